// Package broker divides the memory of a node's devices between its
// processes: a daemon (Server, `vram broker`) on a Unix socket, speaking
// the framed protocol of brokerpb/broker.proto (wire.go), and its client
// (Dial, Lease).
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
// included. A restarted broker rebuilds its table from the clients that
// reconnect: a Client redials with backoff and rejoins each lease with
// what it holds, so no lease is counted twice.
//
// The trust model. Who may do what, and what keeps it so:
//   - Who may connect is the socket's file mode (0600: the broker's user;
//     0660: and a group), in a directory the broker's user alone may write
//     (Listen refuses any other), so no one can swap the socket. Each
//     connection's pid and uid come from the kernel (SO_PEERCRED) as it is
//     accepted.
//   - A lease is owned by the connection that acquired it: only that
//     connection claims, reports, changes or releases it. Not another
//     connection of the same process or uid, and not root: on a node where
//     every container runs as root, root is anyone.
//   - After a broker restart a lease is taken back only with its token,
//     a secret the broker hands its holder at acquire (an HMAC of its id,
//     its uid and the broker's instance under the broker's key), never by
//     its pid or its id, which status shows to all. A rejoin is taken
//     only after a restart the client saw (the token names another
//     instance), or to replace its own user's entry of the id; an entry
//     another uid made of the id since the restart is ended. What a
//     rejoin holds is counted whether or not it fits.
//   - Anyone admitted may read the status: every lease's name, pid, uid
//     and figures, never a token.
//   - Limits bound each uid, root's included (connections, leases), each
//     connection (leases, waiting calls, message size) and the broker (its
//     connections, its leases); a connection that does not finish its
//     handshake in time, or makes no call for a while, is closed. A uid at
//     its limit is refused with an error naming it; the others are served.
//   - A client talks only to a broker of root or of its own user (the
//     server's uid, by SO_PEERCRED).
//   - One device, one broker: each device is locked by its identity, so a
//     second broker of the user on it is refused.
//
// In Kubernetes (deploy/kubernetes) every pod may run as root; pods are
// kept apart by the same rules (a lease is its connection's; a rejoin
// needs its token), mount the socket's directory read-only, so that none
// can swap the socket (connecting to a socket needs no write to its file
// system), and never see the broker's key, which lives in a directory of
// the broker's alone (Config.KeyFile; --key-file): root reads any file it
// can reach, and the key makes every token.
//
// The package owns the table, the protocol and the client; it opens no
// device (a Device states its total and context, as device.Info does) and
// knows nothing of managers or batches: a vram manager that follows a
// lease is built on Lease's Budget, Changed, Claim and Report.
package broker
