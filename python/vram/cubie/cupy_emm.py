"""cubie.memory.cupy_emm, served by vram: CuPyAsyncNumbaManager, Numba's
EMM plugin, and install_async_emm, which makes it Numba's memory manager.

cubie's plugin allocates Numba's device arrays from CuPy's
stream-ordered pool; this one allocates them from vram's pool and budget
(vram.numba's plugin, or vram.numba_mlir's under numba-cuda-mlir), ordered
on the stream of the innermost current_cupy_stream (vram.stream) of the
thread. Under Numba's CUDA simulator there is no device to manage:
CuPyAsyncNumbaManager is None and install_async_emm does nothing, as in
cubie.
"""

from . import _backend

__all__ = ["CuPyAsyncNumbaManager", "install_async_emm"]

if not _backend.simulating():
    if _backend.backend() == "mlir":
        from ..numba_mlir import VramNumbaManager as _Plugin
    else:
        from ..numba import VramNumbaManager as _Plugin

    class CuPyAsyncNumbaManager(_Plugin):
        """Numba's EMM plugin over vram's manager of the context's device
        (cubie's name for its plugin)."""

        def __init__(self, context=None, **kwargs) -> None:
            super().__init__(context=context, **kwargs)
            self.is_cupy = False  # its pool is vram's, not CuPy's

        def reset(self, stream=None) -> None:
            super().reset()

    def install_async_emm() -> None:
        """Makes vram's plugin Numba's memory manager; run before the first
        CUDA context."""
        _backend.cuda().set_memory_manager(CuPyAsyncNumbaManager)

else:
    CuPyAsyncNumbaManager = None

    def install_async_emm() -> None:
        return None
