"""vram.Batch: a batch of runs bigger than the device, declared once,
allocated by the manager in chunks and run chunk by chunk through the Go
batch package's pipeline; the caller's loop launches each chunk's
kernels.

    b = vram.Batch()                      # two buffers in flight where the plan allows
    b.input(inp, "x", x)                  # a NumPy array, run axis 0
    b.output(out, "y", y)
    for ch in b.chunks():                 # ch["x"], ch["y"]: the chunk's arrays
        kernel[blocks, threads, ch.stream](ch["x"], ch["y"])
    b.report                              # what the pipeline did

Each array is declared once with its client (all of one stream group), its
label (unique in the batch) and its host side, a full-length NumPy array
whose shape and dtype are the request's: input (copied in before each
chunk's kernels), output (copied out after them), inout (both, at the same
runs) or scratch (no host side; a request). An unchunkable input is copied
in once, an unchunkable output out once at the end. A NumPy array of
Manager.host_array (pinned) is copied from directly; any other is staged
through the manager's pinned staging pool.

chunks() starts the pipeline (allocate() does it first if called) and
yields one Chunk per pass: its index, its runs (start, runs, the span along
an axis), its buffer's arrays (ch[label], as ArrayResponse.arrays gives
them: Numba device arrays when Numba can reach them) and the stream its
kernels go on (ch.stream). With buffers > 1 that is a stream of the
batch's own: the copies of one chunk go on the group's stream beside the
kernels of another, events order the two, and outputs are copied back
behind the kernels. Asking for the next chunk tells the pipeline the
chunk's kernels are enqueued. Between chunks the pipeline re-cuts them when
the group's budget changes (another group's claim: its arrays are then
allocated again, and each chunk gives its own); with buffers=0 it chooses
1, 2 or 3 after the first chunk. The clients are busy (never evicted)
while it runs. Breaking out of the loop (or close(), or cancel() from
another thread) stops it: the work already enqueued finishes. Nothing
calls into Python from another thread: the pipeline runs on a thread of
the library's and waits for the loop.

On vram's simulator, kernels run on the host (Numba's CUDA simulator, or
code on host_view()): the pipeline hands a chunk over once its copies in
are done, and copies its outputs out once the loop asks for the next.

The NumPy arrays must stay alive and untouched while it runs (read the
outputs once chunks() ends). A chunk's arrays are valid until the next
chunk; the batch frees its device arrays when it ends.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

from . import _capi, _lib
from .arrays import DeviceArray, numba_mode
from .client import ArrayRequest, ChunkPlan, Client, Span, _HostArray, call_then_poll, dtype_name

__all__ = ["Batch", "Chunk", "Report", "Recut"]


@dataclass
class _Decl:
    client: Client
    label: str
    request: ArrayRequest
    host: Any  # the NumPy array, None for scratch
    direction: int  # _capi.BATCH_*


class Chunk:
    """One pass of a batch: index (from 0), chunks (the batch's chunks as now
    cut), start and runs (the chunk's runs along every chunked array's run
    axis), chunk_length (the arrays' length there now: runs or more),
    buffer, arrays (label -> the chunk's buffer's array) and stream (where
    its kernels go: a Numba stream when the arrays are Numba's, else the
    stream's handle). Valid until the next chunk."""

    __slots__ = ("index", "chunks", "start", "runs", "chunk_length", "buffer", "arrays", "stream")

    def __init__(self, index: int, chunks: int, start: int, runs: int, chunk_length: int, buffer: int,
                 arrays: Dict[str, Any], stream: Any):
        self.index, self.chunks, self.start, self.runs = index, chunks, start, runs
        self.chunk_length, self.buffer, self.arrays, self.stream = chunk_length, buffer, arrays, stream

    def __getitem__(self, label: str) -> Any:
        return self.arrays[label]

    def span(self, axis: int) -> Span:
        """The chunk's runs along axis."""
        return Span(axis, self.start, self.runs)

    @property
    def slice(self) -> slice:
        """slice(start, start + runs): the chunk's runs in a full-length array."""
        return slice(self.start, self.start + self.runs)

    def __repr__(self):
        return "vram.Chunk(%d of %d: runs %d..%d, buffer %d)" % (self.index, self.chunks, self.start,
                                                                 self.start + self.runs, self.buffer)


class Recut(NamedTuple):
    """A change of the chunks between two of them (the Go batch.Recut): at
    (seconds into the run), from chunk on, from and to runs a chunk, the
    arrays' lengths, the buffers from then on, and why."""

    at: float
    chunk: int
    from_: int
    to: int
    arrays_from: int
    arrays_to: int
    buffers: int
    why: str


class Report(NamedTuple):
    """What a batch did (the Go batch.Report): chunks taken and done, runs,
    the longest chunk_length, buffers and lag at the end, arrays staged,
    bytes each way, and times in seconds: wall, copy, compute, the copy no
    compute hid (exposed_copy), the device's idle time, the staging's fill
    and write; recuts, and how the buffers were chosen."""

    chunks: int
    chunks_done: int
    runs: int
    chunk_length: int
    buffers: int
    lag: int
    staged: int
    bytes_in: int
    bytes_out: int
    wall: float
    copy: float
    compute: float
    exposed_copy: float
    device_idle: float
    fill: float
    write: float
    write_wait: float
    recuts: List[Recut]
    buffer_choice: str

    @classmethod
    def _of(cls, r: dict) -> "Report":
        recuts = [Recut(c["at"], c["chunk"], c["from"], c["to"], c["arrays_from"], c["arrays_to"], c["buffers"], c["why"])
                  for c in r.get("recuts") or []]
        return cls(r["chunks"], r["chunks_done"], r["runs"], r["chunk_length"], r["buffers"], r["lag"], r["staged"],
                   r["bytes_in"], r["bytes_out"], r["wall"], r["copy"], r["compute"], r["exposed_copy"], r["device_idle"],
                   r["fill"], r["write"], r["write_wait"], recuts, r["buffer_choice"])


class Batch:
    """A batch's arrays, their clients and host sides; see the module's doc.
    buffers: buffers in flight, 1 to 3, or 0 for the pipeline to choose after
    the first chunk (2 by default; a batch of one chunk uses one);
    max_chunk_length caps a chunk's runs (0: none); grow lets the chunks
    grow when the budget does."""

    def __init__(self, buffers: int = 2, *, max_chunk_length: int = 0, grow: bool = False):
        if not 0 <= buffers <= 3:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: a batch of %d buffers: want 1 to 3, or 0 for the pipeline to choose" % buffers)
        if max_chunk_length < 0:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: max_chunk_length %d: want 0 (no cap) or more" % max_chunk_length)
        self.buffers = buffers
        self.max_chunk_length = max_chunk_length
        self.grow = grow
        self._decls: Dict[str, _Decl] = {}
        self._handle = 0  # the started batch, until it ends
        self._keep: list = []  # what the C declarations point at, while it runs
        self.plan: Optional[ChunkPlan] = None  # the allocation's (the latest, once chunks() ran)
        self.report: Optional[Report] = None  # once chunks() ends

    @property
    def response(self):
        raise AttributeError("vram: Batch.response is gone: the batch's plan is Batch.plan, and each chunk gives its "
                             "arrays (ch[label])")

    def _declare(self, client: Client, label: str, request: ArrayRequest, host: Any, direction: int) -> None:
        if self._handle:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: batch array %r declared while the batch runs; declare every array first" % label)
        if label in self._decls:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: batch array %r declared twice; labels are unique in a batch" % label)
        if self._decls:
            first = next(iter(self._decls.values())).client
            if first.group != client.group:
                raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: batch array %r is %s's, of stream group %r; the batch's clients are of %r" % (
                    label, client, client.group, first.group))
        self._decls[label] = _Decl(client, label, request, host, direction)
        self.plan = None

    def _host(self, client: Client, label: str, host: Any, chunk_axis: int, unchunkable: bool, direction: int) -> None:
        import numpy as np

        if not isinstance(host, np.ndarray):
            raise TypeError("vram: batch array %r: the host side is a %s; want a NumPy array" % (label, type(host).__name__))
        writes = direction != _capi.BATCH_IN
        if not host.flags.c_contiguous or (writes and not host.flags.writeable):
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: batch array %r: the host array must be C-contiguous%s (np.ascontiguousarray)" % (
                label, " and writable" if writes else ""))
        req = ArrayRequest(host.shape, dtype_name(host.dtype), chunk_axis=chunk_axis, unchunkable=unchunkable)
        self._declare(client, label, req, host, direction)

    def input(self, client: Client, label: str, host: Any, *, chunk_axis: int = 0, unchunkable: bool = False) -> None:
        """An array copied from host (a NumPy array) before each chunk."""
        self._host(client, label, host, chunk_axis, unchunkable, _capi.BATCH_IN)

    def output(self, client: Client, label: str, host: Any, *, chunk_axis: int = 0, unchunkable: bool = False) -> None:
        """An array copied into host (a writable NumPy array) after each chunk."""
        self._host(client, label, host, chunk_axis, unchunkable, _capi.BATCH_OUT)

    def inout(self, client: Client, label: str, host: Any, *, chunk_axis: int = 0, unchunkable: bool = False) -> None:
        """An array copied in before each chunk and out after it, at the same
        runs of host."""
        self._host(client, label, host, chunk_axis, unchunkable, _capi.BATCH_INOUT)

    def scratch(self, client: Client, label: str, request: "ArrayRequest | dict") -> None:
        """An array of the kernels' own, with no host side."""
        self._declare(client, label, ArrayRequest.of(request), None, _capi.BATCH_SCRATCH)

    @property
    def manager(self):
        """The manager of the batch's clients."""
        if not self._decls:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: the batch declares no arrays")
        return next(iter(self._decls.values())).client.manager

    def allocate(self) -> ChunkPlan:
        """Allocates every array with one allocation of the group (each
        client's queue replaced by its arrays), planned and chunked by the
        manager, and starts the pipeline; returns the plan. chunks() calls it
        when it was not."""
        if self._handle:
            return self.plan
        decls = list(self._decls.values())
        m = self.manager
        arr = (_capi.BatchArray * len(decls))()
        keep = []
        for i, d in enumerate(decls):
            host, handle = None, 0
            if d.host is not None:
                owner = _host_array_of(d.host)
                handle, host = (owner.handle, None) if owner is not None else (0, d.host.ctypes.data)
            req = d.request._c(d.label)
            arr[i] = _capi.BatchArray(d.client.handle, req, d.direction, 0, host, handle)
            keep += [d.host, req]  # the host memory, the label and shape C reads
        o = _capi.BatchOptions(size=ctypes.sizeof(_capi.BatchOptions), buffers=self.buffers,
                               host_kernels=int(m.simulated), max_chunk_length=self.max_chunk_length, grow=int(self.grow))
        h = ctypes.c_int64()
        call_then_poll(m, lambda: _lib.check(_lib.lib().vram_batch_start(
            m.handle, arr, len(decls), ctypes.sizeof(_capi.BatchArray), ctypes.byref(o), ctypes.byref(h)), m.oom_report))
        self._handle, self._keep, self.report = h.value, keep, None
        self.plan = self._plan()
        return self.plan

    def _plan(self) -> ChunkPlan:
        p = _capi.Plan(size=ctypes.sizeof(_capi.Plan))
        _lib.check(_lib.lib().vram_batch_plan(self._handle, ctypes.byref(p)))
        return ChunkPlan._of(p, None)

    def chunks(self) -> Iterator[Chunk]:
        """Runs the batch: yields each chunk for its kernels (see the
        module's doc). Raises the pipeline's error, naming the chunk and
        the step, when it fails."""
        self.allocate()
        m = self.manager
        try:
            yield from self._passes()
            self.plan = self._plan()
            self.report = Report._of(json.loads(_lib.text(_lib.lib().vram_batch_report_json, self._handle)))
        finally:
            call_then_poll(m, self.close)  # the hooks of its re-allocations, if any

    def _passes(self) -> Iterator[Chunk]:
        m = self.manager
        labels = list(self._decls)
        n = len(labels)
        chunk = _capi.BatchChunk(size=ctypes.sizeof(_capi.BatchChunk))
        arrays = (_capi.Array * max(n, 1))()
        hosts = (ctypes.c_void_p * max(n, 1))()
        done = ctypes.c_int()
        views: Dict[tuple, Any] = {}  # (label, address, shape) -> its array, made once
        streams: Dict[int, Any] = {}
        use_numba = m.arrays == "numba" or (m.arrays == "auto" and numba_mode(m.simulated) is not None)
        nxt = _lib.lib().vram_batch_next
        while True:
            _lib.check(nxt(self._handle, ctypes.byref(chunk), arrays, n, ctypes.sizeof(_capi.Array), hosts, ctypes.byref(done)))
            if done.value:
                return
            out = {}
            for i, label in enumerate(labels):
                a = arrays[i]
                key = (label, a.device_ptr, tuple(a.shape[:a.ndim]))
                v = views.get(key)
                if v is None:
                    d = DeviceArray(None, label, int(chunk.buffer), a, manager=m, sim_host=hosts[i] or 0, owner=self)
                    v = views[key] = d.numba() if use_numba else d
                out[label] = v
            stream = streams.get(chunk.stream)
            if stream is None:
                stream = streams[chunk.stream] = _stream(m, chunk.stream, use_numba)
            yield Chunk(chunk.index, chunk.chunks, chunk.start, chunk.len, chunk.chunk_length, chunk.buffer, out, stream)

    def run(self, compute: Callable[[Chunk], None]) -> Report:
        """Calls compute(chunk) for each chunk of chunks(); returns the
        report."""
        for ch in self.chunks():
            compute(ch)
        return self.report

    def cancel(self) -> None:
        """Stops the running batch between two steps (from any thread): its
        loop then raises the pipeline's error, which names the chunks
        finished."""
        if self._handle:
            _lib.check(_lib.lib().vram_batch_cancel(self._handle))

    def close(self) -> None:
        """Stops the batch if it runs, waits for the work it enqueued and
        frees its device arrays. chunks() does it when it ends; the batch
        may be run again (allocated afresh)."""
        h, self._handle = self._handle, 0
        self._keep = []
        if h:
            _lib.check(_lib.lib().vram_batch_close(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutting down, or the manager closed
            pass


def _host_array_of(array) -> Optional[_HostArray]:
    """The host array of Manager.host_array that array is, whole and as
    made (its shape and dtype), or None."""
    base = array
    while base is not None:
        owner = getattr(base, "_vram_owner", None)
        if isinstance(owner, _HostArray):
            same = (array.ctypes.data, array.shape, array.dtype) == (owner.address, owner.shape, owner.dtype)
            return owner if same else None
        base = getattr(base, "base", None)
    return None


def _stream(manager, handle: int, use_numba: bool) -> Any:
    """The chunk's stream: a Numba stream when the arrays are Numba's (under
    Numba's simulator, one of its own: kernels run at their launch), else
    its handle."""
    if not use_numba:
        return handle
    from numba import cuda

    if numba_mode(manager.simulated) == "sim":
        return cuda.stream()
    return cuda.external_stream(handle)
