"""The array vocabulary of `duoloss._xp`: one small namespace per framework.

Each namespace is a class whose static methods are the only array operations
the framework-free algorithms (`duoloss._xp.k2`, `duoloss._xp.ctc`)
call, with numpy's names and argument conventions (``axis=``, ``keepdims=``).
A namespace imports its framework lazily (`namespace_of` looks at the
array's type), so importing this module imports neither torch nor JAX.

What each operation means (``x`` an array of the namespace's framework):

=========================== ===================================================
``asarray(v, like)``        ``v`` (nested Python numbers) as an array on
                            ``like``'s device
``arange(n, like, dtype)``  ``0 .. n-1``; ``dtype`` None: the default index
                            dtype, else the dtype of the array ``dtype``
``full(shape, v, like)``    an array of ``v`` with ``like``'s dtype and device
``zeros_like(x)``           zeros of ``x``'s shape, dtype, device
``astype(x, like)``         ``x`` cast to ``like``'s dtype (no-op if equal)
``index(x)``                ``x`` as the framework's gather index dtype
                            (torch: int64; JAX/numpy: unchanged)
``concat(xs, axis)``        concatenation
``swapaxes(x, a, b)``       a view with two axes swapped
``broadcast_to(x, shape)``  a broadcast view (torch ``expand``)
``contiguous(x)``           a dense copy where the layout is strided (torch)
``where(c, a, b)``          elementwise select (``a``/``b`` arrays or scalars)
``isfinite(x)``             elementwise
``exp``, ``log``            elementwise
``maximum(x, v)``           elementwise maximum with a scalar
``clip(x, lo, hi)``         elementwise clamp to ``[lo, hi]`` (scalars)
``amax(x, axis)``           maximum over one axis, kept as size 1
``sum(x, axis)``            sum over one axis, kept as size 1
``mean(x, axes)``           mean over a tuple of axes, removed
``argmax(x, axis)``         index of the first maximum (bools allowed)
``cummin_rev(x)``           ``out[..., i] = min(x[..., i:])`` on the last axis
``matmul(a, b)``            batched matrix product
``logsumexp(x, axis)``      ``log(sum(exp(x)))`` over one axis, removed
``take_along_axis(x, i,     ``out[..., k, ...] = x[..., i[..., k, ...], ...]``
axis)``                     on ``axis``; ``i`` broadcasts against ``x`` on the
                            other axes (JAX: out-of-range indices are clipped)
``take(x, i)``              ``x[i]`` for a 1-D ``x``
``put_along_axis(base, i,   a copy of ``base`` with ``base[..., i[k]] = v[k]``
v, axis)``                  on ``axis`` (JAX: out-of-range writes dropped)
``stop_gradient(x)``        ``x`` without a gradient (torch ``detach``)
``tiny(x)``                 the smallest normal number of ``x``'s dtype
=========================== ===================================================

Device paths (Triton, XLA) reuse the algorithms with these namespaces; adding
an operation means adding it to all three classes with the same semantics.
"""
from __future__ import annotations

import numpy as np

__all__ = ["NumpyOps", "JaxOps", "TorchOps", "namespace_of"]


