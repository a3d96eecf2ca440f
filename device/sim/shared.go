package sim

// Shared devices: one device's memory seen by many processes.
//
// A Device opened with Config.Shared = NAME (spec shared=NAME) accounts
// its memory in a ledger, a small file that every Device of that name
// maps (MAP_SHARED), in this process and in others on the host. The
// ledger is a 64-byte header and SharedSlotCount slots of 64 bytes, one
// per open Device:
//
//	header  magic "vramsimL", version, slot count, total bytes,
//	        granularity, the boot id and pid namespace it was made under
//	slot    claim nonce (0: free; written last when claiming, zeroed to
//	        release), bytes used, pid, process start time, context
//	        bytes, claimed-at time
//
// Rules:
//   - A slot's used word counts everything the Device holds of device
//     memory: its context, Malloc (rounded to the granularity), the
//     async pool's reserve, physical memory (CreatePhysical). Only the
//     Device that claimed a slot writes its used word (ledger.mine keeps
//     the value; the word is a copy, stored whole).
//   - MemInfo's free is total − Σ used over claimed slots, read with
//     atomic loads and no lock.
//   - An increase (an allocation, pool growth, a physical memory handle,
//     a claim with its context) is decided under the file's lock
//     (flock(2) on the ledger, exclusive): sum the slots, and store the
//     new used word only if the sum stays within the total. Decreases
//     only store a smaller word, without the lock: the sum seen under the
//     lock can only be more than the truth, so the total is never passed.
//     The kernel drops a flock when its holder dies. A holder's writes
//     are ordered so that a process killed between any two of them
//     leaves a table that reads right: a used word is one store; a claim
//     writes its slot's fields and then its nonce (before: the slot is
//     still free); a header is written magic last, after zeroing it (a
//     file whose magic is zero is one whose maker did not finish, made
//     again by the next opener).
//   - A slot whose process has died is dropped (its nonce zeroed, under
//     the lock, if it still holds the claim that was checked) by the next
//     Device of the ledger that sweeps: at Open, when an increase does
//     not fit, and at MemInfo when the last sweep is sweepEvery old.
//     A process is identified by pid and start time (field 22 of
//     /proc/PID/stat, clock ticks since boot): a pid reused by a new
//     process has a later start time. A zombie counts as dead. A process
//     whose /proc entry cannot be read for another reason than its
//     absence is kept (never drop a slot not proven dead).
//   - The header's boot id (/proc/sys/kernel/random/boot_id) tells a file
//     left from an earlier boot, whose slots are all stale; its pid
//     namespace (the inode of /proc/self/ns/pid) tells processes whose
//     pids are not ours, which are refused while they hold slots.
//   - A ledger from an earlier boot is taken over (header rewritten,
//     slots cleared). One whose total, granularity or pid namespace
//     differs from the opener's is taken over only when no slot is
//     claimed after a sweep; else the open is refused (ErrSharedMismatch).
//     A file that is not a ledger of this version is never written.
//
// Why pid and start time: both come from the kernel, cost one read of
// /proc, and can be kept in the file; a pid is reused only after its
// process has gone, and the new one starts later. (A pidfd proves
// liveness too but is a descriptor, which cannot be written in a file
// for other processes.) All clients must see one /proc: the header's pid
// namespace checks it.
//
// The file must be on a local file system (tmpfs by default), and must
// not be removed while clients have it open: those that open the name
// afterwards would make a new ledger, and a second device.
//
// The ledger trusts the processes that can write it: the file is 0600 in
// a directory of the user's own, and the header is checked at Open; every
// value read from a slot is used saturated, so a hostile or torn value
// misreports memory but cannot crash the reader. A process that truncates
// the mapped file can still crash the others (SIGBUS), as it could kill
// them.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// Errors of shared devices.
var (
	// ErrBadLedger: the shared device's ledger file is not a ledger of
	// this version (corrupt, another program's file, another version), or
	// was changed under the Device.
	ErrBadLedger = errors.New("not a usable shared-device ledger")
	// ErrSharedMismatch: the shared device is in use with another total,
	// granularity or pid namespace than the opener's.
	ErrSharedMismatch = errors.New("shared device in use with other settings")
	// ErrSharedFull: every slot of the shared device's ledger is held by
	// a live Device.
	ErrSharedFull = errors.New("every slot of the shared device is taken")
	// ErrLedgerBusy: the ledger's lock stayed taken for lockWait (a
	// process stopped while it held the lock).
	ErrLedgerBusy = errors.New("shared-device ledger lock held too long")
)

