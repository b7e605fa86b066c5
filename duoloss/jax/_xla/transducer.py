r"""The transducer lattice recursion in XLA (k2's mutual-information recursion),
with a ``custom_vjp`` from the forward and backward variables.

Same contract as `duoloss.core.losses.transducer` (read its docstring for
the maths): ``px`` ``(N, S, T + 1)`` (``'regular'``) or ``(N, S, T)``
(``'modified'``), ``py`` ``(N, S + 1, T)``, ``boundary`` ``(N, 4)`` rows
``[s_begin, t_begin, s_end, t_end]``; returns ``loss_b = -p[s_end, t_end]``.

The sweep runs over *levels* so that every move goes from one level to the
next: anti-diagonals ``s + t`` (regular: ``S + T + 1`` levels, each a vector of
``S + 1`` cells) or frames ``t`` (modified: ``T + 1`` levels).  The moves are
first laid out level-major -- ``em[l, n, s]`` the symbol move into cell ``s``
of level ``l`` (from cell ``s - 1`` of level ``l - 1``), ``bl[l, n, s]`` the
blank move into it (from cell ``s``) -- with ``-inf`` for every move that
leaves the sequence's box, so that nothing outside the box is ever read
(NaN there cannot leak in).  Then one ``lax.scan`` computes

.. math::

    p_l(s) = \log\big(e^{p_{l-1}(s-1) + em_l(s)} + e^{p_{l-1}(s) + bl_l(s)}\big)

(``p = 0`` at the start cell), storing ``p`` ``(L, N, S + 1)``; the backward
rule runs the mirror scan for ``q`` (the suffix scores) and emits the move
occupations ``exp(p_{l-1} + move_l + q_l - Z)`` level by level, which are laid
back out to ``px``/``py``'s shapes with one gather each.  Memory:
``O(N (S + 1) L)``.

NaN/inf policy as the core: infeasible -> ``+inf`` and zero gradient; a NaN
inside a box poisons that sequence's loss and in-box gradients only; ``-inf``
moves never give NaN; an invalid boundary row (traced values) gives a NaN loss
and NaN gradient.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .._adapter import _gradient
from .._sharding import mark_varying, varying_axes
from ._logsem import NEG_INF, lse2, shift_left, shift_right

__all__ = ["transducer_losses"]

_NAME = "transducer loss (impl='device')"


def transducer_losses(px, py, boundary, rnnt_type: str = "regular"):
    """Per-sequence negative log-likelihoods ``(N,)`` of the lattice, differentiable
    w.r.t. ``px`` and ``py``.  ``rnnt_type``: ``'regular'`` or ``'modified'``
    (``'constrained'`` differs only in how ``px`` is built: pass ``'modified'``)."""
    kind = "regular" if rnnt_type == "regular" else "modified"
    return _losses(px, py, boundary.astype(jnp.int32), kind)


def _geometry(boundary, s_max, t_max, kind):
    """Box checks and the level-major masks of the two moves ``(L, N, S + 1)``."""
    sb, tb, se, te = (boundary[:, i] for i in range(4))
    valid = (0 <= sb) & (sb <= se) & (se <= s_max) & (0 <= tb) & (tb <= te) & (te <= t_max)
    levels = s_max + t_max + 1 if kind == "regular" else t_max + 1
    lev = jnp.arange(levels, dtype=jnp.int32)[:, None, None]
    s = jnp.arange(s_max + 1, dtype=jnp.int32)[None, None, :]
    t = lev - s if kind == "regular" else jnp.broadcast_to(lev, (levels, 1, s_max + 1))
    sb, tb, se, te = (v[None, :, None] for v in (sb, tb, se, te))
    valid3 = valid[None, :, None]
    target_in = (s <= se) & (t >= tb) & (t <= te) & valid3
    # symbol move from (s - 1, t) [regular] or (s - 1, t - 1) [modified]
    em_ok = target_in & (s - 1 >= sb) & ((t >= tb) if kind == "regular" else (t - 1 >= tb))
    bl_ok = target_in & (s >= sb) & (t - 1 >= tb)
    start_lev = (sb + tb if kind == "regular" else tb)[0, :, 0]
    end_lev = (se + te if kind == "regular" else te)[0, :, 0]
    return valid, em_ok, bl_ok, start_lev, end_lev, t


def _level_major(px, py, kind, t):
    """``em, bl`` ``(L, N, S + 1)``: the move values into each level's cells."""
    n, s1, t_max = py.shape
    pxp = jnp.pad(px, ((0, 0), (1, 0), (0, 0)), constant_values=NEG_INF)   # row s = px[s - 1]
    if kind == "regular":
        tt = t[:, 0, :].T                                                  # (S + 1, L)
        em = jnp.take_along_axis(pxp, jnp.clip(tt, 0, t_max)[None], axis=2)
        bl = jnp.take_along_axis(py, jnp.clip(tt - 1, 0, max(t_max - 1, 0))[None], axis=2) \
            if t_max else jnp.full((n, s1, tt.shape[1]), NEG_INF, py.dtype)
        return jnp.transpose(em, (2, 0, 1)), jnp.transpose(bl, (2, 0, 1))
    # modified: level t reads column t - 1 of both
    em = jnp.pad(pxp, ((0, 0), (0, 0), (1, 0)), constant_values=NEG_INF)
    bl = jnp.pad(py, ((0, 0), (0, 0), (1, 0)), constant_values=NEG_INF)
    return jnp.transpose(em, (2, 0, 1)), jnp.transpose(bl, (2, 0, 1))


