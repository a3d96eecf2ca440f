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
import threading
import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

from . import _capi, _lib
from .arrays import DTYPE_NAMES, DeviceArray, numba_mode, numpy_view

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

    def __reduce__(self):
        # its fields only: the C structs _c keeps are not for pickle or copy
        return (type(self), (self.shape, self.dtype, self.memory, self.chunk_axis, self.unchunkable, self.total_runs))

    def _c(self, label: str) -> _capi.Request:
        """The request as vram.h's struct vram_request under label, made
        once per label (the request is immutable; at most 8 labels kept):
        Client.queue copies it into the array it gives C, and the struct
        keeps its C label and shape alive."""
        made = self.__dict__.get("_c_made")
        if made is None:
            made = self.__dict__["_c_made"] = {}
        c = made.get(label)
        if c is None:
            c = _capi.Request(str(label).encode(), _shape_array(self.shape), len(self.shape), _capi.DTYPES[self.dtype],
                              _capi.MEMORY[self.memory], self.chunk_axis, bool(self.unchunkable), 0, self.total_runs)
            if len(made) < 8:
                made[label] = c
        return c


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


class _PlanFields(NamedTuple):
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


class ChunkPlan(_PlanFields):
    """The group's plan (the Go ChunkPlan): chunks passes of chunk_length
    runs (the last of last_chunk_length), total_runs in all, buffers sets of
    chunkable arrays, the budget it was made within and the bytes it takes
    (device bytes counted as the allocator charges them, in units of
    granularity); chunked_shapes gives, per client ("name#id") and label,
    the shape allocated (read from the library on first use, while the
    response is held). Immutable; equal when the figures are."""

    @classmethod
    def _of(cls, p: _capi.Plan, handle: Optional["_Handle"]) -> "ChunkPlan":
        plan = cls(p.chunks, p.chunk_length, p.last_chunk_length, p.total_runs, p.buffers, p.granularity, p.budget,
                   p.unchunkable_bytes, p.chunk_bytes, p.bytes_per_chunk, p.device_bytes, p.full_bytes, p.host_bytes)
        plan.__dict__["_response"] = handle
        return plan

    @property
    def chunked_shapes(self) -> Dict[str, Dict[str, Tuple[int, ...]]]:
        h = self.__dict__.get("_response")
        if h is None:
            return {}
        shapes = h.json()["plan"].get("chunked_shapes") or {}
        return {c: {l: tuple(s) for l, s in (labels or {}).items()} for c, labels in shapes.items()}


class _Handle:
    """A response's handle, released when the last object holding it (the
    ArrayResponse, its plan, its arrays and their views) is collected, or by
    release(). Not in any reference cycle: it goes when they do."""

    __slots__ = ("value", "alive", "_json", "__weakref__")

    def __init__(self, value: int):
        self.value = value
        self.alive = True
        self._json = None

    def release(self) -> None:
        if self.alive:
            self.alive = False
            _release_response(self.value)

    def __del__(self):
        try:
            self.release()
        except Exception:  # interpreter shutting down
            pass

    def json(self) -> dict:
        """The response as vram_response_json gives it (the plan's shapes,
        the free error's text), read once."""
        if self._json is None:
            if not self.alive:
                raise _lib.VramError(_lib.EHANDLE, "vram: the response was released; read its plan's shapes before release()")
            self._json = json.loads(_lib.text(_lib.lib().vram_response_json, self.value))
        return self._json


def _release_response(handle: int) -> None:
    try:
        _lib.lib().vram_response_release(handle)
    except Exception:  # interpreter shutting down
        pass


def _plan_of(handle: int) -> _capi.Plan:
    p = _capi.Plan(size=_PLAN_SIZE)
    _lib.check(_lib.lib().vram_response_plan(handle, ctypes.byref(p)))
    return p


_PLAN_SIZE = ctypes.sizeof(_capi.Plan)
_ARRAY_SIZE = ctypes.sizeof(_capi.Array)


