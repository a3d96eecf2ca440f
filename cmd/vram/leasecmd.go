// `vram lease -- COMMAND`: a fixed lease from the node's broker for any
// program. The command checks its flags, takes the lease, claims its
// whole guaranteed part (waiting for borrowers to give it back), starts
// COMMAND with each framework's own memory limit set to the lease in its
// environment, forwards signals to it, and releases the lease when it
// exits, however it exits (if vram itself is killed, its connection
// closes and the broker releases the lease all the same). COMMAND ends
// with the lease and with vram (leaselife.go).

package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/internal/share"
	"github.com/vramkit/vram/internal/units"
)

// exitError carries a status for the process to exit with and nothing to
// print: COMMAND's own, which has said what it had to say.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("the command exited with status %d", e.code) }

// Environment variables vram lease sets for COMMAND besides the
// frameworks' own.
const (
	envLeaseBytes    = "VRAM_LEASE_BYTES"    // what COMMAND's allocator may hold, in bytes
	envLeaseFraction = "VRAM_LEASE_FRACTION" // the same as a fraction of the device's total memory
	envLeaseDevice   = "VRAM_LEASE_DEVICE"   // the broker's device index
	envLeaseID       = "VRAM_LEASE_ID"
)

type leaseFlags struct {
	proportion float64
	bytes      string
	device     string
	socket     string
	name       string
	killAfter  time.Duration // SIGTERM's grace when the lease ends first
}

const leaseHelp = `vram lease takes a fixed lease of one device from the node's broker (vram
broker), claims all of it (waiting, up to the broker's reclaim deadline,
for borrowers to give it back), and runs COMMAND with the lease's memory
limit set for each framework, by the framework's own documented setting
where it has one:

  VRAM_ALLOC_CONF                 limit:BYTES (vram's; other keys kept)
  CUPY_GPU_MEMORY_LIMIT           BYTES (CuPy's pools)
  XLA_PYTHON_CLIENT_MEM_FRACTION  the fraction of the device (JAX; or
                                  XLA_CLIENT_MEM_FRACTION if that is the one set)
  TF_FORCE_GPU_ALLOW_GROWTH       true: TensorFlow allocates as it needs
  CUDA_VISIBLE_DEVICES            the leased GPU (when unset)
  PYTHONPATH                      vram's import hook first (sitecustomize)
  VRAM_LEASE_BYTES, VRAM_LEASE_FRACTION, VRAM_LEASE_DEVICE, VRAM_LEASE_ID

The import hook applies the limits that are API calls when the framework
is imported: PyTorch's per_process_memory_fraction (its allocator setting
from PyTorch 2.10, torch.cuda.set_per_process_memory_fraction before),
TensorFlow's logical device memory limit, and vram's Numba plugin
(NUMBA_CUDA_MEMORY_MANAGER=vram.numba, where vram's Python package is
installed). A limit already set lower stays. BYTES is the lease less the
context the process pays on the device; every process of COMMAND keeps to
all of it. $VRAM_BROKER is left out of COMMAND's environment: a vram
inside keeps to the lease by its limit rather than lease the memory again
(for a vram job whose budget follows a lease that grows and shrinks, use
vram run --socket instead). Signals vram receives are passed to COMMAND
(Ctrl-C and Ctrl-\ on a terminal reach it from the terminal itself); the
lease is released when COMMAND exits, however it exits, and vram exits
with COMMAND's status.

COMMAND ends with its lease: if the lease ends first (another process
released it, or a restarted broker did not take it back), COMMAND gets
SIGTERM, and SIGKILL --kill-after later, and vram exits 1 saying why. Off a
terminal COMMAND leads a process group of its own, which these signals
reach whole. On Linux COMMAND also dies with vram, even when vram is
killed with SIGKILL (whose lease the broker then gives to others).`

func (a *app) leaseCommand() *cobra.Command {
	var f leaseFlags
	cmd := &cobra.Command{
		Use:         "lease [--proportion P | --bytes N] [--device D] -- COMMAND [ARGS...]",
		Annotations: noDeviceSpec(), // its --device is the broker's
		Short:       "Run a command under a fixed lease of device memory from the node's broker",
		Long:        leaseHelp,
		Example: `  vram lease --bytes 8GiB -- python train.py
  vram lease --proportion 0.5 --device 1 -- ./serve --port 8080
  vram lease --bytes 1GiB -- env`,
		Args: usageArgs(1, -1, "a COMMAND to run (after --)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("proportion") == cmd.Flags().Changed("bytes") {
				return usagef("give --proportion P or --bytes N, one of them: a fixed lease (the auto pool's share would change under the command)")
			}
			if cmd.Flags().Changed("bytes") && strings.TrimSpace(f.bytes) == "" {
				return usagef("--bytes is empty: want a size such as 8GiB (from Kubernetes: is the pod's %s annotation set? deploy/kubernetes/lease-job.yaml)", podMemoryAnnotation)
			}
			if err := f.check(); err != nil {
				return err
			}
			return a.runLease(f, args)
		},
	}
	fl := cmd.Flags()
	fl.SetInterspersed(false) // COMMAND's own flags are its
	fl.Float64Var(&f.proportion, "proportion", 0, "a manual share of the device, 0 < P ≤ 1")
	fl.StringVar(&f.bytes, "bytes", "", "a lease of N bytes, such as 8GiB (the process's context included)")
	fl.StringVar(&f.device, "device", "0", "the broker's device: its index (the order of its --devices) or its name")
	fl.StringVar(&f.socket, "socket", broker.DefaultSocket(), "the broker's Unix socket ($"+broker.EnvSocket+" sets the default)")
	fl.StringVar(&f.name, "name", "", "the lease's name in the broker's status (default: COMMAND's name)")
	fl.DurationVar(&f.killAfter, "kill-after", 10*time.Second, "when the lease ends before COMMAND: the time between SIGTERM and SIGKILL")
	return cmd
}

