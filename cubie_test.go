package vram

// cubie's tests/memory tests (ccam80/cubie: test_array_requests.py,
// test_chunk_buffer_pool.py, test_stream_groups.py, test_memmgmt.py),
// ported one for one and named after them: TestCubie_<test> for a
// module-level test, TestCubie_<Class>_<test> for one of a test class
// (the "Test" of the class name dropped). Parametrized tests are
// subtests named by their pytest ids.
//
// Each passes, checking what cubie's checks with vram's names, or, where
// vram differs on purpose, checks vram's rule and then skips, naming the
// entry of the package doc's table of differences (doc.go, "From cubie")
// that says what cubie does and why vram does not; a skip whose entry is
// missing from the table fails instead.
//
// cubie's fixtures: mgr is a manager whose device has 1 GiB free of
// 8 GiB (cubieMgr: a simulated device, the rest held by a filler
// allocation, and shares counted of 8 GiB as cubie's totalmem);
// registered_instance is a client with proportion 0.5 and an invalidate
// hook; memory_client a client with the hooks of conftest's MemoryClient
// (cubieClient). cubie's requests that rely on its default run axis,
// chunk_axis_index = 2, name ChunkAxis: 2 here (see "Chunk axis").

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/meminfo"
	"github.com/vramkit/vram/streams"
)

// The table of differences, read from doc.go once.
var (
	cubieTableOnce sync.Once
	cubieTable     map[string]bool
	cubieTableErr  error
)

// cubieEntryRE matches an entry of the table: "//   - Key: …".
var cubieEntryRE = regexp.MustCompile(`^//   - ([A-Z][^:]{2,60}):`)

func cubieEntries() (map[string]bool, error) {
	cubieTableOnce.Do(func() {
		f, err := os.Open("doc.go")
		if err != nil {
			cubieTableErr = err
			return
		}
		defer f.Close()
		cubieTable = map[string]bool{}
		in := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "// Where vram differs from cubie") {
				in = true
			}
			if m := cubieEntryRE.FindStringSubmatch(line); in && m != nil {
				cubieTable[m[1]] = true
			}
		}
		cubieTableErr = sc.Err()
	})
	return cubieTable, cubieTableErr
}

// differs runs vram's side of a difference (nil: none to check), then
// skips the test naming key, its entry in the table of differences; the
// test fails if vram's side does, or if the table has no such entry.
func differs(t *testing.T, key string, vram func(t *testing.T)) {
	t.Helper()
	table, err := cubieEntries()
	if err != nil {
		t.Fatal(err)
	}
	if !table[key] {
		t.Fatalf("the package doc's table of differences has no entry %q", key)
	}
	if vram != nil {
		vram(t)
	}
	if !t.Failed() {
		t.Skipf("vram differs from cubie here on purpose: see the package doc (doc.go), From cubie, %q", key)
	}
}

// The entries the ported tests name.
const (
	dHandles     = "Handles, not objects"
	dPython      = "Python machinery"
	dCollector   = "Close, not the collector"
	dHookless    = "Clients with no OnInvalidate"
	dAxis        = "Chunk axis"
	dRuns        = "Runs"
	dDTypes      = "Element types"
	dMemory      = "Memory types"
	dHostLadder  = "Host ladder"
	dStaging     = "Staging"
	dGroups      = "Stream groups"
	dOneDoor     = "Arrays come from Allocate"
	dResponses   = "Responses"
	dNothing     = "Nothing queued"
	dNoDevice    = "No device"
	dHeld        = "Held bytes"
	dProportions = "Proportions"
	dGrowth      = "Staging growth"
	dMoveQueue   = "Moving a queue"
	dEmptyReqs   = "Empty requests"
	dPinnedArrs  = "Pinned arrays"
	dCopyShapes  = "Copy shapes"
	dLeaving     = "Leaving a group"
	dEvictWork   = "Work after eviction"
)

const cubieGiB = 1 << 30

// cubieMgr is cubie's mgr fixture: a manager whose device has free bytes
// free of total (the rest held by a filler allocation), with shares of
// total (cubie's totalmem), the Direct allocator on 512 B device pages,
// and its log. Devices over 256 MiB keep no bytes (sim.Config.AddressOnly:
// no copies).
func cubieMgr(t *testing.T, free, total uint64, opts ...Option) (*Manager, *sim.Device, *logBuf) {
	t.Helper()
	dev := newSim(t, total, func(c *sim.Config) {
		c.Granularity = 512
		c.AddressOnly = total > 256*MiB
	})
	if total > free {
		p, err := dev.Malloc(total - free)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dev.Free(p) })
	}
	m, lb := managerOn(t, dev, append([]Option{WithTotalMemory(total)}, opts...)...)
	return m, dev, lb
}

// mgr is cubieMgr with cubie's default figures: 1 GiB free of 8 GiB.
func mgr(t *testing.T, opts ...Option) (*Manager, *sim.Device, *logBuf) {
	t.Helper()
	return cubieMgr(t, cubieGiB, 8*cubieGiB, opts...)
}

// cubieClient is conftest's MemoryClient: its invalidate hook resets its
// proportion (a sentinel the tests arm), its allocation hook keeps the
// responses.
type cubieClient struct {
	mu          sync.Mutex
	proportion  string
	invalidated int
	responses   []*ArrayResponse
}

func (k *cubieClient) opts(name, group string) ClientOptions {
	return ClientOptions{
		Name: name, Group: group,
		OnInvalidate: func(error) {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.proportion = ""
			k.invalidated++
		},
		OnAllocated: func(r *ArrayResponse) {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.responses = append(k.responses, r)
		},
	}
}

func (k *cubieClient) last() *ArrayResponse {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.responses) == 0 {
		return nil
	}
	return k.responses[len(k.responses)-1]
}

func (k *cubieClient) calls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.responses)
}

// registered is cubie's registered_mgr: a client of proportion p (0: the
// auto pool) with an invalidate hook, in the default group.
func registered(t *testing.T, m *Manager, p float64) *Client {
	t.Helper()
	return register(t, m, ClientOptions{Name: "registered", Proportion: p, OnInvalidate: func(error) {}})
}

// ── test_array_requests.py ──────────────────────────────────────────

func TestCubie_array_request_accepts_valid_dtypes(t *testing.T) {
	for id, d := range map[string]DType{"float64": Float64, "float32": Float32, "int32": Int32} {
		t.Run(id, func(t *testing.T) {
			r := ArrayRequest{Shape: []int{1, 1, 1}, DType: d}
			if err := r.Validate(); err != nil || r.DType.String() != id {
				t.Errorf("%v: %v", d, err)
			}
			if p, err := ParseDType(id); err != nil || p != d {
				t.Errorf("ParseDType(%q) = %v, %v", id, p, err)
			}
		})
	}
}

func TestCubie_array_request_rejects_invalid_dtype(t *testing.T) {
	differs(t, dDTypes, func(t *testing.T) {
		// int64 is a vram dtype; what vram does not know is refused.
		if err := (ArrayRequest{Shape: []int{1}, DType: Int64}).Validate(); err != nil {
			t.Errorf("int64: %v", err)
		}
		for _, d := range []DType{0, DType(99)} {
			if err := (ArrayRequest{Shape: []int{1}, DType: d}).Validate(); !errors.Is(err, ErrInvalidRequest) {
				t.Errorf("%v: %v, want ErrInvalidRequest", d, err)
			}
		}
		if _, err := ParseDType("float16"); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("float16: %v", err)
		}
	})
}

func TestCubie_array_request_defaults(t *testing.T) {
	differs(t, dAxis, func(t *testing.T) {
		var r ArrayRequest // vram's defaults: the zero value
		if r.Memory != Device || r.ChunkAxis != 0 || r.Unchunkable || r.TotalRuns != 0 || r.Shape != nil {
			t.Errorf("zero request %+v", r)
		}
		if err := r.Validate(); !errors.Is(err, ErrInvalidRequest) { // no default shape: give one
			t.Errorf("no shape: %v", err)
		}
	})
}

func TestCubie_array_request_accepts_custom_shape(t *testing.T) {
	r := ArrayRequest{DType: Float32, Shape: []int{100, 4, 50}}
	if err := r.Validate(); err != nil || !slices.Equal(r.Shape, []int{100, 4, 50}) || r.Bytes() != 100*4*50*4 {
		t.Errorf("%+v: %v", r, err)
	}
}

func TestCubie_array_request_rejects_non_tuple_shape(t *testing.T) {
	differs(t, dPython, nil) // a shape is an []int: there is no other type to refuse
}

