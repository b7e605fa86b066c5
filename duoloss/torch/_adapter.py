"""Turns a core :class:`~duoloss.core.LossKernel` into a torch autograd function.

The forward runs the core once on host numpy views of the inputs (CUDA tensors
make one round trip through the host) and, when a gradient is needed, keeps the
per-sequence gradients it returns; the backward only scales them by the
upstream gradient.  A batch reduction given as per-sequence weights is folded
into the same autograd node (one node per loss call).

Three paths, chosen per call by :func:`apply_kernel`:

* plain eager code: :class:`_EagerKernelFunction`, the same core call with the
  least bookkeeping (on tiny batches the per-call overhead is what is left to
  measure);
* ``torch.func`` transforms: a ``torch.autograd.Function`` with
  ``setup_context`` (so ``torch.func.grad``/``vjp`` work) and a ``vmap`` rule
  that folds the vmapped dimension into the batch axis: one core call per
  ``torch.func.vmap``, nested ones included;
* while ``torch.compile`` traces: the ``duoloss::kernel_loss`` custom operator
  (:mod:`duoloss.torch._ops`), which dynamo and AOTAutograd trace through with
  no graph break.  (The custom operator is not used eagerly: ``torch.func.grad``
  rejects custom operators with ``register_autograd``, pytorch#168393.)

On every path the gradient is first order only: differentiating it again
(``create_graph=True`` then a second ``grad``, ``torch.func.grad`` of ``grad``,
``hessian``, ``jacfwd``/``jvp``) raises ``NotImplementedError`` naming the loss
instead of silently treating the gradient as a constant.  float16/bfloat16
inputs run the kernels on float32 copies (float64 inside) and return the loss
in the input dtype; under ``torch.autocast`` the loss is float32, as for
``F.ctc_loss`` (on autocast's float32 list).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from duoloss.core import LossKernel

from ._ops import fold as _fold
from ._ops import kernel_id, kernel_loss_op, second_order_message, static_json
from ._ops import unfold as _unfold
from ._ops import weigh_batched

__all__ = ["apply_kernel", "apply_kernel_eager", "check_not_torchscript", "is_concrete",
           "reduction_weights", "to_numpy", "torchscript_error"]

try:  # torch >= 2.0: run plain-tensor code inside functorch transforms
    from torch._functorch.pyfunctorch import (
        temporarily_clear_interpreter_stack as _clear_interpreter_stack)
except ImportError:  # pragma: no cover
    import contextlib
    _clear_interpreter_stack = contextlib.nullcontext

try:  # torch >= 2.0: what Function.apply does before running a single-level function
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead_wrappers
except ImportError:  # pragma: no cover
    def _unwrap_dead_wrappers(args):
        return args


def torchscript_error(fn: str) -> RuntimeError:
    """The error of a duoloss function under ``torch.jit.trace`` / ``torch.jit.script``."""
    return RuntimeError(
        f"{fn}: TorchScript (torch.jit.trace / torch.jit.script) is not supported: duoloss runs "
        f"numba kernels on host buffers, which TorchScript can neither trace nor compile. Use "
        f"torch.compile (fullgraph=True works) or torch.export.export instead, or keep the "
        f"loss outside the traced/scripted module")


def check_not_torchscript(fn: str) -> None:
    """Raise :func:`torchscript_error` while ``torch.jit.trace`` runs."""
    # (dynamo cannot trace _is_tracing; under torch.compile it is never true)
    if not torch.compiler.is_compiling() and torch._C._is_tracing():
        raise torchscript_error(fn)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host numpy view (CPU: no copy) of a tensor.

    Works inside ``torch.func`` transforms (``grad``, ``vjp``: the values of
    the tensor at the innermost level); raises a ``TypeError`` for a tensor
    batched by ``torch.func.vmap`` or traced by ``torch.compile``, whose values
    are unknown here (check :func:`is_concrete` first).
    """
    if torch._C._are_functorch_transforms_active():
        if _is_batched(t):
            raise TypeError("duoloss: cannot read the values of a tensor batched by "
                            "torch.func.vmap on the host (vmap over this argument is not "
                            "supported here; pass it unbatched)")
        with _clear_interpreter_stack():
            while torch._C._functorch.is_functorch_wrapped_tensor(t):
                t = torch._C._functorch.get_unwrapped(t)
            return _host(t)
    return _host(t)


