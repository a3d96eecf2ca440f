"""vram's client API in Python: the counterpart of the Go package's
Manager.Register, Client, ArrayRequest and ArrayResponse (and of
cubie.memory's MemoryManager.register, queue_request, allocate_queue and
ArrayResponse), over libvram's C API (libvram/vram.h, ABI 2).

    import numpy as np, vram
    with vram.Manager("sim:vram=64MiB") as m:
        c = m.register("solver", group="batch")
        c.queue({"state": vram.ArrayRequest((4, runs), "float32", chunk_axis=1)})
        r = c.allocate()                       # planned, chunked if it must be
        for i in range(r.plan.chunks):
            sp = r.span(i, 1)
            c.to_device(r.device_arrays["state"], host_state, sp)
            ...                                # kernels on c.stream over sp.len runs
            c.from_device(host_state, r.device_arrays["state"], sp)
        c.sync()

vram.Batch (vram.batch) runs that loop for a group's arrays.

Hooks. on_allocated(response) and on_invalidate(error) are called on the
thread that polls the manager's events: every call of this module that can
cause events polls once it returns (allocate, invalidate_all, free_all,
change_stream_group, ...), and Manager.poll() delivers events another
thread's calls caused. A client's hooks come one at a time, in the order of
their events; never from one of vram's own threads. An exception a hook
raises is raised by the call that delivered it, once every event it took has
been delivered.

Errors: VramError with the Go error's text; OutOfMemoryError (a
MemoryError: the batch does not fit, even chunked), InvalidArgumentError (a
ValueError: a bad request, proportion, span or shape), FreedError (arrays
freed or evicted by the manager: allocate again).
"""

from __future__ import annotations

import ctypes
import json
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from . import _capi, _lib
from .arrays import DeviceArray, numba_mode, numpy_view

__all__ = ["ArrayRequest", "ArrayResponse", "ChunkPlan", "Client", "Span", "Work", "dtype_name"]


def dtype_name(dtype: Any) -> str:
    """The NumPy name of dtype (a name, a NumPy dtype or a scalar type) if
    vram knows it: float64, float32, int32, int64, uint8, uint32, complex64,
    complex128. Raises InvalidArgumentError otherwise."""
    name = dtype if isinstance(dtype, str) else None
    if name is None or name not in _capi.DTYPES:
        try:
            import numpy as np

            d = np.dtype(dtype)
            if d.byteorder == ">":
                raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: dtype %s is big-endian; vram's arrays are little-endian" % d)
            name = d.name
        except (ImportError, TypeError):
            name = str(dtype)
    if name not in _capi.DTYPES:
        raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: dtype %r: want one of %s" % (dtype, ", ".join(_capi.DTYPES)))
    return name


@dataclass(frozen=True)
class ArrayRequest:
    """One array to request (the Go ArrayRequest): shape, dtype (required,
    as in Go), memory ("device", "pinned", "mapped" or "pageable"), chunk_axis (the run
    axis, 0 unless given: cubie's default is 2, the run axis of its (time,
    variable, run) arrays), unchunkable, and total_runs (0: the chunk axis'
    length). An empty shape is a scalar, never chunked; so is a request whose
    shape has no axis chunk_axis or whose chunk axis has length 1. The
    manager validates the rest when the request is queued."""

    shape: Tuple[int, ...]
    dtype: str
    memory: str = "device"
    chunk_axis: int = 0
    unchunkable: bool = False
    total_runs: int = 0

    def __post_init__(self):
        shape = (self.shape,) if isinstance(self.shape, int) else tuple(int(d) for d in self.shape)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if self.memory not in _capi.MEMORY:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: memory %r: want device, pinned, mapped or pageable" % (self.memory,))

    @classmethod
    def of(cls, value: "ArrayRequest | Mapping[str, Any]") -> "ArrayRequest":
        """value as a request: a request, or a mapping of its fields."""
        if isinstance(value, ArrayRequest):
            return value
        return cls(**dict(value))


class Span(NamedTuple):
    """Runs [start, start+len) along axis (the Go Span)."""

    axis: int
    start: int
    len: int

    @property
    def stop(self) -> int:
        return self.start + self.len

    @property
    def slice(self) -> slice:
        """slice(start, stop): index a NumPy array's chunk axis with it."""
        return slice(self.start, self.start + self.len)


