package alloc

// Pool's growth, giving back and reset hooks (the strategy interface of
// core.go), and its out-of-memory account. Rules:
//
//   - A growth asks for segmentSizeLocked's size (or, for AllocExact,
//     the request rounded to the device's granularity); on the device's
//     out of memory it falls back to the request's exact size.
//   - Only segments whose blocks are all free go back to the device; one
//     a stream still owns goes back before a growth only after a fence
//     round (fenceBeforeGrowthLocked), on Trim and on out of memory at
//     once (the device's Free waits for the work that may use it).
//   - A device reset (dropGenerationLocked) takes every segment: free
//     blocks leave the index at once, a segment with no live block leaves
//     the books as a device free without a device call, one with live
//     blocks goes to stale with its free bytes out of Reserved, and leaves
//     the books with its last live block (freeStaleLocked). The growth
//     policy starts afresh, as on a new device.

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// ownSegment reports whether a request of size bytes gets a segment of its
// own: it is at least LargeSize and rounding it up to the device's
// granularity wastes at most 1/ownWasteDiv of it.
func (p *Pool) ownSegment(size uint64) bool {
	return size >= p.cfg.LargeSize && roundUp(size, p.gran)-size <= size/ownWasteDiv
}

// segmentSizeLocked is the growth policy (see pool.go's overview): the
// bytes to ask the device for to serve a request of size bytes (rounded)
// in class c.
func (p *Pool) segmentSizeLocked(size uint64, c uint8) uint64 {
	exact := roundUp(size, p.gran)
	var g uint64
	switch {
	case c == classSmall:
		// Double the small class, up to 1/smallShareDiv of the pool.
		g = max(p.cfg.SmallSegment, min(p.classRes[classSmall], p.st.Reserved/smallShareDiv))
	case p.ownSegment(size):
		return exact
	default:
		g = max(p.cfg.MediumSegment, min(p.classRes[classLarge]/p.cfg.GrowthDivisor, p.cfg.MaxMediumSegment))
	}
	return max(roundUp(g, p.gran), exact)
}

func roundUp(n, g uint64) uint64 {
	r, ok := units.RoundUp(n, g)
	if !ok {
		return math.MaxUint64 &^ (g - 1)
	}
	return r
}

// growthLocked is how many bytes a miss for r asks the device for.
func (p *Pool) growthLocked(r request) uint64 {
	if !r.exact {
		return p.segmentSizeLocked(r.size, r.class)
	}
	if r.class == classSmall {
		return roundUp(max(r.size, p.cfg.SmallSegment), p.gran)
	}
	return roundUp(r.size, p.gran)
}

// grow asks the device for a segment of g bytes for r, and on its out of
// memory for one of r's size rounded to the granularity.
func (p *Pool) grow(r request, g uint64) (*segment, uint64, error) {
	exact := roundUp(r.size, p.gran)
	base, err := p.dev.Malloc(g)
	if err != nil && g > exact && errors.Is(err, device.ErrOutOfMemory) {
		g = exact
		base, err = p.dev.Malloc(g)
	}
	if err != nil {
		return nil, g, err
	}
	return &segment{base: base, size: g, class: r.class}, g, nil
}

// addSegmentLocked books new segment seg, fresh memory safe on every
// stream, and carves r's block from it.
func (p *Pool) addSegmentLocked(seg *segment, r request) *block {
	p.classRes[seg.class] += seg.size
	p.highWater = max(p.highWater, p.st.Reserved)
	p.idx.insertShared(seg.first)
	p.markWhollyLocked(seg)
	return p.carveLocked(seg.first, r.size)
}

// detachLocked takes segment seg, all of whose blocks are free, out of the
// pool's books, ready to be freed on the device.
func (p *Pool) detachLocked(seg *segment) {
	p.unmarkWhollyLocked(seg)
	for b := seg.first; b != nil; {
		nx := b.next
		p.idx.remove(b)
		p.idx.putBlock(b)
		b = nx
	}
	p.unlinkLocked(seg)
	p.classRes[seg.class] -= seg.size
}

// releaseWantedLocked reports whether a growth of g bytes would take the
// pool past its high-water mark while it holds wholly free segments.
func (p *Pool) releaseWantedLocked(g uint64) bool {
	return !p.cfg.KeepCache && len(p.wholly) > 0 && p.st.Reserved+g > p.highWater
}

