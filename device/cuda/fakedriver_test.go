package cuda

// The whole backend against testdata/fakecuda.c, a stand-in driver library
// built with the system C compiler: it proves the binding end to end on a
// machine without a GPU — dlopen and symbol lookup, arguments in registers
// and on the stack (cuLaunchKernel's last five), out-parameters,
// kernelParams, the JIT's error log — and runs the device and allocator
// conformance suites through it. The stand-in is as strict as the driver
// reference allows (contexts, resets, asynchronous sticky faults, lazy
// driver memory, queued streams a spin kernel can hold, CUDA 13.0's
// versions; its file lists the rules, fakerules_linux_test.go tests each),
// but it is not CUDA: that needs scripts/gpu-check.sh on a GPU.
//
// The fake is loaded in a child process (the test binary run again, with
// the library's path in VRAM_TEST_FAKE_LIBCUDA, which TestMain reads), so
// that the process-wide driver library of the other tests stays unloaded.
// Setting the variable by hand runs every test and benchmark against the
// fake, with no meaning as figures (scripts/gpu-check.sh run --sim puts the
// stand-in on LD_LIBRARY_PATH instead).

import (
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
)

const fakeEnv = "VRAM_TEST_FAKE_LIBCUDA"

func TestWithFakeDriver(t *testing.T) {
	if os.Getenv(fakeEnv) != "" {
		t.Skip("in the child process")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the fake driver is a Linux shared library")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler (cc) to build testdata/fakecuda.c")
	}
	lib := filepath.Join(t.TempDir(), "libcuda-fake.so.1")
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", lib, "testdata/fakecuda.c", "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("building the fake driver: %v\n%s", err, out)
	}
	// The child runs TestFakeDriverChild and the external package's tests
	// that go through the manager (manager_bench_test.go).
	args := []string{"-test.run=^(TestFakeDriverChild|TestManagerCopies)$", "-test.v", "-test.count=1"}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), fakeEnv+"="+lib)
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestFakeDriverChild") ||
		!strings.Contains(string(out), "--- PASS: TestManagerCopies") {
		t.Fatalf("child tests with the fake driver: %v\n%s", err, out)
	}
	if testing.Verbose() {
		t.Logf("child output:\n%s", out)
	}
}

// TestFakeDriverChild runs only in the child process TestWithFakeDriver
// starts.
func TestFakeDriverChild(t *testing.T) {
	if os.Getenv(fakeEnv) == "" {
		t.Skip("run by TestWithFakeDriver")
	}

	t.Run("Open", func(t *testing.T) {
		d, err := Open(0)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		info := d.Info()
		if info.Name != "vram fake CUDA device" || info.ComputeCapability != "9.0" || info.TotalBytes != 1<<30 ||
			info.ContextBytes != 64<<20 || !strings.Contains(info.Driver, "13.0") ||
			info.ID != "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf" {
			t.Errorf("Info = %+v", info)
		}
		if _, err := Open(1); !errors.Is(err, device.ErrNoDevice) || !strings.Contains(err.Error(), "no device 1 of 1") {
			t.Errorf("Open(1) = %v; want ErrNoDevice naming device 1 of 1", err)
		}
		// The driver's own names and descriptions now label Results.
		if s := ErrorOutOfMemory.Error(); s != "CUDA_ERROR_OUT_OF_MEMORY (2): fake: out of memory" {
			t.Errorf("ErrorOutOfMemory.Error() = %q; want the fake driver's text", s)
		}
		if s := Result(4242).Error(); !strings.Contains(s, "CUresult(4242)") {
			t.Errorf("an unknown code prints %q", s)
		}
	})

	t.Run("Launch", func(t *testing.T) {
		d, err := Open(0)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if _, err := d.LoadPTX(".version 7.0\n.entry broken() { bogus; }"); !strings.Contains(fmtErr(err), "fake JIT: unknown instruction") ||
			!strings.Contains(fmtErr(err), "CUDA_ERROR_INVALID_PTX") {
			t.Errorf("LoadPTX of bad PTX = %v; want the JIT log and CUDA_ERROR_INVALID_PTX", err)
		}
		mod, err := d.LoadPTX(fillPTX)
		if err != nil {
			t.Fatal(err)
		}
		fn, err := mod.Function("fill")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mod.Function("nosuch"); !errors.Is(err, device.ErrInvalidValue) {
			t.Errorf(`Function("nosuch") = %v; want ErrInvalidValue`, err)
		}
		const n = 300
		p, err := d.Malloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		// 3 blocks of 128 threads cover 300 runs; the fake checks the
		// dimensions, shared memory, stream and extra (the stack arguments).
		err = fn.Launch(s, device.Dim3{X: 3, Y: 1, Z: 1}, device.Dim3{X: 128, Y: 1, Z: 1}, 1024, p, uint32(n), float32(-1.25), 7.5)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4*n)
		if err := d.CopyDtoH(got, p, s); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			v := math.Float32frombits(uint32(got[4*i]) | uint32(got[4*i+1])<<8 | uint32(got[4*i+2])<<16 | uint32(got[4*i+3])<<24)
			if want := -1.25*float32(i) + 7.5; v != want {
				t.Fatalf("p[%d] = %v, want %v: kernel arguments did not arrive", i, v, want)
			}
		}
		// Too much shared memory: the driver's refusal comes back as a Result.
		err = fn.Launch(s, device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: 1, Y: 1, Z: 1}, 1<<20, p, uint32(1), float32(1), 1.0)
		var r Result
		if !errors.As(err, &r) || r != ErrorInvalidValue {
			t.Errorf("Launch with 1 MiB of shared memory = %v; want CUDA_ERROR_INVALID_VALUE", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := mod.Close(); err != nil {
			t.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
	})

	// The GPU tests run through the fake too.
	t.Run("Allocators", TestAllocatorsOnCUDA)
	t.Run("AllocatorConformance", TestAllocatorConformance)
	t.Run("LaunchPTX", TestLaunchPTX)
	t.Run("PinnedCopies", TestPinnedCopiesAreAsync)
	t.Run("ResetAcrossDevices", TestResetAcrossDevices)
	t.Run("StridedRowByRow", TestStridedRowByRow)
	t.Run("StridedPinned", TestStridedPinned)
	t.Run("DriverOutOfMemory", TestDriverOutOfMemory)
	t.Run("NoAliasAfterReset", TestNoAliasAfterReset)
	t.Run("Regressions", fakeRegressions)
	t.Run("Foreign", fakeForeign)
	t.Run("Rules", fakeRules)

	t.Run("Conformance", TestConformance)
	t.Run("NoCallOutsideTheContext", noCallOutsideTheContext)
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