@dataclass(frozen=True)
class ChunkPlan:
    """The group's plan (the Go ChunkPlan): chunks passes of chunk_length
    runs (the last of last_chunk_length), total_runs in all, buffers sets of
    chunkable arrays, the budget it was made within and the bytes it takes
    (device bytes counted as the allocator charges them, in units of
    granularity); chunked_shapes gives, per client ("name#id") and label,
    the shape allocated."""

    chunks: int
    chunk_length: int
    last_chunk_length: int
    total_runs: int
    buffers: int
    granularity: int
    budget: int
    unchunkable_bytes: int
    chunk_bytes: int
    bytes_per_chunk: int
    device_bytes: int
    full_bytes: int
    host_bytes: int
    chunked_shapes: Dict[str, Dict[str, Tuple[int, ...]]]

    @classmethod
    def _from_json(cls, p: dict) -> "ChunkPlan":
        shapes = {c: {l: tuple(s) for l, s in (labels or {}).items()} for c, labels in (p.get("chunked_shapes") or {}).items()}
        return cls(p["chunks"], p["chunk_length"], p["last_chunk_length"], p["total_runs"], p["buffers"],
                   p["granularity"], p["budget_bytes"], p["unchunkable_bytes"], p["chunk_bytes"], p["bytes_per_chunk"],
                   p["device_bytes"], p["full_bytes"], p["host_bytes"], shapes)


def _release_response(handle: int) -> None:
    try:
        _lib.lib().vram_response_release(handle)
    except Exception:  # interpreter shutting down
        pass


class ArrayResponse:
    """What an allocation gives a client (the Go ArrayResponse): its arrays
    (none for a member of the group that queued nothing) and the group's
    plan. The arrays stay the manager's (see vram.arrays on lifetimes); the
    response object only describes them, and is released when collected
    (or by release()).

    arrays: label -> each device array of buffer 0, as a Numba device array
    when Numba can reach it here (the manager's arrays option), else as a
    DeviceArray. device_arrays: the DeviceArrays themselves. host: label ->
    each pinned, mapped or pageable array of buffer 0 as a NumPy array.
    buffer(i) gives buffer i's three dicts."""

    def __init__(self, client: "Client", handle: int):
        self.client = client
        self.handle = handle
        self._finalizer = weakref.finalize(self, _release_response, handle)
        r = json.loads(_lib.text(_lib.lib().vram_response_json, handle))
        self.plan = ChunkPlan._from_json(r["plan"])
        self.free_error: Optional[str] = r.get("free_error") or None
        self._buffers = r["buffers"]
        self._sets: Dict[int, "ArraySet"] = {}

    def __repr__(self):
        return "vram.ArrayResponse(%s, %d chunks of %d runs, arrays %s)" % (
            self.client, self.plan.chunks, self.plan.chunk_length, sorted(self._buffers[0]) if self._buffers else [])

    def release(self) -> None:
        """Forgets the response now (views of its arrays must not be used
        afterwards); the collector does it otherwise."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def buffer(self, i: int) -> "ArraySet":
        """Buffer i's arrays (0 <= i < plan.buffers)."""
        s = self._sets.get(i)
        if s is None:
            if not 0 <= i < max(len(self._buffers), 1):
                raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: buffer %d of a response with %d" % (i, len(self._buffers)))
            s = self._sets[i] = ArraySet(self, i, self._buffers[i] if self._buffers else {})
        return s

    @property
    def arrays(self) -> Dict[str, Any]:
        return self.buffer(0).arrays

    @property
    def device_arrays(self) -> Dict[str, DeviceArray]:
        return self.buffer(0).device_arrays

    @property
    def host(self) -> Dict[str, Any]:
        return self.buffer(0).host

    @property
    def chunked_shapes(self) -> Dict[str, Tuple[int, ...]]:
        """label -> the shape allocated, for this client's arrays."""
        return {l: d.shape for l, d in self.device_arrays.items()} | {l: tuple(a.shape) for l, a in self.host.items()}

    def span(self, i: int, axis: int) -> Span:
        """Chunk i along axis, to copy with Client.to_device / from_device."""
        sp = _capi.Span()
        _lib.check(_lib.lib().vram_response_span(self.handle, i, axis, ctypes.byref(sp)))
        return Span(sp.axis, sp.start, sp.len)

    def chunk(self, i: int) -> Tuple[int, int]:
        """(start, runs) of chunk i."""
        sp = self.span(i, 0) if self.plan.chunks else Span(0, 0, 0)
        return sp.start, sp.len

    def member(self, client: "Client") -> Optional["ArrayResponse"]:
        """The response the same allocation gave client, a member of the
        group (its arrays, or the plan alone), or None."""
        out = ctypes.c_int64()
        status = _lib.lib().vram_response_member(self.handle, client.handle, ctypes.byref(out))
        if status == _lib.EINVAL:
            return None
        _lib.check(status)
        return ArrayResponse(client, out.value)