func TestCubie_array_request_accepts_valid_memory(t *testing.T) {
	for _, id := range []string{"device", "pinned"} {
		t.Run(id, func(t *testing.T) {
			mem, err := ParseMemoryType(id)
			if err != nil || mem.String() != id {
				t.Fatalf("ParseMemoryType(%q) = %v, %v", id, mem, err)
			}
			if err := (ArrayRequest{Shape: []int{1}, DType: Float64, Memory: mem}).Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestCubie_array_request_rejects_invalid_memory(t *testing.T) {
	t.Run("host", func(t *testing.T) {
		// cubie's "host" is pageable memory, which vram's requests take
		// (its name here is "pageable"; "host" names nothing).
		differs(t, dMemory, func(t *testing.T) {
			mem, err := ParseMemoryType("pageable")
			if err != nil || mem != Pageable {
				t.Fatalf("ParseMemoryType(pageable) = %v, %v", mem, err)
			}
			if err := (ArrayRequest{Shape: []int{1}, DType: Float64, Memory: Pageable}).Validate(); err != nil {
				t.Errorf("pageable: %v", err)
			}
		})
	})
	t.Run("mapped", func(t *testing.T) {
		differs(t, dMemory, func(t *testing.T) {
			if err := (ArrayRequest{Shape: []int{1}, DType: Float64, Memory: Mapped}).Validate(); err != nil {
				t.Errorf("mapped: %v", err)
			}
		})
	})
	t.Run("managed", func(t *testing.T) {
		if err := (ArrayRequest{Shape: []int{1}, DType: Float64, Memory: Managed}).Validate(); !errors.Is(err, ErrNotSupported) {
			t.Errorf("managed: %v", err)
		}
	})
}

func TestCubie_array_request_chunk_axis_none(t *testing.T) {
	differs(t, dAxis, func(t *testing.T) {
		r := ArrayRequest{Shape: []int{4, 4}, DType: Float64, Unchunkable: true} // chunk_axis_index=None
		if r.Chunkable() {
			t.Error("an unchunkable request is chunkable")
		}
	})
}

func TestCubie_array_request_chunk_axis_rejects_negative(t *testing.T) {
	err := (ArrayRequest{Shape: []int{1}, DType: Float64, ChunkAxis: -1}).Validate()
	if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "negative") {
		t.Errorf("%v", err)
	}
}

func TestCubie_array_request_total_runs_custom(t *testing.T) {
	r := ArrayRequest{Shape: []int{1, 1, 1}, DType: Float64, TotalRuns: 100}
	if err := r.Validate(); err != nil || r.Runs() != 100 {
		t.Errorf("%+v: runs %d, %v", r, r.Runs(), err)
	}
}

func TestCubie_array_request_total_runs_rejects_zero(t *testing.T) {
	differs(t, dRuns, func(t *testing.T) {
		if r := (ArrayRequest{Shape: []int{4, 7}, DType: Float64}); r.Validate() != nil || r.Runs() != 4 {
			t.Errorf("TotalRuns 0 is the chunk axis' length: runs %d", r.Runs())
		}
		if err := (ArrayRequest{Shape: []int{4}, DType: Float64, TotalRuns: -1}).Validate(); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("negative runs: %v", err)
		}
	})
}

func TestCubie_array_request_total_runs_rejects_none(t *testing.T) {
	differs(t, dPython, nil) // TotalRuns is an int: there is no None
}

func TestCubie_array_response_defaults(t *testing.T) {
	differs(t, dResponses, func(t *testing.T) {
		var r ArrayResponse // made by Allocate only; its zero value says nothing
		if r.Plan.Chunks != 0 || r.Arrays() != nil {
			t.Errorf("zero response %+v", r)
		}
	})
}

// Through Allocate, since a Go struct stores what it is given: an
// (output, state) pair chunked into 2 comes back with its chunked shapes.
func TestCubie_array_response_stores_chunked_shapes(t *testing.T) {
	m, _, _ := cubieMgr(t, 4096, 4096) // 6000 B asked: 2 chunks of 3072 B
	c := register(t, m, ClientOptions{Name: "c"})
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{
		"output": req(Uint8, 2, 10, 3, 100), // 3000 B
		"state":  req(Uint8, 1, 30, 100),    // 3000 B
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Plan.Chunks != 2 || resp.Plan.ChunkLength != 50 ||
		!slices.Equal(resp.ChunkedShapes()["output"], []int{10, 3, 50}) || !slices.Equal(resp.ChunkedShapes()["state"], []int{30, 50}) {
		t.Errorf("%d chunks of %d, shapes %v", resp.Plan.Chunks, resp.Plan.ChunkLength, resp.ChunkedShapes())
	}
}

// ── test_chunk_buffer_pool.py ───────────────────────────────────────
// cubie's ChunkBufferPool is Host().Staging(); its buffers are bytes,
// not shaped and typed arrays (see "Staging").

// stagingPool is a manager's staging pool with a pinned limit of
// pinned bytes (0: the default).
func stagingPool(t *testing.T, pinned uint64) *StagingPool {
	t.Helper()
	m, _, _ := cubieMgr(t, 64*MiB, 64*MiB, WithHostOptions(HostOptions{PinnedLimit: pinned}))
	return m.Host().Staging()
}

func TestCubie_pinned_buffer_construction(t *testing.T) {
	differs(t, dStaging, func(t *testing.T) {
		b, err := stagingPool(t, 0).Acquire(t.Context(), 800) // (10, 20) float32
		if err != nil || len(b.Bytes()) != 800 || !b.Pinned() {
			t.Errorf("buffer %d bytes, pinned %v: %v", len(b.Bytes()), b.Pinned(), err)
		}
		b.Release()
	})
}

func TestCubie_pinned_buffer_in_use_override(t *testing.T) {
	differs(t, dStaging, nil) // a buffer is in use from Acquire to Release; none is made otherwise
}

func TestCubie_acquire_returns_buffer_with_correct_shape_dtype(t *testing.T) {
	p := stagingPool(t, 0)
	b, err := p.Acquire(t.Context(), 100*4*4) // (100, 4) float32
	if err != nil || len(b.Bytes()) != 1600 || p.Stats().InUse != 1 {
		t.Fatalf("buffer of %d bytes, stats %+v: %v", len(b.Bytes()), p.Stats(), err)
	}
	// Its shaped, typed view: cubie's buf.array.
	a, err := b.Array([]int{100, 4}, Float32)
	if err != nil || !slices.Equal(a.Shape(), []int{100, 4}) || a.DType() != Float32 || len(a.Float32s()) != 400 {
		t.Fatalf("view %v: %v", a, err)
	}
	if err := a.Free(); err != nil || p.Stats().InUse != 0 { // freeing the view releases the buffer
		t.Errorf("free: %v, stats %+v", err, p.Stats())
	}
}

func TestCubie_acquire_reuses_released_buffer(t *testing.T) {
	p := stagingPool(t, 0)
	b1, err := p.Acquire(t.Context(), 50*3*4)
	if err != nil {
		t.Fatal(err)
	}
	first := &b1.Bytes()[0]
	b1.Release()
	b2, err := p.Acquire(t.Context(), 50*3*4)
	if err != nil || &b2.Bytes()[0] != first || p.Stats().Reuses != 1 || p.Stats().Buffers != 1 {
		t.Errorf("second buffer reused %v, stats %+v: %v", err == nil && &b2.Bytes()[0] == first, p.Stats(), err)
	}
	b2.Release()
}

func TestCubie_acquire_allocates_new_when_all_in_use(t *testing.T) {
	p := stagingPool(t, 0)
	b1, err1 := p.Acquire(t.Context(), 40)
	b2, err2 := p.Acquire(t.Context(), 40)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if &b1.Bytes()[0] == &b2.Bytes()[0] || p.Stats().Buffers != 2 {
		t.Errorf("two buffers in use share memory, or stats %+v", p.Stats())
	}
	b1.Release()
	b2.Release()
}

// acquiresAfter acquires first bytes, releases them, then acquires then
// bytes, and reports whether the second buffer is a new one.
func acquiresAfter(t *testing.T, first, then uint64) (grew bool) {
	t.Helper()
	p := stagingPool(t, 0)
	b1, err := p.Acquire(t.Context(), first)
	if err != nil {
		t.Fatal(err)
	}
	b1.Release()
	b2, err := p.Acquire(t.Context(), then)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Release()
	st := p.Stats()
	if uint64(len(b2.Bytes())) < then || st.Grows+st.Reuses != 2 {
		t.Errorf("a buffer of %d bytes for %d; stats %+v", len(b2.Bytes()), then, st)
	}
	return st.Grows == 2
}

// cubie's rule, a new buffer for another shape or dtype, is vram's where
// the idle buffer is too small, and not where it holds the request.
func TestCubie_acquire_allocates_new_for_different_shape(t *testing.T) {
	differs(t, dStaging, func(t *testing.T) {
		if !acquiresAfter(t, 10*4, 20*4) { // (10,) then (20,) float32, cubie's case
			t.Error("(20,) reused the 40 B buffer of (10,)")
		}
		if acquiresAfter(t, 20*4, 10*4) { // (20,) then (10,)
			t.Error("(10,) did not reuse the idle 80 B buffer of (20,)")
		}
	})
}

func TestCubie_acquire_allocates_new_for_different_dtype(t *testing.T) {
	differs(t, dStaging, func(t *testing.T) {
		if !acquiresAfter(t, 10*4, 10*8) { // (10,) float32 then float64, cubie's case
			t.Error("float64 reused the 40 B buffer of float32")
		}
		if acquiresAfter(t, 10*8, 10*4) { // float64 then float32
			t.Error("float32 did not reuse the idle 80 B buffer of float64")
		}
	})
}

func TestCubie_acquire_creates_new_array_name_entry(t *testing.T) {
	differs(t, dStaging, nil) // buffers are not kept by array name
}

func TestCubie_release_marks_not_in_use(t *testing.T) {
	p := stagingPool(t, 0)
	b, _ := p.Acquire(t.Context(), 40)
	if p.Stats().InUse != 1 {
		t.Fatalf("in use %d after Acquire", p.Stats().InUse)
	}
	b.Release()
	if st := p.Stats(); st.InUse != 0 || st.Buffers != 1 {
		t.Errorf("after Release: %+v", st)
	}
}

// cubie clears a pool whose two buffers are in use; clear is Trim, which
// frees idle buffers only (and buffers have no ids).
func TestCubie_clear_empties_pool_and_resets_id(t *testing.T) {
	differs(t, dStaging, func(t *testing.T) {
		p := stagingPool(t, 0)
		a, err1 := p.Acquire(t.Context(), 40)
		b, err2 := p.Acquire(t.Context(), 160)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if err := p.Trim(); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Buffers != 2 || st.InUse != 2 || st.Bytes != 200 {
			t.Errorf("Trim with both in use: %+v; want both kept", st)
		}
		a.Release()
		b.Release()
		if err := p.Trim(); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Buffers != 0 || st.Bytes != 0 {
			t.Errorf("Trim once released: %+v; want an empty pool", st)
		}
	})
}

func TestCubie_allocate_buffer_increments_id(t *testing.T) {
	differs(t, dStaging, nil) // buffers have no ids
}

func TestCubie_thread_safe_concurrent_acquire_release(t *testing.T) {
	p := stagingPool(t, 0)
	var wg sync.WaitGroup
	errs := make(chan error, 5*20)
	for range 5 {
		wg.Go(func() {
			for range 20 {
				b, err := p.Acquire(t.Context(), 40)
				if err != nil {
					errs <- err
					return
				}
				b.Release()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := p.Stats(); st.InUse != 0 || st.Buffers > 5 {
		t.Errorf("after the workers: %+v", st)
	}
}

func TestCubie_acquire_grows_first_buffer_even_without_headroom(t *testing.T) {
	differs(t, dStaging, func(t *testing.T) {
		_, err := stagingPool(t, 1024).Acquire(t.Context(), 4096) // the pinned limit leaves no room
		if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "pinned limit") {
			t.Errorf("Acquire past the limits with nothing in use: %v, want ErrOutOfMemory at once", err)
		}
	})
}

func TestCubie_acquire_blocks_until_release_when_headroom_exhausted(t *testing.T) {
	p := stagingPool(t, 4096) // room for one buffer
	first, err := p.Acquire(t.Context(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	firstBytes := &first.Bytes()[0]
	got := make(chan *StagingBuffer, 1)
	go func() {
		b, err := p.Acquire(t.Context(), 4096)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	for p.Stats().Waits == 0 { // the second Acquire is waiting
		time.Sleep(time.Millisecond)
	}
	select {
	case <-got:
		t.Fatal("the second Acquire returned while the only buffer was in use")
	default:
	}
	first.Release()
	b := <-got
	if b == nil || &b.Bytes()[0] != firstBytes {
		t.Fatal("the waiter did not get the released buffer")
	}
	b.Release()
}

// ── test_stream_groups.py ───────────────────────────────────────────
// cubie's StreamGroups is package streams (ids are the clients' ids);
// the tests of the manager's side go through Register and the handles.

// streamGroups is a fresh streams.Groups on a simulated device.
func streamGroups(t *testing.T) *streams.Groups {
	t.Helper()
	g := streams.New(newSim(t, 64*MiB))
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

func TestCubie_default_group_created_when_none(t *testing.T) {
	differs(t, dPython, nil) // streams.New takes no groups to start with
}

func TestCubie_empty_dict_default_no_post_init(t *testing.T) {
	g := streamGroups(t)
	if names := g.Names(); len(names) != 0 {
		t.Errorf("a fresh set of groups has %v", names)
	}
}

func TestCubie_add_instance_with_int(t *testing.T) {
	g := streamGroups(t)
	if err := g.Add(42, "g1"); err != nil {
		t.Fatal(err)
	}
	if m := g.Members("g1"); !slices.Equal(m, []uint64{42}) {
		t.Errorf("g1 has %v", m)
	}
}

func TestCubie_add_instance_with_object(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{Group: "g1"})
	if got := m.GroupMembers("g1"); len(got) != 1 || got[0] != c || c.Group() != "g1" {
		t.Errorf("g1 has %v; c in %q", got, c.Group())
	}
}

func TestCubie_add_instance_raises_if_already_registered(t *testing.T) {
	g := streamGroups(t)
	if err := g.Add(99, "g1"); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(99, "g2"); !errors.Is(err, streams.ErrAlreadyGrouped) {
		t.Errorf("second Add: %v, want ErrAlreadyGrouped", err)
	}
}

func TestCubie_add_instance_creates_new_group(t *testing.T) {
	g := streamGroups(t)
	if err := g.Add(10, "new_group"); err != nil {
		t.Fatal(err)
	}
	s, err := g.GroupStream("new_group")
	if err != nil || s == nil || !slices.Contains(g.Names(), "new_group") {
		t.Errorf("new_group: stream %v, %v; groups %v", s, err, g.Names())
	}
}

func TestCubie_add_instance_appends_to_existing(t *testing.T) {
	g := streamGroups(t)
	if err := errors.Join(g.Add(1, "g1"), g.Add(2, "g1")); err != nil {
		t.Fatal(err)
	}
	if m := g.Members("g1"); !slices.Equal(m, []uint64{1, 2}) {
		t.Errorf("g1 has %v", m)
	}
}

func TestCubie_get_group_returns_correct_group(t *testing.T) {
	g := streamGroups(t)
	_ = g.Add(7, "alpha")
	if got, err := g.Group(7); err != nil || got != "alpha" {
		t.Errorf("Group(7) = %q, %v", got, err)
	}
}

func TestCubie_get_group_raises_for_unknown(t *testing.T) {
	if _, err := streamGroups(t).Group(999); !errors.Is(err, streams.ErrNotGrouped) {
		t.Errorf("Group(999): %v, want ErrNotGrouped", err)
	}
}

func TestCubie_get_group_handles_object(t *testing.T) {
	m, _, _ := mgr(t)
	if c := register(t, m, ClientOptions{Group: "beta"}); c.Group() != "beta" {
		t.Errorf("in %q", c.Group())
	}
}

func TestCubie_get_group_stream_creates_dedicated_stream(t *testing.T) {
	g := streamGroups(t)
	s, err := g.Ensure("default")
	if err != nil || s == nil || s.Handle() == 0 || !slices.Contains(g.Names(), "default") {
		t.Fatalf("Ensure(default) = %v, %v; groups %v", s, err, g.Names())
	}
	again, _ := g.Ensure("default")
	other, _ := g.Ensure("other")
	if again != s || other == s {
		t.Errorf("default again %v (want %v), other %v", again, s, other)
	}
}

// cubie's StreamGroups(groups=None) has a "default" group with no
// stream; vram's groups have their stream from the moment they exist.
func TestCubie_get_group_stream_backfills_group_without_stream(t *testing.T) {
	differs(t, dGroups, func(t *testing.T) {
		g := streamGroups(t)
		if _, err := g.GroupStream("default"); !errors.Is(err, streams.ErrUnknownGroup) {
			t.Errorf("a group nobody made: %v, want ErrUnknownGroup", err)
		}
		if err := g.Add(1, "default"); err != nil {
			t.Fatal(err)
		}
		s, err1 := g.GroupStream("default")
		got, err2 := g.Stream(1)
		if err := errors.Join(err1, err2); err != nil || s == nil || got != s {
			t.Errorf("made by its first member: stream %v, the member's %v: %v", s, got, err)
		}
	})
}

func TestCubie_add_instance_shares_group_stream(t *testing.T) {
	g := streamGroups(t)
	s, _ := g.Ensure("default")
	_ = g.Add(11, "default")
	if got, _ := g.Stream(11); got != s {
		t.Errorf("member's stream %v, want %v", got, s)
	}
}

func TestCubie_memory_manager_get_group_stream_passthrough(t *testing.T) {
	differs(t, dGroups, func(t *testing.T) {
		// A group's stream is its members': Client.Stream, never the
		// device's default stream.
		m, dev, _ := mgr(t)
		a, b := register(t, m, ClientOptions{}), register(t, m, ClientOptions{})
		sa, err1 := a.Stream()
		sb, err2 := b.Stream()
		if err := errors.Join(err1, err2); err != nil || sa != sb || sa == dev.DefaultStream() {
			t.Errorf("streams %v, %v (device default %v): %v", sa, sb, dev.DefaultStream(), err)
		}
	})
}

func TestCubie_get_stream_returns_group_stream(t *testing.T) {
	g := streamGroups(t)
	_ = g.Add(5, "g1")
	s, err1 := g.Stream(5)
	gs, err2 := g.GroupStream("g1")
	if err := errors.Join(err1, err2); err != nil || s != gs {
		t.Errorf("member %v, group %v: %v", s, gs, err)
	}
}

func TestCubie_get_instances_in_group_existing(t *testing.T) {
	m, _, _ := mgr(t)
	a := register(t, m, ClientOptions{Group: "g1"})
	b := register(t, m, ClientOptions{Group: "g1"})
	if got := m.GroupMembers("g1"); !slices.Equal(got, []*Client{a, b}) {
		t.Errorf("g1 has %v", got)
	}
}

func TestCubie_get_instances_in_group_nonexistent(t *testing.T) {
	m, _, _ := mgr(t)
	if got := m.GroupMembers("no_such"); len(got) != 0 {
		t.Errorf("no_such has %v", got)
	}
}

func TestCubie_change_group_moves_instance(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{Group: "src"})
	if err := c.ChangeStreamGroup("dst"); err != nil {
		t.Fatal(err)
	}
	if len(m.GroupMembers("src")) != 0 || !slices.Equal(m.GroupMembers("dst"), []*Client{c}) {
		t.Errorf("src %v, dst %v", m.GroupMembers("src"), m.GroupMembers("dst"))
	}
}

func TestCubie_change_group_creates_target_if_missing(t *testing.T) {
	g := streamGroups(t)
	_ = g.Add(10, "src")
	if err := g.Move(10, "brand_new"); err != nil {
		t.Fatal(err)
	}
	s, err := g.GroupStream("brand_new")
	if err != nil || s == nil || !slices.Equal(g.Members("brand_new"), []uint64{10}) {
		t.Errorf("brand_new: %v, %v, members %v", s, err, g.Members("brand_new"))
	}
}

func TestCubie_change_group_handles_object(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{Group: "a"})
	if err := c.ChangeStreamGroup("b"); err != nil || c.Group() != "b" || len(m.GroupMembers("a")) != 0 {
		t.Errorf("in %q, a has %v: %v", c.Group(), m.GroupMembers("a"), err)
	}
}

func TestCubie_reinit_streams_replaces_all(t *testing.T) {
	m, _, _ := mgr(t)
	a := register(t, m, ClientOptions{Group: "g1"})
	b := register(t, m, ClientOptions{Group: "g2"})
	oldA, _ := a.Stream()
	oldB, _ := b.Stream()
	ha, hb := oldA.Handle(), oldB.Handle()
	if err := m.ReinitStreams(); err != nil {
		t.Fatal(err)
	}
	newA, _ := a.Stream()
	newB, _ := b.Stream()
	if newA == oldA || newB == oldB || newA.Handle() == ha || newB.Handle() == hb {
		t.Error("a stream was not replaced")
	}
	if a.Group() != "g1" || b.Group() != "g2" {
		t.Errorf("groups %q, %q after the reinit", a.Group(), b.Group())
	}
}

// ── test_memmgmt.py: TestInstanceMemorySettings ─────────────────────
// cubie's per-instance registry entry is the *Client.

func TestCubie_InstanceMemorySettings_instantiation(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{Proportion: 0.5, OnInvalidate: func(error) {}})
	if !near(c.Proportion(), 0.5) || c.Arrays() == nil || len(c.Arrays()) != 0 {
		t.Errorf("proportion %v, arrays %v", c.Proportion(), c.Arrays())
	}
}

func TestCubie_InstanceMemorySettings_add_allocation(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float64, 10)})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Arrays()["foo"]; got == nil || got != resp.Arrays()["foo"] {
		t.Errorf("foo is %v, want the allocated %v", got, resp.Arrays()["foo"])
	}
}

func TestCubie_InstanceMemorySettings_free(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	resp, _ := queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float64, 10)})
	if err := c.Free("foo"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Arrays()["foo"]; ok || !resp.Arrays()["foo"].Freed() {
		t.Error("foo is still held")
	}
}

func TestCubie_InstanceMemorySettings_free_all(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	_, err := queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float64, 10), "bar": fixed(Float64, 20)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.FreeAll(); err != nil { // free_all of the registry; one client's own: Close
		t.Fatal(err)
	}
	if len(c.Arrays()) != 0 || c.Held() != 0 {
		t.Errorf("arrays %v, held %d", c.Arrays(), c.Held())
	}
}

