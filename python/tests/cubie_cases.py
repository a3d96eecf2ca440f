"""vram.cubie, the drop-in for cubie.memory, under Numba's CUDA simulator on
vram's simulator: cubie's names and signatures, a batch bigger than the
device chunked by vram's manager with a Numba kernel per chunk, the
refusals in cubie's words, eviction, release of collected instances, and
that vram's manager holds what the registry says. Run by test_cubie.py in a
child python3 with NUMBA_ENABLE_CUDASIM=1 (Numba reads it at import).
cubie's own tests/memory are scripts/cubie-suite.sh's.
"""

import ast
import gc
import inspect
import os
import unittest
import warnings
from unittest import mock

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "run by test_cubie.py, under Numba's simulator"

import numpy as np
from numba import cuda

import vram
import vram.cubie
from vram.cubie import array_requests, chunk_buffer_pool, cupy_emm, mem_manager, stream_groups
from vram.cubie.mem_manager import ArrayRequest, MemoryManager

MiB = 1 << 20

# cubie 0dfe92b4's public names, module by module (src/cubie/memory).
NAMES = {
    vram.cubie: ["default_memmgr", "MemoryManager", "current_cupy_stream", "CuPyAsyncNumbaManager"],
    mem_manager: ["ALL_MEMORY_MANAGER_PARAMETERS", "HOST_PINNED_MAX_BYTES", "HOST_SPILL_FRACTION",
                  "HOST_STAGING_BYTES", "InstanceMemorySettings", "MIN_AUTOPOOL_SIZE", "MemoryManager",
                  "ArrayRequest", "ArrayResponse", "available_system_ram", "current_cupy_stream",
                  "defer_instance_teardown", "get_portioned_request_size", "is_request_chunkable",
                  "placeholder_dataready", "placeholder_invalidate", "replace_with_chunked_size",
                  "run_instance_teardown", "total_system_ram", "_numba_stream_ptr", "_pinned_host_array",
                  "_ensure_cuda_context", "_WeakCallable"],
    array_requests: ["ArrayRequest", "ArrayResponse"],
    stream_groups: ["StreamGroups"],
    cupy_emm: ["CuPyAsyncNumbaManager", "install_async_emm"],
    chunk_buffer_pool: ["ChunkBufferPool", "PinnedBuffer"],
}

