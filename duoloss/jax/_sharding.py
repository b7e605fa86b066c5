"""Manual-axis ("varying") types for host callbacks inside ``jax.shard_map``.

Inside ``shard_map`` (with its default ``check_vma=True``) every value carries
the set of mesh axes it varies over.  A ``pure_callback``'s outputs carry none,
so a ``custom_vjp`` around it fails ("Custom VJP bwd rule must produce an output
with the same type ... manual axis types do not match") unless its outputs are
marked as varying over the axes its inputs vary over.  The helpers here do that
marking, and are no-ops outside ``shard_map`` and on JAX versions without
varying types, so users never need ``check_vma=False``.
"""
from __future__ import annotations

from typing import FrozenSet

import jax

__all__ = ["mark_varying", "varying_axes"]


def _axes_of(x) -> FrozenSet[str]:
    try:
        aval = jax.typeof(x)
    except (AttributeError, TypeError):  # pragma: no cover - old JAX, or not an array
        return frozenset()
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(getattr(mat, "varying", ()) or ())
    return frozenset(getattr(aval, "vma", ()) or ())  # pragma: no cover - JAX 0.6-0.9


def varying_axes(*xs) -> FrozenSet[str]:
    """The union of the mesh axes the arguments vary over (empty outside ``shard_map``)."""
    out = frozenset()
    for x in xs:
        out |= _axes_of(x)
    return out


def mark_varying(x, axes: FrozenSet[str]):
    """``x`` cast to vary over ``axes`` (those it lacks); ``x`` itself if none are missing.

    Casting an invariant value to varying is JAX's ``pvary``: its transpose is a
    ``psum``, so the gradient of an input replicated over the mesh (e.g. a
    transition matrix) is summed over the shards, as for any JAX operation.
    """
    missing = tuple(sorted(axes - _axes_of(x)))
    if not missing:
        return x
    pcast = getattr(jax.lax, "pcast", None)
    if pcast is not None:
        return pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)  # pragma: no cover - JAX before pcast
