package alloc_test

// Out of memory with free blocks that wait on other streams: the pool
// waits for those streams' work (with its lock released) before it gives
// up, and says apart bytes that wait on other streams from fragmentation.

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// waitProbe is a simulated device whose events report each Synchronize
// on a channel (so a test knows, without timing, that a caller is about
// to block on one) and can be made to fail it.
type waitProbe struct {
	*sim.Device
	waits    chan struct{} // one value per Event.Synchronize, if there is room
	failWait error         // returned by Event.Synchronize when set
}

func newWaitProbe(t *testing.T, cfg sim.Config) *waitProbe {
	t.Helper()
	cfg.NoContext = true
	return &waitProbe{Device: openSimT(t, cfg), waits: make(chan struct{}, 16)}
}

func (d *waitProbe) NewEvent() (device.Event, error) {
	ev, err := d.Device.NewEvent()
	if err != nil {
		return nil, err
	}
	return &probedWait{Event: ev, d: d}, nil
}

type probedWait struct {
	device.Event
	d *waitProbe
}

func (e *probedWait) Synchronize() error {
	select {
	case e.d.waits <- struct{}{}:
	default:
	}
	if e.d.failWait != nil {
		return e.d.failWait
	}
	return e.Event.Synchronize()
}

// lastUse enqueues on s a kernel that fills [p, p+n) with v: the last use
// of a block about to be freed on s.
func lastUse(t *testing.T, dev *sim.Device, p device.Ptr, n uint64, v byte, s device.Stream) {
	t.Helper()
	err := dev.LaunchFunc(s, 1, func(mem device.View, _, _ int) error {
		b, err := mem.Bytes(p, n)
		for i := range b {
			b[i] = v
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPoolOutOfMemoryWaitsForOtherStreams fills a 22 MiB device with 5 MiB
// blocks on stream S (one 20 MiB segment), holds S busy and frees blocks
// on it behind the hold, each with a last write queued there. An Alloc on
// another stream that only the freed memory can serve must wait for S
// (not fail at once, and not take the memory before the writes land),
// then get the freed memory, coalesced where two freed blocks touch.
func TestPoolOutOfMemoryWaitsForOtherStreams(t *testing.T) {
	tests := map[string]struct {
		free []int  // blocks (of four) freed behind the hold, on S then on U alternately
		ask  uint64 // asked for on T
		at   int    // the block the answer must start at
	}{
		"one block freed on a busy stream":          {free: []int{0}, ask: 5 * mib, at: 0},
		"two blocks on two busy streams, coalesced": {free: []int{1, 2}, ask: 10 * mib, at: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := newWaitProbe(t, sim.Config{TotalBytes: 22 * mib})
			p := newPoolOn(t, dev)
			S, U, T := newStreamT(t, dev.Device), newStreamT(t, dev.Device), newStreamT(t, dev.Device)
			var blocks []device.Ptr
			for range 4 {
				blocks = append(blocks, mustAlloc(t, p, 5*mib, S))
			}
			if err := S.Synchronize(); err != nil {
				t.Fatal(err)
			}
			releaseS, releaseU := busy(t, dev.Device, S), busy(t, dev.Device, U)
			// U may wait on S (below): should the test stop early, open S first.
			t.Cleanup(func() { releaseS(); releaseU() })
			for k, i := range tc.free {
				on := S
				if k%2 == 1 {
					on = U
					// The block was used on S: order S's work into U first.
					orderInto(t, dev.Device, S, U)
				}
				lastUse(t, dev.Device, blocks[i], 5*mib, 0xAA, on)
				if err := p.Free(blocks[i], on); err != nil {
					t.Fatal(err)
				}
			}
			before := p.Stats()

			type result struct {
				p   device.Ptr
				err error
			}
			got := make(chan result, 1)
			go func() {
				q, err := p.Alloc(tc.ask, T)
				got <- result{q, err}
			}()
			select {
			case r := <-got:
				t.Fatalf("Alloc(%d MiB) on T returned (%v, %v) while the streams that freed the memory were held; want it to wait for them",
					tc.ask/mib, r.p, r.err)
			case <-dev.waits:
			}
			releaseS()
			releaseU()
			r := <-got
			if r.err != nil {
				t.Fatalf("Alloc(%d MiB) on T after waiting: %v", tc.ask/mib, r.err)
			}
			if r.p != blocks[tc.at] {
				t.Errorf("Alloc on T got %v, want the freed memory at %v", r.p, blocks[tc.at])
			}
			if err := dev.Memset(r.p, 0x55, tc.ask, T); err != nil {
				t.Fatal(err)
			}
			expectBytes(t, dev.Device, r.p, tc.ask, 0x55, T)
			after := p.Stats()
			if after.Retries != before.Retries+1 || after.OOMs != before.OOMs || after.DeviceAllocs != before.DeviceAllocs || after.CacheHits != before.CacheHits+1 {
				t.Errorf("stats %+v → %+v: want one retry served from the cache", before, after)
			}
			if err := p.CheckInvariants(); err != nil {
				t.Error(err)
			}
			if err := p.Free(r.p, T); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPoolOutOfMemoryErrorSaysWhatWaits: when waiting for the stream that
// freed the memory fails, the Alloc fails with an error that counts the
// bytes waiting on other streams' work apart from fragmentation, keeps the
// figures, and changes nothing but OOMs and Retries; once the stream is
// done, the same Alloc succeeds from the cache.
func TestPoolOutOfMemoryErrorSaysWhatWaits(t *testing.T) {
	dev := newWaitProbe(t, sim.Config{TotalBytes: 22 * mib})
	p := newPoolOn(t, dev)
	S, T := newStreamT(t, dev.Device), newStreamT(t, dev.Device)
	var blocks []device.Ptr
	for range 4 {
		blocks = append(blocks, mustAlloc(t, p, 5*mib, S))
	}
	release := busy(t, dev.Device, S)
	if err := p.Free(blocks[0], S); err != nil {
		t.Fatal(err)
	}
	dev.failWait = errors.New("injected wait failure")
	before := p.Stats()
	_, err := p.Alloc(5*mib, T)
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("Alloc(5 MiB) with the wait failing: err = %v, want ErrOutOfMemory", err)
	}
	for _, want := range []string{
		"alloc of 5 MiB", "15 MiB allocated", "20 MiB reserved", "5 MiB cached", "largest free block 5 MiB",
		"5 MiB of it waiting on other streams' work", "5 MiB freed on other streams cannot be used on stream",
		"waiting for those streams failed", "injected",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "not in one piece") {
		t.Errorf("error %q blames fragmentation for memory that waits on another stream", err)
	}
	after := p.Stats()
	if after.OOMs != before.OOMs+1 || after.Retries != before.Retries+1 {
		t.Errorf("stats %+v → %+v: want one OOM and one retry", before, after)
	}
	after.OOMs, after.Retries = before.OOMs, before.Retries
	if after != before {
		t.Errorf("a failed Alloc changed the pool's accounting: %+v → %+v", before, after)
	}
	if err := p.CheckInvariants(); err != nil {
		t.Error(err)
	}

	dev.failWait = nil
	release()
	q, err := p.Alloc(5*mib, T)
	if err != nil {
		t.Fatalf("Alloc(5 MiB) once stream S is done: %v", err)
	}
	if q != blocks[0] {
		t.Errorf("Alloc got %v, want the block freed on S (%v)", q, blocks[0])
	}
	for _, b := range append(blocks[1:], q) {
		if err := p.Free(b, T); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPoolOutOfMemoryFragmented: with nothing waiting on other streams, a
// cache that holds the bytes in pieces is called fragmentation.
func TestPoolOutOfMemoryFragmented(t *testing.T) {
	dev := newWaitProbe(t, sim.Config{TotalBytes: 22 * mib})
	p := newPoolOn(t, dev)
	s := dev.DefaultStream()
	var blocks []device.Ptr
	for range 4 {
		blocks = append(blocks, mustAlloc(t, p, 5*mib, s))
	}
	for _, i := range []int{0, 2} {
		if err := p.Free(blocks[i], s); err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.Alloc(10*mib, s)
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("Alloc(10 MiB): err = %v, want ErrOutOfMemory", err)
	}
	for _, want := range []string{"10 MiB cached", "largest free block 5 MiB", "0 B of it waiting", "not in one piece"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if len(dev.waits) != 0 {
		t.Errorf("the pool waited on %d events with nothing freed on another stream", len(dev.waits))
	}
	for _, i := range []int{1, 3} {
		if err := p.Free(blocks[i], s); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPoolOutOfMemoryOwnBlockNextToShared: blocks T freed lie next to
// one S freed, already promoted to the shared set (S's work is done): a
// run all of it usable on T. Out of memory, the pool merges T's blocks
// with their shared neighbour and hands the run out rather than blaming
// fragmentation.
func TestPoolOutOfMemoryOwnBlockNextToShared(t *testing.T) {
	tests := map[string]struct {
		freeOnT []int // of the four 5 MiB blocks, T's (block 1 is S's)
		want    uint64
	}{
		"own block then shared":           {freeOnT: []int{0}, want: 10 * mib},
		"own blocks on both sides":        {freeOnT: []int{0, 2}, want: 15 * mib},
		"own block freed after the other": {freeOnT: []int{2, 0}, want: 15 * mib},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 22 * mib, NoContext: true, AddressOnly: true})
			p := newPoolOn(t, dev)
			S, T := newStreamT(t, dev), newStreamT(t, dev)
			var blocks []device.Ptr
			for range 4 {
				blocks = append(blocks, mustAlloc(t, p, 5*mib, T))
			}
			if len(p.Segments()) != 1 || uint64(blocks[1]) != uint64(blocks[0])+5*mib {
				t.Fatalf("layout: %+v", p.Segments())
			}
			for _, i := range tc.freeOnT {
				if err := p.Free(blocks[i], T); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.Free(blocks[1], S); err != nil {
				t.Fatal(err)
			}
			if err := dev.Synchronize(); err != nil { // every stream's work is done
				t.Fatal(err)
			}
			q, err := p.Alloc(tc.want, T)
			if err != nil {
				t.Fatalf("Alloc(%d MiB) on T with its own blocks and a shared one side by side: %v", tc.want/mib, err)
			}
			if q != blocks[0] {
				t.Errorf("Alloc = %v, want the run at %v", q, blocks[0])
			}
			if err := p.CheckInvariants(); err != nil {
				t.Error(err)
			}
			live := []device.Ptr{q, blocks[3]}
			if len(tc.freeOnT) == 1 {
				live = append(live, blocks[2])
			}
			for _, x := range live {
				if err := p.Free(x, T); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.CheckInvariants(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestPoolOutOfMemoryOtherClass: cached bytes that only the other size
// class may use are not called fragmentation.
func TestPoolOutOfMemoryOtherClass(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 22 * mib, NoContext: true, AddressOnly: true})
	p := newPoolOn(t, dev)
	s := dev.DefaultStream()
	small := mustAlloc(t, p, 4096, s) // a 2 MiB small segment, held
	big := mustAlloc(t, p, 20*mib, s) // the rest of the device
	_, err := p.Alloc(mib+mib/2, s)   // large class: the small segment's cache cannot serve it
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("Alloc(1.5 MiB): err = %v, want ErrOutOfMemory", err)
	}
	for _, want := range []string{"only 0 B of them serve requests of this size", "segments for small requests (at most 1 MiB)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "not in one piece") {
		t.Errorf("error %q calls the other class's cache fragmentation", err)
	}
	for _, x := range []device.Ptr{small, big} {
		if err := p.Free(x, s); err != nil {
			t.Fatal(err)
		}
	}
}

// newPoolOn makes a Pool on dev, closed when the test ends — after the
// holds that the test registers later are released, so that its device
// frees do not wait on a held stream.
func newPoolOn(t *testing.T, dev device.Device) *alloc.Pool {
	t.Helper()
	p, err := alloc.NewPool(dev, alloc.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("pool Close: %v", err)
		}
	})
	return p
}

func newStreamT(t *testing.T, dev device.Device) device.Stream {
	t.Helper()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func mustAlloc(t *testing.T, a alloc.Allocator, n uint64, s device.Stream) device.Ptr {
	t.Helper()
	p, err := a.Alloc(n, s)
	if err != nil {
		t.Fatalf("Alloc(%d): %v", n, err)
	}
	return p
}

// orderInto makes work enqueued on to from now on wait for from's work so
// far.
func orderInto(t *testing.T, dev device.Device, from, to device.Stream) {
	t.Helper()
	ev, err := dev.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := ev.Record(from); err != nil {
		t.Fatal(err)
	}
	if err := ev.Wait(to); err != nil {
		t.Fatal(err)
	}
}

// expectBytes checks, after s's work, that all n bytes at p are v.
func expectBytes(t *testing.T, dev device.Device, p device.Ptr, n uint64, v byte, s device.Stream) {
	t.Helper()
	got := make([]byte, n)
	if err := dev.CopyDtoH(got, p, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != v {
			t.Fatalf("byte %d of the block at %v is %#x, want %#x: a write by the stream that freed it landed after it was handed out", i, p, b, v)
		}
	}
}
