"""A stand-in of torch with the interface vram.torch uses (read from
PyTorch's torch/cuda/memory.py, torch/csrc/cuda/CUDAPluggableAllocator.cpp
and c10/cuda/CUDACachingAllocator.cpp), for tests without PyTorch:

  - torch.cuda.memory.CUDAPluggableAllocator(path, alloc_fn_name,
    free_fn_name) loads the library with ctypes and takes the two
    functions' addresses; .allocator() is the raw allocator object, which
    is what MemPool takes (a pybind type: anything else is a TypeError).
  - torch.cuda.MemPool(allocator) and torch.cuda.use_mem_pool(pool): the
    thread's allocations inside go to the pool. Its caching allocator asks
    the allocator for whole segments (2 MiB, or the request rounded up to
    2 MiB) through raw_alloc, with the current stream (0 here); a NULL is
    out of memory: it frees the cached segments of the default pool and of
    pools no MemPool holds any more (release_cached_blocks(context, {0,
    0})), asks once more, and raises torch.OutOfMemoryError. A freed
    tensor's segment stays cached in its pool; a live pool keeps its cache
    through empty_cache(), which frees a dropped pool's through the free
    function.
  - torch.cuda.memory_stats(): the caching allocator's own figures.
  - change_current_allocator(alloc) for vram.torch.install().
"""
__version__ = "2.9.0+standin"

from . import cuda
from .cuda import OutOfMemoryError


class device:
    def __init__(self, spec):
        if isinstance(spec, device):
            self.type, self.index = spec.type, spec.index
            return
        self.type, _, index = str(spec).partition(":")
        self.index = int(index) if index else None


def empty(nbytes, dtype=None, device="cuda"):
    """A CUDA tensor of nbytes bytes (dtype ignored: one byte each)."""
    return cuda._tensor(nbytes)