const (
	// SharedSlotCount is how many Devices may have one shared device open
	// at once, in all processes together; Open refuses the next one with
	// an error wrapping ErrSharedFull.
	SharedSlotCount = 256
	// MaxSharedName is the longest shared device name.
	MaxSharedName = 64
	// EnvSharedDir names the environment variable that sets the directory
	// of shared-device ledgers (Config.SharedDir overrides it).
	EnvSharedDir = "VRAM_SIM_DIR"
	// LedgerSuffix ends a ledger file's name: NAME.vramsim.
	LedgerSuffix = ".vramsim"
)

// Ledger layout (bytes).
const (
	ledgerMagic    = "vramsimL"
	ledgerVersion  = 1
	headerSize     = 64
	slotSize       = 64
	ledgerFileSize = headerSize + SharedSlotCount*slotSize

	// Slot words, as offsets into a slot.
	slotNonce   = 0
	slotUsed    = 8
	slotPID     = 16
	slotStart   = 24
	slotContext = 32
	slotSince   = 40
)

// sweepEvery is how old the last sweep may be before MemInfo sweeps
// again, so that a dead process's slot is dropped well within a second.
const sweepEvery = 250 * time.Millisecond

// lockWait is how long an increase waits for the ledger's lock before it
// fails with ErrLedgerBusy (a var for tests). The lock is held for
// microseconds; only a process stopped while holding it keeps it long.
var lockWait = 10 * time.Second

// header is a ledger's header.
type header struct {
	total, gran uint64
	bootID      [16]byte
	pidNS       uint64
}

// encode writes h as a header of this version into b[:headerSize],
// the magic last (see the rules above).
func (h header) encode(b []byte) {
	_ = b[headerSize-1]
	binary.NativeEndian.PutUint32(b[8:], ledgerVersion)
	binary.NativeEndian.PutUint32(b[12:], SharedSlotCount)
	binary.NativeEndian.PutUint64(b[16:], h.total)
	binary.NativeEndian.PutUint64(b[24:], h.gran)
	copy(b[32:48], h.bootID[:])
	binary.NativeEndian.PutUint64(b[48:], h.pidNS)
	clear(b[56:headerSize])
	copy(b, ledgerMagic)
}

// parseHeader reads a ledger header from b, the first bytes of an
// untrusted file. It reads at most headerSize bytes and refuses anything
// but a header of this version with a valid device size.
func parseHeader(b []byte) (header, error) {
	var h header
	if len(b) < headerSize {
		return h, fmt.Errorf("%d bytes, less than a %d-byte header: %w", len(b), headerSize, ErrBadLedger)
	}
	if string(b[:8]) != ledgerMagic {
		return h, fmt.Errorf("magic %s, want %q: not a vram shared-device ledger: %w", clipBytes(b[:8]), ledgerMagic, ErrBadLedger)
	}
	if v := binary.NativeEndian.Uint32(b[8:]); v != ledgerVersion {
		return h, fmt.Errorf("version %d, this program reads version %d: %w", v, ledgerVersion, ErrBadLedger)
	}
	if n := binary.NativeEndian.Uint32(b[12:]); n != SharedSlotCount {
		return h, fmt.Errorf("%d slots, want %d: %w", n, SharedSlotCount, ErrBadLedger)
	}
	h.total = binary.NativeEndian.Uint64(b[16:])
	h.gran = binary.NativeEndian.Uint64(b[24:])
	copy(h.bootID[:], b[32:48])
	h.pidNS = binary.NativeEndian.Uint64(b[48:])
	for _, c := range b[56:headerSize] {
		if c != 0 {
			return h, fmt.Errorf("reserved header bytes are not zero: %w", ErrBadLedger)
		}
	}
	if h.gran < PoolAlignment || h.gran > MaxGranularity || bits.OnesCount64(h.gran) != 1 {
		return h, fmt.Errorf("granularity %d bytes, want a power of two from %d bytes to %s: %w",
			h.gran, PoolAlignment, units.Format(MaxGranularity), ErrBadLedger)
	}
	if h.total < h.gran || h.total > MaxTotalBytes {
		return h, fmt.Errorf("total %d bytes, want from the granularity (%s) to %s: %w",
			h.total, units.Format(h.gran), units.Format(MaxTotalBytes), ErrBadLedger)
	}
	return h, nil
}

// clipBytes quotes untrusted bytes, at most 16 of them.
func clipBytes(b []byte) string {
	if len(b) > 16 {
		return strconv.Quote(string(b[:16])) + "…"
	}
	return strconv.Quote(string(b))
}

// checkSharedName refuses a name that is not 1 to MaxSharedName letters,
// digits, '.', '_' or '-', starting with a letter or digit (so it is one
// file name, never a path).
func checkSharedName(name string) error {
	ok := name != "" && len(name) <= MaxSharedName
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '.' || c == '_' || c == '-')
	}
	if !ok {
		return fmt.Errorf("sim: shared device name %s: want 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit: %w",
			device.QuoteSpec(name), MaxSharedName, device.ErrInvalidValue)
	}
	return nil
}

