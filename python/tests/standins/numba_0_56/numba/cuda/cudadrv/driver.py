"""numba 0.56: USE_NV_BINDING states the binding; MemoryPointer keeps its
pointer as given; the ctypes binding's functions take drvapi.cu_device_ptr."""
import _emmbase
from numba.core import config
from . import drvapi

USE_NV_BINDING = config.CUDA_USE_NVIDIA_BINDING
globals().update(_emmbase.driver(config, USE_NV_BINDING, False, drvapi.cu_device_ptr))
