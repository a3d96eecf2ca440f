"""vram's Python API under Numba's CUDA simulator on vram's simulator: the
arrays of a response are Numba's simulator arrays over the simulated device
memory itself, so a kernel written for the GPU runs on the host on vram's
arrays, between vram's copies. Runs only with NUMBA_ENABLE_CUDASIM=1 (set
before Numba is imported; libvram's Go test TestPythonCUDASim runs it so);
skipped otherwise.
"""

import gc
import os
import unittest

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
why = "NUMBA_ENABLE_CUDASIM=1 not set: Numba's CUDA simulator is chosen at its import"
if SIM:
    try:
        import numpy as np
        from numba import cuda
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    except ImportError as e:  # pragma: no cover - reported as a skip
        SIM, why = False, "numba not importable: %s" % e

import vram

KiB = 1 << 10

if SIM:
    @cuda.jit
    def axpy(a, x, y, out):
        # A grid-stride loop: the simulator runs each thread as a Python
        # thread, so a few threads over many runs keep it quick.
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for i in range(start, x.shape[0], stride):
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def rowsum(m, out):
        # m is (rows, runs), chunked along axis 1.
        start, stride = cuda.grid(1), cuda.gridsize(1)
        for j in range(start, m.shape[1], stride):
            s = 0.0
            for i in range(m.shape[0]):
                s += m[i, j]
            out[j] = s


@unittest.skipUnless(SIM, why)
class TestNumbaSimulator(unittest.TestCase):
    # A 64 KiB device of 4 KiB pages: a batch of 16 Ki runs (64 KiB per
    # float32 array) does not fit.
    spec = "sim:vram=64KiB,granularity=4KiB,context=0"

    def setUp(self):
        self.m = vram.Manager(self.spec)
        self.addCleanup(self.close)

    def close(self):
        gc.collect()
        self.m.close()

    def test_arrays_are_numbas_over_the_simulated_memory(self):
        c = self.m.register("c")
        c.queue({"x": vram.ArrayRequest((256,), "float32")})
        r = c.allocate()
        x = r.arrays["x"]
        self.assertIsInstance(x, FakeCUDAArray)
        self.assertEqual((x.shape, x.dtype), ((256,), np.float32))
        dev = r.device_arrays["x"]
        host = np.arange(256, dtype=np.float32)
        c.to_device(dev, host)
        c.sync()
        np.testing.assert_array_equal(x.copy_to_host(), host, "a copy in shows in Numba's array")
        axpy[2, 32](np.float32(2), x, x, x)  # x = 3x, by a kernel on vram's memory
        back = np.zeros(256, np.float32)
        c.from_device(back, x)  # Numba's array of the response copies as its DeviceArray
        c.sync()
        np.testing.assert_array_equal(back, 3 * host, "the kernel's writes are in vram's device memory")

    def test_two_components_chunked(self):
        runs = 16 * KiB
        a = np.float32(0.5)
        x = np.random.default_rng(1).random(runs, dtype=np.float32)
        y = np.random.default_rng(2).random(runs, dtype=np.float32)
        out = np.zeros(runs, np.float32)
        solver = self.m.register("solver", group="batch")
        saver = self.m.register("saver", group="batch")
        b = vram.Batch()
        b.input(solver, "x", x)
        b.input(solver, "y", y)
        b.output(saver, "out", out)
        n = 0
        for ch in b.chunks():
            self.assertIsInstance(ch["x"], FakeCUDAArray)
            self.assertEqual(ch["out"].shape, (b.plan.chunk_length,))
            axpy[4, 32, ch.stream](a, ch["x"], ch["y"], ch["out"])
            n += 1
        self.assertGreater(n, 1, "the batch is bigger than the device")
        np.testing.assert_allclose(out, a * x + y, rtol=1e-6)

    def test_chunk_axis_one(self):
        rows, runs = 3, 8 * KiB
        m = np.random.default_rng(3).random((rows, runs), dtype=np.float32)
        sums = np.zeros(runs, np.float32)
        c = self.m.register("c", group="g")
        b = vram.Batch()
        b.input(c, "m", m, chunk_axis=1)
        b.output(c, "sums", sums)
        for ch in b.chunks():
            rowsum[4, 32, ch.stream](ch["m"], ch["sums"])
        self.assertGreater(b.plan.chunks, 1)
        np.testing.assert_allclose(sums, m.sum(axis=0), rtol=1e-5)

    def test_arrays_option(self):
        self.m.close()
        self.m = vram.Manager(self.spec, arrays="vram")
        c = self.m.register("c")
        c.queue({"x": vram.ArrayRequest((8,), "int32")})
        r = c.allocate()
        self.assertIsInstance(r.arrays["x"], vram.DeviceArray)
        self.assertIsInstance(r.device_arrays["x"].numba(), FakeCUDAArray)


if __name__ == "__main__":
    unittest.main()
