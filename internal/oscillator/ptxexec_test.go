package oscillator

// An executor for the PTX subset that oscillate.ptx uses, so that the
// kernel's logic (its address arithmetic, loop bounds, sampling and status
// flag) is run and checked on a machine without a GPU. It is test code: it
// knows exactly the instruction forms in ptxForms, refuses any other, and
// runs each thread of a 1-D launch on the simulator through LaunchFunc,
// reading and writing device memory through the simulator's checked View,
// so an access outside the kernel's arrays fails the launch.
//
// Semantics follow the PTX ISA for each form: integer arithmetic wraps at
// its width, .rn float operations round once to float32 (fma.rn.f32 is
// computed with math.FMA in float64, then rounded: the product is exact in
// float64, so only a sum within one float64 ulp of a float32 tie can round
// differently), cos.approx.f32 is the correctly rounded cosine (the GPU's
// is within 2^-20.9 absolute in the kernel's range), and cvta.to.global is
// the identity (the simulator's addresses are global addresses).

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// ptxStmt is one statement of an entry's body and the labels in front of it.
type ptxStmt struct {
	labels []string
	text   string
}

// ptxEntry is the text of one .entry, split up: its parameters in order,
// its registers and their types, and its statements.
type ptxEntry struct {
	name       string
	paramNames []string
	paramTypes map[string]string // name → type without the dot
	regs       map[string]string // register → type without the dot
	stmts      []ptxStmt
}

var (
	ptxCommentRE = regexp.MustCompile(`//[^\n]*`)
	ptxEntryRE   = regexp.MustCompile(`\.entry\s+(\w+)\s*\(([^)]*)\)`)
	ptxRegRE     = regexp.MustCompile(`\.reg\s+\.(\w+)\s+([^;]+);`)
	ptxLabelRE   = regexp.MustCompile(`^\s*(\w+):`)
)

// readPTX splits the first .entry of ptx into a ptxEntry.
func readPTX(ptx string) (ptxEntry, error) {
	src := ptxCommentRE.ReplaceAllString(ptx, "")
	m := ptxEntryRE.FindStringSubmatch(src)
	if m == nil {
		return ptxEntry{}, errors.New("no .entry found")
	}
	e := ptxEntry{name: m[1], paramTypes: map[string]string{}, regs: map[string]string{}}
	for _, p := range strings.Split(m[2], ",") {
		f := strings.Fields(p)
		if len(f) != 3 || f[0] != ".param" {
			return ptxEntry{}, fmt.Errorf("parameter %q: want .param .type name", strings.TrimSpace(p))
		}
		e.paramNames = append(e.paramNames, f[2])
		e.paramTypes[f[2]] = strings.TrimPrefix(f[1], ".")
	}
	open, end := strings.Index(src, "{"), strings.LastIndex(src, "}")
	if open < 0 || end < open {
		return ptxEntry{}, errors.New("no { body } after the .entry")
	}
	body := src[open+1 : end]
	for _, d := range ptxRegRE.FindAllStringSubmatch(body, -1) {
		for _, r := range strings.Split(d[2], ",") {
			e.regs[strings.TrimSpace(r)] = d[1]
		}
	}
	code := ptxRegRE.ReplaceAllString(body, "")
	var pending []string
	for _, chunk := range strings.Split(code, ";") {
		for {
			l := ptxLabelRE.FindStringSubmatch(chunk)
			if l == nil {
				break
			}
			pending = append(pending, l[1])
			chunk = chunk[len(l[0]):]
		}
		text := strings.Join(strings.Fields(chunk), " ")
		if text == "" {
			continue
		}
		e.stmts = append(e.stmts, ptxStmt{labels: pending, text: text})
		pending = nil
	}
	if len(pending) > 0 {
		return ptxEntry{}, fmt.Errorf("labels %v mark no instruction", pending)
	}
	return e, nil
}

// Operand kinds of a compiled instruction.
const (
	opdReg     = iota // a register, by index
	opdImm            // an immediate, as bits
	opdSpecial        // %ctaid.x, %ntid.x or %tid.x
	opdParam          // [param], by index
	opdAddr           // [register]
	opdLabel          // a branch target, by statement index
)

const (
	spCtaid = iota
	spNtid
	spTid
)

type ptxOperand struct {
	kind int
	v    uint64 // register/param/special/statement index, or immediate bits
}

type ptxInst struct {
	op       string
	guard    int // register index of the guard predicate, or -1
	negGuard bool
	args     []ptxOperand
	text     string
}

