r"""Auto Segmentation Criterion (ASG) and the all-alignments loss on numpy buffers.

Shapes: ``T`` frames, ``N`` sequences, ``C`` tokens (there is no blank), ``S``
padded target length; sequence ``b`` has ``T_b = input_lengths[b]`` frames and
``L_b = target_lengths[b]`` tokens ``y_1 .. y_L``.

A *frame labelling* :math:`\pi = (\pi_1, \dots, \pi_{T_b})` assigns one token to
each frame.  With emissions :math:`e_t(k)` (``emissions[t, b, k]``, unnormalised),
transitions :math:`A_{ij}` (``transitions[i, j]``: score of token ``i`` right
after token ``j``; row = to, column = from) and start scores :math:`s_k`
(``start_transitions[k]``) its score is

.. math::

    w(\pi) = s_{\pi_1} + e_1(\pi_1) + \sum_{t=2}^{T_b} \left(A_{\pi_t \pi_{t-1}}
        + e_t(\pi_t)\right).

The *force-aligned* labellings of a target are those that spell ``y_1 .. y_L``
when every token is stretched over one or more consecutive frames (repeated
tokens need no separator; two segmentations with the same frame labels, e.g.
``a|aa`` and ``aa|a`` for target ``aa``, are different paths).  The loss is

.. math::

    \text{loss}_b = \log \sum_{\pi} e^{w(\pi)}
        - \log \sum_{\pi \in \text{align}(y)} e^{w(\pi)},

i.e. GTN's ``forward_score(compose(E, Trans)) - forward_score(compose(compose(FAL,
Trans), E))``.  The first term (the normaliser) runs the recursion
:math:`\alpha_t(i) = e_t(i) + \operatorname{logsumexp}_j(\alpha_{t-1}(j) + A_{ij})`
over all ``C`` tokens; the second one runs it over the ``L`` target positions,
each of which either stays (:math:`A_{y_l y_l}`) or advances from the previous
position (:math:`A_{y_l y_{l-1}}`).

Gradients are expected counts: ``d loss / d emissions[t, b, k]`` is the posterior
of token ``k`` at frame ``t`` under the normaliser minus the same posterior under
the target paths; ``d loss / d transitions[i, j]`` is the expected number of
``j -> i`` transitions (normaliser minus target); ``d loss / d start[k]`` is the
probability that a path starts with ``k`` (normaliser minus target, where the
latter is 1 for ``k = y_1``).

Without ``transitions`` (and without start scores) the normaliser factorises
over frames, every labelling has weight :math:`\sum_t e_t(\pi_t)`, and the loss
is the *all-alignments* loss of GTN's PyTorch example
(``bindings/python/examples/pytorch_loss.py``); the emission gradient is then
``softmax(emissions) - posterior``.

Implementation: as in :mod:`duoloss.core._ctc`, emissions, transitions and
start scores are exponentiated once with numpy (each relative to its maximum);
the numba kernels run both forward-backward passes in *linear* space in float64
with per-frame rescaling, check on every frame that the posteriors sum to one,
and fall back to an exact log-space recursion for a sequence where that check
fails or a frame's mass underflows (e.g. a transition needed by the target that
is ~700 nats below the best one).

NB: Infeasible targets (``T_b < L_b``), empty targets with ``T_b > 0``, and
targets whose every alignment has weight ``-inf`` give loss ``+inf``; their
gradients are the normaliser's part only (GTN's convention), or the loss and
gradients are 0 with ``zero_infinity``.  ``T_b = L_b = 0`` gives loss 0.  A
sequence whose normaliser is ``-inf`` (a frame with every emission ``-inf``)
also counts as infeasible, with zero gradient.  NaN or ``+inf`` among the
scores a sequence uses, or invalid labels/lengths (possible only for traced JAX
values), make that sequence's loss and gradients NaN.

References:
  Collobert, Puhrsch, Synnaeve, "Wav2Letter: an End-to-End ConvNet-based Speech
  Recognition System", arXiv:1609.03193, 2016.
  Hannun, Pratap, Kahn, Hsu, "Differentiable Weighted Finite-State Transducers",
  arXiv:2010.01003, 2020 (GTN).
"""
from __future__ import annotations

import math

import numba
import numpy as np

