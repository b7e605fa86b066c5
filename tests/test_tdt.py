"""tdt_loss / TDTLoss (torch and JAX) against independent references.

References (all float64, written here from the paper's / NeMo's description):

* brute force: every TDT path of a tiny lattice enumerated, its weight summed
  in torch, the loss a logsumexp over paths; torch's autograd gives the
  reference gradient (FastEmit as a gradient scaling of the label moves' token
  log-probs, clamp applied to it afterwards);
* NeMo's ``TDTLossPytorch`` semantics re-derived: the pull-form alpha
  recursion over (t, u) with the final blanks summed at the end, autograd for
  the gradient (bigger cases than brute force can enumerate);
* finite differences (torch.autograd.gradcheck, float64);
* ``rnnt_loss`` for the identities that hold exactly (``omega = 1``, and the
  single-path masks with ``durations = [0, 1]``).
"""
from __future__ import annotations

import itertools
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


# --------------------------------------------------------------------------- #
# References                                                                   #
# --------------------------------------------------------------------------- #
def _paths(tb, ub, durations):
    """Every TDT path: lists of moves (kind, t, u, i) with i the duration index;
    kind 'y' a label move, 'b' a blank move (the last one lands on tb)."""
    out = []

    def walk(t, u, acc):
        if u < ub:
            for i, d in enumerate(durations):
                if t + d < tb:
                    walk(t + d, u + 1, acc + [("y", t, u, i)])
        for i, d in enumerate(durations):
            if d == 0:
                continue
            if t + d < tb:
                walk(t + d, u, acc + [("b", t, u, i)])
            elif t + d == tb and u == ub:
                out.append(acc + [("b", t, u, i)])

    if tb > 0:
        walk(0, 0, [])
    return out


def _split(x, n_dur, sigma):
    tok = torch.log_softmax(x[..., : x.shape[-1] - n_dur], -1) - sigma
    dur = torch.log_softmax(x[..., x.shape[-1] - n_dur:], -1)
    return tok, dur


def _fastemit(v, lam):
    """``v`` in the forward, gradient scaled by ``1 + lam``."""
    return v + lam * (v - v.detach()) if lam else v


def brute_force(x, targets, il, tl, blank, durations, sigma=0.0, lam=0.0):
    """Per-sequence NLLs ``(N,)`` (a torch graph; the value times ``1 + lam``
    is the reported loss, its gradient is the FastEmit one)."""
    tok, dur = _split(x, len(durations), sigma)
    out = []
    for b in range(x.shape[0]):
        tb, ub = int(il[b]), int(tl[b])
        if tb == 0:
            out.append(x.new_zeros(()) if ub == 0 else x.new_full((), float("inf")))
            continue
        ws = []
        for path in _paths(tb, ub, durations):
            w = x.new_zeros(())
            for kind, t, u, i in path:
                if kind == "y":
                    w = w + _fastemit(tok[b, t, u, int(targets[b, u])], lam) + dur[b, t, u, i]
                else:
                    w = w + tok[b, t, u, blank] + dur[b, t, u, i]
            ws.append(w)
        out.append(-torch.logsumexp(torch.stack(ws), 0) if ws else x.new_full((), float("inf")))
    return torch.stack(out)


def nemo_reference(x, targets, il, tl, blank, durations, sigma=0.0):
    """NeMo's TDTLossPytorch recursion (pull form): alpha[t, u] sums the blanks
    of every positive duration from (t - d, u) and the labels of every duration
    from (t - d, u - 1); the loss adds the final blanks landing on T_b."""
    tok, dur = _split(x, len(durations), sigma)
    out = []
    for b in range(x.shape[0]):
        tb, ub = int(il[b]), int(tl[b])
        alpha = [[None] * (ub + 1) for _ in range(tb)]  # None: unreachable
        for t in range(tb):
            for u in range(ub + 1):
                if t == 0 and u == 0:
                    alpha[t][u] = x.new_zeros(())
                    continue
                terms = []
                for i, d in enumerate(durations):
                    if t - d < 0:
                        continue
                    if d > 0 and alpha[t - d][u] is not None:
                        terms.append(alpha[t - d][u] + tok[b, t - d, u, blank]
                                     + dur[b, t - d, u, i])
                    if u > 0 and alpha[t - d][u - 1] is not None:
                        y = int(targets[b, u - 1])
                        terms.append(alpha[t - d][u - 1] + tok[b, t - d, u - 1, y]
                                     + dur[b, t - d, u - 1, i])
                if terms:
                    alpha[t][u] = torch.logsumexp(torch.stack(terms), 0)
        fin = [alpha[tb - d][ub] + tok[b, tb - d, ub, blank] + dur[b, tb - d, ub, i]
               for i, d in enumerate(durations)
               if d > 0 and tb - d >= 0 and alpha[tb - d][ub] is not None]
        out.append(-torch.logsumexp(torch.stack(fin), 0))
    return torch.stack(out)


