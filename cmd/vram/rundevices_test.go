package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// devicesRun is a small batch for --devices: 20,000 runs of 10 steps.
var devicesRun = []string{"--runs", "20000", "--steps", "10", "--seed", "5"}

func runMulti(t *testing.T, args ...string) multiReport {
	t.Helper()
	stdout, stderr, code := cli(t, "", append(append([]string{"run", "--json"}, devicesRun...), args...)...)
	if code != exitOK {
		t.Fatalf("vram run %q: exit %d\n%s", args, code, stderr)
	}
	var r multiReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	return r
}

// TestDevicesMatchOneDevice: four simulated devices write the file one
// device writes, byte for byte, each took chunks, and the report adds up.
func TestDevicesMatchOneDevice(t *testing.T) {
	dir := t.TempDir()
	one, four := filepath.Join(dir, "one.npy"), filepath.Join(dir, "four.npy")
	if _, stderr, code := cli(t, "", append(append([]string{"run", "--device", "sim"}, devicesRun...), "--out", one)...); code != exitOK {
		t.Fatalf("one device: exit %d\n%s", code, stderr)
	}
	// Units that take a while (--kernel-delay), so that every device has
	// opened before the queue is empty.
	r := runMulti(t, "--devices", "sim:count=4", "--kernel-delay", "40us", "--out", four)
	a, err := os.ReadFile(one)
	must(t, err)
	b, err := os.ReadFile(four)
	must(t, err)
	if !bytes.Equal(a, b) {
		t.Fatalf("four devices wrote a different file (%d bytes) from one device (%d bytes)", len(b), len(a))
	}
	if len(r.Devices) != 4 || !r.Verified || r.Runs != 20000 {
		t.Fatalf("report: %d devices, verified %v, %d runs", len(r.Devices), r.Verified, r.Runs)
	}
	chunks, runs := 0, 0
	for i, d := range r.Devices {
		if d.Chunks < 1 {
			t.Errorf("device %d (%s) took no chunk: %+v", i, d.Device, r.Devices)
		}
		if want := fmt.Sprintf("sim:%d ", i); !strings.HasPrefix(d.Device, want) {
			t.Errorf("device %d is %q, want ordinal %d", i, d.Device, i)
		}
		chunks, runs = chunks+d.Chunks, runs+d.Runs
	}
	if chunks != r.Chunks || runs != r.Runs {
		t.Errorf("the devices took %d chunks and %d runs; the report says %d and %d", chunks, runs, r.Chunks, r.Runs)
	}
}

// TestDevicesInMemory: without --out the results stay in memory and are
// verified there, on devices of different sizes (so of different chunk
// lengths).
func TestDevicesInMemory(t *testing.T) {
	// 356 device bytes a run: the small device's plan has chunks of
	// about 950 runs, the large one's the whole batch; each cuts its own
	// (at most ⌈left/4⌉ of the runs left), so the large one's are
	// longer.
	r := runMulti(t, "--devices", "sim:vram=512KiB,granularity=64KiB,context=0;sim:vram=16MiB,granularity=64KiB,context=0", "--steps", "40")
	d0, d1 := r.Devices[0], r.Devices[1]
	if !r.Verified || r.FailedRuns != 0 || len(r.Devices) != 2 || d0.PlanChunkLength >= d1.PlanChunkLength ||
		d0.ChunkLength > d0.PlanChunkLength || d0.Chunks+d1.Chunks != r.Chunks || d0.Runs+d1.Runs != r.Runs {
		t.Fatalf("report %+v", r)
	}
}

// TestSlowDeviceTakesLess: a device with slow copies takes fewer chunks
// than the others. Timing on a loaded machine: up to three tries.
func TestSlowDeviceTakesLess(t *testing.T) {
	var last []deviceShare
	for range 3 {
		r := runMulti(t, "--devices", "sim:count=3;sim:bandwidth=1MB", "--kernel-delay", "20us")
		slow := r.Devices[3]
		fast := slices.MinFunc(r.Devices[:3], func(a, b deviceShare) int { return a.Chunks - b.Chunks })
		if slow.Chunks < fast.Chunks {
			return
		}
		last = r.Devices
	}
	t.Fatalf("the slow device (the last) did not take fewer chunks than every fast one, in three tries: %+v", last)
}

// TestDevicesShard: a shard on several devices writes the part one
// device writes.
func TestDevicesShard(t *testing.T) {
	dir1, dir2 := t.TempDir(), t.TempDir()
	runShard(t, 3001, nil, "--out", filepath.Join(dir1, "r.npy"), "--shard", "1/2")
	stdout, stderr, code := cli(t, "", "run", "--runs", "3001", "--steps", "40", "--samples", "21", "--seed", "7",
		"--devices", "sim:count=3", "--shard", "1/2", "--out", filepath.Join(dir2, "r.npy"))
	if code != exitOK || !strings.Contains(stdout, "shard        1/2 (from --shard): runs 1500-3000 of 3001") {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, name := range []string{"r.shard-1-of-2.npy", "r.shard-1-of-2.json"} {
		a, err := os.ReadFile(filepath.Join(dir1, name))
		must(t, err)
		b, err := os.ReadFile(filepath.Join(dir2, name))
		must(t, err)
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between one device and three:\n%s\n%s", name, a, b)
		}
	}
}

