package capi

// Responses: what an allocation gave a client, held by handle until C
// releases it; the description of their arrays; the host address of a
// device array on the simulator; and the copies between C's host memory and
// their arrays, on the client's stream.
//
// One response may be given under several handles (Allocate's, its
// event's, Member's); each is released on its own. Its id is the first
// handle it was given under, and every handle of it says the same id, so
// that a caller holding a description of it need not read it again.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// responseEntry is a response C holds.
type responseEntry struct {
	m    *Manager
	r    *vram.ArrayResponse
	id   int64          // r's id: the first handle it was given under
	axes map[string]int // label → its request's chunk axis; -1 when not chunkable

	pinMu   sync.Mutex        // serializes pins, and protects cLabels
	pins    runtime.Pinner    // the Go memory of every address handed out from r
	cLabels map[string][]byte // each label NUL-terminated, pinned: C may keep its address; made on first use
}

// identity is a held response's id and how many of its handles are held.
type identity struct {
	id      int64
	handles int
}

// unpin lets the response's memory go.
func (re *responseEntry) unpin() {
	re.pinMu.Lock()
	re.pins.Unpin()
	re.cLabels = nil
	re.pinMu.Unlock()
}

// hostViewer is a device whose memory the host can reach (the simulator:
// sim.Device.HostBytes).
type hostViewer interface {
	HostBytes(p device.Ptr, n uint64) ([]byte, error)
}

// axesOf is each queued label's chunk axis, -1 for one not chunkable.
func axesOf(queued map[string]vram.ArrayRequest) map[string]int {
	axes := make(map[string]int, len(queued))
	for l, r := range queued {
		axes[l] = -1
		if r.Chunkable() {
			axes[l] = r.ChunkAxis
		}
	}
	return axes
}

// addResponse registers r, given to e's client, pins its host arrays, and
// returns its new handle and its id. Its arrays' chunk axes are those of
// the client's requests as last queued here.
func (cs *Clients) addResponse(e *clientEntry, r *vram.ArrayResponse) (int64, int64) {
	re := &responseEntry{m: e.m, r: r}
	re.pinMu.Lock()
	for _, set := range r.Buffers {
		for _, h := range set.Host {
			pinBytes(&re.pins, h.Data())
		}
	}
	re.pinMu.Unlock()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.initLocked()
	re.axes = axesOf(e.queued)
	h := cs.nextLocked()
	cs.resps[h] = re
	id := cs.ids[r]
	if id == nil {
		id = &identity{id: h}
		cs.ids[r] = id
	}
	id.handles++
	re.id = id.id
	return h, id.id
}

// dropIDLocked counts a handle of re's response released. cs.mu must be
// held.
func (cs *Clients) dropIDLocked(re *responseEntry) {
	if id := cs.ids[re.r]; id != nil {
		if id.handles--; id.handles <= 0 {
			delete(cs.ids, re.r)
		}
	}
}

// Allocate allocates client h's group with buffers chunk buffers in flight
// (0 or 1: one) and returns the client's response.
func (cs *Clients) Allocate(h int64, buffers int) (int64, error) {
	if buffers < 0 {
		return 0, fmt.Errorf("vram: allocate for client %d with %d buffers: want 0 or more: %w", h, buffers, device.ErrInvalidValue)
	}
	e, done, err := cs.client(h, "allocate")
	if err != nil {
		return 0, err
	}
	defer done()
	r, err := e.c.Allocate(context.Background(), buffersOption(buffers)...)
	if err != nil {
		return 0, fmt.Errorf("vram: %w", err)
	}
	rh, _ := cs.addResponse(e, r)
	return rh, nil
}

// response finds response rh.
func (cs *Clients) response(rh int64) (*responseEntry, error) {
	cs.mu.Lock()
	re := cs.resps[rh]
	cs.mu.Unlock()
	if re == nil {
		return nil, fmt.Errorf("vram: response %d: never given, released, or its manager closed: %w", rh, ErrNoManager)
	}
	return re, nil
}

