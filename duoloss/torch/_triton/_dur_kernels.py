r"""Fused Triton kernels of the duration transducers' device path (``tdt_loss``,
``multiblank_rnnt_loss``): the logits read where they lie, as `_rnnt_kernels` does
for ``rnnt_loss``.

The lattice of `duoloss.core.losses.tdt`: from node ``(t, u)`` a label move of
duration ``d`` (duration logit ``i``, or none) to ``(t + d, u + 1)`` with weight
``lpy(t, u) + dlp_i(t, u)``, a blank move of symbol ``k`` and duration ``d`` to ``(t +
d, u)`` with weight ``lpb_k(t, u) + dlp_i(t, u)``; the moves are compile-time tables
(packed 12 bits per entry, `_entry`): label moves ``LAB_D``/``LAB_I`` (``L`` of them),
blank moves ``BLK_K``/``BLK_D``/``BLK_I`` (``J``); a duration index ``4095`` means none.

* `dur_norm_kernel` -- per cell, one pass over the ``V`` token logits (online max and
  sum of ``2^x``) and the ``D`` duration logits: the label's and each blank symbol's
  token log-probabilities minus ``sigma`` and the duration log-probabilities (base 2),
  and both normalisers for the gradient.
* `dur_alpha_beta_kernel` -- one program per sequence and side (alpha, beta run
  concurrently), a loop over frames, the states ``u`` of a frame in one block and a
  frame's moves as ``(moves, BLOCK)`` tiles; the rows of earlier (later) frames are
  read back from the workspace after a barrier, each frame's weights a frame ahead;
  duration-0 label moves chain within a frame as an associative scan (over reversed
  lanes for beta).  A move is read only from a source that holds mass and with a
  weight (`_lse_moves`): a cell no path reaches is never read, whatever its logits
  (NaN, ``+inf``), as on the host.  The program checks its sequence (lengths, labels in
  ``[0, V)`` and no blank symbol) and gives an invalid one a NaN loss.
* `dur_reduce_kernel` -- ``'sum'``/``'mean'`` of the losses in float64, in order.
* `dur_grad_kernel` -- the gradient w.r.t. the logits in one parallel pass (the
  backward, the cotangent folded in): the core's formula, ``softmax * (occ + lambda
  plab)`` minus the label (times ``1 + lambda``) and blank posteriors at their classes,
  clamped, then the duration columns ``softmax_dur * occ - pdur``; zero where no mass
  passes, NaN over a box whose ``log Z`` is NaN and over an invalid sequence.

The workspace ``(N, W)`` holds ``5 + NB + D`` planes of ``(T, U + 1)`` --
``lpy``, the ``NB`` blank symbols' ``lpb``, the ``D`` ``dlp``, the two normalisers
(token, duration) and ``alpha``/``beta`` in that order after them -- then ``log2 Z``,
the loss and a validity flag.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

#: Whether the kernels were defined under the Triton interpreter (CPU tensors).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

NONE = tl.constexpr(4095)


# the combine functions, reductions and base-2 log-add of the RNN-T kernels (one
# definition; Triton resolves them as this module's globals)
from ._rnnt_kernels import LN2, LOG2E, _add, _lae2, _max, _maxnum, _sum  # noqa: E402,F401


@triton.jit
def _chain(w1, a1, w2, a2):
    dead = (a1 == float("-inf")) | (w2 == float("-inf"))
    return w1 + w2, _lae2(a2, tl.where(dead, float("-inf"), a1 + w2))


@triton.jit
def _entry(PACKED: tl.constexpr, COUNT: tl.constexpr, m):
    """Entry ``m`` (a run-time index below ``COUNT``) of a table packed 12 bits per
    entry into ``PACKED`` (48-bit chunks as 64-bit immediates)."""
    k = tl.full((), 0, tl.int64) + m
    d = tl.full((), 0, tl.int64)
    for c in tl.static_range((COUNT + 3) // 4):
        part = tl.full((), (PACKED >> (48 * c)) & 0xFFFFFFFFFFFF, tl.int64)
        d = tl.where(k // 4 == c, (part >> (12 * (k & 3))) & 4095, d)
    return d.to(tl.int32)


@triton.jit
def _f64(bits):
    """A float argument passed as the int64 bits of a float64 (`duoloss.torch._triton.
    _rnnt_ops.f64_bits`): Triton types a Python float argument as float32, which
    would round ``sigma``, ``1 / N`` or a clamp bound in float64 kernels."""
    return bits.to(tl.int64).to(tl.float64, bitcast=True)


@triton.jit(do_not_specialize=["sx_b", "sx_t", "sx_u", "sy_b", "sy_u", "W", "P", "n_cells",
                                "T", "U1", "NLAB", "sigma", "blank"])
def dur_norm_kernel(x_ptr, sx_b, sx_t, sx_u, y_ptr, sy_b, sy_u, il_ptr, tl_ptr,
                    work_ptr, W, P, n_cells, T, U1, NLAB, sigma, blank,
                    NB: tl.constexpr, D: tl.constexpr,
                    ROWS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """Planes ``lpy``, ``lpb_0..NB-1`` (symbols ``blank - k``), ``dlp_0..D-1``,
    ``lse_tok``, ``lse_dur`` of ``ROWS`` cells per program (base 2)."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    in_grid = rows < n_cells
    tu1 = T.to(tl.int64) * U1
    b = rows // tu1
    rem = rows - b * tu1
    t = rem // U1
    u = rem - t * U1
    b = tl.where(in_grid, b, 0)
    tb = tl.load(il_ptr + b, mask=in_grid, other=0)
    ub = tl.load(tl_ptr + b, mask=in_grid, other=0)
    act = in_grid & (t < tb) & (u <= ub)
    cd = work_ptr.dtype.element_ty
    sigma = _f64(sigma).to(cd)
    xrow = x_ptr + b * sx_b + t * sx_t + u * sx_u
    v = tl.arange(0, BLOCK_V)
    m = tl.full((ROWS,), float("-inf"), cd)
    s = tl.full((ROWS,), 0, cd)
    for c in range(0, NLAB.to(tl.int64), BLOCK_V):
        cols = c + v
        xv = tl.load(xrow[:, None] + cols[None, :], mask=act[:, None] & (cols < NLAB)[None, :],
                     other=float("-inf")).to(cd)
        nm = tl.maximum(m, _max(xv, 1), propagate_nan=tl.PropagateNan.ALL)
        nms = tl.where(nm == float("-inf"), 0.0, nm)
        s = s * tl.exp2((m - nms) * LOG2E) + _sum(tl.exp2((xv - nms[:, None]) * LOG2E), 1)
        m = nm
    ms = tl.where(m == float("-inf"), 0.0, m)
    lse = ms * LOG2E + tl.log2(s)
    P = P.to(tl.int64)
    seq = work_ptr + b * W
    cell = t * U1 + u
    sig2 = sigma * LOG2E
    lab = tl.load(y_ptr + b * sy_b + u * sy_u, mask=act & (u < ub), other=0)
    lab = tl.where((lab >= 0) & (lab < NLAB), lab, 0).to(tl.int64)
    xy = tl.load(xrow + lab, mask=act & (u < ub), other=float("-inf")).to(cd)
    lpy = tl.where(lse == float("-inf"), float("-inf"), xy * LOG2E - lse) - sig2
    tl.store(seq + cell, tl.where(act & (u < ub), lpy, float("-inf")), mask=in_grid)
    for k in tl.static_range(NB):
        xk = tl.load(xrow + (blank - k).to(tl.int64), mask=act, other=float("-inf")).to(cd)
        lpk = tl.where(lse == float("-inf"), float("-inf"), xk * LOG2E - lse) - sig2
        tl.store(seq + ((1 + k) * P + cell), tl.where(act, lpk, float("-inf")), mask=in_grid)
    tl.store(seq + ((1 + NB + D) * P + cell), lse, mask=in_grid)
    if D > 0:
        j = tl.arange(0, BLOCK_D)
        dm = act[:, None] & (j < D)[None, :]
        xd = tl.load(xrow[:, None] + (NLAB + j)[None, :], mask=dm,
                     other=float("-inf")).to(cd)
        md = _max(xd, 1)
        mds = tl.where(md == float("-inf"), 0.0, md)
        lsed = mds * LOG2E + tl.log2(_sum(tl.exp2((xd - mds[:, None]) * LOG2E), 1))
        dlp = tl.where(lsed[:, None] == float("-inf"), float("-inf"),
                       xd * LOG2E - lsed[:, None])
        tl.store(seq[:, None] + ((1 + NB + j)[None, :] * P + cell[:, None]),
                 tl.where(dm, dlp, float("-inf")), mask=in_grid[:, None] & (j < D)[None, :])
        tl.store(seq + ((2 + NB + D) * P + cell), lsed, mask=in_grid)