from ._spec import LossKernel
from ._threading import parallel_guard

__all__ = [
    "ASG_KERNEL",
    "ASG_NO_TRANSITIONS_KERNEL",
    "asg_loss_and_grad",
    "check_asg_args",
]

_TINY = 1e-200
_CHECK_TOL = 1e-7
_PARALLEL_MIN_CELLS = 40_000
_NEG_INF = -np.inf

# Status codes of one forward-backward pass.
_OK = 0
_FALLBACK = 1
_NAN = 2


@numba.njit(cache=True, nogil=True, inline="always")
def _lae(a, b):
    """log(exp(a) + exp(b)) with -inf handled."""
    if a == _NEG_INF:
        return b
    if b == _NEG_INF:
        return a
    if a > b:
        return a + math.log1p(math.exp(b - a))
    return b + math.log1p(math.exp(a - b))


# --------------------------------------------------------------------------- #
# Normaliser: all C tokens at every frame                                      #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True)
def _norm_linear(b, tb, probs, fmax, mt, m, tau, sp, sigma, has_trans, want, ge, gt, gs):
    """Linear-space normaliser of sequence ``b``; returns ``(logZ, status)``.

    Adds posteriors to ``ge (tb, C)``, expected transition counts to ``gt (C, C)``
    and first-frame posteriors to ``gs (C,)`` when ``want``.
    """
    n_cls = probs.shape[2]
    alpha = np.empty((tb, n_cls))
    cs = np.empty(tb)
    log_a = np.empty(tb)
    acc = sigma
    tmp = np.empty(n_cls)
    for t in range(tb):
        c = 0.0
        if t == 0:
            for k in range(n_cls):
                v = sp[k] * probs[0, b, k]
                alpha[0, k] = v
                c += v
        elif has_trans:
            pt = probs[t, b]
            for i in range(n_cls):
                tmp[i] = 0.0
            for j in range(n_cls):
                a = alpha[t - 1, j]
                if a != 0.0:
                    for i in range(n_cls):
                        tmp[i] += a * mt[j, i]
            for i in range(n_cls):
                v = tmp[i] * pt[i]
                alpha[t, i] = v
                c += v
        else:
            for i in range(n_cls):
                v = probs[t, b, i]
                alpha[t, i] = v
                c += v
        if c != c or c == np.inf:
            return np.nan, _NAN
        if c < _TINY:
            return 0.0, _FALLBACK
        inv = 1.0 / c
        for k in range(n_cls):
            alpha[t, k] *= inv
        cs[t] = c
        acc += math.log(c) + fmax[t, b]
        if t > 0:
            acc += tau
        log_a[t] = acc
    logz = log_a[tb - 1]
    if not want:
        return logz, _OK

    beta = np.ones(n_cls)
    nb = np.empty(n_cls)
    w = np.empty(n_cls)
    # u[t, i] = P_t(i) beta_t(i) / (c_t r_t): the transition counts are then one
    # matrix product, sum_t u[t] alpha[t-1]^T, after the backward pass.
    u_rows = np.zeros((tb, n_cls)) if has_trans else np.zeros((0, 0))
    log_b = 0.0
    for t in range(tb - 1, -1, -1):
        r = 0.0
        for k in range(n_cls):
            r += alpha[t, k] * beta[k]
        expected = math.exp(logz - log_a[t] - log_b)
        if not abs(r - expected) <= _CHECK_TOL * expected:
            return logz, _FALLBACK
        inv = 1.0 / r
        for k in range(n_cls):
            ge[t, k] += alpha[t, k] * beta[k] * inv
        if t == 0:
            for k in range(n_cls):
                gs[k] += alpha[0, k] * beta[k] * inv
            break
        if not has_trans:
            # beta stays all ones (unnormalised): sum_i P_t(i) * 1 = c_t.
            log_b += math.log(cs[t]) + fmax[t, b]
            continue
        scale = inv / cs[t]
        pt = probs[t, b]
        for i in range(n_cls):
            w[i] = pt[i] * beta[i]
        for i in range(n_cls):
            u_rows[t, i] = w[i] * scale
        for j in range(n_cls):
            nb[j] = 0.0
        for i in range(n_cls):
            wi = w[i]
            if wi != 0.0:
                for j in range(n_cls):
                    nb[j] += wi * m[i, j]
        d = 0.0
        for j in range(n_cls):
            d += nb[j]
        if not d >= _TINY:
            return logz, _FALLBACK
        inv_d = 1.0 / d
        for j in range(n_cls):
            beta[j] = nb[j] * inv_d
        log_b += math.log(d) + fmax[t, b] + tau
    if has_trans and tb > 1:
        # cnt = u_rows[1:].T @ alpha[:-1], as loops: a BLAS call from inside the
        # kernel runs on scipy's OpenBLAS threads, which fight numba's for the
        # cores (measured 24 ms instead of 0.1 ms at T=500, C=50 on 2 cores).
        cnt = np.zeros(n_cls)
        for i in range(n_cls):
            for j in range(n_cls):
                cnt[j] = 0.0
            for t in range(1, tb):
                u = u_rows[t, i]
                if u != 0.0:
                    for j in range(n_cls):
                        cnt[j] += u * alpha[t - 1, j]
            for j in range(n_cls):
                gt[i, j] += cnt[j] * m[i, j]
    return logz, _OK


