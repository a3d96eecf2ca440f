package broker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/device/sim"
)

// A broker of one 8 GiB device, and two processes' leases (here two
// clients of one process): a manual half, and the auto pool's half. The
// auto lease borrows more than its share while it is free, and is asked to
// give it back when the manual lease claims its own.
func Example() {
	dir, _ := os.MkdirTemp("", "vbx")
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "broker.sock")
	s, _ := broker.NewServer(broker.Config{Devices: []broker.Device{{Name: "gpu0", Total: 8 << 30}}})
	ln, err := broker.Listen(socket, 0o600, -1)
	if err != nil {
		fmt.Println(err)
		return
	}
	go s.Serve(ln)
	defer s.Stop()

	ctx := context.Background()
	batch, _ := broker.Dial(ctx, socket)
	defer batch.Close()
	train, _ := broker.Dial(ctx, socket)
	defer train.Close()

	b, _ := batch.Acquire(ctx, broker.LeaseOptions{Name: "batch"}) // the auto pool
	t, _ := train.Acquire(ctx, broker.LeaseOptions{Name: "train", Proportion: 0.5})
	// The broker tells batch of its smaller share on batch's own stream,
	// a moment after train's Acquire returns: wait for it.
	for changed := b.Changed(); b.Budget().Guaranteed > 4<<30; changed = b.Changed() {
		<-changed
	}
	fmt.Println("batch guaranteed", b.Budget().Guaranteed>>30, "GiB, train", t.Budget().Guaranteed>>30, "GiB")

	_, _ = t.Claim(ctx, 0) // train needs nothing yet
	got, _ := b.Claim(ctx, 7<<30)
	_ = b.Report(ctx, 7<<30)
	fmt.Println("batch borrows up to", got.Bytes()>>30, "GiB")

	// The batch shrinks when asked, at its next chunk boundary.
	go func() {
		for {
			changed := b.Changed() // before reading the budget, so no change is missed
			if b.Budget().Shrink != nil {
				break
			}
			<-changed
		}
		_ = b.Report(ctx, b.Budget().Shrink.Bytes)
	}()
	got, err = t.Claim(ctx, 4<<30)
	fmt.Println("train has", got.Bytes()>>30, "GiB:", err)
	fmt.Println("batch may hold", b.Budget().Bytes()>>30, "GiB")
	// Output:
	// batch guaranteed 4 GiB, train 4 GiB
	// batch borrows up to 7 GiB
	// train has 4 GiB: <nil>
	// batch may hold 4 GiB
}

// A vram manager whose budget is a lease of the broker: the broker is a
// value (At), passed in the lease's options. The manager's device is
// named by its index among the broker's devices (a GPU, or a shared
// simulator, is found by its ID instead).
func ExampleAt() {
	dir, _ := os.MkdirTemp("", "vbx")
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "broker.sock")
	s, _ := broker.NewServer(broker.Config{Devices: []broker.Device{{Name: "gpu0", Total: 1 << 30}}})
	ln, err := broker.Listen(socket, 0o600, -1)
	if err != nil {
		fmt.Println(err)
		return
	}
	go s.Serve(ln)
	defer s.Stop()

	dev, _ := sim.New(sim.Config{TotalBytes: 1 << 30, NoContext: true, AddressOnly: true})
	defer dev.Close()
	m, err := vram.New(dev, vram.WithLease(vram.LeaseOptions{Broker: broker.At(socket), Device: "0", Name: "job", Proportion: 0.5}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()
	ls, _ := m.Lease()
	fmt.Println("guaranteed", ls.Guaranteed>>20, "MiB; the lease is", s.Status().Devices[0].Leases[0].Name)
	// Output: guaranteed 512 MiB; the lease is job
}
