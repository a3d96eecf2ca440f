"""vram.cubie: a drop-in for cubie.memory (ccam80/cubie), served by vram's
Go manager. A cubie user changes one import:

    from vram.cubie import default_memmgr, MemoryManager, current_cupy_stream
    from vram.cubie.array_requests import ArrayRequest, ArrayResponse

The modules are cubie's (mem_manager, array_requests, stream_groups,
cupy_emm, chunk_buffer_pool), with its names, signatures and defaults;
mem_manager's doc says what vram's manager decides and what stays in
Python, and docs/cubie.md where the drop-in and cubie differ and why.
Importing it installs vram's Numba plugin as Numba's memory manager (on a
GPU) and makes default_memmgr, as importing cubie.memory does.
"""

from .cupy_emm import CuPyAsyncNumbaManager, install_async_emm
from .mem_manager import MemoryManager, current_cupy_stream

install_async_emm()

default_memmgr = MemoryManager()

__all__ = ["current_cupy_stream", "CuPyAsyncNumbaManager", "default_memmgr", "MemoryManager"]
