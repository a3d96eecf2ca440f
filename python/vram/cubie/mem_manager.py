"""cubie.memory.mem_manager, served by vram's Go manager: MemoryManager,
InstanceMemorySettings and the module's helpers, with cubie's names,
signatures and defaults.

Who does what. Each MemoryManager has a vram manager (vram.Manager): the
process's manager of the device on a GPU (vram.manager(0)); under Numba's
CUDA simulator, a simulated device of its own, as large as
get_memory_info() says (cubie's simulator figures, 1 GiB free of 8 GiB,
unless a subclass says otherwise), whose free memory is what
get_memory_info's free says. Every registered instance is a vram client
of it, in the instance's stream group, with its proportion. vram's
manager then decides: it refuses proportions the pools cannot give, says
each instance's proportion and cap, queues the requests per group, plans
the group (chunked when it does not fit), allocates the arrays (Numba
device arrays over vram's memory; under the simulator, over the simulated
device's memory), evicts idle instances of other groups under pressure,
marks work, frees. get_chunk_parameters asks vram's planner (vram_plan).

What stays in Python, as cubie keeps it, because cubie's callers read it:
the registry of InstanceMemorySettings (proportion, cap, allocations,
hooks, held weakly), the pools' id lists, StreamGroups, the queue by
group, the chunk parameters by (group, owner), the host spill policy and
its memmap files, and the warnings. The hooks run on the thread whose call
caused them (vram's events are polled there), never on one of vram's own.

Where cubie and vram differ (the Go package's doc, "From cubie"), the
drop-in follows cubie except where vram's rule protects the user; the
drop-in's own list is in docs/cubie.md.
"""

import ctypes
import json
import os
import threading
from functools import partial
from inspect import ismethod
from math import prod
from tempfile import gettempdir, mkstemp
from typing import Any, Callable, Dict, Optional, Tuple
from warnings import warn
from weakref import WeakMethod, finalize
from weakref import ref as weakref_ref

import numpy as np

import vram as _vram
from .. import _capi, _lib
from .. import client as _client
from . import _backend
from .array_requests import ArrayRequest, ArrayResponse
from .stream_groups import StreamGroups

__all__ = [
    "ALL_MEMORY_MANAGER_PARAMETERS", "MIN_AUTOPOOL_SIZE", "HOST_SPILL_FRACTION", "HOST_PINNED_MAX_BYTES",
    "HOST_STAGING_BYTES", "ArrayRequest", "ArrayResponse", "InstanceMemorySettings", "MemoryManager",
    "current_cupy_stream", "total_system_ram", "available_system_ram", "placeholder_invalidate",
    "placeholder_dataready", "get_portioned_request_size", "is_request_chunkable", "replace_with_chunked_size",
    "defer_instance_teardown", "run_instance_teardown",
]

ALL_MEMORY_MANAGER_PARAMETERS = {"memory_manager", "stream_group", "mem_proportion", "host_spill_threshold",
                                 "spill_directory"}
MIN_AUTOPOOL_SIZE = 0.05
HOST_SPILL_FRACTION = 0.8
HOST_PINNED_MAX_BYTES = 2**30
HOST_STAGING_BYTES = 64 * 1024**2

# cubie's figures for the CUDA simulator's device: 1 GiB free of 8 GiB.
SIMULATED_FREE, SIMULATED_TOTAL = 1024**3, 8 * 1024**3
# Simulated devices of MemoryManagers are numbered from here, apart from
# the devices a process opens itself.
_SIM_ORDINAL_BASE = 1000
_sim_ordinals = iter(range(_SIM_ORDINAL_BASE, 1 << 30))
_sim_lock = threading.Lock()


# ── the host ───────────────────────────────────────────────────────────


def total_system_ram() -> Optional[int]:
    """Total physical RAM in bytes, or None where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_system_ram() -> Optional[int]:
    """RAM available to new allocations in bytes (MemAvailable), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _remove_spill_file(mapping: Any, path: str) -> None:
    try:
        mapping.close()
        os.remove(path)
    except OSError as error:
        warn("Could not remove spill file '%s': %s" % (path, error), ResourceWarning)


def _spill_directory(value) -> Optional[str]:
    if value is None:
        return None
    value = os.fspath(value)
    if not os.path.isdir(value):
        raise ValueError("spill_directory must be an existing directory, got '%s'" % value)
    return value


def _spill_threshold(value) -> Optional[int]:
    if value is None:
        return None
    if not isinstance(value, int):
        raise TypeError("'host_spill_threshold' must be %r (got %r)" % (int, value))
    if value < 0:
        raise ValueError("'host_spill_threshold' must be >= 0: %r" % value)
    return value


def _pinned_host_array(shape: Tuple[int, ...], dtype) -> np.ndarray:
    """A page-locked host array from vram's manager of the device (a NumPy
    array under the CUDA simulator, which never copies to a device)."""
    if _backend.simulating():
        return np.empty(shape, dtype=dtype)
    return _vram.manager(0).host_array(shape, dtype, "pinned")


# ── hooks and streams ──────────────────────────────────────────────────


def placeholder_invalidate() -> None:
    """The invalidate hook of an instance that gives none: does nothing."""


def placeholder_dataready(response: ArrayResponse) -> None:
    """The allocation hook of an instance that gives none: does nothing."""


