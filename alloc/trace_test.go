package alloc_test

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// traceLine is one parsed line of a Trace's log.
type traceLine struct {
	thread  uint64
	time    float64
	action  string
	pointer uint64
	size    uint64
	stream  uint64
}

func parseTraceLog(t *testing.T, log string) []traceLine {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	if lines[0] != alloc.TraceHeader {
		t.Fatalf("first line %q, want %q", lines[0], alloc.TraceHeader)
	}
	var out []traceLine
	for i, l := range lines[1:] {
		f := strings.Split(l, ",")
		if len(f) != 6 {
			t.Fatalf("line %d %q: %d fields, want 6", i+2, l, len(f))
		}
		var tl traceLine
		var errs [5]error
		tl.thread, errs[0] = strconv.ParseUint(f[0], 10, 64)
		tl.time, errs[1] = strconv.ParseFloat(f[1], 64)
		tl.action = f[2]
		if !strings.HasPrefix(f[3], "0x") {
			t.Fatalf("line %d %q: pointer not in hex", i+2, l)
		}
		tl.pointer, errs[2] = strconv.ParseUint(f[3][2:], 16, 64)
		tl.size, errs[3] = strconv.ParseUint(f[4], 10, 64)
		tl.stream, errs[4] = strconv.ParseUint(f[5], 10, 64)
		if err := errors.Join(errs[:]...); err != nil {
			t.Fatalf("line %d %q: %v", i+2, l, err)
		}
		out = append(out, tl)
	}
	return out
}

// TestTraceLogsEveryCall checks each line of the log against the calls
// made: action, pointer, size (also on free), stream, a failure line for a
// refused allocation, and times that never go back.
func TestTraceLogsEveryCall(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
	var buf bytes.Buffer
	tr := alloc.NewTrace(alloc.NewDirect(dev), &buf)
	s0 := dev.DefaultStream()
	s1, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	p, err := tr.Alloc(1000, s0)
	if err != nil {
		t.Fatal(err)
	}
	q, err := tr.Alloc(3*units.MiB, s1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Alloc(units.GiB, s1); !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("Alloc(1 GiB) on a 64 MiB device: %v", err)
	}
	if err := tr.Free(p, s1); err != nil {
		t.Fatal(err)
	}
	if err := tr.Free(p, s1); !errors.Is(err, alloc.ErrUnknownPointer) {
		t.Fatalf("double Free: %v", err)
	}
	if err := tr.Free(q, s0); err != nil {
		t.Fatal(err)
	}
	if err := tr.Flush(); err != nil {
		t.Fatal(err)
	}
	got := parseTraceLog(t, buf.String())
	want := []traceLine{
		{action: "allocate", pointer: uint64(p), size: 1000, stream: uint64(s0.Handle())},
		{action: "allocate", pointer: uint64(q), size: 3 * units.MiB, stream: uint64(s1.Handle())},
		{action: "allocate failure", pointer: 0, size: units.GiB, stream: uint64(s1.Handle())},
		{action: "free", pointer: uint64(p), size: 1000, stream: uint64(s1.Handle())},
		{action: "free", pointer: uint64(q), size: 3 * units.MiB, stream: uint64(s0.Handle())},
	}
	if len(got) != len(want) {
		t.Fatalf("log has %d lines, want %d:\n%s", len(got), len(want), buf.String())
	}
	var last float64
	for i := range want {
		g, w := got[i], want[i]
		if g.action != w.action || g.pointer != w.pointer || g.size != w.size || g.stream != w.stream {
			t.Errorf("line %d = %+v, want %+v", i+2, g, w)
		}
		if g.thread == 0 {
			t.Errorf("line %d: thread 0, want the goroutine's id", i+2)
		}
		if g.time < last {
			t.Errorf("line %d: time %g before the previous line's %g", i+2, g.time, last)
		}
		last = g.time
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestTraceThreadIDs: calls from different goroutines carry different ids.
func TestTraceThreadIDs(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
	var buf bytes.Buffer
	tr := alloc.NewTrace(alloc.NewDirect(dev), &buf)
	defer tr.Close()
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := tr.Alloc(4096, dev.DefaultStream())
			if err == nil {
				err = tr.Free(p, dev.DefaultStream())
			}
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := tr.Flush(); err != nil {
		t.Fatal(err)
	}
	threads := map[uint64]int{}
	for _, l := range parseTraceLog(t, buf.String()) {
		threads[l.thread]++
	}
	if len(threads) != 3 {
		t.Errorf("3 goroutines logged under %d thread ids: %v", len(threads), threads)
	}
	for id, n := range threads {
		if n != 2 {
			t.Errorf("thread %d has %d lines, want 2 (an allocate and its free)", id, n)
		}
	}
}

// failingWriter fails every write after the first ok bytes.
type failingWriter struct{ ok int }

func (w *failingWriter) Write(b []byte) (int, error) {
	if len(b) <= w.ok {
		w.ok -= len(b)
		return len(b), nil
	}
	return 0, fmt.Errorf("disk full")
}

// TestTraceWriteErrorDoesNotFailCalls: the allocator keeps working and
// the error comes back from Flush and Close.
func TestTraceWriteErrorDoesNotFailCalls(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
	tr := alloc.NewTrace(alloc.NewDirect(dev), &failingWriter{})
	for range 2000 { // more than the buffer holds
		p, err := tr.Alloc(512, dev.DefaultStream())
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Free(p, dev.DefaultStream()); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.Flush(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Flush: err = %v, want the write error", err)
	}
	if err := tr.Close(); err == nil {
		t.Errorf("Close: nil error after a write error")
	}
	if st := tr.Stats(); st.Allocs != 2000 || st.InUse != 0 {
		t.Errorf("Stats = %+v", st)
	}
}
