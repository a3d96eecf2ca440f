"""A stand-in of numba.cuda: the memory manager is the configuration's."""
from .. import CUDA_MEMORY_MANAGER as memory_manager  # noqa: F401
