r"""Duration transducers in XLA: TDT, multi-blank RNN-T (and the RNN-T of TDT's
``omega``), with a ``custom_vjp`` from the forward and backward variables.

Same contract and numbers as `duoloss.core.losses.tdt` (read its docstring
for the lattice, the FastEmit/clamp scope and the NaN/inf policy): the loss is
one recursion over the ``(T, U + 1)`` lattice whose moves are given by small
static tables -- label moves ``(d, i)`` (duration ``d``, duration-logit index
``i`` or ``-1``) and blank moves ``(k, d, i)`` (symbol ``k``) -- so TDT,
multi-blank and the standard RNN-T share this code.

Forward: the move weights ``w`` (``log_softmax`` of the token logits minus
``sigma`` at the move's symbol, plus the duration's ``log_softmax``) are laid
out frame-major ``(T, N, U + 1)``, ``-inf`` for every move that leaves the
sequence's box (so nothing outside it is read).  One ``lax.scan`` over frames
keeps a window of the last ``max(d)`` rows of $\alpha$:

.. math::

    a_t(u) = \log\Big(\sum_{d > 0} e^{\alpha_{t-d}(u-1) + w^{lab}_{d}}
             + \sum_{j} e^{\alpha_{t-d_j}(u) + w^{blk}_{j}}\Big), \qquad
    \alpha_t(u) = \log\big(e^{a_t(u)} + e^{\alpha_t(u-1) + w^{lab}_{0}(t, u-1)}\big),

the within-frame chain of duration-0 label moves as an associative scan over
``u`` (elements ``(w, a)`` composing as ``(w_1 + w_2, lse(a_2, a_1 + w_2))``).
The backward rule runs the mirror scan for $\beta$ and forms every move's
posterior ``exp(alpha + w + beta_dest - log Z)`` in one vectorised pass, then
each cell's gradient row exactly as the core (JAX never differentiates through a
scan).  Memory ``O(N T (U + 1) (V + D))`` (the gradient itself).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._adapter import _gradient
from .._sharding import mark_varying, varying_axes
from ._logsem import NEG_INF, lse2, shift_left, shift_right

__all__ = ["multiblank_losses", "tdt_losses"]

_NAME = "tdt_loss (impl='device')"


def tdt_losses(logits, targets, logit_lengths, target_lengths, *, blank, durations, sigma,
               fastemit_lambda, clamp, omega, path="xla"):
    """Per-sequence TDT losses ``(N,)`` (``(1 - omega) * tdt + omega * rnnt``, times
    ``1 + fastemit_lambda``), differentiable w.r.t. ``logits`` ``(N, T, U + 1, V + D)``.
    ``blank`` in ``[0, V)``; arguments already validated.  ``path``: ``'xla'`` (the
    recursions as ``lax.scan``) or a Pallas answer of `duoloss.jax._pallas.backend_for`
    (the recursions as a Pallas kernel, `duoloss.jax._pallas.tdt`; the rest as here)."""
    durations = tuple(int(d) for d in durations)
    n_dur = len(durations)
    n_lab = logits.shape[-1] - n_dur
    omega = float(omega)
    args = (logits, targets, logit_lengths, target_lengths)
    tdt_tab = (tuple((d, i) for i, d in enumerate(durations)),
               tuple((blank, d, i) for i, d in enumerate(durations) if d > 0))
    rnnt_tab = (((0, -1),), ((blank, 1, -1),))
    common = (n_lab, n_dur, float(fastemit_lambda), float(clamp))
    if omega <= 0.0:
        return _losses(*args, (tdt_tab, float(sigma), True) + common, path)
    if omega >= 1.0:
        return _losses(*args, (rnnt_tab, 0.0, False) + common, path)
    return _mixed(*args, (tdt_tab, float(sigma), True) + common,
                  (rnnt_tab, 0.0, False) + common, omega, path)


def multiblank_losses(logits, targets, logit_lengths, target_lengths, *, blank,
                      big_blank_durations, sigma, fastemit_lambda, clamp, path="xla"):
    """Per-sequence multi-blank RNN-T losses ``(N,)``, differentiable w.r.t. ``logits``
    ``(N, T, U + 1, V)``; big blank ``i`` at ``blank - 1 - i``; ``path`` as in
    `tdt_losses`."""
    big = tuple(int(d) for d in big_blank_durations)
    tab = (((0, -1),), ((blank, 1, -1),) + tuple((blank - 1 - i, d, -1)
                                                   for i, d in enumerate(big)))
    return _losses(logits, targets, logit_lengths, target_lengths,
                   (tab, float(sigma), False, logits.shape[-1], 0, float(fastemit_lambda),
                    float(clamp)), path)


# ----------------------------------------------------------------- helpers
def _lse_raw(x, axis):
    """``log sum exp`` as the core's normaliser: NaN for a row holding NaN or
    ``+inf`` (as ``log_softmax``), ``-inf`` for a row of ``-inf`` only (no
    probability to share: see `_log_prob`)."""
    m = jnp.max(x, axis=axis, keepdims=True)
    s = m + jnp.log(jnp.sum(jnp.exp(x - m), axis=axis, keepdims=True))
    return jnp.where(m == NEG_INF, NEG_INF, s)


def _log_prob(x, s):
    """``x - s``, ``-inf`` where ``s = -inf`` (a row of ``-inf`` only: every
    move it weighs has probability 0, not NaN), as the core."""
    return jnp.where(s == NEG_INF, NEG_INF, x - s)


def _from(a, w):
    """``a + w`` pushed from a lattice value ``a``: ``-inf`` where ``a = -inf``
    whatever ``w`` (NaN, ``+inf``): the core never pushes from a cell no path
    reaches, so a NaN or ``inf`` row there is never read."""
    return jnp.where(a == NEG_INF, NEG_INF, a + w)


def _wsum(w1, w2):
    """``w1 + w2`` of move weights along a path, ``-inf`` when either is (a path
    through an impossible move carries nothing, even past a NaN weight)."""
    return jnp.where((w1 == NEG_INF) | (w2 == NEG_INF), NEG_INF, w1 + w2)


def _lse_safe(x, axis):
    """``log sum exp`` over ``axis``: ``-inf`` for only ``-inf`` entries, NaN in, NaN out."""
    m = jnp.max(x, axis=axis, keepdims=True)
    m0 = jnp.where(m == NEG_INF, 0.0, m)
    return jnp.squeeze(m0, axis) + jnp.log(jnp.sum(jnp.exp(x - m0), axis=axis))


def _shift_t(x, d, fill=NEG_INF):
    """``y[t] = x[t - d]`` along axis 0 (``d`` may be negative: ``x[t + |d|]``)."""
    t = x.shape[0]
    if abs(d) >= t:
        return jnp.full_like(x, fill)
    if d >= 0:
        return jnp.concatenate([jnp.full_like(x[:d], fill), x[:t - d]], axis=0)
    d = -d
    return jnp.concatenate([x[d:], jnp.full_like(x[:d], fill)], axis=0)


def _chain(w, a, push=False):
    """``x_u = lse(a_u, x_{u-1} + w_u)`` along the last axis (``x_{-1} = -inf``);
    ``push``: the forward's ``x_{u-1} + w_u`` taken as `_from` (nothing from
    ``x_{u-1} = -inf``), as the core's push."""
    def combine(e1, e2):
        w1, a1 = e1
        w2, a2 = e2
        if push:
            return _wsum(w1, w2), lse2(a2, _from(a1, w2))
        return w1 + w2, lse2(a2, a1 + w2)
    return jax.lax.associative_scan(combine, (w, a), axis=w.ndim - 1)[1]


