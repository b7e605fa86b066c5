"""The per-call shortcuts of the CTC step (issue 27 point 8) change no answer.

* ``_first_invalid`` checks a small batch on Python lists and a large one with numpy
  reductions: both give what the textbook loops give (input lengths first, then target
  lengths, then the labels in row-major order), on random batches with and without
  bad entries, for every threshold;
* the serial CTC call (no ``run_batch``) and the pool's call give the same bits;
* ``unit_cotangent`` is True exactly when every entry equals 1 (checked against the
  plain comparison), for scalars and arrays;
* the JAX callback's small read-only operands are copied and large ones viewed:
  either way a writeable array with the same values;
* ``impl='auto'`` on CPU tensors takes the host path and bad ``impl`` values are still
  refused with the same message;
* ``reduction_weights`` on Python floats (small integer batches) gives numpy's bits;
* ``loss.backward()`` of a reduced loss hands the saved gradient on without multiplying
  it by 1: the same bits as the tensor-op formula (``torch.func.vjp``, which never
  reads the cotangent), and a leaf's ``.grad`` changed in place never reaches the saved
  gradient (a second ``retain_graph`` backward is unchanged).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import duoloss.torch as dt
from duoloss.core.losses import ctc
from duoloss.torch._weights import unit_cotangent


def _loops(targets, in_len, tg_len, t_max, n_cls, blank):
    """The check written as plain loops over the entries."""
    n, s_cap = targets.shape
    for b in range(n):
        if not 0 <= in_len[b] <= t_max:
            return 1, b, 0, int(in_len[b])
    for b in range(n):
        if not 0 <= tg_len[b] <= s_cap:
            return 2, b, 0, int(tg_len[b])
    for b in range(n):
        for i in range(tg_len[b]):
            y = int(targets[b, i])
            if not 0 <= y < n_cls:
                return 3, b, i, y
            if y == blank:
                return 4, b, i, y
    return 0, 0, 0, 0


@pytest.mark.parametrize("limit", [0, 64, 10 ** 9])
def test_first_invalid_small_and_numpy_paths_match_the_loops(monkeypatch, limit):
    monkeypatch.setattr(ctc, "_SMALL_CHECK", limit)
    rng = np.random.default_rng(limit)
    for _ in range(400):
        n, s_cap = int(rng.integers(0, 12)), int(rng.integers(0, 12))
        t_max, n_cls = int(rng.integers(0, 8)), int(rng.integers(1, 7))
        blank = int(rng.integers(0, n_cls))
        p = rng.choice([0.0, 0.02, 0.2])
        targets = rng.integers(-1 if p else 0, n_cls + (1 if p else 0), (n, s_cap))
        if not p:
            targets[targets == blank] = (blank + 1) % n_cls if n_cls > 1 else blank
        in_len = rng.integers(-1 if p else 0, t_max + (2 if p else 1), n)
        tg_len = rng.integers(-1 if p else 0, s_cap + (2 if p else 1), n)
        if rng.random() < 0.5:  # valid lengths: the label checks decide
            in_len[:] = t_max
            tg_len = np.clip(tg_len, 0, s_cap)
        got = ctc._first_invalid(targets, in_len, tg_len, t_max, n_cls, blank)
        assert all(type(v) is int for v in got)
        assert got == _loops(targets, in_len, tg_len, t_max, n_cls, blank)


def test_serial_call_and_pool_call_give_the_same_bits(monkeypatch):
    rng = np.random.default_rng(3)
    logp = np.log(rng.dirichlet(np.ones(6), size=(20, 3))).astype(np.float32)
    targets, il, tl = rng.integers(1, 6, (3, 4)), np.array([20, 17, 9]), np.array([4, 2, 3])
    w = np.array([0.5, 1.0, 0.25])
    direct = ctc.ctc_loss_and_grad(logp, targets, il, tl, grad_weights=w)
    monkeypatch.setattr(ctc, "_PARALLEL_MIN_CELLS", 1)  # now through run_batch
    pooled = ctc.ctc_loss_and_grad(logp, targets, il, tl, grad_weights=w)
    for a, b in zip(direct, pooled):
        assert a.tobytes() == b.tobytes()
    np.testing.assert_array_equal(ctc._serial_order(3), np.arange(3))  # never written


@pytest.mark.parametrize("values", [[1.0], [2.5], [np.nan], [1.0 + 2 ** -23], [1.0, 1.0],
                                    [1.0, 0.5], [], [-1.0]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unit_cotangent_is_true_exactly_for_all_ones(values, dtype):
    want = all(v == 1 for v in values)
    g = torch.tensor(values, dtype=dtype)
    assert unit_cotangent(g) is want
    if len(values) == 1:
        assert unit_cotangent(g.reshape(())) is want
    assert unit_cotangent(torch.ones((), dtype=dtype, requires_grad=True)) is False


def test_jax_callback_inputs_are_writeable_copies_or_views():
    jnp = pytest.importorskip("jax.numpy")
    from duoloss.jax import _callback as cb

    small = jnp.arange(10, dtype=jnp.float32)
    large = jnp.arange(cb._COPY_MAX_BYTES // 4 + 1, dtype=jnp.float32)
    for x, shared in ((small, False), (large, True)):
        a = np.asarray(x)
        assert not a.flags.writeable
        for given in (a, x):  # (a callback's operands arrive as jax.Arrays)
            h = cb._host_input(given)
            assert type(h) is np.ndarray and h.flags.writeable
            assert h.dtype == a.dtype and np.array_equal(h, a)
        assert np.shares_memory(cb._host_input(a), a) is shared


def test_default_impl_on_cpu_is_the_host_path_and_bad_impl_still_raises():
    rng = np.random.default_rng(0)
    lp = torch.tensor(rng.normal(size=(12, 2, 5))).log_softmax(-1).requires_grad_(True)
    args = (lp, torch.tensor([[1, 2], [3, 3]]), torch.tensor([12, 10]), torch.tensor([2, 2]))
    auto = dt.ctc_loss(*args)
    host = dt.ctc_loss(*args, impl="host")
    (ga,) = torch.autograd.grad(auto, lp)
    (gh,) = torch.autograd.grad(host, lp)
    assert auto.detach().numpy().tobytes() == host.detach().numpy().tobytes()
    assert ga.numpy().tobytes() == gh.numpy().tobytes()
    for bad in ("Auto", "gpu", None, 1):
        with pytest.raises((ValueError, TypeError), match="ctc_loss: argument 'impl'"):
            dt.ctc_loss(*args, impl=bad)


@pytest.mark.parametrize("n", [1, 3, 64, 65])
def test_small_batch_reduction_weights_equal_numpy_formula(n):
    from duoloss.core._reduce import reduction_weights
    rng = np.random.default_rng(n)
    for dtype in (np.int64, np.int32, np.uint8):
        lengths = rng.integers(0, 200, n).astype(dtype)
        lengths[0] = 0  # clamped to 1
        want = 1.0 / (n * np.maximum(lengths.astype(np.float64), 1.0))
        got = reduction_weights("mean", n, lengths)
        assert got.dtype == np.float64 and np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_unit_cotangent_backward_hands_on_the_same_bits(dtype, reduction):
    g = torch.Generator().manual_seed(5)
    lp = torch.randn(30, 4, 12, generator=g, dtype=dtype).log_softmax(-1)
    tg = torch.randint(1, 12, (4, 6), generator=g)
    il, tl = torch.tensor([30, 28, 25, 30]), torch.tensor([6, 5, 0, 3])

    def loss_of(x):
        return dt.ctc_loss(x, tg, il, tl, reduction=reduction)

    x = lp.clone().requires_grad_(True)
    loss = loss_of(x)
    loss.backward(retain_graph=True)
    first = x.grad.clone()
    _, vjp = torch.func.vjp(loss_of, lp)
    (formula,) = vjp(torch.ones((), dtype=dtype))
    assert torch.equal(first, formula)
    assert torch.equal(first.view(-1).view(torch.int32 if dtype == torch.float32
                                           else torch.int64),
                       formula.view(-1).view(torch.int32 if dtype == torch.float32
                                             else torch.int64))
    x.grad.mul_(0.0).add_(7.0)  # in place on the leaf's .grad
    x.grad = None
    loss.backward()  # the graph's saved gradient is untouched
    assert torch.equal(x.grad, first)
    y = lp.clone().requires_grad_(True)
    loss_of(y).backward()
    y.grad.mul_(3.0)  # .grad stolen from the graph: changing it hurts nothing
    z = lp.clone().requires_grad_(True)
    loss_of(z).backward()
    assert torch.equal(z.grad, first)