// ptxProgram is a compiled entry: run runs one thread of it.
type ptxProgram struct {
	entry ptxEntry
	nregs int
	code  []ptxInst
	// maxSteps bounds one thread's instruction count, so that a kernel
	// whose loop never ends fails instead of hanging the test.
	maxSteps int
}

var ptxGuardRE = regexp.MustCompile(`^@(!?)(%\w+)\s+`)

// compilePTX reads ptx, checks it with the type checker, and compiles it
// for run. Anything outside ptxForms is an error.
func compilePTX(ptx string) (*ptxProgram, error) {
	if errs := ptxTypeErrors(ptx); len(errs) > 0 {
		return nil, fmt.Errorf("PTX does not type-check: %s", strings.Join(errs, "; "))
	}
	e, err := readPTX(ptx)
	if err != nil {
		return nil, err
	}
	p := &ptxProgram{entry: e, maxSteps: 50_000_000}
	regIndex := map[string]int{}
	for r := range e.regs {
		regIndex[r] = len(regIndex)
	}
	p.nregs = len(regIndex)
	paramIndex := map[string]int{}
	for i, n := range e.paramNames {
		paramIndex[n] = i
	}
	labels := map[string]int{}
	for i, s := range e.stmts {
		for _, l := range s.labels {
			labels[l] = i
		}
	}
	specials := map[string]uint64{"%ctaid.x": spCtaid, "%ntid.x": spNtid, "%tid.x": spTid}
	for _, s := range e.stmts {
		in := ptxInst{guard: -1, text: s.text}
		text := s.text
		if g := ptxGuardRE.FindStringSubmatch(text); g != nil {
			in.guard, in.negGuard = regIndex[g[2]], g[1] == "!"
			text = text[len(g[0]):]
		}
		op, rest, _ := strings.Cut(text, " ")
		in.op = op
		form := ptxForms[op]
		for i, a := range strings.Split(rest, ",") {
			a = strings.TrimSpace(a)
			if a == "" {
				continue
			}
			var o ptxOperand
			switch want := form[i]; {
			case want == "label":
				at, ok := labels[a]
				if !ok {
					return nil, fmt.Errorf("%q: no label %s", s.text, a)
				}
				o = ptxOperand{kind: opdLabel, v: uint64(at)}
			case want == "param":
				o = ptxOperand{kind: opdParam, v: uint64(paramIndex[strings.Trim(a, "[]")])}
			case want == "addr":
				o = ptxOperand{kind: opdAddr, v: uint64(regIndex[strings.Trim(a, "[]")])}
			case strings.HasPrefix(a, "%"):
				if sp, ok := specials[a]; ok {
					o = ptxOperand{kind: opdSpecial, v: sp}
				} else if r, ok := regIndex[a]; ok {
					o = ptxOperand{kind: opdReg, v: uint64(r)}
				} else {
					return nil, fmt.Errorf("%q: register %s is not one the executor knows", s.text, a)
				}
			case want == "f32":
				bits, err := strconv.ParseUint(a[2:], 16, 32)
				if err != nil {
					return nil, fmt.Errorf("%q: float immediate %s: %v", s.text, a, err)
				}
				o = ptxOperand{kind: opdImm, v: bits}
			default:
				n, err := strconv.ParseInt(a, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("%q: immediate %s: %v", s.text, a, err)
				}
				o = ptxOperand{kind: opdImm, v: uint64(n)}
			}
			in.args = append(in.args, o)
		}
		p.code = append(p.code, in)
	}
	return p, nil
}

// ptxThread is one thread's state while run executes it.
type ptxThread struct {
	regs             []uint64
	ctaid, ntid, tid uint32
	params           []uint64
	mem              device.View
}

func (t *ptxThread) val(o ptxOperand) uint64 {
	switch o.kind {
	case opdReg:
		return t.regs[o.v]
	case opdSpecial:
		return uint64([3]uint32{t.ctaid, t.ntid, t.tid}[o.v])
	}
	return o.v
}

func (t *ptxThread) f32(o ptxOperand) float32 { return math.Float32frombits(uint32(t.val(o))) }
func (t *ptxThread) u32(o ptxOperand) uint32  { return uint32(t.val(o)) }

func (t *ptxThread) bytes(o ptxOperand) ([]byte, error) {
	addr := t.regs[o.v]
	return t.mem.Bytes(device.Ptr(addr), 4)
}