# cubie 0dfe92b4's signatures (owner, name, parameters).
SIGNATURES = [
    ("MemoryManager", "register", "self, instance, proportion=None, invalidate_cache_hook=placeholder_invalidate, "
     "allocation_ready_hook=placeholder_dataready, stream_group='default', owner=None, host_spill_threshold=None, "
     "spill_directory=None"),
    ("MemoryManager", "get_registration", "self, instance"),
    ("MemoryManager", "set_limit_mode", "self, mode"),
    ("MemoryManager", "get_stream", "self, instance"),
    ("MemoryManager", "get_group_stream", "self, group='default'"),
    ("MemoryManager", "change_stream_group", "self, instance, new_group"),
    ("MemoryManager", "reinit_streams", "self"),
    ("MemoryManager", "invalidate_all", "self"),
    ("MemoryManager", "set_manual_proportion", "self, instance, proportion"),
    ("MemoryManager", "set_manual_limit_mode", "self, instance, proportion"),
    ("MemoryManager", "set_auto_limit_mode", "self, instance"),
    ("MemoryManager", "proportion", "self, instance"),
    ("MemoryManager", "cap", "self, instance"),
    ("MemoryManager", "defer_teardown", "self, teardown"),
    ("MemoryManager", "release_instance", "self, instance_id, settings"),
    ("MemoryManager", "begin_work", "self, owner"),
    ("MemoryManager", "end_work", "self, owner, stream"),
    ("MemoryManager", "free", "self, array_label"),
    ("MemoryManager", "free_all", "self"),
    ("MemoryManager", "create_host_array", "self, shape, dtype, memory_type='pinned', like=None, instance=None"),
    ("MemoryManager", "choose_host_memory_type", "self, nbytes, instance, allow_pinned=True"),
    ("MemoryManager", "release_host_array", "self, array"),
    ("MemoryManager", "get_available_memory", "self, group"),
    ("MemoryManager", "get_memory_info", "self"),
    ("MemoryManager", "get_stream_group", "self, instance"),
    ("MemoryManager", "is_grouped", "self, instance"),
    ("MemoryManager", "allocate_all", "self, requests, instance_id, stream, settings=None"),
    ("MemoryManager", "allocate", "self, shape, dtype, memory_type, stream=0"),
    ("MemoryManager", "queue_request", "self, instance, requests"),
    ("MemoryManager", "to_device", "self, instance, from_arrays, to_arrays, stream=None"),
    ("MemoryManager", "from_device", "self, instance, from_arrays, to_arrays, stream=None"),
    ("MemoryManager", "sync_stream", "self, instance, stream=None"),
    ("MemoryManager", "allocate_queue", "self, triggering_instance, stream=None"),
    ("MemoryManager", "get_chunk_parameters", "self, requests, axis_length, stream_group"),
    ("MemoryManager", "compute_chunked_shapes", "self, requests, chunk_size"),
    ("StreamGroups", "add_instance", "self, instance, group"),
    ("StreamGroups", "get_group", "self, instance"),
    ("StreamGroups", "get_group_stream", "self, group='default'"),
    ("StreamGroups", "get_stream", "self, instance"),
    ("StreamGroups", "get_instances_in_group", "self, group"),
    ("StreamGroups", "remove_instance", "self, instance"),
    ("StreamGroups", "change_group", "self, instance, new_group"),
    ("StreamGroups", "reinit_streams", "self"),
    ("ChunkBufferPool", "acquire", "self, array_name, shape, dtype"),
    ("ChunkBufferPool", "release", "self, buffer"),
    ("ChunkBufferPool", "clear", "self"),
    ("InstanceMemorySettings", "add_allocation", "self, key, arr"),
    ("InstanceMemorySettings", "free", "self, key"),
    ("InstanceMemorySettings", "free_all", "self"),
    ("mem_manager", "placeholder_dataready", "response"),
    ("mem_manager", "defer_instance_teardown", "memory_manager, instance_id, settings, cleanups"),
    ("mem_manager", "run_instance_teardown", "memory_manager, instance_id, settings, cleanups"),
    ("mem_manager", "get_portioned_request_size", "requests"),
    ("mem_manager", "is_request_chunkable", "request"),
    ("mem_manager", "replace_with_chunked_size", "shape, axis_index, chunked_size"),
]

OWNERS = {"MemoryManager": MemoryManager, "StreamGroups": stream_groups.StreamGroups,
          "ChunkBufferPool": chunk_buffer_pool.ChunkBufferPool,
          "InstanceMemorySettings": mem_manager.InstanceMemorySettings, "mem_manager": mem_manager}


class Component:
    """A registrant as cubie's are: hooks as bound methods."""

    def __init__(self):
        self.responses = []
        self.invalidated = 0

    def notice_allocation(self, response):
        self.responses.append(response)

    def notice_invalidate(self):
        self.invalidated += 1


class Fixed(MemoryManager):
    """A manager whose device has free bytes free of total (cubie's
    fixture: vram's simulated device is made that size)."""

    device_free, device_total = 4 * MiB, 64 * MiB

    def get_memory_info(self):
        return self.device_free, self.device_total


def fixed(free, total):
    return type("Fixed", (Fixed,), {"device_free": free, "device_total": total})()


def register(m, group="default", proportion=None):
    c = Component()
    m.register(c, proportion=proportion, invalidate_cache_hook=c.notice_invalidate,
               allocation_ready_hook=c.notice_allocation, stream_group=group)
    return c


@cuda.jit
def scale_runs(a, factor):
    # a is (vars, runs of this chunk); a grid-stride loop over the runs.
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for j in range(start, a.shape[1], stride):
        for i in range(a.shape[0]):
            a[i, j] *= factor


