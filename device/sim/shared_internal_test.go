//go:build linux

package sim

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

func openShared(t *testing.T, dir, name string) *Device {
	t.Helper()
	d, err := New(Config{TotalBytes: units.GiB, ContextBytes: 32 * units.MiB, AddressOnly: true, Shared: name, SharedDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// fakeSlot writes slot i by hand, claimed with nonce (0: never claimed).
func fakeSlot(l *ledger, i int, nonce, pid, start, used uint64) {
	l.word(i, slotUsed).Store(used)
	l.word(i, slotPID).Store(pid)
	l.word(i, slotStart).Store(start)
	l.word(i, slotNonce).Store(nonce)
}

func memFree(t *testing.T, d *Device) uint64 {
	t.Helper()
	f, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestParseProcStat(t *testing.T) {
	rest := " 1 1 0 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 %s 1000 10 18446744073709551615"
	tests := map[string]struct {
		line  string
		state byte
		start uint64
	}{
		"plain":             {"42 (sleep) S" + strings.Replace(rest, "%s", "12345", 1), 'S', 12345},
		"name with ) and (": {"42 (a) (b) c) Z" + strings.Replace(rest, "%s", "7", 1), 'Z', 7},
		"name with spaces":  {"42 (my prog) R" + strings.Replace(rest, "%s", "99", 1), 'R', 99},
		"too few fields":    {"42 (x) S 1 1 0", 0, 0},
		"no parenthesis":    {"42 x S" + strings.Replace(rest, "%s", "1", 1), 0, 0},
		"start not a count": {"42 (x) S" + strings.Replace(rest, "%s", "-5", 1), 0, 0},
		"empty":             {"", 0, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			state, start := parseProcStat([]byte(tc.line))
			if state != tc.state || start != tc.start {
				t.Errorf("parseProcStat = %q, %d; want %q, %d", state, start, tc.state, tc.start)
			}
		})
	}
	self, err := selfID()
	if err != nil {
		t.Fatal(err)
	}
	if !procAlive(self.pid, self.start) || procAlive(self.pid, self.start+1) {
		t.Errorf("procAlive: this process (pid %d, start %d) should be alive, and dead with another start", self.pid, self.start)
	}
}

// TestSweepDropsDeadSlots: slots of a pid no process has, of a reused pid
// (a later start time), and of impossible pids are dropped; a live
// process's slot stays; a slot written but never claimed counts nothing.
func TestSweepDropsDeadSlots(t *testing.T) {
	d := openShared(t, t.TempDir(), "sweep")
	l := d.shared
	self, err := selfID()
	if err != nil {
		t.Fatal(err)
	}
	const mib = units.MiB
	fakeSlot(l, 200, 11, 0, 0, 10*mib)                      // pid 0
	fakeSlot(l, 201, 12, self.pid, self.start+1, 20*mib)    // pid reused
	fakeSlot(l, 202, 13, 1<<40, 1, 30*mib)                  // no such pid
	fakeSlot(l, 203, 14, self.pid, self.start, 100*mib)     // alive
	fakeSlot(l, 204, 0, self.pid, self.start, 500*mib)      // died mid-claim
	fakeSlot(l, 205, 15, math.MaxInt32, self.start, 40*mib) // pid beyond pid_max
	before := units.GiB - 32*mib - 200*mib
	if got := l.free(); got != before {
		t.Fatalf("free %d MiB before the sweep, want %d MiB", got/mib, before/mib)
	}
	u, err := d.SharedUsage()
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Clients) != 2 || u.Clients[1].Slot != 203 || u.Used != 132*mib {
		t.Errorf("after the sweep: %+v, want this Device and slot 203 (132 MiB)", u)
	}
	if got := memFree(t, d); got != units.GiB-132*mib {
		t.Errorf("free %d MiB after the sweep, want %d MiB", got/mib, (units.GiB-132*mib)/mib)
	}
	l.word(203, slotNonce).Store(0)
}

// TestHostileSlots: a live slot claiming more than the device, or a used
// word torn by another writer, misreports memory but never crashes:
// free is 0 and allocations fail cleanly; the owner's slot rewritten by
// another program is noticed.
func TestHostileSlots(t *testing.T) {
	d := openShared(t, t.TempDir(), "hostile")
	l := d.shared
	self, err := selfID()
	if err != nil {
		t.Fatal(err)
	}
	fakeSlot(l, 250, 99, self.pid, self.start, math.MaxUint64)
	fakeSlot(l, 251, 98, self.pid, self.start, math.MaxUint64)
	if got := memFree(t, d); got != 0 {
		t.Errorf("free %d with slots claiming 2^64 bytes each, want 0", got)
	}
	if _, err := d.Malloc(units.MiB); !errors.Is(err, device.ErrOutOfMemory) {
		t.Errorf("Malloc beside a hostile slot: %v, want ErrOutOfMemory", err)
	}
	l.word(250, slotNonce).Store(0)
	l.word(251, slotNonce).Store(0)
	l.word(l.slot, slotNonce).Store(12345) // another program takes our slot
	if _, err := d.Malloc(units.MiB); !errors.Is(err, ErrBadLedger) || !strings.Contains(err.Error(), "no longer holds") {
		t.Errorf("Malloc with the slot taken: %v, want ErrBadLedger", err)
	}
	l.word(l.slot, slotNonce).Store(l.nonce)
	p, err := d.Malloc(units.MiB)
	if err != nil {
		t.Fatal(err)
	}
	d.Free(p)
}

// TestTakeOver: a ledger left from an earlier boot is taken over whatever
// its slots say; one of another pid namespace only when no slot is
// claimed.
func TestTakeOver(t *testing.T) {
	self, err := selfID()
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		edit    func(mem []byte)
		claimed bool // a slot is left claimed by a live-looking process
		wantErr error
	}{
		"earlier boot, slots left":   {edit: func(m []byte) { m[32] ^= 1 }, claimed: true},
		"other pid namespace, empty": {edit: func(m []byte) { m[48] ^= 1 }},
		"other pid namespace, used":  {edit: func(m []byte) { m[48] ^= 1 }, claimed: true, wantErr: ErrSharedMismatch},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			d, err := New(Config{TotalBytes: units.GiB, AddressOnly: true, Shared: "to", SharedDir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if tc.claimed {
				fakeSlot(d.shared, 100, 7, self.pid, self.start, units.MiB)
			}
			tc.edit(d.shared.mem)
			d.Close()
			d, err = New(Config{TotalBytes: units.GiB, AddressOnly: true, Shared: "to", SharedDir: dir})
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
				t.Fatalf("New: %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if !strings.Contains(err.Error(), "pid namespace") {
					t.Errorf("error does not name the pid namespace: %v", err)
				}
				return
			}
			defer d.Close()
			if u, _ := d.SharedUsage(); len(u.Clients) != 1 {
				t.Errorf("after taking over: %+v, want this Device alone", u)
			}
		})
	}
}