_is_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def _host(t: torch.Tensor) -> np.ndarray:
    if t.requires_grad:
        t = t.detach()
    if not t.is_cpu:
        t = t.cpu()
    return t.numpy()


def is_concrete(*xs) -> bool:
    """True when the values of every tensor argument can be read on the host now.

    False while ``torch.compile`` traces (tensors are fake) and for tensors
    batched by ``torch.func.vmap``.  Frontends skip host-side value checks
    (labels, lengths) when this is False, as the JAX frontends do under ``jit``:
    the kernel then marks an invalid sequence with a NaN loss instead of raising.
    """
    if torch.compiler.is_compiling():
        return False
    if not torch._C._are_functorch_transforms_active():
        return True  # no vmap level is alive
    return not any(isinstance(x, torch.Tensor) and _is_batched(x) for x in xs)


def _is_batched(t: torch.Tensor) -> bool:
    """Whether ``t`` is batched by ``torch.func.vmap`` at some level."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        if torch._C._functorch.is_batchedtensor(t):
            return True
        t = torch._C._functorch.get_unwrapped(t)
    return False


def _requires_grad(t) -> bool:
    """``t.requires_grad`` at any functorch level (a vmapped tensor hides it)."""
    if not isinstance(t, torch.Tensor):
        return False
    while True:
        if t.requires_grad:
            return True
        if not torch._C._functorch.is_functorch_wrapped_tensor(t):
            return False
        t = torch._C._functorch.get_unwrapped(t)


def _scale(grad: torch.Tensor, g: torch.Tensor, axis: Optional[int]) -> torch.Tensor:
    if axis is None:  # shared input: (N, *shape) per-sequence gradients
        return torch.tensordot(g.to(grad.dtype), grad, dims=1)
    shape = [1] * grad.dim()
    shape[axis] = -1
    return grad * g.to(grad.dtype).reshape(shape)


def _weigh(grad: np.ndarray, weights: np.ndarray, axis: Optional[int]) -> np.ndarray:
    """sum_b weights[b] * d loss_b / d x, from the per-sequence gradients."""
    if axis is None:
        return np.tensordot(weights.astype(grad.dtype), grad, axes=1)
    shape = [1] * grad.ndim
    shape[axis] = -1
    grad *= weights.astype(grad.dtype).reshape(shape)
    return grad


def _device(tensors) -> torch.device:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _host_weights(weights) -> Optional[np.ndarray]:
    if weights is None or isinstance(weights, np.ndarray):
        return weights
    return to_numpy(weights).astype(np.float64)


def _host_forward(kernel: LossKernel, static: dict, want: Tuple[bool, ...], weights, tensors,
                  host=to_numpy):
    """One core call: ``[losses, *wanted gradients]`` as tensors on the inputs' device.

    With ``weights`` the loss is ``sum_b w_b loss_b`` (reduced on the host in
    float64) and the gradients are already weighted (in the kernel's own
    stores when it can), so a backward is a single multiply.  ``host`` turns a
    tensor into a host numpy array.
    """
    arrays = tuple([host(t) if isinstance(t, torch.Tensor) else t for t in tensors])
    weights = _host_weights(weights)
    if weights is None:
        losses, grads = kernel.run(arrays, want, **static)
    else:
        if kernel.weighted:
            losses, grads = kernel.run(arrays, want, grad_weights=weights, **static)
            if None in kernel.batch_axes:
                grads = tuple(g if g is None or axis is not None else g.sum(axis=0)
                              for g, axis in zip(grads, kernel.batch_axes))
        else:
            losses, grads = kernel.run(arrays, want, **static)
            grads = tuple(g if g is None else _weigh(g, weights, axis)
                          for g, axis in zip(grads, kernel.batch_axes))
        losses = np.array(np.dot(weights, losses), losses.dtype)  # float64 dot
    out = [torch.from_numpy(losses)]
    for w, g in zip(want, grads):
        if w:
            out.append(torch.from_numpy(g))
    for t in tensors:  # back to the device of the first tensor input
        if isinstance(t, torch.Tensor):
            if not t.is_cpu:
                out = [o.to(t.device) for o in out]
            break
    return out


def _scaled_grads(kernel: LossKernel, want, weighted: bool, grads, grad_loss):
    """The inputs' gradients from the saved per-sequence ones and the cotangent."""
    result = []
    grads = iter(grads)
    for i, wanted in enumerate(want):
        if not wanted or grad_loss is None:
            result.append(None)
        elif weighted:  # scalar output, weights already applied
            g = next(grads)
            result.append(g * grad_loss.to(g.dtype))
        else:
            result.append(_scale(next(grads), grad_loss, kernel.batch_axes[i]))
    return result