class TestLayout(unittest.TestCase):
    def test_names(self):
        for module, names in NAMES.items():
            for name in names:
                self.assertTrue(hasattr(module, name), "%s has no %s" % (module.__name__, name))

    def test_signatures(self):
        for owner, name, want in SIGNATURES:
            with self.subTest("%s.%s" % (owner, name)):
                got = inspect.signature(getattr(OWNERS[owner], name))
                params = [p.strip() for p in want.split(",") if p.strip()]
                self.assertEqual([p.split("=")[0] for p in params], list(got.parameters))
                for p in params:
                    n, _, default = p.partition("=")
                    d = got.parameters[n].default
                    if not default:
                        self.assertIs(d, inspect.Parameter.empty, n)
                    elif default[0] in "'\"0123456789" or default in ("None", "True", "False"):
                        self.assertEqual(d, ast.literal_eval(default), n)
                    else:
                        self.assertEqual(getattr(d, "__name__", None), default, n)

    def test_request_defaults(self):
        r = ArrayRequest(dtype=np.float64)
        self.assertEqual((r.shape, r.memory, r.chunk_axis_index, r.unchunkable, r.total_runs),
                         ((1, 1, 1), "device", 2, False, 1))
        with self.assertRaises(ValueError):
            ArrayRequest(dtype=np.int64)  # cubie's three dtypes
        v = ArrayRequest(dtype=np.float32, shape=(4, 8), chunk_axis_index=None).to_vram()
        self.assertTrue(v.unchunkable)

    def test_default_memmgr(self):
        m = vram.cubie.default_memmgr
        self.assertIsInstance(m, MemoryManager)
        self.assertEqual(m.get_memory_info(), (mem_manager.SIMULATED_FREE, mem_manager.SIMULATED_TOTAL))
        self.assertIsNone(vram.cubie.CuPyAsyncNumbaManager, "no EMM plugin under the simulator, as cubie")


class TestBatch(unittest.TestCase):
    def test_two_components_chunked(self):
        # Two components in one group, 8 MiB of runs on a device with
        # 4 MiB free: vram's manager chunks the group; a kernel per chunk.
        m = fixed(4 * MiB, 64 * MiB)
        a, b = register(m, "solver"), register(m, "solver")
        runs = 1 << 17
        state = np.arange(4 * runs, dtype=np.float64).reshape(4, runs) % 97
        m.queue_request(a, {"state": ArrayRequest(np.float64, shape=(4, runs), chunk_axis_index=1, total_runs=runs)})
        m.queue_request(b, {"out": ArrayRequest(np.float64, shape=(4, runs), chunk_axis_index=1, total_runs=runs)})
        m.allocate_queue(a)
        ra, rb = a.responses[-1], b.responses[-1]
        self.assertGreater(ra.chunks, 1)
        self.assertEqual((rb.chunks, rb.chunk_length), (ra.chunks, ra.chunk_length))
        self.assertEqual(ra.chunked_shapes["state"], (4, ra.chunk_length))
        d_state, d_out = ra.arr["state"], rb.arr["out"]
        stream = m.get_stream(a)
        self.assertIs(stream, m.get_stream(b))
        result = np.zeros_like(state)
        for i in range(ra.chunks):
            lo, hi = i * ra.chunk_length, min((i + 1) * ra.chunk_length, runs)
            chunk = np.ascontiguousarray(state[:, lo:hi])
            view = d_state[:, : hi - lo]
            view.copy_to_device(chunk, stream=stream)
            scale_runs[4, 32, stream](view, 2.0)
            result[:, lo:hi] = view.copy_to_host(stream=stream)
        m.sync_stream(a)
        np.testing.assert_array_equal(result, state * 2)
        self.assertIsNotNone(d_out)

    def test_held_is_vrams(self):
        m = fixed(4 * MiB, 64 * MiB)
        a = register(m, "g")
        m.queue_request(a, {"x": ArrayRequest(np.float32, shape=(1024,), chunk_axis_index=None)})
        m.allocate_queue(a)
        client = m.registry[id(a)].client
        self.assertEqual(client.held, 4096, "the registry's array is the vram client's")
        m.free("x")
        self.assertEqual((client.held, m.registry[id(a)].allocations), (0, {}))
        m.queue_request(a, {"x": ArrayRequest(np.float32, shape=(1024,), chunk_axis_index=None)})
        m.allocate_queue(a)
        m.invalidate_all()
        self.assertEqual((client.held, a.invalidated), (0, 1))


