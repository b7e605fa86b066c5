"""The eight defects of issue 27's adversarial run, each against an independent reference.

1. JAX device CTC with every target empty: minus the summed blank log-probabilities
   (analytic), gradient -1 on the blank of every frame read.
2. ``token_spans`` on zero frames (``ctc_align``'s output for ``T = 0``): no span.
3. ``rnnt_loss_from_joiner`` with a joiner whose ``V`` changes between chunks: a
   ``ValueError`` naming the function, expected and actual shapes.
4. TDT device paths with NaN / ``+inf`` / all ``-inf`` logits in a cell no path reaches:
   the loss and gradient of the same input with that cell's logits finite (the cell is
   never read), equal to the host path (the oracle of the device paths).
5. RNN-T, TDT and multi-blank with a reachable cell of ``-inf`` logits only: every move
   from it has probability 0 -- against brute-force path enumeration in float64 torch
   (autograd for the gradient); ``+inf`` and a zero gradient when every path crosses it;
   on every path (torch host/device, JAX host/device).
6. JAX device CTC with raw scores of 1e100 (float64): each frame's gradient sums to -1
   (the frame's posteriors), as the host path.
7. ``rnnt_loss_from_joiner(chunk_size=np.int64(2))``: accepted, equal to ``rnnt_loss`` on
   the whole joiner output.
8. ``impl`` errors: the same message in both frontends.

The torch device paths run the Triton kernels in the interpreter (``TRITON_INTERPRET=1``,
as tests/test_device_tdt_torch.py); they are skipped when triton is missing or the
kernels were imported earlier without the interpreter.
"""
from __future__ import annotations

import importlib
import importlib.util
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt

NEG = -math.inf


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


