r"""Duration transducers on numpy buffers: TDT (token-and-duration) and
multi-blank RNN-T, straight from the joiner's logits.

Both losses are one recursion over the ``(T_b, U_b + 1)`` lattice of a
sequence whose moves may skip frames.  From node ``(t, u)`` (``t < T_b``,
``u <= U_b``) a path takes

* a *label move*: emit ``y_{u+1}`` (``u < U_b``) and go to ``(t + d, u + 1)``
  for each label duration ``d`` with ``t + d < T_b``;
* a *blank move* ``j``: emit blank symbol ``k_j`` and go to ``(t + d_j, u)``
  (``d_j > 0``) when ``t + d_j < T_b``, or end the path when ``u = U_b`` and
  ``t + d_j = T_b`` exactly.

Paths start at ``(0, 0)``.  A move's weight is the log-probability of its
symbol, ``log_softmax(x[b, t, u, :V])_k - sigma``, plus (TDT) the duration's
``log_softmax(x[b, t, u, V:])_i``.  With the forward and backward scores
$\alpha, \beta$ (log space, float64)

.. math::

    \alpha_{0,0} = 0, \quad
    \alpha_{t',u'} = \log \sum_{m: (t,u) \to (t',u')} e^{\alpha_{t,u} + w_m}, \quad
    \text{loss}_b = -\log Z_b = -\log \sum_{m \text{ final}} e^{\alpha_{t,u} + w_m}.

The two losses differ only in the move tables (all built in Python):

* TDT (``V = C - D``): label durations = every entry of ``durations`` (0
  included), blank moves = the blank with each positive duration; duration
  log-probs from the last ``D`` logits;
* multi-blank (``V = C``): labels with duration 0 only, the standard blank
  with duration 1 and big blank ``i`` (index ``blank - 1 - i``) with duration
  ``big_blank_durations[i]``; no duration logits;
* the standard RNN-T (TDT's ``omega`` term): labels with duration 0, the blank
  with duration 1, on the first ``V`` logits.

Gradient w.r.t. the logits (per sequence, before any reduction), with move
posteriors $P_m = e^{\alpha_{t,u} + w_m + \beta_{dest} - \log Z}$, the
cell's occupation $o = \sum_m P_m$ over its moves and $P_y$ the
posterior of its label moves:

.. math::

    g_{t,u,k} = \operatorname{softmax}_k \cdot (o + \lambda P_y)
        - (1 + \lambda) [k = y_{u+1}] P_y - \sum_{j: k_j = k} P_j
        \quad (k < V), \qquad
    g_{t,u,V+i} = \operatorname{softmax}^{dur}_i \cdot o - P^{dur}_i ,

with $\lambda$ = ``fastemit_lambda`` (FastEmit scales the gradient
through the label moves' token log-probs, never the durations'; the loss
reported is ``(1 + lambda) * NLL``, as NeMo's kernels) and the token part
(``k < V``) clamped to ``[-clamp, clamp]`` when ``clamp > 0`` (NeMo's
``clamp``: never the duration logits).  With reduction weights ``w``
(``grad_weights``) each sequence's clamped gradient is multiplied by ``w_b``
in the same store.

NB (NaN/inf policy, as `duoloss.core.losses.transducer`): ``-inf``
logits are valid, and a cell whose token (or duration) logits are all ``-inf``
gives probability 0 to every move from it (``+inf`` only when every path
crosses it; its gradient row 0); a sequence without a path (e.g. ``durations = [2]`` with an
odd ``T_b``) gets loss ``+inf`` and zero gradient; a NaN in a row the lattice
reads makes that sequence's loss and its rows' gradient NaN, never the other
sequences'; an invalid length or label (possible only for traced values) gives
NaN, never an out-of-bounds read.  ``T_b = 0``: loss 0 when ``U_b = 0`` (the
empty path, as ``rnnt_loss``), else ``+inf``.

Implementation: one kernel per sequence (parallel over the batch), float64
inside for float32 logits: each read cell's two normalisers in one vectorised
pass (`exp_poly`, a ``reassoc`` sum), the
forward (push) and backward (pull) recursions in log space with
`logaddexp_fast`, then each cell's gradient row
(the softmax term vectorised, the cell's own symbols corrected exactly) written
in the logits' dtype.  The move tables are small int arrays built in Python,
so TDT, multi-blank and the RNN-T of ``omega`` share the compiled kernels (two
dtypes, serial and parallel).
"""
from __future__ import annotations

