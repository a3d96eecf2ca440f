// The life of `vram lease`'s COMMAND: it ends with its lease and its
// lease ends with it.
//
//  1. COMMAND dies with vram: where the system has one, it is started with
//     a death signal (Linux's PR_SET_PDEATHSIG, SIGKILL), so that vram
//     killed by SIGKILL, whose lease the broker then frees for others,
//     leaves no COMMAND holding that memory. The forking thread is kept
//     for COMMAND's whole life: the death signal follows the thread, not
//     the process.
//  2. COMMAND ends with its lease: when the lease ends first (released by
//     another process, or not taken back by a restarted broker), COMMAND
//     gets SIGTERM, and SIGKILL after --kill-after; vram then exits 1
//     with a line saying why. Off a terminal COMMAND leads a process group
//     of its own, so that these signals, and those vram passes on, reach
//     every process it started; on a terminal it stays in the terminal's
//     foreground group, where Ctrl-C reaches it.
//  3. The lease ends with COMMAND: vram releases it when COMMAND exits
//     (leasecmd.go), and the broker does when vram's connection closes.
//
// The broker tells a lease's client when a restarted broker did not take
// the lease back (Lease.Changed, Lease.Err); that another process released
// it shows only as its absence from the broker's table, which vram reads
// every leaseCheckEvery.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"time"

	"golang.org/x/term"

	"github.com/vramkit/vram/broker"
)

// leaseCheckEvery is how often vram lease reads the broker's table for
// its lease while COMMAND runs; leaseCheckTimeout bounds one read.
const (
	leaseCheckEvery   = time.Second
	leaseCheckTimeout = 10 * time.Second
)

// leaseEndedError is vram lease's failure when the lease ended before
// COMMAND did.
type leaseEndedError struct {
	command string
	why     error
	killed  bool // COMMAND outlived SIGTERM's grace and was killed
}

func (e leaseEndedError) Error() string {
	how := "stopped with SIGTERM"
	if e.killed {
		how = "killed with SIGKILL after it outlived SIGTERM's grace (--kill-after)"
	}
	return fmt.Sprintf("the lease ended before %s did, so %s was %s: %v", e.command, e.command, how, e.why)
}

func (e leaseEndedError) Unwrap() error { return e.why }

// leasedCommand is COMMAND running under lease l.
type leasedCommand struct {
	cmd       *exec.Cmd
	group     bool          // it leads a process group of its own
	killAfter time.Duration // SIGTERM's grace when the lease ends first
}

// runLeased runs args with env under lease l of client c, passing on the
// signals vram gets, and returns its exit status (128 + the signal when
// one ended it), or a leaseEndedError when the lease ended first.
func (a *app) runLeased(c *broker.Client, l *broker.Lease, args, env []string, killAfter time.Duration) (int, error) {
	f, ok := a.stdin.(*os.File)
	terminal := ok && term.IsTerminal(int(f.Fd()))
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = a.stdin, a.stdout, a.stderr
	lc := &leasedCommand{cmd: cmd, group: !terminal, killAfter: killAfter}
	prepareCommand(cmd, lc.group)
	sigs := make(chan os.Signal, 8)
	if fwd := forwardedSignals(terminal); len(fwd) > 0 { // none would mean all
		signal.Notify(sigs, fwd...)
	}
	defer signal.Stop(sigs)
	waited, err := lc.start()
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", args[0], err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	return lc.supervise(sigs, waited, watchLease(ctx, c, l), a.stderr)
}

// start starts the command on a goroutine locked to its thread until the
// command has been waited for (the death signal is the thread's), and
// returns the channel its Wait's result arrives on.
func (lc *leasedCommand) start() (<-chan error, error) {
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := lc.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- lc.cmd.Wait()
	}()
	return waited, <-started
}

// supervise passes signals on until the command exits, and stops it if
// the lease ends first.
func (lc *leasedCommand) supervise(sigs <-chan os.Signal, waited <-chan error, ended <-chan error, stderr io.Writer) (int, error) {
	var (
		endErr error
		kill   <-chan time.Time
		killed bool
	)
	for {
		select {
		case sig := <-sigs:
			_ = lc.signal(sig)
		case why := <-ended:
			ended, endErr = nil, why
			fmt.Fprintf(stderr, "vram lease: %v; stopping %s: SIGTERM now, SIGKILL in %v if it has not exited\n", why, lc.cmd.Args[0], lc.killAfter)
			_ = lc.signal(sigTerm)
			kill = time.After(lc.killAfter)
		case <-kill:
			kill, killed = nil, true
			_ = lc.signal(os.Kill)
		case err := <-waited:
			if endErr != nil {
				return 0, leaseEndedError{command: lc.cmd.Args[0], why: endErr, killed: killed}
			}
			var ee *exec.ExitError
			switch {
			case err == nil:
				return 0, nil
			case errors.As(err, &ee):
				return exitStatus(ee), nil
			}
			return 0, fmt.Errorf("%s: %w", lc.cmd.Args[0], err)
		}
	}
}

// signal sends sig to the command, to its whole group when it leads one.
func (lc *leasedCommand) signal(sig os.Signal) error {
	return signalCommand(lc.cmd.Process, sig, lc.group)
}

// watchLease returns a channel that receives why l ended, once, if it
// ends before ctx is done: at the client's word (Lease.Err), or when the
// broker's table no longer lists it.
func watchLease(ctx context.Context, c *broker.Client, l *broker.Lease) <-chan error {
	ended := make(chan error, 1)
	go func() {
		tick := time.NewTicker(leaseCheckEvery)
		defer tick.Stop()
		for {
			changed := l.Changed()
			if err := l.Err(); err != nil {
				ended <- lostLease(l, err)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-tick.C:
				if gone(ctx, c, l) {
					ended <- fmt.Errorf("%s is no longer in the broker's table (another process released it): %w", l, broker.ErrReleased)
					return
				}
			}
		}
	}()
	return ended
}

// lostLease says why the client ended l while COMMAND ran: the only end
// it states then, other than a release, is a restarted broker's refusal to
// take the lease back.
func lostLease(l *broker.Lease, err error) error {
	if errors.Is(err, broker.ErrReleased) {
		return fmt.Errorf("%s ended: %w", l, err)
	}
	return fmt.Errorf("%s was not taken back by the restarted broker: %w", l, err)
}

// gone reports whether the broker's table, read now, lacks lease l. A
// broker that does not answer in time says nothing: the client rejoins
// the lease when it comes back, or ends it (Lease.Err).
func gone(ctx context.Context, c *broker.Client, l *broker.Lease) bool {
	ctx, cancel := context.WithTimeout(ctx, leaseCheckTimeout)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil || l.Err() != nil {
		return false
	}
	for _, d := range st.Devices {
		for _, ls := range d.Leases {
			if ls.ID == l.ID() {
				return false
			}
		}
	}
	return true
}