func TestPrepareDir(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	link := filepath.Join(base, "link")
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		dir      string
		explicit bool
		ok       bool
	}{
		"default, new":           {filepath.Join(base, "new"), false, true},
		"default, open to all":   {open, false, false},
		"default, a symlink":     {link, false, false},
		"chosen, open to all":    {open, true, true},
		"chosen, nested new":     {filepath.Join(base, "a", "b"), true, true},
		"chosen, a regular file": {filepath.Join(base, "file"), true, false},
	}
	if err := os.WriteFile(filepath.Join(base, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := prepareDir(tc.dir, tc.explicit)
			if (err == nil) != tc.ok {
				t.Errorf("prepareDir(%s, %v) = %v, want ok=%v", tc.dir, tc.explicit, err, tc.ok)
			}
		})
	}
}

// FuzzLedgerHeader: the header reader reads any bytes without panicking
// and accepts only what it would write itself.
func FuzzLedgerHeader(f *testing.F) {
	good := make([]byte, headerSize)
	header{total: units.GiB, gran: DefaultGranularity, bootID: [16]byte{1, 2}, pidNS: 4026531836}.encode(good)
	f.Add(good)
	f.Add(good[:headerSize-1])
	f.Add([]byte(ledgerMagic))
	f.Add(append([]byte(nil), make([]byte, headerSize)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			if !errors.Is(err, ErrBadLedger) {
				t.Fatalf("error %v does not wrap ErrBadLedger", err)
			}
			if len(err.Error()) > 300 {
				t.Fatalf("error of %d bytes: an untrusted value is not clipped", len(err.Error()))
			}
			return
		}
		again := make([]byte, headerSize)
		h.encode(again)
		if string(again) != string(b[:headerSize]) {
			t.Fatalf("accepted a header it would not write: %x", b[:headerSize])
		}
		if _, err := (Config{TotalBytes: h.total, Granularity: h.gran, NoContext: true}).withDefaults(); err != nil {
			t.Fatalf("accepted a device the simulator refuses: %v", err)
		}
	})
}

// FuzzLedgerFile: whatever a ledger file holds, opening it is refused
// with an error or yields a device whose accounting stays within its
// total; a refused file is never changed.
func FuzzLedgerFile(f *testing.F) {
	img := make([]byte, ledgerFileSize)
	h := header{total: units.GiB, gran: DefaultGranularity}
	h.bootID, h.pidNS = hostID()
	h.encode(img)
	f.Add(img[:headerSize], uint16(0), uint64(0), uint64(0))
	f.Add(img[:headerSize], uint16(3), uint64(5), uint64(1)<<62)
	f.Add(img[:headerSize], uint16(255), uint64(1), uint64(math.MaxUint64))
	f.Add([]byte("vramsimL\x02"), uint16(0), uint64(0), uint64(0))
	f.Add([]byte{}, uint16(0), uint64(0), uint64(0))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, head []byte, slot uint16, nonce, used uint64) {
		// The file: head over a valid image, one slot set from the input,
		// cut or padded to head's length when head is longer.
		file := append([]byte(nil), img...)
		copy(file, head)
		if len(head) > ledgerFileSize {
			file = append(file, head[ledgerFileSize:]...)
		}
		i := int(slot) % SharedSlotCount
		off := headerSize + i*slotSize
		binary.NativeEndian.PutUint64(file[off+slotNonce:], nonce)
		binary.NativeEndian.PutUint64(file[off+slotUsed:], used)
		binary.NativeEndian.PutUint64(file[off+slotPID:], used>>32)
		path := filepath.Join(dir, "fz"+LedgerSuffix)
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := New(Config{TotalBytes: units.GiB, AddressOnly: true, Shared: "fz", SharedDir: dir})
		if err != nil {
			known := []error{ErrBadLedger, ErrSharedMismatch, ErrSharedFull, device.ErrOutOfMemory}
			if !isAny(err, known) {
				t.Fatalf("New: unexpected error %v", err)
			}
			if errors.Is(err, ErrBadLedger) {
				if got, _ := os.ReadFile(path); string(got) != string(file) {
					t.Fatal("a refused file was changed")
				}
			}
			return
		}
		defer d.Close()
		free, total, err := d.MemInfo()
		if err != nil || free > total {
			t.Fatalf("MemInfo = %d, %d, %v", free, total, err)
		}
		if p, err := d.Malloc(DefaultGranularity); err == nil {
			d.Free(p)
		} else if !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("Malloc: %v", err)
		}
		if err := d.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
	})
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
