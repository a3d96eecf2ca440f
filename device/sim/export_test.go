package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram/internal/meminfo"
)

// CheckInvariants verifies the device's internal bookkeeping (tests only):
// pool segments are tiled by their blocks, no two ready neighbours are left
// uncoalesced, every free block is in exactly the index of its class, the
// pool's and the device's byte counts add up, and every piece of a freed
// allocation's record lies inside it.
func (d *Device) CheckInvariants() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := &d.pool
	var reserved, used uint64
	nUsed, nReady, nPending, segs := 0, 0, 0, 0
	pend := map[*stream]int{}
	var err error
	d.live.each(func(n *tnode[rec]) bool {
		if n.v.kind != kSegment {
			return true
		}
		seg := n.v.seg
		segs++
		reserved += seg.size
		first := p.blocks.get(seg.start, 0)
		if first == nil {
			err = fmt.Errorf("segment 0x%x has no first block", seg.start)
			return false
		}
		at := seg.start
		var prev *block
		for b := first.v; b != nil; b = b.next {
			if b.start != at || b.seg != seg || b.prev != prev {
				err = fmt.Errorf("segment 0x%x: block 0x%x breaks the tiling at 0x%x", seg.start, b.start, at)
				return false
			}
			if p.blocks.get(b.start, 0) == nil {
				err = fmt.Errorf("block 0x%x missing from the address index", b.start)
				return false
			}
			switch b.state {
			case bUsed:
				nUsed++
				used += b.size
			case bReady:
				nReady++
				if prev != nil && prev.state == bReady {
					err = fmt.Errorf("ready blocks 0x%x and 0x%x not coalesced", prev.start, b.start)
					return false
				}
				if nd := p.ready.get(b.size, b.start); nd == nil || nd.v != b {
					err = fmt.Errorf("ready block 0x%x missing from the ready index", b.start)
					return false
				}
				if (b.size == seg.size) != seg.inEmpty {
					err = fmt.Errorf("segment 0x%x: empty-list membership %v wrong", seg.start, seg.inEmpty)
					return false
				}
			case bPending:
				nPending++
				pend[b.s]++
				if nd := b.s.pend.get(b.size, b.start); nd == nil || nd.v != b {
					err = fmt.Errorf("pending block 0x%x missing from its stream's index", b.start)
					return false
				}
			default:
				err = fmt.Errorf("block 0x%x in state %d", b.start, b.state)
				return false
			}
			at += b.size
			prev = b
		}
		if at != seg.start+seg.size {
			err = fmt.Errorf("segment 0x%x: blocks end at 0x%x, not 0x%x", seg.start, at, seg.start+seg.size)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	switch {
	case reserved != p.reserved || segs != p.nSeg:
		return fmt.Errorf("pool reserved %d in %d segments, counted %d in %d", p.reserved, p.nSeg, reserved, segs)
	case used != p.used || nUsed != p.nUsed:
		return fmt.Errorf("pool used %d in %d blocks, counted %d in %d", p.used, p.nUsed, used, nUsed)
	case p.ready.len() != nReady:
		return fmt.Errorf("ready index holds %d, counted %d", p.ready.len(), nReady)
	case p.blocks.len() != nUsed+nReady+nPending:
		return fmt.Errorf("address index holds %d blocks, counted %d", p.blocks.len(), nUsed+nReady+nPending)
	}
	for s, n := range pend {
		if s.pend.len() != n {
			return fmt.Errorf("%v's pending index holds %d, counted %d", s, s.pend.len(), n)
		}
	}
	d.ghosts.each(func(g *tnode[ghost]) bool {
		if g.span == 0 || g.k1 < g.v.start || g.k1+g.span > g.v.start+g.v.size || g.k2 != g.v.id {
			err = fmt.Errorf("ghost node (0x%x, #%d) of %d bytes lies outside freed allocation #%d (%d bytes at 0x%x)",
				g.k1, g.k2, g.span, g.v.id, g.v.size, g.v.start)
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if free := d.freeLocked(); free > d.cfg.TotalBytes {
		return fmt.Errorf("free memory %d underflowed", free)
	}
	if l := d.shared; l != nil && !d.closed.Load() {
		held := d.cfg.ContextBytes + d.mallocBytes + p.reserved + d.vm.physBytes
		if l.mine != held || l.word(l.slot, slotUsed).Load() != held {
			return fmt.Errorf("shared slot %d holds %d (word %d), the device %d", l.slot, l.mine, l.word(l.slot, slotUsed).Load(), held)
		}
	}
	return nil
}

// SetLockWait sets how long a shared device waits for its ledger's lock,
// until the test ends.
func SetLockWait(t testing.TB, d time.Duration) {
	old := lockWait
	lockWait = d
	t.Cleanup(func() { lockWait = old })
}

// LedgerFileSize is the size of a ledger file.
const LedgerFileSize = ledgerFileSize

// SweepEvery is how old a sweep may be before MemInfo sweeps again.
const SweepEvery = sweepEvery

// HeldRegions reports how many address regions open devices hold, and
// how many bytes of addresses (tests only).
func HeldRegions() (n int, bytes uint64) {
	regions.mu.Lock()
	defer regions.mu.Unlock()
	return regions.owned.len(), regions.nOwned
}

// HostRAM is the host's RAM as the default pinned limit reads it.
var HostRAM = meminfo.RAM

// OpenStreams is how many streams the device lists as open (tests only).
func (d *Device) OpenStreams() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.streams)
}

// timedAttempts is how many times a timing check is tried before it
// fails: one run on a loaded machine may be stretched by the scheduler,
// three in a row seldom are, and a real defect fails them all.
const timedAttempts = 3

// retryTimed runs attempt until it returns "" (passed), at most
// timedAttempts times, and fails t with every attempt's complaint if none
// passed. Only load-sensitive bounds (an upper bound on a duration, an
// overlap) belong in attempt; what no load can break (a copy taking at
// least its emulated time, an order of events) is checked outright.
func retryTimed(t testing.TB, attempt func() string) {
	t.Helper()
	var why []string
	for i := range timedAttempts {
		msg := attempt()
		if msg == "" {
			if i > 0 {
				t.Logf("passed at attempt %d of %d after: %s", i+1, timedAttempts, strings.Join(why, "; "))
			}
			return
		}
		why = append(why, msg)
	}
	t.Errorf("all %d attempts failed: %s", timedAttempts, strings.Join(why, "; "))
}

// RetryTimed is retryTimed, for the package's external tests.
var RetryTimed = retryTimed
