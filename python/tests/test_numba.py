"""vram.numba.VramNumbaManager against the installed Numba, without a GPU.

Numba cannot make a CUDA context here, so the plugin is built as Numba
builds it (set_memory_manager makes one with context=None; a context gives
itself) and its methods are called directly, against Numba's own
MemoryPointer and MemoryInfo types. What needs a GPU — a kernel on the
plugin's arrays, pinned host memory, Numba's context creation calling
initialize — is scripts/gpu-python.sh's.
"""

import gc
import os
import subprocess
import sys
import unittest
import weakref

try:
    import numba
    from numba import cuda
    from numba.cuda.cudadrv import driver
    from numba.cuda.cudadrv.error import CudaSupportError
except ImportError as e:  # pragma: no cover - reported as a skip
    numba = None
    why = "numba not importable: %s" % e

import vram

MiB = 1 << 20


class _Device:
    id = 0


class _Context:
    """What the plugin reads of Numba's Context: its device's id."""

    device = _Device()


@unittest.skipIf(numba is None, "numba is not installed" if numba is None else "")
class TestVramNumbaManager(unittest.TestCase):
    def setUp(self):
        from vram.numba import VramNumbaManager

        self.cls = VramNumbaManager
        self.m = vram.open("sim:vram=64MiB", cap=16 * MiB)
        self.addCleanup(self.close)
        self.ctx = _Context()
        self.plugin = VramNumbaManager(context=self.ctx)
        self.plugin.initialize()

    def close(self):
        gc.collect()
        self.m.close()

    def test_interface(self):
        self.assertEqual(self.plugin.interface_version, 1)
        self.assertTrue(issubclass(self.cls, cuda.HostOnlyCUDAMemoryManager))
        # set_memory_manager builds one with context=None and checks its
        # interface version; then restore Numba's default.
        cuda.set_memory_manager(self.cls)
        self.assertIs(driver._memory_manager, self.cls)
        driver._memory_manager = None

    def test_environment_variable(self):
        code = ("from numba.cuda.cudadrv import driver; driver._ensure_memory_manager(); "
                "import vram.numba; assert driver._memory_manager is vram.numba.VramNumbaManager, driver._memory_manager")
        env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="vram.numba")
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_memalloc(self):
        mp = self.plugin.memalloc(3 * MiB)
        self.assertIsInstance(mp, cuda.MemoryPointer)
        self.assertEqual((mp.size, mp._cuda_memsize_), (3 * MiB, 3 * MiB))
        self.assertTrue(mp.device_pointer_value)
        self.assertIs(mp.context.device, self.ctx.device)  # a weak proxy of the context
        st = self.m.stats()
        self.assertEqual(st["sources"]["numba"]["in_use"], 3 * MiB)
        view = mp.view(MiB, 2 * MiB)
        self.assertEqual((view.device_pointer_value - mp.device_pointer_value, view.size), (MiB, MiB))
        mp.free()  # Numba's explicit free runs the finalizer
        self.assertEqual(self.m.stats()["sources"]["numba"]["in_use"], 0)
        mp = self.plugin.memalloc(MiB)
        ref = weakref.ref(mp)
        del mp, view
        gc.collect()
        self.assertIsNone(ref())
        st = self.m.stats()
        self.assertEqual((st["sources"]["numba"]["in_use"], st["sources"]["numba"]["frees"]), (0, 2),
                         "dropping the last reference frees")

    def test_memalloc_on_a_stream(self):
        with vram.stream(0x40):
            mp = self.plugin.memalloc(MiB)
        addr = mp.device_pointer_value
        mp.free()  # on 0x40, its allocation's stream: reused there at once
        with vram.stream(0x40):
            again = self.plugin.memalloc(MiB)
        self.assertEqual(again.device_pointer_value, addr)
        again.free()

    def test_cap(self):
        keep = self.plugin.memalloc(12 * MiB)
        with self.assertRaises(vram.OutOfMemoryError) as cm:
            self.plugin.memalloc(8 * MiB)
        self.assertIsInstance(cm.exception, MemoryError)
        self.assertIn("cap of 16 MiB", str(cm.exception))
        self.assertIn("numba", cm.exception.report)
        self.assertEqual(self.m.stats()["sources"]["numba"]["ooms"], 1)
        keep.free()

    def test_get_memory_info(self):
        info = self.plugin.get_memory_info()
        self.assertIsInstance(info, cuda.MemoryInfo)
        self.assertEqual(info, (16 * MiB, 16 * MiB))
        keep = self.plugin.memalloc(4 * MiB)
        self.assertEqual(self.plugin.get_memory_info().free, 12 * MiB)
        keep.free()

    def test_ipc_refused(self):
        mp = self.plugin.memalloc(MiB)
        with self.assertRaisesRegex(NotImplementedError, "IPC"):
            self.plugin.get_ipc_handle(mp)
        mp.free()

    def test_reset_trims(self):
        self.plugin.memalloc(MiB).free()
        self.assertGreater(self.m.stats()["reserved"], 0)
        self.plugin.reset()
        self.assertEqual(self.m.stats()["reserved"], 0)

    def test_defer_cleanup(self):
        with self.plugin.defer_cleanup():
            self.assertTrue(self.plugin.deallocations.is_disabled)
            mp = self.plugin.memalloc(MiB)
            mp.free()  # device frees are stream-ordered, not deferred
            self.assertEqual(self.m.stats()["sources"]["numba"]["in_use"], 0)
        self.assertFalse(self.plugin.deallocations.is_disabled)

    def test_host_memory_is_numbas(self):
        # memhostalloc and mempin are HostOnlyCUDAMemoryManager's: without a
        # GPU they fail as Numba's own do, with its driver error.
        self.assertIs(self.cls.memhostalloc, cuda.HostOnlyCUDAMemoryManager.memhostalloc)
        self.assertIs(self.cls.mempin, cuda.HostOnlyCUDAMemoryManager.mempin)
        if cuda.is_available():
            self.skipTest("a GPU is present: scripts/gpu-python.sh checks host memory")
        with self.assertRaises(CudaSupportError):
            self.plugin.memhostalloc(4096)
        buf = bytearray(4096)
        with self.assertRaises(CudaSupportError):
            self.plugin.mempin(buf, id(buf), 4096)


if __name__ == "__main__":
    unittest.main()
