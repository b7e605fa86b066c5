"""ctc_align / asg_align / asg_viterbi in torch and JAX vs brute force, and their validation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import duoloss.jax as dj
import duoloss.torch as dt
from test_asg_reference import brute_asg_align, brute_ctc_align


def _ctc_batch(rng):
    lp = rng.standard_normal((6, 3, 4)).astype(np.float32)
    tg = np.array([[1, 2, 2], [3, 0, 0], [1, 1, 0]])
    il = np.array([6, 4, 2])
    tl = np.array([3, 1, 2])  # sequence 2 is infeasible (needs 3 frames)
    return lp, tg, il, tl


def test_ctc_align_frontends_match_brute_force():
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(0))
    lt, st = dt.ctc_align(torch.tensor(lp), torch.tensor(tg), torch.tensor(il), tuple(tl.tolist()))
    lj, sj = jax.jit(dj.ctc_align)(lp, tg, il, tl)
    assert lt.dtype == torch.int64 and st.dtype == torch.float32
    np.testing.assert_array_equal(lt.numpy(), np.asarray(lj))
    np.testing.assert_array_equal(st.numpy(), np.asarray(sj))
    for b in range(3):
        best, arg = brute_ctc_align(lp[:il[b], b].astype(np.float64), list(tg[b, :tl[b]]), 0)
        if best == -np.inf:
            assert st[b] == -np.inf and torch.all(lt[b] == -1)
            continue
        np.testing.assert_allclose(st[b].item(), best, rtol=1e-6)
        assert tuple(lt[b, :il[b]].tolist()) in arg and torch.all(lt[b, il[b]:] == -1)


def test_ctc_align_unbatched_and_concatenated():
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(1))
    full_l, full_s = dt.ctc_align(torch.tensor(lp), torch.tensor(tg), il.tolist(), tl.tolist())
    one_l, one_s = dt.ctc_align(torch.tensor(lp[:, 0]), torch.tensor(tg[0]), [6], [3])
    assert one_l.shape == (6,) and one_s.shape == ()
    np.testing.assert_array_equal(one_l.numpy(), full_l[0].numpy())
    flat = np.concatenate([tg[b, :tl[b]] for b in range(3)])
    cl, cs = dj.ctc_align(lp, flat, il, tl)
    np.testing.assert_array_equal(np.asarray(cl), full_l.numpy())


@pytest.mark.parametrize("with_trans", [True, False])
def test_asg_align_frontends_match_brute_force(with_trans):
    rng = np.random.default_rng(2)
    em = rng.standard_normal((6, 3, 3))
    tr = rng.standard_normal((3, 3)) if with_trans else None
    sv = rng.standard_normal(3)
    tg = np.array([[0, 1, 1], [2, 0, 0], [1, 2, 0]])
    il, tl = np.array([6, 5, 1]), np.array([3, 2, 2])
    lt, st = dt.asg_align(torch.tensor(em), None if tr is None else torch.tensor(tr),
                          torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                          start_transitions=torch.tensor(sv))
    with jax.enable_x64(True):
        lj, sj = dj.asg_align(em, tr, tg, il, tl, start_transitions=sv)
        np.testing.assert_array_equal(lt.numpy(), np.asarray(lj))
        np.testing.assert_array_equal(st.numpy(), np.asarray(sj))
    for b in range(3):
        best, arg = brute_asg_align(em[:il[b], b], tr, sv, list(tg[b, :tl[b]]))
        if best == -np.inf:
            assert st[b] == -np.inf and torch.all(lt[b] == -1)
            continue
        np.testing.assert_allclose(st[b].item(), best, rtol=1e-12)
        assert tuple(lt[b, :il[b]].tolist()) in arg


def test_asg_viterbi_frontends_agree():
    rng = np.random.default_rng(3)
    em = rng.standard_normal((5, 2, 4)).astype(np.float32)
    tr = rng.standard_normal((4, 4)).astype(np.float32)
    lt, st = dt.asg_viterbi(torch.tensor(em), torch.tensor(tr), [5, 3])
    lj, sj = jax.jit(dj.asg_viterbi)(em, tr, np.array([5, 3]))
    np.testing.assert_array_equal(lt.numpy(), np.asarray(lj))
    np.testing.assert_allclose(st.numpy(), np.asarray(sj))
    assert torch.all(lt[1, 3:] == -1)


def test_jax_align_has_no_gradient_and_vmaps():
    lp, tg, il, tl = _ctc_batch(np.random.default_rng(4))
    g = jax.grad(lambda x: dj.ctc_align(x, tg, il, tl)[1][0])(jnp.asarray(lp))
    assert not np.asarray(g).any()
    lv, sv = jax.vmap(lambda x: dj.ctc_align(x, tg, il, tl))(jnp.stack([lp, lp]))
    assert lv.shape == (2, 3, 6)


@pytest.mark.parametrize("frontend", ["torch", "jax"])
def test_align_validation(frontend):
    conv = torch.tensor if frontend == "torch" else jnp.asarray
    mod = dt if frontend == "torch" else dj
    lp = conv(np.zeros((4, 2, 3), np.float32))
    with pytest.raises(ValueError, match=r"ctc_align: argument 'targets' must not contain the "
                                         r"blank index"):
        mod.ctc_align(lp, conv(np.array([[0, 1], [1, 1]])), conv(np.array([4, 4])),
                      conv(np.array([2, 2])))
    with pytest.raises(ValueError, match=r"ctc_align: argument 'input_lengths' must be in "
                                         r"\[0, 4\]"):
        mod.ctc_align(lp, conv(np.array([[2, 1], [1, 1]])), conv(np.array([5, 4])),
                      conv(np.array([2, 2])))
    with pytest.raises(ValueError, match=r"asg_align: argument 'targets' must hold labels in "
                                         r"\[0, 3\)"):
        mod.asg_align(lp, None, conv(np.array([[3, 1], [1, 1]])), conv(np.array([4, 4])),
                      conv(np.array([2, 2])))
    with pytest.raises(ValueError, match=r"asg_viterbi: argument 'transitions' must have shape"):
        mod.asg_viterbi(lp, conv(np.zeros((2, 2), np.float32)), conv(np.array([4, 4])))