def forward_mode_message(name: str) -> str:
    """The error of forward-mode differentiation (jvp) of a duoloss loss."""
    return (f"{name}: forward-mode derivatives (torch.func.jvp, jacfwd, hessian, "
            f"torch.autograd.forward_ad) are not implemented; duoloss losses support reverse "
            f"mode only (backward, torch.autograd.grad, torch.func.grad/vjp/jacrev), and their "
            f"gradients are not themselves differentiable")


class _GradientNode(torch.autograd.Function):
    """``grad = scale(per-sequence gradient, cotangent)`` as a node of a
    ``create_graph=True`` backward (or of a ``torch.func`` transform, whose
    backward always builds a graph).

    Its inputs are the cotangent *and the loss's input*, so a second
    differentiation reaches this node (as it reaches ``_ctc_loss_backward`` for
    torch's own CTC) and raises instead of silently treating the gradient as a
    constant.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(name, axis, weighted, grad, grad_loss, x):
        if weighted:
            return grad * grad_loss.to(grad.dtype)
        return _scale(grad, grad_loss, axis)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.name = inputs[0]

    @staticmethod
    def backward(ctx, *unused):
        raise NotImplementedError(second_order_message(ctx.name))

    @staticmethod
    def jvp(ctx, *unused):
        raise NotImplementedError(second_order_message(ctx.name))


def _graph_grads(kernel: LossKernel, want, weighted: bool, grads, grad_loss, inputs):
    """:func:`_scaled_grads` while grad mode is on: each gradient is a
    :class:`_GradientNode` linked to its input, so differentiating it raises."""
    result = []
    grads = iter(grads)
    for i, wanted in enumerate(want):
        if not wanted or grad_loss is None:
            result.append(None)
        else:
            result.append(_GradientNode.apply(kernel.name, kernel.batch_axes[i], weighted,
                                              next(grads), grad_loss, inputs[i]))
    return result


class _EagerKernelFunction(torch.autograd.Function):
    """Plain eager autograd (no ``torch.func`` transform active, not compiling).

    The same core call as :class:`_KernelFunction`, with less bookkeeping: the
    per-sequence gradients are saved directly (``save_for_backward`` of
    intermediate tensors) instead of travelling as extra (non-differentiable)
    outputs.  That is only valid outside functorch, whose transforms need the
    ``setup_context`` form; on tiny batches it saves about a fifth of a
    training step's loss time.  Saving them (rather than keeping them on
    ``ctx``) makes a second backward without ``retain_graph=True`` raise
    torch's "Trying to backward through the graph a second time".

    NB: the gradient is not differentiable: a ``create_graph=True`` backward
    returns it through :class:`_GradientNode`, whose own backward raises, and
    forward mode (``jvp``) raises too.
    """

    @staticmethod
    def forward(ctx, kernel: LossKernel, static: dict, want: Tuple[bool, ...], weights,
                *tensors):
        out = _host_forward(kernel, static, want, weights, tensors, _host)
        ctx.state = (kernel, want, weights is not None)
        # Saved (not kept on ctx) so that a second backward without retain_graph
        # raises torch's "Trying to backward through the graph a second time".
        ctx.save_for_backward(*out[1:])
        # Only a create_graph=True backward uses them (to link the gradient to them).
        ctx.inputs = tensors
        return out[0]

    @staticmethod
    def backward(ctx, grad_loss):
        grads = ctx.saved_tensors
        kernel, want, weighted = ctx.state
        if torch.is_grad_enabled():  # create_graph=True: a gradient that refuses a 2nd one
            return (None, None, None, None,
                    *_graph_grads(kernel, want, weighted, grads, grad_loss, ctx.inputs))
        return (None, None, None, None, *_scaled_grads(kernel, want, weighted, grads, grad_loss))

    @staticmethod
    def jvp(ctx, *unused):
        raise NotImplementedError(forward_mode_message(ctx.state[0].name))

    @classmethod
    def apply(cls, *args):
        # Straight to the C++ implementation: Function.apply's own work (the
        # functorch check, unwrapping dead functorch wrappers) is done by
        # apply_kernel_eager, the only caller.
        return super(torch.autograd.Function, cls).apply(*args)


class _KernelFunction(torch.autograd.Function):
    """loss = kernel(*tensors) (or sum_b w_b loss_b); gradients from the same core call."""

    @staticmethod
    def forward(kernel: LossKernel, static: Tuple, want: Tuple[bool, ...], weights, *tensors):
        return tuple(_host_forward(kernel, dict(static), want, weights, tensors))

    @staticmethod
    def setup_context(ctx, inputs, output):
        kernel, _, want, weights = inputs[:4]
        ctx.kernel = kernel
        ctx.want = want
        ctx.weighted = weights is not None
        grads = output[1:]
        ctx.mark_non_differentiable(*grads)
        # The wanted inputs too: a backward that builds a graph (torch.func, or
        # create_graph=True) links each gradient to its input (_GradientNode).
        tensors = inputs[4:]
        ctx.save_for_backward(*grads, *[t for t, w in zip(tensors, want) if w])
        # The gradient outputs never get a cotangent: no zeros to build for them.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        saved = ctx.saved_tensors
        k = len(saved) // 2
        if torch.is_grad_enabled():
            inputs = iter(saved[k:])
            inputs = [next(inputs) if w else None for w in ctx.want]
            grads = _graph_grads(ctx.kernel, ctx.want, ctx.weighted, saved[:k], grad_loss,
                                 inputs)
        else:
            grads = _scaled_grads(ctx.kernel, ctx.want, ctx.weighted, saved[:k], grad_loss)
        return (None, None, None, None, *grads)

    @staticmethod
    def jvp(ctx, *unused):
        raise NotImplementedError(forward_mode_message(ctx.kernel.name))

    @staticmethod
    def vmap(info, in_dims, kernel, static, want, weights, *tensors):
        """``torch.func.vmap`` rule: fold the vmapped dimension into the batch axis.

        One core call for all ``info.batch_size`` instances (nested vmaps arrive
        here one level at a time, each folding into the same call).  Only when a
        shared input (``batch_axes[i] is None``, e.g. a transition matrix) is
        itself vmapped are the instances run one by one.
        """
        dims = in_dims[4:]
        wdim = in_dims[3]
        m = info.batch_size
        if any(axis is None and d is not None for axis, d in zip(kernel.batch_axes, dims)):
            outs = []
            for j in range(m):
                args = [t.select(d, j) if d is not None else t for t, d in zip(tensors, dims)]
                w = weights.select(wdim, j) if wdim is not None else weights
                outs.append(_KernelFunction.apply(kernel, static, want, w, *args))
            return tuple(torch.stack(o) for o in zip(*outs)), (0,) * len(outs[0])
        n = next(t.shape[axis + (d is not None and d <= axis)]
                 for t, d, axis in zip(tensors, dims, kernel.batch_axes) if axis is not None)
        folded = tuple(_fold(t, d, axis, m) for t, d, axis in zip(tensors, dims, kernel.batch_axes))
        out = _KernelFunction.apply(kernel, static, want, None, *folded)
        losses = out[0].reshape(m, n)
        grads = []
        j = 1
        for i, wanted in enumerate(want):
            if wanted:
                grads.append((_unfold(out[j], kernel.batch_axes[i], m, n), kernel.batch_axes[i]))
                j += 1
        if weights is None:
            return (losses,) + tuple(g for g, _ in grads), (0,) * (1 + len(grads))
        w = torch.as_tensor(weights, device=losses.device)
        w = w.unsqueeze(0).expand(m, n) if wdim is None else w.movedim(wdim, 0)
        losses, weighted = weigh_batched(losses, grads, w, m, n)
        return (losses,) + tuple(weighted), (0,) * (1 + len(weighted))

    @classmethod
    def apply(cls, *args):
        # Function.apply binds default arguments with inspect.signature on every
        # call (tens of microseconds); forward has no defaults, so outside
        # functorch transforms go straight to the C++ implementation.
        if torch._C._are_functorch_transforms_active():
            return super().apply(*args)
        if any(isinstance(a, torch.Tensor) and _is_wrapped(a) for a in args[4:]):
            args = _unwrap_dead_wrappers(args)
        return super(torch.autograd.Function, cls).apply(*args)


def _compiled_apply(kernel: LossKernel, tensors, weights, static) -> torch.Tensor:
    """The ``torch.compile`` path: one ``duoloss::kernel_loss`` operator call."""
    device = _device(tensors)
    inputs = [t if isinstance(t, torch.Tensor) else torch.as_tensor(t, device=device)
              for t in tensors]
    if weights is not None and not isinstance(weights, torch.Tensor):
        weights = torch.as_tensor(weights, dtype=torch.float64)
    grad_on = torch.is_grad_enabled()
    want = [bool(d and grad_on and t.requires_grad) for d, t in zip(kernel.differentiable, inputs)]
    axes = [-1 if a is None else int(a) for a in kernel.batch_axes]
    return kernel_loss_op(kernel_id(kernel), static_json(kernel, static), axes, want, weights,
                          inputs)[0]


def apply_kernel(kernel: LossKernel, tensors: Sequence[torch.Tensor], *,
                 weights=None, **static) -> torch.Tensor:
    """Losses of ``kernel``: ``(N,)`` per sequence, or ``sum_b weights[b] * loss_b``.

    Differentiable w.r.t. the floating inputs that require grad, under eager
    autograd, ``torch.func`` (``grad``, ``vjp``, ``vmap``) and ``torch.compile``.

    Args:
      kernel: the core loss.
      tensors: its array inputs in order; non-differentiable ones (targets,
        lengths) may be numpy arrays.
      weights: ``(N,)`` numpy array or tensor of per-sequence weights (a
        reduction), or None for per-sequence losses.
      **static: the kernel's static keyword arguments (under ``torch.compile``:
        bool, int, float, str or None).
    """
    check_not_torchscript(kernel.name)
    half = _half_dtype(tensors)
    if half is not None:  # float16/bfloat16: float32 in, the loss cast back
        tensors, dtype = _upcast(tensors, half)
        out = apply_kernel(kernel, tensors, weights=weights, **static)
        return out.to(dtype)
    if torch.compiler.is_compiling():
        return _compiled_apply(kernel, tensors, weights, static)
    if torch.is_grad_enabled():
        want = tuple(d and _requires_grad(t) for d, t in zip(kernel.differentiable, tensors))
    else:  # non-differentiable inputs may be passed as numpy arrays
        want = (False,) * len(tensors)
    out = _apply_eager(kernel, tensors, want, weights, static)
    if out is not None:
        return out
    static_items = tuple(sorted(static.items()))
    return _KernelFunction.apply(kernel, static_items, want, weights, *tensors)[0]


_HALF = (torch.float16, torch.bfloat16)


def _half_dtype(tensors) -> Optional[torch.dtype]:
    """float16/bfloat16 when the first floating input (which sets the loss dtype,
    as in the core) has it, else None."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.dtype if t.dtype in _HALF else None
    return None


