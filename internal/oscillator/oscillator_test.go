package oscillator

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/cuda"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runsForTest is a handful of runs: undamped, damped, driven at and off
// resonance, overdamped, and one starting at rest.
var runsForTest = []Run{
	{X0: 1, V0: 0, Omega: 2, Zeta: 0, A: 0, Drive: 0},
	{X0: 0.5, V0: -1, Omega: 3, Zeta: 0.1, A: 0, Drive: 0},
	{X0: 0, V0: 0, Omega: 1.5, Zeta: 0.05, A: 1, Drive: 1.5},
	{X0: -1, V0: 2, Omega: 4, Zeta: 0.3, A: 2, Drive: 2.5},
	{X0: 2, V0: 0, Omega: 1, Zeta: 2, A: 0.5, Drive: 0.7},
	{X0: 0.1, V0: 0.1, Omega: 6, Zeta: 0.01, A: 3, Drive: 5.9},
}

func TestReferenceMatchesClosedForm(t *testing.T) {
	tests := map[string]struct {
		x0, v0, omega, zeta float64
		exact               func(t float64) float64
	}{
		"undamped": {x0: 1, v0: 0.5, omega: 2, exact: func(t float64) float64 {
			return math.Cos(2*t) + 0.25*math.Sin(2*t)
		}},
		"underdamped": {x0: 1, v0: 0, omega: 3, zeta: 0.2, exact: func(t float64) float64 {
			wd := 3 * math.Sqrt(1-0.04)
			return math.Exp(-0.6*t) * (math.Cos(wd*t) + 0.6/wd*math.Sin(wd*t))
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			const dt, steps, every = 0.001, 5000, 100
			got := Reference(tc.x0, tc.v0, tc.omega, tc.zeta, 0, 0, dt, steps, every)
			if len(got) != steps/every+1 {
				t.Fatalf("%d samples, want %d", len(got), steps/every+1)
			}
			for k, s := range got {
				want := tc.exact(float64(k*every) * dt)
				if math.Abs(s.X-want) > 1e-9 {
					t.Fatalf("sample %d: x = %.12g, closed form %.12g", k, s.X, want)
				}
			}
		})
	}
}

func TestVerify(t *testing.T) {
	ref := []Sample{{1, 0}, {100, -2}}
	tests := map[string]struct {
		got  []Sample
		fail string
	}{
		"equal":           {got: []Sample{{1, 0}, {100, -2}}},
		"within relative": {got: []Sample{{1.0019, 0.0009}, {100.09, -2.0029}}},
		"x out":           {got: []Sample{{1.0021, 0}, {100, -2}}, fail: "sample 0: x"},
		"v out":           {got: []Sample{{1, 0}, {100, -2.004}}, fail: "sample 1: v"},
		"NaN":             {got: []Sample{{1, 0}, {math.NaN(), -2}}, fail: "sample 1: x"},
		"count":           {got: []Sample{{1, 0}}, fail: "1 samples, want 2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := Verify(tc.got, ref)
			switch {
			case tc.fail == "" && err != nil:
				t.Fatalf("Verify: %v", err)
			case tc.fail != "" && (err == nil || !strings.Contains(err.Error(), tc.fail)):
				t.Fatalf("Verify = %v, want an error containing %q", err, tc.fail)
			}
		})
	}
}

func TestArgsCheck(t *testing.T) {
	ok := Args{Init: 1, Params: 2, Out: 3, Status: 4, N: 3, LD: 4, Dt: 0.01, Steps: 10, Every: 5}
	tests := map[string]struct {
		mod  func(*Args)
		want bool
	}{
		"ok":           {mod: func(*Args) {}, want: true},
		"n = ld":       {mod: func(a *Args) { a.N = 4 }, want: true},
		"n > ld":       {mod: func(a *Args) { a.N = 5 }},
		"n = 0":        {mod: func(a *Args) { a.N = 0 }},
		"every 0":      {mod: func(a *Args) { a.Every = 0 }},
		"not multiple": {mod: func(a *Args) { a.Steps = 11 }},
		"dt 0":         {mod: func(a *Args) { a.Dt = 0 }},
		"dt NaN":       {mod: func(a *Args) { a.Dt = float32(math.NaN()) }},
		"nil out":      {mod: func(a *Args) { a.Out = 0 }},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := ok
			tc.mod(&a)
			err := a.Check()
			if (err == nil) != tc.want {
				t.Fatalf("Check() = %v, want ok = %v", err, tc.want)
			}
			if err != nil && !errors.Is(err, ErrArgs) {
				t.Fatalf("Check() = %v, want it to wrap ErrArgs", err)
			}
		})
	}
}

