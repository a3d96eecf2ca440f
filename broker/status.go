package broker

// Status: what `vram broker status` prints, the metrics read and tests
// compare. The server builds the protocol's StatusReply under its lock;
// Status is the same in Go types (JSON field names are the command's
// --json output).

import (
	"fmt"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
)

// Status describes a broker: each device and its leases.
type Status struct {
	Broker  string         `json:"broker"` // the instance id, new at every start
	Devices []DeviceStatus `json:"devices"`
}

// DeviceStatus is one device. Sizes are bytes.
type DeviceStatus struct {
	Index      int           `json:"index"`
	Name       string        `json:"name"`
	ID         string        `json:"id,omitempty"` // device.Info.ID
	Total      uint64        `json:"total_bytes"`
	Context    uint64        `json:"context_bytes"`    // a process's context
	Guaranteed uint64        `json:"guaranteed_bytes"` // Σ guaranteed parts: never over Total
	Granted    uint64        `json:"granted_bytes"`    // Σ limits
	Held       uint64        `json:"held_bytes"`       // Σ held, contexts included
	Free       uint64        `json:"free_bytes"`       // neither granted nor held
	Leases     []LeaseStatus `json:"leases"`
	Claims     []ClaimStatus `json:"claims"` // waiting for memory
}

// LeaseStatus is one lease.
type LeaseStatus struct {
	ID         string  `json:"id"` // 16 hex digits
	PID        uint32  `json:"pid"`
	UID        uint32  `json:"uid"`
	Name       string  `json:"name"`
	Proportion float64 `json:"proportion"` // as asked; 0 with Auto
	Auto       bool    `json:"auto"`
	Cap        uint64  `json:"cap_bytes"` // 0: none
	Share      float64 `json:"share"`     // its proportion of the device now
	Guaranteed uint64  `json:"guaranteed_bytes"`
	Limit      uint64  `json:"limit_bytes"`
	Borrowed   uint64  `json:"borrowed_bytes"` // occupied beyond the guaranteed part
	Held       uint64  `json:"held_bytes"`     // as reported, context excluded
	Context    uint64  `json:"context_bytes"`  // its process's context, when charged here
	// Reclaim is the request to shrink in flight, if any.
	Reclaim         *Reclaim `json:"reclaim,omitempty"`
	MissedDeadlines uint64   `json:"missed_deadlines"`
}

// Holds is what the lease occupies on the device: held plus context.
func (l LeaseStatus) Holds() uint64 { return l.Held + l.Context }

// Reclaim is a request to shrink.
type Reclaim struct {
	Target   uint64    `json:"target_bytes"`
	Deadline time.Time `json:"deadline"`
	Overdue  bool      `json:"overdue"`
}

// ClaimStatus is a claim waiting for memory.
type ClaimStatus struct {
	Lease    string    `json:"lease"`
	Limit    uint64    `json:"limit_bytes"`
	Since    time.Time `json:"since"`
	Deadline time.Time `json:"deadline"`
}

// Status describes the server's devices and leases now.
func (s *Server) Status() Status { return statusFromPB(s.statusReply()) }

// statusReply builds the protocol's status under mu.
func (s *Server) statusReply() *brokerpb.StatusReply {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &brokerpb.StatusReply{Broker: s.id}
	for _, d := range s.devices {
		ds := &brokerpb.DeviceStatus{Device: deviceInfo(d), FreeBytes: d.free()}
		for _, l := range d.sortedLeases() {
			v := d.view(l)
			ls := &brokerpb.LeaseStatus{LeaseId: l.id, Pid: l.sess.pid, Uid: l.sess.uid, Name: l.name,
				Proportion: l.asked, CapBytes: l.cap, Share: v.share, GuaranteedBytes: v.guaranteed,
				LimitBytes: l.limit, BorrowedBytes: d.borrowed(l), HeldBytes: l.held, ContextBytes: l.ctx,
				MissedDeadlines: l.missed}
			if r := l.reclaim; r != nil {
				ls.Reclaim = &brokerpb.Reclaim{Id: r.id, TargetBytes: r.target, DeadlineUnixNano: r.deadline.UnixNano(), Overdue: r.overdue}
			}
			ds.GuaranteedBytes += v.guaranteed
			ds.GrantedBytes += l.limit
			ds.HeldBytes += l.usage()
			ds.Leases = append(ds.Leases, ls)
		}
		for _, c := range d.claims {
			ds.Claims = append(ds.Claims, &brokerpb.ClaimStatus{LeaseId: c.l.id, LimitBytes: c.want,
				SinceUnixNano: c.since.UnixNano(), DeadlineUnixNano: c.deadline.UnixNano()})
		}
		out.Devices = append(out.Devices, ds)
	}
	return out
}

func leaseID(id uint64) string { return fmt.Sprintf("%016x", id) }

// statusFromPB converts the protocol's status.
func statusFromPB(r *brokerpb.StatusReply) Status {
	st := Status{Broker: leaseID(r.GetBroker()), Devices: []DeviceStatus{}}
	for _, d := range r.GetDevices() {
		ds := DeviceStatus{Index: int(d.GetDevice().GetIndex()), Name: d.GetDevice().GetName(),
			ID: d.GetDevice().GetId(), Total: d.GetDevice().GetTotalBytes(), Context: d.GetDevice().GetContextBytes(),
			Guaranteed: d.GetGuaranteedBytes(), Granted: d.GetGrantedBytes(), Held: d.GetHeldBytes(),
			Free: d.GetFreeBytes(), Leases: []LeaseStatus{}, Claims: []ClaimStatus{}}
		for _, l := range d.GetLeases() {
			ls := LeaseStatus{ID: leaseID(l.GetLeaseId()), PID: l.GetPid(), UID: l.GetUid(), Name: l.GetName(),
				Proportion: l.GetProportion(), Auto: l.GetProportion() == 0, Cap: l.GetCapBytes(), Share: l.GetShare(),
				Guaranteed: l.GetGuaranteedBytes(), Limit: l.GetLimitBytes(), Borrowed: l.GetBorrowedBytes(),
				Held: l.GetHeldBytes(), Context: l.GetContextBytes(), MissedDeadlines: l.GetMissedDeadlines()}
			if r := l.GetReclaim(); r != nil {
				ls.Reclaim = &Reclaim{Target: r.GetTargetBytes(), Deadline: time.Unix(0, r.GetDeadlineUnixNano()), Overdue: r.GetOverdue()}
			}
			ds.Leases = append(ds.Leases, ls)
		}
		for _, c := range d.GetClaims() {
			ds.Claims = append(ds.Claims, ClaimStatus{Lease: leaseID(c.GetLeaseId()), Limit: c.GetLimitBytes(),
				Since: time.Unix(0, c.GetSinceUnixNano()), Deadline: time.Unix(0, c.GetDeadlineUnixNano())})
		}
		st.Devices = append(st.Devices, ds)
	}
	return st
}
