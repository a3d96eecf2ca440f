package capi

// The manager's client API as the C library serves it (vram.h, ABI 2):
// clients, the responses of their allocations, work marks and host arrays,
// each named by a handle, and each manager's queue of hook events. It uses
// the vram package's exported API only, and reaches a manager's
// vram.Manager through Manager.Manager alone.
//
// Hooks never call into C. A client's OnAllocated and OnInvalidate, which
// the vram manager calls on whichever goroutine caused the event, append
// an Event to the manager's queue and return; the program takes the events
// with Poll on a thread of its own. So a Python hook runs on a Python
// thread with no Go frame below it, and a C hook on the thread that polls.
//
// Handles. A client's handle is its vram id (never reused in the process);
// responses, work marks and host arrays share one counter. Go memory whose
// address is handed to C (a host array's bytes; the simulator's bytes of a
// device array) is pinned (runtime.Pinner) while the handle that gave it
// is held, so that C may keep the address: the collector neither moves nor
// frees it until the handle is released or the manager closed.
//
// Locking: Clients.mu protects the maps and the queues, and is taken after
// a Manager's useMu; nothing holding it calls the vram manager (whose hooks
// take it). A response's pinMu serializes its pinner.

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"sync"
	"unsafe"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// Hooks are the events a client asks Poll to report (vram.h's enum
// vram_hook).
type Hooks uint32

// The hooks.
const (
	HookAllocated Hooks = 1 << iota
	HookInvalidate
)

// EventKind is vram.h's enum vram_event_kind.
type EventKind int32

// The event kinds.
const (
	EventNone EventKind = iota
	EventAllocated
	EventInvalidated
)

// Event is one hook's event, queued on its client's manager.
type Event struct {
	Kind     EventKind
	Client   int64  // the client's handle
	Response int64  // EventAllocated: a response handle the taker releases
	Evicted  bool   // EventInvalidated: an eviction for another group
	Reason   string // EventInvalidated: why
	Pending  int    // set by Poll: the events still queued after this one
	ID       int64  // EventAllocated: the response's id
}

// ClientOptions describe a client to Register (vram.h's struct
// vram_client_options).
type ClientOptions struct {
	Name       string
	Group      string
	Proportion float64 // 0 < p ≤ 1; 0: the auto pool
	NoEvict    bool
	Hooks      Hooks
}

// Clients holds the process's clients, responses, work marks and host
// arrays by handle, and each manager's event queue. Safe for concurrent
// use; the zero value is ready.
type Clients struct {
	mu      sync.Mutex // protects the fields below
	last    int64      // the last handle given to a response, work mark or host array
	clients map[int64]*clientEntry
	resps   map[int64]*responseEntry
	ids     map[*vram.ArrayResponse]*identity // the id of each response some handle holds
	works   map[int64]*workEntry
	hosts   map[int64]*hostEntry
	batches map[int64]*batchEntry
	events  map[*Manager][]Event
}

// clientEntry is a registered client.
type clientEntry struct {
	m      *Manager
	c      *vram.Client                 // set once Register has it, under Clients.mu
	queued map[string]vram.ArrayRequest // protected by Clients.mu: as last queued here
}

// workEntry is an open work mark.
type workEntry struct {
	m *Manager
	w *vram.Work
}

// hostEntry is a host array made for C.
type hostEntry struct {
	m    *Manager
	h    *vram.HostArray
	pins runtime.Pinner // its bytes; protected by Clients.mu until taken out of hosts
}

// initLocked makes the maps. cs.mu must be held.
func (cs *Clients) initLocked() {
	if cs.clients == nil {
		cs.clients, cs.resps = map[int64]*clientEntry{}, map[int64]*responseEntry{}
		cs.ids = map[*vram.ArrayResponse]*identity{}
		cs.works, cs.hosts = map[int64]*workEntry{}, map[int64]*hostEntry{}
		cs.batches = map[int64]*batchEntry{}
		cs.events = map[*Manager][]Event{}
	}
}

// nextLocked is a new handle. cs.mu must be held.
func (cs *Clients) nextLocked() int64 {
	cs.last++
	return cs.last
}

// Register registers a client of m; its handle is its id.
func (cs *Clients) Register(m *Manager, o ClientOptions) (int64, error) {
	done, err := m.use("register")
	if err != nil {
		return 0, err
	}
	defer done()
	e := &clientEntry{m: m}
	vo := vram.ClientOptions{Name: o.Name, Group: o.Group, Proportion: o.Proportion, NoEvict: o.NoEvict}
	if o.Hooks&HookAllocated != 0 {
		vo.OnAllocated = func(r *vram.ArrayResponse) { cs.allocated(e, r) }
	}
	if o.Hooks&HookInvalidate != 0 {
		vo.OnInvalidate = func(reason error) { cs.invalidated(e, reason) }
	}
	c, err := m.Manager().Register(vo)
	if err != nil {
		return 0, fmt.Errorf("vram: register client %q in group %q: %w", o.Name, o.Group, err)
	}
	h := int64(c.ID())
	cs.mu.Lock()
	cs.initLocked()
	e.c = c
	cs.clients[h] = e
	cs.mu.Unlock()
	return h, nil
}

