"""ctypes bindings of libvram's client API (libvram/vram.h, ABI version
2.2): the structs and the signatures _lib applies when it loads the
library. Nothing here calls the library; vram.client does.
"""

import ctypes

# enum vram_dtype, by NumPy name (vram's DType; vram.h's values).
DTYPES = {
    "float64": 1, "float32": 2, "int32": 3, "int64": 4,
    "uint8": 5, "uint32": 6, "complex64": 7, "complex128": 8,
}

# enum vram_memory (vram's MemoryType): "managed" (3) is refused.
MEMORY = {"device": 0, "pinned": 1, "mapped": 2, "managed": 3, "pageable": 4}

# enum vram_limit_mode.
LIMIT_MODES = {"passive": 0, "active": 1}

# enum vram_hook bits.
HOOK_ALLOCATED = 1
HOOK_INVALIDATE = 2

# enum vram_event_kind.
EVENT_NONE = 0
EVENT_ALLOCATED = 1
EVENT_INVALIDATED = 2

MAX_NDIM = 32

_handle = ctypes.c_int64  # vram_manager, vram_client, vram_response, vram_work, vram_host
_stream = ctypes.c_size_t  # uintptr_t
_size = ctypes.c_size_t


class ClientOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("name", ctypes.c_char_p),
        ("group", ctypes.c_char_p),
        ("proportion", ctypes.c_double),
        ("no_evict", ctypes.c_int32),
        ("hooks", ctypes.c_uint32),
    ]


class ClientInfo(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("manager", _handle),
        ("proportion", ctypes.c_double),
        ("cap", ctypes.c_uint64),
        ("held", ctypes.c_uint64),
        ("stream", _stream),
        ("closed", ctypes.c_int32),
        ("evicted", ctypes.c_int32),
        ("idle", ctypes.c_int32),
        ("grouped", ctypes.c_int32),
    ]


