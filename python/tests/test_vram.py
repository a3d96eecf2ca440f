"""The vram package over libvram, on the simulator: allocations and frees,
each framework's books, peaks, trim, the cap, errors, streams, threads and
fork. Run by libvram's Go tests (VRAM_LIBRARY names the library built for
them), or by hand: VRAM_LIBRARY=… PYTHONPATH=python python3 -m unittest
discover -s python/tests.
"""

import ctypes
import gc
import os
import threading
import unittest

import vram
from vram import _lib

MiB = 1 << 20


class SimTest(unittest.TestCase):
    """A test with a fresh simulated device 0 (64 MiB, a 16 MiB cap)."""

    cap = 16 * MiB

    def setUp(self):
        self.m = vram.open("sim:vram=64MiB", cap=self.cap)
        self.addCleanup(self.close)

    def close(self):
        gc.collect()  # finalizers of a failed test's pointers
        self.m.close()


class TestLibrary(unittest.TestCase):
    def test_loaded_once(self):
        self.assertIs(_lib.lib(), _lib.lib())
        self.assertEqual(_lib.lib().vram_abi_version(), _lib.ABI_VERSION)
        self.assertTrue(_lib.path)

    def test_status_codes(self):
        # The two codes the package acts on are vram.h's.
        self.assertEqual(_lib.lib().vram_strerror(_lib.ENOMEM), b"out of memory")
        self.assertEqual(_lib.lib().vram_strerror(_lib.ERANGE), b"buffer too small")
        self.assertEqual(_lib.lib().vram_strerror(_lib.OK), b"success")

    def test_torch_library(self):
        # What PyTorch's CUDAPluggableAllocator(path, alloc_fn_name,
        # free_fn_name) does with the path it is given: ctypes.CDLL, then
        # both names, which must be the library's own functions.
        try:
            p = _lib.torch_path()
        except OSError as e:
            self.skipTest(str(e))
        t = ctypes.CDLL(p)
        for name in ("vram_torch_alloc", "vram_torch_free"):
            self.assertTrue(ctypes.cast(getattr(t, name), ctypes.c_void_p).value, name)
        self.assertEqual(ctypes.cast(t.vram_torch_free, ctypes.c_void_p).value, _lib.address("vram_torch_free"),
                         "libvram_torch.so's free is libvram.so's: one library, one Go runtime")
        self.assertFalse(hasattr(_lib.lib(), "vram_torch_alloc"), "libvram.so has no allocation hook that returns NULL")

    def test_no_manager(self):
        with self.assertRaisesRegex(vram.VramError, "no manager is open on device 3"):
            vram.manager(3)

    def test_stream_handles(self):
        class TorchStream:
            cuda_stream = 0x40

        class CupyStream:
            ptr = 0x80

        class NumbaStream:
            handle = ctypes.c_void_p(0xC0)

        class NumbaDefault:
            handle = ctypes.c_void_p(None)

        for s, want in [(None, vram.UNORDERED), (7, 7), (TorchStream(), 0x40), (CupyStream(), 0x80),
                        (NumbaStream(), 0xC0), (NumbaDefault(), 0)]:
            self.assertEqual(vram.stream_handle(s), want, s)
        with self.assertRaises(TypeError):
            vram.stream_handle("stream")

    def test_stream_context(self):
        self.assertEqual(vram.current_stream(), vram.UNORDERED)
        with vram.stream(0x40):
            with vram.stream(0x80):
                self.assertEqual(vram.current_stream(), 0x80)
            self.assertEqual(vram.current_stream(), 0x40)
            seen = []
            t = threading.Thread(target=lambda: seen.append(vram.current_stream()))
            t.start()
            t.join()
            self.assertEqual(seen, [vram.UNORDERED], "vram.stream is per thread")
        self.assertEqual(vram.current_stream(), vram.UNORDERED)