// client finds client h and marks a call on its manager in progress;
// call done when the call is over.
func (cs *Clients) client(h int64, op string) (e *clientEntry, done func(), err error) {
	cs.mu.Lock()
	e = cs.clients[h]
	cs.mu.Unlock()
	if e == nil {
		return nil, nil, fmt.Errorf("vram: %s: client %d: never registered, or closed: %w", op, h, ErrNoManager)
	}
	if done, err = e.m.use(op); err != nil {
		return nil, nil, err
	}
	return e, done, nil
}

// allocated queues the event of r, delivered to e's client.
func (cs *Clients) allocated(e *clientEntry, r *vram.ArrayResponse) {
	h := int64(r.Client.ID())
	rh, id := cs.addResponse(e, r)
	cs.post(e.m, Event{Kind: EventAllocated, Client: h, Response: rh, ID: id})
}

// invalidated queues the invalidation of e's client's arrays. One that
// comes while Register is still making the client concerns no arrays.
func (cs *Clients) invalidated(e *clientEntry, reason error) {
	cs.mu.Lock()
	c := e.c
	cs.mu.Unlock()
	if c == nil {
		return
	}
	cs.post(e.m, Event{Kind: EventInvalidated, Client: int64(c.ID()), Evicted: errors.Is(reason, vram.ErrEvicted), Reason: clip(reason.Error(), 2000)})
}

// post appends ev to m's queue, unless its client has been closed (then
// its response, if any, is released).
func (cs *Clients) post(m *Manager, ev Event) {
	cs.mu.Lock()
	if _, open := cs.clients[ev.Client]; open {
		cs.events[m] = append(cs.events[m], ev)
		ev.Response = 0
	}
	cs.mu.Unlock()
	if ev.Response != 0 {
		_ = cs.ReleaseResponse(ev.Response)
	}
}

// Poll takes m's oldest event (Kind EventNone when there is none), with
// the count of those still queued behind it.
func (cs *Clients) Poll(m *Manager) Event {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	q := cs.events[m]
	if len(q) == 0 {
		return Event{}
	}
	ev := q[0]
	ev.Pending = len(q) - 1
	q[0] = Event{}
	if cs.events[m] = q[1:]; len(q) == 1 {
		delete(cs.events, m)
	}
	return ev
}

// Close closes client h and drops its queued events (releasing their
// responses). A second Close returns nil.
func (cs *Clients) Close(h int64) error {
	e, done, err := cs.client(h, "close client")
	if errors.Is(err, ErrNoManager) {
		return nil
	}
	if err != nil {
		return err
	}
	defer done()
	err = e.c.Close()
	cs.mu.Lock()
	delete(cs.clients, h)
	var drop []int64
	kept := cs.events[e.m][:0]
	for _, ev := range cs.events[e.m] {
		switch {
		case ev.Client != h:
			kept = append(kept, ev)
		case ev.Response != 0:
			drop = append(drop, ev.Response)
		}
	}
	cs.events[e.m] = kept
	cs.mu.Unlock()
	for _, r := range drop {
		_ = cs.ReleaseResponse(r)
	}
	if err != nil {
		return fmt.Errorf("vram: close client %d: %w", h, err)
	}
	return nil
}

// ClientInfo is a client's figures (vram.h's struct vram_client_info).
type ClientInfo struct {
	Manager    int64
	Proportion float64
	Cap, Held  uint64
	Stream     uintptr // its group's stream handle; 0 once closed
	Closed     bool
	Evicted    bool
	Idle       bool
	Grouped    bool
}

// Info returns client h's figures.
func (cs *Clients) Info(h int64) (ClientInfo, error) {
	e, done, err := cs.client(h, "client info")
	if err != nil {
		return ClientInfo{}, err
	}
	defer done()
	c := e.c
	info := ClientInfo{Manager: e.m.handle, Proportion: c.Proportion(), Cap: c.Cap(), Held: c.Held(),
		Closed: c.Closed(), Evicted: c.Evicted(), Grouped: c.IsGrouped()}
	if s, err := c.Stream(); err == nil {
		info.Stream = s.Handle()
	}
	if idle, err := c.Idle(); err == nil {
		info.Idle = idle
	}
	return info, nil
}

// Group is the name of client h's stream group.
func (cs *Clients) Group(h int64) (string, error) {
	e, done, err := cs.client(h, "client group")
	if err != nil {
		return "", err
	}
	defer done()
	return e.c.Group(), nil
}

// Do runs f on client h's vram client, as the call op (the setters,
// ChangeStreamGroup, Free, Sync). The vram package's errors name the call
// and the client already: they are only marked as vram's.
func (cs *Clients) Do(h int64, op string, f func(*vram.Client) error) error {
	e, done, err := cs.client(h, op)
	if err != nil {
		return err
	}
	defer done()
	if err := f(e.c); err != nil {
		return fmt.Errorf("vram: %w", err)
	}
	return nil
}

