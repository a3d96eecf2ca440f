//go:build linux

package capi

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/brokertest"
)

// A manager opened with a broker's lease (vram_open_lease) claims what
// each allocation needs from the broker; one past what the broker can
// give is refused before the device is asked, as out of memory naming the
// lease; what is freed goes back to the broker for another process's
// manager (here a second Registry, as a second process would have).
func TestLeasedManager(t *testing.T) {
	dir := t.TempDir()
	spec := fmt.Sprintf("sim:shared=capi%d,vram=64MiB,context=0,dir=%s", os.Getpid(), dir)
	socket := brokertest.Serve(t, spec, 64*MiB, 300*time.Millisecond)
	var r1, r2 Registry
	a, err := r1.Open(Options{Spec: spec, Broker: socket, Lease: vram.LeaseOptions{Name: "python-a"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r1.Close(a.Handle()) }()
	b, err := r2.Open(Options{Spec: spec, Broker: socket, Lease: vram.LeaseOptions{Name: "python-b"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r2.Close(b.Handle()) }()
	// Each lease is guaranteed half; a borrows what b leaves.
	p, err := a.Alloc(SourceTorch, 40*MiB, 0)
	if err != nil {
		t.Fatalf("a's 40 MiB of 64 with b holding nothing: %v", err)
	}
	before := stats(t, b)
	_, err = b.Alloc(SourceCuPy, 40*MiB, Unordered)
	if !errors.Is(err, device.ErrOutOfMemory) || !errors.Is(err, vram.ErrLease) || !strings.Contains(err.Error(), "python-a") {
		t.Fatalf("b's 40 MiB beside a's: %v; want out of memory from the lease, naming python-a", err)
	}
	after := stats(t, b)
	if after.DeviceAllocs != before.DeviceAllocs || after.Sources[SourceCuPy].OOMs != 1 {
		t.Errorf("b's refusal: device allocs %d → %d, cupy OOMs %d; want none reaching the device, one counted",
			before.DeviceAllocs, after.DeviceAllocs, after.Sources[SourceCuPy].OOMs)
	}
	if err := a.Free(p, 40*MiB, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Trim(); err != nil {
		t.Fatal(err)
	}
	var q device.Ptr
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if q, err = b.Alloc(SourceCuPy, 40*MiB, Unordered); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("b's 40 MiB once a freed and trimmed: %v", err)
	}
	if err := b.Free(q, 40*MiB, Unordered); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, a); st.OOMs != 0 {
		t.Errorf("a's allocator ran out of memory %d times", st.OOMs)
	}
}
