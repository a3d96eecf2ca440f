"""The stand-in's torch.cuda: see torch/__init__.py."""
import contextlib
import ctypes
import itertools
import threading

from . import memory
from .memory import MemPool, _cuda_CUDAAllocator  # noqa: F401

SEGMENT = 2 << 20
_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class OutOfMemoryError(RuntimeError):
    pass


def current_device():
    return 0


def init():
    pass


class _Pool:
    """One pool of the caching allocator: its segments, cached or in use."""

    fake = itertools.count(1 << 40, SEGMENT)  # addresses of the default pool's "cudaMalloc"

    def __init__(self, allocator=None):
        self.allocator = allocator
        self.freeable = False  # no MemPool holds it (its use_count is 0)
        self.cached = []  # (ptr, size)
        self.reserved = 0
        self.allocated = 0

    def raw_alloc(self, size):
        if self.allocator is None:
            return next(self.fake)
        return _MALLOC(self.allocator.alloc_fn)(size, current_device(), None)

    def raw_free(self, ptr, size):
        if self.allocator is not None:
            _FREE(self.allocator.free_fn)(ptr, size, current_device(), None)

    def malloc(self, nbytes):
        size = max(SEGMENT, -(-nbytes // SEGMENT) * SEGMENT)
        for i, (ptr, s) in enumerate(self.cached):
            if s == size:
                del self.cached[i]
                self.allocated += size
                return ptr, size
        ptr = self.raw_alloc(size)
        if not ptr:  # out of memory: free the default pool's cache and dropped pools', and ask once more
            _release_freeable()
            ptr = self.raw_alloc(size)
        if not ptr:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate %d MiB" % (size >> 20))
        self.reserved += size
        self.allocated += size
        return ptr, size

    def free(self, ptr, size):
        self.allocated -= size
        self.cached.append((ptr, size))

    def release(self):
        for ptr, size in self.cached:
            self.raw_free(ptr, size)
            self.reserved -= size
        self.cached = []


_default = _Pool()
_pools = {}  # id → _Pool
_tls = threading.local()


class _Tensor:
    def __init__(self, pool, nbytes):
        self._pool = pool
        self.nbytes = nbytes
        self._ptr, self._size = pool.malloc(nbytes)

    def data_ptr(self):
        return self._ptr

    def __del__(self):
        if hasattr(self, "_ptr"):  # not one whose allocation failed
            self._pool.free(self._ptr, self._size)


def _tensor(nbytes):
    stack = getattr(_tls, "pools", [])
    return _Tensor(_pools[stack[-1].id] if stack else _default, nbytes)


def _dropped(pool_id):
    if pool_id in _pools:
        _pools[pool_id].freeable = True


@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    if pool.id not in _pools:
        _pools[pool.id] = _Pool(pool.allocator)
    _tls.pools = getattr(_tls, "pools", []) + [pool]
    try:
        yield
    finally:
        _tls.pools = _tls.pools[:-1]


def _release_freeable():
    """As CUDACachingAllocator's release_cached_blocks(context, {0, 0}): the
    default pool's cached segments and those of pools no MemPool holds any
    more; a live pool keeps its own."""
    _default.release()
    for p in _pools.values():
        if p.freeable:
            p.release()


def empty_cache():
    _release_freeable()


def memory_stats(device=None):
    pools = [_default] + list(_pools.values())
    return {"reserved_bytes.all.current": sum(p.reserved for p in pools),
            "allocated_bytes.all.current": sum(p.allocated for p in pools)}
