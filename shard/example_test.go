package shard_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/vramkit/vram/npy"
	"github.com/vramkit/vram/shard"
)

// Three tasks of a job array each write their shard's part of a batch of
// 10 runs (one float32 result a run, run r's result r²), and a merge job
// gathers them into the file one process would have written.
func Example() {
	dir, _ := os.MkdirTemp("", "shardx")
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "results.npy")
	const runs, tasks = 10, 3
	for i := range uint64(tasks) { // in a Slurm array: s, _, _ := shard.FromEnv(os.Getenv)
		s := shard.Shard{Index: i, Count: tasks}
		lo, hi := s.Range(runs)
		p, err := shard.CreatePart(out, s, runs, npy.Header{Descr: "<f4", Shape: []int{int(hi - lo)}}, shard.PartOptions{})
		if err != nil {
			fmt.Println(err)
			return
		}
		b := make([]byte, 4)
		for r := lo; r < hi; r++ {
			binary.LittleEndian.PutUint32(b, math.Float32bits(float32(r*r)))
			_, _ = p.File().WriteAt(b, int64(r-lo)*4)
		}
		if err := p.Commit(); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: runs %d-%d in %s\n", s, lo, hi-1, filepath.Base(p.Path()))
	}
	res, err := shard.Merge(context.Background(), out, shard.MergeOptions{RemoveParts: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	f, _ := npy.Open(out)
	defer f.Close()
	b := make([]byte, 4)
	_, _ = f.ReadAt(b, 9*4)
	fmt.Println(len(res.Parts), "parts merged into", filepath.Base(res.Out), res.Header, "run 9:", math.Float32frombits(binary.LittleEndian.Uint32(b)))
	// Output:
	// 0/3: runs 0-2 in results.shard-0-of-3.npy
	// 1/3: runs 3-5 in results.shard-1-of-3.npy
	// 2/3: runs 6-9 in results.shard-2-of-3.npy
	// 3 parts merged into results.npy "<f4" (10) run 9: 81
}
