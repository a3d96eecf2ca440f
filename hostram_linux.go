//go:build linux

package vram

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// hostRAM is the host's physical memory in bytes, or 0 when unknown.
func hostRAM() uint64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return uint64(si.Totalram) * max(uint64(si.Unit), 1)
}

// ramAvailable is Linux's estimate of the memory available to start new
// programs without swapping (MemAvailable), or ok false when unknown.
func ramAvailable() (uint64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, found := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !found {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, false
		}
		n, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0, false
		}
		return n << 10, true // kB
	}
	return 0, false
}
