"""vram as Numba's memory manager: an External Memory Management (EMM)
plugin for numba.cuda (numba's built-in CUDA target, as Debian's numba 0.56
has it, or numba-cuda 0.21.2 and later), allocating from vram's pool and
budget. numba-cuda-mlir has its own: vram.numba_mlir.

    from numba import cuda
    import vram.numba
    cuda.set_memory_manager(vram.numba.VramNumbaManager)   # before the first context

or, for a whole program, NUMBA_CUDA_MEMORY_MANAGER=vram.numba.

Device memory comes from the manager open on the context's device
(vram.manager(device)), counted under "numba", ordered on the thread's
vram.stream(...) or unordered; a free is ordered on the stream of its
allocation. Pinned and mapped host memory stay Numba's own
(HostOnlyCUDAMemoryManager): vram's budget is device memory. vram/_emm.py
says which parts of the EMM interface the plugin uses.

The pointer MemoryPointer takes. Numba documents a ctypes.c_void_p;
numba-cuda 0.21 and later convert one to its binding's CUdeviceptr. The
built-in target (numba 0.56 to 0.60) stores it as given and passes it to its
driver functions, whose ctypes argument types refuse a c_void_p: there the
pointer is of the type its own allocator returns, which its driver module
states by USE_NV_BINDING (the NVIDIA binding's CUdeviceptr, else
drvapi.cu_device_ptr). numba-cuda 0.21 removed USE_NV_BINDING with the
ctypes binding. numba-cuda 0.21.0 and 0.21.1 took MemoryPointer's context
argument away (0.21.2 gave it back); no plugin that passes one works there.
"""

import ctypes

from numba import cuda as _cuda
from numba.cuda.cudadrv import driver as _driver

from . import _emm

__all__ = ["VramNumbaManager"]


def _pointer_type():
    if not hasattr(_driver, "USE_NV_BINDING"):  # numba-cuda 0.21 and later
        return ctypes.c_void_p
    if _driver.USE_NV_BINDING:
        return _driver.binding.CUdeviceptr
    from numba.cuda.cudadrv import drvapi

    return drvapi.cu_device_ptr


VramNumbaManager = _emm.plugin_class(_cuda, _pointer_type(), __name__,
                                     "Numba EMM plugin (numba.cuda) over vram's manager of the context's device.")

# NUMBA_CUDA_MEMORY_MANAGER=vram.numba makes Numba use this class.
_numba_memory_manager = VramNumbaManager
