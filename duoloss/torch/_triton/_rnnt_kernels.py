r"""Triton kernels of ``rnnt_loss``'s device path: the joiner output is read where it
lies, never normalised into a ``(N, T, U + 1, V)`` copy.

Three kernels with one job each (the layout of torch's ``LossCTC.cu`` and
warp-rnnt), all in base 2 (``exp2``/``log2``: one ``ex2``/``lg2`` instruction each in
float32, no branchy ``__nv_logf``):

* `rnnt_norm_kernel` -- the normaliser, fully parallel over the cells ``(b, t, u)``:
  one pass over each row of ``V`` logits (an online max and sum of ``2^x``, chunk by
  chunk when ``V`` exceeds the block) gives ``lse``; only the blank's and the next
  label's log-probabilities are kept (``lpb``, ``lpy``, base 2, the delay penalty
  added to ``lpy``).  Cells outside a sequence's box are not read.
* `rnnt_alpha_beta_kernel` -- the recursion, one program per sequence and side
  (``program_id(1) = 0``: alpha, ``1``: beta; the two run concurrently).  A level is
  an anti-diagonal ``m = t + u`` whose lanes are the states ``u``; the previous
  level stays in registers and its one-lane shift is a ``tl.gather`` (warp shuffles
  when the row fits one warp: no barrier, no scratch round trip).  The next level's
  emissions are loaded before the current level is combined (a software prefetch),
  and each log-add is the guarded two-term ``max + log2(1 + 2^{-|a-b|})``: one
  ``ex2`` and one ``lg2``, NaN in, NaN out, ``-inf`` for two ``-inf``.  The kernel
  checks the sequence itself (lengths in range, labels in ``[0, V)`` and never the
  blank) and gives an invalid one a NaN loss.
* `rnnt_grad_kernel` -- the gradient w.r.t. the logits in one parallel pass (in the
  backward, with the cotangent folded in):

  .. math::

      \frac{\partial L}{\partial x_{t,u,v}} = g_b\Big(\operatorname{softmax}(x_{t,u})_v
      \big(p^\varnothing_{t,u} + (1+\lambda) p^y_{t,u}\big) - p^\varnothing_{t,u}
      [v = \varnothing] - (1+\lambda) p^y_{t,u} [v = y_{u+1}]\Big),

  with the move posteriors ``p = 2^(alpha + lp + beta_dest - log2 Z)``; clamped when
  asked; 0 outside the box and wherever no mass passes (no ``0 * NaN``); NaN over
  the whole sequence when it is invalid.

The per-sequence workspace ``work`` ``(N, W)`` (the compute dtype: float32, or
float64 for float64 logits) holds five ``(T, U + 1)`` planes -- ``lpb``, ``lpy``,
``alpha``, ``beta``, ``lse`` -- then ``log2 Z``, the loss and a validity flag:
about ``5 / V`` of the logits.  Every per-sequence base is 64-bit; lengths, strides
and sizes are not specialised (``do_not_specialize``).

Imported on the first device call; with ``TRITON_INTERPRET=1`` set before its import
the kernels run on CPU tensors (how the tests exercise them).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

#: Whether the kernels were defined under the Triton interpreter (CPU tensors).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# (globals a kernel reads must be constexpr)
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

# the planes of the workspace (multiples of P = T * (U + 1)) and its scalars after them
PLANE_LPB = tl.constexpr(0)
PLANE_LPY = tl.constexpr(1)
PLANE_ALPHA = tl.constexpr(2)
PLANE_BETA = tl.constexpr(3)
PLANE_LSE = tl.constexpr(4)
N_PLANES = tl.constexpr(5)
SLOT_LOGZ = tl.constexpr(0)
SLOT_LOSS = tl.constexpr(1)
SLOT_OK = tl.constexpr(2)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _maxnum(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


# reductions through tl.reduce with this module's combine functions (tl.sum / tl.max
# are jit functions of triton.language that the interpreter handles only when triton
# itself was imported under TRITON_INTERPRET=1)
@triton.jit
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _add)


@triton.jit
def _max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _maxnum)


@triton.jit
def _lae2(a, b):
    """``log2(2^a + 2^b)``: one ``exp2`` and one ``log2``; NaN if either is NaN,
    ``-inf`` (not NaN) for two ``-inf``."""
    mx = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    r = mx + tl.log2(1.0 + tl.exp2(-tl.abs(a - b)))
    return tl.where(mx == float("-inf"), mx, r)


@triton.jit
def _cells(rows, TU1, U1):
    """``(b, t, u)`` of flat cell indices (64-bit)."""
    b = rows // TU1
    rem = rows - b * TU1
    t = rem // U1
    return b, t, rem - t * U1


@triton.jit
def _f64(bits):
    """A float argument passed as the int64 bits of a float64 (`duoloss.torch._triton.
    _rnnt_ops.f64_bits`): Triton types a Python float argument as float32, which
    would round ``sigma``, ``1 / N`` or a clamp bound in float64 kernels."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True)


