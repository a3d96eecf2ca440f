// Package broker divides the memory of a node's devices between its
// processes: a daemon (Server, `vram broker`) on a Unix socket, speaking
// gRPC by the contract in brokerpb/broker.proto, and its client (Dial,
// Lease).
//
// A process leases a share of a device as a vram client registers with a
// manager, by the same rules (internal/share, one implementation for
// both): a manual proportion or the auto pool, which keeps at least 5%
// while it has leases, and an optional cap. A lease's share is its
// guaranteed part; its limit is what it may occupy now, the context its
// process pays on the device included (counted once a process and
// device). A lease may borrow beyond its guaranteed part what is free,
// when its connection watches for requests to shrink.
//
// Cooperative reclaim: when a lease claims memory of its guaranteed part
// that others borrow, the broker lowers their limits and asks each to
// shrink, by a deadline, on its Watch stream; a borrower shrinks (a vram
// batch at its next chunk boundary) and Reports what it holds, which is
// the acknowledgement. The claim waits, under its context, until the
// memory is back, or fails at the deadline with ErrReclaimTimeout naming
// who holds what; a borrower that misses the deadline is named in the
// error, in Status and in the metrics. Nothing is killed.
//
// Leases belong to their connection and end when it closes, kill -9
// included; the peer's pid and uid come from SO_PEERCRED, and a lease is
// changed or released only by its own process, or by root. Who may
// connect at all is the socket's mode (Listen). A restarted broker
// rebuilds its table from the clients that reconnect: a Client redials
// with backoff and rejoins each lease by its id with what it holds, so no
// lease is counted twice. Every request is checked, with an error naming
// the field; limits bound connections, leases per connection and in all,
// and each connection's queue of events (the latest state of each of its
// leases, never more).
//
// The package owns the table, the protocol and the client; it opens no
// device (a Device states its total and context, as device.Info does) and
// knows nothing of managers or batches: a vram manager that follows a
// lease is built on Lease's Budget, Changed, Claim and Report.
package broker