import math

import numba
import numpy as np
import numpy.typing as npt
from typing import Sequence

# NB: the kernels inline exp_poly and fast_exp; numba's on-disk cache is keyed
# on this file's mtime only, so touch it after editing _numerics.py.
from .._numerics import HELPER
from .._numerics import NEG_INF as _NEG_INF
from .._numerics import logaddexp_fast as _lae
from .._numerics import exp_poly, fast_exp
from .._pool import run_batch
from .._spec import LossKernel
from .._validate import check_impl
from .transducer import check_targets_and_lengths

__all__ = ["TDT_KERNEL", "MULTIBLANK_KERNEL", "check_tdt_args", "check_multiblank_args",
           "check_duration_options", "check_host_impl", "durations_key", "tdt_loss_and_grad",
           "multiblank_loss_and_grad"]

_PARALLEL_MIN_CELLS = 20_000


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _lse(row, k0, k1):
    """``log sum exp row[k0:k1]`` in float64; NaN for a row with a NaN or
    ``+inf`` entry (as ``torch.log_softmax``), ``-inf`` for a row of ``-inf``
    only (no probability to share: every move it weighs is impossible, see
    `_log_prob`).  Not inlined: its own ``reassoc`` flag lets the sum
    vectorise (6x measured at ``V = 256``)."""
    m = _NEG_INF
    for k in range(k0, k1):
        v = np.float64(row[k])
        m = v if v > m else m
    if m == _NEG_INF:
        return m
    acc = 0.0
    for k in range(k0, k1):
        acc += exp_poly(np.float64(row[k]) - m)   # NaN for NaN, inf - inf, -inf - -inf
    return m + math.log(acc)


@numba.njit(cache=True, nogil=True, inline="always")
def _log_prob(v, s):
    """``v - s``: a logit's log-probability under the normaliser ``s``; ``-inf``
    when ``s = -inf`` (a row of ``-inf`` only: probability 0, not NaN)."""
    return v - s if s != _NEG_INF else _NEG_INF


@numba.njit(**HELPER, fastmath={"contract"})
def _softmax_row(row, n, s, c, clamp, wb, out):
    """``out[k] = clip(exp(row[k] - s) * c) * wb`` for ``k < n`` (vectorised)."""
    if clamp > 0.0:
        for k in range(n):
            v = exp_poly(np.float64(row[k]) - s) * c
            v = v if not v > clamp else clamp
            out[k] = (v if not v < -clamp else -clamp) * wb
    else:
        for k in range(n):
            out[k] = exp_poly(np.float64(row[k]) - s) * c * wb


@numba.njit(cache=True, nogil=True, inline="always")
def _clip(v, clamp):
    """``v`` clamped to ``[-clamp, clamp]`` when ``clamp > 0``."""
    if clamp > 0.0:
        v = v if not v > clamp else clamp
        v = v if not v < -clamp else -clamp
    return v


@numba.njit(cache=True, nogil=True, inline="always")
def _move(base, dlp, t, u, di):
    """A move's log-weight: its symbol's ``base`` plus its duration's, if it has one."""
    return base + (dlp[t, u, di] if di >= 0 else 0.0)


@numba.njit(cache=True, nogil=True)
def _seq_ok(b, x, tg, il, tl, n_lab, blk_sym):
    """Whether sequence ``b``'s lengths and labels are valid (no blank among the labels)."""
    tb = il[b]
    ub = tl[b]
    ok = 0 <= tb <= x.shape[1] and 0 <= ub <= x.shape[2] - 1 and ub <= tg.shape[1]
    if ok:
        for i in range(ub):
            y = tg[b, i]
            if y < 0 or y >= n_lab:
                ok = False
            for j in range(blk_sym.shape[0]):
                if y == blk_sym[j]:
                    ok = False
    return ok


