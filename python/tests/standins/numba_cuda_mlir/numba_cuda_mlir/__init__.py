"""Stand-in of numba-cuda-mlir (see ../../_emmbase.py)."""
__version__ = "0.1.0"
