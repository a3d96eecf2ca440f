package meminfo_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/vramkit/vram/internal/meminfo"
)

// TestAvailableAt: MemAvailable, lowered to what a cgroup limit leaves
// where that is less, saying which.
func TestAvailableAt(t *testing.T) {
	const meminfoFile = "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n"
	v2 := func(limit, current string) map[string]string {
		return map[string]string{"proc/meminfo": meminfoFile, "proc/self/cgroup": "0::/job\n", "proc/self/mountinfo": mountV2,
			"sys/fs/cgroup/job/memory.max": limit, "sys/fs/cgroup/job/memory.current": current}
	}
	tests := map[string]struct {
		files    map[string]string
		want     uint64
		fromPart string
		known    bool
	}{
		"no cgroup":                 {map[string]string{"proc/meminfo": meminfoFile}, 8 * gib, "MemAvailable in /proc/meminfo", true},
		"limit below available":     {v2("2147483648\n", "1073741824\n"), 1 * gib, "the cgroup limit ", true},
		"no limit":                  {v2("max\n", "1073741824\n"), 8 * gib, "MemAvailable", true},
		"limit above available":     {v2("17179869184", "0"), 8 * gib, "MemAvailable", true},
		"over its limit":            {v2("1073741824", "2147483648"), 0, "sys/fs/cgroup/job/memory.max less what is in use", true},
		"cgroup without meminfo":    {map[string]string{"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": mountV2, "sys/fs/cgroup/memory.max": "1073741824", "sys/fs/cgroup/memory.current": "0"}, gib, "memory.max", true},
		"neither meminfo nor limit": {nil, 0, "", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := meminfo.AvailableAt(fakeTree(t, tc.files))
			if got.Bytes != tc.want || got.Known != tc.known || !strings.Contains(got.From, tc.fromPart) {
				t.Errorf("AvailableAt = %+v; want %d (known %v) from %q", got, tc.want, tc.known, tc.fromPart)
			}
		})
	}
}

// TestHostFigures: where the host says (Linux), its RAM is known, its RAM
// and swap are no less, and what is available is no more than the RAM
// (both lowered to this process's cgroup's limit, if it has one).
func TestHostFigures(t *testing.T) {
	ram, both := meminfo.RAM(), meminfo.RAMAndSwap()
	avail, ok := meminfo.HostAvailable()
	if runtime.GOOS != "linux" {
		if ram != 0 || both != 0 || ok {
			t.Errorf("RAM %d, RAM and swap %d, available %d (%v) where the host says nothing; want 0s", ram, both, avail, ok)
		}
		t.Skip("the host's figures are read on Linux only")
	}
	if ram == 0 || both < ram {
		t.Errorf("RAM %d, RAM and swap %d: want RAM > 0 and RAM and swap ≥ RAM", ram, both)
	}
	if !ok || avail > ram {
		t.Errorf("available %d (%v) of RAM %d: want known and at most the RAM", avail, ok, ram)
	}
	if cg, ok := meminfo.ReadCgroup("/"); ok && ram > cg.Bytes {
		t.Errorf("RAM %d above this process's cgroup limit %d (%s)", ram, cg.Bytes, cg.File)
	}
}
