package account_test

import (
	"context"
	"fmt"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
)

// An account of a simulated device with a cap: what the room is, and an
// allocation past the cap refused before the device is asked.
func Example() {
	dev, err := sim.New(sim.Config{TotalBytes: 64 << 20, NoContext: true})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	a, err := account.New(dev, account.Config{Allocator: account.Choice{Kind: alloc.KindDirect}, Cap: 8 << 20})
	if err != nil {
		panic(err)
	}
	defer a.Close(nil)
	r, err := a.Room()
	if err != nil {
		panic(err)
	}
	fmt.Printf("%v allocator: %d MiB free, capped at %d MiB\n", r.Kind, r.Free>>20, r.Cap>>20)
	s := dev.DefaultStream()
	p, err := a.Alloc(context.Background(), 6<<20, s)
	if err != nil {
		panic(err)
	}
	_, err = a.Alloc(context.Background(), 4<<20, s)
	fmt.Println("past the cap refused:", err != nil)
	if err := a.Free(p, s); err != nil {
		panic(err)
	}
	capBytes, used := a.Cap()
	fmt.Printf("cap %d MiB, %d MiB charged\n", capBytes>>20, used>>20)
	// Output:
	// direct allocator: 64 MiB free, capped at 8 MiB
	// past the cap refused: true
	// cap 8 MiB, 0 MiB charged
}