def _case(seed, n=3, t=4, u=2, v=4, durations=(0, 1, 2), il=None, tl=None, dtype=np.float64):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, t, u + 1, v + len(durations))).astype(dtype)
    il = np.array(il if il is not None else [t] + list(rng.integers(1, t + 1, n - 1)))
    tl = np.array(tl if tl is not None else [u] + list(rng.integers(0, u + 1, n - 1)))
    targets = rng.integers(0, v - 1, size=(n, u))  # blank = v - 1 never drawn
    return logits, targets, il, tl


def _torch(logits, targets, il, tl, blank, durations, reduction="none", **kw):
    x = torch.tensor(logits, requires_grad=True)
    loss = dt.tdt_loss(x, torch.tensor(targets), torch.tensor(il), torch.tensor(tl), blank,
                       durations, reduction=reduction, **kw)
    loss.sum().backward()
    return loss.detach().numpy(), x.grad.numpy()


def _jax(logits, targets, il, tl, blank, durations, reduction="none", **kw):
    f = lambda z: dj.tdt_loss(z, targets, il, tl, blank, durations,  # noqa: E731
                              reduction=reduction, **kw)
    loss = f(jnp.asarray(logits))
    g = jax.grad(lambda z: f(z).sum())(jnp.asarray(logits))
    return np.asarray(loss), np.asarray(g)


def _ref(fn, logits, targets, il, tl, blank, durations, sigma=0.0, lam=0.0, clamp=-1.0):
    """Reference ``(losses, per-sequence gradient)``: FastEmit via the gradient
    scaling, clamp on the token logits' part of each sequence's gradient."""
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    kw = {"lam": lam} if fn is brute_force else {}
    nll = fn(x, targets, il, tl, blank, durations, sigma=sigma, **kw)
    finite = torch.isfinite(nll)
    nll[finite].sum().backward() if finite.any() else None
    g = x.grad.numpy().copy() if x.grad is not None else np.zeros_like(logits)
    v = logits.shape[-1] - len(durations)
    if clamp > 0:
        g[..., :v] = np.clip(g[..., :v], -clamp, clamp)
    return nll.detach().numpy() * (1 + lam), g


# --------------------------------------------------------------------------- #
# Values and gradients                                                         #
# --------------------------------------------------------------------------- #
def test_path_enumeration_counts():
    # durations [1]: T_b moves of one frame, the last a blank: C(T_b - 1, U_b) paths
    assert len(_paths(5, 2, (1,))) == 6
    # durations [0, 1], U_b = 0: only blanks of duration 1: one path
    assert len(_paths(4, 0, (0, 1))) == 1
    # one frame: labels need d = 0, the last blank d = 1
    assert len(_paths(1, 2, (0, 1, 2))) == 1
    # [2] with odd T_b: no path
    assert _paths(3, 0, (2,)) == []


@pytest.mark.parametrize("durations,blank,sigma", [
    ((0, 1, 2), 3, 0.05),
    ((0, 1, 3), 0, -0.3),
    ((1, 2), 3, 0.5),
    ((2, 0, 1), 3, 0.0),      # unsorted
    ((1,), 3, 0.1),
])
def test_matches_brute_force_in_both_frontends(durations, blank, sigma, x64):
    logits, targets, il, tl = _case(1, n=4, t=4, u=2, durations=durations,
                                    il=[4, 3, 1, 4], tl=[2, 1, 0, 0])
    if blank != 3:
        targets = np.where(targets == blank, 3, targets)
    ref_l, ref_g = _ref(brute_force, logits, targets, il, tl, blank, durations, sigma)
    for run in (_torch, _jax):
        loss, g = run(logits, targets, il, tl, blank, durations, sigma=sigma)
        np.testing.assert_allclose(loss, ref_l, rtol=1e-12)
        np.testing.assert_allclose(g, ref_g, rtol=1e-10, atol=1e-13)


