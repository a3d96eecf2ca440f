"""Numba's External Memory Management (EMM) plugin over vram, built once for
each Numba that provides the interface (vram.numba for numba.cuda, vram.numba_mlir
for numba_cuda_mlir.cuda).

The plugin uses only EMM interface version 1 as Numba documents it
(docs/source/user/external-memory.rst in numba, numba-cuda and
numba-cuda-mlir): it subclasses HostOnlyCUDAMemoryManager, reads
self.context (and its device's id), builds MemoryPointer(context, pointer,
size, finalizer=...) and MemoryInfo(free, total), and calls super() from
reset and defer_cleanup. Each Numba states one more fact, the pointer type
its MemoryPointer takes (vram.numba and vram.numba_mlir pass it in).

Rules:
  - The manager is the one open on the context's device, asked of the
    library at each allocation (vram.manager(device)), never cached: a
    manager closed and opened again serves the next allocation.
  - A free goes to the manager the memory came from, on the stream it was
    allocated on; the finalizer holds only those (never the plugin or the
    MemoryPointer).
"""

import contextlib
import ctypes
import weakref

import vram as _vram
from . import _lib

__all__ = ["plugin_class", "INTERFACE_VERSION"]

INTERFACE_VERSION = 1  # the EMM interface version the plugin implements


def _finalizer(mgr, ptr, size, stream):
    def free():
        mgr.free(ptr, size, stream)

    return free


def _device(context):
    """The device ordinal of a Numba context; 0 for the context=None that
    set_memory_manager builds a plugin with to read its interface version."""
    return context.device.id if context is not None else 0


def _open_manager(device):
    """The manager open on device, or None: opens none."""
    h = ctypes.c_int64()
    if _lib.lib().vram_manager_for_device(device, ctypes.byref(h)) != _lib.OK:
        return None
    return _vram._wrap(h.value)


def plugin_class(cuda, pointer, module, doc=""):
    """The plugin class for the Numba whose EMM names are cuda's attributes
    (HostOnlyCUDAMemoryManager, MemoryPointer, MemoryInfo); pointer(address)
    makes the pointer its MemoryPointer takes. module names where the class
    lives, for Numba's NUMBA_CUDA_MEMORY_MANAGER and for pickling."""

    class VramNumbaManager(cuda.HostOnlyCUDAMemoryManager):
        def _manager(self):
            return _vram.manager(_device(self.context))

        def initialize(self):
            """Finds (or, on device 0, opens) the device's manager, so a
            context on a device without one fails when it is made, not at
            its first allocation."""
            self._manager()

        def memalloc(self, size):
            """size bytes of device memory from vram's pool, as a Numba
            MemoryPointer whose finalizer frees it. Raises
            vram.OutOfMemoryError (a MemoryError, with the manager's report)
            past the cap."""
            mgr = self._manager()
            stream = _vram.current_stream()
            ptr = mgr.alloc(size, stream=stream, source="numba")
            ctx = weakref.proxy(self.context) if self.context is not None else None
            return cuda.MemoryPointer(ctx, pointer(ptr), size, finalizer=_finalizer(mgr, ptr, size, stream))

        def get_memory_info(self):
            """(free, total) as the budget sees them: with a cap, total is
            the cap and free what it leaves (at most the device's free memory
            plus the pool's cache); without one, the device's, plus the
            pool's cache."""
            st = self._manager().stats()
            cached = st["reserved"] - st["in_use"]
            if st["cap"]:
                free = min(st["cap"] - min(st["cap_used"], st["cap"]), st["device_free"] + cached)
                return cuda.MemoryInfo(free=free, total=st["cap"])
            return cuda.MemoryInfo(free=st["device_free"] + cached, total=st["device_total"])

        def get_ipc_handle(self, memory):
            raise NotImplementedError(
                "vram's pool does not export IPC handles: its blocks are parts of larger segments or mapped "
                "pages (expandable segments), which cuIpcGetMemHandle cannot name; allocate memory to share "
                "with Numba's default manager"
            )

        def reset(self):
            """Numba's host allocations are cleared (HostOnlyCUDAMemoryManager)
            and the pool's cached memory returned to the device; live device
            allocations stay their owners'. Numba may call it before
            initialize: then no manager is opened for it."""
            super().reset()
            mgr = _open_manager(_device(self.context))
            if mgr is not None:
                mgr.trim()

        @contextlib.contextmanager
        def defer_cleanup(self):
            """Defers Numba's host deallocations. Device frees need no
            deferring: they are stream-ordered, so they never wait for or
            break work in flight, as a cuMemFree would."""
            with super().defer_cleanup():
                yield

        @property
        def interface_version(self):
            return INTERFACE_VERSION

    VramNumbaManager.__module__ = module
    VramNumbaManager.__qualname__ = VramNumbaManager.__name__
    VramNumbaManager.__doc__ = doc or "Numba EMM plugin over vram's manager of the context's device."
    return VramNumbaManager
