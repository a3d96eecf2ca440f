from numba_cuda_mlir.numba_cuda.cudadrv.driver import (BaseCUDAMemoryManager, HostOnlyCUDAMemoryManager,
                                                       GetIpcHandleMixin, MemoryPointer, MemoryInfo, IpcHandle,
                                                       set_memory_manager)
