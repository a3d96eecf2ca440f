// The command tree, global flags, exit statuses and output helpers shared by
// every subcommand.
//
// Everything a command needs from the process (arguments, output streams,
// the environment through device.DefaultSpec, a context cancelled on
// interrupt) comes in through runContext, so tests run whole commands
// in-process and read what they printed. Errors travel back up as values:
// a usageError (bad flags, arguments or device spec) exits 2, any other
// error exits 1, and in both cases the message goes to stderr and nothing
// but the command's own output ever reaches stdout.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/vramkit/vram/device"
)

// Exit statuses.
const (
	exitOK      = 0 // the command did what it was asked
	exitFailure = 1 // it ran and failed: no device, out of memory, a result that did not verify
	exitUsage   = 2 // it was asked wrongly: unknown command or flag, bad flag value or argument
)

// usageError marks an error in how the command was called; it exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef makes a usageError. %w verbs wrap as in fmt.Errorf.
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// app holds what every subcommand shares: the process's streams and the
// global flags. One app serves one invocation; it is not safe for
// concurrent use.
type app struct {
	ctx    context.Context
	stdin  io.Reader // request sets for plan
	stdout io.Writer // command output only: tables, or one JSON value with --json
	stderr io.Writer // errors, logs and progress bars

	device    string      // --device: a device spec, as given
	deviceSet bool        // --device was given (else device came from $VRAM_DEVICE or is "auto")
	spec      device.Spec // --device read by its backend, before a command that uses it runs
	json      bool        // --json: machine-readable output on stdout
	verbose   bool        // -v: debug logs on stderr

	log *slog.Logger // set before any subcommand runs

	// onMetrics, when set (by tests), is called with the /metrics URL
	// once `run --metrics-addr` has allocated the batch, before the
	// first chunk.
	onMetrics func(url string)
	// onChunkDone, when set (by tests), is called by `run` as each chunk
	// finishes: done chunks of of.
	onChunkDone func(done, of int)
	// progressEvery, when set (by tests), replaces how often `run`
	// writes progress lines on a stderr that is not a terminal.
	progressEvery time.Duration
	// metricsGrace, when set (by tests), replaces how long `run` waits
	// for scrapes in flight when it stops its metrics server.
	metricsGrace time.Duration
	// metricsWriteTimeout, when set (by tests), replaces the metrics
	// server's write timeout, so that a test can hold a scrape stuck
	// past the end of a slow run.
	metricsWriteTimeout time.Duration
	// metricsSendBuffer, when set (by tests), is the send buffer of the
	// metrics server's connections, so that a client that stops reading
	// blocks the server after a few responses however loaded the machine.
	metricsSendBuffer int
	// hostMem, when set (by tests), stands in for the host memory
	// available to the process (hostAvailable).
	hostMem func() (avail uint64, from string, ok bool)
}

// run executes the vram command line args (without the program name) with
// the process's stdin and returns the process exit status.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, os.Stdin, stdout, stderr)
}

// runContext is run with a context that interrupts long work (the batch
// job, replays, benchmarks) when it is cancelled, and a given stdin.
func runContext(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr}
	return a.execute(args)
}

