"""gpu_python.py: Numba, CuPy and PyTorch on one vram pool and one cap, in
one process, on a GPU (run by scripts/gpu-check.sh, and by
scripts/gpu-python.sh; see them for how).

vram's own manager allocates and is refused past the cap; then each
framework that is installed runs a workload on memory from vram: a Numba
kernel on arrays from the EMM plugin, a CuPy and a PyTorch computation
through their allocator hooks, each checked against the host. Then every
framework asks for more than the cap leaves and must be refused with
vram's error before the device is asked (CuPy twice: through its Python
allocator hook and through vram's C hook, which throws); torch.cuda.
empty_cache() must empty vram's cache; and the shared figures are
printed. A framework that is not installed is a SKIP line, not a failure;
a check that fails is a FAIL line and the exit status is 1. The last lines
are one "CHECK name pass|fail|skip note" per part, for gpu-check.sh's
RESULT table.

Environment: GPU_PYTHON_DEVICE (default cuda:0; a "sim" spec for a dry run
of the script without a GPU, where every framework skips), GPU_PYTHON_CAP
(bytes, default 1 GiB).
"""

import os
import sys
import traceback

import vram

MiB = 1 << 20
failed = []
results = []  # (part, pass|fail|skip, note), in order


def line(tag, what):
    print("%-5s %s" % (tag, what), flush=True)


def check(ok, what):
    line("ok" if ok else "FAIL", what)
    if not ok:
        failed.append(what)


def section(name, fn):
    before = len(failed)
    try:
        fn()
    except ImportError as e:
        line("SKIP", "%s: not installed here (%s)" % (name, e))
        results.append((name, "skip", "not installed: %s" % e))
        return
    except Exception as e:  # a failed workload is reported, and the others still run
        failed.append(name)
        line("FAIL", "%s raised:" % name)
        traceback.print_exc(file=sys.stdout)
        results.append((name, "fail", "raised %s" % type(e).__name__))
        return
    if len(failed) > before:
        results.append((name, "fail", failed[before]))
    else:
        results.append((name, "pass", ""))


def run_vram(m, cap):
    p = m.alloc(8 * MiB, source="c")
    check(in_use("c") == 8 * MiB, "vram: 8 MiB from the manager, counted under c")
    m.free(p, 8 * MiB)
    try:
        m.alloc(cap + 1, source="c")
        check(False, "vram: an allocation past the cap was refused")
    except vram.OutOfMemoryError as e:
        check("cap" in str(e), "vram: past the cap, vram.OutOfMemoryError: %s" % str(e)[:160])


def in_use(source):
    return vram.stats()["sources"][source]["in_use"]


def setup_numba():
    from numba import cuda

    from vram.numba import VramNumbaManager

    cuda.set_memory_manager(VramNumbaManager)  # before Numba's first context


def install_torch():
    import torch  # noqa: F401 - an ImportError here is a SKIP

    import vram.torch as vram_torch

    vram_torch.install()
    line("ok", "torch: vram is PyTorch's CUDA allocator (%s)" % vram._lib.torch_path())


