package devicetest

// Reset: everything released, everything from before refused, the device
// usable again.

import (
	"testing"

	"github.com/vramkit/vram/device"
)

// resetState is what a device held before a Reset, for testReset.
type resetState struct {
	d          device.Device
	start      uint64     // free memory before anything was allocated
	p          device.Ptr // a Malloc
	s          device.Stream
	e          device.Event // recorded on s
	oldDefault device.Stream
	aa         device.AsyncAllocator // nil when the device has none
	ap         device.Ptr            // a MallocAsync on s, when aa
	vm         device.VirtualMemory  // nil when the device has none; else:
	res        device.Ptr            // a reservation of 4 granules
	mapped     device.PhysMem        // mapped at res, with access, released
	spare      device.PhysMem        // neither mapped nor released
}

// testReset resets a device holding memory, a stream, an event, a pool
// block and virtual memory (a reservation, a mapping, physical memory
// neither mapped nor released): everything is released — the reset gives
// back what the device's own reset may not (the pool's memory, virtual
// memory) — every use of what came before fails with ErrInvalidated, and
// the device works afterwards.
func testReset(t *testing.T, o opener) {
	r := resetState{d: o.fresh(t)}
	d := r.d
	r.start = memFree(t, d)
	r.p = ptr(t)(d.Malloc(1 << 20))
	r.s = strm(t)(d.NewStream())
	r.e = evt(t)(d.NewEvent())
	ok(t, r.e.Record(r.s))
	r.oldDefault = d.DefaultStream()
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		r.aa = aa
		r.ap = ptr(t)(aa.MallocAsync(4096, r.s))
	}
	r.makeVM(t)
	resetMovesGeneration(t, d, r.s)
	freeNear(t, d, memFree(t, d), r.start, "after Reset (everything released)")
	if r.aa != nil {
		if res, used, err := r.aa.PoolUsage(); err != nil || res != 0 || used != 0 {
			t.Errorf("PoolUsage after Reset = %d reserved, %d used, %v; want 0, 0, nil", res, used, err)
		}
	}
	// Every use of what came before fails. Nothing is allocated until
	// these are checked: a driver may hand the old addresses out again,
	// and then an old pointer is indistinguishable from a new one.
	uses := r.uses()
	for _, name := range sortedKeys(uses) {
		u := uses[name]
		t.Run(name, func(t *testing.T) {
			if u.pointer {
				isOnly(t, u.call(), device.ErrInvalidated, name)
			} else {
				isErr(t, u.call(), device.ErrInvalidated, name)
			}
		})
	}
	t.Run("closing old streams and events", func(t *testing.T) {
		isErr(t, r.s.Close(), device.ErrInvalidated, "Close of a stream from before Reset")
		isErr(t, r.e.Close(), device.ErrInvalidated, "Close of an event from before Reset")
	})
	worksAfterReset(t, d)
}

// makeVM gives r virtual memory to hold across the reset, on a device
// with it.
func (r *resetState) makeVM(t *testing.T) {
	vm, isVM := r.d.(device.VirtualMemory)
	if !isVM {
		return
	}
	g := vm.VMGranularity()
	r.vm = vm
	r.res = ptr(t)(vm.ReserveAddress(4 * g))
	r.mapped = phys(t)(vm.CreatePhysical(g))
	ok(t, vm.Map(r.res, g, r.mapped))
	ok(t, vm.SetAccess(r.res, g))
	ok(t, vm.ReleasePhysical(r.mapped))
	r.spare = phys(t)(vm.CreatePhysical(g))
}

// resetMovesGeneration resets d, checking, on a device.Generational, that
// work, allocations and frees leave its generation alone and Reset moves
// it.
func resetMovesGeneration(t *testing.T, d device.Device, s device.Stream) {
	gd, isGen := d.(device.Generational)
	if !isGen {
		ok(t, d.Reset())
		return
	}
	gen := gd.Generation()
	q := ptr(t)(d.Malloc(4096))
	ok(t, d.Free(q))
	ok(t, s.Synchronize())
	if g := gd.Generation(); g != gen {
		t.Errorf("Generation moved from %d to %d without a Reset", gen, g)
	}
	ok(t, d.Reset())
	if gd.Generation() == gen {
		t.Errorf("Generation is still %d after Reset", gen)
	}
}