def test_fastemit_and_clamp_match_brute_force(x64):
    durations = (0, 1, 2)
    logits, targets, il, tl = _case(2, n=3, t=4, u=2, durations=durations, il=[4, 4, 2],
                                    tl=[2, 1, 2])
    logits *= 2.0
    for lam, clamp in ((0.3, -1.0), (0.0, 0.05), (0.5, 0.1)):
        ref_l, ref_g = _ref(brute_force, logits, targets, il, tl, 3, durations, 0.1, lam, clamp)
        for run in (_torch, _jax):
            loss, g = run(logits, targets, il, tl, 3, durations, sigma=0.1,
                          fastemit_lambda=lam, clamp=clamp)
            np.testing.assert_allclose(loss, ref_l, rtol=1e-12)
            np.testing.assert_allclose(g, ref_g, rtol=1e-10, atol=1e-13)
    # clamp acts on the token logits only: some duration gradient exceeds the bound
    _, g = _torch(logits, targets, il, tl, 3, durations, clamp=0.05)
    assert np.abs(g[..., :4]).max() <= 0.05 and np.abs(g[..., 4:]).max() > 0.05


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (1, 2, 3, 4, 5)])
def test_matches_nemo_pytorch_reference(durations, x64):
    logits, targets, il, tl = _case(3, n=3, t=7, u=3, v=5, durations=durations,
                                    il=[7, 5, 6], tl=[3, 2, 1])
    ref_l, ref_g = _ref(nemo_reference, logits, targets, il, tl, 4, durations, 0.05)
    for run in (_torch, _jax):
        loss, g = run(logits, targets, il, tl, 4, durations, sigma=0.05)
        np.testing.assert_allclose(loss, ref_l, rtol=1e-12)
        np.testing.assert_allclose(g, ref_g, rtol=1e-9, atol=1e-13)


def test_float32_close_to_float64_reference():
    durations = (0, 1, 2, 3, 4)
    logits, targets, il, tl = _case(4, n=2, t=8, u=3, v=6, durations=durations, dtype=np.float32)
    ref_l, ref_g = _ref(nemo_reference, logits.astype(np.float64), targets, il, tl, 5, durations,
                        0.05)
    loss, g = _torch(logits, targets, il, tl, 5, durations, sigma=0.05)
    assert loss.dtype == np.float32 and g.dtype == np.float32
    np.testing.assert_allclose(loss, ref_l, rtol=1e-6)
    np.testing.assert_allclose(g, ref_g, rtol=1e-4, atol=1e-6)


def test_gradcheck_float64():
    logits, targets, il, tl = _case(5, n=2, t=4, u=2, v=3, durations=(0, 1, 2), il=[4, 3],
                                    tl=[2, 1])
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    x = torch.tensor(logits, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda z: dt.tdt_loss(z, *args, 2, [0, 1, 2], sigma=0.2, reduction="none"), (x,))