func TestCubie_InstanceMemorySettings_allocated_bytes(t *testing.T) {
	differs(t, dHeld, func(t *testing.T) {
		m, _, _ := mgr(t) // 512 B pages: 800 B → 1024 B, 200 B → 512 B
		c := registered(t, m, 0.5)
		if _, err := queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float64, 100), "bar": fixed(Float64, 25)}); err != nil {
			t.Fatal(err)
		}
		if c.Held() != 1024+512 {
			t.Errorf("held %d, want 1536 as charged", c.Held())
		}
		_ = c.Free("foo")
		if c.Held() != 512 {
			t.Errorf("held %d after freeing foo, want 512", c.Held())
		}
	})
}

// ── test_memmgmt.py: TestMemoryManager ──────────────────────────────

func TestCubie_MemoryManager_instantiation(t *testing.T) {
	m, _, _ := mgr(t)
	if s := m.Shares(); s.Total != 8*cubieGiB || len(m.Clients()) != 0 || m.LimitMode() != Passive {
		t.Errorf("shares %+v, clients %v, mode %v", s, m.Clients(), m.LimitMode())
	}
}

func TestCubie_MemoryManager_register(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	s, err := c.Stream()
	if !slices.Contains(m.Clients(), c) || !near(c.Proportion(), 0.5) || c.Cap() != 4*cubieGiB ||
		c.Group() != streams.Default || !slices.Contains(m.GroupMembers(""), c) || err != nil || s == nil {
		t.Errorf("proportion %v, cap %d, group %q, stream %v, %v", c.Proportion(), c.Cap(), c.Group(), s, err)
	}
}

func TestCubie_MemoryManager_set_limit_mode(t *testing.T) {
	m, _, _ := mgr(t)
	for _, mode := range []LimitMode{Active, Passive} {
		if err := m.SetLimitMode(mode); err != nil || m.LimitMode() != mode {
			t.Errorf("SetLimitMode(%v): %v, now %v", mode, err, m.LimitMode())
		}
	}
	if _, err := ParseLimitMode("invalid"); err == nil {
		t.Error(`ParseLimitMode("invalid") succeeded`)
	}
	if err := m.SetLimitMode(LimitMode(7)); err == nil {
		t.Error("SetLimitMode(7) succeeded")
	}
}

func TestCubie_MemoryManager_get_stream(t *testing.T) {
	m, _, _ := mgr(t)
	a := registered(t, m, 0.5)
	b := register(t, m, ClientOptions{Group: "other"})
	sa, err1 := a.Stream()
	sb, err2 := b.Stream()
	if errors.Join(err1, err2) != nil || sa == nil || sb == nil || sa.Handle() == sb.Handle() {
		t.Errorf("streams %v and %v", sa, sb)
	}
}

func TestCubie_MemoryManager_change_stream_group(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	if err := c.ChangeStreamGroup("other"); err != nil || !slices.Contains(m.GroupMembers("other"), c) {
		t.Errorf("moved: %v, other has %v", err, m.GroupMembers("other"))
	}
	gone := register(t, m, ClientOptions{})
	_ = gone.Close() // a client no longer in any group
	if err := gone.ChangeStreamGroup("newgroup"); !errors.Is(err, ErrClosed) {
		t.Errorf("move of a closed client: %v, want ErrClosed", err)
	}
}

func TestCubie_MemoryManager_reinit_streams(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	s1, _ := c.Stream()
	h1 := s1.Handle()
	if err := m.ReinitStreams(); err != nil {
		t.Fatal(err)
	}
	if s2, _ := c.Stream(); s2.Handle() == h1 {
		t.Error("the stream was not replaced")
	}
}

func TestCubie_MemoryManager_invalidate_all(t *testing.T) {
	m, _, _ := mgr(t)
	registered(t, m, 0.5)
	called := false
	register(t, m, ClientOptions{OnInvalidate: func(error) { called = true }})
	if err := m.InvalidateAll(); err != nil || !called {
		t.Errorf("InvalidateAll: %v, hook called %v", err, called)
	}
}

func TestCubie_MemoryManager_set_manual_limit_mode(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0)
	if err := c.SetManualLimitMode(0.3); err != nil || !near(m.Shares().Manual, 0.3) || !near(c.Proportion(), 0.3) {
		t.Errorf("%v: shares %+v", err, m.Shares())
	}
}

func TestCubie_MemoryManager_set_auto_limit_mode(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	if err := c.SetAutoLimitMode(); err != nil || m.Shares().Manual != 0 || !near(m.Shares().Auto, 1) {
		t.Errorf("%v: shares %+v", err, m.Shares())
	}
}

func TestCubie_MemoryManager_proportion(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	auto := register(t, m, ClientOptions{})
	if !near(c.Proportion(), 0.5) || !near(auto.Proportion(), 0.5) {
		t.Errorf("manual %v, auto %v", c.Proportion(), auto.Proportion())
	}
}

func TestCubie_MemoryManager_cap(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	if want := uint64(0.5 * float64(m.Shares().Total)); c.Cap() != want {
		t.Errorf("cap %d, want %d", c.Cap(), want)
	}
}

func TestCubie_MemoryManager_pool_proportions(t *testing.T) {
	t.Run("already_registered", func(t *testing.T) {
		// Register makes a new handle each time, so no client can be
		// registered twice.
		differs(t, dHandles, func(t *testing.T) {
			m, _, _ := mgr(t)
			a, b := registered(t, m, 0), registered(t, m, 0)
			if a == b || a.ID() == b.ID() || len(m.Clients()) != 2 {
				t.Errorf("two registrations: %v and %v, clients %v", a, b, m.Clients())
			}
		})
	})
	t.Run("proportions", poolProportions)
}

