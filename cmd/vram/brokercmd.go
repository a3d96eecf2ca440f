// `vram broker`: the node daemon that divides each device's memory between
// the processes of the node (package vram/broker), and `vram broker
// status`, which asks it what it holds.
//
// The command opens each device once to read what it states (its total
// memory and what a process's context takes of it), closes it again, and
// serves the broker on its socket until interrupted; everything else is
// the library's.

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// brokerFlags are `vram broker`'s flags.
type brokerFlags struct {
	devices         string
	socket          string
	socketMode      string
	socketGroup     string
	lockDir         string
	keyFile         string
	metricsAddr     string
	reclaimTimeout  time.Duration
	maxConnsPerUID  int
	maxLeasesPerUID int
}

const brokerHelp = `vram broker is the node's broker of device memory: processes lease a share
of a device from it (vram lease, or a vram manager), by the manager's own
rules: a manual proportion or the auto pool, which keeps at least 5% while
it has leases, and an optional cap. A lease is guaranteed its share and may
borrow what others leave unused; when a process claims memory that is lent
out, the broker asks the borrowers to shrink (a vram batch does at its next
chunk) and names any that miss the deadline. Nothing is killed. A lease
ends when its process's connection closes, kill -9 included; a restarted
broker is rejoined by its clients.

--devices is as vram run's (default: --device); each device is locked
(--lock-dir), so that no other broker of the user serves it. The socket is
$VRAM_BROKER, else $XDG_RUNTIME_DIR/vram/broker.sock, else
/run/vram/broker.sock, in a directory no one but the broker's user may
write; mode 0600 lets only the broker's user connect, 0660 also
--socket-group's members. A lease is changed only through the connection
that acquired it (root's included) and, after a restart, taken back only
with the secret the broker gave it, signed with the broker's key
(--key-file, default SOCKET.key). Ctrl-C or SIGTERM stops the broker:
every lease ends.`

