package sim_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/vramkit/vram/device/sim"
)

// TestCopiesOverlapKernels: the simulator says its copies and kernels
// overlap only where part of either is emulated time, or the kernels
// leave a core free.
func TestCopiesOverlapKernels(t *testing.T) {
	tests := map[string]struct {
		cfg  sim.Config
		want bool
	}{
		"host work on every core": {sim.Config{}, false},
		"an emulated link":        {sim.Config{CopyBandwidth: 1e9}, true},
		"emulated kernel time":    {sim.Config{KernelTime: time.Microsecond}, true},
		"a core left free":        {sim.Config{KernelWorkers: max(runtime.GOMAXPROCS(0)-1, 0)}, runtime.GOMAXPROCS(0) > 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.cfg.TotalBytes, tc.cfg.AddressOnly = 64<<20, true
			d, err := sim.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if got := d.CopiesOverlapKernels(); got != tc.want {
				t.Errorf("CopiesOverlapKernels() = %v, want %v", got, tc.want)
			}
		})
	}
}