@triton.jit
def _w(seq, P, off, k_plane, i_dur, NB: tl.constexpr, mask):
    """A move's weight at cells ``off``: plane ``k_plane`` (``lpy`` 0, ``lpb_k`` 1 +
    k) plus the duration plane ``i_dur`` (``NONE``: no duration logit)."""
    w = tl.load(seq + (k_plane * P + off), mask=mask, other=float("-inf"))
    has = (off * 0 + i_dur) != NONE   # (a vector: scalar masks trip the interpreter)
    dw = tl.load(seq + ((1 + NB + i_dur) * P + off), mask=mask & has, other=0.0)
    return tl.where(w == float("-inf"), w, w + dw)


@triton.jit
def _move_table(LAB_D: tl.constexpr, LAB_I: tl.constexpr, L: tl.constexpr,
                BLK_K: tl.constexpr, BLK_D: tl.constexpr, BLK_I: tl.constexpr,
                J: tl.constexpr, NB: tl.constexpr, MC: tl.constexpr, c0):
    """Moves ``c0 .. c0 + MC - 1`` of the list ``L`` label moves of duration ``> 0``
    then ``J`` blank moves, as ``(MC,)`` vectors: ``(used, is_label, duration, weight
    plane, duration plane or -1)``."""
    m = c0 + tl.arange(0, MC)
    lab = m < L
    ml = tl.where(lab, m, 0)
    mj = tl.where(lab, 0, m - L)
    d = tl.where(lab, _entry(LAB_D, L, ml), _entry(BLK_D, J, mj))
    di = tl.where(lab, _entry(LAB_I, L, ml), _entry(BLK_I, J, mj))
    plane = tl.where(lab, 0, 1 + _entry(BLK_K, J, mj))
    dplane = tl.where(di == NONE, -1, 1 + NB + di)
    return m < L + J, lab, d, plane, dplane