func poolProportions(t *testing.T) {
	m, _, _ := mgr(t)
	if err := m.SetLimitMode(Active); err != nil {
		t.Fatal(err)
	}
	check := func(step string, c *Client, p, manual, auto float64) {
		t.Helper()
		s := m.Shares()
		if !near(c.Proportion(), p) || !near(s.Manual, manual) || !near(s.Auto, auto) {
			t.Errorf("%s: proportion %v, manual %v, auto %v; want %v, %v, %v", step, c.Proportion(), s.Manual, s.Auto, p, manual, auto)
		}
	}
	i1 := registered(t, m, 0)
	check("one auto client", i1, 1, 0, 1)
	i2 := register(t, m, ClientOptions{})
	check("two auto clients", i2, 0.5, 0, 1)
	i3 := register(t, m, ClientOptions{Proportion: 0.5})
	check("a manual 0.5", i3, 0.5, 0.5, 0.5)
	i4 := register(t, m, ClientOptions{Proportion: 0.4})
	check("a manual 0.4", i4, 0.4, 0.9, 0.1)
	if err := i3.SetAutoLimitMode(); err != nil {
		t.Fatal(err)
	}
	check("i3 to auto", i3, 0.2, 0.4, 0.6)
	if err := i3.SetManualLimitMode(0.3); err != nil {
		t.Fatal(err)
	}
	check("i3 back to manual", i3, 0.3, 0.7, 0.3)
	if _, err := m.Register(ClientOptions{Proportion: 0.3}); !errors.Is(err, ErrProportion) {
		t.Errorf("a manual 0.3 past the auto pool's 5%%: %v, want ErrProportion", err)
	}
}

func TestCubie_MemoryManager_process_request(t *testing.T) {
	m, _, _ := mgr(t)
	var k cubieClient
	c := register(t, m, k.opts("c", ""))
	reqs := map[string]ArrayRequest{
		"arr1": {Shape: []int{8, 8, 8}, DType: Float32, ChunkAxis: 2, TotalRuns: 8},
		"arr2": {Shape: []int{4, 4, 8}, DType: Float32, ChunkAxis: 2, TotalRuns: 8},
	}
	if _, err := queueAndAllocate(t, c, reqs); err != nil {
		t.Fatal(err)
	}
	r := k.last()
	if r == nil || len(r.Arrays()) != 2 || r.Plan.Chunks != 1 {
		t.Fatalf("response %+v", r)
	}
	for l, a := range r.Arrays() {
		if !slices.Equal(a.Shape(), reqs[l].Shape) || a.DType() != reqs[l].DType {
			t.Errorf("%s: %v", l, a)
		}
	}
}

func TestCubie_MemoryManager_allocate_all(t *testing.T) {
	differs(t, dOneDoor, func(t *testing.T) {
		m, _, _ := mgr(t)
		c := registered(t, m, 0.5)
		resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"arr1": fixed(Float32, 2, 2, 2), "arr2": fixed(Float32, 2, 2, 2)})
		if err != nil || len(c.Arrays()) != 2 || c.Arrays()["arr1"] != resp.Arrays()["arr1"] {
			t.Errorf("%v: held %v", err, c.Arrays())
		}
	})
}

func TestCubie_MemoryManager_allocate(t *testing.T) {
	differs(t, dOneDoor, func(t *testing.T) {
		m, _, _ := mgr(t)
		c := registered(t, m, 0.5)
		resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{
			"d": fixed(Float32, 2, 2), "p": {Shape: []int{2, 2}, DType: Float32, Memory: Pinned, Unchunkable: true},
		})
		if err != nil || !slices.Equal(resp.Arrays()["d"].Shape(), []int{2, 2}) || resp.Host()["p"].Memory() != Pinned {
			t.Errorf("%v: %+v", err, resp)
		}
		if err := c.Queue(map[string]ArrayRequest{"m": {Shape: []int{1, 1}, DType: Float32, Memory: Managed}}); !errors.Is(err, ErrNotSupported) {
			t.Errorf("managed: %v", err)
		}
	})
}

func TestCubie_MemoryManager_allocate_device_returns_native_array(t *testing.T) {
	differs(t, dPython, nil) // Numba's and CuPy's array types
}

func TestCubie_MemoryManager_free(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	resp, _ := queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float32, 2, 2)})
	if err := m.Free("foo"); err != nil || c.Arrays()["foo"] != nil || !resp.Arrays()["foo"].Freed() {
		t.Errorf("Free(foo): %v, held %v", err, c.Arrays())
	}
}

func TestCubie_MemoryManager_free_all(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	_, _ = queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float32, 2, 2), "bar": fixed(Float32, 2, 2)})
	if err := m.FreeAll(); err != nil || len(c.Arrays()) != 0 {
		t.Errorf("FreeAll: %v, held %v", err, c.Arrays())
	}
}

func TestCubie_MemoryManager_get_memory_info(t *testing.T) {
	m, _, _ := mgr(t)
	free, total, err := m.MemInfo()
	if err != nil || free != cubieGiB || total != 8*cubieGiB {
		t.Errorf("MemInfo = %d, %d, %v", free, total, err)
	}
}

// hostArrayIsZeros checks a new host array's shape, dtype, row-major
// strides and zeroed bytes.
func hostArrayIsZeros(t *testing.T, h *HostArray, err error, shape []int, d DType) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	if !slices.Equal(h.Shape(), shape) || h.DType() != d || !slices.Equal(h.Strides(), stridesOf(shape, d.Size())) {
		t.Errorf("%v: strides %v", h, h.Strides())
	}
	n, _ := elements(shape)
	if uint64(len(h.Data())) != n*d.Size() || slices.ContainsFunc(h.Data(), func(b byte) bool { return b != 0 }) {
		t.Errorf("%v is not %d zeroed bytes", h, n*d.Size())
	}
}

func TestCubie_MemoryManager_create_host_array_1d(t *testing.T) {
	m, _, _ := mgr(t)
	h, err := m.NewHostArray([]int{10}, Float32, Pinned, nil) // cubie's default memory_type is pinned
	hostArrayIsZeros(t, h, err, []int{10}, Float32)
}

func TestCubie_MemoryManager_create_host_array_2d(t *testing.T) {
	m, _, _ := mgr(t)
	h, err := m.NewHostArray([]int{5, 3}, Float64, Pinned, nil)
	hostArrayIsZeros(t, h, err, []int{5, 3}, Float64)
}

func TestCubie_MemoryManager_create_host_array_3d_default_stride(t *testing.T) {
	m, _, _ := mgr(t)
	h, err := m.NewHostArray([]int{2, 3, 4}, Float32, Pinned, nil)
	hostArrayIsZeros(t, h, err, []int{2, 3, 4}, Float32)
}

func TestCubie_MemoryManager_create_host_array_3d_custom_stride(t *testing.T) {
	m, _, _ := mgr(t)
	h, err := m.NewHostArray([]int{2, 3, 4}, Float32, Pinned, nil)
	hostArrayIsZeros(t, h, err, []int{2, 3, 4}, Float32) // C order: strides 48, 16, 4
}

func TestCubie_MemoryManager_create_host_array_pageable_memory(t *testing.T) {
	m, _, _ := mgr(t)
	h, err := m.NewHostArray([]int{2, 3, 4}, Float32, Pageable, nil) // cubie's "host"
	hostArrayIsZeros(t, h, err, []int{2, 3, 4}, Float32)
	if h.Memory() != Pageable {
		t.Errorf("memory %v", h.Memory())
	}
}

func TestCubie_MemoryManager_create_host_array_invalid_memory_type(t *testing.T) {
	m, _, _ := mgr(t)
	if _, err := ParseMemoryType("invalid"); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf(`ParseMemoryType("invalid"): %v`, err)
	}
	if _, err := m.NewHostArray([]int{2, 3, 4}, Float32, Device, nil); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "want pinned, mapped or pageable") {
		t.Errorf("a device host array: %v", err)
	}
}

func TestCubie_MemoryManager_manual_pool_proportion(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0)
	_ = c.SetManualLimitMode(0.3)
	if !near(m.Shares().Manual, 0.3) {
		t.Errorf("manual %v", m.Shares().Manual)
	}
}

func TestCubie_MemoryManager_auto_pool_proportion(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	register(t, m, ClientOptions{})
	if want := 1 - c.Proportion(); !near(m.Shares().Auto, want) {
		t.Errorf("auto %v, want %v", m.Shares().Auto, want)
	}
}

func TestCubie_MemoryManager_set_manual_proportion(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	if err := c.SetManualProportion(0.4); err != nil || !near(c.Proportion(), 0.4) || !near(m.Shares().Manual, 0.4) {
		t.Errorf("%v: proportion %v", err, c.Proportion())
	}
}

func TestCubie_MemoryManager_set_manual_proportion_from_auto_pool(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0)
	other := register(t, m, ClientOptions{})
	if err := c.SetManualProportion(0.01); err != nil {
		t.Fatal(err)
	}
	total := float64(8 * cubieGiB)
	if !near(c.Proportion(), 0.01) || c.Cap() != uint64(0.01*total) || !near(other.Proportion(), 0.99) || !near(m.Shares().Manual, 0.01) {
		t.Errorf("c %v (cap %d), other %v", c.Proportion(), c.Cap(), other.Proportion())
	}
}

func TestCubie_MemoryManager_rebalance_auto_pool(t *testing.T) {
	m, _, _ := mgr(t)
	a, b := register(t, m, ClientOptions{}), register(t, m, ClientOptions{})
	if !near(a.Proportion(), 0.5) || !near(m.Shares().Auto, 1) {
		t.Fatalf("a %v, auto %v", a.Proportion(), m.Shares().Auto)
	}
	_ = b.SetManualLimitMode(0.75) // the auto pool rebalances on every change
	if !near(a.Proportion(), 0.25) || !near(m.Shares().Auto, 0.25) {
		t.Errorf("a %v, auto %v", a.Proportion(), m.Shares().Auto)
	}
}

func TestCubie_MemoryManager_get_stream_group(t *testing.T) {
	m, _, _ := mgr(t)
	if c := registered(t, m, 0.5); c.Group() != "default" {
		t.Errorf("group %q", c.Group())
	}
	if c := register(t, m, ClientOptions{Group: "custom"}); c.Group() != "custom" {
		t.Errorf("group %q", c.Group())
	}
}

func TestCubie_MemoryManager_check_requests(t *testing.T) {
	differs(t, dPython, func(t *testing.T) {
		// A request set is a map[string]ArrayRequest: no other type can
		// be passed. What is checked is each request, at Queue.
		m, _, _ := mgr(t)
		c := registered(t, m, 0.5)
		valid := map[string]ArrayRequest{
			"arr1": {Shape: []int{2, 2}, DType: Float32, TotalRuns: 2},
			"arr2": {Shape: []int{3, 3}, DType: Float64, Memory: Pinned, TotalRuns: 3},
		}
		if err := c.Queue(valid); err != nil {
			t.Errorf("valid requests: %v", err)
		}
		if err := c.Queue(map[string]ArrayRequest{"m": {Shape: []int{3, 3}, DType: Float64, Memory: Managed}}); !errors.Is(err, ErrNotSupported) || len(c.Queued()) != 2 {
			t.Errorf("managed: %v; queue %v left", err, c.Queued())
		}
	})
}

func TestCubie_MemoryManager_queue_request(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	first := map[string]ArrayRequest{"arr1": {Shape: []int{2, 2}, DType: Float32, TotalRuns: 2}}
	if err := c.Queue(first); err != nil {
		t.Fatal(err)
	}
	if q := c.Queued(); len(q) != 1 || !slices.Equal(q["arr1"].Shape, []int{2, 2}) {
		t.Errorf("queued %v", q)
	}
	if err := c.Queue(map[string]ArrayRequest{"arr2": {Shape: []int{3, 3}, DType: Float32}}); err != nil {
		t.Fatal(err)
	}
	if q := c.Queued(); len(q) != 1 || q["arr2"].Shape == nil { // replaced, not merged
		t.Errorf("queued %v", q)
	}
}

func TestCubie_MemoryManager_allocate_queue_single_instance(t *testing.T) {
	m, _, _ := mgr(t)
	var k cubieClient
	c := register(t, m, k.opts("c", ""))
	if _, err := queueAndAllocate(t, c, map[string]ArrayRequest{"arr1": {Shape: []int{2, 2, 2}, DType: Float32, ChunkAxis: 2, TotalRuns: 2}}); err != nil {
		t.Fatal(err)
	}
	r := k.last()
	if r == nil || !slices.Equal(r.Arrays()["arr1"].Shape(), []int{2, 2, 2}) || r.Arrays()["arr1"].DType() != Float32 || r.Plan.Chunks != 1 {
		t.Errorf("response %+v", r)
	}
}