class TestRefusals(unittest.TestCase):
    def test_proportions(self):
        m = fixed(4 * MiB, 64 * MiB)
        keep = [register(m, proportion=0.6)]  # the registry holds instances weakly, as cubie's
        with self.assertRaisesRegex(ValueError, "exceed total available memory"):
            register(m, proportion=0.6)
        self.assertAlmostEqual(m.manual_pool_proportion, 0.6, 12, "a refusal changes nothing")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            keep.append(register(m, proportion=0.37))
        self.assertIn("less than 5%", str(w[-1].message))
        with self.assertRaisesRegex(ValueError, "less than 5%"):
            register(m)
        with self.assertRaisesRegex(ValueError, "Proportion must be between 0 and 1"):
            register(m, proportion=1.5)

    def test_auto_at_exactly_five_percent(self):
        # cubie refuses 0.9 + 0.05 (its float sum rounds above 0.95);
        # vram's pools are exact.
        m = fixed(4 * MiB, 64 * MiB)
        keep = [register(m, proportion=0.9), register(m, proportion=0.05)]
        c = register(m)
        self.assertEqual(len(keep), 2)
        self.assertAlmostEqual(m.proportion(c), 0.05, 12)

    def test_hookless_queue(self):
        m = fixed(4 * MiB, 64 * MiB)
        c = Component()
        m.register(c)
        with self.assertRaisesRegex(ValueError, "invalidate_cache_hook"):
            m.queue_request(c, {"x": ArrayRequest(np.float32)})

    def test_runs_disagree(self):
        # cubie cuts the second to (3, 3, 2); vram refuses the pair.
        m = fixed(4 * MiB, 64 * MiB)
        a, b = register(m, "g"), register(m, "g")
        m.queue_request(a, {"x": ArrayRequest(np.float32, shape=(2, 2, 2), total_runs=2)})
        m.queue_request(b, {"y": ArrayRequest(np.float32, shape=(3, 3, 3), total_runs=3)})
        with self.assertRaisesRegex(ValueError, "same number of runs"):
            m.allocate_queue(a)
        self.assertEqual((a.responses, b.responses), ([], []))


