package safecopy_test

import (
	"fmt"

	"github.com/vramkit/vram/internal/safecopy"
)

// Copy is copy that returns an error instead of ending the process when
// the memory faults; ordinary memory copies as copy does.
func Example() {
	dst := make([]byte, 3)
	err := safecopy.Copy(dst, []byte("abc"))
	fmt.Println(string(dst), err)
	// Output: abc <nil>
}
