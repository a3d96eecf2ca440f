package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	// Both backends, so that --device auto finds a GPU when there is one
	// and the simulator otherwise.
	_ "github.com/vramkit/vram/device/cuda"
	_ "github.com/vramkit/vram/device/sim"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