// DefaultSharedDir is the directory of shared-device ledgers when neither
// Config.SharedDir nor $VRAM_SIM_DIR says: /dev/shm/vram-sim-UID (memory,
// emptied at boot), or os.TempDir()/vram-sim-UID where there is no
// /dev/shm. It does not follow $XDG_RUNTIME_DIR, which a login session
// has and a batch job or service often lacks: two processes of one user
// would see two devices.
func DefaultSharedDir() string {
	base := "/dev/shm"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = os.TempDir()
	}
	return filepath.Join(base, "vram-sim-"+strconv.Itoa(os.Getuid()))
}

// SharedLedgerPath is the path of the ledger of shared device name in
// dir ("" for $VRAM_SIM_DIR, or DefaultSharedDir).
func SharedLedgerPath(dir, name string) string {
	d, _ := sharedDir(dir)
	return filepath.Join(d, name+LedgerSuffix)
}

// sharedID is the shared device's device.Info.ID: "sim:shared=NAME",
// with ",dir=PATH" when the ledger's directory was chosen; "" for a
// private device.
func (c Config) sharedID() string {
	if c.Shared == "" {
		return ""
	}
	if dir, explicit := sharedDir(c.SharedDir); explicit {
		return "sim:shared=" + c.Shared + ",dir=" + dir
	}
	return "sim:shared=" + c.Shared
}

// sharedDir resolves the ledger directory; explicit reports whether the
// user chose it (Config.SharedDir or $VRAM_SIM_DIR).
func sharedDir(dir string) (path string, explicit bool) {
	if dir != "" {
		return dir, true
	}
	if env := os.Getenv(EnvSharedDir); env != "" {
		return env, true
	}
	return DefaultSharedDir(), false
}

// SharedUsage is a snapshot of a shared device's ledger.
type SharedUsage struct {
	Name  string // Config.Shared
	Path  string // the ledger file
	Total uint64 // device memory, bytes
	// Used is the bytes all clients hold; MemInfo's free is Total − Used.
	Used    uint64
	Clients []SharedClient // by slot
}

// SharedClient is one Device holding a slot of a shared device.
type SharedClient struct {
	Slot    int
	PID     int
	Used    uint64    // bytes of device memory it holds, its context included
	Context uint64    // bytes of its context
	Since   time.Time // when it opened the device
	Self    bool      // this Device
}

// SharedUsage reads the ledger of a shared device: every Device holding
// a slot, in any process, after the slots of dead processes are dropped.
// On a private device it returns an error wrapping
// device.ErrNotSupported.
func (d *Device) SharedUsage() (SharedUsage, error) {
	if d.closed.Load() {
		return SharedUsage{}, d.errClosed("shared usage")
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return SharedUsage{}, d.errClosed("shared usage")
	}
	if d.shared == nil {
		return SharedUsage{}, fmt.Errorf("%v: shared usage: not a shared device (open it with shared=NAME): %w", d, device.ErrNotSupported)
	}
	if err := d.shared.sweep(); err != nil {
		return SharedUsage{}, fmt.Errorf("%v: shared usage: %w", d, err)
	}
	return d.shared.usage(), nil
}

// ledger is a Device's handle on a shared device's ledger: the mapped
// file, its slot, and the file lock (see the overview above).
type ledger struct {
	name, path string
	f          *os.File
	mem        []byte // the mapped file, ledgerFileSize bytes
	slot       int    // this Device's slot
	nonce      uint64 // this Device's claim on it
	total      uint64 // the device's memory, bytes

	// mine is what this Device holds: the value of its slot's used word.
	// Protected by the Device's mu (written under its write lock).
	mine uint64

	lastSweep atomic.Int64 // unix nanoseconds of the last sweep

	// turn is this handle's turn at the file lock: a flock belongs to
	// the open file, not to a goroutine, so two goroutines of one
	// Device (two MemInfo sweeps) must not both think they hold it.
	turn sync.Mutex
}

// word is word off of slot i.
func (l *ledger) word(i, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&l.mem[headerSize+i*slotSize+off]))
}

// othersUsed sums the used words of the claimed slots but this Device's,
// saturating, and counts those slots.
func (l *ledger) othersUsed() (sum uint64, n int) {
	for i := range SharedSlotCount {
		if i == l.slot || l.word(i, slotNonce).Load() == 0 {
			continue
		}
		sum = units.SatAdd(sum, l.word(i, slotUsed).Load())
		n++
	}
	return sum, n
}

// free is the device memory no client holds.
func (l *ledger) free() uint64 {
	others, _ := l.othersUsed()
	used := units.SatAdd(others, l.mine)
	if used >= l.total {
		return 0
	}
	return l.total - used
}

