"""vram's client API in Python (vram.client, vram.batch) on vram's
simulator: clients, stream groups, requests, a batch chunked to fit, the
copies from and into NumPy arrays, hooks on the calling thread, work marks,
host arrays, errors. Run by libvram's Go tests (TestPython), or by hand:
VRAM_LIBRARY=… PYTHONPATH=python python3 -m unittest discover -s python/tests.
Under Numba's CUDA simulator, test_cudasim.py runs Numba kernels on the
same arrays.
"""

import gc
import subprocess
import sys
import threading
import unittest

try:
    import numpy as np
except ImportError:  # pragma: no cover - reported as a skip
    np = None

import vram
from vram import _lib

MiB = 1 << 20
KiB = 1 << 10


@unittest.skipIf(np is None, "numpy not importable")
class ClientTest(unittest.TestCase):
    """A fresh simulated device 0 of 16 MiB, whose arrays stay vram's."""

    spec = "sim:vram=16MiB"

    def setUp(self):
        self.m = vram.Manager(self.spec, arrays="vram")
        self.addCleanup(self.close)

    def close(self):
        gc.collect()  # responses of a failed test
        self.m.close()


class TestChunkedBatch(ClientTest):
    def test_two_members_chunked(self):
        # 12 MiB of float32 each way on a 16 MiB device: chunked, each
        # member's arrays at the chunk length, every run through the device.
        runs = 3 * MiB
        seen = []
        inp = self.m.register("in", group="solver", on_allocated=lambda r: seen.append(("in", r, threading.get_ident())))
        out = self.m.register("out", group="solver", on_allocated=lambda r: seen.append(("out", r, threading.get_ident())))
        inp.queue({"x": vram.ArrayRequest((runs,), "float32")})
        out.queue({"y": {"shape": (runs,), "dtype": np.float32}})
        r = out.allocate()
        plan = r.plan
        self.assertGreaterEqual(plan.chunks, 2)
        self.assertEqual(plan.total_runs, runs)
        self.assertEqual(plan.chunks * plan.chunk_length - plan.chunk_length + plan.last_chunk_length, runs)
        self.assertEqual([(w, t) for w, _, t in seen], [("in", threading.get_ident()), ("out", threading.get_ident())],
                         "each member's on_allocated, in id order, on the allocating thread")
        self.assertIs(inp.response, seen[0][1])
        ri = r.member(inp)
        x, y = ri.device_arrays["x"], r.device_arrays["y"]
        self.assertEqual((x.shape, x.dtype, x.memory, x.chunk_axis, x.nbytes), ((plan.chunk_length,), "float32", "device", 0,
                                                                                 4 * plan.chunk_length))
        self.assertEqual(r.chunked_shapes, {"y": (plan.chunk_length,)})
        self.assertEqual(plan.chunked_shapes["in#%d" % inp.id], {"x": (plan.chunk_length,)})
        self.assertEqual(ri.arrays["x"].ptr, x.ptr, "arrays are the DeviceArrays when arrays='vram'")

        hx = np.arange(runs, dtype=np.float32)
        hy = np.zeros(runs, dtype=np.float32)
        for i in range(plan.chunks):
            sp = r.span(i, 0)
            self.assertEqual(r.chunk(i), (sp.start, sp.len))
            inp.to_device(x, hx, sp)
            inp.sync()
            y.host_view()[:sp.len] = 2 * x.host_view()[:sp.len]  # the chunk's kernel, on the simulated memory
            out.from_device(hy, y, sp)
        out.sync()
        np.testing.assert_array_equal(hy, 2 * hx)

