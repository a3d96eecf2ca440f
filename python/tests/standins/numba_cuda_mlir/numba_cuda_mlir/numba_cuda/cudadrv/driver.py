"""numba-cuda-mlir: numba-cuda's EMM interface under numba_cuda_mlir."""
import _emmbase
from numba_cuda_mlir.numba_cuda.core import config

globals().update(_emmbase.driver(config, True, True))
