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
