package simtest_test

import (
	"fmt"
	"testing"

	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
)

// recorder is a testing.TB that keeps what the device's clean-up says.
type recorder struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// TestLeakFails: a device left with memory fails its test; one left
// clean does not.
func TestLeakFails(t *testing.T) {
	for name, leak := range map[string]bool{"clean": false, "leaked": true} {
		t.Run(name, func(t *testing.T) {
			r := &recorder{TB: t}
			dev := simtest.New(r, 1<<20, func(c *sim.Config) { c.Granularity = 4 << 10 })
			p, err := dev.Malloc(4096)
			if err != nil {
				t.Fatal(err)
			}
			if !leak {
				if err := dev.Free(p); err != nil {
					t.Fatal(err)
				}
			}
			for _, f := range r.cleanups {
				f()
			}
			if failed := len(r.errs) > 0; failed != leak {
				t.Errorf("errors %q; want a failure %v", r.errs, leak)
			}
		})
	}
}

// TestClosedByTheTest: a device the test closed itself passes its
// clean-up.
func TestClosedByTheTest(t *testing.T) {
	r := &recorder{TB: t}
	dev := simtest.New(r, 4<<20)
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range r.cleanups {
		f()
	}
	if len(r.errs) > 0 {
		t.Errorf("a device the test closed failed its clean-up: %q", r.errs)
	}
}