class ArraySet:
    """One buffer's arrays: arrays (Numba's or DeviceArrays, see
    ArrayResponse), device_arrays and host (NumPy arrays)."""

    def __init__(self, response: ArrayResponse, buffer: int, descs: dict):
        self.device_arrays: Dict[str, DeviceArray] = {}
        self.host: Dict[str, Any] = {}
        for label, d in sorted(descs.items()):
            if d["memory"] in ("device", "mapped"):  # freed since: ptr 0, and DeviceArray.freed says so
                self.device_arrays[label] = DeviceArray(response, label, buffer, d)
            if d["memory"] != "device" and d["host"]:  # a host array freed since has no bytes to view
                self.host[label] = numpy_view(d["host"], d["bytes"], d["dtype"], tuple(d["shape"]), response)
        self._response = response
        self._arrays: Optional[Dict[str, Any]] = None

    @property
    def arrays(self) -> Dict[str, Any]:
        if self._arrays is None:
            mgr = self._response.client.manager
            use_numba = mgr.arrays == "numba" or (mgr.arrays == "auto" and self.device_arrays and numba_mode(mgr.simulated))
            self._arrays = {l: (d.numba() if use_numba else d) for l, d in self.device_arrays.items()}
        return self._arrays


class Work:
    """A work mark (Client.begin_work): the client is busy, and never
    evicted, until end() and the device's finishing the work enqueued on
    its stream before it. A context manager."""

    def __init__(self, handle: int):
        self.handle = handle
        self._ended = False

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            _lib.check(_lib.lib().vram_end_work(self.handle))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.end()


def _shape_array(shape) -> "ctypes.Array":
    return (ctypes.c_int64 * max(len(shape), 1))(*shape)


