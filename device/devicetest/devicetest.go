package devicetest

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
)

// opener makes a fresh device for one subtest.
type opener func(t *testing.T) device.Device

// waitLimit bounds every wait the suite does on the device, so that a
// backend that blocks forever fails instead of hanging.
const waitLimit = 20 * time.Second

// Run runs the whole suite against devices made by open.
func Run(t *testing.T, open func(t *testing.T) device.Device) {
	o := opener(open)
	groups := map[string]func(*testing.T, opener){
		"Info":             testInfo,
		"Accounting":       testAccounting,
		"Malloc":           testMalloc,
		"Copies":           testCopies,
		"StreamOrder":      testStreamOrder,
		"Asynchrony":       testAsynchrony,
		"Events":           testEvents,
		"StickyErrors":     testStickyErrors,
		"Kernels":          testKernels,
		"AsyncPool":        testAsyncPool,
		"HostMemory":       testHostMemory,
		"Memcheck":         testMemcheck,
		"Reset":            testReset,
		"BadInputs":        testBadInputs,
		"Closed":           testClosed,
		"Concurrency":      testConcurrency,
		"DeviceSyncAll":    testDeviceSync,
		"StreamCloseWaits": testStreamCloseWaits,
		"StridedCopies":    testStrided,
		"VirtualMemory":    testVirtualMemory,
	}
	for _, name := range sortedKeys(groups) {
		t.Run(name, func(t *testing.T) { groups[name](t, o) })
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// fresh opens a device that is closed when the test ends; Close must
// succeed (the suite frees everything it allocates).
func (o opener) fresh(t *testing.T) device.Device {
	t.Helper()
	d := o(t)
	if d == nil {
		t.Fatal("open returned a nil device")
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}