// resetUse is one use of something made before a Reset.
type resetUse struct {
	call    func() error
	pointer bool // a pointer from before the Reset: ErrInvalidated and no other memcheck error
}

// uses are the uses of what r held, after the Reset, by name.
func (r *resetState) uses() map[string]resetUse {
	d, p, s, e, oldDefault := r.d, r.p, r.s, r.e, r.oldDefault
	ns := d.DefaultStream()
	uses := map[string]resetUse{
		"Free of a Malloc pointer":       {func() error { return d.Free(p) }, true},
		"Stream.Synchronize":             {func() error { return s.Synchronize() }, false},
		"Stream.Query":                   {func() error { _, err := s.Query(); return err }, false},
		"old default stream Synchronize": {func() error { return oldDefault.Synchronize() }, false},
		"Event.Record on the new stream": {func() error { return e.Record(ns) }, false},
		"Event.Wait by the new stream":   {func() error { return e.Wait(ns) }, false},
		"Event.Query":                    {func() error { _, err := e.Query(); return err }, false},
		"Event.Synchronize":              {func() error { return e.Synchronize() }, false},
		"new event recorded on an old stream": {func() error {
			e2, err := d.NewEvent()
			if err != nil {
				return err
			}
			defer e2.Close()
			return e2.Record(s)
		}, false},
	}
	if d.Info().Backed {
		uses["copy to an old pointer"] = resetUse{func() error { return d.CopyHtoD(p, []byte{1}, ns) }, true}
		uses["copy from an old pointer"] = resetUse{func() error { return d.CopyDtoH(make([]byte, 8), p.Add(8), ns) }, true}
		uses["memset of an old pointer"] = resetUse{func() error { return d.Memset(p, 0, 8, ns) }, true}
		uses["copy on the old default stream"] = resetUse{func() error { return d.CopyHtoD(p, []byte{1}, oldDefault) }, false}
		uses["copy on an old stream"] = resetUse{func() error { return d.CopyDtoH(make([]byte, 1), p, s) }, false}
	}
	if aa, ap := r.aa, r.ap; aa != nil {
		uses["MallocAsync on an old stream"] = resetUse{func() error { _, err := aa.MallocAsync(10, s); return err }, false}
		uses["FreeAsync of an old MallocAsync pointer"] = resetUse{func() error { return aa.FreeAsync(ap, ns) }, true}
	}
	if vm := r.vm; vm != nil {
		g, res, spare := vm.VMGranularity(), r.res, r.spare
		uses["FreeAddress of a reservation"] = resetUse{func() error { return vm.FreeAddress(res, 4*g) }, false}
		uses["Unmap of a mapping"] = resetUse{func() error { return vm.Unmap(res, g) }, false}
		uses["SetAccess of a mapping"] = resetUse{func() error { return vm.SetAccess(res, g) }, false}
		uses["ReleasePhysical of a handle"] = resetUse{func() error { return vm.ReleasePhysical(spare) }, false}
		uses["Map of a handle"] = resetUse{func() error { return vm.Map(res.Add(g), g, spare) }, false}
	}
	if fl, isFL := d.(device.FuncLauncher); isFL && d.Info().Backed {
		uses["LaunchFunc on an old stream"] = resetUse{func() error {
			return fl.LaunchFunc(s, 1, func(device.View, int, int) error { return nil })
		}, false}
	}
	return uses
}

// worksAfterReset checks that d allocates, copies and makes streams after
// a Reset, with its new default stream.
func worksAfterReset(t *testing.T, d device.Device) {
	ns := d.DefaultStream()
	q := ptr(t)(d.Malloc(1 << 20))
	defer func() { ok(t, d.Free(q)) }()
	if d.Info().Backed {
		ok(t, d.CopyHtoD(q, []byte("after reset"), ns))
		got := make([]byte, 11)
		ok(t, d.CopyDtoH(got, q, ns))
		syncStream(t, ns)
		if string(got) != "after reset" {
			t.Errorf("a copy round trip after Reset read %q", got)
		}
	}
	s2 := strm(t)(d.NewStream())
	syncStream(t, s2)
	ok(t, s2.Close())
}