func TestCubie_MemoryManager_allocate_queue_multiple_instances_group_limit(t *testing.T) {
	differs(t, dRuns, func(t *testing.T) {
		// cubie plans (2,2,2) of 2 runs and (3,3,3) of 3 with the first's
		// count, cutting the second to (3,3,2); vram refuses the pair.
		m, _, _ := mgr(t)
		var k1, k2 cubieClient
		a, b := register(t, m, k1.opts("a", "test")), register(t, m, k2.opts("b", "test"))
		_ = a.Queue(map[string]ArrayRequest{"arr1": {Shape: []int{2, 2, 2}, DType: Float32, ChunkAxis: 2, TotalRuns: 2}})
		_ = b.Queue(map[string]ArrayRequest{"arr2": {Shape: []int{3, 3, 3}, DType: Float32, ChunkAxis: 2, TotalRuns: 3}})
		if _, err := a.Allocate(t.Context()); !errors.Is(err, ErrRunsMismatch) || k1.calls()+k2.calls() != 0 {
			t.Errorf("%v, hooks %d; want ErrRunsMismatch and none", err, k1.calls()+k2.calls())
		}
	})
}

func TestCubie_MemoryManager_allocate_queue_empty_queue(t *testing.T) {
	differs(t, dNothing, func(t *testing.T) {
		m, _, _ := mgr(t)
		var k cubieClient
		c := register(t, m, k.opts("c", ""))
		if resp, err := c.Allocate(t.Context()); resp != nil || !errors.Is(err, ErrNothingQueued) || k.calls() != 0 {
			t.Errorf("%v, %v, hooks %d; want ErrNothingQueued and no hook", resp, err, k.calls())
		}
	})
}

func TestCubie_MemoryManager_allocate_queue_empty_rebroadcasts_chunk_parameters(t *testing.T) {
	m, _, _ := cubieMgr(t, 1024, 1024)
	var k cubieClient
	c := register(t, m, k.opts("c", ""))
	if _, err := queueAndAllocate(t, c, map[string]ArrayRequest{"arr1": {Shape: []int{4, 100}, DType: Float32, ChunkAxis: 1, TotalRuns: 100}}); err != nil {
		t.Fatal(err)
	}
	first := k.last()
	if k.calls() != 1 || first.Plan.Chunks < 2 {
		t.Fatalf("%d responses, the first %+v; want one, chunked", k.calls(), first)
	}
	if _, err := c.Allocate(t.Context()); err != nil {
		t.Fatal(err)
	}
	second := k.last()
	if k.calls() != 2 || len(second.Arrays()) != 0 || second.Plan.Chunks != first.Plan.Chunks || second.Plan.ChunkLength != first.Plan.ChunkLength {
		t.Errorf("%d responses, the second %+v", k.calls(), second)
	}
}

func TestCubie_MemoryManager_is_grouped(t *testing.T) {
	m, _, _ := mgr(t)
	def := register(t, m, ClientOptions{Group: "default"})
	single := register(t, m, ClientOptions{Group: "single_group"})
	g1 := register(t, m, ClientOptions{Group: "multi_group"})
	g2 := register(t, m, ClientOptions{Group: "multi_group"})
	g3 := register(t, m, ClientOptions{Group: "multi_group"})
	want := map[*Client]bool{def: false, single: false, g1: true, g2: true, g3: true}
	for c, w := range want {
		if c.IsGrouped() != w {
			t.Errorf("%v grouped %v, want %v", c, c.IsGrouped(), w)
		}
	}
	_ = g3.ChangeStreamGroup("new_group")
	if g3.IsGrouped() || !g1.IsGrouped() || !g2.IsGrouped() {
		t.Errorf("after the move: g3 %v, g1 %v, g2 %v", g3.IsGrouped(), g1.IsGrouped(), g2.IsGrouped())
	}
}

// copyClient is a client on a small device that keeps bytes, holding
// arr1 (3, 4) float32 and arr2 (2, 3) float64, for the copy tests.
func copyClient(t *testing.T, s1, s2 []int) (*Manager, *Client, *ArrayResponse) {
	t.Helper()
	m, _, _ := cubieMgr(t, 64*MiB, 64*MiB)
	c := registered(t, m, 0.5)
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"arr1": fixed(Float32, s1...), "arr2": fixed(Float64, s2...)})
	if err != nil {
		t.Fatal(err)
	}
	return m, c, resp
}

func TestCubie_MemoryManager_to_device(t *testing.T) {
	m, c, resp := copyClient(t, []int{3, 4}, []int{2, 3})
	h1, _ := m.NewHostArray([]int{3, 4}, Float32, Pinned, []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	h2, _ := m.NewHostArray([]int{2, 3}, Float64, Pinned, []float64{0, 2.5, 5, 7.5, 10, 12.5})
	defer h1.Free()
	defer h2.Free()
	ctx := t.Context()
	if err := errors.Join(c.ToDevice(ctx, resp.Arrays()["arr1"], h1), c.ToDevice(ctx, resp.Arrays()["arr2"], h2), c.Sync(ctx)); err != nil {
		t.Fatal(err)
	}
	b1, _ := m.NewHostArray([]int{3, 4}, Float32, Pageable, nil)
	b2, _ := m.NewHostArray([]int{2, 3}, Float64, Pageable, nil)
	if err := errors.Join(c.FromDevice(ctx, b1, resp.Arrays()["arr1"]), c.FromDevice(ctx, b2, resp.Arrays()["arr2"]), c.Sync(ctx)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b1.Float32s(), h1.Float32s()) || !slices.Equal(b2.Float64s(), h2.Float64s()) {
		t.Errorf("copied back %v, %v", b1.Float32s(), b2.Float64s())
	}
}

func TestCubie_MemoryManager_from_device(t *testing.T) {
	m, c, resp := copyClient(t, []int{2, 5}, []int{3, 2})
	src1 := make([]float32, 10)
	for i := range src1 {
		src1[i] = float32(i) * 3
	}
	s1, _ := m.NewHostArray([]int{2, 5}, Float32, Pinned, src1)
	s2, _ := m.NewHostArray([]int{3, 2}, Float64, Pinned, []float64{10, 11, 12, 13, 14, 15})
	d1, _ := m.NewHostArray([]int{2, 5}, Float32, Pinned, nil)
	d2, _ := m.NewHostArray([]int{3, 2}, Float64, Pinned, nil)
	for _, h := range []*HostArray{s1, s2, d1, d2} {
		defer h.Free()
	}
	ctx := t.Context()
	if err := errors.Join(c.ToDevice(ctx, resp.Arrays()["arr1"], s1), c.ToDevice(ctx, resp.Arrays()["arr2"], s2), c.Sync(ctx),
		c.FromDevice(ctx, d1, resp.Arrays()["arr1"]), c.FromDevice(ctx, d2, resp.Arrays()["arr2"]), c.Sync(ctx)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d1.Float32s(), src1) || !slices.Equal(d2.Float64s(), s2.Float64s()) {
		t.Errorf("copied %v, %v", d1.Float32s(), d2.Float64s())
	}
}

// ── test_memmgmt.py: module tests and the other classes ─────────────

func TestCubie_ensure_cuda_context(t *testing.T) {
	differs(t, dPython, nil) // the device package opens its context in Open, and says why not
}

func TestCubie_ensure_cuda_context_simulation(t *testing.T) {
	differs(t, dPython, nil)
}

func TestCubie_GetChunkParameters_get_chunk_parameters_unchunkable_exceeds_memory(t *testing.T) {
	// cubie's get_chunk_parameters is Plan, here with mgr's 1 GiB.
	huge := fixed(Float32, 512, 512, 512) // 512 MiB
	_, err := Plan(map[string]map[string]ArrayRequest{"c": {
		"huge_unchunkable": huge, "huge_unchunkable2": huge,
		"small_chunkable": {Shape: []int{1, 1}, DType: Float32, ChunkAxis: 2, TotalRuns: 1},
	}}, cubieGiB, PlanOptions{})
	if !errors.Is(err, ErrUnchunkable) || !strings.Contains(err.Error(), "unchunkable") {
		t.Errorf("Plan: %v, want ErrUnchunkable", err)
	}
}

// allocateOne queues reqs for a fresh client of m with cubie's hooks and
// allocates them, returning the response its hook got.
func allocateOne(t *testing.T, m *Manager, reqs map[string]ArrayRequest) *ArrayResponse {
	t.Helper()
	var k cubieClient
	c := register(t, m, k.opts("c", ""))
	resp, err := queueAndAllocate(t, c, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if got := k.last(); got != resp {
		t.Fatalf("hook got %v, Allocate returned %v", got, resp)
	}
	return resp
}

func TestCubie_AllocateQueueExtractsNumRuns_allocate_queue_extracts_num_runs(t *testing.T) {
	m, _, _ := mgr(t)
	// (10, 50) with cubie's run axis 2: no such axis, so unchunkable, and
	// the runs are its TotalRuns.
	r := allocateOne(t, m, map[string]ArrayRequest{"arr1": {Shape: []int{10, 50}, DType: Float32, ChunkAxis: 2, TotalRuns: 100}})
	if r.Plan.Chunks != 1 || r.Plan.ChunkLength != 100 {
		t.Errorf("%d chunks of %d, want 1 of 100", r.Plan.Chunks, r.Plan.ChunkLength)
	}
}

func TestCubie_AllocateQueueExtractsNumRuns_allocate_queue_chunks_correctly(t *testing.T) {
	m, _, _ := mgr(t)
	a := ArrayRequest{Shape: []int{100, 10000}, DType: Float32, ChunkAxis: 2, TotalRuns: 10000}
	r := allocateOne(t, m, map[string]ArrayRequest{"arr1": a, "arr2": a})
	switch {
	case r.Plan.Chunks > 1 && (r.Plan.ChunkLength <= 0 || r.Plan.ChunkLength >= 10000 || r.Plan.Chunks*r.Plan.ChunkLength < 10000):
		t.Errorf("%d chunks of %d do not cover 10000 runs", r.Plan.Chunks, r.Plan.ChunkLength)
	case r.Plan.Chunks == 1 && r.Plan.ChunkLength != 10000:
		t.Errorf("one chunk of %d, want 10000", r.Plan.ChunkLength)
	}
}

func TestCubie_allocate_queue_no_chunked_slices_in_response(t *testing.T) {
	m, _, _ := mgr(t)
	r := allocateOne(t, m, map[string]ArrayRequest{
		"arr1": {Shape: []int{10, 100}, DType: Float32, ChunkAxis: 1, TotalRuns: 100},
		"arr2": {Shape: []int{5, 100}, DType: Float32, ChunkAxis: 1, TotalRuns: 100},
	})
	// The chunk parameters are in the response; slices come from Span.
	if r.Plan.Chunks != 1 || r.Plan.ChunkLength != 100 || len(r.ChunkedShapes()) != 2 || !slices.Equal(r.ChunkedShapes()["arr2"], []int{5, 100}) {
		t.Errorf("response %+v", r)
	}
	if sp, err := r.Span(0, 1); err != nil || sp.Len != 100 {
		t.Errorf("Span(0) = %+v, %v", sp, err)
	}
}

func TestCubie_allocate_queue_uses_first_request_total_runs(t *testing.T) {
	m, _, _ := mgr(t)
	r := allocateOne(t, m, map[string]ArrayRequest{
		"arr1": {Shape: []int{10, 150}, DType: Float32, ChunkAxis: 2, TotalRuns: 150},
		"arr2": {Shape: []int{5, 150}, DType: Float32, ChunkAxis: 2, TotalRuns: 150},
	})
	if r.Plan.Chunks != 1 || r.Plan.ChunkLength != 150 {
		t.Errorf("%d chunks of %d, want 1 of 150", r.Plan.Chunks, r.Plan.ChunkLength)
	}
}

func TestCubie_allocate_queue_handles_all_requests_same_total_runs(t *testing.T) {
	m, _, _ := mgr(t)
	reqs := map[string]ArrayRequest{}
	for l, rows := range map[string]int{"arr1": 10, "arr2": 5, "arr3": 8} {
		reqs[l] = ArrayRequest{Shape: []int{rows, 200}, DType: Float32, ChunkAxis: 2, TotalRuns: 200}
	}
	r := allocateOne(t, m, reqs)
	if r.Plan.Chunks != 1 || r.Plan.ChunkLength != 200 || len(r.Arrays()) != 3 {
		t.Errorf("%d chunks of %d, arrays %v", r.Plan.Chunks, r.Plan.ChunkLength, r.Arrays())
	}
}

func TestCubie_numba_stream_ptr(t *testing.T)               { differs(t, dPython, nil) }
func TestCubie_cupy_stream_wrapper(t *testing.T)            { differs(t, dPython, nil) }
func TestCubie_numba_stream_ptr_none_stream(t *testing.T)   { differs(t, dPython, nil) }
func TestCubie_numba_stream_ptr_ctypes_void_p(t *testing.T) { differs(t, dPython, nil) }
func TestCubie_numba_stream_ptr_ctypes_void_p_null(t *testing.T) {
	differs(t, dPython, nil)
}
func TestCubie_numba_stream_ptr_unconvertible_handle(t *testing.T) {
	differs(t, dPython, nil)
}

// cubie's placeholder hooks are nil hooks here: a client may have none,
// and nothing calls them.
func TestCubie_placeholder_hooks_are_noop(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{Name: "hookless"})
	if _, err := queueAndAllocate(t, c, map[string]ArrayRequest{"x": fixed(Float32, 4)}); err != nil {
		t.Fatal(err)
	}
	if err := m.InvalidateAll(); err != nil || len(c.Arrays()) != 0 {
		t.Errorf("InvalidateAll: %v, held %v", err, c.Arrays())
	}
}

func TestCubie_pinned_host_array_real_gpu(t *testing.T) {
	m, _, _ := mgr(t)
	h, err := m.NewHostArray([]int{4, 3}, Float32, Pinned, nil)
	hostArrayIsZeros(t, h, err, []int{4, 3}, Float32)
	if h.Memory() != Pinned {
		t.Errorf("memory %v", h.Memory())
	}
}

func TestCubie_instance_memory_settings_free_missing_key_warns(t *testing.T) {
	m, _, lb := mgr(t)
	c := registered(t, m, 0.5)
	if err := c.Free("missing"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lb.String(), "WARN") || !strings.Contains(lb.String(), "label=missing") {
		t.Errorf("log %q; want a warning naming the label", lb)
	}
}

// noDevice is cubie's cuda-less manager: vram refuses to make one.
func noDevice(t *testing.T) {
	dev, err := sim.New(sim.Config{TotalBytes: 64 * MiB, NoContext: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = dev.Close() // its MemInfo fails now
	if m, err := New(dev); m != nil || !errors.Is(err, device.ErrClosed) || !strings.Contains(err.Error(), "read device memory") {
		t.Errorf("New on a device with no memory to read: %v, %v; want an error", m, err)
	}
}

func TestCubie_attrs_post_init_cuda_less_environment(t *testing.T) {
	differs(t, dNoDevice, noDevice)
}

func TestCubie_register_proportion_out_of_range(t *testing.T) {
	m, _, _ := mgr(t)
	if _, err := m.Register(ClientOptions{Proportion: 1.5}); !errors.Is(err, ErrProportion) || !strings.Contains(err.Error(), "want 0 < p ≤ 1") {
		t.Errorf("%v", err)
	}
}

func TestCubie_set_manual_proportion_out_of_range(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{})
	if err := c.SetManualProportion(1.5); !errors.Is(err, ErrProportion) || !near(c.Proportion(), 1) {
		t.Errorf("%v; proportion now %v", err, c.Proportion())
	}
}

func TestCubie_set_manual_limit_mode_noop_when_already_manual(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{})
	if err := c.SetManualLimitMode(0.3); err != nil || !near(c.Proportion(), 0.3) {
		t.Fatalf("%v, %v", err, c.Proportion())
	}
	if err := c.SetManualLimitMode(0.9); err != nil || !near(c.Proportion(), 0.3) {
		t.Errorf("second call: %v, proportion %v; want no change", err, c.Proportion())
	}
}

func TestCubie_set_auto_limit_mode_converts_manual_to_auto(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{Proportion: 0.5})
	if err := c.SetAutoLimitMode(); err != nil || m.Shares().Manual != 0 || !near(c.Proportion(), 1) {
		t.Errorf("%v: proportion %v, shares %+v", err, c.Proportion(), m.Shares())
	}
}

