"""Turns a core `LossKernel` into a torch autograd function.

The forward runs the core once on host numpy views of the inputs (CUDA tensors
make one round trip through the host) and, when a gradient is needed, keeps the
per-sequence gradients it returns; the backward only scales them by the
upstream gradient.  A batch reduction given as per-sequence weights is folded
into the same autograd node (one node per loss call); the weighting and the
scaling are `duoloss.torch._weights`, shared by every path.

Two paths, chosen per call by `apply_kernel`:

* eager code and ``torch.func`` transforms: `_KernelFunction`, one
  ``torch.autograd.Function`` in ``setup_context`` form (so ``torch.func.grad``
  and ``vjp`` work) with a ``vmap`` rule that folds the vmapped dimension into
  the batch axis: one core call per ``torch.func.vmap``, nested ones included.
  Plain eager calls skip ``Function.apply``'s Python layer (on tiny batches the
  per-call overhead is what is left to measure);
* while ``torch.compile`` traces: the ``duoloss::kernel_loss`` custom operator
  (`duoloss.torch._ops`), which dynamo and AOTAutograd trace through with
  no graph break.  (The custom operator is not used eagerly: ``torch.func.grad``
  rejects custom operators with ``register_autograd``, pytorch#168393.)  Both
  share the host forward (`run_on_host`) and the
  ``vmap`` rule (`vmap_fold`).

On every path the gradient is first order only: differentiating it again
(``create_graph=True`` then a second ``grad``, ``torch.func.grad`` of ``grad``,
``hessian``, ``jacfwd``/``jvp``) raises ``NotImplementedError`` naming the loss
instead of silently treating the gradient as a constant.  float16/bfloat16
inputs run the kernels on float32 copies (float64 inside) and return the loss
in the input dtype; under ``torch.autocast`` the loss is float32, as for
``F.ctc_loss`` (on autocast's float32 list).

Private torch APIs: only through `duoloss.torch._private`.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from duoloss.core import LossKernel

from . import _private
from ._ops import host as _host
from ._ops import (FastApply, kernel_id, kernel_loss_op, run_on_host, second_order_message,
                   static_json, vmap_fold)
from ._weights import reduction_weights, scale_cotangent, unit_cotangent

__all__ = ["apply_kernel", "apply_kernel_eager", "autocast_inputs", "check_not_torchscript",
           "forward_mode_message", "is_concrete", "reduction_weights", "to_numpy",
           "torchscript_error"]

_transforms_active = _private.transforms_active
_is_wrapped = _private.is_wrapped


def torchscript_error(fn: str) -> RuntimeError:
    """The error of a duoloss function under ``torch.jit.trace`` / ``torch.jit.script``."""
    return RuntimeError(
        f"{fn}: TorchScript (torch.jit.trace / torch.jit.script) is not supported: duoloss runs "
        f"numba kernels on host buffers, which TorchScript can neither trace nor compile. Use "
        f"torch.compile (fullgraph=True works) or torch.export.export instead, or keep the "
        f"loss outside the traced/scripted module")


def check_not_torchscript(fn: str) -> None:
    """Raise `torchscript_error` while ``torch.jit.trace`` runs."""
    # (dynamo cannot trace is_tracing; under torch.compile it is never true)
    if not torch.compiler.is_compiling() and torch.jit.is_tracing():
        raise torchscript_error(fn)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host numpy view (CPU: no copy) of a tensor.

    Works inside ``torch.func`` transforms (``grad``, ``vjp``: the values of
    the tensor at the innermost level); raises a ``TypeError`` for a tensor
    batched by ``torch.func.vmap`` or traced by ``torch.compile``, whose values
    are unknown here (check `is_concrete` first).
    """
    if _transforms_active():
        if _is_batched(t):
            raise TypeError("duoloss: cannot read the values of a tensor batched by "
                            "torch.func.vmap on the host (vmap over this argument is not "
                            "supported here; pass it unbatched)")
        with _private.clear_interpreter_stack():
            while _is_wrapped(t):
                t = _private.unwrap(t)
            return _host(t)
    return _host(t)


def is_concrete(*xs) -> bool:
    """True when the values of every tensor argument can be read on the host now.

    False while ``torch.compile`` traces (tensors are fake) and for tensors
    batched by ``torch.func.vmap``.  Frontends skip host-side value checks
    (labels, lengths) when this is False, as the JAX frontends do under ``jit``:
    the kernel then marks an invalid sequence with a NaN loss instead of raising.
    """
    if torch.compiler.is_compiling():
        return False
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return False  # a CUDA graph capture: no host reads (bad sequences get NaN)
    if not _transforms_active():
        return True  # no vmap level is alive
    return not any(isinstance(x, torch.Tensor) and _is_batched(x) for x in xs)


def _is_batched(t: torch.Tensor) -> bool:
    """Whether ``t`` is batched by ``torch.func.vmap`` at some level."""
    while _is_wrapped(t):
        if _private.is_batched_level(t):
            return True
        t = _private.unwrap(t)
    return False


def _requires_grad(t) -> bool:
    """``t.requires_grad`` at any functorch level (a vmapped tensor hides it)."""
    if not isinstance(t, torch.Tensor):
        return False
    while True:
        if t.requires_grad:
            return True
        if not _is_wrapped(t):
            return False
        t = _private.unwrap(t)


def _device(tensors) -> torch.device:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _host_weights(weights) -> Optional[np.ndarray]:
    if weights is None or isinstance(weights, np.ndarray):
        return weights
    return to_numpy(weights).astype(np.float64)