// run executes one thread to its ret.
func (p *ptxProgram) run(t *ptxThread) error {
	for pc, steps := 0, 0; ; steps++ {
		if pc >= len(p.code) {
			return errors.New("ran off the end of the entry without ret")
		}
		if steps > p.maxSteps {
			return fmt.Errorf("thread %d of block %d ran %d instructions without returning", t.tid, t.ctaid, p.maxSteps)
		}
		in := &p.code[pc]
		pc++
		if in.guard >= 0 && (t.regs[in.guard] != 0) == in.negGuard {
			continue
		}
		a := in.args
		set := func(v uint64) { t.regs[a[0].v] = v }
		setf := func(v float32) { set(uint64(math.Float32bits(v))) }
		setp := func(b bool) {
			if b {
				set(1)
			} else {
				set(0)
			}
		}
		switch in.op {
		case "mov.u32", "mov.f32":
			set(uint64(t.u32(a[1])))
		case "mad.lo.u32":
			set(uint64(t.u32(a[1])*t.u32(a[2]) + t.u32(a[3])))
		case "mul.wide.u32":
			set(uint64(t.u32(a[1])) * uint64(t.u32(a[2])))
		case "add.u32":
			set(uint64(t.u32(a[1]) + t.u32(a[2])))
		case "sub.u32":
			set(uint64(t.u32(a[1]) - t.u32(a[2])))
		case "add.s64":
			set(t.val(a[1]) + t.val(a[2]))
		case "ld.param.u32", "ld.param.f32":
			set(uint64(uint32(t.params[a[1].v])))
		case "ld.param.u64":
			set(t.params[a[1].v])
		case "cvta.to.global.u64":
			set(t.val(a[1]))
		case "ld.global.f32":
			b, err := t.bytes(a[1])
			if err != nil {
				return fmt.Errorf("%q: %w", in.text, err)
			}
			set(uint64(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24))
		case "st.global.f32", "st.global.u32":
			b, err := t.bytes(a[0])
			if err != nil {
				return fmt.Errorf("%q: %w", in.text, err)
			}
			v := t.u32(a[1])
			b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		case "setp.ge.u32":
			setp(t.u32(a[1]) >= t.u32(a[2]))
		case "setp.gt.u32":
			setp(t.u32(a[1]) > t.u32(a[2]))
		case "setp.eq.u32":
			setp(t.u32(a[1]) == t.u32(a[2]))
		case "and.pred":
			setp(t.val(a[1]) != 0 && t.val(a[2]) != 0)
		case "testp.finite.f32":
			x := float64(t.f32(a[1]))
			setp(!math.IsNaN(x) && !math.IsInf(x, 0))
		case "cvt.rn.f32.u32":
			setf(float32(t.u32(a[1])))
		case "mul.rn.f32":
			setf(t.f32(a[1]) * t.f32(a[2]))
		case "add.rn.f32":
			setf(t.f32(a[1]) + t.f32(a[2]))
		case "div.rn.f32":
			setf(t.f32(a[1]) / t.f32(a[2]))
		case "fma.rn.f32":
			setf(float32(math.FMA(float64(t.f32(a[1])), float64(t.f32(a[2])), float64(t.f32(a[3])))))
		case "neg.f32":
			set(uint64(t.u32(a[1]) ^ 0x8000_0000))
		case "cos.approx.f32":
			setf(float32(math.Cos(float64(t.f32(a[1])))))
		case "bra", "bra.uni":
			pc = int(a[0].v)
		case "ret":
			return nil
		default:
			return fmt.Errorf("%q: the executor has no case for %s", in.text, in.op)
		}
	}
}

// ptxParamFits reports whether a Launch argument can be passed for a
// parameter of PTX type typ. It is stricter than the driver, which only
// reads as many bytes as the parameter is wide: pointers go to 64-bit
// integer parameters, and each other Go type to the PTX types of its own
// kind and width.
func ptxParamFits(arg any, typ string) (uint64, bool) {
	switch v := arg.(type) {
	case device.Ptr:
		return uint64(v), typ == "u64" || typ == "b64" || typ == "s64"
	case uint32:
		return uint64(v), typ == "u32" || typ == "b32"
	case int32:
		return uint64(uint32(v)), typ == "s32" || typ == "b32"
	case uint64:
		return v, typ == "u64" || typ == "b64"
	case int64:
		return uint64(v), typ == "s64" || typ == "b64"
	case float32:
		return uint64(math.Float32bits(v)), typ == "f32" || typ == "b32"
	case float64:
		return math.Float64bits(v), typ == "f64" || typ == "b64"
	}
	return 0, false
}

