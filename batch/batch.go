package batch

// A batch's arrays: each declared once (client, label, request, host
// side), queued and allocated together, and reached through its *Array
// from then on: by the pipeline, the compute step and the caller.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vramkit/vram"
)

// Batch is one batch of runs: its arrays, declared once each with In, Out
// and Scratch on clients of one stream group, then allocated (Allocate)
// and run chunk by chunk (Run). A Batch is used by one goroutine at a
// time; Close frees what it allocated and made.
type Batch struct {
	arrays []*Array
	owned  []*vram.Client // the clients Register registered: Close closes them
	err    error          // the first bad declaration, returned by Allocate
	m      *vram.Manager
	plan   vram.ChunkPlan
	runs   int  // the batch's runs: its requests' (at least 1)
	ok     bool // allocated: the arrays have their device arrays
}

// New returns an empty batch; declare its arrays with In, Out and
// Scratch.
func New() *Batch { return &Batch{} }

// Register registers a client of m with options o for the batch and
// returns it, for In, Out and Scratch: the batch closes it on Close.
// Options with no Group join "default", as Manager.Register's do, so the
// clients a batch registers share one group unless told otherwise. A
// refused registration returns nil and is Allocate's error, as a bad
// declaration is.
func (b *Batch) Register(m *vram.Manager, o vram.ClientOptions) *vram.Client {
	if b.err != nil {
		return nil
	}
	if m == nil {
		b.fail(batchErr("register %q: a nil manager; pass the one the batch runs on", o.Name))
		return nil
	}
	c, err := m.Register(o)
	if err != nil {
		b.fail(err) // the manager's, which names the client and the figures
		return nil
	}
	b.owned = append(b.owned, c)
	return c
}

// direction is what the pipeline does with an array.
type direction uint8

const (
	dirIn      direction = iota // copied in before each chunk's compute
	dirOut                      // copied out after it
	dirScratch                  // neither: the compute step's own
	dirInOut                    // both: a run resolves it as an input and an output of one device array
)

func (d direction) String() string {
	return [...]string{"input", "output", "scratch array", "input and output"}[d]
}

// Array is one array of a batch, as its declaration returned it: the
// handle the caller and the compute step name it by (Chunk.Array,
// Chunk.Launch).
type Array struct {
	b      *Batch
	client *vram.Client
	label  string
	req    vram.ArrayRequest
	dir    direction
	side   Side
	made   bool // side.host was made by MakeHosts: the batch frees it

	resp *vram.ArrayResponse // its client's, once allocated
	dev  []*vram.DeviceArray // per buffer, once allocated
}

// Side is an array's host side: a full-length host array (Host), or a
// function that fills (Fill) or drains (Drain) a chunk-length staging
// array. The zero Side is none. A plain value.
type Side struct {
	host  *vram.HostArray
	fill  func(sp vram.Span, stage *vram.HostArray) error
	drain func(sp vram.Span, stage *vram.HostArray) error
}

// Host is the full-length host array h, with the request's shape and
// dtype: an input's runs are copied from it, an output's into it. A
// pinned or mapped h is copied from directly; a pageable or file-backed
// one is staged through the manager's staging pool.
func Host(h *vram.HostArray) Side { return Side{host: h} }

// Fill is an input's host side as a function: before each chunk it is
// called with the chunk's runs sp (along the array's chunk axis) and a
// pinned staging array shaped like the device array, whose first sp.Len
// runs along that axis it must fill; they are then copied in. It runs
// on Run's goroutine.
func Fill(f func(sp vram.Span, stage *vram.HostArray) error) Side { return Side{fill: f} }

// Drain is an output's host side as a function: once chunk sp's outputs
// are back on the host, it is called with a pinned staging array shaped
// like the device array whose first sp.Len runs along the chunk axis
// hold them. The staging array is reused after it returns.
func Drain(f func(sp vram.Span, stage *vram.HostArray) error) Side { return Side{drain: f} }

func (s Side) none() bool { return s.host == nil && s.fill == nil && s.drain == nil }

// In declares an input: client c's array label of request req, copied in
// before each chunk's compute (its runs along the request's chunk axis;
// an unchunkable one once, before the first chunk), from side when given
// (Host or Fill), else from the host array MakeHosts makes or Use gives.
// A bad declaration is returned by Allocate; a chunk axis past the shape
// is one, unless the request is Unchunkable (the manager alone would take
// it as unchunkable, cubie's rule, and plan the array whole).
func (b *Batch) In(c *vram.Client, label string, req vram.ArrayRequest, side ...Side) *Array {
	return b.declare(c, label, req, dirIn, side)
}

