r"""Triton kernels of the torch device path: k2's transducer recursion on ``(px, py)``
(CTC: `_ctc_kernels`; ``rnnt_loss`` from joiner logits: `_rnnt_kernels`).

The recursion of k2's simple, smoothed and pruned losses (``rnnt_type`` 'regular',
or 'modified' for 'modified' and 'constrained') on the box ``[s0, s1] x [t0, t1]``
of each sequence's lattice:

.. math::

    \alpha_{s,t} = \log\big(e^{\alpha_{s,t-1} + py_{s,t-1}}
                   + e^{\alpha_{s-1,t'} + px_{s-1,t'}}\big),
    \qquad \text{loss} = -\alpha_{s_1,t_1},

with ``t' = t`` (regular) or ``t - 1`` (modified), and ``beta`` the same from the
other corner.  Two kernels with one job each, as `_rnnt_kernels`:

* `k2_alpha_beta_kernel` -- one program per sequence and side (``program_id(1)``:
  0 alpha, also the loss and ``log Z``; 1 beta; the two run
  concurrently).  ``px`` and ``py`` are read where they lie (any strides; no
  level-major copy).  A level is an anti-diagonal ``m = i + j`` (regular) or a frame
  ``j`` (modified) of the box cell ``(s0 + i, t0 + j)``, its lanes the states ``i``;
  the previous level stays in registers and its one-lane shift is a ``tl.gather``
  (warp shuffles while the row fits one warp), the next level's moves are loaded
  before the current level combines, and each log-add is the guarded base-2 form
  ``max + log2(1 + 2^-|a-b|)`` (NaN in, NaN out; ``-inf`` for two ``-inf``).  The
  kernel checks the box itself (``0 <= s0 <= s1 <= S``, ``0 <= t0 <= t1 <= T``): an
  invalid one gets a NaN loss and NaN gradients.
* `k2_grad_kernel` -- the per-sequence gradients ``d loss_b / d px`` and
  ``d loss_b / d py`` in one cell-parallel pass, in the layouts of ``px`` and ``py``:
  minus the move's posterior ``2^(alpha + move + beta_dest - log2 Z)`` inside the
  box, 0 outside it and wherever no path survives (``log Z = -inf``); NaN over the
  box's moves when ``log Z`` is NaN, and over the whole sequence when its box is
  invalid (the host core's conventions).

The workspace ``work`` ``(N, W)`` (the inputs' dtype) holds two ``(S + 1, T + 1)``
planes, alpha and beta (base 2), then ``log2 Z``.  Every
per-sequence base is 64-bit; lengths and strides are not specialised.

Imported on the first device call; with ``TRITON_INTERPRET=1`` set *before* its
import the kernels run on CPU tensors (how the tests exercise them).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

#: Whether the kernels were defined under the Triton interpreter (CPU tensors).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# the CTC kernel lives in a module of its own; looked up here by the launchers
from ._ctc_kernels import ctc_ab_kernel, ctc_kernel, ctc_post_kernel  # noqa: E402,F401
# the base-2 log-add, constants and reductions of rnnt_loss's kernels (one definition)
from ._rnnt_kernels import LN2, LOG2E, _lae2, _sum  # noqa: E402

PLANE_ALPHA = tl.constexpr(0)
PLANE_BETA = tl.constexpr(1)
N_PLANES = tl.constexpr(2)
SLOT_LOGZ = tl.constexpr(0)


@triton.jit
def _box(bd_ptr, sbd_b, sbd_k, b, S, T):
    """``(s0, t0, s1, t1, ok)`` of sequence ``b``'s boundary row (zeros when invalid;
    ``b`` a scalar or a vector of rows in range)."""
    row = bd_ptr + b * sbd_b
    k = sbd_k.to(tl.int64)  # (64-bit scalar offsets throughout)
    s0 = tl.load(row).to(tl.int32)
    t0 = tl.load(row + k).to(tl.int32)
    s1 = tl.load(row + 2 * k).to(tl.int32)
    t1 = tl.load(row + 3 * k).to(tl.int32)
    ok = (s0 >= 0) & (s0 <= s1) & (s1 <= S) & (t0 >= 0) & (t0 <= t1) & (t1 <= T)
    return (tl.where(ok, s0, 0), tl.where(ok, t0, 0), tl.where(ok, s1, 0),
            tl.where(ok, t1, 0), ok)


@triton.jit
def _frame(m, lane, MODIFIED: tl.constexpr):
    """The box frame ``j`` of each lane's cell on level ``m``: ``m - lane`` on an
    anti-diagonal (regular), ``m`` for every lane (modified)."""
    if MODIFIED:
        return lane * 0 + m
    return m - lane


@triton.jit
def _moves(xb, sx_s, sx_t, yb, sy_s, sy_t, sy, ty, sx, tx, my, mx, cd: tl.constexpr):
    """``(py[sy, ty], px[sx, tx])`` of a level's lanes in base 2 (``-inf`` where the
    masks ``my``/``mx`` are off), read in the lattice's dtype, returned in ``cd``."""
    ey = tl.load(yb + sy * sy_s + ty * sy_t, mask=my, other=float("-inf")).to(cd) * LOG2E
    ex = tl.load(xb + sx * sx_s + tx * sx_t, mask=mx, other=float("-inf")).to(cd) * LOG2E
    return ey, ex