// execute runs one command line and returns its exit status.
func (a *app) execute(args []string) int {
	a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	root := a.rootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ee exitError // vram lease: the command's own status, said by it
	if errors.As(err, &ee) {
		return ee.code
	}
	// The one place an error gets the program's name: no error says it
	// (the library's, like the command's own, carry no prefix).
	fmt.Fprintln(a.stderr, "vram: "+err.Error())
	var ue usageError
	if errors.As(err, &ue) {
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	return exitFailure
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "vram",
		Short: "GPU memory management for batch GPU programs",
		Long: `vram manages GPU memory for programs that run large batches of work on a GPU:
it plans a batch that does not fit into chunks, serves arrays from pooled,
stream-ordered allocators, and runs on a real GPU (CUDA driver) or on a
faithful simulator when there is none.

Every command takes --device (a device spec: auto, sim, sim:vram=8GiB,
cuda, cuda:1; default $VRAM_DEVICE or auto) and --json (one JSON value on
stdout, nothing else there). Exit status: 0 success, 1 failure, 2 usage error.`,
		Version:                    version(),
		SuggestionsMinimumDistance: 2,
		SilenceErrors:              true,
		SilenceUsage:               true,
		// A root that runs, so that an unknown command is our usage error
		// and a bare "vram" can say what is missing.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				hint := ""
				if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
					hint = fmt.Sprintf(" (did you mean %q?)", s[0])
				}
				return usagef("unknown command %q%s; the commands are %s", args[0], hint, commandNames(cmd))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("missing command: one of %s", commandNames(cmd))
		},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			level := slog.LevelWarn
			if a.verbose {
				level = slog.LevelDebug
			}
			a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
			a.deviceSet = cmd.Flags().Changed("device")
			if strings.TrimSpace(a.device) == "" {
				return usagef("--device is empty; give a spec such as auto, sim, sim:vram=8GiB or cuda:0")
			}
			// Checked here, so that a command that does not open a
			// device (replay, or plan given a budget and granularity)
			// still refuses a spec it would have ignored; help and a
			// bare "vram" work whatever $VRAM_DEVICE says.
			if !checksSpec(cmd) {
				return nil
			}
			spec, err := device.ParseSpec(a.device)
			if err != nil {
				return usageError{fmt.Errorf("%s: %w", a.deviceSource(), err)}
			}
			a.spec = spec
			a.log.Debug("vram", "command", cmd.CommandPath(), "device", a.device, "json", a.json)
			return nil
		},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{flagError(err)}
	})
	root.CompletionOptions.HiddenDefaultCmd = true
	// The root runs only to report a missing or unknown command; its usage
	// shows the subcommands, not "vram [flags]".
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(),
		"{{if .Runnable}}", "{{if and .Runnable .HasParent}}", 1))

	pf := root.PersistentFlags()
	pf.StringVar(&a.device, "device", device.DefaultSpec(),
		"device spec: auto, sim, sim:vram=8GiB, cuda, cuda:N; $"+device.EnvDevice+" sets the default")
	pf.BoolVar(&a.json, "json", false, "print one JSON value on stdout instead of text")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "debug logs on stderr")

	root.AddCommand(a.infoCommand(), a.planCommand(), a.runCommand(), a.mergeCommand(), a.replayCommand(), a.benchCommand(),
		a.brokerCommand(), a.leaseCommand())
	markOwn(root.Commands())
	return root
}

// Annotations of vram's commands (cobra.Command.Annotations).
const (
	// annOwn marks each of vram's own commands, set once they are
	// registered (markOwn), so that the root tells them from the help and
	// completion commands cobra adds itself when it executes.
	annOwn = "vram/own"
	// annNoDeviceSpec marks a command that has no use for the global
	// --device spec, which it then does not check: merge, broker status,
	// and lease, whose own --device names one of the broker's devices.
	annNoDeviceSpec = "vram/no-device-spec"
)

// markOwn marks cmds and every command under them as vram's own.
func markOwn(cmds []*cobra.Command) {
	for _, c := range cmds {
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[annOwn] = ""
		markOwn(c.Commands())
	}
}

// noDeviceSpec is the annotation of a command with no use for --device.
func noDeviceSpec() map[string]string { return map[string]string{annNoDeviceSpec: ""} }

// checksSpec reports whether cmd checks the --device spec before it runs:
// every command of vram's own (not the root, nor cobra's help and
// completion) that has a use for one.
func checksSpec(cmd *cobra.Command) bool {
	_, own := cmd.Annotations[annOwn]
	_, none := cmd.Annotations[annNoDeviceSpec]
	return own && !none
}

// commandNames lists cmd's runnable subcommands for error messages.
func commandNames(cmd *cobra.Command) string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() && c.Name() != "help" {
			names = append(names, c.Name())
		}
	}
	return strings.Join(names, ", ")
}

// flagError rewrites pflag's message for a flag value that does not
// parse ("invalid argument "x" for "--runs" flag: strconv.ParseInt: ...")
// into one that says what the flag wants.
func flagError(err error) error {
	var ive *pflag.InvalidValueError
	if !errors.As(err, &ive) {
		return err
	}
	f := ive.GetFlag()
	if _, ok := f.Value.(*sizeFlag); ok {
		// Its error says what it wants (sizeFlag.Set).
		return fmt.Errorf("--%s %q: %w", f.Name, ive.GetValue(), errors.Unwrap(err))
	}
	want := map[string]string{
		"int":      "a whole number",
		"uint64":   "a whole number of at least 0",
		"float64":  "a number",
		"bool":     "true or false",
		"duration": "a duration such as 200ms or 2s",
	}[f.Value.Type()]
	if want == "" {
		return err
	}
	return fmt.Errorf("--%s %q: want %s (default %s)", f.Name, ive.GetValue(), want, f.DefValue)
}

