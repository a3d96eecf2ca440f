package broker

// A chaos test of the broker with two users: processes of root and of a
// second uid lease, claim, report, change and release at random while
// trying to act on each other's leases and to forge rejoins; some are
// killed with SIGKILL, and the broker restarts (its key kept) mid-way.
// No hostile call ever succeeds, the table's invariants hold after every
// change on each broker, limits per uid hold, and no lease is left.
// Bounded: a fixed number of processes, steps and restarts (about ten
// seconds). .ci/run runs it (as root, it makes the second user).

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
)

// TestChaosTwoUsers: see the file's overview.
func TestChaosTwoUsers(t *testing.T) {
	const procs, kills = 12, 3
	uid, gid := otherUser(t)
	exe := publicExe(t)
	dir := publicDir(t)
	path := filepath.Join(dir, "b.sock")
	cfg := Config{Devices: []Device{{Name: "a", Total: 8 * GiB}, {Name: "b", Total: 3*GiB + 12345}},
		ReclaimTimeout: 200 * time.Millisecond, MaxLeasesPerUID: 24, KeyFile: filepath.Join(dir, "b.key")}
	servers := []*Server{startServerWith(t, cfg, path, 0o660, int(gid))}
	marks := filepath.Join(dir, "marks") // where each process says it is half-way
	if err := os.Mkdir(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	chmod(t, marks, 0o777)
	r := mrand.New(mrand.NewPCG(34, 1))
	cmds, outs := make([]*exec.Cmd, procs), make([]*bytes.Buffer, procs)
	for i := range procs {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=chaos", "VRAM_BROKER_TEST_SOCKET="+path, fmt.Sprintf("VRAM_BROKER_TEST_SEED=%d", i),
			"VRAM_BROKER_TEST_MARK="+filepath.Join(marks, strconv.Itoa(i)))
		if i%2 == 1 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		}
		outs[i] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr, cmd.Dir = outs[i], outs[i], dir
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	var refused, rejoined int
	killed := map[int]bool{}
	for range kills {
		time.Sleep(time.Duration(200+r.IntN(400)) * time.Millisecond)
		i := r.IntN(procs)
		killed[i] = true
		_ = cmds[i].Process.Signal(syscall.SIGKILL)
	}
	// A restart, its key kept, once every process left is half-way (it
	// waits there to rejoin): every client rejoins what it holds.
	half := waitFor(time.Minute, func() bool {
		for i := range procs {
			if _, err := os.Stat(filepath.Join(marks, strconv.Itoa(i))); err != nil && !killed[i] {
				return false
			}
		}
		return true
	})
	if !half {
		t.Error("the processes did not all reach half-way in a minute")
	}
	servers[0].Stop()
	servers = append(servers, startServerWith(t, cfg, path, 0o660, int(gid)))
	for i, cmd := range cmds {
		err := cmd.Wait()
		out := outs[i].String()
		switch {
		case strings.Contains(out, "violation"):
			t.Errorf("process %d (uid %d): %s", i, uidOf(i, uid), out)
		case killed[i]:
		case err != nil || !strings.Contains(out, "done"):
			t.Errorf("process %d (uid %d): %v:\n%s", i, uidOf(i, uid), err, out)
		default:
			var f, j int
			_, _ = fmt.Sscanf(out, "refused %d rejoined %d", &f, &j)
			refused, rejoined = refused+f, rejoined+j
		}
	}
	t.Logf("%d hostile calls refused, %d clients rejoined the restarted broker", refused, rejoined)
	if refused == 0 || rejoined < procs-len(killed) {
		t.Errorf("%d hostile calls refused, %d of %d clients rejoined", refused, rejoined, procs-len(killed))
	}
	s := servers[len(servers)-1]
	if !waitFor(10*time.Second, func() bool {
		st := s.Status()
		return len(st.Devices[0].Leases) == 0 && len(st.Devices[1].Leases) == 0
	}) {
		t.Errorf("leases left: %+v", s.Status())
	}
	for i, s := range servers {
		if b := s.Broken(); len(b) > 0 {
			t.Errorf("broker %d: invariants broken: %q", i, b)
		}
	}
}

func uidOf(i int, other uint32) uint32 {
	if i%2 == 1 {
		return other
	}
	return uint32(os.Geteuid())
}