// Out declares an output, the reverse of In: copied out after each
// chunk's compute (an unchunkable one once, after the last chunk), into
// side when given (Host or Drain).
func (b *Batch) Out(c *vram.Client, label string, req vram.ArrayRequest, side ...Side) *Array {
	return b.declare(c, label, req, dirOut, side)
}

// InOut declares an array that is both: copied in before each chunk's
// compute and out after it, at the same runs of the same host array (an
// unchunkable one in once, before the first chunk, and out once, after
// the last), from and into side when given (Host only: a function fills
// or drains, not both).
func (b *Batch) InOut(c *vram.Client, label string, req vram.ArrayRequest, side ...Side) *Array {
	return b.declare(c, label, req, dirInOut, side)
}

// Scratch declares an array of the compute step's own, neither copied in
// nor out.
func (b *Batch) Scratch(c *vram.Client, label string, req vram.ArrayRequest) *Array {
	return b.declare(c, label, req, dirScratch, nil)
}

func (b *Batch) declare(c *vram.Client, label string, req vram.ArrayRequest, dir direction, side []Side) *Array {
	a := &Array{b: b, client: c, label: label, req: req, dir: dir}
	b.arrays = append(b.arrays, a)
	switch {
	case len(side) > 1:
		b.fail(batchErr("%v %q: %d host sides; give one", dir, label, len(side)))
	case len(side) == 1:
		b.fail(a.Use(side[0]))
	}
	if b.err != nil {
		return a
	}
	switch {
	case c == nil:
		b.fail(batchErr("%v %q: a nil client; pass the client that holds it", dir, label))
	case label == "":
		b.fail(batchErr("%v of %v: an empty label; name it", dir, c))
	case len(req.Shape) > 0 && !req.Unchunkable && req.ChunkAxis >= len(req.Shape):
		b.fail(batchErr("%v %q of %v: set ChunkAxis to its run axis, 0 to %d, or Unchunkable: chunk axis %d is past shape %v",
			dir, label, c, len(req.Shape)-1, req.ChunkAxis, req.Shape))
	case b.m != nil && c.Manager() != b.m:
		b.fail(batchErr("%v %q of %v: another manager's client; a batch is of one device (RunParts runs one per device)", dir, label, c))
	default:
		b.m = c.Manager()
		for _, o := range b.arrays[:len(b.arrays)-1] {
			if o.client == c && o.label == label {
				b.fail(batchErr("%v %q of %v declared twice", dir, label, c))
			}
		}
	}
	return a
}

func (b *Batch) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

// Use gives a its host side, in place of any it has (a host array
// MakeHosts made is freed): Host or Fill for an input, Host or Drain for
// an output, none for a scratch array. Call it before Run.
func (a *Array) Use(s Side) error {
	switch {
	case a.dir == dirScratch && !s.none():
		return batchErr("scratch array %q: a host side; declare it with In or Out", a.label)
	case a.dir == dirIn && s.drain != nil:
		return batchErr("input %q: a Drain; give an input Host or Fill", a.label)
	case a.dir == dirOut && s.fill != nil:
		return batchErr("output %q: a Fill; give an output Host or Drain", a.label)
	case a.dir == dirInOut && (s.fill != nil || s.drain != nil):
		return batchErr("input and output %q: a function; give it a Host, which it is copied from and into", a.label)
	}
	var err error
	if a.made {
		err = a.side.host.Free()
		a.made = false
	}
	a.side = s
	return err
}

// Label is the array's label.
func (a *Array) Label() string { return a.label }

// Client is the client that holds the array.
func (a *Array) Client() *vram.Client { return a.client }

// Request is the array's request, as declared (its full length).
func (a *Array) Request() vram.ArrayRequest { return a.req }

// Host is the array's full-length host array: the one given (Host), or
// the one MakeHosts made; nil for a function or a scratch array.
func (a *Array) Host() *vram.HostArray { return a.side.host }

// Device is the array's device array in buffer buf (0 … the buffers
// allocated − 1; an unchunkable array is the same in every buffer), nil
// before Allocate.
func (a *Array) Device(buf int) *vram.DeviceArray {
	if buf < 0 || buf >= len(a.dev) {
		return nil
	}
	return a.dev[buf]
}