class TestPlanner(unittest.TestCase):
    def test_chunk_parameters(self):
        m = fixed(10 * MiB, 64 * MiB)
        c = register(m)
        big = {id(c): {"arr": ArrayRequest(np.float32, shape=(2, 5_000_000), chunk_axis_index=1,
                                           total_runs=5_000_000)}}
        length, chunks = m.get_chunk_parameters(big, 5_000_000, "default")
        self.assertGreater(chunks, 1)
        self.assertEqual(length, -(-5_000_000 // chunks), "vram's balanced chunks")
        self.assertLessEqual(2 * 4 * length, 10 * MiB)
        small = {id(c): {"arr": ArrayRequest(np.float32, shape=(2, 100), chunk_axis_index=1, total_runs=100)}}
        self.assertEqual(m.get_chunk_parameters(small, 100, "default"), (100, 1))

    def test_refusals(self):
        m = fixed(1024, 100 * 1024)
        c = register(m)
        huge = {id(c): {"huge": ArrayRequest(np.float32, shape=(1000, 1000, 1000), chunk_axis_index=0,
                                             total_runs=1000)}}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with self.assertRaisesRegex(ValueError, "single run") as cm:
                m.get_chunk_parameters(huge, 1000, "default")
        self.assertIn("exceeds available VRAM", str(w[-1].message))
        self.assertIn("vram: ", str(cm.exception), "vram's figures follow")
        fixed_only = {id(c): {"u": ArrayRequest(np.float32, shape=(4096,), chunk_axis_index=None)}}
        with self.assertRaisesRegex(ValueError, "All requested arrays are unchunkable"):
            m.get_chunk_parameters(fixed_only, 1, "default")
        both = {id(c): {"u": ArrayRequest(np.float32, shape=(4096,), chunk_axis_index=None),
                        "c": ArrayRequest(np.float32, shape=(4, 10), total_runs=10, chunk_axis_index=1)}}
        with self.assertRaisesRegex(ValueError, "Unchunkable arrays require"):
            m.get_chunk_parameters(both, 10, "default")


class TestFarTooLarge(unittest.TestCase):
    def test_allocate_queue_warns_first(self):
        # A request more than 20 times the free memory warns before any
        # hook hears of the allocation, whether the free memory comes
        # with the allocation's own call (vram's figures) or from a
        # get_memory_info a subclass replaced; one that cannot fit warns
        # and raises.
        small = mock.patch.multiple(mem_manager, SIMULATED_FREE=1 * MiB, SIMULATED_TOTAL=64 * MiB)
        for name, make in (("vram's figures", MemoryManager), ("a replaced get_memory_info", lambda: fixed(1 * MiB, 64 * MiB))):
            with self.subTest(name), small:
                m = make()
                free = m.get_memory_info()[0]
                self.assertEqual(free, 1 * MiB)
                seen = []
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    c = Component()
                    m.register(c, invalidate_cache_hook=c.notice_invalidate,
                               allocation_ready_hook=lambda r: seen.append(len(w)))
                    runs = 21 * free // 8
                    m.queue_request(c, {"x": ArrayRequest(np.float32, shape=(2, runs), chunk_axis_index=1, total_runs=runs)})
                    m.allocate_queue(c)
                    self.assertEqual(seen, [1], "one warning, before the hook")
                    self.assertIn("exceeds available VRAM", str(w[0].message))
                    m.free("x")  # the chunks took every free byte: no warning with none free, as cubie's
                    m.queue_request(c, {"u": ArrayRequest(np.float32, shape=(runs, 2), chunk_axis_index=None)})
                    with self.assertRaisesRegex(ValueError, "even in chunks"):
                        m.allocate_queue(c)
                    self.assertEqual(len(w), 2, "the refused one warned too")


class TestEviction(unittest.TestCase):
    def test_idle_evicted_busy_kept(self):
        m = fixed(2048, 64 * MiB)
        idle, busy = register(m, "idle"), register(m, "busy")
        for c in (idle, busy):
            m.queue_request(c, {"buf": ArrayRequest(np.float32, shape=(4, 4, 4), total_runs=4)})
            m.allocate_queue(c)
        m.begin_work(busy)
        req = register(m, "req")
        m.queue_request(req, {"big": ArrayRequest(np.float32, shape=(2, 2, 1024), total_runs=1024)})
        m.allocate_queue(req)
        self.assertEqual((m.registry[id(idle)].allocations, idle.invalidated), ({}, 1))
        self.assertTrue(m.registry[id(busy)].allocations)
        self.assertFalse(m.registry[id(busy)].work_complete)
        with self.assertRaises(vram.FreedError):
            m.begin_work(idle)  # its arrays are gone: allocate again first
        self.assertFalse(m.registry[id(idle)].submitting, "a refused begin_work marks nothing")
        m.end_work(busy, m.get_stream(busy))
        self.assertTrue(m.registry[id(busy)].work_complete)


class TestRelease(unittest.TestCase):
    def test_collected_instance_releases(self):
        m = fixed(4 * MiB, 64 * MiB)
        keeper = register(m)
        gone = register(m, proportion=0.5)
        m.queue_request(gone, {"x": ArrayRequest(np.float32, shape=(256,), chunk_axis_index=None)})
        m.allocate_queue(gone)
        client = m.registry[id(gone)].client
        del gone
        gc.collect()
        self.assertEqual(m.manual_pool_proportion, 0.0)
        self.assertNotIn(client, m._vram.clients(), "vram's client closed with its instance")
        self.assertEqual(m.proportion(keeper), 1.0)

    def test_change_group_moves_queue(self):
        m = fixed(4 * MiB, 64 * MiB)
        a, peer = register(m, "a"), register(m, "a")
        m.queue_request(a, {"x": ArrayRequest(np.float32, shape=(16,), chunk_axis_index=None)})
        m.change_stream_group(a, "b")
        m.queue_request(peer, {"y": ArrayRequest(np.float32, shape=(16,), chunk_axis_index=None)})
        m.allocate_queue(peer)
        self.assertEqual(a.responses, [], "the old group's allocation did not take a's queue")
        m.allocate_queue(a)
        self.assertIn("x", a.responses[-1].arr)


if __name__ == "__main__":
    unittest.main()