class Client:
    """A registered component (the Go Client): made by Manager.register.
    Safe to use from any thread. A context manager that closes it. As in Go,
    it lives until close() or the manager's close, not until it is
    collected: the manager holds it (its group, its queue, its arrays)."""

    def __init__(self, manager, handle: int, name: str,
                 on_allocated: Optional[Callable[[ArrayResponse], None]],
                 on_invalidate: Optional[Callable[[Exception], None]]):
        self.manager = manager
        self.handle = handle
        self.name = name
        self.on_allocated = on_allocated
        self.on_invalidate = on_invalidate
        self.response: Optional[ArrayResponse] = None  # the latest response delivered to it
        self._in_flight: List[Any] = []  # host arrays copies use, kept until sync

    @property
    def id(self) -> int:
        """The client's id, unique in the process (its handle)."""
        return self.handle

    def __repr__(self):
        return "vram.Client(%s#%d)" % (self.name or "client", self.handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _info(self) -> _capi.ClientInfo:
        info = _capi.ClientInfo(size=ctypes.sizeof(_capi.ClientInfo))
        _lib.check(_lib.lib().vram_client_info(self.handle, ctypes.byref(info)))
        return info

    @property
    def group(self) -> str:
        """Its stream group's name."""
        return _lib.text(_lib.lib().vram_client_group, self.handle)

    @property
    def proportion(self) -> float:
        """Its manual proportion, or its part of the auto pool."""
        return self._info().proportion

    @property
    def cap(self) -> int:
        """proportion x the device's total memory, in bytes."""
        return self._info().cap

    @property
    def held(self) -> int:
        """Device bytes its arrays take, as the allocator charges them."""
        return self._info().held

    @property
    def grouped(self) -> bool:
        """It shares a named stream group (not "default") with another
        client (cubie's is_grouped)."""
        return bool(self._info().grouped)

    @property
    def closed(self) -> bool:
        return bool(self._info().closed)

    @property
    def evicted(self) -> bool:
        """Its arrays were evicted for another group and it has not been
        allocated since."""
        return bool(self._info().evicted)

    @property
    def idle(self) -> bool:
        """No work mark open, and the device done with the work before each
        end: eviction may take its arrays."""
        return bool(self._info().idle)

    @property
    def stream(self) -> int:
        """Its group's stream handle: a CUstream on a GPU (numba_stream()
        wraps it), a number naming the stream on the simulator."""
        return self._info().stream

    def numba_stream(self):
        """Its group's stream as a Numba stream, to launch kernels on: an
        external stream on a GPU; under Numba's simulator, which runs
        kernels at once on the host, a simulator stream."""
        from numba import cuda

        if numba_mode(self.manager.simulated) == "sim":
            return cuda.stream()
        return cuda.external_stream(self.stream)

    def queue(self, requests: Mapping[str, "ArrayRequest | Mapping[str, Any]"]) -> None:
        """Queues requests (label -> ArrayRequest, or a mapping of its
        fields) for the next allocation of any member of the group,
        replacing what the client had queued; an empty mapping drops its
        queue. An invalid request queues nothing (InvalidArgumentError)."""
        reqs = [(label, ArrayRequest.of(r)) for label, r in requests.items()]
        arr = (_capi.Request * max(len(reqs), 1))()
        keep = []
        for i, (label, r) in enumerate(reqs):
            shape = _shape_array(r.shape)
            keep.append(shape)
            arr[i] = _capi.Request(label=str(label).encode(), shape=shape, ndim=len(r.shape),
                                   dtype=_capi.DTYPES[r.dtype], memory=_capi.MEMORY[r.memory],
                                   chunk_axis=r.chunk_axis, unchunkable=int(bool(r.unchunkable)),
                                   total_runs=r.total_runs)
        _lib.check(_lib.lib().vram_queue(self.handle, arr, len(reqs), ctypes.sizeof(_capi.Request)))

    def allocate(self, buffers: int = 1) -> ArrayResponse:
        """Plans and allocates everything queued in the group (chunked when
        it does not fit; buffers sets of chunkable arrays in flight) and
        returns this client's response; every member's on_allocated gets its
        own. Raises OutOfMemoryError when even one run at a time does not
        fit, with the figures."""
        out = ctypes.c_int64()
        call_then_poll(self.manager, lambda: _lib.check(_lib.lib().vram_allocate(self.handle, int(buffers), ctypes.byref(out)),
                                                         self.manager.oom_report))
        r = ArrayResponse(self, out.value)
        self.response = r
        return r

    def free(self, label: str) -> None:
        """Frees its arrays under label (every buffer); none is no error."""
        _lib.check(_lib.lib().vram_client_free(self.handle, str(label).encode()))

    def close(self) -> None:
        """Frees its arrays, drops its queue, leaves its group and the
        pools. A second close does nothing."""
        try:
            _lib.check(_lib.lib().vram_client_close(self.handle))
        finally:
            self.manager._forget(self)
            self._in_flight.clear()

    def change_stream_group(self, group: str) -> None:
        """Moves it, with its queue, to group (made if new); its arrays stay
        valid (sync before using them on the new group's stream)."""
        call_then_poll(self.manager, lambda: _lib.check(_lib.lib().vram_change_group(self.handle, (group or "").encode())))

    def set_manual_proportion(self, p: float) -> None:
        """A manual proportion p (0 < p <= 1); a refusal changes nothing."""
        _lib.check(_lib.lib().vram_set_manual_proportion(self.handle, float(p)))

    def set_manual_limit_mode(self, p: float) -> None:
        """From the auto pool to the manual one with p; a manual client
        keeps its proportion."""
        _lib.check(_lib.lib().vram_set_manual_limit_mode(self.handle, float(p)))

    def set_auto_limit_mode(self) -> None:
        """To the auto pool; an auto client stays."""
        _lib.check(_lib.lib().vram_set_auto_limit_mode(self.handle))

    def _copy(self, fn, device: Any, host, span: Optional[Span], writable: bool) -> None:
        import numpy as np

        device = getattr(device, "_vram_array", device)  # a Numba array of a response: its DeviceArray
        if not isinstance(device, DeviceArray):
            raise TypeError("vram: %r is not an array of an ArrayResponse (a vram.DeviceArray, or ArrayResponse.arrays' Numba array)" % (device,))
        if not isinstance(host, np.ndarray):
            raise TypeError("vram: the host side is a %s; want a NumPy array" % type(host).__name__)
        if not host.flags.c_contiguous or (writable and not host.flags.writeable):
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: the host array %s%s must be C-contiguous%s (np.ascontiguousarray)" % (
                host.dtype, list(host.shape), " and writable" if writable else ""))
        shape = _shape_array(host.shape)
        desc = _capi.HostDesc(data=host.ctypes.data, shape=shape, ndim=host.ndim, dtype=_capi.DTYPES[dtype_name(host.dtype)])
        sp = None if span is None else ctypes.byref(_capi.Span(*span))
        _lib.check(fn(self.handle, device.response.handle, device.label.encode(), device.buffer, ctypes.byref(desc), sp))
        self._in_flight.append(host)

    def to_device(self, dst: Any, src, span: Optional[Span] = None) -> None:
        """Copies the NumPy array src into dst (a DeviceArray, or the Numba
        array ArrayResponse.arrays gives for it) on the client's stream: whole
        (equal shapes), or with span the runs span of the full-length src
        into the first span.len runs of the chunk-length dst. Returns once
        enqueued; src is kept, unchanged, until sync()."""
        self._copy(_lib.lib().vram_to_device, dst, src, span, False)

    def from_device(self, dst, src: Any, span: Optional[Span] = None) -> None:
        """The reverse of to_device, into the NumPy array dst (at the runs
        span); read dst after sync()."""
        self._copy(_lib.lib().vram_from_device, src, dst, span, True)

    def sync(self) -> None:
        """Waits for the work on the client's stream; raises its first
        error. Host arrays of the copies before are free again."""
        n = len(self._in_flight)  # the copies enqueued before this sync; another thread's later ones stay
        try:
            _lib.check(_lib.lib().vram_sync(self.handle))
        finally:
            del self._in_flight[:n]

    def begin_work(self) -> Work:
        """Marks work begun (a context manager that ends it): the client is
        busy, never evicted, until the device has done the work enqueued
        before the end. Raises FreedError when its arrays were evicted."""
        out = ctypes.c_int64()
        _lib.check(_lib.lib().vram_begin_work(self.handle, ctypes.byref(out)))
        return Work(out.value)


