"""numba-cuda 0.21.2 on: NVIDIA's binding only, no USE_NV_BINDING;
MemoryPointer converts a ctypes.c_void_p to a CUdeviceptr."""
import _emmbase
from numba.cuda.core import config

globals().update(_emmbase.driver(config, True, True))
