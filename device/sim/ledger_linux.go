//go:build linux

package sim

// Opening a shared device's ledger (see shared.go for its layout and
// rules): the file, its lock, its mapping, and the identity of processes.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/mapfile"
	"github.com/vramkit/vram/internal/units"
)

// procID identifies a process: its pid and its start time in clock ticks
// after boot (field 22 of /proc/PID/stat), which a reused pid does not
// share.
type procID struct{ pid, start uint64 }

// openLedger opens the ledger of shared device cfg.Shared, making it if
// there is none, and claims a slot holding the context's bytes. cfg has
// its defaults filled in.
func openLedger(cfg Config) (*ledger, error) {
	self, err := selfID()
	if err != nil {
		return nil, err
	}
	dir, explicit := sharedDir(cfg.SharedDir)
	if err := prepareDir(dir, explicit); err != nil {
		return nil, fmt.Errorf("sim: shared device %q: %w", cfg.Shared, err)
	}
	path := filepath.Join(dir, cfg.Shared+LedgerSuffix)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sim: shared device %q: %w", cfg.Shared, err)
	}
	l := &ledger{name: cfg.Shared, path: path, f: f, slot: -1, total: cfg.TotalBytes}
	want := header{total: cfg.TotalBytes, gran: cfg.Granularity}
	want.bootID, want.pidNS = hostID()
	if err := l.open(want, self, cfg.ContextBytes); err != nil {
		l.close()
		return nil, err
	}
	return l, nil
}

// open maps the file (giving a new one its header) and claims a slot.
func (l *ledger) open(want header, self procID, ctx uint64) error {
	if err := l.lock(); err != nil {
		return err
	}
	h, err := l.mapLocked(want)
	l.unlock()
	if err != nil {
		return err
	}
	if h.bootID == want.bootID && h.pidNS == want.pidNS {
		// Drop the dead before counting who uses it and what is free.
		if err := l.sweep(); err != nil {
			return err
		}
	}
	if err := l.lock(); err != nil {
		return err
	}
	defer l.unlock()
	if err := l.reconcileLocked(want); err != nil {
		return err
	}
	return l.claimLocked(self, ctx)
}

// mapLocked checks the file, gives a new (or half-made) one its size and
// header, maps it and returns its header.
func (l *ledger) mapLocked(want header) (header, error) {
	fi, err := l.f.Stat()
	if err != nil {
		return header{}, fmt.Errorf("sim: shared device %q: %w", l.name, err)
	}
	if !fi.Mode().IsRegular() {
		return header{}, l.badf("it is not a regular file (%v)", fi.Mode().Type())
	}
	// A file of zeros (or none), or a whole one whose magic is zero, is
	// one its maker did not finish (it sizes the file, then writes the
	// header, magic last): make it again. Anything else must be a whole
	// ledger.
	fresh, err := l.unfinished(fi.Size())
	if err != nil {
		return header{}, err
	}
	switch {
	case fresh:
		if err := l.f.Truncate(ledgerFileSize); err != nil {
			return header{}, fmt.Errorf("sim: shared device %q: %w", l.name, err)
		}
	case fi.Size() != ledgerFileSize:
		return header{}, l.badf("%d bytes, a ledger of version %d has %d", fi.Size(), ledgerVersion, ledgerFileSize)
	}
	if err := reserve(l.f, fresh); err != nil {
		return header{}, fmt.Errorf("sim: shared device %q: allocate the %d bytes of its ledger %s: %w; free space there, or put the ledger elsewhere (dir=, $%s)",
			l.name, ledgerFileSize, l.path, err, EnvSharedDir)
	}
	mem, err := syscall.Mmap(int(l.f.Fd()), 0, ledgerFileSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return header{}, fmt.Errorf("sim: shared device %q: map %s: %w", l.name, l.path, err)
	}
	l.mem = mem
	if fresh {
		l.resetLocked(want)
	}
	h, err := parseHeader(l.mem[:headerSize])
	if err != nil {
		return header{}, l.badf("%v", err)
	}
	return h, nil
}

// reserve gives the ledger file its blocks before it is mapped: a store
// through the mapping into a hole of a full file system is a SIGBUS, not
// an error. A fresh file (all zeros, under the lock) may be written with
// zeros where the file system has no fallocate; a ledger in use may not
// be written, and is mapped as it is there.
func reserve(f *os.File, fresh bool) error {
	if fresh {
		return mapfile.Reserve(f, ledgerFileSize)
	}
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, 0, ledgerFileSize)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOSYS):
			return nil
		}
		return err
	}
}