// chaosClient is TestChaosTwoUsers' process: random requests on its own
// leases, and hostile ones on the others' (found in the status), each of
// which must be refused; it prints "violation" for one that is not.
// Half-way it makes the file mark and waits to rejoin a restarted broker.
func chaosClient(socket, mark string, r *mrand.Rand, steps int) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, socket, WithLogger(quiet), WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := dialRaw(socket)
	if err != nil {
		return err
	}
	defer func() { raw.cc.close() }()
	var mine []*Lease
	refused := 0
	for step := range steps {
		if step == steps/2 {
			if err := halfWay(c, mark); err != nil {
				return err
			}
		}
		var err error
		if r.IntN(3) == 0 {
			if fresh, derr := dialRaw(socket); raw.cc.lost() && derr == nil { // the broker restarted
				raw.cc.close()
				raw = fresh
			} else if derr == nil {
				fresh.cc.close()
			}
			if err = hostile(ctx, c, raw, r, mine); err != nil {
				refused++
			}
		} else {
			mine, err = randomStep(ctx, c, r, mine)
		}
		if err != nil && !chaosExpected(err) {
			return fmt.Errorf("step %d: %w", step, err)
		}
		time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
	}
	fmt.Printf("refused %d rejoined %d\n", refused, c.Rejoins())
	return nil
}

// hostile tries one call on a lease of another connection, or a forged
// rejoin; a success is a violation.
func hostile(ctx context.Context, c *Client, raw rawAPI, r *mrand.Rand, mine []*Lease) error {
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	own := map[string]bool{}
	for _, l := range mine {
		own[l.ID()] = true
	}
	var theirs []uint64
	for _, d := range st.Devices {
		for _, l := range d.Leases {
			if !own[l.ID] {
				id, _ := strconv.ParseUint(l.ID, 16, 64)
				theirs = append(theirs, id)
			}
		}
	}
	if len(theirs) == 0 {
		return nil
	}
	id := theirs[r.IntN(len(theirs))]
	token := make([]byte, tokenBytes)
	_, _ = rand.Read(token)
	var what string
	switch r.IntN(5) {
	case 0:
		what, err = "release", drop(raw.Release(ctx, &brokerpb.ReleaseRequest{LeaseId: id}))
	case 1:
		what, err = "claim", drop(raw.Claim(ctx, &brokerpb.ClaimRequest{LeaseId: id, LimitBytes: GiB}))
	case 2:
		what, err = "report", drop(raw.Report(ctx, &brokerpb.ReportRequest{LeaseId: id, HeldBytes: GiB}))
	case 3:
		what, err = "change", drop(raw.Change(ctx, &brokerpb.ChangeRequest{LeaseId: id, Proportion: 0.01}))
	default:
		what, err = "rejoin", drop(raw.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: id, Spec: &brokerpb.LeaseSpec{Device: 1},
			Rejoin: true, HeldBytes: GiB, Token: token, RejoinBroker: r.Uint64()}))
	}
	if err == nil {
		fmt.Printf("violation: %s of another's lease %016x succeeded (uid %d)\n", what, id, os.Geteuid())
		return nil
	}
	return err
}

func drop[T any](_ T, err error) error { return err }

// halfWay makes the file mark and waits, a minute at most, until c has
// rejoined a restarted broker.
func halfWay(c *Client, mark string) error {
	if err := os.WriteFile(mark, nil, 0o644); err != nil {
		return err
	}
	if !waitFor(time.Minute, func() bool { return c.Rejoins() > 0 }) {
		return fmt.Errorf("no rejoin a minute after half-way")
	}
	return nil
}

// randomStep is one of randomClient's requests on the process's own
// leases.
func randomStep(ctx context.Context, c *Client, r *mrand.Rand, mine []*Lease) ([]*Lease, error) {
	proportion := float64(r.IntN(20)+1) / 100
	var err error
	switch op := r.IntN(5); {
	case op == 0 || len(mine) == 0:
		var l *Lease
		if l, err = c.Acquire(ctx, LeaseOptions{Device: r.IntN(2), Name: "chaos", Proportion: proportion}); err == nil {
			mine = append(mine, l)
		}
	case op == 1:
		err = mine[r.IntN(len(mine))].Change(ctx, proportion, 0)
	case op == 2:
		l := mine[r.IntN(len(mine))]
		_, err = l.Claim(ctx, uint64(r.Float64()*float64(l.Budget().Guaranteed)*1.5))
	case op == 3:
		l := mine[r.IntN(len(mine))]
		err = l.Report(ctx, min(l.Budget().Bytes(), uint64(r.IntN(GiB))))
	default:
		i := r.IntN(len(mine))
		err = mine[i].Release(ctx)
		mine = append(mine[:i], mine[i+1:]...)
	}
	return mine, err
}

// chaosExpected are the refusals chaos may meet: random requests', the
// hostile ones', a lease's end, a broker away as it restarts.
func chaosExpected(err error) bool {
	for _, e := range []error{ErrProportion, ErrInvalid, ErrReclaimTimeout, ErrBusy, ErrLimit, ErrPermission, ErrNotFound,
		ErrReleased, ErrUnavailable, ErrExists} {
		if is(err, e) {
			return true
		}
	}
	return false
}
