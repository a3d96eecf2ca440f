"""Check that a pickle has the structure PyTorch's memory visualizer reads.

Usage: python3 check_snapshot.py SNAPSHOT.pickle ALLOCS FREES
Standard library only. Prints "ok" or raises with what is wrong.
"""
import pickle
import sys

path, want_allocs, want_frees = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "rb") as f:
    snap = pickle.load(f)
assert isinstance(snap, dict), type(snap)
for key in ("segments", "device_traces"):
    assert key in snap, "no %r key" % key

SEG_KEYS = {"address", "total_size", "stream", "segment_type", "allocated_size", "active_size", "blocks"}
segs = snap["segments"]
assert isinstance(segs, list) and segs, "segments: want a non-empty list"
prev_end = 0
for i, s in enumerate(segs):
    missing = SEG_KEYS - set(s)
    assert not missing, "segment %d lacks %s" % (i, sorted(missing))
    assert s["segment_type"] in ("small", "large"), s["segment_type"]
    assert s["address"] >= prev_end, "segment %d overlaps the one before" % i
    prev_end = s["address"] + s["total_size"]
    at, allocated = s["address"], 0
    for j, b in enumerate(s["blocks"]):
        for k in ("size", "requested_size", "state", "address", "frames"):
            assert k in b, "segment %d block %d lacks %r" % (i, j, k)
        assert b["address"] == at, "segment %d block %d at %#x, want %#x" % (i, j, b["address"], at)
        assert b["state"] in ("active_allocated", "inactive"), b["state"]
        assert b["size"] > 0
        at += b["size"]
        if b["state"] == "active_allocated":
            allocated += b["size"]
    assert at == s["address"] + s["total_size"], "segment %d: blocks do not cover it" % i
    assert s["allocated_size"] == allocated == s["active_size"], "segment %d: allocated_size" % i

traces = snap["device_traces"]
assert isinstance(traces, list) and len(traces) == 1, "device_traces: want one device's list"
TRACE_KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}
counts = {}
live = {}
last = 0
for i, e in enumerate(traces[0]):
    missing = TRACE_KEYS - set(e)
    assert not missing, "entry %d lacks %s" % (i, sorted(missing))
    a = e["action"]
    counts[a] = counts.get(a, 0) + 1
    assert e["time_us"] >= last, "entry %d goes back in time" % i
    last = e["time_us"]
    if a == "alloc":
        assert e["addr"] not in live, "entry %d: %#x allocated twice" % (i, e["addr"])
        live[e["addr"]] = e["size"]
    elif a == "free_completed":
        assert live.pop(e["addr"]) == e["size"], "entry %d: free of another size" % i
    else:
        assert a in ("free_requested", "segment_alloc", "segment_free", "segment_map", "segment_unmap"), a
allocated_at_end = sum(s["allocated_size"] for s in segs)
assert allocated_at_end == sum(live.values()), "blocks live at the end are not all in segments"
assert counts.get("alloc", 0) == want_allocs, "allocs %d, want %d" % (counts.get("alloc", 0), want_allocs)
assert counts.get("free_completed", 0) == want_frees, "frees %d, want %d" % (counts.get("free_completed", 0), want_frees)
assert counts.get("segment_alloc", 0) + counts.get("segment_map", 0) >= 1, "no segment_alloc or segment_map"
expandable = counts.get("segment_map", 0) > 0
assert snap.get("allocator_settings", {}).get("expandable_segments") == expandable, "allocator_settings"
for i, s in enumerate(segs):
    assert s.get("is_expandable") == expandable, "segment %d: is_expandable %r" % (i, s.get("is_expandable"))
print("ok")
