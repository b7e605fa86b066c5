"""multiblank_rnnt_loss / MultiblankRNNTLoss (torch and JAX) against independent references.

References (float64, written here from the paper's / NeMo's description):

* brute force: every multi-blank path of a tiny lattice enumerated in torch,
  autograd for the gradient (FastEmit as a gradient scaling of the label
  moves' log-probs, clamp applied afterwards);
* NeMo's ``MultiblankRNNTLossPytorch`` semantics re-derived: the pull-form
  alpha recursion (blank from (t - 1, u), big blank i from (t - d_i, u), label
  from (t, u - 1)) and the final blanks of every duration landing on T_b;
* finite differences (gradcheck, float64); ``rnnt_loss`` (no big blanks).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt
from duoloss.core.losses import tdt as core_tdt


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def _blanks(blank, big):
    """(symbol, duration) of the standard blank and of each big blank."""
    return [(blank, 1)] + [(blank - 1 - i, d) for i, d in enumerate(big)]


def _paths(tb, ub, blanks):
    out = []

    def walk(t, u, acc):
        if u < ub:
            walk(t, u + 1, acc + [("y", t, u, -1)])
        for k, d in blanks:
            if t + d < tb:
                walk(t + d, u, acc + [("b", t, u, k)])
            elif t + d == tb and u == ub:
                out.append(acc + [("b", t, u, k)])

    if tb > 0:
        walk(0, 0, [])
    return out


def brute_force(x, targets, il, tl, blank, big, sigma=0.0, lam=0.0):
    lp = torch.log_softmax(x, -1) - sigma
    out = []
    for b in range(x.shape[0]):
        tb, ub = int(il[b]), int(tl[b])
        ws = []
        for path in _paths(tb, ub, _blanks(blank, big)):
            w = x.new_zeros(())
            for kind, t, u, k in path:
                if kind == "y":
                    v = lp[b, t, u, int(targets[b, u])]
                    w = w + (v + lam * (v - v.detach()) if lam else v)
                else:
                    w = w + lp[b, t, u, k]
            ws.append(w)
        if tb == 0:
            out.append(x.new_zeros(()) if ub == 0 else x.new_full((), float("inf")))
        else:
            out.append(-torch.logsumexp(torch.stack(ws), 0) if ws
                       else x.new_full((), float("inf")))
    return torch.stack(out)


def nemo_reference(x, targets, il, tl, blank, big, sigma=0.0):
    """NeMo's MultiblankRNNTLossPytorch recursion, per sequence (pull form)."""
    lp = torch.log_softmax(x, -1) - sigma
    out = []
    for b in range(x.shape[0]):
        tb, ub = int(il[b]), int(tl[b])
        alpha = [[None] * (ub + 1) for _ in range(tb)]
        for t in range(tb):
            for u in range(ub + 1):
                if t == 0 and u == 0:
                    alpha[t][u] = x.new_zeros(())
                    continue
                terms = []
                if t > 0:
                    terms.append(alpha[t - 1][u] + lp[b, t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t][u - 1] + lp[b, t, u - 1, int(targets[b, u - 1])])
                for i, d in enumerate(big):
                    if t >= d:
                        terms.append(alpha[t - d][u] + lp[b, t - d, u, blank - 1 - i])
                alpha[t][u] = torch.logsumexp(torch.stack(terms), 0)
        fin = [alpha[tb - 1][ub] + lp[b, tb - 1, ub, blank]]
        fin += [alpha[tb - d][ub] + lp[b, tb - d, ub, blank - 1 - i]
                for i, d in enumerate(big) if tb >= d]
        out.append(-torch.logsumexp(torch.stack(fin), 0))
    return torch.stack(out)


def _case(seed, n=3, t=5, u=2, v=6, il=None, tl=None, n_big=2, dtype=np.float64):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, t, u + 1, v)).astype(dtype)
    il = np.array(il if il is not None else [t] + list(rng.integers(1, t + 1, n - 1)))
    tl = np.array(tl if tl is not None else [u] + list(rng.integers(0, u + 1, n - 1)))
    targets = rng.integers(0, v - 1 - n_big, size=(n, u))  # blanks are the last 1 + n_big
    return logits, targets, il, tl


def _torch(logits, targets, il, tl, blank, big, reduction="none", **kw):
    x = torch.tensor(logits, requires_grad=True)
    loss = dt.multiblank_rnnt_loss(x, torch.tensor(targets), torch.tensor(il), torch.tensor(tl),
                                   blank, big, reduction=reduction, **kw)
    loss.sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


def _jax(logits, targets, il, tl, blank, big, reduction="none", **kw):
    f = lambda z: dj.multiblank_rnnt_loss(z, targets, il, tl, blank, big,  # noqa: E731
                                          reduction=reduction, **kw)
    return np.asarray(f(jnp.asarray(logits))), np.asarray(
        jax.grad(lambda z: f(z).sum())(jnp.asarray(logits)))


