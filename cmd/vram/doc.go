// Command vram runs, plans and measures GPU batch work under vram's memory
// manager, on a real GPU or on the simulator.
//
// Usage:
//
//	vram [--device SPEC] [--json] [-v] COMMAND [flags]
//
// The commands:
//
//	vram run      the example batch job: N damped, driven oscillators
//	              integrated with RK4, planned into chunks that fit the
//	              device, checked against a float64 host reference
//	              (--shard i/N, or a Slurm array's or Kubernetes Indexed
//	              Job's index: one share of the batch, written as a part;
//	              --devices: several devices of this process)
//	vram merge    gather the parts of a sharded run into one .npy
//	vram plan     read a request set as JSON (a file or stdin) and print
//	              the chunk plan: chunks, chunk length, bytes, shapes
//	vram replay   replay RMM allocation logs (CSV) or PyTorch memory
//	              snapshots against the allocators: peak live and reserved
//	              bytes, the peak in pages beside the floor, device calls,
//	              speed, a plot, memory reports (--summary), a PyTorch
//	              snapshot out (--snapshot-out)
//	vram info     the device a spec opens, its memory, the allocators
//	vram bench    a quick allocator micro-benchmark table
//	vram broker   the node's broker of device memory between processes
//	              (vram broker status: its leases)
//	vram lease    run a command under a fixed lease from the broker, with
//	              each framework's memory limit in its environment
//
// Global flags:
//
//	--device SPEC   auto (CUDA device 0 if the driver loads and a GPU
//	                exists, else the simulator), sim, sim:vram=8GiB,
//	                cuda, cuda:N. Default: $VRAM_DEVICE, else auto.
//	                The backend it names reads it (device.ParseSpec)
//	                before the command runs: every command checks the
//	                spec, also those that do not open a device (replay;
//	                plan given a budget),
//	                but merge, broker status and lease (whose own
//	                --device names a broker's device), which have no
//	                use for one.
//	--json          one JSON value on stdout and nothing else there.
//	-v, --verbose   debug logs (log/slog) on stderr.
//
// Output: results go to stdout; errors, logs and progress bars (drawn only
// when stderr is a terminal, never with --json) go to stderr.
//
// Observability: `vram run --metrics-addr HOST:PORT` serves Prometheus
// metrics on /metrics for as long as the job runs: the memory manager's
// (package vram/metrics: device memory, allocator counters, each client's
// held bytes, cap and proportion, clients per group), the job's progress
// (vram_run_chunks, vram_run_chunks_done_total, vram_run_runs_done_total)
// and the Go runtime's. -v logs each chunk as it finishes and prints the
// manager's memory report after the batch.
//
// Interrupts: the first Ctrl-C (SIGINT, or SIGTERM) asks long work to
// stop at its next safe point — `vram run` before its next chunk, or
// before verifying — and exits 1 saying how far it got; it also gives
// both signals back their default action, so a second Ctrl-C ends the
// process at once.
//
// Exit status: 0 on success; 1 when a command ran and failed (no device,
// out of memory, a plan that does not fit, a request set or trace that
// cannot be read, results that do not verify, an interrupt); 2 on a usage
// error (an unknown command or flag, a bad flag value or argument, a
// device spec that cannot be read, a batch bigger than the host memory
// available or a time step at which RK4 is unstable).
//
// Examples:
//
//	go run ./cmd/vram run                    # the batch job on the simulator (or a GPU)
//	vram run --runs 2000000 --double-buffer  # more runs, copies overlapped with compute
//	vram run --metrics-addr :9090            # Prometheus metrics on /metrics while it runs
//	vram plan requests.json --budget 256MiB
//	vram replay trace.csv --plot replay.png
//	vram info --device cuda:1 --json
//
// Each command's --help describes its flags.
package main
