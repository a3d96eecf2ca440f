package broker

// The trust model's tests: each row of docs/sharing.md's table "who may
// do what" is one of these (or a test it names).

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/broker/brokerpb"
)

// No connection acts on another's lease: not another connection of the
// same process, nor of the same uid, root's included. (The broker once
// let a process act on a lease of its own pid, which a reused pid could
// be, and let root act on any.)
func TestAnotherConnectionIsRefused(t *testing.T) {
	s, path := startServer(t, oneDevice(8*GiB))
	owner, other := rawClient(t, path), rawClient(t, path)
	ctx := ctxT(t)
	if _, err := owner.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 5, Spec: &brokerpb.LeaseSpec{Name: "mine", Proportion: 0.5}}); err != nil {
		t.Fatal(err)
	}
	before := s.Status()
	for name, call := range map[string]func() error{
		"claim": func() error {
			_, err := other.Claim(ctx, &brokerpb.ClaimRequest{LeaseId: 5, LimitBytes: GiB})
			return err
		},
		"report": func() error {
			_, err := other.Report(ctx, &brokerpb.ReportRequest{LeaseId: 5, HeldBytes: GiB})
			return err
		},
		"change": func() error {
			_, err := other.Change(ctx, &brokerpb.ChangeRequest{LeaseId: 5, Proportion: 0.1})
			return err
		},
		"release": func() error { _, err := other.Release(ctx, &brokerpb.ReleaseRequest{LeaseId: 5}); return err },
		"acquire its id": func() error {
			_, err := other.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 5, Spec: &brokerpb.LeaseSpec{}})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := call()
			if !is(err, ErrPermission) && !is(err, ErrExists) {
				t.Fatalf("uid %d's other connection: %v, want ErrPermission", os.Geteuid(), err)
			}
		})
	}
	after := s.Status()
	if l, _ := leaseOf(after, leaseID(5)); l.Share != 0.5 || l.Held != 0 || l.Limit != before.Devices[0].Leases[0].Limit {
		t.Errorf("another connection changed the lease: %+v", l)
	}
	// Its own connection may.
	if _, err := owner.Release(ctx, &brokerpb.ReleaseRequest{LeaseId: 5}); err != nil {
		t.Fatal(err)
	}
}

// keyServer serves cfg at path with its key in keyFile, until stopped.
func keyServer(t *testing.T, path, keyFile string) *Server {
	t.Helper()
	cfg := oneDevice(8 * GiB)
	cfg.KeyFile = keyFile
	return startServerAt(t, cfg, path)
}

// After a restart, a lease id (public: status shows it) is taken back
// only with its token, the owner's alone, and counted for what it holds.
// (A restarted broker once let any process rejoin any id first.)
func TestRestartRejoinNeedsTheToken(t *testing.T) {
	path := socketPath(t)
	keyFile := filepath.Join(filepath.Dir(path), "b.key")
	s1 := keyServer(t, path, keyFile)
	api := rawClient(t, path)
	ctx := ctxT(t)
	st, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 9, Spec: &brokerpb.LeaseSpec{Name: "owner", Proportion: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	token, was := st.GetToken(), s1.id
	if len(token) != tokenBytes {
		t.Fatalf("the token has %d bytes, want %d", len(token), tokenBytes)
	}
	s1.Stop()
	s2 := keyServer(t, path, keyFile)
	thief, owner := rawClient(t, path), rawClient(t, path)
	rejoin := func(api rawAPI, token []byte) error {
		_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 9, Spec: &brokerpb.LeaseSpec{Name: "owner", Proportion: 0.5},
			Rejoin: true, HeldBytes: 3 * GiB, LimitBytes: 4 * GiB, Token: token, RejoinBroker: was})
		return err
	}
	for name, bad := range map[string][]byte{"no token": nil, "a wrong token": []byte("0123456789abcdef"), "a short one": token[:8]} {
		if err := rejoin(thief, bad); !is(err, ErrPermission) || !strings.Contains(err.Error(), "the token is not the lease's under this broker's key") {
			t.Errorf("a rejoin with %s: %v, want ErrPermission", name, err)
		}
	}
	if d := s2.Status().Devices[0]; len(d.Leases) != 0 {
		t.Fatalf("refused rejoins left leases: %+v", d.Leases)
	}
	if err := rejoin(owner, token); err != nil {
		t.Fatalf("the owner's rejoin: %v", err)
	}
	if l, ok := leaseOf(s2.Status(), leaseID(9)); !ok || l.Held != 3*GiB || l.Limit != 4*GiB || l.Guaranteed != 4*GiB {
		t.Errorf("the rejoined lease: %+v (found %v)", l, ok)
	}
}