def _forward(em, bl, sb, start_lev):
    n, s1 = em.shape[1:]
    cell = jnp.arange(s1, dtype=jnp.int32)[None]
    start_cell = cell == sb[:, None]

    def step(p, xs):
        em_l, bl_l, l = xs
        new = lse2(shift_right(p, 1) + em_l, p + bl_l)
        new = jnp.where(start_cell & (l == start_lev)[:, None], 0.0, new)
        return new, new

    p0 = mark_varying(jnp.full((n, s1), NEG_INF, em.dtype),    # a scan carry in shard_map
                      varying_axes(em, bl, sb, start_lev))
    _, ps = jax.lax.scan(step, p0, (em, bl, jnp.arange(em.shape[0], dtype=jnp.int32)))
    return ps


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _losses(px, py, boundary, kind):
    return _fwd(px, py, boundary, kind)[0]


def _prepared(px, py, boundary, kind):
    s_max, t_max = py.shape[1] - 1, py.shape[2]
    valid, em_ok, bl_ok, start_lev, end_lev, t = _geometry(boundary, s_max, t_max, kind)
    em, bl = _level_major(px, py, kind, t)
    em = jnp.where(em_ok, em, NEG_INF)
    bl = jnp.where(bl_ok, bl, NEG_INF)
    return valid, em, bl, em_ok, bl_ok, start_lev, end_lev


def _fwd(px, py, boundary, kind):
    dtype = px.dtype
    work = jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype
    px_w, py_w = px.astype(work), py.astype(work)
    valid, em, bl, em_ok, bl_ok, start_lev, end_lev = _prepared(px_w, py_w, boundary, kind)
    ps = _forward(em, bl, boundary[:, 0], start_lev)
    levels = ps.shape[0]
    end = jnp.take_along_axis(ps, jnp.clip(end_lev, 0, levels - 1)[None, :, None], axis=0)[0]
    z = jnp.take_along_axis(end, jnp.clip(boundary[:, 2], 0, ps.shape[2] - 1)[:, None],
                            axis=1)[:, 0]
    loss = jnp.where(valid, -z, jnp.nan) + 0.0
    return loss.astype(dtype), ((px, py), boundary, valid, em, bl, em_ok,
                                bl_ok, end_lev, ps, z)


def _bwd(kind, res, g):
    (px, py), boundary, valid, em, bl, em_ok, bl_ok, end_lev, ps, z = res
    n, s1 = em.shape[1:]
    cell = jnp.arange(s1, dtype=jnp.int32)[None]
    end_cell = cell == boundary[:, 2][:, None]
    use = (~(jnp.isinf(z) & (z < 0)) & valid)[:, None]       # infeasible: zero gradient
    scale = -1.0          # per-sequence gradients; the cotangent is applied at the end
    z = jnp.where(use[:, 0], z, 0.0)
    em_next = jnp.concatenate([em[1:], jnp.full_like(em[:1], NEG_INF)], axis=0)
    bl_next = jnp.concatenate([bl[1:], jnp.full_like(bl[:1], NEG_INF)], axis=0)
    p_prev = jnp.concatenate([jnp.full_like(ps[:1], NEG_INF), ps[:-1]], axis=0)

    def step(q, xs):
        em_n, bl_n, em_l, bl_l, em_k, bl_k, pp, l = xs   # q = q_{l + 1}
        q_l = lse2(shift_left(q + em_n, 1), q + bl_n)
        q_l = jnp.where(end_cell & (l == end_lev)[:, None], 0.0, q_l)
        occ_em = jnp.exp(shift_right(pp, 1) + em_l + q_l - z[:, None])
        occ_bl = jnp.exp(pp + bl_l + q_l - z[:, None])
        g_em = jnp.where(em_k & use, occ_em * scale, 0.0)
        g_bl = jnp.where(bl_k & use, occ_bl * scale, 0.0)
        return q_l, (g_em, g_bl)

    xs = (em_next, bl_next, em, bl, em_ok, bl_ok, p_prev,
          jnp.arange(em.shape[0], dtype=jnp.int32))
    q0 = mark_varying(jnp.full((n, s1), NEG_INF, em.dtype),
                      varying_axes(em, bl, boundary, end_lev))
    _, (g_em, g_bl) = jax.lax.scan(step, q0, xs, reverse=True)
    s_max = s1 - 1
    t_py = em.shape[0] - s1 if kind == "regular" else em.shape[0] - 1   # T
    t_cols = t_py + 1 if kind == "regular" else t_py
    g_em = jnp.transpose(g_em, (1, 2, 0))[:, 1:]         # (N, S, L)
    g_bl = jnp.transpose(g_bl, (1, 2, 0))                # (N, S + 1, L)
    if kind == "regular":
        r = jnp.arange(s_max)[:, None]
        gpx = jnp.take_along_axis(g_em, (r + 1 + jnp.arange(t_cols)[None])[None], axis=2)
        s = jnp.arange(s_max + 1)[:, None]
        gpy = jnp.take_along_axis(g_bl, (s + 1 + jnp.arange(t_py)[None])[None], axis=2)
    else:
        gpx = g_em[:, :, 1:]
        gpy = g_bl[:, :, 1:]
    bad = ~valid[:, None, None]
    gpx = jnp.where(bad, jnp.nan, gpx)
    gpy = jnp.where(bad, jnp.nan, gpy)
    # scaled by the cotangent; differentiating it again raises (as on the host path)
    return (_gradient(_NAME, 0, gpx.astype(px.dtype), px, g.astype(px.dtype)),
            _gradient(_NAME, 0, gpy.astype(py.dtype), py, g.astype(py.dtype)), None)


_losses.defvjp(_fwd, _bwd)
