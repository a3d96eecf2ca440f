package meminfo

import (
	"bufio"
	"io"
	"os"
	"strconv"
	"strings"
)

// Path is where Linux publishes the memory figures.
const Path = "/proc/meminfo"

// ParseAvailable reads the MemAvailable line of a meminfo file
// ("MemAvailable:   24216164 kB") in bytes; ok is false when the line is
// missing, malformed, or its figure overflows 64 bits.
func ParseAvailable(r io.Reader) (n uint64, ok bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, found := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !found {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, false
		}
		v, err := strconv.ParseUint(fields[0], 10, 64)
		if err != nil {
			return 0, false
		}
		mult := uint64(1)
		if len(fields) > 1 && strings.EqualFold(fields[1], "kB") {
			mult = 1 << 10
		}
		if v > ^uint64(0)/mult {
			return 0, false
		}
		return v * mult, true
	}
	return 0, false
}

// ReadAvailable is ParseAvailable of the file at path (Path on Linux).
func ReadAvailable(path string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	return ParseAvailable(f)
}
