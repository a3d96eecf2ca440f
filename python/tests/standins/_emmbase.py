"""What the stand-ins of Numba share: the EMM interface (version 1) as each
Numba's cudadrv/driver.py implements it, reduced to what a plugin meets, and
a Context that drives a plugin as Numba's does. Each flavour's driver module
takes from here exactly the names its Numba exports, so a plugin that reads
anything else fails there as it would on that Numba.

The flavours differ in the pointer MemoryPointer takes (see driver()): the
stand-in driver functions check it as the real ones do (ctypes argument
types under numba's ctypes binding, CUdeviceptr under NVIDIA's), so a
pointer of the wrong type fails at memset, as on a GPU.

Written for vram's tests from the three projects' sources (numba 0.56.4,
numba-cuda 0.21.2 to 0.30, numba-cuda-mlir 0.1): no GPU, no compiler.
"""

import contextlib
import ctypes
import importlib
import types
import weakref
from abc import ABCMeta, abstractmethod
from collections import namedtuple

MemoryInfo = namedtuple("MemoryInfo", "free,total")

EMM_INTERFACE_VERSION = 1


class CUdeviceptr:
    """cuda.bindings.driver.CUdeviceptr (and cuda.cuda's before it): an
    address that int() reads and nothing else converts to."""

    def __init__(self, value=0):
        if not isinstance(value, int):
            raise TypeError("CUdeviceptr(%r): not an int" % (value,))
        self._value = value

    def __int__(self):
        return self._value

    def __repr__(self):
        return "<CUdeviceptr 0x%x>" % self._value


def nvidia_binding():
    """A stand-in of the NVIDIA binding module (cuda.bindings.driver)."""
    b = types.ModuleType("cuda.bindings.driver")
    b.CUdeviceptr = CUdeviceptr
    return b


class _PendingDeallocs:
    """Numba's queue of pending host frees, as far as a plugin's super()
    calls reach it."""

    def __init__(self):
        self._disabled = 0
        self.cleared = 0

    def clear(self):
        self.cleared += 1

    @contextlib.contextmanager
    def disable(self):
        self._disabled += 1
        try:
            yield
        finally:
            self._disabled -= 1

    @property
    def is_disabled(self):
        return self._disabled > 0


class BaseCUDAMemoryManager(object, metaclass=ABCMeta):
    def __init__(self, *args, **kwargs):
        if "context" not in kwargs:
            raise RuntimeError("Memory manager requires a context")
        self.context = kwargs.pop("context")

    @abstractmethod
    def memalloc(self, size):
        pass

    @abstractmethod
    def memhostalloc(self, size, mapped, portable, wc):
        pass

    @abstractmethod
    def mempin(self, owner, pointer, size, mapped):
        pass

    @abstractmethod
    def initialize(self):
        pass

    @abstractmethod
    def get_ipc_handle(self, memory):
        pass

    @abstractmethod
    def get_memory_info(self):
        pass

    @abstractmethod
    def reset(self):
        pass

    @abstractmethod
    def defer_cleanup(self):
        pass

    @property
    @abstractmethod
    def interface_version(self):
        pass