def _response(client: "Client", handle: int, id: int = 0) -> "ArrayResponse":
    """The ArrayResponse of handle, given to client: the one the manager
    already has for the same response (its id, read when not given), the
    handle then released, or a new one."""
    responses = client.manager._responses
    p = None
    if not id:
        p = _plan_of(handle)
        id = p.id
    r = responses.get(id)
    if r is not None and r.client is client and r._handle.alive:
        _release_response(handle)
        return r
    r = ArrayResponse(client, handle, p)
    responses[id] = r
    return r


class ArrayResponse:
    """What an allocation gives a client (the Go ArrayResponse): its arrays
    (none for a member of the group that queued nothing) and the group's
    plan. The arrays stay the manager's (see vram.arrays on lifetimes); the
    response object only describes them, and is released when collected
    (or by release()). One allocation's response to a client is one
    object: Client.allocate's return, the client's on_allocated argument
    and ArrayResponse.member's for it are the same.

    arrays: label -> each device array of buffer 0, as a Numba device array
    when Numba can reach it here (the manager's arrays option), else as a
    DeviceArray. device_arrays: the DeviceArrays themselves. host: label ->
    each pinned, mapped or pageable array of buffer 0 as a NumPy array.
    buffer(i) gives buffer i's three dicts."""

    def __init__(self, client: "Client", handle: int, plan: Optional[_capi.Plan] = None, described=None):
        # described: (descs, sim_hosts) of buffer 0, as vram_queue_allocate gave them
        p = plan if plan is not None else _plan_of(handle)
        self.client = client
        self.handle = handle
        self.id: int = p.id
        self._handle = _Handle(handle)
        self.plan = ChunkPlan._of(p, self._handle)
        self._has_free_error = bool(p.free_error)
        self._sets_n = max(p.sets, 1)
        self._arrays_n = p.arrays
        self._sets: Dict[int, "ArraySet"] = {}
        if described is not None:
            self._sets[0] = ArraySet(client.manager, self._handle, 0, described[0], described[1])

    def __repr__(self):
        return "vram.ArrayResponse(%s, %d chunks of %d runs, arrays %s)" % (
            self.client, self.plan.chunks, self.plan.chunk_length, sorted(self.chunked_shapes))

    @cached_property
    def free_error(self) -> Optional[str]:
        """What went wrong freeing the arrays this allocation replaced (the
        Go FreeErr's text), or None: the allocation stands either way."""
        return (self._handle.json().get("free_error") or None) if self._has_free_error else None

    def release(self) -> None:
        """Forgets the response now (views of its arrays must not be used
        afterwards, nor plan.chunked_shapes read); the collector does it
        otherwise."""
        responses = self.client.manager._responses
        if responses.get(self.id) is self:
            del responses[self.id]
        self._handle.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def buffer(self, i: int) -> "ArraySet":
        """Buffer i's arrays (0 <= i < plan.buffers)."""
        s = self._sets.get(i)
        if s is None:
            if not 0 <= i < self._sets_n:
                raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: buffer %d of a response with %d" % (i, self._sets_n))
            s = self._sets[i] = ArraySet(self.client.manager, self._handle, i, self._describe(i))
        return s

    def _describe(self, buffer: int) -> list:
        """Buffer buffer's arrays as vram_response_arrays describes them."""
        n = ctypes.c_size_t()
        cap = self._arrays_n
        out = (_capi.Array * max(cap, 1))()
        _lib.check(_lib.lib().vram_response_arrays(self.handle, buffer, out, cap, _ARRAY_SIZE, ctypes.byref(n)))
        if n.value > cap:  # cannot happen: every buffer holds the same labels
            raise _lib.VramError(_lib.EINVAL, "vram: buffer %d holds %d arrays, buffer 0 %d" % (buffer, n.value, cap))
        return out[:n.value]

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
        return _response(client, out.value)


