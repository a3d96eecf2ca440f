"""Stand-in of numba 0.56's built-in CUDA target (see ../../_emmbase.py)."""
__version__ = "0.56.4"