// fenceBeforeGrowthLocked reports whether a growth for r would give back
// wholly free segments of which some still wait for a stream's event.
func (p *Pool) fenceBeforeGrowthLocked(r request) bool {
	return p.releaseWantedLocked(p.growthLocked(r)) && p.ownedWhollyLocked()
}

// ownedWhollyLocked reports whether some wholly free segment still waits
// for a stream's event.
func (p *Pool) ownedWhollyLocked() bool {
	for _, seg := range p.wholly {
		if seg.first.owner != nil {
			return true
		}
	}
	return false
}

// releaseForGrowthLocked picks wholly free segments to give back before a
// growth of g bytes would raise the high-water mark, detaches them and
// returns them.
func (p *Pool) releaseForGrowthLocked(g uint64) []*segment {
	if !p.releaseWantedLocked(g) {
		return nil
	}
	cand := append([]*segment(nil), p.wholly...)
	sort.Slice(cand, func(i, j int) bool { return cand[i].size > cand[j].size })
	var out []*segment
	for _, seg := range cand {
		if p.st.Reserved+g <= p.highWater {
			break
		}
		if seg.first.owner != nil {
			// Still waiting for a stream's event: the device's Free
			// would wait for that stream's work, and a miss must not
			// block.
			continue
		}
		p.detachLocked(seg)
		out = append(out, seg)
	}
	return out
}

// trimLocked detaches every segment whose blocks are all free, and returns
// them. Blocks may still be waiting for different streams' events (so
// they have not coalesced): the device's Free waits for the work that may
// use them.
func (p *Pool) trimLocked() []*segment {
	var out []*segment
	for seg := p.segs; seg != nil; seg = seg.snext {
		all := true
		for b := seg.first; b != nil && all; b = b.next {
			all = b.free
		}
		if all {
			out = append(out, seg)
		}
	}
	for _, seg := range out {
		p.detachLocked(seg)
	}
	return out
}

// release gives detached segment seg back to the device. Called without
// the lock.
func (p *Pool) release(seg *segment) error {
	if err := p.dev.Free(seg.base); err != nil {
		return fmt.Errorf("alloc: pool: free segment %v (%s): %w", seg.base, units.Format(seg.size), err)
	}
	return nil
}

// dropGenerationLocked handles a device reset: every segment is from
// before it and its memory is gone. Its free blocks leave the free index; a segment with no live
// block leaves the books, counted as a device free; one with live blocks
// keeps only their bytes in Reserved and goes to the stale list until
// they are freed (freeStaleLocked). The growth policy starts afresh, as
// on a new device.
func (p *Pool) dropGenerationLocked() {
	for seg := p.segs; seg != nil; {
		next := seg.snext
		p.unmarkWhollyLocked(seg)
		live, liveBytes := 0, uint64(0)
		for b := seg.first; b != nil; {
			nx := b.next
			if b.free {
				p.idx.remove(b)
				p.idx.putBlock(b)
			} else {
				b.prev, b.next = nil, nil
				live++
				liveBytes += b.size
			}
			b = nx
		}
		seg.first = nil
		if live == 0 {
			seg.sprev, seg.snext = nil, nil
			p.st.deviceFreeLocked(seg.size)
		} else {
			// Only its live blocks stay in Reserved (and InUse), each
			// until it is freed: the rest of it is gone with the reset.
			p.st.Reserved -= seg.size - liveBytes
			seg.stale, seg.nlive = true, live
			seg.sprev, seg.snext = nil, p.stale
			if p.stale != nil {
				p.stale.sprev = seg
			}
			p.stale = seg
		}
		seg = next
	}
	p.segs, p.nsegs = nil, 0
	p.classRes = [numClasses]uint64{}
}

// freeStaleLocked takes back live block b of a stale segment, already out
// of the live table and InUse: its bytes leave Reserved, and the segment
// leaves the books with its last live block, counted as a device free.
func (p *Pool) freeStaleLocked(b *block) []*segment {
	seg := b.seg
	p.st.Reserved -= b.size
	p.idx.putBlock(b)
	seg.nlive--
	if seg.nlive > 0 {
		return nil
	}
	unlinkSegment(&p.stale, seg)
	p.st.DeviceFrees++ // its bytes left Reserved at the reset and with each free
	return nil
}

