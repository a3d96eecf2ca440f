package alloc_test

import (
	"errors"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// TestPoolCheckBlocks: with CheckBlocks the simulator's memory checker
// sees the pool's blocks, so a kernel reading past a 4000-byte block
// fails at Synchronize; without it the read lands in the segment unseen.
func TestPoolCheckBlocks(t *testing.T) {
	for _, on := range []bool{false, true} {
		dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
		p, err := alloc.NewPool(dev, alloc.PoolConfig{CheckBlocks: on})
		if err != nil {
			t.Fatal(err)
		}
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		ptr, err := p.Alloc(4000, s)
		if err != nil {
			t.Fatal(err)
		}
		read := func(n uint64) func(device.View, int, int) error {
			return func(v device.View, lo, hi int) error {
				_, err := v.Bytes(ptr, n)
				return err
			}
		}
		if err := dev.LaunchFunc(s, 1, read(4000)); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Errorf("CheckBlocks=%v: reading the block: %v", on, err)
		}
		if err := dev.LaunchFunc(s, 1, read(4001)); err != nil {
			t.Fatal(err)
		}
		err = s.Synchronize()
		switch {
		case on && !errors.Is(err, device.ErrOutOfBounds):
			t.Errorf("CheckBlocks on: reading 1 byte past the block: %v, want ErrOutOfBounds", err)
		case !on && err != nil:
			t.Errorf("CheckBlocks off: reading past the block inside the segment: %v, want nil", err)
		}
		if err := p.Free(ptr, s); err != nil {
			t.Fatal(err)
		}
		if on {
			// The block is unmarked: a kernel using it after the free fails.
			if err := dev.LaunchFunc(s, 1, read(1)); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); !errors.Is(err, device.ErrUseAfterFree) {
				t.Errorf("CheckBlocks on: read after Free: %v, want ErrUseAfterFree", err)
			}
			// Reused, it is marked again.
			q, err := p.Alloc(4000, s)
			if err != nil {
				t.Fatal(err)
			}
			if err := dev.LaunchFunc(s, 1, func(v device.View, lo, hi int) error { _, err := v.Bytes(q, 4000); return err }); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Errorf("CheckBlocks on: reusing the block: %v", err)
			}
			if err := p.Free(q, s); err != nil {
				t.Fatal(err)
			}
			if err := p.Free(q, s); err == nil {
				t.Error("CheckBlocks on: double Free: nil error")
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