class ArraySet:
    """One buffer's arrays: arrays (Numba's or DeviceArrays, see
    ArrayResponse), device_arrays and host (NumPy arrays)."""

    def __init__(self, manager, handle: "_Handle", buffer: int, descs: list, sim_hosts=None):
        # sim_hosts: each desc's simulator host address (None: read when a view needs it)
        self.device_arrays: Dict[str, DeviceArray] = {}
        self.host: Dict[str, Any] = {}
        for i, d in enumerate(descs):
            label = d.label.decode()
            if d.memory in _DEVICE_MEMORY:  # freed since: ptr 0, and DeviceArray.freed says so
                sim = (sim_hosts[i] or 0) if sim_hosts is not None and d.memory == _DEVICE else 0
                self.device_arrays[label] = DeviceArray(handle, label, buffer, d, manager=manager, sim_host=sim)
            if d.memory != _capi.MEMORY["device"] and d.host:  # a host array freed since has no bytes to view
                self.host[label] = numpy_view(d.host, d.bytes, DTYPE_NAMES[d.dtype], tuple(d.shape[:d.ndim]), handle)
        self._manager = manager
        self._arrays: Optional[Dict[str, Any]] = None

    @property
    def arrays(self) -> Dict[str, Any]:
        if self._arrays is None:
            mgr = self._manager
            use_numba = mgr.arrays == "numba" or (mgr.arrays == "auto" and self.device_arrays and numba_mode(mgr.simulated))
            self._arrays = {l: (d.numba() if use_numba else d) for l, d in self.device_arrays.items()}
        return self._arrays


_DEVICE = _capi.MEMORY["device"]
_DEVICE_MEMORY = (_DEVICE, _capi.MEMORY["mapped"])


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


_REQUEST_SIZE = ctypes.sizeof(_capi.Request)


def _shape_array(shape) -> "ctypes.Array":
    return (ctypes.c_int64 * max(len(shape), 1))(*shape)


_shapes: Dict[Tuple[int, ...], "ctypes.Array"] = {}  # the C shapes copies were given, by shape (read-only to C)


def _c_shape(shape: Tuple[int, ...]) -> "ctypes.Array":
    """shape as C's int64_t array, made once per shape (at most 256 kept)."""
    a = _shapes.get(shape)
    if a is None:
        if len(_shapes) >= 256:
            _shapes.clear()
        a = _shapes[shape] = _shape_array(shape)
    return a


_np_module = None


def _numpy():
    global _np_module
    if _np_module is None:
        import numpy

        _np_module = numpy
    return _np_module


_DTYPE_CODES: Dict[Any, int] = {}  # NumPy dtype -> vram.h's code, for the dtypes copies have met


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
        self._hooked = bool(on_allocated or on_invalidate)  # asked the library for events at registration
        self.response: Optional[ArrayResponse] = None  # the latest response delivered to it
        self._in_flight: List[Any] = []  # host arrays copies use, kept until sync
        self._call: Optional[_AllocCall] = None  # allocate's structs, made on first use

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
        """Whether it is closed: by close(), or with its manager."""
        info = _capi.ClientInfo(size=ctypes.sizeof(_capi.ClientInfo))
        status = _lib.lib().vram_client_info(self.handle, ctypes.byref(info))
        if status == _lib.EHANDLE:  # closed, and forgotten by the library
            return True
        _lib.check(status)
        return bool(info.closed)

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
        arr, n = self._requests(requests)
        _lib.check(_lib.lib().vram_queue(self.handle, arr, n, _REQUEST_SIZE))

    def allocate(self, buffers: int = 1) -> ArrayResponse:
        """Plans and allocates everything queued in the group (chunked when
        it does not fit; buffers sets of chunkable arrays in flight) and
        returns this client's response; every member's on_allocated gets its
        own. Raises OutOfMemoryError when even one run at a time does not
        fit, with the figures."""
        return allocate(self, None, buffers)

    def queue_allocate(self, requests: Mapping[str, "ArrayRequest | Mapping[str, Any]"], buffers: int = 1) -> ArrayResponse:
        """queue(requests), then allocate(buffers), in one call into the
        library: a refused queue allocates nothing."""
        return allocate(self, requests, buffers)

    def _requests(self, requests) -> Tuple["ctypes.Array", int]:
        n = len(requests)
        arr = (_capi.Request * max(n, 1))()
        for i, (label, r) in enumerate(requests.items()):
            arr[i] = ArrayRequest.of(r)._c(label)
        return arr, n

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
        device = getattr(device, "_vram_array", device)  # a Numba array of a response: its DeviceArray
        if not isinstance(device, DeviceArray) or device._handle is None:
            raise TypeError("vram: %r is not an array of an ArrayResponse (a vram.DeviceArray, or ArrayResponse.arrays' "
                            "Numba array; a vram.Batch copies its own)" % (device,))
        flags = getattr(host, "flags", None)
        if flags is None or not isinstance(host, _numpy().ndarray):
            raise TypeError("vram: the host side is a %s; want a NumPy array" % type(host).__name__)
        if not flags.c_contiguous or (writable and not flags.writeable):
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: the host array %s%s must be C-contiguous%s (np.ascontiguousarray)" % (
                host.dtype, list(host.shape), " and writable" if writable else ""))
        code = _DTYPE_CODES.get(host.dtype)
        if code is None:
            code = _DTYPE_CODES[host.dtype] = _capi.DTYPES[dtype_name(host.dtype)]
        desc = _capi.HostDesc(host.ctypes.data, _c_shape(host.shape), host.ndim, code)
        sp = None if span is None else ctypes.byref(_capi.Span(*span))
        _lib.check(fn(self.handle, device._handle.value, device._label_c, device.buffer, ctypes.byref(desc), sp))
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