@triton.jit
def _tile_w(seq, P, cells, plane, dplane, mask):
    """The ``(MB, BLOCK)`` move weights at ``cells``: token plane plus duration plane
    (none where ``dplane < 0``), ``-inf`` off ``mask``."""
    cells = tl.where(mask, cells, 0)
    w = tl.load(seq + (plane[:, None] * P + cells), mask=mask, other=float("-inf"))
    has = mask & (dplane >= 0)[:, None]
    dw = tl.load(seq + (tl.maximum(dplane, 0)[:, None] * P + cells), mask=has, other=0.0)
    return tl.where(w == float("-inf"), w, w + dw)


@triton.jit
def _lse_moves(src, w):
    """``log2 sum_m 2^(src + w)`` over the moves (axis 0), a term read only where its
    source holds mass and its weight is above ``-inf``; NaN propagates."""
    dead = (src == float("-inf")) | (w == float("-inf"))
    terms = tl.where(dead, float("-inf"), src + w)
    mx = _max(terms, 0)
    mxs = tl.where((mx == float("-inf")) | (mx == float("inf")), 0.0, mx)
    return mxs + tl.log2(_sum(tl.exp2(terms - mxs[None, :]), 0))


@triton.jit
def _alpha_sources(t, lane, live, used, is_lab, d, U1):
    """``(cells, ok)``: the source cells ``(t - d, u - is_label)`` of frame ``t``'s moves
    of one tile, and where they lie in the lattice."""
    src_u = lane[None, :] - is_lab[:, None].to(tl.int32)
    src_t = t - d[:, None]
    ok = used[:, None] & live[None, :] & (src_u >= 0) & (src_t >= 0)
    return src_t * U1 + src_u, ok


@triton.jit
def _beta_weighted(used, is_lab, live_r, r, ub):
    """Where a move out of state ``r`` has a weight: every live state for a blank, below
    ``U_b`` for a label."""
    return used[:, None] & live_r[None, :] & (~is_lab[:, None] | (r < ub)[None, :])


@triton.jit
def _alpha_tile(a, a_seq, seq, P, U1, t, lane, live, used, is_lab, d, plane, dplane,
                w_pre, PRE: tl.constexpr):
    """``a`` log-added with frame ``t``'s moves of one tile: sources ``(t - d, u -
    is_label)`` read from the alpha plane, weights ``w_pre`` (``PRE``) or loaded."""
    cells, ok = _alpha_sources(t, lane, live, used, is_lab, d, U1)
    if PRE:
        w = w_pre
    else:
        w = _tile_w(seq, P, cells, plane, dplane, ok)
    src = tl.load(a_seq + tl.where(ok, cells, 0), mask=ok, other=float("-inf"))
    return _lae2(a, _lse_moves(src, w))


