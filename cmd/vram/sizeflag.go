// Size flags (--vram, --host-mem): read into bytes once, where the
// command line is parsed, and carried as bytes from there; the text as
// given stays beside them for messages.

package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/vramkit/vram/internal/units"
)

// sizeFlag is a size flag's value (a pflag.Value): a positive size such
// as 256MiB, read into bytes when the flag is parsed. A malformed or zero
// size is refused then, as a usage error naming the flag and the value
// (flagError). The zero sizeFlag, or one not given, is its default.
type sizeFlag struct {
	bytes   uint64 // the size; 0 for a flag with no default, not given
	text    string // as given (or the default's text), for messages
	set     bool   // given on the command line
	example string // a size the error suggests: "256MiB"
}

// newSizeFlag is a size flag whose default is def ("": none, 0 bytes),
// suggesting example in its error. def is a constant of the program: a
// malformed one panics.
func newSizeFlag(def, example string) *sizeFlag {
	s := &sizeFlag{text: def, example: example}
	if def != "" {
		n, err := units.ParseSize(def)
		if err != nil || n == 0 {
			panic(fmt.Sprintf("size flag default %q: %v", def, err))
		}
		s.bytes = n
	}
	return s
}

// Set reads v (pflag.Value).
func (s *sizeFlag) Set(v string) error {
	n, err := units.ParseSize(v)
	if err != nil || n == 0 {
		return fmt.Errorf("want a positive size such as %s", s.example)
	}
	s.bytes, s.text, s.set = n, v, true
	return nil
}

// String is the size as given (pflag.Value).
func (s *sizeFlag) String() string { return s.text }

// Type names the flag's kind in help and in flagError (pflag.Value).
func (s *sizeFlag) Type() string { return "size" }

// sizeVar defines a size flag on fl.
func sizeVar(fl *pflag.FlagSet, s *sizeFlag, name, usage string) { fl.Var(s, name, usage) }

// note is bytesNote of the flag's text: that a size without a unit was
// read as bytes.
func (s *sizeFlag) note() string { return bytesNote(s.text) }
