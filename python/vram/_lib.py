"""ctypes bindings of libvram (libvram/vram.h, ABI version 2.1; the client
API's structs and signatures are in _capi).

The library is found, in order, at $VRAM_LIBRARY, as libvram.so beside this
package, or by the system's loader (ctypes.util.find_library("vram")). It is
loaded once per process and never unloaded. PyTorch's allocation hook is in
libvram_torch.so (C++), found at $VRAM_TORCH_LIBRARY or beside libvram.so;
CuPy's C allocation hook in libvram_cupy.so (C++), at $VRAM_CUPY_LIBRARY or
beside libvram.so.
"""

import ctypes
import ctypes.util
import operator
import os
import threading

from . import _capi

ABI_VERSION = 2
ABI_MINOR = 2  # vram_response_arrays, struct fields marked (2.1); vram_queue_allocate (2.2)

# Status codes from vram.h that the package acts on; every other failure is
# a VramError with the library's message.
OK = 0
EINVAL = -1
ENOMEM = -2
EHANDLE = -3
ERANGE = -8
EFREED = -10
ENOTSUP = -11

# enum vram_source, in vram.h's order (tests check it against the
# library's stats, which list the sources in this order).
SOURCES = ("c", "torch", "cupy", "numba")

# VRAM_STREAM_UNORDERED: no stream named.
UNORDERED = (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1

_manager = ctypes.c_int64
_stream = ctypes.c_size_t  # uintptr_t

_SIGNATURES = {
    "vram_abi_version": (ctypes.c_int, []),
    "vram_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "vram_last_error": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    "vram_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(_manager)]),
    "vram_open_lease": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_double, ctypes.c_uint64,
                                        ctypes.POINTER(_manager)]),
    "vram_close": (ctypes.c_int, [_manager]),
    "vram_manager_for_device": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_manager)]),
    "vram_alloc": (ctypes.c_int, [_manager, ctypes.c_int, ctypes.c_size_t, _stream, ctypes.POINTER(ctypes.c_void_p)]),
    "vram_free": (ctypes.c_int, [_manager, ctypes.c_void_p, ctypes.c_size_t, _stream]),
    "vram_trim": (ctypes.c_int, [_manager]),
    "vram_trim_all": (ctypes.c_int, []),
    "vram_reset_peaks": (ctypes.c_int, [_manager]),
    "vram_stats_json": (ctypes.c_int, [_manager, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "vram_report": (ctypes.c_int, [_manager, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "vram_oom_report": (ctypes.c_int, [_manager, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "vram_alloc_on_device": (ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, _stream, ctypes.POINTER(ctypes.c_void_p)]),
    # The hooks: the Python package hands their addresses (or, for PyTorch,
    # libvram_torch.so's path) to the frameworks.
    "vram_torch_free": (None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "vram_torch_empty_cache": (None, []),
    "vram_torch_pool_alloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]),
    "vram_cupy_free": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]),
}


class VramError(RuntimeError):
    """A call into libvram failed. status is vram.h's code (negative)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(VramError, ValueError):
    """An argument the library refused (VRAM_EINVAL): a bad request, shape,
    dtype, proportion, span or handle value; the message says which."""


class FreedError(VramError):
    """Arrays the manager freed, or evicted for another group (VRAM_EFREED):
    queue and allocate again. evicted is True in the error an on_invalidate
    hook gets for an eviction (a call's error leaves it False: ask
    Client.evicted)."""

    def __init__(self, status, message, evicted=False):
        super().__init__(status, message)
        self.evicted = evicted


class OutOfMemoryError(VramError, MemoryError):
    """An allocation refused for want of memory: past the cap (refused before
    the device was asked) or the device full. report is the manager's memory
    report at the refusal."""

    def __init__(self, status, message, report=""):
        super().__init__(status, message)
        self.report = report


def unsigned(what, value, bits=64):
    """value as a C unsigned integer of bits bits (ctypes would wrap it
    silently: 2**64 + 4096 as 4096, -1 as 2**64 - 1). Raises TypeError for
    what is not an integer, ValueError for a negative one and OverflowError
    for one past 2**bits - 1, each naming what and the value."""
    n = operator.index(value)
    shown = str(n) if abs(n) < 10 ** 30 else "a %d-bit number" % n.bit_length()
    if n < 0:
        raise ValueError("%s %s: want 0 to 2**%d - 1 (%d)" % (what, shown, bits, (1 << bits) - 1))
    if n >> bits:
        raise OverflowError("%s %s: more than 2**%d - 1 (%d), the most a %d-bit size holds" % (what, shown, bits, (1 << bits) - 1, bits))
    return n


# The bits of a size_t, which vram_alloc and vram_free take.
SIZE_BITS = 8 * ctypes.sizeof(ctypes.c_size_t)


def _find():
    path = os.environ.get("VRAM_LIBRARY")
    if path:
        return path
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libvram.so")
    if os.path.exists(beside):
        return beside
    found = ctypes.util.find_library("vram")
    if found:
        return found
    raise OSError(
        "libvram not found: set VRAM_LIBRARY to its path, or put libvram.so beside the vram package "
        "(build it with: go build -buildmode=c-shared -o libvram.so ./libvram)"
    )


_lock = threading.Lock()
_lib = None
path = None


def lib():
    """The loaded library (loaded on first use, once per process)."""
    if _lib is not None:
        return _lib
    return _load()


def _load():
    global _lib, path
    with _lock:
        if _lib is None:
            p = _find()
            handle = ctypes.CDLL(p)
            handle.vram_abi_version.restype, handle.vram_abi_version.argtypes = ctypes.c_int, []
            version = handle.vram_abi_version()
            minor = 0
            if version == ABI_VERSION and hasattr(handle, "vram_abi_minor"):
                handle.vram_abi_minor.restype, handle.vram_abi_minor.argtypes = ctypes.c_int, []
                minor = handle.vram_abi_minor()
            if (version, minor if version == ABI_VERSION else 0) < (ABI_VERSION, ABI_MINOR):
                raise OSError("%s has ABI version %d.%d; this package needs %d.%d or later (build libvram again)" % (
                    p, version, minor, ABI_VERSION, ABI_MINOR))
            for name, (res, args) in list(_SIGNATURES.items()) + list(_capi.SIGNATURES.items()):
                fn = getattr(handle, name)
                fn.restype, fn.argtypes = res, args
            _lib, path = handle, p
        return _lib


def last_error():
    """The calling thread's last error message from the library."""
    l = lib()
    n = l.vram_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    l.vram_last_error(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def check(status, report=None):
    """Raises the error status stands for (with the thread's last message)."""
    if status == OK:
        return
    msg = last_error() or lib().vram_strerror(status).decode()
    if status == ENOMEM:
        raise OutOfMemoryError(status, msg, report() if report else "")
    if status == EINVAL:
        raise InvalidArgumentError(status, msg)
    if status == EFREED:
        raise FreedError(status, msg)
    raise VramError(status, msg)


def text(fn, handle):
    """Calls one of the library's text functions (report, stats as JSON)."""
    need = ctypes.c_size_t(0)
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        status = fn(handle, buf, size, ctypes.byref(need))
        if status == ERANGE:  # the text may have grown since the last call
            size = max(need.value, 2 * size)
            continue
        check(status)
        return buf.value.decode("utf-8", "replace")


def _hook_path(env, name, what, src):
    lib()
    p = os.environ.get(env) or os.path.join(os.path.dirname(os.path.abspath(path)), name)
    if not os.path.exists(p):
        raise OSError(
            "%s not found: %s is a C++ library beside libvram.so (build it as %s says), or set %s" % (p, what, src, env))
    return p


def torch_path():
    """The path of libvram_torch.so, PyTorch's hook (checked to exist)."""
    return _hook_path("VRAM_TORCH_LIBRARY", "libvram_torch.so", "PyTorch's hook", "libvram/torch/vram_torch.cc")


def cupy_path():
    """The path of libvram_cupy.so, CuPy's C hook (checked to exist)."""
    return _hook_path("VRAM_CUPY_LIBRARY", "libvram_cupy.so", "CuPy's C hook", "libvram/cupy/vram_cupy.cc")


def address(name):
    """The address of one of the library's functions, for a framework's hook."""
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value
