"""Triton kernels of the torch device path: CTC and the transducer recursion.

Both are forward-backward recursions in log space, one program per sequence,
a loop over the levels of the lattice (frames for CTC, anti-diagonals or frames
for the transducer), the states of a level vectorised in one block.  The
forward and backward tables live in global scratch buffers of the caller
(``O(N x levels x block)``); a level reads the previous one through shifted,
masked loads after a ``tl.debug_barrier()``.  Everything is computed in the
inputs' dtype (float32 or float64).

This module is imported only by `duoloss.torch._triton` when a call takes
the device path; with ``TRITON_INTERPRET=1`` set *before* its import the same
kernels run on CPU tensors (how the tests exercise them).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

#: Whether the kernels were defined under the Triton interpreter (CPU tensors).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _maxnum(a, b):
    return tl.maximum(a, b)


# Reductions through tl.reduce with combine functions of this module (not
# tl.sum / tl.max, which are @triton.jit functions of triton.language: under the
# interpreter those work only when triton itself was imported with
# TRITON_INTERPRET=1, and torch may import triton first).
@triton.jit
def _sum(x):
    return tl.reduce(x, 0, _add)


@triton.jit
def _max(x):
    return tl.reduce(x, 0, _maxnum)


@triton.jit
def _lse3(a, b, c):
    """``log(exp(a) + exp(b) + exp(c))`` elementwise; ``-inf`` (not NaN) when all
    three are ``-inf``; NaN or ``+inf`` inputs give NaN (the NaN policy)."""
    m = tl.maximum(tl.maximum(a, b), c)
    ms = tl.where(m == float("-inf"), 0.0, m)
    return ms + tl.log(tl.exp(a - ms) + tl.exp(b - ms) + tl.exp(c - ms))


@triton.jit
def _ctc_skip(tg_b, k, n_states):
    """Whether state ``k`` (odd: label ``(k - 1) // 2``) may be entered from ``k - 2``:
    a label state whose label differs from the previous label (``tg_b``: the
    sequence's targets)."""
    odd = (k % 2) == 1
    i = (k - 1) // 2
    m = odd & (k >= 3) & (k < n_states)
    cur = tl.load(tg_b + i, mask=m, other=0)
    prev = tl.load(tg_b + i - 1, mask=m, other=0)
    return m & (cur != prev)


@triton.jit(do_not_specialize=["stride_lt", "stride_ln", "stride_tb", "stride_gt",
                                "stride_gn", "T_MAX", "zero_inf"])
def ctc_kernel(lp_ptr, stride_lt, stride_ln,
               tg_ptr, stride_tb, il_ptr, tl_ptr,
               alpha_ptr, beta_ptr, loss_ptr,
               grad_ptr, stride_gt, stride_gn,
               T_MAX, zero_inf, WANT_GRAD: tl.constexpr, BLOCK: tl.constexpr):
    """CTC over the gathered ``(T, N, S + 1)`` lattice (column 0 the blank, column
    ``1 + i`` label ``i``; classes contiguous) for sequence ``b = program_id(0)``.

    ``alpha``/``beta`` scratch ``(N, T, BLOCK)``; ``loss`` ``(N,)``; ``grad``
    (zeros on entry, classes contiguous) receives ``d loss_b / d lp[t, b, column]``
    for ``t < T_b``.  Lengths must already be in range (the wrapper clamps invalid
    rows); ``zero_inf`` nonzero: an infinite loss is reported as 0.  Every
    per-sequence and per-frame base is 64-bit (no tensor is limited to 2**31
    elements); lengths and strides are not specialised (a new ``T`` or ``S`` of
    the same ``BLOCK`` reuses the compiled kernel).
    """
    b = tl.program_id(0).to(tl.int64)
    t_b = tl.load(il_ptr + b)
    s_b = tl.load(tl_ptr + b)
    n_states = 2 * s_b + 1
    k = tl.arange(0, BLOCK)
    live = k < n_states
    col = tl.where((k % 2) == 1, (k + 1) // 2, 0)
    tg_b = tg_ptr + b * stride_tb
    skip = _ctc_skip(tg_b, k, n_states)
    neg = tl.full((BLOCK,), float("-inf"), lp_ptr.dtype.element_ty)
    lp_b = lp_ptr + b * stride_ln
    a_seq = alpha_ptr + b * T_MAX * BLOCK
    b_seq = beta_ptr + b * T_MAX * BLOCK
    # forward: alpha[t, k] includes the emission of frame t
    if t_b > 0:
        e = tl.load(lp_b + col, mask=live, other=float("-inf"))
        alpha = tl.where(k < 2, e, neg)
        tl.store(a_seq + k, alpha)
    for t in range(1, t_b):
        tl.debug_barrier()
        prev = a_seq + (t - 1) * BLOCK + k
        a0 = tl.load(prev)
        a1 = tl.load(prev - 1, mask=k >= 1, other=float("-inf"))
        a2 = tl.load(prev - 2, mask=skip, other=float("-inf"))
        e = tl.load(lp_b + t * stride_lt + col, mask=live, other=float("-inf"))
        alpha = tl.where(live, e + _lse3(a0, a1, a2), neg)
        tl.store(a_seq + t * BLOCK + k, alpha)
    tl.debug_barrier()
    # log Z from the last frame's two final states
    fin = live & (k >= n_states - 2) & ((k * 0 + t_b) > 0)
    a_fin = tl.load(a_seq + (t_b - 1) * BLOCK + k, mask=fin, other=float("-inf"))
    m = _max(a_fin)
    ms = tl.where(m == float("-inf"), 0.0, m)
    logz = ms + tl.log(_sum(tl.exp(a_fin - ms)))
    logz = tl.where(t_b > 0, logz, tl.where(s_b == 0, 0.0, float("-inf")))
    loss = -logz
    loss = tl.where((zero_inf != 0) & (loss == float("inf")), 0.0, loss)
    tl.store(loss_ptr + b, loss)
    if WANT_GRAD:
        # backward: beta[t, k] excludes the emission of frame t
        skip2 = _ctc_skip(tg_b, k + 2, n_states)
        # as a vector (scalar masks trip the interpreter); NaN stays NaN
        logz_v = tl.full((BLOCK,), 0.0, lp_ptr.dtype.element_ty) + logz
        feasible = logz_v != float("-inf")
        g_b = grad_ptr + b * stride_gn
        odd = (k % 2) == 1
        for i in range(0, t_b):
            t = t_b - 1 - i
            if i == 0:
                beta = tl.where(live & (k >= n_states - 2), 0.0, neg)
            else:
                tl.debug_barrier()
                nxt = b_seq + (t + 1) * BLOCK + k
                e0 = tl.load(nxt)
                e1 = tl.load(nxt + 1, mask=(k + 1) < n_states, other=float("-inf"))
                e2 = tl.load(nxt + 2, mask=skip2, other=float("-inf"))
                beta = tl.where(live, _lse3(e0, e1, e2), neg)
            e = tl.load(lp_b + t * stride_lt + col, mask=live, other=float("-inf"))
            # the row the previous frame reads: emission + beta
            tl.store(b_seq + t * BLOCK + k, tl.where(live, e + beta, neg))
            alpha = tl.load(a_seq + t * BLOCK + k)
            post = tl.where(live & feasible, tl.exp(alpha + beta - logz), 0.0)
            g_t = g_b + t * stride_gt
            tl.store(g_t + col, -post, mask=live & odd)
            tl.store(g_t, -_sum(tl.where(odd, 0.0, post)))


@triton.jit(do_not_specialize=["stride_xb", "W_X", "stride_yb", "W_Y", "T_X", "N_LEV"])
def transducer_kernel(xs_ptr, stride_xb, W_X, ys_ptr, stride_yb, W_Y,
                      bd_ptr, alpha_ptr, q_ptr, loss_ptr,
                      gx_ptr, gy_ptr, T_X, N_LEV,
                      MODIFIED: tl.constexpr, WANT_GRAD: tl.constexpr, BLOCK: tl.constexpr):
    """k2's mutual-information recursion for sequence ``b = program_id(0)``.

    The moves come level-major (`skew`): ``xs[b, m, r]`` is ``px[b, r, m - r]``
    (regular: rows are the anti-diagonals ``m = s + t``) or ``px[b, r, m]``
    (modified: rows are frames), ``W_X = S`` lanes per row; ``ys`` likewise from
    ``py`` with ``W_Y = S + 1``.  A level's lanes are consecutive states ``s``:
    every load and store of a level is one contiguous run (coalesced).  ``T_X``:
    the frames of ``px`` (``T + 1`` regular, ``T`` modified).

    Boundary rows ``[s0, t0, s1, t1]`` (valid: the wrapper replaces invalid rows).
    Levels: anti-diagonals ``i + j`` (regular) or frames ``j`` (modified) of the box
    node ``(s0 + i, t0 + j)``; lanes: ``i``.  Scratch ``alpha``/``q`` ``(N, N_LEV,
    BLOCK)``.  ``gx``/``gy`` (zeros on entry, the layout of ``xs``/``ys``) receive
    ``d loss_b / d px`` and ``d loss_b / d py``.  Per-sequence bases are 64-bit;
    lengths and strides are not specialised.
    """
    b = tl.program_id(0).to(tl.int64)
    s0 = tl.load(bd_ptr + b * 4)
    t0 = tl.load(bd_ptr + (b * 4 + 1))
    s1 = tl.load(bd_ptr + (b * 4 + 2))
    t1 = tl.load(bd_ptr + (b * 4 + 3))
    ns = s1 - s0 + 1
    nt = t1 - t0 + 1
    if MODIFIED:
        n_lev = nt
        base = t0            # the row of level lev's moves: base + lev - 1
    else:
        n_lev = ns + nt - 1
        base = s0 + t0
    i = tl.arange(0, BLOCK)
    neg = tl.full((BLOCK,), float("-inf"), xs_ptr.dtype.element_ty)
    a_seq = alpha_ptr + b * N_LEV * BLOCK
    q_seq = q_ptr + b * N_LEV * BLOCK
    x_b = xs_ptr + b * stride_xb + s0      # lane i: state s0 + i
    y_b = ys_ptr + b * stride_yb + s0
    tl.store(a_seq + i, tl.where(i == 0, 0.0, neg))
    for lev in range(1, n_lev):
        if MODIFIED:
            j = i * 0 + lev
        else:
            j = lev - i
        node = (i < ns) & (j >= 0) & (j < nt)
        tl.debug_barrier()
        prev = a_seq + (lev - 1) * BLOCK + i
        row = base + lev - 1
        # blank move from (i, j - 1); symbol move from (i - 1, j) or (i - 1, j - 1)
        my = node & (j >= 1)
        wy = tl.load(prev, mask=my, other=float("-inf")) + tl.load(
            y_b + row * W_Y + i, mask=my, other=float("-inf"))
        if MODIFIED:
            mx = node & (i >= 1) & (j >= 1)
        else:
            mx = node & (i >= 1)
        wx = tl.load(prev - 1, mask=mx, other=float("-inf")) + tl.load(
            x_b + row * W_X + i - 1, mask=mx, other=float("-inf"))
        alpha = tl.where(node, _lse3(wy, wx, neg), neg)
        tl.store(a_seq + lev * BLOCK + i, alpha)
    tl.debug_barrier()
    fin = tl.load(a_seq + (n_lev - 1) * BLOCK + i, mask=i == ns - 1, other=float("-inf"))
    # the single final cell, through a sum (a max may drop a NaN)
    total = _sum(tl.where(i == ns - 1, fin, 0.0))
    tl.store(loss_ptr + b, -total)
    if WANT_GRAD:
        # as vectors (scalar masks trip the interpreter); NaN stays NaN
        total_v = tl.full((BLOCK,), 0.0, xs_ptr.dtype.element_ty) + total
        feasible = total_v != float("-inf")
        nan_total = total_v != total_v
        gx_b = gx_ptr + b * stride_xb + s0
        gy_b = gy_ptr + b * stride_yb + s0
        for r in range(0, n_lev):
            lev = n_lev - 1 - r
            if MODIFIED:
                j = i * 0 + lev
            else:
                j = lev - i
            node = (i < ns) & (j >= 0) & (j < nt)
            alpha = tl.load(a_seq + lev * BLOCK + i)
            if r == 0:
                q = tl.where(node & (i == ns - 1), 0.0, neg)
            else:
                tl.debug_barrier()
                nxt = q_seq + (lev + 1) * BLOCK + i
                row = base + lev       # the moves out of level lev
                my = node & (j < nt - 1)
                wy = tl.load(y_b + row * W_Y + i, mask=my,
                             other=float("-inf")) + tl.load(nxt, mask=my, other=float("-inf"))
                if MODIFIED:
                    mx = node & (i < ns - 1) & (j < nt - 1)
                else:
                    mx = node & (i < ns - 1)
                wx = tl.load(x_b + row * W_X + i, mask=mx,
                             other=float("-inf")) + tl.load(nxt + 1, mask=mx,
                                                            other=float("-inf"))
                q = tl.where(node, _lse3(wy, wx, neg), neg)
                gy = tl.where(feasible, -tl.exp(alpha + wy - total), 0.0)
                tl.store(gy_b + row * W_Y + i, gy, mask=my)
                gx = tl.where(feasible, -tl.exp(alpha + wx - total), 0.0)
                tl.store(gx_b + row * W_X + i, gx, mask=mx)
                if MODIFIED:
                    # the host's NaN fill covers frame t1 of px too (when it exists)
                    mlast = node & (i < ns - 1) & (j == nt - 1) & ((t0 + j) < T_X) & nan_total
                    tl.store(gx_b + row * W_X + i, tl.where(mlast, float("nan"), 0.0),
                             mask=mlast)
            tl.store(q_seq + lev * BLOCK + i, q)
