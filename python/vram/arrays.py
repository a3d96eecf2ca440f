"""vram's arrays in Python: DeviceArray (device memory a response holds) and
the NumPy views of host arrays.

A DeviceArray is an address with a shape and a dtype, row-major. It speaks
__cuda_array_interface__ (version 3), so CuPy (cupy.asarray) and PyTorch
(torch.as_tensor) use it in place on a GPU, and DeviceArray.numba() is a
Numba device array over the same memory:

  - on a GPU, numba.cuda.from_cuda_array_interface over the array (its
    owner), in the primary context, which vram and Numba share;
  - under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) on vram's
    simulator, a Numba simulator array over host_view(), the simulated device
    memory itself, so a kernel written for the GPU runs on the host on vram's
    arrays.

Lifetimes. Every view (host_view, numba, the host arrays' NumPy views) keeps
its response's handle alive, but not the memory: the manager frees
an array when the client allocates under its label again, frees it, closes,
or is invalidated or evicted (ArrayResponse's doc). Using a view after that
is undefined, as using freed memory is on a GPU; on the simulator it can end
the process. DeviceArray.freed asks the manager.
"""

from __future__ import annotations

import ctypes
import importlib.util
import sys
from typing import Any, Optional, Tuple

from . import _capi, _lib

__all__ = ["DeviceArray", "numba_mode", "numpy_view"]

DTYPE_NAMES = {v: k for k, v in _capi.DTYPES.items()}
MEMORY_NAMES = {v: k for k, v in _capi.MEMORY.items()}


def _np():
    import numpy

    return numpy


def numpy_view(address: int, nbytes: int, dtype: str, shape: Tuple[int, ...], owner: Any):
    """A NumPy array over nbytes at address (host memory), of dtype and
    shape, row-major, that keeps owner alive. Writable."""
    np = _np()
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    buf = (ctypes.c_byte * nbytes).from_address(address)
    buf._vram_owner = owner  # the view's base is buf; buf holds owner
    return np.ndarray(shape, dtype, buf)


def _numba_simulating() -> bool:
    """Whether Numba is importable and runs CUDA on its simulator."""
    if "numba" not in sys.modules and importlib.util.find_spec("numba") is None:
        return False
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


def numba_mode(simulated: bool) -> Optional[str]:
    """How device arrays of a manager (simulated: on vram's simulator) become
    Numba's: "sim" (Numba's CUDA simulator over the simulated memory), "cuda"
    (a GPU), or None when Numba cannot use them here (no Numba; a real Numba
    and vram's simulator; Numba's simulator and a GPU). Worked out once per
    process: Numba reads NUMBA_ENABLE_CUDASIM when it is imported."""
    mode = _modes.get(simulated, _UNKNOWN)
    if mode is _UNKNOWN:
        mode = _modes[simulated] = _numba_mode(simulated)
    return mode


_UNKNOWN = object()
_modes: dict = {}


def _numba_mode(simulated: bool) -> Optional[str]:
    if "numba" not in sys.modules and importlib.util.find_spec("numba") is None:
        return None
    if _numba_simulating():
        return "sim" if simulated else None
    if simulated:
        return None
    from numba import cuda

    return "cuda" if cuda.is_available() else None


