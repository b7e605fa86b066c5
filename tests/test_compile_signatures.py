"""Both frontends reach the core's kernels with the same numba signatures.

numba compiles (and caches) a kernel once per argument-type signature; a
read-only array is a different numba type from a writeable one.  JAX hands its
host callbacks read-only buffers, so without care every kernel would compile a
second time for JAX users (seconds per loss family; issue 19).  These tests run
JAX calls and check that no kernel gained a signature with a read-only array.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy
from numba.core import types  # noqa: E402
from numba.core.registry import CPUDispatcher  # noqa: E402

import duoloss.jax as dj  # noqa: E402
from duoloss.jax._callback import _writeable  # noqa: E402


def _kernels():
    """Every numba kernel defined at module level in duoloss (all of them are)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("duoloss.") and module is not None:
            for obj in list(vars(module).values()):
                if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == name:
                    yield obj


def _readonly_signatures():
    found = set()
    for obj in _kernels():
        for sig in obj.signatures:
            if any(isinstance(t, types.Array) and not t.mutable for t in sig):
                found.add((obj.py_func.__qualname__, str(sig)))
    return found


def test_writeable_view_shares_memory_and_values():
    a = np.asarray(jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3))
    assert not a.flags.writeable
    w = _writeable(a)
    assert w.flags.writeable and w.dtype == a.dtype and w.shape == a.shape
    assert np.shares_memory(w, a) and np.array_equal(w, a)
    t = _writeable(np.asarray(jnp.arange(12, dtype=jnp.int32).reshape(3, 4))[:, 1:])
    assert t.flags.writeable and np.array_equal(t, np.arange(12).reshape(3, 4)[:, 1:])
    empty = np.zeros((0, 3), np.float32)
    assert _writeable(empty) is empty


def test_jax_calls_compile_no_readonly_signatures():
    before = _readonly_signatures()
    rng = np.random.default_rng(0)
    lp = jax.nn.log_softmax(jnp.asarray(rng.standard_normal((9, 2, 5)), jnp.float32), -1)
    tg, il, tl = np.array([[1, 2], [3, 0]]), np.array([9, 7]), np.array([2, 1])
    jax.block_until_ready(jax.value_and_grad(lambda x: dj.ctc_loss(x, tg, il, tl))(lp))
    jax.block_until_ready(jax.jit(jax.grad(lambda x: dj.ctc_loss(x, tg, il, tl)))(lp))
    jax.block_until_ready(jax.grad(
        lambda x: dj.asg_loss(x, jnp.zeros((5, 5), jnp.float32), tg, il, tl))(lp))
    x = jnp.asarray(rng.standard_normal((2, 4, 3, 5)), jnp.float32)
    jax.block_until_ready(jax.grad(lambda x: dj.rnnt_loss(
        x, tg.astype(np.int32), np.array([4, 3], np.int32), tl.astype(np.int32), blank=0))(x))
    jax.block_until_ready(dj.ctc_align(lp, tg, il, tl))
    # the decoders' searches (issue 25): eager calls and the decoder's host callback
    em = jnp.swapaxes(lp, 0, 1)  # (B, T, C)
    decoder = dj.ctc_decoder(["-", "|", "a", "b", "c"])
    decoder(em, np.array([9, 7]))
    jax.block_until_ready(jax.jit(decoder.padded)(em, np.array([9, 7])))
    from duoloss.graphs import ctc_topo
    dj.graph_decode(em, ctc_topo(5), lengths=np.array([9, 7]))
    assert _readonly_signatures() - before == set()
