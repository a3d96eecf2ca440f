"""vram as PyTorch's CUDA allocator, through its pluggable allocator.

    import vram.torch
    vram.torch.install()     # before the first CUDA allocation

PyTorch calls vram_torch_alloc (in libvram_torch.so, a C++ library beside
libvram.so: _lib.torch_path) and vram_torch_free directly (no Python on the
allocation path) with the device and the current stream;
each allocation comes from the manager open on that device, counted under
"torch". A refusal raises RuntimeError with vram's message (PyTorch's
pluggable allocator does not check for NULL, so the hook throws).
torch.cuda.empty_cache() trims vram's pool (every framework's cache).
torch.cuda.memory_stats() and friends are not supported by PyTorch's
pluggable allocator: use vram.stats() and vram.report().

Checked against torch/csrc/cuda/CUDAPluggableAllocator.cpp and Module.cpp
(_cuda_customAllocator casts the functions to void*(size_t, int,
cudaStream_t) and void(void*, size_t, int, cudaStream_t); set_reset_fn
takes a void()) and torch/cuda/memory.py (CUDAPluggableAllocator,
change_current_allocator). tensor.record_stream is not forwarded (the
pluggable allocator's set_record_stream_fn is left unset): synchronize a
tensor's other streams before freeing it.
"""

import vram as _vram
from . import _lib

__all__ = ["install"]


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
    return alloc
