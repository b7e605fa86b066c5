"""The batch driver `duoloss.core._pool.run_batch`: Python threads over parts of a batch.

Checked with plain Python "kernels" (the driver only slices ``order`` and calls):
every sequence is computed exactly once, in any thread count, from concurrent callers
and in a forked child whose parent already used the pool; errors reach the caller.
The loss kernels' own thread-count independence is tested with the losses
(tests/test_concurrency.py, tests/test_fork.py).
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest

from duoloss.core import _pool


def _recording_kernel():
    seen, threads, lock = [], set(), threading.Lock()

    def kernel(part, out):
        with lock:
            seen.extend(part.tolist())
            threads.add(threading.get_ident())
        out[part] = part * 10

    return kernel, seen, threads


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1001])
def test_every_sequence_once(n):
    kernel, seen, _ = _recording_kernel()
    order = np.random.default_rng(n).permutation(n).astype(np.int64)
    out = np.full(n, -1)
    _pool.run_batch(kernel, order, cells=10**9, min_cells=1, args=(out,))
    assert sorted(seen) == list(range(n))
    np.testing.assert_array_equal(out, np.arange(n) * 10)


def test_small_batches_stay_on_the_calling_thread():
    kernel, seen, threads = _recording_kernel()
    out = np.zeros(50, np.int64)
    _pool.run_batch(kernel, np.arange(50), cells=99, min_cells=100, args=(out,))
    assert threads == {threading.get_ident()} and sorted(seen) == list(range(50))


def test_uses_several_threads_when_allowed(monkeypatch):
    monkeypatch.setattr(_pool, "num_threads", lambda: 3)
    barrier = threading.Barrier(2, timeout=30)
    threads, lock = set(), threading.Lock()

    def kernel(part, out):
        with lock:
            first = threading.get_ident() not in threads
            threads.add(threading.get_ident())
        if first:
            barrier.wait()  # returns only once two threads are inside a kernel at once
        out[part] = 1

    out = np.zeros(40, np.int64)
    _pool.run_batch(kernel, np.arange(40), cells=10**9, min_cells=1, args=(out,))
    assert len(threads) >= 2 and out.sum() == 40


def test_kernel_errors_reach_the_caller(monkeypatch):
    monkeypatch.setattr(_pool, "num_threads", lambda: 2)

    def kernel(part, out):
        if 17 in part:
            raise ZeroDivisionError("sequence 17")
        out[part] = 1

    with pytest.raises(ZeroDivisionError, match="sequence 17"):
        _pool.run_batch(kernel, np.arange(100), cells=10**9, min_cells=1,
                        args=(np.zeros(100),))


def test_concurrent_callers():
    def one(seed):
        kernel, seen, _ = _recording_kernel()
        n = 200 + seed
        out = np.zeros(n, np.int64)
        _pool.run_batch(kernel, np.arange(n)[::-1].copy(), cells=10**9, min_cells=1,
                        args=(out,))
        return sorted(seen) == list(range(n)) and np.array_equal(out, np.arange(n) * 10)

    with ThreadPoolExecutor(8) as callers:
        assert all(callers.map(one, range(16)))


def _child(queue):
    kernel, seen, _ = _recording_kernel()
    out = np.zeros(300, np.int64)
    _pool.run_batch(kernel, np.arange(300), cells=10**9, min_cells=1, args=(out,))
    queue.put(sorted(seen) == list(range(300)) and int(out.sum()) == 10 * 299 * 300 // 2)


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork()")
def test_forked_child_after_parent_used_the_pool():
    kernel, _, _ = _recording_kernel()
    _pool.run_batch(kernel, np.arange(100), cells=10**9, min_cells=1,
                    args=(np.zeros(100, np.int64),))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue,))
    proc.start()
    ok = queue.get(timeout=60)
    proc.join(60)
    assert ok and proc.exitcode == 0


def test_thread_count_follows_numba():
    assert _pool.num_threads() >= 1
    assert _pool.num_threads() <= max(1, numba.config.NUMBA_NUM_THREADS)


class _Kernel:
    """A stand-in for a numba dispatcher: ``overloads`` (empty until its first
    compile or cache load in this process) and the collector's state in each call."""

    def __init__(self, overloads, fail=False):
        self.overloads = overloads
        self.fail = fail
        self.gc_on = []

    def __call__(self, part, out):
        self.gc_on.append(gc.isenabled())
        if self.fail:
            raise ValueError("kernel failed")
        out[part] = 1


@pytest.mark.parametrize("threads", [1, 4])
def test_first_call_of_a_kernel_pauses_the_collector(monkeypatch, threads):
    monkeypatch.setattr(_pool, "num_threads", lambda: threads)
    was = gc.isenabled()
    gc.enable()
    try:
        out = np.zeros(64)
        order = np.arange(64, dtype=np.int64)
        first = _Kernel({})
        _pool.run_batch(first, order, cells=10**9, min_cells=1, args=(out,))
        assert first.gc_on and not any(first.gc_on) and gc.isenabled() and out.all()
        later = _Kernel({"sig": object()})
        _pool.run_batch(later, order, cells=10**9, min_cells=1, args=(out,))
        assert all(later.gc_on)
        with pytest.raises(ValueError, match="kernel failed"):
            _pool.run_batch(_Kernel({}, fail=True), order, 10**9, 1, (out,))
        assert gc.isenabled()
        gc.disable()  # a collector the user switched off stays off
        _pool.run_batch(_Kernel({}), order, cells=10**9, min_cells=1, args=(out,))
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