@numba.njit(cache=True, nogil=True)
def _norm_log(b, tb, em, trans, start, has_trans, want, ge, gt, gs):
    """Exact log-space normaliser (slow, scalar exp/log); returns logZ."""
    n_cls = em.shape[2]
    la = np.empty((tb, n_cls))
    for t in range(tb):
        for i in range(n_cls):
            e = np.float64(em[t, b, i])
            if t == 0:
                v = np.float64(start[i])
            else:
                v = _NEG_INF
                for j in range(n_cls):
                    tr = np.float64(trans[i, j]) if has_trans else 0.0
                    v = _lae(v, la[t - 1, j] + tr)
            la[t, i] = v + e
    logz = _NEG_INF
    for i in range(n_cls):
        logz = _lae(logz, la[tb - 1, i])
    if not want or logz == _NEG_INF or logz != logz:
        return logz
    lb = np.zeros(n_cls)
    nb = np.empty(n_cls)
    for t in range(tb - 1, -1, -1):
        for k in range(n_cls):
            if la[t, k] != _NEG_INF and lb[k] != _NEG_INF:
                p = math.exp(la[t, k] + lb[k] - logz)
                ge[t, k] += p
                if t == 0:
                    gs[k] += p
        if t == 0:
            break
        # w[i] = e_t(i) + lb_t(i): suffix weight entering token i at frame t
        for i in range(n_cls):
            nb[i] = np.float64(em[t, b, i]) + lb[i]
        for j in range(n_cls):
            v = _NEG_INF
            for i in range(n_cls):
                tr = np.float64(trans[i, j]) if has_trans else 0.0
                x = nb[i] + tr
                v = _lae(v, x)
                if has_trans and want:
                    y = la[t - 1, j] + x - logz
                    if y > -745.0:
                        gt[i, j] += math.exp(y)
            lb[j] = v
    return logz