// A token is bound to its uid: one of another uid (stolen, or guessed from
// a leak) takes nothing back.
func TestTokenIsTheUIDs(t *testing.T) {
	s, err := NewServer(Config{Devices: []Device{{Name: "a", Total: 8 * GiB}}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	s.check = checkLocked
	alice, mallory := s.openSession(peerCred{pid: 10, uid: 1000}), s.openSession(peerCred{pid: 11, uid: 1001})
	st, err := s.acquire(alice, &brokerpb.AcquireRequest{LeaseId: 3, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.acquire(mallory, &brokerpb.AcquireRequest{LeaseId: 3, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}, Rejoin: true,
		HeldBytes: GiB, Token: st.GetToken(), RejoinBroker: s.id})
	if !is(err, ErrPermission) {
		t.Fatalf("uid 1001 with uid 1000's token: %v, want ErrPermission", err)
	}
	if l := s.leases[3]; l == nil || l.sess != alice || l.held != 0 {
		t.Errorf("the lease after the refused rejoin: %+v", l)
	}
}

// A token is the HMAC-SHA256 of the label, the lease id, the uid and the
// broker instance under the key, cut to 16 bytes: the same from a signer
// reused for many tokens as from a fresh HMAC, so that tokens given
// before a restart (or an upgrade) still match, and a token of other
// figures does not.
func TestSignerTokens(t *testing.T) {
	key := bytes.Repeat([]byte{7}, keyBytes)
	fresh := func(id uint64, uid uint32, broker uint64) []byte {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(tokenLabel))
		mac.Write(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, id), uid), broker))
		return mac.Sum(nil)[:tokenBytes]
	}
	sg := newSigner(key)
	tests := map[string]struct {
		id     uint64
		uid    uint32
		broker uint64
	}{
		"a lease":               {id: 1, uid: 1000, broker: 42},
		"another id":            {id: 2, uid: 1000, broker: 42},
		"another uid":           {id: 1, uid: 0, broker: 42},
		"another instance":      {id: 1, uid: 1000, broker: 43},
		"every bit of every id": {id: ^uint64(0), uid: ^uint32(0), broker: ^uint64(0)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			want := fresh(tc.id, tc.uid, tc.broker)
			got := sg.of(tc.id, tc.uid, tc.broker)
			if !bytes.Equal(got, want) {
				t.Fatalf("token %x, want %x", got, want)
			}
			if !sg.matches(tc.id, tc.uid, tc.broker, want) {
				t.Error("the token does not match its own figures")
			}
			if sg.matches(tc.id^1, tc.uid, tc.broker, want) || sg.matches(tc.id, tc.uid^1, tc.broker, want) || sg.matches(tc.id, tc.uid, tc.broker^1, want) {
				t.Error("the token matches other figures")
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the token given changed to %x as the signer was used again", got)
			}
		})
	}
}