func TestEncodeDecode(t *testing.T) {
	const ld, samples = 8, 3
	init, params := make([]byte, InitBytes(ld)), make([]byte, ParamsBytes(ld))
	if err := Encode(runsForTest, ld, init, params); err != nil {
		t.Fatal(err)
	}
	if got := f32at(params, 3*ld+3); got != float32(runsForTest[3].Drive) {
		t.Fatalf("params[3][3] = %v, want Ω of run 3 = %v", got, runsForTest[3].Drive)
	}
	if got := f32at(init, ld+1); got != float32(runsForTest[1].V0) {
		t.Fatalf("init[1][1] = %v, want v0 of run 1", got)
	}
	if err := Encode(make([]Run, ld+1), ld, init, params); !errors.Is(err, ErrArgs) {
		t.Fatalf("Encode of ld+1 runs = %v, want ErrArgs", err)
	}
	out := make([]byte, OutBytes(ld, samples))
	putf32(out, outIndex(ld, 2, 1, 5), 7.5)
	s, err := Decode(out, ld, samples, 5)
	if err != nil || s[2].V != 7.5 || s[2].X != 0 {
		t.Fatalf("Decode = %v, %v; want sample 2 = (0, 7.5)", s, err)
	}
}

// launchOn runs the kernel k on dev over runs in arrays of leading
// dimension ld and returns the host copies of out and status.
func launchOn(t *testing.T, dev device.Device, k Kernel, runs []Run, ld int, dt float32, steps, every uint32) (out, status []byte) {
	t.Helper()
	samples := Samples(steps, every)
	init, params := make([]byte, InitBytes(ld)), make([]byte, ParamsBytes(ld))
	if err := Encode(runs, ld, init, params); err != nil {
		t.Fatal(err)
	}
	alloc := func(n uint64) device.Ptr {
		p, err := dev.Malloc(n)
		if err != nil {
			t.Fatalf("Malloc(%d): %v", n, err)
		}
		t.Cleanup(func() {
			if err := dev.Free(p); err != nil {
				t.Errorf("Free: %v", err)
			}
		})
		return p
	}
	s := dev.DefaultStream()
	a := Args{
		Init: alloc(InitBytes(ld)), Params: alloc(ParamsBytes(ld)),
		Out: alloc(OutBytes(ld, samples)), Status: alloc(StatusBytes(ld)),
		N: uint32(len(runs)), LD: uint32(ld), Dt: dt, Steps: steps, Every: every,
	}
	for _, c := range []struct {
		p device.Ptr
		b []byte
	}{{a.Init, init}, {a.Params, params}} {
		if err := dev.CopyHtoD(c.p, c.b, s); err != nil {
			t.Fatal(err)
		}
	}
	// Fill out and status with a marker so columns past n can be checked.
	if err := dev.Memset(a.Out, 0x7f, OutBytes(ld, samples), s); err != nil {
		t.Fatal(err)
	}
	if err := dev.Memset(a.Status, 0x7f, StatusBytes(ld), s); err != nil {
		t.Fatal(err)
	}
	if err := k.Launch(s, a); err != nil {
		t.Fatalf("Launch: %v", err)
	}
	out, status = make([]byte, OutBytes(ld, samples)), make([]byte, StatusBytes(ld))
	if err := dev.CopyDtoH(out, a.Out, s); err != nil {
		t.Fatal(err)
	}
	if err := dev.CopyDtoH(status, a.Status, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	return out, status
}

// checkLaunch verifies a launch's results and that the columns past n were
// not written.
func checkLaunch(t *testing.T, dev device.Device, k Kernel) {
	t.Helper()
	tests := map[string]struct {
		runs         []Run
		ld           int
		dt           float32
		steps, every uint32
	}{
		"n < ld":         {runs: runsForTest, ld: len(runsForTest) + 5, dt: 0.01, steps: 1000, every: 50},
		"n = ld":         {runs: runsForTest[:4], ld: 4, dt: 0.005, steps: 600, every: 1},
		"every = steps":  {runs: runsForTest[2:], ld: 7, dt: 0.02, steps: 500, every: 500},
		"one run":        {runs: runsForTest[5:], ld: 3, dt: 0.001, steps: 2000, every: 400},
		"several blocks": {runs: manyRuns(300), ld: 301, dt: 0.01, steps: 400, every: 20},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, status := launchOn(t, dev, k, tc.runs, tc.ld, tc.dt, tc.steps, tc.every)
			if err := VerifyOutput(tc.runs, tc.dt, tc.steps, tc.every, tc.ld, out, status); err != nil {
				t.Fatalf("%s kernel: %v", k.Kind(), err)
			}
			samples := Samples(tc.steps, tc.every)
			for i := len(tc.runs); i < tc.ld; i++ {
				if Status(status, i) != 0x7f7f7f7f {
					t.Fatalf("status of inactive column %d was written: %#x", i, Status(status, i))
				}
				for s := 0; s < samples; s++ {
					if b := out[4*outIndex(tc.ld, s, 0, i)]; b != 0x7f {
						t.Fatalf("out of inactive column %d, sample %d was written", i, s)
					}
				}
			}
		})
	}
}