# --------------------------------------------------------------------------- #
# Target paths: L positions, stay or advance                                   #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True)
def _num_linear(b, tb, lab, probs, fmax, m, tau, sp, sigma, has_trans, want, ge, gt, gs):
    """Linear-space forward-backward over the target's positions."""
    n_lab = lab.shape[0]
    ws = np.empty(n_lab)
    wa = np.empty(n_lab)
    for l in range(n_lab):
        if has_trans:
            ws[l] = m[lab[l], lab[l]]
            wa[l] = m[lab[l], lab[l - 1]] if l > 0 else 0.0
        else:
            ws[l] = 1.0
            wa[l] = 1.0 if l > 0 else 0.0
    alpha = np.zeros((tb, n_lab))
    cs = np.empty(tb)
    log_a = np.empty(tb)
    acc = sigma
    for t in range(tb):
        lo = max(0, n_lab - (tb - t))
        hi = min(n_lab - 1, t)
        c = 0.0
        if t == 0:
            v = sp[lab[0]] * probs[0, b, lab[0]]
            alpha[0, 0] = v
            c = v
        else:
            pt = probs[t, b]
            for l in range(lo, hi + 1):
                v = alpha[t - 1, l] * ws[l]
                if l > 0:
                    v += alpha[t - 1, l - 1] * wa[l]
                v *= pt[lab[l]]
                alpha[t, l] = v
                c += v
        if c != c or c == np.inf:
            return np.nan, _NAN
        if c < _TINY:
            return 0.0, _FALLBACK
        inv = 1.0 / c
        for l in range(lo, hi + 1):
            alpha[t, l] *= inv
        cs[t] = c
        acc += math.log(c) + fmax[t, b]
        if t > 0:
            acc += tau
        log_a[t] = acc
    # Only position L-1 is allowed at the last frame, and alpha-hat sums to 1 there.
    logz = log_a[tb - 1]
    if not want:
        return logz, _OK
    beta = np.zeros(n_lab)
    nb = np.zeros(n_lab)
    beta[n_lab - 1] = 1.0
    log_b = 0.0
    for t in range(tb - 1, -1, -1):
        lo = max(0, n_lab - (tb - t))
        hi = min(n_lab - 1, t)
        r = 0.0
        for l in range(lo, hi + 1):
            r += alpha[t, l] * beta[l]
        expected = math.exp(logz - log_a[t] - log_b)
        if not abs(r - expected) <= _CHECK_TOL * expected:
            return logz, _FALLBACK
        inv = 1.0 / r
        for l in range(lo, hi + 1):
            ge[t, lab[l]] += alpha[t, l] * beta[l] * inv
        if t == 0:
            gs[lab[0]] += 1.0
            break
        scale = inv / cs[t]
        lo1 = max(0, n_lab - (tb - t + 1))
        hi1 = min(n_lab - 1, t - 1)
        pt = probs[t, b]
        for l in range(lo, hi + 1):
            nb[l] = pt[lab[l]] * beta[l]
            if has_trans:
                u = nb[l] * scale
                gt[lab[l], lab[l]] += u * alpha[t - 1, l] * ws[l]
                if l > 0:
                    gt[lab[l], lab[l - 1]] += u * alpha[t - 1, l - 1] * wa[l]
        d = 0.0
        for l in range(lo1, hi1 + 1):
            v = 0.0
            if lo <= l <= hi:
                v = nb[l] * ws[l]
            if lo <= l + 1 <= hi:
                v += nb[l + 1] * wa[l + 1]
            beta[l] = v
            d += v
        for l in range(lo, hi + 1):
            if l < lo1 or l > hi1:
                beta[l] = 0.0
        if not d >= _TINY:
            return logz, _FALLBACK
        inv_d = 1.0 / d
        for l in range(lo1, hi1 + 1):
            beta[l] *= inv_d
        log_b += math.log(d) + fmax[t, b] + tau
    return logz, _OK


@numba.njit(cache=True, nogil=True)
def _num_log(b, tb, lab, em, trans, start, has_trans, want, ge, gt, gs):
    """Exact log-space forward-backward over the target's positions."""
    n_lab = lab.shape[0]
    ws = np.empty(n_lab)
    wa = np.empty(n_lab)
    for l in range(n_lab):
        ws[l] = np.float64(trans[lab[l], lab[l]]) if has_trans else 0.0
        if l > 0:
            wa[l] = np.float64(trans[lab[l], lab[l - 1]]) if has_trans else 0.0
        else:
            wa[l] = _NEG_INF
    la = np.full((tb, n_lab), _NEG_INF)
    la[0, 0] = np.float64(start[lab[0]]) + np.float64(em[0, b, lab[0]])
    for t in range(1, tb):
        lo = max(0, n_lab - (tb - t))
        hi = min(n_lab - 1, t)
        for l in range(lo, hi + 1):
            v = la[t - 1, l] + ws[l]
            if l > 0:
                v = _lae(v, la[t - 1, l - 1] + wa[l])
            la[t, l] = v + np.float64(em[t, b, lab[l]])
    logz = la[tb - 1, n_lab - 1]
    if not want or logz == _NEG_INF or logz != logz:
        return logz
    lb = np.full(n_lab, _NEG_INF)
    nb = np.full(n_lab, _NEG_INF)
    lb[n_lab - 1] = 0.0
    for t in range(tb - 1, -1, -1):
        for l in range(n_lab):
            if la[t, l] != _NEG_INF and lb[l] != _NEG_INF:
                ge[t, lab[l]] += math.exp(la[t, l] + lb[l] - logz)
        if t == 0:
            gs[lab[0]] += 1.0
            break
        for l in range(n_lab):
            nb[l] = lb[l] + np.float64(em[t, b, lab[l]]) if lb[l] != _NEG_INF else _NEG_INF
        if has_trans:
            for l in range(n_lab):
                if nb[l] == _NEG_INF:
                    continue
                y = la[t - 1, l] + ws[l] + nb[l] - logz
                if y > -745.0:
                    gt[lab[l], lab[l]] += math.exp(y)
                if l > 0:
                    y = la[t - 1, l - 1] + wa[l] + nb[l] - logz
                    if y > -745.0:
                        gt[lab[l], lab[l - 1]] += math.exp(y)
        for l in range(n_lab):
            v = nb[l] + ws[l]
            if l + 1 < n_lab:
                v = _lae(v, nb[l + 1] + wa[l + 1])
            lb[l] = v
    return logz


