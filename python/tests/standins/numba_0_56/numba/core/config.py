import os

CUDA_USE_NVIDIA_BINDING = int(os.environ.get("NUMBA_CUDA_USE_NVIDIA_BINDING", "0"))
CUDA_MEMORY_MANAGER = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "default")
