package alloctest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunOnSimulator runs RunOn with devices the caller makes — here a
// backed 2 GiB simulator, as a stand-in for a real GPU — for Direct and
// Pool: the device-parameterised path, sizes taken from the device.
func TestRunOnSimulator(t *testing.T) {
	open := func(t *testing.T) device.Device {
		d, err := sim.New(sim.Config{TotalBytes: 2 * units.GiB})
		if err != nil {
			t.Fatalf("sim.New: %v", err)
		}
		return d
	}
	factories := map[string]Factory{
		"Direct": func(t *testing.T, dev device.Device) alloc.Allocator { return alloc.NewDirect(dev) },
		"Pool": func(t *testing.T, dev device.Device) alloc.Allocator {
			p, err := alloc.NewPool(dev, alloc.PoolConfig{})
			if err != nil {
				t.Fatalf("NewPool: %v", err)
			}
			return p
		},
	}
	for name, f := range factories {
		t.Run(name, func(t *testing.T) { RunOn(t, open, f) })
	}
}

// unsafeCache is a deliberately broken allocator: a free list that hands
// a freed block to the next Alloc of the same size on any stream at once,
// without waiting for the freeing stream's work. Safe for concurrent use.
type unsafeCache struct {
	dev  device.Device
	mu   sync.Mutex
	free map[uint64][]device.Ptr
	size map[device.Ptr]uint64
	st   alloc.Stats
}

func (c *unsafeCache) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.free[n]; len(l) > 0 {
		p := l[len(l)-1]
		c.free[n] = l[:len(l)-1]
		c.size[p] = n
		c.st.Allocs++
		c.st.CacheHits++
		c.st.InUse += n
		return p, nil
	}
	p, err := c.dev.Malloc(n)
	if err != nil {
		c.st.OOMs++
		return 0, err
	}
	c.size[p] = n
	c.st.Allocs++
	c.st.InUse += n
	c.st.Reserved += n
	return p, nil
}

func (c *unsafeCache) Free(p device.Ptr, s device.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.size[p]
	if !ok {
		return fmt.Errorf("free %v: %w", p, alloc.ErrUnknownPointer)
	}
	delete(c.size, p)
	c.free[n] = append(c.free[n], p)
	c.st.Frees++
	c.st.InUse -= n
	return nil
}

func (c *unsafeCache) Stats() alloc.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	st.PeakInUse, st.PeakReserved = st.InUse, st.Reserved
	return st
}

func (c *unsafeCache) Trim() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for n, l := range c.free {
		for _, p := range l {
			errs = append(errs, c.dev.Free(p))
			c.st.Reserved -= n
		}
	}
	clear(c.free)
	return errors.Join(errs...)
}

func (c *unsafeCache) Close() error {
	err := c.Trim()
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, n := range c.size {
		err = errors.Join(err, c.dev.Free(p))
		c.st.Reserved -= n
	}
	clear(c.size)
	return err
}

const childEnv = "VRAM_ALLOCTEST_UNSAFE_CHILD"

// TestCatchesUnsafeReuse runs the busy-stream check on unsafeCache in a
// child process and expects it to fail, naming the late write: the check
// can tell a safe allocator from an unsafe one.
func TestCatchesUnsafeReuse(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUnsafeReuseChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the busy-stream check passed an allocator that reuses blocks across streams at once:\n%s", out)
	}
	if want := "landed after the block was handed out again"; !strings.Contains(string(out), want) {
		t.Fatalf("the child failed, but not for the late write (want %q):\n%s", want, out)
	}
}

// TestUnsafeReuseChild runs only in TestCatchesUnsafeReuse's child.
func TestUnsafeReuseChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("run by TestCatchesUnsafeReuse")
	}
	newAlloc := func(t *testing.T, dev device.Device) alloc.Allocator {
		return &unsafeCache{dev: dev, free: map[uint64][]device.Ptr{}, size: map[device.Ptr]uint64{}}
	}
	testCrossStreamSafety(simTarget, newAlloc)(t)
}

// unsafeReuseOps is a call sequence for Ops (see its encoding): hold
// stream 1, allocate 1 KiB on it, free it there (its last use still
// queued behind the hold), allocate 1 KiB on stream 2, release stream 1.
var unsafeReuseOps = []byte{0x1e, 0x10, 0x00, 0x0f, 0x14, 0x20, 0x00, 0x0f, 0x1e}

const opsChildEnv = "VRAM_ALLOCTEST_UNSAFE_OPS_CHILD"