@pytest.fixture
def triton_interpreted():
    """``TRITON_INTERPRET=1`` for the torch device path (skip without triton, or when
    the kernels were already imported for a GPU)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    from test_device_torch import interpreted
    gens = [interpreted("_kernels"), interpreted("_dur_kernels")]
    for g in gens:
        next(g)
    yield
    for g in reversed(gens):  # last set, first restored: the variable ends as it was
        next(g, None)


def _jax_losses_and_grad(f, x):
    """``(f(x), grad of f(x).sum())`` in one forward (``jax.vjp``)."""
    losses, vjp = jax.vjp(f, x)
    return losses, vjp(jnp.ones_like(losses))[0]


# --------------------------------------------------------------------------- #
# 1. JAX device CTC, every target empty                                        #
# --------------------------------------------------------------------------- #
def _empty_target_reference(lp, il, blank):
    """Analytic: the only path is all blanks: loss ``-sum_{t < L} lp[t, blank]``,
    gradient w.r.t. ``log_probs`` -1 at ``[t, b, blank]`` for ``t < L_b``."""
    t_max, n, _ = lp.shape
    loss = np.array([-lp[:il[b], b, blank].sum() for b in range(n)])
    grad = np.zeros_like(lp)
    for b in range(n):
        grad[:il[b], b, blank] = -1.0
    return loss, grad


@pytest.mark.parametrize("layout", ["padded", "concatenated", "unbatched"])
def test_1_jax_device_ctc_with_every_target_empty(x64, layout):
    rng = np.random.default_rng(1)
    t_max, n, c, blank = 6, 3, 4, 2
    lp = np.log(rng.dirichlet(np.ones(c), size=(t_max, n)))
    il = np.array([6, 4, 0])
    if layout == "unbatched":
        lp, il = lp[:, :1], il[:1]
    ref_loss, ref_grad = _empty_target_reference(lp, il, blank)
    if layout == "padded":
        args = (np.zeros((lp.shape[1], 0), np.int32), il, np.zeros(lp.shape[1], np.int32))
    elif layout == "concatenated":
        args = (np.zeros(0, np.int32), il, np.zeros(lp.shape[1], np.int32))
    else:
        args = (np.zeros(0, np.int32), il[0], np.int32(0))
    x = jnp.asarray(lp[:, 0] if layout == "unbatched" else lp)
    for impl in ("device", "host"):
        loss, grad = _jax_losses_and_grad(
            lambda z: dj.ctc_loss(z, *args, blank=blank, reduction="none", impl=impl), x)
        np.testing.assert_allclose(np.asarray(loss).reshape(-1), ref_loss, rtol=1e-13)
        np.testing.assert_allclose(np.asarray(grad).reshape(ref_grad.shape), ref_grad,
                                   atol=1e-13)


def test_1_jax_device_optax_ctc_with_every_label_padded(x64):
    """``optax_ctc_loss`` (log_softmax inside) with all labels padded: minus the summed
    blank log-softmax over the unpadded frames; also with zero label columns."""
    rng = np.random.default_rng(2)
    b, t_max, k = 2, 5, 4
    logits = rng.normal(size=(b, t_max, k))
    lpad = np.zeros((b, t_max))
    lpad[1, 3:] = 1.0
    logz = np.log(np.exp(logits).sum(-1))
    ref = np.array([-(logits[i, :, 0] - logz[i])[lpad[i] == 0].sum() for i in range(b)])
    for labels in (np.ones((b, 3), np.int32), np.zeros((b, 0), np.int32)):
        pads = np.ones(labels.shape)
        for impl in ("device", "host"):
            got = dj.optax_ctc_loss(jnp.asarray(logits), lpad, labels, pads, impl=impl)
            np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-13)


# --------------------------------------------------------------------------- #
# 2. token_spans on zero frames                                                #
# --------------------------------------------------------------------------- #
def test_2_token_spans_of_zero_frames_both_frontends():
    """``ctc_align`` -> ``token_spans`` for ``T = 0``: no span (no frame to hold one);
    ``num_spans`` slots stay unused (-1, score 0)."""
    lp = torch.zeros((0, 2, 4))
    tg = torch.zeros((2, 0), dtype=torch.long)
    labels_t = dt.ctc_align(lp, tg, torch.tensor([0, 0]), torch.tensor([0, 0]))[0]
    labels_j = dj.ctc_align(lp.numpy(), tg.numpy(), np.array([0, 0]), np.array([0, 0]))[0]
    assert tuple(labels_t.shape) == (2, 0) and tuple(labels_j.shape) == (2, 0)
    for out in (dt.token_spans(labels_t, lp), dj.token_spans(labels_j, lp.numpy())):
        assert [tuple(o.shape) for o in out] == [(2, 0)] * 4
    for out in (dt.token_spans(labels_t, lp, num_spans=2),
                dj.token_spans(labels_j, lp.numpy(), num_spans=2),
                jax.jit(lambda a, b: dj.token_spans(a, b, num_spans=2))(labels_j, lp.numpy())):
        tokens, starts, ends, scores = (np.asarray(o) for o in out)
        assert (tokens == -1).all() and (starts == -1).all() and (ends == -1).all()
        assert tokens.shape == (2, 2) and (scores == 0).all()
    # unbatched (T, C) with (T,) labels
    for out in (dt.token_spans(torch.zeros(0, dtype=torch.long), torch.zeros((0, 4))),
                dj.token_spans(np.zeros(0, np.int32), np.zeros((0, 4), np.float32))):
        assert [tuple(o.shape) for o in out] == [(0,)] * 4


# --------------------------------------------------------------------------- #
# 3. and 7. rnnt_loss_from_joiner: every chunk's V; numpy chunk_size             #
# --------------------------------------------------------------------------- #
_N, _T, _U, _D = 2, 5, 2, 4
_TG, _IL, _TL = np.array([[1, 2], [3, 1]]), np.array([5, 4]), np.array([2, 1])


def _joiner_inputs():
    rng = np.random.default_rng(3)
    return rng.normal(size=(_N, _T, _D)), rng.normal(size=(_N, _U + 1, _D))


def _shrinking(bad_on):
    """A joiner with V = D - 1 on chunks of ``bad_on`` frames, V = D otherwise."""
    def joiner(e, p):
        x = e + p
        return x[..., :_D - 1] if e.shape[1] == bad_on else x
    return joiner


@pytest.mark.parametrize("chunk_size", [2, 3], ids=["every-chunk-differs", "tail-differs"])
def test_3_joiner_changing_v_between_chunks_is_rejected(chunk_size):
    """The probe (one frame) sees V = 4; the chunks of two frames (T = 5: all full
    chunks of 2, or the tail after a chunk of 3) give V = 3: rejected in both
    frontends, eager and under jit."""
    enc, pred = _joiner_inputs()
    fn = "rnnt_loss_from_joiner"
    pattern = (rf"{fn}: the joiner must give every chunk of frames the same number of classes "
               rf"V = 4 \(from its first call\): expected an output of shape "
               rf"\(2, 2, 3, 4\), got \(2, 2, 3, 3\)")
    with pytest.raises(ValueError, match=pattern):
        dt.rnnt_loss_from_joiner(_shrinking(2), torch.tensor(enc), torch.tensor(pred),
                                 torch.tensor(_TG), torch.tensor(_IL), torch.tensor(_TL),
                                 blank=0, chunk_size=chunk_size)
    with pytest.raises(ValueError, match=pattern):
        dj.rnnt_loss_from_joiner(_shrinking(2), enc, pred, _TG, _IL, _TL, blank=0,
                                 chunk_size=chunk_size)
    with pytest.raises(ValueError, match=pattern):
        jax.jit(lambda e, p: dj.rnnt_loss_from_joiner(_shrinking(2), e, p, _TG, _IL, _TL,
                                                      blank=0, chunk_size=chunk_size))(enc, pred)


def test_7_joiner_numpy_chunk_size(x64):
    """numpy integers accepted (as for ``blank``); the loss and gradients equal
    ``rnnt_loss`` on the whole joiner output."""
    enc, pred = _joiner_inputs()
    chunk_size = np.int64(2)

    def joiner(e, p):
        return e * p
    e = torch.tensor(enc, requires_grad=True)
    loss = dt.rnnt_loss_from_joiner(joiner, e, torch.tensor(pred), torch.tensor(_TG),
                                    torch.tensor(_IL), torch.tensor(_TL), blank=0,
                                    chunk_size=chunk_size)
    (g,) = torch.autograd.grad(loss, e)
    e2 = torch.tensor(enc, requires_grad=True)
    ref = dt.rnnt_loss(joiner(e2[:, :, None], torch.tensor(pred)[:, None]), torch.tensor(_TG),
                       torch.tensor(_IL), torch.tensor(_TL), blank=0)
    (g_ref,) = torch.autograd.grad(ref, e2)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-14)
    lj, gj = jax.value_and_grad(lambda z: dj.rnnt_loss_from_joiner(
        joiner, z, pred, _TG, _IL, _TL, blank=0, chunk_size=chunk_size))(jnp.asarray(enc))
    assert abs(float(lj) - ref.item()) <= 1e-12 * abs(ref.item())
    np.testing.assert_allclose(np.asarray(gj), g_ref.numpy(), rtol=1e-10, atol=1e-13)
    for other in (np.int32(3), np.uint8(1)):
        loss = dt.rnnt_loss_from_joiner(joiner, torch.tensor(enc), torch.tensor(pred),
                                        torch.tensor(_TG), torch.tensor(_IL),
                                        torch.tensor(_TL), blank=0, chunk_size=other)
        torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=0)
    for bad in (np.int64(0), np.bool_(True), 2.0):
        with pytest.raises(ValueError, match="rnnt_loss_from_joiner: argument 'chunk_size' "
                                             "must be None or an int >= 1"):
            dt.rnnt_loss_from_joiner(joiner, e, torch.tensor(pred), torch.tensor(_TG),
                                     torch.tensor(_IL), torch.tensor(_TL), chunk_size=bad)
        with pytest.raises(ValueError, match="rnnt_loss_from_joiner: argument 'chunk_size' "
                                             "must be None or an int >= 1"):
            dj.rnnt_loss_from_joiner(joiner, enc, pred, _TG, _IL, _TL, chunk_size=bad)


# --------------------------------------------------------------------------- #
# Transducer references (4 and 5): brute force over the moves of a table        #
# --------------------------------------------------------------------------- #
def _move_tables(kind, blank, durations):
    """``(label moves [(d, duration index or -1)], blank moves [(symbol, d, index or -1)],
    number of token logits)`` of each loss, as the docstring of duoloss.core.losses.tdt
    states them (written here, not imported)."""
    if kind == "rnnt":
        return [(0, -1)], [(blank, 1, -1)]
    if kind == "tdt":
        return ([(d, i) for i, d in enumerate(durations)],
                [(blank, d, i) for i, d in enumerate(durations) if d > 0])
    return [(0, -1)], [(blank, 1, -1)] + [(blank - 1 - i, d, -1) for i, d in enumerate(durations)]


def _brute_force_nll(x, y, tb, ub, labs, blks, n_lab, dead=()):
    """``-log sum_paths exp(sum of move weights)`` of one sequence (float64 torch,
    differentiable w.r.t. ``x`` ``(T, U + 1, C)``): a move's weight is the token's
    log-softmax over the first ``n_lab`` logits plus the duration's log-softmax over
    the others; the cells in ``dead`` (rows of -inf only) weigh every move -inf."""
    tok = {}
    dur = {}

    def weights(t, u):
        if (t, u) not in tok:
            if (t, u) in dead:
                tok[t, u] = torch.full((n_lab,), NEG, dtype=x.dtype)
                dur[t, u] = torch.full((max(x.shape[-1] - n_lab, 1),), NEG, dtype=x.dtype)
            else:
                tok[t, u] = torch.log_softmax(x[t, u, :n_lab], -1)
                dur[t, u] = (torch.log_softmax(x[t, u, n_lab:], -1) if x.shape[-1] > n_lab
                             else torch.zeros(1, dtype=x.dtype))
        return tok[t, u], dur[t, u]

    scores = []

    def walk(t, u, acc):
        lt, ld = weights(t, u)
        if u < ub:
            for d, i in labs:
                if t + d < tb:
                    walk(t + d, u + 1, acc + lt[y[u]] + (ld[i] if i >= 0 else 0.0))
        for k, d, i in blks:
            w = acc + lt[k] + (ld[i] if i >= 0 else 0.0)
            if t + d < tb:
                walk(t + d, u, w)
            elif t + d == tb and u == ub:
                scores.append(w)

    walk(0, 0, torch.zeros((), dtype=x.dtype))
    return -torch.logsumexp(torch.stack(scores), 0)


def _loss_fns(kind, blank, durations):
    """``(torch loss fn, jax loss fn)`` with the loss's keyword arguments bound."""
    if kind == "rnnt":
        kw = dict(blank=blank)
        return (lambda x, *a, **k: dt.rnnt_loss(x, *a, **kw, **k),
                lambda x, *a, **k: dj.rnnt_loss(x, *a, **kw, **k))
    if kind == "tdt":
        kw = dict(blank=blank, durations=list(durations))
        return (lambda x, *a, **k: dt.tdt_loss(x, *a, **kw, **k),
                lambda x, *a, **k: dj.tdt_loss(x, *a, **kw, **k))
    kw = dict(blank=blank, big_blank_durations=list(durations))
    return (lambda x, *a, **k: dt.multiblank_rnnt_loss(x, *a, **kw, **k),
            lambda x, *a, **k: dj.multiblank_rnnt_loss(x, *a, **kw, **k))


