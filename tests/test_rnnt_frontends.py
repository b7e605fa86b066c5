"""rnnt_loss / RNNTLoss / rnnt_align in torch and JAX against independent references.

References: brute-force enumeration of every RNN-T alignment written in torch
float64 (its autograd gives the reference gradient, including FastEmit and the
delay penalty), Graves' alpha recursion directly on the log-softmax, float64
gradcheck / jax check_grads, and warprnnt-numba (NeMo's numba port) when it is
importable.  torchaudio's rnnt_loss cannot be loaded with this CPU-only torch
build, so it is not a peer here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.test_util import check_grads

import duoloss.jax as dj
import duoloss.torch as dt
from rnnt_reference import lattice_paths


# --------------------------------------------------------------------------- #
# References                                                                   #
# --------------------------------------------------------------------------- #
def _alignments(tb, ub):
    """Every RNN-T alignment: moves ('x', u, t) (emit target u at frame t) and ('y', u, t)
    (blank at frame t), the last move the final blank; no frames and no targets: one empty path."""
    if tb == 0:
        return [] if ub > 0 else [[]]
    return lattice_paths(ub, tb, modified=False, last_is_blank=True)


def brute_losses(logits, targets, il, tl, blank, fused=True, fastemit=0.0, delay=0.0):
    """Per-sequence losses (torch float64, differentiable) by enumeration."""
    lp = torch.log_softmax(logits, -1) if fused else logits
    out = []
    for b in range(logits.shape[0]):
        tb, ub = int(il[b]), int(tl[b])
        scores = []
        for path in _alignments(tb, ub):
            s = torch.zeros((), dtype=lp.dtype)
            for k, u, t in path:
                if k == "y":
                    s = s + lp[b, t, u, blank]
                else:
                    x = lp[b, t, u, int(targets[b, u])]
                    if fastemit:
                        x = x * (1 + fastemit) - fastemit * x.detach()  # scales the gradient
                    s = s + x + delay * ((tb - 1) / 2 - t)
            scores.append(s)
        if not scores:
            out.append(torch.tensor(np.inf, dtype=lp.dtype) + 0 * lp[b].sum())
            continue
        nll = -torch.logsumexp(torch.stack(scores), 0)
        out.append(nll + fastemit * nll.detach())
    return torch.stack(out)


def brute_best(logits, targets, il, tl, blank):
    """Best alignment's score and token sequence (numpy float64)."""
    lp = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), -1).numpy()
    res = []
    for b in range(lp.shape[0]):
        best, arg = -np.inf, None
        for path in _alignments(int(il[b]), int(tl[b])):
            s = sum(lp[b, t, u, blank] if k == "y" else lp[b, t, u, targets[b, u]]
                    for k, u, t in path)
            if s > best:
                best, arg = s, path
        toks = None if arg is None else [blank if k == "y" else int(targets[b, u])
                                         for k, u, t in arg]
        res.append((best, toks))
    return res


def graves(logits, targets, tb, ub, blank):
    """Graves' forward recursion on log_softmax(logits) for one sequence."""
    lp = torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), -1).numpy()
    a = np.full((tb, ub + 1), -np.inf)
    a[0, 0] = 0.0
    for t in range(tb):
        for u in range(ub + 1):
            if t == 0 and u == 0:
                continue
            v = -np.inf
            if t > 0:
                v = np.logaddexp(v, a[t - 1, u] + lp[t - 1, u, blank])
            if u > 0:
                v = np.logaddexp(v, a[t, u - 1] + lp[t, u - 1, targets[u - 1]])
            a[t, u] = v
    return -(a[tb - 1, ub] + lp[tb - 1, ub, blank])


