r"""The duration transducers' forward and backward variables (TDT, multi-blank RNN-T
and TDT's ``omega`` RNN-T) as one Pallas kernel over anti-diagonals.

`duoloss.jax._xla.tdt` forms the move weights (frame-major ``(T, N, U + 1)``,
``-inf`` for every move that leaves a sequence's box), the loss from
$\alpha$ and the terminal weights, and every move's posterior and the gradient
from $\alpha$ and $\beta$ (fully parallel XLA); this module replaces only its
two ``lax.scan`` recursions (one step per frame, a within-frame associative scan
for the duration-0 label moves) by a kernel.

Every move goes from cell ``(t, u)`` to ``(t + d, u + \Delta u)`` with ``d +
\Delta u >= 1`` (a label of duration ``d``: ``\Delta u = 1``; a blank of
duration ``d > 0``: ``\Delta u = 0``), so on the anti-diagonals ``l = t + u``
every move leaves a level for a strictly later one and no level depends on
itself: no within-level chain, whatever the durations.  With the weights laid out
by *source* cell, level-major ``w_m[b, l, u] = w_m(t = l - u, u)``:

.. math::

    \alpha_l(u) = \log \sum_m e^{\alpha_{l - d_m - \Delta u_m}(u - \Delta u_m)
                  + w_m[l - d_m - \Delta u_m,\, u - \Delta u_m]}, \qquad
    \beta_l(u) = \log\Big(e^{\text{term}[l, u]} + \sum_m e^{w_m[l, u]
                  + \beta_{l + d_m + \Delta u_m}(u + \Delta u_m)}\Big),

``alpha = 0`` at ``(0, 0)``; a move out of a cell no path reaches (``alpha =
-inf``) adds nothing whatever its weight (NaN, ``+inf``), as the core.  One
program per sequence, a ``fori_loop`` over the ``T + U`` levels; the rows of
$\alpha$/$\beta$ are stored in the ``(L, W)`` output tables, and a move's
source row is read back ``d + \Delta u`` levels later, one lane over for labels
(GPU form: a shifted load of the stored row after a barrier, the weight tables
guard-padded by one lane on each side; TPU form: ``pltpu.roll``).
XLA lays the tables back out frame-major.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._sharding import varying_axes
from . import pallas_call_options, pallas_target
from .transducer import _lse2, _struct, _warps

__all__ = ["tables"]

NEG_INF = float("-inf")


def _lanes(u1: int, form: str) -> int:
    if form == "tpu":
        return max(128, -(-u1 // 128) * 128)
    return max(32, 1 << max(u1 - 1, 0).bit_length())


def tables(lab_moves, blk_moves, lab_w, blk_w, term, want, backend):
    """``(alpha, beta)`` frame-major ``(T, N, U + 1)`` (``beta`` ``None`` without
    ``want``), the values of `duoloss.jax._xla.tdt`'s ``_alpha``/``_beta``.

    ``lab_moves`` ``((d, i), ...)`` and ``blk_moves`` ``((k, d, i), ...)`` with their
    source-cell weights ``lab_w``/``blk_w`` (lists of ``(T, N, U + 1)``), ``term``
    the terminal weights ``(T, N, U + 1)``; ``backend`` a Pallas answer of
    `duoloss.jax._pallas.backend_for`."""
    form, interpret = pallas_target(backend)
    t_max, _, u1 = term.shape
    dtype = term.dtype
    if form == "tpu" and dtype == jnp.float64:
        raise ValueError("tdt loss (impl='pallas'): the TPU kernel computes in float32 "
                         "(Mosaic has no float64), got float64; use impl='xla'")
    steps = tuple((d + 1, 1) for d, _ in lab_moves) + tuple((d, 0) for _, d, _ in blk_moves)
    lanes = _lanes(u1, form)
    levels = t_max + u1 - 1
    guard = 1 if form == "gpu" else 0
    # source-cell weights level-major: w[b, m, l, u] = w_m(l - u, u), -inf off the lattice
    lev = jnp.arange(levels)[:, None]
    u = jnp.arange(u1)[None, :]
    t = lev - u
    on = (t >= 0) & (t < t_max)
    tc = jnp.clip(t, 0, t_max - 1)
    stacked = jnp.stack(list(lab_w) + list(blk_w) + [term], axis=1)      # (T, M + 1, N, U1)
    w = stacked[tc, :, :, u]                                             # (L, U1, M + 1, N)
    w = jnp.where(on[:, :, None, None], w, NEG_INF)
    w = jnp.transpose(w, (3, 2, 0, 1))                                   # (N, M + 1, L, U1)
    w = jnp.pad(w, ((0, 0), (0, 0), (0, 0), (guard, lanes + guard - u1)),
                constant_values=NEG_INF)
    alpha, beta = _call(w, steps, levels, lanes, form, backend, interpret, want)
    # back to frame-major: table[b, t + u, u + guard] -> (T, N, U1)
    tt = jnp.arange(t_max)[:, None]
    alpha = jnp.transpose(alpha[:, tt + u, u + guard], (1, 0, 2))
    if beta is not None:
        beta = jnp.transpose(beta[:, tt + u, u + guard], (1, 0, 2))
    return alpha, beta


class _GpuRows:
    """Rows of ``W + 2`` lanes, data at lanes ``1..W``: a shifted read is a load at
    another offset (after a barrier when another lane wrote it)."""

    def __init__(self, lanes, dtype, interpret):
        self.w = lanes
        self.lane = jax.lax.broadcasted_iota(jnp.int32, (lanes,), 0)
        self.neg = jnp.full((lanes,), NEG_INF, dtype)
        self.interpret = interpret

    def barrier(self):
        if not self.interpret:
            from jax.experimental.pallas import triton as plgpu
            plgpu.debug_barrier()

    def read(self, ref, l, shift, m=()):
        """``ref[m + (l,)](u - shift)`` (``shift`` in ``{-1, 0, 1}``), ``-inf`` off the
        row (one indexer: Pallas-Triton takes no ``ref.at[m]`` view)."""
        row = ref[m + (l, pl.ds(1 - shift, self.w))]
        if shift > 0:
            return jnp.where(self.lane >= shift, row, self.neg)
        if shift < 0:
            return jnp.where(self.lane < self.w + shift, row, self.neg)
        return row

    def write(self, ref, l, row):
        ref[l, pl.ds(1, self.w)] = row


class _TpuRows:
    """``(1, W)`` rows in VMEM, shifted with ``pltpu.roll``."""

    def __init__(self, lanes, dtype, interpret):
        self.w = lanes
        self.lane = jax.lax.broadcasted_iota(jnp.int32, (1, lanes), 1)
        self.neg = jnp.full((1, lanes), NEG_INF, dtype)

    def barrier(self):
        pass

    def read(self, ref, l, shift, m=()):
        row = ref[m + (pl.ds(l, 1), slice(None))]
        if shift == 0:
            return row
        from jax.experimental.pallas import tpu as pltpu
        row = pltpu.roll(row, shift % self.w, 1)
        ok = self.lane >= shift if shift > 0 else self.lane < self.w + shift
        return jnp.where(ok, row, self.neg)

    def write(self, ref, l, row):
        ref[pl.ds(l, 1), :] = row


def _kernel(w_ref, alpha_ref, *beta_ref, rows, steps, levels):
    """One sequence: ``alpha`` (and ``beta``) ``(L, W)`` over the levels."""
    moves = len(steps)
    lane = rows.lane
    rows.write(alpha_ref, 0, jnp.where(lane == 0, 0.0, rows.neg))

    def forward(l, carry):
        srcs = [jnp.maximum(l - dl, 0) for dl, _ in steps]
        # the weights first: no lane writes them, so their loads need not wait at the barrier
        ws = [rows.read(w_ref, src, du, (m,)) for m, (src, (_, du)) in enumerate(zip(srcs, steps))]
        rows.barrier()
        a = rows.neg
        for src, (dl, du), wv in zip(srcs, steps, ws):
            av = rows.read(alpha_ref, src, du)
            a = _lse2(a, jnp.where((av == NEG_INF) | (l < dl), NEG_INF, av + wv))
        rows.write(alpha_ref, l, a)
        return carry

    jax.lax.fori_loop(1, levels, forward, 0)
    if not beta_ref:
        return
    (beta_ref,) = beta_ref

    def backward(r, carry):
        l = levels - 1 - r
        b = rows.read(w_ref, l, 0, (moves,))                    # the terminal moves
        ws = [rows.read(w_ref, l, 0, (m,)) for m in range(moves)]
        rows.barrier()
        for (dl, du), wv in zip(steps, ws):
            bv = rows.read(beta_ref, jnp.minimum(l + dl, levels - 1), -du)
            b = _lse2(b, jnp.where(l + dl > levels - 1, NEG_INF, wv + bv))
        rows.write(beta_ref, l, b)
        return carry

    jax.lax.fori_loop(0, levels, backward, 0)


def _call(w, steps, levels, lanes, form, backend, interpret, want):
    n, m1, _, width = w.shape
    dtype = w.dtype
    axes = varying_axes(w)
    rows_cls = _TpuRows if form == "tpu" else _GpuRows
    w_spec = pl.BlockSpec((None, m1, levels, width), lambda b: (b, 0, 0, 0))
    t_spec = pl.BlockSpec((None, levels, width), lambda b: (b, 0, 0))
    outs = 2 if want else 1

    def kernel(w_ref, *out_refs):
        _kernel(w_ref, *out_refs, rows=rows_cls(lanes, dtype, interpret), steps=steps,
                levels=levels)

    res = pl.pallas_call(
        kernel, grid=(n,), in_specs=[w_spec], out_specs=[t_spec] * outs,
        out_shape=[_struct((n, levels, width), dtype, axes)] * outs,
        name=f"duoloss_duration_transducer{'_grad' if want else ''}",
        **pallas_call_options(backend, num_warps=_warps(lanes), num_stages=1))(w)
    return res[0], (res[1] if want else None)
