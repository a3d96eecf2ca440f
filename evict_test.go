package vram

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/device/sim"
)

// The calls the eviction tests make on the manager, in one place.

func queueAndAllocate(t *testing.T, c *Client, reqs map[string]ArrayRequest) (*ArrayResponse, error) {
	t.Helper()
	if err := c.Queue(reqs); err != nil {
		t.Fatal(err)
	}
	return c.Allocate(t.Context())
}

// invalidations records each client's OnInvalidate reasons.
type invalidations struct {
	mu  sync.Mutex
	got map[string][]error
}

func (iv *invalidations) hook(name string) func(error) {
	return func(reason error) {
		iv.mu.Lock()
		defer iv.mu.Unlock()
		if iv.got == nil {
			iv.got = map[string][]error{}
		}
		iv.got[name] = append(iv.got[name], reason)
	}
}

func (iv *invalidations) names() []string {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	var out []string
	for n := range iv.got {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// TestEvict: three idle clients of other groups, a, b and c (allocated
// in that order, so least recently used first), hold 16 MiB each of a
// 64 MiB device; a fourth group asks for more than the 16 MiB left.
// Eviction frees exactly the idle clients needed, oldest first, calls
// their hooks with a reason wrapping ErrEvicted, and skips busy,
// opted-out and same-group clients.
func TestEvict(t *testing.T) {
	const each = 16 * int(MiB)
	tests := map[string]struct {
		ask     ArrayRequest
		noEvict string                                                     // the client that opts out
		noHook  string                                                     // the client registered with no OnInvalidate
		prepare func(t *testing.T, dev *sim.Device, cs map[string]*Client) // before the big group allocates
		mate    bool                                                       // a member of the big group holds memory too (never evicted)
		want    []string                                                   // evicted
		wantErr error
		chunks  int
	}{
		"unchunkable: the two oldest": {
			ask: fixed(Uint8, 40*int(MiB)), want: []string{"a", "b"}, chunks: 1,
		},
		"unchunkable: one is enough": {
			ask: fixed(Uint8, 30*int(MiB)), want: []string{"a"}, chunks: 1,
		},
		"fits: nothing evicted": {
			ask: fixed(Uint8, 16*int(MiB)), want: nil, chunks: 1,
		},
		"chunked: evicts to reach the fewest chunks": {
			// 32 MiB of runs: 2 chunks in the 16 MiB free, 1 once a goes.
			ask: req(Uint8, 0, 32*int(MiB)), want: []string{"a"}, chunks: 1,
		},
		"too big even with every idle client: nothing evicted": {
			ask: fixed(Uint8, 70*int(MiB)), want: nil, wantErr: ErrUnchunkable,
		},
		"a mark open: skipped": {
			ask: fixed(Uint8, 40*int(MiB)), want: []string{"b", "c"}, chunks: 1,
			prepare: func(t *testing.T, _ *sim.Device, cs map[string]*Client) {
				if _, err := cs["a"].BeginWork(); err != nil { // never ended
					t.Fatal(err)
				}
				cs["a"].work.lastUse.Store(0) // still the oldest use

			},
		},
		"work ended and done: evicted": {
			ask: fixed(Uint8, 40*int(MiB)), want: []string{"a", "b"}, chunks: 1,
			prepare: func(t *testing.T, dev *sim.Device, cs map[string]*Client) {
				a := cs["a"]
				w, err := a.BeginWork()
				if err != nil {
					t.Fatal(err)
				}
				s, _ := a.Stream()
				open := gateStream(t, dev, s)
				if err := w.End(); err != nil {
					t.Fatal(err)
				}
				// a's use is now the latest: order it back as the oldest.
				a.work.lastUse.Store(0)
				open()
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
			},
		},
		"work ended, the GPU still at it: skipped": {
			ask: fixed(Uint8, 40*int(MiB)), want: []string{"b", "c"}, chunks: 1,
			prepare: func(t *testing.T, dev *sim.Device, cs map[string]*Client) {
				a := cs["a"]
				w, err := a.BeginWork()
				if err != nil {
					t.Fatal(err)
				}
				s, _ := a.Stream()
				open := gateStream(t, dev, s)
				if err := w.End(); err != nil {
					t.Fatal(err)
				}
				a.work.lastUse.Store(0) // still the oldest use
				// The stream runs on once the victims are chosen: Direct's
				// free, like cuMemFree, waits for the whole device.
				x := cs["b"].Arrays()["x"]
				ctx := t.Context()
				go func() {
					for !x.Evicted() && ctx.Err() == nil {
						time.Sleep(time.Millisecond)
					}
					open()
				}()
			},
		},
		"opted out: skipped": {
			ask: fixed(Uint8, 40*int(MiB)), noEvict: "a", want: []string{"b", "c"}, chunks: 1,
		},
		"no OnInvalidate: never evicted, nobody could tell it": {
			ask: fixed(Uint8, 40*int(MiB)), noHook: "a", want: []string{"b", "c"}, chunks: 1,
		},
		"recently used: evicted last": {
			ask: fixed(Uint8, 40*int(MiB)), want: []string{"b", "c"}, chunks: 1,
			prepare: func(t *testing.T, _ *sim.Device, cs map[string]*Client) {
				w, err := cs["a"].BeginWork() // a use: a is now the most recent
				if err != nil {
					t.Fatal(err)
				}
				if err := w.End(); err != nil {
					t.Fatal(err)
				}
			},
		},
		"the group's own members: never": {
			ask: fixed(Uint8, 26*int(MiB)), mate: true, want: []string{"b"}, chunks: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, dev, _ := newManager(t, 64*MiB)
			var iv invalidations
			cs := map[string]*Client{}
			resps := map[string]*ArrayResponse{}
			names := []string{"a", "b", "c"}
			if tc.mate {
				names = []string{"mate", "b", "c"} // the mate is the oldest
			}
			for _, n := range names {
				g := n
				if n == "mate" {
					g = "big"
				}
				o := ClientOptions{Name: n, Group: g, NoEvict: n == tc.noEvict, OnInvalidate: iv.hook(n)}
				if n == tc.noHook {
					o.OnInvalidate = nil
				}
				cs[n] = register(t, m, o)
				resps[n] = holdBytes(t, cs[n], each)
			}
			if tc.prepare != nil {
				tc.prepare(t, dev, cs)
			}
			big := register(t, m, ClientOptions{Name: "big", Group: "big", OnInvalidate: iv.hook("big")})
			resp, err := queueAndAllocate(t, big, map[string]ArrayRequest{"y": tc.ask})
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if resp.Plan.Chunks != tc.chunks {
				t.Errorf("%d chunks, want %d", resp.Plan.Chunks, tc.chunks)
			}
			if got := iv.names(); !slices.Equal(got, tc.want) {
				t.Errorf("OnInvalidate called for %v, want %v", got, tc.want)
			}
			for _, n := range names {
				c, arr := cs[n], resps[n].Arrays()["x"]
				evicted := slices.Contains(tc.want, n)
				if c.Evicted() != evicted || arr.Evicted() != evicted || arr.Freed() != evicted {
					t.Errorf("%s: client evicted %v, array evicted %v, freed %v; want %v", n, c.Evicted(), arr.Evicted(), arr.Freed(), evicted)
				}
				if evicted {
					if rs := iv.got[n]; len(rs) != 1 || !errors.Is(rs[0], ErrEvicted) {
						t.Errorf("%s: reasons %v, want one wrapping ErrEvicted", n, rs)
					}
					if c.Held() != 0 || len(c.Arrays()) != 0 {
						t.Errorf("%s: holds %d bytes, %d arrays after eviction", n, c.Held(), len(c.Arrays()))
					}
				} else if c.Held() == 0 {
					t.Errorf("%s lost its arrays", n)
				}
			}
		})
	}
}

// TestEvictedClientRequestsAgain: an evicted client's arrays fail copies
// with ErrEvicted (and ErrFreed), its BeginWork too; once it has queued
// and been allocated again, everything works.
func TestEvictedClientRequestsAgain(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	var iv invalidations
	a := register(t, m, ClientOptions{Name: "a", Group: "a", OnInvalidate: iv.hook("a")})
	old := holdBytes(t, a, 40*int(MiB))
	big := register(t, m, ClientOptions{Name: "big", Group: "big", OnInvalidate: iv.hook("big")})
	bigResp := holdBytes(t, big, 40*int(MiB))
	if !a.Evicted() || !slices.Equal(iv.names(), []string{"a"}) {
		t.Fatalf("a evicted %v, hooks %v", a.Evicted(), iv.names())
	}
	h, err := m.NewHostArray([]int{40 * int(MiB)}, Uint8, Pageable, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	err = a.ToDevice(t.Context(), old.Arrays()["x"], h)
	if !errors.Is(err, ErrEvicted) || !errors.Is(err, ErrFreed) {
		t.Errorf("copy into an evicted array: %v, want ErrEvicted and ErrFreed", err)
	}
	if _, err := a.BeginWork(); !errors.Is(err, ErrEvicted) {
		t.Errorf("BeginWork of an evicted client: %v, want ErrEvicted", err)
	}
	// big is busy now: a's new request cannot evict it, and fails.
	w, err := big.BeginWork()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queueAndAllocate(t, a, map[string]ArrayRequest{"x": fixed(Uint8, 40*int(MiB))}); !errors.Is(err, ErrUnchunkable) {
		t.Fatalf("a's request while big works: %v, want ErrUnchunkable", err)
	}
	if bigResp.Arrays()["x"].Freed() || big.Evicted() {
		t.Fatal("a busy client was evicted")
	}
	if err := w.End(); err != nil {
		t.Fatal(err)
	}
	if err := big.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	// big is idle again: a's request (still queued) evicts it and works.
	resp, err := a.Allocate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if a.Evicted() || !big.Evicted() {
		t.Errorf("a evicted %v, big evicted %v; want false, true", a.Evicted(), big.Evicted())
	}
	if err := a.ToDevice(t.Context(), resp.Arrays()["x"], h); err != nil {
		t.Errorf("copy into a's new array: %v", err)
	}
	w, err = a.BeginWork()
	if err != nil {
		t.Fatalf("BeginWork after allocating again: %v", err)
	}
	if err := errors.Join(w.End(), a.Sync(t.Context())); err != nil {
		t.Fatal(err)
	}
}

// TestEvictNotForBadRequests: a group whose requests are
// themselves wrong (runs that disagree) evicts nothing.
func TestEvictNotForBadRequests(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	var iv invalidations
	a := register(t, m, ClientOptions{Name: "a", Group: "a", OnInvalidate: iv.hook("a")})
	holdBytes(t, a, 40*int(MiB))
	big := register(t, m, ClientOptions{Name: "big", Group: "big"})
	_, err := queueAndAllocate(t, big, map[string]ArrayRequest{
		"p": req(Uint8, 0, 30*int(MiB)),
		"q": req(Uint8, 0, 20*int(MiB)),
	})
	if !errors.Is(err, ErrRunsMismatch) {
		t.Fatalf("error %v, want ErrRunsMismatch", err)
	}
	if a.Evicted() || len(iv.names()) > 0 {
		t.Errorf("a evicted %v, hooks %v", a.Evicted(), iv.names())
	}
}

// TestEvictThenFail: an allocation that fails after evicting rolls back
// as any failure does (its queue restored, nothing of it allocated), and
// the error names the victims, whose hooks are called: freed memory
// cannot be given back.
func TestEvictThenFail(t *testing.T) {
	m, dev, _ := newManager(t, 64*MiB)
	var iv invalidations
	a := register(t, m, ClientOptions{Name: "a", Group: "a", OnInvalidate: iv.hook("a")})
	holdBytes(t, a, 40*int(MiB))
	big := register(t, m, ClientOptions{Name: "big", Group: "big"})
	before := free(t, m)
	dev.Faults().OOMAtAlloc(1) // the group's own array
	_, err := queueAndAllocate(t, big, map[string]ArrayRequest{"y": fixed(Uint8, 40*int(MiB))})
	if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), a.String()) {
		t.Fatalf("error %v, want ErrOutOfMemory naming %v", err, a)
	}
	if !a.Evicted() || !slices.Equal(iv.names(), []string{"a"}) {
		t.Errorf("a evicted %v, hooks %v", a.Evicted(), iv.names())
	}
	if q := big.Queued(); len(q) != 1 || big.Held() != 0 {
		t.Errorf("big: queue %v, holds %d; want its request back and nothing held", q, big.Held())
	}
	if got := free(t, m); got != before+40*MiB {
		t.Errorf("free %d after the failure, want %d (a's memory back, nothing of big's)", got, before+40*MiB)
	}
	// Once the fault is gone, the restored queue allocates.
	if _, err := big.Allocate(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestEvictUnderActiveCaps: in the Active mode eviction frees memory
// only where it lowers the plan's chunk count: not where the group's
// caps bind (evicting others cannot raise them, as cubie reasons), but
// where the device binds under the caps.
func TestEvictUnderActiveCaps(t *testing.T) {
	for name, tc := range map[string]struct {
		proportion float64 // the requester's; its cap binds below the 24 MiB free at 0.25
		evicted    bool
		chunks     int
	}{
		"the cap binds: nothing evicted":              {proportion: 0.25, evicted: false, chunks: 2},
		"the device binds under the cap: one evicted": {proportion: 0.5, evicted: true, chunks: 1},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB, WithLimitMode(Active))
			var iv invalidations
			idle := register(t, m, ClientOptions{Name: "idle", Group: "other", OnInvalidate: iv.hook("idle")}) // the auto pool: all of it, for now
			holdBytes(t, idle, 40*int(MiB))
			c := register(t, m, ClientOptions{Name: "c", Group: "g", Proportion: tc.proportion, OnInvalidate: iv.hook("c")})
			resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"x": req(Uint8, 0, 30*int(MiB))})
			if err != nil {
				t.Fatal(err)
			}
			if idle.Evicted() != tc.evicted || resp.Plan.Chunks != tc.chunks || c.Held() > c.Cap() {
				t.Errorf("evicted %v, %d chunks, held %d of a %d cap; want evicted %v, %d chunks", idle.Evicted(), resp.Plan.Chunks, c.Held(), c.Cap(), tc.evicted, tc.chunks)
			}
		})
	}
}
