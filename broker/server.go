package broker

// The Server: the lease table behind the broker's protocol on a Unix
// socket (serve.go).
//
// Sessions. Every connection is a session, made as it is accepted (its
// peer's pid and uid read from SO_PEERCRED, conns.go), and ended when
// the connection closes, which releases every lease it holds: a process
// that exits, kill -9 included, loses its leases as soon as the kernel
// closes its socket. A lease is its session's: no other connection may
// change or release it, root's included (ops.go); after a restart it is
// taken back only with its token (token.go).
//
// Locking. One mutex, mu, protects the table (devices, leases, claims,
// reclaims) and the sessions. Nothing holding mu writes to a connection,
// waits for a client or calls a device: a call's reply is written after
// its operation let mu go, and events to a session are marked dirty
// under mu and sent by the session's watch goroutine afterwards, so a
// client that never reads blocks only its own connection. Admission
// (conns.go) and the connections served (serve.go) have mutexes of their
// own, never held with mu.
//
// Limits (Config): connections in all and per uid, leases per
// connection, per uid and in all, the size of a request and the calls a
// connection has waiting; a connection must send its preface in time,
// and one that makes no call is closed when idle.

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vramkit/vram/internal/share"
)

// Defaults of Config.
const (
	DefaultReclaimTimeout   = 10 * time.Second
	DefaultMaxConns         = 1024
	DefaultMaxConnsPerUID   = 256
	DefaultMaxLeasesPerConn = 64
	DefaultMaxLeasesPerUID  = 1024
	DefaultMaxLeases        = 4096
	// DefaultHandshakeTimeout is generous: a broker busy with many new
	// connections at once answers each late, and a client whose
	// handshake is cut short only tries again.
	DefaultHandshakeTimeout = 20 * time.Second
	DefaultIdleTimeout      = time.Minute
	// maxMessageBytes bounds a request: the largest valid one is a few
	// hundred bytes.
	maxMessageBytes = 16 << 10
)

// Device is one device the broker divides: the memory it has and what a
// process's context takes of it (a device states both: device.Info's
// TotalBytes and ContextBytes).
type Device struct {
	Name    string // as the broker's --devices named it ("cuda:0", "sim:vram=1GiB")
	ID      string // the device's device.Info.ID, which processes find it by ("": none)
	Total   uint64 // bytes divided between the leases
	Context uint64 // bytes each process's context takes, charged once per process
}

// Config configures NewServer. Zero fields take their defaults.
type Config struct {
	Devices []Device
	// ReclaimTimeout is how long a borrower has to shrink when asked,
	// and so how long a claim waits for it (default 10s).
	ReclaimTimeout time.Duration
	// MaxConns bounds the connections open at once; more are closed on
	// accept (default 1024).
	MaxConns int
	// MaxConnsPerUID bounds the connections of one uid, root's included;
	// more are refused with ErrLimit (default 256).
	MaxConnsPerUID int
	// MaxLeasesPerConn bounds the leases of one connection (default 64).
	MaxLeasesPerConn int
	// MaxLeasesPerUID bounds the leases of one uid (default 1024).
	MaxLeasesPerUID int
	// MaxLeases bounds the leases in all (default 4096).
	MaxLeases int
	// HandshakeTimeout bounds how long a new connection may take to send
	// its preface (default 20s).
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection with no call in progress for this
	// long (default 1m): a Client always has one, its watch.
	IdleTimeout time.Duration
	// KeyFile is the file of the key that signs lease tokens, made at
	// the first start (DefaultKeyFile beside the socket, for `vram
	// broker`). "": a new key at every start, so that no lease is taken
	// back after a restart.
	KeyFile string
	// LockDir is where each device with an ID is locked, so that no other
	// broker of the user serves it (DefaultLockDir, for `vram broker`).
	// "": no locks.
	LockDir string
	// Logger receives warnings: missed deadlines, refused connections
	// (default slog.Default()).
	Logger *slog.Logger
}

// Server is a node broker. It is safe for concurrent use.
type Server struct {
	cfg Config
	log *slog.Logger
	id  uint64 // this instance, new at every start
	// tokens signs lease tokens under the broker's key (token.go); used
	// under mu.
	tokens *signer
	locks  deviceLocks
	admit  *admission
	net    served // the listeners and connections served (serve.go)

	mu          sync.Mutex // protects the fields below
	devices     []*device
	leases      map[uint64]*lease    // by id
	uidLeases   map[uint32]int       // leases by their holders' uid
	sessions    map[uint64]*session  // by id
	counts      []counts             // per device
	nextSession uint64               // ids of sessions
	nextReclaim uint64               // ids of reclaims
	seq         uint64               // of the lease states sent (LeaseState.seq)
	stopped     bool                 // Stop was called
	check       func(*Server) string // test hook (export_test.go): an invariant broken, or ""
	broken      []string             // what check found
}

// counts are a device's counters since the start. Protected by
// Server.mu.
type counts struct {
	granted, timedOut, cancelled, released uint64 // claims, by how they ended
	reclaims, missed                       uint64 // requests to shrink, and deadlines missed
}

