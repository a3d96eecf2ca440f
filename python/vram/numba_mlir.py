"""vram as numba-cuda-mlir's memory manager: the EMM plugin of vram.numba
for numba_cuda_mlir.cuda, whose EMM interface (version 1) is numba-cuda's.

    from numba_cuda_mlir import cuda
    import vram.numba_mlir
    cuda.set_memory_manager(vram.numba_mlir.VramNumbaManager)   # before the first context

or NUMBA_CUDA_MEMORY_MANAGER=vram.numba_mlir. Its MemoryPointer takes the
documented ctypes.c_void_p and converts it to its binding's CUdeviceptr.
"""

import ctypes

from numba_cuda_mlir import cuda as _cuda

from . import _emm

__all__ = ["VramNumbaManager"]

VramNumbaManager = _emm.plugin_class(_cuda, ctypes.c_void_p, __name__,
                                     "Numba EMM plugin (numba_cuda_mlir.cuda) over vram's manager of the "
                                     "context's device.")

# NUMBA_CUDA_MEMORY_MANAGER=vram.numba_mlir makes numba-cuda-mlir use this class.
_numba_memory_manager = VramNumbaManager
