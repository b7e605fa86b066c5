"""``jax.pure_callback`` that also works under the ``jax.enable_x64`` context manager.

JAX checks a callback's results on the thread that runs the callback, after
canonicalising them with *that thread's* x64 setting.  The ``jax.enable_x64``
context manager is thread-local, and a long-running jitted computation runs its
host callbacks on a JAX worker thread where the context is not set: a float64
result is then canonicalised to float32 and rejected ("Incorrect output dtype
... Expected: float64, Actual: float32") — depending on timing, so it looks
random.  64-bit results therefore cross as pairs of uint32 (which no x64 setting
touches; a zero-copy view on the host) and are bitcast back inside the traced
program, where float64/int64 are valid types because they were declared there.

The host function receives JAX's buffers as *read-only* numpy arrays.  numba types
a read-only array as a different type from a writeable one, so every core kernel
would be compiled (and cached) a second time for JAX alone.  The core never writes
to its inputs, so the callback hands it writeable views of the same memory instead
(`_writeable`, zero-copy; small operands are copied, which costs less): one compiled
signature serves both frontends.

**No deadlock under threads.**  ``jax.pure_callback`` (jax 0.10) hands the host function
its operands through ``jax.device_put(operands, cpu_device)``: a host-to-device copy that
the CPU client runs *asynchronously on its worker pool*, and reading such an operand
(``np.asarray``) waits for that copy.  The callback itself runs on a worker of the same
pool, inside a computation.  When several Python threads run jitted computations at once,
every worker can be a callback waiting for a copy queued behind it: a deadlock (reproduced
with a plain ``pure_callback`` whose host function only reads its operand, numba holding
or releasing the GIL alike; a host function that never reads its operands does not hang,
nor does ``jax_cpu_enable_async_dispatch=False``).  Holding a lock around the host function
cannot help (the waiting callback keeps its worker).  So duoloss's callbacks are a
primitive of their own (`_host_callback_p`) lowered exactly as ``pure_callback`` is
(``emit_python_callback``: the FFI handler that calls Python with the operands as numpy
arrays) but whose host side uses those numpy arrays as they come, without the
``device_put`` round trip; that is also cheaper.  It uses jax internals
(``jax._src.callback``), checked at import: where they are missing the public
``jax.pure_callback`` is used instead (`HOST_CALLBACK_PRIMITIVE` says which).
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import numpy as np

__all__ = ["HOST_CALLBACK_PRIMITIVE", "pure_callback"]


def _make_primitive():
    """``pure_callback``'s primitive without the ``device_put`` of its operands (see the
    module docstring), or None where this JAX lacks the internals it is built from."""
    try:
        from jax._src import callback as jcb, core, dispatch, ffi
        from jax._src.interpreters import batching, mlir
        emit, op_sharding, flat_callback = (jcb.emit_python_callback, jcb._callback_op_sharding,
                                            jcb._FlatCallback)
    except (ImportError, AttributeError):  # pragma: no cover (other JAX versions)
        return None
    prim = core.Primitive("duoloss_host_callback")
    prim.multiple_results = True
    dispatch.prim_requires_devices_during_lowering.add(prim)
    prim.def_impl(functools.partial(dispatch.apply_primitive, prim))
    prim.def_abstract_eval(lambda *avals, callback, result_avals, sharding, vmap_method:
                           result_avals)
    batching.primitive_batchers[prim] = functools.partial(ffi.ffi_batching_rule, prim)

    def lowering(ctx, *args, callback, sharding, result_avals, vmap_method):
        del result_avals, vmap_method

        def host(*arrays):  # numpy arrays from XLA's FFI handler, used as they are
            return tuple(callback(*arrays))

        result, _, _ = emit(ctx, host, None, list(args), ctx.avals_in, ctx.avals_out,
                            has_side_effect=False, returns_token=False,
                            sharding=op_sharding(ctx.module_context.axis_context, sharding,
                                                 ctx.avals_out))
        return result

    mlir.register_lowering(prim, lowering, cacheable=False)

    def bind(fn, result_shape_dtypes, *args, vmap_method):
        flat_args, in_tree = jax.tree.flatten((args, {}))
        flat_avals, out_tree = jax.tree.flatten(result_shape_dtypes)
        avals = tuple(core.ShapedArray(tuple(a.shape), a.dtype) for a in flat_avals)
        out = prim.bind(*flat_args, callback=flat_callback(fn, in_tree), result_avals=avals,
                        sharding=None, vmap_method=vmap_method)
        return jax.tree.unflatten(out_tree, out)

    return bind


_bind = _make_primitive()
#: Whether duoloss's callbacks use their own primitive (immune to the thread deadlock).
HOST_CALLBACK_PRIMITIVE = _bind is not None


def _host_callback(fn, result_shape_dtypes, *args, vmap_method):
    if _bind is None:  # pragma: no cover
        return jax.pure_callback(fn, result_shape_dtypes, *args, vmap_method=vmap_method)
    return _bind(fn, result_shape_dtypes, *args, vmap_method=vmap_method)


class _Memory:
    """The memory of a read-only array, exposed as writeable (keeps the array alive)."""

    __slots__ = ("__array_interface__", "_array")

    def __init__(self, array: np.ndarray):
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface
        self._array = array


def _writeable(a):
    """A host array (a callback's ``jax.Array`` as numpy) that numba types as writeable:
    ``a`` itself, or for read-only memory a writeable view of it (no copy)."""
    if type(a) is not np.ndarray:
        if isinstance(a, jax.Array):
            a = np.asarray(a)
        elif not isinstance(a, np.ndarray):
            return a
    if not a.flags.writeable and a.size:
        view = np.asarray(_Memory(a))
        if view.dtype == a.dtype:  # (structured/object dtypes keep the original)
            return view
    return a


#: Read-only operands up to this size are copied instead (a 4 KB copy takes 0.2 us,
#: the writeable view about 2 us: its array interface is built in Python).
_COPY_MAX_BYTES = 16384


def _host_input(a):
    """`_writeable`, or for a small read-only array a writeable copy (cheaper)."""
    if type(a) is not np.ndarray:
        if not isinstance(a, jax.Array):
            return _writeable(a)
        a = np.asarray(a)  # (the callback's operands arrive as jax.Arrays)
    if not a.flags.writeable and a.nbytes <= _COPY_MAX_BYTES:
        return a.copy()
    return _writeable(a)


def _with_writeable_inputs(fn: Callable) -> Callable:
    # (the callbacks' operands are flat arrays: no pytree walk, a few us per call)
    def host(*arrays):
        return fn(*[_host_input(a) for a in arrays])

    return host


def pure_callback(fn: Callable, result_shape_dtypes, *args, vmap_method: str):
    """``jax.pure_callback(fn, result_shape_dtypes, *args, vmap_method=...)``, x64-safe and
    safe from many threads (no ``device_put`` of the operands: see the module docstring)."""
    fn = _with_writeable_inputs(fn)
    flat, tree = jax.tree.flatten(result_shape_dtypes)
    dtypes = [np.dtype(s.dtype) for s in flat]
    wide = [dt.itemsize == 8 for dt in dtypes]
    if not any(wide):
        return _host_callback(fn, result_shape_dtypes, *args, vmap_method=vmap_method)
    specs = tuple(jax.ShapeDtypeStruct(tuple(s.shape) + (2,), np.uint32) if w else s
                  for s, w in zip(flat, wide))

    def host(*arrays):
        out = []
        for o, w, dt in zip(jax.tree.leaves(fn(*arrays)), wide, dtypes):
            o = np.asarray(o, dtype=dt, order="C")  # (ascontiguousarray makes 0-d 1-d)
            out.append(o.reshape(o.shape + (1,)).view(np.uint32) if w else o)
        return tuple(out)

    outs = _host_callback(host, specs, *args, vmap_method=vmap_method)
    outs = [jax.lax.bitcast_convert_type(o, dt) if w else o
            for o, w, dt in zip(outs, wide, dtypes)]
    return jax.tree.unflatten(tree, outs)
