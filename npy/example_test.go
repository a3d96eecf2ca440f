package npy_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/vramkit/vram/npy"
)

// A (3, 4) float32 file written one column block at a time, as two
// shards of a job would write their runs into one preallocated file.
func Example() {
	dir, _ := os.MkdirTemp("", "npy")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "r.npy")
	f, err := npy.Create(path, npy.Header{Descr: "<f4", Shape: []int{3, 4}}, 0o644)
	if err != nil {
		fmt.Println(err)
		return
	}
	f.Close()
	for _, cols := range [][2]int{{0, 2}, {2, 4}} { // two writers, two columns each
		w, _ := npy.OpenWrite(path)
		for row := range 3 {
			var b []byte
			for c := cols[0]; c < cols[1]; c++ {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(10*row+c)))
			}
			// Element (row, c) is at itemsize × (row × 4 + c).
			w.WriteAt(b, int64(4*(row*4+cols[0])))
		}
		w.Close()
	}
	r, _ := npy.Open(path)
	defer r.Close()
	b := make([]byte, r.DataBytes())
	r.ReadAt(b, 0)
	fmt.Println(r.Header().Shape, r.DataOffset())
	for i := range 12 {
		fmt.Print(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])), " ")
	}
	fmt.Println()
	// Output:
	// [3 4] 128
	// 0 1 2 3 10 11 12 13 20 21 22 23
}
