"""Triton kernels of the torch device path: the transducer recursion (CTC: `_ctc_kernels`).

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

# the CTC kernel lives in a module of its own; looked up here by the launchers
from ._ctc_kernels import ctc_kernel  # noqa: E402,F401


# the combine functions and reductions of the CTC kernel's module (one definition)
from ._ctc_kernels import _add, _max, _maxnum, _sum  # noqa: E402,F401


@triton.jit
def _lse3(a, b, c):
    """``log(exp(a) + exp(b) + exp(c))`` elementwise; ``-inf`` (not NaN) when all
    three are ``-inf``; NaN or ``+inf`` inputs give NaN (the NaN policy)."""
    m = tl.maximum(tl.maximum(a, b), c)
    ms = tl.where(m == float("-inf"), 0.0, m)
    return ms + tl.log(tl.exp(a - ms) + tl.exp(b - ms) + tl.exp(c - ms))


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