def _all_paths(kind, blank, durations, x, tg, il, tl, impls=("host", "device")):
    """``{path name: (losses (N,), grad of the summed loss)}`` as float64 numpy, for
    torch and JAX, each ``impl``."""
    ft, fj = _loss_fns(kind, blank, durations)
    out = {}
    for impl in impls:
        xt = torch.tensor(x, requires_grad=True)
        loss = ft(xt, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), reduction="none",
                  impl=impl)
        loss.sum().backward()
        out[f"torch-{impl}"] = (loss.detach().numpy(), xt.grad.numpy())
        lj, gj = _jax_losses_and_grad(lambda z: fj(z, tg, il, tl, reduction="none", impl=impl),
                                      jnp.asarray(x))
        out[f"jax-{impl}"] = (np.asarray(lj), np.asarray(gj))
    return out


# --------------------------------------------------------------------------- #
# 4. TDT: NaN / +inf / -inf rows in cells no path reaches                       #
# --------------------------------------------------------------------------- #
# (durations, T, cells no TDT path of (T, U = 1) reaches with label 1)
_UNREACHABLE = [
    ([2], 6, [(1, 0), (3, 1), (5, 0)]),        # only even frames
    ([2, 3], 6, [(1, 0), (1, 1)]),             # frame 1 is never landed on
    ([0, 2], 6, [(1, 0), (3, 1), (5, 1)]),     # labels in-frame, every move even
    ([1, 2], 6, [(0, 1)]),                     # a label takes a frame
]


