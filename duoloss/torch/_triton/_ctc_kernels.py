"""The Triton CTC kernel of the torch device path: one launch per loss call.

One program per sequence ``b`` runs the whole forward–backward recursion over
the ``2 S_b + 1`` extended states of its target, vectorised in one block of
``BLOCK`` lanes (lane ``k``: state ``k``; odd lanes the labels, even lanes the
blank), and a loop over frames.  It reads what the caller passes, where it lies:

* ``log_probs`` ``(T, N, C)`` (any strides, classes contiguous; float64,
  float32, bfloat16 or float16), lane ``k`` of frame ``t`` reading
  ``lp[t, b, label_k]`` — no gathered copy;
* the targets (padded ``(N, S)`` rows, or concatenated 1-D with each
  sequence's start summed from the target lengths in the kernel) and the
  lengths, int32 or int64, never converted;

and writes what the caller returns: the loss (per sequence, or weighted by the
reduction, in float64, for the caller's one ``sum``) and the gradient with
respect to ``log_probs`` (every entry of ``(T, N, C)``: ``-w_b * posterior``
on the classes the target uses, zero elsewhere and on frames past ``T_b``, the
whole slab NaN for an invalid row), so no zero fill, scatter or ``where``
runs around it.

Arithmetic is in natural log space, in float32 for half inputs and the input's
dtype otherwise; every exponential and logarithm goes through ``exp2``/``log2``
(``ex2.approx``/``lg2.approx`` in float32, not the branchy ``__nv_logf``) on a
difference scaled by ``log2(e)``: the stored values keep natural-log magnitudes,
so float32 rounding grows with ``T`` as ``F.ctc_loss``'s does (in base 2 the
alphas are 1.44 times larger and the error was 1.7 times ``F.ctc_loss``'s).
The alpha table (``(N, T, BLOCK)``, needed by the posteriors) is the
only scratch of size ``T``; beta lives in registers.  Two ways to shift a row
by one and two states, a compile-time choice (``GATHER``):

* ``GATHER=False`` (any ``BLOCK``): the row goes through a small global
  scratch (the alpha table itself forwards; a two-row ring for beta) with one
  ``tl.debug_barrier()`` per frame, the next frame's emissions loaded before
  the barrier;
* ``GATHER=True``: ``tl.gather`` on the row in registers (one warp: shuffles,
  no barrier and no scratch round trip).

This module is imported on the first device CTC call; with
``TRITON_INTERPRET=1`` set *before* that import the kernel runs on CPU
tensors (how the tests exercise it).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "ctc_ab_kernel", "ctc_kernel", "ctc_post_kernel"]

#: Whether the kernel was defined under the Triton interpreter (CPU tensors).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _maxnum(a, b):
    return tl.maximum(a, b)


# tl.reduce with this module's combine functions (tl.sum / tl.max are jit functions
# of triton.language, usable under the interpreter only when triton itself was
# imported with TRITON_INTERPRET=1, and torch may import triton first)
@triton.jit
def _sum(x):
    return tl.reduce(x, 0, _add)


@triton.jit
def _max(x):
    return tl.reduce(x, 0, _maxnum)


@triton.jit
def _lse3(a, b, c, log2e, ln2):
    """``log(e**a + e**b + e**c)`` elementwise through ``exp2``/``log2`` (``x * log2e``
    and ``ln2 * y`` fold into fused multiply-adds); ``-inf`` (not NaN) when all three
    are ``-inf``; a NaN input gives NaN (the NaN policy)."""
    m = tl.maximum(tl.maximum(a, b), c)
    ms = tl.where(m == float("-inf"), 0.0, m)
    return ms + ln2 * tl.log2(tl.exp2((a - ms) * log2e) + tl.exp2((b - ms) * log2e)
                              + tl.exp2((c - ms) * log2e))


@triton.jit
def _shift_down(row, k, by: tl.constexpr, scratch, GATHER: tl.constexpr):
    """``row[k - by]`` (``-inf`` below 0): from registers (``GATHER``) or from
    ``scratch`` (the row as stored before the caller's barrier)."""
    if GATHER:
        out = tl.gather(row, tl.maximum(k - by, 0), 0)
    else:
        out = tl.load(scratch + k - by, mask=k >= by, other=float("-inf"))
    return tl.where(k >= by, out, float("-inf"))


@triton.jit
def _shift_up(row, k, by: tl.constexpr, scratch, BLOCK: tl.constexpr, GATHER: tl.constexpr):
    """``row[k + by]`` (``-inf`` past the block)."""
    if GATHER:
        out = tl.gather(row, tl.minimum(k + by, BLOCK - 1), 0)
    else:
        out = tl.load(scratch + k + by, mask=(k + by) < BLOCK, other=float("-inf"))
    return tl.where((k + by) < BLOCK, out, float("-inf"))


@triton.jit
def _fill_rows(g_b, stride_gt, t0, t1, C, value, BLOCK_C: tl.constexpr):
    """``grad[t, b, :] = value`` for frames ``t0 <= t < t1``."""
    kc = tl.arange(0, BLOCK_C)
    fill = (tl.full((BLOCK_C,), 0.0, tl.float32) + value).to(g_b.dtype.element_ty)
    for t in range(t0, t1):
        g_t = g_b + t * stride_gt
        for c0 in range(0, C, BLOCK_C):
            tl.store(g_t + c0 + kc, fill, mask=(c0 + kc) < C)


@triton.jit(do_not_specialize=["stride_lt", "stride_ln", "C", "blank", "stride_tb", "S_MAX",
                                "T_MAX", "stride_gt", "stride_gn", "n_div", "zero_inf"])
def ctc_kernel(lp_ptr, stride_lt, stride_ln, C, blank,
               tg_ptr, stride_tb, il_ptr, tl_ptr, S_MAX, T_MAX,
               alpha_ptr, out_ptr, grad_ptr, stride_gt, stride_gn,
               n_div, zero_inf,
               CONCAT: tl.constexpr, MODE: tl.constexpr, WANT_GRAD: tl.constexpr,
               ZERO_ROWS: tl.constexpr, GATHER: tl.constexpr, BLOCK: tl.constexpr,
               BLOCK_C: tl.constexpr):
    """CTC loss and gradient of sequence ``b = program_id(0)``.

    ``lp`` ``(T_MAX, N, C)`` (classes contiguous); ``tg``: padded rows of
    ``stride_tb`` (``S_MAX`` labels each) or, with ``CONCAT``, the concatenated
    labels (``S_MAX`` in all); ``il``/``tl`` ``(N,)`` (any integer dtype).  A row
    whose lengths are out of range, or whose labels are out of ``[0, C)`` or the
    blank, gets NaN (loss and gradient slab): the traced path's validation.
    ``alpha``: scratch of ``N * (T_MAX + 2) * BLOCK`` entries in the compute dtype
    (float32 for half inputs): the alpha tables ``(N, T_MAX, BLOCK)``, then beta's
    two-row rings ``(N, 2, BLOCK)``.

    ``MODE`` 0: ``out[b]`` the loss (``out``'s dtype); 1 (``'sum'``) and 2
    (``'mean'``: weight ``1 / (n_div * max(S_b, 1))``, the host path's IEEE
    operations): ``out[b]`` the weighted loss in float64.  ``zero_inf`` nonzero:
    an infinite loss is 0.  With ``WANT_GRAD``, ``grad`` (``lp``'s shape, strides
    ``stride_gt``/``stride_gn``, classes contiguous) receives ``w_b * d loss_b /
    d lp[:, b, :]`` in every entry; ``ZERO_ROWS``: the zeros are written here
    (else the caller passes zeros).  Bases are 64-bit; lengths, sizes and
    strides are not specialised.
    """
    b = tl.program_id(0).to(tl.int64)
    C = C.to(tl.int64)                    # (64-bit offsets within a gradient row)
    blank = blank.to(tl.int64)
    k = tl.arange(0, BLOCK)
    odd = (k % 2) == 1
    i = (k - 1) // 2                      # the label of an odd lane
    acc = alpha_ptr.dtype.element_ty
    neg = tl.full((BLOCK,), float("-inf"), acc)
    # lengths, checked: an invalid row reads nothing and becomes NaN
    t_b = tl.load(il_ptr + b).to(tl.int64)
    s_b = tl.load(tl_ptr + b).to(tl.int64)
    ok = (t_b >= 0) & (t_b <= T_MAX) & (s_b >= 0) & (s_b <= S_MAX)
    s_b = tl.where(ok, s_b, 0)
    if CONCAT:
        start = b * 0
        for j0 in range(0, b, BLOCK):
            jj = j0 + k
            start += _sum(tl.load(tl_ptr + jj, mask=jj < b, other=0).to(tl.int64))
        tg_b = tg_ptr + start
    else:
        tg_b = tg_ptr + b * stride_tb
    n_states = 2 * s_b + 1
    is_lab = odd & (k < n_states)
    lab = tl.load(tg_b + i, mask=is_lab, other=0).to(tl.int64)
    bad = is_lab & ((lab < 0) | (lab >= C) | (lab == blank))
    ok = ok & (_max(bad.to(tl.int32)) == 0)
    t_b = tl.where(ok, t_b, 0)
    s_b = tl.where(ok, s_b, 0)
    n_states = 2 * s_b + 1
    live = k < n_states
    is_lab = odd & live
    col = tl.where(is_lab, lab, blank)
    prev_lab = tl.load(tg_b + i - 1, mask=is_lab & (k >= 3), other=0).to(tl.int64)
    skip = is_lab & (k >= 3) & (lab != prev_lab)
    # log2(e) and ln(2) in the compute dtype (a float literal would be float32)
    ln2 = tl.log(tl.full((), 2.0, acc))
    log2e = 1.0 / ln2
    lp_b = lp_ptr + b * stride_ln
    a_seq = alpha_ptr + b * T_MAX * BLOCK
    # forward: alpha[t, k] includes the emission of frame t
    e = tl.load(lp_b + col, mask=live & ((k * 0 + t_b) > 0), other=float("-inf")).to(acc)
    alpha = tl.where(k < 2, e, neg)
    tl.store(a_seq + k, alpha, mask=(k * 0 + t_b) > 0)
    for t in range(1, t_b):
        e = tl.load(lp_b + t * stride_lt + col, mask=live, other=float("-inf")).to(acc)
        if not GATHER:
            tl.debug_barrier()
        prev = a_seq + (t - 1) * BLOCK + k
        a1 = _shift_down(alpha, k, 1, prev - k, GATHER)
        a2 = tl.where(skip, _shift_down(alpha, k, 2, prev - k, GATHER), float("-inf"))
        alpha = tl.where(live, e + _lse3(alpha, a1, a2, log2e, ln2), neg)
        tl.store(a_seq + t * BLOCK + k, alpha)
    # log Z from the last frame's two final states
    fin = live & (k >= n_states - 2)
    a_fin = tl.where(fin, alpha, float("-inf"))
    m = _max(a_fin)
    ms = tl.where(m == float("-inf"), 0.0, m)
    logz = ms + ln2 * tl.log2(_sum(tl.exp2((a_fin - ms) * log2e)))
    logz = tl.where(t_b > 0, logz, tl.where(s_b == 0, 0.0, float("-inf")))
    loss = 0.0 - logz  # (not -logz: an empty target on no frames is +0)
    loss = tl.where((zero_inf != 0) & (loss == float("inf")), 0.0, loss)
    loss = tl.where(ok, loss, float("nan"))
    if MODE == 0:
        w = tl.full((), 1.0, tl.float64)
        tl.store(out_ptr + b, loss.to(out_ptr.dtype.element_ty))
    else:
        if MODE == 1:
            w = tl.full((), 1.0, tl.float64)
        else:
            w = 1.0 / (n_div * tl.maximum(s_b, 1)).to(tl.float64)
        tl.store(out_ptr + b, loss.to(tl.float64) * w)
    if WANT_GRAD:
        g_b = grad_ptr + b * stride_gn
        gty = grad_ptr.dtype.element_ty
        # frames past T_b (and an invalid row's whole slab); with ZERO_ROWS the last
        # frame's row too, before the barrier that precedes its posteriors
        if ZERO_ROWS:
            first = tl.where(t_b > 0, t_b - 1, t_b)
            _fill_rows(g_b, stride_gt, first, T_MAX, C, tl.where(ok, 0.0, float("nan")),
                       BLOCK_C)
        else:
            if ok.to(tl.int32) == 0:
                _fill_rows(g_b, stride_gt, b * 0, T_MAX, C, float("nan"), BLOCK_C)
        # the rank of each label among equal labels of the target: labels of one
        # rank are distinct, so a frame's label posteriors are added rank by rank
        rank = k * 0
        for j in range(0, s_b):
            lj = tl.load(tg_b + j).to(tl.int64)
            rank += (is_lab & (lab == lj) & (j < i)).to(rank.dtype)
        rounds = _max(rank) + 1
        # skip[k + 2]: label i + 1 may be entered from label i - it differs
        nxt_lab = tl.load(tg_b + i + 1, mask=is_lab & ((k + 2) < n_states), other=0)
        skip2 = is_lab & ((k + 2) < n_states) & (nxt_lab.to(tl.int64) != lab)
        # as vectors (scalar masks trip the interpreter); NaN stays NaN
        logz_v = tl.full((BLOCK,), 0.0, acc) + logz
        feasible = logz_v != float("-inf")
        wg = -(tl.full((BLOCK,), 0.0, tl.float64) + w).to(acc)
        # beta's two-row ring after the alpha tables of all N sequences
        b_seq = alpha_ptr + tl.num_programs(0).to(tl.int64) * T_MAX * BLOCK + b * 2 * BLOCK
        tl.debug_barrier()
        beta = tl.where(live & (k >= n_states - 2), 0.0, neg)
        for r in range(0, t_b):
            t = t_b - 1 - r
            e = tl.load(lp_b + t * stride_lt + col, mask=live, other=float("-inf"))
            e = e.to(acc)
            alpha = tl.load(a_seq + t * BLOCK + k)
            if r > 0:
                if GATHER:
                    if ZERO_ROWS:
                        tl.debug_barrier()
                else:
                    tl.debug_barrier()
                nxt = b_seq + ((t + 1) % 2) * BLOCK + k
                e1 = _shift_up(beta, k, 1, nxt - k, BLOCK, GATHER)
                e2 = tl.where(skip2, _shift_up(beta, k, 2, nxt - k, BLOCK, GATHER),
                              float("-inf"))
                beta = tl.where(live, _lse3(beta, e1, e2, log2e, ln2), neg)
            post = tl.where(live & feasible, tl.exp2((alpha + beta - logz) * log2e), 0.0) * wg
            g_t = g_b + t * stride_gt
            if ZERO_ROWS:
                # the previous frame's row, ordered before its posteriors by the
                # next frame's barrier
                kc = tl.arange(0, BLOCK_C)
                for c0 in range(0, C, BLOCK_C):
                    tl.store(g_b + (t - 1) * stride_gt + c0 + kc, tl.full((BLOCK_C,), 0.0, gty),
                             mask=((c0 + kc) < C) & ((kc * 0 + t) > 0))
            tl.store(g_t + blank, _sum(tl.where(odd, 0.0, post)).to(gty))
            tl.store(g_t + col, post.to(gty), mask=is_lab & (rank == 0))
            for rr in range(1, rounds):
                tl.debug_barrier()
                mr = is_lab & (rank == rr)
                cur = tl.load(g_t + col, mask=mr, other=0.0).to(acc)
                tl.store(g_t + col, (cur + post).to(gty), mask=mr)
            # the row frame t - 1 reads: emission + beta
            beta = tl.where(live, e + beta, neg)
            if not GATHER:
                tl.store(b_seq + (t % 2) * BLOCK + k, beta)


# ---------------------------------------------------------------- split α / β
# The same loss and gradient in two launches (`duoloss.torch._triton._ops`, chosen by
# ``CTC_SPLIT_MIN_BLOCK``): `ctc_ab_kernel` runs alpha and beta as two concurrent
# programs per sequence (a dependent chain of T frames instead of the fused kernel's
# 2 T), each storing its table; `ctc_post_kernel` writes the gradient row of one
# frame of one sequence from both tables, every row in parallel.  Scratch: the two
# tables (2 N T_MAX BLOCK), the lanes' classes and ranks (2 N BLOCK int32) and three
# float64 statistics per sequence (log Z, the weight, the validity).  Its validation
# prologue and alpha loop repeat `ctc_kernel`'s on purpose: the fused kernel stays as
# it was measured on the H200 until the two forms are timed side by side, and the
# slower one is then deleted (no shared helper changes the measured code meanwhile).


@triton.jit(do_not_specialize=["stride_lt", "stride_ln", "C", "blank", "stride_tb", "S_MAX",
                                "T_MAX", "n_div", "zero_inf"])
def ctc_ab_kernel(lp_ptr, stride_lt, stride_ln, C, blank,
                  tg_ptr, stride_tb, il_ptr, tl_ptr, S_MAX, T_MAX,
                  tab_ptr, ints_ptr, stat_ptr, out_ptr, n_div, zero_inf,
                  CONCAT: tl.constexpr, MODE: tl.constexpr, GATHER: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Alpha (``program_id(1) == 0``: also the loss, ``out`` as `ctc_kernel`'s, and the
    statistics, classes and ranks for `ctc_post_kernel`) or beta (``program_id(1) ==
    1``) of sequence ``b = program_id(0)``.  ``tab``: ``(2, N, T_MAX, BLOCK)`` in the
    compute dtype: ``alpha[t, k]`` and ``beta[t, k]`` both include frame ``t``'s
    emission.  ``ints``: ``(N, 2, BLOCK)`` int32, each lane's class (``-1`` past the
    states) and rank among equal labels; ``stat``: ``(N, 3)`` float64, log Z, the
    reduction weight and 1.0 for a valid row.  The validation is `ctc_kernel`'s."""
    b = tl.program_id(0).to(tl.int64)
    side = tl.program_id(1)
    n_seq = tl.num_programs(0).to(tl.int64)
    C = C.to(tl.int64)
    blank = blank.to(tl.int64)
    k = tl.arange(0, BLOCK)
    odd = (k % 2) == 1
    i = (k - 1) // 2
    acc = tab_ptr.dtype.element_ty
    neg = tl.full((BLOCK,), float("-inf"), acc)
    t_b = tl.load(il_ptr + b).to(tl.int64)
    s_b = tl.load(tl_ptr + b).to(tl.int64)
    ok = (t_b >= 0) & (t_b <= T_MAX) & (s_b >= 0) & (s_b <= S_MAX)
    s_b = tl.where(ok, s_b, 0)
    if CONCAT:
        start = b * 0
        for j0 in range(0, b, BLOCK):
            jj = j0 + k
            start += _sum(tl.load(tl_ptr + jj, mask=jj < b, other=0).to(tl.int64))
        tg_b = tg_ptr + start
    else:
        tg_b = tg_ptr + b * stride_tb
    n_states = 2 * s_b + 1
    is_lab = odd & (k < n_states)
    lab = tl.load(tg_b + i, mask=is_lab, other=0).to(tl.int64)
    bad = is_lab & ((lab < 0) | (lab >= C) | (lab == blank))
    ok = ok & (_max(bad.to(tl.int32)) == 0)
    t_b = tl.where(ok, t_b, 0)
    s_b = tl.where(ok, s_b, 0)
    n_states = 2 * s_b + 1
    live = k < n_states
    is_lab = odd & live
    col = tl.where(is_lab, lab, blank)
    ln2 = tl.log(tl.full((), 2.0, acc))
    log2e = 1.0 / ln2
    lp_b = lp_ptr + b * stride_ln
    some = (k * 0 + t_b) > 0
    if side == 0:
        prev_lab = tl.load(tg_b + i - 1, mask=is_lab & (k >= 3), other=0).to(tl.int64)
        skip = is_lab & (k >= 3) & (lab != prev_lab)
        a_seq = tab_ptr + b * T_MAX * BLOCK
        e = tl.load(lp_b + col, mask=live & some, other=float("-inf")).to(acc)
        alpha = tl.where(k < 2, e, neg)
        tl.store(a_seq + k, alpha, mask=some)
        # the emissions two frames ahead: each frame's gathered row is requested two
        # iterations before its use, its memory latency behind two frames' work
        one_t = stride_lt.to(tl.int64)
        ep1 = tl.load(lp_b + one_t + col, mask=live & ((k * 0 + 1) < t_b),
                      other=float("-inf")).to(acc)
        ep2 = tl.load(lp_b + 2 * one_t + col, mask=live & ((k * 0 + 2) < t_b),
                      other=float("-inf")).to(acc)
        for t in range(1, t_b):
            e = ep1
            ep1 = ep2
            ep2 = tl.load(lp_b + (t + 2) * stride_lt + col,
                          mask=live & ((k * 0 + t + 2) < t_b), other=float("-inf")).to(acc)
            if not GATHER:
                tl.debug_barrier()
            prev = a_seq + (t - 1) * BLOCK + k
            a1 = _shift_down(alpha, k, 1, prev - k, GATHER)
            a2 = tl.where(skip, _shift_down(alpha, k, 2, prev - k, GATHER), float("-inf"))
            alpha = tl.where(live, e + _lse3(alpha, a1, a2, log2e, ln2), neg)
            tl.store(a_seq + t * BLOCK + k, alpha)
        fin = live & (k >= n_states - 2)
        a_fin = tl.where(fin, alpha, float("-inf"))
        m = _max(a_fin)
        ms = tl.where(m == float("-inf"), 0.0, m)
        logz = ms + ln2 * tl.log2(_sum(tl.exp2((a_fin - ms) * log2e)))
        logz = tl.where(t_b > 0, logz, tl.where(s_b == 0, 0.0, float("-inf")))
        loss = 0.0 - logz
        loss = tl.where((zero_inf != 0) & (loss == float("inf")), 0.0, loss)
        loss = tl.where(ok, loss, float("nan"))
        if MODE == 0:
            w = tl.full((), 1.0, tl.float64)
            tl.store(out_ptr + b, loss.to(out_ptr.dtype.element_ty))
        else:
            if MODE == 1:
                w = tl.full((), 1.0, tl.float64)
            else:
                w = 1.0 / (n_div * tl.maximum(s_b, 1)).to(tl.float64)
            tl.store(out_ptr + b, loss.to(tl.float64) * w)
        # for the gradient pass: log Z, the weight, the validity; classes and ranks
        one = k == 0
        st = stat_ptr + b * 3 + k * 0
        tl.store(st, tl.where(one, logz.to(tl.float64), 0.0), mask=one)
        tl.store(st + 1, tl.where(one, w, 0.0), mask=one)
        tl.store(st + 2, tl.where(one & ok, 1.0, 0.0).to(tl.float64), mask=one)
        rank = k * 0
        for j in range(0, s_b):
            lj = tl.load(tg_b + j).to(tl.int64)
            rank += (is_lab & (lab == lj) & (j < i)).to(rank.dtype)
        iw = ints_ptr + b * 2 * BLOCK
        tl.store(iw + k, tl.where(live, col, -1).to(tl.int32))
        tl.store(iw + BLOCK + k, rank.to(tl.int32))
    else:
        nxt_lab = tl.load(tg_b + i + 1, mask=is_lab & ((k + 2) < n_states), other=0)
        skip2 = is_lab & ((k + 2) < n_states) & (nxt_lab.to(tl.int64) != lab)
        b_seq = tab_ptr + (n_seq + b) * T_MAX * BLOCK
        t_last = tl.maximum(t_b - 1, 0)
        e = tl.load(lp_b + t_last * stride_lt + col, mask=live & some,
                    other=float("-inf")).to(acc)
        beta = tl.where(live & (k >= n_states - 2), e, neg)
        tl.store(b_seq + t_last * BLOCK + k, beta, mask=some)
        ep1 = tl.load(lp_b + (t_last - 1) * stride_lt + col,
                      mask=live & ((k * 0 + t_last - 1) >= 0) & some,
                      other=float("-inf")).to(acc)
        ep2 = tl.load(lp_b + (t_last - 2) * stride_lt + col,
                      mask=live & ((k * 0 + t_last - 2) >= 0) & some,
                      other=float("-inf")).to(acc)
        for r in range(1, t_b):
            t = t_b - 1 - r
            e = ep1
            ep1 = ep2
            ep2 = tl.load(lp_b + (t - 2) * stride_lt + col,
                          mask=live & ((k * 0 + t - 2) >= 0), other=float("-inf")).to(acc)
            if not GATHER:
                tl.debug_barrier()
            nxt = b_seq + (t + 1) * BLOCK + k
            e1 = _shift_up(beta, k, 1, nxt - k, BLOCK, GATHER)
            e2 = tl.where(skip2, _shift_up(beta, k, 2, nxt - k, BLOCK, GATHER),
                          float("-inf"))
            beta = tl.where(live, e + _lse3(beta, e1, e2, log2e, ln2), neg)
            tl.store(b_seq + t * BLOCK + k, beta)


@triton.jit
def _fill_row(g_t, C, fill, BLOCK_C: tl.constexpr):
    """``g_t[:C] = fill`` (``fill`` a ``(BLOCK_C,)`` row of the gradient's dtype)."""
    kc = tl.arange(0, BLOCK_C)
    for c0 in range(0, C, BLOCK_C):
        tl.store(g_t + c0 + kc, fill, mask=(c0 + kc) < C)


@triton.jit(do_not_specialize=["stride_lt", "stride_ln", "C", "blank", "T_MAX", "stride_gt",
                                "stride_gn"])
def ctc_post_kernel(lp_ptr, stride_lt, stride_ln, C, blank, il_ptr, T_MAX,
                    tab_ptr, ints_ptr, stat_ptr, grad_ptr, stride_gt, stride_gn,
                    ZERO_ROWS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_C: tl.constexpr):
    """The gradient row of frame ``t = program_id(0)`` of sequence ``b =
    program_id(1)`` from `ctc_ab_kernel`'s tables: ``-w_b`` times the posteriors
    ``exp(alpha + beta - emission - log Z)``, the blank's summed, each label's added
    rank by rank; zeros on frames past ``T_b`` (``ZERO_ROWS``: every other class's
    zeros too; else the caller passes zeros), NaN over an invalid row."""
    t = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1).to(tl.int64)
    n_seq = tl.num_programs(1).to(tl.int64)
    C = C.to(tl.int64)
    blank = blank.to(tl.int64)
    k = tl.arange(0, BLOCK)
    odd = (k % 2) == 1
    acc = tab_ptr.dtype.element_ty
    gty = grad_ptr.dtype.element_ty
    # (as vectors: scalar masks trip the interpreter; 64-bit offsets throughout)
    logz = tl.load(stat_ptr + b * 3 + k * 0).to(acc)
    w = tl.load(stat_ptr + (b * 3 + 1) + k * 0)
    ok = tl.load(stat_ptr + (b * 3 + 2) + k * 0) != 0.0
    t_b = tl.where(ok, tl.load(il_ptr + b + k * 0).to(tl.int64), 0)
    g_t = grad_ptr + b * stride_gn + t * stride_gt
    run = ok & ((k * 0 + t) < t_b)
    if _max(run.to(tl.int32)) == 0:
        # past T_b (zeros, written here with ZERO_ROWS) or an invalid row (NaN): the
        # whole row
        valid = _max(ok.to(tl.int32))
        fill = (tl.full((BLOCK_C,), 0.0, tl.float32)
                + tl.where(valid != 0, 0.0, float("nan"))).to(gty)
        if ZERO_ROWS:
            _fill_row(g_t, C, fill, BLOCK_C)
        else:
            if valid == 0:
                _fill_row(g_t, C, fill, BLOCK_C)
    else:
        colv = tl.load(ints_ptr + b * 2 * BLOCK + k)
        rank = tl.load(ints_ptr + (b * 2 + 1) * BLOCK + k)
        live = colv >= 0
        is_lab = odd & live
        col = tl.where(live, colv, 0).to(tl.int64)
        ln2 = tl.log(tl.full((), 2.0, acc))
        log2e = 1.0 / ln2
        a = tl.load(tab_ptr + (b * T_MAX + t) * BLOCK + k)
        bt = tl.load(tab_ptr + ((n_seq + b) * T_MAX + t) * BLOCK + k)
        e = tl.load(lp_ptr + b * stride_ln + t * stride_lt + col, mask=live,
                    other=float("-inf")).to(acc)
        use = live & (logz != float("-inf")) & (e != float("-inf"))
        post = tl.where(use, tl.exp2((a + bt - e - logz) * log2e), 0.0) * (-w).to(acc)
        if ZERO_ROWS:
            _fill_row(g_t, C, tl.full((BLOCK_C,), 0.0, gty), BLOCK_C)
            tl.debug_barrier()
        tl.store(g_t + blank, _sum(tl.where(odd, 0.0, post)).to(gty))
        tl.store(g_t + col, post.to(gty), mask=is_lab & (rank == 0))
        rounds = _max(tl.where(is_lab, rank, 0)) + 1
        for rr in range(1, rounds):
            tl.debug_barrier()
            mr = is_lab & (rank == rr)
            cur = tl.load(g_t + col, mask=mr, other=0.0).to(acc)
            tl.store(g_t + col, (cur + post).to(gty), mask=mr)