// A rejoin is taken only after a restart the client saw: a fresh
// connection that says it holds memory of a lease this broker ended (or
// of none) adds nothing. (Two such "rejoins" once made a broker count
// 128 MiB held on a 64 MiB device and refuse a real job.)
func TestRejoinWithoutARestartIsRefused(t *testing.T) {
	s, path := startServer(t, oneDevice(64*MiB))
	ctx := ctxT(t)
	first := rawClient(t, path)
	st, err := first.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 4, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Release(ctx, &brokerpb.ReleaseRequest{LeaseId: 4}); err != nil {
		t.Fatal(err)
	}
	api := rawClient(t, path)
	for name, tc := range map[string]struct {
		id     uint64
		token  []byte
		broker uint64
		want   error
	}{
		"its token, this broker":      {4, st.GetToken(), s.id, ErrReleased},
		"its token, no broker named":  {4, st.GetToken(), 0, ErrPermission},
		"no token, another broker":    {5, nil, 77, ErrPermission},
		"another's token, its own id": {6, st.GetToken(), 77, ErrPermission},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: tc.id, Spec: &brokerpb.LeaseSpec{}, Rejoin: true,
				HeldBytes: 64 * MiB, LimitBytes: 64 * MiB, Token: tc.token, RejoinBroker: tc.broker})
			if !is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if d := s.Status().Devices[0]; d.Held != 0 || len(d.Leases) != 0 {
		t.Fatalf("refused rejoins are counted: %+v", d)
	}
	c := dial(t, path)
	l := acquire(t, c, LeaseOptions{Name: "real job"})
	if got, err := l.Claim(ctx, 48*MiB); err != nil || got.Bytes() != 48*MiB {
		t.Errorf("a real job's claim beside the refused rejoins: %+v, %v", got, err)
	}
}

// A rejoin is counted for what it holds whether or not its share still
// fits: one that no longer does (a new lease took it while the broker was
// away) is taken back without a share, and its memory is counted.
func TestRejoinCountedWhetherOrNotItFits(t *testing.T) {
	path := socketPath(t)
	keyFile := filepath.Join(filepath.Dir(path), "b.key")
	s1 := keyServer(t, path, keyFile)
	ctx := ctxT(t)
	old := rawClient(t, path)
	st, err := old.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Name: "old", Proportion: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	was := s1.id
	s1.Stop()
	s2 := keyServer(t, path, keyFile)
	newer := rawClient(t, path)
	if _, err := newer.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 3, Spec: &brokerpb.LeaseSpec{Name: "new", Proportion: 0.6}}); err != nil {
		t.Fatal(err)
	}
	back := rawClient(t, path)
	got, err := back.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Name: "old", Proportion: 0.5},
		Rejoin: true, HeldBytes: 3 * GiB, LimitBytes: 4 * GiB, Token: st.GetToken(), RejoinBroker: was})
	if err != nil {
		t.Fatalf("a rejoin whose share no longer fits: %v", err)
	}
	if got.GetGuaranteedBytes() != 0 || got.GetShare() != 0 || got.GetHeldBytes() != 3*GiB {
		t.Errorf("the rejoined lease %+v: want no share, 3 GiB held", got)
	}
	if d := s2.Status().Devices[0]; d.Held != 3*GiB || d.Guaranteed > d.Total {
		t.Errorf("the device after the rejoin: %+v", d)
	}
	// It may take a share again when one fits.
	if _, err := back.Change(ctx, &brokerpb.ChangeRequest{LeaseId: 2, Proportion: 0.3}); err != nil {
		t.Fatalf("a share for the rejoined lease: %v", err)
	}
}