class DeviceArray:
    """A device array of an ArrayResponse: label, shape, dtype (a NumPy
    dtype name), strides (bytes), nbytes, memory ("device", or "mapped" for
    the device address of mapped host memory), ptr (the device address),
    chunk_axis (its request's run axis; None when it is not chunkable) and
    buffer (which of the response's buffers it is in). Not copied: a
    description of memory the manager owns."""

    __slots__ = ("manager", "label", "buffer", "shape", "dtype", "strides", "nbytes", "memory", "ptr",
                 "chunk_axis", "_handle", "_label_c", "_sim_host", "_owner", "_host", "_numba")

    def __init__(self, handle, label: str, buffer: int, desc: "_capi.Array", *, manager, sim_host: int = 0,
                 owner=None):
        # handle: its response's handle (vram.client._Handle), which every
        # view keeps alive; None for an array of a batch's chunk
        # (vram.Batch), which gives sim_host and its owner instead. Nothing
        # here refers to the ArrayResponse, so that it is freed as soon as
        # it is dropped.
        self._handle = handle
        self.manager = manager
        self._sim_host = sim_host
        self._owner = owner if owner is not None else handle
        self.label = label
        self._label_c = label.encode()
        self.buffer = buffer
        n = desc.ndim
        self.shape = tuple(desc.shape[:n])
        self.dtype = DTYPE_NAMES[desc.dtype]
        self.strides = tuple(desc.strides[:n])
        self.nbytes = desc.bytes
        self.memory = MEMORY_NAMES[desc.memory]
        self.ptr = desc.device_ptr
        axis = desc.chunk_axis
        self.chunk_axis = None if axis < 0 else axis
        self._host = None
        self._numba = None

    def __repr__(self):
        return "vram.DeviceArray(%r, %s%s, %s at %#x)" % (self.label, self.dtype, list(self.shape), self.memory, self.ptr)

    @property
    def size(self) -> int:
        """The number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def freed(self) -> bool:
        """Whether the manager has freed the array since the response. (An
        array of a batch's chunk is valid until the next chunk; this cannot
        tell.)"""
        if self._handle is None:
            raise _lib.VramError(_lib.ENOTSUP, "vram: %r is a batch chunk's array: valid until the next chunk, which "
                                 "this cannot tell" % (self,))
        a = _capi.Array(size=ctypes.sizeof(_capi.Array))
        _lib.check(_lib.lib().vram_response_array(self._handle.value, self._label_c, self.buffer, ctypes.byref(a)))
        return bool(a.freed)

    @property
    def __cuda_array_interface__(self) -> dict:
        """CUDA Array Interface version 3: the device address, no stream
        (order work after the client's stream yourself: its work is enqueued
        there)."""
        return {
            "shape": self.shape,
            "typestr": _np().dtype(self.dtype).str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
        }

    def host_view(self):
        """On vram's simulator, a NumPy array over the simulated device
        memory (writable; the same bytes copies and kernels use). Raises
        VramError (ENOTSUP) on a GPU."""
        if self._host is None:
            addr = self._sim_host
            if not addr and self._handle is None:
                raise _lib.VramError(_lib.ENOTSUP, "vram: %r has no host view: a batch's arrays have one on the "
                                     "simulator, where its kernels run on the host" % (self,))
            if not addr:
                out = ctypes.c_void_p()
                _lib.check(_lib.lib().vram_sim_host_address(self._handle.value, self._label_c, self.buffer,
                                                            ctypes.byref(out)))
                addr = out.value or 0
            self._host = numpy_view(addr, self.nbytes, self.dtype, self.shape, self._owner)
        return self._host

    def numba(self):
        """The array as a Numba device array over the same memory (see the
        module's doc); raises VramError when Numba cannot reach it here."""
        if self._numba is not None:
            return self._numba
        mode = numba_mode(self.manager.simulated)
        if mode == "sim":
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

            self._numba = FakeCUDAArray(self.host_view())
        elif mode == "cuda":
            from numba import cuda

            self._numba = cuda.from_cuda_array_interface(self.__cuda_array_interface__, owner=self, sync=False)
        else:
            raise _lib.VramError(_lib.ENOTSUP, _numba_refusal(self.manager.simulated))
        try:
            self._numba._vram_array = self  # so that Client.to_device and from_device take it too
        except AttributeError:  # pragma: no cover - a Numba array that takes no attributes
            pass
        return self._numba


def _numba_refusal(simulated: bool) -> str:
    if importlib.util.find_spec("numba") is None:
        return "vram: Numba is not installed: use the DeviceArray (its __cuda_array_interface__, or host_view() on the simulator)"
    if simulated:
        return ("vram: the array is in vram's simulated device memory, which Numba on a GPU cannot reach; "
                "run Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) to run kernels on the host over it")
    if _numba_simulating():
        return ("vram: the array is on a GPU and Numba runs its CUDA simulator (NUMBA_ENABLE_CUDASIM=1), which "
                "cannot reach it; unset NUMBA_ENABLE_CUDASIM, or open the manager on vram's simulator (\"sim\")")
    return "vram: Numba finds no CUDA GPU here (numba.cuda.is_available() is False)"