// fitsLocked reports whether n more bytes for this Device fit, given the
// other slots as they are now (under the file lock).
func (l *ledger) fitsLocked(n uint64) bool {
	others, _ := l.othersUsed()
	return units.SatAdd(units.SatAdd(others, l.mine), n) <= l.total
}

// setMine stores what this Device holds in its slot. A decrease needs no
// lock; an increase must be decided by take.
func (l *ledger) setMine(n uint64) {
	l.mine = n
	l.word(l.slot, slotUsed).Store(n)
}

// give returns n bytes this Device held.
func (l *ledger) give(n uint64) { l.setMine(l.mine - min(n, l.mine)) }

// ownsSlotLocked reports whether this Device's slot still holds its claim.
func (l *ledger) ownsSlotLocked() error {
	if got := l.word(l.slot, slotNonce).Load(); got != l.nonce {
		return fmt.Errorf("sim: shared device %q (%s): slot %d no longer holds this process's claim "+
			"(the file was changed or replaced by another program): %w", l.name, l.path, l.slot, ErrBadLedger)
	}
	return nil
}

// take adds n bytes to this Device's slot if they fit within the total
// with every other slot, atomically against the other processes. When
// they do not, it sweeps dead processes' slots and tries once more.
func (l *ledger) take(n uint64) (bool, error) {
	for try := range 2 {
		if try == 1 {
			if _, others := l.othersUsed(); others == 0 {
				return false, nil
			}
			if err := l.sweep(); err != nil {
				return false, err
			}
		}
		if err := l.lock(); err != nil {
			return false, err
		}
		err := l.ownsSlotLocked()
		fits := err == nil && l.fitsLocked(n)
		if fits {
			l.setMine(l.mine + n)
		}
		l.unlock()
		if err != nil || fits {
			return fits, err
		}
	}
	return false, nil
}

// usage reads the ledger's claimed slots.
func (l *ledger) usage() SharedUsage {
	u := SharedUsage{Name: l.name, Path: l.path, Total: l.total}
	for i := range SharedSlotCount {
		nonce := l.word(i, slotNonce).Load()
		if nonce == 0 {
			continue
		}
		c := SharedClient{
			Slot:    i,
			PID:     int(min(l.word(i, slotPID).Load(), math.MaxInt32)),
			Used:    l.word(i, slotUsed).Load(),
			Context: l.word(i, slotContext).Load(),
			Since:   time.Unix(0, int64(min(l.word(i, slotSince).Load(), math.MaxInt64))),
			Self:    i == l.slot && nonce == l.nonce,
		}
		if c.Self {
			c.Used = l.mine
		}
		if nonce != l.word(i, slotNonce).Load() {
			continue // released or claimed again while read
		}
		u.Used = units.SatAdd(u.Used, c.Used)
		u.Clients = append(u.Clients, c)
	}
	return u
}

// lock takes this handle's turn, then the file lock, waiting at most
// lockWait for the file lock.
func (l *ledger) lock() error {
	l.turn.Lock()
	if err := lockFile(l.f, lockWait); err != nil {
		l.turn.Unlock()
		return fmt.Errorf("sim: shared device %q (%s): %w", l.name, l.path, err)
	}
	return nil
}

func (l *ledger) unlock() {
	unlockFile(l.f)
	l.turn.Unlock()
}

// sweep drops the slots of dead processes. Liveness is checked without
// the file lock (reading /proc takes microseconds a slot); each dead slot
// is then dropped under the lock if it still holds the claim that was
// checked (a slot released and claimed again has another nonce).
func (l *ledger) sweep() error {
	l.lastSweep.Store(time.Now().UnixNano())
	var dead [SharedSlotCount]uint64 // nonce of each dead slot, 0 if none
	found := false
	for i := range SharedSlotCount {
		nonce := l.word(i, slotNonce).Load()
		if i == l.slot || nonce == 0 {
			continue
		}
		if !procAlive(l.word(i, slotPID).Load(), l.word(i, slotStart).Load()) {
			dead[i], found = nonce, true
		}
	}
	if !found {
		return nil
	}
	if err := l.lock(); err != nil {
		return err
	}
	for i, nonce := range dead {
		if nonce != 0 {
			l.word(i, slotNonce).CompareAndSwap(nonce, 0)
		}
	}
	l.unlock()
	return nil
}

// maybeSweep sweeps if the last sweep is older than sweepEvery.
func (l *ledger) maybeSweep() error {
	last := l.lastSweep.Load()
	now := time.Now().UnixNano()
	if now-last < int64(sweepEvery) || !l.lastSweep.CompareAndSwap(last, now) {
		return nil
	}
	return l.sweep()
}
