from .cudadrv.driver import (BaseCUDAMemoryManager, HostOnlyCUDAMemoryManager, GetIpcHandleMixin, MemoryPointer,
                             MemoryInfo, IpcHandle, set_memory_manager)
