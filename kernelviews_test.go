package vram

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram/kernel"
)

var _ kernel.Typed = (*DeviceArray)(nil) // a kernel's views check its dtype

// TestKernelViewsCheckTheDType: a Go kernel's Float64s view of a float32
// device array fails the launch (it once read the bytes as float64s).
func TestKernelViewsCheckTheDType(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Name: "c"})
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"x": fixed(Float32, 16)})
	if err != nil {
		t.Fatal(err)
	}
	for view, want := range map[string]string{"float32": "", "float64": "as []float64, but it is an array of float32"} {
		k, err := kernel.New("k", "", func(a kernel.Args, _, _ int) error {
			if view == "float32" {
				a.Float32s(0)[0] = 1
			} else {
				a.Float64s(0)[0] = 1
			}
			return nil
		}, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := c.Stream()
		err = errors.Join(k.Launch(m.Device(), s, 1, resp.Arrays()["x"]), c.Sync(t.Context()))
		if (err == nil) != (want == "") || (want != "" && (!errors.Is(err, kernel.ErrArgs) || !strings.Contains(err.Error(), want))) {
			t.Errorf("%s view of a float32 array: %v; want %q", view, err, want)
		}
	}
}