class _WeakCallable:
    """A hook held weakly when it is a bound method (so the registry never
    keeps an instance alive); a call once its instance is gone does
    nothing."""

    def __init__(self, func: Callable) -> None:
        if isinstance(func, _WeakCallable):
            self._weak, self._strong = func._weak, func._strong
        elif ismethod(func):
            self._weak, self._strong = WeakMethod(func), None
        else:
            self._weak, self._strong = None, func

    def target(self) -> Optional[Callable]:
        return self._weak() if self._weak is not None else self._strong

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        target = self.target()
        return None if target is None else target(*args, **kwargs)

    __hash__ = None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _WeakCallable):
            return self.target() == other.target()
        return self.target() == other


def _ensure_cuda_context() -> None:
    """Makes sure a CUDA context works (nothing under the simulator);
    RuntimeError saying what to check otherwise."""
    if _backend.simulating():
        return
    try:
        if _backend.cuda().current_context() is None:
            raise RuntimeError("CUDA context is None - GPU may not be accessible")
    except Exception as e:
        raise RuntimeError("Failed to initialize or verify CUDA context: %s. Check the GPU driver, the "
                           "permissions on the device, or restart the process." % e) from e


def _numba_stream_ptr(nb_stream) -> Optional[int]:
    """The CUstream handle of a Numba stream, or None (no stream, a null
    handle, or one that is not a number)."""
    if nb_stream is None:
        return None
    h = getattr(nb_stream, "handle", None)
    if h is None:
        return None
    if isinstance(h, ctypes.c_void_p):
        return int(h.value) if h.value is not None else None
    try:
        return int(getattr(h, "value", h))
    except Exception:
        return None


class current_cupy_stream:
    """Within the block, allocations that name no stream (vram's Numba
    plugin, CuPy when importable) are ordered on the Numba stream
    nb_stream: it enters vram.stream(nb_stream) and, with CuPy, CuPy's
    external stream of it. Numba's default stream (handle 0) changes
    nothing."""

    def __init__(self, nb_stream) -> None:
        self.nb_stream = nb_stream
        self.cupy_ext_stream = None
        self._vram_stream = None

    def __enter__(self) -> "current_cupy_stream":
        ptr = _numba_stream_ptr(self.nb_stream)
        if ptr:
            self._vram_stream = _vram.stream(ptr)
            self._vram_stream.__enter__()
            try:
                import cupy
            except ImportError:
                cupy = None
            if cupy is not None:
                self.cupy_ext_stream = cupy.cuda.ExternalStream(ptr)
                self.cupy_ext_stream.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> Optional[bool]:
        result = None
        if self.cupy_ext_stream is not None:
            result = self.cupy_ext_stream.__exit__(exc_type, exc, tb)
            self.cupy_ext_stream = None
        if self._vram_stream is not None:
            self._vram_stream.__exit__(exc_type, exc, tb)
            self._vram_stream = None
        return result


# ── the registry's entries ─────────────────────────────────────────────


class InstanceMemorySettings:
    """One registered instance, as cubie keeps it: proportion, cap,
    allocations (label -> array), its hooks (held weakly when bound
    methods), a weak reference to it, its owner's id (the unit of work
    marks), its spill settings, and its vram client. allocated_bytes sums
    its arrays' bytes; work_complete says whether no work mark is open and
    the device is done with the work before the last."""

    def __init__(self, proportion: float = 1.0, allocations: Optional[dict] = None,
                 invalidate_hook: Callable = placeholder_invalidate,
                 allocation_ready_hook: Callable = placeholder_dataready, cap: Optional[int] = None,
                 instance_ref=None, last_stream=None, submitting: bool = False, completion_event=None,
                 owner_id: Optional[int] = None, last_used: int = 0, host_spill_threshold: Optional[int] = None,
                 spill_directory=None):
        if not isinstance(proportion, float):
            raise TypeError("'proportion' must be %r (got %r)" % (float, proportion))
        if not callable(invalidate_hook):
            raise TypeError("'invalidate_hook' must be callable (got %r)" % (invalidate_hook,))
        if cap is not None and not isinstance(cap, int):
            raise TypeError("'cap' must be %r (got %r)" % (int, cap))
        if instance_ref is not None and not isinstance(instance_ref, weakref_ref):
            raise TypeError("'instance_ref' must be a weak reference (got %r)" % (instance_ref,))
        self.proportion = proportion
        self.allocations = {} if allocations is None else allocations
        self.invalidate_hook = _WeakCallable(invalidate_hook)
        self.allocation_ready_hook = _WeakCallable(allocation_ready_hook)
        self.cap = cap
        self.instance_ref = instance_ref
        self.last_stream = last_stream
        self.submitting = submitting
        self.completion_event = completion_event
        self.owner_id = owner_id
        self.last_used = last_used
        self.host_spill_threshold = _spill_threshold(host_spill_threshold)
        self.spill_directory = _spill_directory(spill_directory)
        self.client = None  # its vram.Client, once registered
        self._vram_labels = set()  # labels whose array is the client's (freed through it)
        self._works = []  # its open vram work marks

    def __repr__(self):
        return "InstanceMemorySettings(proportion=%r, cap=%r, allocations=%s, owner_id=%r)" % (
            self.proportion, self.cap, sorted(self.allocations), self.owner_id)

    def add_allocation(self, key: str, arr: Any) -> None:
        """Keeps arr under key, freeing what key held first."""
        if key in self.allocations:
            self.free(key)
        self.allocations[key] = arr

    def free(self, key: str) -> None:
        """Frees the array under key (warns when there is none)."""
        if key not in self.allocations:
            warn("Attempted to free allocation for %s, but it was not found in the allocations list." % key)
            return
        del self.allocations[key]
        if key in self._vram_labels:
            self._vram_labels.discard(key)
            if self.client is not None:
                self.client.free(key)

    def free_all(self) -> None:
        """Frees every array it holds."""
        for key in list(self._vram_labels):
            if self.client is not None:
                self.client.free(key)
        self._vram_labels.clear()
        self.allocations.clear()

    def _forget(self) -> None:
        """Drops the arrays vram freed (an eviction, an invalidation)."""
        self._vram_labels.clear()
        self.allocations.clear()

    @property
    def allocated_bytes(self) -> int:
        return sum(arr.nbytes for arr in self.allocations.values())

    @property
    def work_complete(self) -> bool:
        if self.submitting:
            return False
        try:
            return self.client is None or self.client.idle
        except _vram.VramError:  # closed: nothing of it runs
            return True


