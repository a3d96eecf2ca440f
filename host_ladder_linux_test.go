//go:build linux

package vram

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/safecopy"
	"github.com/vramkit/vram/npy"
)

// smallDisk mounts a tmpfs of size bytes for the test and returns its
// path; it skips, saying why, where it cannot (not root, no mount).
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs as a full disk")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// TestSpillOntoFullDisk spills an array four times the room of its spill
// directory: Alloc fails with an out-of-memory error saying where, and
// leaves no file, instead of handing out a mapping whose writes would
// fault (a SIGBUS, fatal to the process).
func TestSpillOntoFullDisk(t *testing.T) {
	spill := smallDisk(t, "1m")
	m := newHostManager(t, HostOptions{SpillDir: spill}, 1<<40)
	h, err := m.Host().Alloc([]int{1 << 20}, Float32, HostArrayOptions{Rung: RungFile})
	if err == nil {
		data := h.Data()
		werr := safecopy.Do(func() {
			for i := 0; i < len(data); i += 4096 {
				data[i] = 1
			}
		})
		h.Free()
		t.Fatalf("a 4 MiB spill on a 1 MiB disk was made; writing it: %v", werr)
	}
	if !errors.Is(err, ErrOutOfMemory) || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Alloc: %v; want out of memory, no space left", err)
	}
	if es, _ := os.ReadDir(spill); len(es) != 0 {
		t.Errorf("the spill directory holds %d files after the failure", len(es))
	}
}

// shrunkOpenFile makes a .npy of n float32s, opens it as a host array
// of m (writable or not), allocates for a client of m the device array
// "x" of req (its shape and dtype set to the file's) and truncates the
// file under the mapping.
func shrunkOpenFile(t *testing.T, m *Manager, n int, writable bool, req ArrayRequest) (*Client, *HostArray, *ArrayResponse) {
	t.Helper()
	c := register(t, m, ClientOptions{})
	path := filepath.Join(t.TempDir(), "in.npy")
	f, err := npy.Create(path, npy.Header{Descr: "<f4", Shape: []int{n}}, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	h, err := m.Host().Open(path, writable)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Free() })
	req.Shape, req.DType = []int{n}, Float32
	if err := c.Queue(map[string]ArrayRequest{"x": req}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 128); err != nil {
		t.Fatal(err)
	}
	return c, h, resp
}

// TestOpenedFileShrinks opens a .npy as a host array, truncates the file
// under the mapping, and copies from and into it: each copy fails with
// ErrHostFault (and the device's ErrCopyFailed) instead of ending the
// process.
func TestOpenedFileShrinks(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c, h, resp := shrunkOpenFile(t, m, 1<<18, true, ArrayRequest{Unchunkable: true})
	ctx := context.Background()
	tests := map[string]func() error{
		"to the device":   func() error { return c.ToDevice(ctx, resp.Arrays()["x"], h) },
		"from the device": func() error { return c.FromDevice(ctx, h, resp.Arrays()["x"]) },
	}
	for name, copyFn := range tests {
		t.Run(name, func(t *testing.T) {
			err := copyFn()
			if err == nil {
				err = c.Sync(ctx)
			}
			if !errors.Is(err, ErrHostFault) || !errors.Is(err, device.ErrCopyFailed) {
				t.Errorf("%v; want ErrHostFault and ErrCopyFailed", err)
			}
		})
	}
}

// TestHostChunkCopyFromShrunkFile copies a chunk of a .npy opened as a
// host array and truncated under its mapping into a chunk-length host
// array (what package batch does to stage a file-backed input):
// CopyChunkFrom fails with ErrHostFault instead of ending the process, and
// so does CopyChunkTo back into the file.
func TestHostChunkCopyFromShrunkFile(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	const n = 1 << 22
	_, h, _ := shrunkOpenFile(t, m, n, true, ArrayRequest{Unchunkable: true})
	stage, err := m.NewHostArray([]int{n / 4}, Float32, Pageable, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stage.Free()
	sp := Span{Axis: 0, Start: n / 2, Len: n / 4} // past the 128 bytes left
	if err := stage.CopyChunkFrom(h, sp); !errors.Is(err, ErrHostFault) {
		t.Errorf("CopyChunkFrom: %v; want ErrHostFault", err)
	}
	if err := stage.CopyChunkTo(h, sp); !errors.Is(err, ErrHostFault) {
		t.Errorf("CopyChunkTo: %v; want ErrHostFault", err)
	}
}