func manyRuns(n int) []Run {
	runs := make([]Run, n)
	for i := range runs {
		f := float64(i) / float64(n)
		runs[i] = Run{X0: 1 - f, V0: f, Omega: 0.5 + 4*f, Zeta: 0.5 * f, A: 2 * f, Drive: 3 - 2*f}
	}
	return runs
}

// newSim is a simulated device of the simulator's default size, checked
// for leaks when the test ends (simtest).
func newSim(t *testing.T) *sim.Device { return simtest.New(t, 8<<30) }

func TestGoKernelOnSimulator(t *testing.T) {
	dev := newSim(t)
	k, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if k.Kind() != "go" {
		t.Fatalf("New(sim) picked the %q kernel, want go", k.Kind())
	}
	checkLaunch(t, dev, k)
}

func TestGoKernelFlagsNonFinite(t *testing.T) {
	dev := newSim(t)
	runs := []Run{
		{X0: 1, Omega: 1},
		{X0: math.Inf(1), Omega: 1},
		{X0: 1, Omega: 1e20, Zeta: 1e20}, // blows up to Inf, then NaN
	}
	_, status := launchOn(t, dev, NewGo(dev), runs, 3, 0.1, 100, 10)
	for i, want := range []int32{0, 1, 1} {
		if got := Status(status, i); got != want {
			t.Errorf("run %d (%+v): status %d, want %d", i, runs[i], got, want)
		}
	}
}

func TestGoKernelRefusesBadArgs(t *testing.T) {
	dev := newSim(t)
	err := NewGo(dev).Launch(dev.DefaultStream(), Args{Init: 1, Params: 1, Out: 1, Status: 1, N: 5, LD: 4, Dt: 1, Steps: 1, Every: 1})
	if !errors.Is(err, ErrArgs) {
		t.Fatalf("Launch with n > ld = %v, want ErrArgs", err)
	}
}

// openCUDA opens CUDA device 0 or skips the test, saying why.
func openCUDA(t *testing.T) device.Device {
	t.Helper()
	dev, err := cuda.Open(0)
	if errors.Is(err, device.ErrNoDevice) {
		t.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		t.Fatalf("cuda.Open(0): %v", err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("cuda Close: %v", err)
		}
	})
	return dev
}

func TestPTXKernelOnCUDA(t *testing.T) {
	dev := openCUDA(t)
	k, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if k.Kind() != "ptx" {
		t.Fatalf("New(cuda) picked the %q kernel, want ptx", k.Kind())
	}
	checkLaunch(t, dev, k)
}