@numba.njit(cache=True, nogil=True)
def _cell_log_probs(b, x, tg, tb, ub, n_lab, n_dur, blk_sym, sigma):
    """Per cell ``(t, u)``: the token normaliser ``lse``, the label's and each blank's
    log-probability (``lab``, ``blk``), the durations' log-probabilities ``dlp`` and
    normaliser ``dlse`` (float64)."""
    u1 = ub + 1
    kb = blk_sym.shape[0]
    lse = np.empty((tb, u1))
    lab = np.full((tb, u1), _NEG_INF)
    blk = np.empty((tb, u1, kb))
    dlp = np.zeros((tb, u1, max(n_dur, 1)))
    dlse = np.zeros((tb, u1))
    for t in range(tb):
        for u in range(u1):
            row = x[b, t, u]
            s = _lse(row, 0, n_lab)
            lse[t, u] = s
            if u < ub:
                lab[t, u] = _log_prob(np.float64(row[tg[b, u]]), s) - sigma
            for j in range(kb):
                blk[t, u, j] = _log_prob(np.float64(row[blk_sym[j]]), s) - sigma
            if n_dur > 0:
                s = _lse(row, n_lab, n_lab + n_dur)
                dlse[t, u] = s
                for k in range(n_dur):
                    dlp[t, u, k] = _log_prob(np.float64(row[n_lab + k]), s)
    return lse, lab, blk, dlp, dlse


@numba.njit(cache=True, nogil=True)
def _alpha(tb, ub, lab, blk, dlp, lab_dur, lab_di, blk_dur, blk_di):
    """Forward variables (pushed: moves go to a later frame or, with ``d = 0``, to
    ``u + 1``) and ``log Z``."""
    u1 = ub + 1
    alpha = np.full((tb, u1), _NEG_INF)
    alpha[0, 0] = 0.0
    logz = _NEG_INF
    for t in range(tb):
        for u in range(u1):
            a = alpha[t, u]
            if a == _NEG_INF:
                continue
            if u < ub:
                for k in range(lab_dur.shape[0]):
                    d = lab_dur[k]
                    if t + d < tb:
                        w = _move(lab[t, u], dlp, t, u, lab_di[k])
                        alpha[t + d, u + 1] = _lae(alpha[t + d, u + 1], a + w)
            for j in range(blk_dur.shape[0]):
                d = blk_dur[j]
                w = _move(blk[t, u, j], dlp, t, u, blk_di[j])
                if t + d < tb:
                    alpha[t + d, u] = _lae(alpha[t + d, u], a + w)
                elif t + d == tb and u == ub:
                    logz = _lae(logz, a + w)
    return alpha, logz


@numba.njit(cache=True, nogil=True)
def _beta(tb, ub, lab, blk, dlp, lab_dur, lab_di, blk_dur, blk_di):
    """Backward variables (pulled, in the reverse order of `_alpha`)."""
    beta = np.full((tb, ub + 1), _NEG_INF)
    for t in range(tb - 1, -1, -1):
        for u in range(ub, -1, -1):
            acc = _NEG_INF
            if u < ub:
                for k in range(lab_dur.shape[0]):
                    d = lab_dur[k]
                    if t + d < tb:
                        w = _move(lab[t, u], dlp, t, u, lab_di[k])
                        acc = _lae(acc, w + beta[t + d, u + 1])
            for j in range(blk_dur.shape[0]):
                d = blk_dur[j]
                w = _move(blk[t, u, j], dlp, t, u, blk_di[j])
                if t + d < tb:
                    acc = _lae(acc, w + beta[t + d, u])
                elif t + d == tb and u == ub:
                    acc = _lae(acc, w)
            beta[t, u] = acc
    return beta