// reconcileLocked makes the header want's, if the one there differs: a
// ledger from an earlier boot has only stale slots; otherwise it is taken
// over only when no slot is claimed.
func (l *ledger) reconcileLocked(want header) error {
	h, err := parseHeader(l.mem[:headerSize])
	if err != nil {
		return l.badf("%v", err)
	}
	if h == want {
		return nil
	}
	if h.bootID == want.bootID {
		if u := l.usage(); len(u.Clients) > 0 {
			return l.mismatchErr(h, want, u)
		}
	}
	l.resetLocked(want)
	return nil
}

// resetLocked makes the ledger a new one of header h: magic zeroed
// first, slots cleared, the header written magic last.
func (l *ledger) resetLocked(h header) {
	clear(l.mem[:len(ledgerMagic)])
	for i := range SharedSlotCount {
		l.word(i, slotNonce).Store(0)
	}
	h.encode(l.mem)
}

// unfinished reports whether the file, of size bytes, is one whose maker
// did not finish: all zeros (or empty) and no longer than a ledger, or a
// ledger's size with a zero magic.
func (l *ledger) unfinished(size int64) (bool, error) {
	if size > ledgerFileSize {
		return false, nil
	}
	n := size
	if size == ledgerFileSize {
		n = int64(len(ledgerMagic))
	}
	buf := make([]byte, n)
	if _, err := l.f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		return false, fmt.Errorf("sim: shared device %q: %w", l.name, err)
	}
	return bytes.Count(buf, []byte{0}) == len(buf), nil
}

func (l *ledger) mismatchErr(h, want header, u SharedUsage) error {
	who := pidList(u.Clients)
	if h.pidNS != want.pidNS {
		return fmt.Errorf("sim: shared device %q (%s) is in use by processes of another pid namespace (inode %d, this one's %d; pids %s), "+
			"whose liveness cannot be checked from here: use another name or directory (dir=, $%s): %w",
			l.name, l.path, h.pidNS, want.pidNS, who, EnvSharedDir, ErrSharedMismatch)
	}
	return fmt.Errorf("sim: shared device %q (%s) is in use as a %s device of %s granularity (pids %s); "+
		"this one asks for %s at %s: open it with vram=%d,granularity=%d (bytes), or use another name: %w",
		l.name, l.path, units.Format(h.total), units.Format(h.gran), who,
		units.Format(want.total), units.Format(want.gran), h.total, h.gran, ErrSharedMismatch)
}

// claimLocked takes a free slot for self, holding the context's bytes if
// they fit.
func (l *ledger) claimLocked(self procID, ctx uint64) error {
	free := -1
	for i := range SharedSlotCount {
		if l.word(i, slotNonce).Load() == 0 {
			free = i
			break
		}
	}
	if free < 0 {
		return fmt.Errorf("sim: shared device %q (%s): all %d slots are held by live Devices (pids %s); close some first: %w",
			l.name, l.path, SharedSlotCount, pidList(l.usage().Clients), ErrSharedFull)
	}
	if !l.fitsLocked(ctx) {
		others, n := l.othersUsed()
		return fmt.Errorf("sim: shared device %q (%s): the context's %s does not fit: %s of %s is free, other clients (%d) hold %s: %w",
			l.name, l.path, units.Format(ctx), units.Format(l.free()), units.Format(l.total), n, units.Format(others), device.ErrOutOfMemory)
	}
	l.slot = free
	for l.nonce == 0 {
		l.nonce = rand.Uint64()
	}
	l.setMine(ctx)
	l.word(free, slotPID).Store(self.pid)
	l.word(free, slotStart).Store(self.start)
	l.word(free, slotContext).Store(ctx)
	l.word(free, slotSince).Store(uint64(time.Now().UnixNano()))
	l.word(free, slotNonce).Store(l.nonce) // last: the claim
	return nil
}

// close releases the slot (one store, no lock needed: nobody else writes
// a claimed slot of a live process), unmaps the file and closes it.
func (l *ledger) close() {
	if l.mem != nil {
		if l.slot >= 0 {
			l.word(l.slot, slotNonce).CompareAndSwap(l.nonce, 0)
		}
		_ = syscall.Munmap(l.mem)
		l.mem = nil
	}
	_ = l.f.Close()
}

