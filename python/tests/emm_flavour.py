"""vram's Numba EMM plugin against one Numba's EMM interface, driven as that
Numba drives it (a Context made with the plugin, initialize, memalloc,
views, memset, get_memory_info, reset, defer_cleanup, the finalizer).

Run by test_numba_interfaces.py in a child python3 whose path starts with
one stand-in of python/tests/standins/ (numba 0.56's built-in target,
numba-cuda, numba-cuda-mlir); VRAM_EMM_PLUGIN names the plugin module
(vram.numba or vram.numba_mlir), VRAM_EMM_CUDA the module whose
attributes are the interface (numba.cuda, numba_cuda_mlir.cuda) and
VRAM_EMM_DRIVER its driver module.
"""

import gc
import importlib
import os
import unittest

import vram

MiB = 1 << 20

cuda = importlib.import_module(os.environ["VRAM_EMM_CUDA"])
driver = importlib.import_module(os.environ["VRAM_EMM_DRIVER"])
plugin = importlib.import_module(os.environ["VRAM_EMM_PLUGIN"])

from _emmbase import Context  # noqa: E402  (the stand-ins' directory is on the path)


class TestPlugin(unittest.TestCase):
    def setUp(self):
        driver._state["manager"] = None
        self.m = vram.open("sim:vram=64MiB", cap=16 * MiB)
        self.addCleanup(self.close)

    def close(self):
        gc.collect()
        for m in vram.managers():
            m.close()

    def context(self):
        cuda.set_memory_manager(plugin.VramNumbaManager)
        return Context(driver)

    def numba_in_use(self, m=None):
        return (m or self.m).stats()["sources"]["numba"]["in_use"]

    def test_set_memory_manager(self):
        cuda.set_memory_manager(plugin.VramNumbaManager)
        self.assertIs(driver._state["manager"], plugin.VramNumbaManager)
        self.assertTrue(issubclass(plugin.VramNumbaManager, cuda.HostOnlyCUDAMemoryManager))
        self.assertEqual(plugin.VramNumbaManager.__module__, plugin.__name__)

    def test_environment_variable(self):
        # NUMBA_CUDA_MEMORY_MANAGER names the plugin's module (set by the runner).
        self.assertEqual(os.environ["NUMBA_CUDA_MEMORY_MANAGER"], plugin.__name__)
        ctx = Context(driver)
        self.assertIsInstance(ctx.memory_manager, plugin.VramNumbaManager)

    def test_memalloc(self):
        ctx = self.context()
        mp = ctx.memalloc(3 * MiB)
        self.assertIsInstance(mp, cuda.MemoryPointer)
        self.assertEqual((mp.size, mp._cuda_memsize_), (3 * MiB, 3 * MiB))
        self.assertTrue(mp.device_pointer_value)
        self.assertIs(mp.context.device, ctx.device)
        self.assertEqual(self.numba_in_use(), 3 * MiB)
        mp.memset(0)  # the driver function takes the pointer as it was given
        view = mp.view(MiB, 2 * MiB)
        self.assertEqual((view.device_pointer_value - mp.device_pointer_value, view.size), (MiB, MiB))
        view.memset(0)
        mp.free()
        self.assertEqual(self.numba_in_use(), 0)
        mp = ctx.memalloc(MiB)
        del mp, view
        gc.collect()
        st = self.m.stats()["sources"]["numba"]
        self.assertEqual((st["in_use"], st["frees"]), (0, 2), "dropping the last reference frees")

    def test_stream(self):
        ctx = self.context()
        with vram.stream(0x40):
            mp = ctx.memalloc(MiB)
        addr = mp.device_pointer_value
        mp.free()
        with vram.stream(0x40):
            again = ctx.memalloc(MiB)
        self.assertEqual(again.device_pointer_value, addr, "a free on its allocation's stream is reused there")
        again.free()

    def test_cap(self):
        ctx = self.context()
        keep = ctx.memalloc(12 * MiB)
        with self.assertRaises(vram.OutOfMemoryError) as cm:
            ctx.memalloc(8 * MiB)
        self.assertIsInstance(cm.exception, MemoryError)
        self.assertIn("cap of 16 MiB", str(cm.exception))
        keep.free()

    def test_get_memory_info(self):
        ctx = self.context()
        self.assertEqual(ctx.get_memory_info(), cuda.MemoryInfo(free=16 * MiB, total=16 * MiB))
        keep = ctx.memalloc(4 * MiB)
        self.assertEqual(ctx.get_memory_info().free, 12 * MiB)
        keep.free()

    def test_reset(self):
        ctx = self.context()
        ctx.memalloc(MiB).free()
        self.assertGreater(self.m.stats()["reserved"], 0)
        ctx.reset()
        self.assertEqual(self.m.stats()["reserved"], 0, "the pool's cache back to the device")
        self.assertEqual(ctx.memory_manager.deallocations.cleared, 1, "super().reset() ran")

    def test_reset_before_initialize_opens_nothing(self):
        self.m.close()
        p = plugin.VramNumbaManager(context=None)
        p.reset()  # Numba may reset a plugin it never initialized
        self.assertEqual(vram.managers(), [])

    def test_defer_cleanup(self):
        ctx = self.context()
        with ctx.defer_cleanup():
            self.assertTrue(ctx.memory_manager.deallocations.is_disabled, "super().defer_cleanup() held")
            ctx.memalloc(MiB).free()
            self.assertEqual(self.numba_in_use(), 0, "device frees are not deferred")
        self.assertFalse(ctx.memory_manager.deallocations.is_disabled)

    def test_manager_closed_and_opened_again(self):
        # W8: the plugin served allocations from the first manager it met
        # for ever, a closed one included.
        ctx = self.context()
        ctx.memalloc(MiB).free()
        self.m.close()
        m2 = vram.open("sim:vram=32MiB", cap=8 * MiB)
        mp = ctx.memalloc(2 * MiB)
        self.assertEqual(self.numba_in_use(m2), 2 * MiB)
        self.assertEqual(ctx.get_memory_info().total, 8 * MiB)
        mp.free()
        self.assertEqual(self.numba_in_use(m2), 0)


if __name__ == "__main__":
    unittest.main()
