"""vram for Python: one pool and one budget per device for Numba, CuPy and
PyTorch in one process.

A thin ctypes layer over libvram (vram's Go memory manager as a C shared
library; libvram/vram.h is the contract). Each device has at most one
manager per process, with one cap, and every framework installed on it
allocates through it:

    import vram
    vram.open("cuda:0", cap=8 << 30)   # or VRAM_ALLOC_CONF=limit:8GiB
    vram.torch.install()               # before PyTorch's first CUDA allocation
    vram.cupy.install()
    # Numba: numba.cuda.set_memory_manager(vram.numba.VramNumbaManager),
    # or NUMBA_CUDA_MEMORY_MANAGER=vram.numba
    print(vram.stats())                # every framework's bytes, the cap, the pool
    print(vram.report())
    vram.empty_cache()                 # the pool's cached memory back to the device

Without a GPU, "auto" (the default device) is vram's simulator: allocations
are real address ranges of simulated memory, which no framework can use,
but the books, the cap and the reports work as on a GPU.

Streams. An allocation is ordered on a stream (a cudaStream_t handle, or
an object with one: a Numba stream's .handle, a CuPy stream's .ptr, a
PyTorch stream's .cuda_stream), or on none (UNORDERED): the library's
header says what each promises. Numba's EMM plugin allocates on the stream
of the innermost `with vram.stream(s):` of the thread, else unordered.
"""

import contextlib
import json
import threading

from . import _lib
from ._lib import OutOfMemoryError, VramError, UNORDERED

__all__ = [
    "Manager", "VramError", "OutOfMemoryError", "UNORDERED", "SOURCES",
    "open", "open_lease", "manager", "managers", "stats", "report", "oom_report", "empty_cache",
    "stream", "current_stream", "stream_handle",
]

SOURCES = _lib.SOURCES


def stream_handle(s):
    """The handle of s: an int, None (UNORDERED), or a framework's stream."""
    if s is None:
        return UNORDERED
    if isinstance(s, int):
        return s
    for attr in ("cuda_stream", "ptr", "handle"):  # PyTorch, CuPy, Numba
        h = getattr(s, attr, None)
        if h is not None:
            h = getattr(h, "value", h)  # Numba's handle is a ctypes c_void_p
            return int(h or 0)
    raise TypeError("not a stream: %r (want an int handle, or a PyTorch, CuPy or Numba stream)" % (s,))


class Manager:
    """One device's vram manager: its pool and its budget, shared by every
    framework of the process on that device. Get one with vram.open or
    vram.manager. Safe to use from any thread."""

    def __init__(self, handle):
        self.handle = handle
        st = self.stats()
        self.device = st["device"]
        self.spec = st["spec"]

    def __repr__(self):
        return "vram.Manager(%d, %r, device %d)" % (self.handle, self.spec, self.device)

    def alloc(self, size, stream=UNORDERED, source="c"):
        """Allocates size bytes for source ("c", "torch", "cupy", "numba"),
        ordered on stream; returns the device address. Raises
        OutOfMemoryError (a MemoryError) past the cap or the device."""
        out = _lib.ctypes.c_void_p()
        size = _lib.unsigned("size", size, _lib.SIZE_BITS)
        status = _lib.lib().vram_alloc(self.handle, SOURCES.index(source), size, stream_handle(stream), _lib.ctypes.byref(out))
        _lib.check(status, self.oom_report)
        return out.value

    def free(self, ptr, size=0, stream=UNORDERED):
        """Frees ptr, last used on stream; size, when not 0, must be the size
        it was allocated with."""
        size = _lib.unsigned("size", size, _lib.SIZE_BITS)
        _lib.check(_lib.lib().vram_free(self.handle, ptr, size, stream_handle(stream)))

    def stats(self):
        """The manager's figures as a dict: the allocator's (in_use, reserved,
        peaks, counts), the cap, the device, and under "sources" each
        framework's books by name."""
        st = json.loads(_lib.text(_lib.lib().vram_stats_json, self.handle))
        st["sources"] = {s["source"]: s for s in st["sources"]}
        return st

    def report(self):
        """The manager's memory report as text."""
        return _lib.text(_lib.lib().vram_report, self.handle)

    def oom_report(self):
        """The manager's report at its last out of memory, or ""."""
        return _lib.text(_lib.lib().vram_oom_report, self.handle)

    def trim(self):
        """Returns the pool's cached memory to the device."""
        _lib.check(_lib.lib().vram_trim(self.handle))

    def reset_peaks(self):
        """Sets every peak to its current value."""
        _lib.check(_lib.lib().vram_reset_peaks(self.handle))

    def close(self):
        """Closes the manager; refused (VramError) while it has live
        allocations."""
        _lib.check(_lib.lib().vram_close(self.handle))
        with _known_lock:
            _known.pop(self.handle, None)


