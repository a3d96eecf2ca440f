package device

// Several devices from one list of specs: the --devices grammar.
//
//	all                       every CUDA device the driver lists
//	SPEC;SPEC;...             each spec as Open reads it ("," also separates
//	                          specs where the next one starts with a backend
//	                          name and a colon, or is a bare backend name)
//	sim:count=N,OPTS          N simulators with OPTS, ordinals 0 … N−1
//
// A sim spec in a list that gives no ordinal gets its place in the list,
// so the devices of one list are told apart in reports.

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxCount is the most devices a count= option may make.
const MaxCount = 64

// Counter counts the devices of one backend (for "all").
type Counter func() (int, error)

var counters = map[string]Counter{} // guarded by backendsMu

// RegisterCounter lets "all" count the devices of backend name. Backends
// call it from init; it panics if name is registered twice.
func RegisterCounter(name string, count Counter) { registerOnce(counters, "counter", name, count) }

// ParseSpecs reads a list of device specs (see the grammar above) into
// one spec per device, for Open. "all" asks the CUDA backend how many
// devices it has; with none (or no driver) the error wraps ErrNoDevice.
// A malformed list returns an error wrapping ErrBadSpec.
func ParseSpecs(list string) ([]string, error) {
	list = strings.TrimSpace(list)
	if strings.EqualFold(list, "all") {
		return allCUDA()
	}
	var specs []string
	for _, item := range splitSpecs(list) {
		expanded, err := expandCount(item)
		if err != nil {
			return nil, err
		}
		specs = append(specs, expanded...)
	}
	if len(specs) == 0 {
		return nil, fmt.Errorf("device list %s names no device; want all, or device specs separated by ';' (sim:count=4, or cuda:0;cuda:1): %w", QuoteSpec(list), ErrBadSpec)
	}
	if len(specs) > 1 {
		for i, s := range specs {
			specs[i] = withOrdinal(s, i)
		}
	}
	return specs, nil
}

// ReadSpecs is ParseSpecs with each spec read by its backend
// (ParseSpec), for OpenSpec: a program opens a list's devices with
// OpenSpec, one by one, and closes those it opened should one fail. A spec its backend refuses is an error
// wrapping ErrBadSpec that names its place in the list.
func ReadSpecs(list string) ([]Spec, error) {
	texts, err := ParseSpecs(list)
	if err != nil {
		return nil, err
	}
	specs := make([]Spec, len(texts))
	for i, t := range texts {
		if specs[i], err = ParseSpec(t); err != nil {
			return nil, fmt.Errorf("device %d of %d (%q): %w", i+1, len(texts), t, err)
		}
	}
	return specs, nil
}

func allCUDA() ([]string, error) {
	backendsMu.RLock()
	count := counters["cuda"]
	backendsMu.RUnlock()
	if count == nil {
		return nil, fmt.Errorf("--devices all: the cuda backend is not linked into this program: %w", ErrNoDevice)
	}
	n, err := count()
	if err != nil {
		return nil, fmt.Errorf("--devices all counts CUDA devices, and there are none here (give a list such as sim:count=4 for the simulator): %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("--devices all: the CUDA driver lists no device (give a list such as sim:count=4 for the simulator): %w", ErrNoDevice)
	}
	specs := make([]string, n)
	for i := range specs {
		specs[i] = "cuda:" + strconv.Itoa(i)
	}
	return specs, nil
}

// splitSpecs cuts a list at ";" and at "," where what follows starts a
// spec (a backend name and a colon, or a bare backend name or "auto").
func splitSpecs(list string) []string {
	var out []string
	for _, part := range strings.Split(list, ";") {
		cur := ""
		for _, f := range strings.Split(part, ",") {
			if cur != "" && startsSpec(f) {
				out = append(out, strings.TrimSpace(cur))
				cur = ""
			}
			if cur != "" {
				cur += ","
			}
			cur += f
		}
		if strings.TrimSpace(cur) != "" {
			out = append(out, strings.TrimSpace(cur))
		}
	}
	return out
}

func startsSpec(f string) bool {
	name, _, hasColon := strings.Cut(strings.TrimSpace(f), ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if strings.Contains(name, "=") {
		return false
	}
	known := name == "auto" || name == "sim" || name == "cuda"
	return known && (hasColon || !strings.Contains(f, "="))
}

// expandCount turns "sim:count=N,OPTS" into N copies of "sim:OPTS".
func expandCount(spec string) ([]string, error) {
	name, opts, _ := strings.Cut(spec, ":")
	var keep []string
	n := 1
	found := false
	for _, kv := range strings.Split(opts, ",") {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.EqualFold(strings.TrimSpace(k), "count") {
			if strings.TrimSpace(kv) != "" {
				keep = append(keep, strings.TrimSpace(kv))
			}
			continue
		}
		c, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || c < 1 || c > MaxCount || found {
			return nil, fmt.Errorf("spec %s: count=%s: want one count, 1 to %d devices: %w", QuoteSpec(spec), QuoteSpec(strings.TrimSpace(v)), MaxCount, ErrBadSpec)
		}
		n, found = c, true
	}
	if !found {
		return []string{spec}, nil
	}
	if n > 1 && strings.Contains(strings.ToLower(opts), "ordinal=") {
		return nil, fmt.Errorf("spec %s: count= with ordinal=: the devices would share one ordinal; give one of them: %w", QuoteSpec(spec), ErrBadSpec)
	}
	if !strings.EqualFold(strings.TrimSpace(name), "sim") {
		return nil, fmt.Errorf("spec %s: count= is for the simulator; for CUDA devices give all or cuda:0;cuda:1: %w", QuoteSpec(spec), ErrBadSpec)
	}
	one := strings.TrimSpace(name)
	if len(keep) > 0 {
		one += ":" + strings.Join(keep, ",")
	}
	out := make([]string, n)
	for i := range out {
		out[i] = one
	}
	return out, nil
}

// withOrdinal gives a sim spec without an ordinal the ordinal i.
func withOrdinal(spec string, i int) string {
	name, opts, _ := strings.Cut(spec, ":")
	if !strings.EqualFold(strings.TrimSpace(name), "sim") || strings.Contains(strings.ToLower(opts), "ordinal=") {
		return spec
	}
	if strings.TrimSpace(opts) == "" {
		return "sim:ordinal=" + strconv.Itoa(i)
	}
	return spec + ",ordinal=" + strconv.Itoa(i)
}

// OpenAll opens every device of a list (ParseSpecs). On an error it
// closes those it opened and returns the error.
//
// Deprecated: read the list once with ReadSpecs and open each Spec with
// OpenSpec, which also says why an "auto" spec fell back to the
// simulator. OpenAll stays for the programs that call it.
func OpenAll(list string) ([]Device, error) {
	specs, err := ReadSpecs(list)
	if err != nil {
		return nil, err
	}
	devs := make([]Device, 0, len(specs))
	for i, s := range specs {
		d, _, err := OpenSpec(s)
		if err != nil {
			errs := []error{fmt.Errorf("device %d of %d (%q): %w", i+1, len(specs), s, err)}
			for _, o := range devs {
				errs = append(errs, o.Close())
			}
			return nil, errors.Join(errs...)
		}
		devs = append(devs, d)
	}
	return devs, nil
}
