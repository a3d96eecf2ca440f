"""vram as CuPy's device allocator.

    import vram.cupy
    vram.cupy.install()          # cupy.cuda.set_allocator(...) on vram's pool

Each allocation comes from the manager open on CuPy's current device
(vram.manager(device)), counted under "cupy", ordered on CuPy's current
stream, and is freed on that same stream, as CuPy's own MemoryPool does.
install() uses CuPy's PythonFunctionAllocator, so that a refusal raises
CuPy's OutOfMemoryError with vram's message. install(c_functions=True) uses
vram's C functions with CuPy's CFunctionAllocator instead: faster, but they
name no stream (allocations are unordered), and a refusal raises a plain
MemoryError with vram's message, which vram_cupy_malloc (libvram_cupy.so,
C++) throws as a std::bad_alloc. That needs CuPy 14.2 or newer, whose hook
type is declared `except +` so that Cython turns the exception into
Python's; on an older CuPy the exception would end the process, and
install(c_functions=True) refuses. Pinned host memory stays CuPy's.

Checked against cupy/cuda/memory.pyx: CFunctionAllocator(param, malloc_func,
free_func, owner) with void*(*)(void*, size_t, int), `except +` since 14.2,
and void(*)(void*, void*, int); PythonFunctionAllocator(malloc_func,
free_func) with malloc(size, device_id) -> int and free(ptr, device_id).
"""

import ctypes

import threading

import vram as _vram
from . import _lib

__all__ = ["install", "Allocator"]


class Allocator:
    """The malloc and free PythonFunctionAllocator calls. current_stream
    returns the handle the next allocation is ordered on (CuPy's current
    stream's .ptr when installed); a free goes on its allocation's stream."""

    def __init__(self, current_stream, out_of_memory=None):
        self._current_stream = current_stream
        self._out_of_memory = out_of_memory  # the exception type to raise, CuPy's when installed
        self._lock = threading.Lock()
        self._streams = {}  # ptr → the stream it was allocated on

    def malloc(self, size, device_id):
        mgr = _vram.manager(device_id)
        stream = self._current_stream()
        try:
            ptr = mgr.alloc(size, stream=stream, source="cupy")
        except _vram.OutOfMemoryError as e:
            if self._out_of_memory is None:
                raise
            raise self._out_of_memory(str(e), e.report) from e
        with self._lock:
            self._streams[ptr] = stream
        return ptr

    def free(self, ptr, device_id):
        with self._lock:
            stream = self._streams.pop(ptr, _vram.UNORDERED)
        _vram.manager(device_id).free(ptr, 0, stream)


def _cupy_oom_type(cupy):
    base = cupy.cuda.memory.OutOfMemoryError

    class VramCupyOutOfMemoryError(base):
        """CuPy's OutOfMemoryError with vram's message and report."""

        def __init__(self, message, report):
            MemoryError.__init__(self, message)
            self.report = report

        def __str__(self):
            return self.args[0]

    return VramCupyOutOfMemoryError


# The first CuPy whose C hook may throw (its malloc type is `except +`).
C_HOOK_MIN_VERSION = (14, 2)


def _version(v):
    """The leading (major, minor) of a version string such as "14.2.0rc1"."""
    parts = []
    for p in str(v).split(".")[:2]:
        digits = ""
        for ch in p:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (2 - len(parts)))


def c_functions_allocator(cupy):
    """The CFunctionAllocator of vram's C hooks for this cupy module;
    RuntimeError, saying what to do, on a CuPy older than 14.2."""
    if _version(cupy.__version__) < C_HOOK_MIN_VERSION:
        raise RuntimeError(
            "vram.cupy.install(c_functions=True) needs CuPy %d.%d or newer (this is %s): its C hook throws on a "
            "refusal, which an older CuPy cannot catch and would end the process; use install(), which works "
            "on every CuPy" % (C_HOOK_MIN_VERSION + (cupy.__version__,)))
    hooks = ctypes.CDLL(_lib.cupy_path())
    malloc = ctypes.cast(hooks.vram_cupy_malloc, ctypes.c_void_p).value
    return cupy.cuda.memory.CFunctionAllocator(0, malloc, _lib.address("vram_cupy_free"), hooks)


def install(c_functions=False):
    """Makes vram's pool CuPy's allocator (cupy.cuda.set_allocator) and
    returns the CuPy allocator object. Open the manager first (vram.open)
    for a cap or a device other than the default one. c_functions=True
    uses vram's C hooks (CuPy 14.2 or newer; see the module's doc)."""
    import cupy

    _vram.manager(cupy.cuda.runtime.getDevice())  # opened now, not in the first allocation
    if c_functions:
        alloc = c_functions_allocator(cupy)
    else:
        a = Allocator(lambda: cupy.cuda.get_current_stream().ptr, _cupy_oom_type(cupy))
        alloc = cupy.cuda.memory.PythonFunctionAllocator(a.malloc, a.free)
    cupy.cuda.set_allocator(alloc.malloc)
    return alloc
