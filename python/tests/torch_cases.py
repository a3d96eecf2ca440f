"""vram.torch's routes against the stand-in of PyTorch (standins/torch),
run by test_torch.py in a child python3 whose path finds the stand-in
first: the MemPool route's segments from vram's pool and budget, PyTorch's
own statistics, its cache, and a refusal as PyTorch's OutOfMemoryError."""

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
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(3 * MiB)  # a 4 MiB segment
            b = torch.empty(100)      # a 2 MiB one
        c = torch.empty(5 * MiB)      # outside the pool: PyTorch's own
        self.assertEqual(self.torch_in_use(), 6 * MiB, "the pool's segments are vram's, counted under torch")
        st = torch.cuda.memory_stats()
        self.assertEqual(st["reserved_bytes.all.current"], 6 * MiB + 6 * MiB, "PyTorch's statistics count both")
        del a, b, c
        self.assertEqual(self.torch_in_use(), 6 * MiB, "freed tensors' segments stay in the pool's cache")
        torch.cuda.empty_cache()
        self.assertEqual(self.torch_in_use(), 6 * MiB, "a live pool keeps its cache")
        del pool
        torch.cuda.empty_cache()
        self.assertEqual(self.torch_in_use(), 0, "a dropped pool's segments go back to vram")

    def test_refusal(self):
        pool = vram.torch.mempool()
        with torch.cuda.use_mem_pool(pool):
            a = torch.empty(12 * MiB)
            with self.assertRaises(torch.OutOfMemoryError):
                torch.empty(6 * MiB)  # 12 + 6 > 16: NULL, and PyTorch's error, not a C++ exception
            b = torch.empty(4 * MiB)  # 12 + 4 fits
            del a, b
            with self.assertRaises(torch.OutOfMemoryError):
                torch.empty(14 * MiB)  # the pool's 16 MiB cached count: PyTorch keeps them
        self.assertIn("cap", vram.oom_report(), "vram's side of the refusal")
        del pool
        torch.cuda.empty_cache()
        self.assertEqual(self.torch_in_use(), 0)

    def test_device_spec(self):
        for d in (None, 0, "cuda", "cuda:0", torch.device("cuda")):
            self.assertIsInstance(vram.torch.mempool(d), torch.cuda.MemPool)
        with self.assertRaises(ValueError):
            vram.torch.mempool("cpu")
        with self.assertRaisesRegex(vram.VramError, "device 1"):
            vram.torch.mempool(1)  # no manager open there

    def test_no_mempool_in_this_pytorch(self):
        saved = torch.cuda.MemPool
        del torch.cuda.MemPool
        self.addCleanup(setattr, torch.cuda, "MemPool", saved)
        with self.assertRaisesRegex(RuntimeError, r"torch.cuda.MemPool.*use vram.torch.install\(\) instead"):
            vram.torch.mempool()


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