class NumpyOps:
    """numpy (host reference; no gradients)."""

    name = "numpy"

    @staticmethod
    def asarray(v, like):
        return np.asarray(v)

    @staticmethod
    def arange(n, like=None, dtype=None):
        return np.arange(n) if dtype is None else np.arange(n, dtype=dtype.dtype)

    @staticmethod
    def full(shape, value, like):
        return np.full(shape, value, like.dtype)

    @staticmethod
    def zeros_like(x):
        return np.zeros_like(x)

    @staticmethod
    def astype(x, like):
        return x.astype(like.dtype, copy=False)

    @staticmethod
    def index(x):
        return x

    @staticmethod
    def concat(xs, axis):
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def swapaxes(x, a, b):
        return np.swapaxes(x, a, b)

    @staticmethod
    def broadcast_to(x, shape):
        return np.broadcast_to(x, shape)

    @staticmethod
    def contiguous(x):
        return np.ascontiguousarray(x)

    where = staticmethod(np.where)
    isfinite = staticmethod(np.isfinite)
    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    maximum = staticmethod(np.maximum)
    clip = staticmethod(np.clip)
    matmul = staticmethod(np.matmul)

    @staticmethod
    def amax(x, axis):
        return x.max(axis=axis, keepdims=True)

    @staticmethod
    def sum(x, axis):
        return x.sum(axis=axis, keepdims=True)

    @staticmethod
    def mean(x, axes):
        return x.mean(axis=axes)

    @staticmethod
    def argmax(x, axis):
        return np.argmax(x, axis=axis)

    @staticmethod
    def cummin_rev(x):
        return np.flip(np.minimum.accumulate(np.flip(x, -1), axis=-1), -1)

    @staticmethod
    def logsumexp(x, axis):
        m = x.max(axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        return (np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m).squeeze(axis)

    @staticmethod
    def take_along_axis(x, i, axis):
        return np.take_along_axis(x, i, axis=axis)

    @staticmethod
    def take(x, i):
        return x[i]

    @staticmethod
    def put_along_axis(base, i, v, axis):
        out = base.copy()
        np.put_along_axis(out, i, v, axis=axis)
        return out

    @staticmethod
    def stop_gradient(x):
        return x

    @staticmethod
    def tiny(x):
        return np.finfo(x.dtype).tiny


class JaxOps:
    """jax.numpy (traceable; gathers clip and scatters drop out-of-range indices)."""

    name = "jax"

    def __init__(self):
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp

    def asarray(self, v, like):
        return self.jnp.asarray(v)

    def arange(self, n, like=None, dtype=None):
        return self.jnp.arange(n) if dtype is None else self.jnp.arange(n, dtype=dtype.dtype)

    def full(self, shape, value, like):
        return self.jnp.full(shape, value, like.dtype)

    def zeros_like(self, x):
        return self.jnp.zeros_like(x)

    def astype(self, x, like):
        return x.astype(like.dtype)

    def index(self, x):
        return x

    def concat(self, xs, axis):
        return self.jnp.concatenate(xs, axis=axis)

    def swapaxes(self, x, a, b):
        return self.jnp.swapaxes(x, a, b)

    def broadcast_to(self, x, shape):
        return self.jnp.broadcast_to(x, shape)

    def contiguous(self, x):
        return x

    def where(self, c, a, b):
        return self.jnp.where(c, a, b)

    def isfinite(self, x):
        return self.jnp.isfinite(x)

    def exp(self, x):
        return self.jnp.exp(x)

    def log(self, x):
        return self.jnp.log(x)

    def maximum(self, x, v):
        return self.jnp.maximum(x, v)

    def clip(self, x, lo, hi):
        return self.jnp.clip(x, lo, hi)

    def matmul(self, a, b):
        return self.jnp.matmul(a, b)

    def amax(self, x, axis):
        return x.max(axis=axis, keepdims=True)

    def sum(self, x, axis):
        return x.sum(axis=axis, keepdims=True)

    def mean(self, x, axes):
        return x.mean(axis=axes)

    def argmax(self, x, axis):
        return self.jnp.argmax(x, axis=axis)

    def cummin_rev(self, x):
        return self.jax.lax.cummin(x, axis=x.ndim - 1, reverse=True)

    def logsumexp(self, x, axis):
        return self.jax.nn.logsumexp(x, axis=axis)

    def take_along_axis(self, x, i, axis):
        return self.jnp.take_along_axis(x, i, axis=axis, mode="clip")

    def take(self, x, i):
        return self.jnp.take(x, i, mode="clip")

    def put_along_axis(self, base, i, v, axis):
        # base.at[idx].set with every other axis indexed by a broadcast arange
        idx = tuple(i if d == axis % base.ndim else
                    self.jnp.arange(base.shape[d]).reshape(
                        (-1,) + (1,) * (base.ndim - 1 - d))
                    for d in range(base.ndim))
        return base.at[idx].set(v, mode="drop")

    def stop_gradient(self, x):
        return self.jax.lax.stop_gradient(x)

    def tiny(self, x):
        return self.jnp.finfo(x.dtype).tiny


class TorchOps:
    """torch (autograd flows through every operation but ``stop_gradient``)."""

    name = "torch"

    def __init__(self):
        import torch
        self.torch = torch

    def asarray(self, v, like):
        return self.torch.tensor(v, device=like.device)

    def arange(self, n, like, dtype=None):
        if dtype is None:
            return self.torch.arange(n, device=like.device)
        return self.torch.arange(n, device=like.device, dtype=dtype.dtype)

    def full(self, shape, value, like):
        return like.new_full(shape, value)

    def zeros_like(self, x):
        return self.torch.zeros_like(x)

    def astype(self, x, like):
        return x.to(like.dtype)

    def index(self, x):
        return x.to(self.torch.int64)

    def concat(self, xs, axis):
        return self.torch.cat(xs, dim=axis)

    def swapaxes(self, x, a, b):
        return x.transpose(a, b)

    def broadcast_to(self, x, shape):
        return x.expand(shape)

    def contiguous(self, x):
        return x.contiguous()

    def where(self, c, a, b):
        return self.torch.where(c, a, b)

    def isfinite(self, x):
        return self.torch.isfinite(x)

    def exp(self, x):
        return x.exp()

    def log(self, x):
        return x.log()

    def maximum(self, x, v):
        return self.torch.clamp(x, min=v)

    def clip(self, x, lo, hi):
        return x.clamp(lo, hi)

    def matmul(self, a, b):
        return self.torch.matmul(a, b)

    def amax(self, x, axis):
        return x.amax(dim=axis, keepdim=True)

    def sum(self, x, axis):
        return x.sum(dim=axis, keepdim=True)

    def mean(self, x, axes):
        return x.mean(dim=axes)

    def argmax(self, x, axis):
        if x.dtype == self.torch.bool:  # torch's argmax takes no bools
            x = x.to(self.torch.int8)
        return self.torch.argmax(x, dim=axis)

    def cummin_rev(self, x):
        t = self.torch
        return t.flip(t.cummin(t.flip(x, (-1,)), dim=-1).values, (-1,))

    def logsumexp(self, x, axis):
        return self.torch.logsumexp(x, dim=axis)

    def take_along_axis(self, x, i, axis):
        axis %= x.ndim
        off = [1 if d == axis else n for d, n in enumerate(x.shape)]
        shape = list(self.torch.broadcast_shapes(
            off, [1 if d == axis else n for d, n in enumerate(i.shape)]))
        shape[axis] = i.shape[axis]
        i = self.index(i).expand(shape)
        if list(x.shape) != shape:  # gather needs x as large as i off the axis
            xs = list(shape)
            xs[axis] = x.shape[axis]
            x = x.expand(xs)
        return self.torch.gather(x, axis, i)

    def take(self, x, i):
        return x[self.index(i)]

    def put_along_axis(self, base, i, v, axis):
        return base.scatter(axis, self.index(i), v)

    def stop_gradient(self, x):
        return x.detach()

    def tiny(self, x):
        return self.torch.finfo(x.dtype).tiny


_CACHE: dict = {}


def namespace_of(x):
    """The namespace for ``x``'s framework (torch tensor, JAX array or tracer, numpy)."""
    mod = type(x).__module__.split(".", 1)[0]
    if mod not in ("torch", "jax", "jaxlib"):
        mod = "numpy"
    elif mod == "jaxlib":
        mod = "jax"
    ns = _CACHE.get(mod)
    if ns is None:
        ns = {"numpy": NumpyOps, "jax": JaxOps, "torch": TorchOps}[mod]
        ns = ns() if ns is not NumpyOps else ns
        _CACHE[mod] = ns
    return ns