// ReleaseResponse forgets response rh and lets its pinned memory go.
func (cs *Clients) ReleaseResponse(rh int64) error {
	cs.mu.Lock()
	re := cs.resps[rh]
	if re != nil {
		delete(cs.resps, rh)
		cs.dropIDLocked(re)
	}
	cs.mu.Unlock()
	if re == nil {
		return fmt.Errorf("vram: release response %d: never given, released, or its manager closed: %w", rh, ErrNoManager)
	}
	re.unpin()
	return nil
}

// PlanInfo is a response's plan (vram.h's struct vram_plan).
type PlanInfo struct {
	Client    int64
	Plan      vram.ChunkPlan
	Arrays    int   // the client's arrays in buffer 0
	ID        int64 // the response's id (the same under each of its handles)
	Sets      int   // the buffer sets it holds
	FreeError bool  // freeing the arrays it replaced failed
}

// Plan returns response rh's plan.
func (cs *Clients) Plan(rh int64) (PlanInfo, error) {
	re, err := cs.response(rh)
	if err != nil {
		return PlanInfo{}, err
	}
	return PlanInfo{Client: int64(re.r.Client.ID()), Plan: re.r.Plan, Arrays: len(re.labels(0)), ID: re.id,
		Sets: len(re.r.Buffers), FreeError: re.r.FreeErr != nil}, nil
}

// labels are the labels of buffer b's arrays, sorted.
func (re *responseEntry) labels(b int) []string {
	if b < 0 || b >= len(re.r.Buffers) {
		return nil
	}
	set := re.r.Buffers[b]
	ls := slices.Collect(maps.Keys(set.Device))
	for l := range set.Host {
		if set.Device[l] == nil {
			ls = append(ls, l)
		}
	}
	slices.Sort(ls)
	return ls
}

// ArrayInfo describes one array of a response (vram.h's struct vram_array,
// and the JSON of vram_response_json).
type ArrayInfo struct {
	Label     string          `json:"-"`
	LabelC    uintptr         `json:"-"` // Label as a NUL-terminated string, pinned while the response is held
	DType     vram.DType      `json:"dtype"`
	Memory    vram.MemoryType `json:"memory"`
	Shape     []int           `json:"shape"`
	Strides   []int           `json:"strides"`
	ChunkAxis int             `json:"chunk_axis"`
	DevicePtr uint64          `json:"device_ptr"` // 0 for host memory, and once freed
	Host      uintptr         `json:"host"`       // 0 for device memory, and once freed
	Bytes     uint64          `json:"bytes"`
	Freed     bool            `json:"freed"`
}

// Array describes response rh's array under label in buffer b.
func (cs *Clients) Array(rh int64, label string, b int) (ArrayInfo, error) {
	re, err := cs.response(rh)
	if err != nil {
		return ArrayInfo{}, err
	}
	a, err := re.array(label, b)
	if err != nil {
		return ArrayInfo{}, err
	}
	a.LabelC = re.labelAddress(a.Label)
	return a, nil
}

// Arrays describes every array of response rh's buffer b, by label, into
// out (reused when it has room).
func (cs *Clients) Arrays(rh int64, b int, out []ArrayInfo) ([]ArrayInfo, error) {
	re, err := cs.response(rh)
	if err != nil {
		return nil, err
	}
	if b < 0 || b >= len(re.r.Buffers) {
		return nil, fmt.Errorf("vram: buffer %d of a response with %d: %w", b, len(re.r.Buffers), device.ErrInvalidValue)
	}
	out = out[:0]
	for _, l := range re.labels(b) {
		a, err := re.array(l, b)
		if err != nil {
			return nil, err
		}
		a.LabelC = re.labelAddress(l)
		out = append(out, a)
	}
	return out, nil
}

// labelAddress is the address of label as a NUL-terminated string that
// stays (pinned) while the response is held.
func (re *responseEntry) labelAddress(label string) uintptr {
	re.pinMu.Lock()
	defer re.pinMu.Unlock()
	if b, ok := re.cLabels[label]; ok {
		return uintptr(unsafe.Pointer(&b[0]))
	}
	if re.cLabels == nil {
		re.cLabels = map[string][]byte{}
	}
	b := append([]byte(label), 0)
	re.cLabels[label] = b
	return pinBytes(&re.pins, b) // once per label: each Pin is kept until Unpin
}