_known_lock = threading.Lock()
_known = {}  # handle → Manager, for the managers this package has seen


def _wrap(handle):
    with _known_lock:
        m = _known.get(handle)
    if m is None:
        m = Manager(handle)
        with _known_lock:
            m = _known.setdefault(handle, m)
    return m


def open(spec=None, cap=0):
    """Opens the manager of the device spec names ("auto", "cuda:1",
    "sim:vram=8GiB"; None: $VRAM_DEVICE, else auto) with a cap in bytes (0:
    $VRAM_ALLOC_CONF's limit, else none). A process has one manager per
    device: a second open of the same device raises VramError."""
    h = _lib.ctypes.c_int64()
    cap = _lib.unsigned("cap", cap)
    _lib.check(_lib.lib().vram_open((spec or "").encode(), cap, _lib.ctypes.byref(h)))
    return _wrap(h.value)


def open_lease(spec=None, socket=None, name=None, proportion=0.0, cap=0):
    """Opens the manager of the device spec names, as open does, with its
    budget a lease of the node broker (vram broker) on socket (None:
    $VRAM_BROKER, else the broker's default socket): name labels it in `vram
    broker status` (None: the program's name), proportion is a manual share
    of the device (0: the broker's auto pool), cap bounds the lease in bytes
    (0: none). An allocation past the lease claims more from the broker; one
    the broker cannot cover raises OutOfMemoryError, before the device is
    asked. The lease ends when the manager is closed or the process ends."""
    h = _lib.ctypes.c_int64()
    cap = _lib.unsigned("cap", cap)
    _lib.check(_lib.lib().vram_open_lease((spec or "").encode(), (socket or "").encode(), (name or "").encode(),
                                          float(proportion), cap, _lib.ctypes.byref(h)))
    return _wrap(h.value)


def manager(device=0):
    """The manager open on device ordinal device; for device 0, one is
    opened on the default device ($VRAM_DEVICE, else auto) if none is."""
    h = _lib.ctypes.c_int64()
    status = _lib.lib().vram_manager_for_device(device, _lib.ctypes.byref(h))
    if status != _lib.OK and device == 0:
        try:
            return open()
        except VramError:
            status = _lib.lib().vram_manager_for_device(device, _lib.ctypes.byref(h))  # opened meanwhile?
            if status != _lib.OK:
                raise
    _lib.check(status)
    return _wrap(h.value)


def managers():
    """The managers this package has opened or found, by handle."""
    with _known_lock:
        return [m for _, m in sorted(_known.items())]


def stats(device=0):
    """Device's manager's figures (Manager.stats): every framework's
    allocations on the device, the pool and the cap, in one dict."""
    return manager(device).stats()


def report(device=None):
    """The memory report of device's manager, or of every manager this
    package knows when device is None."""
    if device is not None:
        return manager(device).report()
    ms = managers() or [manager(0)]
    return "\n".join(m.report() for m in ms)


def oom_report(device=0):
    """Device's manager's report at its last out of memory, or ""."""
    return manager(device).oom_report()


def empty_cache():
    """Returns every manager's cached memory to its device (PyTorch's
    empty_cache and CuPy's free_all_blocks, for all frameworks at once)."""
    _lib.check(_lib.lib().vram_trim_all())


_local = threading.local()


def __getattr__(name):
    # vram.numba, vram.cupy and vram.torch import their framework: loaded on
    # first use, so that import vram needs none of them.
    if name in ("numba", "cupy", "torch"):
        import importlib

        return importlib.import_module("vram." + name)
    raise AttributeError("module 'vram' has no attribute %r" % name)


@contextlib.contextmanager
def stream(s):
    """Within the block, allocations that name no stream of their own on
    this thread (Numba's EMM plugin) are ordered on s."""
    stack = getattr(_local, "streams", None)
    if stack is None:
        stack = _local.streams = []
    stack.append(stream_handle(s))
    try:
        yield
    finally:
        stack.pop()


def current_stream():
    """The thread's stream for allocations that name none (vram.stream), or
    UNORDERED."""
    stack = getattr(_local, "streams", None)
    return stack[-1] if stack else UNORDERED
