"""``rnnt_loss_from_joiner`` (torch and JAX): the RNN-T loss of a joiner's output computed
in chunks of frames with a recomputing backward.

References: a brute-force sum over every alignment (float64, tiny sizes), and the loss
and gradients of ``rnnt_loss`` on the whole joiner output (float64, to ~1e-12: every
option, chunk sizes that do and do not divide ``T``, lengths 0 included), gradients
w.r.t. the joiner's parameters, ``encoder_out`` and ``predictor_out``; torch == JAX;
the joiner never sees more than ``chunk_size`` frames (forward and backward); bad input.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import duoloss.torch as dt
from rnnt_reference import lattice_paths

N, T, U, V, D = 3, 7, 4, 6, 5
IL = np.array([7, 5, 0])
TL = np.array([4, 2, 0])
OPTIONS = [dict(), dict(reduction="none", blank=0), dict(clamp=0.05),
           dict(fastemit_lambda=0.3, delay_penalty=0.2, reduction="sum"),
           dict(fused_log_softmax=False, reduction="sum")]


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    enc = rng.standard_normal((N, T, D))
    pred = rng.standard_normal((N, U + 1, D))
    w = rng.standard_normal((D, V))
    b = rng.standard_normal(V)
    tg = rng.integers(1, V - 1, (N, U))
    return enc, pred, w, b, tg


def _torch_joiner(w, b, log_softmax=False):
    lin = torch.nn.Linear(D, V).double()
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w.T))
        lin.bias.copy_(torch.from_numpy(b))

    def joiner(e, p):
        out = lin(torch.tanh(e + p))
        return torch.log_softmax(out, -1) if log_softmax else out

    return lin, joiner


def _torch_both(kw, chunk_size, seed=0):
    enc, pred, w, b, tg = _inputs(seed)
    out = []
    for chunked in (False, True):
        lin, joiner = _torch_joiner(w, b, log_softmax=not kw.get("fused_log_softmax", True))
        e = torch.from_numpy(enc).requires_grad_()
        p = torch.from_numpy(pred).requires_grad_()
        args = (torch.from_numpy(tg), torch.from_numpy(IL), torch.from_numpy(TL))
        if chunked:
            loss = dt.rnnt_loss_from_joiner(joiner, e, p, *args, chunk_size=chunk_size, **kw)
        else:
            loss = dt.rnnt_loss(joiner(e[:, :, None], p[:, None]), *args, **kw)
        loss.sum().backward()
        out.append((loss.detach().numpy(), e.grad.numpy(), p.grad.numpy(),
                    lin.weight.grad.numpy().T, lin.bias.grad.numpy()))
    return out


@pytest.mark.parametrize("kw, chunk_size", zip(OPTIONS, [1, 3, None, 2, 7]))
def test_torch_equals_rnnt_loss_on_the_whole_output(kw, chunk_size):
    whole, chunked = _torch_both(kw, chunk_size)
    for a, b in zip(chunked, whole):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert np.any(whole[3] != 0) and np.any(whole[1] != 0)


def test_torch_brute_force():
    enc, pred, w, b, tg = _inputs(1)
    lin, joiner = _torch_joiner(w, b)
    loss = dt.rnnt_loss_from_joiner(joiner, torch.from_numpy(enc), torch.from_numpy(pred),
                                    torch.from_numpy(tg), IL, TL, reduction="none", blank=0,
                                    chunk_size=2).detach()
    h = np.tanh(enc[:, :, None] + pred[:, None]) @ w + b
    logp = h - np.log(np.exp(h).sum(-1, keepdims=True))
    for n in range(N):
        if IL[n] == 0:
            assert float(loss[n]) == (0.0 if TL[n] == 0 else np.inf)
            continue
        scores = [sum(logp[n, t, s, tg[n, s] if m == "x" else 0] for m, s, t in path)
                  for path in lattice_paths(int(TL[n]), int(IL[n]), last_is_blank=True)]
        np.testing.assert_allclose(float(loss[n]), -np.logaddexp.reduce(scores), rtol=1e-12)


def test_torch_joiner_sees_one_chunk_at_a_time():
    enc, pred, w, b, tg = _inputs()
    lin, inner = _torch_joiner(w, b)
    seen = []

    def joiner(e, p):
        seen.append(e.shape[1])
        return inner(e, p)

    e = torch.from_numpy(enc).requires_grad_()
    loss = dt.rnnt_loss_from_joiner(joiner, e, torch.from_numpy(pred), torch.from_numpy(tg),
                                    IL, TL, chunk_size=2)
    n_forward = len(seen)
    loss.backward()
    assert max(seen) <= 2
    assert n_forward == 1 + 4  # the probe (1 frame), then ceil(7 / 2) chunks
    assert len(seen) == n_forward + 4  # the backward recomputes each chunk once
    with torch.no_grad():
        again = dt.rnnt_loss_from_joiner(inner, e, torch.from_numpy(pred), torch.from_numpy(tg),
                                          IL, TL, chunk_size=3)
    assert float(again) == pytest.approx(loss.item(), rel=1e-13)


def test_torch_float32_module():
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(D, V))
    enc = torch.randn(N, T, D, requires_grad=True)
    pred = torch.randn(N, U + 1, D, requires_grad=True)
    tg = torch.randint(0, V - 1, (N, U))
    loss = dt.rnnt_loss_from_joiner(lambda e, p: head(e + p), enc, pred, tg, IL, TL)
    g = torch.autograd.grad(loss, [enc, pred, *head.parameters()])
    ref = dt.rnnt_loss(head(enc[:, :, None] + pred[:, None]), tg, IL, TL)
    g_ref = torch.autograd.grad(ref, [enc, pred, *head.parameters()])
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_torch_bad_input():
    enc, pred, w, b, tg = _inputs()
    _, joiner = _torch_joiner(w, b)
    e, p, t = torch.from_numpy(enc), torch.from_numpy(pred), torch.from_numpy(tg)
    fn = "rnnt_loss_from_joiner"
    with pytest.raises(ValueError, match=f"{fn}: argument 'encoder_out'"):
        dt.rnnt_loss_from_joiner(joiner, e[0], p, t, IL, TL)
    with pytest.raises(ValueError, match=f"{fn}: argument 'targets' must have shape"):
        dt.rnnt_loss_from_joiner(joiner, e, p, t[:, :2], IL, TL)
    with pytest.raises(ValueError, match=f"{fn}: argument 'chunk_size'"):
        dt.rnnt_loss_from_joiner(joiner, e, p, t, IL, TL, chunk_size=0)
    with pytest.raises(TypeError, match=f"{fn}: argument 'joiner' must be callable"):
        dt.rnnt_loss_from_joiner(None, e, p, t, IL, TL)
    with pytest.raises(ValueError, match=f"{fn}: the joiner must map"):
        dt.rnnt_loss_from_joiner(lambda a, c: (a + c).sum(-1), e, p, t, IL, TL)
    with pytest.raises(ValueError, match=f"{fn}: argument 'logit_lengths'"):
        dt.rnnt_loss_from_joiner(joiner, e, p, t, IL + 1, TL)
    with pytest.raises(ValueError, match=f"{fn}: argument 'targets'"):
        dt.rnnt_loss_from_joiner(joiner, e, p, t * 0 + V - 1, IL, TL)  # the blank


# --------------------------------------------------------------------------- #
# JAX                                                                          #
# --------------------------------------------------------------------------- #
jax = pytest.importorskip("jax")
jnp = jax.numpy
import duoloss.jax as dj  # noqa: E402


@pytest.fixture
def x64():
    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", old)


def _jax_joiner(params, log_softmax=False):
    def joiner(e, p):
        out = jnp.tanh(e + p) @ params[0] + params[1]
        return jax.nn.log_softmax(out, -1) if log_softmax else out
    return joiner


@pytest.mark.parametrize("kw, chunk_size", zip(OPTIONS, [2, 7, None, 3, 1]))
def test_jax_equals_rnnt_loss_and_torch(x64, kw, chunk_size):
    enc, pred, w, b, tg = _inputs()
    ls = not kw.get("fused_log_softmax", True)

    def whole(params, e, p):
        return dj.rnnt_loss(_jax_joiner(params, ls)(e[:, :, None], p[:, None]), tg, IL, TL,
                            **kw).sum()

    def chunked(params, e, p):
        return dj.rnnt_loss_from_joiner(_jax_joiner(params, ls), e, p, tg, IL, TL,
                                        chunk_size=chunk_size, **kw).sum()

    a, ga = jax.value_and_grad(whole, argnums=(0, 1, 2))((w, b), enc, pred)
    c, gc = jax.jit(jax.value_and_grad(chunked, argnums=(0, 1, 2)))((w, b), enc, pred)
    np.testing.assert_allclose(c, a, rtol=1e-12, atol=1e-12)
    for x, y in zip(jax.tree.leaves(gc), jax.tree.leaves(ga)):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)
    # torch == JAX (same core on the same lattices)
    _, (lt, ge, gp, gw, gb) = _torch_both(kw, chunk_size)
    np.testing.assert_allclose(c, lt.sum(), rtol=1e-12)
    for x, y in zip((gc[1], gc[2], gc[0][0], gc[0][1]), (ge, gp, gw, gb)):
        np.testing.assert_allclose(x, y, rtol=1e-11, atol=1e-12)


def test_jax_float32_and_reductions():
    enc, pred, w, b, tg = (x.astype(np.float32) if x.dtype == np.float64 else x
                           for x in _inputs())
    j = _jax_joiner((w, b))
    for red in ("none",):
        a = dj.rnnt_loss_from_joiner(j, enc, pred, tg, IL, TL, reduction=red, chunk_size=3)
        r = dj.rnnt_loss(j(enc[:, :, None], pred[:, None]), tg, IL, TL, reduction=red)
        assert a.dtype == jnp.float32 and a.shape == r.shape
        np.testing.assert_allclose(a, r, rtol=1e-5)


def test_jax_bad_input():
    enc, pred, w, b, tg = _inputs()
    j = _jax_joiner((w, b))
    fn = "rnnt_loss_from_joiner"
    with pytest.raises(ValueError, match=f"{fn}: argument 'predictor_out'"):
        dj.rnnt_loss_from_joiner(j, enc, pred[0], tg, IL, TL)
    with pytest.raises(ValueError, match=f"{fn}: the joiner must map"):
        dj.rnnt_loss_from_joiner(lambda a, c: (a + c).sum(-1), enc, pred, tg, IL, TL)
    with pytest.raises(ValueError, match=f"{fn}: argument 'chunk_size'"):
        dj.rnnt_loss_from_joiner(j, enc, pred, tg, IL, TL, chunk_size=-1)
    with pytest.raises(ValueError, match=f"{fn}: argument 'target_lengths'"):
        dj.rnnt_loss_from_joiner(j, enc, pred, tg, IL, TL + 5)


@pytest.mark.parametrize("n, t_max, u_max", [(2, 0, 0), (0, 3, 2), (2, 3, 0), (2, 0, 2)])
def test_empty_shapes_torch_and_jax(n, t_max, u_max):
    lin = torch.nn.Linear(4, 5).double()
    joiner = lambda e, p: lin(torch.tanh(e + p))  # noqa: E731
    enc = torch.randn(n, t_max, 4, dtype=torch.float64, requires_grad=True)
    pred = torch.randn(n, u_max + 1, 4, dtype=torch.float64, requires_grad=True)
    tg = torch.ones(n, u_max, dtype=torch.int64)
    il, tl = torch.full((n,), t_max), torch.full((n,), u_max)
    a = dt.rnnt_loss_from_joiner(joiner, enc, pred, tg, il, tl, reduction="none", blank=0)
    b = dt.rnnt_loss(joiner(enc[:, :, None], pred[:, None]), tg, il, tl, reduction="none",
                     blank=0)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    w = lin.weight.detach().numpy().T
    c = dj.rnnt_loss_from_joiner(lambda e, p: jnp.tanh(e + p) @ w + lin.bias.detach().numpy(),
                                 enc.detach().numpy(), pred.detach().numpy(), tg.numpy(),
                                 il.numpy(), tl.numpy(), reduction="none", blank=0)
    assert c.shape == (n,)
    np.testing.assert_allclose(np.asarray(c), a.detach().numpy(), rtol=1e-5)


def test_torch_recompute_second_backward_and_dropout(monkeypatch):
    """The recomputed regions: a second backward (``retain_graph=True``) recomputes
    again and doubles the gradients; a joiner with dropout gets, in the recomputation,
    the masks of its forward (the CPU generator's state is restored): the gradients
    equal those of plain autograd through the same chunks (no recomputation)."""
    from duoloss.torch import _rnnt_joiner

    enc, pred, w, b, tg = _inputs()
    lin, inner = _torch_joiner(w, b)
    seen = []

    def joiner(e, p):
        seen.append(e.shape[1])
        return inner(e, p)

    e = torch.from_numpy(enc).requires_grad_()
    loss = dt.rnnt_loss_from_joiner(joiner, e, torch.from_numpy(pred), torch.from_numpy(tg),
                                    IL, TL, chunk_size=3)
    loss.backward(retain_graph=True)
    g1, n1 = e.grad.clone(), len(seen)
    loss.backward()
    assert len(seen) == n1 + 3  # ceil(7 / 3) chunks recomputed again
    torch.testing.assert_close(e.grad, 2 * g1, rtol=0, atol=0)

    def dropout_joiner(e, p):
        return lin(torch.nn.functional.dropout(torch.tanh(e + p), 0.5, training=True))

    grads = []
    for plain in (False, True):
        if plain:
            monkeypatch.setattr(_rnnt_joiner, "_checkpointed", lambda fn, *args: fn(*args))
        e = torch.from_numpy(enc).requires_grad_()
        torch.manual_seed(123)
        loss = dt.rnnt_loss_from_joiner(dropout_joiner, e, torch.from_numpy(pred),
                                        torch.from_numpy(tg), IL, TL, chunk_size=2)
        grads.append(torch.autograd.grad(loss, [e, lin.weight]))
    for a, c in zip(*grads):
        torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_torch_never_imports_dynamo():
    """No ``torch.utils.checkpoint`` nor ``torch.library`` dispatch on this path: their
    first call imports ``torch._dynamo`` (about 150 MiB resident)."""
    import subprocess
    import sys

    code = (
        "import sys, torch, duoloss.torch as dt\n"
        "enc = torch.randn(2, 5, 4, requires_grad=True); pred = torch.randn(2, 3, 4)\n"
        "lin = torch.nn.Linear(4, 6)\n"
        "loss = dt.rnnt_loss_from_joiner(lambda e, p: lin(torch.tanh(e + p)), enc, pred,\n"
        "    torch.tensor([[1, 2], [3, 1]]), [5, 4], [2, 1], blank=0, chunk_size=2)\n"
        "loss.backward()\n"
        "assert enc.grad is not None and lin.weight.grad is not None\n"
        "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"
