package batch

// A run's work marks: a batch marks work begun on its clients (and on
// every other member of their group that holds arrays) for as long as it
// runs, so that eviction never takes them mid-batch.

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram"
)

// markBatch begins a work mark on every client of b, and on every other
// member of their group that holds arrays (a compute step may use arrays
// the batch does not declare); end ends them all. If a client of b
// cannot begin one (evicted or closed), the marks begun are ended and
// its error returned; another member that cannot be marked (evicted or
// closed meanwhile) is passed over.
func markBatch(b *Batch) (end func() error, err error) {
	var marks []*vram.Work
	end = func() error {
		var errs []error
		for _, w := range marks {
			errs = append(errs, w.End())
		}
		return errors.Join(errs...)
	}
	seen := map[*vram.Client]bool{}
	for _, a := range b.arrays {
		if seen[a.client] {
			continue
		}
		seen[a.client] = true
		w, err := a.client.BeginWork()
		if err != nil {
			return nil, errors.Join(fmt.Errorf("batch: mark work on %v: %w", a.client, err), end())
		}
		marks = append(marks, w)
	}
	c := b.arrays[0].client
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
