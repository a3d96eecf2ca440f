"""The cost of the client API's calls from Python, on vram's simulator, for
BENCHMARKS.md ("The client API from Python"): per call, the median of 5
rounds of N calls each, timed with time.perf_counter. Not a test.

    VRAM_LIBRARY=… PYTHONPATH=python python3 python/tests/bench_client.py
"""

import statistics
import time

import numpy as np

import vram

N = 2000


def per_call(fn, n=N):
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t) / n)
    return statistics.median(rounds), min(rounds), max(rounds)


def main():
    with vram.Manager("sim:vram=1GiB", arrays="vram") as m:
        c = m.register("bench", group="bench", on_allocated=lambda r: None)
        req = {"x": vram.ArrayRequest((1024,), "float32")}

        def allocate():
            c.queue(req)
            c.allocate().release()

        host = np.zeros(1024, np.float32)
        held = {}

        def copy():
            if "x" not in held:  # the arrays of the latest allocation
                c.queue(req)
                held["r"] = c.allocate()
                held["x"] = held["r"].device_arrays["x"]
            c.to_device(held["x"], host)
            c.from_device(host, held["x"])
            c.sync()

        for name, fn in [("queue + allocate + its event + release", allocate), ("4 KiB in, out, sync", copy),
                         ("poll, nothing queued", m.poll), ("client.held (one info call)", lambda: c.held)]:
            med, lo, hi = per_call(fn)
            print("%-40s %8.1f µs (%.1f–%.1f)" % (name, med * 1e6, lo * 1e6, hi * 1e6))


if __name__ == "__main__":
    main()