@triton.jit
def _beta_tile(bt, b_seq, seq, P, U1, t, tb, row, r, ub, live_r, used, is_lab, d, plane,
               dplane, w_pre, PRE: tl.constexpr):
    """``bt`` log-added with the moves of one tile out of ``(t, r)``: sources ``(t + d, r
    + is_label)`` read from the beta plane, weights at the cell (``w_pre`` with
    ``PRE``); a blank move landing exactly on ``T_b`` from row ``U_b`` ends a path."""
    w_ok = _beta_weighted(used, is_lab, live_r, r, ub)
    if PRE:
        w = w_pre
    else:
        w = _tile_w(seq, P, row[None, :] + d[:, None] * 0, plane, dplane, w_ok)
    tgt_t = d[:, None] + t
    src_ok = w_ok & (tgt_t < tb)
    cells = row[None, :] + d[:, None] * U1 + is_lab[:, None].to(tl.int32)
    src = tl.load(b_seq + tl.where(src_ok, cells, 0), mask=src_ok, other=float("-inf"))
    term = w_ok & ~is_lab[:, None] & (tgt_t == tb) & (r == ub)[None, :]
    return _lae2(bt, _lse_moves(tl.where(term, 0.0, src), w))


@triton.jit(do_not_specialize=["W", "P", "sy_b", "sy_u", "T", "U", "NLAB", "blank", "lam1",
                                "sout"])