# --------------------------------------------------------------------------- #
# Identities with rnnt_loss                                                    #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("lam,clamp", [(0.0, -1.0), (0.2, 0.05)])
def test_omega_is_the_expectation_of_tdt_and_rnnt(lam, clamp):
    durations = (0, 1, 2)
    logits, targets, il, tl = _case(6, n=3, t=5, u=2, durations=durations)
    v = logits.shape[-1] - 3
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    kw = dict(fastemit_lambda=lam, clamp=clamp)

    def rnnt(z):
        return dt.rnnt_loss(z, *args, blank=3, reduction="none", **kw)

    xr = torch.tensor(logits[..., :v], requires_grad=True)
    lr = rnnt(xr)
    lr.sum().backward()
    lt, gt = _torch(logits, targets, il, tl, 3, durations, sigma=0.1, **kw)
    # omega = 1: exactly NeMo's RNN-T branch (token logits, no sigma); no duration gradient
    l1, g1 = _torch(logits, targets, il, tl, 3, durations, sigma=0.1, omega=1.0, **kw)
    np.testing.assert_allclose(l1, lr.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(g1[..., :v], xr.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert not g1[..., v:].any()
    lo, go = _torch(logits, targets, il, tl, 3, durations, sigma=0.1, omega=0.3, **kw)
    np.testing.assert_allclose(lo, 0.7 * lt + 0.3 * l1, rtol=1e-12)
    np.testing.assert_allclose(go, 0.7 * gt + 0.3 * g1, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("sigma", [0.0, 0.25])
def test_single_path_masks_coincide_with_rnnt_loss(sigma):
    """durations [0, 1]: duration logits (0, -inf) on u < U_b and (-inf, 0) on
    u = U_b, and the blank impossible on u < U_b, leave both TDT and RNN-T one
    path (every label on frame 0, then T_b blanks): equal up to (T_b + U_b) sigma,
    with the same gradient w.r.t. the token logits."""
    logits, targets, il, tl = _case(7, n=3, t=4, u=2, durations=(0, 1), il=[4, 2, 3],
                                    tl=[2, 1, 0])
    v = 4
    for b in range(3):
        ub = tl[b]
        logits[b, :, :ub, v:] = [0.0, -np.inf]
        logits[b, :, ub:, v:] = [-np.inf, 0.0]
        logits[b, :, :ub, 3] = -np.inf
    loss, g = _torch(logits, targets, il, tl, 3, (0, 1), sigma=sigma)
    xr = torch.tensor(logits[..., :v], requires_grad=True)
    lr = dt.rnnt_loss(xr, torch.tensor(targets), torch.tensor(il), torch.tensor(tl), blank=3,
                      reduction="none")
    lr.sum().backward()
    np.testing.assert_allclose(loss, lr.detach().numpy() + (il + tl) * sigma, rtol=1e-12)
    np.testing.assert_allclose(g[..., :v], xr.grad.numpy(), rtol=1e-10, atol=1e-14)
    assert not g[..., v:].any()  # the duration softmax is one-hot: no gradient


# --------------------------------------------------------------------------- #
# Frontends: reductions, module, transforms                                    #
# --------------------------------------------------------------------------- #
def test_reductions_module_and_torch_equals_jax():
    durations = [0, 1, 2]
    logits, targets, il, tl = _case(8, n=3, t=5, u=2, durations=durations, dtype=np.float32)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    x = torch.tensor(logits)
    none = dt.tdt_loss(x, *args, 3, durations, reduction="none", sigma=0.05)
    assert none.shape == (3,)
    # reductions: sum_b w_b loss_b correctly rounded in float64, then float32
    terms = none.double().numpy()
    assert dt.tdt_loss(x, *args, 3, durations, sigma=0.05).item() == np.float32(
        math.fsum((terms * (1 / 3)).tolist()))
    assert dt.tdt_loss(x, *args, 3, durations, reduction="sum", sigma=0.05).item() == np.float32(
        math.fsum(terms.tolist()))
    mod = dt.TDTLoss(3, durations, sigma=0.05, reduction="none")
    torch.testing.assert_close(mod(x, *args), none, rtol=0, atol=0)
    assert "durations=[0, 1, 2]" in repr(mod)
    # blank=-1 is V - 1 (NeMo's layout: the blank last among the token logits)
    torch.testing.assert_close(dt.tdt_loss(x, *args, -1, durations, reduction="none",
                                           sigma=0.05), none, rtol=0, atol=0)
    # torch == JAX, x64 off (float32 in, float32 out); the same core: same bits
    lj, gj = _jax(logits, targets, il, tl, 3, durations, sigma=0.05, clamp=0.1)
    lt, gt = _torch(logits, targets, il, tl, 3, durations, sigma=0.05, clamp=0.1)
    assert lj.dtype == np.float32
    np.testing.assert_array_equal(lj, lt)
    np.testing.assert_array_equal(gj, gt)
    for red in ("sum", "mean"):  # one core reduction for both frameworks: the same bits
        lj, gj = _jax(logits, targets, il, tl, 3, durations, red, sigma=0.05, omega=0.3)
        lt, gt2 = _torch(logits, targets, il, tl, 3, durations, red, sigma=0.05, omega=0.3)
        np.testing.assert_array_equal(lj, lt)
        np.testing.assert_array_equal(gj, gt2)
    # 'mean' scales each sequence's (clamped) gradient by 1 / N, as NeMo
    xm = torch.tensor(logits, requires_grad=True)
    dt.tdt_loss(xm, *args, 3, durations, sigma=0.05, clamp=0.1).backward()
    np.testing.assert_allclose(xm.grad.numpy(), gt / 3, rtol=1e-6)


def test_no_grad_equals_grad_and_value_and_grad():
    logits, targets, il, tl = _case(9, dtype=np.float32)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    with torch.no_grad():
        a = dt.tdt_loss(torch.tensor(logits), *args, 3, [0, 1, 2], reduction="none", omega=0.4)
    b = dt.tdt_loss(torch.tensor(logits, requires_grad=True), *args, 3, [0, 1, 2],
                    reduction="none", omega=0.4)
    np.testing.assert_array_equal(a.numpy(), b.detach().numpy())
    f = lambda z: dj.tdt_loss(z, targets, il, tl, 3, [0, 1, 2], reduction="sum", omega=0.4)  # noqa
    v, _ = jax.value_and_grad(f)(jnp.asarray(logits))
    assert float(v) == float(f(jnp.asarray(logits)))


def test_torch_compile_and_func():
    logits, targets, il, tl = _case(10, dtype=np.float32)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))

    def f(z, tg, a, b):
        return dt.tdt_loss(z, tg, a, b, 3, [0, 1, 2], sigma=0.05, clamp=0.2, fastemit_lambda=0.1)

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    x1 = torch.tensor(logits, requires_grad=True)
    x2 = torch.tensor(logits, requires_grad=True)
    l1, l2 = f(x1, *args), cf(x2, *args)
    l1.backward()
    l2.backward()
    assert l1.item() == l2.item()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=0, atol=0)
    g = torch.func.grad(lambda z: f(z, *args))(torch.tensor(logits))
    torch.testing.assert_close(g, x1.grad, rtol=0, atol=0)
    # vmap of grad ('sum': the vmap rule weighs after the kernel, in the
    # gradient's dtype, so a 'mean' weight 1 / N may round differently by an ulp)
    xs = torch.stack([torch.tensor(logits), torch.tensor(logits) * 0.5])

    def fs(z):
        return dt.tdt_loss(z, *args, 3, [0, 1, 2], sigma=0.05, clamp=0.2, reduction="sum")

    gv = torch.func.vmap(torch.func.grad(fs))(xs)
    for i in range(2):
        torch.testing.assert_close(gv[i], torch.func.grad(fs)(xs[i]), rtol=0, atol=0)