# ── the manager ────────────────────────────────────────────────────────


def _weak_method(method):
    """method called through a weak reference to its object (None once
    the object is gone), so that a callback kept by vram or StreamGroups
    never keeps a MemoryManager alive."""
    ref = WeakMethod(method)

    def call(*args, **kwargs):
        m = ref()
        return None if m is None else m(*args, **kwargs)

    return call


def _proportion_error(err: Exception, manual: bool) -> ValueError:
    """cubie's ValueError for a proportion vram's pools refused."""
    why = str(err)
    if manual and "over 100%" in why:
        msg = "Manual proportion would exceed total available memory"
    elif manual:
        msg = "Manual proportion would leave less than 5% of memory for auto-allocated processes"
    else:
        msg = "Available auto-allocation pool is less than 5% of total due to manual allocations"
    return ValueError("%s (%s)" % (msg, why))


class MemoryManager:
    """cubie's memory manager, served by vram's (see the module doc).

    totalmem is the device's total memory (get_memory_info's, read at
    construction); registry maps id(instance) to its
    InstanceMemorySettings; stream_groups is cubie's StreamGroups, whose
    group streams are vram's; mode is "passive" (caps computed, not
    enforced) or "active". host_spill_threshold, spill_directory and
    pinned_max_bytes are cubie's host policy (create_host_array,
    choose_host_memory_type).
    """

    def __init__(self, totalmem: Optional[int] = None, registry: Optional[dict] = None,
                 stream_groups: Optional[StreamGroups] = None, mode: str = "passive", auto_pool=None,
                 manual_pool=None, queued_allocations=None, group_chunk_parameters=None,
                 host_spill_threshold: Optional[int] = None, spill_directory=None,
                 pinned_max_bytes: int = HOST_PINNED_MAX_BYTES):
        if auto_pool or manual_pool or queued_allocations or group_chunk_parameters:
            raise ValueError("vram.cubie's pools, queue and plans are vram's manager's: register instances and "
                             "queue their requests instead of passing them to MemoryManager")
        if mode not in ("passive", "active"):
            raise ValueError("'mode' must be in ['passive', 'active'] (got %r)" % (mode,))
        if not isinstance(pinned_max_bytes, int) or pinned_max_bytes < 0:
            raise ValueError("'pinned_max_bytes' must be an int >= 0: %r" % (pinned_max_bytes,))
        self.host_spill_threshold = _spill_threshold(host_spill_threshold)
        self.spill_directory = _spill_directory(spill_directory)
        self.pinned_max_bytes = pinned_max_bytes
        self._mode = mode
        self._vram = None  # the vram.Manager, opened on first need (_manager)
        self._vram_lock = threading.Lock()
        self._quiet = 0  # > 0 while allocate_all allocates: no allocation hooks
        self.stream_groups = stream_groups if stream_groups is not None else StreamGroups()
        if self.stream_groups.stream_factory is None:
            self.stream_groups.stream_factory = _weak_method(self._group_stream)
        self._auto_pool = []
        self._manual_pool = []
        self._queued_allocations: Dict[str, Dict[int, dict]] = {}
        self._group_chunk_parameters: Dict[Tuple[str, int], Tuple[int, int]] = {}
        self._usage_clock = 0
        self._pending_teardowns = []
        self.totalmem = totalmem
        self.registry = registry if registry is not None else {}
        self._read_totalmem()

    def _read_totalmem(self) -> None:
        try:
            free, total = self.get_memory_info()
        except ValueError as e:
            total = 1
            if e.args and str(e.args[0]).startswith("not enough values to unpack"):
                warn("memory manager was initialised in a cuda-less environment - memory manager will allow "
                     "import but not provide any memory (1 byte)")
            else:
                warn("Unexpected exception %s encountered while instantiating memory manager" % e)
        except Exception as e:
            warn("Unexpected exception %s encountered while instantiating memory manager" % e)
            total = 1
        self.totalmem = total
        self.registry = {}

    # vram's manager

    def _manager(self) -> "_vram.Manager":
        """The vram manager serving this one, opened on first need (see the
        module doc)."""
        with self._vram_lock:
            if self._vram is None:
                self._vram = self._open_manager()
            return self._vram

    def _open_manager(self) -> "_vram.Manager":
        if not _backend.simulating():
            m = _vram.manager(0)
        else:
            if type(self).get_memory_info is MemoryManager.get_memory_info:
                free, total = SIMULATED_FREE, SIMULATED_TOTAL
            else:
                try:
                    free, total = self.get_memory_info()
                except Exception:
                    free = total = max(int(self.totalmem or 1), 1)
            free, total = int(min(free, total)), max(int(total), 1)
            with _sim_lock:
                ordinal = next(_sim_ordinals)
            spec = "sim:vram=%d,context=%d,granularity=512,ordinal=%d,name=vram.cubie" % (total, total - free, ordinal)
            m = _vram.Manager(spec)
        if self._mode == "active":
            m.set_limit_mode("active")
        return m

    def _group_stream(self, group: str):
        """A group's stream for stream_groups: the group's vram stream on a
        GPU once vram has the group (a Numba external stream), else a Numba
        stream; a Numba simulator stream under the simulator."""
        cuda = _backend.cuda()
        if _backend.simulating() or self._vram is None:
            return cuda.stream()
        members = self._vram.group_members(group)
        if members:
            return cuda.external_stream(members[0].stream)
        return cuda.stream()

    def _poll(self) -> None:
        if self._vram is not None:
            self._vram.poll()

    # registration

    def register(self, instance: object, proportion: Optional[float] = None,
                 invalidate_cache_hook: Callable = placeholder_invalidate,
                 allocation_ready_hook: Callable = placeholder_dataready, stream_group: str = "default",
                 owner: Optional[object] = None, host_spill_threshold: Optional[int] = None,
                 spill_directory=None) -> None:
        """Registers instance in stream_group with a manual proportion (0 to
        1) or, with none, a share of the auto pool. ValueError when it is
        registered already or the pools cannot give the proportion: a
        refusal changes nothing."""
        self._purge_dead_instances()
        instance_id = id(instance)
        if instance_id in self.registry:
            raise ValueError("Instance already registered")
        try:
            instance_ref = weakref_ref(instance)
        except TypeError:
            instance_ref = None
        settings = InstanceMemorySettings(
            invalidate_hook=invalidate_cache_hook, allocation_ready_hook=allocation_ready_hook,
            instance_ref=instance_ref, owner_id=instance_id if owner is None else id(owner),
            host_spill_threshold=host_spill_threshold, spill_directory=spill_directory)
        if proportion and not 0 <= proportion <= 1:
            raise ValueError("Proportion must be between 0 and 1")
        if any(instance_id in m for m in self.stream_groups.groups.values()):
            raise ValueError("Instance already in a stream group. Call change_group instead")
        settings.client = self._register_client(instance, instance_id, settings, stream_group, proportion)
        self.stream_groups.add_instance(instance, stream_group)
        self.registry[instance_id] = settings
        (self._manual_pool if proportion else self._auto_pool).append(instance_id)
        self._refresh_shares()
        if proportion:
            self._warn_low_autopool()

    def _register_client(self, instance, instance_id, settings, group, proportion):
        live_hook = settings.invalidate_hook.target() not in (None, placeholder_invalidate)
        try:
            return self._manager().register(
                type(instance).__name__, group=group, proportion=float(proportion or 0.0),
                on_allocated=partial(_on_allocated, weakref_ref(self), instance_id),
                on_invalidate=partial(_on_invalidate, weakref_ref(self), instance_id) if live_hook else None)
        except _lib.InvalidArgumentError as e:
            raise _proportion_error(e, bool(proportion)) from None

    def get_registration(self, instance: object) -> InstanceMemorySettings:
        """The registry entry of instance (KeyError if not registered)."""
        return self.registry[id(instance)]

    def _refresh_shares(self) -> None:
        """Each entry's proportion and cap, as vram's pools give them."""
        for settings in self.registry.values():
            c = settings.client
            if c is not None:
                settings.proportion, settings.cap = float(c.proportion), int(c.cap)

    def _rebalance_auto_pool(self) -> None:
        """vram's pools rebalance at every change; this reads them."""
        self._refresh_shares()

    def _warn_low_autopool(self) -> None:
        if not self._auto_pool and self.manual_pool_proportion > 1.0 - MIN_AUTOPOOL_SIZE:
            warn("Manual proportion leaves less than 5% of memory for auto allocation if management mode == "
                 "'active'.")

    def set_limit_mode(self, mode: str) -> None:
        """"passive" or "active" (ValueError otherwise)."""
        if mode not in ("passive", "active"):
            raise ValueError("Unknown mode: %s" % mode)
        if self._vram is not None:
            self._vram.set_limit_mode(mode)
        self._mode = mode

    @property
    def manual_pool_proportion(self) -> float:
        self._purge_dead_instances()
        if self._vram is None or not self._manual_pool:
            return 0.0
        return self._vram.shares.manual

    @property
    def auto_pool_proportion(self) -> float:
        self._purge_dead_instances()
        if self._vram is None or not self._auto_pool:
            return 0.0
        return self._vram.shares.auto

    def proportion(self, instance: object) -> float:
        return self.registry[id(instance)].proportion

    def cap(self, instance: object) -> Optional[int]:
        settings = self.registry.get(id(instance))
        return None if settings is None else settings.cap

    def set_manual_proportion(self, instance: object, proportion: float) -> None:
        """A manual proportion for instance, moving it from the auto pool
        if it is there; a refusal (ValueError) changes nothing."""
        self._purge_dead_instances()
        if proportion < 0 or proportion > 1:
            raise ValueError("Proportion must be between 0 and 1")
        self._to_manual(instance, lambda c: c.set_manual_proportion(float(proportion)))

    def set_manual_limit_mode(self, instance: object, proportion: float) -> None:
        """Moves an auto instance to the manual pool with proportion; a
        manual one stays as it is."""
        self._purge_dead_instances()
        if id(instance) in self._manual_pool:
            return
        self._to_manual(instance, lambda c: c.set_manual_limit_mode(float(proportion)))

    def _to_manual(self, instance, change) -> None:
        instance_id = id(instance)
        settings = self.registry[instance_id]
        try:
            change(settings.client)
        except _lib.InvalidArgumentError as e:
            raise _proportion_error(e, True) from None
        if instance_id in self._auto_pool:
            self._auto_pool.remove(instance_id)
            self._manual_pool.append(instance_id)
        self._refresh_shares()
        self._warn_low_autopool()

    def set_auto_limit_mode(self, instance: object) -> None:
        """Moves a manual instance to the auto pool; an auto one stays."""
        self._purge_dead_instances()
        instance_id = id(instance)
        settings = self.registry[instance_id]
        if instance_id in self._auto_pool:
            return
        try:
            settings.client.set_auto_limit_mode()
        except _lib.InvalidArgumentError as e:
            raise _proportion_error(e, False) from None
        self._manual_pool.remove(instance_id)
        self._auto_pool.append(instance_id)
        self._refresh_shares()

    # teardown of collected instances

    def defer_teardown(self, teardown: Callable[[], None]) -> None:
        """Records a teardown for the manager's next call (a collector's
        finalizer must not deregister in the middle of one)."""
        self._pending_teardowns.append(teardown)

    def _purge_dead_instances(self) -> None:
        """Drops the entries whose instance was collected: their arrays,
        proportion, group membership and queue go, as cubie's."""
        while self._pending_teardowns:
            self._pending_teardowns.pop()()
        dead = [i for i, s in self.registry.items() if s.instance_ref is not None and s.instance_ref() is None]
        for instance_id in dead:
            self._drop_instance(instance_id)
        if dead:
            self._refresh_shares()

    def _drop_instance(self, instance_id: int) -> None:
        settings = self.registry.pop(instance_id, None)
        if settings is not None:
            settings._forget()
            if settings.client is not None:
                settings.client.close()  # its arrays, its share, its group, its queue
        for pool in (self._manual_pool, self._auto_pool):
            if instance_id in pool:
                pool.remove(instance_id)
        self.stream_groups.remove_instance(instance_id)
        for queued in self._queued_allocations.values():
            queued.pop(instance_id, None)

    def release_instance(self, instance_id: int, settings: InstanceMemorySettings) -> None:
        """Releases the instance registered with settings."""
        if self.registry.get(instance_id) is not settings:
            return
        self._drop_instance(instance_id)
        self._refresh_shares()

    # work marks

    def _owner_settings(self, owner_id: int) -> list:
        return [s for s in self.registry.values() if s.owner_id == owner_id]

    def begin_work(self, owner: object) -> None:
        """Marks the owner's instances busy: never evicted until end_work
        and the device's finishing the work before it. vram.FreedError for
        an instance whose arrays were evicted: allocate again first."""
        self._usage_clock += 1
        owned = self._owner_settings(id(owner))
        works = []
        try:
            for settings in owned:
                works.append((settings, settings.client.begin_work()))
        except Exception:
            for _, w in works:
                w.end()
            raise
        for settings, w in works:
            settings._works.append(w)
            settings.submitting = True
            settings.last_used = self._usage_clock

    def end_work(self, owner: object, stream) -> None:
        """Ends the owner's work marks: its instances are idle once the
        device has done the work enqueued before."""
        for settings in self._owner_settings(id(owner)):
            settings.last_stream = stream
            while settings._works:
                settings._works.pop().end()
            settings.submitting = False

    # streams and groups

    def get_stream(self, instance: object):
        """The stream of instance's group."""
        return self.stream_groups.get_stream(instance)

    def get_group_stream(self, group: str = "default"):
        """The group's stream (made, with the group, if missing)."""
        return self.stream_groups.get_group_stream(group)

    def get_stream_group(self, instance: object) -> str:
        return self.stream_groups.get_group(instance)

    def change_stream_group(self, instance: object, new_group: str) -> None:
        """Moves instance, and what it has queued, to new_group (ValueError
        if it is in no group). Its arrays stay valid: synchronize the old
        group's stream before using them on the new one's."""
        old = self.stream_groups.get_group(instance)
        settings = self.registry.get(id(instance))
        if settings is not None and settings.client is not None:
            settings.client.change_stream_group(new_group)
        self.stream_groups.change_group(instance, new_group)
        queued = self._queued_allocations.get(old, {}).pop(id(instance), None)
        if queued is not None:
            self._queued_allocations.setdefault(new_group, {})[id(instance)] = queued

    def reinit_streams(self) -> None:
        """Fresh streams for every group (after a context reset)."""
        if self._vram is not None:
            self._vram.reinit_streams()
        self.stream_groups.reinit_streams()

    def is_grouped(self, instance: object) -> bool:
        """Whether instance shares a named group (not "default") with
        others."""
        group = self.get_stream_group(instance)
        return group != "default" and len(self.stream_groups.get_instances_in_group(group)) > 1

    # freeing

    def free(self, array_label: str) -> None:
        """Frees every instance's array under array_label."""
        if self._vram is not None:
            self._vram.free_label(array_label)
        for settings in self.registry.values():
            if array_label in settings.allocations:
                del settings.allocations[array_label]
                settings._vram_labels.discard(array_label)

    def free_all(self) -> None:
        """Frees every instance's arrays."""
        if self._vram is not None:
            self._vram.free_all()
        for settings in self.registry.values():
            settings._forget()

    def invalidate_all(self) -> None:
        """Frees every array and calls every instance's invalidate hook."""
        self.free_all()
        for settings in list(self.registry.values()):
            settings.invalidate_hook()

    # host arrays

    def create_host_array(self, shape, dtype, memory_type: str = "pinned", like=None, instance=None) -> np.ndarray:
        """A zeroed C-contiguous host array (filled from like when given):
        "pinned" (vram's pinned memory), "host" (pageable) or "memmap" (a
        spill file, in instance's spill directory)."""
        _ensure_cuda_context()
        if memory_type not in ("pinned", "host", "memmap"):
            raise ValueError("memory_type must be 'pinned', 'host', or 'memmap', got '%s'" % memory_type)
        if memory_type == "memmap":
            arr = self._create_spill_array(shape, dtype, instance)
        elif memory_type == "pinned" and not _backend.simulating():
            arr = self._manager().host_array(shape, dtype, "pinned")
        else:
            arr = np.zeros(shape, dtype=dtype)
        if like is not None:
            arr[:] = like
        return arr

    def choose_host_memory_type(self, nbytes: int, instance: object, allow_pinned: bool = True) -> str:
        """"memmap" above the spill threshold, "pinned" up to
        pinned_max_bytes (when allowed), else "host"."""
        threshold = self._resolved_spill_threshold(instance)
        if threshold is not None and nbytes > threshold:
            return "memmap"
        if allow_pinned and nbytes <= self.pinned_max_bytes:
            return "pinned"
        return "host"

    def _resolved_spill_threshold(self, instance: object) -> Optional[int]:
        settings = self.registry[id(instance)]
        owner = self.registry.get(settings.owner_id)
        for t in (settings.host_spill_threshold, owner and owner.host_spill_threshold, self.host_spill_threshold):
            if t is not None:
                return t
        ram = total_system_ram()
        return None if ram is None else int(ram * HOST_SPILL_FRACTION)

    def _create_spill_array(self, shape, dtype, instance) -> np.memmap:
        settings = self.registry[id(instance)]
        owner = self.registry.get(settings.owner_id)
        directory = settings.spill_directory or (owner and owner.spill_directory) or self.spill_directory
        handle, path = mkstemp(prefix="cubie-spill-", suffix=".dat", dir=directory or gettempdir())
        os.close(handle)
        arr = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
        arr._cubie_spill_path = path
        arr._cubie_spill_cleanup = finalize(arr, _remove_spill_file, arr._mmap, path)
        return arr

    def release_host_array(self, array: np.ndarray) -> None:
        """Removes a spill array's file now (OSError naming it on failure)."""
        cleanup = getattr(array, "_cubie_spill_cleanup", None)
        if cleanup is None or not cleanup.alive:
            return
        path = array._cubie_spill_path
        try:
            array._mmap.close()
            os.remove(path)
        except OSError as error:
            raise OSError("Could not remove spill file '%s'" % path) from error
        cleanup.detach()

    # memory

    def get_memory_info(self) -> Tuple[int, int]:
        """The device's (free, total) bytes, as vram's manager reads them."""
        return self._manager().mem_info()

    def get_available_memory(self, group: str) -> int:
        """The group's memory: the device's free memory (passive), or its
        members' caps less what they hold, at most the free memory
        (active; warns past 95% of the caps)."""
        return self._available_memory(group, self.get_memory_info()[0])

    def _available_memory(self, group: str, free: int) -> int:
        """get_available_memory with the device's free memory read."""
        if self._mode == "passive":
            return free
        members = self.stream_groups.get_instances_in_group(group)
        allocated = sum(self.registry[i].allocated_bytes for i in members)
        cap = sum(self.registry[i].cap for i in members)
        headroom = cap - allocated
        if cap and headroom / cap < 0.05:
            warn("Stream group %s has used more than 95%% of it's allotted memory already, and future "
                 "requests will run slowly/in many chunks" % group)
        return min(headroom, free)

    def _check_requests(self, requests) -> None:
        if not isinstance(requests, dict):
            raise TypeError("Expected dict for requests, got %s" % type(requests))
        for key, request in requests.items():
            if not isinstance(request, ArrayRequest):
                raise TypeError("Expected ArrayRequest for %s, got %s" % (key, type(request)))

    # queueing and allocating

    def queue_request(self, instance: object, requests: Dict[str, ArrayRequest]) -> None:
        """Queues requests for instance's group's next allocate_queue,
        replacing what instance had queued. ValueError for an instance
        registered without a live invalidate hook (its arrays could be
        evicted unawares), or for a request vram refuses."""
        self._check_requests(requests)
        instance_id = id(instance)
        settings = self.registry[instance_id]
        if settings.invalidate_hook.target() in (None, placeholder_invalidate):
            raise ValueError("Instances that request allocations must register a live invalidate_cache_hook: "
                             "allocated buffers are evicted under VRAM pressure, and the hook is how the "
                             "instance drops its handles.")
        settings.client.queue({label: r.to_vram() for label, r in requests.items()})
        self._queued_allocations.setdefault(self.get_stream_group(instance), {})[instance_id] = requests

    def allocate_queue(self, triggering_instance: object, stream=None) -> None:
        """Plans and allocates what the instance's group has queued
        (chunked along the run axis when it does not fit) and calls every
        member's allocation hook: the arrays to those that queued, the plan
        alone to the others. With nothing queued, the group's last plan
        goes to its members again (nothing happens when it has none).
        ValueError when even one run at a time does not fit."""
        self._purge_dead_instances()
        group = self.get_stream_group(triggering_instance)
        queued = self._queued_allocations.pop(group, {})
        settings = self.registry[id(triggering_instance)]
        if not queued and (group, settings.owner_id) not in self._group_chunk_parameters:
            return None
        if stream is None:
            stream = self.get_stream(triggering_instance)
        for peer in self.stream_groups.get_instances_in_group(group):
            if peer in self.registry:
                self.registry[peer].last_stream = stream
        # the 20x warning before any hook, with the free memory the
        # allocation's own call read (get_memory_info's, unless a subclass
        # or a test replaced it: then its)
        warn_far = partial(self._warn_if_far_too_large, queued, group) if queued else None
        if warn_far is not None and not self._own_memory_info():
            warn_far(self.get_memory_info()[0])
            warn_far = None
        try:
            _client.allocate(settings.client, None, 1, _capi.ALLOCATE_MEM_INFO if warn_far else 0,
                             None if warn_far is None else lambda mem: warn_far(mem[0]))
        except Exception as e:
            if warn_far is not None:  # the memory as it was, unless the arrays replaced had to be freed first
                warn_far(self.get_memory_info()[0])
            if isinstance(e, _vram.OutOfMemoryError):
                raise ValueError("Can't fit the request in GPU VRAM even in chunks of one run: %s" % e) from e
            raise
        return None

    def _own_memory_info(self) -> bool:
        """Whether get_memory_info is this class's: vram's manager's figures."""
        return "get_memory_info" not in self.__dict__ and type(self).get_memory_info is MemoryManager.get_memory_info

    def _warn_if_far_too_large(self, requests: dict, group: str, free: int) -> None:
        size = sum(get_portioned_request_size(requests))
        if free > 0 and size > self._available_memory(group, free) and size / free > 20:
            warn("This request exceeds available VRAM by more than 20x. Available VRAM = %d, request size = %d."
                 % (free, size), UserWarning)

    def allocate_all(self, requests: Dict[str, ArrayRequest], instance_id: int, stream,
                     settings: Optional[InstanceMemorySettings] = None) -> Dict[str, Any]:
        """Allocates each request as it is (no chunking) for the instance
        with id instance_id and keeps the arrays in its allocations;
        returns them. No allocation hook is called."""
        settings = settings if settings is not None else self.registry[instance_id]
        settings.last_stream = stream
        reqs = {}
        for label, r in requests.items():
            v = r.to_vram()
            reqs[label] = type(v)(shape=v.shape, dtype=v.dtype, memory=v.memory, unchunkable=True)
        settings.client.queue(reqs)
        self._quiet += 1
        try:
            settings.client.allocate()
        finally:
            self._quiet -= 1
        return {label: settings.allocations[label] for label in requests}

    def allocate(self, shape, dtype, memory_type: str, stream=0):
        """One array outside any instance's books: "device" (Numba's
        device_array, through Numba's memory manager: vram's when
        vram.cubie.install_async_emm ran) or "pinned"."""
        _ensure_cuda_context()
        if memory_type == "device":
            with current_cupy_stream(stream):
                return _backend.cuda().device_array(shape, dtype)
        if memory_type == "pinned":
            return _pinned_host_array(shape, dtype)
        raise ValueError("Invalid memory type: %s" % memory_type)

    def to_device(self, instance: object, from_arrays, to_arrays, stream=None) -> None:
        """Copies each host array into its device array on instance's
        stream."""
        _ensure_cuda_context()
        if stream is None:
            stream = self.get_stream(instance)
        self.registry[id(instance)].last_stream = stream
        for src, dst in zip(from_arrays, to_arrays):
            _backend.cuda().to_device(src, stream=stream, to=dst)

    def from_device(self, instance: object, from_arrays, to_arrays, stream=None) -> None:
        """Copies each device array into its host array on instance's
        stream."""
        _ensure_cuda_context()
        if stream is None:
            stream = self.get_stream(instance)
        self.registry[id(instance)].last_stream = stream
        for src, dst in zip(from_arrays, to_arrays):
            src.copy_to_host(dst, stream=stream)

    def sync_stream(self, instance: object, stream=None) -> None:
        """Waits for instance's stream (its last one, or stream), and for
        vram's copies on its group's."""
        _ensure_cuda_context()
        settings = self.registry.get(id(instance))
        if stream is None:
            stream = None if settings is None else settings.last_stream
        if stream is None or (isinstance(stream, int) and stream == 0):
            stream = self.get_stream(instance)
        stream.synchronize()
        if settings is not None and settings.client is not None:
            settings.client.sync()

    # planning

    def get_chunk_parameters(self, requests: Dict[int, Dict[str, ArrayRequest]], axis_length: int,
                             stream_group: str) -> Tuple[int, int]:
        """(chunk length, chunks) for requests (instance id -> label ->
        request) of stream_group, as vram's planner cuts them within the
        group's memory (the free memory and, in the active mode, the
        members' caps, with the requesters' own arrays counted free).
        ValueError when they cannot fit, saying why; a warning when they are
        more than 20 times the free memory."""
        free, _ = self.get_memory_info()
        budget = self._planning_budget(requests, stream_group, free)
        chunkable, unchunkable = get_portioned_request_size(requests)
        out = _plan({str(k): v for k, v in requests.items()}, budget)
        size = chunkable + unchunkable
        if ("error" in out or out["plan"]["chunks"] > 1) and free > 0 and size / free > 20:
            warn("This request exceeds available VRAM by more than 20x. Available VRAM = %d, request size = %d."
                 % (free, size), UserWarning)
        if "error" in out:
            raise _plan_error(out["error"], size, chunkable, unchunkable, budget)
        p = out["plan"]
        return (axis_length, 1) if p["chunks"] <= 1 else (p["chunk_length"], p["chunks"])

    def _planning_budget(self, requests: dict, group: str, free: int) -> int:
        own = sum(self.registry[i].allocated_bytes for i in requests if i in self.registry)
        budget = free + own
        if self._mode == "active":
            members = self.stream_groups.get_instances_in_group(group)
            caps = sum(self.registry[m].cap - self.registry[m].allocated_bytes for m in members)
            budget = min(budget, max(caps, 0))
        return max(budget, 0)

    def compute_chunked_shapes(self, requests: Dict[str, ArrayRequest], chunk_size: int) -> Dict[str, tuple]:
        """Each request's shape with its run axis cut to chunk_size
        (unchunkable ones as they are)."""
        return {k: replace_with_chunked_size(r.shape, r.chunk_axis_index, chunk_size) if is_request_chunkable(r)
                else r.shape for k, r in requests.items()}


