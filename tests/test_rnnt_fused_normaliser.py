"""The fused normaliser + gather of the RNN-T frontends (issue #11 speed work).

The core's one-pass kernels (:mod:`duoloss.core.losses.joiner`, what torch CPU
tensors take) are checked against torch's ``log_softmax`` and autograd on rows
of every width around the kernels' 32-wide blocks, NaN/inf rows and the row
sentinels; the torch frontend (CPU kernels and the torch-op formula GPU tensors
take) and the JAX custom backward against an independent float64 reference
written here (plain torch autograd through ``log_softmax``, gathers and the
alpha recursion), and against each other.
"""
import numpy as np
import pytest
import torch

import duoloss.torch as dt
import duoloss.torch._rnnt as trnnt


def _reference(logits, targets, il, tl, blank):
    """Per-sequence RNN-T NLL by the textbook alpha recursion, torch autograd."""
    lp = torch.log_softmax(logits, dim=-1)
    out = []
    for b in range(logits.shape[0]):
        t_b, u_b = int(il[b]), int(tl[b])
        alpha = {}
        for t in range(t_b):
            for u in range(u_b + 1):
                terms = []
                if t == 0 and u == 0:
                    terms.append(lp.new_zeros(()))
                if t > 0:
                    terms.append(alpha[t - 1, u] + lp[b, t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[t, u - 1] + lp[b, t, u - 1, int(targets[b, u - 1])])
                alpha[t, u] = torch.logsumexp(torch.stack(terms), 0)
        out.append(-(alpha[t_b - 1, u_b] + lp[b, t_b - 1, u_b, blank]))
    return torch.stack(out)


def _case(seed=0, n=3, t=5, u=3, v=7):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, t, u + 1, v))
    tg = rng.integers(1, v, (n, u))
    il = np.array([t, t - 2, 1])[:n]
    tl = np.array([u, 1, 0])[:n]
    return x, tg, il, tl


def _torch_loss_grad(x, tg, il, tl, dtype=torch.float64, **kw):
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    loss = dt.rnnt_loss(xt, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), blank=0,
                        reduction="none", **kw)
    w = torch.arange(1.0, x.shape[0] + 1, dtype=xt.dtype)  # distinct cotangents per sequence
    (loss * w).sum().backward()
    return loss.detach().numpy(), xt.grad.numpy()


def _core_reference(x, labels, blank, g_label, g_blank):
    """float64 torch autograd through log_softmax and the two gathers."""
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(xt, -1)
    rows = torch.arange(x.shape[0])
    lab = torch.tensor(np.clip(labels, 0, None))
    has = torch.tensor(labels >= 0)
    act = torch.tensor(labels != -2)
    label = torch.where(has, lp[rows, lab], torch.tensor(-np.inf, dtype=torch.float64))
    blk = lp[:, blank]
    tot = (torch.where(has & act, label, 0.0) * torch.tensor(g_label)).sum() \
        + (torch.where(act, blk, 0.0) * torch.tensor(g_blank)).sum()
    tot.backward()
    return label.detach().numpy(), blk.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_cls", [1, 2, 7, 28, 31, 32, 33, 64, 95, 500])
