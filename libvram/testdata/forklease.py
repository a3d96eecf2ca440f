"""A Python program that leases through vram.open_lease and forks, by
os.fork or by multiprocessing's "fork" start method (its default on Linux
before Python 3.14): it allocates 1 MiB through the lease, starts a child
that sleeps without exec, prints "parent=PID child=PID" and waits to be
killed. libvram's TestForkedChildDropsLease kills the parent and watches
the broker.

    PYTHONPATH=python python3 forklease.py os.fork|multiprocessing SPEC SOCKET
"""

import multiprocessing
import os
import sys
import time

import vram


def sleep():
    while True:
        time.sleep(60)


how, spec, socket = sys.argv[1:4]
m = vram.open_lease(spec, socket, name="forklease")
m.alloc(1 << 20)
if how == "multiprocessing":
    p = multiprocessing.get_context("fork").Process(target=sleep, daemon=False)
    p.start()
    child = p.pid
else:
    child = os.fork()
    if child == 0:
        sleep()
print("parent=%d child=%d" % (os.getpid(), child), flush=True)
sleep()
