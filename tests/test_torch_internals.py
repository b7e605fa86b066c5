"""The torch frontend's shared machinery: private-API isolation, weights, argument coercion."""
from __future__ import annotations

import io
import pathlib
import re
import tokenize

import numpy as np
import pytest
import torch

import duoloss.torch as dt
from duoloss.torch import _args, _private, _weights

TORCH_DIR = pathlib.Path(dt.__file__).parent


def _code_only(path: pathlib.Path) -> str:
    """The source without comments and string literals (docstrings included)."""
    out = []
    with open(path, "rb") as f:
        for tok in tokenize.tokenize(f.readline):
            if tok.type not in (tokenize.COMMENT, tokenize.STRING, tokenize.ENCODING):
                out.append(tok.string)
    return " ".join(out)


@pytest.mark.parametrize("path", sorted(p.name for p in TORCH_DIR.glob("*.py")))
def test_private_torch_apis_only_in_private_module(path):
    if path == "_private.py":
        return
    code = _code_only(TORCH_DIR / path)
    # torch._C, torch._functorch, torch._log_softmax, from torch._x import ...
    assert not re.search(r"\btorch\s*\.\s*_", code), path
    # Function.apply's C++ base, dynamo's private marker attribute
    assert "_FunctionBase" not in code and "_dynamo" not in code, path
    assert not re.search(r"super\s*\(\s*torch\s*\.\s*autograd\s*\.\s*Function", code), path


def test_private_module_has_the_private_uses():
    # the test above is not vacuous: the same scan finds them here
    code = _code_only(TORCH_DIR / "_private.py")
    assert re.search(r"\btorch\s*\.\s*_", code)


def test_functorch_introspection_wrappers():
    x = torch.arange(6.0).reshape(2, 3)
    assert not _private.transforms_active()
    assert not _private.is_wrapped(x)
    seen = {}

    def f(a):
        seen["active"] = _private.transforms_active()
        seen["wrapped"] = _private.is_wrapped(a)
        seen["batched"] = _private.is_batched_level(a)
        inner = _private.unwrap(a)
        seen["inner_wrapped"] = _private.is_wrapped(inner)
        return (a * a).sum()

    g = torch.func.grad(f)(x)
    torch.testing.assert_close(g, 2 * x)
    assert seen == {"active": True, "wrapped": True, "batched": False, "inner_wrapped": False}

    def h(a):
        seen["vmap_batched"] = _private.is_batched_level(a)
        return a.sum()

    torch.func.vmap(h)(x)
    assert seen["vmap_batched"] is True
    assert not _private.transforms_active()


def test_function_apply_matches_function_apply():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return 2 * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            return 3 * g  # not the true derivative: shows which backward ran

    x = torch.ones(3, requires_grad=True)
    y = _private.function_apply(Double)(x)
    y.sum().backward()
    torch.testing.assert_close(y.detach(), torch.full((3,), 2.0))
    torch.testing.assert_close(x.grad, torch.full((3,), 3.0))


def test_mark_constant_result_sets_dynamo_marker_without_importing_dynamo():
    def f():
        return 1
    assert _private.mark_constant_result(f) is f
    assert getattr(f, "_dynamo_marked_constant") is True


# ---------------------------------------------------------------- weights


def test_reduction_weights_numpy_and_tensor_agree_with_the_formula():
    tl = np.array([3, 0, 5, 1])
    for reduction, ref in (("sum", np.ones(4)), ("mean", 1.0 / (4 * np.array([3, 1, 5, 1.0])))):
        w_np = _weights.reduction_weights(reduction, tl)
        w_t = _weights.reduction_weights(reduction, torch.from_numpy(tl))
        np.testing.assert_array_equal(w_np, ref)
        np.testing.assert_array_equal(w_t.numpy(), ref)
    assert _weights.reduction_weights("none", tl) is None


def test_core_weighting_against_explicit_sums():
    """The reduction every path runs (duoloss.core._reduce, which replaced _weights.weigh_host)."""
    from duoloss.core._reduce import run_weighted, sum_weighted

    rng = np.random.default_rng(0)
    n = 4
    w = rng.uniform(0.1, 2.0, n)
    losses = rng.normal(size=n).astype(np.float32)
    batched = rng.normal(size=(5, n, 3)).astype(np.float32)  # batch axis 1
    shared = rng.normal(size=(n, 3, 3)).astype(np.float32)   # (N, *shape)
    axes = (1, None, 0)

    def run(arrays, want, grad_weights=None):
        return losses.copy(), (batched.copy(), shared.copy(), None)

    weighted = run_weighted(run, False, axes, (), (True,) * 3, w, {})
    total, (gb, gs, none) = sum_weighted(*weighted, w, axes)
    assert none is None and total.dtype == np.float32 and total.shape == ()
    np.testing.assert_allclose(total, sum(w[b] * float(losses[b]) for b in range(n)), rtol=1e-6)
    for b in range(n):
        np.testing.assert_allclose(gb[:, b], w[b] * batched[:, b], rtol=1e-6)
    np.testing.assert_allclose(gs, sum(w[b] * shared[b] for b in range(n)), rtol=1e-5)
    # a weighted kernel (grad_weights): its gradients are final; shared ones are only summed
    _, (pb, ps, _) = sum_weighted(*run_weighted(run, True, axes, (), (True,) * 3, w, {}),
                                  w, axes)
    np.testing.assert_array_equal(pb, batched)
    np.testing.assert_allclose(ps, shared.sum(axis=0), rtol=1e-6)


