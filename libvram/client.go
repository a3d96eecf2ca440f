package main

// The Go side of the client API's entry points (vram.h, ABI 2; client.c
// is their C side): C values to Go ones, internal/capi's Clients, errors
// to status codes.

/*
#include <stdlib.h>
#include "internal.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/libvram/internal/capi"
)

// clients holds the process's clients, responses, work marks, host arrays
// and event queues.
var clients capi.Clients

// vram.h's enums and the vram package's agree: a compile error if not.
var (
	_ = [1]struct{}{}[vram.Float64-C.VRAM_FLOAT64]
	_ = [1]struct{}{}[vram.Complex128-C.VRAM_COMPLEX128]
	_ = [1]struct{}{}[vram.Pinned-C.VRAM_MEMORY_PINNED]
	_ = [1]struct{}{}[vram.Pageable-C.VRAM_MEMORY_PAGEABLE]
	_ = [1]struct{}{}[vram.Active-C.VRAM_ACTIVE]
	_ = [1]struct{}{}[capi.HookInvalidate-C.VRAM_HOOK_INVALIDATE]
	_ = [1]struct{}{}[capi.EventInvalidated-C.VRAM_EVENT_INVALIDATED]
)

// clientStatus is the status code of an error of the client API, and
// whether err is one.
func clientStatus(err error) (C.int, bool) {
	switch {
	case errors.Is(err, vram.ErrOutOfMemory), errors.Is(err, vram.ErrUnchunkable), errors.Is(err, vram.ErrRunTooLarge):
		return C.VRAM_ENOMEM, true
	case errors.Is(err, vram.ErrFreed), errors.Is(err, vram.ErrEvicted):
		return C.VRAM_EFREED, true
	case errors.Is(err, device.ErrNotSupported):
		return C.VRAM_ENOTSUP, true
	case errors.Is(err, vram.ErrClosed):
		return C.VRAM_EHANDLE, true
	case errors.Is(err, vram.ErrInvalidRequest), errors.Is(err, vram.ErrProportion), errors.Is(err, vram.ErrMismatch),
		errors.Is(err, vram.ErrRunsMismatch), errors.Is(err, vram.ErrChunkRange), errors.Is(err, vram.ErrOtherGroup),
		errors.Is(err, vram.ErrNothingQueued), errors.Is(err, vram.ErrUnknownClient), errors.Is(err, batch.ErrBatch):
		return C.VRAM_EINVAL, true
	}
	return 0, false
}

// done turns err into a status code, handing its message to C.
func done(errOut **C.char, err error) C.int {
	if err != nil {
		return fail(errOut, err)
	}
	return C.VRAM_OK
}

// ints reads n int64s at p as ints (a shape from C), refusing a
// negative n or one past VRAM_MAX_NDIM.
func ints(p *C.int64_t, n C.int) ([]int, error) {
	if n < 0 || n > C.VRAM_MAX_NDIM {
		return nil, fmt.Errorf("vram: %d dimensions: want 0 to %d: %w", n, C.VRAM_MAX_NDIM, device.ErrInvalidValue)
	}
	if n > 0 && p == nil {
		return nil, fmt.Errorf("vram: a shape of %d dimensions is NULL: %w", n, device.ErrInvalidValue)
	}
	out := make([]int, n)
	for i, v := range unsafe.Slice((*int64)(unsafe.Pointer(p)), int(n)) {
		out[i] = int(v)
	}
	return out, nil
}

//export vramgo_register
func vramgo_register(h C.int64_t, name, group *C.char, proportion C.double, noEvict C.int32_t, hooks C.uint32_t, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	c, err := clients.Register(m, capi.ClientOptions{Name: C.GoString(name), Group: C.GoString(group),
		Proportion: float64(proportion), NoEvict: noEvict != 0, Hooks: capi.Hooks(hooks)})
	*out = C.int64_t(c)
	return done(errOut, err)
}

//export vramgo_client_close
func vramgo_client_close(c C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	return done(errOut, clients.Close(int64(c)))
}

//export vramgo_client_info
func vramgo_client_info(c C.int64_t, out *C.struct_vram_client_info, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	info, err := clients.Info(int64(c))
	if err != nil {
		return fail(errOut, err)
	}
	out.manager, out.proportion = C.int64_t(info.Manager), C.double(info.Proportion)
	out.cap, out.held, out.stream = C.uint64_t(info.Cap), C.uint64_t(info.Held), C.vram_stream(info.Stream)
	out.closed, out.evicted, out.idle, out.grouped = cbool(info.Closed), cbool(info.Evicted), cbool(info.Idle), cbool(info.Grouped)
	return C.VRAM_OK
}

func cbool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

//export vramgo_client_group
func vramgo_client_group(c C.int64_t, out **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	g, err := clients.Group(int64(c))
	if err != nil {
		return fail(errOut, err)
	}
	return text(out, g)
}

//export vramgo_client_do
func vramgo_client_do(c C.int64_t, op C.int, arg *C.char, p C.double, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	s := C.GoString(arg)
	var err error
	switch op {
	case C.VRAM_OP_CHANGE_GROUP_:
		err = clients.Do(int64(c), "change group", func(c *vram.Client) error { return c.ChangeStreamGroup(s) })
	case C.VRAM_OP_SET_MANUAL_PROPORTION_:
		err = clients.Do(int64(c), "set manual proportion", func(c *vram.Client) error { return c.SetManualProportion(float64(p)) })
	case C.VRAM_OP_SET_MANUAL_LIMIT_MODE_:
		err = clients.Do(int64(c), "set manual limit mode", func(c *vram.Client) error { return c.SetManualLimitMode(float64(p)) })
	case C.VRAM_OP_SET_AUTO_LIMIT_MODE_:
		err = clients.Do(int64(c), "set auto limit mode", (*vram.Client).SetAutoLimitMode)
	case C.VRAM_OP_CLIENT_FREE_:
		err = clients.Do(int64(c), fmt.Sprintf("free %q", s), func(c *vram.Client) error { return c.Free(s) })
	case C.VRAM_OP_SYNC_:
		err = clients.Do(int64(c), "sync", func(c *vram.Client) error { return c.Sync(context.Background()) })
	default:
		err = fmt.Errorf("vram: client call %d: %w", op, device.ErrInvalidValue)
	}
	return done(errOut, err)
}

//export vramgo_queue
func vramgo_queue(c C.int64_t, reqs unsafe.Pointer, n, size C.size_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	rs, err := requests(reqs, int(n), int(size))
	if err != nil {
		return fail(errOut, err)
	}
	return done(errOut, clients.Queue(int64(c), rs))
}

// requests reads n struct vram_requests, size bytes apart, at p.
func requests(p unsafe.Pointer, n, size int) (map[string]vram.ArrayRequest, error) {
	if n > 0 && (p == nil || size < int(unsafe.Sizeof(C.struct_vram_request{}))) {
		return nil, fmt.Errorf("vram: queue: %d requests at %p, %d bytes apart: want them non-NULL, at least sizeof(struct vram_request) = %d apart: %w",
			n, p, size, unsafe.Sizeof(C.struct_vram_request{}), device.ErrInvalidValue)
	}
	out := make(map[string]vram.ArrayRequest, n)
	for i := range n {
		r := (*C.struct_vram_request)(unsafe.Add(p, i*size))
		if r.label == nil {
			return nil, fmt.Errorf("vram: queue: request %d has no label (NULL): %w", i, device.ErrInvalidValue)
		}
		label := C.GoString(r.label)
		if _, dup := out[label]; dup {
			return nil, fmt.Errorf("vram: queue: label %q twice: %w", label, vram.ErrInvalidRequest)
		}
		shape, err := ints(r.shape, C.int(r.ndim))
		if err != nil {
			return nil, fmt.Errorf("vram: queue %q: %w", label, err)
		}
		out[label] = vram.ArrayRequest{Shape: shape, DType: vram.DType(r.dtype), Memory: vram.MemoryType(r.memory),
			ChunkAxis: int(r.chunk_axis), Unchunkable: r.unchunkable != 0, TotalRuns: int(r.total_runs)}
	}
	return out, nil
}

//export vramgo_allocate
func vramgo_allocate(c C.int64_t, buffers C.int, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	r, err := clients.Allocate(int64(c), int(buffers))
	*out = C.int64_t(r)
	return done(errOut, err)
}

//export vramgo_queue_allocate
func vramgo_queue_allocate(c C.int64_t, reqs unsafe.Pointer, n, size C.size_t, a *C.struct_vram_allocation, plan *C.struct_vram_plan, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	o := capi.AllocateOptions{Queue: a.flags&C.VRAM_ALLOCATE_QUEUE != 0, Buffers: int(a.buffers),
		TakeEvent: a.flags&C.VRAM_ALLOCATE_TAKE_EVENT != 0, SimHosts: a.sim_hosts != nil && a.cap > 0,
		MemInfo: a.flags&C.VRAM_ALLOCATE_MEM_INFO != 0}
	if o.Queue {
		rs, err := requests(reqs, int(n), int(size))
		if err != nil {
			return fail(errOut, err)
		}
		o.Requests = rs
	}
	al, err := clients.QueueAllocate(int64(c), o)
	if err != nil {
		return fail(errOut, err)
	}
	fillPlan(plan, al.Plan)
	a.response, a.n, a.pending, a.event_taken = C.int64_t(al.Response), C.size_t(len(al.Arrays)), C.int64_t(al.Pending), cbool(al.EventTaken)
	a.free_bytes, a.total_bytes = C.uint64_t(al.Free), C.uint64_t(al.Total)
	if err := fillArrays(unsafe.Pointer(a.arrays), int(a.cap), int(a.array_size), al.Arrays); err != nil {
		_ = clients.ReleaseResponse(al.Response)
		return fail(errOut, err)
	}
	for i := range al.SimHosts[:min(len(al.SimHosts), int(a.cap))] {
		*(*uintptr)(unsafe.Add(unsafe.Pointer(a.sim_hosts), uintptr(i)*unsafe.Sizeof(uintptr(0)))) = al.SimHosts[i] // pinned while the response is held
	}
	return C.VRAM_OK
}

// fillArrays describes up to capacity of as at out, size bytes apart, as
// far as size goes (a smaller struct of an earlier ABI).
func fillArrays(out unsafe.Pointer, capacity, size int, as []capi.ArrayInfo) error {
	k := min(uintptr(size), unsafe.Sizeof(C.struct_vram_array{}))
	for i, a := range as[:min(len(as), capacity)] {
		var c C.struct_vram_array
		if err := fillArray(&c, a); err != nil {
			return err
		}
		c.size = C.uint64_t(k)
		dst := unsafe.Add(out, uintptr(i)*uintptr(size))
		copy(unsafe.Slice((*byte)(dst), k), unsafe.Slice((*byte)(unsafe.Pointer(&c)), k))
	}
	return nil
}

//export vramgo_response_plan
func vramgo_response_plan(r C.int64_t, out *C.struct_vram_plan, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	pi, err := clients.Plan(int64(r))
	if err != nil {
		return fail(errOut, err)
	}
	fillPlan(out, pi)
	return C.VRAM_OK
}

//export vramgo_batch_plan
func vramgo_batch_plan(b C.int64_t, out *C.struct_vram_plan, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	pi, err := clients.BatchPlan(int64(b))
	if err != nil {
		return fail(errOut, err)
	}
	fillPlan(out, pi)
	return C.VRAM_OK
}

// fillPlan describes pi in *out.
func fillPlan(out *C.struct_vram_plan, pi capi.PlanInfo) {
	p := pi.Plan
	out.client, out.arrays = C.int64_t(pi.Client), C.int64_t(pi.Arrays)
	out.chunks, out.chunk_length, out.last_chunk_length = C.int64_t(p.Chunks), C.int64_t(p.ChunkLength), C.int64_t(p.LastChunkLength)
	out.total_runs, out.buffers = C.int64_t(p.TotalRuns), C.int64_t(p.Buffers)
	out.budget, out.unchunkable_bytes, out.chunk_bytes = C.uint64_t(p.Budget), C.uint64_t(p.UnchunkableBytes), C.uint64_t(p.ChunkBytes)
	out.device_bytes, out.full_bytes, out.host_bytes = C.uint64_t(p.DeviceBytes), C.uint64_t(p.FullBytes), C.uint64_t(p.HostBytes)
	out.granularity, out.bytes_per_chunk = C.uint64_t(p.Granularity), C.uint64_t(p.BytesPerChunk)
	out.id, out.sets, out.free_error = C.int64_t(pi.ID), C.int32_t(pi.Sets), cbool(pi.FreeError)
}

//export vramgo_response_array
func vramgo_response_array(r C.int64_t, label *C.char, buffer C.int, out *C.struct_vram_array, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	a, err := clients.Array(int64(r), C.GoString(label), int(buffer))
	if err != nil {
		return fail(errOut, err)
	}
	return done(errOut, fillArray(out, a))
}

// fillArray describes a in *out.
func fillArray(out *C.struct_vram_array, a capi.ArrayInfo) error {
	if len(a.Shape) > C.VRAM_MAX_NDIM {
		return fmt.Errorf("vram: array %q has %d dimensions; the C struct holds %d: %w", a.Label, len(a.Shape), C.VRAM_MAX_NDIM, device.ErrNotSupported)
	}
	out.dtype, out.memory, out.ndim, out.chunk_axis = C.int32_t(a.DType), C.int32_t(a.Memory), C.int32_t(len(a.Shape)), C.int32_t(a.ChunkAxis)
	out.device_ptr, out.bytes, out.freed = C.uint64_t(a.DevicePtr), C.uint64_t(a.Bytes), cbool(a.Freed)
	*(*uintptr)(unsafe.Pointer(&out.host)) = a.Host    // memory pinned while the response is held
	*(*uintptr)(unsafe.Pointer(&out.label)) = a.LabelC // the same
	for i := range a.Shape {
		out.shape[i], out.strides[i] = C.int64_t(a.Shape[i]), C.int64_t(a.Strides[i])
	}
	return nil
}

//export vramgo_response_arrays
func vramgo_response_arrays(r C.int64_t, buffer C.int, out unsafe.Pointer, capacity, size C.size_t, n *C.size_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	as, err := clients.Arrays(int64(r), int(buffer), nil)
	if err != nil {
		return fail(errOut, err)
	}
	*n = C.size_t(len(as))
	return done(errOut, fillArrays(out, int(capacity), int(size), as))
}

//export vramgo_response_span
func vramgo_response_span(r C.int64_t, chunk, axis C.int, out *C.struct_vram_span, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	sp, err := clients.Span(int64(r), int(chunk), int(axis))
	if err != nil {
		return fail(errOut, err)
	}
	out.axis, out.start, out.len = C.int64_t(sp.Axis), C.int64_t(sp.Start), C.int64_t(sp.Len)
	return C.VRAM_OK
}

//export vramgo_response_member
func vramgo_response_member(r, c C.int64_t, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := clients.Member(int64(r), int64(c))
	*out = C.int64_t(m)
	return done(errOut, err)
}

//export vramgo_response_json
func vramgo_response_json(r C.int64_t, out **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	s, err := clients.JSON(int64(r))
	if err != nil {
		return fail(errOut, err)
	}
	return text(out, s)
}

//export vramgo_response_release
func vramgo_response_release(r C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	return done(errOut, clients.ReleaseResponse(int64(r)))
}

//export vramgo_sim_host_address
func vramgo_sim_host_address(r C.int64_t, label *C.char, buffer C.int, out *C.uintptr_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	p, err := clients.SimHost(int64(r), C.GoString(label), int(buffer))
	*out = C.uintptr_t(p)
	return done(errOut, err)
}

//export vramgo_copy
func vramgo_copy(toDevice C.int, c, r C.int64_t, label *C.char, buffer C.int, hd *C.struct_vram_host_desc, sp *C.struct_vram_span, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	shape, err := ints(hd.shape, C.int(hd.ndim))
	if err != nil {
		return fail(errOut, err)
	}
	desc := capi.HostDesc{Data: hd.data, Shape: shape, DType: vram.DType(hd.dtype)}
	var span *vram.Span
	if sp != nil {
		span = &vram.Span{Axis: int(sp.axis), Start: int(sp.start), Len: int(sp.len)}
	}
	return done(errOut, clients.Copy(toDevice != 0, int64(c), int64(r), C.GoString(label), int(buffer), desc, span))
}

//export vramgo_begin_work
func vramgo_begin_work(c C.int64_t, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	w, err := clients.BeginWork(int64(c))
	*out = C.int64_t(w)
	return done(errOut, err)
}

//export vramgo_end_work
func vramgo_end_work(w C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	return done(errOut, clients.EndWork(int64(w)))
}

//export vramgo_manager_do
func vramgo_manager_do(h C.int64_t, op C.int, arg *C.char, n C.int, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	switch op {
	case C.VRAM_OP_SET_LIMIT_MODE_:
		err = m.SetLimitMode(int(n))
	case C.VRAM_OP_FREE_LABEL_:
		err = m.FreeLabel(C.GoString(arg))
	case C.VRAM_OP_FREE_ALL_:
		err = m.FreeAll()
	case C.VRAM_OP_INVALIDATE_ALL_:
		err = m.InvalidateAll()
	case C.VRAM_OP_REINIT_STREAMS_:
		err = m.ReinitStreams()
	default:
		err = fmt.Errorf("vram: manager call %d: %w", op, device.ErrInvalidValue)
	}
	return done(errOut, err)
}

//export vramgo_shares
func vramgo_shares(h C.int64_t, manual, autoPool *C.double, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	s, err := m.Shares()
	*manual, *autoPool = C.double(s.Manual), C.double(s.Auto)
	return done(errOut, err)
}

//export vramgo_mem_info
func vramgo_mem_info(h C.int64_t, free, total *C.uint64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	f, t, err := m.MemInfo()
	*free, *total = C.uint64_t(f), C.uint64_t(t)
	return done(errOut, err)
}

//export vramgo_group_members
func vramgo_group_members(h C.int64_t, group *C.char, out *C.int64_t, capacity C.size_t, n *C.size_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	hs, err := m.GroupMembers(C.GoString(group))
	if err != nil {
		return fail(errOut, err)
	}
	*n = C.size_t(len(hs))
	if capacity > 0 && out != nil {
		dst := unsafe.Slice((*int64)(unsafe.Pointer(out)), int(capacity))
		copy(dst, hs)
	}
	return C.VRAM_OK
}

//export vramgo_poll
func vramgo_poll(h C.int64_t, out *C.struct_vram_event, reason **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	ev := clients.Poll(m)
	out.kind, out.evicted = C.int32_t(ev.Kind), cbool(ev.Evicted)
	out.client, out.response, out.pending, out.response_id = C.int64_t(ev.Client), C.int64_t(ev.Response), C.int64_t(ev.Pending), C.int64_t(ev.ID)
	if ev.Reason != "" {
		*reason = C.CString(ev.Reason)
	}
	return C.VRAM_OK
}

//export vramgo_host_array
func vramgo_host_array(h C.int64_t, shape *C.int64_t, ndim, dtype, memory C.int, out *C.int64_t, data *C.uintptr_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	sh, err := ints(shape, ndim)
	if err != nil {
		return fail(errOut, err)
	}
	mem := vram.MemoryType(memory)
	if mem != vram.Pinned && mem != vram.Mapped && mem != vram.Pageable {
		return fail(errOut, fmt.Errorf("vram: host array of memory %d: want pinned (%d), mapped (%d) or pageable (%d): %w",
			memory, vram.Pinned, vram.Mapped, vram.Pageable, device.ErrInvalidValue))
	}
	hh, p, err := clients.HostArray(m, sh, vram.DType(dtype), mem)
	*out, *data = C.int64_t(hh), C.uintptr_t(p)
	return done(errOut, err)
}

//export vramgo_host_free
func vramgo_host_free(hh C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	return done(errOut, clients.HostFree(int64(hh)))
}

// batchArrays reads n struct vram_batch_arrays, size bytes apart, at p.
func batchArrays(p unsafe.Pointer, n, size int) ([]capi.BatchArray, error) {
	if n > 0 && (p == nil || size < int(unsafe.Sizeof(C.struct_vram_batch_array{}))) {
		return nil, fmt.Errorf("vram: batch: %d arrays at %p, %d bytes apart: want them non-NULL, at least sizeof(struct vram_batch_array) = %d apart: %w",
			n, p, size, unsafe.Sizeof(C.struct_vram_batch_array{}), device.ErrInvalidValue)
	}
	out := make([]capi.BatchArray, n)
	for i := range n {
		a := (*C.struct_vram_batch_array)(unsafe.Add(p, i*size))
		reqs, err := requests(unsafe.Pointer(&a.request), 1, int(unsafe.Sizeof(a.request)))
		if err != nil {
			return nil, fmt.Errorf("vram: batch array %d: %w", i, err)
		}
		for l, r := range reqs {
			out[i] = capi.BatchArray{Client: int64(a.client), Label: l, Dir: capi.BatchDir(a.direction), Request: r,
				HostHandle: int64(a.host_array)}
		}
		if a.host != nil {
			out[i].Host = capi.HostDesc{Data: a.host, Shape: out[i].Request.Shape, DType: out[i].Request.DType}
		}
	}
	return out, nil
}

//export vramgo_batch_start
func vramgo_batch_start(h C.int64_t, arrays unsafe.Pointer, n, size C.size_t, o *C.struct_vram_batch_options, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	as, err := batchArrays(arrays, int(n), int(size))
	if err != nil {
		return fail(errOut, err)
	}
	bo := capi.BatchOptions{Buffers: int(o.buffers), HostKernels: o.host_kernels != 0, MaxChunkLength: int(o.max_chunk_length), Grow: o.grow != 0}
	b, err := clients.StartBatch(m, as, bo)
	*out = C.int64_t(b)
	return done(errOut, err)
}

//export vramgo_batch_next
func vramgo_batch_next(b C.int64_t, ch *C.struct_vram_batch_chunk, arrays unsafe.Pointer, capacity, size C.size_t, simHosts *unsafe.Pointer, finished *C.int, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	c, end, err := clients.NextChunk(int64(b))
	*finished = 0
	if end {
		*finished = 1
	}
	if err != nil || end {
		return done(errOut, err)
	}
	ch.index, ch.chunks, ch.start, ch.len = C.int64_t(c.Index), C.int64_t(c.Chunks), C.int64_t(c.Start), C.int64_t(c.Len)
	ch.chunk_length, ch.buffer, ch.stream = C.int64_t(c.ChunkLength), C.int64_t(c.Buffer), C.vram_stream(c.Stream)
	ch.arrays = C.int64_t(len(c.Arrays))
	k := min(uintptr(size), unsafe.Sizeof(C.struct_vram_array{}))
	for i, a := range c.Arrays[:min(len(c.Arrays), int(capacity))] {
		var ca C.struct_vram_array
		if err := fillArray(&ca, a); err != nil {
			return fail(errOut, err)
		}
		ca.size = C.uint64_t(k)
		copy(unsafe.Slice((*byte)(unsafe.Add(arrays, uintptr(i)*uintptr(size))), k), unsafe.Slice((*byte)(unsafe.Pointer(&ca)), k))
		if simHosts != nil {
			*(*uintptr)(unsafe.Add(unsafe.Pointer(simHosts), uintptr(i)*unsafe.Sizeof(uintptr(0)))) = c.SimHost[i] // pinned while the batch is open
		}
	}
	return C.VRAM_OK
}

//export vramgo_batch_do
func vramgo_batch_do(b C.int64_t, op C.int, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	switch op {
	case C.VRAM_OP_BATCH_CANCEL_:
		return done(errOut, clients.CancelBatch(int64(b)))
	case C.VRAM_OP_BATCH_CLOSE_:
		return done(errOut, clients.CloseBatch(int64(b)))
	}
	return fail(errOut, fmt.Errorf("vram: batch call %d: %w", op, device.ErrInvalidValue))
}

//export vramgo_batch_report_json
func vramgo_batch_report_json(b C.int64_t, out **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	s, err := clients.BatchReportJSON(int64(b))
	if err != nil {
		return fail(errOut, err)
	}
	return text(out, s)
}