# --------------------------------------------------------------------------- #
# One sequence, batch drivers                                                  #
# --------------------------------------------------------------------------- #
@numba.njit(cache=True, nogil=True)
def _asg_one(b, probs, fmax, em, m, mt, tau, trans, sp, sigma, start, targets, in_len,
             tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses, g_em, g_tr, g_st):
    t_max, _, n_cls = em.shape
    s_cap = targets.shape[1]
    tb = in_len[b]
    nl = tg_len[b]
    want = want_e or want_t or want_s
    if want_e:
        for t in range(t_max):
            for k in range(n_cls):
                g_em[t, b, k] = 0.0
    if want_t:
        for i in range(n_cls):
            for j in range(n_cls):
                g_tr[b, i, j] = 0.0
    if want_s:
        for k in range(n_cls):
            g_st[b, k] = 0.0
    ok = 0 <= tb <= t_max and 0 <= nl <= s_cap
    if ok:
        for i in range(nl):
            y = targets[b, i]
            if y < 0 or y >= n_cls:
                ok = False
    if not ok:
        _asg_nan(b, t_max, want_e, want_t, want_s, losses, g_em, g_tr, g_st)
        return
    if tb == 0:
        losses[b] = 0.0 if (nl == 0 or zero_inf) else np.inf
        return
    ge = np.zeros((tb, n_cls))
    gt = np.zeros((n_cls, n_cls))
    gs = np.zeros(n_cls)
    logz, st = _norm_linear(b, tb, probs, fmax, mt, m, tau, sp, sigma, has_trans, want,
                            ge, gt, gs)
    if st == _FALLBACK:
        ge[:, :] = 0.0
        gt[:, :] = 0.0
        gs[:] = 0.0
        logz = _norm_log(b, tb, em, trans, start, has_trans, want, ge, gt, gs)
        st = _NAN if (logz != logz or logz == np.inf) else _OK
    if st == _NAN:
        _asg_nan(b, tb, want_e, want_t, want_s, losses, g_em, g_tr, g_st)
        return
    if logz == _NEG_INF:
        # No labelling has finite weight: infeasible, zero gradient.
        losses[b] = 0.0 if zero_inf else np.inf
        return
    feasible = 0 < nl <= tb
    if feasible:
        lab = np.empty(nl, np.int64)
        for i in range(nl):
            lab[i] = targets[b, i]
        ne = np.zeros((tb, n_cls))
        nt = np.zeros((n_cls, n_cls))
        ns = np.zeros(n_cls)
        lognum, st = _num_linear(b, tb, lab, probs, fmax, m, tau, sp, sigma, has_trans,
                                 want, ne, nt, ns)
        if st == _FALLBACK:
            ne[:, :] = 0.0
            nt[:, :] = 0.0
            ns[:] = 0.0
            lognum = _num_log(b, tb, lab, em, trans, start, has_trans, want, ne, nt, ns)
            st = _NAN if (lognum != lognum or lognum == np.inf) else _OK
        if st == _NAN:
            _asg_nan(b, tb, want_e, want_t, want_s, losses, g_em, g_tr, g_st)
            return
        if lognum == _NEG_INF:
            feasible = False
        else:
            losses[b] = logz - lognum
            for t in range(tb):
                for k in range(n_cls):
                    ge[t, k] -= ne[t, k]
            for i in range(n_cls):
                gs[i] -= ns[i]
                for j in range(n_cls):
                    gt[i, j] -= nt[i, j]
    if not feasible:
        if zero_inf:
            losses[b] = 0.0
            return
        # GTN's convention: +inf loss, the normaliser's gradient.
        losses[b] = np.inf
    if want_e:
        for t in range(tb):
            for k in range(n_cls):
                g_em[t, b, k] = ge[t, k]
    if want_t:
        for i in range(n_cls):
            for j in range(n_cls):
                g_tr[b, i, j] = gt[i, j]
    if want_s:
        for k in range(n_cls):
            g_st[b, k] = gs[k]