class TestPipeline(ClientTest):
    """vram.Batch through the Go pipeline on the simulator, its "kernels" on
    the host over the simulated memory (host_view): the order it keeps is
    judged by what the memory holds, never by time."""

    runs = 3 * MiB  # 12 MiB of float32 each for x and y on 16 MiB: several chunks

    def batch(self, buffers):
        inp, out = self.m.register("in", group="b"), self.m.register("out", group="b")
        x = np.arange(self.runs, dtype=np.float32) % 977
        y = np.zeros(self.runs, np.float32)
        k = np.array([3.0], np.float32)
        b = vram.Batch(buffers=buffers)
        b.input(inp, "x", x)
        b.output(out, "y", y)
        b.inout(inp, "k", k, unchunkable=True)
        return b, inp, x, y, k

    def test_order(self):
        # For 1, 2 and 3 buffers: each chunk's input buffer holds the
        # chunk's runs when it is handed over (its copy in completed before
        # the kernel reads it), and still does once every copy enqueued
        # so far has completed (no copy in overwrote a buffer whose kernel
        # had not finished); consecutive chunks use other buffers; every
        # output comes back, the in-out k once, at the end.
        for buffers in (1, 2, 3):
            with self.subTest(buffers=buffers):
                b, inp, x, y, k = self.batch(buffers)
                seen, first = [], 0
                for ch in b.chunks():
                    dx = ch["x"].host_view()[:ch.runs]
                    np.testing.assert_array_equal(dx, x[ch.slice], "chunk %d handed over before its copy in" % ch.index)
                    dk = ch["k"].host_view()
                    ch["y"].host_view()[:ch.runs] = dk[0] * dx
                    if ch.index == 0:
                        dk[0] += 1
                        first = ch.runs
                    inp.sync()  # every copy enqueued on the group's stream so far
                    np.testing.assert_array_equal(ch["x"].host_view()[:ch.runs], x[ch.slice],
                                                  "chunk %d's input overwritten before its kernel ended" % ch.index)
                    self.assertFalse(inp.idle, "the batch's clients are busy while it runs")
                    seen.append((ch.buffer, ch["x"].ptr, ch.start, ch.runs))
                rep = b.report
                self.assertEqual((rep.chunks, rep.chunks_done, rep.buffers), (len(seen), len(seen), buffers))
                self.assertGreater(len(seen), buffers)
                self.assertEqual([s for _, _, s, _ in seen], [sum(n for *_, n in seen[:i]) for i in range(len(seen))])
                self.assertEqual(len({p for _, p, _, _ in seen}), buffers, "one buffer of x per buffer in flight")
                for (b0, p0, _, _), (b1, p1, _, _) in zip(seen, seen[1:]):
                    self.assertTrue(buffers == 1 or (b0 != b1 and p0 != p1), "consecutive chunks in one buffer")
                want = 4 * x
                want[:first] = 3 * x[:first]
                np.testing.assert_array_equal(y, want)
                self.assertEqual(k[0], 4.0, "k copied out once, after the last chunk")
                self.assertEqual(rep.bytes_out, 4 * self.runs + 4)
                self.assertTrue(inp.idle)
                self.assertEqual((inp.held, b.plan.buffers), (0, buffers), "the batch's arrays are freed when it ends")
                inp.close()
                self.m.clients()[0].close()

    def test_break_stops_it(self):
        b, inp, x, y, _ = self.batch(2)
        for ch in b.chunks():
            if ch.index == 1:
                break
        self.assertEqual((inp.held, inp.idle), (0, True), "stopped: its arrays freed, its clients idle")
        self.assertIsNone(b.report)
        b.run(lambda ch: ch["y"].host_view().__setitem__(slice(0, ch.runs), ch["x"].host_view()[:ch.runs]))
        np.testing.assert_array_equal(y, x, "the same batch runs again, allocated afresh")

    def test_recut_for_a_claim(self):
        # Another group's allocation that only the batch's memory would
        # fit fails and claims it; the batch gives it back at its next
        # chunk boundary: shorter chunks, re-allocated, every run right.
        b, inp, x, y, _ = self.batch(2)
        other = self.m.register("other", group="other")
        other.queue({"big": vram.ArrayRequest((3 * MiB,), "float32", unchunkable=True)})  # 12 MiB
        lengths = []
        for ch in b.chunks():
            if ch.index == 1:
                with self.assertRaisesRegex(vram.OutOfMemoryError, "claims"):
                    other.allocate()
            lengths.append(ch.chunk_length)
            ch["y"].host_view()[:ch.runs] = 2 * ch["x"].host_view()[:ch.runs]
        np.testing.assert_array_equal(y, 2 * x)
        self.assertTrue(b.report.recuts, "a re-cut: %r" % (b.report,))
        self.assertLess(lengths[-1], lengths[0], "shorter chunks after the claim: %s" % lengths)
        other.allocate()  # the claim is met now

    def test_refusals(self):
        a, c = self.m.register("a", group="one"), self.m.register("c", group="two")
        b = vram.Batch()
        b.input(a, "x", np.zeros(8, np.float32))
        with self.assertRaisesRegex(vram.InvalidArgumentError, "declared twice"):
            b.output(a, "x", np.zeros(8, np.float32))
        with self.assertRaisesRegex(vram.InvalidArgumentError, "of stream group 'two'"):
            b.output(c, "y", np.zeros(8, np.float32))
        with self.assertRaisesRegex(vram.InvalidArgumentError, "C-contiguous"):
            b.output(a, "z", np.zeros((8, 2), np.float32).T)
        with self.assertRaisesRegex(vram.InvalidArgumentError, "1 to 3"):
            vram.Batch(buffers=4)
        with self.assertRaisesRegex(AttributeError, "Batch.plan"):
            b.response

    def test_pinned_host_arrays(self):
        # Host arrays of Manager.host_array are copied from directly: no
        # staging; any other NumPy array is staged.
        a = self.m.register("a", group="p")
        x = self.m.host_array((self.runs,), "float32", like=np.arange(self.runs, dtype=np.float32))
        y = np.zeros(self.runs, np.float32)
        b = vram.Batch()
        b.input(a, "x", x)
        b.output(a, "y", y)
        b.run(lambda ch: ch["y"].host_view().__setitem__(slice(0, ch.runs), ch["x"].host_view()[:ch.runs] + 1))
        np.testing.assert_array_equal(y, x + 1)
        self.assertEqual(b.report.staged, 1, "y staged, x copied from directly")


