"""A Python program that leases through vram.open_lease and forks (as
multiprocessing's default start method does on Linux): it allocates 1 MiB
through the lease, forks a child that sleeps without exec, prints
"parent=PID child=PID" and waits to be killed. libvram's
TestForkedChildDropsLease kills the parent and watches the broker.

    PYTHONPATH=python python3 forklease.py SPEC SOCKET
"""

import os
import sys
import time

import vram

m = vram.open_lease(sys.argv[1], sys.argv[2], name="forklease")
m.alloc(1 << 20)
child = os.fork()
if child == 0:
    while True:
        time.sleep(60)
print("parent=%d child=%d" % (os.getpid(), child), flush=True)
while True:
    time.sleep(60)