class _AllocCall:
    """A client's structs for vram_queue_allocate, reused by its
    allocations (one at a time: busy; a concurrent one makes its own):
    the plan, room for cap arrays of buffer 0 and, on the simulator when
    the arrays may become Numba's, their host addresses."""

    __slots__ = ("a", "ref", "plan", "arrays", "hosts", "sim", "busy")

    def __init__(self, sim: bool, cap: int = 4):
        self.plan = _capi.Plan(size=_PLAN_SIZE)
        self.a = _capi.Allocation(size=ctypes.sizeof(_capi.Allocation), plan=ctypes.pointer(self.plan),
                                  array_size=_ARRAY_SIZE)
        self.ref = ctypes.byref(self.a)
        self.sim = sim
        self.busy = threading.Lock()
        self.grow(cap)

    def grow(self, cap: int) -> None:
        self.arrays = (_capi.Array * cap)()
        self.a.arrays, self.a.cap = ctypes.addressof(self.arrays), cap
        self.hosts = (ctypes.c_void_p * cap)() if self.sim else None
        self.a.sim_hosts = ctypes.addressof(self.hosts) if self.sim else None


def _alloc_call(client: "Client") -> Tuple[_AllocCall, bool]:
    """client's _AllocCall, taken (True: release its busy lock after), or a
    fresh one while another thread uses it."""
    c = client._call
    if c is None:
        mgr = client.manager
        c = client._call = _AllocCall(mgr.simulated and mgr.arrays != "vram")
    if c.busy.acquire(False):
        return c, True
    return _AllocCall(c.sim), False


def _queue_allocate(client: "Client", requests, buffers: int, flags: int) -> Tuple[ArrayResponse, bool, int, Tuple[int, int]]:
    """One vram_queue_allocate: client's response, whether its own event
    was taken (to deliver), the events pending, and the device's (free,
    total) memory before it (with ALLOCATE_MEM_INFO)."""
    call, taken = _alloc_call(client)
    try:
        a = call.a
        a.flags, a.buffers = flags | _capi.ALLOCATE_TAKE_EVENT, int(buffers)
        arr, n = (None, 0)
        if requests is not None:
            arr, n = client._requests(requests)
            a.flags |= _capi.ALLOCATE_QUEUE
        _lib.check(_lib.lib().vram_queue_allocate(client.handle, arr, n, _REQUEST_SIZE, call.ref), client.manager.oom_report)
        described = None
        if a.n <= a.cap:
            described = (call.arrays[:a.n], call.hosts[:a.n] if call.sim else None)
        else:  # read by the response, and room for them next time
            call.grow(a.n)
        r = ArrayResponse(client, a.response, call.plan, described)
        client.manager._responses[r.id] = r
        return r, bool(a.event_taken), a.pending, (a.free_bytes, a.total_bytes)
    finally:
        if taken:
            call.busy.release()