// ptxSim is the simulator with a ModuleLoader that runs PTX through the
// executor, so that oscillator.New picks the PTX kernel and its real Launch
// (argument order, grid size) is what runs.
type ptxSim struct{ *sim.Device }

var _ device.ModuleLoader = ptxSim{}

type ptxModule struct {
	d    ptxSim
	prog *ptxProgram
}

type ptxFunction ptxModule

func (d ptxSim) LoadPTX(ptx string) (device.Module, error) {
	prog, err := compilePTX(ptx)
	if err != nil {
		return nil, err
	}
	return &ptxModule{d: d, prog: prog}, nil
}

func (m *ptxModule) Function(name string) (device.Function, error) {
	if name != m.prog.entry.name {
		return nil, fmt.Errorf("no entry %q (the module has %q): %w", name, m.prog.entry.name, device.ErrInvalidValue)
	}
	return (*ptxFunction)(m), nil
}

func (m *ptxModule) Close() error { return nil }

// Launch checks the arguments against the entry's parameters and runs
// grid.X × block.X threads on s.
func (f *ptxFunction) Launch(s device.Stream, grid, block device.Dim3, sharedMem uint32, args ...any) error {
	e := f.prog.entry
	if grid.Y != 1 || grid.Z != 1 || block.Y != 1 || block.Z != 1 || grid.X == 0 || block.X == 0 || block.X > 1024 {
		return fmt.Errorf("launch %s: grid %+v, block %+v: the executor runs 1-D launches of 1 to 1024 threads a block: %w",
			e.name, grid, block, device.ErrInvalidValue)
	}
	if sharedMem != 0 {
		return fmt.Errorf("launch %s: %d bytes of shared memory: the kernel declares none: %w", e.name, sharedMem, device.ErrInvalidValue)
	}
	if len(args) != len(e.paramNames) {
		return fmt.Errorf("launch %s: %d arguments for %d parameters: %w", e.name, len(args), len(e.paramNames), device.ErrInvalidValue)
	}
	params := make([]uint64, len(args))
	for i, a := range args {
		v, ok := ptxParamFits(a, e.paramTypes[e.paramNames[i]])
		if !ok {
			return fmt.Errorf("launch %s: argument %d (%s) is a %T, parameter is .%s: %w",
				e.name, i, e.paramNames[i], a, e.paramTypes[e.paramNames[i]], device.ErrInvalidValue)
		}
		params[i] = v
	}
	threads := int(grid.X) * int(block.X)
	return f.d.LaunchFunc(s, threads, func(mem device.View, lo, hi int) error {
		t := &ptxThread{regs: make([]uint64, f.prog.nregs), ntid: block.X, params: params, mem: mem}
		for i := lo; i < hi; i++ {
			clear(t.regs)
			t.ctaid, t.tid = uint32(i)/block.X, uint32(i)%block.X
			if err := f.prog.run(t); err != nil {
				return fmt.Errorf("%s thread %d: %w", e.name, i, err)
			}
		}
		return nil
	})
}

func newPTXSim(t *testing.T) ptxSim { return ptxSim{newSim(t)} }

// TestPTXExecuted runs oscillate.ptx itself, through the PTX kernel's
// Launch, on the simulator and checks it like the GPU test does: against
// the float64 reference, with the columns past n untouched.
func TestPTXExecuted(t *testing.T) {
	dev := newPTXSim(t)
	k, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if k.Kind() != "ptx" {
		t.Fatalf("New picked the %q kernel, want ptx", k.Kind())
	}
	checkLaunch(t, dev, k)
}