// Queue queues reqs for client h, replacing what it had queued.
func (cs *Clients) Queue(h int64, reqs map[string]vram.ArrayRequest) error {
	e, done, err := cs.client(h, "queue")
	if err != nil {
		return err
	}
	defer done()
	if err := e.c.Queue(reqs); err != nil {
		return fmt.Errorf("vram: %w", err)
	}
	cs.mu.Lock()
	e.queued = maps.Clone(reqs)
	cs.mu.Unlock()
	return nil
}

// BeginWork opens a work mark on client h.
func (cs *Clients) BeginWork(h int64) (int64, error) {
	e, done, err := cs.client(h, "begin work")
	if err != nil {
		return 0, err
	}
	defer done()
	w, err := e.c.BeginWork()
	if err != nil {
		return 0, fmt.Errorf("vram: %w", err)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	wh := cs.nextLocked()
	cs.works[wh] = &workEntry{m: e.m, w: w}
	return wh, nil
}

// EndWork ends work mark wh and forgets it.
func (cs *Clients) EndWork(wh int64) error {
	cs.mu.Lock()
	we := cs.works[wh]
	delete(cs.works, wh)
	cs.mu.Unlock()
	if we == nil {
		return fmt.Errorf("vram: end work %d: no such work mark, or ended: %w", wh, device.ErrInvalidValue)
	}
	done, err := we.m.use("end work")
	if err != nil {
		return err
	}
	defer done()
	if err := we.w.End(); err != nil {
		return fmt.Errorf("vram: end work %d: %w", wh, err)
	}
	return nil
}

// HostArray makes a host array of shape and dtype in mem on m, zeroed, and
// returns its handle and the address of its bytes (pinned while it lives).
func (cs *Clients) HostArray(m *Manager, shape []int, dtype vram.DType, mem vram.MemoryType) (int64, uintptr, error) {
	done, err := m.use("host array")
	if err != nil {
		return 0, 0, err
	}
	defer done()
	h, err := m.Manager().NewHostArray(shape, dtype, mem, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("vram: host array %v%v %v: %w", dtype, shape, mem, err)
	}
	he := &hostEntry{m: m, h: h}
	addr := pinBytes(&he.pins, h.Data())
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.initLocked()
	hh := cs.nextLocked()
	cs.hosts[hh] = he
	return hh, addr, nil
}

// HostFree frees host array hh and forgets it.
func (cs *Clients) HostFree(hh int64) error {
	cs.mu.Lock()
	he := cs.hosts[hh]
	delete(cs.hosts, hh)
	cs.mu.Unlock()
	if he == nil {
		return fmt.Errorf("vram: free host array %d: no such host array, or freed: %w", hh, device.ErrInvalidValue)
	}
	defer he.pins.Unpin()
	done, err := he.m.use("free host array")
	if err != nil {
		return err
	}
	defer done()
	if err := he.h.Free(); err != nil {
		return fmt.Errorf("vram: free host array %d: %w", hh, err)
	}
	return nil
}

// pinBytes pins the Go memory of b (a no-op for memory outside Go) and
// returns its address, 0 for no bytes.
func pinBytes(p *runtime.Pinner, b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	p.Pin(&b[0])
	return uintptr(unsafe.Pointer(&b[0]))
}

// CloseManager closes manager h as Registry.Close does, first closing what
// the client API holds on it: its host arrays (freed), its responses and
// work marks (forgotten) and its event queue; its clients close with the
// vram manager. A manager with live allocations of the allocator API is
// refused as Registry.Close refuses it, with nothing closed.
func (cs *Clients) CloseManager(r *Registry, h int64) error {
	m, err := r.Get(h)
	if err != nil || m.liveCount() > 0 {
		return r.Close(h)
	}
	errs := []error{cs.endBatches(m)} // their arrays freed before the clients close
	hosts, resps := cs.forget(m)
	if done, err := m.use("close"); err == nil {
		for _, he := range hosts {
			errs = append(errs, he.h.Free())
			he.pins.Unpin()
		}
		done()
	}
	for _, re := range resps {
		re.unpin()
	}
	errs = append(errs, r.Close(h))
	return errors.Join(errs...)
}

// forget takes everything of m out of the maps and returns the host arrays
// and responses to release.
func (cs *Clients) forget(m *Manager) ([]*hostEntry, []*responseEntry) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var hosts []*hostEntry
	var resps []*responseEntry
	for k, he := range cs.hosts {
		if he.m == m {
			hosts = append(hosts, he)
			delete(cs.hosts, k)
		}
	}
	for k, re := range cs.resps {
		if re.m == m {
			resps = append(resps, re)
			delete(cs.resps, k)
			cs.dropIDLocked(re)
		}
	}
	for k, we := range cs.works {
		if we.m == m {
			delete(cs.works, k)
		}
	}
	for k, ce := range cs.clients {
		if ce.m == m {
			delete(cs.clients, k)
		}
	}
	delete(cs.events, m)
	return hosts, resps
}

// liveCount is the number of m's allocations of the allocator API.
func (m *Manager) liveCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}
