"""The cache of large output buffers (`duoloss.core._buffers`).

Two things must hold: memory handed out is never handed out again while anything
(a numpy view, a torch tensor, a view of that tensor) still refers to it; and the
kernels that write into such memory write every entry, so a result never shows
what an earlier one left there.  The second is checked by poisoning: a cached
buffer is filled with NaN, released, and the RNN-T gradients computed into it must
equal, bit for bit, those computed with the cache off.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import duoloss.torch as dt
from duoloss.core import _buffers
from duoloss.core.losses import joiner


@pytest.fixture
def small_cache(monkeypatch):
    """Every request of at least 1 KiB cached; the cache empty before and after."""
    monkeypatch.setattr(_buffers, "MIN_BYTES", 1024)
    monkeypatch.delenv("DUOLOSS_BUFFER_CACHE", raising=False)
    _buffers.release()
    yield
    _buffers.release()


def _ptr(a) -> int:
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr()


def test_memory_is_handed_out_again_only_once_nothing_refers_to_it(small_cache):
    a = _buffers.empty((64, 32), np.float32)
    first = _ptr(a)
    b = _buffers.empty((64, 32), np.float32)
    assert _ptr(b) != first  # a is alive
    view = a[3:, 1:]
    del a
    c = _buffers.empty((64, 32), np.float32)
    assert _ptr(c) not in (first, _ptr(b))  # a numpy view keeps it
    del view
    d = _buffers.empty((16, 16), np.float64)  # a smaller request fits a free buffer
    assert _ptr(d) == first
    assert d.shape == (16, 16) and d.dtype == np.float64 and d.flags.c_contiguous


def test_torch_tensors_and_their_views_keep_the_memory(small_cache):
    a = _buffers.empty((256,), np.float32)
    first = _ptr(a)
    t = torch.from_numpy(a)[8:].view(8, 31)  # a torch view of a tensor of a numpy view
    del a
    assert _ptr(_buffers.empty((256,), np.float32)) != first
    del t
    assert _ptr(_buffers.empty((256,), np.float32)) == first


def test_results_start_on_a_cache_line(small_cache):
    for n in (300, 1000, 4097):
        assert _ptr(_buffers.empty((n,), np.float32)) % 64 == 0


def test_small_requests_and_the_switch_give_plain_arrays(small_cache, monkeypatch):
    a = _buffers.empty((8,), np.float32)  # 32 bytes: below MIN_BYTES
    assert a.base is None
    monkeypatch.setenv("DUOLOSS_BUFFER_CACHE", "0")
    b = _buffers.empty((1024,), np.float32)
    assert b.base is None and not _buffers.enabled()


def test_release_drops_idle_buffers_only(small_cache):
    keep = _buffers.empty((1024,), np.float32)
    idle = _buffers.empty((2048,), np.float32)
    del idle
    assert _buffers.release() >= 2048 * 4
    assert _buffers.release() == 0  # keep is still alive: not released
    del keep
    assert _buffers.release() >= 1024 * 4


def test_a_miss_gives_idle_memory_back_first(small_cache):
    """Memory held while idle: at most the largest recent result, not every size seen."""
    a = _buffers.empty((1000,), np.float32)
    del a
    b = _buffers.empty((5000,), np.float32)  # larger: a miss
    assert [o.nbytes for o in _buffers._owners] == [5000 * 4 + 64]
    c = _buffers.empty((2000,), np.float32)  # b is alive: a miss, and b is kept
    assert sorted(o.nbytes for o in _buffers._owners) == [2000 * 4 + 64, 5000 * 4 + 64]
    del b, c


def test_at_most_max_buffers_are_tracked(small_cache):
    alive = [_buffers.empty((512,), np.float32) for _ in range(_buffers.MAX_BUFFERS + 3)]
    tracked = [a for a in alive if a.base is not None]  # plain np.empty: no base
    assert len(tracked) == _buffers.MAX_BUFFERS
    assert len({_ptr(a) for a in alive}) == len(alive)  # all distinct memory


def test_concurrent_callers_never_share_live_memory(small_cache):
    errors = []

    def work(k):
        for i in range(300):
            a = _buffers.empty((300 + (i % 7),), np.float32)
            a.fill(k)
            if not (a == k).all():
                errors.append((k, i))
            del a

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


# --------------------------------------------------------------- poisoned buffers
def _rnnt_case(seed=0, n=4, t=7, u=4, v=37):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, t, u + 1, v)).astype(np.float32)
    x[1, 2, 1] += 100.0  # a row outside the unshifted range: the max-shifted kernels
    tg = rng.integers(1, v, (n, u)).astype(np.int64)
    il = np.array([t, t - 3, 1, t])
    tl = np.array([u, 2, 0, u - 1])
    return x, tg, il, tl


def _poison(nbytes):
    a = _buffers.empty((nbytes // 4 + 16,), np.float32)
    a.fill(np.nan)
    return _ptr(a)


def _grad(x, tg, il, tl, reduction):
    xt = torch.tensor(x, requires_grad=True)
    loss = dt.rnnt_loss(xt, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), blank=0,
                        reduction=reduction)
    loss = loss if reduction != "none" else (loss * torch.arange(1.0, 5.0)).sum()
    loss.backward()
    return loss.detach(), xt.grad


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_rnnt_gradient_in_a_poisoned_buffer_equals_a_fresh_one(small_cache, monkeypatch,
                                                               reduction):
    x, tg, il, tl = _rnnt_case()
    monkeypatch.setenv("DUOLOSS_BUFFER_CACHE", "0")
    loss0, g0 = _grad(x, tg, il, tl, reduction)
    monkeypatch.setenv("DUOLOSS_BUFFER_CACHE", "1")
    poisoned = _poison(x.nbytes)
    loss1, g1 = _grad(x, tg, il, tl, reduction)
    assert g1.data_ptr() - poisoned in range(0, 64)  # it did land in the poisoned memory
    assert torch.equal(loss0, loss1)
    assert torch.equal(g0, g1)  # every entry written: no NaN left over
    assert float(g1[2, 1:].abs().sum()) == 0.0  # frames past a sequence's end: zeros


def test_lattice_gradient_in_a_poisoned_buffer_equals_a_fresh_one(small_cache, monkeypatch):
    x, tg, il, tl = _rnnt_case(seed=1)
    px, py, lse = joiner.transducer_log_probs(x, tg, il, tl, 0)
    rng = np.random.default_rng(2)
    gx = rng.standard_normal(px.shape).astype(np.float32)
    gy = rng.standard_normal(py.shape).astype(np.float32)
    monkeypatch.setenv("DUOLOSS_BUFFER_CACHE", "0")
    ref = joiner.transducer_log_probs_grad(x, lse, tg, il, tl, 0, gx, gy)
    monkeypatch.setenv("DUOLOSS_BUFFER_CACHE", "1")
    poisoned = _poison(x.nbytes)
    out = joiner.transducer_log_probs_grad(x, lse, tg, il, tl, 0, gx, gy)
    assert out.ctypes.data - poisoned in range(0, 64)
    np.testing.assert_array_equal(out, ref)


def test_training_steps_reuse_the_gradients_memory(small_cache):
    """What the cache is for: a step whose previous gradient is gone writes into
    the same memory (no fresh pages to fault in)."""
    x, tg, il, tl = _rnnt_case(seed=3)
    xt = torch.tensor(x, requires_grad=True)
    ptrs = []
    for _ in range(3):
        xt.grad = None
        dt.rnnt_loss(xt, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), blank=0,
                     reduction="sum").backward()
        ptrs.append(xt.grad.data_ptr())
    assert ptrs[0] == ptrs[1] == ptrs[2]
    kept = xt.grad  # a gradient the caller keeps is never written again
    before = kept.clone()
    xt.grad = None
    dt.rnnt_loss(xt, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), blank=0,
                 reduction="sum").backward()
    assert xt.grad.data_ptr() != kept.data_ptr()
    assert torch.equal(kept, before)


def test_a_forked_child_starts_with_a_free_lock_and_no_cache(small_cache):
    """A child forked while another thread holds the cache's lock (a DataLoader worker
    forked mid-step) must not wait on it forever."""
    import os
    kept = _buffers.empty((4096,), np.float32)
    _buffers._lock.acquire()  # as if another thread were inside `empty` at the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: allocate, then report through the exit status
            import signal
            signal.alarm(30)  # a hang would end the child (exit status: killed), not the test
            code = 1
            try:
                a = _buffers.empty((4096,), np.float32)
                code = 0 if a.shape == (4096,) and _buffers._owners[0] is a.base else 2
            finally:
                os._exit(code)
    finally:
        _buffers._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert kept.base is not None
