"""Which Numba the drop-in speaks to, chosen as cubie chooses it
(cubie.cuda_backend): CUBIE_CUDA_BACKEND ("numba-cuda" or "mlir") when
set; under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) numba.cuda,
since numba-cuda-mlir has none; else numba-cuda-mlir when installed, else
numba.cuda. Loaded on first use, so that importing vram.cubie imports no
Numba until a stream or an array is needed."""

import importlib.util
import os

_cuda = None


def simulating() -> bool:
    """Whether Numba runs CUDA on its simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def backend() -> str:
    """"numba-cuda" or "mlir"."""
    requested = os.environ.get("CUBIE_CUDA_BACKEND", "").strip().lower()
    if requested in ("numba-cuda", "mlir"):
        return requested
    if requested:
        raise ValueError("CUBIE_CUDA_BACKEND=%r: want 'numba-cuda' or 'mlir'" % requested)
    if not simulating() and importlib.util.find_spec("numba_cuda_mlir") is not None:
        return "mlir"
    return "numba-cuda"


def cuda():
    """The Numba CUDA module (numba.cuda, or numba_cuda_mlir.cuda)."""
    global _cuda
    if _cuda is None:
        if backend() == "mlir":
            from numba_cuda_mlir import cuda as c
        else:
            from numba import cuda as c
        _cuda = c
    return _cuda
