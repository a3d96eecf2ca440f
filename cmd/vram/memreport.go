// The manager's memory report (vram.Report) on stderr for `vram run -v`.

package main

import (
	"fmt"

	"github.com/vramkit/vram"
)

// printMemoryReport writes m's memory report to stderr when -v is set,
// with the job's arrays still held.
func (a *app) printMemoryReport(m *vram.Manager) {
	if !a.verbose {
		return
	}
	fmt.Fprintf(a.stderr, "memory after the batch:\n%s", m.Report())
}