class Request(ctypes.Structure):
    _fields_ = [
        ("label", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("memory", ctypes.c_int32),
        ("chunk_axis", ctypes.c_int32),
        ("unchunkable", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("total_runs", ctypes.c_int64),
    ]


class Plan(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("client", _handle),
        ("chunks", ctypes.c_int64),
        ("chunk_length", ctypes.c_int64),
        ("last_chunk_length", ctypes.c_int64),
        ("total_runs", ctypes.c_int64),
        ("buffers", ctypes.c_int64),
        ("budget", ctypes.c_uint64),
        ("unchunkable_bytes", ctypes.c_uint64),
        ("chunk_bytes", ctypes.c_uint64),
        ("device_bytes", ctypes.c_uint64),
        ("full_bytes", ctypes.c_uint64),
        ("host_bytes", ctypes.c_uint64),
        ("arrays", ctypes.c_int64),
        ("granularity", ctypes.c_uint64),  # 2.1
        ("bytes_per_chunk", ctypes.c_uint64),
        ("id", ctypes.c_int64),
        ("sets", ctypes.c_int32),
        ("free_error", ctypes.c_int32),
    ]


class Array(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("dtype", ctypes.c_int32),
        ("memory", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("chunk_axis", ctypes.c_int32),
        ("device_ptr", ctypes.c_uint64),
        ("host", ctypes.c_void_p),
        ("bytes", ctypes.c_uint64),
        ("shape", ctypes.c_int64 * MAX_NDIM),
        ("strides", ctypes.c_int64 * MAX_NDIM),
        ("freed", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("label", ctypes.c_char_p),  # 2.1
    ]


class Span(ctypes.Structure):
    _fields_ = [("axis", ctypes.c_int64), ("start", ctypes.c_int64), ("len", ctypes.c_int64)]


class HostDesc(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
    ]


class Event(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("kind", ctypes.c_int32),
        ("evicted", ctypes.c_int32),
        ("client", _handle),
        ("response", _handle),
        ("pending", ctypes.c_int64),  # 2.1
        ("response_id", ctypes.c_int64),
    ]


# enum vram_allocate_flags (2.2).
ALLOCATE_QUEUE, ALLOCATE_TAKE_EVENT, ALLOCATE_MEM_INFO = 1, 2, 4


class Allocation(ctypes.Structure):  # 2.2
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("buffers", ctypes.c_int32),
        ("plan", ctypes.POINTER(Plan)),
        ("arrays", ctypes.c_void_p),
        ("cap", ctypes.c_size_t),
        ("array_size", ctypes.c_size_t),
        ("sim_hosts", ctypes.c_void_p),
        ("response", _handle),
        ("n", ctypes.c_size_t),
        ("pending", ctypes.c_int64),
        ("event_taken", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("free_bytes", ctypes.c_uint64),
        ("total_bytes", ctypes.c_uint64),
    ]


# enum vram_batch_dir.
BATCH_IN, BATCH_OUT, BATCH_INOUT, BATCH_SCRATCH = 0, 1, 2, 3


class BatchArray(ctypes.Structure):
    _fields_ = [
        ("client", _handle),
        ("request", Request),
        ("direction", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
        ("host", ctypes.c_void_p),
        ("host_array", _handle),
    ]


class BatchOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("buffers", ctypes.c_int32),
        ("host_kernels", ctypes.c_int32),
        ("max_chunk_length", ctypes.c_int64),
        ("grow", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


class BatchChunk(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint64),
        ("index", ctypes.c_int64),
        ("chunks", ctypes.c_int64),
        ("start", ctypes.c_int64),
        ("len", ctypes.c_int64),
        ("chunk_length", ctypes.c_int64),
        ("buffer", ctypes.c_int64),
        ("stream", _stream),
        ("arrays", ctypes.c_int64),
    ]


_P = ctypes.POINTER
_text = [ctypes.c_char_p, _size, _P(_size)]

SIGNATURES = {
    "vram_register": (ctypes.c_int, [_handle, _P(ClientOptions), _P(_handle)]),
    "vram_client_close": (ctypes.c_int, [_handle]),
    "vram_client_info": (ctypes.c_int, [_handle, _P(ClientInfo)]),
    "vram_client_group": (ctypes.c_int, [_handle] + _text),
    "vram_change_group": (ctypes.c_int, [_handle, ctypes.c_char_p]),
    "vram_set_manual_proportion": (ctypes.c_int, [_handle, ctypes.c_double]),
    "vram_set_manual_limit_mode": (ctypes.c_int, [_handle, ctypes.c_double]),
    "vram_set_auto_limit_mode": (ctypes.c_int, [_handle]),
    "vram_queue": (ctypes.c_int, [_handle, _P(Request), _size, _size]),
    "vram_allocate": (ctypes.c_int, [_handle, ctypes.c_int, _P(_handle)]),
    "vram_queue_allocate": (ctypes.c_int, [_handle, _P(Request), _size, _size, _P(Allocation)]),
    "vram_response_plan": (ctypes.c_int, [_handle, _P(Plan)]),
    "vram_response_array": (ctypes.c_int, [_handle, ctypes.c_char_p, ctypes.c_int, _P(Array)]),
    "vram_response_arrays": (ctypes.c_int, [_handle, ctypes.c_int, ctypes.c_void_p, _size, _size, _P(_size)]),
    "vram_response_span": (ctypes.c_int, [_handle, ctypes.c_int, ctypes.c_int, _P(Span)]),
    "vram_response_member": (ctypes.c_int, [_handle, _handle, _P(_handle)]),
    "vram_response_json": (ctypes.c_int, [_handle] + _text),
    "vram_response_release": (ctypes.c_int, [_handle]),
    "vram_sim_host_address": (ctypes.c_int, [_handle, ctypes.c_char_p, ctypes.c_int, _P(ctypes.c_void_p)]),
    "vram_to_device": (ctypes.c_int, [_handle, _handle, ctypes.c_char_p, ctypes.c_int, _P(HostDesc), _P(Span)]),
    "vram_from_device": (ctypes.c_int, [_handle, _handle, ctypes.c_char_p, ctypes.c_int, _P(HostDesc), _P(Span)]),
    "vram_sync": (ctypes.c_int, [_handle]),
    "vram_client_free": (ctypes.c_int, [_handle, ctypes.c_char_p]),
    "vram_begin_work": (ctypes.c_int, [_handle, _P(_handle)]),
    "vram_end_work": (ctypes.c_int, [_handle]),
    "vram_set_limit_mode": (ctypes.c_int, [_handle, ctypes.c_int]),
    "vram_shares": (ctypes.c_int, [_handle, _P(ctypes.c_double), _P(ctypes.c_double)]),
    "vram_mem_info": (ctypes.c_int, [_handle, _P(ctypes.c_uint64), _P(ctypes.c_uint64)]),
    "vram_group_members": (ctypes.c_int, [_handle, ctypes.c_char_p, _P(_handle), _size, _P(_size)]),
    "vram_free_label": (ctypes.c_int, [_handle, ctypes.c_char_p]),
    "vram_free_all": (ctypes.c_int, [_handle]),
    "vram_invalidate_all": (ctypes.c_int, [_handle]),
    "vram_reinit_streams": (ctypes.c_int, [_handle]),
    "vram_poll": (ctypes.c_int, [_handle, _P(Event), ctypes.c_char_p, _size]),
    "vram_host_array": (ctypes.c_int, [_handle, _P(ctypes.c_int64), ctypes.c_int, ctypes.c_int, ctypes.c_int, _P(_handle),
                                       _P(ctypes.c_void_p)]),
    "vram_host_free": (ctypes.c_int, [_handle]),
    "vram_plan": (ctypes.c_int, [ctypes.c_char_p] + _text),
    "vram_batch_start": (ctypes.c_int, [_handle, ctypes.c_void_p, _size, _size, _P(BatchOptions), _P(_handle)]),
    "vram_batch_next": (ctypes.c_int, [_handle, _P(BatchChunk), ctypes.c_void_p, _size, _size, _P(ctypes.c_void_p),
                                       _P(ctypes.c_int)]),
    "vram_batch_plan": (ctypes.c_int, [_handle, _P(Plan)]),
    "vram_batch_cancel": (ctypes.c_int, [_handle]),
    "vram_batch_report_json": (ctypes.c_int, [_handle] + _text),
    "vram_batch_close": (ctypes.c_int, [_handle]),
}
