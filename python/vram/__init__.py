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

The manager's client API (vram.client: clients, stream groups, requests,
batches chunked to fit, copies, hooks) is the Go package's Manager and
Client in Python, and vram.Batch runs a chunked batch:

    with vram.Manager("sim:vram=64MiB") as m:
        c = m.register("solver", group="batch")
        c.queue({"x": vram.ArrayRequest((runs,), "float32")})
        r = c.allocate()          # r.plan.chunks passes of r.plan.chunk_length runs
"""

import contextlib
import json
import threading
import typing

from . import _capi, _lib
from . import client as _client
from ._lib import FreedError, InvalidArgumentError, OutOfMemoryError, VramError, UNORDERED
from .arrays import DeviceArray
from .client import ArrayRequest, ArrayResponse, ChunkPlan, Client, Span, Work

__all__ = [
    "Manager", "VramError", "OutOfMemoryError", "InvalidArgumentError", "FreedError", "UNORDERED", "SOURCES",
    "open", "open_lease", "manager", "managers", "stats", "report", "oom_report", "empty_cache",
    "stream", "current_stream", "stream_handle",
    "Client", "ArrayRequest", "ArrayResponse", "ChunkPlan", "Span", "Work", "DeviceArray", "Shares", "Batch",
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


class Shares(typing.NamedTuple):
    """How a manager divides memory (the Go Shares): manual, the sum of the
    manual clients' proportions; auto, what the auto clients split (0 with
    none); total, the bytes proportions are of."""

    manual: float
    auto: float
    total: int


class Manager:
    """One device's vram manager: its pool and its budget, shared by every
    framework of the process on that device, and its clients (the Go
    Manager). Manager(spec, cap) opens it, as vram.open does (a process has
    one manager per device: a second open of the same device raises
    VramError); vram.manager(device) finds one. A context manager that
    closes it. Safe to use from any thread.

    arrays says what ArrayResponse.arrays holds: "auto" (Numba device
    arrays when Numba can reach the manager's memory here, a GPU, or vram's
    simulator under Numba's CUDA simulator; else vram.DeviceArray),
    "numba" or "vram"."""

    def __init__(self, spec: typing.Optional[str] = None, cap: int = 0, *, arrays: str = "auto"):
        h = _lib.ctypes.c_int64()
        _lib.check(_lib.lib().vram_open((spec or "").encode(), _lib.unsigned("cap", cap), _lib.ctypes.byref(h)))
        self._setup(h.value, arrays)
        with _known_lock:
            _known[self.handle] = self

    @classmethod
    def _of_handle(cls, handle):
        m = cls.__new__(cls)
        m._setup(handle, "auto")
        return m

    def _setup(self, handle, arrays):
        if arrays not in ("auto", "numba", "vram"):
            raise InvalidArgumentError(_lib.EINVAL, "vram: arrays=%r: want auto, numba or vram" % (arrays,))
        self.handle = handle
        self.arrays = arrays
        st = self.stats()
        self.device = st["device"]
        self.spec = st["spec"]
        self.simulated = st["backend"] == "sim"
        self._clients = {}  # handle -> Client registered through this object
        self._poll_lock = threading.RLock()

    def __repr__(self):
        return "vram.Manager(%d, %r, device %d)" % (self.handle, self.spec, self.device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

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
        """Closes the manager, its clients (their arrays freed) and the host
        arrays it made; refused (VramError) while allocations of the
        allocator API (alloc, the frameworks' hooks) are live."""
        _lib.check(_lib.lib().vram_close(self.handle))
        with _known_lock:
            _known.pop(self.handle, None)
        self._clients.clear()

    # The client API (vram.client).

    def register(self, name: str = "", group: str = "default", proportion: float = 0.0, *, no_evict: bool = False,
                 on_allocated: typing.Optional[typing.Callable[[ArrayResponse], None]] = None,
                 on_invalidate: typing.Optional[typing.Callable[[Exception], None]] = None) -> Client:
        """Registers a client (the Go Manager.Register; cubie's register):
        name labels it in plans and errors, group is its stream group (made
        if new), proportion a manual share of the device's memory (0 < p <=
        1; 0 or None: the auto pool). on_allocated(response) is called when
        its group is allocated (its arrays, or the plan alone);
        on_invalidate(error) when its arrays were freed behind its back (a
        FreedError; error.evicted for an eviction for another group). A
        client with no on_invalidate, or no_evict, is never evicted. Raises
        InvalidArgumentError for a proportion the pools cannot give."""
        hooks = (_capi.HOOK_ALLOCATED if on_allocated else 0) | (_capi.HOOK_INVALIDATE if on_invalidate else 0)
        o = _capi.ClientOptions(size=_lib.ctypes.sizeof(_capi.ClientOptions), name=(name or "").encode(),
                                group=(group or "").encode(), proportion=float(proportion or 0.0),
                                no_evict=int(bool(no_evict)), hooks=hooks)
        h = _lib.ctypes.c_int64()
        _lib.check(_lib.lib().vram_register(self.handle, _lib.ctypes.byref(o), _lib.ctypes.byref(h)))
        c = Client(self, h.value, name, on_allocated, on_invalidate)
        with self._poll_lock:
            self._clients[c.handle] = c
        return c

    def _forget(self, client):
        with self._poll_lock:
            self._clients.pop(client.handle, None)

    def clients(self) -> typing.List[Client]:
        """The open clients registered through this object, by id."""
        with self._poll_lock:
            return [c for _, c in sorted(self._clients.items())]

    def group_members(self, group: str = "default") -> typing.List[Client]:
        """The open clients of group, by id (those registered through this
        object)."""
        n = _lib.ctypes.c_size_t()
        _lib.check(_lib.lib().vram_group_members(self.handle, group.encode(), None, 0, _lib.ctypes.byref(n)))
        out = (_lib.ctypes.c_int64 * max(n.value, 1))()
        _lib.check(_lib.lib().vram_group_members(self.handle, group.encode(), out, n.value, _lib.ctypes.byref(n)))
        with self._poll_lock:
            return [self._clients[h] for h in out[:n.value] if h in self._clients]

    def poll(self) -> int:
        """Delivers the manager's queued events to the hooks of the clients
        registered through this object, on this thread, in order; returns
        how many it took. Every call that can cause events polls once it
        returns; call it for events another thread's calls caused. The first
        exception a hook raised is raised once all are delivered."""
        return _client.deliver_events(self)

    def set_limit_mode(self, mode: str) -> None:
        """"passive" (the default: caps computed, not enforced) or "active"
        (each requester within its cap), for later allocations."""
        if mode not in _capi.LIMIT_MODES:
            raise InvalidArgumentError(_lib.EINVAL, "vram: limit mode %r: want passive or active" % (mode,))
        _lib.check(_lib.lib().vram_set_limit_mode(self.handle, _capi.LIMIT_MODES[mode]))

    @property
    def shares(self) -> Shares:
        """How memory is divided now (cubie's manual_pool_proportion and
        auto_pool_proportion)."""
        manual, auto = _lib.ctypes.c_double(), _lib.ctypes.c_double()
        _lib.check(_lib.lib().vram_shares(self.handle, _lib.ctypes.byref(manual), _lib.ctypes.byref(auto)))
        return Shares(manual.value, auto.value, self.mem_info()[1])

    def mem_info(self) -> typing.Tuple[int, int]:
        """The device's (free, total) memory in bytes."""
        free, total = _lib.ctypes.c_uint64(), _lib.ctypes.c_uint64()
        _lib.check(_lib.lib().vram_mem_info(self.handle, _lib.ctypes.byref(free), _lib.ctypes.byref(total)))
        return free.value, total.value

    def free_label(self, label: str) -> None:
        """Frees every client's arrays under label (cubie's free)."""
        _lib.check(_lib.lib().vram_free_label(self.handle, str(label).encode()))

    def free_all(self) -> None:
        """Frees every client's arrays."""
        _lib.check(_lib.lib().vram_free_all(self.handle))

    def invalidate_all(self) -> None:
        """Frees every client's arrays and calls every on_invalidate (after
        a device reset, or to start over)."""
        _client.call_then_poll(self, lambda: _lib.check(_lib.lib().vram_invalidate_all(self.handle)))

    def reinit_streams(self) -> None:
        """Gives every stream group a fresh stream (after a device reset)."""
        _lib.check(_lib.lib().vram_reinit_streams(self.handle))

    def host_array(self, shape, dtype="float32", memory: str = "pinned", like=None):
        """A zeroed host array of shape and dtype in memory ("pinned",
        "mapped" or "pageable"; cubie's create_host_array), as a NumPy array,
        filled from like when given (NumPy's broadcast). Pinned memory is
        what asynchronous copies need; free it with free_host, or let the
        collector, before the manager is closed (close frees what is left)."""
        return _client.host_array(self, shape, dtype, memory, like)

    def free_host(self, array) -> None:
        """Frees a host array from host_array now (its views must not be
        used afterwards)."""
        _client.free_host(array)


_known_lock = threading.Lock()
_known = {}  # handle → Manager, for the managers this package has seen


def _wrap(handle):
    with _known_lock:
        m = _known.get(handle)
    if m is None:
        m = Manager._of_handle(handle)
        with _known_lock:
            m = _known.setdefault(handle, m)
    return m


def open(spec=None, cap=0):
    """Opens the manager of the device spec names ("auto", "cuda:1",
    "sim:vram=8GiB"; None: $VRAM_DEVICE, else auto) with a cap in bytes (0:
    $VRAM_ALLOC_CONF's limit, else none). A process has one manager per
    device: a second open of the same device raises VramError. The same as
    Manager(spec, cap)."""
    return Manager(spec, cap)


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
    if name == "Batch":
        from .batch import Batch

        return Batch
    if name in ("numba", "cupy", "torch", "batch"):
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
