package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// devicesRun is a batch of 40,000 runs on 1 MiB devices: 8 chunks.
func devicesRun(dev string, extra ...string) []string {
	return append([]string{"run", "--json", dev, "--vram", "1MiB", "--runs", "40000", "--steps", "40", "--samples", "21"}, extra...)
}

func runDevicesJSON(t *testing.T, args []string) runReport {
	t.Helper()
	stdout, stderr, code := cli(t, "", args...)
	if code != exitOK {
		t.Fatalf("vram %s: exit %d; stderr:\n%s", strings.Join(args, " "), code, stderr)
	}
	var r runReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	return r
}

// Four simulated devices write the same file as one, and each takes
// chunks. Kernels of 5 µs a run (25 ms a chunk) keep the devices busy
// long enough that every one starts before the chunks run out.
func TestRunDevicesSameFile(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.npy"), filepath.Join(dir, "b.npy")
	const sim = "sim:granularity=64KiB,context=0,kerneltime=5us"
	r := runDevicesJSON(t, devicesRun("--devices="+sim+",count=4", "--out", a))
	one := runDevicesJSON(t, devicesRun("--device="+sim, "--out", b))
	if !r.Verified || !one.Verified || len(r.Devices) != 4 || len(one.Devices) != 0 {
		t.Fatalf("verified %v and %v, %d and %d devices in the reports; want both verified, 4 and none", r.Verified, one.Verified, len(r.Devices), len(one.Devices))
	}
	took := 0
	for _, d := range r.Devices {
		took += d.Chunks
		if d.Chunks == 0 {
			t.Errorf("%s took no chunk: %+v", d.Device, r.Devices)
		}
	}
	if took != r.Chunks || r.Chunks < 8 {
		t.Errorf("devices took %d chunks of %d; want all of at least 8", took, r.Chunks)
	}
	fa, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fa, fb) {
		t.Errorf("--devices wrote %d bytes, one device %d: the files differ", len(fa), len(fb))
	}
}

// With one device's kernels fifty times slower, each of the others takes
// more chunks than it. 256 KiB devices cut the batch into about 18
// chunks, so that the two or three the slow device takes before its
// first is done leave the others many.
func TestRunDevicesSlowOne(t *testing.T) {
	const sim = "sim:granularity=64KiB,context=0"
	r := runDevicesJSON(t, devicesRun("--devices="+sim+",kerneltime=2us,count=2;"+sim+",kerneltime=100us", "--vram", "256KiB"))
	if len(r.Devices) != 3 {
		t.Fatalf("%d devices in the report; want 3", len(r.Devices))
	}
	slow := r.Devices[2].Chunks
	t.Logf("%d chunks: %d, %d and the slow device %d", r.Chunks, r.Devices[0].Chunks, r.Devices[1].Chunks, slow)
	for _, d := range r.Devices[:2] {
		if d.Chunks <= slow {
			t.Errorf("a fast device took %d chunks, the slow one %d: %+v", d.Chunks, slow, r.Devices)
		}
	}
}

func TestRunDevicesUsage(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--devices", "sim:count=0"},
		{"run", "--devices", "cuda:count=2"},
		{"run", "--devices", "sim:count=2", "--metrics-addr", "127.0.0.1:0"},
	} {
		if _, stderr, code := cli(t, "", args...); code != exitUsage {
			t.Errorf("vram %s: exit %d, want %d (usage); stderr:\n%s", strings.Join(args, " "), code, exitUsage, stderr)
		}
	}
}
