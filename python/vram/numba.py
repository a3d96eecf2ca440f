"""vram as Numba's memory manager: an External Memory Management (EMM)
plugin, the counterpart of cubie's CuPyAsyncNumbaManager, allocating from
vram's pool and budget instead of CuPy's.

    from numba import cuda
    import vram.numba
    cuda.set_memory_manager(vram.numba.VramNumbaManager)   # before the first context

or, for a whole program, NUMBA_CUDA_MEMORY_MANAGER=vram.numba.

Device memory comes from the manager open on the context's device
(vram.manager(device)), counted under "numba", ordered on the thread's
vram.stream(...) or unordered; a free is ordered on the stream of its
allocation. Pinned and mapped host memory stay Numba's own
(HostOnlyCUDAMemoryManager): vram's budget is device memory.

Checked against Numba's EMM interface version 1 (numba.cuda.cudadrv.driver:
BaseCUDAMemoryManager, HostOnlyCUDAMemoryManager, MemoryPointer, MemoryInfo,
set_memory_manager).
"""

import contextlib
import weakref

from numba import cuda as _cuda
from numba.cuda.cudadrv import driver as _driver
from numba.cuda.cudadrv import drvapi as _drvapi

import vram as _vram

__all__ = ["VramNumbaManager"]


def _device_pointer(ptr):
    """ptr as the pointer type Numba's MemoryPointer expects."""
    if _driver.USE_NV_BINDING:
        return _driver.binding.CUdeviceptr(ptr)
    return _drvapi.cu_device_ptr(ptr)


def _finalizer(mgr, ptr, size, stream):
    # Keeps no reference to the plugin or the MemoryPointer: only what the
    # free needs.
    def free():
        mgr.free(ptr, size, stream)

    return free


class VramNumbaManager(_cuda.HostOnlyCUDAMemoryManager):
    """Numba EMM plugin over vram's manager of the context's device."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._mgr = None  # found in initialize: set_memory_manager makes one with context=None

    def _manager(self):
        if self._mgr is None:
            device = self.context.device.id if self.context is not None else 0
            self._mgr = _vram.manager(device)
        return self._mgr

    def initialize(self):
        self._manager()
        # Numba flushes its pending host deallocations against the device's
        # capacity (NumbaCUDAMemoryManager does the same).
        if not self.deallocations.memory_capacity:
            self.deallocations.memory_capacity = self.get_memory_info().total

    def memalloc(self, size):
        """size bytes of device memory from vram's pool, as a Numba
        MemoryPointer whose finalizer frees it. Raises vram.OutOfMemoryError
        (a MemoryError, with the manager's report) past the cap."""
        mgr = self._manager()
        stream = _vram.current_stream()
        ptr = mgr.alloc(size, stream=stream, source="numba")
        ctx = weakref.proxy(self.context) if self.context is not None else None
        return _cuda.MemoryPointer(ctx, _device_pointer(ptr), size, finalizer=_finalizer(mgr, ptr, size, stream))

    def get_memory_info(self):
        """(free, total) as the budget sees them: with a cap, total is the cap
        and free what it leaves (at most the device's free memory plus the
        pool's cache); without one, the device's, plus the pool's cache."""
        st = self._manager().stats()
        cached = st["reserved"] - st["in_use"]
        if st["cap"]:
            free = min(st["cap"] - min(st["cap_used"], st["cap"]), st["device_free"] + cached)
            return _cuda.MemoryInfo(free=free, total=st["cap"])
        return _cuda.MemoryInfo(free=st["device_free"] + cached, total=st["device_total"])

    def get_ipc_handle(self, memory):
        raise NotImplementedError(
            "vram's pool does not export IPC handles: its blocks are parts of larger segments or mapped pages "
            "(expandable segments), which cuIpcGetMemHandle cannot name; allocate memory to share with "
            "Numba's default manager"
        )

    def reset(self):
        """Numba's host allocations are cleared (HostOnlyCUDAMemoryManager)
        and the pool's cached memory returned to the device; live device
        allocations stay their owners'."""
        super().reset()
        if self._mgr is not None:
            self._mgr.trim()

    @contextlib.contextmanager
    def defer_cleanup(self):
        """Defers Numba's host deallocations. Device frees need no deferring:
        they are stream-ordered, so they never wait for or break work in
        flight, as a cuMemFree would."""
        with super().defer_cleanup():
            yield

    @property
    def interface_version(self):
        return 1


# NUMBA_CUDA_MEMORY_MANAGER=vram.numba makes Numba use this class.
_numba_memory_manager = VramNumbaManager