def test_core_kernel_matches_torch_log_softmax(dtype, n_cls):
    from duoloss.core.losses.joiner import log_softmax_gather, log_softmax_gather_grad

    rng = np.random.default_rng(n_cls)
    r = 300
    x = (rng.standard_normal((r, n_cls)) * 6).astype(dtype)
    x[5, -1] = 80.0                      # a large logit: max-shifted sums must not overflow
    x[6, 0] = -1e30
    labels = rng.integers(0, n_cls, r)
    labels[7] = -1
    labels[8] = -2
    blank = n_cls - 1
    g_label = rng.standard_normal(r)
    g_blank = rng.standard_normal(r)
    g_label[9] = g_blank[9] = 0.0
    lab, blk, lse = log_softmax_gather(x, labels, blank)
    grad = log_softmax_gather_grad(x, lse, labels, blank, g_label, g_blank)
    rl, rb, rg = _core_reference(x.astype(np.float64), labels, blank, g_label, g_blank)
    act = labels != -2
    tol = dict(rtol=1e-13, atol=1e-13) if dtype == np.float64 else dict(rtol=2e-6, atol=2e-6)
    assert lab.dtype == blk.dtype == grad.dtype == dtype and lse.dtype == np.float64
    np.testing.assert_allclose(blk[act], rb[act], **tol)
    has = act & (labels >= 0)
    np.testing.assert_allclose(lab[has], rl[has], **tol)
    assert np.all(lab[labels == -1] == -np.inf)
    assert lab[8] == blk[8] == 0.0 and np.all(grad[8] == 0.0) and np.all(grad[9] == 0.0)
    np.testing.assert_allclose(grad, rg, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_cls", [5, 28, 300])
def test_core_kernel_rows_on_both_sides_of_the_unshifted_range(dtype, n_cls):
    # rows whose normaliser lies inside the range where the kernels skip the max
    # shift (float32 [-16, 80], float64 [-500, 690]), on its edges and outside
    # (the max-shifted path): every row matches torch's float64 log_softmax
    from duoloss.core.losses.joiner import log_softmax_gather, log_softmax_gather_grad

    rng = np.random.default_rng(n_cls)
    shifts = [-1e4, -700, -501, -499, -100, -30, -17, -16.5, -15.5, -3, 0, 10, 60, 79, 80.5,
              85, 87.9, 88.5, 95, 300, 650, 689, 691, 1e4]
    if dtype == np.float32:
        shifts = [c for c in shifts if abs(c) < 1e4]
    r = len(shifts) * 3
    x = rng.standard_normal((r, n_cls))
    x[1::3] *= 30                          # wide rows: entries far below the row's max
    x[2::3, 1:] = -200.0                   # one dominant entry
    x += np.repeat(shifts, 3)[:, None]
    x = x.astype(dtype)
    labels = rng.integers(0, n_cls, r)
    g_label = rng.standard_normal(r)
    g_blank = rng.standard_normal(r)
    lab, blk, lse = log_softmax_gather(x, labels, 0)
    grad = log_softmax_gather_grad(x, lse, labels, 0, g_label, g_blank)
    rl, rb, rg = _core_reference(x.astype(np.float64), labels, 0, g_label, g_blank)
    tol = dict(rtol=1e-13, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(blk, rb, **tol)
    np.testing.assert_allclose(lab, rl, **tol)
    np.testing.assert_allclose(grad, rg, **tol)
    # softmax entries the kernels drop are far below the dtype's resolution
    assert np.all(np.abs(grad - rg)[grad == 0] <= (1e-30 if dtype == np.float32 else 1e-200))


def test_core_kernel_nan_and_inf_rows_follow_torch():
    from duoloss.core.losses.joiner import log_softmax_gather, log_softmax_gather_grad

    x = np.zeros((6, 40))
    x[0, 3] = np.nan         # NaN inside: row NaN
    x[1, 0] = np.nan         # NaN first
    x[2, 7] = np.inf         # +inf: NaN, as torch.log_softmax
    x[3, :] = -np.inf        # all -inf: no probability to share, -inf (torch: NaN)
    x[4, 5] = -np.inf        # one -inf: finite, its gradient exactly 0
    labels = np.full(6, 5)
    for dtype in (np.float32, np.float64):
        xd = x.astype(dtype)
        lab, blk, lse = log_softmax_gather(xd, labels, 0)
        ref = torch.log_softmax(torch.tensor(xd), -1)[:, 0].numpy()
        assert np.array_equal(np.isnan(blk[:3]), np.isnan(ref[:3])) and np.isnan(blk[:3]).all()
        assert blk[3] == lab[3] == lse[3] == -np.inf and np.isfinite(blk[4:]).all()
        g = log_softmax_gather_grad(xd, lse, labels, 0, np.ones(6), np.ones(6))
        assert np.isnan(g[:3]).all(axis=1).all() and np.isfinite(g[3:]).all()
        onehots = np.zeros(40)
        onehots[[0, 5]] = 1.0    # the all -inf row: a zero softmax term, the cotangents
        assert np.array_equal(g[3], onehots.astype(dtype))
        assert g[4, 5] == 1.0    # softmax 0 (exactly), plus the label's own cotangent
        # no cotangent: a zero row, even where the row is NaN
        g0 = log_softmax_gather_grad(xd, lse, labels, 0, np.zeros(6), np.zeros(6))
        assert np.all(g0 == 0.0)


@pytest.mark.parametrize("bad, err, match", [
    (dict(x=np.zeros((3, 4), np.int64)), TypeError, "'x' must be a 2-D float32/float64"),
    (dict(x=np.zeros((3,))), TypeError, "'x' must be a 2-D"),
    (dict(labels=np.zeros(2, np.int64)), ValueError, "'labels' must have 3 entries"),
    (dict(labels=np.array([0, 4, 0])), ValueError, r"'labels' must lie in \[-2, 3\]"),
    (dict(labels=np.array([0, -3, 0])), ValueError, r"'labels' must lie in \[-2, 3\]"),
    (dict(blank=4), ValueError, r"'blank' must lie in \[0, 3\], got 4"),
    (dict(blank=-1), ValueError, "'blank' must lie in"),
])
def test_core_kernel_bad_input(bad, err, match):
    from duoloss.core.losses.joiner import log_softmax_gather

    kw = dict(x=np.zeros((3, 4)), labels=np.zeros(3, np.int64), blank=0)
    kw.update(bad)
    with pytest.raises(err, match="log_softmax_gather: " + match):
        log_softmax_gather(**kw)


def test_core_grad_out_argument_checked():
    from duoloss.core.losses.joiner import log_softmax_gather_grad

    x = np.zeros((3, 4))
    args = (x, np.zeros(3), np.zeros(3, np.int64), 0, np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="log_softmax_gather_grad: 'out' must be"):
        log_softmax_gather_grad(*args, out=np.zeros((3, 4), np.float32))
    with pytest.raises(ValueError, match="log_softmax_gather_grad: 'lse' must have 3"):
        log_softmax_gather_grad(x, np.zeros(2), *args[2:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_matches_reference(dtype):
    x, tg, il, tl = _case()
    loss, grad = _torch_loss_grad(x, tg, il, tl, dtype=dtype)
    xr = torch.tensor(x, requires_grad=True)
    ref = _reference(xr, tg, il, tl, 0)
    (ref * torch.arange(1.0, 4.0, dtype=xr.dtype)).sum().backward()
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, ref.detach().numpy(), **tol)
    np.testing.assert_allclose(grad, xr.grad.numpy(), **tol)


def test_torch_cpu_kernels_agree_with_the_device_formula(monkeypatch):
    """The CPU kernels and the torch-op formula that GPU tensors take."""
    x, tg, il, tl = _case(1)
    cpu = _torch_loss_grad(x, tg, il, tl)
    monkeypatch.setattr(trnnt._joiner, "supported", lambda x: False)
    formula = _torch_loss_grad(x, tg, il, tl)
    np.testing.assert_allclose(cpu[0], formula[0], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(cpu[1], formula[1], rtol=1e-12, atol=1e-14)


def test_torch_func_grad_is_bit_identical_to_eager():
    x, tg, il, tl = _case(6)
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    eager = _torch_loss_grad(x, tg, il, tl)[1] / 1.0
    w = torch.arange(1.0, x.shape[0] + 1, dtype=torch.float64)
    g = torch.func.grad(lambda z: (dt.rnnt_loss(z, *args, blank=0, reduction="none") * w).sum())
    assert np.array_equal(g(torch.tensor(x)).numpy(), eager)


def test_torch_no_grad_loss_is_bit_identical_and_retain_graph_works():
    x, tg, il, tl = _case(2)
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    with torch.no_grad():
        plain = dt.rnnt_loss(torch.tensor(x), *args, blank=0, reduction="none")
    xt = torch.tensor(x, requires_grad=True)
    loss = dt.rnnt_loss(xt, *args, blank=0, reduction="sum")
    g1, = torch.autograd.grad(loss, xt, retain_graph=True)
    g2, = torch.autograd.grad(loss, xt)
    assert torch.equal(g1, g2)
    with_grad = dt.rnnt_loss(xt, *args, blank=0, reduction="none").detach()
    assert torch.equal(plain, with_grad)


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_torch_nan_in_padding_stays_out(monkeypatch, cpu_kernels):
    if not cpu_kernels:
        monkeypatch.setattr(trnnt._joiner, "supported", lambda x: False)
    x, tg, il, tl = _case(3)
    clean = _torch_loss_grad(x, tg, il, tl)
    dirty = x.copy()
    dirty[2, 4, 3, :] = np.nan  # sequence 2 has T_b = 1, U_b = 0: a padded cell
    dirty[1, 0, 3, 2] = np.inf  # beyond U_b = 1 of sequence 1
    loss, grad = _torch_loss_grad(dirty, tg, il, tl)
    assert np.array_equal(loss, clean[0]) and np.array_equal(grad, clean[1])


def test_torch_fused_grad_matches_finite_differences():
    x, tg, il, tl = _case(4, n=2, t=3, u=2, v=4)
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    xt = torch.tensor(x, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda z: dt.rnnt_loss(z, *args, blank=0, reduction="none"), (xt,), eps=1e-6,
        atol=1e-7)


def test_jax_fused_backward_matches_reference_and_torch():
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj

    with jax.enable_x64(True):
        x, tg, il, tl = _case(5)
        w = np.arange(1.0, 4.0)
        f = jax.value_and_grad(lambda z: (dj.rnnt_loss(z, tg, il, tl, blank=0,
                                                        reduction="none") * w).sum())
        val, grad = f(jax.numpy.asarray(x))
        xr = torch.tensor(x, requires_grad=True)
        ref = (_reference(xr, tg, il, tl, 0) * torch.tensor(w)).sum()
        ref.backward()
        np.testing.assert_allclose(float(val), float(ref.detach()), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(grad), xr.grad.numpy(), rtol=1e-10, atol=1e-12)
        _, tgrad = _torch_loss_grad(x, tg, il, tl)
        np.testing.assert_allclose(np.asarray(grad), tgrad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_core_lattice_log_probs_match_torch_gathers(dtype):
    # transducer_log_probs = log_softmax + gathers + the core's (N, U, T + 1) /
    # (N, U + 1, T) layout with -inf past each sequence's frames; the gradient
    # against torch autograd through the same masks (padding gets exact zeros)
    from duoloss.core.losses.joiner import transducer_log_probs, transducer_log_probs_grad

    rng = np.random.default_rng(3)
    n, t, u, v = 4, 6, 3, 9
    x = (rng.standard_normal((n, t, u + 1, v)) * 3).astype(dtype)
    tg = rng.integers(1, v, (n, u))
    il = np.array([6, 4, 0, 2])
    tl = np.array([3, 1, 0, 2])
    x[1, 5, 0, 2] = np.nan                 # past sequence 1's frames: never read
    px, py, lse = transducer_log_probs(x, tg, il, tl, 0)
    assert px.shape == (n, u, t + 1) and py.shape == (n, u + 1, t) and lse.shape == (n, t, u + 1)
    # (the reference without the NaN: torch's softmax backward would spread it)
    xt = torch.tensor(np.nan_to_num(x.astype(np.float64)), requires_grad=True)
    lp = torch.log_softmax(xt, -1)
    ref_px = torch.full((n, u, t + 1), -np.inf, dtype=torch.float64)
    ref_py = torch.zeros((n, u + 1, t), dtype=torch.float64)
    for b in range(n):
        for tt in range(il[b]):
            for s in range(tl[b] + 1):
                ref_py[b, s, tt] = lp[b, tt, s, 0]
                if s < u:
                    ref_px[b, s, tt] = lp[b, tt, s, tg[b, s]]
            for s in range(tl[b] + 1, u):
                ref_px[b, s, tt] = 0.0     # never read: not computed
    tol = dict(rtol=1e-13, atol=1e-13) if dtype == np.float64 else dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(px, ref_px.detach().numpy(), **tol)
    np.testing.assert_allclose(py, ref_py.detach().numpy(), **tol)
    g_px = rng.standard_normal(px.shape) * np.isfinite(ref_px.detach().numpy())
    g_py = rng.standard_normal(py.shape)
    grad = transducer_log_probs_grad(x, lse, tg, il, tl, 0, g_px, g_py)
    keep = torch.isfinite(ref_px)
    ((torch.where(keep, ref_px, 0.0) * torch.tensor(g_px)).sum()
     + (ref_py * torch.tensor(g_py)).sum()).backward()
    assert grad.dtype == dtype and np.isfinite(grad).all()
    np.testing.assert_allclose(grad, xt.grad.numpy(), **tol)
    assert np.all(grad[2] == 0) and np.all(grad[1, 4:] == 0) and np.all(grad[0, :, 3:] != 0)


def test_core_lattice_log_probs_bad_input():
    from duoloss.core.losses.joiner import transducer_log_probs, transducer_log_probs_grad

    x = np.zeros((2, 3, 4, 5), np.float32)
    tg = np.ones((2, 3), np.int64)
    ln = np.array([3, 3])
    with pytest.raises(ValueError, match="transducer_log_probs: 'x' must be a 4-D"):
        transducer_log_probs(x[0], tg, ln, ln, 0)
    with pytest.raises(ValueError, match=r"'targets' must be an integer \(2, 3\) array"):
        transducer_log_probs(x, tg[:, :2], ln, ln, 0)
    with pytest.raises(ValueError, match=r"'logit_lengths' must be an integer \(2,\) array"):
        transducer_log_probs(x, tg, ln[:1], ln, 0)
    with pytest.raises(ValueError, match="'blank' must lie in"):
        transducer_log_probs(x, tg, ln, ln, 5)
    with pytest.raises(TypeError, match="transducer_log_probs: 'x' must be float32 or float64"):
        transducer_log_probs(x.astype(np.float16), tg, ln, ln, 0)
    px, py, lse = transducer_log_probs(x, tg, ln, ln, 0)
    with pytest.raises(ValueError, match=r"transducer_log_probs_grad: 'g_px' must be a float "
                                         r"array of shape \(2, 3, 4\)"):
        transducer_log_probs_grad(x, lse, tg, ln, ln, 0, py, px)
    with pytest.raises(ValueError, match=r"transducer_log_probs_grad: 'lse' must be a float "
                                         r"array of shape \(2, 3, 4\)"):
        transducer_log_probs_grad(x, lse[:1], tg, ln, ln, 0, px, py)
    with pytest.raises(ValueError, match="transducer_log_probs_grad: 'out' must be a writeable"):
        transducer_log_probs_grad(x, lse, tg, ln, ln, 0, px, py, out=np.zeros_like(x[:1]))
    out = np.full_like(x, np.nan)
    g_px, g_py = np.ones_like(px), np.ones_like(py)
    assert transducer_log_probs_grad(x, lse, tg, ln, ln, 0, g_px, g_py, out=out) is out
    assert np.isfinite(out).all()


def _general_path(monkeypatch):
    """Route ``rnnt_loss`` through the general path (lattice operators, lattice
    kernel, framework reduction) instead of the whole-loss one."""
    monkeypatch.setattr(trnnt, "_fusable", lambda *a: False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_torch_whole_loss_path_is_bit_identical_to_the_general_path(monkeypatch, dtype,
                                                                    reduction):
    """``rnnt_loss`` on CPU in eager mode with a reduced loss runs the whole loss
    one sequence at a time (gradient in the forward, for the cotangent
    ``backward()`` sends); the general path must give the same bits, for that
    cotangent and for any other (the fallback), and both match the reference."""
    x, tg, il, tl = _case(7)  # N = 3: the mean's 1/3 is not a power of two
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))

    def run(factor=None, clamp=-1):
        xt = torch.tensor(x, dtype=dtype, requires_grad=True)
        loss = dt.rnnt_loss(xt, *args, blank=0, reduction=reduction, clamp=clamp)
        (loss if factor is None else loss * factor).backward()
        return loss.detach(), xt.grad, type(loss.grad_fn).__name__

    whole = [run(), run(3.0), run(clamp=0.05)]
    assert {w[2] for w in whole} == {"_FusedRNNTBackward"}
    with monkeypatch.context() as m:
        _general_path(m)
        general = [run(), run(3.0), run(clamp=0.05)]
    assert "_FusedRNNTBackward" not in {g[2] for g in general}
    for (lw, gw, _), (lg, gg, _) in zip(whole, general):
        assert torch.equal(lw, lg) and torch.equal(gw, gg)
    xr = torch.tensor(x, requires_grad=True)
    ref = _reference(xr, tg, il, tl, 0)
    ref = ref.sum() if reduction == "sum" else ref.mean()
    ref.backward()
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(whole[0][0].double().numpy(), ref.detach().numpy(), **tol)
    np.testing.assert_allclose(whole[0][1].double().numpy(), xr.grad.numpy(), **tol)
    np.testing.assert_allclose(whole[1][1].double().numpy(), 3 * xr.grad.numpy(), **tol)


def test_torch_whole_loss_path_retain_graph_and_second_order(monkeypatch):
    x, tg, il, tl = _case(8)
    args = (torch.tensor(tg), torch.tensor(il), torch.tensor(tl))
    xt = torch.tensor(x, requires_grad=True)
    loss = dt.rnnt_loss(xt, *args, blank=0, reduction="mean")
    assert type(loss.grad_fn).__name__ == "_FusedRNNTBackward"
    g1, = torch.autograd.grad(loss, xt, retain_graph=True)
    g1c = g1.clone()
    g1.zero_()  # the first gradient is the caller's: changing it must not change the next
    g2, = torch.autograd.grad(loss, xt)
    assert torch.equal(g1c, g2)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(loss, xt)
    loss = dt.rnnt_loss(xt, *args, blank=0, reduction="sum")
    g, = torch.autograd.grad(loss, xt, create_graph=True)
    with pytest.raises(NotImplementedError, match="rnnt_loss"):
        g.sum().backward()
    _general_path(monkeypatch)
    ref, = torch.autograd.grad(dt.rnnt_loss(xt, *args, blank=0, reduction="sum"), xt)
    assert torch.equal(g.detach(), ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_core_rnnt_loss_from_logits_equals_the_three_steps(dtype):
    from duoloss.core.losses.joiner import (rnnt_loss_from_logits, transducer_log_probs,
                                            transducer_log_probs_grad)
    from duoloss.core.losses.transducer import transducer_loss_and_grad

    x, tg, il, tl = _case(9, n=4, t=6, u=3, v=33)
    x = x.astype(dtype)
    il = np.array([6, 4, 1, 0])
    tl = np.array([3, 1, 0, 0])
    x[1, 5] = np.nan  # past sequence 1's frames: stays out
    bd = np.stack([np.zeros(4), np.zeros(4), tl, il], 1).astype(np.int64)
    bd[3] = -1  # an invalid sequence: NaN loss (and NaN gradients), as the lattice kernel
    scale = float(np.float32(1) / np.float32(3)) if dtype == np.float32 else 0.3
    losses, lse, gx, gy, grad = rnnt_loss_from_logits(x, tg, il, tl, 0, bd, scale)
    px, py, lse3 = transducer_log_probs(x, tg, il, tl, 0)
    losses3, (gx3, gy3) = transducer_loss_and_grad(px, py, bd)
    sc = dtype(scale)
    grad3 = transducer_log_probs_grad(x, lse3, tg, il, tl, 0, gx3 * sc, gy3 * sc)
    assert np.array_equal(losses.astype(dtype), losses3, equal_nan=True)
    assert np.array_equal(lse, lse3)
    for a, b in ((gx, gx3), (gy, gy3), (grad, grad3)):
        assert np.array_equal(a, b, equal_nan=True)
    assert np.isnan(losses[3]) and np.isfinite(grad[:3]).all()
    only, _, no_gx, no_gy, no_grad = rnnt_loss_from_logits(x, tg, il, tl, 0, bd, want_grad=False)
    assert np.array_equal(only, losses, equal_nan=True)
    assert no_gx is None and no_gy is None and no_grad is None
    with pytest.raises(ValueError, match=r"rnnt_loss_from_logits: 'boundary' must be an integer "
                                         r"\(4, 4\) array"):
        rnnt_loss_from_logits(x, tg, il, tl, 0, bd[:2])


@pytest.mark.parametrize("x64", [False, True])
def test_jax_one_pass_normaliser_rows_on_both_sides_of_its_range(x64):
    """duoloss.jax's ``logsumexp`` sums unshifted exponentials where every row's
    normaliser allows it, else takes ``jax.nn.logsumexp`` for the rows that do
    not: against an mpmath-free float64 reference (numpy's shifted sum on the
    float64 values), and a row's bits never depend on the other rows."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from duoloss.jax._rnnt import _logsumexp

    dtype = np.float64 if x64 else np.float32
    lo, hi = (-500.0, 690.0) if x64 else (-16.0, 80.0)
    rng = np.random.default_rng(11)
    shifts = [lo - 3, lo + 1, -2.0, 0.0, 5.0, hi - 4, hi + 3, 1000.0]
    rows = np.stack([rng.standard_normal(28) + s for s in shifts]).astype(dtype)
    special = np.zeros((3, 28), dtype)
    special[0, 3] = np.nan
    special[1, 5] = np.inf
    special[2, :] = -np.inf
    with jax.enable_x64(x64):
        fn = jax.jit(_logsumexp)
        got = np.asarray(fn(jnp.asarray(rows)))
        m = rows.astype(np.float64).max(-1, keepdims=True)
        ref = m[:, 0] + np.log(np.exp(rows.astype(np.float64) - m).sum(-1))
        eps = np.finfo(dtype).eps
        np.testing.assert_allclose(got, ref, rtol=8 * eps, atol=0)
        alone = np.stack([np.asarray(fn(jnp.asarray(r[None])))[0] for r in rows])
        assert np.array_equal(got, alone)  # in range or not, a row is its own business
        mixed = np.asarray(fn(jnp.asarray(np.concatenate([rows[2:4], special]))))
        assert np.array_equal(mixed[:2], got[2:4])
        assert np.isnan(mixed[2]) and mixed[3] == np.inf and mixed[4] == -np.inf
        batched = np.asarray(jax.vmap(fn)(jnp.asarray(rows[:, None])))[:, 0]
        assert np.array_equal(batched, got)