func TestCubie_add_manual_proportion_exceeds_total(t *testing.T) {
	m, _, _ := mgr(t)
	register(t, m, ClientOptions{Proportion: 0.6})
	if _, err := m.Register(ClientOptions{Proportion: 0.6}); !errors.Is(err, ErrProportion) || !strings.Contains(err.Error(), "over 100%") {
		t.Errorf("%v", err)
	}
}

func TestCubie_add_manual_proportion_warns_low_autopool(t *testing.T) {
	m, _, lb := mgr(t)
	register(t, m, ClientOptions{Proportion: 0.97})
	if !strings.Contains(lb.String(), "under the minimum 5%") {
		t.Errorf("log %q; want the warning", lb)
	}
}

func TestCubie_add_auto_proportion_raises_when_pool_too_small(t *testing.T) {
	m, _, lb := mgr(t)
	register(t, m, ClientOptions{Proportion: 0.97})
	if !strings.Contains(lb.String(), "under the minimum 5%") {
		t.Errorf("log %q; want the warning", lb)
	}
	if _, err := m.Register(ClientOptions{}); !errors.Is(err, ErrProportion) || !strings.Contains(err.Error(), "at least 5%") {
		t.Errorf("an auto client: %v", err)
	}
}

// activeHolding registers a manual 0.5 client (a 32 MiB cap of a
// 64 MiB device, cubie's figures scaled) in Active mode holding held
// bytes, then allocates one more small array, and returns its budget.
func activeHolding(t *testing.T, held int) (budget uint64, c *Client, log string) {
	t.Helper()
	m, _, lb := cubieMgr(t, 64*MiB, 64*MiB, WithLimitMode(Active))
	c = register(t, m, ClientOptions{Proportion: 0.5, OnInvalidate: func(error) {}})
	if held > 0 {
		holdBytes(t, c, held)
	}
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"small": fixed(Uint8, 512)})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Plan.Budget, c, lb.String()
}

func TestCubie_get_available_memory_active_mode_warns_low_headroom(t *testing.T) {
	held := 32 * int(MiB) * 99 / 100 / 512 * 512 // 99% of the cap, in whole pages
	budget, c, log := activeHolding(t, held)
	if !strings.Contains(log, "more than 95% of its members' caps") {
		t.Errorf("log %q; want the 95%% warning", log)
	}
	if want := min(c.Cap()-uint64(held), 64*MiB-uint64(held)); budget != want {
		t.Errorf("budget %d, want min(headroom, free) = %d", budget, want)
	}
}

// With cubie's figures (1 GiB free of 8 GiB, a 4 GiB cap) the free memory
// binds; on activeHolding's 64 MiB device the cap does.
func TestCubie_get_available_memory_active_mode_normal(t *testing.T) {
	t.Run("free_binds", func(t *testing.T) {
		m, _, lb := mgr(t, WithLimitMode(Active))
		c := register(t, m, ClientOptions{Proportion: 0.5, OnInvalidate: func(error) {}})
		resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"small": fixed(Uint8, 512)})
		if err != nil {
			t.Fatal(err)
		}
		// headroom = the 4 GiB cap − 0 held; free = 1 GiB.
		if want := min(c.Cap(), uint64(cubieGiB)); resp.Plan.Budget != want || strings.Contains(lb.String(), "95%") {
			t.Errorf("budget %d, want min(headroom %d, free 1 GiB) = %d; log %q", resp.Plan.Budget, c.Cap(), want, lb)
		}
	})
	t.Run("cap_binds", func(t *testing.T) {
		budget, c, log := activeHolding(t, 0)
		if strings.Contains(log, "95%") || budget != c.Cap() {
			t.Errorf("budget %d, want the cap %d; log %q", budget, c.Cap(), log)
		}
	})
}

func TestCubie_get_chunk_parameters_warns_and_raises_when_unfittable(t *testing.T) {
	m, _, lb := cubieMgr(t, 1024, 100*1024)
	c := register(t, m, ClientOptions{Name: "c", Group: "test"})
	_, err := queueAndAllocate(t, c, map[string]ArrayRequest{"huge": {Shape: []int{1000, 1000, 1000}, DType: Float32, TotalRuns: 1000}})
	if !errors.Is(err, ErrRunTooLarge) || !strings.Contains(err.Error(), "one run needs") {
		t.Errorf("%v, want ErrRunTooLarge", err)
	}
	if !strings.Contains(lb.String(), "more than 20 times the device's free memory") {
		t.Errorf("log %q; want the 20x warning", lb)
	}
}

func TestCubie_is_request_chunkable_empty_shape(t *testing.T) {
	if r := (ArrayRequest{Shape: []int{}, DType: Float32}); r.Chunkable() || r.Validate() != nil {
		t.Errorf("a scalar: chunkable %v, valid %v", r.Chunkable(), r.Validate())
	}
}

func TestCubie_is_request_chunkable_no_chunk_axis(t *testing.T) {
	differs(t, dAxis, func(t *testing.T) { // no None: Unchunkable says it
		if (ArrayRequest{Shape: []int{4, 4}, DType: Float32, Unchunkable: true}).Chunkable() {
			t.Error("chunkable")
		}
	})
}

func TestCubie_is_request_chunkable_axis_out_of_bounds(t *testing.T) {
	if (ArrayRequest{Shape: []int{4, 4}, DType: Float32, ChunkAxis: 5}).Chunkable() {
		t.Error("chunkable")
	}
}

func TestCubie_is_request_chunkable_degenerate_axis(t *testing.T) {
	if (ArrayRequest{Shape: []int{4, 1}, DType: Float32, ChunkAxis: 1}).Chunkable() {
		t.Error("chunkable")
	}
}

func TestCubie_get_portioned_request_size(t *testing.T) {
	// The plan's figures, counted unrounded (granularity 1) as cubie's.
	p, err := Plan(map[string]map[string]ArrayRequest{"1": {
		"chunkable":   req(Float32, 2, 2, 3, 4),
		"unchunkable": fixed(Float32, 2, 3, 4),
	}}, math.MaxUint64-1, PlanOptions{Granularity: 1})
	const want = 2 * 3 * 4 * 4
	if err != nil || p.UnchunkableBytes != want || p.FullBytes-p.UnchunkableBytes != want {
		t.Errorf("unchunkable %d, chunkable %d (%v); want %d each", p.UnchunkableBytes, p.FullBytes-p.UnchunkableBytes, err, want)
	}
}

func TestCubie_replace_with_chunked_size(t *testing.T) {
	p, err := Plan(map[string]map[string]ArrayRequest{"c": {"x": req(Uint8, 1, 2, 18, 4)}}, 1<<20, PlanOptions{MaxChunkLength: 9})
	if err != nil || !slices.Equal(p.ChunkedShapes["c"]["x"], []int{2, 9, 4}) {
		t.Errorf("shape %v, %v; want [2 9 4]", p.ChunkedShapes["c"]["x"], err)
	}
}

func TestCubie_attrs_post_init_unexpected_exception(t *testing.T) {
	differs(t, dNoDevice, noDevice)
}

func TestCubie_set_auto_limit_mode_noop_when_already_auto(t *testing.T) {
	m, _, _ := mgr(t)
	c := register(t, m, ClientOptions{})
	before := c.Proportion()
	if err := c.SetAutoLimitMode(); err != nil || c.Proportion() != before || m.Shares().Manual != 0 {
		t.Errorf("%v: proportion %v, was %v", err, c.Proportion(), before)
	}
}

func TestCubie_add_allocation_overwrites_existing_key(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	first, _ := queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float32, 4)})
	second, err := queueAndAllocate(t, c, map[string]ArrayRequest{"foo": fixed(Float32, 4)})
	if err != nil || c.Arrays()["foo"] != second.Arrays()["foo"] || !first.Arrays()["foo"].Freed() {
		t.Errorf("foo is %v (want %v), the first freed %v: %v", c.Arrays()["foo"], second.Arrays()["foo"], first.Arrays()["foo"].Freed(), err)
	}
}

func TestCubie_create_host_array_with_like(t *testing.T) {
	m, _, _ := mgr(t)
	src := []float32{0, 1, 2, 3, 4, 5}
	h, err := m.NewHostArray([]int{2, 3}, Float32, Pinned, src)
	if err != nil || !slices.Equal(h.Float32s(), src) {
		t.Errorf("%v: %v", h, err)
	}
	_ = h.Free()
}

func TestCubie_sync_stream(t *testing.T) {
	m, _, _ := mgr(t)
	if err := registered(t, m, 0.5).Sync(t.Context()); err != nil {
		t.Error(err)
	}
}

func TestCubie_allocate_queue_notifies_notaries(t *testing.T) {
	m, _, _ := mgr(t)
	var k1, k2 cubieClient
	a := register(t, m, k1.opts("a", "grp"))
	register(t, m, k2.opts("b", "grp"))
	if _, err := queueAndAllocate(t, a, map[string]ArrayRequest{"arr1": {Shape: []int{2, 2, 2}, DType: Float32, ChunkAxis: 2, TotalRuns: 2}}); err != nil {
		t.Fatal(err)
	}
	r1, r2 := k1.last(), k2.last()
	if r2 == nil || len(r2.Arrays()) != 0 || r1 == nil || r2.Plan.Chunks != r1.Plan.Chunks {
		t.Errorf("the notary's response %+v, the requester's %+v", r2, r1)
	}
}

