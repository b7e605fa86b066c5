r"""The transducer lattice recursion (k2's mutual-information recursion) as Pallas
kernels, with a ``custom_vjp`` from the forward and backward variables.

Same contract and numbers as `duoloss.jax._xla.transducer` (and the core,
`duoloss.core.losses.transducer`): ``px`` ``(N, S, T + 1)`` (``'regular'``) or
``(N, S, T)`` (``'modified'``), ``py`` ``(N, S + 1, T)``, ``boundary`` ``(N, 4)``
rows ``[s_begin, t_begin, s_end, t_end]``; ``loss_b = -p[s_end, t_end]``.  It
serves ``rnnt_loss`` and ``rnnt_loss_simple``/``_smoothed``/``_pruned``.

Layout (XLA, before the kernel).  The moves are laid out *level-major*, one row
per level -- anti-diagonals ``l = s + t`` (regular, ``L = S + T + 1``) or frames
``l = t`` (modified, ``L = T + 1``) -- with the states ``s`` along the lanes:
``em[b, l, s]`` is the symbol move into cell ``s`` of level ``l`` (from cell
``s - 1`` of level ``l - 1``), ``bl[b, l, s]`` the blank move into it (from cell
``s``), ``-inf`` for every move that leaves the sequence's box (so nothing
outside the box is ever read: NaN there cannot leak in).  Rows are padded to
``W`` lanes (a power of two >= 32 for Triton, a multiple of 128 for TPU).

Kernel (one program per sequence, the grid over the batch).  A ``fori_loop`` over
the levels keeps the row of ``S + 1`` forward scores in registers:

.. math::

    p_l(s) = \log\big(e^{p_{l-1}(s-1) + em_l(s)} + e^{p_{l-1}(s) + bl_l(s)}\big),

``p = 0`` at the start cell, every row stored in the ``(L, W)`` table ``alpha``.
The gradient variant then runs the mirror loop for the suffix scores
``q_l(s) = log(e^{q_{l+1}(s+1) + em_{l+1}(s+1)} + e^{q_{l+1}(s) + bl_{l+1}(s)})``
and writes each move's occupation ``exp(p_{l-1} + move_l + q_l - log Z)`` in the
moves' layout; XLA lays them back out to ``px``/``py``'s shapes (one gather each).
The loss, its gradient and the occupations are those of one launch (the
forward of ``value_and_grad``; a loss without a gradient launches the forward
loop only); ``jax.grad`` never goes through the kernel.  The kernel body is the
same for both lattices: ``'regular'`` and ``'modified'`` differ only in the layout.

The shift by one lane (``s - 1``, ``s + 1``) is the only data movement across
lanes.  Pallas-Triton has no gather, pad or roll: the kernel stores the row
(``alpha``'s rows, a two-row ``work`` buffer), waits at a barrier and reads it
back one lane over (global memory, the caller's buffers).  Mosaic (TPU) keeps the
rows in VMEM and shifts in registers with ``pltpu.roll``.  float64 runs on GPUs
(Triton) and in interpret mode, not on TPUs (refused with a ``ValueError``);
float16/bfloat16 inputs run in float32.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._adapter import _gradient
from .._sharding import mark_varying, varying_axes
from . import pallas_call_options, pallas_target

__all__ = ["transducer_losses"]

_NAME = "transducer loss (impl='pallas')"
NEG_INF = float("-inf")


#: Warps per program of the GPU form (this module's and `duoloss.jax._pallas.tdt`'s);
#: ``None``: `_warps`' rule.  A knob for timing sweeps: set it before the call is traced.
NUM_WARPS = None


def _warps(lanes: int) -> int:
    """Warps per program: one per 64 lanes (a level is one short vector), 1 to 8."""
    if NUM_WARPS is not None:
        return int(NUM_WARPS)
    return max(1, min(8, lanes // 64))


def _lanes(s1: int, form: str) -> int:
    """Lanes of a level's row: a power of two >= 32 (Triton blocks), a multiple of 128 (TPU)."""
    if form == "tpu":
        return max(128, -(-s1 // 128) * 128)
    return max(32, 1 << max(s1 - 1, 0).bit_length())


def transducer_losses(px, py, boundary, rnnt_type: str = "regular", *,
                      backend: str = "pallas-interpret"):
    """Per-sequence negative log-likelihoods ``(N,)`` of the lattice, differentiable
    w.r.t. ``px`` and ``py`` (as `duoloss.jax._xla.transducer.transducer_losses`).

    ``backend``: a Pallas answer of `duoloss.jax._pallas.backend_for`
    (``'pallas-gpu'``, ``'pallas-tpu'``, ``'pallas-interpret'``: the kernel form
    `interpret_target` names, in Pallas's interpreter).  ``rnnt_type``:
    ``'regular'``, or ``'modified'`` (also for ``'constrained'``, which differs only
    in how ``px`` is built).  float64 with the TPU form: ``ValueError``."""
    form, interpret = pallas_target(backend)
    kind = "regular" if rnnt_type == "regular" else "modified"
    if form == "tpu" and jnp.float64 in (px.dtype, py.dtype):
        raise ValueError(f"{_NAME}: the TPU kernel computes in float32 (Mosaic has no "
                         f"float64), got px {px.dtype} and py {py.dtype}; use impl='xla'")
    return _losses(px, py, boundary.astype(jnp.int32), (kind, backend, form, interpret))


# ------------------------------------------------------------------ layout (XLA)
def _work_dtype(dtype):
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def _layout(px, py, boundary, kind, lanes):
    """Masked level-major moves ``em, bl`` ``(N, L, lanes)``, their masks ``(N, L, S + 1)``,
    the validity of each row, and ``geo`` ``(N, 4)`` ``[start_lev, s_begin, end_lev, s_end]``."""
    n, s1, t_max = py.shape
    s_max = s1 - 1
    regular = kind == "regular"
    levels = s_max + t_max + 1 if regular else t_max + 1
    sb, tb, se, te = (boundary[:, i] for i in range(4))
    valid = (0 <= sb) & (sb <= se) & (se <= s_max) & (0 <= tb) & (tb <= te) & (te <= t_max)
    lev = jnp.arange(levels, dtype=jnp.int32)[:, None]
    s = jnp.arange(s1, dtype=jnp.int32)[None, :]
    t = lev - s if regular else jnp.broadcast_to(lev, (levels, s1))     # (L, S + 1)
    sb3, tb3, se3, te3 = (v[:, None, None] for v in (sb, tb, se, te))
    target_in = (s <= se3) & (t >= tb3) & (t <= te3) & valid[:, None, None]
    em_ok = target_in & (s - 1 >= sb3) & ((t >= tb3) if regular else (t - 1 >= tb3))
    bl_ok = target_in & (s >= sb3) & (t - 1 >= tb3)
    # em[l, s] = px[s - 1, t] (regular) or px[s - 1, t - 1] (modified); bl[l, s] = py[s, t - 1]
    t_px = t if regular else t - 1
    if s_max and px.shape[2]:
        em = px[:, jnp.clip(s - 1, 0, s_max - 1), jnp.clip(t_px, 0, px.shape[2] - 1)]
    else:
        em = jnp.full((n, levels, s1), NEG_INF, px.dtype)
    if t_max:
        bl = py[:, jnp.broadcast_to(s, (levels, s1)), jnp.clip(t - 1, 0, t_max - 1)]
    else:
        bl = jnp.full((n, levels, s1), NEG_INF, py.dtype)
    pad = ((0, 0), (0, 0), (0, lanes - s1))
    em = jnp.pad(jnp.where(em_ok, em, NEG_INF), pad, constant_values=NEG_INF)
    bl = jnp.pad(jnp.where(bl_ok, bl, NEG_INF), pad, constant_values=NEG_INF)
    start_lev = sb + tb if regular else tb
    end_lev = se + te if regular else te
    geo = jnp.stack([start_lev, sb, end_lev, se], axis=1)
    geo = jnp.where(valid[:, None], geo, 0).astype(jnp.int32)
    return em, bl, em_ok, bl_ok, valid, geo


def _unskew(g_em, g_bl, kind, px_shape, py_shape):
    """The occupations ``(N, L, S + 1)`` back in ``px``/``py``'s layouts."""
    _, s_max, t_x = px_shape
    t_max = py_shape[2]
    if kind == "regular":   # px[s, t]: em into cell s + 1 of level s + t + 1; py[s, t]: bl
        #                     into cell s of level s + t + 1
        s = jnp.arange(s_max)[:, None]
        gpx = g_em[:, s + 1 + jnp.arange(t_x)[None], s + 1]
        s = jnp.arange(s_max + 1)[:, None]
        gpy = g_bl[:, s + 1 + jnp.arange(t_max)[None], s]
    else:                   # level t + 1 reads column t of both
        gpx = jnp.swapaxes(g_em[:, 1:t_x + 1, 1:], 1, 2)
        gpy = jnp.swapaxes(g_bl[:, 1:, :], 1, 2)
    return gpx, gpy


# ------------------------------------------------------------------ kernels
def _lse2(a, b):
    """``log(exp(a) + exp(b))``: ``-inf`` when both are (never NaN), NaN in, NaN out."""
    m = jnp.maximum(a, b)
    m0 = jnp.where(m == NEG_INF, 0.0, m)
    return m0 + jnp.log(jnp.exp(a - m0) + jnp.exp(b - m0))


def _pick(row, lane, k):
    """``row[k]`` as a scalar (a masked sum: a NaN there stays NaN)."""
    return jnp.sum(jnp.where(lane == k, row, 0.0))


class _TritonRows:
    """Rows in global memory: ``alpha`` ``(L, W + 2)`` holds ``p_l`` at lanes ``1..W``, so
    reading lanes ``0..W-1`` gives ``p_l(s - 1)`` (lane 0 masked); ``work`` ``(2, W + 2)``
    likewise shifts a register row to ``x(s + 1)`` (lanes ``2..W+1``).  A barrier
    separates every store from the loads of other lanes (skipped when interpreted:
    one thread)."""

    def __init__(self, lanes, dtype, interpret):
        self.w = lanes
        self.lane = jax.lax.broadcasted_iota(jnp.int32, (lanes,), 0)
        self.neg = jnp.full((lanes,), NEG_INF, dtype)
        self.interpret = interpret

    def barrier(self):
        if not self.interpret:
            from jax.experimental.pallas import triton as plgpu
            plgpu.debug_barrier()

    def load(self, ref, l):
        return ref[l, pl.ds(0, self.w)]

    def store(self, ref, l, row):
        ref[l, pl.ds(0, self.w)] = row

    def store_alpha(self, ref, l, row):
        ref[l, pl.ds(1, self.w)] = row

    def alpha(self, ref, l):
        return ref[l, pl.ds(1, self.w)]

    def alpha_right(self, ref, l, row=None):
        """``p_l(s - 1)`` (after a barrier)."""
        return jnp.where(self.lane >= 1, ref[l, pl.ds(0, self.w)], self.neg)

    def left(self, work, slot, row):
        """``row(s + 1)``, through ``work[slot]`` (one barrier)."""
        work[slot, pl.ds(1, self.w)] = row
        self.barrier()
        return jnp.where(self.lane < self.w - 1, work[slot, pl.ds(2, self.w)], self.neg)


class _TpuRows:
    """Rows in VMEM as ``(1, W)`` values, shifted in registers with ``pltpu.roll``."""

    def __init__(self, lanes, dtype, interpret):
        self.w = lanes
        self.lane = jax.lax.broadcasted_iota(jnp.int32, (1, lanes), 1)
        self.neg = jnp.full((1, lanes), NEG_INF, dtype)

    def barrier(self):
        pass

    def load(self, ref, l):
        return ref[pl.ds(l, 1), :]

    def store(self, ref, l, row):
        ref[pl.ds(l, 1), :] = row

    def store_alpha(self, ref, l, row):
        ref[pl.ds(l, 1), :] = row

    def alpha(self, ref, l):
        return ref[pl.ds(l, 1), :]

    def _roll(self, x, k):
        from jax.experimental.pallas import tpu as pltpu
        return pltpu.roll(x, k, 1)

    def alpha_right(self, ref, l, row=None):
        row = self.alpha(ref, l) if row is None else row
        return jnp.where(self.lane >= 1, self._roll(row, 1), self.neg)

    def left(self, work, slot, row):
        return jnp.where(self.lane < self.w - 1, self._roll(row, self.w - 1), self.neg)


def _kernel(em_ref, bl_ref, geo_ref, alpha_ref, *grad_refs, rows, levels, want):
    """One sequence: the forward table; with ``want`` the suffix scores and the
    occupations ``occ_em``/``occ_bl`` ``(L, W)`` (``work``: Triton's shift buffer)."""
    lane = rows.lane
    start_lev, sb, end_lev, se = (geo_ref[0, k] for k in range(4))
    start = lane == sb
    p0 = jnp.where(start & (start_lev == 0), 0.0, rows.neg)
    rows.store_alpha(alpha_ref, 0, p0)

    def forward(l, carry):
        p, em_l, bl_l = carry                 # p_{l-1}; level l's moves, loaded a level early
        nxt = jnp.minimum(l + 1, levels - 1)
        em_n, bl_n = rows.load(em_ref, nxt), rows.load(bl_ref, nxt)   # before the barrier
        rows.barrier()
        pr = rows.alpha_right(alpha_ref, l - 1, p)
        new = _lse2(pr + em_l, p + bl_l)
        new = jnp.where(start & (l == start_lev), 0.0, new)
        rows.store_alpha(alpha_ref, l, new)
        return new, em_n, bl_n

    first = min(1, levels - 1)
    jax.lax.fori_loop(1, levels, forward,
                      (p0, rows.load(em_ref, first), rows.load(bl_ref, first)))
    if not want:
        return
    occ_em_ref, occ_bl_ref = grad_refs[:2]
    work = grad_refs[2] if len(grad_refs) > 2 else None
    rows.barrier()
    z = _pick(rows.alpha(alpha_ref, end_lev), lane, se)
    z = jnp.where(z == NEG_INF, 0.0, z)       # infeasible: no gradient (masked outside)
    end = lane == se

    def backward(r, carry):
        q1, em1, bl1 = carry                  # level l + 1 (-inf past the last level)
        l = levels - 1 - r
        # the rows this level reads that no lane writes any more: issued before the barrier
        em_l, bl_l = rows.load(em_ref, l), rows.load(bl_ref, l)
        lp = jnp.maximum(l - 1, 0)
        top = l == 0
        pp = jnp.where(top, rows.neg, rows.alpha(alpha_ref, lp))
        pr = jnp.where(top, rows.neg, rows.alpha_right(alpha_ref, lp))
        ql = rows.left(work, jax.lax.rem(r, 2), q1 + em1)
        q = _lse2(ql, q1 + bl1)
        q = jnp.where(end & (l == end_lev), 0.0, q)
        rows.store(occ_em_ref, l, jnp.exp(pr + em_l + q - z))
        rows.store(occ_bl_ref, l, jnp.exp(pp + bl_l + q - z))
        return q, em_l, bl_l

    jax.lax.fori_loop(0, levels, backward, (rows.neg, rows.neg, rows.neg))


def _struct(shape, dtype, axes):
    """An output's type; inside ``shard_map`` (``check_vma=True``) a ``pallas_call``'s
    outputs must name the mesh axes they vary over (``manual_axis_type``, spelled
    ``vma`` before JAX 0.10)."""
    if not axes:
        return jax.ShapeDtypeStruct(shape, dtype)
    from jax._src import core as jax_core
    manual = getattr(jax_core, "ManualAxisType", None)
    if manual is None:  # pragma: no cover - older JAX
        return jax.ShapeDtypeStruct(shape, dtype, vma=frozenset(axes))
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=manual(varying=frozenset(axes)))


def _call(em, bl, geo, kind, backend, form, interpret, want):
    """The kernel over the batch: ``alpha`` and, with ``want``, ``(occ_em, occ_bl)``."""
    n, levels, lanes = em.shape
    dtype = em.dtype
    axes = varying_axes(em, bl, geo)            # shard_map's mesh axes (none outside)
    em, bl, geo = (mark_varying(a, axes) for a in (em, bl, geo[:, None, :]))   # geo (N, 1, 4)
    if form == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        rows_cls = _TpuRows
        a_w = lanes
        # (1, 4) per program in SMEM: Mosaic's blocks equal the array's last two dims
        geo_spec = pl.BlockSpec((None, 1, 4), lambda b: (b, 0, 0), memory_space=pltpu.SMEM)
    else:
        rows_cls = _TritonRows
        a_w = lanes + 2
        geo_spec = pl.BlockSpec((None, 1, 4), lambda b: (b, 0, 0))
    row_spec = pl.BlockSpec((None, levels, lanes), lambda b: (b, 0, 0))
    out_shape = [_struct((n, levels, a_w), dtype, axes)]
    out_specs = [pl.BlockSpec((None, levels, a_w), lambda b: (b, 0, 0))]
    if want:
        out_shape += [_struct((n, levels, lanes), dtype, axes)] * 2
        out_specs += [row_spec] * 2
        if form == "gpu":
            out_shape.append(_struct((n, 2, lanes + 2), dtype, axes))
            out_specs.append(pl.BlockSpec((None, 2, lanes + 2), lambda b: (b, 0, 0)))

    def kernel(em_ref, bl_ref, geo_ref, alpha_ref, *grad_refs):
        rows = rows_cls(lanes, dtype, interpret)
        _kernel(em_ref, bl_ref, geo_ref, alpha_ref, *grad_refs, rows=rows, levels=levels,
                want=want)

    outs = pl.pallas_call(
        kernel, grid=(n,), in_specs=[row_spec, row_spec, geo_spec], out_specs=out_specs,
        out_shape=out_shape, name=f"duoloss_transducer_{kind}{'_grad' if want else ''}",
        **pallas_call_options(backend, num_warps=_warps(lanes), num_stages=1))(em, bl, geo)
    alpha = outs[0] if form == "tpu" else outs[0][..., 1:]
    return alpha, tuple(outs[1:3])


# ------------------------------------------------------------------ custom_vjp
def _run(px, py, boundary, cfg, want):
    """``(losses, gpx, gpy)`` in the inputs' dtypes (``None`` gradients without ``want``)."""
    kind, backend, form, interpret = cfg
    n, s1, _ = py.shape
    work = _work_dtype(px.dtype)
    pxw, pyw = px.astype(work), py.astype(work)
    lanes = _lanes(s1, form)
    em, bl, em_ok, bl_ok, valid, geo = _layout(pxw, pyw, boundary, kind, lanes)
    if n == 0:
        loss = jnp.zeros((0,), px.dtype)
        return loss, (jnp.zeros_like(px), jnp.zeros_like(py)) if want else None
    alpha, occ = _call(em, bl, geo, kind, backend, form, interpret, want)
    end = jnp.take_along_axis(alpha, geo[:, 2][:, None, None], axis=1)[:, 0]     # (N, W)
    z = jnp.take_along_axis(end, geo[:, 3][:, None], axis=1)[:, 0]
    loss = (jnp.where(valid, -z, jnp.nan) + 0.0).astype(px.dtype)
    if not want:
        return loss, None
    use = (valid & ~(jnp.isinf(z) & (z < 0)))[:, None, None]
    g_em = jnp.where(em_ok & use, -occ[0][..., :s1], 0.0)
    g_bl = jnp.where(bl_ok & use, -occ[1][..., :s1], 0.0)
    gpx, gpy = _unskew(g_em, g_bl, kind, px.shape, py.shape)
    bad = ~valid[:, None, None]
    gpx = jnp.where(bad, jnp.nan, gpx).astype(px.dtype)
    gpy = jnp.where(bad, jnp.nan, gpy).astype(py.dtype)
    return loss, (gpx, gpy)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _losses(px, py, boundary, cfg):
    return _run(px, py, boundary, cfg, False)[0]


def _fwd(px, py, boundary, cfg):
    # the kernel has no derivative of its own: a second derivative must reach _gradient's
    # rule (which raises), not JAX's linearisation of pallas_call
    sg = jax.lax.stop_gradient
    loss, (gpx, gpy) = _run(sg(px), sg(py), boundary, cfg, True)
    return loss, (gpx, gpy, px, py)


def _bwd(cfg, res, g):
    gpx, gpy, px, py = res
    # scaled by the cotangent; differentiating it again raises (as on the host path)
    return (_gradient(_NAME, 0, gpx, px, g.astype(gpx.dtype)),
            _gradient(_NAME, 0, gpy, py, g.astype(gpy.dtype)), None)


_losses.defvjp(_fwd, _bwd)
