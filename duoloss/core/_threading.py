"""Thread-safety of the compiled kernels.

numba's default ``workqueue`` threading layer is not safe when several Python
threads launch parallel kernels at once.  On import we ask numba for a
thread-safe layer (``tbb`` if installed, else GNU ``omp``) unless the user chose
one with ``NUMBA_THREADING_LAYER``.  If numba still ends up on ``workqueue``
(the user forced it, or another library launched a parallel kernel before
duoloss was imported), every parallel kernel launch is serialised with a lock.
"""
from __future__ import annotations

import os
import threading

import numba

__all__ = ["parallel_guard", "threading_layer"]

if "NUMBA_THREADING_LAYER" not in os.environ:
    try:
        numba.config.THREADING_LAYER = "threadsafe"
    except Exception:  # pragma: no cover - very old numba
        pass

_lock = threading.Lock()
_layer = None


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_LOCK = _NoLock()


def threading_layer() -> str:
    """The numba threading layer in use ('unknown' before the first launch)."""
    try:
        return numba.threading_layer()
    except ValueError:
        return "unknown"


def parallel_guard():
    """Context manager to hold around a parallel (``prange``) kernel call.

    A no-op on thread-safe layers; a process-wide lock on ``workqueue``.
    """
    global _layer
    if _layer is None:
        layer = threading_layer()
        if layer == "unknown":
            # The layer is picked at the first launch: lock that one, decide after.
            return _FirstLaunch()
        _layer = layer
    return _lock if _layer == "workqueue" else _NO_LOCK


class _FirstLaunch:
    def __enter__(self):
        _lock.acquire()
        return self

    def __exit__(self, *exc):
        global _layer
        layer = threading_layer()
        if layer != "unknown":
            _layer = layer
        _lock.release()
        return False