def dur_alpha_beta_kernel(work_ptr, W, P, y_ptr, sy_b, sy_u, il_ptr, tl_ptr, T, U, NLAB,
                          blank, lam1, out_ptr, sout,
                          LAB_D: tl.constexpr, LAB_I: tl.constexpr, L: tl.constexpr,
                          BLK_K: tl.constexpr, BLK_D: tl.constexpr, BLK_I: tl.constexpr,
                          J: tl.constexpr, NB: tl.constexpr, D: tl.constexpr,
                          ZERO_I: tl.constexpr, HAS_ZERO: tl.constexpr,
                          REDUCED: tl.constexpr, BLOCK: tl.constexpr, MB: tl.constexpr,
                          MC: tl.constexpr, PREFETCH: tl.constexpr, UNROLL: tl.constexpr):
    """Alpha (``program_id(1) == 0``; also ``log2 Z``, the loss, the flag) or beta of
    sequence ``program_id(0)``.  ``LAB_*``: the ``L`` label moves of duration ``> 0``;
    ``HAS_ZERO``: a duration-0 label move (duration logit ``ZERO_I``); ``MB``: a power
    of two ``>= L + J``; ``MC``: the moves per tile (a power of two dividing ``MB``);
    ``PREFETCH`` (only with ``MC == MB``): each frame's weights loaded a frame ahead;
    ``UNROLL``: the tiles of a frame unrolled (all their loads in flight together)
    rather than a loop (fewer live registers)."""
    b = tl.program_id(0).to(tl.int64)
    side = tl.program_id(1)
    U1 = U + 1
    P = P.to(tl.int64)
    tb = tl.load(il_ptr + b).to(tl.int32)
    ub = tl.load(tl_ptr + b).to(tl.int32)
    lane = tl.arange(0, BLOCK)
    lam1 = _f64(lam1)
    zero = lane * 0
    nbad = tl.full((BLOCK,), 0, tl.int32)
    ub_c = tl.minimum(tl.maximum(ub, 0), U)
    for c in range(0, U, BLOCK):
        k = c + lane
        km = k < ub_c
        lab = tl.load(y_ptr + b * sy_b + k * sy_u, mask=km, other=0)
        badk = (lab < 0) | (lab >= NLAB)
        for q in tl.static_range(NB):
            badk = badk | (lab == blank - q)
        nbad += (km & badk).to(tl.int32)
    ok_v = (_sum(nbad, 0) == 0) & (tb >= 0) & (tb <= T) & (ub >= 0) & (ub <= U)
    tb = tl.where(ok_v, tb, 0)
    ub = tl.where(ok_v, ub, 0)
    seq = work_ptr + b * W
    cd = work_ptr.dtype.element_ty
    neg = tl.full((BLOCK,), float("-inf"), cd)
    live = lane <= ub
    a_seq = seq + (3 + NB + D) * P
    b_seq = seq + (4 + NB + D) * P
    if side == 0:
        # frame t's moves as (MC, BLOCK) tiles, MC moves at a time: source cells
        # (t - d, u - is_label) and their weights (with PREFETCH, MC = MB: loaded a
        # frame ahead, before the barrier that publishes the previous frame's row),
        # the sources' alpha read after the barrier, one log-sum-exp per lane
        if PREFETCH:
            used, is_lab, d, plane, dplane = _move_table(LAB_D, LAB_I, L, BLK_K, BLK_D,
                                                         BLK_I, J, NB, MB, 0)
            cells, ok = _alpha_sources(0, lane, live, used, is_lab, d, U1)
            w_nx = _tile_w(seq, P, cells, plane, dplane, ok)
        if HAS_ZERO:
            w0_nx = _w(seq, P, lane - 1, 0, ZERO_I, NB, live & (lane >= 1) & ((zero + tb) > 0))
        for t in range(0, tb):
            if PREFETCH:
                w_mv = w_nx
                cells, ok = _alpha_sources(t + 1, lane, live, used, is_lab, d, U1)
                w_nx = _tile_w(seq, P, cells, plane, dplane,
                               ok & ((zero + t + 1) < tb)[None, :])
            if HAS_ZERO:
                w0 = w0_nx
                w0_nx = _w(seq, P, (t + 1) * U1 + lane - 1, 0, ZERO_I, NB,
                           live & (lane >= 1) & ((zero + t + 1) < tb))
            tl.debug_barrier()
            a = tl.where((lane == 0) & (zero + t == 0), 0.0, neg)
            if PREFETCH:
                a = _alpha_tile(a, a_seq, seq, P, U1, t, lane, live, used, is_lab, d, plane,
                                dplane, w_mv, True)
            elif UNROLL:
                for c0 in tl.static_range(0, MB, MC):
                    used, is_lab, d, plane, dplane = _move_table(
                        LAB_D, LAB_I, L, BLK_K, BLK_D, BLK_I, J, NB, MC, c0)
                    a = _alpha_tile(a, a_seq, seq, P, U1, t, lane, live, used, is_lab, d,
                                    plane, dplane, a, False)
            else:
                for c0 in range(0, MB, MC):
                    used, is_lab, d, plane, dplane = _move_table(
                        LAB_D, LAB_I, L, BLK_K, BLK_D, BLK_I, J, NB, MC, c0)
                    a = _alpha_tile(a, a_seq, seq, P, U1, t, lane, live, used, is_lab, d,
                                    plane, dplane, a, False)
            if HAS_ZERO:
                _, a = tl.associative_scan((w0, a), 0, _chain)
            tl.store(a_seq + (t * U1 + lane), a, mask=live)
        tl.debug_barrier()
        # log Z: the last blank, landing exactly on T_b from row U_b
        fin = (lane == ub) & ((zero + tb) > 0)
        acc = neg
        for c0 in tl.static_range(0, MB, MC):
            used, is_lab, d, plane, dplane = _move_table(LAB_D, LAB_I, L, BLK_K, BLK_D,
                                                         BLK_I, J, NB, MC, c0)
            okf = ((~is_lab & used)[:, None] & fin[None, :]
                   & ((zero[None, :] + tb - d[:, None]) >= 0))
            cells = (tb - d[:, None]) * U1 + lane[None, :]
            src = tl.load(a_seq + tl.where(okf, cells, 0), mask=okf, other=float("-inf"))
            acc = _lae2(acc, _lse_moves(src, _tile_w(seq, P, cells, plane, dplane, okf)))
        logz = _sum(tl.where(fin, acc, 0.0), 0)
        logz = tl.where(tb > 0, logz, tl.where(ub == 0, 0.0, float("-inf")))
        logz = tl.where(ok_v, logz, float("nan"))
        loss = -(logz * LN2) * lam1
        one = lane == 0
        sc = seq + (5 + NB + D) * P
        tl.store(sc + zero, tl.where(one, logz, 0.0), mask=one)
        okl = (zero + ok_v.to(tl.int32)) != 0
        tl.store(sc + (zero + 2), tl.where(one & okl, 1.0, 0.0), mask=one)
        if REDUCED:
            tl.store(sc + (zero + 1), tl.where(one, loss, 0.0), mask=one)
        else:
            tl.store(out_ptr + b * sout + zero, tl.where(one, loss, 0.0), mask=one)
    else:
        r = U1 - 1 - lane     # lane k holds state r (the chain scans over reversed lanes)
        live_r = (r >= 0) & (r <= ub)
        # frame t's moves out of (t, r): weights at the cell itself (with PREFETCH
        # loaded a frame ahead), sources (t + d, r + is_label) read after the barrier;
        # a blank move landing exactly on T_b from row U_b ends a path (its weight alone)
        t_nx = tb - 1
        if PREFETCH:
            used, is_lab, d, plane, dplane = _move_table(LAB_D, LAB_I, L, BLK_K, BLK_D,
                                                         BLK_I, J, NB, MB, 0)
            w_ok = _beta_weighted(used, is_lab, live_r, r, ub)
            w_nx = _tile_w(seq, P, zero[None, :] + (t_nx * U1 + r)[None, :], plane, dplane,
                           w_ok & ((zero[None, :] + t_nx) >= 0))
        if HAS_ZERO:
            m0 = live_r & (r < ub) & (lane >= 1)
            w0_nx = _w(seq, P, tl.where(t_nx >= 0, t_nx * U1 + r, 0), 0, ZERO_I, NB,
                       m0 & ((zero + t_nx) >= 0))
        for i in range(0, tb):
            t = tb - 1 - i
            row = t * U1 + r
            nrow = row - U1
            if PREFETCH:
                w_mv = w_nx
                w_nx = _tile_w(seq, P, zero[None, :] + nrow[None, :], plane, dplane,
                               w_ok & ((zero[None, :] + t - 1) >= 0))
            if HAS_ZERO:
                w0 = w0_nx
                w0_nx = _w(seq, P, tl.where(t >= 1, nrow, 0), 0, ZERO_I, NB,
                           m0 & ((zero + t - 1) >= 0))
            tl.debug_barrier()
            bt = neg
            if PREFETCH:
                bt = _beta_tile(bt, b_seq, seq, P, U1, t, tb, row, r, ub, live_r, used,
                                is_lab, d, plane, dplane, w_mv, True)
            elif UNROLL:
                for c0 in tl.static_range(0, MB, MC):
                    used, is_lab, d, plane, dplane = _move_table(
                        LAB_D, LAB_I, L, BLK_K, BLK_D, BLK_I, J, NB, MC, c0)
                    bt = _beta_tile(bt, b_seq, seq, P, U1, t, tb, row, r, ub, live_r, used,
                                    is_lab, d, plane, dplane, bt, False)
            else:
                for c0 in range(0, MB, MC):
                    used, is_lab, d, plane, dplane = _move_table(
                        LAB_D, LAB_I, L, BLK_K, BLK_D, BLK_I, J, NB, MC, c0)
                    bt = _beta_tile(bt, b_seq, seq, P, U1, t, tb, row, r, ub, live_r, used,
                                    is_lab, d, plane, dplane, bt, False)
            if HAS_ZERO:
                _, bt = tl.associative_scan((w0, bt), 0, _chain)
            tl.store(b_seq + row, bt, mask=live_r)