// TestPTXStatic checks the PTX text without a GPU: its header, the entry
// and its parameter list in the documented order, balanced braces, every
// register used declared, and every branch target defined.
func TestPTXStatic(t *testing.T) {
	src := regexp.MustCompile(`//[^\n]*`).ReplaceAllString(PTX, "")
	for _, want := range []string{".version 7.0", ".target sm_52", ".address_size 64", ".visible .entry " + Entry + "("} {
		if !strings.Contains(src, want) {
			t.Errorf("PTX lacks %q", want)
		}
	}
	if o, c := strings.Count(src, "{"), strings.Count(src, "}"); o != c || o != 1 {
		t.Errorf("PTX has %d '{' and %d '}', want one balanced body", o, c)
	}
	if o, c := strings.Count(src, "("), strings.Count(src, ")"); o != c {
		t.Errorf("PTX has %d '(' and %d ')'", o, c)
	}
	m := regexp.MustCompile(`\.entry\s+(\w+)\s*\(([^)]*)\)`).FindStringSubmatch(src)
	if m == nil || m[1] != Entry {
		t.Fatalf("no .entry %s(...) found", Entry)
	}
	var types []string
	for _, p := range strings.Split(m[2], ",") {
		f := strings.Fields(p)
		if len(f) != 3 || f[0] != ".param" {
			t.Fatalf("parameter %q: want .param .type name", p)
		}
		types = append(types, f[1])
	}
	want := []string{".u64", ".u64", ".u64", ".u64", ".u32", ".u32", ".f32", ".u32", ".u32"}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Errorf("parameter types %v, want %v (init, params, out, status, n, ld, dt, steps, every)", types, want)
	}

	body := src[strings.Index(src, "{")+1 : strings.LastIndex(src, "}")]
	declared := map[string]bool{}
	for _, d := range regexp.MustCompile(`\.reg\s+\.\w+\s+([^;]+);`).FindAllStringSubmatch(body, -1) {
		for _, r := range strings.Split(d[1], ",") {
			r = strings.TrimSpace(r)
			if declared[r] {
				t.Errorf("register %s declared twice", r)
			}
			declared[r] = true
		}
	}
	special := map[string]bool{"%ctaid": true, "%ntid": true, "%tid": true}
	code := regexp.MustCompile(`\.reg[^;]*;`).ReplaceAllString(body, "")
	for _, r := range regexp.MustCompile(`%[A-Za-z_]\w*`).FindAllString(code, -1) {
		if !declared[r] && !special[r] {
			t.Errorf("register %s used but not declared", r)
		}
	}
	for r := range declared {
		if special[r] {
			t.Errorf("register %s shadows a special register", r)
		}
	}
	labels := map[string]bool{}
	for _, l := range regexp.MustCompile(`(?m)^(\w+):`).FindAllStringSubmatch(body, -1) {
		labels[l[1]] = true
	}
	for _, b := range regexp.MustCompile(`bra(?:\.uni)?\s+(\w+);`).FindAllStringSubmatch(body, -1) {
		if !labels[b[1]] {
			t.Errorf("branch to undefined label %s", b[1])
		}
	}
	// Every instruction line ends with a semicolon.
	for i, line := range strings.Split(code, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasSuffix(line, ":") || strings.HasSuffix(line, ";") {
			continue
		}
		t.Errorf("body line %d %q does not end with ';'", i, line)
	}
}

// ptxForms is the PTX ISA subset oscillate.ptx may use: each instruction
// form, exactly as written, with the type of each operand in order. Types
// follow the PTX type-checking rules: a register declared .bN fits any
// N-bit operand, a .f32 register only an .f32 one, a .pred register only a
// predicate. "addr" is [reg] with a 64-bit register, "param" is [name] of
// an entry parameter whose declared type is the instruction's, "-" takes
// no operands. Rounding is explicit wherever the ISA requires it (fma.rn,
// div.rn; cos only exists as .approx).
var ptxForms = map[string][]string{
	"mov.u32":            {"u32", "u32"},
	"mov.f32":            {"f32", "f32"},
	"mad.lo.u32":         {"u32", "u32", "u32", "u32"},
	"mul.wide.u32":       {"u64", "u32", "u32"},
	"add.u32":            {"u32", "u32", "u32"},
	"sub.u32":            {"u32", "u32", "u32"},
	"add.s64":            {"s64", "s64", "s64"},
	"ld.param.u32":       {"u32", "param"},
	"ld.param.u64":       {"u64", "param"},
	"ld.param.f32":       {"f32", "param"},
	"cvta.to.global.u64": {"u64", "u64"},
	"ld.global.f32":      {"f32", "addr"},
	"st.global.f32":      {"addr", "f32"},
	"st.global.u32":      {"addr", "u32"},
	"setp.ge.u32":        {"pred", "u32", "u32"},
	"setp.gt.u32":        {"pred", "u32", "u32"},
	"setp.eq.u32":        {"pred", "u32", "u32"},
	"and.pred":           {"pred", "pred", "pred"},
	"testp.finite.f32":   {"pred", "f32"},
	"cvt.rn.f32.u32":     {"f32", "u32"},
	"mul.rn.f32":         {"f32", "f32", "f32"},
	"add.rn.f32":         {"f32", "f32", "f32"},
	"div.rn.f32":         {"f32", "f32", "f32"},
	"fma.rn.f32":         {"f32", "f32", "f32", "f32"},
	"neg.f32":            {"f32", "f32"},
	"cos.approx.f32":     {"f32", "f32"},
	"bra":                {"label"},
	"bra.uni":            {"label"},
	"ret":                {"-"},
}

