package devicetest_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/devicetest"
	"github.com/vramkit/vram/device/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func openSim(t *testing.T) device.Device {
	d, err := sim.New(sim.Config{TotalBytes: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSim: the simulator passes the suite (its own package runs it in
// more configurations).
func TestSim(t *testing.T) { devicetest.Run(t, openSim) }

// Broken devices: each embeds the simulator and breaks one rule.

// leakyFree forgets to give memory back.
type leakyFree struct{ *sim.Device }

func (d leakyFree) Free(p device.Ptr) error { return nil }

// silentDoubleFree accepts a second free of the same pointer.
type silentDoubleFree struct {
	*sim.Device
	freed map[device.Ptr]bool
}

func (d silentDoubleFree) Free(p device.Ptr) error {
	if d.freed[p] {
		return nil
	}
	d.freed[p] = true
	return d.Device.Free(p)
}

// bareErrors returns an unwrapped error for a zero-byte Malloc.
type bareErrors struct{ *sim.Device }

func (d bareErrors) Malloc(n uint64) (device.Ptr, error) {
	if n == 0 {
		return 0, errors.New("bad size")
	}
	return d.Device.Malloc(n)
}

// unordered runs each copy to the host on a fresh stream, ignoring the
// stream it was given.
type unordered struct{ *sim.Device }

func (d unordered) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	return d.Device.CopyDtoH(dst, src, d.Device.DefaultStream())
}

// gappy2D widens each row of a 2-D copy to the smaller pitch, writing
// over the bytes between the destination's rows.
type gappy2D struct{ *sim.Device }

func (d gappy2D) CopyDtoH2D(dst []byte, dstPitch uint64, src device.Ptr, srcPitch, width, height uint64, s device.Stream) error {
	return d.Device.CopyDtoH2D(dst, dstPitch, src, srcPitch, min(dstPitch, srcPitch), height, s)
}

// lax2D skips a 2-D copy whose pitch is below its width instead of
// refusing it.
type lax2D struct{ *sim.Device }

func (d lax2D) CopyHtoD2D(dst device.Ptr, dstPitch uint64, src []byte, srcPitch, width, height uint64, s device.Stream) error {
	if dstPitch < width {
		return nil
	}
	return d.Device.CopyHtoD2D(dst, dstPitch, src, srcPitch, width, height, s)
}

var broken = map[string]struct {
	wrap  func(*sim.Device) device.Device
	fails string   // a subtest that must fail
	says  []string // its failure must contain one of these
}{
	"leaky free":          {func(d *sim.Device) device.Device { return leakyFree{d} }, "Accounting", []string{"after freeing everything"}},
	"silent double free":  {func(d *sim.Device) device.Device { return silentDoubleFree{d, map[device.Ptr]bool{}} }, "Memcheck/double_free", []string{"double free"}},
	"bare errors":         {func(d *sim.Device) device.Device { return bareErrors{d} }, "BadInputs/Malloc_zero", []string{"invalid value"}},
	"unordered copies":    {func(d *sim.Device) device.Device { return unordered{d} }, "Events/cross-stream_wait", []string{"before the event's work", "before stream one's write", "DATA RACE"}},
	"2-D copy over gaps":  {func(d *sim.Device) device.Device { return gappy2D{d} }, "StridedCopies/round_trip/sub-block", []string{"after CopyDtoH2D host byte"}},
	"2-D copy, lax pitch": {func(d *sim.Device) device.Device { return lax2D{d} }, "StridedCopies/refused/HtoD_device_pitch_below_width", []string{"want one wrapping"}},
}

const childEnv = "DEVICETEST_BROKEN"

// TestBrokenChild runs the suite on one broken device; only when started
// by TestSuiteCatchesBrokenDevices.
func TestBrokenChild(t *testing.T) {
	name := os.Getenv(childEnv)
	if name == "" {
		t.Skip("runs only as a child of TestSuiteCatchesBrokenDevices")
	}
	b := broken[name]
	devicetest.Run(t, func(t *testing.T) device.Device {
		d, err := sim.New(sim.Config{TotalBytes: 128 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return b.wrap(d)
	})
}

// TestSuiteCatchesBrokenDevices proves the suite's tests can fail: each
// broken device must fail the subtest aimed at its flaw.
func TestSuiteCatchesBrokenDevices(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("child process")
	}
	for name, b := range broken {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenChild$/^"+strings.ReplaceAll(b.fails, "/", "$/^")+"$", "-test.v")
			cmd.Env = append(os.Environ(), childEnv+"="+name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("the suite passed a device with a %s (err %v):\n%s", name, err, out)
			}
			said := false
			for _, s := range b.says {
				said = said || strings.Contains(string(out), s)
			}
			if !strings.Contains(string(out), "--- FAIL: TestBrokenChild/"+b.fails) || !said {
				t.Fatalf("want %s to fail saying one of %q; output:\n%s", b.fails, b.says, out)
			}
		})
	}
}

// Run a backend's devices through the suite from its own tests.
func ExampleRun() {
	_ = func(t *testing.T) {
		devicetest.Run(t, func(t *testing.T) device.Device {
			d, err := device.Open("sim:vram=256MiB")
			if err != nil {
				t.Fatal(err)
			}
			return d
		})
	}
}
