"""Turns a core `LossKernel` into a JAX ``custom_vjp``.

* The primal is one ``jax.pure_callback`` computing only the losses.
* The forward rule is one callback returning the losses *and* the gradients of
  the inputs that are actually perturbed (``symbolic_zeros=True`` tells us
  which), so a ``value_and_grad`` costs a single host round trip; the backward
  rule only scales those gradients by the cotangent.
* ``vmap_method="expand_dims"``: under ``vmap`` (nested too) the host receives
  extra leading axes; they are folded into the batch axis and the core runs
  once.  Only when an input shared by all sequences (e.g. a transition matrix)
  is itself vmapped does the host loop over the vmapped instances.
* Inside ``jax.shard_map`` the callback outputs are marked as varying over the
  inputs' mesh axes (`duoloss.jax._sharding`), so ``check_vma=True`` (the
  default) works.
* Outputs are declared in the inputs' dtypes, so float32 stays float32 whether
  ``jax_enable_x64`` is on or off, and float64 works when it is on.
* The inputs travel as at most two byte buffers (the per-sequence inputs, the
  shared ones): JAX moves every callback operand with its own ``device_put``
  (about 70 µs each on CPU), so CTC's four inputs in four operands cost more
  than its kernel at small sizes.  The host unpacks them as zero-copy views.
"""
from __future__ import annotations

import functools
from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from duoloss.core import LossKernel
from duoloss.core._reduce import (flush_subnormals, is_subnormal_free, reduction_weights,
                                  run_reduced, run_weighted, sum_weighted, weighted_sum)

from jax.sharding import PartitionSpec

from ._args import first_floating, host_floats, is_half
from ._sharding import explicit_batch_sharding, mark_varying, varying_axes
from ._callback import pure_callback

__all__ = ["apply_kernel", "host_call"]


def _batch_size(kernel: LossKernel, shapes) -> int:
    for axis, shape in zip(kernel.batch_axes, shapes):
        if axis is not None:
            return shape[axis]
    raise ValueError(f"{kernel.name}: kernel has no batched input")


# Byte offset alignment of the inputs inside a packed operand.
_ALIGN = 8
#: Inputs of at least this many bytes travel as operands of their own: packing them
#: costs XLA a byte-wise copy (a concatenation of their ``uint8`` bitcast), which on
#: CPU took 7-13 ms for 3-6 MB of CTC logits, more than the kernel.
_SEPARATE_BYTES = 1 << 16


