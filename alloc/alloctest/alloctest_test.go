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
