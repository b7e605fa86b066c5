r"""Auto Segmentation Criterion (ASG) and the all-alignments loss on numpy buffers.

Shapes: ``T`` frames, ``N`` sequences, ``C`` tokens (there is no blank), ``S``
padded target length; sequence ``b`` has ``T_b = input_lengths[b]`` frames and
``L_b = target_lengths[b]`` tokens ``y_1 .. y_L``.

A *frame labelling* $\pi = (\pi_1, \dots, \pi_{T_b})$ assigns one token to
each frame.  With emissions $e_t(k)$ (``emissions[t, b, k]``, unnormalised),
transitions $A_{ij}$ (``transitions[i, j]``: score of token ``i`` right
after token ``j``; row = to, column = from) and start scores $s_k$
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
$\alpha_t(i) = e_t(i) + \operatorname{logsumexp}_j(\alpha_{t-1}(j) + A_{ij})$
over all ``C`` tokens; the second one runs it over the ``L`` target positions,
each of which either stays ($A_{y_l y_l}$) or advances from the previous
position ($A_{y_l y_{l-1}}$).

Gradients are expected counts: ``d loss / d emissions[t, b, k]`` is the posterior
of token ``k`` at frame ``t`` under the normaliser minus the same posterior under
the target paths; ``d loss / d transitions[i, j]`` is the expected number of
``j -> i`` transitions (normaliser minus target); ``d loss / d start[k]`` is the
probability that a path starts with ``k`` (normaliser minus target, where the
latter is 1 for ``k = y_1``).

Without ``transitions`` (and without start scores) the normaliser factorises
over frames, every labelling has weight $\sum_t e_t(\pi_t)$, and the loss
is the *all-alignments* loss of GTN's PyTorch example
(``bindings/python/examples/pytorch_loss.py``); the emission gradient is then
``softmax(emissions) - posterior``.

Implementation: as in `duoloss.core.losses.ctc`, the kernels exponentiate the
emissions once per frame (relative to the frame's maximum; values below
``exp(-708)`` relative to it flush to 0), the transitions and start scores once
per call (relative to their maxima; zero-padded to a multiple of 8 tokens), run
both forward-backward passes in *linear* space in float64 with per-frame
rescaling, check on every frame that the posteriors sum to one, and fall back to
an exact log-space recursion for a sequence where that check fails or a frame's
mass underflows (e.g. a transition needed by the target that is ~700 nats below
the best one).  The fallback runs as a second kernel over those sequences only
(`_asg_batch_exact`: the whole sequence again, with the log-space recursions,
on a float64 copy of those sequences' emissions: one signature for both dtypes),
so numba compiles it only when a call first needs it.  Those exact recursions
are the same code as the Viterbi decoders
of `duoloss.core.losses.align` in the other semiring: one token trellis (the
normaliser; `asg_viterbi`) and one target trellis
(`asg_align`), with the semiring a compile-time
constant.  The expected transition counts are accumulated during the
backward pass; emission posteriors overwrite the forward variables.

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
import numpy.typing as npt

# NB: the kernels inline these; numba's on-disk cache is keyed on this file's
# mtime only, so touch it after editing _numerics.py.
from .. import _numerics, _pool
from .._numerics import CHECK_TOL as _CHECK_TOL
from .._numerics import FALLBACK as _FALLBACK
from .._numerics import FLUSH as _FLUSH
from .._numerics import NAN as _NAN
from .._numerics import NEG_INF as _NEG_INF
from .._numerics import OK as _OK
from .._numerics import HELPER, exp_core, fast_exp, sequence_ok
from .._numerics import logaddexp as _lae
from .._spec import LossKernel

__all__ = [
    "ASG_KERNEL",
    "ASG_NO_TRANSITIONS_KERNEL",
    "asg_loss_and_grad",
    "check_asg_args",
]

_TINY = 1e-200
_MAX_SCALE = 1e250  # 1 / (c_t r_t) beyond this: transition counts in log space
_PARALLEL_MIN_CELLS = 40_000
# --------------------------------------------------------------------------- #
# Normaliser: all C tokens at every frame                                      #
# --------------------------------------------------------------------------- #
# The linear-space kernels fuse multiply-adds; only their sums (small helpers)
# may be reassociated, to be vectorised.  No NaN/inf assumptions anywhere, so the
# NaN and underflow checks stand.  (Reassociation in the kernels themselves makes
# LLVM vectorise the matrix loops along the wrong axis, with gathers.)
_FM = {"contract"}
_FM_SUM = {"reassoc", "contract"}
# Cold compile (issue 19): numba compiles each overload once per argument-type
# combination, so the fast kernels allocate float64 scratch only as
# ``np.empty((a, b))`` / ``np.zeros((a, b))`` (a 1-D array is row 0 of a
# ``(1, n)`` one) and pass row numbers as runtime int64 values, not literals.


@numba.njit(**HELPER, fastmath=_FM_SUM)
def _sum_row(a, r, lo, hi):
    """``sum(a[r, lo:hi])`` (``lo``, ``hi`` unsigned: no negative-index code)."""
    s = 0.0
    for k in range(lo, hi):
        s += a[r, k]
    return s


@numba.njit(**HELPER, fastmath=_FM_SUM)
def _dot_rows(a, ra, b, rb, lo, hi):
    """``a[ra, lo:hi] @ b[rb, lo:hi]`` (``lo``, ``hi`` unsigned)."""
    s = 0.0
    for k in range(lo, hi):
        s += a[ra, k] * b[rb, k]
    return s


@numba.njit(**HELPER, fastmath=_FM)
def _matvec(a, x, rx, y, ry):
    """``y[ry, j] = sum_i x[rx, i] a[i, j]`` for ``(n, n)`` ``a``, ``n`` a multiple of 8.

    Eight rows per sweep over ``y``: eight times fewer loads and stores of ``y``
    than a row-by-row axpy, and a loop LLVM vectorises without reassociating.
    """
    n = a.shape[0]
    for j in range(n):
        y[ry, j] = 0.0
    for i in range(0, n, 8):
        x0 = x[rx, i]
        x1 = x[rx, i + 1]
        x2 = x[rx, i + 2]
        x3 = x[rx, i + 3]
        x4 = x[rx, i + 4]
        x5 = x[rx, i + 5]
        x6 = x[rx, i + 6]
        x7 = x[rx, i + 7]
        for j in range(n):
            y[ry, j] += (((x0 * a[i, j] + x1 * a[i + 1, j])
                          + (x2 * a[i + 2, j] + x3 * a[i + 3, j]))
                         + ((x4 * a[i + 4, j] + x5 * a[i + 5, j])
                            + (x6 * a[i + 6, j] + x7 * a[i + 7, j])))


@numba.njit(**HELPER, fastmath=_FM)
def _rank1(cnt, m, u, ru, scale, x, rx):
    """``cnt[i, j] += scale * u[ru, i] * m[i, j] * x[rx, j]``.

    Multiplying by ``m`` here (not once at the end) keeps every term a
    probability: ``scale * u`` alone can be huge where ``m`` is tiny.
    """
    n = cnt.shape[0]
    for i in range(n):
        ui = u[ru, i] * scale
        for j in range(n):
            cnt[i, j] += (ui * m[i, j]) * x[rx, j]


@numba.njit(**HELPER, fastmath=_FM)
def _norm_linear(tb, probs, mt, m, sp, has_trans, want, want_cnt, alpha, cnt, flushed):
    """Linear-space normaliser of one sequence; returns ``(sum_t log c_t, status, exact)``.

    Specialised on purpose, not merged with the log/tropical token trellis
    (`_asg_token_forward`): it multiplies rescaled probabilities (a
    vectorised matrix-vector product per frame, no exp/log in the loop) and
    checks every frame; the log-space recursion, scalar exp/log per
    transition, measured ~50x slower (T=300, C=40: ~50 ms vs ~1 ms per sequence).

    ``flushed``: whether a probability was already flushed below ``_FLUSH``;
    ``exact``: whether ``sum_t log c_t`` is the exact value (nothing flushed, or
    the backward sweep's per-frame check passed).  Without ``want`` the sweep
    runs only when something was flushed, as the verdict on the value.

    ``probs (tb, cp)``: the frame-normalised emission probabilities (columns
    ``>= C`` zero); ``m``/``mt`` ``(cp, cp)``: the shifted transition
    probabilities and their transpose (zero-padded); ``sp (1, cp)``: the
    shifted start probabilities.  ``alpha (tb, cp)`` is scratch; with ``want``
    it ends up holding the posteriors.  With ``want_cnt``, ``cnt[i, j]``
    accumulates the expected number of ``j -> i`` transitions.

    The per-frame check compares ``r_t = sum_k alpha_t(k) beta_t(k)`` (hatted,
    rescaled quantities) with its exact value ``prod_{s > t} c_s / d_s``.
    (Rows of 2-D arrays are indexed, never sliced: a view costs two reference
    count calls per frame.)
    """
    cp = probs.shape[1]
    z = np.uint64(0)
    ucp = np.uint64(cp)
    r1 = np.int64(1)  # runtime row numbers: literals would compile another signature
    r2 = np.int64(2)
    cs = np.empty((1, tb))[0]
    lsum = 0.0
    prod = 1.0
    for t in range(tb):
        if t == 0:
            for k in range(cp):
                alpha[0, k] = sp[0, k] * probs[0, k]
        elif has_trans:
            _matvec(mt, alpha, t - 1, alpha, t)
            for k in range(cp):
                p = probs[t, k]
                w = alpha[t, k] * p
                if w < _FLUSH and p > 0.0:
                    flushed = True
                alpha[t, k] = w
        else:
            for k in range(cp):
                alpha[t, k] = probs[t, k]
        c = _sum_row(alpha, t, z, ucp)
        if c != c or c == np.inf:
            return np.nan, _NAN, False
        if c < _TINY:
            return 0.0, _FALLBACK, False
        inv = 1.0 / c
        for k in range(cp):
            w = alpha[t, k] * inv
            if w < _FLUSH and probs[t, k] > 0.0:
                flushed = True
            alpha[t, k] = w
        cs[t] = c
        prod *= c
        if not 1e-100 < prod < 1e100:  # prod * c stays normal
            lsum += math.log(prod)
            prod = 1.0
    lsum += math.log(prod)
    if not (want or flushed):
        return lsum, _OK, True
    # The sweep's r/d checks are the verdict on lsum when something was
    # flushed; a failed _MAX_SCALE check only sends the counts to log space.
    status = _OK
    # rows: beta_t, w = P_t beta_t, next beta (unnormalised)
    vec = np.empty((3, cp))
    for i in range(3):
        for k in range(cp):
            vec[i, k] = 1.0
    q = 1.0
    for t in range(tb - 1, -1, -1):
        r = _dot_rows(alpha, t, vec, 0, z, ucp)
        if not (abs(r - q) <= _CHECK_TOL * q and r >= _TINY):
            return lsum, _FALLBACK, not flushed
        inv = 1.0 / r
        for k in range(cp):
            alpha[t, k] *= vec[0, k] * inv
        if t == 0 or not has_trans:
            # Without transitions beta stays all ones (d_t = c_t).
            continue
        for k in range(cp):
            vec[1, k] = probs[t, k] * vec[0, k]
        _matvec(m, vec, r1, vec, r2)
        if want_cnt and status == _OK:
            # Expected j -> i transitions into frame t:
            # alpha_{t-1}(j) m[i, j] P_t(i) beta_t(i) / (c_t r_t).
            scale = inv / cs[t]
            if not scale <= _MAX_SCALE:
                status = _FALLBACK
            else:
                _rank1(cnt, m, vec, 1, scale, alpha, t - 1)
        d = _sum_row(vec, r2, z, ucp)
        if not d >= _TINY:
            return lsum, _FALLBACK, not flushed
        inv_d = 1.0 / d
        for k in range(cp):
            vec[0, k] = vec[2, k] * inv_d
        q *= cs[t] * inv_d
    return lsum, status, True


# --------------------------------------------------------------------------- #
# Target paths: L positions, stay or advance                                   #
# --------------------------------------------------------------------------- #
@numba.njit(**HELPER, fastmath=_FM)
def _num_linear(tb, lab, probs, ws, wa, sp, want, want_cnt, alpha, cnt, flushed):
    """Linear-space forward-backward over the target's positions.

    Specialised on purpose, like `_norm_linear`: rescaled probabilities,
    no exp/log in the loop, a per-frame check; the exact trellis it falls back
    to is `_asg_target_forward` (shared with the Viterbi aligner).

    Returns ``(sum_t log c_t, status, exact)`` (``flushed``/``exact`` as in
    `_norm_linear`).  ``lab``: the target as unsigned
    integers; ``ws[l]``/``wa[l]``: weight of staying at / advancing to position
    ``l`` (``wa[0] = 0``; both have a zero entry at ``L``).  ``alpha (tb, L + 1)``
    is scratch; with ``want`` it ends up holding the posteriors inside each
    frame's band ``[lo, hi)`` of positions that are reachable and can still
    finish.  With ``want_cnt``, ``cnt[0, l]``/``cnt[1, l]`` accumulate the
    expected numbers of stays at / advances to position ``l``.
    """
    n_lab = lab.shape[0]
    one = np.uint64(1)
    cs = np.empty((1, tb))[0]
    lsum = 0.0
    prod = 1.0
    for t in range(tb):
        lo = np.uint64(max(0, n_lab - (tb - t)))
        hi = np.uint64(min(n_lab - 1, t)) + one
        if t == 0:
            alpha[0, 0] = sp[0, lab[0]] * probs[0, lab[0]]
        else:
            l0 = lo
            if lo == 0:
                p = probs[t, lab[0]]
                w = alpha[t - 1, 0] * ws[0] * p
                if w < _FLUSH and p > 0.0:
                    flushed = True
                alpha[t, 0] = w
                l0 = one
            for l in range(l0, hi):
                p = probs[t, lab[l]]
                w = (alpha[t - 1, l] * ws[l] + alpha[t - 1, l - one] * wa[l]) * p
                if w < _FLUSH and p > 0.0:
                    flushed = True
                alpha[t, l] = w
        # Position hi is unreachable at frame t: keep it 0 for frame t + 1.
        alpha[t, hi] = 0.0
        c = _sum_row(alpha, t, lo, hi)
        if c != c or c == np.inf:
            return np.nan, _NAN, False
        if c < _TINY:
            return 0.0, _FALLBACK, False
        inv = 1.0 / c
        for l in range(lo, hi):
            w = alpha[t, l] * inv
            if w < _FLUSH and probs[t, lab[l]] > 0.0:
                flushed = True
            alpha[t, l] = w
        cs[t] = c
        prod *= c
        if not 1e-100 < prod < 1e100:  # prod * c stays normal
            lsum += math.log(prod)
            prod = 1.0
    lsum += math.log(prod)
    # Only position L-1 is allowed at the last frame, and alpha-hat sums to 1 there.
    if not (want or flushed):
        return lsum, _OK, True
    status = _OK
    # rows: beta_t; P_t(y_l) beta_t(l) (zero outside frame t's band)
    vec = np.zeros((2, n_lab + 1))
    vec[0, n_lab - 1] = 1.0
    q = 1.0
    for t in range(tb - 1, -1, -1):
        lo = np.uint64(max(0, n_lab - (tb - t)))
        hi = np.uint64(min(n_lab - 1, t)) + one
        r = _dot_rows(alpha, t, vec, 0, lo, hi)
        if not (abs(r - q) <= _CHECK_TOL * q and r >= _TINY):
            return lsum, _FALLBACK, not flushed
        inv = 1.0 / r
        for l in range(lo, hi):
            alpha[t, l] *= vec[0, l] * inv
        if t == 0:
            break
        for l in range(lo, hi):
            vec[1, l] = probs[t, lab[l]] * vec[0, l]
        vec[1, hi] = 0.0
        if want_cnt and status == _OK:
            scale = inv / cs[t]
            if not scale <= _MAX_SCALE:
                status = _FALLBACK
                scale = 0.0
            for l in range(lo, hi):
                cnt[0, l] += (vec[1, l] * scale * ws[l]) * alpha[t - 1, l]
            for l in range(max(lo, one), hi):
                cnt[1, l] += (vec[1, l] * scale * wa[l]) * alpha[t - 1, l - one]
        lo1 = np.uint64(max(0, n_lab - (tb - t + 1)))
        hi1 = np.uint64(min(n_lab - 1, t - 1)) + one
        for l in range(lo1, hi1):
            vec[0, l] = vec[1, l] * ws[l] + vec[1, l + one] * wa[l + one]
        d = _sum_row(vec, np.int64(0), lo1, hi1)
        if not d >= _TINY:
            return lsum, _FALLBACK, not flushed
        inv_d = 1.0 / d
        for l in range(lo1, hi1):
            vec[0, l] *= inv_d
        q *= cs[t] * inv_d
    return lsum, status, True


# --------------------------------------------------------------------------- #
# The two ASG trellises in the log and tropical semirings                      #
# --------------------------------------------------------------------------- #
# One recursion per trellis serves the exact log-space fallback here
# (logsumexp over predecessors) and the Viterbi decoders of ``align.py`` (max
# over predecessors): ``tropical`` is a literal constant at every call site and
# the cores are inlined, so LLVM drops the other semiring's branch.
# NB: numba's on-disk cache of a caller in another module is keyed on that
# module's mtime only: touch ``align.py`` after editing these.


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_best_previous_token(table, t, i, trans, has_trans):
    """Tropical step into token ``i`` at frame ``t >= 1`` over all tokens:
    ``(best, j)`` maximising ``table[t-1, j] + A_ij``.  Ties go to the larger
    ``j``; NaN is never picked (all NaN/``-inf``: ``(-inf, C-1)``).  The
    decoder calls it again while backtracking instead of storing back-pointers.
    (Array arguments cost reference-count calls per call; here they are
    amortised over the ``C``-long loop, unlike `_asg_best_target_step`.)
    """
    n_cls = table.shape[1]
    best = _NEG_INF
    arg = n_cls - 1
    for j in range(n_cls - 1, -1, -1):
        v = table[t - 1, j] + (np.float64(trans[i, j]) if has_trans else 0.0)
        if v > best:
            best = v
            arg = j
    return best, arg


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_token_forward(b, input_len, em, trans, start, has_trans, tropical):
    """The normaliser's forward table ``(input_len, C)`` over all tokens.

    Log semiring: $\\alpha_t(i) = e_t(i) + \\operatorname{logsumexp}_j
    (\\alpha_{t-1}(j) + A_{ij})$, $\\alpha_0(i) = s_i + e_0(i)$.
    Tropical: the same with ``max`` (`_asg_best_previous_token`).
    """
    n_cls = em.shape[2]
    table = np.empty((input_len, n_cls))
    for t in range(input_len):
        for i in range(n_cls):
            emit = np.float64(em[t, b, i])
            if t == 0:
                v = np.float64(start[i])
            elif tropical:
                v, _ = _asg_best_previous_token(table, t, i, trans, has_trans)
            else:
                v = _NEG_INF
                for j in range(n_cls):
                    tr = np.float64(trans[i, j]) if has_trans else 0.0
                    v = _lae(v, table[t - 1, j] + tr)
            table[t, i] = v + emit
    return table


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_token_final(table, tropical):
    """``(value, token)`` at the last frame: ``(log Z, C-1)`` in the log
    semiring; the best token and its score in the tropical one (ties: the
    larger token)."""
    last = table.shape[0] - 1
    n_cls = table.shape[1]
    if tropical:
        k = n_cls - 1
        for j in range(n_cls - 1, -1, -1):
            if table[last, j] > table[last, k]:
                k = j
        return table[last, k], k
    logz = _NEG_INF
    for i in range(n_cls):
        logz = _lae(logz, table[last, i])
    return logz, n_cls - 1


@numba.njit(**HELPER)
def _norm_log(b, tb, em, trans, start, has_trans, want, ge, gt, gs):
    """Exact log-space normaliser (slow, scalar exp/log); returns logZ.

    The forward is the shared token trellis (`_asg_token_forward`, log
    semiring); with ``want`` the posteriors are added to ``ge``/``gs`` and the
    expected transition counts to ``gt``.
    """
    n_cls = em.shape[2]
    log_alpha = _asg_token_forward(b, tb, em, trans, start, has_trans, False)
    logz, _ = _asg_token_final(log_alpha, False)
    if not want or logz == _NEG_INF or logz != logz:
        return logz
    log_beta = np.zeros(n_cls)
    emit_beta = np.empty(n_cls)
    for t in range(tb - 1, -1, -1):
        for k in range(n_cls):
            if log_alpha[t, k] != _NEG_INF and log_beta[k] != _NEG_INF:
                p = math.exp(log_alpha[t, k] + log_beta[k] - logz)
                ge[t, k] += p
                if t == 0:
                    gs[k] += p
        if t == 0:
            break
        # emit_beta[i] = e_t(i) + log_beta_t(i): suffix weight entering token i at frame t
        for i in range(n_cls):
            emit_beta[i] = np.float64(em[t, b, i]) + log_beta[i]
        for j in range(n_cls):
            v = _NEG_INF
            for i in range(n_cls):
                tr = np.float64(trans[i, j]) if has_trans else 0.0
                x = emit_beta[i] + tr
                v = _lae(v, x)
                if has_trans and want:
                    y = log_alpha[t - 1, j] + x - logz
                    if y > -745.0:
                        gt[i, j] += math.exp(y)
            log_beta[j] = v
    return logz


@numba.njit(**HELPER)
def _asg_target_weights(lab, trans, has_trans):
    """Log weights ``(stay, advance)`` per target position: ``A_{y_l y_l}`` and
    ``A_{y_l y_{l-1}}`` (0 without transitions; ``advance[0] = -inf``)."""
    n_lab = lab.shape[0]
    stay = np.empty(n_lab)
    advance = np.empty(n_lab)
    for l in range(n_lab):
        stay[l] = np.float64(trans[lab[l], lab[l]]) if has_trans else 0.0
        if l > 0:
            advance[l] = np.float64(trans[lab[l], lab[l - 1]]) if has_trans else 0.0
        else:
            advance[l] = _NEG_INF
    return stay, advance


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_best_target_step(stay, advance):
    """Tropical sum into a target position: ``(best, step)`` of the scores of
    staying (step 0) and advancing (step 1; ``-inf`` at position 0); a tie
    stays, NaN is never picked over a number.  Scalars only (see
    `duoloss.core.losses.ctc._ctc_best_step`)."""
    best = stay
    step = 0
    if advance > best:
        best = advance
        step = 1
    return best, step


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_target_forward(b, input_len, lab, stay, advance, em, start, tropical):
    """The target's forward table ``(input_len, L)`` (``-inf`` outside each
    frame's band of positions); needs ``0 < L <= input_len``.

    Log semiring: logsumexp of staying and advancing; tropical: their max
    (`_asg_best_target_step`).  Either way the value is
    ``table[input_len - 1, L - 1]``.
    """
    n_lab = lab.shape[0]
    table = np.full((input_len, n_lab), _NEG_INF)
    table[0, 0] = np.float64(start[lab[0]]) + np.float64(em[0, b, lab[0]])
    for t in range(1, input_len):
        lo = max(0, n_lab - (input_len - t))
        hi = min(n_lab - 1, t)
        for l in range(lo, hi + 1):
            if tropical:
                v, _ = _asg_best_target_step(
                    table[t - 1, l] + stay[l],
                    table[t - 1, l - 1] + advance[l] if l >= 1 else _NEG_INF)
            else:
                v = table[t - 1, l] + stay[l]
                if l > 0:
                    v = _lae(v, table[t - 1, l - 1] + advance[l])
            table[t, l] = v + np.float64(em[t, b, lab[l]])
    return table


@numba.njit(**HELPER)
def _num_log(b, tb, lab, em, trans, start, has_trans, want, ge, gt, gs):
    """Exact log-space forward-backward over the target's positions; returns
    the log-sum over the target paths.  The forward is the shared target
    trellis (`_asg_target_forward`, log semiring)."""
    n_lab = lab.shape[0]
    stay, advance = _asg_target_weights(lab, trans, has_trans)
    log_alpha = _asg_target_forward(b, tb, lab, stay, advance, em, start, False)
    logz = log_alpha[tb - 1, n_lab - 1]
    if not want or logz == _NEG_INF or logz != logz:
        return logz
    log_beta = np.full(n_lab, _NEG_INF)
    emit_beta = np.full(n_lab, _NEG_INF)
    log_beta[n_lab - 1] = 0.0
    for t in range(tb - 1, -1, -1):
        for l in range(n_lab):
            if log_alpha[t, l] != _NEG_INF and log_beta[l] != _NEG_INF:
                ge[t, lab[l]] += math.exp(log_alpha[t, l] + log_beta[l] - logz)
        if t == 0:
            gs[lab[0]] += 1.0
            break
        for l in range(n_lab):
            emit_beta[l] = (log_beta[l] + np.float64(em[t, b, lab[l]])
                            if log_beta[l] != _NEG_INF else _NEG_INF)
        if has_trans:
            for l in range(n_lab):
                if emit_beta[l] == _NEG_INF:
                    continue
                y = log_alpha[t - 1, l] + stay[l] + emit_beta[l] - logz
                if y > -745.0:
                    gt[lab[l], lab[l]] += math.exp(y)
                if l > 0:
                    y = log_alpha[t - 1, l - 1] + advance[l] + emit_beta[l] - logz
                    if y > -745.0:
                        gt[lab[l], lab[l - 1]] += math.exp(y)
        for l in range(n_lab):
            v = emit_beta[l] + stay[l]
            if l + 1 < n_lab:
                v = _lae(v, emit_beta[l + 1] + advance[l + 1])
            log_beta[l] = v
    return logz


# --------------------------------------------------------------------------- #
# One sequence, batch drivers                                                  #
# --------------------------------------------------------------------------- #
@numba.njit(**HELPER, fastmath=_FM)
def _exp_row(em, t, b, mx, probs):
    """``probs[t, k] = exp(em[t, b, k] - mx)`` for ``em[t, b, k] - mx <= 0`` or
    NaN (NaN stays NaN, results below ``exp(-708)`` flush to 0); a loop LLVM
    vectorises, unlike one calling `fast_exp` (a branch to ``math.exp``)."""
    for k in range(em.shape[2]):
        y = np.float64(em[t, b, k]) - mx
        r = exp_core(-708.0 if y < -708.0 else y)
        probs[t, k] = 0.0 if y < -708.0 else r


@numba.njit(**HELPER)
def _frame_probs(b, tb, em, probs):
    """``probs[t, k] = exp(em[t, b, k] - fmax_t)``, ``fmax_t = max_k em[t, b, k]``
    (0 if all the frame's scores are ``-inf``; NaN scores are skipped, their
    ``probs`` are NaN); columns ``k >= C`` of ``probs`` are 0.  Returns
    ``(sum_t fmax_t, flushed)``: whether a finite score's probability came
    out below ``_FLUSH``.
    """
    n_cls = em.shape[2]
    cp = probs.shape[1]
    fsum = 0.0
    flushed = False
    for t in range(tb):
        mx = _NEG_INF
        for k in range(n_cls):
            v = np.float64(em[t, b, k])
            if v > mx:
                mx = v
        if mx == _NEG_INF:
            mx = 0.0
        fsum += mx
        _exp_row(em, t, b, mx, probs)
        for k in range(n_cls):
            if probs[t, k] < _FLUSH and np.float64(em[t, b, k]) != _NEG_INF:
                flushed = True
        for k in range(n_cls, cp):
            probs[t, k] = 0.0
    return fsum, flushed


@numba.njit(**HELPER)
def _asg_fill(b, tb, v, want_e, want_t, want_s, g_em, g_tr, g_st):
    """Set sequence ``b``'s slices of the wanted gradients to ``v`` (of the
    emission gradient, its first ``tb`` frames only)."""
    if want_e:
        for t in range(max(0, min(tb, g_em.shape[0]))):
            for k in range(g_em.shape[2]):
                g_em[t, b, k] = v
    if want_t:
        for i in range(g_tr.shape[1]):
            for j in range(g_tr.shape[2]):
                g_tr[b, i, j] = v
    if want_s:
        for k in range(g_st.shape[1]):
            g_st[b, k] = v


# ``exact`` (the last argument of the per-sequence functions below) selects
# what a failed linear-space check does.  ``None`` (the batch kernels): return
# status ``_FALLBACK``, and `_asg_one` records the sequence in ``pending``;
# numba prunes the ``exact is None`` branches at compile time, so those
# kernels never compile the log-space recursions.  ``True``
# (`_asg_batch_exact`, which the driver runs on the pending sequences only):
# run the log-space recursion then and there.  Either way a sequence's
# results are those of one complete pass over it, so they do not depend on
# whether it went through the fast kernel first.
@numba.njit(cache=True, nogil=True, inline="always")
def _asg_normaliser(b, input_len, em, probs, m, mt, sp, trans, start, has_trans, want,
                    want_cnt, shift, flushed, pn, cnt, gs, exact):
    """The normaliser of sequence ``b``: ``(log_z, linear_log_z, status, linear_exact)``.

    Rescaled linear space first (`_norm_linear`; its value is
    ``shift + linear_log_z``), the exact log space (`_norm_log`) on a
    failed check (with ``exact``; else status ``_FALLBACK``): it gives the value
    only when the linear one is not exact, and the gradient whenever the linear
    sweep failed.  With ``want``, ``pn``, ``cnt`` and ``gs`` receive the
    posteriors, the expected transition counts and the first frame's posteriors.
    """
    lz, st, norm_lin = _norm_linear(input_len, probs, mt, m, sp, has_trans, want, want_cnt, pn,
                                    cnt, flushed)
    logz = shift + lz
    if st == _OK:
        if want:
            for k in range(sp.shape[1]):
                gs[k] = pn[0, k]
    elif st == _FALLBACK:
        if exact is None:
            return logz, lz, st, norm_lin
        pn[:, :] = 0.0
        cnt[:, :] = 0.0
        lg = _norm_log(b, input_len, em, trans, start, has_trans, want, pn, cnt, gs)
        if not norm_lin:
            logz = lg
        st = _NAN if (logz != logz or logz == np.inf) else _OK
    return logz, lz, st, norm_lin


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_numerator(b, input_len, target_len, em, probs, m, trans, sp, start, targets,
                   has_trans, want, want_cnt, flushed, logz, lz, norm_lin, shift, losses, pn,
                   cnt, gs, exact):
    """The target paths of sequence ``b`` (``0 < target_len <= input_len``):
    writes ``losses[b]`` and subtracts the target posteriors and counts from
    ``pn``, ``cnt``, ``gs``; returns ``(status, feasible)``.

    Rescaled linear space first (`_num_linear`), exact log space
    (`_num_log`) on a failed check (with ``exact``; else status
    ``_FALLBACK``), with the normaliser's loss rule.
    """
    n_cls = em.shape[2]
    feasible = True
    lab = np.empty(target_len, np.uint64)
    weights = np.zeros((2, target_len + 1))
    stay_prob = weights[0]
    advance_prob = weights[1]
    for i in range(target_len):
        lab[i] = targets[b, i]
    for l in range(target_len):
        if has_trans:
            stay_prob[l] = m[lab[l], lab[l]]
            if l > 0:
                advance_prob[l] = m[lab[l], lab[l - 1]]
        else:
            stay_prob[l] = 1.0
            if l > 0:
                advance_prob[l] = 1.0
    na = np.empty((input_len, target_len + 1))
    ncnt = np.zeros((2, target_len))
    ln, st, num_lin = _num_linear(input_len, lab, probs, stay_prob,
                                  advance_prob, sp, want, want_cnt, na, ncnt, flushed)
    if num_lin:
        losses[b] = (lz - ln) if norm_lin else (logz - (shift + ln))
    if st == _OK:
        if want:
            for t in range(input_len):
                for l in range(max(0, target_len - (input_len - t)), min(target_len - 1, t) + 1):
                    pn[t, lab[l]] -= na[t, l]
            gs[lab[0]] -= 1.0
        if want_cnt and input_len > 1:
            for l in range(target_len):
                cnt[lab[l], lab[l]] -= ncnt[0, l]
                if l > 0:
                    cnt[lab[l], lab[l - 1]] -= ncnt[1, l]
    elif st == _FALLBACK:
        if exact is None:
            return st, feasible
        ne = np.zeros((input_len, n_cls))
        nt = np.zeros((n_cls, n_cls) if has_trans and want else (0, 0))
        ns = np.zeros(n_cls)
        lognum = _num_log(b, input_len, lab, em, trans, start, has_trans, want, ne, nt, ns)
        st = _OK
        if num_lin:
            pass  # the linear value stands; log space gives the gradient
        elif lognum != lognum or lognum == np.inf:
            st = _NAN
        elif lognum == _NEG_INF:
            feasible = False
        else:
            losses[b] = logz - lognum
        if st != _NAN and feasible:
            if want:
                for t in range(input_len):
                    for k in range(n_cls):
                        pn[t, k] -= ne[t, k]
                for k in range(n_cls):
                    gs[k] -= ns[k]
                if has_trans:
                    for i in range(n_cls):
                        for j in range(n_cls):
                            cnt[i, j] -= nt[i, j]
    return st, feasible


@numba.njit(cache=True, nogil=True, inline="always")
def _asg_one(b, em, m, mt, tau, trans, sp, sigma, start, pflushed, targets, in_len, tg_len,
             has_trans, want_e, want_t, want_s, zero_inf, losses, g_em, g_tr, g_st, pending,
             exact):
    """Loss and gradients of sequence ``b``; see the module docstring.

    Steps: validate; frame probabilities (`_frame_probs`); the
    normaliser (`_asg_normaliser`); the target paths
    (`_asg_numerator`); store the gradients (normaliser minus target).
    ``pflushed``: whether a start or transition probability flushed (see
    `_params_flushed`).  Without ``exact`` a failed linear-space check stops
    here with ``pending[b]`` = 1 (normaliser) or 2 (target paths); see above.
    """
    t_max, _, n_cls = em.shape
    cp = sp.shape[1]
    input_len = in_len[b]
    target_len = tg_len[b]
    want = want_e or want_t or want_s
    want_cnt = has_trans and want_t
    _asg_fill(b, t_max, 0.0, want_e, want_t, want_s, g_em, g_tr, g_st)
    ok = sequence_ok(targets, b, input_len, target_len, t_max, n_cls, -1, False)
    if not ok:
        losses[b] = np.nan
        _asg_fill(b, t_max, np.nan, want_e, want_t, want_s, g_em, g_tr, g_st)
        return
    if input_len == 0:
        losses[b] = 0.0 if (target_len == 0 or zero_inf) else np.inf
        return
    probs = np.empty((input_len, cp))
    # log of everything the rescaled recursions divide out besides their c_t
    shift, flushed = _frame_probs(b, input_len, em, probs)
    shift += sigma
    if pflushed:
        flushed = True
    if input_len > 1:
        shift += (input_len - 1) * tau
    # pn: normaliser posteriors minus target posteriors; cnt: the same for the
    # transition counts; gs: for the first frame (start scores).
    pn = np.empty((input_len, cp))
    cnt = np.zeros((cp, cp) if has_trans and want else (0, 0))
    gs = np.zeros((1, cp))[0]
    # Loss rule (the same with or without a gradient): a linear value that is
    # exact (nothing flushed, or the sweep's check passed) is the value; log
    # space gives the value only otherwise, and the gradient whenever the
    # linear sweep failed.
    logz, lz, st, norm_lin = _asg_normaliser(b, input_len, em, probs, m, mt, sp, trans, start,
                                             has_trans, want, want_cnt, shift, flushed, pn, cnt,
                                             gs, exact)
    if st == _FALLBACK:
        pending[b] = 1
        return
    if st == _NAN:
        losses[b] = np.nan
        _asg_fill(b, input_len, np.nan, want_e, want_t, want_s, g_em, g_tr, g_st)
        return
    if logz == _NEG_INF:
        # No labelling has finite weight: infeasible, zero gradient.
        losses[b] = 0.0 if zero_inf else np.inf
        return
    feasible = 0 < target_len <= input_len
    if feasible:
        st, feasible = _asg_numerator(b, input_len, target_len, em, probs, m, trans, sp, start,
                                      targets, has_trans, want, want_cnt, flushed, logz, lz,
                                      norm_lin, shift, losses, pn, cnt, gs, exact)
        if st == _FALLBACK:
            pending[b] = 2
            return
        if st == _NAN:
            losses[b] = np.nan
            _asg_fill(b, input_len, np.nan, want_e, want_t, want_s, g_em, g_tr, g_st)
            return
    if not feasible:
        if zero_inf:
            losses[b] = 0.0
            return
        # GTN's convention: +inf loss, the normaliser's gradient.
        losses[b] = np.inf
    if want_e:
        for t in range(input_len):
            for k in range(n_cls):
                g_em[t, b, k] = pn[t, k]
    if want_t:
        for i in range(n_cls):
            for j in range(n_cls):
                g_tr[b, i, j] = cnt[i, j]
    if want_s:
        for k in range(n_cls):
            g_st[b, k] = gs[k]


@numba.njit(**HELPER)
def _shifted_exp(x, out):
    """``out[i, j] = exp(x[i, j] - max(x))`` for 2-D ``x`` (``out`` may be larger)
    and the shift: 0 when ``max(x)`` is ``-inf``, NaN when ``x`` has a NaN (then
    all of it is NaN)."""
    mx = _NEG_INF
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = x[i, j]
            if v > mx or v != v:
                mx = v
                if v != v:
                    break
        if mx != mx:
            break
    if mx == _NEG_INF:
        mx = 0.0
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = fast_exp(x[i, j] - mx)
    return mx


@numba.njit(cache=True, nogil=True)
def _exp_params(trans, start, has_trans):
    """Zero-padded exponentiated start scores ``sp (1, cp)`` (``start`` is
    ``(1, C)``), transitions ``m`` and their transpose ``mt (cp, cp)``, their
    shifts ``sigma`` and ``tau``, and whether a probability from a finite score
    came out below ``_FLUSH`` (then linear space cannot be trusted without its
    check).  One float64 signature; the batch kernels get its results."""
    n_cls = start.shape[1]
    cp = max(8, (n_cls + 7) // 8 * 8)   # multiple of the vector width
    sp = np.zeros((1, cp))
    sigma = _shifted_exp(start, sp)
    flushed = False
    for k in range(n_cls):
        if sp[0, k] < _FLUSH and start[0, k] != _NEG_INF:
            flushed = True
    nt = cp if has_trans else 0
    m = np.zeros((nt, nt))
    mt = np.zeros((nt, nt))
    tau = 0.0
    if has_trans:
        tau = _shifted_exp(trans, m)
        for i in range(n_cls):
            for j in range(n_cls):
                mt[j, i] = m[i, j]
                if m[i, j] < _FLUSH and trans[i, j] != _NEG_INF:
                    flushed = True
    return sp, sigma, m, mt, tau, flushed


# The batch kernels (the same arguments): each processes exactly the
# sequences listed in ``order`` (int64), writing only their outputs, so
# `duoloss.core._pool.run_batch` splits a large batch's ``order`` over threads
# (no prange twin to compile).
@numba.njit(cache=True, nogil=True)
def _asg_batch(order, em, m, mt, tau, trans, sp, sigma, start, pflushed, targets, in_len, tg_len,
               has_trans, want_e, want_t, want_s, zero_inf, losses, g_em, g_tr, g_st, pending):
    for i in range(order.shape[0]):
        _asg_one(order[i], em, m, mt, tau, trans, sp, sigma, start, pflushed, targets, in_len,
                 tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses, g_em, g_tr, g_st,
                 pending, None)


@numba.njit(cache=True, nogil=True)
def _asg_batch_exact(order, em, m, mt, tau, trans, sp, sigma, start, pflushed, targets, in_len,
                     tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses, g_em, g_tr,
                     g_st, pending):
    for i in range(order.shape[0]):
        _asg_one(order[i], em, m, mt, tau, trans, sp, sigma, start, pflushed, targets, in_len,
                 tg_len, has_trans, want_e, want_t, want_s, zero_inf, losses, g_em, g_tr, g_st,
                 pending, True)


def asg_loss_and_grad(emissions: npt.ArrayLike, transitions: npt.ArrayLike, targets: npt.ArrayLike,
                      input_lengths: npt.ArrayLike, target_lengths: npt.ArrayLike, *,
                      start_transitions: npt.ArrayLike | None = None,
                      want_grad: bool | tuple[bool, bool, bool] = (True, True, True),
                      zero_infinity: bool = False
                      ) -> tuple[np.ndarray, tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]]:
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
    if dtype != np.float32 and dtype != np.float64:
        em = em.astype(np.float64)
    t_max, n, n_cls = em.shape
    has_trans = transitions is not None
    has_start = start_transitions is not None
    want_e, want_t, want_s = (bool(w) for w in want_grad)
    want_t = want_t and has_trans
    want_s = want_s and has_start
    # The kernels read emissions in their own dtype (float32 or float64: one
    # compiled signature each) and write the emission gradient in it; everything
    # else is float64.
    f64 = np.float64
    trans = (np.ascontiguousarray(transitions, dtype=f64) if has_trans
             else np.zeros((0, 0), f64))
    start = (np.ascontiguousarray(start_transitions, dtype=f64) if has_start
             else np.zeros(n_cls, f64))
    tg = np.ascontiguousarray(targets, dtype=np.int64)
    if tg.ndim != 2:
        tg = tg.reshape(n, -1)
    il = np.ascontiguousarray(input_lengths, dtype=np.int64).reshape(n)
    tl = np.ascontiguousarray(target_lengths, dtype=np.int64).reshape(n)
    losses = np.empty(n, f64)
    g_em = np.empty((t_max, n, n_cls), em.dtype) if want_e else np.empty((0, 0, 0), em.dtype)
    g_tr = np.empty((n, n_cls, n_cls), f64) if want_t else np.empty((0, 0, 0), f64)
    g_st = np.empty((n, n_cls), f64) if want_s else np.empty((0, 0), f64)
    if n > 0:
        sp, sigma, m, mt, tau, pflushed = _exp_params(trans, start.reshape(1, n_cls), has_trans)
        frames = np.clip(il, 0, t_max)
        per_frame = (n_cls * n_cls) if has_trans else n_cls
        cells = int(frames.sum()) * per_frame
        # threads balance better longest (most cells) first; the order never
        # changes a result
        order = (np.argsort(-frames, kind="stable") if n > 1 and cells >= _PARALLEL_MIN_CELLS
                 else np.arange(n, dtype=np.int64))
        pending = np.zeros(n, np.int8)
        args = (order, em, m, mt, tau, trans, sp, sigma, start, pflushed, tg, il, tl, has_trans,
                want_e, want_t, want_s, bool(zero_infinity), losses, g_em, g_tr, g_st, pending)
        _pool.run_batch(_asg_batch, order, cells, _PARALLEL_MIN_CELLS, args[1:])
        # The sequences whose linear-space check failed, again with the exact
        # log-space recursions: compiled on first need (or by warmup, with none),
        # for float64 only: they run on a compacted float64 copy of those
        # sequences (the kernels read emissions as float64 anyway, and the
        # emission gradient is rounded to its dtype once either way).
        redo = order[pending[order] != 0]
        if redo.size or _numerics._compile_both:
            r = redo.size
            sub = (np.ascontiguousarray(em[:, redo], dtype=f64), tg[redo], il[redo], tl[redo])
            outs = (np.empty(r, f64), np.empty((t_max, r, n_cls) if want_e else (0, 0, 0), f64),
                    np.empty((r, n_cls, n_cls), f64) if want_t else g_tr,
                    np.empty((r, n_cls), f64) if want_s else g_st, np.zeros(r, np.int8))
            args = ((sub[0], m, mt, tau, trans, sp, sigma, start, pflushed) + sub[1:]
                    + (has_trans, want_e, want_t, want_s, bool(zero_infinity)) + outs)
            _pool.run_batch(_asg_batch_exact, np.arange(r, dtype=np.int64),
                            int(frames[redo].sum()) * per_frame, _PARALLEL_MIN_CELLS, args)
            losses[redo] = outs[0]
            if want_e:
                g_em[:, redo] = outs[1]
            if want_t:
                g_tr[redo] = outs[2]
            if want_s:
                g_st[redo] = outs[3]
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
    from .. import _validate as v

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
                         f"got shape {v.shape_str(targets.shape)}"
                         + v.batch_first_hint(emissions.shape, targets.shape[0], "emissions"))
    for arg, x in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        v.check_ndim(fn, arg, x.shape, (1,), f"an (N,)-array with N = {n}")
        v.check_dtype(fn, arg, x.dtype, v.INT_DTYPES, "an integer")
        if int(x.shape[0]) != n:
            raise ValueError(f"{fn}: argument '{arg}' must be an (N,)-array with N = {n}, "
                             f"got shape {v.shape_str(x.shape)}"
                             + v.batch_first_hint(emissions.shape, x.shape[0], "emissions"))
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
        from .ctc import concat_to_padded
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