func (a *app) brokerCommand() *cobra.Command {
	var f brokerFlags
	cmd := &cobra.Command{
		Use:   "broker",
		Short: "Serve the node's broker of device memory between processes",
		Long:  brokerHelp,
		Example: `  vram broker --devices 'cuda:0;cuda:1'
  vram broker --devices sim:vram=1GiB --socket /tmp/vram.sock --metrics-addr 127.0.0.1:9091
  vram broker --socket-mode 0660 --socket-group gpu
  vram broker status --json`,
		Args: usageArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, args []string) error { return a.serveBroker(f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.devices, "devices", "", "the devices to divide, as vram run's --devices: all, or specs separated by ';' (default: --device)")
	fl.StringVar(&f.socket, "socket", broker.DefaultSocket(), "the Unix socket to serve ($"+broker.EnvSocket+" sets the default)")
	fl.StringVar(&f.socketMode, "socket-mode", "0600", "the socket's mode: 0600 (the broker's user only) or 0660 (and --socket-group)")
	fl.StringVar(&f.socketGroup, "socket-group", "", "the socket's group (a name or a number), for --socket-mode 0660 (default: the broker's own group)")
	fl.StringVar(&f.keyFile, "key-file", "", "the key that signs the leases' tokens, made at the first start, in a directory of the broker's user alone (default: SOCKET.key); keep it where no leaseholder can read it")
	fl.StringVar(&f.lockDir, "lock-dir", broker.DefaultLockDir(), "where each device is locked, so that no other broker of the user serves it")
	fl.IntVar(&f.maxConnsPerUID, "max-conns-per-uid", broker.DefaultMaxConnsPerUID, "the connections one uid may have open (root's included)")
	fl.IntVar(&f.maxLeasesPerUID, "max-leases-per-uid", broker.DefaultMaxLeasesPerUID, "the leases one uid may hold (root's included)")
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on host:port /metrics: :9091 listens on every interface, 127.0.0.1:9091 on this machine only")
	fl.DurationVar(&f.reclaimTimeout, "reclaim-timeout", broker.DefaultReclaimTimeout, "how long a borrower has to shrink when asked (and a claim waits for it)")
	cmd.AddCommand(a.brokerStatusCommand())
	return cmd
}

// brokerDevices reads each device's total and context, closing it again.
func (a *app) brokerDevices(list string) ([]broker.Device, error) {
	specs := []device.Spec{a.spec}
	if list != "" {
		var err error
		if specs, err = deviceSpecs(list); err != nil {
			return nil, err
		}
	}
	var out []broker.Device
	for _, spec := range specs {
		dev, _, err := a.openDeviceAs(spec, fmt.Sprintf("--devices (the spec %q)", spec))
		if err != nil {
			return nil, err
		}
		info := dev.Info()
		if err := dev.Close(); err != nil {
			return nil, fmt.Errorf("close %s: %w", spec, err)
		}
		out = append(out, broker.Device{Name: spec.String(), ID: info.ID, Total: info.TotalBytes, Context: info.ContextBytes})
	}
	return out, nil
}

// socketOptions reads --socket-mode and --socket-group.
func (f brokerFlags) socketOptions() (fs.FileMode, int, error) {
	mode, err := strconv.ParseUint(f.socketMode, 8, 32)
	if err != nil || (mode != 0o600 && mode != 0o660) {
		return 0, 0, usagef("--socket-mode %q: want 0600 (the broker's user only) or 0660 (and the socket's group)", f.socketMode)
	}
	gid := -1
	if f.socketGroup != "" {
		if n, err := strconv.Atoi(f.socketGroup); err == nil && n >= 0 {
			gid = n
		} else if g, err := user.LookupGroup(f.socketGroup); err == nil {
			gid, _ = strconv.Atoi(g.Gid)
		} else {
			return 0, 0, usagef("--socket-group %q: no such group (%v)", f.socketGroup, err)
		}
	}
	return fs.FileMode(mode), gid, nil
}

func (a *app) serveBroker(f brokerFlags) error {
	if f.metricsAddr != "" {
		if err := checkMetricsAddr(f.metricsAddr); err != nil {
			return err
		}
	}
	if f.reclaimTimeout <= 0 {
		return usagef("--reclaim-timeout %v: want a duration above 0, such as 10s", f.reclaimTimeout)
	}
	if f.maxConnsPerUID <= 0 || f.maxLeasesPerUID <= 0 {
		return usagef("--max-conns-per-uid %d, --max-leases-per-uid %d: want counts above 0", f.maxConnsPerUID, f.maxLeasesPerUID)
	}
	mode, gid, err := f.socketOptions()
	if err != nil {
		return err
	}
	devs, err := a.brokerDevices(f.devices)
	if err != nil {
		return err
	}
	// The socket first: it checks the directory the key goes in.
	made := missingDirs(f.socket) // Listen makes them
	ln, err := broker.Listen(f.socket, mode, gid)
	if err != nil {
		return err
	}
	defer a.tidyMadeDirs(made) // once the socket is gone
	s, err := broker.NewServer(broker.Config{Devices: devs, ReclaimTimeout: f.reclaimTimeout, Logger: a.log,
		MaxConnsPerUID: f.maxConnsPerUID, MaxLeasesPerUID: f.maxLeasesPerUID,
		KeyFile: cmp.Or(f.keyFile, broker.DefaultKeyFile(f.socket)), LockDir: f.lockDir})
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer s.Stop() // its devices' locks go
	if f.metricsAddr != "" {
		stop, err := a.serveBrokerMetrics(f.metricsAddr, s)
		if err != nil {
			s.Stop()
			_ = ln.Close()
			return err
		}
		defer stop()
	}
	for i, d := range devs {
		fmt.Fprintf(a.stderr, "vram broker: device %d %s: %s, a process's context %s\n", i, d.Name, units.Format(d.Total), units.Format(d.Context))
	}
	fmt.Fprintf(a.stderr, "vram broker: serving %s on %s (mode %#o)\n", plural(len(devs), "device"), f.socket, mode)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-a.ctx.Done():
		s.Stop()
		fmt.Fprintln(a.stderr, "vram broker: stopped; every lease ended")
		return <-done
	}
}

// missingDirs lists the directories of socket's path that do not exist
// yet, deepest first: those Listen makes.
func missingDirs(socket string) []string {
	var dirs []string
	for d := filepath.Dir(socket); ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			return dirs
		}
		dirs = append(dirs, d)
		if filepath.Dir(d) == d {
			return dirs
		}
	}
}

// tidyMadeDirs removes the directories made for the socket that the
// stopped broker left empty, deepest first, and says which stay, and why.
func (a *app) tidyMadeDirs(made []string) {
	for _, d := range made {
		if err := os.Remove(d); err != nil {
			top := made[len(made)-1]
			fmt.Fprintf(a.stderr, "vram broker: %s stays, made for the socket: it holds the broker's key, kept for a restart (rm -r %s when done)\n", top, top)
			return
		}
	}
}