# ── vram's events ──────────────────────────────────────────────────────


def _on_allocated(manager_ref, instance_id: int, response) -> None:
    """vram allocated the instance's group: its arrays (device ones as
    Numba arrays, pinned ones as NumPy arrays) go into its allocations,
    the plan into the group's chunk parameters, and cubie's response to its
    hook."""
    mgr = manager_ref()
    settings = None if mgr is None else mgr.registry.get(instance_id)
    if settings is None:
        return
    arrays = dict(response.arrays)
    arrays.update(response.host)
    for label, arr in arrays.items():
        settings.allocations[label] = arr
        settings._vram_labels.add(label)
    plan = response.plan
    group = mgr.stream_groups.get_group(instance_id)
    mgr._group_chunk_parameters[(group, settings.owner_id)] = (plan.chunk_length, plan.chunks)
    if mgr._quiet:
        return
    shapes = {label: tuple(a.shape) for label, a in arrays.items()}
    settings.allocation_ready_hook(ArrayResponse(arr=arrays, chunks=plan.chunks, chunk_length=plan.chunk_length,
                                                 chunked_shapes=shapes))


def _on_invalidate(manager_ref, instance_id: int, error) -> None:
    """vram freed the instance's arrays (evicted for another group): it
    forgets them and hears it through its invalidate hook."""
    mgr = manager_ref()
    settings = None if mgr is None else mgr.registry.get(instance_id)
    if settings is None:
        return
    settings._forget()
    settings.invalidate_hook()