@numba.njit(cache=True, nogil=True, inline="always")
def _occupations(t, u, tb, ub, a, lab, blk, dlp, beta, logz, lab_dur, lab_di, blk_dur, blk_di,
                 pdur, pblk):
    """The posteriors of cell ``(t, u)``'s moves: ``(occ, plab)`` (all moves, the label's),
    each blank's in ``pblk`` and each duration's in ``pdur`` (overwritten)."""
    occ = 0.0
    plab = 0.0
    for i in range(pdur.shape[0]):
        pdur[i] = 0.0
    if u < ub:
        for k in range(lab_dur.shape[0]):
            d = lab_dur[k]
            if t + d < tb:
                di = lab_di[k]
                p = fast_exp(a + _move(lab[t, u], dlp, t, u, di) + beta[t + d, u + 1] - logz)
                plab += p
                if di >= 0:
                    pdur[di] += p
    for j in range(blk_dur.shape[0]):
        d = blk_dur[j]
        di = blk_di[j]
        w = _move(blk[t, u, j], dlp, t, u, di)
        p = 0.0
        if t + d < tb:
            p = fast_exp(a + w + beta[t + d, u] - logz)
        elif t + d == tb and u == ub:
            p = fast_exp(a + w - logz)
        pblk[j] = p
        occ += p
        if di >= 0:
            pdur[di] += p
    return occ + plab, plab


@numba.njit(cache=True, nogil=True, inline="always")
def _grad_cell(row, grow, y, s, ds, occ, plab, pblk, pdur, blk_sym, n_lab, n_dur, lam, clamp,
               dur_grad, wb):
    """Cell gradient row ``grow`` from its posteriors: the softmax term (vectorised), then
    the label ``y`` (``-1``: none) and each distinct blank exactly, then the durations."""
    c = occ + lam * plab
    _softmax_row(row, n_lab, s, c, clamp, wb, grow)
    if y >= 0:
        grow[y] = _clip(exp_poly(np.float64(row[y]) - s) * c - (1.0 + lam) * plab, clamp) * wb
    kb = blk_sym.shape[0]
    for j in range(kb):
        k = blk_sym[j]
        first = True
        adj = 0.0
        for i in range(kb):
            if blk_sym[i] == k:
                adj += pblk[i]
                if i < j:
                    first = False
        if first:
            grow[k] = _clip(exp_poly(np.float64(row[k]) - s) * c - adj, clamp) * wb
    if dur_grad:
        for i in range(n_dur):
            grow[n_lab + i] = (exp_poly(np.float64(row[n_lab + i]) - ds) * occ - pdur[i]) * wb


@numba.njit(cache=True, nogil=True)
def _seq(b, x, tg, il, tl, n_lab, n_dur, lab_dur, lab_di, blk_sym, blk_dur, blk_di, sigma,
         lam, clamp, dur_grad, want, gw, losses, g):
    """Loss (and gradient rows) of sequence ``b``; ``g`` is zero on entry."""
    tb = il[b]
    ub = tl[b]
    if not _seq_ok(b, x, tg, il, tl, n_lab, blk_sym):
        losses[b] = np.nan
        if want:
            g[b] = np.nan
        return
    if tb == 0:
        losses[b] = 0.0 if ub == 0 else np.inf
        return
    lse, lab, blk, dlp, dlse = _cell_log_probs(b, x, tg, tb, ub, n_lab, n_dur, blk_sym, sigma)
    alpha, logz = _alpha(tb, ub, lab, blk, dlp, lab_dur, lab_di, blk_dur, blk_di)
    losses[b] = -logz * (1.0 + lam)
    if not want:
        return
    if logz != logz:
        g[b, :tb, :ub + 1] = np.nan
        return
    if logz == _NEG_INF:
        return  # infeasible: loss +inf, zero gradient
    beta = _beta(tb, ub, lab, blk, dlp, lab_dur, lab_di, blk_dur, blk_di)
    pdur = np.zeros(max(n_dur, 1))
    pblk = np.zeros(blk_sym.shape[0])
    for t in range(tb):
        for u in range(ub + 1):
            a = alpha[t, u]
            if a == _NEG_INF:
                continue
            occ, plab = _occupations(t, u, tb, ub, a, lab, blk, dlp, beta, logz, lab_dur,
                                     lab_di, blk_dur, blk_di, pdur, pblk)
            if occ != 0.0:
                _grad_cell(x[b, t, u], g[b, t, u], tg[b, u] if u < ub else -1, lse[t, u],
                           dlse[t, u], occ, plab, pblk, pdur, blk_sym, n_lab, n_dur, lam,
                           clamp, dur_grad, gw[b])


