"""Stand-in of numba-cuda 0.21.2 and later, which provides numba.cuda (see ../../_emmbase.py)."""
__version__ = "0.30.4"
