import os

CUDA_MEMORY_MANAGER = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "default")
