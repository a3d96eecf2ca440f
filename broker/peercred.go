package broker

// The peer's credentials: a connection's pid and uid, read from the Unix
// socket (SO_PEERCRED on Linux) as the connection was accepted
// (conns.go), the broker's only authentication. The socket's file mode
// says who may connect (socket.go); the credentials say who each
// connection is: its uid's limits, its process's context. Which leases a
// connection may touch is its own business (ops.go). Nothing is
// encrypted: the socket never leaves the node.

// peerCred is a connection's peer as the kernel reports it, and the
// broker's answer to it.
type peerCred struct {
	pid, uid, gid uint32
	refused       error    // why the connection is refused (it is told at its first call), or nil
	sess          *session // the connection's session (conns.go)
}
