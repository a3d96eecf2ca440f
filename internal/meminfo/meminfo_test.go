package meminfo_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/internal/meminfo"
)

func TestAvailable(t *testing.T) {
	tests := map[string]struct {
		text string
		want uint64
		ok   bool
	}{
		"kB":         {"MemTotal:       24683656 kB\nMemFree:  100 kB\nMemAvailable:   24216164 kB\nBuffers: 1 kB\n", 24216164 << 10, true},
		"bytes":      {"MemAvailable: 4096\n", 4096, true},
		"missing":    {"MemTotal: 1 kB\nMemFree: 1 kB\n", 0, false},
		"no number":  {"MemAvailable: kB\n", 0, false},
		"no value":   {"MemAvailable:\n", 0, false},
		"overflow":   {"MemAvailable: 18446744073709551615 kB\n", 0, false},
		"empty file": {"", 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := meminfo.ParseAvailable(strings.NewReader(tc.text))
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseAvailable = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestReadAvailable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(p, []byte("MemAvailable: 2 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, ok := meminfo.ReadAvailable(p); n != 2048 || !ok {
		t.Errorf("ReadAvailable = %d, %v; want 2048, true", n, ok)
	}
	if n, ok := meminfo.ReadAvailable(filepath.Join(t.TempDir(), "none")); n != 0 || ok {
		t.Errorf("ReadAvailable of a missing file = %d, %v; want 0, false", n, ok)
	}
}

func ExampleParseAvailable() {
	n, ok := meminfo.ParseAvailable(strings.NewReader("MemTotal: 8000 kB\nMemAvailable: 6000 kB\n"))
	fmt.Println(n, ok)
	// Output: 6144000 true
}
