package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// 64 clients, each on its own connection, acquire, change, claim, report
// and release leases at random on two devices. The server checks its
// invariants after every change (Σ guaranteed ≤ the device, Σ limits ≤
// the device, the pools match the leases: export_test.go); every refusal
// is one of the broker's sentinels; at the end no lease is left.
func TestRandomClients(t *testing.T) {
	const clients, steps = 64, 40
	cfg := Config{Devices: []Device{{Name: "a", Total: 8 * GiB}, {Name: "b", Total: 3*GiB + 12345}}}
	cfg.ReclaimTimeout = 300 * time.Millisecond
	s, path := startServer(t, cfg)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			errs <- randomClient(path, rand.New(rand.NewPCG(seed, 7)), steps)
		}(uint64(i))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if !waitFor(10*time.Second, func() bool {
		st := s.Status()
		return len(st.Devices[0].Leases) == 0 && len(st.Devices[1].Leases) == 0
	}) {
		t.Errorf("leases left: %+v", s.Status())
	}
	if b := s.Broken(); len(b) > 0 {
		t.Fatalf("invariants broken: %q", b)
	}
}

// TestRandomProcesses is TestRandomClients with each client a process of
// its own (the test binary as a child): 64 processes register, change,
// claim, report and release leases at random, half of them leaving their
// last leases to end with the process. After every change the broker
// checks that the guaranteed parts fit each device (Broken lists any
// that did not); at the end no lease is left.
func TestRandomProcesses(t *testing.T) {
	const procs = 64
	cfg := Config{Devices: []Device{{Name: "a", Total: 8 * GiB}, {Name: "b", Total: 3*GiB + 12345}}}
	cfg.ReclaimTimeout = 300 * time.Millisecond
	s, path := startServer(t, cfg)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmds := make([]*exec.Cmd, procs)
	outs := make([]*bytes.Buffer, procs)
	for i := range procs {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=random", "VRAM_BROKER_TEST_SOCKET="+path, fmt.Sprintf("VRAM_BROKER_TEST_SEED=%d", i))
		outs[i] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil || !strings.Contains(outs[i].String(), "done") {
			t.Errorf("process %d: %v:\n%s", i, err, outs[i])
		}
	}
	if !waitFor(10*time.Second, func() bool {
		st := s.Status()
		return len(st.Devices[0].Leases) == 0 && len(st.Devices[1].Leases) == 0
	}) {
		t.Errorf("leases left: %+v", s.Status())
	}
	if b := s.Broken(); len(b) > 0 {
		t.Fatalf("invariants broken: %q", b)
	}
}

func randomClient(path string, r *rand.Rand, steps int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, path, WithLogger(quiet))
	if err != nil {
		return err
	}
	defer c.Close()
	var mine []*Lease
	proportion := func() float64 {
		if r.IntN(3) == 0 {
			return 0
		}
		return float64(r.IntN(40)+1) / 100
	}
	for range steps {
		var err error
		switch op := r.IntN(6); {
		case op == 0 || len(mine) == 0:
			var l *Lease
			l, err = c.Acquire(ctx, LeaseOptions{Device: r.IntN(2), Name: "r", Proportion: proportion()})
			if err == nil {
				mine = append(mine, l)
			}
		case op == 1:
			err = mine[r.IntN(len(mine))].Change(ctx, proportion(), uint64(r.IntN(2))*GiB)
		case op == 2:
			l := mine[r.IntN(len(mine))]
			_, err = l.Claim(ctx, uint64(r.Float64()*float64(l.Budget().Guaranteed)*1.5))
		case op == 3:
			l := mine[r.IntN(len(mine))]
			err = l.Report(ctx, min(l.Budget().Bytes(), uint64(r.IntN(2*GiB))))
		case op == 4:
			l := mine[r.IntN(len(mine))]
			if sh := l.Budget().Shrink; sh != nil {
				err = l.Report(ctx, sh.Bytes)
			}
		default:
			i := r.IntN(len(mine))
			err = mine[i].Release(ctx)
			mine = append(mine[:i], mine[i+1:]...)
		}
		if err != nil && !expected(err) {
			return err
		}
	}
	if r.IntN(2) == 0 {
		for _, l := range mine {
			if err := l.Release(ctx); err != nil {
				return err
			}
		}
	}
	return nil // the rest end with the connection
}

// expected are the refusals random requests may meet.
func expected(err error) bool {
	for _, e := range []error{ErrProportion, ErrInvalid, ErrReclaimTimeout, ErrBusy} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
