package batch

// Run's work marks: a batch marks work begun on the clients whose
// arrays it moves (and the client whose group runs it) for as long as it
// runs, so that eviction never takes them mid-batch.

import (
	"errors"
	"fmt"
	"github.com/vramkit/vram"
)

// markBatch begins a work mark on c and on the owner of every array of b,
// and on every other member of c's group that holds arrays (a compute
// step may use its scratch arrays through Chunk.Array); end ends them
// all. If an owner's cannot begin (a client evicted or closed), the
// marks begun are ended and its error returned; another member that
// cannot be marked (evicted or closed meanwhile) is passed over.
func markBatch(c *vram.Client, b Batch) (end func() error, err error) {
	var marks []*vram.Work
	end = func() error {
		var errs []error
		for _, w := range marks {
			errs = append(errs, w.End())
		}
		return errors.Join(errs...)
	}
	seen := map[*vram.Client]bool{}
	owners := []*vram.Client{c}
	for _, a := range b.Arrays {
		if a.resp != nil && a.resp.Client != nil {
			owners = append(owners, a.resp.Client)
		}
	}
	for _, o := range owners {
		if seen[o] {
			continue
		}
		seen[o] = true
		w, err := o.BeginWork()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("batch: mark work on %v: %w", o, err), end())
		}
		marks = append(marks, w)
	}
	for _, o := range c.Manager().GroupMembers(c.Group()) {
		if seen[o] || o.Held() == 0 {
			continue
		}
		seen[o] = true
		if w, err := o.BeginWork(); err == nil {
			marks = append(marks, w)
		}
	}
	return end, nil
}