func (re *responseEntry) array(label string, b int) (ArrayInfo, error) {
	if b < 0 || b >= len(re.r.Buffers) {
		return ArrayInfo{}, fmt.Errorf("vram: buffer %d of a response with %d: %w", b, len(re.r.Buffers), device.ErrInvalidValue)
	}
	d, h := re.r.Buffers[b].Device[label], re.r.Buffers[b].Host[label]
	axis, ok := re.axes[label]
	if !ok {
		axis = -1
	}
	switch {
	case d != nil:
		info := ArrayInfo{Label: label, DType: d.DType(), Memory: d.Memory(), Shape: d.Shape(), Strides: d.Strides(), ChunkAxis: axis,
			DevicePtr: uint64(d.Ptr()), Bytes: d.Bytes(), Freed: d.Freed()}
		if h != nil { // mapped: its host side too
			info.Host = hostAddress(h)
		}
		return info, nil
	case h != nil:
		return ArrayInfo{Label: label, DType: h.DType(), Memory: h.Memory(), Shape: h.Shape(), Strides: h.Strides(), ChunkAxis: axis,
			Host: hostAddress(h), Bytes: h.Bytes(), Freed: h.Freed()}, nil
	}
	return ArrayInfo{}, fmt.Errorf("vram: no array %q in buffer %d of the response for %v (it has %q): %w",
		label, b, re.r.Client, re.labels(b), device.ErrInvalidValue)
}

// hostAddress is the address of h's bytes (pinned by addResponse), 0 once
// freed.
func hostAddress(h *vram.HostArray) uintptr {
	if b := h.Data(); len(b) > 0 {
		return uintptr(unsafe.Pointer(&b[0]))
	}
	return 0
}

// responseJSON is vram_response_json's object.
type responseJSON struct {
	Client    int64                  `json:"client"`
	Plan      vram.ChunkPlan         `json:"plan"`
	FreeError string                 `json:"free_error,omitempty"`
	Buffers   []map[string]ArrayInfo `json:"buffers"`
}

// JSON is response rh as one JSON object.
func (cs *Clients) JSON(rh int64) (string, error) {
	re, err := cs.response(rh)
	if err != nil {
		return "", err
	}
	out := responseJSON{Client: int64(re.r.Client.ID()), Plan: re.r.Plan}
	if re.r.FreeErr != nil {
		out.FreeError = re.r.FreeErr.Error()
	}
	for b := range re.r.Buffers {
		set := map[string]ArrayInfo{}
		for _, l := range re.labels(b) {
			if set[l], err = re.array(l, b); err != nil {
				return "", err
			}
		}
		out.Buffers = append(out.Buffers, set)
	}
	js, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("vram: response %d as JSON: %w", rh, err)
	}
	return string(js), nil
}

// Span is chunk i of response rh's plan along axis.
func (cs *Clients) Span(rh int64, i, axis int) (vram.Span, error) {
	re, err := cs.response(rh)
	if err != nil {
		return vram.Span{}, err
	}
	sp, err := re.r.Span(i, axis)
	if err != nil {
		return vram.Span{}, fmt.Errorf("vram: span of response %d: %w", rh, err)
	}
	return sp, nil
}

// Member is the response the allocation of rh gave client ch, as a new
// response.
func (cs *Clients) Member(rh, ch int64) (int64, error) {
	re, err := cs.response(rh)
	if err != nil {
		return 0, err
	}
	cs.mu.Lock()
	ce := cs.clients[ch]
	cs.mu.Unlock()
	if ce == nil {
		return 0, fmt.Errorf("vram: member response: client %d: never registered, or closed: %w", ch, ErrNoManager)
	}
	mr := re.r.Member(ce.c)
	if mr == nil {
		return 0, fmt.Errorf("vram: the allocation of response %d gave %v no response (not a member of the group, or closed meanwhile): %w",
			rh, ce.c, device.ErrInvalidValue)
	}
	h, _ := cs.addResponse(ce, mr)
	return h, nil
}

