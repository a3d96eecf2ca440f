"""The stand-in's torch.cuda.memory: see torch/__init__.py."""
import ctypes
import itertools

_ids = itertools.count(1)
_current = [None]


class _cuda_CUDAAllocator:
    """The raw allocator (torch._C._cuda_CUDAAllocator): the two functions."""

    def __init__(self, alloc_fn, free_fn):
        self.alloc_fn, self.free_fn = alloc_fn, free_fn
        self.reset_fn = None

    def set_reset_fn(self, fn):
        self.reset_fn = fn


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        alloc_fn = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        free_fn = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
        assert alloc_fn is not None
        assert free_fn is not None
        self._allocator = _cuda_CUDAAllocator(alloc_fn, free_fn)

    def allocator(self):
        return self._allocator


def change_current_allocator(allocator):
    if _current[0] is not None:
        raise RuntimeError("Can't swap an already initialized allocator")
    _current[0] = allocator.allocator()


class MemPool:
    def __init__(self, allocator=None, use_on_oom=False, symmetric=False):
        if allocator is not None and not isinstance(allocator, _cuda_CUDAAllocator):
            raise TypeError("__init__(): incompatible function arguments: allocator: torch._C._cuda_CUDAAllocator | None")
        self._allocator = allocator
        self._id = (next(_ids), 0)

    @property
    def id(self):
        return self._id

    @property
    def allocator(self):
        return self._allocator

    def __del__(self):
        from . import _dropped

        _dropped(self._id)