// session is one connection. Protected by Server.mu, but wake.
type session struct {
	id       uint64
	pid, uid uint32
	refused  error // why every call is refused (conns.go), or nil
	leases   map[uint64]*lease
	watching bool
	closed   bool
	dirty    map[uint64]struct{} // leases whose state the Watch stream has to send
	wake     chan struct{}       // room for one: something is dirty
}

// NewServer returns a server of cfg's devices, holding their locks
// (Config.LockDir) and its key (Config.KeyFile). Serve it on a listener
// from Listen; Stop it, served or not, to let the locks go.
func NewServer(cfg Config) (*Server, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, id: randomID(), leases: map[uint64]*lease{}, uidLeases: map[uint32]int{},
		sessions: map[uint64]*session{}}
	s.admit = &admission{srv: s, maxConns: cfg.MaxConns, perUID: cfg.MaxConnsPerUID, log: cfg.Logger, byUID: map[uint32]*uidConns{}}
	for i, d := range cfg.Devices {
		s.devices = append(s.devices, &device{index: i, name: d.Name, id: d.ID, total: d.Total, context: d.Context,
			pools: share.New("lease"), leases: map[uint64]*lease{}, procs: map[uint32]int{}})
	}
	s.counts = make([]counts, len(s.devices))
	key := newKey()
	if cfg.KeyFile != "" {
		if key, err = loadKey(cfg.KeyFile); err != nil {
			return nil, err
		}
	}
	s.tokens = newSigner(key)
	if cfg.LockDir != "" {
		if s.locks, err = lockDevices(cfg.LockDir, cfg.Devices); err != nil {
			return nil, err
		}
	}
	s.net.lns, s.net.conns = map[net.Listener]struct{}{}, map[*serverConn]struct{}{}
	return s, nil
}

// withDefaults checks cfg's devices and fills its zero fields.
func withDefaults(cfg Config) (Config, error) {
	if len(cfg.Devices) == 0 {
		return cfg, errorf(ErrInvalid, "broker: no devices to serve")
	}
	for i, d := range cfg.Devices {
		if d.Total == 0 || d.Context >= d.Total {
			return cfg, errorf(ErrInvalid, "broker: device %d (%s): total %d bytes with a context of %d: want a total above the context", i, d.Name, d.Total, d.Context)
		}
		for j, o := range cfg.Devices[:i] {
			if (d.ID != "" && o.ID == d.ID) || o.Name == d.Name {
				return cfg, errorf(ErrInvalid, "broker: devices %d and %d are the same device (%s, id %s): list each once, or its memory is promised twice",
					j, i, clip(d.Name), clip(d.ID))
			}
		}
	}
	if cfg.ReclaimTimeout <= 0 {
		cfg.ReclaimTimeout = DefaultReclaimTimeout
	}
	cfg.MaxConns = orDefault(cfg.MaxConns, DefaultMaxConns)
	cfg.MaxConnsPerUID = orDefault(cfg.MaxConnsPerUID, DefaultMaxConnsPerUID)
	cfg.MaxLeasesPerConn = orDefault(cfg.MaxLeasesPerConn, DefaultMaxLeasesPerConn)
	cfg.MaxLeasesPerUID = orDefault(cfg.MaxLeasesPerUID, DefaultMaxLeasesPerUID)
	cfg.MaxLeases = orDefault(cfg.MaxLeases, DefaultMaxLeases)
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// randomID is a random nonzero id.
func randomID() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}

// Stop closes every connection, which ends every lease, stops Serve and
// lets the devices' locks go.
func (s *Server) Stop() {
	s.mu.Lock()
	stopped := s.stopped
	s.stopped = true
	s.mu.Unlock()
	s.net.stop()
	if !stopped {
		s.locks.unlock()
	}
}

func (s *Server) openSession(cred peerCred) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextSession++
	sess := &session{id: s.nextSession, pid: cred.pid, uid: cred.uid, refused: cred.refused, leases: map[uint64]*lease{},
		dirty: map[uint64]struct{}{}, wake: make(chan struct{}, 1)}
	if sess.refused == nil {
		s.sessions[sess.id] = sess
	}
	return sess
}

// endSession releases everything the connection held.
func (s *Server) endSession(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess.closed {
		return
	}
	sess.closed = true
	delete(s.sessions, sess.id)
	for _, l := range sortedByID(sess.leases) {
		s.releaseLocked(l, fmt.Errorf("%s: its connection closed: %w", l.label(), ErrReleased))
	}
}

// markDirty queues l's state for its session's Watch stream.
func (sess *session) markDirty(id uint64) {
	sess.dirty[id] = struct{}{}
	select {
	case sess.wake <- struct{}{}:
	default:
	}
}

func sortedByID(m map[uint64]*lease) []*lease {
	d := device{leases: m}
	return d.sortedLeases()
}

// counters are device i's counters now.
func (s *Server) counters(i int) counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[i]
}