func TestCubie_get_chunk_parameters_unchunkable_alone_exceeds_memory(t *testing.T) {
	_, err := Plan(map[string]map[string]ArrayRequest{"c": {
		"big_unchunkable": fixed(Float32, 512, 512, 256), // 256 MiB
		"small_chunkable": req(Float32, 2, 4, 4, 10),
	}}, 100*MiB, PlanOptions{})
	if !errors.Is(err, ErrUnchunkable) || !strings.Contains(err.Error(), "unchunkable arrays need") {
		t.Errorf("%v", err)
	}
}

func TestCubie_get_chunk_parameters_computes_chunk_size_when_eligible(t *testing.T) {
	p, err := Plan(map[string]map[string]ArrayRequest{"c": {"arr": req(Float32, 1, 2, 5_000_000)}}, 10*MiB, PlanOptions{})
	if err != nil || p.ChunkLength <= 0 || p.ChunkLength >= 5_000_000 || p.Chunks <= 1 {
		t.Errorf("%d chunks of %d: %v", p.Chunks, p.ChunkLength, err)
	}
}

func TestCubie_active_cap_chunks_with_free_device_memory(t *testing.T) {
	m, _, _ := mgr(t, WithLimitMode(Active))
	c := register(t, m, ClientOptions{Name: "c", Group: "capped", Proportion: 0.01})                    // 82 MiB of 8 GiB
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"arr": req(Float32, 1, 2, 20_000_000)}) // 153 MiB
	if err != nil || resp.Plan.Chunks <= 1 || resp.Plan.ChunkLength <= 0 || resp.Plan.ChunkLength >= 20_000_000 {
		t.Errorf("%+v: %v", resp, err)
	}
}

// gated blocks a stream of another group of m with a kernel until the
// test ends (or open is called), as cubie's start_cuda_busy_work.
func gated(t *testing.T, m *Manager, dev *sim.Device) (open func()) {
	t.Helper()
	busy := register(t, m, ClientOptions{Name: "busy", Group: "busy"})
	s, err := busy.Stream()
	if err != nil {
		t.Fatal(err)
	}
	return gateStream(t, dev, s)
}

// returnsWhileGated runs f, failing the test if it has not returned
// within a minute (it waits for the gated stream), and then opens it.
func returnsWhileGated(t *testing.T, open func(), f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(time.Minute):
		t.Error("it waited for another group's stream")
		open()
		<-done
	}
	open()
}

func TestCubie_active_cap_chunking_leaves_unrelated_stream_running(t *testing.T) {
	m, dev, _ := cubieMgr(t, 64*MiB, 64*MiB, WithLimitMode(Active))
	open := gated(t, m, dev)
	c := register(t, m, ClientOptions{Name: "c", Group: "capped", Proportion: 0.01})
	returnsWhileGated(t, open, func() error {
		resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"arr": req(Float32, 1, 2, 200_000)})
		if err == nil && resp.Plan.Chunks <= 1 {
			err = fmt.Errorf("%d chunks under a 655 KiB cap", resp.Plan.Chunks)
		}
		return err
	})
}

// cubie's holder is unreachable and uncollected; a *Client nobody holds is
// still the registry's until Close, and no collector runs its teardown.
func TestCubie_allocation_pressure_does_not_run_cyclic_gc(t *testing.T) {
	m, _, _ := cubieMgr(t, 1024, 8*cubieGiB)
	holder := register(t, m, (&cubieClient{}).opts("holder", "pressure_holder"))
	if _, err := queueAndAllocate(t, holder, map[string]ArrayRequest{"buf": {Shape: []int{4, 4, 4}, DType: Float32, ChunkAxis: 2, TotalRuns: 4}}); err != nil {
		t.Fatal(err)
	}
	if holder.Held() == 0 {
		t.Fatal("the holder holds nothing")
	}
	id := holder.ID()
	holder = nil
	runtime.GC()
	requester := register(t, m, (&cubieClient{}).opts("requester", "pressure_requester"))
	resp, err := queueAndAllocate(t, requester, map[string]ArrayRequest{"big": req(Float32, 2, 2, 2, 512)})
	if err != nil || resp.Plan.Chunks <= 1 {
		t.Fatalf("%+v: %v; want the request chunked", resp, err)
	}
	if !slices.ContainsFunc(m.Clients(), func(c *Client) bool { return c.ID() == id }) {
		t.Errorf("the holder left the registry: %v", m.Clients())
	}
}

func TestCubie_owner_work_state_tracks_submission(t *testing.T) {
	m, dev, _ := cubieMgr(t, 64*MiB, 64*MiB)
	c := register(t, m, ClientOptions{Name: "c", Group: "flags"})
	if idle, err := c.Idle(); err != nil || !idle {
		t.Fatalf("a new client: idle %v, %v", idle, err)
	}
	w, err := c.BeginWork()
	if err != nil {
		t.Fatal(err)
	}
	if idle, _ := c.Idle(); idle {
		t.Error("idle with a mark open")
	}
	s, _ := c.Stream()
	open := gateStream(t, dev, s)
	if err := w.End(); err != nil {
		t.Fatal(err)
	}
	if idle, _ := c.Idle(); idle {
		t.Error("idle while the GPU still works on it")
	}
	open()
	if err := c.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	if idle, err := c.Idle(); err != nil || !idle {
		t.Errorf("after the work: idle %v, %v", idle, err)
	}
}

// pressure is cubie's eviction setting, scaled to 512 B device pages:
// a device of total bytes; each holder has one 256 B array (a page).
func pressure(t *testing.T, total uint64, holders ...string) (*Manager, map[string]*Client, map[string]*cubieClient) {
	t.Helper()
	m, _, _ := cubieMgr(t, total, total)
	cs, ks := map[string]*Client{}, map[string]*cubieClient{}
	for _, n := range holders {
		ks[n] = &cubieClient{}
		cs[n] = register(t, m, ks[n].opts(n, "evict_"+n))
		if _, err := queueAndAllocate(t, cs[n], map[string]ArrayRequest{"buf": {Shape: []int{4, 4, 4}, DType: Float32, ChunkAxis: 2, TotalRuns: 4}}); err != nil {
			t.Fatal(err)
		}
		ks[n].proportion = "armed"
	}
	return m, cs, ks
}

func TestCubie_pressure_evicts_idle_complete_owner(t *testing.T) {
	// 4 KiB: 3 KiB free beside the holders; the request, 16 KiB of
	// runs, takes 6 chunks in it and 5 with one holder's page back.
	m, cs, ks := pressure(t, 4096, "idle", "busy")
	if _, err := cs["busy"].BeginWork(); err != nil {
		t.Fatal(err)
	}
	var kr cubieClient
	requester := register(t, m, kr.opts("requester", "evict_requester"))
	if _, err := queueAndAllocate(t, requester, map[string]ArrayRequest{"big": req(Float32, 2, 2, 2, 1024)}); err != nil {
		t.Fatal(err)
	}
	if cs["idle"].Held() != 0 || ks["idle"].proportion != "" || cs["busy"].Held() == 0 || ks["busy"].proportion != "armed" {
		t.Errorf("idle holds %d (hook %q), busy holds %d (hook %q)", cs["idle"].Held(), ks["idle"].proportion, cs["busy"].Held(), ks["busy"].proportion)
	}
}

func TestCubie_inflight_owner_is_not_evicted(t *testing.T) {
	m, cs, _ := pressure(t, 4096, "inflight")
	if _, err := cs["inflight"].BeginWork(); err != nil {
		t.Fatal(err)
	}
	requester := register(t, m, (&cubieClient{}).opts("requester", "protected_requester"))
	if _, err := queueAndAllocate(t, requester, map[string]ArrayRequest{"big": req(Float32, 2, 2, 2, 1024)}); err != nil {
		t.Fatal(err)
	}
	if cs["inflight"].Held() == 0 || cs["inflight"].Evicted() {
		t.Error("a client with work in flight was evicted")
	}
}

func TestCubie_queue_request_requires_live_invalidate_hook(t *testing.T) {
	differs(t, dHookless, func(t *testing.T) {
		// Such a client may queue, and is never evicted.
		m, cs, _ := pressure(t, 4096)
		hookless := register(t, m, ClientOptions{Name: "no_hook", Group: "no_hook"})
		if _, err := queueAndAllocate(t, hookless, map[string]ArrayRequest{"buf": fixed(Float32, 4, 4, 4)}); err != nil {
			t.Fatal(err)
		}
		_ = cs
		requester := register(t, m, (&cubieClient{}).opts("requester", "r"))
		if _, err := queueAndAllocate(t, requester, map[string]ArrayRequest{"big": req(Float32, 2, 2, 2, 1024)}); err != nil {
			t.Fatal(err)
		}
		if hookless.Held() == 0 || hookless.Evicted() {
			t.Error("a client with no OnInvalidate was evicted")
		}
	})
}

func TestCubie_pressure_evicts_only_required_lru_owner(t *testing.T) {
	// 3 KiB: 2 KiB free beside the two holders; the request, 574 runs of
	// 4 B (2296 B, 2560 B in pages), fits whole once one holder is gone.
	m, cs, _ := pressure(t, 3072, "a", "b")
	for _, n := range []string{"a", "b"} { // a's work, then b's: a is the least recently used
		w, err := cs[n].BeginWork()
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(w.End(), cs[n].Sync(t.Context())); err != nil {
			t.Fatal(err)
		}
	}
	requester := register(t, m, (&cubieClient{}).opts("requester", "lru_requester"))
	resp, err := queueAndAllocate(t, requester, map[string]ArrayRequest{"big": {Shape: []int{1, 1, 574}, DType: Float32, ChunkAxis: 2, TotalRuns: 574}})
	if err != nil || resp.Plan.Chunks != 1 {
		t.Fatalf("%+v: %v", resp, err)
	}
	if cs["a"].Held() != 0 || cs["b"].Held() == 0 {
		t.Errorf("a holds %d, b %d; want a evicted, b kept", cs["a"].Held(), cs["b"].Held())
	}
}

func TestCubie_total_system_ram_reports_positive(t *testing.T) {
	if meminfo.RAM() == 0 {
		t.Skip("the host's RAM is unknown on this platform")
	}
	if r := meminfo.RAM(); r < 64*MiB {
		t.Errorf("host RAM %d", r)
	}
}

func TestCubie_choose_host_memory_type_applies_policy(t *testing.T) {
	differs(t, dHostLadder, func(t *testing.T) {
		// vram's limits count what is live: pinned while the pinned total
		// stays under PinnedLimit, pageable while the RAM total stays
		// under Limit, else a file in the spill directory.
		dir := t.TempDir()
		m, _, _ := cubieMgr(t, 64*MiB, 64*MiB, WithHostOptions(HostOptions{PinnedLimit: 256, Limit: 1024, SpillDir: dir}))
		place := func(n int) (*HostArray, HostRung) {
			h, err := m.Host().Alloc([]int{n}, Uint8, HostArrayOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return h, h.Placement().Rung
		}
		small, r1 := place(128)
		mid, r2 := place(512)  // over the pinned limit beside small
		big, r3 := place(4096) // over the host limit
		if r1 != RungPinned || r2 != RungPageable || r3 != RungFile {
			t.Errorf("rungs %v, %v, %v; want pinned, pageable, file", r1, r2, r3)
		}
		if files, _ := filepath.Glob(filepath.Join(dir, "*.npy")); len(files) != 1 || slices.ContainsFunc(big.Data(), func(b byte) bool { return b != 0 }) {
			t.Errorf("spill files %v; the file array zeroed: %v", files, !slices.ContainsFunc(big.Data(), func(b byte) bool { return b != 0 }))
		}
		like := make([]float64, 16)
		for i := range like {
			like[i] = float64(i)
		}
		explicit, err := m.Host().Alloc([]int{4, 4}, Float64, HostArrayOptions{Rung: RungFile, Like: like})
		if err != nil || !slices.Equal(explicit.Float64s(), like) {
			t.Errorf("a forced file array with like: %v", err)
		}
		if err := errors.Join(small.Free(), mid.Free(), big.Free(), explicit.Free()); err != nil {
			t.Fatal(err)
		}
		if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
			t.Errorf("spill files left: %v", files)
		}
	})
}

