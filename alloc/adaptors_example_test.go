package alloc_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

func ExampleNewDirect() {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	d := alloc.NewDirect(dev)
	defer d.Close()

	p, _ := d.Alloc(1000, dev.DefaultStream()) // the device reserves a 2 MiB granule
	st := d.Stats()
	fmt.Println(units.Format(st.InUse), st.DeviceAllocs)
	_ = d.Free(p, dev.DefaultStream())
	fmt.Println(units.Format(d.Stats().InUse), d.Stats().DeviceFrees)
	// Output:
	// 2 MiB 1
	// 0 B 1
}

func ExampleNewAsyncPool() {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	a, err := alloc.NewAsyncPool(dev, alloc.AsyncConfig{}) // keeps freed memory cached
	if err != nil {
		panic(err)
	}
	defer a.Close()

	s := dev.DefaultStream()
	for range 3 {
		p, _ := a.Alloc(units.MiB, s)
		_ = a.Free(p, s) // reusable at once on s
	}
	st := a.Stats()
	fmt.Println("device allocations:", st.DeviceAllocs, "cache hits:", st.CacheHits)
	_ = a.Trim()
	fmt.Println("reserved after Trim:", units.Format(a.Stats().Reserved))
	// Output:
	// device allocations: 1 cache hits: 2
	// reserved after Trim: 0 B
}

func ExampleNewLimit() {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	l := alloc.NewLimit(alloc.NewDirect(dev), 4*units.MiB)
	defer l.Close()

	s := dev.DefaultStream()
	p, _ := l.Alloc(3*units.MiB, s) // charged 4 MiB: Direct spends 2 MiB granules
	_, err = l.Alloc(1, s)
	fmt.Println(errors.Is(err, alloc.ErrLimit), errors.Is(err, device.ErrOutOfMemory), units.Format(l.Used()))
	_ = l.Free(p, s)
	fmt.Println(units.Format(l.Used()))
	// Output:
	// true true 4 MiB
	// 0 B
}

func ExampleNewTrace() {
	dev, err := sim.New(sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	var log bytes.Buffer
	tr := alloc.NewTrace(alloc.NewDirect(dev), &log)

	s := dev.DefaultStream()
	p, _ := tr.Alloc(4096, s)
	_, _ = tr.Alloc(units.GiB, s) // more than the device has: logged as a failure
	_ = tr.Free(p, s)
	_ = tr.Close()

	// Thread and time vary from run to run; show the rest.
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		f := strings.Split(line, ",")
		fmt.Println(f[2], f[4], f[5])
	}
	// Output:
	// Action Size Stream
	// allocate 4096 0
	// allocate failure 1073741824 0
	// free 4096 0
}
