package broker

// Transport credentials that read the peer's pid and uid from the Unix
// socket (SO_PEERCRED on Linux): the broker's only authentication. The
// socket's file mode says who may connect (socket.go); the credentials
// say who each connection is, so that a lease is changed or released only
// by its own process, or by root. Nothing is encrypted: the socket never
// leaves the node.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"

	"google.golang.org/grpc/credentials"
)

// peerCred is a connection's peer as the kernel reports it.
type peerCred struct {
	pid, uid, gid uint32
}

func (peerCred) AuthType() string { return "peercred" }

// peerCredentials reads peerCred in the server's handshake; on the client
// it does nothing (the client trusts the socket's path).
type peerCredentials struct{}

var _ credentials.TransportCredentials = peerCredentials{}

func (peerCredentials) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerCred{}, nil
}

func (peerCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, nil, fmt.Errorf("broker: connection of %T: want a Unix socket", c)
	}
	cred, err := readPeerCred(sc)
	if err != nil {
		return nil, nil, err
	}
	if cred.pid == 0 {
		// The kernel reports pid 0 for a peer in a pid namespace the
		// broker cannot see: every such process would look alike.
		return nil, nil, errors.New("broker: the peer's pid is not visible from the broker's pid namespace; run the broker in the host's (hostPID: true in Kubernetes)")
	}
	return c, cred, nil
}

func (peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p peerCredentials) Clone() credentials.TransportCredentials { return p }
func (peerCredentials) OverrideServerName(string) error           { return nil }

// limitListener closes connections past its slots as they are accepted,
// so that a client opening many cannot exhaust the broker.
type limitListener struct {
	net.Listener
	slots chan struct{}
	log   *slog.Logger
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			uc, ok := c.(*net.UnixConn)
			if !ok {
				_ = c.Close()
				<-l.slots
				return nil, errors.New("broker: accepted a connection that is not a Unix socket")
			}
			return &limitedConn{UnixConn: uc, release: func() { <-l.slots }}, nil
		default:
			l.log.Warn("vram broker: connection refused: the limit of connections is reached", "limit", cap(l.slots))
			_ = c.Close()
		}
	}
}

// limitedConn gives its slot back when closed.
type limitedConn struct {
	*net.UnixConn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.UnixConn.Close()
	c.once.Do(c.release)
	return err
}