// String names the array for messages: "label of client".
func (a *Array) String() string { return fmt.Sprintf("%q of %v", a.label, a.client) }

// Allocate queues every array of the batch with its client (each
// client's declared arrays replace what it had queued, as Client.Queue
// does) and allocates them together with one Allocate of the group,
// planned and chunked by the manager; opts are Allocate's
// (vram.WithBuffers for buffers in flight). On failure the clients'
// queues are as they were. Allocating again allocates afresh (a new
// plan, new device arrays).
func (b *Batch) Allocate(ctx context.Context, opts ...vram.AllocateOption) error {
	if b.err != nil {
		return b.err
	}
	if len(b.arrays) == 0 {
		return batchErr("no arrays; declare them with In, Out and Scratch")
	}
	clients, reqs := b.byClient()
	group := clients[0].Group()
	for _, c := range clients {
		if g := c.Group(); g != group || g == "" {
			return batchErr("%v is in group %q and %v in %q (\"\" once closed); a batch's clients share one group", c, g, clients[0], group)
		}
	}
	resp, err := allocateQueued(ctx, clients, reqs, opts...)
	if err != nil {
		return err
	}
	return b.install(resp)
}

// allocateQueued queues each client's requests (replacing what it had
// queued) and allocates their group with one Allocate of the first; on
// failure it puts every client's queue back as it was.
func allocateQueued(ctx context.Context, clients []*vram.Client, reqs []map[string]vram.ArrayRequest, opts ...vram.AllocateOption) (*vram.ArrayResponse, error) {
	prev := make([]map[string]vram.ArrayRequest, len(clients))
	restore := func(err error) error {
		for i, c := range clients {
			err = errors.Join(err, c.Queue(prev[i]))
		}
		return err
	}
	for i, c := range clients {
		prev[i] = c.Queued()
		if err := c.Queue(reqs[i]); err != nil {
			return nil, restore(fmt.Errorf("batch: queue the arrays of %v: %w", c, err))
		}
	}
	resp, err := clients[0].Allocate(ctx, opts...)
	if err != nil {
		return nil, restore(err) // the manager's, which names every figure
	}
	return resp, nil
}

// byClient groups the arrays' requests by client, in the order the
// clients first appear.
func (b *Batch) byClient() ([]*vram.Client, []map[string]vram.ArrayRequest) {
	var clients []*vram.Client
	var reqs []map[string]vram.ArrayRequest
	for _, a := range b.arrays {
		i := slices.Index(clients, a.client)
		if i < 0 {
			clients, reqs = append(clients, a.client), append(reqs, map[string]vram.ArrayRequest{})
			i = len(clients) - 1
		}
		reqs[i][a.label] = a.req
	}
	return clients, reqs
}

// install takes each array's device arrays from its client's response.
func (b *Batch) install(resp *vram.ArrayResponse) error {
	b.plan, b.runs, b.ok = resp.Plan, 1, false
	for _, a := range b.arrays {
		b.runs = max(b.runs, a.req.Runs())
	}
	for _, a := range b.arrays {
		a.resp, a.dev = resp.Member(a.client), nil
		if a.resp == nil {
			return fmt.Errorf("batch: array %v: the allocation delivered its client nothing (closed or moved meanwhile?): %w", a, vram.ErrClosed)
		}
		for buf := range max(len(a.resp.Buffers), 1) {
			set := a.resp.Arrays()
			if buf < len(a.resp.Buffers) {
				set = a.resp.Buffers[buf].Device
			}
			d := set[a.label]
			if d == nil {
				return batchErr("array %v: its response has no device array %q (a %v request is not on the device; ask for device memory)", a, a.label, a.req.Memory)
			}
			a.dev = append(a.dev, d)
		}
	}
	b.ok = true
	return nil
}

// Plan is the plan the batch was allocated with (the zero plan before
// Allocate); after a run re-cut its chunks, the plan of that re-cut's
// allocation, which covers its chunkable arrays alone.
func (b *Batch) Plan() vram.ChunkPlan { return b.plan }

// stride is the device arrays' length along their chunk axes: the plan's
// chunk length, or every run when nothing was chunked.
func (b *Batch) stride() int {
	if b.plan.TotalRuns > 0 {
		return max(b.plan.ChunkLength, 1)
	}
	return max(b.runs, 1)
}

// buffers is the buffers the arrays were allocated with.
func (b *Batch) buffers() int {
	n := 1
	for _, a := range b.arrays {
		if a.req.Chunkable() {
			n = max(n, len(a.dev))
		}
	}
	return n
}