class TestHooks(ClientTest):
    def test_invalidate_and_evict(self):
        got = []
        a = self.m.register("a", group="A", on_invalidate=got.append)
        b = self.m.register("b", group="B", on_invalidate=got.append)
        a.queue({"x": vram.ArrayRequest((2 * MiB,), "float32")})  # 8 MiB
        ra = a.allocate()
        b.queue({"y": vram.ArrayRequest((3 * MiB,), "float32", unchunkable=True)})  # 12 MiB: a's are evicted
        b.allocate()
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], vram.FreedError)
        self.assertTrue(got[0].evicted)
        self.assertTrue(a.evicted)
        self.assertTrue(ra.device_arrays["x"].freed)
        with self.assertRaises(vram.FreedError):
            a.begin_work()
        with self.assertRaises(vram.FreedError):
            a.to_device(ra.device_arrays["x"], np.zeros(2 * MiB, np.float32))
        got.clear()
        self.m.invalidate_all()
        self.assertEqual([e.evicted for e in got], [False, False])
        self.assertIn("freed", str(got[0]))

    def test_hook_error_after_delivery(self):
        # A hook's exception is raised by the call that delivered it, once
        # the other events are delivered too.
        calls = []

        def boom(r):
            calls.append("boom")
            raise KeyError("from the hook")

        # The requester's hook comes before the notary's (the Go
        # manager's order); the requester's raises.
        self.m.register("a", group="g", on_allocated=lambda r: calls.append("a"))
        c = self.m.register("c", group="g", on_allocated=boom)
        c.queue({"v": vram.ArrayRequest((16,), "int32")})
        with self.assertRaisesRegex(KeyError, "from the hook"):
            c.allocate()
        self.assertEqual(calls, ["boom", "a"])
        self.assertIsNotNone(c.response)

    def test_call_error_wins_over_hook_error(self):
        # A failed allocation delivers the events queued before it; a hook's
        # exception then rides on the allocation's error as its context.
        def boom(r):
            raise KeyError("from the hook")

        a = self.m.register("a", group="g", on_allocated=boom)
        a.queue({"v": vram.ArrayRequest((16,), "int32")})
        vram.client.ArrayResponse(a, _raw_allocate(a)).release()  # an event no call has polled
        c = self.m.register("c", group="h")
        c.queue({"huge": vram.ArrayRequest((1 << 30,), "float32", unchunkable=True)})
        with self.assertRaises(vram.OutOfMemoryError) as e:
            c.allocate()
        self.assertIsInstance(e.exception.__context__, KeyError)

    def test_poll_for_other_threads(self):
        # Events another thread's call caused wait for a poll; hooks run on
        # the polling thread.
        ran = []
        a = self.m.register("a", group="g", on_allocated=lambda r: ran.append(threading.get_ident()))
        a.queue({"v": vram.ArrayRequest((16,), "int32")})
        err = []

        def alloc():
            try:
                vram.client.ArrayResponse(a, _raw_allocate(a)).release()
            except Exception as e:  # pragma: no cover
                err.append(e)

        t = threading.Thread(target=alloc)
        t.start()
        t.join()
        self.assertEqual(err, [])
        self.assertEqual(ran, [])
        self.assertEqual(self.m.poll(), 1)
        self.assertEqual(ran, [threading.get_ident()])
        self.assertEqual(self.m.poll(), 0)


