package main

// The test binary doubles as a leaseholder in a child process: a manager
// of a device spec with a lease of the broker on a socket, driven line by
// line on stdin, for the tests with real processes (leaseproc_test.go).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// leaseHolderEnv, set to "SPEC\nSOCKET\nNAME" in a child's environment,
// makes the test binary a leaseholder.
const leaseHolderEnv = "VRAM_TEST_LEASE_HOLDER"

// leaseHolderMain runs the leaseholder when the environment asks for it,
// and reports whether it did.
func leaseHolderMain() bool {
	v, ok := os.LookupEnv(leaseHolderEnv)
	if !ok {
		return false
	}
	parts := strings.SplitN(v, "\n", 3)
	if len(parts) != 3 {
		fmt.Println("error: want SPEC\\nSOCKET\\nNAME, got", strconv.Quote(v))
		os.Exit(2)
	}
	if err := holdLease(parts[0], parts[1], parts[2], os.Stdin, os.Stdout); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	return true
}

// holdLease opens the device and its manager, says "ready", then answers
// each command of in on out:
//
//	alloc N TIMEOUT  allocate N bytes (unchunkable) waiting at most TIMEOUT:
//	                 "ok", "refused ERR", or "oom ERR" when the allocator met
//	                 the device's out of memory
//	free             free what alloc took and trim the cache: "freed"
//	held             what the allocator holds, in bytes
//
// It ends when in does.
func holdLease(spec, socket, name string, in io.Reader, out io.Writer) (err error) {
	dev, err := device.Open(spec)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dev.Close()) }()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := vram.New(dev, vram.WithBroker(socket), vram.WithLease(vram.LeaseOptions{Name: name}), vram.WithLogger(quiet))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	fmt.Fprintln(out, "ready")
	var held *vram.Client
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 3 && f[0] == "alloc":
			n, _ := strconv.Atoi(f[1])
			wait, _ := time.ParseDuration(f[2])
			ooms := m.Account().Allocator().Stats().OOMs
			var aerr error
			held, aerr = holdFor(m, name, n, wait)
			switch {
			case m.Account().Allocator().Stats().OOMs != ooms:
				fmt.Fprintln(out, "oom", aerr)
			case aerr != nil:
				fmt.Fprintln(out, "refused", strings.ReplaceAll(aerr.Error(), "\n", " "))
			default:
				fmt.Fprintln(out, "ok")
			}
		case len(f) == 1 && f[0] == "free":
			if held != nil {
				if err := held.Close(); err != nil {
					return err
				}
				held = nil
			}
			if err := m.Account().Allocator().Trim(); err != nil {
				return err
			}
			fmt.Fprintln(out, "freed")
		case len(f) == 1 && f[0] == "held":
			fmt.Fprintln(out, m.Account().Allocator().Stats().Reserved)
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
	}
	if held != nil {
		return errors.Join(sc.Err(), held.Close())
	}
	return sc.Err()
}

// holdFor allocates an unchunkable device array of n bytes for a new
// client of m, waiting at most wait.
func holdFor(m *vram.Manager, name string, n int, wait time.Duration) (*vram.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c, err := m.Register(vram.ClientOptions{Name: name, Group: name})
	if err != nil {
		return nil, err
	}
	if err := c.Queue(map[string]vram.ArrayRequest{"a": {Shape: []int{n}, DType: vram.Uint8, Unchunkable: true}}); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if _, err := c.Allocate(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}
