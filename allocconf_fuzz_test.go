package vram

import (
	"errors"
	"testing"
)

// FuzzParseAllocConf: any $VRAM_ALLOC_CONF is read or refused with
// ErrAllocConf, in a message of a line, never a panic.
func FuzzParseAllocConf(f *testing.F) {
	for _, s := range []string{"kind:pool,expandable:true,limit:8GiB,release_threshold:1GiB", "kind=pool", "kind:async,release_threshold:1G", "limit:0", ",", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		opts, err := ParseAllocConf(s)
		if err != nil {
			if !errors.Is(err, ErrAllocConf) {
				t.Fatalf("%q: error %v does not wrap ErrAllocConf", s, err)
			}
			if len(err.Error()) > 1024 { // each of at most three quoted pieces is 40 bytes, escaped up to 4 bytes each
				t.Fatalf("an error of %d bytes for %d bytes", len(err.Error()), len(s))
			}
			return
		}
		var c config
		for _, o := range opts {
			o(&c)
		}
	})
}