// ptxFits reports whether a register declared with type decl can be an
// operand of type want.
func ptxFits(decl, want string) bool {
	size := func(t string) string { return strings.TrimLeft(t, "bfsu") }
	switch {
	case want == "pred" || decl == "pred":
		return decl == want
	case size(decl) != size(want):
		return false
	case decl[0] == 'b' || decl == want:
		return true
	case want[0] == 'f' || decl[0] == 'f':
		return false // floats take only float or bit-size registers
	}
	return true // signed and unsigned integers of one size mix
}

// TestPTXTypes checks every instruction of the PTX against ptxForms: the
// form is known, the operand count is right, each register operand is
// declared with a type that fits, immediates are integers for integer
// operands and 0f hex floats for .f32 ones, parameters are loaded with
// their declared types, and the special registers are read as .u32.
func TestPTXTypes(t *testing.T) {
	for _, e := range ptxTypeErrors(PTX) {
		t.Error(e)
	}
}

// ptxTypeErrors is TestPTXTypes's checker: one message per problem.
func ptxTypeErrors(ptx string) []string {
	var errs []string
	errorf := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	e, err := readPTX(ptx)
	if err != nil {
		return []string{err.Error()}
	}
	params, regs := e.paramTypes, e.regs
	special := regexp.MustCompile(`^%(ctaid|ntid|tid|nctaid)\.[xyz]$`)
	guardRE := regexp.MustCompile(`^@!?(%\w+)\s+`)
	intImm := regexp.MustCompile(`^-?[0-9]+$`)
	f32Imm := regexp.MustCompile(`^0[fF][0-9A-Fa-f]{8}$`)
	used := map[string]bool{}
	for _, st := range e.stmts {
		stmt := st.text
		if g := guardRE.FindStringSubmatch(stmt); g != nil {
			if regs[g[1]] != "pred" {
				errorf("%q: guard %s is not a declared .pred register", stmt, g[1])
			}
			stmt = stmt[len(g[0]):]
		}
		op, rest, _ := strings.Cut(stmt, " ")
		form, ok := ptxForms[op]
		if !ok {
			errorf("%q: instruction form %s is not in the checked subset (add it to ptxForms after checking it against the PTX ISA)", stmt, op)
			continue
		}
		used[op] = true
		var args []string
		if rest = strings.TrimSpace(rest); rest != "" {
			for _, a := range strings.Split(rest, ",") {
				args = append(args, strings.TrimSpace(a))
			}
		}
		if form[0] == "-" {
			if len(args) != 0 {
				errorf("%q: %s takes no operands", stmt, op)
			}
			continue
		}
		if len(args) != len(form) {
			errorf("%q: %s takes %d operands, got %d", stmt, op, len(form), len(args))
			continue
		}
		for i, a := range args {
			want := form[i]
			switch {
			case want == "label":
				// TestPTXStatic checks that branch targets exist.
			case want == "param":
				name := strings.Trim(a, "[]")
				if !strings.HasPrefix(a, "[") || params[name] == "" {
					errorf("%q: operand %d %s is not [parameter]", stmt, i, a)
				} else if typ := op[strings.LastIndex(op, ".")+1:]; params[name] != typ {
					errorf("%q: parameter %s is .%s, loaded as .%s", stmt, name, params[name], typ)
				}
			case want == "addr":
				r := strings.Trim(a, "[]")
				if !strings.HasPrefix(a, "[") || !ptxFits(regs[r], "u64") {
					errorf("%q: address %s is not [64-bit register]", stmt, a)
				}
			case special.MatchString(a):
				if want != "u32" {
					errorf("%q: special register %s read as .%s, want .u32", stmt, a, want)
				}
			case strings.HasPrefix(a, "%"):
				if decl, ok := regs[a]; !ok || !ptxFits(decl, want) {
					errorf("%q: operand %d %s is declared .%s, which does not fit .%s", stmt, i, a, decl, want)
				}
			case want == "f32":
				if !f32Imm.MatchString(a) {
					errorf("%q: immediate %s for an .f32 operand is not a 0f hex float", stmt, a)
				}
			default:
				if !intImm.MatchString(a) || want == "pred" {
					errorf("%q: immediate %s does not fit .%s", stmt, a, want)
				}
			}
		}
	}
	if !used["cos.approx.f32"] || !used["testp.finite.f32"] || !used["st.global.f32"] {
		errorf("the checker saw none of cos.approx.f32, testp.finite.f32 or st.global.f32: it did not read the kernel")
	}
	return errs
}