@triton.jit(do_not_specialize=["W", "off", "N", "inv_n"])
def dur_reduce_kernel(work_ptr, W, off, N, out_ptr, inv_n, BLOCK: tl.constexpr):
    """``out[0] = inv_n * sum_b work[b, off]`` in float64, in order (one program)."""
    lane = tl.arange(0, BLOCK)
    inv_n = _f64(inv_n)
    acc = tl.full((BLOCK,), 0, tl.float64)
    for c in range(0, N, BLOCK):
        k = (c + lane).to(tl.int64)
        acc += tl.load(work_ptr + k * W + off, mask=k < N, other=0.0).to(tl.float64)
    total = _sum(acc, 0) * inv_n
    tl.store(out_ptr + lane * 0, tl.where(lane == 0, total, 0.0), mask=lane == 0)


@triton.jit
def _lab_post(seq, P, b_seq, cell, alpha, zl, okm, d, di, U1, NB: tl.constexpr):
    """The posterior of a label move of duration ``d`` out of ``cell``."""
    w = _w(seq, P, cell, 0, di, NB, okm)
    bd = tl.load(b_seq + (cell + d * U1 + 1), mask=okm, other=float("-inf"))
    dead = (alpha == float("-inf")) | (w == float("-inf")) | (bd == float("-inf"))
    return tl.where(dead | ~okm, 0.0, tl.exp2(alpha + w + bd - zl))


@triton.jit
def _lab_move(seq, P, b_seq, cell, alpha, zl, act, t, u, tb, ub, plab, pdur, j, U1,
              LAB_D: tl.constexpr, LAB_I: tl.constexpr, L: tl.constexpr, NB: tl.constexpr,
              mv):
    """`dur_grad_kernel`'s sums with label move ``mv``'s posterior added."""
    d = _entry(LAB_D, L, mv)
    di = _entry(LAB_I, L, mv)
    p = _lab_post(seq, P, b_seq, cell, alpha, zl, act & (u < ub) & (t + d < tb), d, di,
                  U1, NB)
    return plab + p, pdur + tl.where(j[None, :] == di, p[:, None], 0.0)


