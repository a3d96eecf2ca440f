package alloc_test

import (
	"fmt"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

func ExampleNewPool() {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	pool, err := alloc.NewPool(dev, alloc.PoolConfig{})
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	s := dev.DefaultStream()

	a, _ := pool.Alloc(1000, s)     // rounded to 1 KiB, in a new 2 MiB segment
	b, _ := pool.Alloc(3000, s)     // 3 KiB from the same segment, right after a
	big, _ := pool.Alloc(64<<20, s) // 64 MiB: a segment of its own
	fmt.Println("b follows a:", b == a.Add(1024))
	st := pool.Stats()
	fmt.Println("in use:", units.Format(st.InUse), "reserved:", units.Format(st.Reserved), "device allocs:", st.DeviceAllocs)

	_ = pool.Free(a, s)
	_ = pool.Free(big, s)
	again, _ := pool.Alloc(512, s) // best fit: a's old block, split
	fmt.Println("reused a's block:", again == a, "cache hits:", pool.Stats().CacheHits)

	_ = pool.Free(again, s)
	_ = pool.Free(b, s)
	_ = pool.Trim() // every segment is free now: give them back
	fmt.Println("after Trim:", units.Format(pool.Stats().Reserved))
	// Output:
	// b follows a: true
	// in use: 64 MiB reserved: 66 MiB device allocs: 2
	// reused a's block: true cache hits: 2
	// after Trim: 0 B
}

func ExampleNewPinnedPool() {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	pinned, err := alloc.NewPinnedPool(dev)
	if err != nil {
		panic(err)
	}
	defer pinned.Close()
	s := dev.DefaultStream()

	buf, _ := pinned.Alloc(4096, s)
	copy(buf.Data, "staged")
	dst, _ := dev.Malloc(4096)
	defer dev.Free(dst)
	_ = dev.CopyHtoD(dst, buf.Data, s)
	_ = pinned.Free(buf, s) // reusable once s has finished the copy

	_ = s.Synchronize()
	again, _ := pinned.Alloc(4000, s) // same size class, s is done: reused
	fmt.Println("reused:", &again.Data[0] == &buf.Data[0], "host allocations:", pinned.Stats().DeviceAllocs)
	_ = pinned.Free(again, s)
	// Output:
	// reused: true host allocations: 1
}