// TestPTXTypesCatches feeds the checker the kernel with one mistake each
// and expects it to say so.
func TestPTXTypesCatches(t *testing.T) {
	tests := map[string]struct{ from, to, want string }{
		"param loaded too wide":   {"ld.param.u32\t%n, [oscillate_n]", "ld.param.u64\t%n, [oscillate_n]", "does not fit .u64"},
		"param type mismatch":     {"ld.param.f32\t%dt, [oscillate_dt]", "ld.param.u32\t%dt, [oscillate_dt]", "is .f32, loaded as .u32"},
		"float in an int op":      {"add.u32\t\t%k, %k, 1", "add.u32\t\t%k, %x, 1", "%x is declared .f32"},
		"int immediate for f32":   {"0fC0000000", "2", "not a 0f hex float"},
		"fma without rounding":    {"fma.rn.f32\t%k1v, %nc1, %v, %c0", "fma.f32\t%k1v, %nc1, %v, %c0", "fma.f32 is not in the checked subset"},
		"cos without approx":      {"cos.approx.f32\t%c0, %arg", "cos.f32\t%c0, %arg", "cos.f32 is not in the checked subset"},
		"32-bit address":          {"st.global.u32\t[%a], %bad", "st.global.u32\t[%i], %bad", "not [64-bit register]"},
		"narrow product":          {"mul.wide.u32\t%i4, %i, 4", "mul.wide.u32\t%i, %i, 4", "does not fit .u64"},
		"operand count":           {"neg.f32\t\t%nc2, %nc2", "neg.f32\t\t%nc2", "takes 2 operands, got 1"},
		"guard not a predicate":   {"@%pexit bra", "@%n bra", "not a declared .pred"},
		"predicate from a number": {"and.pred\t%pok, %pfx, %pfv", "and.pred\t%pok, %pfx, %bad", "does not fit .pred"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(PTX, tc.from) {
				t.Fatalf("the kernel has no %q to change", tc.from)
			}
			errs := ptxTypeErrors(strings.Replace(PTX, tc.from, tc.to, 1))
			if !strings.Contains(strings.Join(errs, "\n"), tc.want) {
				t.Fatalf("with %q the checker said %q; want a message containing %q", tc.to, errs, tc.want)
			}
		})
	}
}

func TestPTXFits(t *testing.T) {
	tests := map[string]struct {
		decl, want string
		fits       bool
	}{
		"b32 as u32":   {"b32", "u32", true},
		"b32 as f32":   {"b32", "f32", true},
		"b64 as s64":   {"b64", "s64", true},
		"u32 as s32":   {"u32", "s32", true},
		"f32 as f32":   {"f32", "f32", true},
		"f32 as u32":   {"f32", "u32", false},
		"u32 as f32":   {"u32", "f32", false},
		"b32 as u64":   {"b32", "u64", false},
		"b64 as u32":   {"b64", "u32", false},
		"pred as pred": {"pred", "pred", true},
		"b32 as pred":  {"b32", "pred", false},
		"pred as u32":  {"pred", "u32", false},
		"undeclared":   {"", "u32", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.decl != "" && ptxFits(tc.decl, tc.want); got != tc.fits {
				t.Errorf("ptxFits(%q, %q) = %v, want %v", tc.decl, tc.want, got, tc.fits)
			}
		})
	}
}