def _prepare(x, tg, il, tl, spec):
    """Validity, box masks and the masked frame-major move weights."""
    (lab_moves, blk_moves), sigma, _, n_lab, n_dur, _, _ = spec
    n, t_max, u1, _ = x.shape
    u_cap = u1 - 1
    tb = il.astype(jnp.int32)
    ub = tl.astype(jnp.int32)
    blank_syms = sorted({k for k, _, _ in blk_moves})
    upos = jnp.arange(u_cap, dtype=jnp.int32)[None]
    in_tg = upos < ub[:, None]
    lab_ok = (tg >= 0) & (tg < n_lab)
    for k in blank_syms:
        lab_ok &= tg != k
    valid = ((tb >= 0) & (tb <= t_max) & (ub >= 0) & (ub <= u_cap)
             & jnp.all(lab_ok | ~in_tg, axis=1))
    tok = x[..., :n_lab]
    lse = _lse_raw(tok, -1)                                      # (N, T, U1, 1)
    y = jnp.clip(tg, 0, n_lab - 1).astype(jnp.int32)
    y = jnp.concatenate([y, jnp.zeros((n, 1), jnp.int32)], axis=1)       # (N, U1)
    lab = _log_prob(jnp.take_along_axis(tok, jnp.broadcast_to(y[:, None, :, None],
                                                              (n, t_max, u1, 1)),
                                        axis=-1)[..., 0], lse[..., 0]) - sigma
    if n_dur:
        dur = x[..., n_lab:]
        dlp = _log_prob(dur, _lse_raw(dur, -1))
    # frame-major (T, N, U1) geometry
    t = jnp.arange(t_max, dtype=jnp.int32)[:, None, None]
    u = jnp.arange(u1, dtype=jnp.int32)[None, None, :]
    tb3, ub3, valid3 = tb[None, :, None], ub[None, :, None], valid[None, :, None]
    inbox = valid3 & (t < tb3) & (u <= ub3)

    def fm(a):
        return jnp.transpose(a, (1, 0, 2))

    lab_w = []
    for d, i in lab_moves:
        w = lab + (dlp[..., i] if i >= 0 else 0.0)
        ok = inbox & (u < ub3) & (t + d < tb3)
        lab_w.append(jnp.where(ok, fm(w), NEG_INF))
    blk_w, term_w = [], []
    for k, d, i in blk_moves:
        w = fm(_log_prob(tok[..., k], lse[..., 0]) - sigma + (dlp[..., i] if i >= 0 else 0.0))
        blk_w.append(jnp.where(inbox & (t + d < tb3), w, NEG_INF))
        term_w.append(jnp.where(inbox & (u == ub3) & (t + d == tb3), w, NEG_INF))
    return valid, tb, ub, inbox, lse, y, lab_w, blk_w, term_w