@numba.njit(cache=True, nogil=True)
def _serial(order, x, tg, il, tl, n_lab, n_dur, lab_dur, lab_di, blk_sym, blk_dur, blk_di, sigma,
            lam, clamp, dur_grad, want, gw, losses, g):
    for i in range(order.shape[0]):
        _seq(order[i], x, tg, il, tl, n_lab, n_dur, lab_dur, lab_di, blk_sym, blk_dur, blk_di,
             sigma, lam, clamp, dur_grad, want, gw, losses, g)



def _run_tables(x, targets, logit_lengths, target_lengths, n_lab, n_dur, tables, sigma, lam,
                clamp, dur_grad, want, weights=None):
    """One pass of the kernels: ``(losses float64 (N,), grad or None)``; the
    gradient (in ``x``'s dtype) is that of ``sum_b weights[b] * loss_b``."""
    lab_dur, lab_di, blk_sym, blk_dur, blk_di = (np.asarray(a, np.int64) for a in tables)
    x = np.ascontiguousarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)
    tg = np.ascontiguousarray(targets, np.int64)
    if tg.ndim != 2:
        tg = tg.reshape(x.shape[0], -1)
    il = np.ascontiguousarray(logit_lengths, np.int64).reshape(-1)
    tl = np.ascontiguousarray(target_lengths, np.int64).reshape(-1)
    n = x.shape[0]
    losses = np.empty(n, np.float64)
    g = np.zeros(x.shape if want else (0, 0, 0, 0), x.dtype)
    w = np.ones(n) if weights is None else np.ascontiguousarray(weights, np.float64).reshape(n)
    if n > 0:
        args = (x, tg, il, tl, n_lab, n_dur, lab_dur, lab_di, blk_sym, blk_dur, blk_di,
                float(sigma), float(lam), float(clamp), bool(dur_grad), bool(want), w, losses, g)
        cells = n * x.shape[1] * x.shape[2]
        run_batch(_serial, np.arange(n, dtype=np.int64), cells, _PARALLEL_MIN_CELLS, args)
    return losses, (g if want else None)


def _tdt_tables(durations, blank):
    durations = [int(d) for d in durations]
    lab_dur = durations
    lab_di = list(range(len(durations)))
    blk = [(i, d) for i, d in enumerate(durations) if d > 0]
    return (lab_dur, lab_di, [blank] * len(blk), [d for _, d in blk], [i for i, _ in blk])


def _rnnt_tables(blank):
    return ([0], [-1], [blank], [1], [-1])


def _multiblank_tables(big_blank_durations, blank):
    big = [int(d) for d in big_blank_durations]
    syms = [blank] + [blank - 1 - i for i in range(len(big))]
    return ([0], [-1], syms, [1] + big, [-1] * (1 + len(big)))


def durations_key(durations):
    """Durations as a static key the frontends can pass under ``torch.compile``
    (an identifier: ``(0, 1, 2)`` -> ``'d0_1_2'``, ``()`` -> ``'d'``)."""
    return "d" + "_".join(str(int(d)) for d in durations)


def _parse(key):
    return tuple(int(d) for d in key[1:].split("_")) if len(key) > 1 else ()