@pytest.mark.parametrize("durations, t_max, cells", _UNREACHABLE,
                         ids=[str(d) for d, _, _ in _UNREACHABLE])
def test_4_tdt_unreachable_cells_are_never_read(x64, triton_interpreted, durations, t_max,
                                                cells):
    """Sequence ``b`` gets NaN, ``+inf`` or only ``-inf`` in every unreachable cell:
    loss and gradient equal the brute-force reference of the clean input (the same
    logits with those cells finite), with a zero gradient on those cells, on every
    path."""
    v, blank = 3, 0
    rng = np.random.default_rng(4)
    clean = rng.normal(size=(3, t_max, 2, v + len(durations)))
    x = clean.copy()
    for b, value in enumerate((math.nan, math.inf, NEG)):
        for t, u in cells:
            x[b, t, u] = value
    tg, il, tl = np.ones((3, 1), np.int64), np.full(3, t_max), np.ones(3, np.int64)
    labs, blks = _move_tables("tdt", blank, durations)
    for b in range(3):
        xb = torch.tensor(clean[b], requires_grad=True)
        ref = _brute_force_nll(xb, [1], t_max, 1, labs, blks, v)
        ref.backward()
        ref_grad = xb.grad.numpy()
        assert all((ref_grad[t, u] == 0).all() for t, u in cells)  # truly never read
        for name, (loss, grad) in _all_paths("tdt", blank, durations, x, tg, il, tl).items():
            assert abs(loss[b] - ref.item()) <= 1e-12 * abs(ref.item()), (name, b)
            np.testing.assert_allclose(grad[b], ref_grad, atol=1e-12, err_msg=f"{name} {b}")


