"""A stand-in of torch.cuda with what vram lease's hook uses.

As PyTorch's torch/cuda/__init__.py: _lazy_call(fn) queues fn until CUDA
is initialized (init(), or the first call that needs CUDA) and calls it at
once after; set_per_process_memory_fraction(fraction, device) needs CUDA.
As c10/cuda/CUDAAllocatorConfig.h: the allocator configuration is read
when CUDA is initialized, from PYTORCH_CUDA_ALLOC_CONF, else
PYTORCH_ALLOC_CONF; a release before 2.10 stops on per_process_memory_fraction,
an option it does not know ("Unrecognized CachingAllocator option"); from
2.10 each device's allocator starts with the key's fraction.
"""
import os
import re

from .. import version

_initialized = False
_queued = []
_fractions = {}  # device → the fraction set by the API
DEVICES = 2

KNOWN = {"max_split_size_mb", "expandable_segments", "backend", "garbage_collection_threshold"}


def _release():
    m = re.match(r"(\d+)\.(\d+)", version.__version__)
    return int(m.group(1)), int(m.group(2))


def _read_conf():
    env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if env is None:
        env = os.environ.get("PYTORCH_ALLOC_CONF", "")
    known = KNOWN | ({"per_process_memory_fraction"} if _release() >= (2, 10) else set())
    fraction = 1.0
    for item in filter(None, env.split(",")):
        key, _, value = item.partition(":")
        if key.strip() not in known:
            raise RuntimeError("Unrecognized CachingAllocator option: " + key.strip())
        if key.strip() == "per_process_memory_fraction":
            fraction = float(value)
    return fraction


def _lazy_init():
    global _initialized
    if _initialized:
        return
    fraction = _read_conf()
    for d in range(DEVICES):
        _fractions.setdefault(d, fraction)
    _initialized = True
    for fn in _queued:
        fn()


def init():
    _lazy_init()


def is_initialized():
    return _initialized


def _lazy_call(fn):
    if _initialized:
        fn()
    else:
        _queued.append(fn)


def device_count():
    return DEVICES


def set_per_process_memory_fraction(fraction, device=None):
    _lazy_init()
    if not isinstance(fraction, float) or not 0 <= fraction <= 1:
        raise ValueError("Invalid fraction value: %r" % (fraction,))
    _fractions[0 if device is None else device] = fraction


def get_per_process_memory_fraction(device=None):
    _lazy_init()
    return _fractions[0 if device is None else device]
