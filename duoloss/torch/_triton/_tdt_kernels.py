r"""Triton kernel of the torch device path for the duration transducers (TDT,
multi-blank RNN-T and TDT's ``omega`` RNN-T): the forward and backward
variables over the ``(T, U + 1)`` lattice, one program per sequence.

The move weights are formed beforehand in torch operations
(`duoloss.torch._triton._tdt`, the maths of `duoloss.jax._xla.tdt`):
label moves of duration ``d > 0`` ``lab[m]`` (``d = lab_d[m]``), blank moves
``blk[j]`` (``d = blk_d[j]``), the duration-0 label move ``w0`` and the
terminal weights ``term``, all ``(N, T, U + 1)`` and ``-inf`` on every move
that leaves the sequence's box.  For ``t < T_b`` (loop over frames, the states
``u`` of a frame in one block):

.. math::

    a_t(u) = \log\Big(\sum_{m} e^{\alpha_{t-d_m}(u-1) + lab_m(t-d_m, u-1)}
             + \sum_{j} e^{\alpha_{t-d_j}(u) + blk_j(t-d_j, u)}\Big), \qquad
    \alpha_t(u) = \log\big(e^{a_t(u)} + e^{\alpha_t(u-1) + w_0(t, u-1)}\big),

the within-frame chain of duration-0 label moves as a log-space associative
scan over ``u`` (elements ``(w, a)`` composing as ``(w_1 + w_2, lse(a_2, a_1 +
w_2))``); $\beta$ is the mirror recursion (frames backwards, the chain scanned
over reversed lanes).  ``alpha``/``beta`` (``(N, T, U + 1)``, ``-inf`` on
entry) receive the tables; rows ``t >= T_b`` are never written.

Imported only on the first device call; with ``TRITON_INTERPRET=1`` set
*before* its import the kernel runs on CPU tensors (how the tests exercise it).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

#: Whether the kernel was defined under the Triton interpreter (CPU tensors).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _lse2(a, b):
    """``log(exp(a) + exp(b))``: ``-inf`` for two ``-inf`` (never NaN), NaN in, NaN out."""
    m = tl.maximum(a, b)
    ms = tl.where(m == float("-inf"), 0.0, m)
    return ms + tl.log(tl.exp(a - ms) + tl.exp(b - ms))


@triton.jit
def _chain_combine(w1, a1, w2, a2):
    # a chain link out of a state without mass (or with a -inf weight) is never read
    dead = (a1 == float("-inf")) | (w2 == float("-inf"))
    return w1 + w2, _lse2(a2, tl.where(dead, float("-inf"), a1 + w2))


@triton.jit
def _move(a, src, w):
    """``a`` log-added with ``src + w``, a move read only from a source that holds
    mass (``src > -inf``) and with a weight (``w > -inf``): a cell no path reaches
    (or leaves) is never read, whatever its logits (NaN, ``+inf``)."""
    dead = (src == float("-inf")) | (w == float("-inf"))
    return _lse2(a, tl.where(dead, float("-inf"), src + w))


@triton.jit
def _dur(PACKED: tl.constexpr, MOVES: tl.constexpr, m):
    """Duration of move ``m`` (a run-time index below ``MOVES``) packed 12 bits each
    in ``PACKED``: 48-bit chunks of the constant (four durations each) as 64-bit
    immediates, the one holding move ``m`` selected."""
    k = tl.full((), 0, tl.int64) + m
    d = tl.full((), 0, tl.int64)
    for c in tl.static_range((MOVES + 3) // 4):
        part = tl.full((), (PACKED >> (48 * c)) & 0xFFFFFFFFFFFF, tl.int64)
        d = tl.where(k // 4 == c, (part >> (12 * (k & 3))) & 4095, d)
    return d.to(tl.int32)


@triton.jit(do_not_specialize=["N", "T_MAX", "U1"])
def tdt_kernel(lab_ptr, blk_ptr, w0_ptr, term_ptr, il_ptr,
               alpha_ptr, beta_ptr, N, T_MAX, U1,
               LAB_D: tl.constexpr, L: tl.constexpr, BLK_D: tl.constexpr, J: tl.constexpr,
               HAS_ZERO: tl.constexpr, WANT_BETA: tl.constexpr, BLOCK: tl.constexpr):
    """Alpha (and with ``WANT_BETA`` beta) of sequence ``b = program_id(0)``; all
    tables contiguous, ``lab`` ``(L, N, T, U1)``, ``blk`` ``(J, N, T, U1)``,
    ``w0``/``term``/``alpha``/``beta`` ``(N, T, U1)``; ``il`` ``(N,)`` int32 in ``[0, T]``.

    The durations are compile-time constants (one variant per duration set, no
    table read from memory): label move ``m`` has duration ``(LAB_D >> 12 m) &
    4095``, blank move ``j`` ``(BLK_D >> 12 j) & 4095`` (`_dur`).  ``N``, ``T`` and
    ``U + 1`` are not specialised.

    Registers (measured with ``benchmarks/aot_table.py``, sm_80/sm_90): every
    table's per-sequence (and per-move) base is a 64-bit scalar (``b * T * U1``,
    ``m * N * T * U1``), so no tensor is limited to ``2**31`` elements; within a
    sequence the cell offsets are 32-bit vectors (``t * U1 + u``, below ``(T + 1) *
    U1``, which the launcher keeps below ``2**31``).  A 64-bit address affine in
    the frame let the compiler keep a 64-bit induction pointer per lane, move and
    table live across the frame loop (up to 244 bytes of spills at ``BLOCK =
    2048``).  The move loops run at run time (not unrolled: one move's values live
    at a time, whatever the number of durations; unrolled, 8 durations still
    spilled at ``BLOCK = 2048`` in float32)."""
    b = tl.program_id(0).to(tl.int64)
    t_b = tl.load(il_ptr + b)
    u = tl.arange(0, BLOCK)
    live = u < U1
    plane = T_MAX.to(tl.int64) * U1    # one (T, U1) table
    seq = b * plane
    move = N * plane                   # one move's (N, T, U1) table
    a_seq = alpha_ptr + seq
    w0_seq = w0_ptr + seq
    neg = tl.full((BLOCK,), float("-inf"), alpha_ptr.dtype.element_ty)
    for t in range(t_b):
        tl.debug_barrier()
        a = tl.where((u == 0) & ((u * 0 + t) == 0), 0.0, neg)
        for m in range(L):
            d_la = _dur(LAB_D, L, m)
            if t >= d_la:
                off = (t - d_la) * U1 - 1 + u
                ok = live & (u >= 1)
                a = _move(a, tl.load(a_seq + off, mask=ok, other=float("-inf")),
                          tl.load((lab_ptr + (m * move + seq)) + off, mask=ok,
                                  other=float("-inf")))
        for j in range(J):
            d_ja = _dur(BLK_D, J, j)
            if t >= d_ja:
                off = (t - d_ja) * U1 + u
                a = _move(a, tl.load(a_seq + off, mask=live, other=float("-inf")),
                          tl.load((blk_ptr + (j * move + seq)) + off, mask=live,
                                  other=float("-inf")))
        if HAS_ZERO:
            w = tl.load(w0_seq + (t * U1 + u - 1), mask=live & (u >= 1), other=float("-inf"))
            _, a = tl.associative_scan((w, a), 0, _chain_combine)
        tl.store(a_seq + (t * U1 + u), a, mask=live)
    if WANT_BETA:
        # lanes in reverse: lane k holds state r = U1 - 1 - k
        r = U1 - 1 - u
        b_seq = beta_ptr + seq
        t_seq = term_ptr + seq
        for i in range(t_b):
            t = t_b - 1 - i
            tl.debug_barrier()
            row = t * U1 + r
            bt = tl.load(t_seq + row, mask=live, other=float("-inf"))
            for m in range(L):
                d_lb = _dur(LAB_D, L, m)
                if t + d_lb < t_b:
                    ok = live & (r + 1 < U1)
                    bt = _move(bt, tl.load(b_seq + (row + (d_lb * U1 + 1)), mask=ok,
                                           other=float("-inf")),
                               tl.load((lab_ptr + (m * move + seq)) + row, mask=ok,
                                       other=float("-inf")))
            for j in range(J):
                d_jb = _dur(BLK_D, J, j)
                if t + d_jb < t_b:
                    bt = _move(bt, tl.load(b_seq + (row + d_jb * U1), mask=live,
                                           other=float("-inf")),
                               tl.load((blk_ptr + (j * move + seq)) + row, mask=live,
                                       other=float("-inf")))
            if HAS_ZERO:
                # beta_t(r) = lse(b(r), w0(t, r) + beta_t(r + 1)): lane k - 1 is state r + 1
                w = tl.load(w0_seq + row, mask=live & (u >= 1), other=float("-inf"))
                _, bt = tl.associative_scan((w, bt), 0, _chain_combine)
            tl.store(b_seq + row, bt, mask=live)