class TestQueueAllocate(ClientTest):
    def test_own_event_in_order(self):
        # allocate delivers the client's own event first when it heads the
        # queue; behind an older event of the client's (an allocation no
        # call polled), it waits its turn.
        got = []
        a = self.m.register("a", group="g", on_allocated=got.append)
        a.queue({"v": vram.ArrayRequest((16,), "int32")})
        older = _raw_allocate(a)
        r = a.queue_allocate({"v": vram.ArrayRequest((32,), "int32")})
        self.assertEqual(len(got), 2)
        self.assertNotEqual(got[0].id, r.id, "the older event first")
        self.assertIs(got[1], r)
        self.assertEqual(r.device_arrays["v"].shape, (32,))
        vram.client._release_response(older)
        got.clear()
        r = a.queue_allocate({"v": vram.ArrayRequest((8,), "int32")})
        self.assertEqual(got, [r])
        self.assertIs(a.response, r)
        self.assertEqual(self.m.poll(), 0, "no event left behind")

    def test_same_as_queue_then_allocate(self):
        # queue_allocate gives what queue and allocate give; a refused queue
        # allocates nothing and leaves the arrays before.
        a = self.m.register("a", group="g", on_allocated=lambda r: None)
        reqs = {"x": vram.ArrayRequest((4, 1000), "float32", chunk_axis=1),
                "p": vram.ArrayRequest((8,), "float64", memory="pinned", unchunkable=True)}
        r1 = a.queue_allocate(reqs)
        a.queue(reqs)
        r2 = a.allocate()
        for r in (r1, r2):
            self.assertEqual((r.plan.chunks, sorted(r.device_arrays), sorted(r.host)), (1, ["x"], ["p"]))
            self.assertEqual(r.device_arrays["x"].shape, (4, 1000))
            self.assertEqual(r.host["p"].shape, (8,))
        with self.assertRaises(vram.InvalidArgumentError):
            a.queue_allocate({"x": {"shape": (4, 1000), "dtype": "float32", "chunk_axis": 1, "total_runs": 7}})
        self.assertIs(a.response, r2)
        self.assertFalse(r2.device_arrays["x"].freed)
        x = np.arange(4000, dtype=np.float32).reshape(4, 1000)
        a.to_device(r2.device_arrays["x"], x)
        back = np.zeros_like(x)
        a.from_device(back, r2.device_arrays["x"])
        a.sync()
        np.testing.assert_array_equal(back, x)

    def test_many_arrays_and_threads(self):
        # More arrays than the reused structs hold, then allocations of one
        # client from two threads at once: each gets its own response whole
        # (a queue and an allocation are two steps: one thread's allocation
        # may take the other's queue, and the other's then finds none and
        # gets the plan alone).
        a = self.m.register("a", group="g", on_allocated=lambda r: None)
        many = {"a%d" % i: vram.ArrayRequest((16,), "float32") for i in range(9)}
        r = a.queue_allocate(many)
        self.assertEqual(sorted(r.device_arrays), sorted(many))
        self.assertEqual(sorted(a.queue_allocate(many).device_arrays), sorted(many))
        errs, shapes = [], []

        def run(n):
            try:
                for _ in range(50):
                    r = a.queue_allocate({"x": vram.ArrayRequest((n,), "float32")})
                    self.assertEqual(len(r.device_arrays), r._arrays_n)
                    shapes.extend(d.shape for d in r.device_arrays.values())
            except Exception as e:  # pragma: no cover
                errs.append(e)

        ts = [threading.Thread(target=run, args=(n,)) for n in (64, 128)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errs, [])
        self.assertLessEqual(set(shapes), {(64,), (128,)})
        self.assertGreaterEqual(len(shapes), 50)