def _upcast(tensors, half: torch.dtype):
    """Mixed precision: the floating inputs cast to float32, and the loss dtype.

    The loss comes back in ``half``, or in float32 under ``torch.autocast``:
    like ``F.ctc_loss``, which is on autocast's float32 list, float16, bfloat16
    and float32 inputs are cast to float32 (float64 stays) and the loss is
    float32.  The casts are differentiable, so each gradient comes back in its
    input's dtype.  The kernels compute in float64 either way.
    """
    device = next(t.device for t in tensors if isinstance(t, torch.Tensor))
    if torch.is_autocast_enabled(device.type):
        half = torch.float32
    out = tuple(t.float() if isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.dtype != torch.float64 else t for t in tensors)
    return out, half


def autocast_inputs(*tensors):
    """Under ``torch.autocast`` (for the first tensor's device type): the
    float16/bfloat16/float32 tensors cast to float32 (float64 and None kept), as
    autocast's float32 list does for ``F.ctc_loss``; else the tensors unchanged.

    For losses with several floating inputs (emissions and float32 parameters
    such as ASG transitions), so that their dtypes agree before validation.
    """
    first = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
    if first is None or not torch.is_autocast_enabled(first.device.type):
        return tensors
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.is_floating_point()
                 and t.dtype != torch.float64 else t for t in tensors)


