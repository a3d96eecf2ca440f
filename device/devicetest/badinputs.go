package devicetest

// Bad inputs: each refused with its own error, taking no memory.

import (
	"math"
	"testing"

	"github.com/vramkit/vram/device"
)

// badCall is a call with a bad input and the error it must wrap.
type badCall struct {
	call func() error
	want error
}

// testBadInputs makes calls with bad inputs: each fails with its error
// and takes no memory.
func testBadInputs(t *testing.T, o opener) {
	d := o.fresh(t)
	cases := badInputs(d)
	for _, name := range sortedKeys(cases) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			free := memFree(t, d)
			isErr(t, tc.call(), tc.want, name)
			freeNear(t, d, memFree(t, d), free, "after a failed call")
		})
	}
	t.Run("stream from another device", func(t *testing.T) { badStreamFromAnotherDevice(t, o, d) })
}

// badInputs are the bad calls of d's abilities, by name.
func badInputs(d device.Device) map[string]badCall {
	s := d.DefaultStream()
	cases := map[string]badCall{
		"Malloc zero": {func() error { _, err := d.Malloc(0); return err }, device.ErrInvalidValue},
		"Malloc more than total": {func() error {
			_, err := d.Malloc(d.Info().TotalBytes + 1)
			return err
		}, device.ErrOutOfMemory},
		"Malloc max": {func() error { _, err := d.Malloc(math.MaxUint64); return err }, device.ErrOutOfMemory},
		"copy on nil stream": {func() error {
			return d.CopyHtoD(1, []byte{1}, nil)
		}, device.ErrInvalidValue},
		"event record on nil stream": {func() error {
			e, err := d.NewEvent()
			if err != nil {
				return err
			}
			defer e.Close()
			return e.Record(nil)
		}, device.ErrInvalidValue},
	}
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		cases["MallocAsync zero"] = badCall{func() error { _, err := aa.MallocAsync(0, s); return err }, device.ErrInvalidValue}
		cases["MallocAsync nil stream"] = badCall{func() error { _, err := aa.MallocAsync(8, nil); return err }, device.ErrInvalidValue}
		cases["MallocAsync more than total"] = badCall{func() error { _, err := aa.MallocAsync(d.Info().TotalBytes+1, s); return err }, device.ErrOutOfMemory}
		cases["MallocAsync max"] = badCall{func() error { _, err := aa.MallocAsync(math.MaxUint64, s); return err }, device.ErrOutOfMemory}
		cases["FreeAsync null"] = badCall{func() error { return aa.FreeAsync(0, s) }, device.ErrInvalidPointer}
	}
	if ha, isHA := d.(device.HostAllocator); isHA {
		cases["HostAlloc zero"] = badCall{func() error { _, err := ha.HostAlloc(0, false); return err }, device.ErrInvalidValue}
	}
	if fl, isFL := d.(device.FuncLauncher); isFL && d.Info().Backed {
		nop := func(device.View, int, int) error { return nil }
		cases["LaunchFunc zero range"] = badCall{func() error { return fl.LaunchFunc(s, 0, nop) }, device.ErrInvalidValue}
		cases["LaunchFunc nil func"] = badCall{func() error { return fl.LaunchFunc(s, 1, nil) }, device.ErrInvalidValue}
		cases["LaunchFunc negative range"] = badCall{func() error { return fl.LaunchFunc(s, -1, nop) }, device.ErrInvalidValue}
	}
	return cases
}

// badStreamFromAnotherDevice: d refuses a stream of another device in an
// event, a copy and an allocation, and takes no memory for it.
func badStreamFromAnotherDevice(t *testing.T, o opener, d device.Device) {
	d2 := o.fresh(t)
	s2 := strm(t)(d2.NewStream())
	defer func() { ok(t, s2.Close()) }()
	e := evt(t)(d.NewEvent())
	defer func() { ok(t, e.Close()) }()
	isErr(t, e.Record(s2), device.ErrInvalidValue, "Record on another device's stream")
	isErr(t, e2Wait(d, s2), device.ErrInvalidValue, "Wait by another device's stream")
	if d.Info().Backed {
		p := ptr(t)(d.Malloc(8))
		defer func() { ok(t, d.Free(p)) }()
		isErr(t, d.CopyHtoD(p, []byte{1}, s2), device.ErrInvalidValue, "copy on another device's stream")
	}
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		free := memFree(t, d)
		_, err := aa.MallocAsync(8, s2)
		isErr(t, err, device.ErrInvalidValue, "MallocAsync on another device's stream")
		freeNear(t, d, memFree(t, d), free, "after a refused MallocAsync, another device's stream open")
	}
}
