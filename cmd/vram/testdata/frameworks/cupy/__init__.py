"""A stand-in of cupy: the limit of a device's memory pool as
cupy/cuda/memory.pyx reads it (_parse_limit_string: bytes, or a
percentage of the device's memory)."""
import os


def pool_limit(total):
    limit = os.environ.get("CUPY_GPU_MEMORY_LIMIT")
    if limit is None:
        return 0
    if limit.endswith("%"):
        return int(float(limit[:-1]) / 100.0 * total)
    return int(limit)
