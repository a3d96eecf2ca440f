package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	// Both backends, so that --device auto finds a GPU when there is one
	// and the simulator otherwise.
	_ "github.com/vramkit/vram/device/cuda"
	_ "github.com/vramkit/vram/device/sim"
)

func main() {
	ctx, stop := interruptContext(os.Stderr)
	code := runContext(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// interruptContext returns a context cancelled by the first SIGINT or
// SIGTERM, which asks long work (the batch job, the broker, replays,
// benchmarks) to stop at its next safe point. That signal also gives both
// back to their default action and says so on w, so a second one ends
// the process at once. stop releases the signals and the goroutine that
// watches them.
func interruptContext(w io.Writer) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case sig := <-sigs:
			signal.Stop(sigs) // the next one kills
			fmt.Fprintln(w, stoppingLine(sig))
			cancel()
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		<-exited
		cancel()
	}
}

// stoppingLine says what the first signal does, and how to quit at once:
// by Ctrl-C again at a terminal, by the same signal again otherwise.
func stoppingLine(sig os.Signal) string {
	if sig == syscall.SIGTERM {
		return "vram: SIGTERM: stopping at the next safe point, as for Ctrl-C; a second SIGTERM (or SIGKILL) quits at once"
	}
	return "vram: interrupted: stopping at the next safe point; press Ctrl-C again to quit at once"
}