func (l *ledger) badf(format string, args ...any) error {
	return fmt.Errorf("sim: shared device %q: %s: %s (remove it if no process uses it): %w",
		l.name, l.path, fmt.Sprintf(format, args...), ErrBadLedger)
}

// pidList names at most 8 clients' pids.
func pidList(cs []SharedClient) string {
	var b strings.Builder
	for i, c := range cs {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more", len(cs)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(c.PID))
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

// prepareDir makes the ledger directory if need be. The default one must
// be the user's own and closed to others (it lies in /dev/shm or the
// temporary directory, where anyone may make files); one the user chose
// is taken as it is.
func prepareDir(dir string, explicit bool) error {
	if explicit {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("ledger directory %s is not a directory: %w", dir, device.ErrInvalidValue)
		}
		return nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("ledger directory %s is not a directory of this user's closed to others (%v); "+
			"remove it, or set $%s to a directory of your own: %w", dir, fi.Mode(), EnvSharedDir, os.ErrPermission)
	}
	return nil
}

// lockFile takes f's exclusive flock, waiting at most wait.
func lockFile(f *os.File, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for try := 0; ; try++ {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case !errors.Is(err, syscall.EWOULDBLOCK):
			return fmt.Errorf("lock the ledger: %w", err)
		case time.Now().After(deadline):
			return fmt.Errorf("its lock has been held by another process for %v (one stopped while it held it?): %w", wait, ErrLedgerBusy)
		}
		// The lock is held for microseconds: yield first, then back off
		// up to a millisecond.
		if try < 8 {
			runtime.Gosched()
		} else {
			time.Sleep(min(time.Duration(1<<min(try-8, 10))*time.Microsecond, time.Millisecond))
		}
	}
}

func unlockFile(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }

// selfID is this process's identity.
func selfID() (procID, error) {
	pid := uint64(os.Getpid())
	state, start, err := procStat(pid)
	if err != nil || state == 0 {
		return procID{}, fmt.Errorf("sim: shared devices need /proc to tell live processes from dead ones: %v: %w", err, device.ErrNotSupported)
	}
	return procID{pid, start}, nil
}

// procAlive reports whether the process that claimed a slot as (pid,
// start) is still running. Only a process proven gone (no /proc entry, a
// zombie, or a pid now held by a later process) is dead; a pid no
// process can have is a corrupt slot, dead too.
func procAlive(pid, start uint64) bool {
	if pid == 0 || pid > math.MaxInt32 {
		return false
	}
	state, now, err := procStat(pid)
	switch {
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH):
		return false
	case err != nil || state == 0:
		return true // unreadable, not proven dead
	}
	return state != 'Z' && state != 'X' && now == start
}

// procStat reads the state and start time of process pid from
// /proc/PID/stat, of which it reads at most 1 KiB (the fields up to the
// start time take well under 300 bytes). state is 0 if the line cannot
// be parsed.
func procStat(pid uint64) (state byte, start uint64, err error) {
	f, err := os.Open("/proc/" + strconv.FormatUint(pid, 10) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	var buf [1024]byte
	n, err := io.ReadFull(f, buf[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return 0, 0, err
	}
	state, start = parseProcStat(buf[:n])
	return state, start, nil
}

// parseProcStat reads the state (field 3) and start time (field 22) of a
// /proc/PID/stat line; the command name (field 2, in parentheses) may hold
// any byte, so the fields are counted from the last ')'.
func parseProcStat(b []byte) (state byte, start uint64) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, 0
	}
	return f[0][0], start
}

// hostID is this boot's id and this process's pid namespace, zero where
// they cannot be read.
func hostID() (boot [16]byte, pidNS uint64) {
	if f, err := os.Open("/proc/sys/kernel/random/boot_id"); err == nil {
		var buf [64]byte
		n, _ := io.ReadFull(f, buf[:])
		f.Close()
		hex := strings.ReplaceAll(strings.TrimSpace(string(buf[:n])), "-", "")
		for i := 0; i < len(boot) && 2*i+2 <= len(hex); i++ {
			v, err := strconv.ParseUint(hex[2*i:2*i+2], 16, 8)
			if err != nil {
				break
			}
			boot[i] = byte(v)
		}
	}
	if fi, err := os.Stat("/proc/self/ns/pid"); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			pidNS = st.Ino
		}
	}
	return boot, pidNS
}