def _host_forward(kernel: LossKernel, static: dict, want: Tuple[bool, ...], weights, tensors):
    """One core call: ``[losses, *wanted gradients]`` as tensors on the inputs' device.

    With ``weights`` the loss is ``sum_b w_b loss_b`` (reduced on the host in
    float64) and the gradients are already weighted, so a backward is a single
    multiply.
    """
    if _transforms_active():
        arrays = tuple([to_numpy(t) if isinstance(t, torch.Tensor) else t for t in tensors])
    else:
        arrays = tuple([_host(t) if isinstance(t, torch.Tensor) else t for t in tensors])
    losses, grads = run_on_host(kernel.run, kernel.weighted, kernel.batch_axes, arrays, want,
                                _host_weights(weights), static)
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


def _scaled_grads(kernel: LossKernel, want, weighted: bool, grads, grad_loss, inputs):
    """The inputs' gradients from the saved per-sequence ones and the cotangent.

    While grad mode is on (a ``create_graph=True`` backward, or a ``torch.func``
    transform, whose backward always builds a graph) each gradient is a
    `_GradientNode` linked to its input, so differentiating it raises.
    """
    graph = torch.is_grad_enabled()
    result = []
    grads = iter(grads)
    inputs = iter(inputs)
    for i, wanted in enumerate(want):
        if not wanted:
            result.append(None)
            continue
        g, x = next(grads), next(inputs)
        if grad_loss is None:
            result.append(None)
        elif graph:
            result.append(_GradientNode.apply(kernel.name, kernel.batch_axes[i], weighted,
                                              g, grad_loss, x))
        elif weighted and unit_cotangent(grad_loss):
            # ``loss.backward()`` of a reduced loss: ``g * 1`` has g's bits, so the saved
            # gradient is handed on as it is (as a pass-through node hands on its
            # cotangent; autograd clones it before accumulating in place while the graph
            # still holds it)
            result.append(g)
        else:
            result.append(scale_cotangent(g, grad_loss, kernel.batch_axes[i], weighted))
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
        return scale_cotangent(grad, grad_loss, axis, weighted)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.name = inputs[0]

    @staticmethod
    def backward(ctx, *unused):
        raise NotImplementedError(second_order_message(ctx.name))

    @staticmethod
    def jvp(ctx, *unused):
        raise NotImplementedError(second_order_message(ctx.name))


class _KernelFunction(FastApply, torch.autograd.Function):
    """``loss = kernel(*tensors)`` (or ``sum_b w_b loss_b``), gradients from the same core call.

    Outputs: the loss and the wanted per-sequence gradients (non-differentiable
    outputs, saved for the backward, so the ``setup_context`` form works under
    ``torch.func``).  Saved tensors also make a second backward without
    ``retain_graph=True`` raise torch's "Trying to backward through the graph a
    second time".

    Its eager ``apply`` skips ``Function.apply``'s per-call ``inspect.signature``
    binding (`FastApply`: ``forward`` has no default arguments).

    NB: the gradient is not differentiable: a backward that builds a graph
    returns it through `_GradientNode`, whose own backward raises, and
    forward mode (``jvp``) raises too.
    """

    @staticmethod
    def forward(kernel: LossKernel, static, want: Tuple[bool, ...], weights, *tensors):
        return tuple(_host_forward(kernel, dict(static), want, weights, tensors))

    @staticmethod
    def setup_context(ctx, inputs, output):
        kernel, _, want, weights = inputs[:4]
        ctx.kernel = kernel
        ctx.want = want
        ctx.weighted = weights is not None
        grads = output[1:]
        ctx.inputs = None
        if grads:
            ctx.mark_non_differentiable(*grads)
            # The wanted inputs too: a backward that builds a graph links each
            # gradient to its input (_GradientNode).  Under a torch.func
            # transform they must be saved tensors (functorch rewraps them per
            # level); in plain eager code plain references do, so that, as for
            # a Function that does not save its inputs, changing an input in
            # place after the call (under no_grad) does not fail the backward.
            wanted = [t for t, w in zip(inputs[4:], want) if w]
            if _transforms_active():
                ctx.save_for_backward(*grads, *wanted)
            else:
                ctx.save_for_backward(*grads)
                ctx.inputs = wanted
        # The gradient outputs never get a cotangent: no zeros to build for them.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        saved = ctx.saved_tensors
        if ctx.inputs is None:
            k = len(saved) // 2
            saved, inputs = saved[:k], saved[k:]
        else:
            inputs = ctx.inputs
        return (None, None, None, None,
                *_scaled_grads(ctx.kernel, ctx.want, ctx.weighted, saved, grad_loss, inputs))

    @staticmethod
    def jvp(ctx, *unused):
        raise NotImplementedError(forward_mode_message(ctx.kernel.name))

    @staticmethod
    def vmap(info, in_dims, kernel, static, want, weights, *tensors):
        """``torch.func.vmap`` rule: `vmap_fold`."""
        outs, dims = vmap_fold(
            info.batch_size, in_dims[4:], in_dims[3], kernel.batch_axes, want, weights, tensors,
            lambda w, args: _KernelFunction.apply(kernel, static, want, w, *args))
        return tuple(outs), tuple(dims)



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
    return _KernelFunction.apply(kernel, static, want, weights, *tensors)[0]


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
    """`apply_kernel` for a frontend's common case, with the bookkeeping
    done by the caller: ``want`` (which inputs get a gradient) precomputed and
    ``static`` a dict of the kernel's keyword arguments.

    Only for plain eager calls (not compiling, no ``torch.func`` transform
    active); returns None for anything else, and the caller then uses
    `apply_kernel`.
    """
    if (torch.compiler.is_compiling() or _transforms_active()
            or _half_dtype(tensors) is not None):
        return None
    return _KernelFunction.apply(kernel, static, want, weights, *tensors)[0]
