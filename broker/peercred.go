package broker

// Transport credentials that hand gRPC the peer's pid and uid, read from
// the Unix socket (SO_PEERCRED on Linux) as the connection was accepted
// (conns.go): the broker's only authentication. The socket's file mode
// says who may connect (socket.go); the credentials say who each
// connection is: its uid's limits, its process's context. Which leases a
// connection may touch is its own business (ops.go). Nothing is
// encrypted: the socket never leaves the node.

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"
)

// peerCred is a connection's peer as the kernel reports it, and the
// broker's answer to it.
type peerCred struct {
	pid, uid, gid uint32
	refused       error    // why the connection is refused (it is told at its first call), or nil
	sess          *session // the connection's session (conns.go)
}

func (peerCred) AuthType() string { return "peercred" }

// peerCredentials reads peerCred in the server's handshake; on the client
// it does nothing (the client trusts the socket's path).
type peerCredentials struct{}

var _ credentials.TransportCredentials = peerCredentials{}

func (peerCredentials) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerCred{}, nil
}

// ServerHandshake hands on what admit found of the connection when it
// was accepted.
func (peerCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	ac, ok := c.(*admittedConn)
	if !ok {
		return nil, nil, fmt.Errorf("broker: connection of %T: want one the broker's listener accepted", c)
	}
	return c, ac.cred, nil
}

func (peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p peerCredentials) Clone() credentials.TransportCredentials { return p }
func (peerCredentials) OverrideServerName(string) error           { return nil }