def _raw_allocate(c):
    """An allocation through the library alone, without the package's poll."""
    out = _lib.ctypes.c_int64()
    _lib.check(_lib.lib().vram_allocate(c.handle, 0, _lib.ctypes.byref(out)))
    return out.value


class TestClient(ClientTest):
    def test_shares_groups_and_figures(self):
        a = self.m.register("a", group="g", proportion=0.25)
        b = self.m.register("b", group="g")
        free, total = self.m.mem_info()
        self.assertEqual(total, 16 * MiB)
        self.assertEqual((a.proportion, a.cap, b.proportion), (0.25, 4 * MiB, 0.75))
        self.assertEqual(self.m.shares, vram.Shares(0.25, 0.75, 16 * MiB))
        self.assertTrue(a.grouped)
        self.assertEqual(self.m.group_members("g"), [a, b])
        with self.assertRaisesRegex(vram.InvalidArgumentError, "proportion") as e:
            b.set_manual_proportion(0.9)
        self.assertIsInstance(e.exception, ValueError)
        self.assertEqual(b.proportion, 0.75, "a refusal changes nothing")
        a.set_auto_limit_mode()
        self.assertEqual(self.m.shares.auto, 1.0)
        b.change_stream_group("h")
        self.assertEqual((b.group, self.m.group_members("g")), ("h", [a]))
        self.assertNotEqual(a.stream, 0)
        with a.begin_work():
            self.assertFalse(a.idle)
        self.assertTrue(a.idle)
        self.m.set_limit_mode("active")
        with self.assertRaises(vram.InvalidArgumentError):
            self.m.set_limit_mode("eager")
        with b:
            pass
        self.assertEqual(self.m.clients(), [a])

    def test_host_arrays(self):
        c = self.m.register("c")
        c.queue({"p": vram.ArrayRequest((4, 3), "float64", memory="pinned", unchunkable=True),
                 "q": vram.ArrayRequest((5,), "uint8", memory="pageable", unchunkable=True)})
        r = c.allocate()
        p, q = r.host["p"], r.host["q"]
        self.assertEqual((p.shape, p.dtype, q.shape, q.dtype), ((4, 3), np.float64, (5,), np.uint8))
        self.assertEqual(r.device_arrays, {})
        p[...] = 7
        self.assertTrue((r.host["p"] == 7).all(), "host arrays are views of the response's memory")
        h = self.m.host_array((2, 3), "int32", like=[1, 2, 3])
        np.testing.assert_array_equal(h, [[1, 2, 3], [1, 2, 3]])
        self.m.free_host(h)
        with self.assertRaises(vram.InvalidArgumentError):
            self.m.free_host(np.zeros(3))
        with self.assertRaises(vram.InvalidArgumentError):
            self.m.host_array(3, "float32", memory="device")

    def test_a_request_queued_again(self):
        # A request keeps the C struct it was queued as, per label: queued
        # under two labels, then again, each array has its own label; the
        # struct stays out of pickle and copy.
        import copy
        import pickle

        c = self.m.register("c")
        r = vram.ArrayRequest((4, 8), "float32", chunk_axis=1)
        for _ in range(2):
            c.queue({"a": r, "b": r})
            self.assertEqual(sorted(c.allocate().device_arrays), ["a", "b"])
        c.queue({"b": r})
        self.assertEqual(sorted(c.allocate().device_arrays), ["b"])
        for twin in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r), copy.copy(r)):
            self.assertEqual(twin, r)
            c.queue({"t": twin})
            self.assertEqual(c.allocate().device_arrays["t"].shape, (4, 8))

    def test_copies_check_their_arrays(self):
        c = self.m.register("c")
        c.queue({"x": vram.ArrayRequest((4, 8), "float32", chunk_axis=1)})
        r = c.allocate()
        x = r.device_arrays["x"]
        self.assertEqual(x.__cuda_array_interface__,
                         {"shape": (4, 8), "typestr": "<f4", "data": (x.ptr, False), "strides": None, "version": 3})
        full = np.arange(4 * 20, dtype=np.float32).reshape(4, 20)
        c.to_device(x, full, vram.Span(1, 12, 8))
        c.sync()
        np.testing.assert_array_equal(x.host_view(), full[:, 12:20])
        for bad, err in [(np.zeros((8, 4), np.float32), vram.InvalidArgumentError),
                         (np.zeros((4, 8), np.float64), vram.InvalidArgumentError),
                         (np.zeros((4, 8), np.float16), vram.InvalidArgumentError),
                         ([0.0] * 32, TypeError)]:
            with self.assertRaises(err, msg=repr(bad)):
                c.to_device(x, bad)
        with self.assertRaisesRegex(vram.InvalidArgumentError, "runs \\[18, 26\\)"):
            c.to_device(x, full, vram.Span(1, 18, 8))
        with self.assertRaisesRegex(vram.InvalidArgumentError, "writable"):
            ro = np.zeros((4, 8), np.float32)
            ro.flags.writeable = False
            c.from_device(ro, x)

    def test_errors_carry_the_go_text(self):
        c = self.m.register("c")
        c.queue({"huge": vram.ArrayRequest((1 << 30,), "float32", unchunkable=True)})
        with self.assertRaisesRegex(vram.OutOfMemoryError, "4 GiB.*cannot be chunked") as e:
            c.allocate()
        self.assertIsInstance(e.exception, MemoryError)
        with self.assertRaisesRegex(vram.InvalidArgumentError, "float16"):
            vram.ArrayRequest((4,), "float16")
        with self.assertRaisesRegex(vram.VramError, "managed .* not supported") as e:
            c.queue({"m": vram.ArrayRequest((4,), "float32", memory="managed")})
        self.assertEqual(e.exception.status, _lib.ENOTSUP)
        with self.assertRaisesRegex(vram.InvalidArgumentError, "nothing queued"):
            c.queue({})
            c.allocate()
        c.close()
        with self.assertRaisesRegex(vram.VramError, "closed"):
            c.queue({"x": vram.ArrayRequest((4,), "float32")})