def test_scale_cotangent_against_explicit_products():
    rng = np.random.default_rng(1)
    g = torch.from_numpy(rng.normal(size=3))
    batched = torch.from_numpy(rng.normal(size=(5, 3, 2)))
    out = _weights.scale_cotangent(batched, g, 1, False)
    for b in range(3):
        torch.testing.assert_close(out[:, b], g[b] * batched[:, b])
    shared = torch.from_numpy(rng.normal(size=(3, 4)))
    for axis in (None, -1):
        torch.testing.assert_close(_weights.scale_cotangent(shared, g, axis, False),
                                   sum(g[b] * shared[b] for b in range(3)))
    scalar = torch.tensor(2.5, dtype=torch.float64)
    torch.testing.assert_close(_weights.scale_cotangent(batched, scalar, 1, True), 2.5 * batched)


# ---------------------------------------------------------------- argument coercion


@pytest.mark.parametrize("lengths", [
    (4, 2), [4, 2], (torch.tensor(4), torch.tensor(2)), torch.tensor([4, 2]),
    np.array([4, 2]), (np.int32(4), np.int64(2)),
])
def test_int_lengths_eager_and_traced_forms_agree(lengths):
    data = torch.zeros(5, 2, 3)
    eager = _args.int_lengths("f", "lengths", lengths, data)
    traced = _args.int_lengths("f", "lengths", lengths, data, traced=True)
    np.testing.assert_array_equal(np.asarray(eager).astype(np.int64), [4, 2])
    assert isinstance(traced, torch.Tensor)
    np.testing.assert_array_equal(traced.numpy().astype(np.int64), [4, 2])


@pytest.mark.parametrize("scalar", [3, torch.tensor(3), np.int64(3)])
def test_int_lengths_scalar_for_a_batch_of_one(scalar):
    data = torch.zeros(5, 1, 3)
    eager = _args.int_lengths("f", "lengths", scalar, data)
    traced = _args.int_lengths("f", "lengths", scalar, data, traced=True)
    assert tuple(eager.shape) == (1,) and tuple(traced.shape) == (1,)
    assert int(eager[0]) == int(traced[0]) == 3


def test_padded_targets_traced_matches_a_python_split():
    targets = torch.tensor([5, 6, 7, 8, 9, 1])
    lengths = torch.tensor([2, 0, 3, 1])
    out = _args.padded_targets_traced(targets, lengths)
    ref = np.zeros((4, 6), np.int64)
    pos = 0
    for b, n in enumerate(lengths.tolist()):
        ref[b, :n] = targets[pos:pos + n].numpy()
        pos += n
    np.testing.assert_array_equal(out.numpy(), ref)


# ---------------------------------------------------------------- the one Function


def test_inplace_change_of_an_input_after_the_call_keeps_the_backward_working():
    # Plain eager calls keep references to their inputs, not saved tensors (the
    # gradient was computed in the forward), as before the paths were merged.
    x = torch.randn(20, 2, 5, dtype=torch.float64).log_softmax(-1).requires_grad_()
    tg, il, tl = torch.tensor([[1, 2], [3, 4]]), torch.tensor([20, 20]), torch.tensor([2, 2])
    ref = torch.autograd.grad(dt.ctc_loss(x, tg, il, tl), x)[0]
    loss = dt.ctc_loss(x, tg, il, tl)
    with torch.no_grad():
        x.add_(1.0)
    loss.backward()
    torch.testing.assert_close(x.grad, ref, rtol=0, atol=0)


def test_eager_and_torch_func_gradients_are_bit_identical():
    x = torch.randn(20, 2, 5, dtype=torch.float32).log_softmax(-1)
    tg, il, tl = torch.tensor([[1, 2], [3, 4]]), torch.tensor([20, 17]), torch.tensor([2, 1])
    xe = x.clone().requires_grad_()
    dt.ctc_loss(xe, tg, il, tl).backward()
    gf = torch.func.grad(lambda a: dt.ctc_loss(a, tg, il, tl))(x)
    _, vjp = torch.func.vjp(lambda a: dt.ctc_loss(a, tg, il, tl), x)
    (gv,) = vjp(torch.tensor(1.0))
    torch.testing.assert_close(gf, xe.grad, rtol=0, atol=0)
    torch.testing.assert_close(gv, xe.grad, rtol=0, atol=0)
