"""Thread- and fork-safety of the parallel (``prange``) kernels.

numba runs parallel kernels on one *threading layer* per process, loaded at the
first parallel launch and never changed afterwards:

* ``omp`` (GNU OpenMP on Linux) is thread-safe but not fork-safe: a process
  forked after the parent ran a parallel kernel is killed by numba ("fork() called
  from a process already using GNU OpenMP") at its first parallel kernel, which
  hangs ``multiprocessing`` fork pools and kills ``DataLoader`` workers.
* ``tbb`` is thread- and fork-safe (fork from the main thread), but numba finds
  ``libtbb.so.12`` only where the dynamic loader looks (``pip install tbb`` in a
  virtual environment is not enough on Linux).
* ``workqueue`` ships with numba and is fork-safe, but aborts the process when
  two Python threads launch parallel kernels at once.

Unless the user chose a layer (``NUMBA_THREADING_LAYER`` or
``numba.config.THREADING_LAYER``), duoloss asks numba for ``'forksafe'``: ``tbb``
when it loads, else ``workqueue``.  On ``workqueue`` every parallel launch of
duoloss is serialised with a process-wide lock, so concurrent Python threads stay
safe (``benchmarks/threading_layers.py`` measures what that costs against ``omp``).

If the requested layer cannot be loaded (e.g. the user forced ``omp`` and libgomp
is missing), duoloss falls back to ``workqueue`` with the lock and warns once,
instead of numba's ``ValueError: No threading layer could be loaded``.  If numba
runs on ``omp`` anyway (forced, or loaded by other code first) and this process is
a fork of the one that loaded it, parallel kernels raise a ``RuntimeError`` that
says how to fix it, instead of numba killing the process.
"""
from __future__ import annotations

import os
import threading
import warnings

import numba

__all__ = ["parallel_guard", "threading_layer"]

#: What duoloss asks numba for when the user did not choose a layer.
_REQUEST = "forksafe"


def _user_chose_layer():
    return ("NUMBA_THREADING_LAYER" in os.environ
            or str(numba.config.THREADING_LAYER).lower() != "default")


def _request_layer():
    # Also called again just before the first launch: numba's compiler reloads its
    # config from the environment when a NUMBA_* variable changed, which would
    # undo an assignment made at import.
    if not _user_chose_layer():
        numba.config.THREADING_LAYER = _REQUEST


_request_layer()

_lock = threading.Lock()       # serialises parallel launches on workqueue
_init_lock = threading.Lock()  # guards the one-time layer resolution
_layer = None                  # the loaded layer, once known
_layer_pid = None              # the process that loaded it


def _reset_locks_in_child():
    # A fork while another thread held a lock would leave it locked forever in
    # the child, whose only thread is the one that forked.
    global _lock, _init_lock
    _lock = threading.Lock()
    _init_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_locks_in_child)


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


def _load_layer():
    """Load numba's threading layer now (once per process); fall back to workqueue."""
    global _layer, _layer_pid
    with _init_lock:
        if _layer is not None:
            return _layer
        _request_layer()
        try:
            numba.get_num_threads()  # makes numba load its threading layer
        except ValueError as exc:
            requested = numba.config.THREADING_LAYER
            numba.config.THREADING_LAYER = "workqueue"
            numba.get_num_threads()
            reason = str(exc).strip().splitlines()[0]
            warnings.warn(
                f"duoloss: numba could not load the threading layer {requested!r} "
                f"({reason}); using 'workqueue' instead, with duoloss's parallel kernels "
                "serialised by a lock.", RuntimeWarning, stacklevel=3)
        _layer = threading_layer()
        _layer_pid = os.getpid()
        return _layer


def parallel_guard():
    """Context manager to hold around a parallel (``prange``) kernel call.

    Loads numba's threading layer at the first call.  A no-op on thread-safe
    layers; a process-wide lock on ``workqueue``.

    Raises:
      RuntimeError: numba runs on GNU OpenMP and this process was forked from the
        one that loaded it (numba would kill the process).
    """
    layer = _layer if _layer is not None else _load_layer()
    if layer == "workqueue":
        return _lock
    if layer == "omp" and os.getpid() != _layer_pid and _gnu_openmp():
        raise RuntimeError(
            "duoloss: this process was forked from one that already loaded numba's "
            "GNU OpenMP threading layer, which cannot run parallel kernels after fork(). "
            "Use a fork-safe layer (leave NUMBA_THREADING_LAYER unset, or set it to "
            "'workqueue', 'tbb' or 'forksafe', before numba runs any parallel code), "
            "or start workers with the 'spawn' or 'forkserver' method.")
    return _NO_LOCK


def _gnu_openmp():
    try:
        from numba.np.ufunc import omppool
    except ImportError:  # pragma: no cover - omp is loaded if we got here
        return True
    return getattr(omppool, "openmp_vendor", "GNU") == "GNU"
