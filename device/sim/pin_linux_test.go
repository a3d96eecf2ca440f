package sim_test

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// residentPages reports of each page of b whether it is resident
// (mincore); mapped is false when the range is not mapped at all.
func residentPages(t *testing.T, b []byte) (resident, pages int, mapped bool) {
	t.Helper()
	page := uintptr(syscall.Getpagesize())
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))) &^ (page - 1)
	hi := uintptr(unsafe.Pointer(unsafe.SliceData(b))) + uintptr(len(b))
	vec := make([]byte, (hi-lo+page-1)/page)
	_, _, e := syscall.Syscall(syscall.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(&vec[0])))
	switch {
	case e == syscall.ENOMEM:
		return 0, len(vec), false
	case e != 0:
		t.Skipf("mincore: %v", e)
	}
	for _, v := range vec {
		if v&1 != 0 {
			resident++
		}
	}
	return resident, len(vec), true
}

// Pinned memory is off the Go heap, and freeing it gives it back to the
// host at once: its pages are no longer mapped after HostFree, after a
// Reset's HostFree (which says the buffer is stale) and after Close,
// and the heap did not grow by the buffer. On the Go heap the pages
// stayed resident until the collector ran: a re-cut batch then held its
// old staging and its new together (1029 MiB RSS under a 512 MiB limit).
func TestHostFreeGivesMemoryBack(t *testing.T) {
	tests := map[string]struct {
		free    func(t *testing.T, d *sim.Device, b device.HostBuffer) error
		wantErr error
	}{
		"HostFree": {free: func(t *testing.T, d *sim.Device, b device.HostBuffer) error { return d.HostFree(b) }},
		"HostFree after Reset": {
			free: func(t *testing.T, d *sim.Device, b device.HostBuffer) error {
				check(t, d.Reset())
				return d.HostFree(b)
			},
			wantErr: device.ErrInvalidated,
		},
		"Close": {free: func(t *testing.T, d *sim.Device, b device.HostBuffer) error { return d.Close() }, wantErr: sim.ErrLeak},
	}
	for name, tc := range tests {
		for _, mapped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, mapped %v", name, mapped), func(t *testing.T) {
				d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
				const n = 32 * MiB
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				b := get[device.HostBuffer](t)(d.HostAlloc(n, mapped))
				runtime.ReadMemStats(&after)
				if grew := after.HeapSys - before.HeapSys; grew >= n/2 {
					t.Errorf("the Go heap grew by %d bytes with a %d byte pinned buffer: want it off the heap", grew, n)
				}
				if res, pages, ok := residentPages(t, b.Data); !ok || res != pages {
					t.Fatalf("before the free: %d of %d pages resident (mapped %v)", res, pages, ok)
				}
				err := tc.free(t, d, b)
				if tc.wantErr == nil {
					check(t, err)
				} else if !errors.Is(err, tc.wantErr) {
					t.Fatalf("free: %v; want it to wrap %q", err, tc.wantErr)
				}
				if res, pages, ok := residentPages(t, b.Data); ok {
					t.Errorf("after the free: the buffer is still mapped, %d of %d pages resident; want it unmapped", res, pages)
				}
			})
		}
	}
}

// PinnedBytes counts what is pinned now and the most pinned at once.
func TestPinnedBytes(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	a := get[device.HostBuffer](t)(d.HostAlloc(3*MiB, false))
	b := get[device.HostBuffer](t)(d.HostAlloc(5*MiB, true))
	check(t, d.HostFree(a))
	c := get[device.HostBuffer](t)(d.HostAlloc(1*MiB, false))
	// 3 + 5 = 8 MiB at most; then 5 + 1 = 6 MiB live.
	if live, peak := d.PinnedBytes(); live != 6*MiB || peak != 8*MiB {
		t.Errorf("PinnedBytes: %d live, %d peak; want 6 MiB live, 8 MiB peak", live, peak)
	}
	check(t, d.HostFree(b))
	check(t, d.HostFree(c))
	if live, peak := d.PinnedBytes(); live != 0 || peak != 8*MiB {
		t.Errorf("PinnedBytes after freeing all: %d live, %d peak; want 0, 8 MiB", live, peak)
	}
}

// Pinned memory is resident when HostAlloc returns (mincore says so of
// every page), as cuMemHostAlloc's is: copies into it take no page faults.
func TestHostAllocIsResident(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	for name, mapped := range map[string]bool{"unmapped": false, "mapped": true} {
		t.Run(name, func(t *testing.T) {
			const n = 48 * MiB
			b := get[device.HostBuffer](t)(d.HostAlloc(n, mapped))
			defer func() { check(t, d.HostFree(b)) }()
			page := uintptr(syscall.Getpagesize())
			lo := uintptr(unsafe.Pointer(&b.Data[0])) &^ (page - 1)
			hi := uintptr(unsafe.Pointer(&b.Data[n-1])) + 1
			vec := make([]byte, (hi-lo+page-1)/page)
			if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
				t.Skipf("mincore: %v", e)
			}
			out := 0
			for _, v := range vec {
				if v&1 == 0 {
					out++
				}
			}
			if out > 0 {
				t.Errorf("%d of the %d pages of a %d MiB pinned buffer are not resident", out, len(vec), n/MiB)
			}
		})
	}
}
