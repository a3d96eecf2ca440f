"""cubie.memory.array_requests, served by vram: ArrayRequest and
ArrayResponse with cubie's names, fields, defaults and checks.

An ArrayRequest describes one array as cubie's do (dtype one of
numpy.float64, float32 and int32; shape a tuple, (1, 1, 1) by default;
memory "device" or "pinned"; chunk_axis_index 2 by default, None for
none; total_runs at least 1), and becomes a vram.ArrayRequest when the
manager queues it (to_vram). Fields are checked when given and when set.
"""

from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..client import ArrayRequest as _VramRequest

__all__ = ["ArrayRequest", "ArrayResponse"]

DTYPES = (np.float64, np.float32, np.int32)
MEMORY = ("device", "pinned")


def _check_int(name: str, value: Any, least: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError("'%s' must be %r (got %r that is a %r)." % (name, int, value, type(value)))
    if value < least:
        raise ValueError("'%s' must be >= %d: %r" % (name, least, value))


def _check(name: str, value: Any) -> None:
    """cubie's validator of field name (attrs' messages)."""
    if name == "dtype":
        if not any(value is d for d in DTYPES):
            raise ValueError("'dtype' must be in %r (got %r)" % (list(DTYPES), value))
    elif name == "shape":
        if not isinstance(value, tuple):
            raise TypeError("'shape' must be %r (got %r that is a %r)." % (tuple, value, type(value)))
        for d in value:
            if not isinstance(d, int):
                raise TypeError("'shape' must be a tuple of int (got %r that is a %r)." % (d, type(d)))
    elif name == "memory":
        if value not in MEMORY:
            raise ValueError("'memory' must be in %r (got %r)" % (list(MEMORY), value))
    elif name == "chunk_axis_index":
        if value is not None:
            _check_int(name, value, 0)
    elif name == "unchunkable":
        if not isinstance(value, bool):
            raise TypeError("'unchunkable' must be %r (got %r that is a %r)." % (bool, value, type(value)))
    elif name == "total_runs":
        _check_int(name, value, 1)


class ArrayRequest:
    """One array to allocate, as cubie describes it (see the module doc)."""

    __slots__ = ("dtype", "shape", "memory", "chunk_axis_index", "unchunkable", "total_runs")

    def __init__(self, dtype, shape: Tuple[int, ...] = (1, 1, 1), memory: str = "device",
                 chunk_axis_index: Optional[int] = 2, unchunkable: bool = False, total_runs: int = 1):
        self.dtype = dtype
        self.shape = shape
        self.memory = memory
        self.chunk_axis_index = chunk_axis_index
        self.unchunkable = unchunkable
        self.total_runs = total_runs

    def __setattr__(self, name, value):
        _check(name, value)
        object.__setattr__(self, name, value)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    __hash__ = None

    def __repr__(self):
        return "ArrayRequest(%s)" % ", ".join("%s=%r" % (f, getattr(self, f)) for f in self.__slots__)

    def __copy__(self):
        return ArrayRequest(*(getattr(self, f) for f in self.__slots__))

    def __deepcopy__(self, memo):
        return self.__copy__()

    @property
    def nbytes(self) -> int:
        """The array's bytes, unchunked."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_vram(self) -> _VramRequest:
        """The request as vram's manager takes it: a chunk_axis_index of
        None is an unchunkable request, total_runs its TotalRuns."""
        axis = self.chunk_axis_index
        return _VramRequest(shape=self.shape, dtype=np.dtype(self.dtype).name, memory=self.memory,
                            chunk_axis=0 if axis is None else axis, unchunkable=self.unchunkable or axis is None,
                            total_runs=self.total_runs)


class ArrayResponse:
    """What an allocation gives an instance, as cubie's: arr (label ->
    array: Numba device arrays for device memory, NumPy arrays for
    pinned), chunks, chunk_length and chunked_shapes (label -> the shape
    allocated)."""

    __slots__ = ("arr", "chunks", "chunk_length", "chunked_shapes")

    def __init__(self, arr: Optional[Dict[str, Any]] = None, chunks: int = 1, chunk_length: int = 1,
                 chunked_shapes: Optional[Dict[str, Tuple[int, ...]]] = None):
        self.arr = {} if arr is None else arr
        self.chunks = chunks
        self.chunk_length = chunk_length
        self.chunked_shapes = {} if chunked_shapes is None else chunked_shapes

    def __setattr__(self, name, value):
        if name in ("arr", "chunked_shapes") and not isinstance(value, dict):
            raise TypeError("'%s' must be %r (got %r that is a %r)." % (name, dict, value, type(value)))
        object.__setattr__(self, name, value)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    __hash__ = None

    def __repr__(self):
        return "ArrayResponse(%s)" % ", ".join("%s=%r" % (f, getattr(self, f)) for f in self.__slots__)
