#!/usr/bin/env python3
# One process, cubie's MemoryManager and vram.cubie's side by side: the time
# of queue_request + allocate_queue of one instance's (4, 4, 100) float32
# request, under Numba's CUDA simulator, median of 5 rounds of 200, each
# manager twice, alternating. Run from a cubie checkout with the import
# shim, vram's python/ and cubie's src on PYTHONPATH, NUMBA_ENABLE_CUDASIM=1
# (BENCHMARKS.md, "cubie's tests against vram.cubie", has the command).
import statistics, sys, time
import cubie_sim_shim  # noqa: F401
import numpy as np
from cubie.memory import mem_manager as cm
from vram.cubie import mem_manager as vm

class C:
    def inv(self): pass
    def ready(self, r): pass

def rounds(mod):
    m = mod.MemoryManager()
    c = C()
    m.register(c, invalidate_cache_hook=c.inv, allocation_ready_hook=c.ready)
    req = {"x": mod.ArrayRequest(np.float32, shape=(4, 4, 100), total_runs=100)}
    out = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200):
            m.queue_request(c, req)
            m.allocate_queue(c)
        out.append((time.perf_counter() - t) / 200 * 1e6)
    return statistics.median(out)

for name, mod in (("cubie", cm), ("vram.cubie", vm), ("cubie", cm), ("vram.cubie", vm)):
    print("%-10s %.0f µs per queue_request + allocate_queue" % (name, rounds(mod)))