# ── the planner ────────────────────────────────────────────────────────


def _plan(requests: Dict[str, Dict[str, ArrayRequest]], budget: int) -> dict:
    """vram_plan over cubie's requests (owner -> label -> request), counted
    in bytes as cubie counts them (granularity 1)."""
    reqs = {}
    for owner, labels in requests.items():
        reqs[owner] = {}
        for label, r in labels.items():
            v = r.to_vram()
            reqs[owner][label] = {"shape": list(v.shape), "dtype": v.dtype, "memory": v.memory,
                                  "chunk_axis": v.chunk_axis, "unchunkable": v.unchunkable,
                                  "total_runs": v.total_runs}
    arg = json.dumps({"requests": reqs, "budget": int(budget), "granularity": 1}).encode()
    return json.loads(_lib.text(_lib.lib().vram_plan, arg))


def _plan_error(e: dict, size: int, chunkable: int, unchunkable: int, budget: int) -> ValueError:
    """cubie's ValueError for a refusal of vram's planner."""
    why = "(vram: %s)" % e["message"]
    if e["kind"] == "unchunkable" and chunkable == 0:
        return ValueError("All requested arrays are unchunkable, but request size (%d) exceeds available memory "
                          "(%d). Cannot proceed. %s" % (size, budget, why))
    if e["kind"] == "unchunkable":
        return ValueError("Unchunkable arrays require %d bytes but only %d bytes available. Cannot proceed. %s"
                          % (unchunkable, budget, why))
    if e["kind"] == "run_too_large":
        return ValueError("Can't fit a single run in GPU VRAM. Available memory: %d. Request size: %d. Chunkable "
                          "request size: %d. %s" % (budget, size, chunkable, why))
    return ValueError(e["message"])