def _alpha(lab_moves, blk_moves, lab_w, blk_w, n, u1, dtype):
    k = max([d for d, _ in lab_moves] + [d for _, d, _ in blk_moves])
    zero = [w for (d, _), w in zip(lab_moves, lab_w) if d == 0]
    w0 = shift_right(zero[0], 1) if zero else None
    lab_s = [(d, _shift_t(w, d)) for (d, _), w in zip(lab_moves, lab_w) if d > 0]
    blk_s = [(d, _shift_t(w, d)) for (_, d, _), w in zip(blk_moves, blk_w)]
    start = (jnp.arange(u1) == 0)[None]

    def step(win, xs):
        tt, w0_t, lab_t, blk_t = xs
        a = jnp.full((n, u1), NEG_INF, dtype)
        for (d, _), w in zip(lab_s, lab_t):
            a = lse2(a, shift_right(_from(win[d - 1], w), 1))
        for (d, _), w in zip(blk_s, blk_t):
            a = lse2(a, _from(win[d - 1], w))
        a = jnp.where(start & (tt == 0), 0.0, a)
        if w0_t is not None:
            a = _chain(w0_t, a, push=True)
        win = jnp.concatenate([a[None], win[:-1]], axis=0)
        return win, a

    t_max = lab_w[0].shape[0]
    xs = (jnp.arange(t_max), w0, [w for _, w in lab_s], [w for _, w in blk_s])
    win0 = mark_varying(jnp.full((k, n, u1), NEG_INF, dtype),   # a scan carry in shard_map
                        varying_axes(*lab_w, *blk_w))
    return jax.lax.scan(step, win0, xs)[1]                   # (T, N, U1)


