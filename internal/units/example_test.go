package units_test

import (
	"fmt"

	"github.com/vramkit/vram/internal/units"
)

func Example() {
	n, _ := units.ParseSize("1.5GiB")
	fmt.Println(n, units.Format(n))
	r, _ := units.RoundUp(1000, 512)
	fmt.Println(r)
	_, err := units.ParseSize("lots")
	fmt.Println(err)
	// Output:
	// 1610612736 1.5 GiB
	// 1024
	// "lots": want a number with an optional unit such as 512MiB or 2GB: not a byte size
}