def apply_kernel_eager(kernel: LossKernel, tensors: Sequence, want: Tuple[bool, ...], weights,
                       static: dict) -> Optional[torch.Tensor]:
    """:func:`apply_kernel` for a frontend's common case, with the bookkeeping
    done by the caller: ``want`` (which inputs get a gradient) precomputed and
    ``static`` a dict of the kernel's keyword arguments.

    Only for plain eager calls (not compiling, no ``torch.func`` transform
    active); returns None for anything else, and the caller then uses
    :func:`apply_kernel`.
    """
    if torch.compiler.is_compiling() or _half_dtype(tensors) is not None:
        return None
    return _apply_eager(kernel, tensors, want, weights, static)


def _apply_eager(kernel, tensors, want, weights, static) -> Optional[torch.Tensor]:
    """The eager Function, unless a ``torch.func`` transform is active or an
    input is a (dead) functorch wrapper; the caller has ruled out compiling."""
    if torch._C._are_functorch_transforms_active():
        return None
    for t in tensors:
        if type(t) is not np.ndarray and isinstance(t, torch.Tensor) and _is_wrapped(t):
            return None
    return _EagerKernelFunction.apply(kernel, static, want, weights, *tensors)


# 'sum' weights per batch size, shared by every call (never written to).
_ONES = {}


def reduction_weights(reduction: str, target_lengths):
    """Per-sequence weights of a reduction: None for 'none', ones for 'sum', and
    ``1 / (N * max(target_length, 1))`` for 'mean' (ctc_loss's convention).

    ``target_lengths`` is a numpy array (numpy weights) or a tensor (float64
    tensor weights on its device, e.g. while ``torch.compile`` traces).
    """
    if reduction == "none":
        return None
    if isinstance(target_lengths, torch.Tensor):
        tl = target_lengths.reshape(-1).to(torch.float64)
        if reduction == "sum":
            return torch.ones_like(tl)
        return 1.0 / (tl.shape[0] * torch.clamp(tl, min=1.0))
    n = target_lengths.shape[0]
    if reduction == "sum":
        ones = _ONES.get(n)
        if ones is None:
            ones = _ONES[n] = np.ones(n)
        return ones
    if n == 0:
        return np.zeros(0)
    return 1.0 / (n * np.maximum(target_lengths.astype(np.float64), 1.0))
