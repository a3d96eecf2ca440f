"""The cost of the client API's calls from Python, on vram's simulator, for
BENCHMARKS.md ("The client API from Python"): per call, over 40 rounds of
200 calls each timed with time.perf_counter, the fastest round and the
median, and the process's CPU time per call (time.process_time: every
thread's, the library's included), which a busy machine inflates less than
the wall. Not a test.

    VRAM_LIBRARY=… PYTHONPATH=python python3 python/tests/bench_client.py
"""

import statistics
import time

import numpy as np

import vram

ROUNDS, N = 40, 200


def per_call(fn, n=N):
    walls, cpus = [], []
    for _ in range(ROUNDS):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            fn()
        walls.append((time.perf_counter() - t) / n)
        cpus.append((time.process_time() - c) / n)
    return min(walls), statistics.median(walls), statistics.median(cpus)


def batch_per_chunk(m):
    """vram.Batch's cost per chunk with nothing to do: 64 Ki float32 runs in
    and out in chunks of 256 runs, two buffers (a Batch of the pipeline)."""
    c = m.register("piped", group="piped")
    x, y = np.zeros(1 << 16, np.float32), np.zeros(1 << 16, np.float32)
    b = vram.Batch(buffers=2, max_chunk_length=256)
    b.input(c, "x", x)
    b.output(c, "y", y)
    walls, cpus = [], []
    for _ in range(5):
        t, cpu = time.perf_counter(), time.process_time()
        n = sum(1 for _ in b.chunks())
        walls.append((time.perf_counter() - t) / n)
        cpus.append((time.process_time() - cpu) / n)
    c.close()
    return min(walls), statistics.median(walls), statistics.median(cpus)


def main():
    with vram.Manager("sim:vram=1GiB", arrays="vram") as m:
        c = m.register("bench", group="bench", on_allocated=lambda r: None)
        req = {"x": vram.ArrayRequest((1024,), "float32")}

        def allocate():
            c.queue(req)
            c.allocate().release()

        rows = [("queue + allocate + its event + release", per_call(allocate))]
        host = np.zeros(1024, np.float32)
        c.queue(req)
        x = c.allocate().device_arrays["x"]

        def copy():
            c.to_device(x, host)
            c.from_device(host, x)
            c.sync()

        rows.append(("4 KiB in, out, sync", per_call(copy)))
        rows.append(("4 KiB in, enqueued (no sync)", per_call(lambda: c.to_device(x, host), n=20)))
        c.sync()
        rows.append(("sync, nothing enqueued", per_call(c.sync)))
        rows.append(("poll, nothing queued", per_call(m.poll)))
        rows.append(("client.held (one info call)", per_call(lambda: c.held)))
        try:
            rows.append(("vram.Batch, per chunk of nothing", batch_per_chunk(m)))
        except TypeError:  # a package without Batch(max_chunk_length=...)
            pass
        for name, (lo, med, cpu) in rows:
            print("%-40s wall %8.1f µs (fastest round %.1f), CPU %8.1f µs" % (name, med * 1e6, lo * 1e6, cpu * 1e6))


if __name__ == "__main__":
    main()