def tdt_loss_and_grad(logits: npt.ArrayLike, targets: npt.ArrayLike, logit_lengths: npt.ArrayLike,
                      target_lengths: npt.ArrayLike, *, blank: int, durations: Sequence[int],
                      sigma: float = 0.0, fastemit_lambda: float = 0.0, clamp: float = -1.0,
                      omega: float = 0.0, want_grad: bool = True,
                      grad_weights: npt.ArrayLike | None = None
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-sequence TDT losses and their gradients w.r.t. ``logits`` (NeMo's semantics).

    Args:
      logits: ``(N, T, U + 1, V + D)`` float32/float64: ``V`` token logits
        (blank among them) then ``D = len(durations)`` duration logits.
      targets: ``(N, U)`` integers.
      logit_lengths: ``(N,)`` integers.
      target_lengths: ``(N,)`` integers.
      blank: the blank's index in ``[0, V)``.
      durations: distinct ints >= 0, one at least positive (checked by the
        frontends).
      sigma: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].
      fastemit_lambda: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].
      clamp: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].
      omega: as in [`duoloss.torch.tdt_loss`][duoloss.torch.tdt_loss].
      want_grad: compute the gradient.
      grad_weights: ``(N,)`` float64 weights ``w`` or None: the gradient is
        then that of ``sum_b w_b * loss_b`` (each sequence's clamped gradient
        times ``w_b``, folded into the kernel's stores; the losses stay
        unweighted).

    Returns:
      ``(losses, grad)``: ``(N,)`` losses and the ``(N, T, U + 1, V + D)``
      gradient of each sequence's own loss (``None`` unless ``want_grad``), in
      the logits' dtype.
    """
    x = np.asarray(logits)
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    durations = tuple(int(d) for d in durations)
    n_dur = len(durations)
    n_lab = x.shape[-1] - n_dur
    omega = float(omega)
    args = (targets, logit_lengths, target_lengths)
    losses, g = None, None
    if omega < 1.0:
        losses, g = _run_tables(x, *args, n_lab, n_dur, _tdt_tables(durations, blank), sigma,
                                fastemit_lambda, clamp, True, want_grad, grad_weights)
    if omega > 0.0:
        lr, gr = _run_tables(x, *args, n_lab, n_dur, _rnnt_tables(blank), 0.0, fastemit_lambda,
                             clamp, False, want_grad, grad_weights)
        if losses is None:
            losses, g = lr, gr
        else:
            losses = (1.0 - omega) * losses + omega * lr
            if want_grad:
                g *= g.dtype.type(1.0 - omega)
                g += g.dtype.type(omega) * gr
                g[np.isinf(losses)] = 0.0
    return losses.astype(dtype), (g.astype(dtype, copy=False) if want_grad else None)


def multiblank_loss_and_grad(logits: npt.ArrayLike, targets: npt.ArrayLike,
                             logit_lengths: npt.ArrayLike, target_lengths: npt.ArrayLike, *,
                             blank: int, big_blank_durations: Sequence[int], sigma: float = 0.0,
                             fastemit_lambda: float = 0.0, clamp: float = -1.0,
                             want_grad: bool = True, grad_weights: npt.ArrayLike | None = None
                             ) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-sequence multi-blank RNN-T losses and gradients w.r.t. ``logits``
    ``(N, T, U + 1, V)`` (NeMo's semantics; big blank ``i`` at ``blank - 1 - i``;
    ``grad_weights`` as in [`tdt_loss_and_grad`][duoloss.core.tdt_loss_and_grad]).

    Returns ``(losses (N,), grad or None)`` in the logits' dtype.
    """
    x = np.asarray(logits)
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    losses, g = _run_tables(x, targets, logit_lengths, target_lengths, x.shape[-1], 0,
                            _multiblank_tables(big_blank_durations, blank), sigma,
                            fastemit_lambda, clamp, False, want_grad, grad_weights)
    return losses.astype(dtype), (g.astype(dtype, copy=False) if want_grad else None)


def _tdt_run(arrays, want_grad, *, blank, durations, sigma, fastemit_lambda, clamp, omega,
             grad_weights=None):
    x, tg, il, tl = arrays
    losses, g = tdt_loss_and_grad(x, tg, il, tl, blank=blank, durations=_parse(durations),
                                  sigma=sigma, fastemit_lambda=fastemit_lambda, clamp=clamp,
                                  omega=omega, want_grad=bool(want_grad[0]),
                                  grad_weights=grad_weights)
    return losses, (g, None, None, None)


def _multiblank_run(arrays, want_grad, *, blank, big_blank_durations, sigma, fastemit_lambda,
                    clamp, grad_weights=None):
    x, tg, il, tl = arrays
    losses, g = multiblank_loss_and_grad(
        x, tg, il, tl, blank=blank, big_blank_durations=_parse(big_blank_durations),
        sigma=sigma, fastemit_lambda=fastemit_lambda, clamp=clamp, want_grad=bool(want_grad[0]),
        grad_weights=grad_weights)
    return losses, (g, None, None, None)