def _ref(fn, logits, targets, il, tl, blank, big, sigma=0.0, lam=0.0, clamp=-1.0):
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    kw = {"lam": lam} if fn is brute_force else {}
    nll = fn(x, targets, il, tl, blank, big, sigma=sigma, **kw)
    finite = torch.isfinite(nll)
    if finite.any():
        nll[finite].sum().backward()
    g = x.grad.numpy().copy() if x.grad is not None else np.zeros_like(logits)
    if clamp > 0:
        g = np.clip(g, -clamp, clamp)
    return nll.detach().numpy() * (1 + lam), g


def test_path_enumeration_counts():
    # no big blanks: RNN-T alignments, C(T_b - 1 + U_b, U_b)
    assert len(_paths(3, 2, _blanks(5, []))) == 6
    # one frame: only the standard blank can end it
    assert len(_paths(1, 1, _blanks(5, [2]))) == 1
    # T_b = 2, U_b = 0 with a big blank of 2: two blanks, or the big blank
    assert len(_paths(2, 0, _blanks(5, [2]))) == 2


@pytest.mark.parametrize("big,sigma", [([2], 0.05), ([2, 3], -0.2), ([2, 4], 0.5), ([1], 0.0)])
def test_matches_brute_force_in_both_frontends(big, sigma, x64):
    logits, targets, il, tl = _case(1, n=4, t=5, u=2, il=[5, 4, 2, 1], tl=[2, 1, 0, 2])
    ref_l, ref_g = _ref(brute_force, logits, targets, il, tl, 5, big, sigma)
    for run in (_torch, _jax):
        loss, g = run(logits, targets, il, tl, 5, big, sigma=sigma)
        np.testing.assert_allclose(loss, ref_l, rtol=1e-12)
        np.testing.assert_allclose(g, ref_g, rtol=1e-10, atol=1e-13)


def test_fastemit_and_clamp_match_brute_force(x64):
    logits, targets, il, tl = _case(2, n=3, t=5, u=2, il=[5, 3, 4], tl=[2, 2, 1])
    logits *= 2.0
    for lam, clamp in ((0.3, -1.0), (0.0, 0.05), (0.5, 0.1)):
        ref_l, ref_g = _ref(brute_force, logits, targets, il, tl, 5, [2, 3], 0.1, lam, clamp)
        for run in (_torch, _jax):
            loss, g = run(logits, targets, il, tl, 5, [2, 3], sigma=0.1, fastemit_lambda=lam,
                          clamp=clamp)
            np.testing.assert_allclose(loss, ref_l, rtol=1e-12)
            np.testing.assert_allclose(g, ref_g, rtol=1e-10, atol=1e-13)


def test_matches_nemo_pytorch_reference(x64):
    logits, targets, il, tl = _case(3, n=3, t=9, u=3, v=8, n_big=3, il=[9, 6, 8], tl=[3, 1, 2])
    ref_l, ref_g = _ref(nemo_reference, logits, targets, il, tl, 7, [2, 4, 8], 0.05)
    for run in (_torch, _jax):
        loss, g = run(logits, targets, il, tl, 7, [2, 4, 8], sigma=0.05)
        np.testing.assert_allclose(loss, ref_l, rtol=1e-12)
        np.testing.assert_allclose(g, ref_g, rtol=1e-9, atol=1e-13)


