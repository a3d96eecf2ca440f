package trace

// Recording an allocator that maps pages (alloc.Expandable): the device's
// virtual-memory calls pass through, each Map recorded as PyTorch records
// an expandable segment's growth ("segment_map") and each Unmap as its
// shrinking ("segment_unmap"). At the end, mapped pages that touch, on one
// stream, are one expandable segment, as PyTorch shows them.

import "github.com/vramkit/vram/device"

// recVM passes a device's virtual-memory calls through, recording maps
// and unmaps.
type recVM struct {
	vm  device.VirtualMemory
	log *recorder
}

func (d recVM) VMGranularity() uint64                       { return d.vm.VMGranularity() }
func (d recVM) ReserveAddress(n uint64) (device.Ptr, error) { return d.vm.ReserveAddress(n) }
func (d recVM) FreeAddress(p device.Ptr, n uint64) error    { return d.vm.FreeAddress(p, n) }
func (d recVM) CreatePhysical(n uint64) (device.PhysMem, error) {
	return d.vm.CreatePhysical(n)
}
func (d recVM) ReleasePhysical(h device.PhysMem) error { return d.vm.ReleasePhysical(h) }
func (d recVM) SetAccess(p device.Ptr, n uint64) error { return d.vm.SetAccess(p, n) }

// Map records n bytes mapped at p as a "segment_map".
func (d recVM) Map(p device.Ptr, n uint64, h device.PhysMem) error {
	err := d.vm.Map(p, n, h)
	if err == nil {
		d.log.mapped(p, n)
	}
	return err
}

// Unmap records the mapping at p going as a "segment_unmap".
func (d recVM) Unmap(p device.Ptr, n uint64) error {
	err := d.vm.Unmap(p, n)
	if err == nil {
		d.log.unmapped(p)
	}
	return err
}

// recVMDevice is a recorded device with virtual memory.
type recVMDevice struct {
	recDevice
	recVM
}

// recAsyncVMDevice is a recorded device with stream-ordered allocation
// and virtual memory.
type recAsyncVMDevice struct {
	recAsyncDevice
	recVM
}

// recordDevice wraps dev for rec, keeping its stream-ordered allocation
// and virtual memory, if it has them.
func recordDevice(dev device.Device, rec *recorder) device.Device {
	base := recDevice{Device: dev, rec: rec}
	ad, async := dev.(device.AsyncAllocator)
	vm, isVM := dev.(device.VirtualMemory)
	switch {
	case async && isVM:
		return &recAsyncVMDevice{recAsyncDevice{base, ad}, recVM{vm, rec}}
	case async:
		return &recAsyncDevice{base, ad}
	case isVM:
		return &recVMDevice{base, recVM{vm, rec}}
	}
	return &base
}

func (r *recorder) mapped(p device.Ptr, n uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.segs[uint64(p)] = segInfo{size: n, stream: r.stream, mapped: true}
	r.addLocked("segment_map", uint64(p), n, r.stream)
}

func (r *recorder) unmapped(p device.Ptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.segs[uint64(p)]
	if r.done || !ok {
		return
	}
	delete(r.segs, uint64(p))
	r.addLocked("segment_unmap", uint64(p), s.size, s.stream)
}

// joinMapped merges the mappings that touch on one stream, in bases
// (sorted) and segs, into one expandable segment each; it returns the
// bases left.
func joinMapped(bases []uint64, segs map[uint64]segInfo) []uint64 {
	out := bases[:0]
	for _, b := range bases {
		s := segs[b]
		if k := len(out); k > 0 && s.mapped {
			last := out[k-1]
			ls := segs[last]
			if ls.mapped && ls.stream == s.stream && last+ls.size == b {
				ls.size += s.size
				segs[last] = ls
				delete(segs, b)
				continue
			}
		}
		out = append(out, b)
	}
	return out
}
