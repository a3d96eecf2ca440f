"""cubie.memory.chunk_buffer_pool, served by vram: ChunkBufferPool and
PinnedBuffer with cubie's names and rules.

The pool keeps pinned buffers by array name, shape and dtype, reuses a
free one that matches, grows while the RAM headroom allows
(_headroom_allows: the RAM available after the buffer stays above
1 - HOST_SPILL_FRACTION of the total), grows regardless for a name with
none of its buffers in flight, and otherwise blocks until one is
released. Its buffers are vram's pinned host arrays (the process's
manager on the device), or NumPy arrays under Numba's CUDA simulator.
vram's own staging pool (Manager.Host().Staging() in Go) sizes buffers in
bytes and bounds them by the host ladder's limits; the package doc's table
of differences ("Staging", "Staging growth") says why; this module keeps
cubie's rules for cubie's callers.
"""

from math import prod
from threading import Condition
from typing import Dict, List, Tuple

import numpy as np

from . import _backend
from .mem_manager import HOST_SPILL_FRACTION, _pinned_host_array, available_system_ram, total_system_ram

__all__ = ["PinnedBuffer", "ChunkBufferPool"]


class PinnedBuffer:
    """A reusable pinned buffer: buffer_id, array, in_use."""

    __slots__ = ("buffer_id", "array", "in_use")

    def __init__(self, buffer_id: int, array: np.ndarray, in_use: bool = False):
        if not isinstance(buffer_id, int):
            raise TypeError("'buffer_id' must be %r (got %r)" % (int, buffer_id))
        if not isinstance(array, np.ndarray):
            raise TypeError("'array' must be %r (got %r)" % (np.ndarray, type(array)))
        if not isinstance(in_use, bool):
            raise TypeError("'in_use' must be %r (got %r)" % (bool, in_use))
        self.buffer_id = buffer_id
        self.array = array
        self.in_use = in_use

    def __repr__(self):
        return "PinnedBuffer(buffer_id=%d, array=%s%s, in_use=%r)" % (
            self.buffer_id, self.array.dtype, list(self.array.shape), self.in_use)


class ChunkBufferPool:
    """Pinned buffers for chunked transfers, by array name (see the
    module doc). Safe for concurrent use."""

    def __init__(self):
        self._buffers: Dict[str, List[PinnedBuffer]] = {}
        self._condition = Condition()
        self._next_id = 0

    def acquire(self, array_name: str, shape: Tuple[int, ...], dtype) -> PinnedBuffer:
        """A buffer of shape and dtype for array_name: a free matching one,
        a new one while the headroom allows it (or while none of the name's
        matching buffers is in flight), else the next one released."""
        with self._condition:
            while True:
                in_flight = False
                for buf in self._buffers.get(array_name, []):
                    if buf.array.shape == shape and buf.array.dtype == dtype:
                        if not buf.in_use:
                            buf.in_use = True
                            return buf
                        in_flight = True
                if not in_flight or self._headroom_allows(shape, dtype):
                    buf = self._allocate_buffer(shape, dtype)
                    buf.in_use = True
                    self._buffers.setdefault(array_name, []).append(buf)
                    return buf
                self._condition.wait()

    @staticmethod
    def _headroom_allows(shape: Tuple[int, ...], dtype) -> bool:
        """Whether one more buffer leaves the RAM available above
        1 - HOST_SPILL_FRACTION of the total (always, under the simulator
        or where RAM cannot be read)."""
        if _backend.simulating():
            return True
        available, total = available_system_ram(), total_system_ram()
        if available is None or total is None:
            return True
        nbytes = int(prod(shape)) * np.dtype(dtype).itemsize
        return available - nbytes > (1 - HOST_SPILL_FRACTION) * total

    def release(self, buffer: PinnedBuffer) -> None:
        """Gives buffer back, waking a blocked acquire."""
        with self._condition:
            buffer.in_use = False
            self._condition.notify_all()

    def clear(self) -> None:
        """Forgets every buffer (those in use are freed when their users
        drop them) and wakes blocked acquires."""
        with self._condition:
            self._buffers.clear()
            self._next_id = 0
            self._condition.notify_all()

    def _allocate_buffer(self, shape: Tuple[int, ...], dtype) -> PinnedBuffer:
        arr = _pinned_host_array(shape, dtype)
        arr.fill(0)
        buffer_id = self._next_id
        self._next_id += 1
        return PinnedBuffer(buffer_id=buffer_id, array=arr)
