package capi

// One allocation in one call (vram.h's vram_queue_allocate, ABI 2.2): the
// client's requests queued, its group allocated, and the response
// described (its plan, buffer 0's arrays, their simulator host addresses),
// so that a program's cycle crosses into the library once instead of once
// per fact. The steps and their errors are Queue's and Allocate's, in that
// order; what it adds is which facts come back with the call.
//
// The caller's own allocated event. Allocate queues an event for the
// caller as for every member that asked; a caller that gets the response
// from the call has then to poll the event and release its second handle.
// With TakeEvent, when that event is the first queued on the manager (no
// earlier event of anyone's could have to be delivered before it), it is
// taken out of the queue and its handle is the response's: the caller
// delivers it first, then polls for the rest. Otherwise it stays queued.

import (
	"context"
	"fmt"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// AllocateOptions say what QueueAllocate does and describes.
type AllocateOptions struct {
	Queue     bool                         // queue Requests first (an empty map drops the queue), as Queue
	Requests  map[string]vram.ArrayRequest // with Queue
	Buffers   int                          // as Allocate's
	TakeEvent bool                         // take the caller's own allocated event when it is first in the queue
	SimHosts  bool                         // each device array's simulator host address (0 where it has none)
	MemInfo   bool                         // the device's free and total memory before the allocation
}

// Allocation is what QueueAllocate gives.
type Allocation struct {
	Response   int64       // the response's handle, to release
	Plan       PlanInfo    // as Plan(Response)
	Arrays     []ArrayInfo // buffer 0's arrays, as Arrays(Response, 0)
	SimHosts   []uintptr   // with SimHosts: Arrays[i]'s host address on the simulator, else 0
	EventTaken bool        // the caller's own allocated event was taken: Response is its handle
	Pending    int         // events queued on the manager when the call returned
	Free       uint64      // with MemInfo: the device's free memory before the allocation
	Total      uint64      // with MemInfo: its total memory
}

// QueueAllocate queues o.Requests for client h (with o.Queue), allocates
// its group with o.Buffers buffers and describes the response. A refused
// queue allocates nothing; a failed allocation leaves what Allocate
// leaves (the queue queued).
func (cs *Clients) QueueAllocate(h int64, o AllocateOptions) (Allocation, error) {
	if o.Buffers < 0 {
		return Allocation{}, fmt.Errorf("vram: allocate for client %d with %d buffers: want 0 or more: %w", h, o.Buffers, device.ErrInvalidValue)
	}
	if o.Queue {
		if err := cs.Queue(h, o.Requests); err != nil {
			return Allocation{}, err
		}
	}
	e, done, err := cs.client(h, "allocate")
	if err != nil {
		return Allocation{}, err
	}
	defer done()
	var a Allocation
	if o.MemInfo {
		if a.Free, a.Total, err = e.m.Manager().MemInfo(); err != nil {
			return Allocation{}, fmt.Errorf("vram: allocate for client %d: the device's memory: %w", h, err)
		}
	}
	r, err := e.c.Allocate(context.Background(), buffersOption(o.Buffers)...)
	if err != nil {
		return Allocation{}, fmt.Errorf("vram: %w", err)
	}
	a.Response, a.EventTaken = cs.takeOwnEvent(e, h, r, o.TakeEvent)
	if !a.EventTaken {
		a.Response, _ = cs.addResponse(e, r)
	}
	re, err := cs.response(a.Response)
	if err == nil {
		err = cs.describe(re, &a, o.SimHosts)
	}
	if err != nil { // cannot happen: the response is held, its arrays just made
		_ = cs.ReleaseResponse(a.Response)
		return Allocation{}, err
	}
	return a, nil
}

// takeOwnEvent takes client h's allocated event of r out of e's manager's
// queue when asked and it is first there, and returns its response handle
// (false: left queued, or none).
func (cs *Clients) takeOwnEvent(e *clientEntry, h int64, r *vram.ArrayResponse, take bool) (int64, bool) {
	if !take {
		return 0, false
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	q := cs.events[e.m]
	if len(q) == 0 || q[0].Kind != EventAllocated || q[0].Client != h {
		return 0, false
	}
	rh := q[0].Response
	if re := cs.resps[rh]; re == nil || re.r != r {
		return 0, false
	}
	q[0] = Event{}
	if cs.events[e.m] = q[1:]; len(q) == 1 {
		delete(cs.events, e.m)
	}
	return rh, true
}

// describe fills a's plan, arrays, simulator addresses (with sims) and the
// manager's pending events from re.
func (cs *Clients) describe(re *responseEntry, a *Allocation, sims bool) error {
	a.Plan = PlanInfo{Client: int64(re.r.Client.ID()), Plan: re.r.Plan, ID: re.id, Sets: len(re.r.Buffers), FreeError: re.r.FreeErr != nil}
	ls := re.labels(0)
	a.Plan.Arrays = len(ls)
	a.Arrays = make([]ArrayInfo, 0, len(ls))
	for _, l := range ls {
		ai, err := re.array(l, 0)
		if err != nil {
			return err
		}
		ai.LabelC = re.labelAddress(l)
		a.Arrays = append(a.Arrays, ai)
	}
	if sims {
		a.SimHosts = make([]uintptr, len(ls))
		if err := re.simHosts(a.Arrays, a.SimHosts); err != nil {
			return err
		}
	}
	cs.mu.Lock()
	a.Pending = len(cs.events[re.m])
	cs.mu.Unlock()
	return nil
}

// simHosts pins and gives the simulator's host address of each device
// array of as (buffer 0 of re) into out; 0 for host arrays, and for all on
// a device whose memory has no host address.
func (re *responseEntry) simHosts(as []ArrayInfo, out []uintptr) error {
	hv, ok := re.m.dev.(hostViewer)
	if !ok {
		return nil
	}
	re.pinMu.Lock()
	defer re.pinMu.Unlock()
	for i, ai := range as {
		d := re.r.Buffers[0].Device[ai.Label]
		if d == nil || d.Freed() {
			continue
		}
		bs, err := hv.HostBytes(d.Ptr(), d.Bytes())
		if err != nil {
			return fmt.Errorf("vram: host address of %v: %w", d, err)
		}
		out[i] = pinBytes(&re.pins, bs)
	}
	return nil
}

// buffersOption is Allocate's option for buffers (none for 0 or 1).
func buffersOption(buffers int) []vram.AllocateOption {
	if buffers > 1 {
		return []vram.AllocateOption{vram.WithBuffers(buffers)}
	}
	return nil
}
