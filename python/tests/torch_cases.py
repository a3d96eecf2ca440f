"""vram.torch's routes against the stand-in of PyTorch (standins/torch),
run by test_torch.py in a child python3 whose path finds the stand-in
first: the MemPool route's segments from vram's pool and budget, PyTorch's
own statistics, and a refusal as PyTorch's OutOfMemoryError after it has
freed what its pool caches."""

import gc
import unittest

import torch

import vram
import vram.torch

MiB = 1 << 20


class TestMemPool(unittest.TestCase):
    def setUp(self):
        # A 16 MiB cap; the stand-in's segments are 2 MiB, or the request
        # rounded up to 2 MiB.
        self.m = vram.open("sim:vram=64MiB", cap=16 * MiB)
        self.addCleanup(self.m.close)
        self.addCleanup(torch.cuda.empty_cache)
        self.addCleanup(gc.collect)

    def torch_in_use(self):
        return vram.stats()["sources"]["torch"]["in_use"]

    def test_segments_from_vram(self):
        pool = vram.torch.mempool()
        self.assertIs(pool, vram.torch.mempool(0), "one pool a device")
        self.assertIs(pool.allocator.alloc_fn, pool.allocator.alloc_fn)
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(3 * MiB)  # a 4 MiB segment
            b = torch.empty(100)      # a 2 MiB one
        c = torch.empty(5 * MiB)      # outside the pool: PyTorch's own
        self.assertEqual(self.torch_in_use(), 6 * MiB, "the pool's segments are vram's, counted under torch")
        st = torch.cuda.memory_stats()
        self.assertEqual(st["reserved_bytes.all.current"], 6 * MiB + 6 * MiB, "PyTorch's statistics count both")
        del a, b, c
        self.assertEqual(self.torch_in_use(), 6 * MiB, "freed tensors' segments stay in PyTorch's cache")
        torch.cuda.empty_cache()
        self.assertEqual(self.torch_in_use(), 0, "empty_cache gives them back to vram")

    def test_refusal_after_the_cache(self):
        pool = vram.torch.mempool()
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(8 * MiB)
            del a  # 8 MiB cached by PyTorch's pool
            # 12 MiB: vram refuses (8 + 12 > 16), PyTorch frees its cache
            # and asks again, and it fits.
            b = torch.empty(12 * MiB)
            self.assertEqual(self.torch_in_use(), 12 * MiB)
            with self.assertRaises(torch.OutOfMemoryError):
                torch.empty(6 * MiB)  # 12 + 6 > 16, nothing cached to free
            del b
        self.assertIn("cap", vram.oom_report(), "vram's side of the refusal")

    def test_device_spec(self):
        self.assertIs(vram.torch.mempool("cuda:0"), vram.torch.mempool(torch.device("cuda")))
        with self.assertRaises(ValueError):
            vram.torch.mempool("cpu")

    def test_no_mempool_in_this_pytorch(self):
        saved = torch.cuda.MemPool
        del torch.cuda.MemPool
        self.addCleanup(setattr, torch.cuda, "MemPool", saved)
        with self.assertRaisesRegex(RuntimeError, r"torch.cuda.MemPool.*use vram.torch.install\(\) instead"):
            vram.torch.mempool(1)


class TestInstall(unittest.TestCase):
    def test_whole_allocator(self):
        m = vram.open("sim:vram=64MiB", cap=16 * MiB)
        self.addCleanup(m.close)
        self.addCleanup(torch.cuda.memory._current.__setitem__, 0, None)
        self.addCleanup(vram.torch._installed.__setitem__, 0, False)
        try:
            alloc = vram.torch.install()
        except OSError as e:  # no libvram_torch.so here: said so
            self.assertIn("libvram_torch.so", str(e))
            return
        self.assertIs(torch.cuda.memory._current[0], alloc.allocator())
        self.assertEqual(alloc.allocator().reset_fn, vram._lib.address("vram_torch_empty_cache"))
        with self.assertRaisesRegex(RuntimeError, "whole allocator"):
            vram.torch.mempool()


if __name__ == "__main__":
    unittest.main()