// TestOpsCatchesUnsafeReuse runs unsafeReuseOps on unsafeCache in a child
// process and expects Ops to fail, naming the early handoff: the fuzz
// targets' stream check can tell a safe allocator from an unsafe one. The
// safe allocators pass the same sequence (it is among the fuzz seeds).
func TestOpsCatchesUnsafeReuse(t *testing.T) {
	if os.Getenv(opsChildEnv) != "" {
		t.Skip("in the child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUnsafeOpsChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), opsChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("Ops passed an allocator that reuses blocks across streams at once:\n%s", out)
	}
	if want := "handed to another stream before the freeing stream's work was done"; !strings.Contains(string(out), want) {
		t.Fatalf("the child failed, but not for the early handoff (want %q):\n%s", want, out)
	}
}

// TestUnsafeOpsChild runs only in TestOpsCatchesUnsafeReuse's child.
func TestUnsafeOpsChild(t *testing.T) {
	if os.Getenv(opsChildEnv) == "" {
		t.Skip("run by TestOpsCatchesUnsafeReuse")
	}
	Ops(t, func(t *testing.T, dev device.Device) alloc.Allocator {
		return &unsafeCache{dev: dev, free: map[uint64][]device.Ptr{}, size: map[device.Ptr]uint64{}}
	}, unsafeReuseOps)
}

// TestOpsHoldsStreams runs unsafeReuseOps on the Pool: the stream held,
// the block freed behind the hold is not handed to the other stream.
func TestOpsHoldsStreams(t *testing.T) {
	Ops(t, func(t *testing.T, dev device.Device) alloc.Allocator {
		p, err := alloc.NewPool(dev, alloc.PoolConfig{})
		if err != nil {
			t.Fatalf("NewPool: %v", err)
		}
		return p
	}, unsafeReuseOps)
}

// unsafePinned is a deliberately broken pinned pool: it hands a freed
// buffer of the same size to the next Alloc at once, on any stream.
type unsafePinned struct {
	dev  device.HostAllocator
	mu   sync.Mutex
	free map[int][]device.HostBuffer
	live map[*byte]bool
	st   alloc.Stats
}

func (u *unsafePinned) Alloc(n uint64, s device.Stream) (device.HostBuffer, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if l := u.free[int(n)]; len(l) > 0 {
		b := l[len(l)-1]
		u.free[int(n)] = l[:len(l)-1]
		u.live[&b.Data[0]] = true
		u.st.Allocs++
		u.st.InUse += n
		return b, nil
	}
	b, err := u.dev.HostAlloc(n, false)
	if err != nil {
		u.st.OOMs++
		return b, err
	}
	u.live[&b.Data[0]] = true
	u.st.Allocs++
	u.st.InUse += n
	u.st.Reserved += n
	return b, nil
}

func (u *unsafePinned) Free(b device.HostBuffer, s device.Stream) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(b.Data) == 0 || !u.live[&b.Data[0]] {
		return alloc.ErrUnknownPointer
	}
	delete(u.live, &b.Data[0])
	u.free[len(b.Data)] = append(u.free[len(b.Data)], b)
	u.st.Frees++
	u.st.InUse -= uint64(len(b.Data))
	return nil
}

func (u *unsafePinned) Stats() alloc.Stats {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.st
}

func (u *unsafePinned) Trim() error { return nil }
func (u *unsafePinned) Close() error {
	var errs []error
	for _, l := range u.free {
		for _, b := range l {
			errs = append(errs, u.dev.HostFree(b))
		}
	}
	return errors.Join(errs...)
}

const pinnedChildEnv = "VRAM_ALLOCTEST_UNSAFE_PINNED_CHILD"

// TestRunPinnedCatchesUnsafeReuse runs RunPinned's Streams rule on
// unsafePinned in a child process and expects it to fail for the early
// handoff.
func TestRunPinnedCatchesUnsafeReuse(t *testing.T) {
	if os.Getenv(pinnedChildEnv) != "" {
		t.Skip("in the child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUnsafePinnedChild$/^Streams$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), pinnedChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("RunPinned passed a pool that reuses buffers before the freeing stream's work ran:\n%s", out)
	}
	if want := "was handed out on stream"; !strings.Contains(string(out), want) {
		t.Fatalf("the child failed, but not for the early handoff (want %q):\n%s", want, out)
	}
}

// TestUnsafePinnedChild runs only in TestRunPinnedCatchesUnsafeReuse's child.
func TestUnsafePinnedChild(t *testing.T) {
	if os.Getenv(pinnedChildEnv) == "" {
		t.Skip("run by TestRunPinnedCatchesUnsafeReuse")
	}
	RunPinned(t, func(t *testing.T, dev device.Device) PinnedAllocator {
		return &unsafePinned{dev: dev.(device.HostAllocator), free: map[int][]device.HostBuffer{}, live: map[*byte]bool{}}
	})
}