// TestPTXExecutedMatchesGoKernel compares the executed PTX with the Go
// kernel sample by sample. They differ only where the PTX fuses a multiply
// and an add and the Go code rounds twice, so they agree far more closely
// than either does with the float64 reference.
func TestPTXExecutedMatchesGoKernel(t *testing.T) {
	dev := newPTXSim(t)
	pk, err := NewPTX(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer pk.Close()
	runs := manyRuns(130)
	const ld, dt, steps, every = 131, 0.01, 300, 3
	pout, pstatus := launchOn(t, dev, pk, runs, ld, dt, steps, every)
	gout, gstatus := launchOn(t, dev, NewGo(dev), runs, ld, dt, steps, every)
	samples := Samples(steps, every)
	worst := 0.0
	for i := range runs {
		if Status(pstatus, i) != Status(gstatus, i) {
			t.Fatalf("run %d: PTX status %d, Go status %d", i, Status(pstatus, i), Status(gstatus, i))
		}
		ps, err := Decode(pout, ld, samples, i)
		if err != nil {
			t.Fatal(err)
		}
		gs, err := Decode(gout, ld, samples, i)
		if err != nil {
			t.Fatal(err)
		}
		for k := range ps {
			for _, c := range [][2]float64{{ps[k].X, gs[k].X}, {ps[k].V, gs[k].V}} {
				d := math.Abs(c[0]-c[1]) / (1 + math.Abs(c[1]))
				worst = max(worst, d)
				if !(d <= 1e-5) {
					t.Fatalf("run %d sample %d: PTX %.9g, Go %.9g", i, k, c[0], c[1])
				}
			}
		}
	}
	t.Logf("largest relative difference between the PTX and Go kernels: %.3g (reference tolerance %.3g)", worst, Tolerance)
}

func TestPTXExecutedFlagsNonFinite(t *testing.T) {
	dev := newPTXSim(t)
	k, err := NewPTX(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	runs := []Run{
		{X0: 1, Omega: 1},
		{X0: math.Inf(1), Omega: 1},
		{X0: 1, Omega: 1e20, Zeta: 1e20}, // blows up to Inf, then NaN
		{X0: math.NaN(), Omega: 1},
	}
	_, status := launchOn(t, dev, k, runs, 4, 0.1, 100, 10)
	for i, want := range []int32{0, 1, 1, 1} {
		if got := Status(status, i); got != want {
			t.Errorf("run %d (%+v): status %d, want %d", i, runs[i], got, want)
		}
	}
}

// TestPTXExecutorCatches runs mutated kernels to show that the executed
// checks fail on mistakes the static checks cannot see: each mutation
// type-checks, and each must make the launch fail or its results wrong.
func TestPTXExecutorCatches(t *testing.T) {
	tests := map[string]struct{ from, to string }{
		"v row read from x row":      {"add.s64\t\t%a, %a, %ldb;\n\tld.global.f32\t%v", "add.s64\t\t%a, %a, 0;\n\tld.global.f32\t%v"},
		"samples a row apart":        {"add.s64\t\t%ox, %ox, %ldb2;\n\tadd.s64\t\t%ov, %ov, %ldb2;\n\ttestp", "add.s64\t\t%ox, %ox, %ldb;\n\tadd.s64\t\t%ov, %ov, %ldb;\n\ttestp"},
		"one step too many":          {"setp.gt.u32\t%pmore, %k, %steps", "setp.ge.u32\t%pmore, %steps, %k"},
		"time of the step's end":     {"sub.u32\t\t%km1, %k, 1", "sub.u32\t\t%km1, %k, 0"},
		"threads past n not stopped": {"setp.ge.u32\t%pexit, %i, %n", "setp.gt.u32\t%pexit, %i, %n"},
		"block index ignored":        {"mad.lo.u32\t%i, %blk, %bdim, %thr", "mad.lo.u32\t%i, %blk, 0, %thr"},
		"status past the array":      {"add.s64\t\t%a, %status, %i4", "add.s64\t\t%a, %status, %ldb"},
		"half step as a full step":   {"mul.rn.f32\t%half, %dt, 0f3F000000", "mul.rn.f32\t%half, %dt, 0f3F800000"},
	}
	runs := append(manyRuns(130), Run{X0: math.Inf(1), Omega: 1})
	const ld, dt, steps, every = 133, 0.02, 200, 4
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(PTX, tc.from) {
				t.Fatalf("the kernel has no %q to change", tc.from)
			}
			mutated := strings.Replace(PTX, tc.from, tc.to, 1)
			if errs := ptxTypeErrors(mutated); len(errs) > 0 {
				t.Fatalf("the mutation does not type-check, so it tests nothing here: %v", errs)
			}
			if err := launchMutated(t, mutated, runs, ld, dt, steps, every); err == nil {
				t.Fatalf("the kernel with %q ran and verified", tc.to)
			} else {
				t.Logf("caught: %v", err)
			}
		})
	}
}