// chunkedRequests is the batch's chunkable requests by client: what a
// re-cut allocates again (its unchunkable arrays stay where they are).
func (b *Batch) chunkedRequests() map[*vram.Client]map[string]vram.ArrayRequest {
	out := map[*vram.Client]map[string]vram.ArrayRequest{}
	for _, a := range b.arrays {
		if !a.req.Chunkable() {
			continue
		}
		if out[a.client] == nil {
			out[a.client] = map[string]vram.ArrayRequest{}
		}
		out[a.client][a.label] = a.req
	}
	return out
}

// reallocate allocates the batch's chunkable arrays again with k buffers,
// planned as Allocate plans them now (the arrays they replace counted
// free, and freed first where the new ones need their memory); its
// unchunkable arrays, and what they hold, stay. On failure the clients'
// queues are as they were.
func (b *Batch) reallocate(ctx context.Context, k int) error {
	byClient := b.chunkedRequests()
	clients := slices.SortedFunc(maps.Keys(byClient), func(x, y *vram.Client) int { return cmp.Compare(x.ID(), y.ID()) })
	reqs := make([]map[string]vram.ArrayRequest, len(clients))
	for i, c := range clients {
		reqs[i] = byClient[c]
	}
	resp, err := allocateQueued(ctx, clients, reqs, vram.WithBuffers(k))
	if err != nil {
		return err
	}
	b.plan = resp.Plan
	nb := max(len(resp.Buffers), 1)
	for _, a := range b.arrays {
		if !a.req.Chunkable() {
			d := a.dev[0]
			a.dev = a.dev[:0]
			for range nb {
				a.dev = append(a.dev, d)
			}
			continue
		}
		m := resp.Member(a.client)
		if m == nil {
			return fmt.Errorf("batch: array %v: the re-allocation delivered its client nothing (closed or moved meanwhile?): %w", a, vram.ErrClosed)
		}
		a.resp, a.dev = m, nil
		for buf := range nb {
			d := m.Buffers[min(buf, len(m.Buffers)-1)].Device[a.label]
			if d == nil {
				return batchErr("array %v: its re-allocation has no device array %q", a, a.label)
			}
			a.dev = append(a.dev, d)
		}
	}
	return nil
}

// intact reports whether the batch's device arrays are all still there
// (a failed re-allocation that freed them first leaves them gone).
func (b *Batch) intact() bool {
	for _, a := range b.arrays {
		if len(a.dev) == 0 || a.dev[0].Freed() {
			return false
		}
	}
	return true
}

// Runs is the batch's number of runs, as its requests state it (1 when
// none is chunkable).
func (b *Batch) Runs() int { return b.runs }

// MakeHosts makes, on the manager's host ladder, a full-length host array
// for every input and output that has no host side: shaped as its
// request, named after its label, owned by the batch (Close frees it).
// Call it after Allocate, when the ladder knows what the device arrays
// left; Host then returns each. On failure it frees what it made.
func (b *Batch) MakeHosts() error {
	if b.err != nil {
		return b.err
	}
	var made []*Array
	for _, a := range b.arrays {
		if a.dir == dirScratch || !a.side.none() {
			continue
		}
		h, err := a.client.Manager().Host().Alloc(a.req.Shape, a.req.DType, vram.HostArrayOptions{Name: "vram-batch-" + a.label})
		if err != nil {
			for _, m := range made {
				err = errors.Join(err, m.Use(Side{}))
			}
			return fmt.Errorf("batch: host array for %v (%v%v): %w", a, a.req.DType, a.req.Shape, err)
		}
		a.side, a.made = Host(h), true
		made = append(made, a)
	}
	return nil
}

// Close frees the host arrays MakeHosts made and the batch's device
// arrays (those its clients still hold from its Allocate; a closed
// client's are already gone), then closes the clients Register
// registered. A second Close does nothing.
func (b *Batch) Close() error {
	var errs []error
	for _, a := range b.arrays {
		if a.made {
			errs = append(errs, a.Use(Side{}))
		}
		if a.dev != nil && !a.client.Closed() && a.client.Arrays()[a.label] == a.dev[0] {
			errs = append(errs, a.client.Free(a.label)) // still the batch's: not allocated again since
		}
		a.dev, a.resp = nil, nil
	}
	for _, c := range b.owned {
		errs = append(errs, c.Close())
	}
	b.owned, b.ok = nil, false
	return errors.Join(errs...)
}
