package alloctest

import (
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
)

// TestBlocksCatchBadAllocations: the interval tracker the suite relies on
// refuses each kind of bad block and accepts touching neighbours.
func TestBlocksCatchBadAllocations(t *testing.T) {
	tests := map[string]struct {
		p       device.Ptr
		n       uint64
		wantErr string // "" for accepted
	}{
		"zero pointer":        {0, 16, "zero pointer"},
		"misaligned":          {0x10080, 16, "not aligned"},
		"same start":          {0x10000, 16, "already live"},
		"inside a live block": {0x10200, 16, "overlaps"},
		"overlaps next start": {0xff00, 0x101, "overlaps"},
		"covers a live block": {0xf000, 0x10000, "overlaps"},
		"wraps":               {device.Ptr(^uint64(0) &^ (Alignment - 1)), 1 << 20, "wraps"},
		"touches the end":     {0x10400, 16, ""},
		"touches the start":   {0xff00, 0x100, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := newBlocks()
			if err := b.add(0x10000, 0x400, nil); err != nil { // live: [0x10000, 0x10400)
				t.Fatal(err)
			}
			err := b.add(tc.p, tc.n, nil)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("add(%v, %d): %v, want accepted", tc.p, tc.n, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("add(%v, %d): err = %v, want one saying %q", tc.p, tc.n, err, tc.wantErr)
			}
			wantLen := 1
			if tc.wantErr == "" {
				wantLen = 2
			}
			if b.len() != wantLen {
				t.Errorf("%d blocks tracked, want %d", b.len(), wantLen)
			}
		})
	}
}

func TestBlocksRemove(t *testing.T) {
	b := newBlocks()
	for _, p := range []device.Ptr{0x3000, 0x1000, 0x2000} {
		if err := b.add(p, 0x100, nil); err != nil {
			t.Fatal(err)
		}
	}
	if p, n, _ := b.at(0); p != 0x1000 || n != 0x100 {
		t.Errorf("at(0) = %v, %d; want the lowest block", p, n)
	}
	if n, ok := b.remove(0x2000); !ok || n != 0x100 || b.liveBytes() != 0x200 {
		t.Errorf("remove: %d, %v; %d bytes left", n, ok, b.liveBytes())
	}
	if _, ok := b.remove(0x2000); ok {
		t.Errorf("second remove of the same block succeeded")
	}
	if err := b.add(0x2000, 0x1000, nil); err != nil {
		t.Errorf("re-adding the freed range: %v", err)
	}
}
