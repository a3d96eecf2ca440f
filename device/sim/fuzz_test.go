package sim_test

import (
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// FuzzAllocFree drives Malloc, Free, MallocAsync, FreeAsync, stream
// synchronization, held streams (a kernel waiting on a gate, so that
// frees stay pending) and kernels that read whole allocations from fuzz
// input. A kernel on stream s reads every live Malloc and every live
// MallocAsync block allocated on s; such a block is then freed on s, so
// the kernel runs before the free takes effect and must never see an
// error, however the pool hands the block out again meanwhile. It checks
// the internal invariants (CheckInvariants) and, after every step: live allocations never overlap; free memory is exactly
// total − context − Σ Malloc rounded to the granularity − the pool's
// reserve; the pool's used bytes are Σ MallocAsync rounded to 512 B; and
// freeing everything then trimming returns free memory to where it started.
func FuzzAllocFree(f *testing.F) {
	f.Add([]byte{0, 10, 1, 0, 2, 30, 3, 0, 4, 1})
	f.Add([]byte{2, 200, 2, 100, 6, 1, 3, 1, 2, 50, 5, 0, 4, 0})
	// A held stream; a kernel reads a block; the block is freed and a
	// smaller one takes its address before the kernel runs.
	f.Add([]byte{7, 0, 2, 6, 9, 0, 5, 0, 2, 3, 8, 0, 6, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const gran = 64 << 10
		d, err := sim.New(sim.Config{TotalBytes: 16 << 20, ContextBytes: gran, Granularity: gran, KernelWorkers: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		streams := []device.Stream{d.DefaultStream()}
		for range 2 {
			s, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, s)
		}
		start, total, _ := d.MemInfo()
		gates := map[int]chan struct{}{}
		releaseAll := func() {
			for i, g := range gates {
				close(g)
				delete(gates, i)
			}
		}
		defer releaseAll()
		type live struct {
			n     uint64
			async bool
			s     int  // MallocAsync: the allocating stream
			read  bool // a kernel on s may read it: free it on s
		}
		lives := map[device.Ptr]live{}
		var mallocReserved, asyncUsed uint64
		pick := func(b byte, async bool) (device.Ptr, bool) {
			i := int(b)
			for p, l := range lives { // map order is random; pick the i-th match
				if l.async == async {
					if i == 0 {
						return p, true
					}
					i--
				}
			}
			for p, l := range lives {
				if l.async == async {
					return p, true
				}
			}
			return 0, false
		}
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i]%10, ops[i+1]
			si := int(arg) % len(streams)
			s := streams[si]
			n := uint64(arg)*4099 + 1
			switch op {
			case 0, 1:
				p, err := d.Malloc(n)
				if err != nil {
					continue
				}
				lives[p] = live{n: n}
				r, _ := units.RoundUp(n, gran)
				mallocReserved += r
			case 2, 3:
				p, err := d.MallocAsync(n, s)
				if err != nil {
					continue
				}
				lives[p] = live{n: n, async: true, s: si}
				r, _ := units.RoundUp(n, sim.PoolAlignment)
				asyncUsed += r
			case 4:
				releaseAll() // Free waits for every stream
				if p, ok := pick(arg, false); ok {
					if err := d.Free(p); err != nil {
						t.Fatal(err)
					}
					r, _ := units.RoundUp(lives[p].n, gran)
					mallocReserved -= r
					delete(lives, p)
				}
			case 5:
				if p, ok := pick(arg, true); ok {
					if lives[p].read {
						s = streams[lives[p].s]
					}
					if err := d.FreeAsync(p, s); err != nil {
						t.Fatal(err)
					}
					r, _ := units.RoundUp(lives[p].n, sim.PoolAlignment)
					asyncUsed -= r
					delete(lives, p)
				}
			case 6:
				if _, held := gates[int(arg)%len(streams)]; held {
					continue
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
			case 7:
				if _, held := gates[int(arg)%len(streams)]; !held {
					g := make(chan struct{})
					gates[int(arg)%len(streams)] = g
					if err := d.LaunchFunc(s, 1, func(device.View, int, int) error { <-g; return nil }); err != nil {
						t.Fatal(err)
					}
				}
			case 8:
				releaseAll()
			case 9:
				type read struct {
					p device.Ptr
					n uint64
				}
				var reads []read
				for p, l := range lives {
					if !l.async || l.s == si {
						reads = append(reads, read{p, l.n})
						l.read = true
						lives[p] = l
					}
				}
				if err := d.LaunchFunc(s, 1, func(v device.View, _, _ int) error {
					for _, r := range reads {
						if _, err := v.Bytes(r.p, r.n); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			for p, l := range lives {
				for q, m := range lives {
					if p < q && uint64(p)+l.n > uint64(q) || q < p && uint64(q)+m.n > uint64(p) {
						t.Fatalf("live allocations %v (+%d) and %v (+%d) overlap", p, l.n, q, m.n)
					}
				}
			}
			if err := d.CheckInvariants(); err != nil {
				t.Fatalf("after op %d (%d, %d): %v", i/2, op, arg, err)
			}
			free, _, _ := d.MemInfo()
			reserved, used, _ := d.PoolUsage()
			if used != asyncUsed {
				t.Fatalf("pool used %d, want %d", used, asyncUsed)
			}
			if free != total-gran-mallocReserved-reserved {
				t.Fatalf("free %d, want %d - %d - %d - %d", free, total, gran, mallocReserved, reserved)
			}
		}
		releaseAll()
		for p, l := range lives {
			if l.async {
				err = d.FreeAsync(p, streams[l.s])
			} else {
				err = d.Free(p)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, s := range streams[1:] {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Synchronize(); err != nil { // the frees complete
			t.Fatal(err)
		}
		if err := d.TrimPool(0); err != nil {
			t.Fatal(err)
		}
		if free, _, _ := d.MemInfo(); free != start {
			t.Fatalf("after freeing everything free = %d, want %d", free, start)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
