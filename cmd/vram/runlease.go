// vram run's manager and its budget: a cap, or a lease from the node
// broker (--socket, $VRAM_BROKER), and the lease's line in the report.
// The lease itself (its cap, claims, shrinks) is the library's
// (vram.WithLease of broker.At).

package main

import (
	"fmt"
	"io"
	"os"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/internal/units"
)

// capOptions are the manager's options for its budget: with --socket, a
// lease (capped at limit, --vram on a GPU, when not 0); without, a cap of
// limit.
func (f runFlags) capOptions(limit uint64) []vram.Option {
	if f.broker != "" {
		return []vram.Option{vram.WithLease(vram.LeaseOptions{Broker: broker.At(f.broker), Name: "vram run", Cap: limit})}
	}
	if limit > 0 {
		return []vram.Option{vram.WithCap(limit)}
	}
	return nil
}

// leaseJSON is the manager's lease as the report gives it (vram.LeaseStats).
type leaseJSON struct {
	ID               string  `json:"id"`
	Bytes            uint64  `json:"bytes"`
	Guaranteed       uint64  `json:"guaranteed_bytes"`
	Borrowed         uint64  `json:"borrowed_bytes"`
	Held             uint64  `json:"held_bytes"`
	Claims           int     `json:"claims"`
	ClaimWaitSeconds float64 `json:"claim_wait_seconds"`
	Refused          int     `json:"refused"`
	Shrinks          int     `json:"shrinks"`
	ShrinkAckSeconds float64 `json:"shrink_ack_seconds"` // the longest, from the request to the report within it
	Evicted          int     `json:"evicted"`
	GaveBack         int     `json:"gave_back"`
}

// leaseOf is m's lease for the report, or nil without one.
func leaseOf(m *vram.Manager) *leaseJSON {
	s, ok := m.Lease()
	if !ok {
		return nil
	}
	return &leaseJSON{ID: s.ID, Bytes: s.Bytes, Guaranteed: min(s.Guaranteed, s.Bytes), Borrowed: s.Bytes - min(s.Guaranteed, s.Bytes), Held: s.Held, Claims: s.Claims, ClaimWaitSeconds: s.ClaimWait.Seconds(),
		Refused: s.Refused, Shrinks: s.Shrinks, ShrinkAckSeconds: s.ShrinkAck.Seconds(), Evicted: s.Evicted, GaveBack: s.GaveBack}
}

// printLease writes the report's lease line, if the job had a lease.
func printLease(w io.Writer, l *leaseJSON) {
	if l == nil {
		return
	}
	fmt.Fprint(w, "lease        ")
	printLeaseFigures(w, l)
}

// printLeaseFigures writes l's figures, after the line's label.
func printLeaseFigures(w io.Writer, l *leaseJSON) {
	fmt.Fprintf(w, "%s: %s (%s guaranteed, %s borrowed), %s held at the end\n",
		l.ID, units.Format(l.Bytes), units.Format(l.Guaranteed), units.Format(l.Borrowed), units.Format(l.Held))
	fmt.Fprintf(w, "             %s (%.3f s waiting, %d refused or cut short), %s to shrink answered (the longest in %.3f s), given back %s\n",
		plural(l.Claims, "claim"), l.ClaimWaitSeconds, l.Refused, plural(l.Shrinks, "request"), l.ShrinkAckSeconds, plural(l.GaveBack, "time"))
}

// defaultBroker is --socket's default: $VRAM_BROKER ("": none).
func defaultBroker() string { return os.Getenv(vram.BrokerEnv) }
