"""vram and PyTorch: two routes to vram's pool and budget.

    import vram.torch

    # 1. A pool beside PyTorch's own allocator (torch.cuda.MemPool):
    with torch.cuda.use_mem_pool(vram.torch.mempool()):
        model = Model().cuda()       # these tensors' memory is vram's

    # 2. vram as PyTorch's whole CUDA allocator (its pluggable allocator):
    vram.torch.install()             # before the first CUDA allocation

mempool() keeps PyTorch's caching allocator, which asks vram for whole
segments (vram_torch_pool_alloc and vram_torch_free, in libvram.so) and
splits, caches and reuses them itself, so torch.compile, CUDA graphs and
torch.cuda.memory_stats() work as without vram, and vram's budget counts
the segments under "torch", cached ones included. A segment vram refuses
is NULL to PyTorch, which frees its default pool's cache, asks once more,
and raises torch.OutOfMemoryError; vram.oom_report() has vram's side of
it. The pool's own cached segments stay the pool's until it is dropped
(CUDACachingAllocator's release_cached_blocks frees a private pool's only
once no MemPool holds it). Memory allocated outside use_mem_pool, and a
CUDA graph's private pool, are PyTorch's own, outside vram's budget.

install() replaces PyTorch's whole allocator: every CUDA tensor is vram's,
each allocation is vram's (no PyTorch cache on top), and a refusal raises
RuntimeError with vram's message. torch.compile refuses the pluggable
allocator (pytorch#163257: it does not support checkPoolLiveAllocations),
torch.cuda.memory_stats() and friends are not supported by it (use
vram.stats() and vram.report()), and torch.cuda.empty_cache() trims vram's
pool. PyTorch calls vram_torch_alloc (in libvram_torch.so, a C++ library
beside libvram.so: _lib.torch_path) and vram_torch_free directly (no Python
on the allocation path) with the device and the current stream; each
allocation comes from the manager open on that device, counted under
"torch". A refusal raises RuntimeError with vram's message (PyTorch's
pluggable allocator does not check for NULL, so the hook throws).
tensor.record_stream is not forwarded (the pluggable allocator's
set_record_stream_fn is left unset): synchronize a tensor's other streams
before freeing it.

Checked against torch/csrc/cuda/CUDAPluggableAllocator.cpp and Module.cpp
(_cuda_customAllocator casts the functions to void*(size_t, int,
cudaStream_t) and void(void*, size_t, int, cudaStream_t); set_reset_fn
takes a void(); raw_alloc passes the current stream), torch/cuda/memory.py
(CUDAPluggableAllocator, change_current_allocator, MemPool, which takes
the allocator's .allocator(), and use_mem_pool) and
c10/cuda/CUDACachingAllocator.cpp (allocPrimitive: a pool with an
allocator asks it through raw_alloc and takes NULL for out of memory).
"""

import vram as _vram
from . import _lib

__all__ = ["install", "mempool"]

_installed = [False]  # install() has run in this process


def install():
    """Makes vram PyTorch's CUDA allocator and returns the
    CUDAPluggableAllocator. Call it before PyTorch allocates on a GPU (PyTorch
    refuses to swap an allocator in use); torch.cuda.current_device() and the
    like initialize it, so open managers for devices other than 0 with
    vram.open("cuda:N") rather than by asking PyTorch."""
    import torch

    _vram.manager(0)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib.torch_path(), "vram_torch_alloc", "vram_torch_free")
    inner = alloc.allocator()
    if hasattr(inner, "set_reset_fn"):
        inner.set_reset_fn(_lib.address("vram_torch_empty_cache"))
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError(
            "vram.torch.install() must run before PyTorch's first CUDA allocation (%s)" % e) from e
    _installed[0] = True
    return alloc


def _ordinal(torch, device):
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError("vram.torch.mempool(%r): want a CUDA device (an ordinal, 'cuda:N' or a torch.device)" % (device,))
    return torch.cuda.current_device() if d.index is None else d.index


def mempool(device=None):
    """A new torch.cuda.MemPool whose segments come from vram's pool and
    budget; use it with torch.cuda.use_mem_pool(pool), and keep it while its
    tensors live. device (None: the current one) is the device whose
    manager is found, or, for device 0, opened on the default device, now
    rather than at the first segment; open others with vram.open("cuda:N")
    first. The pool's freed segments stay cached for it, as PyTorch keeps
    a pool's (a refusal does not free them); they go back to vram once the
    pool is dropped and torch.cuda.empty_cache() runs."""
    import torch

    cuda = torch.cuda
    if not hasattr(cuda, "MemPool") or not hasattr(cuda, "use_mem_pool"):
        raise RuntimeError("vram.torch.mempool() needs torch.cuda.MemPool and torch.cuda.use_mem_pool, which this "
                           "PyTorch (%s) has not: use vram.torch.install() instead" % getattr(torch, "__version__", "?"))
    if _installed[0]:
        raise RuntimeError("vram.torch.install() has made vram PyTorch's whole allocator in this process: every CUDA "
                           "tensor's memory is vram's already, and PyTorch's pools need its own allocator")
    _vram.manager(_ordinal(torch, device))
    _lib.lib()  # loaded: _lib.path names it
    alloc = cuda.memory.CUDAPluggableAllocator(_lib.path, "vram_torch_pool_alloc", "vram_torch_free")
    return cuda.MemPool(alloc.allocator())