def _beta(lab_moves, blk_moves, lab_w, blk_w, term, n, u1, dtype):
    k = max([d for d, _ in lab_moves] + [d for _, d, _ in blk_moves])
    zero = [w for (d, _), w in zip(lab_moves, lab_w) if d == 0]
    lab_p = [(d, w) for (d, _), w in zip(lab_moves, lab_w) if d > 0]
    blk_p = [(d, w) for (_, d, _), w in zip(blk_moves, blk_w)]

    def step(win, xs):
        w0_t, lab_t, blk_t, term_t = xs
        b = term_t
        for (d, _), w in zip(lab_p, lab_t):
            b = lse2(b, w + shift_left(win[d - 1], 1))
        for (d, _), w in zip(blk_p, blk_t):
            b = lse2(b, w + win[d - 1])
        if w0_t is not None:   # b_u = lse(b_u, w0_u + beta_{u+1}): the chain reversed in u
            b = jnp.flip(_chain(jnp.flip(w0_t, -1), jnp.flip(b, -1)), -1)
        win = jnp.concatenate([b[None], win[:-1]], axis=0)
        return win, b

    xs = (zero[0] if zero else None, [w for _, w in lab_p], [w for _, w in blk_p], term)
    win0 = mark_varying(jnp.full((k, n, u1), NEG_INF, dtype),
                        varying_axes(*lab_w, *blk_w, term))
    return jax.lax.scan(step, win0, xs, reverse=True)[1]     # (T, N, U1)


def _run(x, tg, il, tl, spec, want, path="xla"):
    """``(losses (N,), grad or None)`` in the work dtype; ``path``: who runs the
    alpha/beta recursions (see `tdt_losses`)."""
    (lab_moves, blk_moves), _, dur_grad, n_lab, n_dur, lam, clamp = spec
    n, t_max, u1, _ = x.shape
    if n == 0 or t_max == 0:
        labels_ok = (tg >= 0) & (tg < n_lab)
        for k, _, _ in blk_moves:
            labels_ok &= tg != k
        in_tg = jnp.arange(u1 - 1)[None] < tl[:, None]
        valid = ((il == 0) & (tl >= 0) & (tl <= u1 - 1)
                 & jnp.all(labels_ok | ~in_tg, axis=1))
        loss = jnp.where(valid, jnp.where(tl == 0, 0.0, jnp.inf), jnp.nan).astype(x.dtype)
        return loss, (jnp.zeros_like(x) if want else None)
    valid, tb, ub, inbox, lse, y, lab_w, blk_w, term_w = _prepare(x, tg, il, tl, spec)
    term = jnp.stack(term_w)                                 # (J, T, N, U1)
    term = _lse_safe(term, 0) if len(term_w) > 1 else term[0]
    if path == "xla":
        alpha = _alpha(lab_moves, blk_moves, lab_w, blk_w, n, u1, x.dtype)
    else:   # both recursions in one Pallas kernel (beta only with want)
        from .._pallas.tdt import tables
        sg = jax.lax.stop_gradient    # (a second derivative raises in _gradient's rule)
        alpha, beta = tables(lab_moves, blk_moves, [sg(w) for w in lab_w],
                             [sg(w) for w in blk_w], sg(term), want, path)
    logz = _lse_safe(jnp.reshape(jnp.transpose(_from(alpha, term), (1, 0, 2)), (n, -1)), 1)
    nll = jnp.where(tb == 0, jnp.where(ub == 0, 0.0, jnp.inf), -logz)
    loss = jnp.where(valid, nll * (1.0 + lam), jnp.nan)
    if not want:
        return loss, None
    if path == "xla":
        beta = _beta(lab_moves, blk_moves, lab_w, blk_w, term, n, u1, x.dtype)
    use = valid & (tb > 0) & jnp.isfinite(logz)
    z = jnp.where(use, logz, 0.0)[None, :, None]
    plab = jnp.zeros_like(alpha)
    pdur = [jnp.zeros_like(alpha) for _ in range(n_dur)]
    # moves from cells no path reaches carry nothing (the core skips them)
    for (d, i), w in zip(lab_moves, lab_w):
        p = jnp.exp(_from(alpha, w + shift_left(_shift_t(beta, -d), 1)) - z)
        plab = plab + p
        if i >= 0:
            pdur[i] = pdur[i] + p
    pblk = {}
    for (k, d, i), w, tw in zip(blk_moves, blk_w, term_w):
        p = jnp.exp(_from(alpha, w + _shift_t(beta, -d)) - z) + jnp.exp(_from(alpha, tw) - z)
        pblk[k] = pblk.get(k, 0.0) + p
        if i >= 0:
            pdur[i] = pdur[i] + p
    occ = plab + sum(pblk.values())

    def nm(a):                                              # (T, N, U1) -> (N, T, U1)
        return jnp.transpose(a, (1, 0, 2))

    occ_n, plab_n = nm(occ), nm(plab)
    tok = x[..., :n_lab]
    gt = jnp.exp(tok - lse) * (occ_n + lam * plab_n)[..., None]
    cls = jnp.arange(n_lab)
    gt = gt - (1.0 + lam) * (cls == y[:, None, :, None]) * plab_n[..., None]
    for k, p in pblk.items():
        gt = gt - (cls == k) * nm(p)[..., None]
    if clamp > 0:
        gt = jnp.clip(gt, -clamp, clamp)
    parts = [gt]
    if n_dur:
        dur = x[..., n_lab:]
        if dur_grad:
            sd = jnp.exp(dur - _lse_raw(dur, -1)) * occ_n[..., None]
            parts.append(sd - jnp.stack([nm(p) for p in pdur], axis=-1))
        else:
            parts.append(jnp.zeros_like(dur))
    g = jnp.concatenate(parts, axis=-1) if len(parts) > 1 else gt
    g = jnp.where((occ_n != 0)[..., None] & use[:, None, None, None], g, 0.0)
    # a NaN the lattice read: the whole box NaN; an invalid row: the whole sequence NaN
    box = nm(inbox)[..., None]
    g = jnp.where(box & (valid & jnp.isnan(logz))[:, None, None, None], jnp.nan, g)
    g = jnp.where(~valid[:, None, None, None], jnp.nan, g)
    return loss, g