# --------------------------------------------------------------------------- #
# 5. A reachable cell of -inf logits only                                       #
# --------------------------------------------------------------------------- #
_DEAD_CASES = [("rnnt", 0, ()), ("tdt", 0, (0, 1, 2)), ("multiblank", 4, (2,))]


@pytest.mark.parametrize("kind, blank, durations", _DEAD_CASES,
                         ids=[k for k, _, _ in _DEAD_CASES])
def test_5_reachable_cell_of_minus_inf_logits(x64, triton_interpreted, kind, blank,
                                              durations):
    """Sequence 0: the cell (1, 1) is reachable but some paths avoid it -- finite loss
    and gradient equal to brute force with that cell's moves at probability 0 (its own
    gradient row 0); sequence 1: the start cell (0, 0) -- every path crosses it: ``+inf``
    and a zero gradient.  No NaN, on every path."""
    t_max, u_max = 4, 2
    n_cls = 5 + (len(durations) if kind == "tdt" else 0)
    n_lab = 5
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, t_max, u_max + 1, n_cls))
    x[0, 1, 1] = NEG
    x[1, 0, 0] = NEG
    tg = np.array([[1, 2], [2, 3]]) if blank == 0 else np.array([[0, 1], [1, 0]])
    il, tl = np.array([t_max, t_max]), np.array([2, 2])
    labs, blks = _move_tables(kind, blank, durations)
    x0 = torch.tensor(x[0], requires_grad=True)
    ref = _brute_force_nll(x0, list(tg[0]), t_max, 2, labs, blks, n_lab, dead={(1, 1)})
    ref.backward()
    ref_grad = x0.grad.numpy()
    assert math.isfinite(ref.item()) and (ref_grad[1, 1] == 0).all()
    for name, (loss, grad) in _all_paths(kind, blank, durations, x, tg, il, tl).items():
        assert not np.isnan(loss).any() and not np.isnan(grad).any(), name
        assert abs(loss[0] - ref.item()) <= 1e-12 * abs(ref.item()), (name, loss[0], ref)
        np.testing.assert_allclose(grad[0], ref_grad, atol=1e-12, err_msg=name)
        assert loss[1] == math.inf and (grad[1] == 0).all(), name


def test_5_docs_state_the_all_minus_inf_row():
    """docs/transducers.md says what an all -inf row means (not "like -1e4")."""
    from pathlib import Path
    text = Path(__file__).resolve().parents[1].joinpath("docs", "transducers.md").read_text()
    assert "all `-inf`" in text and "probability 0 for every move" in text