// check refuses, before the broker is asked, what no broker accepts: a
// proportion the share rules cannot read, a name the broker refuses, a
// grace that is not positive.
func (f leaseFlags) check() error {
	if f.bytes == "" {
		if _, err := share.ToUnits(f.proportion, false); err != nil || math.IsInf(f.proportion, 0) {
			return usagef("--proportion %v: want 0 < P ≤ 1, at least %v (the smallest share)", f.proportion, 1/float64(share.Unit))
		}
	}
	if f.name != "" {
		if n := leaseName(f.name); n != f.name {
			return usagef("--name %s: want at most %d bytes of printable UTF-8, such as %s", quoteName(f.name), broker.MaxNameBytes, quoteName(n))
		}
	}
	if f.killAfter <= 0 {
		return usagef("--kill-after %v: want a positive duration such as 10s", f.killAfter)
	}
	return nil
}

// quoteName quotes a name for a message: at most 40 bytes of it, cut at
// a character's start, with its length when longer.
func quoteName(s string) string {
	if len(s) <= 40 {
		return strconv.Quote(s)
	}
	cut := 40
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// leaseName is name made a valid lease name: what is not printable UTF-8
// replaced by '?', cut to broker.MaxNameBytes at a character's start.
func leaseName(name string) string {
	out := []rune(strings.ToValidUTF8(name, "?"))
	for i, r := range out {
		if !strconv.IsPrint(r) {
			out[i] = '?'
		}
	}
	s := string(out)
	if len(s) <= broker.MaxNameBytes {
		return s
	}
	cut := broker.MaxNameBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// leaseDevice finds --device among the broker's devices.
func leaseDevice(spec string, devs []broker.DeviceInfo) (broker.DeviceInfo, error) {
	d, err := broker.FindDevice(devs, spec, "")
	if err != nil {
		return d, usagef("--device: %v", err)
	}
	return d, nil
}

// leaseOptions turns the flags into the lease to ask for on dev.
func (f leaseFlags) leaseOptions(dev broker.DeviceInfo, command string) (broker.LeaseOptions, error) {
	o := broker.LeaseOptions{Device: dev.Index, Name: f.name}
	if o.Name == "" {
		o.Name = leaseName(filepath.Base(command))
	}
	if f.bytes == "" {
		o.Proportion = f.proportion // checked by check
		return o, nil
	}
	n, err := units.ParseSize(f.bytes)
	switch {
	case err != nil:
		return o, usagef("--bytes %q: %v", f.bytes, err)
	case n > dev.Total:
		return o, usagef("--bytes %s: more than device %d's %s", units.Format(n), dev.Index, units.Format(dev.Total))
	case n <= dev.Context:
		return o, usagef("--bytes %s: no more than the %s a process's context takes on device %d; ask for more", units.Format(n), units.Format(dev.Context), dev.Index)
	}
	// The share just above n, capped at n: exactly n guaranteed.
	o.Proportion = min(1, float64(n)/float64(dev.Total)+1e-12)
	o.Cap = n
	return o, nil
}

func (a *app) runLease(f leaseFlags, args []string) error {
	ctx, cancel := context.WithTimeout(a.ctx, time.Minute+broker.DefaultReclaimTimeout)
	defer cancel()
	c, err := broker.Dial(ctx, f.socket, broker.WithLogger(a.log))
	if err != nil {
		return err // the broker's, which names the socket and what to do
	}
	defer c.Close() // releases the lease, whatever else failed
	dev, err := leaseDevice(f.device, c.Devices())
	if err != nil {
		return err
	}
	o, err := f.leaseOptions(dev, args[0])
	if err != nil {
		return err
	}
	l, err := c.Acquire(ctx, o)
	if err != nil {
		return err
	}
	b := l.Budget()
	if b, err = l.Claim(ctx, b.Guaranteed-min(b.Guaranteed, b.Context)); err != nil {
		return fmt.Errorf("claim the lease's %s: %w", units.Format(l.Budget().Guaranteed), err)
	}
	// COMMAND's use is not known to vram: count all of it as held.
	if err := l.Report(ctx, b.Bytes()); err != nil {
		return err
	}
	a.log.Debug("lease", "id", l.ID(), "device", dev.Index, "limit", b.Limit, "bytes", b.Bytes())
	fmt.Fprintf(a.stderr, "vram lease: %s on device %d (%s): %s for the command, %s with its context\n",
		l.ID(), dev.Index, dev.Name, units.Format(b.Bytes()), units.Format(b.Limit))
	hook, herr := writeLeaseHook()
	if herr != nil {
		a.leaseNotes([]string{"the import hook: " + herr.Error()})
	} else {
		defer os.RemoveAll(hook)
	}
	env, notes := leaseEnv(os.Environ(), leaseLimit{bytes: b.Bytes(), dev: dev, id: l.ID(), hook: hook})
	a.leaseNotes(notes)
	code, err := a.runLeased(c, l, args, env, f.killAfter)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if rerr := l.Release(rctx); rerr != nil {
		a.log.Warn("vram lease: release (the broker releases it when this process exits)", "err", rerr)
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return exitError{code}
	}
	return nil
}