@numba.njit(cache=True, nogil=True)
def _asg_nan(b, tb, want_e, want_t, want_s, losses, g_em, g_tr, g_st):
    losses[b] = np.nan
    if want_e:
        for t in range(max(0, min(tb, g_em.shape[0]))):
            for k in range(g_em.shape[2]):
                g_em[t, b, k] = np.nan
    if want_t:
        for i in range(g_tr.shape[1]):
            for j in range(g_tr.shape[2]):
                g_tr[b, i, j] = np.nan
    if want_s:
        for k in range(g_st.shape[1]):
            g_st[b, k] = np.nan


@numba.njit(cache=True, nogil=True, parallel=True)
def _asg_batch_parallel(order, probs, fmax, em, m, mt, tau, trans, sp, sigma, start, targets,
                        in_len, tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses,
                        g_em, g_tr, g_st):
    for i in numba.prange(order.shape[0]):
        _asg_one(order[i], probs, fmax, em, m, mt, tau, trans, sp, sigma, start, targets,
                 in_len, tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses, g_em,
                 g_tr, g_st)


@numba.njit(cache=True, nogil=True)
def _asg_batch_serial(order, probs, fmax, em, m, mt, tau, trans, sp, sigma, start, targets,
                      in_len, tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses,
                      g_em, g_tr, g_st):
    for i in range(order.shape[0]):
        _asg_one(order[i], probs, fmax, em, m, mt, tau, trans, sp, sigma, start, targets,
                 in_len, tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses, g_em,
                 g_tr, g_st)


def _shifted_exp(x: np.ndarray):
    """exp(x - max(x)) in float64 and the shift (0 when max is -inf or NaN)."""
    x = x.astype(np.float64, copy=False)
    if x.size == 0:
        return np.ones_like(x), 0.0
    mx = float(np.max(x))
    if mx == -np.inf or mx != mx:
        mx = 0.0 if mx == -np.inf else mx
    return np.exp(x - mx), mx