class TestResponses(ClientTest):
    def test_one_object_per_response(self):
        # The response allocate returns, the on_allocated argument and
        # member's are one object per client and allocation, described once.
        got = []
        a = self.m.register("a", group="g", on_allocated=got.append)
        b = self.m.register("b", group="g", on_allocated=got.append)
        a.queue({"x": vram.ArrayRequest((64,), "float32")})
        r = a.allocate()
        self.assertEqual(len(got), 2)
        self.assertIs(got[0], r)
        self.assertIs(a.response, r)
        self.assertIs(r.member(b), got[1])
        self.assertIs(r.member(a), r)
        self.assertNotEqual(r.id, got[1].id)
        self.assertEqual(got[1].device_arrays, {}, "b queued nothing: the plan alone")
        self.assertEqual(got[1].plan, r.plan)
        r2 = a.allocate()  # nothing queued: the plan again, in new responses
        self.assertIsNot(r2, r)
        self.assertEqual(r2.plan, r.plan)
        self.assertIs(got[2], r2)

    def test_dropped_response_released_at_once(self):
        # A response whose arrays were described (and viewed) is in no
        # reference cycle: dropping it releases its handle at once, without
        # the cyclic collector (it took a collection before).
        c = self.m.register("c")
        c.queue({"x": vram.ArrayRequest((64,), "float32"),
                 "p": vram.ArrayRequest((4,), "float32", memory="pinned", unchunkable=True)})
        gc.disable()
        try:
            r = c.allocate()
            h = r.handle
            r.device_arrays["x"].host_view()[0] = 1
            r.host["p"][0] = 2
            self.assertEqual(r.plan.chunks, 1)
            view = r.device_arrays["x"].host_view()
            del r
            c.response = None
            p = vram._capi.Plan(size=_lib.ctypes.sizeof(vram._capi.Plan))
            self.assertEqual(_lib.lib().vram_response_plan(h, _lib.ctypes.byref(p)), _lib.OK, "a view keeps the handle")
            del view
            self.assertEqual(_lib.lib().vram_response_plan(h, _lib.ctypes.byref(p)), _lib.EHANDLE, "released once dropped")
        finally:
            gc.enable()

    def test_plan_shapes_on_demand(self):
        c = self.m.register("c", group="g")
        c.queue({"x": vram.ArrayRequest((4, 5 * MiB), "float32", chunk_axis=1)})  # 80 MiB on 16: chunked
        r = c.allocate()
        plan = r.plan
        n = plan.chunk_length
        self.assertGreater(plan.chunks, 1)
        self.assertEqual(plan.chunked_shapes, {"c#%d" % c.id: {"x": (4, n)}})
        self.assertEqual(plan.bytes_per_chunk, plan.unchunkable_bytes + plan.buffers * plan.chunk_bytes)
        self.assertIsNone(r.free_error)
        again = vram.ChunkPlan(*plan)
        self.assertEqual(again, plan, "plans are equal when their figures are")
        self.assertEqual(again.chunked_shapes, {}, "a plan made by hand knows no shapes")
        with self.assertRaises(AttributeError):
            plan.chunks = 1
        r2 = c.allocate()
        r2.release()
        with self.assertRaisesRegex(vram.VramError, "released"):
            r2.plan.chunked_shapes

    def test_closed(self):
        # Client.closed answers for a closed client (it raised VramError).
        c, d = self.m.register("c"), self.m.register("d")
        self.assertFalse(c.closed)
        c.close()
        self.assertTrue(c.closed)
        self.m.close()
        self.assertTrue(d.closed, "closed with its manager")
        self.m = vram.Manager(self.spec, arrays="vram")  # for tearDown


