"""vram.Batch: a batch of runs bigger than the device, declared once,
allocated by the manager in chunks and run chunk by chunk, with the copies
in and out done for you: the Go batch package's pipeline in its simplest
form.

    b = vram.Batch()
    b.input(inp, "x", x)                  # a NumPy array, run axis 0
    b.output(out, "y", y)
    b.allocate()                          # one allocation for the group, chunked to fit
    for ch in b.chunks():                 # ch["x"], ch["y"]: the chunk's arrays
        kernel[blocks, threads, ch.stream](ch["x"], ch["y"])

Each array is declared once with its client (all of one stream group), its
label (unique in the batch) and its host side, a NumPy array whose shape
and dtype are the request's: input (copied in before each chunk), output
(copied out after it), inout (both) or scratch (no host side; a request).
An unchunkable input is copied in once, an unchunkable output out once at
the end. allocate() queues every client's arrays and allocates the group
with one allocation; each member's arrays come from the response it
returns (ArrayResponse.member), so no hook is needed.

chunks() yields one Chunk per pass: its index, its runs (start, runs, the
span along an axis) and its buffer's arrays (ch[label], as
ArrayResponse.arrays gives them: Numba device arrays when Numba can reach
them). Work for the chunk goes on ch.stream, the group's stream, where the
copies are; on vram's simulator, where kernels run on the host (Numba's
CUDA simulator), the chunk's copies in are waited for before it is yielded.
The clients are marked busy (never evicted) while it runs, and it waits for
the last copies out before it returns. The NumPy arrays must stay alive and
untouched while it runs. With buffers > 1, chunk i uses buffer i %
buffers.

What the Go pipeline has and this does not (yet): copies overlapping the
kernels on a second stream, staging through pinned buffers, re-cutting the
chunks when the budget changes, several devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

from . import _lib
from .client import ArrayRequest, ArrayResponse, Client, Span, dtype_name

__all__ = ["Batch", "Chunk"]


@dataclass
class _Decl:
    client: Client
    label: str
    request: ArrayRequest
    host: Any  # the NumPy array, None for scratch
    copy_in: bool
    copy_out: bool


class Chunk:
    """One pass of a batch: index, start and runs (the chunk's runs along
    every array's run axis), arrays (label -> the chunk's buffer's array),
    stream (the group's stream, a Numba stream when the arrays are Numba's,
    else its handle)."""

    def __init__(self, index: int, start: int, runs: int, arrays: Dict[str, Any], stream: Any):
        self.index = index
        self.start = start
        self.runs = runs
        self.arrays = arrays
        self.stream = stream

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
        return "vram.Chunk(%d: runs %d..%d)" % (self.index, self.start, self.start + self.runs)


class Batch:
    """A batch's arrays, their clients and host sides; see the module's doc."""

    def __init__(self, buffers: int = 1):
        if buffers < 1:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: a batch of %d buffers: want 1 or more" % buffers)
        self.buffers = buffers
        self._decls: Dict[str, _Decl] = {}
        self.response: Optional[ArrayResponse] = None  # the first client's, from allocate
        self.responses: Dict[int, ArrayResponse] = {}  # client handle -> its response

    def _declare(self, client: Client, label: str, request: ArrayRequest, host: Any, copy_in: bool, copy_out: bool) -> None:
        if label in self._decls:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: batch array %r declared twice; labels are unique in a batch" % label)
        if self._decls:
            first = next(iter(self._decls.values())).client
            if first.group != client.group:
                raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: batch array %r is %s's, of stream group %r; the batch's clients are of %r" % (
                    label, client, client.group, first.group))
        self._decls[label] = _Decl(client, label, request, host, copy_in, copy_out)
        self.response = None

    def _host(self, client: Client, label: str, host: Any, chunk_axis: int, unchunkable: bool, memory: str,
              copy_in: bool, copy_out: bool) -> None:
        import numpy as np

        if not isinstance(host, np.ndarray):
            raise TypeError("vram: batch array %r: the host side is a %s; want a NumPy array" % (label, type(host).__name__))
        if not host.flags.c_contiguous or (copy_out and not host.flags.writeable):
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: batch array %r: the host array must be C-contiguous%s (np.ascontiguousarray)" % (
                label, " and writable" if copy_out else ""))
        req = ArrayRequest(host.shape, dtype_name(host.dtype), memory=memory, chunk_axis=chunk_axis, unchunkable=unchunkable)
        self._declare(client, label, req, host, copy_in, copy_out)

    def input(self, client: Client, label: str, host: Any, *, chunk_axis: int = 0, unchunkable: bool = False) -> None:
        """An array copied from host (a NumPy array) before each chunk."""
        self._host(client, label, host, chunk_axis, unchunkable, "device", True, False)

    def output(self, client: Client, label: str, host: Any, *, chunk_axis: int = 0, unchunkable: bool = False) -> None:
        """An array copied into host (a writable NumPy array) after each chunk."""
        self._host(client, label, host, chunk_axis, unchunkable, "device", False, True)

    def inout(self, client: Client, label: str, host: Any, *, chunk_axis: int = 0, unchunkable: bool = False) -> None:
        """An array copied in before each chunk and out after it."""
        self._host(client, label, host, chunk_axis, unchunkable, "device", True, True)

    def scratch(self, client: Client, label: str, request: "ArrayRequest | dict") -> None:
        """An array of the kernels' own, with no host side."""
        self._declare(client, label, ArrayRequest.of(request), None, False, False)

    def _clients(self) -> List[Client]:
        seen: Dict[int, Client] = {}
        for d in self._decls.values():
            seen.setdefault(d.client.handle, d.client)
        return list(seen.values())

    def allocate(self) -> ArrayResponse:
        """Queues every client's arrays (replacing what each had queued) and
        allocates the group once; returns the first client's response."""
        if not self._decls:
            raise _lib.InvalidArgumentError(_lib.EINVAL, "vram: the batch declares no arrays")
        clients = self._clients()
        for c in clients:
            c.queue({d.label: d.request for d in self._decls.values() if d.client is c})
        first = clients[0].allocate(self.buffers)
        self.responses = {clients[0].handle: first}
        for c in clients[1:]:
            r = first.member(c)
            if r is None:
                raise _lib.VramError(_lib.EINVAL, "vram: the allocation gave %s no response: was it closed meanwhile?" % c)
            self.responses[c.handle] = r
        self.response = first
        return first

    def _array(self, d: _Decl, buffer: int, vram_array: bool) -> Any:
        s = self.responses[d.client.handle].buffer(buffer)
        return s.device_arrays[d.label] if vram_array else s.arrays[d.label]

    def chunks(self) -> Iterator[Chunk]:
        """Runs the batch: yields each chunk between its copies in and out
        (see the module's doc). Allocates first if allocate() was not
        called since the last declaration."""
        if self.response is None:
            self.allocate()
        plan = self.response.plan
        clients = self._clients()
        first = clients[0]
        host_kernels = first.manager.simulated  # kernels run on the host, not on the group's stream
        works = [c.begin_work() for c in clients]
        try:
            yield from self._passes(plan, first, host_kernels)
        finally:
            for w in works:
                w.end()

    def _passes(self, plan, first: Client, host_kernels: bool) -> Iterator[Chunk]:
        decls = list(self._decls.values())
        whole = [d for d in decls if self._array(d, 0, True).chunk_axis is None]
        chunked = [d for d in decls if d not in whole]
        for d in whole:
            if d.copy_in:
                d.client.to_device(self._array(d, 0, True), d.host)
        stream = None
        for i in range(plan.chunks):
            b = i % max(plan.buffers, 1)
            start, runs = self.response.chunk(i)
            for d in chunked:
                if d.copy_in:
                    d.client.to_device(self._array(d, b, True), d.host, Span(self._array(d, b, True).chunk_axis, start, runs))
            if host_kernels:
                first.sync()
            arrays = {d.label: self._array(d, b, False) for d in decls}
            if stream is None:
                stream = self._stream(first, arrays)
            yield Chunk(i, start, runs, arrays, stream)
            for d in chunked:
                if d.copy_out:
                    dev = self._array(d, b, True)
                    d.client.from_device(d.host, dev, Span(dev.chunk_axis, start, runs))
        for d in whole:
            if d.copy_out:
                d.client.from_device(d.host, self._array(d, 0, True))
        for c in self._clients():
            c.sync()

    @staticmethod
    def _stream(client: Client, arrays: Dict[str, Any]) -> Any:
        from .arrays import DeviceArray

        if arrays and not any(isinstance(a, DeviceArray) for a in arrays.values()):
            return client.numba_stream()
        return client.stream

    def run(self, compute: Callable[[Chunk], None]) -> None:
        """Calls compute(chunk) for each chunk of chunks()."""
        for ch in self.chunks():
            compute(ch)