def allocate(client: "Client", requests, buffers: int, flags: int = 0, before_hooks: Optional[Callable] = None) -> ArrayResponse:
    """Client.allocate and queue_allocate: one vram_queue_allocate, then
    the client's own event (when the call took it: first, as the queue
    had it) and the others the call caused, as call_then_poll delivers
    them. before_hooks((free, total)), if given, is called before any hook
    with the device's memory read before the allocation (flags
    ALLOCATE_MEM_INFO)."""
    mgr = client.manager
    try:
        r, own, pending, mem = _queue_allocate(client, requests, buffers, flags)
    except BaseException as e:
        try:
            if mgr._hooked:
                mgr.poll()
        except Exception:
            raise e
        raise
    first = None
    try:
        if before_hooks is not None:
            before_hooks(mem)
    except Exception as e:
        first = e
    if own:
        with mgr._poll_lock:  # after any event another thread took before ours
            try:
                _deliver_allocated(client, r)
            except Exception as e:
                first = first or e
    if pending > 0 and mgr._hooked:
        try:
            mgr.poll()
        except Exception as e:
            first = first or e
    client.response = r
    if first is not None:
        raise first
    return r


def call_then_poll(manager, call: Callable[[], Any]) -> Any:
    """Runs call, then delivers the events it caused (Manager.poll), when
    a client of manager asked for events. The call's exception wins over a
    hook's, which it carries as its context."""
    try:
        result = call()
    except BaseException as e:
        try:
            if manager._hooked:
                manager.poll()
        except Exception:
            raise e
        raise
    if manager._hooked:
        manager.poll()
    return result


class _Poller:
    """A manager's event struct and reason buffer, reused by every poll
    (one thread polls at a time: Manager._poll_lock)."""

    __slots__ = ("event", "ref", "reason")

    def __init__(self):
        self.event = _capi.Event(size=ctypes.sizeof(_capi.Event))
        self.ref = ctypes.byref(self.event)
        self.reason = ctypes.create_string_buffer(4096)


def deliver_events(manager) -> int:
    """Manager.poll: takes the manager's queued events and calls the hooks of
    the clients registered through manager, on this thread, in order."""
    poll = _lib.lib().vram_poll
    taken, first = 0, None
    with manager._poll_lock:  # one thread delivers at a time, so a client's hooks keep their order
        p = manager._poller
        ev = p.event
        while True:
            _lib.check(poll(manager.handle, p.ref, p.reason, len(p.reason)))
            if ev.kind == _capi.EVENT_NONE:
                break
            taken += 1
            more = ev.pending
            try:
                _deliver(manager, ev.kind, ev.client, ev.response, ev.response_id, bool(ev.evicted),
                         p.reason.value.decode("utf-8", "replace") if ev.kind == _capi.EVENT_INVALIDATED else "")
            except Exception as e:  # delivered the rest first
                first = first or e
            if more <= 0:
                break
    if first is not None:
        raise first
    return taken


def _deliver(manager, kind: int, client: int, response: int, response_id: int, evicted: bool, reason: str) -> None:
    c = manager._clients.get(client)
    if kind == _capi.EVENT_ALLOCATED:
        if c is None:  # closed since, or another program's client
            _lib.lib().vram_response_release(response)
            return
        _deliver_allocated(c, _response(c, response, response_id))
    elif kind == _capi.EVENT_INVALIDATED and c is not None:
        c.response = None
        if c.on_invalidate is not None:
            c.on_invalidate(_lib.FreedError(_lib.EFREED, reason, evicted=evicted))


def _deliver_allocated(c: "Client", r: ArrayResponse) -> None:
    c.response = r
    if c.on_allocated is not None:
        c.on_allocated(r)


class _HostArray:
    """The owner of a host array from Manager.host_array (handle, and the
    address, shape and dtype it was made with): frees it when collected,
    or at free()."""

    def __init__(self, handle: int, address: int, shape: Tuple[int, ...], dtype: Any):
        self.handle = handle
        self.address, self.shape, self.dtype = address, shape, dtype
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
    owner = _HostArray(h.value, data.value or 0, shape, np.dtype(name))
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
