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

Which threads.  By default the calling thread and this module's pool threads.  Where
`openmp_wanted(True)` (the torch frontend's host losses) in a process where the GNU OpenMP
runtime is already loaded (torch's CPU wheels load it; `attach_openmp`), the chunks
run instead on an OpenMP team (``GOMP_parallel``, the calling thread its master): torch's
own intra-op threads.  After each parallel operator those threads busy-wait for the
next one (libgomp spins for milliseconds before sleeping), so duoloss's own threads
started right after a torch operator shared the cores with them: a CTC training step at
(32, 500, 50, 100) on 2 cores took 11.3 ms with pool threads and 6.6-7.5 ms on the team.
Each chunk is the same kernel call either way (the same bits).  Not used in a forked
child (libgomp's team does not survive ``fork``), from a chunk already running on a
team, with ``DUOLOSS_OPENMP=0``, or for the JAX frontend (XLA's threads are not
OpenMP's, and a team left spinning would compete with them).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from ._numba_setup import gc_paused

__all__ = ["attach_openmp", "num_threads", "openmp_batches", "openmp_wanted", "run_batch"]

_pool = None        # ThreadPoolExecutor of this process (None until needed)
_pool_lock = threading.Lock()

#: ``GOMP_parallel`` of the OpenMP runtime this process had loaded (`attach_openmp`)
_gomp = None
_GOMP_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
#: .on: whether this thread's batches may run on an OpenMP team (`openmp_wanted`);
#: .team: this thread is running a team's chunks
_local = threading.local()


def _reset_in_child():
    # After fork() the parent's pool object exists in the child but its threads do
    # not, and another thread may have held the lock at the fork.  Nor do the OpenMP
    # team's threads: the child never starts a team.
    global _pool, _pool_lock, _gomp
    _pool, _pool_lock, _gomp = None, threading.Lock(), None


def attach_openmp() -> bool:
    """Run `openmp_wanted` batches on the GNU OpenMP runtime this process has
    already loaded (``libgomp.so.1``, e.g. by ``import torch``); never loads one.
    Returns whether one was found (Linux only; ``DUOLOSS_OPENMP=0`` disables)."""
    global _gomp
    if os.environ.get("DUOLOSS_OPENMP", "1").strip() == "0" or not sys.platform.startswith(
            "linux"):
        return False
    try:
        lib = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        fn = lib.GOMP_parallel
    except (OSError, AttributeError):
        return False
    fn.argtypes = [_GOMP_FN, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    fn.restype = None
    _gomp = fn
    return True


def openmp_wanted(on: bool) -> bool:
    """Set whether this thread's large batches run on an OpenMP team where
    `attach_openmp` found a runtime (see the module docstring); returns the previous
    setting, to restore in a ``finally`` (a thread attribute: about 0.2 us, where a
    context manager cost a tiny CTC step a few per cent)."""
    previous = getattr(_local, "on", False)
    _local.on = on
    return previous


@contextlib.contextmanager
def openmp_batches():
    """`openmp_wanted` as a ``with`` block."""
    previous = openmp_wanted(True)
    try:
        yield
    finally:
        openmp_wanted(previous)


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

    gomp = _gomp
    if gomp is not None and getattr(_local, "on", False) and not getattr(_local, "team", False):
        _run_on_team(gomp, work, threads, state, lock, len(chunks))
        return
    pool = _executor()
    futures = [pool.submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        errors = [f.exception() for f in futures]  # waits for every helper thread
    for error in errors:
        if error is not None:
            raise error


def _run_on_team(gomp, work, threads, state, lock, n_chunks):
    """``work()`` on an OpenMP team of ``threads`` (the calling thread its master;
    ctypes releases the GIL for the call and each member takes it to run Python
    between kernel calls, which release it); returns when every member is done and
    re-raises the first exception a member met (the others stop at their next
    chunk)."""
    errors = []

    def member(_data):
        _local.team = True
        try:
            work()
        except BaseException as error:  # noqa: BLE001 (re-raised by the caller)
            errors.append(error)
            with lock:
                state["next"] = n_chunks
        finally:
            _local.team = False

    callback = _GOMP_FN(member)  # kept alive until GOMP_parallel returns
    gomp(callback, None, threads, 0)
    if errors:
        raise errors[0]
