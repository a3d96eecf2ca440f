"""pytest plugin: cubie's modules cubie.memory and cubie.memory.{mem_manager,
array_requests, stream_groups, cupy_emm, chunk_buffer_pool} served by
vram.cubie's, so that cubie's own tests/memory, unmodified, test the
drop-in. Load it after the import shim that lets cubie's source import
here: -p cubie_sim_shim -p vram_cubie_plugin (scripts/cubie-suite.sh).
"""

import importlib
import sys

_MODULES = ("mem_manager", "array_requests", "stream_groups", "cupy_emm", "chunk_buffer_pool")

drop_in = importlib.import_module("vram.cubie")
sys.modules["cubie.memory"] = drop_in
for _name in _MODULES:
    sys.modules["cubie.memory." + _name] = importlib.import_module("vram.cubie." + _name)
if "cubie" in sys.modules:
    sys.modules["cubie"].memory = drop_in

# cubie's tests that fail against vram.cubie on purpose, by node id (less
# parameters), with why: each is marked xfail(strict), so the run says why
# it fails and fails if it starts to pass. docs/cubie.md has the list.
EXPECTED_FAILURES = {
    "tests/memory/test_memmgmt.py::TestMemoryManager::test_allocate_queue_multiple_instances_group_limit":
        "Runs (the Go package doc's table of differences): the group's requests have 2 and 3 runs; cubie plans "
        "with the first's 2 and cuts (3, 3, 3) to (3, 3, 2), which a kernel over 3 runs overruns; vram refuses "
        "the pair (ValueError naming both) and allocates nothing",
}


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        why = EXPECTED_FAILURES.get(item.nodeid.split("[")[0])
        if why is not None:
            item.add_marker(pytest.mark.xfail(reason=why, strict=True))