// closeLocked clears the pool's own books at Close and returns the
// number of stale segments, gone with a reset: nothing to free.
func (p *Pool) closeLocked() int {
	nstale := 0
	for seg := p.stale; seg != nil; seg = seg.snext {
		nstale++
	}
	p.wholly, p.stale = nil, nil
	p.classRes = [numClasses]uint64{}
	return nstale
}

// grewAcrossReset is the error of a growth a reset overtook.
func (p *Pool) grewAcrossReset(m miss, seg *segment) error {
	return fmt.Errorf("alloc: pool alloc of %s on stream %d: the device was reset while the pool grew, so the new %s segment may be from before the reset and was given back; retry on a stream made since: %w",
		units.Format(m.r.n), m.s.Handle(), units.Format(seg.size), device.ErrInvalidated)
}

// allocFailed builds the error of a miss the ladder could not serve.
// Called without the lock.
func (p *Pool) allocFailed(m miss, err error) error {
	n, size, s := m.r.n, m.r.size, m.s
	if !errors.Is(err, device.ErrOutOfMemory) {
		return errors.Join(fmt.Errorf("alloc: pool alloc of %s on stream %d: %w", units.Format(n), s.Handle(), err), m.relErr)
	}
	p.mu.Lock()
	p.st.OOMs++
	st := p.st
	largest := p.idx.largest()
	waiting := p.idx.waitingBytes(s.Handle())
	classFree := p.idx.classBytes(m.r.class)
	p.mu.Unlock()
	devFree := "unknown"
	if free, total, e := p.dev.MemInfo(); e == nil {
		devFree = units.Format(free) + " of " + units.Format(total)
	}
	asked := units.Format(n)
	if r := units.Format(size); r != asked {
		asked += " (" + r + " rounded)"
	}
	advice := p.oomAdvice(m, st, waiting, classFree)
	return errors.Join(fmt.Errorf("alloc: pool alloc of %s on stream %d failed after waiting for other streams' frees, trimming the cache and retrying: "+
		"the pool has %s allocated and %s reserved (%s cached, largest free block %s, %s of it waiting on other streams' work), the device has %s free; %s: %w",
		asked, s.Handle(),
		units.Format(st.InUse), units.Format(st.Reserved), units.Format(st.Cached()), units.Format(largest), units.Format(waiting),
		devFree, advice, err), m.relErr)
}

// oomAdvice says what to do about a failed miss, given the counters st,
// the cached bytes that wait on other streams, and the free bytes of the
// request's class.
func (p *Pool) oomAdvice(m miss, st Stats, waiting, classFree uint64) string {
	size, s := m.r.size, m.s
	advice := "free live arrays, lower the batch size, or give this pool more of the device"
	switch {
	case waiting > 0 && m.waitErr != nil:
		advice = fmt.Sprintf("%s freed on other streams cannot be used on stream %d, as waiting for those streams failed (%v); "+
			"synchronize them, or %s", units.Format(waiting), s.Handle(), m.waitErr, advice)
	case waiting > 0:
		// Freed by other goroutines while this call waited.
		advice = fmt.Sprintf("%s was freed on other streams after this call waited for them; retry, or %s",
			units.Format(waiting), advice)
	case classFree >= size:
		// Nothing waits on another stream, and the out-of-memory path
		// merged every free block this stream may use with its free
		// neighbours: live blocks lie between what is left.
		advice = fmt.Sprintf("the cache has the bytes but not in one piece: its %s of free blocks for requests of this size lie between live blocks; %s",
			units.Format(classFree), advice)
	case st.Cached() >= size:
		// Trim gave back every wholly free segment: the rest of the
		// cache is in segments of the other size class that live
		// blocks hold.
		other := "small requests (at most " + units.Format(p.cfg.SmallSize) + ")"
		if m.r.class == classSmall {
			other = "larger requests"
		}
		advice = fmt.Sprintf("the cache has the bytes but only %s of them serve requests of this size: the rest lies in segments for %s, held by live blocks; %s",
			units.Format(classFree), other, advice)
	}
	return advice
}