@triton.jit(do_not_specialize=["sx_b", "sx_t", "sx_u", "sy_b", "sy_u", "W", "P",
                                "n_cells", "T", "U1", "V", "blank", "delay"])
def rnnt_norm_kernel(x_ptr, sx_b, sx_t, sx_u, y_ptr, sy_b, sy_u, il_ptr, tl_ptr,
                     work_ptr, W, P, n_cells, T, U1, V, blank, delay,
                     FUSED: tl.constexpr, DELAY: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """``lse``, ``lpb`` and ``lpy`` (base 2) of ``ROWS`` cells per program (classes
    contiguous in ``x``; ``x`` of any float dtype, read as it is and accumulated in
    the workspace's dtype).  ``FUSED`` false: the logits are log-probabilities
    already (``lse = 0``)."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    in_grid = rows < n_cells
    b, t, u = _cells(rows, T.to(tl.int64) * U1, U1)
    b = tl.where(in_grid, b, 0)
    tb = tl.load(il_ptr + b, mask=in_grid, other=0)
    ub = tl.load(tl_ptr + b, mask=in_grid, other=0)
    act = in_grid & (t < tb) & (u <= ub)
    cd = work_ptr.dtype.element_ty
    delay = _f64(delay).to(cd)
    xrow = x_ptr + b * sx_b + t * sx_t + u * sx_u
    if FUSED:
        v = tl.arange(0, BLOCK_V)
        m = tl.full((ROWS,), float("-inf"), cd)
        s = tl.full((ROWS,), 0, cd)
        for c in range(0, V.to(tl.int64), BLOCK_V):
            cols = c + v
            msk = act[:, None] & (cols < V)[None, :]
            xv = tl.load(xrow[:, None] + cols[None, :], mask=msk,
                         other=float("-inf")).to(cd)
            nm = tl.maximum(m, _max(xv, 1), propagate_nan=tl.PropagateNan.ALL)
            nms = tl.where(nm == float("-inf"), 0.0, nm)
            s = s * tl.exp2((m - nms) * LOG2E) + _sum(
                tl.exp2((xv - nms[:, None]) * LOG2E), 1)
            m = nm
        ms = tl.where(m == float("-inf"), 0.0, m)
        lse2 = ms * LOG2E + tl.log2(s)         # -inf for a row of -inf only
    else:
        lse2 = tl.full((ROWS,), 0, cd)
    lab = tl.load(y_ptr + b * sy_b + u * sy_u, mask=act & (u < ub), other=0)
    lab = tl.where((lab >= 0) & (lab < V), lab, 0)  # (an invalid label: NaN loss, any read)
    xb = tl.load(xrow + blank.to(tl.int64), mask=act, other=float("-inf")).to(cd)
    xy = tl.load(xrow + lab, mask=act & (u < ub), other=float("-inf")).to(cd)
    if FUSED:
        lpb = tl.where(lse2 == float("-inf"), float("-inf"), xb * LOG2E - lse2)
        lpy = tl.where(lse2 == float("-inf"), float("-inf"), xy * LOG2E - lse2)
    else:
        lpb = xb * LOG2E
        lpy = xy * LOG2E
    if DELAY:
        # k2's delay penalty on the label log-prob: delay * ((T_b - 1) / 2 - t)
        pen = delay * ((tb.to(cd) - 1.0) / 2.0 - t.to(cd))
        lpy = lpy + pen * LOG2E
    lpy = tl.where(act & (u < ub), lpy, float("-inf"))
    lpb = tl.where(act, lpb, float("-inf"))
    seq = work_ptr + b * W
    cell = t * U1 + u
    P = P.to(tl.int64)
    tl.store(seq + (PLANE_LPB * P + cell), lpb, mask=in_grid)
    tl.store(seq + (PLANE_LPY * P + cell), lpy, mask=in_grid)
    if FUSED:
        tl.store(seq + (PLANE_LSE * P + cell), lse2, mask=in_grid)


@triton.jit(do_not_specialize=["W", "P", "sy_b", "sy_u", "T", "U", "V", "blank", "lam1",
                                "sout"])
def rnnt_alpha_beta_kernel(work_ptr, W, P, y_ptr, sy_b, sy_u, il_ptr, tl_ptr, T, U, V,
                           blank, lam1, out_ptr, sout,
                           REDUCED: tl.constexpr, BLOCK: tl.constexpr):
    """Alpha (``program_id(1) == 0``: also ``log2 Z``, the loss and the validity flag)
    or beta (``program_id(1) == 1``) of sequence ``b = program_id(0)``.

    ``alpha[t, u]``: log2-mass of the paths from ``(0, 0)`` to ``(t, u)``;
    ``beta[t, u]``: of the paths from ``(t, u)`` to the end, its moves included
    (``beta[T_b - 1, U_b] = lpb[T_b - 1, U_b]``, the last blank); ``log2 Z =
    alpha[T_b - 1, U_b] + lpb[T_b - 1, U_b] = beta[0, 0]``.  The loss ``-lam1 log Z``
    goes to ``out[b * sout]`` (``REDUCED``: to the workspace, for the reduction)."""
    b = tl.program_id(0).to(tl.int64)
    side = tl.program_id(1)
    U1 = U + 1
    P = P.to(tl.int64)  # the planes' bases: 64-bit scalars
    # (32-bit within a sequence: the launcher keeps a workspace row below 2**31 entries)
    tb = tl.load(il_ptr + b).to(tl.int32)
    ub = tl.load(tl_ptr + b).to(tl.int32)
    lane = tl.arange(0, BLOCK)
    lam1 = _f64(lam1)
    # the sequence's own check: lengths in range, labels in [0, V) and not the blank
    nbad = tl.full((BLOCK,), 0, tl.int32)
    in_len = (ub >= 0) & (ub <= U)
    ub_c = tl.minimum(tl.maximum(ub, 0), U)   # (vector masks: scalar ones trip the interpreter)
    for c in range(0, U, BLOCK):
        k = c + lane
        km = k < ub_c
        lab = tl.load(y_ptr + b * sy_b + k * sy_u, mask=km, other=0)
        nbad += (km & ((lab < 0) | (lab >= V) | (lab == blank))).to(tl.int32)
    ok_v = (_sum(nbad, 0) == 0) & (tb >= 0) & (tb <= T) & in_len
    tb = tl.where(ok_v, tb, 0)
    ub = tl.where(ok_v, ub, 0)
    seq = work_ptr + b * W
    lpb_p = seq + PLANE_LPB * P
    lpy_p = seq + PLANE_LPY * P
    cd = work_ptr.dtype.element_ty
    neg = tl.full((BLOCK,), float("-inf"), cd)
    n_lev = tl.where(tb > 0, tb + ub, 0)
    # scalars as vectors where they enter a mask (scalar masks trip the interpreter)
    zero = lane * 0
    some = (zero + n_lev) > 0
    ok_l = (zero + ok_v.to(tl.int32)) != 0
    if side == 0:
        a_p = seq + PLANE_ALPHA * P
        alpha = tl.where(lane == 0, 0.0, neg)
        tl.store(a_p + lane, alpha, mask=(lane == 0) & some)
        # the emissions of level 1, loaded ahead (see the loop)
        t1 = 1 - lane
        c1 = (t1 >= 0) & (t1 < tb) & (lane <= ub)
        eb_n = tl.load(lpb_p + (t1 - 1) * U1 + lane, mask=c1 & (t1 >= 1), other=float("-inf"))
        ey_n = tl.load(lpy_p + t1 * U1 + lane - 1, mask=c1 & (lane >= 1), other=float("-inf"))
        for m in range(1, n_lev):
            eb = eb_n
            ey = ey_n
            # the next level's emissions, in flight while this level combines
            t2 = m + 1 - lane
            c2 = (t2 >= 0) & (t2 < tb) & (lane <= ub) & (zero + m + 1 < n_lev)
            eb_n = tl.load(lpb_p + (t2 - 1) * U1 + lane, mask=c2 & (t2 >= 1),
                           other=float("-inf"))
            ey_n = tl.load(lpy_p + t2 * U1 + lane - 1, mask=c2 & (lane >= 1),
                           other=float("-inf"))
            t = m - lane
            cell = (t >= 0) & (t < tb) & (lane <= ub)
            # alpha[t - 1, u]: this lane; alpha[t, u - 1]: the lane below
            below = tl.gather(alpha, tl.maximum(lane - 1, 0), 0)
            below = tl.where(lane >= 1, below, float("-inf"))
            alpha = tl.where(cell, _lae2(alpha + eb, below + ey), neg)
            tl.store(a_p + t * U1 + lane, alpha, mask=cell)
        fin = (lane == ub) & some
        e_fin = tl.load(lpb_p + ((tb - 1).to(tl.int64) * U1 + lane), mask=fin, other=0.0)
        logz = _sum(tl.where(fin, alpha + e_fin, 0.0), 0)
        logz = tl.where(tb > 0, logz, tl.where(ub == 0, 0.0, float("-inf")))
        logz = tl.where(ok_v, logz, float("nan"))
        loss = -(logz * LN2) * lam1
        one = lane == 0
        tl.store(seq + (N_PLANES * P + SLOT_LOGZ) + lane * 0, tl.where(one, logz, 0.0),
                 mask=one)
        tl.store(seq + (N_PLANES * P + SLOT_OK) + lane * 0,
                 tl.where(one & ok_l, 1.0, 0.0), mask=one)
        if REDUCED:
            tl.store(seq + (N_PLANES * P + SLOT_LOSS) + lane * 0, tl.where(one, loss, 0.0),
                     mask=one)
        else:
            tl.store(out_ptr + b * sout + lane * 0, tl.where(one, loss, 0.0), mask=one)
    else:
        b_p = seq + PLANE_BETA * P
        top = tl.minimum(lane + 1, BLOCK - 1)
        t_fin = n_lev - 1 - lane
        fin = (lane == ub) & some
        beta = tl.where(fin, tl.load(lpb_p + t_fin * U1 + lane, mask=fin, other=0.0), neg)
        tl.store(b_p + t_fin * U1 + lane, beta, mask=fin)
        # emissions of level n_lev - 2, loaded ahead
        t1 = n_lev - 2 - lane
        c1 = (t1 >= 0) & (t1 < tb) & (lane <= ub)
        eb_n = tl.load(lpb_p + t1 * U1 + lane, mask=c1 & (t1 + 1 < tb), other=float("-inf"))
        ey_n = tl.load(lpy_p + t1 * U1 + lane, mask=c1 & (lane < ub), other=float("-inf"))
        for r in range(2, n_lev + 1):
            m = n_lev - r
            eb = eb_n
            ey = ey_n
            t2 = m - 1 - lane
            c2 = (t2 >= 0) & (t2 < tb) & (lane <= ub) & (zero + m >= 1)
            eb_n = tl.load(lpb_p + t2 * U1 + lane, mask=c2 & (t2 + 1 < tb),
                           other=float("-inf"))
            ey_n = tl.load(lpy_p + t2 * U1 + lane, mask=c2 & (lane < ub),
                           other=float("-inf"))
            t = m - lane
            cell = (t >= 0) & (t < tb) & (lane <= ub)
            # beta[t + 1, u]: this lane; beta[t, u + 1]: the lane above
            above = tl.gather(beta, top, 0)
            above = tl.where(lane + 1 < BLOCK, above, float("-inf"))
            beta = tl.where(cell, _lae2(beta + eb, above + ey), neg)
            tl.store(b_p + t * U1 + lane, beta, mask=cell)


@triton.jit(do_not_specialize=["W", "P", "N", "inv_n"])
def rnnt_reduce_kernel(work_ptr, W, P, N, out_ptr, inv_n, BLOCK: tl.constexpr):
    """``out[0] = inv_n * sum_b loss_b``, summed in float64 in a fixed order (one
    program: the same bits on every run)."""
    lane = tl.arange(0, BLOCK)
    inv_n = _f64(inv_n)
    acc = tl.full((BLOCK,), 0, tl.float64)
    for c in range(0, N, BLOCK):
        k = (c + lane).to(tl.int64)
        acc += tl.load(work_ptr + k * W + (N_PLANES * P + SLOT_LOSS), mask=k < N,
                       other=0.0).to(tl.float64)
    total = _sum(acc, 0) * inv_n
    tl.store(out_ptr + lane * 0, tl.where(lane == 0, total, 0.0), mask=lane == 0)


@triton.jit(do_not_specialize=["sx_b", "sx_t", "sx_u", "sg_b", "sg_t", "sg_u", "W", "P",
                                "sy_b", "sy_u", "s_cot", "cot_scale", "n_cells", "T", "U1",
                                "V", "blank", "lam1", "bound"])
def rnnt_grad_kernel(x_ptr, sx_b, sx_t, sx_u, g_ptr, sg_b, sg_t, sg_u, work_ptr, W, P,
                     y_ptr, sy_b, sy_u, il_ptr, tl_ptr, cot_ptr, s_cot, cot_scale,
                     n_cells, T, U1, V, blank, lam1, bound,
                     FUSED: tl.constexpr, CLAMP: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """``g = d (sum_b cot_b loss_b) / d x`` for ``ROWS`` cells per program (classes
    contiguous in ``x`` and ``g``; ``g`` in ``x``'s dtype); ``cot_b = cot[b * s_cot] *
    cot_scale``; ``CLAMP``: clamped to ``[-bound, bound]``."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    in_grid = rows < n_cells
    b, t, u = _cells(rows, T.to(tl.int64) * U1, U1)
    b = tl.where(in_grid, b, 0)
    cd = work_ptr.dtype.element_ty
    cot_scale = _f64(cot_scale).to(cd)
    lam1 = _f64(lam1).to(cd)
    bound = _f64(bound).to(cd)
    P = P.to(tl.int64)
    seq = work_ptr + b * W
    scal = seq + N_PLANES * P
    ok = tl.load(scal + (b * 0 + SLOT_OK), mask=in_grid, other=0.0) != 0.0
    tb = tl.load(il_ptr + b, mask=in_grid & ok, other=0)
    ub = tl.load(tl_ptr + b, mask=in_grid & ok, other=0)
    act = in_grid & ok & (t < tb) & (u <= ub)
    logz = tl.load(scal + (b * 0 + SLOT_LOGZ), mask=in_grid, other=0.0)
    cell = t * U1 + u
    alpha = tl.load(seq + (PLANE_ALPHA * P + cell), mask=act, other=float("-inf"))
    eb = tl.load(seq + (PLANE_LPB * P + cell), mask=act, other=float("-inf"))
    ey = tl.load(seq + (PLANE_LPY * P + cell), mask=act, other=float("-inf"))
    last = (t == tb - 1) & (u == ub)
    b_next = tl.load(seq + (PLANE_BETA * P + cell + U1), mask=act & (t + 1 < tb),
                     other=float("-inf"))
    b_next = tl.where(last, 0.0, b_next)
    b_up = tl.load(seq + (PLANE_BETA * P + cell + 1), mask=act & (u < ub),
                   other=float("-inf"))
    feas = act & (logz > float("-inf"))
    pb = tl.where(feas, tl.exp2(alpha + eb + b_next - logz), 0.0)
    py = tl.where(feas & (u < ub), tl.exp2(alpha + ey + b_up - logz), 0.0)
    cot = tl.load(cot_ptr + b * s_cot, mask=in_grid, other=0.0).to(cd) * cot_scale
    cb = cot * pb
    cy = (cot * lam1) * py
    coef = cb + cy
    lab = tl.load(y_ptr + b * sy_b + u * sy_u, mask=act & (u < ub), other=-1)
    lab = tl.where(act & (u < ub), lab, -1)
    if FUSED:
        lse2 = tl.load(seq + (PLANE_LSE * P + cell), mask=act, other=0.0)
    xrow = x_ptr + b * sx_b + t * sx_t + u * sx_u
    grow = g_ptr + b * sg_b + t * sg_t + u * sg_u
    v = tl.arange(0, BLOCK_V)
    bad = in_grid & ~ok
    for c in range(0, V.to(tl.int64), BLOCK_V):
        cols = c + v
        cm = (cols < V)[None, :]
        if FUSED:
            xv = tl.load(xrow[:, None] + cols[None, :], mask=act[:, None] & cm,
                         other=0.0).to(cd)
            sm = tl.exp2(xv * LOG2E - lse2[:, None])
            gv = tl.where(coef[:, None] == 0.0, 0.0, sm * coef[:, None])
        else:
            gv = tl.full((ROWS, BLOCK_V), 0, cd)
        gv = gv - tl.where(cols[None, :] == blank, cb[:, None], 0.0)
        gv = gv - tl.where(cols[None, :] == lab[:, None], cy[:, None], 0.0)
        if CLAMP:
            gv = tl.minimum(tl.maximum(gv, -bound, propagate_nan=tl.PropagateNan.ALL), bound,
                            propagate_nan=tl.PropagateNan.ALL)
        gv = tl.where(act[:, None], gv, 0.0)
        gv = tl.where(bad[:, None], float("nan"), gv)
        tl.store(grow[:, None] + cols[None, :], gv, mask=in_grid[:, None] & cm)
