#!/usr/bin/env python3
# One process, cubie's MemoryManager and vram.cubie's side by side: the time
# of queue_request + allocate_queue of one instance's (4, 4, 100) float32
# request, under Numba's CUDA simulator, each manager twice, alternating:
# over 40 rounds of 100 cycles, the median and fastest round's wall time
# per cycle and the median CPU time (time.process_time: every thread's,
# which a busy machine inflates less than the wall). Run from a cubie
# checkout with the import shim, vram's python/ and cubie's src on
# PYTHONPATH, NUMBA_ENABLE_CUDASIM=1 (BENCHMARKS.md, "cubie's tests against
# vram.cubie", has the command). An argument, WARMUP, makes each manager
# run that many cycles untimed first: a process's first few thousand
# cycles through libvram run 2-3x slower while the Go heap first grows to
# its goal (fresh pages; BENCHMARKS.md says how that was found).
import statistics, sys, time
import cubie_sim_shim  # noqa: F401
import numpy as np
from cubie.memory import mem_manager as cm
from vram.cubie import mem_manager as vm


class C:
    def inv(self): pass
    def ready(self, r): pass


WARMUP = int(sys.argv[1]) if len(sys.argv) > 1 else 0


def rounds(mod):
    m = mod.MemoryManager()
    c = C()
    m.register(c, invalidate_cache_hook=c.inv, allocation_ready_hook=c.ready)
    req = {"x": mod.ArrayRequest(np.float32, shape=(4, 4, 100), total_runs=100)}
    for _ in range(WARMUP):
        m.queue_request(c, req)
        m.allocate_queue(c)
    walls, cpus = [], []
    for _ in range(40):
        t, cpu = time.perf_counter(), time.process_time()
        for _ in range(100):
            m.queue_request(c, req)
            m.allocate_queue(c)
        walls.append((time.perf_counter() - t) / 100 * 1e6)
        cpus.append((time.process_time() - cpu) / 100 * 1e6)
    return statistics.median(walls), min(walls), statistics.median(cpus)


for name, mod in (("cubie", cm), ("vram.cubie", vm), ("cubie", cm), ("vram.cubie", vm)):
    print("%-10s %6.0f µs wall (fastest round %.0f), %6.0f µs CPU per queue_request + allocate_queue" % ((name,) + rounds(mod)))
