"""Log-semiring helpers shared by the XLA recursions (elementwise, NaN-propagating)."""
from __future__ import annotations

import jax.numpy as jnp

NEG_INF = -jnp.inf


def lse2(a, b):
    """``log(exp(a) + exp(b))``: ``-inf`` when both are ``-inf`` (never NaN), NaN in, NaN out."""
    m = jnp.maximum(a, b)
    m0 = jnp.where(m == NEG_INF, 0, m)
    return m0 + jnp.log(jnp.exp(a - m0) + jnp.exp(b - m0))


def lse3(a, b, c):
    """``log(exp(a) + exp(b) + exp(c))`` with `lse2`'s conventions."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m0 = jnp.where(m == NEG_INF, 0, m)
    return m0 + jnp.log(jnp.exp(a - m0) + jnp.exp(b - m0) + jnp.exp(c - m0))


def shift_right(x, k, fill=NEG_INF):
    """``y[..., s] = x[..., s - k]`` (``fill`` for ``s < k``) along the last axis."""
    if k >= x.shape[-1]:
        return jnp.full_like(x, fill)
    pad = [(0, 0)] * (x.ndim - 1) + [(k, 0)]
    return jnp.pad(x[..., :x.shape[-1] - k], pad, constant_values=fill)


def shift_left(x, k, fill=NEG_INF):
    """``y[..., s] = x[..., s + k]`` (``fill`` past the end) along the last axis."""
    if k >= x.shape[-1]:
        return jnp.full_like(x, fill)
    pad = [(0, 0)] * (x.ndim - 1) + [(0, k)]
    return jnp.pad(x[..., k:], pad, constant_values=fill)
