package main

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// The planner on a request set given on stdin: a million runs of 201
// samples × 4 variables do not fit 256 MiB, so they go in 12 chunks.
func Example_plan() {
	requests := `{"budget": "256MiB", "granularity": 512,
	  "requests": {"outputs": {"state": {"shape": [201, 4, 1000000], "dtype": "float32", "chunk_axis": 2}}}}`
	runContext(context.Background(), []string{"plan"}, strings.NewReader(requests), os.Stdout, os.Stderr)
	// Output:
	// 12 chunks × 83334 runs (last chunk 83326), 1000000 runs in all
	// budget       256 MiB (given)
	// granularity  512 B (given)
	// buffers      1 in flight
	// device       255.6 MiB per chunk = 0 B unchunkable + 1 × 255.6 MiB chunked (all at once: 3 GiB)
	//
	// CLIENT   LABEL  DTYPE    MEMORY  SHAPE          CHUNKED SHAPE  BYTES
	// outputs  state  float32  device  201×4×1000000  201×4×83334    255.6 MiB
}

// A usage error exits 2 and says what to change.
func Example_usageError() {
	code := runContext(context.Background(), []string{"run", "--steps", "40", "--samples", "7"}, nil, os.Stdout, os.Stdout)
	fmt.Println("exit", code)
	// Output:
	// vram: --samples 7 with --steps 40: want 2 to 41 samples, with steps a multiple of samples−1 (e.g. --samples 41)
	// Run 'vram run --help' for usage.
	// exit 2
}
