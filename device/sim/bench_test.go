package sim_test

import (
	"fmt"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

func benchDevice(b *testing.B, addressOnly bool) *sim.Device {
	b.Helper()
	d, err := sim.New(sim.Config{TotalBytes: 1 << 40, AddressOnly: addressOnly})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// BenchmarkMallocFree is one Malloc/Free pair of 1 MiB with live
// allocations already on the device (the address index's depth).
func BenchmarkMallocFree(b *testing.B) {
	for _, mode := range []string{"backed", "address-only"} {
		for _, live := range []int{0, 10_000} {
			b.Run(fmt.Sprintf("%s/live=%d", mode, live), func(b *testing.B) {
				d := benchDevice(b, mode == "address-only")
				if mode == "backed" && live > 0 {
					b.Skip("backed live allocations would touch host memory; address-only shows the index cost")
				}
				var keep []device.Ptr
				for range live {
					p, err := d.Malloc(4096)
					if err != nil {
						b.Fatal(err)
					}
					keep = append(keep, p)
				}
				b.ReportAllocs()
				for b.Loop() {
					p, err := d.Malloc(1 << 20)
					if err != nil {
						b.Fatal(err)
					}
					if err := d.Free(p); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				for _, p := range keep {
					d.Free(p)
				}
			})
		}
	}
}

// BenchmarkFreeOpenStreams is a Malloc/Free pair on an address-only
// device with idle streams open: Free waits for every stream's work, and
// must not pay (or allocate) per stream to find out there is none.
func BenchmarkFreeOpenStreams(b *testing.B) {
	for _, n := range []int{1, 16, 10000} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			d := benchDevice(b, true)
			for range n {
				s, err := d.NewStream()
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
			}
			b.ReportAllocs()
			for b.Loop() {
				p, err := d.Malloc(1 << 20)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Free(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNewStreamClose makes and closes a stream beside n open ones:
// O(1), whatever n.
func BenchmarkNewStreamClose(b *testing.B) {
	for _, n := range []int{0, 10000} {
		b.Run(fmt.Sprintf("open=%d", n), func(b *testing.B) {
			d := benchDevice(b, true)
			for range n {
				s, err := d.NewStream()
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
			}
			b.ReportAllocs()
			for b.Loop() {
				s, err := d.NewStream()
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMallocAsyncFreeAsync is one stream-ordered pair on one stream,
// served from the pool's cache (threshold high so nothing is released).
func BenchmarkMallocAsyncFreeAsync(b *testing.B) {
	for _, live := range []int{0, 10_000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			d := benchDevice(b, true)
			s := d.DefaultStream()
			d.SetReleaseThreshold(1 << 62)
			var keep []device.Ptr
			for range live {
				p, err := d.MallocAsync(4096, s)
				if err != nil {
					b.Fatal(err)
				}
				keep = append(keep, p)
			}
			b.ReportAllocs()
			for b.Loop() {
				p, err := d.MallocAsync(64<<10, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.FreeAsync(p, s); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			for _, p := range keep {
				d.FreeAsync(p, s)
			}
			s.Synchronize()
		})
	}
}

func noop(device.View, int, int) error { return nil }

// BenchmarkStreamOp is an empty stream operation (a one-index no-op
// kernel): "enqueue" measures the call alone (the stream drains in the
// background; one Synchronize at the end), "enqueue+sync" the round trip
// through the stream's goroutine.
func BenchmarkStreamOp(b *testing.B) {
	b.Run("enqueue", func(b *testing.B) {
		d := benchDevice(b, false)
		s, _ := d.NewStream()
		defer s.Close()
		b.ReportAllocs()
		for b.Loop() {
			if err := d.LaunchFunc(s, 1, noop); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("enqueue+sync", func(b *testing.B) {
		d := benchDevice(b, false)
		s, _ := d.NewStream()
		defer s.Close()
		b.ReportAllocs()
		for b.Loop() {
			if err := d.LaunchFunc(s, 1, noop); err != nil {
				b.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sync idle", func(b *testing.B) {
		d := benchDevice(b, false)
		s, _ := d.NewStream()
		defer s.Close()
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Synchronize(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEvent is an event record followed by a query.
func BenchmarkEvent(b *testing.B) {
	b.Run("record+query", func(b *testing.B) {
		d := benchDevice(b, false)
		s, _ := d.NewStream()
		defer s.Close()
		e, _ := d.NewEvent()
		defer e.Close()
		b.ReportAllocs()
		for b.Loop() {
			if err := e.Record(s); err != nil {
				b.Fatal(err)
			}
			if _, err := e.Query(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("record+wait pending", func(b *testing.B) {
		// Each Wait enqueues a wait on s2, because s1 is held busy.
		d := benchDevice(b, false)
		s1, _ := d.NewStream()
		s2, _ := d.NewStream()
		defer s1.Close()
		defer s2.Close()
		e, _ := d.NewEvent()
		defer e.Close()
		gate := make(chan struct{})
		d.LaunchFunc(s1, 1, func(device.View, int, int) error { <-gate; return nil })
		b.ReportAllocs()
		for b.Loop() {
			if err := e.Record(s1); err != nil {
				b.Fatal(err)
			}
			if err := e.Wait(s2); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		close(gate)
		if err := s2.Synchronize(); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("record+wait+sync", func(b *testing.B) {
		d := benchDevice(b, false)
		s1, _ := d.NewStream()
		s2, _ := d.NewStream()
		defer s1.Close()
		defer s2.Close()
		e, _ := d.NewEvent()
		defer e.Close()
		b.ReportAllocs()
		for b.Loop() {
			d.LaunchFunc(s1, 1, noop)
			e.Record(s1)
			e.Wait(s2)
			if err := s2.Synchronize(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCopyHtoD is a 1 MiB host-to-device copy and synchronize.
func BenchmarkCopyHtoD(b *testing.B) {
	d := benchDevice(b, false)
	s := d.DefaultStream()
	p, _ := d.Malloc(1 << 20)
	defer d.Free(p)
	src := make([]byte, 1<<20)
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	for b.Loop() {
		if err := d.CopyHtoD(p, src, s); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCopyHtoD2D is a 2-D copy of 256 rows of 4 KiB (1 MiB moved)
// into rows 8 KiB apart, and a synchronize.
func BenchmarkCopyHtoD2D(b *testing.B) {
	d := benchDevice(b, false)
	s := d.DefaultStream()
	const rows, width, pitch = 256, 4 << 10, 8 << 10
	p, _ := d.Malloc(rows * pitch)
	defer d.Free(p)
	src := make([]byte, rows*width)
	b.SetBytes(rows * width)
	b.ReportAllocs()
	for b.Loop() {
		if err := d.CopyHtoD2D(p, pitch, src, width, width, rows, s); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVMUnmap is one page created, mapped, released and unmapped
// again with other pages mapped already, each from a handle released
// while mapped (as alloc.Expandable maps its pages): an Unmap that frees
// its handle must not pay per handle alive.
func BenchmarkVMUnmap(b *testing.B) {
	for _, live := range []int{0, 1024, 16384} {
		b.Run(fmt.Sprintf("mapped=%d", live), func(b *testing.B) {
			d := benchDevice(b, true)
			g := d.VMGranularity()
			base, err := d.ReserveAddress(uint64(live+1) * g)
			if err != nil {
				b.Fatal(err)
			}
			mapPage := func(at device.Ptr) {
				h, err := d.CreatePhysical(g)
				if err == nil {
					err = d.Map(at, g, h)
				}
				if err == nil {
					err = d.ReleasePhysical(h)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			for i := range live {
				mapPage(base.Add(uint64(i+1) * g))
			}
			b.ReportAllocs()
			for b.Loop() {
				mapPage(base)
				if err := d.Unmap(base, g); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			for i := range live {
				if err := d.Unmap(base.Add(uint64(i+1)*g), g); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
