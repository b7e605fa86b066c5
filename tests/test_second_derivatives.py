"""Second derivatives and forward mode are refused with a named error, never silently wrong.

duoloss's gradient comes from its kernel's forward-backward and is not itself
differentiable.  Before this was enforced, differentiating it again returned a
Hessian without the loss's term (``create_graph=True`` plus an extra term),
or zeros (``torch.func.grad`` of ``grad``, ``jax.grad`` of ``jax.grad``,
``jax.hessian``).  The reference for "wrong": the Hessian of ``sum(x**3)``
alone is ``6 x``, and that is what the old code returned for
``loss(x) + sum(x**3)``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt

T, N, C = 6, 2, 4
TARGETS = np.array([[1, 2], [3, 3]], np.int64)
IL = np.array([6, 5], np.int64)
TL = np.array([2, 2], np.int64)


def _lp(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, N, C))
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _ctc_graphs():
    from test_graph_loss import ctc_graph
    return [ctc_graph(list(t[:n])) for t, n in zip(TARGETS, TL)]


# Each case: (name of the loss in the message, torch f(x), jax f(x)) for the
# differentiable input x of shape (T, N, C) (emissions / log_probs).
def _torch_losses():
    tg, il, tl = (torch.from_numpy(a) for a in (TARGETS, IL, TL))
    trans = torch.zeros(C, C, dtype=torch.float64)
    graphs = _ctc_graphs()
    return {
        "ctc_loss": lambda x: dt.ctc_loss(x, tg, il, tl),
        "asg_loss": lambda x: dt.asg_loss(x, trans, tg, il, tl),
        "graph_loss": lambda x: dt.graph_loss(x, graphs, il),
    }


def _jax_losses():
    tg, il, tl = (jnp.asarray(a) for a in (TARGETS, IL, TL))
    trans = jnp.zeros((C, C), jnp.float32)
    graphs = _ctc_graphs()
    return {
        "ctc_loss": lambda x: dj.ctc_loss(x, tg, il, tl),
        "asg_loss": lambda x: dj.asg_loss(x, trans, tg, il, tl),
        "graph_loss": lambda x: dj.graph_loss(x, graphs, il),
    }


LOSSES = ["ctc_loss", "asg_loss", "graph_loss"]


def _second(name):
    return rf"{name}: second derivatives are not implemented"


def _forward(name):
    return rf"{name}: forward-mode derivatives .* are not implemented"


# ---------------------------------------------------------------- torch


@pytest.fixture(scope="module")
def torch_losses():
    return _torch_losses()


@pytest.mark.parametrize("name", LOSSES)
def test_torch_create_graph_hessian_with_another_term_raises(torch_losses, name):
    f = torch_losses[name]
    x = torch.from_numpy(_lp()).requires_grad_()
    (g,) = torch.autograd.grad(f(x) + (x ** 3).sum(), x, create_graph=True)
    with pytest.raises(NotImplementedError, match=_second(name)):
        torch.autograd.grad(g.sum(), x)  # main returned 6 x: the loss's term was missing


@pytest.mark.parametrize("name", LOSSES)
def test_torch_create_graph_first_order_is_unchanged(torch_losses, name):
    f = torch_losses[name]
    x = torch.from_numpy(_lp()).requires_grad_()
    (g_plain,) = torch.autograd.grad(f(x), x)
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    assert g.requires_grad  # linked to x, so that a second grad reaches the refusal
    torch.testing.assert_close(g.detach(), g_plain, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match=_second(name)):
        g.sum().backward()


def test_torch_asg_transitions_second_derivative_raises():
    tg, il, tl = (torch.from_numpy(a) for a in (TARGETS, IL, TL))
    x = torch.from_numpy(_lp())
    trans = torch.zeros(C, C, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(dt.asg_loss(x, trans, tg, il, tl) + (trans ** 2).sum(), trans,
                               create_graph=True)
    with pytest.raises(NotImplementedError, match=_second("asg_loss")):
        torch.autograd.grad(g.sum(), trans)


@pytest.mark.parametrize("name", LOSSES)
def test_torch_func_nested_grad_raises(torch_losses, name):
    f = torch_losses[name]
    x = torch.from_numpy(_lp())
    g = torch.func.grad(f)(x)  # first order still fine
    assert g.shape == x.shape and g.abs().sum() > 0
    with pytest.raises(NotImplementedError, match=_second(name)):
        torch.func.grad(lambda y: torch.func.grad(f)(y).sum())(x)  # main: zeros
    with pytest.raises(NotImplementedError, match=_second(name)):
        torch.func.jacrev(torch.func.jacrev(f))(x)


@pytest.mark.parametrize("name", LOSSES)
def test_torch_forward_mode_names_the_loss(torch_losses, name):
    f = torch_losses[name]
    x = torch.from_numpy(_lp())
    with pytest.raises(NotImplementedError, match=_forward(name)):
        torch.func.jvp(f, (x,), (torch.ones_like(x),))
    with pytest.raises(NotImplementedError, match=_forward(name)):
        torch.func.jacfwd(f)(x)
    with pytest.raises(NotImplementedError, match=name):
        torch.func.hessian(f)(x)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match=_forward(name)):
        f(fwAD.make_dual(x, torch.ones_like(x)))


def test_torch_autograd_functional_hvp_raises(torch_losses):
    x = torch.from_numpy(_lp())
    with pytest.raises(NotImplementedError, match=_second("ctc_loss")):
        torch.autograd.functional.hvp(torch_losses["ctc_loss"], x, torch.ones_like(x))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_second_backward_without_retain_graph_raises(reduction):
    # main silently doubled x.grad; torch's own functions raise.
    tg, il, tl = (torch.from_numpy(a) for a in (TARGETS, IL, TL))
    x = torch.from_numpy(_lp()).requires_grad_()
    loss = dt.ctc_loss(x, tg, il, tl, reduction=reduction).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_torch_retain_graph_backward_accumulates_exactly():
    tg, il, tl = (torch.from_numpy(a) for a in (TARGETS, IL, TL))
    x = torch.from_numpy(_lp()).requires_grad_()
    loss = dt.asg_loss(x, None, tg, il, tl)
    loss.backward(retain_graph=True)
    g1 = x.grad.clone()
    loss.backward()
    torch.testing.assert_close(x.grad, 2 * g1, rtol=0, atol=0)


def test_torch_func_path_second_backward_raises():
    # The torch.func Function (used eagerly for dead functorch wrappers) saves
    # its gradients too: a second backward raises there as well.
    from duoloss.core import CTC_KERNEL
    from duoloss.torch._adapter import _KernelFunction
    x = torch.from_numpy(_lp()).requires_grad_()
    out = _KernelFunction.apply(CTC_KERNEL, (("blank", 0), ("zero_infinity", False)),
                                (True, False, False, False), None, x, TARGETS, IL, TL)[0]
    out.sum().backward()
    g1 = x.grad.clone()
    assert g1.abs().sum() > 0
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()


def test_torch_compiled_create_graph_second_derivative_raises(torch_losses):
    import torch._functorch.config as functorch_config
    # A backward compiled with donated buffers refuses create_graph=True on its
    # own (its error depends on what ran before); without them the first-order
    # create_graph gradient must be right and the second one refused.
    with functorch_config.patch(donated_buffer=False):
        torch._dynamo.reset()
        f = torch.compile(torch_losses["ctc_loss"], backend="aot_eager", fullgraph=True)
        x = torch.from_numpy(_lp()).requires_grad_()
        (g,) = torch.autograd.grad(f(x) + (x ** 3).sum(), x, create_graph=True)
        (g_plain,) = torch.autograd.grad(torch_losses["ctc_loss"](x), x)
        torch.testing.assert_close(g.detach(), g_plain + 3 * x.detach() ** 2)
        # AOTAutograd's own refusal is reached because the gradient is linked to
        # x (main returned 6 x here).
        with pytest.raises(RuntimeError, match="double backward|second derivatives"):
            torch.autograd.grad(g.sum(), x)


# ---------------------------------------------------------------- JAX


@pytest.fixture(scope="module")
def jax_losses():
    return _jax_losses()


@pytest.mark.parametrize("name", LOSSES)
def test_jax_grad_of_grad_raises(jax_losses, name):
    f = jax_losses[name]
    x = jnp.asarray(_lp(), jnp.float32)
    g = jax.grad(f)(x)  # first order still fine, and the same under jit
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(f))(x)), np.asarray(g))
    assert float(jnp.abs(g).sum()) > 0
    with pytest.raises(NotImplementedError, match=_second(name)):
        jax.grad(lambda y: jax.grad(f)(y).sum())(x)  # main: zeros
    with pytest.raises(NotImplementedError, match=_second(name)):
        jax.grad(lambda y: jax.grad(lambda z: f(z) + (z ** 3).sum())(y).sum())(x)  # main: 6 x
    with pytest.raises(NotImplementedError, match=_second(name)):
        jax.jit(jax.hessian(f))(x)
    with pytest.raises(NotImplementedError, match=_second(name)):
        jax.jvp(jax.grad(f), (x,), (jnp.ones_like(x),))  # Hessian-vector product
    with pytest.raises(NotImplementedError, match=_second(name)):
        jax.jacrev(jax.jacrev(f))(x)


@pytest.mark.parametrize("name", LOSSES)
def test_jax_forward_mode_names_the_loss(jax_losses, name):
    f = jax_losses[name]
    x = jnp.asarray(_lp(), jnp.float32)
    with pytest.raises(TypeError, match=_forward(name)):
        jax.jvp(f, (x,), (jnp.ones_like(x),))
    with pytest.raises(TypeError, match=_forward(name)):
        jax.jacfwd(f)(x)


def test_jax_asg_transitions_second_derivative_raises():
    tg, il, tl = (jnp.asarray(a) for a in (TARGETS, IL, TL))
    x = jnp.asarray(_lp(), jnp.float32)
    f = lambda tr: dj.asg_loss(x, tr, tg, il, tl)  # noqa: E731
    tr = jnp.zeros((C, C), jnp.float32)
    assert float(jnp.abs(jax.grad(f)(tr)).sum()) > 0
    with pytest.raises(NotImplementedError, match=_second("asg_loss")):
        jax.hessian(f)(tr)


def test_jax_cotangent_linearity_still_differentiable(jax_losses):
    # The gradient is linear in the cotangent: differentiating the VJP w.r.t. the
    # cotangent only (not the input) is a legitimate first-order quantity.
    f = jax_losses["ctc_loss"]
    x = jnp.asarray(_lp(), jnp.float32)
    _, vjp = jax.vjp(f, x)
    (g,) = vjp(jnp.float32(1.0))
    d = jax.grad(lambda c: (vjp(c)[0] * x).sum())(jnp.float32(2.0))
    np.testing.assert_allclose(float(d), float((g * x).sum()), rtol=1e-6)
