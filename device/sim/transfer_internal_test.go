package sim

import (
	"fmt"
	"testing"
	"time"
)

// A copy under CopyBandwidth takes the longer of the link's time and the
// host's own work, not their sum.
func TestTransferTakesTheLonger(t *testing.T) {
	// Generous for a loaded machine; the sum of link time and work that
	// this guards against is at least 100 ms more than the longer.
	const slack = 95 * time.Millisecond
	cases := map[string]struct {
		bw   uint64
		n    uint64
		work time.Duration // the host's work of the copy
		want time.Duration
	}{
		"link only":            {bw: 1e9, n: 200e6, want: 200 * time.Millisecond},
		"work within the link": {bw: 1e9, n: 200e6, work: 120 * time.Millisecond, want: 200 * time.Millisecond},
		"work past the link":   {bw: 1e9, n: 100e6, work: 200 * time.Millisecond, want: 200 * time.Millisecond},
		"no bandwidth":         {n: 100e6, work: 50 * time.Millisecond, want: 50 * time.Millisecond},
		"short, spun":          {bw: 1e9, n: 1e6, want: time.Millisecond},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, err := New(Config{TotalBytes: 64 << 20, CopyBandwidth: tc.bw})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			retryTimed(t, func() string {
				ran := false
				start := time.Now()
				d.transfer(tc.n, func() {
					ran = true
					time.Sleep(tc.work)
				})
				took := time.Since(start)
				if !ran {
					t.Fatal("transfer did not run the copy")
				}
				if took < tc.want {
					t.Errorf("took %v, want at least %v", took, tc.want)
				}
				if took > tc.want+slack {
					return fmt.Sprintf("took %v, want %v (up to %v more)", took, tc.want, slack)
				}
				return ""
			})
		})
	}
}

func TestWaitUntil(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, 300 * time.Microsecond, spinBelow, 5 * time.Millisecond} {
		at := time.Now().Add(d)
		waitUntil(at)
		if now := time.Now(); now.Before(at) {
			t.Errorf("waitUntil(now%+v) returned %v early", d, at.Sub(now))
		}
	}
}
