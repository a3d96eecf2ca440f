package broker

// Admission: which connections the broker serves.
//
// Every connection is accepted, its peer's credentials are read
// (SO_PEERCRED) and it is counted against its uid before a byte of it is
// read, so that no user can take the broker from the others:
//   - past Config.MaxConns in all it is closed at once: the client
//     retries with backoff, then says the broker is full;
//   - past Config.MaxConnsPerUID of its uid, or from a pid the broker
//     cannot see, it is refused: it is served only to answer its calls
//     with the reason, and it is closed after refuseLinger. A uid has at
//     most refusedPerUID such connections at once; the rest are closed at
//     once;
//   - a connection must send its preface within Config.HandshakeTimeout,
//     and one with no call in progress for Config.IdleTimeout is closed
//     (a Client always has its watch open, so only a connection that
//     never speaks is idle).
//
// A connection's counts are given back, and its session (and so its
// leases) ended, when it closes.

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"
)

const (
	// refuseLinger is how long a refused connection is kept open for its
	// client to read why.
	refuseLinger = 2 * time.Second
	// refusedPerUID bounds the refused connections of a uid kept open at
	// once.
	refusedPerUID = 4
)

// admission counts the connections served, in all and per uid, and
// makes and ends their sessions.
type admission struct {
	srv              *Server
	maxConns, perUID int
	log              *slog.Logger

	mu    sync.Mutex // protects the fields below
	conns int
	byUID map[uint32]*uidConns
}

// uidConns are one uid's connections. Protected by admission.mu.
type uidConns struct{ served, refused int }

// accept accepts the next connection of ln that it admits, with its
// session.
func (a *admission) accept(ln net.Listener) (*admittedConn, error) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil, err
		}
		uc, ok := c.(*net.UnixConn)
		if !ok {
			_ = c.Close()
			return nil, errors.New("broker: accepted a connection that is not a Unix socket")
		}
		if ac := a.admit(uc); ac != nil {
			ac.cred.sess = a.srv.openSession(ac.cred)
			return ac, nil
		}
		_ = uc.Close()
	}
}

// admit reads c's credentials and counts it: the connection to serve
// (refused or not), or nil to close at once.
func (a *admission) admit(c *net.UnixConn) *admittedConn {
	cred, err := readPeerCred(c)
	if err != nil {
		a.log.Warn("vram broker: connection refused", "err", err)
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conns >= a.maxConns {
		a.log.Warn("vram broker: connection closed: the limit of connections is reached", "limit", a.maxConns, "uid", cred.uid, "pid", cred.pid)
		return nil
	}
	u := a.byUID[cred.uid]
	if u == nil {
		u = &uidConns{}
		a.byUID[cred.uid] = u
	}
	switch {
	case cred.pid == 0:
		// The kernel reports pid 0 for a peer in a pid namespace the
		// broker cannot see: every such process would look alike.
		cred.refused = errorf(ErrPermission, "the broker cannot see the pid of this process from its pid namespace: run the broker in the host's (hostPID: true in Kubernetes)")
	case u.served >= a.perUID:
		cred.refused = errorf(ErrLimit, "uid %d has %d connections to the broker, its limit per uid: close some (each broker client is one), or raise the broker's limit (vram broker --max-conns-per-uid)",
			cred.uid, u.served)
	}
	if cred.refused != nil {
		if u.refused >= refusedPerUID {
			a.log.Warn("vram broker: connection closed", "uid", cred.uid, "pid", cred.pid, "why", cred.refused)
			a.forgetLocked(cred.uid, u)
			return nil
		}
		u.refused++
	} else {
		u.served++
	}
	a.conns++
	ac := &admittedConn{UnixConn: c, a: a, cred: cred}
	if cred.refused != nil {
		a.log.Warn("vram broker: connection refused", "uid", cred.uid, "pid", cred.pid, "why", cred.refused)
		time.AfterFunc(refuseLinger, func() { _ = ac.Close() })
	}
	return ac
}

// release gives back what cred's connection counted.
func (a *admission) release(cred peerCred) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.conns--
	u := a.byUID[cred.uid]
	if cred.refused != nil {
		u.refused--
	} else {
		u.served--
	}
	a.forgetLocked(cred.uid, u)
}

func (a *admission) forgetLocked(uid uint32, u *uidConns) {
	if u.served == 0 && u.refused == 0 {
		delete(a.byUID, uid)
	}
}

// served is how many connections of uid are served now (for tests).
func (a *admission) served(uid uint32) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if u := a.byUID[uid]; u != nil {
		return u.served
	}
	return 0
}

// admittedConn is an admitted connection; closing it gives back its
// counts, once.
type admittedConn struct {
	*net.UnixConn
	a    *admission
	cred peerCred
	once sync.Once
}

func (c *admittedConn) Close() error {
	err := c.UnixConn.Close()
	c.once.Do(func() {
		c.a.release(c.cred)
		if c.cred.sess != nil {
			c.a.srv.endSession(c.cred.sess)
		}
	})
	return err
}