class TestManager(SimTest):
    def test_one_manager_per_device(self):
        self.assertIs(vram.manager(0), self.m)
        self.assertEqual((self.m.device, self.m.spec), (0, "sim:vram=64MiB"))
        with self.assertRaisesRegex(vram.VramError, "one budget, per device") as cm:
            vram.open("sim:vram=32MiB")
        self.assertNotIsInstance(cm.exception, vram.OutOfMemoryError)
        self.assertIn(self.m, vram.managers())

    def test_sources_in_header_order(self):
        self.assertEqual(list(self.m.stats()["sources"]), list(vram.SOURCES))

    def test_books(self):
        sizes = {"c": 1000, "torch": 3 * MiB, "cupy": 2 * MiB, "numba": 12345}
        ptrs = {src: self.m.alloc(n, source=src, stream=0x40 * i) for i, (src, n) in enumerate(sizes.items())}
        st = vram.stats()
        for src, n in sizes.items():
            b = st["sources"][src]
            self.assertEqual((b["in_use"], b["peak_in_use"], b["allocs"]), (n, n, 1), src)
        self.assertEqual(st["allocs"], 4)
        self.assertGreaterEqual(st["in_use"], sum(sizes.values()))
        self.assertEqual((st["backend"], st["device_total"], st["cap"]), ("sim", 64 * MiB, self.cap))
        self.m.free(ptrs["torch"], sizes["torch"], stream=0x40)
        st = self.m.stats()
        self.assertEqual((st["sources"]["torch"]["in_use"], st["sources"]["torch"]["peak_in_use"]), (0, 3 * MiB))
        self.m.reset_peaks()
        st = self.m.stats()
        self.assertEqual(st["sources"]["torch"]["peak_in_use"], 0)
        self.assertEqual(st["peak_in_use"], st["in_use"])
        for i, (src, p) in enumerate(ptrs.items()):
            if src != "torch":
                self.m.free(p, 0, stream=0x40 * i)
        self.assertGreater(self.m.stats()["reserved"], 0)
        vram.empty_cache()
        st = self.m.stats()
        self.assertEqual((st["in_use"], st["reserved"]), (0, 0))
        rep = vram.report()
        for want in ("vram manager", "framework", "numba", "cupy", "torch"):
            self.assertIn(want, rep)

    def test_cap(self):
        p = self.m.alloc(10 * MiB, source="torch")
        before = self.m.stats()
        self.assertEqual(vram.oom_report(), "")
        with self.assertRaises(vram.OutOfMemoryError) as cm:
            self.m.alloc(8 * MiB, source="cupy")
        e = cm.exception
        self.assertIsInstance(e, MemoryError)
        self.assertIn("would pass the cap of 16 MiB", str(e))
        self.assertIn("manager:", e.report)
        after = self.m.stats()
        self.assertEqual(after["device_allocs"], before["device_allocs"], "the refusal reached the device")
        self.assertEqual(after["device_free"], before["device_free"])
        self.assertEqual(after["sources"]["cupy"]["ooms"], 1)
        self.assertIn("cap", vram.oom_report())
        self.m.free(p, 10 * MiB)
        self.m.free(self.m.alloc(8 * MiB, source="cupy"))

    def test_bad_calls(self):
        p = self.m.alloc(MiB)
        for call, pattern in [
            (lambda: self.m.free(p + 64), "not live"),
            (lambda: self.m.free(p, 2 * MiB), "allocated with size 1048576"),
            (lambda: self.m.alloc(0), "0 bytes"),
            (lambda: self.m.close(), "still live"),
        ]:
            with self.assertRaisesRegex(vram.VramError, pattern):
                call()
        with self.assertRaises(ValueError):
            self.m.alloc(MiB, source="tensorflow")
        self.m.free(p, MiB)
        with self.assertRaisesRegex(vram.VramError, "freed already"):
            self.m.free(p, MiB)

    def test_sizes_past_64_bits(self):
        # ctypes would take these modulo 2**64: 4096 bytes for 2**64 + 4096,
        # no cap for -1.
        before = self.m.stats()
        for call, error, pattern in [
            (lambda: self.m.alloc(2 ** 64 + 4096), OverflowError, "size 18446744073709555712: more than 2\\*\\*64 - 1"),
            (lambda: self.m.alloc(-4096), ValueError, "size -4096: want 0 to"),
            (lambda: self.m.alloc(2 ** 1000), OverflowError, "size a 1001-bit number"),
            (lambda: self.m.alloc(4096.0), TypeError, "float"),
            (lambda: self.m.free(0, 2 ** 64), OverflowError, "size 18446744073709551616"),
            (lambda: vram.open("sim:vram=64MiB", cap=-1), ValueError, "cap -1: want 0 to"),
            (lambda: vram.open("sim:vram=64MiB", cap=2 ** 64), OverflowError, "cap 18446744073709551616"),
            (lambda: vram.open_lease("sim:vram=64MiB", "/nonexistent/b.sock", cap=-1), ValueError, "cap -1"),
        ]:
            with self.assertRaisesRegex(error, pattern):
                call()
        after = self.m.stats()
        self.assertEqual((after["allocs"], after["in_use"]), (before["allocs"], before["in_use"]), "nothing was allocated")
        self.assertEqual(vram.manager(0), self.m, "no other manager was opened")

    def test_threads(self):
        errors = []

        def work(i):
            try:
                for k in range(200):
                    n = 4096 * (1 + (i * 31 + k * 7) % 64)
                    s = vram.UNORDERED if i % 3 == 0 else 0x100 * (i % 3)
                    self.m.free(self.m.alloc(n, stream=s, source=vram.SOURCES[i % 4]), n, stream=s)
            except Exception as e:  # reported below, in the test's thread
                errors.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        st = self.m.stats()
        self.assertEqual((st["in_use"], st["allocs"], st["frees"]), (0, 1600, 1600))

    @unittest.skipUnless(hasattr(os, "fork"), "no fork here")
    def test_fork(self):
        pid = os.fork()
        if pid == 0:  # the child: a clear error, never a hang
            code = 1
            try:
                self.m.alloc(MiB)
            except vram.VramError as e:
                code = 0 if "forked" in str(e) and "spawn" in str(e) else 2
            except BaseException:
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertTrue(os.WIFEXITED(status), "the child was killed: %d" % status)
        self.assertEqual(os.WEXITSTATUS(status), 0)
        self.m.free(self.m.alloc(MiB))