@triton.jit(do_not_specialize=["sx_b", "sx_s", "sx_t", "sy_b", "sy_s", "sy_t", "sbd_b",
                                "sbd_k", "W", "P", "S", "T", "sout"])
def k2_alpha_beta_kernel(px_ptr, sx_b, sx_s, sx_t, py_ptr, sy_b, sy_s, sy_t, bd_ptr,
                         sbd_b, sbd_k, work_ptr, W, P, S, T, out_ptr, sout,
                         MODIFIED: tl.constexpr, BLOCK: tl.constexpr):
    """Alpha (``program_id(1) == 0``: also ``log2 Z`` and the loss
    ``out[b * sout]``) or beta (``program_id(1) == 1``) of sequence ``b``.

    ``alpha[s, t]``: log2-mass of the paths from ``(s0, t0)`` to ``(s, t)``;
    ``beta[s, t]``: from ``(s, t)`` to ``(s1, t1)``; planes indexed ``s * (T + 1) + t``
    (32-bit within a sequence: the launcher keeps a row below 2**31 entries)."""
    b = tl.program_id(0).to(tl.int64)
    side = tl.program_id(1)
    T1 = T + 1
    P = P.to(tl.int64)
    lane = tl.arange(0, BLOCK)
    zero = lane * 0
    s0, t0, s1, t1, ok = _box(bd_ptr, sbd_b, sbd_k, b, S, T)
    ns = s1 - s0 + 1
    nt = t1 - t0 + 1
    if MODIFIED:
        n_lev = nt
    else:
        n_lev = ns + nt - 1
    seq = work_ptr + b * W
    cd = work_ptr.dtype.element_ty
    neg = tl.full((BLOCK,), float("-inf"), cd)
    xb = px_ptr + b * sx_b
    yb = py_ptr + b * sy_b
    st = s0 + lane                       # this lane's state
    live = lane < ns
    if side == 0:
        a_p = seq + PLANE_ALPHA * P
        alpha = tl.where(lane == 0, 0.0, neg)
        if MODIFIED:  # frame t0: only the corner
            tl.store(a_p + st * T1 + t0, alpha, mask=live)
        else:
            tl.store(a_p + st * T1 + t0, alpha, mask=lane == 0)
        # the moves into level 1, loaded ahead (see the loop)
        j1 = _frame(1, lane, MODIFIED)
        c1 = live & (j1 >= 0) & (j1 < nt) & (zero + 1 < n_lev)
        if MODIFIED:
            jx = j1 - 1
        else:
            jx = j1
        # (into lane i: the blank move of state i, the symbol move of state i - 1)
        ey_n, ex_n = _moves(xb, sx_s, sx_t, yb, sy_s, sy_t, st, t0 + j1 - 1, st - 1, t0 + jx,
                            c1 & (j1 >= 1), c1 & (lane >= 1), cd)
        for m in range(1, n_lev):
            ey = ey_n
            ex = ex_n
            j2 = _frame(m + 1, lane, MODIFIED)
            c2 = live & (j2 >= 0) & (j2 < nt) & (zero + m + 1 < n_lev)
            if MODIFIED:
                jx2 = j2 - 1
            else:
                jx2 = j2
            ey_n, ex_n = _moves(xb, sx_s, sx_t, yb, sy_s, sy_t, st, t0 + j2 - 1, st - 1,
                                t0 + jx2, c2 & (j2 >= 1), c2 & (lane >= 1), cd)
            j = _frame(m, lane, MODIFIED)
            cell = live & (j >= 0) & (j < nt)
            # alpha[s, t - 1]: this lane; alpha[s - 1, t'] : the lane below
            below = tl.gather(alpha, tl.maximum(lane - 1, 0), 0)
            below = tl.where(lane >= 1, below, float("-inf"))
            alpha = tl.where(cell, _lae2(alpha + ey, below + ex), neg)
            tl.store(a_p + st * T1 + (t0 + j), alpha, mask=cell)
        fin = lane == ns - 1
        logz = _sum(tl.where(fin, alpha, 0.0), 0)
        logz = tl.where(ok, logz, float("nan"))
        one = lane == 0
        tl.store(seq + (N_PLANES * P + SLOT_LOGZ) + zero, tl.where(one, logz, 0.0), mask=one)
        tl.store(out_ptr + b * sout + zero, tl.where(one, -(logz * LN2), 0.0), mask=one)
    else:
        b_p = seq + PLANE_BETA * P
        top = tl.minimum(lane + 1, BLOCK - 1)
        fin = lane == ns - 1
        beta = tl.where(fin, 0.0, neg)
        if MODIFIED:
            tl.store(b_p + st * T1 + t1, beta, mask=live)
        else:
            tl.store(b_p + st * T1 + t1, beta, mask=fin)
        # the moves out of level n_lev - 2, loaded ahead
        j1 = _frame(n_lev - 2, lane, MODIFIED)
        c1 = live & (j1 >= 0) & (j1 < nt)
        ey_n, ex_n = _moves(xb, sx_s, sx_t, yb, sy_s, sy_t, st, t0 + j1, st, t0 + j1,
                            c1 & (j1 + 1 < nt), c1 & (lane + 1 < ns), cd)
        for r in range(2, n_lev + 1):
            m = n_lev - r
            ey = ey_n
            ex = ex_n
            j2 = _frame(m - 1, lane, MODIFIED)
            c2 = live & (j2 >= 0) & (j2 < nt)
            ey_n, ex_n = _moves(xb, sx_s, sx_t, yb, sy_s, sy_t, st, t0 + j2, st, t0 + j2,
                                c2 & (j2 + 1 < nt), c2 & (lane + 1 < ns), cd)
            j = _frame(m, lane, MODIFIED)
            cell = live & (j >= 0) & (j < nt)
            # beta[s, t + 1]: this lane; beta[s + 1, t'']: the lane above
            above = tl.gather(beta, top, 0)
            above = tl.where(lane + 1 < BLOCK, above, float("-inf"))
            beta = tl.where(cell, _lae2(beta + ey, above + ex), neg)
            tl.store(b_p + st * T1 + (t0 + j), beta, mask=cell)