# ── teardown and the module's helpers ──────────────────────────────────


def defer_instance_teardown(memory_manager: MemoryManager, instance_id: int, settings: InstanceMemorySettings,
                            cleanups: Tuple[Callable[[], None], ...]) -> None:
    """A collector finalizer's target: records the teardown for the
    manager's next call."""
    memory_manager.defer_teardown(partial(run_instance_teardown, memory_manager, instance_id, settings, cleanups))


def run_instance_teardown(memory_manager: MemoryManager, instance_id: int, settings: InstanceMemorySettings,
                          cleanups: Tuple[Callable[[], None], ...]) -> None:
    """Runs cleanups and releases the instance; on failure the entry is
    kept (never purged)."""
    try:
        with current_cupy_stream(settings.last_stream):
            for cleanup in cleanups:
                cleanup()
            memory_manager.release_instance(instance_id, settings)
    except Exception:
        settings.instance_ref = None


def _itemsize(dtype) -> int:
    return np.dtype(dtype).itemsize


def get_portioned_request_size(requests: Dict[Any, Dict[str, ArrayRequest]]) -> Tuple[int, int]:
    """(chunkable, unchunkable) bytes of requests (owner -> label ->
    request)."""
    chunkable = unchunkable = 0
    for reqs in requests.values():
        for r in reqs.values():
            n = prod(r.shape) * _itemsize(r.dtype)
            if is_request_chunkable(r):
                chunkable += n
            else:
                unchunkable += n
    return chunkable, unchunkable


def is_request_chunkable(request) -> bool:
    """Whether request may be cut along its run axis: not unchunkable, a
    run axis within its shape, of length above 1."""
    axis = request.chunk_axis_index
    return not (request.unchunkable or len(request.shape) == 0 or axis is None or axis >= len(request.shape)
                or request.shape[axis] == 1)


def replace_with_chunked_size(shape: Tuple[int, ...], axis_index: int, chunked_size: int) -> Tuple[int, ...]:
    """shape with axis axis_index set to chunked_size."""
    return tuple(chunked_size if i == axis_index else d for i, d in enumerate(shape))