#: TDT for the frontends' adapters: arrays ``(logits, targets, logit_lengths,
#: target_lengths)``; static ``blank`` (in ``[0, V)``), ``durations`` (a
#: key, e.g. ``"d0_1_2"``), ``sigma``, ``fastemit_lambda``,
#: ``clamp``, ``omega``.  Durations are passed as `durations_key`.
TDT_KERNEL = LossKernel(
    name="tdt_loss",
    run=_tdt_run,
    batch_axes=(0, 0, 0, 0),
    differentiable=(True, False, False, False),
    weighted=True,
)

#: Multi-blank RNN-T for the frontends' adapters: arrays as `TDT_KERNEL`;
#: static ``blank``, ``big_blank_durations`` (a `durations_key`),
#: ``sigma``, ``fastemit_lambda``, ``clamp``.
MULTIBLANK_KERNEL = LossKernel(
    name="multiblank_rnnt_loss",
    run=_multiblank_run,
    batch_axes=(0, 0, 0, 0),
    differentiable=(True, False, False, False),
    weighted=True,
)


# --------------------------------------------------------------------------- #
# Validation (before any kernel runs; identical messages in both frontends)    #
# --------------------------------------------------------------------------- #
def _int_tuple(fn, arg, values, what):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{fn}: argument '{arg}' must be a list/tuple of ints ({what}), "
                        f"got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{fn}: argument '{arg}' must be a list/tuple of ints ({what}), "
                            f"got an entry of type {type(v).__name__}")
        out.append(int(v))
    return tuple(out)


def check_tdt_durations(fn, durations):
    """``durations`` as a tuple: distinct ints >= 0, at least one positive."""
    d = _int_tuple(fn, "durations", durations, "distinct durations >= 0, one at least positive")
    if not d:
        raise ValueError(f"{fn}: argument 'durations' must be a non-empty list of distinct ints "
                         f">= 0 with at least one positive, got {list(d)}")
    if min(d) < 0:
        raise ValueError(f"{fn}: argument 'durations' must hold ints >= 0, got {list(d)}")
    if len(set(d)) != len(d):
        raise ValueError(f"{fn}: argument 'durations' must hold distinct ints, got {list(d)}")
    if max(d) < 1:
        raise ValueError(f"{fn}: argument 'durations' must hold at least one positive duration "
                         f"(every path ends with a blank of duration > 0), got {list(d)}")
    return d


def check_big_blank_durations(fn, durations):
    """``big_blank_durations`` as a tuple of ints >= 1 (possibly empty)."""
    d = _int_tuple(fn, "big_blank_durations", durations, "durations >= 1")
    if d and min(d) < 1:
        raise ValueError(f"{fn}: argument 'big_blank_durations' must hold ints >= 1, "
                         f"got {list(d)}")
    return d




def check_host_impl(fn, impl):
    """``impl`` (``'auto'``/``'host'``); ``'device'`` raises ``NotImplementedError``:
    these losses have no device kernel yet (the seam: the frontends' one
    ``apply_kernel`` call)."""
    check_impl(fn, impl)
    if impl == "device":
        raise NotImplementedError(
            f"{fn}: impl='device' is not available: this loss has no device kernel yet; use "
            f"impl='auto' or 'host' (the numba core; accelerator inputs make one round trip "
            f"through the host)")
    return impl


def check_duration_options(fn, reduction, clamp, fastemit_lambda, sigma, omega=0.0):
    """The scalar options (plain Python values)."""
    from .. import _validate as v

    v.check_reduction(fn, reduction)
    for arg, x in (("clamp", clamp), ("fastemit_lambda", fastemit_lambda), ("sigma", sigma),
                   ("omega", omega)):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer,
                                                                 np.floating)):
            raise TypeError(f"{fn}: argument '{arg}' must be a float, got {type(x).__name__}")
        if not math.isfinite(float(x)):
            raise ValueError(f"{fn}: argument '{arg}' must be finite, got {x!r}")
    if float(fastemit_lambda) < 0:
        raise ValueError(f"{fn}: argument 'fastemit_lambda' must be >= 0, got {fastemit_lambda!r}")
    if not 0.0 <= float(omega) <= 1.0:
        raise ValueError(f"{fn}: argument 'omega' must be in [0, 1], got {omega!r}")