@triton.jit
def _blk_move(seq, P, b_seq, cell, alpha, zl, act, t, u, tb, ub, occ, pdur, pk_all, j, U1,
              BLK_K: tl.constexpr, BLK_D: tl.constexpr, BLK_I: tl.constexpr,
              J: tl.constexpr, NB: tl.constexpr, mv):
    """`dur_grad_kernel`'s sums with blank move ``mv``'s posterior added (a move that
    lands exactly on ``T_b`` from row ``U_b`` ends a path: its weight alone)."""
    d = _entry(BLK_D, J, mv)
    kk = _entry(BLK_K, J, mv)
    di = _entry(BLK_I, J, mv)
    w = _w(seq, P, cell, 1 + kk, di, NB, act)
    okn = act & (t + d < tb)
    bd = tl.load(b_seq + (cell + d * U1), mask=okn, other=float("-inf"))
    dead = (alpha == float("-inf")) | (w == float("-inf")) | (bd == float("-inf"))
    p = tl.where(dead | ~okn, 0.0, tl.exp2(alpha + w + bd - zl))
    term = act & (u == ub) & (t + d == tb)
    dead_t = (alpha == float("-inf")) | (w == float("-inf"))
    p += tl.where(dead_t | ~term, 0.0, tl.exp2(alpha + w - zl))
    return (occ + p, pdur + tl.where(j[None, :] == di, p[:, None], 0.0),
            pk_all + tl.where(j[None, :] == kk, p[:, None], 0.0))


@triton.jit(do_not_specialize=["sx_b", "sx_t", "sx_u", "sg_b", "sg_t", "sg_u", "W", "P",
                                "sy_b", "sy_u", "s_cot", "cot_scale", "n_cells", "T", "U1",
                                "NLAB", "blank", "lam", "clamp"])