// deviceArray is response rh's device array under label in buffer b.
func (cs *Clients) deviceArray(rh int64, label string, b int) (*responseEntry, *vram.DeviceArray, error) {
	re, err := cs.response(rh)
	if err != nil {
		return nil, nil, err
	}
	if b >= 0 && b < len(re.r.Buffers) {
		if d := re.r.Buffers[b].Device[label]; d != nil {
			return re, d, nil
		}
		if h := re.r.Buffers[b].Host[label]; h != nil {
			return nil, nil, fmt.Errorf("vram: %q of response %d is host memory (%v), not a device array: %w",
				label, rh, h.Memory(), device.ErrInvalidValue)
		}
	}
	_, err = re.array(label, b) // says what is wrong
	return nil, nil, err
}

// SimHost is the host address of the simulated device memory of response
// rh's device array under label in buffer b; its Go memory is pinned while
// the response is held.
func (cs *Clients) SimHost(rh int64, label string, b int) (uintptr, error) {
	re, bs, err := cs.simBytes(rh, label, b)
	if err != nil {
		return 0, err
	}
	re.pinMu.Lock()
	defer re.pinMu.Unlock()
	return pinBytes(&re.pins, bs), nil
}

// simBytes is SimHost's bytes.
func (cs *Clients) simBytes(rh int64, label string, b int) (*responseEntry, []byte, error) {
	re, d, err := cs.deviceArray(rh, label, b)
	if err != nil {
		return nil, nil, err
	}
	hv, ok := re.m.dev.(hostViewer)
	if !ok {
		return nil, nil, fmt.Errorf("vram: host address of %v: the memory of a %s device has no host address; copy with vram_to_device and vram_from_device: %w",
			d, re.m.dev.Info().Backend, device.ErrNotSupported)
	}
	if d.Freed() {
		return nil, nil, fmt.Errorf("vram: host address of %v: %w", d, vram.ErrFreed)
	}
	done, err := re.m.use("host address")
	if err != nil {
		return nil, nil, err
	}
	defer done()
	bs, err := hv.HostBytes(d.Ptr(), d.Bytes())
	if err != nil {
		return nil, nil, fmt.Errorf("vram: host address of %v: %w", d, err)
	}
	return re, bs, nil
}

// HostDesc is host memory C gives a copy: C-contiguous elements.
type HostDesc struct {
	Data  unsafe.Pointer
	Shape []int
	DType vram.DType
}

// wrap is d as a host array (vram.WrapHost), checked.
func (d HostDesc) wrap() (*vram.HostArray, error) {
	r := vram.ArrayRequest{Shape: d.Shape, DType: d.DType, Memory: vram.Pageable}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("the host array: %w", err)
	}
	if d.Data == nil {
		return nil, fmt.Errorf("the host array %v%v has no data (NULL): %w", d.DType, d.Shape, device.ErrInvalidValue)
	}
	return vram.WrapHost(unsafe.Slice((*byte)(d.Data), r.Bytes()), d.Shape, d.DType)
}

// Copy copies between C's host memory hd and response rh's device array
// under label in buffer b, on client ch's stream: into the device when
// toDevice, whole when sp is nil, else the runs sp.
func (cs *Clients) Copy(toDevice bool, ch, rh int64, label string, b int, hd HostDesc, sp *vram.Span) error {
	op := map[bool]string{true: "to device", false: "from device"}[toDevice]
	e, done, err := cs.client(ch, op)
	if err != nil {
		return err
	}
	defer done()
	_, d, err := cs.deviceArray(rh, label, b)
	if err != nil {
		return err
	}
	h, err := hd.wrap()
	if err != nil {
		return fmt.Errorf("vram: %s %q for %v: %w", op, label, e.c, err)
	}
	ctx := context.Background()
	switch {
	case toDevice && sp == nil:
		err = e.c.ToDevice(ctx, d, h)
	case toDevice:
		err = e.c.ToDeviceChunk(ctx, d, h, *sp)
	case sp == nil:
		err = e.c.FromDevice(ctx, h, d)
	default:
		err = e.c.FromDeviceChunk(ctx, h, d, *sp)
	}
	if err != nil {
		return fmt.Errorf("vram: %s %q for %v: %w", op, label, e.c, err)
	}
	return nil
}