// launchMutated runs ptx over runs (the last one must flag its status) on
// a fresh simulator and returns the first failure: the launch's, an
// inactive column written, a wrong status, or a sample off the reference.
func launchMutated(t *testing.T, ptx string, runs []Run, ld int, dt float32, steps, every uint32) error {
	t.Helper()
	// One worker: a mutated kernel may write one address from several
	// blocks (the block index ignored), which run in parallel otherwise,
	// and the race detector would fail the test on the mutation it is
	// meant to catch.
	d, err := sim.New(sim.Config{KernelWorkers: 1})
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	dev := ptxSim{d}
	mod, err := dev.LoadPTX(ptx)
	if err != nil {
		return err
	}
	fn, err := mod.Function(Entry)
	if err != nil {
		return err
	}
	samples := Samples(steps, every)
	init, params := make([]byte, InitBytes(ld)), make([]byte, ParamsBytes(ld))
	if err := Encode(runs, ld, init, params); err != nil {
		return err
	}
	sizes := []uint64{InitBytes(ld), ParamsBytes(ld), OutBytes(ld, samples), StatusBytes(ld)}
	var ptrs [4]device.Ptr
	for i, n := range sizes {
		if ptrs[i], err = dev.Malloc(n); err != nil {
			return err
		}
		defer dev.Free(ptrs[i])
	}
	s := dev.DefaultStream()
	if err := errors.Join(
		dev.CopyHtoD(ptrs[0], init, s), dev.CopyHtoD(ptrs[1], params, s),
		dev.Memset(ptrs[2], 0x7f, sizes[2], s), dev.Memset(ptrs[3], 0x7f, sizes[3], s)); err != nil {
		return err
	}
	grid := uint32((len(runs)-1)/BlockSize + 1)
	if err := fn.Launch(s, device.Dim3{X: grid, Y: 1, Z: 1}, device.Dim3{X: BlockSize, Y: 1, Z: 1}, 0,
		ptrs[0], ptrs[1], ptrs[2], ptrs[3], uint32(len(runs)), uint32(ld), dt, steps, every); err != nil {
		return err
	}
	out, status := make([]byte, sizes[2]), make([]byte, sizes[3])
	if err := errors.Join(dev.CopyDtoH(out, ptrs[2], s), dev.CopyDtoH(status, ptrs[3], s), s.Synchronize()); err != nil {
		return err
	}
	last := len(runs) - 1
	if got := Status(status, last); got != 1 {
		return fmt.Errorf("run %d starts at +Inf but its status is %d", last, got)
	}
	for i := len(runs); i < ld; i++ {
		if Status(status, i) != 0x7f7f7f7f || out[4*outIndex(ld, 0, 0, i)] != 0x7f {
			return fmt.Errorf("inactive column %d was written", i)
		}
	}
	return VerifyOutput(runs[:last], dt, steps, every, ld, out, status)
}

// TestPTXExecutorRefuses checks the executor's own guards: a launch whose
// arguments do not match the entry, and a kernel that never returns.
func TestPTXExecutorRefuses(t *testing.T) {
	dev := newPTXSim(t)
	mod, err := dev.LoadPTX(PTX)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := mod.Function(Entry)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mod.Function("nope"); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("Function(nope) = %v, want ErrInvalidValue", err)
	}
	one := device.Dim3{X: 1, Y: 1, Z: 1}
	p := device.Ptr(1)
	tests := map[string][]any{
		"too few":          {p, p, p, p, uint32(1)},
		"dt as an integer": {p, p, p, p, uint32(1), uint32(1), uint32(1), uint32(1), uint32(1)},
		"n as a pointer":   {p, p, p, p, p, uint32(1), float32(1), uint32(1), uint32(1)},
	}
	for name, args := range tests {
		if err := fn.Launch(dev.DefaultStream(), one, one, 0, args...); !errors.Is(err, device.ErrInvalidValue) {
			t.Errorf("%s: Launch = %v, want ErrInvalidValue", name, err)
		}
	}

	// A kernel that loops at its end: the launch fails, naming the loop.
	m, err := dev.LoadPTX(strings.Replace(PTX, "ret;", "bra.uni L_done;", 1))
	if err != nil {
		t.Fatalf("a kernel looping at its end did not compile: %v", err)
	}
	m.(*ptxModule).prog.maxSteps = 10_000
	loop, err := m.Function(Entry)
	if err != nil {
		t.Fatal(err)
	}
	if err := loop.Launch(dev.DefaultStream(), one, one, 0, p, p, p, p, uint32(0), uint32(1), float32(1), uint32(1), uint32(1)); err != nil {
		t.Fatalf("Launch: %v", err)
	}
	if err := dev.DefaultStream().Synchronize(); err == nil || !strings.Contains(err.Error(), "without returning") {
		t.Fatalf("a kernel that never returns: Synchronize = %v, want an error saying it ran without returning", err)
	}
}