// serveBrokerMetrics serves /metrics of s on addr until stop.
func (a *app) serveBrokerMetrics(addr string, s *broker.Server) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(broker.NewCollector(s), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var lc net.ListenConfig
	ln, err := lc.Listen(a.ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve metrics on --metrics-addr %s: %w; pick another port, or a host:port of this machine", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn), ErrorHandling: promhttp.ContinueOnError}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: metricsReadTimeout,
		WriteTimeout: cmp.Or(a.metricsWriteTimeout, metricsWriteTimeout), IdleTimeout: metricsIdleTimeout,
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := scrapeURL(ln.Addr())
	fmt.Fprintf(a.stderr, "vram broker: serving metrics on %s\n", url)
	if a.onMetrics != nil {
		a.onMetrics(url)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(a.metricsGrace, defaultMetricsGrace))
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(a.stderr, "vram: warning: metrics server: %v\n", err)
		}
	}, nil
}

func (a *app) brokerStatusCommand() *cobra.Command {
	var socket string
	cmd := &cobra.Command{
		Use:         "status",
		Annotations: noDeviceSpec(), // it asks the broker on --socket
		Short:       "Show what the broker holds: each device's leases, their shares, what they borrow and hold",
		Long: `vram broker status asks the broker on --socket for each device's total and
leases: each lease's pid, name, share, guaranteed and borrowed bytes, what
it holds (its process's context included), and any request to shrink in
flight or overdue. --json prints the same as one JSON value.`,
		Args: usageArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(a.ctx, 10*time.Second)
			defer cancel()
			c, err := broker.Dial(ctx, socket, broker.WithLogger(a.log))
			if err != nil {
				return err // it names the socket and what to do
			}
			defer c.Close()
			st, err := c.Status(ctx)
			if err != nil {
				return err
			}
			if a.json {
				return a.writeJSON(st)
			}
			return a.printBrokerStatus(socket, st)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", broker.DefaultSocket(), "the broker's Unix socket ($"+broker.EnvSocket+" sets the default)")
	return cmd
}

// printBrokerStatus writes st as text: a line per device, a table of its
// leases, its waiting claims.
func (a *app) printBrokerStatus(socket string, st broker.Status) error {
	fmt.Fprintf(a.stdout, "broker %s on %s\n", st.Broker, socket)
	for _, d := range st.Devices {
		fmt.Fprintf(a.stdout, "\ndevice %d  %s  total %s  context %s per process  guaranteed %s  granted %s  held %s  free %s\n",
			d.Index, d.Name, units.Format(d.Total), units.Format(d.Context), units.Format(d.Guaranteed),
			units.Format(d.Granted), units.Format(d.Held), units.Format(d.Free))
		if len(d.Leases) == 0 {
			fmt.Fprintln(a.stdout, "  no leases")
			continue
		}
		w := a.table()
		fmt.Fprintln(w, "  LEASE\tPID\tNAME\tSHARE\tGUARANTEED\tLIMIT\tBORROWED\tHOLDS\tRECLAIM")
		for _, l := range d.Leases {
			share := fmt.Sprintf("%.4g%%", 100*l.Share)
			if l.Auto {
				share += " auto"
			}
			if l.Cap > 0 {
				share += " cap " + units.Format(l.Cap)
			}
			fmt.Fprintf(w, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.ID, l.PID, strconv.Quote(l.Name), share,
				units.Format(l.Guaranteed), units.Format(l.Limit), units.Format(l.Borrowed), units.Format(l.Holds()), reclaimText(l))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		for _, c := range d.Claims {
			fmt.Fprintf(a.stdout, "  claim waiting: lease %s for a limit of %s since %s (deadline %s)\n",
				c.Lease, units.Format(c.Limit), c.Since.Format("15:04:05.000"), c.Deadline.Format("15:04:05.000"))
		}
	}
	return nil
}

func reclaimText(l broker.LeaseStatus) string {
	var parts []string
	if r := l.Reclaim; r != nil {
		s := fmt.Sprintf("shrink to %s by %s", units.Format(r.Target), r.Deadline.Format("15:04:05.000"))
		if r.Overdue {
			s += " OVERDUE"
		}
		parts = append(parts, s)
	}
	if l.MissedDeadlines > 0 {
		parts = append(parts, fmt.Sprintf("missed %d", l.MissedDeadlines))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}