def test_jax_jit_and_vmap():
    logits, targets, il, tl = _case(11, dtype=np.float32)
    f = lambda z, tg, a, b: dj.tdt_loss(z, tg, a, b, 3, [0, 1, 2], reduction="none",  # noqa
                                        sigma=0.05)
    eager = f(jnp.asarray(logits), targets, il, tl)
    jitted = jax.jit(f)(jnp.asarray(logits), targets, il, tl)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(eager))
    xs = jnp.stack([jnp.asarray(logits), jnp.asarray(logits) * 2])
    vm = jax.vmap(f, in_axes=(0, None, None, None))(xs, targets, il, tl)
    np.testing.assert_array_equal(np.asarray(vm[1]), np.asarray(f(xs[1], targets, il, tl)))
    gj = jax.jit(jax.grad(lambda z: f(z, targets, il, tl).sum()))(jnp.asarray(logits))
    _, gt = _torch(logits, targets, il, tl, 3, [0, 1, 2], sigma=0.05)
    np.testing.assert_array_equal(np.asarray(gj), gt)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_run_in_float32(half):
    logits, targets, il, tl = _case(12, dtype=np.float32)
    x = torch.tensor(logits).to(half).requires_grad_()
    loss = dt.tdt_loss(x, torch.tensor(targets), torch.tensor(il), torch.tensor(tl), 3,
                       [0, 1, 2], reduction="none")
    loss.sum().backward()
    assert loss.dtype == half and x.grad.dtype == half
    ref = dt.tdt_loss(x.detach().float(), torch.tensor(targets), torch.tensor(il),
                      torch.tensor(tl), 3, [0, 1, 2], reduction="none")
    torch.testing.assert_close(loss.float(), ref, rtol=1e-2, atol=1e-2)