def call_then_poll(manager, call: Callable[[], Any]) -> Any:
    """Runs call, then delivers the events it caused (Manager.poll). The
    call's exception wins over a hook's, which it carries as its context."""
    try:
        result = call()
    except BaseException as e:
        try:
            manager.poll()
        except Exception:
            raise e
        raise
    manager.poll()
    return result


def deliver_events(manager) -> int:
    """Manager.poll: takes the manager's queued events and calls the hooks of
    the clients registered through manager, on this thread, in order."""
    lib = _lib.lib()
    reason = ctypes.create_string_buffer(4096)
    taken, first = 0, None
    with manager._poll_lock:  # one thread delivers at a time, so a client's hooks keep their order
        while True:
            ev = _capi.Event(size=ctypes.sizeof(_capi.Event))
            _lib.check(lib.vram_poll(manager.handle, ctypes.byref(ev), reason, len(reason)))
            if ev.kind == _capi.EVENT_NONE:
                break
            taken += 1
            try:
                _deliver(manager, ev, reason.value.decode("utf-8", "replace"))
            except Exception as e:  # delivered the rest first
                first = first or e
    if first is not None:
        raise first
    return taken


def _deliver(manager, ev: _capi.Event, reason: str) -> None:
    c = manager._clients.get(ev.client)
    if ev.kind == _capi.EVENT_ALLOCATED:
        if c is None:  # closed since, or another program's client
            _lib.lib().vram_response_release(ev.response)
            return
        r = ArrayResponse(c, ev.response)
        c.response = r
        if c.on_allocated is not None:
            c.on_allocated(r)
    elif ev.kind == _capi.EVENT_INVALIDATED and c is not None:
        c.response = None
        if c.on_invalidate is not None:
            c.on_invalidate(_lib.FreedError(_lib.EFREED, reason, evicted=bool(ev.evicted)))


class _HostArray:
    """The owner of a host array from Manager.host_array: frees it when
    collected, or at free()."""

    def __init__(self, handle: int):
        self.handle = handle
        self._finalizer = weakref.finalize(self, _free_host, handle)

    def free(self) -> None:
        self._finalizer()


def _free_host(handle: int) -> None:
    try:
        _lib.lib().vram_host_free(handle)
    except Exception:  # interpreter shutting down
        pass


def host_array(manager, shape, dtype, memory: str, like):
    """Manager.host_array."""
    import numpy as np

    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    name = dtype_name(dtype)
    if memory not in ("pinned", "mapped", "pageable"):
        raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: host memory %r: want pinned, mapped or pageable" % (memory,))
    h, data = ctypes.c_int64(), ctypes.c_void_p()
    _lib.check(_lib.lib().vram_host_array(manager.handle, _shape_array(shape), len(shape), _capi.DTYPES[name],
                                          _capi.MEMORY[memory], ctypes.byref(h), ctypes.byref(data)))
    owner = _HostArray(h.value)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(name).itemsize
    arr = numpy_view(data.value or 0, nbytes, name, shape, owner)
    if like is not None:
        arr[...] = like
    return arr


def free_host(array) -> None:
    """Manager.free_host: frees the host array that array views."""
    base = array
    while base is not None:
        owner = getattr(base, "_vram_owner", None)
        if isinstance(owner, _HostArray):
            owner.free()
            return
        base = getattr(base, "base", None)
    raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: %s%s is not a host array of Manager.host_array" % (
        getattr(array, "dtype", type(array).__name__), list(getattr(array, "shape", ()))))