def asg_loss_and_grad(emissions, transitions, targets, input_lengths, target_lengths, *,
                      start_transitions=None, want_grad=(True, True, True),
                      zero_infinity=False):
    """Per-sequence ASG losses and their gradients (see the module docstring).

    Args:
      emissions: ``(T, N, C)`` float32/float64 array of unnormalised scores.
      transitions: ``(C, C)`` array (``[i, j]`` = score of ``i`` after ``j``), or
        ``None`` for no transition scores (the all-alignments loss).
      targets: ``(N, S)`` integer array of padded targets, tokens in ``[0, C)``.
      input_lengths: ``(N,)`` integers in ``[0, T]``.
      target_lengths: ``(N,)`` integers in ``[0, S]``.
      start_transitions: ``(C,)`` array of first-token scores, or ``None`` (zeros).
      want_grad: booleans ``(emissions, transitions, start_transitions)``.
      zero_infinity: infeasible sequences get loss 0 and zero gradients.

    Returns:
      ``(losses, (g_emissions, g_transitions, g_start))``: ``(N,)`` losses in
      ``emissions.dtype``; ``(T, N, C)`` gradient of each sequence's loss w.r.t.
      its emissions; ``(N, C, C)`` and ``(N, C)`` per-sequence gradients w.r.t.
      the shared transitions and start scores.  A gradient is ``None`` when not
      wanted (or its input is ``None``).
    """
    em = np.ascontiguousarray(emissions)
    dtype = em.dtype
    t_max, n, n_cls = em.shape
    has_trans = transitions is not None
    has_start = start_transitions is not None
    want_e, want_t, want_s = (bool(w) for w in want_grad)
    want_t = want_t and has_trans
    want_s = want_s and has_start
    # Every kernel buffer is float64 whatever the input dtype: one compiled
    # signature per kernel (numba compiles per dtype), results cast back at the end.
    trans = (np.ascontiguousarray(transitions, dtype=np.float64) if has_trans
             else np.zeros((0, 0), np.float64))
    start = (np.ascontiguousarray(start_transitions, dtype=np.float64) if has_start
             else np.zeros(n_cls, np.float64))
    tg = np.ascontiguousarray(targets, dtype=np.int64)
    if tg.ndim != 2:
        tg = tg.reshape(n, -1)
    il = np.ascontiguousarray(input_lengths, dtype=np.int64).reshape(n)
    tl = np.ascontiguousarray(target_lengths, dtype=np.int64).reshape(n)
    losses = np.empty(n, np.float64)
    f64 = np.float64
    g_em = np.empty((t_max, n, n_cls), f64) if want_e else np.empty((0, 0, 0), f64)
    g_tr = np.empty((n, n_cls, n_cls), f64) if want_t else np.empty((0, 0, 0), f64)
    g_st = np.empty((n, n_cls), f64) if want_s else np.empty((0, 0), f64)
    if n > 0:
        lp = em.astype(np.float64, copy=False)
        fmax = lp.max(axis=2) if n_cls else np.zeros((t_max, n))
        fmax[fmax == -np.inf] = 0.0
        probs = np.exp(lp - fmax[:, :, None])
        if has_trans:
            m, tau = _shifted_exp(trans)
            mt = np.ascontiguousarray(m.T)
        else:
            m = mt = np.ones((0, 0))
            tau = 0.0
        sp, sigma = _shifted_exp(start)
        cells = np.clip(il, 0, t_max) * ((n_cls * n_cls) if has_trans else n_cls)
        order = np.argsort(-cells, kind="stable").astype(np.int64)
        args = (order, probs, fmax, lp, m, mt, float(tau), trans, sp, float(sigma), start,
                tg, il, tl, has_trans, want_e, want_t, want_s, bool(zero_infinity), losses,
                g_em, g_tr, g_st)
        if n > 1 and int(cells.sum()) >= _PARALLEL_MIN_CELLS:
            with parallel_guard():
                old = numba.set_parallel_chunksize(1)
                try:
                    _asg_batch_parallel(*args)
                finally:
                    numba.set_parallel_chunksize(old)
        else:
            _asg_batch_serial(*args)
    return losses.astype(dtype, copy=False), (g_em.astype(dtype, copy=False) if want_e else None,
                                              g_tr.astype(dtype, copy=False) if want_t else None,
                                              g_st.astype(dtype, copy=False) if want_s else None)


