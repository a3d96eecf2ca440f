package device

// A device spec read once: its backend's name and options, the options
// checked by the backend that reads them, and what they say about the
// device without opening it. A program that takes a spec on its command
// line (and a device size of its own, such as vram run's --vram) parses
// it with ParseSpec, sizes it with WithTotal and opens it with OpenSpec:
// the size travels as bytes, never pasted back into the spec's text.

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// specQuoteLen bounds how much of a spec, or of one of its options, a
// message quotes: specs come from flags and the environment, of any size.
const specQuoteLen = 64

// QuoteSpec quotes s, a device spec or a part of one, for a message: at
// most specQuoteLen bytes of it, cut at a character's start and marked
// with "…" and its length when longer.
func QuoteSpec(s string) string {
	if len(s) <= specQuoteLen {
		return strconv.Quote(s)
	}
	cut := specQuoteLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// SpecInfo is what a spec's options say about the device they make, read
// without opening it.
type SpecInfo struct {
	// TotalBytes is the device memory the options give; 0 when they
	// leave it to the backend (its default, or a GPU's own memory).
	TotalBytes uint64
	// Granularity is the device's page as the options make it; 0 when
	// it is known only once the device is open (a GPU's).
	Granularity uint64
}

// SpecReader is what a backend knows of its specs without opening a
// device.
type SpecReader struct {
	// Check reads opts (the text after the backend's name and colon, as
	// the Opener gets it) and says what they give; malformed options
	// are an error wrapping ErrBadSpec.
	Check func(opts string) (SpecInfo, error)
	// OpenSized opens a device with opts (which Check accepted, and
	// which give no size) and total bytes of memory. Nil for a backend
	// whose devices have their own memory (a GPU's).
	OpenSized func(opts string, total uint64) (Device, error)
}

var readers = map[string]SpecReader{} // guarded by backendsMu

// RegisterSpecReader lets ParseSpec check the specs of backend name and
// OpenSpec size its devices. Backends call it from init, beside
// Register; it panics if name is registered twice.
func RegisterSpecReader(name string, r SpecReader) { registerOnce(readers, "spec reader", name, r) }

// readerOf is the spec reader of backend name; "auto" is read as the
// simulator, to which it passes its options when it falls back.
func readerOf(name string) (SpecReader, bool) {
	if name == "auto" {
		name = "sim"
	}
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	r, ok := readers[name]
	return r, ok
}

// Spec is a device spec read by ParseSpec. The zero Spec is not valid.
type Spec struct {
	text    string // as given, trimmed
	backend string // lower case: auto, sim, cuda, …
	opts    string
	info    SpecInfo
	total   uint64 // WithTotal's size; 0: the spec's own
}

// ParseSpec reads a spec as Open does ("" is DefaultSpec) without
// opening anything: a linked backend or auto, whose options the backend
// checks (auto's the simulator's, which it falls back to). A spec it
// cannot read is an error wrapping ErrBadSpec.
func ParseSpec(text string) (Spec, error) {
	text, name, opts, err := splitSpec(text)
	if err != nil {
		return Spec{}, err
	}
	s := Spec{text: text, backend: name, opts: opts}
	if s.backend != "auto" {
		if _, err := lookup(s.backend); err != nil {
			return Spec{}, err
		}
	}
	if r, ok := readerOf(s.backend); ok && r.Check != nil {
		info, err := r.Check(opts)
		if err != nil {
			return Spec{}, err
		}
		s.info = info
	}
	return s, nil
}

// String is the spec as given.
func (s Spec) String() string { return s.text }

// Backend is the spec's backend name in lower case: auto, sim, cuda, ….
func (s Spec) Backend() string { return s.backend }

// Info is what the spec's options say about the device (for auto, the
// simulator it falls back to); TotalBytes is WithTotal's size once set.
func (s Spec) Info() SpecInfo {
	info := s.info
	if s.total != 0 {
		info.TotalBytes = s.total
	}
	return info
}

// Sizable reports whether the device the spec opens may take its size
// from WithTotal: its backend opens devices of a given size (for auto,
// the simulator it falls back to), and its options give none.
func (s Spec) Sizable() bool {
	r, ok := readerOf(s.backend)
	return ok && r.OpenSized != nil && s.info.TotalBytes == 0
}

// WithTotal is the spec opening a device of total bytes of memory; an
// error wrapping ErrBadSpec where the spec is not Sizable or total is 0.
// On auto the size is the simulator's, should it fall back to it.
func (s Spec) WithTotal(total uint64) (Spec, error) {
	switch {
	case total == 0:
		return Spec{}, fmt.Errorf("spec %s with a size of 0 bytes: want a positive size: %w", QuoteSpec(s.text), ErrBadSpec)
	case s.info.TotalBytes != 0:
		return Spec{}, fmt.Errorf("spec %s gives the device's size already: %w", QuoteSpec(s.text), ErrBadSpec)
	case !s.Sizable():
		return Spec{}, fmt.Errorf("spec %s: backend %q opens devices of their own size: %w", QuoteSpec(s.text), s.backend, ErrBadSpec)
	}
	s.total = total
	return s, nil
}

// SizedBy reports whether a device the spec opened, described by info,
// has the memory the spec gives (WithTotal's, its options' or its
// backend's default) rather than a memory of its own: its backend opens
// devices of a given size. On auto that is the simulator it fell back to.
func (s Spec) SizedBy(info Info) bool {
	if s.backend != "auto" && s.backend != info.Backend {
		return false
	}
	r, ok := readerOf(info.Backend)
	return ok && r.OpenSized != nil
}

// OpenSpec opens the device s names, as Open opens its text, at
// WithTotal's size where one is set. fallback is nil unless s is "auto"
// and CUDA was not used: then it is the error CUDA gave (wrapping
// ErrNoDevice), which a program may show to say why it runs on the
// simulator.
func OpenSpec(s Spec) (dev Device, fallback error, err error) {
	if s.backend == "" {
		return nil, nil, fmt.Errorf("the zero Spec names no device; make one with ParseSpec: %w", ErrBadSpec)
	}
	return openNamed(s.text, s.backend, s.opts, s.total)
}

// openBackend opens a device of backend name with opts, of total bytes
// when total is not 0 (through the backend's SpecReader).
func openBackend(name, opts string, total uint64) (Device, error) {
	open, err := lookup(name)
	if err != nil {
		return nil, err
	}
	if total == 0 {
		return open(opts)
	}
	r, ok := readerOf(name)
	if !ok || r.OpenSized == nil {
		return nil, fmt.Errorf("backend %q opens devices of their own size, not of %d bytes: %w", name, total, ErrBadSpec)
	}
	return r.OpenSized(opts, total)
}