// After a restart, an id made by another uid before its holder rejoined
// (it was public in the old broker's status) is the holder's: the rejoin
// ends the squatter's lease and takes the id, and the squatter cannot
// take it back, its token being the new broker's.
func TestSquatterLosesTheID(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Devices: []Device{{Name: "a", Total: 8 * GiB}}, KeyFile: filepath.Join(dir, "k"), Logger: quiet}
	s1, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	alice := s1.openSession(peerCred{pid: 10, uid: 1000})
	st, err := s1.acquire(alice, &brokerpb.AcquireRequest{LeaseId: 8, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	s1.Stop()
	s2, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	s2.check = checkLocked
	mallory, alice2 := s2.openSession(peerCred{pid: 11, uid: 1001}), s2.openSession(peerCred{pid: 12, uid: 1000})
	squat, err := s2.acquire(mallory, &brokerpb.AcquireRequest{LeaseId: 8, Spec: &brokerpb.LeaseSpec{Proportion: 0.9}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.acquire(alice2, &brokerpb.AcquireRequest{LeaseId: 8, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}, Rejoin: true,
		HeldBytes: GiB, Token: st.GetToken(), RejoinBroker: s1.id}); err != nil {
		t.Fatalf("the holder's rejoin beside a squatter: %v", err)
	}
	if l := s2.leases[8]; l == nil || l.sess != alice2 || l.held != GiB || len(mallory.leases) != 0 {
		t.Fatalf("after the rejoin: lease %+v, the squatter holds %d", l, len(mallory.leases))
	}
	_, err = s2.acquire(mallory, &brokerpb.AcquireRequest{LeaseId: 8, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}, Rejoin: true,
		HeldBytes: GiB, Token: squat.GetToken(), RejoinBroker: s2.id})
	if !is(err, ErrExists) || s2.leases[8].sess != alice2 {
		t.Errorf("the squatter's rejoin: %v, want ErrExists and the lease the holder's", err)
	}
	if b := s2.broken; len(b) > 0 {
		t.Errorf("invariants broken: %q", b)
	}
}

// Limits per uid: a uid at its limit of leases is refused, naming it;
// another uid is served.
func TestLeaseLimitPerUID(t *testing.T) {
	s, err := NewServer(Config{Devices: []Device{{Name: "a", Total: 8 * GiB}}, MaxLeasesPerUID: 3, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	s.check = checkLocked
	a1, a2 := s.openSession(peerCred{pid: 10, uid: 1000}), s.openSession(peerCred{pid: 11, uid: 1000})
	b := s.openSession(peerCred{pid: 12, uid: 1001})
	take := func(sess *session, id uint64) error {
		_, err := s.acquire(sess, &brokerpb.AcquireRequest{LeaseId: id, Spec: &brokerpb.LeaseSpec{Proportion: 0.01}})
		return err
	}
	for i, sess := range []*session{a1, a1, a2} {
		if err := take(sess, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := take(a2, 4); !is(err, ErrLimit) || !strings.Contains(err.Error(), "uid 1000 holds 3 leases") {
		t.Errorf("uid 1000's fourth lease: %v, want ErrLimit naming the uid and its count", err)
	}
	if err := take(b, 5); err != nil {
		t.Errorf("uid 1001 beside uid 1000 at its limit: %v", err)
	}
	s.endSession(a1)
	if err := take(a2, 6); err != nil {
		t.Errorf("uid 1000 after a session ended: %v", err)
	}
}

// Each row of docs/sharing.md's table "who may do what" names tests that
// exist, in this package or the one the row names.
func TestTrustTableNamesTests(t *testing.T) {
	doc, err := os.ReadFile("../docs/sharing.md")
	if err != nil {
		t.Skipf("no docs beside the package: %v", err)
	}
	_, table, ok := strings.Cut(string(doc), "**Who may do what.**")
	if !ok {
		t.Fatal("docs/sharing.md has no table of who may do what")
	}
	_, table, _ = strings.Cut(table, "\n| who |")
	table, _, _ = strings.Cut(table, "\n\n")
	sources := map[string]string{}
	for _, dir := range []string{".", "../deploy/kubernetes"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*_test.go"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			sources[dir] += string(b)
		}
	}
	rows := 0
	for _, row := range strings.Split(table, "\n") {
		cells := strings.Split(row, "|")
		if len(cells) < 5 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") || strings.TrimSpace(cells[1]) == "who" {
			continue
		}
		rows++
		dir := "."
		if strings.Contains(cells[4], "deploy/kubernetes") {
			dir = "../deploy/kubernetes"
		}
		names := 0
		for _, f := range strings.Split(cells[4], "`") {
			name, _, _ := strings.Cut(f, "/")
			if !strings.HasPrefix(name, "Test") {
				continue
			}
			names++
			if !strings.Contains(sources[dir], "func "+name+"(t *testing.T)") {
				t.Errorf("the row %q names %s, which %s has not", strings.TrimSpace(cells[1]), name, dir)
			}
		}
		if names == 0 {
			t.Errorf("the row %q names no test", strings.TrimSpace(cells[1]))
		}
	}
	if rows < 10 {
		t.Errorf("the table has %d rows", rows)
	}
}