def _check_common(fn, logits, targets, logit_lengths, target_lengths, n_lab, layout):
    from .. import _validate as v

    v.check_ndim(fn, "logits", logits.shape, (4,), layout)
    v.check_dtype(fn, "logits", logits.dtype, v.FLOAT_DTYPES, "a floating")
    n, t_max, u1, _ = (int(s) for s in logits.shape)
    check_targets_and_lengths(fn, logits.shape, targets, logit_lengths, target_lengths)
    return n, t_max, u1


def _check_values(fn, targets, logit_lengths, target_lengths, t_max, u1, n_lab, blanks, what):
    from .. import _validate as v

    il = np.asarray(logit_lengths).astype(np.int64)
    tl = np.asarray(target_lengths).astype(np.int64)
    v.check_lengths(fn, "logit_lengths", il, t_max, "T, the number of frames")
    v.check_lengths(fn, "target_lengths", tl, u1 - 1, "U, the padded target length")
    tg = np.asarray(targets).astype(np.int64)
    v.check_labels(fn, "targets", tg, tl, n_lab)
    for k in blanks:
        v.check_labels(fn, "targets", tg, tl, n_lab, forbidden=k, forbidden_what=what)


def check_tdt_args(fn, logits, targets, logit_lengths, target_lengths, blank, durations, *,
                   concrete=True):
    """Validate TDT arguments; returns ``(blank in [0, V), durations tuple)``.

    ``logits`` ``(N, T, U + 1, V + D)`` with ``V >= 1``; ``blank`` in ``[-V, V)``
    (negative counts from the end of the token logits); with ``concrete`` the
    lengths and labels too (labels in ``[0, V)``, never the blank).
    """
    from .. import _validate as v

    durations = check_tdt_durations(fn, durations)
    layout = f"an (N, T, U + 1, V + D)-array with D = len(durations) = {len(durations)}"
    v.check_ndim(fn, "logits", logits.shape, (4,), layout)
    c = int(logits.shape[3])
    n_lab = c - len(durations)
    if n_lab < 1 or int(logits.shape[2]) < 1:
        raise ValueError(f"{fn}: argument 'logits' must have a last axis of V + D with V >= 1 and "
                         f"D = len(durations) = {len(durations)}, and U + 1 >= 1, "
                         f"got shape {v.shape_str(logits.shape)}")
    _, t_max, u1 = _check_common(fn, logits, targets, logit_lengths, target_lengths, n_lab,
                                 layout)
    blank = v.check_int_scalar(fn, "blank", blank, -n_lab, n_lab)
    if blank < 0:
        blank += n_lab
    if concrete:
        _check_values(fn, targets, logit_lengths, target_lengths, t_max, u1, n_lab, (blank,),
                      "the blank")
    return blank, durations


def check_multiblank_args(fn, logits, targets, logit_lengths, target_lengths, blank,
                          big_blank_durations, *, concrete=True):
    """Validate multi-blank arguments; returns ``(blank in [0, V), durations tuple)``.

    Big blank ``i`` sits at ``blank - 1 - i``, which must be ``>= 0``; labels
    are never the blank nor a big blank.
    """
    from .. import _validate as v

    big = check_big_blank_durations(fn, big_blank_durations)
    layout = "an (N, T, U + 1, V)-array"
    v.check_ndim(fn, "logits", logits.shape, (4,), layout)
    n_lab = int(logits.shape[3])
    if n_lab < 1 or int(logits.shape[2]) < 1:
        raise ValueError(f"{fn}: argument 'logits' must have U + 1 >= 1 and V >= 1, "
                         f"got shape {v.shape_str(logits.shape)}")
    _, t_max, u1 = _check_common(fn, logits, targets, logit_lengths, target_lengths, n_lab,
                                 layout)
    blank = v.check_int_scalar(fn, "blank", blank, -n_lab, n_lab)
    if blank < 0:
        blank += n_lab
    if blank - len(big) < 0:
        raise ValueError(f"{fn}: argument 'blank' must leave room for the {len(big)} big blanks "
                         f"at indices blank - 1 - i >= 0, got blank = {blank}")
    if concrete:
        syms = [blank] + [blank - 1 - i for i in range(len(big))]
        _check_values(fn, targets, logit_lengths, target_lengths, t_max, u1, n_lab, syms,
                      "a blank or big blank")
    return blank, big