func TestCubie_manager_rejects_negative_spill_threshold(t *testing.T) {
	differs(t, dPython, nil) // HostOptions' limits are uint64: no negative one can be given
}

func TestCubie_release_host_array_reports_unlink_failure(t *testing.T) {
	m, _, _ := cubieMgr(t, 64*MiB, 64*MiB, WithHostOptions(HostOptions{SpillDir: t.TempDir()}))
	h, err := m.Host().Alloc([]int{4}, Float64, HostArrayOptions{Rung: RungFile})
	if err != nil {
		t.Fatal(err)
	}
	path := h.Placement().Path
	// The file replaced by a directory that cannot be removed.
	if err := errors.Join(os.Remove(path), os.Mkdir(path, 0o755), os.WriteFile(filepath.Join(path, "x"), nil, 0o644)); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(path)
	if err := h.Free(); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Free = %v; want an error naming %s", err, path)
	}
}

func TestCubie_host_spill_does_not_wait_for_unrelated_stream(t *testing.T) {
	m, dev, _ := cubieMgr(t, 64*MiB, 64*MiB, WithHostOptions(HostOptions{SpillDir: t.TempDir(), Limit: 1}))
	open := gated(t, m, dev)
	returnsWhileGated(t, open, func() error {
		h, err := m.Host().Alloc([]int{32}, Float32, HostArrayOptions{})
		if err == nil && h.Placement().Rung != RungFile {
			err = fmt.Errorf("placed on %v, want a file", h.Placement())
		}
		if err == nil {
			err = h.Free()
		}
		return err
	})
}

func TestCubie_legacy_default_stream_sync_is_stream_local(t *testing.T) {
	m, dev, _ := cubieMgr(t, 64*MiB, 64*MiB)
	owner := register(t, m, ClientOptions{Name: "owner"})
	open := gated(t, m, dev)
	returnsWhileGated(t, open, func() error { return owner.Sync(t.Context()) })
}

// ── TestDeadInstanceRelease: Close, not the collector ───────────────

func TestCubie_DeadInstanceRelease_registry_does_not_pin_instances(t *testing.T) {
	differs(t, dCollector, func(t *testing.T) {
		m, _, _ := mgr(t)
		c := register(t, m, ClientOptions{Proportion: 0.4, OnInvalidate: func(error) {}})
		_ = c.Close()
		if m.Shares().Manual != 0 || slices.Contains(m.Clients(), c) {
			t.Errorf("after Close: shares %+v, clients %v", m.Shares(), m.Clients())
		}
	})
}

func TestCubie_DeadInstanceRelease_dead_manual_instances_release_proportion(t *testing.T) {
	differs(t, dCollector, func(t *testing.T) {
		m, _, _ := mgr(t)
		register(t, m, ClientOptions{})
		for range 3 {
			_ = register(t, m, ClientOptions{Proportion: 0.5}).Close()
		}
		survivor, err := m.Register(ClientOptions{Proportion: 0.9})
		if err != nil || !near(m.Shares().Manual, 0.9) || !slices.Contains(m.Clients(), survivor) {
			t.Errorf("%v: shares %+v", err, m.Shares())
		}
	})
}

func TestCubie_DeadInstanceRelease_dead_auto_instance_leaves_pool(t *testing.T) {
	differs(t, dCollector, func(t *testing.T) {
		m, _, _ := mgr(t)
		keeper := register(t, m, ClientOptions{})
		_ = register(t, m, ClientOptions{}).Close()
		if !near(m.Shares().Auto, 1) || !near(keeper.Proportion(), 1) {
			t.Errorf("auto %v, keeper %v", m.Shares().Auto, keeper.Proportion())
		}
	})
}

func TestCubie_DeadInstanceRelease_bound_method_hooks_compare_equal(t *testing.T) {
	differs(t, dPython, nil) // bound methods held weakly
}

func TestCubie_DeadInstanceRelease_dead_hooks_are_noops(t *testing.T) {
	differs(t, dCollector, func(t *testing.T) {
		m, _, _ := mgr(t)
		called := false
		c := register(t, m, ClientOptions{OnInvalidate: func(error) { called = true }})
		_ = c.Close()
		if err := m.InvalidateAll(); err != nil || called {
			t.Errorf("InvalidateAll: %v; a closed client's hook called %v", err, called)
		}
	})
}

func TestCubie_DeadInstanceRelease_non_weakrefable_instance_registers(t *testing.T) {
	differs(t, dPython, nil) // weak references
}

// ── The table's entries that no ported test meets ───────────────────

// TestCubie_table_entries checks vram's side of each difference that
// cubie's tests do not reach (found by reading cubie's source), naming
// its entry: an entry missing from the table fails.
func TestCubie_table_entries(t *testing.T) {
	for name, tc := range map[string]struct {
		entry string
		check func(t *testing.T)
	}{
		"auto client at exactly 5%":                  {dProportions, autoAtExactlyFivePercent},
		"ChangeStreamGroup moves the queue":          {dMoveQueue, changeGroupMovesQueue},
		"Queue of an empty map drops the queue":      {dEmptyReqs, emptyQueueDropsQueue},
		"pinned arrays come in Host":                 {dPinnedArrs, pinnedArraysInHost},
		"ToDevice and FromDevice refuse a shape":     {dCopyShapes, copiesRefuseShapes},
		"Remove of an id in no group":                {dLeaving, removeUnknownFails},
		"BeginWork after an eviction":                {dEvictWork, beginWorkAfterEviction},
		"staging growth counts the pinned total":     {dGrowth, stagingCountsPinned},
		"staging grows for no array past the limits": {dGrowth, stagingGrowsForNobody},
	} {
		t.Run(name, func(t *testing.T) {
			table, err := cubieEntries()
			if err != nil {
				t.Fatal(err)
			}
			if !table[tc.entry] {
				t.Fatalf("the package doc's table of differences has no entry %q", tc.entry)
			}
			tc.check(t)
		})
	}
}

// cubie refuses 0.9 + 0.05 (the float sum is 0.9500000000000001) and takes
// 0.95 and 0.5 + 0.45; vram takes all three.
func autoAtExactlyFivePercent(t *testing.T) {
	for _, manual := range [][]float64{{0.95}, {0.5, 0.45}, {0.9, 0.05}, {0.05, 0.9}} {
		m, _, _ := mgr(t)
		for _, p := range manual {
			register(t, m, ClientOptions{Proportion: p})
		}
		if c, err := m.Register(ClientOptions{}); err != nil || !near(c.Proportion(), 0.05) {
			t.Errorf("manual %v, then an auto client: %v", manual, err)
		}
	}
}

func changeGroupMovesQueue(t *testing.T) {
	m, _, _ := mgr(t)
	var kc, kp cubieClient
	c, peer := register(t, m, kc.opts("c", "a")), register(t, m, kp.opts("peer", "a"))
	if err := c.Queue(map[string]ArrayRequest{"x": fixed(Float32, 4)}); err != nil {
		t.Fatal(err)
	}
	if err := c.ChangeStreamGroup("b"); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Queued()["x"]; !ok {
		t.Fatalf("queue after the move: %v", c.Queued())
	}
	if _, err := queueAndAllocate(t, peer, map[string]ArrayRequest{"y": fixed(Float32, 4)}); err != nil {
		t.Fatal(err)
	}
	if kc.calls() != 0 || c.Arrays()["x"] != nil {
		t.Errorf("the old group's Allocate served the moved queue: %d responses, arrays %v", kc.calls(), c.Arrays())
	}
	resp, err := c.Allocate(t.Context())
	if err != nil || resp.Arrays()["x"] == nil {
		t.Errorf("the new group's Allocate: %v, %v", resp, err)
	}
}

func emptyQueueDropsQueue(t *testing.T) {
	m, _, _ := cubieMgr(t, 1024, 1024)
	var k cubieClient
	c := register(t, m, k.opts("c", ""))
	first, err := queueAndAllocate(t, c, map[string]ArrayRequest{"x": req(Float32, 1, 4, 100)})
	if err != nil || first.Plan.Chunks < 2 {
		t.Fatalf("%+v: %v; want a chunked plan", first, err)
	}
	if err := c.Queue(map[string]ArrayRequest{}); err != nil || len(c.Queued()) != 0 {
		t.Fatalf("Queue({}): %v, queued %v", err, c.Queued())
	}
	again, err := c.Allocate(t.Context())
	if err != nil || len(again.Arrays()) != 0 || again.Plan.Chunks != first.Plan.Chunks || again.Plan.ChunkLength != first.Plan.ChunkLength {
		t.Errorf("Allocate after Queue({}): %+v, %v; want the last plan, %d chunks of %d", again, err, first.Plan.Chunks, first.Plan.ChunkLength)
	}
	if c.Arrays()["x"] == nil {
		t.Error("x was freed")
	}
}

func pinnedArraysInHost(t *testing.T) {
	m, _, _ := mgr(t)
	c := registered(t, m, 0.5)
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{
		"d": fixed(Float32, 2, 2), "p": {Shape: []int{2, 2}, DType: Float32, Memory: Pinned, Unchunkable: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := resp.Arrays()["p"]; ok || resp.Arrays()["d"] == nil {
		t.Errorf("device arrays %v", resp.Arrays())
	}
	if h := resp.Host()["p"]; h == nil || h.Memory() != Pinned || !slices.Equal(h.Shape(), []int{2, 2}) {
		t.Errorf("host arrays %v", resp.Host())
	}
}

func copiesRefuseShapes(t *testing.T) {
	m, c, resp := copyClient(t, []int{3, 4}, []int{2, 3})
	h, err := m.NewHostArray([]int{4, 3}, Float32, Pinned, nil) // 12 elements, as arr1, in another shape
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	ctx := t.Context()
	if err := c.ToDevice(ctx, resp.Arrays()["arr1"], h); !errors.Is(err, ErrMismatch) {
		t.Errorf("ToDevice (4, 3) into (3, 4): %v, want ErrMismatch", err)
	}
	if err := c.FromDevice(ctx, h, resp.Arrays()["arr1"]); !errors.Is(err, ErrMismatch) {
		t.Errorf("FromDevice (3, 4) into (4, 3): %v, want ErrMismatch", err)
	}
}

func removeUnknownFails(t *testing.T) {
	g := streamGroups(t)
	if err := g.Remove(12345); !errors.Is(err, streams.ErrNotGrouped) {
		t.Errorf("Remove of an id in no group: %v, want ErrNotGrouped", err)
	}
}

func beginWorkAfterEviction(t *testing.T) {
	m, cs, _ := pressure(t, 4096, "idle")
	requester := register(t, m, (&cubieClient{}).opts("requester", "r"))
	if _, err := queueAndAllocate(t, requester, map[string]ArrayRequest{"big": req(Float32, 2, 2, 2, 1024)}); err != nil {
		t.Fatal(err)
	}
	idle := cs["idle"]
	if !idle.Evicted() {
		t.Fatal("the idle holder was not evicted")
	}
	if w, err := idle.BeginWork(); w != nil || !errors.Is(err, ErrEvicted) {
		t.Errorf("BeginWork after the eviction: %v, %v; want ErrEvicted and no mark", w, err)
	}
	if free, _ := idle.Idle(); !free {
		t.Error("a refused BeginWork marked the client busy")
	}
}

// Pinned host arrays count in the pinned limit the staging pool grows
// under; cubie's bound is RAM alone.
func stagingCountsPinned(t *testing.T) {
	m, _, _ := cubieMgr(t, 64*MiB, 64*MiB, WithHostOptions(HostOptions{PinnedLimit: 4096}))
	h, err := m.NewHostArray([]int{3072}, Uint8, Pinned, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	if _, err := m.Host().Staging().Acquire(t.Context(), 2048); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("2 KiB of staging beside 3 KiB pinned under a 4 KiB limit: %v, want ErrOutOfMemory", err)
	}
}

// With the limits used up by a buffer in use, a request for another
// array (another size) waits: cubie would grow for another name.
func stagingGrowsForNobody(t *testing.T) {
	p := stagingPool(t, 4096)
	first, err := p.Acquire(t.Context(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := p.TryAcquire(1024); b != nil || err != nil {
		t.Errorf("TryAcquire past the limits: %v, %v; want nothing now", b, err)
	}
	if st := p.Stats(); st.Grows != 1 {
		t.Errorf("stats %+v; want one buffer made", st)
	}
	first.Release()
	b, err := p.TryAcquire(1024)
	if err != nil || b == nil {
		t.Fatalf("once released: %v, %v", b, err)
	}
	b.Release()
}