func TestDeviceSpecs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "sim:count=3", want: []string{"sim:ordinal=0", "sim:ordinal=1", "sim:ordinal=2"}},
		{in: "sim:vram=1GiB,count=2", want: []string{"sim:vram=1GiB,ordinal=0", "sim:vram=1GiB,ordinal=1"}},
		{in: "sim; sim:bandwidth=1GB", want: []string{"sim:ordinal=0", "sim:bandwidth=1GB,ordinal=1"}},
		{in: "sim:ordinal=7;cuda:1", want: []string{"sim:ordinal=7", "cuda:1"}},
		{in: "cuda:count=2", wantErr: "count= is for the simulator"},
		{in: "sim:count=0", wantErr: "1 to 64 devices"},
		{in: "sim:count=2,ordinal=1", wantErr: "share one ordinal"},
		{in: " ; ", wantErr: "want all, or device specs"},
		{in: "sim;sim:colour=red", wantErr: `--devices "sim;sim:colour=red": device 2 of 2 ("sim:colour=red,ordinal=1"): unknown sim option "colour"`},
		{in: "sim;cuda:first", wantErr: `cuda device "first": want a device number`},
	} {
		specs, err := deviceSpecs(tc.in)
		var got []string
		for _, s := range specs {
			got = append(got, s.String())
		}
		if tc.wantErr != "" {
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("deviceSpecs(%q) = %q, %v; want a usage error saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("deviceSpecs(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestDevicesRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"delay alone": {[]string{"--kernel-delay", "1us"}, exitUsage, "--kernel-delay 1µs: only with --devices"},
		"metrics":     {[]string{"--devices", "sim:count=2", "--metrics-addr", "127.0.0.1:0"}, exitUsage, "without --devices"},
		"bad spec":    {[]string{"--devices", "sim:nosuch=1;sim"}, exitUsage, "unknown sim option"},
		"too small": {[]string{"--devices", "sim:granularity=64KiB,context=0,count=2", "--vram", "64KiB", "--steps", "4000", "--dt", "0.001"},
			exitFailure, "device 0 (sim:granularity=64KiB,context=0,ordinal=0): allocate the batch's device arrays"},
		"count in cuda": {[]string{"--devices", "cuda:count=2"}, exitUsage, "count= is for the simulator"},
	} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"run", "--device", "sim", "--runs", "100", "--steps", "10"}, tc.args...)
			_, stderr, code := cli(t, "", args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d saying %q", code, stderr, tc.code, tc.want)
			}
		})
	}
}

// BenchmarkRunDevices is the batch on one and on four simulated devices
// with kernels that take 10 µs a run (--kernel-delay: they sleep, so the
// devices overlap them as GPUs would, whatever the CPU). It reports the
// batch's runs per second.
//
//	go test -run ^$ -bench RunDevices -benchtime 3x ./cmd/vram
func BenchmarkRunDevices(b *testing.B) {
	for _, devices := range []string{"sim", "sim:count=2", "sim:count=4"} {
		b.Run("devices="+devices, func(b *testing.B) {
			var rate float64
			for b.Loop() {
				var out, errb bytes.Buffer
				code := runContext(b.Context(), []string{"run", "--json", "--runs", "100000", "--steps", "10",
					"--devices", devices, "--kernel-delay", "10us"}, strings.NewReader(""), &out, &errb)
				if code != exitOK {
					b.Fatalf("exit %d: %s", code, errb.String())
				}
				var r multiReport
				if err := json.Unmarshal(out.Bytes(), &r); err != nil {
					b.Fatal(err)
				}
				rate += r.RunsPerSecond
			}
			b.ReportMetric(rate/float64(b.N), "runs/s")
		})
	}
}

// TestDevicesReportAndProgress: off a terminal, --devices writes the
// progress lines one device does (the set-up, the chunks), and its
// report has every line of the one-device report (once six were missing).
func TestDevicesReportAndProgress(t *testing.T) {
	stdout, stderr, code := cli(t, "", append(append([]string{"run"}, devicesRun...), "--devices", "sim:count=2")...)
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, want := range []string{jobTag() + ": set-up: open the 2 devices", jobTag() + ": run the batch", "done (100%)", jobTag() + ": verify the results"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
	for _, line := range []string{"batch ", "devices ", "plan ", "copied ", "overlap ", "peak memory ", "allocator ", "host ", "time ", "verified "} {
		if !strings.Contains(stdout, "\n"+line) && !strings.HasPrefix(stdout, line) {
			t.Errorf("the report has no %q line:\n%s", strings.TrimSpace(line), stdout)
		}
	}
	r := runMulti(t, "--devices", "sim:count=2")
	if r.BytesToDevice == 0 || r.BytesFromDevice == 0 || r.ComputeSeconds == 0 {
		t.Errorf("report: %d bytes in, %d out, %.3f s of kernels; want them counted", r.BytesToDevice, r.BytesFromDevice, r.ComputeSeconds)
	}
	for i, d := range r.Devices {
		if d.PeakDeviceBytes == 0 || d.Stats.Allocs == 0 || d.Allocator == "" || d.BytesPerChunk == 0 || d.BuffersInFlight == 0 {
			t.Errorf("device %d: %+v; want its plan, memory, allocator and buffers", i, d)
		}
	}
}
