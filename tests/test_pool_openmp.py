"""The torch frontend's host losses run their batches on torch's OpenMP team
(`duoloss.core._pool.attach_openmp` / `openmp_batches`): the same bits as on duoloss's
own pool threads, exceptions re-raised in the caller, concurrent callers, forked
children (which never start a team) and the JAX frontend (which keeps the pool)."""
from __future__ import annotations

import multiprocessing as mp
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import duoloss.torch as dt  # noqa: E402  (attaches torch's OpenMP runtime)
from duoloss.core import _pool  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or _pool._gomp is None,
                                reason="needs Linux and torch's GNU OpenMP runtime")


@pytest.fixture(autouse=True)
def _two_threads(monkeypatch):
    # two threads whatever an earlier test in this process set numba's count to (a
    # started threading layer makes `num_threads` follow numba.set_num_threads)
    monkeypatch.setattr(_pool, "num_threads", lambda: 2)


def _record_kernel(seen):
    def kernel(order, out):
        seen.add(threading.get_native_id())
        for b in order:
            out[b] = 3 * b + 1
    return kernel


def test_batches_run_on_the_team_only_inside_openmp_batches(monkeypatch):
    calls = []
    real = _pool._run_on_team
    monkeypatch.setattr(_pool, "_run_on_team", lambda *a: (calls.append(1), real(*a)))
    order = np.arange(64, dtype=np.int64)
    for inside in (False, True):
        seen: set = set()
        out = np.zeros(64, np.int64)
        if inside:
            with _pool.openmp_batches():
                _pool.run_batch(_record_kernel(seen), order, 10 ** 9, 1, (out,))
        else:
            _pool.run_batch(_record_kernel(seen), order, 10 ** 9, 1, (out,))
        assert np.array_equal(out, 3 * order + 1)
        assert len(calls) == int(inside)
    assert getattr(_pool._local, "on", False) is False  # the block restored the default


def test_an_exception_in_a_team_member_reaches_the_caller():
    def kernel(order, out):
        if 5 in order:
            raise ValueError("chunk with 5")
        out[order] = 1

    out = np.zeros(64, np.int64)
    with _pool.openmp_batches(), pytest.raises(ValueError, match="chunk with 5"):
        _pool.run_batch(kernel, np.arange(64, dtype=np.int64), 10 ** 9, 1, (out,))
    # the team is usable again afterwards
    with _pool.openmp_batches():
        _pool.run_batch(_record_kernel(set()), np.arange(64, dtype=np.int64), 10 ** 9, 1,
                        (out,))
    assert np.array_equal(out, 3 * np.arange(64) + 1)


def _ctc_case(seed=0, n=32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(60, n, 12, generator=g, dtype=torch.float32)
    tg = torch.randint(1, 12, (n, 15), generator=g)
    il = torch.full((n,), 60, dtype=torch.long)
    tl = torch.randint(5, 16, (n,), generator=g)
    return x, tg, il, tl


def _ctc_step(x, tg, il, tl):
    xi = x.clone().requires_grad_()
    loss = dt.ctc_loss(xi.log_softmax(-1), tg, il, tl, reduction="none")
    loss.sum().backward()
    return loss.detach(), xi.grad


def _rnnt_step(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 30, 9, 7, generator=g).requires_grad_()
    tg = torch.randint(1, 7, (16, 8), generator=g, dtype=torch.int32)
    il = torch.full((16,), 30, dtype=torch.int32)
    tl = torch.full((16,), 8, dtype=torch.int32)
    loss = dt.rnnt_loss(x, tg, il, tl, blank=0, reduction="sum")
    loss.backward()
    return loss.detach(), x.grad


def _same_bits(a, b):
    for u, v in zip(a, b):
        assert torch.equal(u.view(torch.int32), v.view(torch.int32))


def test_torch_losses_have_the_same_bits_on_the_team_and_on_the_pool(monkeypatch):
    used = []
    real = _pool._run_on_team
    monkeypatch.setattr(_pool, "_run_on_team", lambda *a: (used.append(1), real(*a)))
    case = _ctc_case()
    on_team = _ctc_step(*case), _rnnt_step()
    assert used, "the torch losses did not run on the team"
    monkeypatch.setattr(_pool, "_gomp", None)
    used.clear()
    on_pool = _ctc_step(*case), _rnnt_step()
    assert not used
    for a, b in zip(on_team, on_pool):
        _same_bits(a, b)


def test_concurrent_callers_get_the_same_bits():
    case = _ctc_case(3)
    ref = _ctc_step(*case)
    results = [None] * 6

    def call(i):
        results[i] = _ctc_step(*case)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for r in results:
        _same_bits(r, ref)


def _child(conn):
    # as a DataLoader worker does: torch's own operators after a fork hang on the
    # parent's OpenMP team otherwise (a torch/libgomp matter, duoloss or not)
    torch.set_num_threads(1)
    case = _ctc_case(5)
    conn.send((_pool._gomp is None, [t.numpy() for t in _ctc_step(*case)]))
    conn.close()


def test_a_forked_child_after_the_parent_used_the_team():
    case = _ctc_case(5)
    ref = _ctc_step(*case)  # the parent's team has run
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child,))
    proc.start()
    assert parent.poll(120), "the forked child hung"
    detached, (loss, grad) = parent.recv()
    proc.join(30)
    assert detached  # the child never starts a team
    assert np.array_equal(loss, ref[0].numpy()) and np.array_equal(grad, ref[1].numpy())


def test_the_jax_frontend_keeps_the_pool(monkeypatch):
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj

    def refuse(*_a):
        raise AssertionError("a JAX call ran on the OpenMP team")

    monkeypatch.setattr(_pool, "_run_on_team", refuse)
    x, tg, il, tl = _ctc_case(7)
    lp = jax.nn.log_softmax(x.numpy(), axis=-1)
    loss, grad = jax.value_and_grad(lambda q: dj.ctc_loss(q, tg.numpy(), il.numpy(),
                                                          tl.numpy(), reduction="sum"))(lp)
    assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
