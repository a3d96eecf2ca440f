"""A stand-in of numba: as numba/core/config.py, it reads
NUMBA_CUDA_MEMORY_MANAGER once, when it is imported ("default" unset)."""
import os

CUDA_MEMORY_MANAGER = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "default")