class TestCupyAllocator(SimTest):
    """vram.cupy.Allocator, the functions install() hands CuPy's
    PythonFunctionAllocator, called as CuPy calls them (malloc(size,
    device_id), free(ptr, device_id)); CuPy itself is not installed here."""

    def test_stream_of_allocation(self):
        from vram import cupy as vcupy

        current = [0x40]
        a = vcupy.Allocator(lambda: current[0])
        p = a.malloc(2 * MiB, 0)
        current[0] = 0x80  # CuPy's current stream changed before the free
        self.assertEqual(self.m.stats()["sources"]["cupy"]["in_use"], 2 * MiB)
        a.free(p, 0)  # freed on 0x40, its allocation's stream
        q = vcupy.Allocator(lambda: 0x40).malloc(2 * MiB, 0)
        self.assertEqual(q, p, "a block freed on its stream is reused on it")
        self.m.free(q)

    def test_out_of_memory_type(self):
        from vram import cupy as vcupy

        class CupyOOM(MemoryError):
            def __init__(self, message, report):
                super().__init__(message)
                self.report = report

        a = vcupy.Allocator(lambda: 0, CupyOOM)
        with self.assertRaises(CupyOOM) as cm:
            a.malloc(32 * MiB, 0)
        self.assertIn("cap", str(cm.exception))
        self.assertIn("cap", cm.exception.report)


class TestCupyCFunctions(unittest.TestCase):
    """install(c_functions=True)'s allocator: refused on a CuPy older than
    14.2 (whose hook cannot let vram's exception through), built from
    libvram_cupy.so's throwing malloc and libvram.so's free on a newer one.
    A stand-in cupy module; the hooks themselves are called, as CuPy calls
    them, by libvram's C++ harness (cupy_harness.cc)."""

    @staticmethod
    def fake_cupy(version):
        import types

        memory = types.SimpleNamespace(CFunctionAllocator=lambda param, malloc, free, owner: (param, malloc, free, owner))
        return types.SimpleNamespace(__version__=version, cuda=types.SimpleNamespace(memory=memory))

    def test_versions(self):
        from vram import cupy as vcupy

        cases = {"14.1.3": (14, 1), "14.2.0": (14, 2), "14.2.0rc1": (14, 2), "15.0.0a1": (15, 0), "13": (13, 0)}
        for v, want in cases.items():
            self.assertEqual(vcupy._version(v), want, v)

    def test_old_cupy_refused(self):
        from vram import cupy as vcupy

        with self.assertRaises(RuntimeError) as cm:
            vcupy.c_functions_allocator(self.fake_cupy("14.1.3"))
        for want in ("14.2", "14.1.3", "install()"):
            self.assertIn(want, str(cm.exception))

    def test_hooks(self):
        from vram import cupy as vcupy

        try:
            _lib.cupy_path()
        except OSError as e:
            self.skipTest("no libvram_cupy.so (libvram's TestPython and pip install build one): %s" % e)
        param, malloc, free, owner = vcupy.c_functions_allocator(self.fake_cupy("14.2.0"))
        self.assertEqual(param, 0)
        self.assertEqual(malloc, ctypes.cast(owner.vram_cupy_malloc, ctypes.c_void_p).value)
        self.assertEqual(free, _lib.address("vram_cupy_free"))
        self.assertFalse(hasattr(_lib.lib(), "vram_cupy_malloc"), "libvram.so must not export a malloc that returns NULL")


_OTHER_PROCESS = """
import sys, vram
m = vram.open_lease(sys.argv[1], sys.argv[2], name="py-b")
try:
    p = m.alloc(40 << 20, source="cupy")
except vram.OutOfMemoryError as e:
    print("refused", e)
else:
    m.free(p)
    print("ok")
"""


@unittest.skipUnless(os.environ.get("VRAM_TEST_BROKER"), "no broker: libvram's TestPython serves one (VRAM_TEST_BROKER)")
class TestLease(unittest.TestCase):
    """A manager whose budget is a broker's lease, beside another process's
    on one shared simulated device of 64 MiB (each guaranteed half)."""

    def setUp(self):
        self.socket = os.environ["VRAM_TEST_BROKER"]
        self.spec = os.environ["VRAM_TEST_BROKER_SPEC"]

    def other(self):
        import subprocess
        import sys
        out = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, self.spec, self.socket],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout.strip()

    def test_lease(self):
        m = vram.open_lease(self.spec, self.socket, name="py-a")
        self.addCleanup(m.close)
        p = m.alloc(40 * MiB, source="torch")  # borrows what the other leaves
        got = self.other()
        self.assertTrue(got.startswith("refused") and "py-a" in got, got)
        m.free(p)
        m.trim()
        for _ in range(100):  # the freed memory reaches the broker
            got = self.other()
            if got == "ok":
                break
        self.assertEqual(got, "ok")
        self.assertEqual(m.stats()["ooms"], 0)

    def test_no_broker(self):
        with self.assertRaises(vram.VramError) as cm:
            vram.open_lease("sim:vram=64MiB", "/nonexistent/b.sock")
        self.assertIn("/nonexistent/b.sock", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