def dur_grad_kernel(x_ptr, sx_b, sx_t, sx_u, g_ptr, sg_b, sg_t, sg_u, work_ptr, W, P,
                    y_ptr, sy_b, sy_u, il_ptr, tl_ptr, cot_ptr, s_cot, cot_scale,
                    n_cells, T, U1, NLAB, blank, lam, clamp,
                    LAB_D: tl.constexpr, LAB_I: tl.constexpr, L: tl.constexpr,
                    BLK_K: tl.constexpr, BLK_D: tl.constexpr, BLK_I: tl.constexpr,
                    J: tl.constexpr, NB: tl.constexpr, D: tl.constexpr,
                    ZERO_I: tl.constexpr, HAS_ZERO: tl.constexpr, DUR_GRAD: tl.constexpr,
                    DC: tl.constexpr, CLAMP: tl.constexpr, ROWS: tl.constexpr,
                    BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, UNROLL: tl.constexpr):
    """The gradient rows of ``ROWS`` cells (token columns ``[0, NLAB)``, then the ``DC``
    duration columns: ``D = DC`` planes with ``DUR_GRAD``, else zeros), times
    ``cot[b * s_cot] * cot_scale``."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    in_grid = rows < n_cells
    tu1 = T.to(tl.int64) * U1
    b = rows // tu1
    rem = rows - b * tu1
    t = rem // U1
    u = rem - t * U1
    b = tl.where(in_grid, b, 0)
    cd = work_ptr.dtype.element_ty
    cot_scale = _f64(cot_scale).to(cd)
    lam = _f64(lam).to(cd)
    clamp = _f64(clamp).to(cd)
    P = P.to(tl.int64)
    seq = work_ptr + b * W
    sc = seq + (5 + NB + D) * P
    ok = tl.load(sc + 2, mask=in_grid, other=0.0) != 0.0
    logz = tl.load(sc, mask=in_grid, other=0.0)
    tb = tl.load(il_ptr + b, mask=in_grid & ok, other=0)
    ub = tl.load(tl_ptr + b, mask=in_grid & ok, other=0)
    act = in_grid & ok & (t < tb) & (u <= ub)
    use = ok & (tb > 0) & (logz > float("-inf")) & (logz < float("inf"))
    zl = tl.where(use, logz, 0.0)
    cell = t * U1 + u
    a_seq = seq + (3 + NB + D) * P
    b_seq = seq + (4 + NB + D) * P
    alpha = tl.load(a_seq + cell, mask=act, other=float("-inf"))
    plab = tl.full((ROWS,), 0, cd)
    occ = tl.full((ROWS,), 0, cd)
    j = tl.arange(0, BLOCK_D)
    pdur = tl.full((ROWS, BLOCK_D), 0, cd)
    # the move loops unrolled (``UNROLL``: every move's loads in flight together) or
    # at run time (one move's values live at a time: 8 durations unrolled spilled in
    # float64)
    if UNROLL:
        for mv in tl.static_range(L):
            plab, pdur = _lab_move(seq, P, b_seq, cell, alpha, zl, act, t, u, tb, ub, plab,
                                   pdur, j, U1, LAB_D, LAB_I, L, NB, mv)
    else:
        for mv in range(L):
            plab, pdur = _lab_move(seq, P, b_seq, cell, alpha, zl, act, t, u, tb, ub, plab,
                                   pdur, j, U1, LAB_D, LAB_I, L, NB, mv)
    if HAS_ZERO:
        p = _lab_post(seq, P, b_seq, cell, alpha, zl, act & (u < ub), 0, ZERO_I, U1, NB)
        plab += p
        pdur += tl.where(j[None, :] == ZERO_I, p[:, None], 0.0)
    v = tl.arange(0, BLOCK_V)
    xrow = x_ptr + b * sx_b + t * sx_t + u * sx_u
    grow = g_ptr + b * sg_b + t * sg_t + u * sg_u
    # the blank symbols' posteriors, per symbol (a blank symbol k is class blank - k)
    pk_all = tl.full((ROWS, BLOCK_D), 0, cd)   # (unused columns stay 0)
    if UNROLL:
        for mv in tl.static_range(J):
            occ, pdur, pk_all = _blk_move(seq, P, b_seq, cell, alpha, zl, act, t, u, tb, ub,
                                          occ, pdur, pk_all, j, U1, BLK_K, BLK_D, BLK_I, J,
                                          NB, mv)
    else:
        for mv in range(J):
            occ, pdur, pk_all = _blk_move(seq, P, b_seq, cell, alpha, zl, act, t, u, tb, ub,
                                          occ, pdur, pk_all, j, U1, BLK_K, BLK_D, BLK_I, J,
                                          NB, mv)
    occ += plab
    cot = tl.load(cot_ptr + b * s_cot, mask=in_grid, other=0.0).to(cd) * cot_scale
    keep = act & use & (occ != 0.0)
    nanbox = act & ok & (logz != logz)
    bad = in_grid & ~ok
    lse = tl.load(seq + ((1 + NB + D) * P + cell), mask=act, other=0.0)
    lab = tl.load(y_ptr + b * sy_b + u * sy_u, mask=act & (u < ub), other=-1)
    lab = tl.where(act & (u < ub), lab, -1)
    coef = occ + lam * plab
    for c in range(0, NLAB.to(tl.int64), BLOCK_V):
        cols = c + v
        cm = (cols < NLAB)[None, :]
        xv = tl.load(xrow[:, None] + cols[None, :], mask=keep[:, None] & cm, other=0.0).to(cd)
        gv = tl.exp2(xv * LOG2E - lse[:, None]) * coef[:, None]
        gv = gv - tl.where(cols[None, :] == lab[:, None], ((1.0 + lam) * plab)[:, None], 0.0)
        for q in tl.static_range(NB):
            pq = _sum(tl.where(j[None, :] == q, pk_all, 0.0), 1)
            gv = gv - tl.where(cols[None, :] == blank - q, pq[:, None], 0.0)
        if CLAMP:
            gv = tl.minimum(tl.maximum(gv, -clamp, propagate_nan=tl.PropagateNan.ALL), clamp,
                            propagate_nan=tl.PropagateNan.ALL)
        gv = tl.where(keep[:, None], gv * cot[:, None], 0.0)
        gv = tl.where(nanbox[:, None] | bad[:, None], float("nan"), gv)
        tl.store(grow[:, None] + cols[None, :], gv, mask=in_grid[:, None] & cm)
    if DC > 0:
        dm = (j < DC)[None, :]
        if DUR_GRAD:
            lsed = tl.load(seq + ((2 + NB + D) * P + cell), mask=act, other=0.0)
            xd = tl.load(xrow[:, None] + (NLAB + j)[None, :], mask=keep[:, None] & dm,
                         other=0.0).to(cd)
            gd = tl.exp2(xd * LOG2E - lsed[:, None]) * occ[:, None] - pdur
            gd = tl.where(keep[:, None], gd * cot[:, None], 0.0)
        else:
            gd = tl.full((ROWS, BLOCK_D), 0, cd)
        gd = tl.where(nanbox[:, None] | bad[:, None], float("nan"), gd)
        tl.store(grow[:, None] + (NLAB + j)[None, :], gd, mask=in_grid[:, None] & dm)