def run_numba(cap):
    import numpy as np
    from numba import cuda

    @cuda.jit
    def axpy(a, x, y, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

    n = 1 << 22
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    s = cuda.stream()
    with vram.stream(s):
        dx, dy = cuda.to_device(x, stream=s), cuda.to_device(y, stream=s)
        dout = cuda.device_array(n, dtype=np.float32, stream=s)
    check(in_use("numba") >= 3 * 4 * n, "numba: three arrays of %d MiB from vram (numba in use %d MiB)" % (4 * n // MiB, in_use("numba") // MiB))
    axpy[(n + 255) // 256, 256, s](np.float32(2), dx, dy, dout)
    got = dout.copy_to_host(stream=s)
    s.synchronize()
    check(np.array_equal(got, 2 * x + y), "numba: a kernel on the plugin's arrays matches the host")
    try:
        cuda.device_array(cap // 4 + 1, dtype=np.float32)  # cap + 4 bytes
        check(False, "numba: an array past the cap was refused")
    except vram.OutOfMemoryError as e:
        check("cap" in str(e), "numba: past the cap, vram.OutOfMemoryError: %s" % str(e)[:160])
    del dx, dy, dout
    check(in_use("numba") == 0, "numba: the arrays' memory is back when they are dropped")


def run_cupy(cap):
    import cupy as cp

    import vram.cupy as vram_cupy

    vram_cupy.install()
    a = cp.arange(1 << 22, dtype=cp.float64)
    b = (a * 2).sum()
    check(float(b) == float(2 * ((1 << 22) - 1) * (1 << 22) / 2), "cupy: a sum on vram memory matches")
    check(in_use("cupy") >= 8 << 22, "cupy: its arrays counted under cupy (%d MiB)" % (in_use("cupy") // MiB))
    try:
        cp.empty(cap + 1, dtype=cp.uint8)
        check(False, "cupy: an array past the cap was refused")
    except cp.cuda.memory.OutOfMemoryError as e:
        check("cap" in str(e), "cupy: past the cap, CuPy's OutOfMemoryError: %s" % str(e)[:160])
    del a, b


def run_cupy_c(cap):
    import cupy as cp

    import vram.cupy as vram_cupy

    try:
        vram_cupy.install(c_functions=True)
    except RuntimeError as e:  # an older CuPy: the C hook may not throw there
        raise ImportError(str(e)) from e
    try:
        a = cp.arange(1 << 20, dtype=cp.float32)
        check(float(a.sum()) == float(((1 << 20) - 1) * (1 << 20) / 2), "cupy (C hook): a sum on vram memory matches")
        try:
            cp.empty(cap + 1, dtype=cp.uint8)
            check(False, "cupy (C hook): an array past the cap was refused")
        except MemoryError as e:
            check("cap" in str(e), "cupy (C hook): past the cap, %s: %s" % (type(e).__name__, str(e)[:160]))
        del a
    finally:
        vram_cupy.install()


def run_torch(cap):
    import torch

    x = torch.randn(2048, 2048, device="cuda")
    y = x @ x.T
    ref = (x.cpu().double() @ x.cpu().double().T).float()
    check(torch.allclose(y.cpu(), ref, rtol=1e-3, atol=1e-2), "torch: a matmul on vram memory matches the host")
    check(in_use("torch") >= 2 * 4 * 2048 * 2048, "torch: its tensors counted under torch (%d MiB)" % (in_use("torch") // MiB))
    try:
        torch.empty(cap + 1, dtype=torch.uint8, device="cuda")
        check(False, "torch: a tensor past the cap was refused")
    except RuntimeError as e:
        check("cap" in str(e), "torch: past the cap, RuntimeError: %s" % str(e)[:160])
    del x, y
    torch.cuda.synchronize()
    before = vram.stats()["reserved"]
    torch.cuda.empty_cache()
    after = vram.stats()["reserved"]
    check(after < before or before == vram.stats()["in_use"], "torch: empty_cache trims vram's pool (%d → %d MiB reserved)" % (before // MiB, after // MiB))


def main():
    spec = os.environ.get("GPU_PYTHON_DEVICE", "cuda:0")
    cap = int(os.environ.get("GPU_PYTHON_CAP", str(1 << 30)))
    m = vram.open(spec, cap=cap)
    line("ok", "vram: %r, cap %d MiB" % (m, cap // MiB))
    section("vram", lambda: run_vram(m, cap))
    # Every hook is installed before its framework's first allocation.
    if spec.startswith("cuda") and not os.environ.get("GPU_PYTHON_NO_FRAMEWORKS"):
        section("numba", lambda: (setup_numba(), run_numba(cap)))
        section("torch install", install_torch)
        results.pop()  # counted with torch
        section("cupy", lambda: run_cupy(cap))
        section("cupy-c-hook", lambda: run_cupy_c(cap))
        section("torch", lambda: run_torch(cap))
    else:
        line("SKIP", "%s: the frameworks are not run (a dry run of the script)" % spec)
        for name in ("numba", "cupy", "cupy-c-hook", "torch"):
            results.append((name, "skip", "no GPU: %s" % spec))
    st = vram.stats()
    print()
    print("shared figures (one pool, one cap): in use %d MiB, reserved %d MiB, cap %d MiB, charged %d MiB, refusals %d"
          % (st["in_use"] // MiB, st["reserved"] // MiB, st["cap"] // MiB, st["cap_used"] // MiB, st["ooms"]))
    for name, b in st["sources"].items():
        print("  %-6s in use %8d MiB  peak %8d MiB  allocs %6d  frees %6d  refused %d"
              % (name, b["in_use"] // MiB, b["peak_in_use"] // MiB, b["allocs"], b["frees"], b["ooms"]))
    print()
    print(vram.report())
    print("last refusal's report:")
    print(vram.oom_report() or "(none)")
    for name, result, note in results:
        print("CHECK %s %s %s" % (name, result, note))
    if failed:
        print("FAILED: %s" % "; ".join(failed))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