# --------------------------------------------------------------------------- #
# NaN / inf policy                                                             #
# --------------------------------------------------------------------------- #
def test_infeasible_empty_and_nan_sequences():
    logits, targets, il, tl = _case(13, n=4, t=4, u=2, durations=(2,), il=[3, 4, 0, 0],
                                    tl=[0, 1, 0, 1])
    loss, g = _torch(logits, targets, il, tl, 3, (2,))
    # odd T_b with durations [2]: no path -> +inf, zero gradient; T_b = 0: 0 or +inf
    assert loss[0] == np.inf and not g[0].any()
    assert np.isfinite(loss[1]) and g[1].any()
    assert loss[2] == 0.0 and loss[3] == np.inf and not g[2:].any()
    # a NaN in a read row poisons only its sequence
    logits2, targets2, il2, tl2 = _case(14, n=3, durations=(0, 1, 2), il=[4, 4, 4],
                                        tl=[2, 2, 2])
    clean, gc = _torch(logits2, targets2, il2, tl2, 3, (0, 1, 2))
    logits2[1, 1, 1, 0] = np.nan
    bad, gb = _torch(logits2, targets2, il2, tl2, 3, (0, 1, 2))
    assert np.isnan(bad[1]) and np.isnan(gb[1]).any()
    np.testing.assert_array_equal(bad[[0, 2]], clean[[0, 2]])
    np.testing.assert_array_equal(gb[[0, 2]], gc[[0, 2]])
    # -inf logits are probability zero: never NaN
    logits3, targets3, il3, tl3 = _case(15, durations=(0, 1, 2))
    logits3[:, :, :, 1] = -np.inf
    targets3 = np.where(targets3 == 1, 0, targets3)
    l3, g3 = _torch(logits3, targets3, il3, tl3, 3, (0, 1, 2))
    assert np.isfinite(l3).all() and np.isfinite(g3).all() and not g3[..., 1].any()


def test_traced_invalid_label_gives_nan_for_that_sequence_only():
    logits, targets, il, tl = _case(16, n=3)
    bad = targets.copy()
    bad[0, 0] = 3  # the blank
    out = jax.jit(lambda tg: dj.tdt_loss(logits, tg, il, tl, 3, [0, 1, 2],
                                         reduction="none"))(bad)
    clean = dj.tdt_loss(logits, targets, il, tl, 3, [0, 1, 2], reduction="none")
    assert np.isnan(out[0]) and np.array_equal(np.asarray(out[1:]), np.asarray(clean[1:]))


