package sharedtraces

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the directory of the shared traces, or skips tb, saying
// where it looked, when there is none. Relative places are tried from the
// calling test's package directory.
func Dir(tb testing.TB) string {
	tb.Helper()
	dirs := []string{os.Getenv("VRAM_TRACES"), "../../shared/traces", "../shared/traces", "../../../shared/traces"}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if m, _ := filepath.Glob(filepath.Join(d, "*.csv")); len(m) > 0 {
			return d
		}
	}
	tb.Skipf("no traces: set VRAM_TRACES to a directory of RMM logs (looked in %q)", dirs)
	return ""
}
