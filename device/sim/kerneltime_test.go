package sim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

func TestParseSpecKernelTime(t *testing.T) {
	for spec, want := range map[string]time.Duration{
		"kerneltime=2us":             2 * time.Microsecond,
		"kernel-time=1ms":            time.Millisecond,
		"kerneltime=0s":              0,
		"vram=1GiB,kerneltime=250ns": 250 * time.Nanosecond,
	} {
		c, err := sim.ParseSpec(spec)
		if err != nil || c.KernelTime != want {
			t.Errorf("ParseSpec(%q) = %v, %v; want KernelTime %v", spec, c.KernelTime, err, want)
		}
	}
	for _, bad := range []string{"kerneltime=2", "kerneltime=-1us", "kerneltime=fast"} {
		if _, err := sim.ParseSpec(bad); !errors.Is(err, device.ErrBadSpec) {
			t.Errorf("ParseSpec(%q): %v; want ErrBadSpec", bad, err)
		}
	}
}

// A launch over n indices takes at least n × KernelTime, and its blocks
// still run.
func TestKernelTime(t *testing.T) {
	d, err := sim.New(sim.Config{TotalBytes: 64 << 20, KernelTime: 50 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s := d.DefaultStream()
	var ran [2000]bool
	start := time.Now()
	if err := d.LaunchFunc(s, len(ran), func(_ device.View, lo, hi int) error {
		for i := lo; i < hi; i++ {
			ran[i] = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if got, want := time.Since(start), 2000*50*time.Microsecond; got < want {
		t.Errorf("launch over 2000 indices at 50µs each took %v; want at least %v", got, want)
	}
	for i, ok := range ran {
		if !ok {
			t.Fatalf("index %d did not run", i)
		}
	}
}