# --------------------------------------------------------------------------- #
# Bad input: clear errors before any kernel runs                               #
# --------------------------------------------------------------------------- #
@pytest.fixture
def no_kernel(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel ran before validation")
    monkeypatch.setattr(core_tdt, "_run_tables", boom)


@pytest.mark.parametrize("durations,err,match", [
    ([0], ValueError, "at least one positive"),
    ([], ValueError, "non-empty"),
    ([0, -1, 2], ValueError, ">= 0"),
    ([0, 1, 1], ValueError, "distinct"),
    ([0, 1.5, 2], TypeError, "list/tuple of ints"),
    ("012", TypeError, "list/tuple of ints"),
])
def test_bad_durations(durations, err, match, no_kernel):
    logits, targets, il, tl = _case(17)
    for frontend, x in ((dt, torch.tensor(logits)), (dj, jnp.asarray(logits))):
        tg = torch.tensor(targets) if frontend is dt else targets
        with pytest.raises(err, match=f"tdt_loss: argument 'durations' must.*{match}"):
            frontend.tdt_loss(x, tg, tuple(il), tuple(tl), 3, durations)


@pytest.mark.parametrize("kw,err,match", [
    ({"durations": [0, 1, 2, 3, 4, 5, 6, 7]}, ValueError,
     r"argument 'logits' must have a last axis of V \+ D with V >= 1 and D = len\(durations\) = 8"),
    ({"blank": 4}, ValueError, r"argument 'blank' must be in \[-4, 4\), got 4"),
    ({"omega": 1.5}, ValueError, r"argument 'omega' must be in \[0, 1\]"),
    ({"sigma": float("nan")}, ValueError, "argument 'sigma' must be finite"),
    ({"fastemit_lambda": -0.1}, ValueError, "argument 'fastemit_lambda' must be >= 0"),
    ({"reduction": "mean_batch"}, ValueError, "argument 'reduction' must be one of"),
    ({"targets_blank": True}, ValueError, r"argument 'targets' must not contain the blank \(3\)"),
    ({"il": [5, 1, 1]}, ValueError, r"argument 'logit_lengths' must be in \[0, 4\]"),
])
def test_bad_arguments(kw, err, match, no_kernel):
    logits, targets, il, tl = _case(18)
    kw = dict(kw)
    if kw.pop("targets_blank", False):
        targets = targets.copy()
        targets[0, 0] = 3
    il = kw.pop("il", il)
    args = dict(blank=3, durations=[0, 1, 2])
    args.update(kw)
    for frontend, x in ((dt, torch.tensor(logits)), (dj, jnp.asarray(logits))):
        tg = torch.tensor(targets) if frontend is dt else targets
        with pytest.raises(err, match=f"tdt_loss: {match}"):
            frontend.tdt_loss(x, tg, tuple(int(i) for i in il), tuple(tl), **args)


@pytest.mark.parametrize("frontend", ["torch", "jax"])
def test_impl_seam(frontend, no_kernel):
    logits, targets, il, tl = _case(20)
    f = dt.tdt_loss if frontend == "torch" else dj.tdt_loss
    x = torch.tensor(logits) if frontend == "torch" else jnp.asarray(logits)
    tg = torch.tensor(targets) if frontend == "torch" else targets
    if frontend == "torch":  # the Triton path (tests/test_device_tdt_torch.py): on CPU
        # tensors only under TRITON_INTERPRET=1, else a RuntimeError before any kernel
        with pytest.raises(RuntimeError, match="tdt_loss: impl='device'"):
            f(x, tg, tuple(il), tuple(tl), 3, [0, 1, 2], impl="device")
    with pytest.raises(ValueError, match="tdt_loss: argument 'impl' must be one of"):
        f(x, tg, tuple(il), tuple(tl), 3, [0, 1, 2], impl="gpu")


def test_impl_host_is_auto():
    logits, targets, il, tl = _case(21)
    a, _ = _torch(logits, targets, il, tl, 3, (0, 1, 2), impl="host")
    b, _ = _torch(logits, targets, il, tl, 3, (0, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert dt.TDTLoss(3, [0, 1], impl="device").impl == "device"
    with pytest.raises(ValueError, match="TDTLoss: argument 'impl' must be one of"):
        dt.TDTLoss(3, [0, 1], impl="gpu")


def test_module_validates_at_construction():
    with pytest.raises(ValueError, match="TDTLoss: argument 'durations' must hold distinct"):
        dt.TDTLoss(3, [1, 1])
    with pytest.raises(ValueError, match="TDTLoss: argument 'omega' must be in"):
        dt.TDTLoss(3, [0, 1], omega=-0.1)


def test_durations_order_and_itertools_agree():
    """The duration logits follow the order of ``durations``: permuting both
    together leaves the loss unchanged."""
    logits, targets, il, tl = _case(19, durations=(0, 1, 3))
    base, _ = _torch(logits, targets, il, tl, 3, (0, 1, 3))
    for perm in itertools.permutations(range(3)):
        p = list(perm)
        permuted = np.concatenate([logits[..., :4], logits[..., 4:][..., p]], axis=-1)
        out, _ = _torch(permuted, targets, il, tl, 3, tuple((0, 1, 3)[i] for i in p))
        np.testing.assert_allclose(out, base, rtol=1e-13)


def test_parallel_batch_equals_one_sequence_at_a_time():
    """A batch big enough for the parallel kernel (>= 20,000 lattice cells) gives
    each sequence the bits of its own serial call."""
    logits, targets, il, tl = _case(22, n=4, t=60, u=89, v=4, durations=(0, 1, 2),
                                    il=[60, 41, 60, 7], tl=[30, 89, 0, 5], dtype=np.float32)
    assert logits.shape[0] * logits.shape[1] * logits.shape[2] >= core_tdt._PARALLEL_MIN_CELLS
    for omega in (0.0, 0.5):
        loss, g = core_tdt.tdt_loss_and_grad(logits, targets, il, tl, blank=3,
                                             durations=(0, 1, 2), sigma=0.05, omega=omega)
        for b in range(4):
            lb, gb = core_tdt.tdt_loss_and_grad(logits[b:b + 1], targets[b:b + 1], il[b:b + 1],
                                                tl[b:b + 1], blank=3, durations=(0, 1, 2),
                                                sigma=0.05, omega=omega)
            np.testing.assert_array_equal(loss[b:b + 1], lb)
            np.testing.assert_array_equal(g[b:b + 1], gb)
    assert np.isfinite(loss).all() and g.any()
