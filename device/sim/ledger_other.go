//go:build !linux

package sim

import (
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/vramkit/vram/device"
)

// openLedger refuses: shared devices tell live processes from dead ones
// through Linux's /proc.
func openLedger(cfg Config) (*ledger, error) {
	return nil, fmt.Errorf("sim: shared device %q: shared devices need Linux (/proc, flock, a shared mapping), not %s: %w",
		cfg.Shared, runtime.GOOS, device.ErrNotSupported)
}

// No ledger is ever opened here; these complete the type.

func (l *ledger) close() {}

func lockFile(*os.File, time.Duration) error { return device.ErrNotSupported }

func unlockFile(*os.File) {}

func procAlive(pid, start uint64) bool { return true }
