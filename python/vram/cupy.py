"""vram as CuPy's device allocator.

    import vram.cupy
    vram.cupy.install()          # cupy.cuda.set_allocator(...) on vram's pool

Each allocation comes from the manager open on CuPy's current device
(vram.manager(device)), counted under "cupy", ordered on CuPy's current
stream, and is freed on that same stream, as CuPy's own MemoryPool does.
install() uses CuPy's PythonFunctionAllocator, so that a refusal raises
CuPy's OutOfMemoryError with vram's message (the allocator's C functions,
vram_cupy_malloc and vram_cupy_free, with CuPy's CFunctionAllocator, are
faster, but name no stream and return NULL on a refusal, which CuPy does
not check; install(c_functions=True) uses them all the same). Pinned host
memory stays CuPy's.

Checked against cupy/cuda/memory.pyx: CFunctionAllocator(param, malloc_func,
free_func, owner) with void*(*)(void*, size_t, int) and
void(*)(void*, void*, int); PythonFunctionAllocator(malloc_func, free_func)
with malloc(size, device_id) -> int and free(ptr, device_id).
"""

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


def install(c_functions=False):
    """Makes vram's pool CuPy's allocator (cupy.cuda.set_allocator) and
    returns the CuPy allocator object. Open the manager first (vram.open)
    for a cap or a device other than the default one."""
    import cupy

    _vram.manager(cupy.cuda.runtime.getDevice())  # opened now, not in the first allocation
    if c_functions:
        alloc = cupy.cuda.memory.CFunctionAllocator(
            0, _lib.address("vram_cupy_malloc"), _lib.address("vram_cupy_free"), _lib.lib())
    else:
        a = Allocator(lambda: cupy.cuda.get_current_stream().ptr, _cupy_oom_type(cupy))
        alloc = cupy.cuda.memory.PythonFunctionAllocator(a.malloc, a.free)
    cupy.cuda.set_allocator(alloc.malloc)
    return alloc