// usageArgs checks a command's arguments: at least lo and at most hi
// (hi < 0: no limit). what names them for the message ("TRACE.csv").
func usageArgs(lo, hi int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case hi == 0 && len(args) > 0:
			return usagef("%s takes no arguments, but was given %q", cmd.CommandPath(), args)
		case len(args) < lo:
			return usagef("%s needs %s", cmd.CommandPath(), what)
		case hi >= 0 && len(args) > hi:
			return usagef("%s takes at most %d %s, but was given %d: %q", cmd.CommandPath(), hi, what, len(args), args)
		}
		return nil
	}
}

// version is the module version the binary was built from, or "devel".
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// deviceSource names where the device spec came from, for messages:
// `--device "sim"` when the flag was given (or nothing was, and the spec
// is the default "auto"), `$VRAM_DEVICE "sim"` when the environment set
// it.
func (a *app) deviceSource() string {
	if !a.deviceSet && strings.TrimSpace(os.Getenv(device.EnvDevice)) != "" {
		return fmt.Sprintf("$%s %s", device.EnvDevice, device.QuoteSpec(a.device))
	}
	return "--device " + device.QuoteSpec(a.device)
}

// openDevice opens spec (the --device flag or $VRAM_DEVICE, or a spec a
// command chose itself) and says why "auto" fell back to the simulator,
// if it did.
func (a *app) openDevice(spec device.Spec) (device.Device, error, error) {
	src := "device " + device.QuoteSpec(spec.String())
	if spec.String() == strings.TrimSpace(a.device) {
		src = a.deviceSource()
	}
	return a.openDeviceAs(spec, src)
}

// openDeviceAs is openDevice for a spec a command derived from its flags;
// flags names them for a message.
func (a *app) openDeviceAs(spec device.Spec, flags string) (device.Device, error, error) {
	dev, fallback, err := device.OpenSpec(spec)
	if err != nil {
		if errors.Is(err, device.ErrBadSpec) {
			return nil, nil, usageError{fmt.Errorf("%s: %w", flags, err)}
		}
		if errors.Is(err, device.ErrNoDevice) {
			// It says "open SPEC: why"; say what to do instead.
			return nil, nil, fmt.Errorf("%w; --device sim (or auto) runs on the simulator instead", err)
		}
		return nil, nil, err
	}
	info := dev.Info()
	if fallback != nil {
		a.log.Debug("auto fell back to the simulator", "reason", fallback)
	}
	a.log.Debug("device open", "spec", spec.String(), "backend", info.Backend, "name", info.Name,
		"total", info.TotalBytes, "granularity", info.Granularity)
	return dev, fallback, nil
}

// writeJSON prints v as indented JSON on stdout.
func (a *app) writeJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table returns a tab-aligned writer on stdout; Flush it when done.
func (a *app) table() *tabwriter.Writer {
	return tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
}

// progress is a progress bar, or nothing. Finish may be called more than
// once, so a deferred Finish can back up the one on the success path.
type progress interface {
	Add(n int)
	Finish()
}

type noProgress struct{}

func (noProgress) Add(int) {}
func (noProgress) Finish() {}

// barProgress draws a bar; Finish clears it and may be called again.
type barProgress struct {
	bar  *progressbar.ProgressBar
	done bool
}

func (b *barProgress) Add(n int) { _ = b.bar.Add(n) }

func (b *barProgress) Finish() {
	if !b.done {
		b.done = true
		_ = b.bar.Finish()
	}
}

// progress returns a bar of max steps on stderr when stderr is a terminal
// and --json is off; otherwise one that draws nothing.
func (a *app) progress(max int, desc string) progress {
	if a.json || !isTerminal(a.stderr) || max <= 0 {
		return noProgress{}
	}
	bar := progressbar.NewOptions(max,
		progressbar.OptionSetWriter(a.stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(30),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(true),
	)
	return &barProgress{bar: bar}
}

// isTerminal reports whether the stream w (an io.Writer or io.Reader) is
// a terminal.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