def _work(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _losses(x, tg, il, tl, spec, path):
    return _run(_work(x), tg, il, tl, spec, False, path)[0].astype(x.dtype)


def _losses_fwd(x, tg, il, tl, spec, path):
    loss, g = _run(_work(x), tg, il, tl, spec, True, path)
    return loss.astype(x.dtype), (g.astype(x.dtype), x)


def _losses_bwd(spec, path, res, ct):
    g, x = res
    return _gradient(_NAME, 0, g, x, ct.astype(g.dtype)), None, None, None


_losses.defvjp(_losses_fwd, _losses_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _mixed(x, tg, il, tl, spec_a, spec_b, omega, path):
    xw = _work(x)
    la = _run(xw, tg, il, tl, spec_a, False, path)[0]
    lb = _run(xw, tg, il, tl, spec_b, False, path)[0]
    return ((1.0 - omega) * la + omega * lb).astype(x.dtype)


def _mixed_fwd(x, tg, il, tl, spec_a, spec_b, omega, path):
    xw = _work(x)
    la, ga = _run(xw, tg, il, tl, spec_a, True, path)
    lb, gb = _run(xw, tg, il, tl, spec_b, True, path)
    loss = (1.0 - omega) * la + omega * lb
    g = (1.0 - omega) * ga + omega * gb
    g = jnp.where(jnp.isinf(loss)[:, None, None, None], 0.0, g)
    return loss.astype(x.dtype), (g.astype(x.dtype), x)


def _mixed_bwd(spec_a, spec_b, omega, path, res, ct):
    g, x = res
    return _gradient(_NAME, 0, g, x, ct.astype(g.dtype)), None, None, None


_mixed.defvjp(_mixed_fwd, _mixed_bwd)