@triton.jit(do_not_specialize=["sx_b", "sx_s", "sx_t", "sy_b", "sy_s", "sy_t", "sbd_b",
                                "sbd_k", "W", "P", "S", "T", "TX", "n_cells"])
def k2_grad_kernel(px_ptr, sx_b, sx_s, sx_t, py_ptr, sy_b, sy_s, sy_t, gx_ptr, gy_ptr,
                   bd_ptr, sbd_b, sbd_k, work_ptr, W, P, S, T, TX, n_cells,
                   MODIFIED: tl.constexpr, ROWS: tl.constexpr):
    """``gx = d loss_b / d px`` (``(N, S, TX)``) and ``gy = d loss_b / d py``
    (``(N, S + 1, T)``), contiguous, for ``ROWS`` cells ``(b, s, t)`` of the
    ``(N, S + 1, T + 1)`` grid per program."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    in_grid = rows < n_cells
    T1 = T + 1
    per = (S + 1).to(tl.int64) * T1
    b = rows // per
    rem = rows - b * per
    s = (rem // T1).to(tl.int32)
    t = (rem - (rem // T1) * T1).to(tl.int32)
    b = tl.where(in_grid, b, 0)
    P = P.to(tl.int64)
    seq = work_ptr + b * W
    cd = work_ptr.dtype.element_ty
    s0, t0, s1, t1, ok = _box(bd_ptr, sbd_b, sbd_k, b, S, T)  # (b = 0 outside the grid)
    logz = tl.load(seq + (N_PLANES * P + SLOT_LOGZ), mask=in_grid, other=0.0)
    in_s = ok & (s >= s0) & (s <= s1)
    in_y = in_grid & in_s & (t >= t0) & (t < t1)
    if MODIFIED:
        in_x = in_grid & in_s & (s < s1) & (t >= t0) & (t < t1)
        tx = t + 1
    else:
        in_x = in_grid & in_s & (s < s1) & (t >= t0) & (t <= t1)
        tx = t
    cell = s * T1 + t
    alpha = tl.load(seq + (PLANE_ALPHA * P + cell), mask=in_x | in_y, other=float("-inf"))
    ey = tl.load(py_ptr + b * sy_b + s * sy_s + t * sy_t, mask=in_y,
                 other=float("-inf")).to(cd) * LOG2E
    ex = tl.load(px_ptr + b * sx_b + s * sx_s + t * sx_t, mask=in_x,
                 other=float("-inf")).to(cd) * LOG2E
    by = tl.load(seq + (PLANE_BETA * P + cell + 1), mask=in_y, other=float("-inf"))
    bx = tl.load(seq + (PLANE_BETA * P + (s + 1) * T1 + tx), mask=in_x, other=float("-inf"))
    feas = logz > float("-inf")
    nan_z = logz != logz
    gy = tl.where(in_y & (feas | nan_z), -tl.exp2(alpha + ey + by - logz), 0.0)
    gx = tl.where(in_x & (feas | nan_z), -tl.exp2(alpha + ex + bx - logz), 0.0)
    # log Z NaN: NaN over the box's moves (frame t1 of px too, where it exists)
    x_box = in_grid & in_s & (s < s1) & (t >= t0) & (t <= t1)
    gx = tl.where(x_box & nan_z, float("nan"), gx)
    bad = in_grid & ~ok
    gy = tl.where(bad, float("nan"), gy)
    gx = tl.where(bad, float("nan"), gx)
    bl = b * (S + 1).to(tl.int64) * T
    tl.store(gy_ptr + bl + s * T + t, gy, mask=in_grid & (t < T))
    bx_l = b * S.to(tl.int64) * TX
    tl.store(gx_ptr + bx_l + s * TX + t, gx, mask=in_grid & (s < S) & (t < TX))
