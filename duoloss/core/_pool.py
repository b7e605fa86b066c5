"""Batch parallelism without numba's threading layer: Python threads over nogil kernels.

A batch kernel ``kernel(order, *args)`` computes the sequences whose indices are listed
in the int64 array ``order`` and writes only their rows of the output arrays in
``args`` (see e.g. ``duoloss.core.losses.ctc``).  Every core kernel is compiled
with ``nogil=True``, so several Python threads can run the *same* compiled kernel on
disjoint parts of ``order`` at once: `run_batch` splits a large batch that way.

Why not numba's ``prange``: a ``parallel=True`` twin of each batch kernel costs about
two extra seconds of compile time per signature (numba's parfor pipeline and a second
LLVM module holding the whole kernel), which was most of the time of a full
``duoloss.warmup``; and the threading layer it needs is either not fork-safe (GNU
OpenMP), not always loadable (TBB), or aborts on concurrent launches (workqueue).
Plain threads have none of these problems: a forked child (a ``DataLoader`` worker)
makes its own pool, and any number of Python threads may call the losses at once
(each caller also works through its own batch, so it never waits on a busy pool).

The results do not depend on the thread count or on which thread computed which
sequence: each sequence is computed by the same function, into its own rows.

Threads: ``numba.get_num_threads()`` where numba's threading layer is already
running (so ``numba.set_num_threads(n)`` applies), else ``NUMBA_NUM_THREADS`` (numba's
default: the number of CPUs).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ._numba_setup import gc_paused

__all__ = ["num_threads", "run_batch"]

_pool = None        # ThreadPoolExecutor of this process (None until needed)
_pool_lock = threading.Lock()


def _reset_in_child():
    # After fork() the parent's pool object exists in the child but its threads do
    # not, and another thread may have held the lock at the fork.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def num_threads() -> int:
    """How many threads a large batch is split over."""
    from numba.np.ufunc import parallel

    if getattr(parallel, "_is_initialized", False):
        return max(1, int(numba.get_num_threads()))
    return max(1, int(numba.config.NUMBA_NUM_THREADS))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            # threads start on demand, at most one fewer than numba's maximum
            # (the calling thread is the other one)
            _pool = ThreadPoolExecutor(max(1, int(numba.config.NUMBA_NUM_THREADS) - 1),
                                       thread_name_prefix="duoloss")
        return _pool


def run_batch(kernel, order: np.ndarray, cells: int, min_cells: int, args: tuple) -> None:
    """``kernel(part, *args)`` over parts of ``order``, on several threads when worth it.

    ``order`` lists the sequences to compute (int64), longest first; ``cells`` is the
    batch's total work (trellis or lattice cells).  A single sequence, fewer than
    ``min_cells`` cells or a single thread run as one call on the calling thread.
    Otherwise ``order`` is cut into chunks (about four per thread, so that threads
    finishing early take more), which the calling thread and ``num_threads() - 1``
    pool threads take in turn; the call returns when all chunks are done, and
    re-raises the first exception a chunk raised.
    """
    if not getattr(kernel, "overloads", True):
        # This process's first call of the kernel: numba loads it from its disk cache
        # or compiles it, making millions of short-lived objects; with the cyclic
        # collector paused (see `_CompileNotice`) a cold CTC call takes 0.4 s less.
        with gc_paused():
            _run_batch(kernel, order, cells, min_cells, args)
    else:
        _run_batch(kernel, order, cells, min_cells, args)


def _run_batch(kernel, order, cells, min_cells, args):
    n = int(order.shape[0])
    threads = min(num_threads(), n) if cells >= min_cells else 1
    if threads <= 1:
        kernel(order, *args)
        return
    size = max(1, n // (4 * threads))
    chunks = [order[i:i + size] for i in range(0, n, size)]
    state = {"next": 0}
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                i = state["next"]
                state["next"] = i + 1
            if i >= len(chunks):
                return
            kernel(chunks[i], *args)

    pool = _executor()
    futures = [pool.submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        errors = [f.exception() for f in futures]  # waits for every helper thread
    for error in errors:
        if error is not None:
            raise error
