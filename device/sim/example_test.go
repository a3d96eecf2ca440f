package sim_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// A simulated device: copy data in, run a Go kernel over it, copy it out.
func Example() {
	dev, err := sim.New(sim.Config{TotalBytes: 1 << 30})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	s, _ := dev.NewStream()
	defer s.Close()

	const n = 1000
	x, _ := dev.Malloc(n * 8)
	defer dev.Free(x)
	host := make([]byte, n*8)
	for i := range n {
		binary.LittleEndian.PutUint64(host[i*8:], math.Float64bits(float64(i)))
	}
	_ = dev.CopyHtoD(x, host, s)
	// x[i] = 2*x[i], over the host's cores.
	_ = dev.LaunchFunc(s, n, func(mem device.View, lo, hi int) error {
		b, err := mem.Bytes(x.Add(uint64(lo)*8), uint64(hi-lo)*8)
		if err != nil {
			return err
		}
		for i := 0; i < len(b); i += 8 {
			v := math.Float64frombits(binary.LittleEndian.Uint64(b[i:]))
			binary.LittleEndian.PutUint64(b[i:], math.Float64bits(2*v))
		}
		return nil
	})
	_ = dev.CopyDtoH(host, x, s)
	if err := s.Synchronize(); err != nil {
		panic(err)
	}
	last := math.Float64frombits(binary.LittleEndian.Uint64(host[(n-1)*8:]))
	fmt.Println("last element:", last)
	// Output: last element: 1998
}

// Memory is accounted the way the driver reports it: whole 2 MiB granules
// per Malloc, less the context's own memory.
func ExampleDevice_MemInfo() {
	dev, _ := sim.New(sim.Config{TotalBytes: 1 << 30, ContextBytes: 32 << 20})
	defer dev.Close()
	free, total, _ := dev.MemInfo()
	fmt.Printf("free %d MiB of %d MiB\n", free>>20, total>>20)
	p, _ := dev.Malloc(3 << 20) // 3 MiB reserves two granules
	free, _, _ = dev.MemInfo()
	fmt.Printf("after Malloc(3 MiB): free %d MiB\n", free>>20)
	_ = dev.Free(p)
	free, _, _ = dev.MemInfo()
	fmt.Printf("after Free: free %d MiB\n", free>>20)
	// Output:
	// free 992 MiB of 1024 MiB
	// after Malloc(3 MiB): free 988 MiB
	// after Free: free 992 MiB
}

// The memory checker: each misuse gives its own error.
func ExampleDevice_CopyHtoD_memcheck() {
	dev, _ := sim.New(sim.Config{TotalBytes: 64 << 20})
	defer dev.Close()
	s := dev.DefaultStream()
	p, _ := dev.Malloc(16)
	err := dev.CopyHtoD(p.Add(8), make([]byte, 16), s)
	fmt.Println("past the end:", errors.Is(err, device.ErrOutOfBounds))
	_ = dev.Free(p)
	err = dev.CopyHtoD(p, []byte{1}, s)
	fmt.Println("after free:", errors.Is(err, device.ErrUseAfterFree))
	err = dev.Free(p)
	fmt.Println("freed again:", errors.Is(err, device.ErrDoubleFree))
	q, _ := dev.Malloc(16)
	_ = dev.Reset()
	err = dev.Free(q)
	fmt.Println("from before Reset:", errors.Is(err, device.ErrInvalidated))
	// Output:
	// past the end: true
	// after free: true
	// freed again: true
	// from before Reset: true
}

// Fault injection makes the third allocation fail, once.
func ExampleFaults_OOMAtAlloc() {
	dev, _ := sim.New(sim.Config{TotalBytes: 64 << 20})
	defer dev.Close()
	dev.Faults().OOMAtAlloc(3)
	for i := 1; i <= 4; i++ {
		p, err := dev.Malloc(1024)
		if err != nil {
			fmt.Println(i, "out of memory:", errors.Is(err, device.ErrOutOfMemory), "injected:", errors.Is(err, sim.ErrInjected))
			continue
		}
		fmt.Println(i, "ok")
		defer dev.Free(p)
	}
	// Output:
	// 1 ok
	// 2 ok
	// 3 out of memory: true injected: true
	// 4 ok
}

// Close reports what was left allocated.
func ExampleLeakError() {
	dev, _ := sim.New(sim.Config{TotalBytes: 64 << 20})
	_, _ = dev.Malloc(1 << 20)
	err := dev.Close()
	fmt.Println(errors.Is(err, sim.ErrLeak))
	var le *sim.LeakError
	if errors.As(err, &le) {
		fmt.Println(le.Report.Allocs, "allocation of", le.Report.AllocBytes>>20, "MiB")
	}
	// Output:
	// true
	// 1 allocation of 1 MiB
}

// The stream-ordered pool reuses a block on the freeing stream at once.
func ExampleDevice_MallocAsync() {
	dev, _ := sim.New(sim.Config{TotalBytes: 64 << 20})
	defer dev.Close()
	s := dev.DefaultStream()
	p, _ := dev.MallocAsync(1000, s)
	_ = dev.FreeAsync(p, s)
	q, _ := dev.MallocAsync(1000, s)
	fmt.Println("reused:", p == q)
	reserved, used, _ := dev.PoolUsage()
	fmt.Println("reserved", reserved>>20, "MiB, used", used, "B")
	_ = dev.FreeAsync(q, s)
	_ = s.Synchronize() // a synchronization point: the pool releases to its threshold (0)
	reserved, _, _ = dev.PoolUsage()
	fmt.Println("after sync reserved", reserved)
	// Output:
	// reused: true
	// reserved 2 MiB, used 1024 B
	// after sync reserved 0
}

func ExampleParseSpec() {
	cfg, err := sim.ParseSpec("vram=24GiB,backed=false,granularity=64KiB")
	fmt.Println(cfg.TotalBytes>>30, cfg.AddressOnly, cfg.Granularity, err)
	// Output: 24 true 65536 <nil>
}

// A 2-D copy reads one column of a device matrix in a single stream
// operation: 4 rows of 1 byte, 5 bytes apart on the device, packed on the
// host. A pitch below the width is refused.
func ExampleDevice_CopyDtoH2D() {
	dev, _ := sim.New(sim.Config{TotalBytes: 64 << 20})
	defer dev.Close()
	s := dev.DefaultStream()
	p, _ := dev.Malloc(20)
	defer dev.Free(p)
	_ = dev.CopyHtoD(p, []byte("a1b2cd3e4fg5h6ij7k8l"), s)
	col := make([]byte, 4)
	_ = dev.CopyDtoH2D(col, 1, p.Add(1), 5, 1, 4, s) // column 1 of a 4×5 matrix
	_ = s.Synchronize()
	fmt.Println(string(col))
	err := dev.CopyDtoH2D(col, 1, p, 1, 2, 2, s)
	fmt.Println(errors.Is(err, device.ErrInvalidValue))
	// Output:
	// 1357
	// true
}