def _pack_operands(kernel: LossKernel, arrays, batch_axes=None):
    """The inputs as few operands: the small per-sequence inputs packed into one
    ``uint8`` operand, the small shared inputs into another, and each input of at
    least `_SEPARATE_BYTES` as an operand of its own (as it is).

    Returns ``(operands, layout)``; ``layout[i] = (operand, offset, nbytes,
    dtype, shape)`` locates input ``i`` (``offset`` -1: the whole operand).  Every
    packed piece starts at a multiple of ``_ALIGN`` bytes and each operand's size is
    one too, so the host's views are aligned, also for the rows of a vmapped
    operand.  Under ``vmap`` the concatenation broadcasts the unbatched pieces of a
    batched operand, which the host treats like its own broadcast of
    ``expand_dims`` operands.
    """
    pieces = ([], [])
    sizes = [0, 0]
    layout = []
    whole = []
    for a, axis in zip(arrays, kernel.batch_axes if batch_axes is None else batch_axes):
        g = 0 if axis is not None else 1
        dt = np.dtype(a.dtype)
        shape = tuple(int(s) for s in a.shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if nbytes >= _SEPARATE_BYTES:
            layout.append((2, len(whole), nbytes, dt, shape))
            whole.append(a)
            continue
        layout.append((g, sizes[g], nbytes, dt, shape))
        flat = jax.lax.bitcast_convert_type(a, jnp.uint8).reshape(-1)
        pad = -nbytes % _ALIGN
        if pad:
            flat = jnp.concatenate([flat, jnp.zeros(pad, jnp.uint8)])
        pieces[g].append(flat)
        sizes[g] += nbytes + pad
    operands = []
    index = {}
    for g in (0, 1):
        if pieces[g]:
            index[g] = len(operands)
            operands.append(pieces[g][0] if len(pieces[g]) == 1 else jnp.concatenate(pieces[g]))
    layout = tuple((len(operands) + off, -1, nb, dt, shape) if g == 2 else
                   (index[g], off, nb, dt, shape) for g, off, nb, dt, shape in layout)
    return tuple(operands) + tuple(whole), layout


def _unpack_operands(layout, operands):
    """Host views of the inputs packed by `_pack_operands`, leading
    (vmapped) axes of the operands kept."""
    bufs = [np.asarray(o) for o in operands]
    out = []
    for g, off, nbytes, dt, shape in layout:
        buf = bufs[g]
        if off < 0:  # an operand of its own
            out.append(buf)
            continue
        if buf.ndim == 1 and buf.flags.c_contiguous:  # (no vmap: one view, not three)
            out.append(np.ndarray(shape, dt, buf, off))
            continue
        lead = buf.shape[:-1]
        out.append(buf[..., off:off + nbytes].view(dt).reshape(lead + shape))
    return out


def _host_run_packed(kernel, static, want, base_shapes, out_dtypes, layout, *operands):
    return _host_run(kernel, static, want, base_shapes, out_dtypes,
                     *_unpack_operands(layout, operands))


def _host_run(kernel, static, want, base_shapes, out_dtypes, *arrays):
    """Run ``kernel`` on host arrays that may carry leading vmapped axes."""
    arrays = [np.asarray(a) for a in arrays]
    k = arrays[0].ndim - len(base_shapes[0])
    # per-sequence gradients straight from the kernel: no subnormals if its
    # stores flush them (a shared input's rows too: no sum is formed here)
    flushed = is_subnormal_free(kernel.run, kernel.weighted, None)
    if k == 0:
        losses, grads = kernel.run(tuple(arrays), want, **static)
        return _pack(losses, grads, want, out_dtypes, flushed)
    leads = [a.shape[:k] for a in arrays]
    lead = np.broadcast_shapes(*leads)
    shared_vmapped = any(
        axis is None and int(np.prod(ld)) > 1 for axis, ld in zip(kernel.batch_axes, leads)
    )
    if shared_vmapped:
        outs = []
        for idx in np.ndindex(*lead):
            inst = [a[tuple(i if d > 1 else 0 for i, d in zip(idx, ld))]
                    for a, ld in zip(arrays, leads)]
            outs.append(_host_run(kernel, static, want, base_shapes, out_dtypes, *inst))
        return tuple(np.stack([o[j] for o in outs]).reshape(lead + outs[0][j].shape)
                     for j in range(len(outs[0])))
    folded = _fold_instances(kernel, arrays, base_shapes, k, lead)
    losses, grads = kernel.run(tuple(folded), want, **static)
    n = _batch_size(kernel, base_shapes)
    out = [losses.reshape(lead + (n,))]
    for i, g in enumerate(grads):
        if not want[i]:
            continue
        axis, base = kernel.batch_axes[i], base_shapes[i]
        if axis is None:  # (m*n, *shape) per-sequence gradients of a shared input
            out.append(g.reshape(lead + (n,) + tuple(base)))
            continue
        shape = list(base[:axis]) + list(lead) + list(base[axis:])
        g = g.reshape(shape)
        out.append(np.moveaxis(g, tuple(range(axis, axis + k)), tuple(range(k))))
    return _pack(out[0], out[1:], (True,) * (len(out) - 1), out_dtypes, flushed)


def _pack(losses, grads, want, out_dtypes, flushed=False):
    """The callback's results in the declared dtypes, gradients without subnormals
    (``flushed``: ``grads`` hold none already, so only a cast can make some)."""
    res = [np.asarray(losses, dtype=out_dtypes[0])]
    j = 1
    for i, g in enumerate(grads):
        if want[i]:
            out = np.ascontiguousarray(g, dtype=out_dtypes[j])
            res.append(out if flushed and out.dtype == g.dtype else flush_subnormals(out))
            j += 1
    return tuple(res)


def _call(kernel: LossKernel, static: Tuple, want: Tuple[bool, ...], arrays):
    shapes = [tuple(a.shape) for a in arrays]
    n = _batch_size(kernel, shapes)
    loss_dtype = arrays[kernel.differentiable.index(True)].dtype
    specs = [jax.ShapeDtypeStruct((n,), loss_dtype)]
    for i, w in enumerate(want):
        if w:
            shape = shapes[i] if kernel.batch_axes[i] is not None else (n,) + shapes[i]
            specs.append(jax.ShapeDtypeStruct(shape, arrays[i].dtype))
    operands, layout = _pack_operands(kernel, arrays)
    host = functools.partial(_host_run_packed, kernel, dict(static), want, shapes,
                             tuple(s.dtype for s in specs), layout)
    out = pure_callback(host, tuple(specs), *operands, vmap_method="expand_dims")
    axes = varying_axes(*arrays)  # inside shard_map: vary like the inputs
    return tuple(mark_varying(o, axes) for o in out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _losses(kernel, static, *arrays):
    return _call(kernel, static, (False,) * len(arrays), arrays)[0]


def _losses_fwd(kernel, static, *primals):
    arrays = [p.value for p in primals]
    want = tuple(bool(d and p.perturbed) for d, p in zip(kernel.differentiable, primals))
    out = iter(_call(kernel, static, want, arrays))
    losses = next(out)
    # One residual slot per input: its per-sequence gradient and the input
    # itself (which links the gradient to it, see _gradient), or None.
    return losses, tuple((next(out), x) if w else None for w, x in zip(want, arrays))


def _losses_bwd(kernel, static, residuals, g):
    cts = []
    zero = isinstance(g, SymbolicZero)
    for axis, res in zip(kernel.batch_axes, residuals):
        if res is None or zero:
            cts.append(None)
        else:
            cts.append(_gradient(kernel.name, axis, *res, g))
    return tuple(cts)


def second_order_message(name: str) -> str:
    """The error of every attempt to differentiate a duoloss gradient."""
    return (f"{name}: second derivatives are not implemented (the gradient is computed by "
            f"duoloss's kernel and is not itself differentiable)")


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _gradient(name, axis, grad, x, g):
    """An input's gradient: its per-sequence gradient ``grad`` scaled by the cotangent ``g``.

    ``x`` (the loss's input) is not read: differentiating the gradient w.r.t. it
    (``jax.grad`` of ``jax.grad``, ``jax.hessian``, Hessian-vector products)
    reaches the JVP rule below, which raises instead of returning zeros.
    """
    return scale_by_cotangent(grad, g, axis)


def scale_by_cotangent(grad, g, axis):
    """``sum_b g_b * grad_b``: per-sequence gradients ``grad`` times the losses'
    cotangent ``g`` ``(N,)``.

    ``axis``: the batch axis of ``grad`` (the input's gradient, same shape as the
    input), or ``None`` for a shared input, whose ``grad`` is ``(N, *shape)``
    (one gradient per sequence) and is contracted over ``N``.
    """
    if jnp.ndim(g) == 0:  # a reduced loss: grad is already its gradient
        return grad * g.astype(grad.dtype)
    if axis is None:
        return jnp.tensordot(g.astype(grad.dtype), grad, axes=1)
    shape = [1] * grad.ndim
    shape[axis] = -1
    return grad * g.astype(grad.dtype).reshape(shape)


def _gradient_jvp(name, axis, primals, tangents):
    grad, x, g = primals
    grad_dot, x_dot, g_dot = tangents
    if not (isinstance(x_dot, SymbolicZero) and isinstance(grad_dot, SymbolicZero)):
        raise NotImplementedError(second_order_message(name))
    out = _gradient(name, axis, grad, x, g)
    if isinstance(g_dot, SymbolicZero):  # linear in g: the tangent scales the same way
        return out, jnp.zeros_like(out)
    return out, _gradient(name, axis, grad, x, g_dot)


_gradient.defjvp(_gradient_jvp, symbolic_zeros=True)


_losses.defvjp(_losses_fwd, _losses_bwd, symbolic_zeros=True)


# -- Reduced losses: the batch reduction inside the callback ----------------
#
# The core reduces (duoloss.core._reduce: float64 weights, a correctly rounded
# sum, the weights folded into the gradients) exactly as for the torch
# frontend, so a reduced loss and its gradient are the same bits in both;
# the backward only multiplies by the scalar cotangent.


def _fold_instances(kernel, arrays, base_shapes, k, lead):
    """Arrays with ``k`` leading (vmapped) axes ``lead`` folded into their batch axis."""
    m = int(np.prod(lead))
    folded = []
    for a, axis, base in zip(arrays, kernel.batch_axes, base_shapes):
        if axis is None:
            folded.append(a.reshape(base))
            continue
        a = np.broadcast_to(a, lead + tuple(base))
        a = np.moveaxis(a, tuple(range(k)), tuple(range(axis, axis + k)))
        shape = list(base)
        shape[axis] = m * base[axis]
        folded.append(np.ascontiguousarray(a).reshape(shape))
    return folded


def _host_reduced_packed(kernel, static, want, rspec, base_shapes, out_dtypes, layout,
                         *operands):
    arrays = _unpack_operands(layout, operands)
    lengths = arrays.pop() if rspec[1] else None
    return _host_reduced(kernel, static, want, rspec, base_shapes, out_dtypes, arrays, lengths)


def _host_reduced(kernel, static, want, rspec, base_shapes, out_dtypes, arrays, lengths):
    """The reduced loss and its gradients from host arrays that may carry
    leading vmapped axes (each vmapped instance reduced on its own)."""
    reduction, _, k2_mean = rspec
    k2 = bool(k2_mean and reduction == "mean")
    n = _batch_size(kernel, base_shapes)
    arrays = [np.asarray(a) for a in arrays]
    k = arrays[0].ndim - len(base_shapes[0])
    if k == 0:
        w = reduction_weights(reduction, n, lengths)
        total, grads = run_reduced(kernel.run, kernel.weighted, kernel.batch_axes,
                                   tuple(arrays), want, w, static, k2_mean=k2)
        return _pack(total, grads, want, out_dtypes, True)  # (run_reduced flushed them)
    leads = [a.shape[:k] for a in arrays]
    if lengths is not None:
        lengths = np.asarray(lengths)
        leads.append(lengths.shape[:k])
    lead = tuple(np.broadcast_shapes(*leads))
    if lengths is not None:
        lengths = np.broadcast_to(lengths, lead + (n,))
    if any(axis is None and int(np.prod(ld)) > 1
           for axis, ld in zip(kernel.batch_axes, leads)):  # a vmapped shared input
        outs = []
        for idx in np.ndindex(*lead):
            inst = [a[tuple(i if d > 1 else 0 for i, d in zip(idx, ld))]
                    for a, ld in zip(arrays, leads)]
            outs.append(_host_reduced(kernel, static, want, rspec, base_shapes, out_dtypes,
                                      inst, None if lengths is None else lengths[idx]))
        return tuple(np.stack([o[j] for o in outs]).reshape(lead + outs[0][j].shape)
                     for j in range(len(outs[0])))
    m = int(np.prod(lead))
    folded = _fold_instances(kernel, arrays, base_shapes, k, lead)
    flat_lengths = None if lengths is None else lengths.reshape(m, n)
    w = np.concatenate([reduction_weights(reduction, n, None if flat_lengths is None
                                          else flat_lengths[i]) for i in range(m)])
    losses, grads = run_weighted(kernel.run, kernel.weighted, kernel.batch_axes, tuple(folded),
                                 want, w, static)
    totals = np.stack([weighted_sum(losses[i * n:(i + 1) * n], w[i * n:(i + 1) * n],
                                    k2_mean=k2) for i in range(m)]).reshape(lead)
    out = []
    for i, g in enumerate(grads):
        if not want[i]:
            continue
        axis, base = kernel.batch_axes[i], base_shapes[i]
        if axis is None:  # (m*n, *shape) weighted rows: each instance's rows in order
            g = g.reshape((m, n) + tuple(base))
            acc = np.zeros((m,) + tuple(base), g.dtype)
            for b in range(n):
                acc += g[:, b]
            out.append(acc.reshape(lead + tuple(base)))
            continue
        g = g.reshape(list(base[:axis]) + list(lead) + list(base[axis:]))
        out.append(np.moveaxis(g, tuple(range(axis, axis + k)), tuple(range(k))))
    return _pack(totals, out, (True,) * len(out), out_dtypes)


def _call_reduced(kernel, static, rspec, want, arrays, lengths):
    shapes = [tuple(a.shape) for a in arrays]
    loss_dtype = arrays[kernel.differentiable.index(True)].dtype
    specs = [jax.ShapeDtypeStruct((), loss_dtype)]
    for i, w in enumerate(want):
        if w:
            specs.append(jax.ShapeDtypeStruct(shapes[i], arrays[i].dtype))
    operands = tuple(arrays)
    axes = tuple(kernel.batch_axes)
    if lengths is not None:
        operands, axes = operands + (lengths,), axes + (0,)
    operands, layout = _pack_operands(kernel, operands, axes)
    host = functools.partial(_host_reduced_packed, kernel, dict(static), want, rspec, shapes,
                             tuple(s.dtype for s in specs), layout)
    out = pure_callback(host, tuple(specs), *operands, vmap_method="expand_dims")
    axes = varying_axes(*arrays)
    return tuple(mark_varying(o, axes) for o in out)


def _split(rspec, arrays):
    return (arrays[:-1], arrays[-1]) if rspec[1] else (arrays, None)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _reduced(kernel, static, rspec, *arrays):
    arrays, lengths = _split(rspec, arrays)
    return _call_reduced(kernel, static, rspec, (False,) * len(arrays), arrays, lengths)[0]


def _reduced_fwd(kernel, static, rspec, *primals):
    arrays, lengths = _split(rspec, [p.value for p in primals])
    want = tuple(bool(d and p.perturbed) for d, p in zip(kernel.differentiable, primals))
    out = iter(_call_reduced(kernel, static, rspec, want, tuple(arrays), lengths))
    loss = next(out)
    return loss, tuple((next(out), x) if w else None for w, x in zip(want, arrays))


def _reduced_bwd(kernel, static, rspec, residuals, g):
    zero = isinstance(g, SymbolicZero)
    cts = [None if res is None or zero else _gradient(kernel.name, None, *res, g)
           for res in residuals]
    if rspec[1]:
        cts.append(None)
    return tuple(cts)


_reduced.defvjp(_reduced_fwd, _reduced_bwd, symbolic_zeros=True)


def xla_reduce(losses, reduction: str, lengths=None, *, k2_mean: bool = False):
    """The reduction in jnp ops, for per-sequence losses sharded over devices
    (each shard's callback sees only its own sequences): ``sum_b w_b loss_b``
    with the core's weights' formulas, in XLA's order (not bit-identical to the
    core's correctly rounded sum)."""
    n = losses.shape[0]
    if reduction == "sum":
        return losses.sum()
    if n == 0:
        return jnp.asarray(jnp.nan if k2_mean else 0.0, losses.dtype)
    if lengths is None:
        return losses.sum() / n
    return (losses / jnp.maximum(lengths, 1).astype(losses.dtype)).sum() / n


def apply_kernel(kernel: LossKernel, arrays: Sequence[jax.Array], *, reduction: str = "none",
                 lengths=None, k2_mean: bool = False, **static) -> jax.Array:
    """Losses of ``kernel`` as a differentiable JAX function: per sequence ``(N,)``, or reduced.

    ``reduction`` ``'sum'``/``'mean'``: the core reduces in the callback
    (`duoloss.core._reduce.run_reduced`, with
    ``reduction_weights(reduction, N, lengths)``; ``k2_mean``: the mean of an
    empty batch is NaN), the same function the torch frontend calls, so the
    reduced loss and its gradient are bit-identical to torch's; the backward
    only multiplies by the scalar cotangent.  ``lengths``: ``(N,)`` integers
    (the ``'mean'`` divisor per sequence), or None.

    Works under ``jit``, ``grad``/``vjp``, (nested) ``vmap``, ``pmap`` and
    ``shard_map`` (default ``check_vma=True``): inside ``shard_map`` every input
    is cast to vary over the mesh axes any input varies over, so the gradient
    of a replicated input (e.g. transitions) is summed over the shards, as JAX
    does for its own operations.  Outputs land on the inputs' device (XLA
    copies callback results to it; on a GPU that is one host round trip each
    way per call).

    Args:
      kernel: the core loss.
      arrays: its array inputs, in order.
      reduction: ``'none'``, ``'sum'`` or ``'mean'``.
      lengths: per-sequence lengths of ``'mean'`` (None: ``sum / N``).
      k2_mean: the ``'mean'`` of an empty batch is NaN (k2's functions).
      **static: the kernel's static keyword arguments (hashable).
    """
    if reduction != "none":
        return _apply_reduced(kernel, arrays, reduction, lengths, k2_mean, static)
    loss_dtype = first_floating(arrays)  # sets the losses' dtype, as in the core
    if loss_dtype is not None and is_half(loss_dtype):
        # float16/bfloat16: float32 in (differentiable casts), losses cast back
        arrays = tuple(a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating)
                       and a.dtype != jnp.float64 else a for a in arrays)
        return apply_kernel(kernel, arrays, **static).astype(loss_dtype)
    static = tuple(sorted(static.items()))
    layout = explicit_batch_sharding(arrays, kernel.batch_axes)
    if layout is not None:
        return _explicit(kernel, static, arrays, *layout)
    return _local(kernel, static, arrays)


def _apply_reduced(kernel, arrays, reduction, lengths, k2_mean, static):
    loss_dtype = first_floating(arrays)
    if loss_dtype is not None and is_half(loss_dtype):
        arrays = tuple(a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating)
                       and a.dtype != jnp.float64 else a for a in arrays)
        return _apply_reduced(kernel, arrays, reduction, lengths, k2_mean,
                              static).astype(loss_dtype)
    if explicit_batch_sharding(arrays, kernel.batch_axes) is not None:
        # batch-sharded: per-shard callbacks, the reduction over shards in XLA
        losses = apply_kernel(kernel, arrays, **static)
        return xla_reduce(losses, reduction, lengths, k2_mean=k2_mean)
    static = tuple(sorted(static.items()))
    rspec = (reduction, lengths is not None, bool(k2_mean))
    extra = () if lengths is None else (jnp.asarray(lengths).reshape(-1),)
    axes = varying_axes(*arrays, *extra)
    if axes:
        arrays = tuple(mark_varying(a, axes) for a in arrays)
        extra = tuple(mark_varying(a, axes) for a in extra)
    ops = tuple(arrays) + extra
    try:
        return _reduced(kernel, static, rspec, *ops)
    except TypeError as e:
        if "forward-mode" not in str(e):
            raise
        raise TypeError(forward_mode_message(kernel.name)) from e