# --------------------------------------------------------------------------- #
# 6. JAX device CTC with raw scores of 1e100                                    #
# --------------------------------------------------------------------------- #
def test_6_jax_device_ctc_raw_scores_of_1e100(x64):
    """Raw scores (not log-probabilities) of 1e100: each frame's gradient is minus its
    posteriors, in [-1, 0], summing to -1 (docs/numerics.md), on two sequences (one on
    the blank, one at random), as the host path; class 3 (on no path of sequence 0)
    gets 0."""
    t_max, c = 6, 4
    rng = np.random.default_rng(6)
    x = np.zeros((t_max, 2, c))
    x[:, 0, 0] = 1e100
    x[:, 1] = rng.normal(size=(t_max, c)) * 1e100
    tg, il, tl = np.array([[1, 2], [3, 3]]), np.array([t_max, 5]), np.array([2, 2])
    for impl in ("device", "host"):
        losses, g = _jax_losses_and_grad(
            lambda z: dj.ctc_loss(z, tg, il, tl, reduction="none", impl=impl), jnp.asarray(x))
        g = np.asarray(g)
        assert np.isfinite(g).all() and (g <= 0).all() and (g >= -1).all(), impl
        np.testing.assert_allclose(g[:t_max, 0].sum(-1), -1.0, rtol=1e-12, err_msg=impl)
        np.testing.assert_allclose(g[:5, 1].sum(-1), -1.0, rtol=1e-12, err_msg=impl)
        assert (g[5:, 1] == 0).all() and (g[:, 0, 3] == 0).all(), impl
        # the blank's 1e100 on the t_max - 2 frames of the best paths (labels at 0)
        assert float(losses[0]) == pytest.approx(-(t_max - 2) * 1e100, rel=1e-15), impl


# --------------------------------------------------------------------------- #
# 8. One impl message                                                          #
# --------------------------------------------------------------------------- #
def _impl_calls(impl):
    """``{name: (torch call, jax call)}`` for every function with an ``impl`` argument."""
    lp = np.log(np.full((3, 1, 3), 1 / 3))
    tg, il, tl = np.array([[1]]), np.array([3]), np.array([1])
    x = np.zeros((1, 3, 2, 3))
    xd = np.zeros((1, 3, 2, 5))
    t = torch.tensor
    return {
        "ctc_loss": (lambda: dt.ctc_loss(t(lp), t(tg), t(il), t(tl), impl=impl),
                     lambda: dj.ctc_loss(lp, tg, il, tl, impl=impl)),
        "ctc_align": (lambda: dt.ctc_align(t(lp), t(tg), t(il), t(tl), impl=impl),
                      lambda: dj.ctc_align(lp, tg, il, tl, impl=impl)),
        "rnnt_loss": (lambda: dt.rnnt_loss(t(x), t(tg), t(il), t(tl), blank=0, impl=impl),
                      lambda: dj.rnnt_loss(x, tg, il, tl, blank=0, impl=impl)),
        "rnnt_align": (lambda: dt.rnnt_align(t(x), t(tg), t(il), t(tl), blank=0, impl=impl),
                       lambda: dj.rnnt_align(x, tg, il, tl, blank=0, impl=impl)),
        "tdt_loss": (lambda: dt.tdt_loss(t(xd), t(tg), t(il), t(tl), blank=0,
                                         durations=[0, 1], impl=impl),
                     lambda: dj.tdt_loss(xd, tg, il, tl, blank=0, durations=[0, 1], impl=impl)),
        "multiblank_rnnt_loss": (
            lambda: dt.multiblank_rnnt_loss(t(x), t(tg), t(il), t(tl), blank=2,
                                            big_blank_durations=[2], impl=impl),
            lambda: dj.multiblank_rnnt_loss(x, tg, il, tl, blank=2, big_blank_durations=[2],
                                            impl=impl)),
    }


@pytest.mark.parametrize("impl", ["gpu", None, 1])
def test_8_impl_message_is_the_same_in_both_frontends(impl):
    # one message shape; each frontend lists its own words (JAX adds 'xla' and 'pallas')
    for name, (call_t, call_j) in _impl_calls(impl).items():
        msgs = []
        for call in (call_t, call_j):
            with pytest.raises(ValueError) as err:
                call()
            msgs.append(str(err.value))
        want = f"{name}: argument 'impl' must be one of 'auto', 'host', 'device'%s, got {impl!r}"
        assert msgs == [want % "", want % ", 'xla', 'pallas'"], name


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_8_torch_refuses_the_jax_only_impl_words(impl):
    for name, (call_t, _) in _impl_calls(impl).items():
        with pytest.raises(ValueError) as err:
            call_t()
        assert str(err.value) == (f"{name}: impl={impl!r} is a JAX-only choice; torch takes "
                                  f"'auto', 'host' or 'device'"), name