class HostOnlyCUDAMemoryManager(BaseCUDAMemoryManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocations = {}
        self.deallocations = _PendingDeallocs()

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        raise RuntimeError("stand-in: no host memory without a GPU")

    def mempin(self, owner, pointer, size, mapped=False):
        raise RuntimeError("stand-in: no host memory without a GPU")

    def reset(self):
        self.allocations.clear()
        self.deallocations.clear()

    @contextlib.contextmanager
    def defer_cleanup(self):
        with self.deallocations.disable():
            yield


class GetIpcHandleMixin:
    def get_ipc_handle(self, memory):
        raise RuntimeError("stand-in: no IPC without a GPU")


class IpcHandle:
    def __init__(self, base, handle, size, source_info=None, offset=0):
        self.base, self.handle, self.size, self.source_info, self.offset = base, handle, size, source_info, offset


def driver(config, nv_binding, converts_void_p, cu_device_ptr=ctypes.c_size_t):
    """The names of one flavour's driver module, whose configuration is
    config (CUDA_MEMORY_MANAGER, from NUMBA_CUDA_MEMORY_MANAGER). nv_binding: the NVIDIA
    binding is in use (its functions take CUdeviceptr); else numba's ctypes
    binding, whose functions' argument type for a device pointer is
    cu_device_ptr. converts_void_p: MemoryPointer turns a ctypes.c_void_p
    into a CUdeviceptr (numba-cuda 0.21 and later, numba-cuda-mlir)."""
    binding = nvidia_binding() if nv_binding else None

    def check_device_pointer(fn, ptr):
        # What the binding's function does with a device pointer argument.
        if nv_binding:
            if not isinstance(ptr, CUdeviceptr):
                raise TypeError("%s: argument 1 must be CUdeviceptr, not %s" % (fn, type(ptr).__name__))
        elif type(ptr) is not cu_device_ptr:
            raise ctypes.ArgumentError("argument 1: TypeError: wrong type")

    class MemoryPointer:
        __cuda_memory__ = True

        def __init__(self, context, pointer, size, owner=None, finalizer=None):
            if converts_void_p and isinstance(pointer, ctypes.c_void_p):
                pointer = binding.CUdeviceptr(pointer.value or 0)
            self.context = context
            self.device_pointer = pointer
            self.size = size
            self._cuda_memsize_ = size
            self.is_managed = finalizer is not None
            self.refct = 1
            self.handle = self.device_pointer
            self._owner = owner
            if finalizer is not None:
                self._finalizer = weakref.finalize(self, finalizer)

        @property
        def owner(self):
            return self if self._owner is None else self._owner

        def free(self):
            if self.is_managed:
                if not self._finalizer.alive:
                    raise RuntimeError("Freeing dead memory")
                self._finalizer()

        def memset(self, byte, count=None, stream=0):
            check_device_pointer("cuMemsetD8", self.device_pointer)
            self.memset_calls = getattr(self, "memset_calls", 0) + 1

        def view(self, start, stop=None):
            size = (self.size if stop is None else stop) - start
            base = self.device_pointer_value + start
            pointer = binding.CUdeviceptr(base) if nv_binding or converts_void_p else cu_device_ptr(base)
            return MemoryPointer(self.context, pointer, size, owner=self.owner)

        @property
        def device_ctypes_pointer(self):
            return self.device_pointer

        @property
        def device_pointer_value(self):
            if nv_binding or converts_void_p:
                return int(self.device_pointer) or None
            return self.device_pointer.value

    state = {"manager": None}

    def set_memory_manager(mm_plugin):
        dummy = mm_plugin(context=None)
        iv = dummy.interface_version
        if iv != EMM_INTERFACE_VERSION:
            raise RuntimeError("EMM Plugin interface has version %d - version %d required" % (iv, EMM_INTERFACE_VERSION))
        state["manager"] = mm_plugin

    def ensure_memory_manager():
        if state["manager"]:
            return
        if config.CUDA_MEMORY_MANAGER == "default":
            raise RuntimeError("stand-in: Numba's own manager needs a GPU")
        try:
            mod = importlib.import_module(config.CUDA_MEMORY_MANAGER)
            set_memory_manager(mod._numba_memory_manager)
        except Exception:
            raise RuntimeError("Failed to use memory manager from %s" % config.CUDA_MEMORY_MANAGER)

    names = {
        "BaseCUDAMemoryManager": BaseCUDAMemoryManager,
        "HostOnlyCUDAMemoryManager": HostOnlyCUDAMemoryManager,
        "GetIpcHandleMixin": GetIpcHandleMixin,
        "MemoryPointer": MemoryPointer,
        "MemoryInfo": MemoryInfo,
        "IpcHandle": IpcHandle,
        "set_memory_manager": set_memory_manager,
        "_ensure_memory_manager": ensure_memory_manager,
        "_state": state,
    }
    if binding is not None:
        names["binding"] = binding
    return names


class Device:
    def __init__(self, ordinal):
        self.id = ordinal


class Context:
    """A Numba Context as far as its memory manager sees it: made with the
    plugin class set (or named by NUMBA_CUDA_MEMORY_MANAGER), initialize on
    first use, memalloc, get_memory_info, reset, defer_cleanup."""

    def __init__(self, drv, ordinal=0):
        self.device = Device(ordinal)
        drv._ensure_memory_manager()
        self.memory_manager = drv._state["manager"](context=self)
        self.memory_manager.initialize()

    def memalloc(self, size):
        return self.memory_manager.memalloc(size)

    def get_memory_info(self):
        return self.memory_manager.get_memory_info()

    def reset(self):
        self.memory_manager.reset()

    @contextlib.contextmanager
    def defer_cleanup(self):
        with self.memory_manager.defer_cleanup():
            yield
