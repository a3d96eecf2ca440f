package cuda

import (
	"fmt"
	"math"
	"regexp"
	"runtime"
	"strings"
	"unsafe"

	"github.com/vramkit/vram/device"
)

// Kernel arguments. cuLaunchKernel takes kernelParams, an array with one
// pointer per kernel parameter, each pointing to that parameter's value;
// the driver reads as many bytes behind each pointer as the kernel's
// parameter is wide, and copies them before cuLaunchKernel returns.
// packArgs builds both: one 8-byte slot per argument (values stored
// little-endian from the slot's start, so a 4-byte parameter reads the low
// half) and the pointer array into those slots.
//
// Memory passed to C must hold no Go pointers the collector does not know
// to be pinned. So the slots are pinned (runtime.Pinner, which also moves
// them to the heap) and the pointer array holds their addresses as
// uintptr: it is plain integers, which the driver may read freely. The
// caller unpins after cuLaunchKernel has returned.

// ptxParam is one parameter of a PTX entry, as declared in the PTX text.
type ptxParam struct {
	typ  string // the PTX type without its dot: u64, f32, b32, ...
	size int    // bytes
}

// argSlot is the packed form of one argument.
type argSlot struct {
	bits uint64
	size int    // 4 or 8
	kind string // Go type name, for messages
	ptr  bool   // a device.Ptr, checked against the allocation records
}

// packArg converts one Launch argument.
func packArg(a any) (argSlot, error) {
	switch v := a.(type) {
	case device.Ptr:
		return argSlot{bits: uint64(v), size: 8, kind: "device.Ptr", ptr: true}, nil
	case int32:
		return argSlot{bits: uint64(uint32(v)), size: 4, kind: "int32"}, nil
	case uint32:
		return argSlot{bits: uint64(v), size: 4, kind: "uint32"}, nil
	case int64:
		return argSlot{bits: uint64(v), size: 8, kind: "int64"}, nil
	case uint64:
		return argSlot{bits: v, size: 8, kind: "uint64"}, nil
	case float32:
		return argSlot{bits: uint64(math.Float32bits(v)), size: 4, kind: "float32"}, nil
	case float64:
		return argSlot{bits: math.Float64bits(v), size: 8, kind: "float64"}, nil
	}
	return argSlot{}, fmt.Errorf("kernel argument of type %T: pass a device.Ptr, int32, uint32, int64, uint64, float32 or float64: %w",
		a, device.ErrInvalidValue)
}

// packArgs converts args for a kernel whose parameters are params (nil when
// the PTX declaration could not be read; then only the Go types are
// checked). It returns the argument slots, the values (pinned with pin)
// and the kernelParams array of their addresses.
func packArgs(name string, params []ptxParam, args []any, pin *runtime.Pinner) ([]argSlot, []uint64, []uintptr, error) {
	if params != nil && len(args) != len(params) {
		return nil, nil, nil, fmt.Errorf("kernel %s takes %d parameters, got %d arguments: %w",
			name, len(params), len(args), device.ErrInvalidValue)
	}
	slots := make([]argSlot, len(args))
	vals := make([]uint64, len(args))
	ptrs := make([]uintptr, len(args))
	if len(vals) > 0 {
		pin.Pin(&vals[0]) // pins the whole array
	}
	for i, a := range args {
		s, err := packArg(a)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("kernel %s argument %d: %w", name, i, err)
		}
		if params != nil && params[i].size != s.size {
			return nil, nil, nil, fmt.Errorf("kernel %s argument %d is a %s (%d bytes) but the parameter is .%s (%d bytes): %w",
				name, i, s.kind, s.size, params[i].typ, params[i].size, device.ErrInvalidValue)
		}
		slots[i] = s
		vals[i] = s.bits
		ptrs[i] = uintptr(unsafe.Pointer(&vals[i]))
	}
	return slots, vals, ptrs, nil
}

var (
	// entryRE finds ".entry name ( params )"; PTX parameter lists hold no
	// parentheses of their own.
	entryRE = regexp.MustCompile(`\.entry\s+([A-Za-z_$%][\w$]*)\s*\(([^)]*)\)`)
	// paramRE reads one ".param [.align N] .type [.ptr...] name[N]".
	paramRE   = regexp.MustCompile(`^\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+[0-9]+)(?:\s+\.ptr(?:\.(?:global|const|local|shared))?(?:\s*\.align\s+\d+)?)?\s+[A-Za-z_$%][\w$]*\s*(\[\s*(\d+)\s*\])?$`)
	commentRE = regexp.MustCompile(`(?s)//[^\n]*|/\*.*?\*/`)
)

// ptxEntries reads the parameter lists of the .entry functions declared in
// ptx. An entry whose list it cannot read fully is left out (Launch then
// checks only the Go types of its arguments).
func ptxEntries(ptx string) map[string][]ptxParam {
	ptx = commentRE.ReplaceAllString(ptx, "")
	out := map[string][]ptxParam{}
	for _, m := range entryRE.FindAllStringSubmatch(ptx, -1) {
		name, list := m[1], strings.TrimSpace(m[2])
		params := []ptxParam{}
		ok := true
		if list != "" {
			for _, p := range strings.Split(list, ",") {
				pm := paramRE.FindStringSubmatch(strings.Join(strings.Fields(p), " "))
				if pm == nil || pm[2] != "" { // arrays (structs by value) are not supported by Launch
					ok = false
					break
				}
				size := ptxTypeSize(pm[1])
				if size == 0 {
					ok = false
					break
				}
				params = append(params, ptxParam{typ: pm[1], size: size})
			}
		}
		if ok {
			out[name] = params
		}
	}
	return out
}

// ptxTypeSize is the width in bytes of a PTX fundamental type, or 0.
func ptxTypeSize(t string) int {
	switch t {
	case "u8", "s8", "b8":
		return 1
	case "u16", "s16", "b16", "f16":
		return 2
	case "u32", "s32", "b32", "f32":
		return 4
	case "u64", "s64", "b64", "f64":
		return 8
	}
	return 0
}