def _local(kernel, static, arrays):
    axes = varying_axes(*arrays)
    if axes:
        arrays = tuple(mark_varying(a, axes) for a in arrays)
    try:
        return _losses(kernel, static, *arrays)
    except TypeError as e:  # jax.jvp / jacfwd / hessian: JAX's message without the loss
        if "forward-mode" not in str(e):
            raise
        raise TypeError(forward_mode_message(kernel.name)) from e


def forward_mode_message(name: str) -> str:
    """The error of forward-mode differentiation (jvp) of a duoloss loss."""
    return (f"{name}: forward-mode derivatives (jax.jvp, jax.jacfwd) are not implemented "
            f"(the loss is a jax.custom_vjp); use "
            f"reverse mode (jax.grad, jax.vjp, jax.jacrev); its gradient is not itself "
            f"differentiable")


def _explicit(kernel, static, arrays, kind, mesh, entry):
    """Inputs sharded in their types (explicit mesh axes) under ``jit``.

    Sharded only along the batch: the loss runs under ``shard_map``, one host
    callback per shard on its own device, and the losses come back sharded like
    the batch (gradients like their inputs; a replicated input's gradient is
    summed over the shards).  Any other sharding: the inputs are first gathered
    (``reshard`` to replicated; its transpose re-shards the gradients).
    """
    if kind == "other":
        replicated = jax.sharding.NamedSharding(mesh, PartitionSpec())
        gathered = tuple(jax.sharding.reshard(a, replicated) for a in arrays)
        return _local(kernel, static, gathered)
    in_specs = tuple(
        PartitionSpec() if axis is None else
        PartitionSpec(*[entry if d == axis else None for d in range(jnp.ndim(a))])
        for a, axis in zip(arrays, kernel.batch_axes))
    return jax.shard_map(lambda *xs: _local(kernel, static, xs), mesh=mesh,
                         in_specs=in_specs, out_specs=PartitionSpec(entry))(*arrays)


def host_call(fn, specs, *arrays):
    """``fn``'s outputs for ``specs`` from one host callback, without gradient.

    For results that carry no gradient (Viterbi alignments): the inputs pass
    through ``stop_gradient``, reach ``fn`` as numpy arrays with float16/bfloat16
    as float32 (`host_floats`), and ``fn``'s results are
    cast to the declared ``specs`` (a tuple of ``jax.ShapeDtypeStruct``).  Under
    ``vmap`` the host runs once per instance (``vmap_method="sequential"``).
    """
    dtypes = tuple(np.dtype(s.dtype) for s in specs)

    def run(*xs):
        out = fn(*(host_floats(x) for x in xs))
        return tuple(np.asarray(o).astype(d) for o, d in zip(out, dtypes))

    arrays = tuple(jax.lax.stop_gradient(a) for a in arrays)
    return pure_callback(run, tuple(specs), *arrays, vmap_method="sequential")
