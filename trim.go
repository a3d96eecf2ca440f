package vram

// When Allocate gives the allocator's cache back to the device.
//
// A trim waits for work: every stream that owns cached blocks must reach
// the frees that cached them before their pages go back, and a device
// free waits for all the device's work (cuMemFree synchronizes; so does
// the simulator). That work may be another group's, a long kernel
// included. So Allocate plans with the device's free memory as it is,
// the cache left alone, and trims only when the plan falls short for
// want of memory: it fails, or it has more chunks than it would with the
// cached bytes given back. Then it trims once and plans again. The trim
// waits no longer than Allocate's context: when the context ends first,
// Allocate fails with its error and the trim finishes in the background
// (SetAllocator and Close wait for it before closing the allocator).

import (
	"context"
	"errors"
	"fmt"

	"github.com/vramkit/vram/alloc"
)

// trimRun is a trim of the allocator in flight.
type trimRun struct {
	done chan struct{} // closed when the trim has returned
	err  error         // its error, once done
}

// trimCtx trims the allocator, or joins the trim in flight, waiting no
// longer than ctx. allocMu must be held for reading; a trim that ctx
// abandons goes on, under m.trims, and the next trimCtx joins it.
func (m *Manager) trimCtx(ctx context.Context) error {
	m.mu.Lock()
	run := m.trim
	if run == nil {
		run = &trimRun{done: make(chan struct{})}
		m.trim = run
		al := m.al
		m.trims.Add(1)
		go func() {
			defer m.trims.Done()
			err := al.Trim()
			m.mu.Lock()
			run.err, m.trim = err, nil
			m.mu.Unlock()
			close(run.done)
		}()
	}
	m.mu.Unlock()
	select {
	case <-run.done:
		return trimErr(run.err)
	case <-ctx.Done():
		return fmt.Errorf("trim the allocator's cache (it waits for the work of the streams its cached blocks were last used on, other groups' too): %w", ctx.Err())
	}
}

// trimming reports whether a trim is in flight.
func (m *Manager) trimming() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.trim != nil
}

func trimErr(err error) error {
	if err != nil && !errors.Is(err, alloc.ErrClosed) {
		return fmt.Errorf("trim the allocator: %w", err)
	}
	return nil
}

// cached is the allocator's cached bytes: held from the device, not in
// use.
func (m *Manager) cached() uint64 { return m.al.Stats().Cached() }

// forWantOfMemory reports whether a plan's error says the budget was too
// small (rather than that the requests are bad).
func forWantOfMemory(err error) bool {
	var pe *PlanError
	return errors.As(err, &pe) || errors.Is(err, ErrUnchunkable) ||
		errors.Is(err, ErrRunTooLarge) || errors.Is(err, ErrOutOfMemory)
}

// trimWouldHelp reports whether giving the cache back could improve on
// the plan just made against b (err its error): it failed for want of
// memory, or planning with the cached bytes counted free gives fewer
// chunks.
func (tx *allocTx) trimWouldHelp(err error, cached uint64) bool {
	if cached == 0 && !tx.m.trimming() {
		return false
	}
	if err != nil {
		return forWantOfMemory(err)
	}
	if tx.plan.Chunks <= 1 {
		return false
	}
	gb := tx.gb
	gb.giveBack(cached)
	p, perr := planGroup(tx.q, &gb, PlanOptions{Granularity: gb.gran, Buffers: tx.ac.buffers})
	return perr == nil && p.Chunks < tx.plan.Chunks
}

// planOnce reads the budget and plans the group against the allocator's
// stated cost, trimming the allocator's cache and planning again only
// when that could help (trim.go); errors say what bounds the budget.
func (tx *allocTx) planOnce() error {
	tx.gb.trimmed = false
	err := tx.planBudget()
	if cached := tx.m.cached(); tx.trimWouldHelp(err, cached) {
		if terr := tx.m.trimCtx(tx.ac.ctx); terr != nil {
			return fmt.Errorf("allocate group %q: %w", tx.group, terr)
		}
		tx.gb.trimmed = true
		err = tx.planBudget()
	}
	return err
}