def check_asg_args(fn, emissions, transitions, start_transitions, targets, input_lengths,
                   target_lengths, *, concrete=True):
    """Validate ASG arguments (shapes, dtypes; values when ``concrete``).

    Arguments are anything with ``.shape`` and ``.dtype`` (numpy, torch or JAX
    arrays, including JAX tracers when ``concrete=False``); ``targets`` is
    ``(N, S)`` padded or 1-D concatenated (``sum(target_lengths)`` labels).
    Raises ``TypeError``/``ValueError`` naming ``fn`` and the argument.

    Returns:
      The ``(N, S)`` int64 padded targets when ``concrete``, else ``None``.
    """
    from . import _validate as v

    v.check_ndim(fn, "emissions", emissions.shape, (3,), "a (T, N, C)-array")
    v.check_dtype(fn, "emissions", emissions.dtype, v.FLOAT_DTYPES, "a floating")
    t_max, n, n_cls = (int(s) for s in emissions.shape)
    edt = v.dtype_name(emissions.dtype)
    if n_cls < 1:
        raise ValueError(f"{fn}: argument 'emissions' must have at least one class (C >= 1), "
                         f"got shape {v.shape_str(emissions.shape)}")
    for arg, x, shape in (("transitions", transitions, (n_cls, n_cls)),
                          ("start_transitions", start_transitions, (n_cls,))):
        if x is None:
            continue
        v.check_dtype(fn, arg, x.dtype, v.FLOAT_DTYPES, "a floating")
        if tuple(int(s) for s in x.shape) != shape:
            raise ValueError(f"{fn}: argument '{arg}' must have shape {v.shape_str(shape)} "
                             f"(C = {n_cls} from emissions), got {v.shape_str(x.shape)}")
        if v.dtype_name(x.dtype) != edt:
            raise TypeError(f"{fn}: argument '{arg}' must have the dtype of 'emissions' "
                            f"({edt}), got {v.dtype_name(x.dtype)}")
    v.check_ndim(fn, "targets", targets.shape, (1, 2),
                 f"an (N, S) = ({n}, S)-array of padded targets or 1-D concatenated targets")
    v.check_dtype(fn, "targets", targets.dtype, v.INT_DTYPES, "an integer")
    concatenated = len(targets.shape) == 1
    if not concatenated and int(targets.shape[0]) != n:
        raise ValueError(f"{fn}: argument 'targets' must have N = {n} rows (from emissions), "
                         f"got shape {v.shape_str(targets.shape)}")
    for arg, x in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        v.check_ndim(fn, arg, x.shape, (1,), f"an (N,)-array with N = {n}")
        v.check_dtype(fn, arg, x.dtype, v.INT_DTYPES, "an integer")
        if int(x.shape[0]) != n:
            raise ValueError(f"{fn}: argument '{arg}' must be an (N,)-array with N = {n}, "
                             f"got shape {v.shape_str(x.shape)}")
    if not concrete:
        return None
    il = np.asarray(input_lengths).astype(np.int64)
    tl = np.asarray(target_lengths).astype(np.int64)
    tg = np.asarray(targets).astype(np.int64)
    v.check_lengths(fn, "input_lengths", il, t_max, "T, the number of frames")
    if concatenated:
        v.check_lengths(fn, "target_lengths", tl, tg.shape[0], "the concatenated targets' size")
        if int(tl.sum()) != tg.shape[0]:
            raise ValueError(f"{fn}: argument 'target_lengths' must sum to the size of the "
                             f"concatenated 1-D targets ({tg.shape[0]}), got sum {int(tl.sum())}")
        from ._ctc import concat_to_padded
        tg = concat_to_padded(tg, tl)
    else:
        v.check_lengths(fn, "target_lengths", tl, int(targets.shape[1]),
                        "S, the padded target length")
    v.check_labels(fn, "targets", tg, tl, n_cls)
    return tg


def _asg_run(arrays, want_grad, *, zero_infinity=False):
    emissions, transitions, start, targets, input_lengths, target_lengths = arrays
    losses, (ge, gt, gs) = asg_loss_and_grad(
        emissions, transitions, targets, input_lengths, target_lengths,
        start_transitions=start, want_grad=tuple(want_grad[:3]), zero_infinity=zero_infinity)
    return losses, (ge, gt, gs, None, None, None)


def _asg_nt_run(arrays, want_grad, *, zero_infinity=False):
    emissions, start, targets, input_lengths, target_lengths = arrays
    losses, (ge, _, gs) = asg_loss_and_grad(
        emissions, None, targets, input_lengths, target_lengths, start_transitions=start,
        want_grad=(want_grad[0], False, want_grad[1]), zero_infinity=zero_infinity)
    return losses, (ge, gs, None, None, None)


#: ASG for the frontends' adapters: arrays are ``(emissions (T,N,C), transitions
#: (C,C), start_transitions (C,), targets (N,S), input_lengths (N,),
#: target_lengths (N,))``; static ``zero_infinity``.
ASG_KERNEL = LossKernel(
    name="asg_loss",
    run=_asg_run,
    batch_axes=(1, None, None, 0, 0, 0),
    differentiable=(True, True, True, False, False, False),
)

#: ASG without transition scores (``transitions=None``): arrays are
#: ``(emissions (T,N,C), start_transitions (C,), targets, input_lengths,
#: target_lengths)``.  With zero start scores this is the all-alignments loss.
ASG_NO_TRANSITIONS_KERNEL = LossKernel(
    name="asg_loss",
    run=_asg_nt_run,
    batch_axes=(1, None, 0, 0, 0),
    differentiable=(True, True, False, False, False),
)
