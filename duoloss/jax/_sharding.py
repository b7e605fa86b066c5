"""Sharding-in-types support for host callbacks: ``shard_map`` and explicit meshes.

**Explicit meshes** (``AxisType.Explicit``, the default of ``jax.make_mesh`` in
recent JAX): an array's type carries its sharding, and a ``pure_callback``
output carries none, so a ``custom_vjp`` gradient would not match a sharded
input's type.  `explicit_batch_sharding` reads the types; the adapter
then runs the loss under ``shard_map`` over the batch (one callback per shard,
no gather), or gathers first when inputs are sharded along other axes.

**Varying types**:

Inside ``shard_map`` (with its default ``check_vma=True``) every value carries
the set of mesh axes it varies over.  A ``pure_callback``'s outputs carry none,
so a ``custom_vjp`` around it fails ("Custom VJP bwd rule must produce an output
with the same type ... manual axis types do not match") unless its outputs are
marked as varying over the axes its inputs vary over.  The helpers here do that
marking, and are no-ops outside ``shard_map`` and on JAX versions without
varying types, so users never need ``check_vma=False``.
"""
from __future__ import annotations

from typing import FrozenSet, Optional, Sequence, Tuple

import jax

__all__ = ["explicit_batch_sharding", "mark_varying", "varying_axes"]


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


def _spec_entries(x) -> Tuple[Optional[object], ...]:
    """Per-dimension sharding entries of ``x``'s type (explicit axes only), or ()."""
    try:
        sharding = jax.typeof(x).sharding
        spec = tuple(sharding.spec)
    except (AttributeError, TypeError):  # old JAX, no mesh, or not an array
        return ()
    return spec + (None,) * (len(getattr(x, "shape", ())) - len(spec))


def explicit_batch_sharding(arrays: Sequence, batch_axes: Sequence[Optional[int]]):
    """How explicitly sharded inputs are laid out.

    Returns:
      ``None`` when no input is sharded in its type (no explicit mesh axis: nothing
      to do); ``("batch", mesh, entry)`` when the only sharding is one common
      ``entry`` (a mesh axis name or tuple of names) on the batch axis of every
      batched input (shared inputs unsharded): the loss can run per shard; else
      ``("other", mesh, None)``: inputs must be gathered first.
    """
    entries = [_spec_entries(a) for a in arrays]
    if not any(e is not None for spec in entries for e in spec):
        return None
    mesh = None
    for a, spec in zip(arrays, entries):
        if any(e is not None for e in spec):
            mesh = jax.typeof(a).sharding.mesh
            break
    common = set()
    for spec, axis in zip(entries, batch_axes):
        for dim, e in enumerate(spec):
            if e is None:
                continue
            if axis is None or dim != axis:
                return ("other", mesh, None)
        if axis is not None:
            common.add(spec[axis] if spec else None)
    if len(common) != 1 or None in common:
        return ("other", mesh, None)
    return ("batch", mesh, common.pop())