class TestPackage(unittest.TestCase):
    def test_lazy_submodules(self):
        # vram.cubie and vram.numba_mlir are reached as the others are.
        self.assertTrue({"cubie", "numba_mlir", "numba", "cupy", "torch", "batch", "Batch"} <= set(dir(vram)))
        if np is not None:  # in a process of its own: vram.cubie opens the process's manager of device 0
            code = "import vram; print(vram.cubie.__name__, vram.cubie.default_memmgr.__class__.__name__)"
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            self.assertEqual(out.stdout.strip(), "vram.cubie MemoryManager", out.stderr)
        with self.assertRaisesRegex(AttributeError, "no attribute 'nope' \\(its submodules: .*numba_mlir"):
            vram.nope


@unittest.skipIf(np is None, "numpy not importable")
class TestManagerLifetime(unittest.TestCase):
    def test_close_closes_what_the_client_api_holds(self):
        with vram.Manager("sim:vram=16MiB") as m:
            c = m.register("c")
            c.queue({"x": vram.ArrayRequest((64,), "float32")})
            r = c.allocate()
            h = m.host_array(8)
        with self.assertRaises(vram.VramError):
            r.span(0, 0)  # the response's handle went with the manager
        self.assertEqual(m.clients(), [])
        r.release()
        del h
        gc.collect()


if __name__ == "__main__":
    unittest.main()