def test_no_big_blanks_is_rnnt_loss():
    logits, targets, il, tl = _case(4, n=3, t=5, u=3, v=5, n_big=0)
    for blank in (4, 0):
        tg = np.where(targets == blank, 2, targets)
        for kw in ({}, {"fastemit_lambda": 0.2, "clamp": 0.05}):
            loss, g = _torch(logits, tg, il, tl, blank, [], **kw)
            xr = torch.tensor(logits, requires_grad=True)
            lr = dt.rnnt_loss(xr, torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                              blank=blank, reduction="none", **kw)
            lr.sum().backward()
            np.testing.assert_allclose(loss, lr.detach().numpy(), rtol=1e-12)
            np.testing.assert_allclose(g, xr.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_gradcheck_float64():
    logits, targets, il, tl = _case(5, n=2, t=4, u=2, v=5, il=[4, 3], tl=[2, 1])
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    x = torch.tensor(logits, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda z: dt.multiblank_rnnt_loss(z, *args, 4, [2, 3], sigma=0.2, reduction="none"), (x,))


def test_reductions_module_transforms_and_torch_equals_jax():
    logits, targets, il, tl = _case(6, dtype=np.float32)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    x = torch.tensor(logits)
    none = dt.multiblank_rnnt_loss(x, *args, -1, [2, 3], reduction="none", sigma=0.05)
    # reductions: sum_b w_b loss_b correctly rounded in float64, then float32
    terms = none.double().numpy()
    assert dt.multiblank_rnnt_loss(x, *args, 5, [2, 3], sigma=0.05).item() == np.float32(
        math.fsum((terms * (1 / 3)).tolist()))
    mod = dt.MultiblankRNNTLoss(5, [2, 3], sigma=0.05, reduction="sum")
    assert mod(x, *args).item() == np.float32(math.fsum(terms.tolist()))
    lt, gt = _torch(logits, targets, il, tl, 5, [2, 3], sigma=0.05)
    lj, gj = _jax(logits, targets, il, tl, 5, [2, 3], sigma=0.05)
    np.testing.assert_array_equal(lj, lt)
    np.testing.assert_array_equal(gj, gt)
    for red in ("sum", "mean"):  # one core reduction for both frameworks: the same bits
        lj2, gj2 = _jax(logits, targets, il, tl, 5, [2, 3], red, clamp=0.1)
        lt2, gt2 = _torch(logits, targets, il, tl, 5, [2, 3], red, clamp=0.1)
        np.testing.assert_array_equal(lj2, lt2)
        np.testing.assert_array_equal(gj2, gt2)
    f = lambda z: dj.multiblank_rnnt_loss(z, targets, il, tl, 5, [2, 3], reduction="none")  # noqa
    xs = jnp.stack([jnp.asarray(logits), jnp.asarray(logits) * 2])
    vm = jax.jit(jax.vmap(f))(xs)
    np.testing.assert_array_equal(np.asarray(vm[1]), np.asarray(f(xs[1])))
    g = torch.func.grad(lambda z: dt.multiblank_rnnt_loss(z, *args, 5, [2, 3], sigma=0.05,
                                                          reduction="sum"))(x)
    torch.testing.assert_close(g, torch.tensor(gt), rtol=0, atol=0)
    with torch.no_grad():
        ng = dt.multiblank_rnnt_loss(x, *args, 5, [2, 3], reduction="none", sigma=0.05)
    np.testing.assert_array_equal(ng.numpy(), lt)


def test_infeasible_and_nan():
    logits, targets, il, tl = _case(7, n=3, il=[0, 5, 5], tl=[1, 2, 2])
    logits[2, 0, 0, 0] = np.nan
    loss, g = _torch(logits, targets, il, tl, 5, [2])
    assert loss[0] == np.inf and not g[0].any()
    assert np.isfinite(loss[1]) and np.isfinite(g[1]).all()
    assert np.isnan(loss[2]) and np.isnan(g[2]).any()


def test_impl_seam():
    logits, targets, il, tl = _case(9)
    for f, x in ((dt.multiblank_rnnt_loss, torch.tensor(logits)),
                 (dj.multiblank_rnnt_loss, jnp.asarray(logits))):
        tg = torch.tensor(targets) if f is dt.multiblank_rnnt_loss else targets
        if f is dt.multiblank_rnnt_loss:  # Triton (tests/test_device_tdt_torch.py): CPU
            # tensors only under TRITON_INTERPRET=1, else a RuntimeError before any kernel
            with pytest.raises(RuntimeError, match="multiblank_rnnt_loss: impl='device'"):
                f(x, tg, tuple(il), tuple(tl), 5, [2], impl="device")
        np.testing.assert_array_equal(np.asarray(f(x, tg, tuple(il), tuple(tl), 5, [2],
                                                   impl="host", reduction="none")),
                                      np.asarray(f(x, tg, tuple(il), tuple(tl), 5, [2],
                                                   reduction="none")))


@pytest.fixture
def no_kernel(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel ran before validation")
    monkeypatch.setattr(core_tdt, "_run_tables", boom)


@pytest.mark.parametrize("blank,big,label,err,match", [
    (5, [0, 2], None, ValueError, r"argument 'big_blank_durations' must hold ints >= 1"),
    (5, [2, True], None, TypeError, r"argument 'big_blank_durations' must be a list/tuple"),
    (1, [2, 3], None, ValueError, r"argument 'blank' must leave room for the 2 big blanks"),
    (6, [2], None, ValueError, r"argument 'blank' must be in \[-6, 6\), got 6"),
    (5, [2, 3], 3, ValueError, r"argument 'targets' must not contain a blank or big blank \(3\)"),
])
def test_bad_input(blank, big, label, err, match, no_kernel):
    logits, targets, il, tl = _case(8)
    if label is not None:
        targets = targets.copy()
        targets[1, 0] = label
        tl = tl.copy()
        tl[1] = 2
    for frontend, x in ((dt, torch.tensor(logits)), (dj, jnp.asarray(logits))):
        tg = torch.tensor(targets) if frontend is dt else targets
        with pytest.raises(err, match=f"multiblank_rnnt_loss: {match}"):
            frontend.multiblank_rnnt_loss(x, tg, tuple(il), tuple(int(i) for i in tl), blank, big)