def _case(seed, n=3, t=4, u=3, v=5, blank=-1, dtype=np.float64):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, t, u + 1, v)).astype(dtype)
    b = blank % v
    labels = [k for k in range(v) if k != b]
    targets = rng.choice(labels, size=(n, u)).astype(np.int32)
    il = np.array([t, max(1, t - 1), 2][:n] + [t] * max(0, n - 3), np.int32)
    tl = np.array([u, 1, 0][:n] + [u] * max(0, n - 3), np.int32)
    return logits, targets, il, tl


def _torch_loss_grad(logits, targets, il, tl, **kw):
    x = torch.tensor(logits, requires_grad=True)
    loss = dt.rnnt_loss(x, torch.tensor(targets), torch.tensor(il), torch.tensor(tl), **kw)
    (g,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach().numpy(), g.numpy()


def _jax_loss_grad(logits, targets, il, tl, **kw):
    f = lambda x: dj.rnnt_loss(x, targets, il, tl, **kw)  # noqa: E731
    loss = f(jnp.asarray(logits))
    g = jax.grad(lambda x: f(x).sum())(jnp.asarray(logits))
    return np.asarray(loss), np.asarray(g)


@pytest.fixture(autouse=True)
def _x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


# --------------------------------------------------------------------------- #
# Values and gradients                                                         #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("kw", [
    {},
    {"blank": 0},
    {"fused_log_softmax": False},
    {"fastemit_lambda": 0.3},
    {"delay_penalty": 0.25},
    {"blank": 2, "fastemit_lambda": 0.1, "delay_penalty": 0.5},
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_both_frontends_match_brute_force(kw):
    logits, targets, il, tl = _case(0, blank=kw.get("blank", -1))
    blank = kw.get("blank", -1) % logits.shape[-1]
    x = torch.tensor(logits, requires_grad=True)
    ref = brute_losses(x, targets, il, tl, blank, fused=kw.get("fused_log_softmax", True),
                       fastemit=kw.get("fastemit_lambda", 0.0), delay=kw.get("delay_penalty", 0.0))
    (rg,) = torch.autograd.grad(ref.sum(), x)
    tl_, tg_ = _torch_loss_grad(logits, targets, il, tl, reduction="none", **kw)
    jl_, jg_ = _jax_loss_grad(logits, targets, il, tl, reduction="none", **kw)
    np.testing.assert_allclose(tl_, ref.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(tg_, rg.numpy(), rtol=1e-10, atol=1e-12)
    # each framework computes its own log_softmax: the lattices agree to ~1 ulp
    # (the core itself is bit-identical: test_same_lattice_bit_identical_in_both_adapters)
    np.testing.assert_allclose(jl_, tl_, rtol=1e-14)
    np.testing.assert_allclose(jg_, tg_, rtol=1e-12, atol=1e-15)


def test_same_lattice_bit_identical_in_both_adapters():
    from duoloss.core import TRANSDUCER_KERNEL
    from duoloss.jax._adapter import apply_kernel as japply
    from duoloss.torch._adapter import apply_kernel as tapply

    rng = np.random.default_rng(21)
    px = rng.normal(size=(4, 3, 7)).astype(np.float32)
    py = rng.normal(size=(4, 4, 6)).astype(np.float32)
    bd = np.array([[0, 0, 3, 6], [0, 0, 2, 5], [0, 0, 0, 3], [0, 0, 1, 1]], np.int32)
    tx = torch.tensor(px, requires_grad=True)
    ty = torch.tensor(py, requires_grad=True)
    lt = tapply(TRANSDUCER_KERNEL, (tx, ty, torch.tensor(bd)), rnnt_type="regular")
    gt = torch.autograd.grad(lt.sum(), (tx, ty))
    f = lambda x, y: japply(TRANSDUCER_KERNEL, (x, y, jnp.asarray(bd)),  # noqa: E731
                            rnnt_type="regular")
    lj = f(jnp.asarray(px), jnp.asarray(py))
    gj = jax.grad(lambda x, y: f(x, y).sum(), argnums=(0, 1))(jnp.asarray(px), jnp.asarray(py))
    np.testing.assert_array_equal(np.asarray(lj), lt.detach().numpy())
    for a, b in zip(gj, gt):
        np.testing.assert_array_equal(np.asarray(a), b.numpy())


def test_matches_graves_recursion_larger():
    logits, targets, il, tl = _case(1, n=4, t=9, u=5, v=7)
    losses, _ = _torch_loss_grad(logits, targets, il, tl, reduction="none")
    for b in range(4):
        np.testing.assert_allclose(
            losses[b], graves(logits[b], targets[b], int(il[b]), int(tl[b]), 6), rtol=1e-12)


def test_gradcheck_torch_and_check_grads_jax():
    logits, targets, il, tl = _case(2, n=2, t=3, u=2, v=4)
    x = torch.tensor(logits, requires_grad=True)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    assert torch.autograd.gradcheck(lambda z: dt.rnnt_loss(z, *args, reduction="sum"), (x,))
    assert torch.autograd.gradcheck(
        lambda z: dt.rnnt_loss(z, *args, fused_log_softmax=False, delay_penalty=0.3), (x,))
    check_grads(lambda z: dj.rnnt_loss(z, targets, il, tl), (jnp.asarray(logits),),
                order=1, modes=("rev",))


def test_reductions_and_module():
    logits, targets, il, tl = _case(3)
    none, _ = _torch_loss_grad(logits, targets, il, tl, reduction="none")
    args = (torch.tensor(logits), torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    # torchaudio's 'mean' is the plain batch mean (no division by target lengths)
    np.testing.assert_allclose(dt.rnnt_loss(*args).item(), none.mean(), rtol=1e-14)
    np.testing.assert_allclose(dt.rnnt_loss(*args, reduction="sum").item(), none.sum(), rtol=1e-14)
    np.testing.assert_allclose(float(dj.rnnt_loss(*logits_targets(args))), none.mean(),
                               rtol=1e-14)
    m = dt.RNNTLoss(blank=-1, reduction="sum")
    np.testing.assert_allclose(m(*args).item(), none.sum(), rtol=1e-14)
    assert "reduction='sum'" in repr(m)
    # blank=-1 is V - 1; lengths as tuples
    v = logits.shape[-1]
    np.testing.assert_array_equal(
        dt.rnnt_loss(args[0], args[1], tuple(il.tolist()), tuple(tl.tolist()), blank=v - 1,
                     reduction="none").numpy(), none)


def logits_targets(args):
    return tuple(jnp.asarray(a.numpy()) for a in args)


def test_clamp_bounds_each_sequence_gradient():
    logits, targets, il, tl = _case(4)
    logits = logits * 4  # sharp distributions: large gradients
    _, g = _torch_loss_grad(logits, targets, il, tl, reduction="none")
    for red, scale in (("sum", 1.0), ("mean", 1.0 / logits.shape[0])):
        _, gc = _torch_loss_grad(logits, targets, il, tl, reduction=red, clamp=0.2)
        np.testing.assert_allclose(gc, np.clip(g, -0.2, 0.2) * scale, rtol=1e-14, atol=1e-17)
        _, jc = _jax_loss_grad(logits, targets, il, tl, reduction=red, clamp=0.2)
        np.testing.assert_allclose(jc, gc, rtol=1e-12, atol=1e-16)
    # clamp does not change the loss value
    l0, _ = _torch_loss_grad(logits, targets, il, tl)
    l1, _ = _torch_loss_grad(logits, targets, il, tl, clamp=0.2)
    assert l0 == l1


def test_warprnnt_numba_peer():
    wn = pytest.importorskip("warprnnt_numba.rnnt_loss.rnnt_pytorch")
    logits, targets, il, tl = _case(5, n=4, t=7, u=4, v=6, blank=0)
    for lam in (0.0, 0.4):
        x = torch.tensor(logits, requires_grad=True)
        ref = wn.rnnt_loss(x, torch.tensor(targets), torch.tensor(il), torch.tensor(tl),
                           blank=0, reduction="none", fastemit_lambda=lam)
        (rg,) = torch.autograd.grad(ref.sum(), x)
        ours, g = _torch_loss_grad(logits, targets, il, tl, blank=0, reduction="none",
                                   fastemit_lambda=lam)
        np.testing.assert_allclose(ours, ref.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(g, rg.numpy(), rtol=1e-10, atol=1e-13)


# --------------------------------------------------------------------------- #
# Paths agree: no_grad, compile, torch.func, jit, vmap, dtypes                 #
# --------------------------------------------------------------------------- #
def test_no_grad_equals_with_grad_and_value_and_grad():
    logits, targets, il, tl = _case(6, n=5, t=6, u=3, v=5, dtype=np.float32)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    with torch.no_grad():
        a = dt.rnnt_loss(torch.tensor(logits), *args, reduction="none")
    b = dt.rnnt_loss(torch.tensor(logits, requires_grad=True), *args, reduction="none")
    np.testing.assert_array_equal(a.numpy(), b.detach().numpy())
    f = lambda x: dj.rnnt_loss(x, targets, il, tl, reduction="sum")  # noqa: E731
    v, _ = jax.value_and_grad(f)(jnp.asarray(logits))
    assert float(v) == float(f(jnp.asarray(logits)))
    np.testing.assert_allclose(float(v), float(b.detach().sum()), rtol=1e-6)


def test_torch_compile_fullgraph_matches_eager():
    logits, targets, il, tl = _case(7, dtype=np.float32)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))

    def f(x, tg, a, b):
        return dt.rnnt_loss(x, tg, a, b, clamp=0.5, fastemit_lambda=0.1)

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    x1 = torch.tensor(logits, requires_grad=True)
    x2 = torch.tensor(logits, requires_grad=True)
    l1, l2 = f(x1, *args), cf(x2, *args)
    l1.backward()
    l2.backward()
    assert l1.item() == l2.item()
    # CPU tensors: the normaliser is the same core kernel (a torch.library op) on
    # both paths, so the gradient is the same bits
    torch.testing.assert_close(x1.grad, x2.grad, rtol=0, atol=0)


def test_torch_func_grad_and_vmap():
    logits, targets, il, tl = _case(8)
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    x = torch.tensor(logits)
    g = torch.func.grad(lambda z: dt.rnnt_loss(z, *args, clamp=0.3, fastemit_lambda=0.2))(x)
    xe = x.clone().requires_grad_()
    dt.rnnt_loss(xe, *args, clamp=0.3, fastemit_lambda=0.2).backward()
    torch.testing.assert_close(g, xe.grad, rtol=0, atol=0)
    # vmap over a stack of logits batches
    xs = torch.stack([x, x * 0.5])
    vm = torch.func.vmap(lambda z: dt.rnnt_loss(z, *args, reduction="none"))(xs)
    for i in range(2):
        np.testing.assert_array_equal(
            vm[i].numpy(), dt.rnnt_loss(xs[i], *args, reduction="none").numpy())
    # vmap of grad: the normaliser's backward op under vmap (its rule folds the
    # vmapped dimension into the rows)
    gv = torch.func.vmap(torch.func.grad(lambda z: dt.rnnt_loss(z, *args, clamp=0.3)))(xs)
    for i in range(2):
        gi = torch.func.grad(lambda z: dt.rnnt_loss(z, *args, clamp=0.3))(xs[i])
        torch.testing.assert_close(gv[i], gi, rtol=0, atol=0)


def test_jax_jit_and_vmap():
    logits, targets, il, tl = _case(9)
    f = lambda x, tg, a, b: dj.rnnt_loss(x, tg, a, b, reduction="none")  # noqa: E731
    eager = f(jnp.asarray(logits), targets, il, tl)
    jitted = jax.jit(f)(jnp.asarray(logits), targets, il, tl)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(eager))
    xs = jnp.stack([jnp.asarray(logits), jnp.asarray(logits) * 2])
    vm = jax.vmap(f, in_axes=(0, None, None, None))(xs, targets, il, tl)
    np.testing.assert_array_equal(np.asarray(vm[1]), np.asarray(f(xs[1], targets, il, tl)))
    gj = jax.jit(jax.grad(lambda x: f(x, targets, il, tl).sum()))(jnp.asarray(logits))
    _, ge = _jax_loss_grad(logits, targets, il, tl, reduction="sum")
    np.testing.assert_allclose(np.asarray(gj), ge, rtol=1e-13, atol=1e-16)


def test_traced_invalid_label_gives_nan_for_that_sequence_only():
    logits, targets, il, tl = _case(10)
    bad = targets.copy()
    bad[0, 1] = logits.shape[-1] - 1  # the blank
    out = jax.jit(lambda tg: dj.rnnt_loss(logits, tg, il, tl, reduction="none"))(bad)
    clean = dj.rnnt_loss(logits, targets, il, tl, reduction="none")
    assert np.isnan(out[0]) and np.array_equal(np.asarray(out[1:]), np.asarray(clean[1:]))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_upcast(half):
    logits, targets, il, tl = _case(11, dtype=np.float32)
    x = torch.tensor(logits).to(half).requires_grad_()
    args = (torch.tensor(targets), torch.tensor(il), torch.tensor(tl))
    loss = dt.rnnt_loss(x, *args, reduction="none")
    ref = dt.rnnt_loss(x.detach().float(), *args, reduction="none")
    assert loss.dtype == torch.float32
    np.testing.assert_array_equal(loss.detach().numpy(), ref.numpy())
    loss.sum().backward()
    assert x.grad.dtype == half and torch.isfinite(x.grad.float()).all()
    jl = dj.rnnt_loss(jnp.asarray(x.detach().float().numpy()).astype(
        jnp.float16 if half == torch.float16 else jnp.bfloat16), targets, il, tl,
        reduction="none")
    # float32 normalisers come from each framework's own logsumexp: ~1 ulp apart
    np.testing.assert_allclose(np.asarray(jl), ref.numpy(), rtol=1e-6)


def test_float32_close_to_float64():
    logits, targets, il, tl = _case(12, n=4, t=20, u=6, v=9)
    l64, g64 = _torch_loss_grad(logits, targets, il, tl, reduction="none")
    l32, g32 = _torch_loss_grad(logits.astype(np.float32), targets, il, tl, reduction="none")
    np.testing.assert_allclose(l32, l64, rtol=1e-5)
    np.testing.assert_allclose(g32, g64, atol=1e-5)


# --------------------------------------------------------------------------- #
# Edge cases                                                                   #
# --------------------------------------------------------------------------- #
def test_zero_lengths_and_empty_batch():
    logits, targets, _, _ = _case(13, n=3)
    il = np.array([0, 0, 4], np.int32)
    tl = np.array([0, 2, 0], np.int32)
    for loss, g in (_torch_loss_grad(logits, targets, il, tl, reduction="none"),
                    _jax_loss_grad(logits, targets, il, tl, reduction="none")):
        assert loss[0] == 0.0 and loss[1] == np.inf and np.isfinite(loss[2])
        assert np.all(g[:2] == 0) and np.isfinite(g).all()
    # only blanks: -sum_t log p(blank | t, 0)
    lp = torch.log_softmax(torch.tensor(logits[2]), -1).numpy()
    np.testing.assert_allclose(_torch_loss_grad(logits, targets, il, tl, reduction="none")[0][2],
                               -lp[:4, 0, -1].sum(), rtol=1e-13)
    empty = np.zeros((0, 4, 4, 5))
    e_t = dt.rnnt_loss(torch.tensor(empty), torch.zeros((0, 3), dtype=torch.int32),
                       torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
    e_j = dj.rnnt_loss(empty, np.zeros((0, 3), np.int32), np.zeros(0, np.int32),
                       np.zeros(0, np.int32))
    assert e_t.item() == 0.0 and float(e_j) == 0.0


def test_minus_inf_logits_are_probability_zero():
    logits, targets, il, tl = _case(14)
    logits[:, :, :, 1] = -np.inf  # class 1 never emitted; the targets avoid it
    targets = np.where(targets == 1, 2, targets).astype(np.int32)
    loss, g = _torch_loss_grad(logits, targets, il, tl, reduction="none")
    ref = logits.copy()
    ref[:, :, :, 1] = -1e4
    rl, rg = _torch_loss_grad(ref, targets, il, tl, reduction="none")
    np.testing.assert_allclose(loss, rl, rtol=1e-13)
    assert np.isfinite(g).all()
    np.testing.assert_allclose(g, rg, atol=1e-13)


def test_nan_stays_in_its_sequence():
    logits, targets, il, tl = _case(15)
    dirty = logits.copy()
    dirty[1, 0, 0, 0] = np.nan
    dirty[2, 3, 3, 0] = np.nan  # beyond sequence 2's lengths (T_b = 2, U_b = 0)
    # each frontend against its own clean run (their normalisers differ in the
    # last bits: torch's CPU kernel vs XLA's log_softmax)
    for run in (_torch_loss_grad, _jax_loss_grad):
        clean, cg = run(logits, targets, il, tl, reduction="none")
        loss, g = run(dirty, targets, il, tl, reduction="none")
        assert np.isnan(loss[1]) and np.isnan(g[1]).any()
        np.testing.assert_array_equal(loss[[0, 2]], clean[[0, 2]])
        np.testing.assert_allclose(g[[0, 2]], cg[[0, 2]], rtol=1e-12, atol=1e-16)


# --------------------------------------------------------------------------- #
# rnnt_align                                                                   #
# --------------------------------------------------------------------------- #
def test_rnnt_align_matches_brute_force_in_both_frontends():
    logits, targets, il, tl = _case(16, n=4, t=5, u=3, v=5)
    il[3], tl[3] = 0, 1  # no frame for a label: infeasible
    at, ft, st = dt.rnnt_align(torch.tensor(logits), torch.tensor(targets), torch.tensor(il),
                               torch.tensor(tl))
    aj, fj, sj = jax.jit(dj.rnnt_align)(logits, targets, il, tl)
    np.testing.assert_array_equal(np.asarray(aj), at.numpy())
    np.testing.assert_array_equal(np.asarray(fj), ft.numpy())
    np.testing.assert_allclose(np.asarray(sj), st.numpy(), rtol=1e-14)
    assert at.shape == (4, 5 + 3) and ft.shape == (4, 3)
    for b, (best, toks) in enumerate(brute_best(logits, targets, il, tl, 4)):
        if toks is None:
            assert st[b] == -np.inf and torch.all(at[b] == -1) and torch.all(ft[b] == -1)
            continue
        np.testing.assert_allclose(st[b].item(), best, rtol=1e-12)
        n_tok = int(il[b] + tl[b])
        assert at[b, :n_tok].tolist() == toks and torch.all(at[b, n_tok:] == -1)
        # label_frames: the number of blanks before each label
        frames = [toks[:i].count(4) for i, k in enumerate(toks) if k != 4]
        assert ft[b, :tl[b]].tolist() == frames and torch.all(ft[b, tl[b]:] == -1)


def test_rnnt_align_score_bounds_loss():
    # the best path's probability is at most the total: -score >= loss
    logits, targets, il, tl = _case(17, n=3, t=6, u=3, v=6)
    _, _, st = dt.rnnt_align(torch.tensor(logits), torch.tensor(targets), torch.tensor(il),
                             torch.tensor(tl))
    loss, _ = _torch_loss_grad(logits, targets, il, tl, reduction="none")
    assert np.all(-st.numpy() >= loss - 1e-12)
