"""ASG's exact log-space fallbacks compile lazily (issue 19, cold compile).

The batch kernels run the rescaled linear-space passes only; a sequence whose check
fails is marked pending (1: the normaliser, 2: the target paths), and
`_asg_batch_exact` runs it again, whole, with the log-space recursions (`_norm_log`,
`_num_log`; float64 only, on a compacted copy of those sequences), so a first
call that needs no fallback never compiles them:

* pending sequences (either term) match brute force and float64 central differences;
* mixed batches (pending and not, NaN, inf, infeasible, ``zero_infinity``, each
  gradient wanted or not; serial and threaded) give every sequence exactly the bits
  of a call on that sequence alone;
* the batch kernels write only the sequences listed in ``order`` (any subset), so
  they can be split over threads;
* a fresh process whose call needs no fallback compiles neither `_norm_log` nor
  `_num_log`; under ``_compile_both`` (warmup) the exact kernel compiles with an
  empty index array and the signature real calls of either dtype then use.
"""
from __future__ import annotations


import numpy as np
import pytest
from numba.core import types

from duoloss.core import _numerics
from duoloss.core.losses import asg
from fresh_process import run_with_empty_cache
from test_asg_core import _central
from test_asg_reference import brute_asg


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32)


def _assert_same_bits(got, want, msg=""):
    assert (got is None) == (want is None), msg
    if got is not None:
        assert got.dtype == want.dtype, msg
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=msg)


def _kernel_args(em, tr, st, tg, il, tl, zero_infinity=False):
    """The batch kernels' arguments as `asg_loss_and_grad` builds them (all gradients)."""
    t_max, n, n_cls = em.shape
    has_trans = tr is not None
    tr = np.zeros((0, 0)) if tr is None else np.asarray(tr, np.float64)
    st = np.zeros(n_cls) if st is None else np.asarray(st, np.float64)
    sp, sigma, m, mt, tau, pflushed = asg._exp_params(tr, st.reshape(1, n_cls), has_trans)
    outs = (np.full(n, 7.0), np.full(em.shape, 7.0, em.dtype), np.full((n, n_cls, n_cls), 7.0),
            np.full((n, n_cls), 7.0), np.zeros(n, np.int8))
    return (em, m, mt, tau, tr, sp, sigma, st, pflushed, tg, il, tl, has_trans, True, has_trans,
            True, zero_infinity) + outs


def _underflow_batch():
    """Every transition out of token 0 sits 900 nats below the rest.  Sequence 0
    never needs one; sequence 1's target needs 0 -> 1 (the target paths' linear
    pass underflows); sequence 2 can only start with token 0 (the normaliser's
    linear pass underflows at the second frame)."""
    rng = np.random.default_rng(11)
    t_max, c = 5, 3
    em = rng.standard_normal((t_max, 3, c))
    em[0, 2, 1:] = -1000.0
    tr = rng.standard_normal((c, c))
    tr[:, 0] = -900.0
    st = rng.standard_normal(c)
    tg = np.array([[2, 1, 2], [0, 1, 2], [0, 0, 0]])
    return em, tr, st, tg, np.array([5, 5, 5]), np.array([3, 3, 3])


def test_underflow_batch_marks_both_terms_pending():
    args = _kernel_args(*_underflow_batch())
    pending = args[-1]
    asg._asg_batch(np.arange(3, dtype=np.int64), *args)
    assert list(pending) == [0, 2, 1]


def test_pending_sequences_match_brute_force_and_central_differences():
    em, tr, st, tg, il, tl = _underflow_batch()
    losses, (ge, gt, gs) = asg.asg_loss_and_grad(em, tr, tg, il, tl, start_transitions=st)

    def loss(b, e=None, t=None, s=None):
        e = em[:, b:b + 1] if e is None else e[:, None]
        return asg.asg_loss_and_grad(e, tr if t is None else t, tg[b:b + 1], il[b:b + 1],
                                     tl[b:b + 1], start_transitions=st if s is None else s,
                                     want_grad=(0, 0, 0))[0][0]

    for b in range(3):
        ref, _ = brute_asg(em[:, b], tr, st, list(tg[b]))
        np.testing.assert_allclose(losses[b], ref, rtol=1e-10)
        np.testing.assert_allclose(ge[:, b], _central(lambda e: loss(b, e=e), em[:, b], 1e-5),
                                   atol=1e-5)
        np.testing.assert_allclose(gt[b], _central(lambda t: loss(b, t=t), tr, 1e-5), atol=1e-5)
        np.testing.assert_allclose(gs[b], _central(lambda s: loss(b, s=s), st, 1e-5), atol=1e-5)


def _mixed_case(rng, trial, n):
    t_max = int(rng.integers(1, 9)) if n < 6 else 60
    c = int(rng.integers(1, 6)) if n < 6 else 20
    s = int(rng.integers(1, 5)) if n < 6 else 25
    dtype = np.float32 if trial % 2 else np.float64
    em = rng.standard_normal((t_max, n, c))
    tr = rng.standard_normal((c, c))
    st = rng.standard_normal(c)
    for b in range(n):
        kind = (trial + b) % 6
        if kind == 1:
            em[:, b] *= 400.0
        elif kind == 2:
            em[0, b, 0] = rng.choice([np.nan, np.inf, -np.inf])
    if trial % 3 == 1:
        tr[0, :] = -900.0
    elif trial % 3 == 2:
        tr[rng.integers(0, c), rng.integers(0, c)] = rng.choice([-np.inf, -2000.0, np.nan])
    tg = rng.integers(0, c, (n, s))
    il = rng.integers(0, t_max + 1, n)
    tl = rng.integers(0, s + 1, n)
    return em.astype(dtype), tr.astype(dtype), st.astype(dtype), tg, il, tl


@pytest.mark.parametrize("n", [4, 8])  # 8: 60 frames, 20 tokens, enough cells for threads
def test_mixed_batches_equal_one_sequence_calls(rng, n):
    redone = 0
    for trial in range(12 if n < 6 else 4):
        em, tr, st, tg, il, tl = _mixed_case(rng, trial, n)
        for use_tr, use_st, want, zi in ((True, True, (1, 1, 1), False),
                                         (True, False, (1, 0, 1), True),
                                         (False, True, (0, 1, 1), False),
                                         (True, True, (0, 0, 0), trial % 2 == 1)):
            kw = dict(start_transitions=st if use_st else None, want_grad=want,
                      zero_infinity=zi)
            t = tr if use_tr else None
            losses, grads = asg.asg_loss_and_grad(em, t, tg, il, tl, **kw)
            args = _kernel_args(em, t, kw["start_transitions"], tg, il, tl)
            asg._asg_batch(np.arange(n, dtype=np.int64), *args)
            redone += int(np.count_nonzero(args[-1]))
            for b in range(n):
                one, g1 = asg.asg_loss_and_grad(em[:, b:b + 1], t, tg[b:b + 1], il[b:b + 1],
                                                tl[b:b + 1], **kw)
                msg = f"trial {trial} b {b} {use_tr} {use_st} {want} {zi}"
                _assert_same_bits(losses[b:b + 1], one, msg)
                _assert_same_bits(None if grads[0] is None else grads[0][:, b:b + 1], g1[0], msg)
                for k in (1, 2):
                    _assert_same_bits(None if grads[k] is None else grads[k][b:b + 1], g1[k], msg)
    assert redone > 0  # the log-space kernel ran


def test_batch_kernels_write_only_the_listed_sequences(rng):
    em, tr, st, tg, il, tl = _mixed_case(rng, 0, 6)
    em[:, 1] *= 400.0  # pending
    full = asg.asg_loss_and_grad(em, tr, tg, il, tl, start_transitions=st)
    order = np.array([4, 1, 3], np.int64)
    rest = np.setdiff1d(np.arange(6), order)
    for parts in ([order], [order[:1], order[1:]]):
        args = _kernel_args(em, tr, st, tg, il, tl)
        losses, g_em, g_tr, g_st, pending = args[-5:]
        for part in parts:
            asg._asg_batch(part, *args)
        redo = np.flatnonzero(pending).astype(np.int64)
        assert set(redo) <= set(order)
        asg._asg_batch_exact(redo, *args)
        assert np.all(losses[rest] == 7.0) and np.all(g_em[:, rest] == 7.0)
        assert np.all(g_tr[rest] == 7.0) and np.all(g_st[rest] == 7.0)
        assert np.all(pending[rest] == 0)
        _assert_same_bits(losses[order].astype(em.dtype), full[0][order])
        _assert_same_bits(g_em[:, order], full[1][0][:, order])
        _assert_same_bits(g_tr[order].astype(em.dtype), full[1][1][order])
        _assert_same_bits(g_st[order].astype(em.dtype), full[1][2][order])


def test_compile_both_compiles_the_exact_kernel_with_the_real_signature(monkeypatch):
    """One float64 signature serves every dtype; warmup compiles it with none pending."""
    em, tr, st, tg, il, tl = _underflow_batch()
    plain = np.zeros_like(em, np.float32)
    monkeypatch.setattr(_numerics, "_compile_both", True)
    asg.asg_loss_and_grad(plain, tr.astype(np.float32), tg, il, tl)
    monkeypatch.setattr(_numerics, "_compile_both", False)
    sigs = set(asg._asg_batch_exact.signatures)
    assert sigs
    for dtype in (np.float32, np.float64):
        asg.asg_loss_and_grad(em.astype(dtype), tr.astype(dtype), tg, il, tl)
    assert set(asg._asg_batch_exact.signatures) == sigs
    assert all(sig[1].dtype == types.float64 for sig in sigs)


_FRESH = """
import numpy as np
from duoloss.core import _numerics
from duoloss.core.losses import asg
em = np.zeros((6, 2, 4), np.float32)
tr = np.zeros((4, 4), np.float32)
tg = np.array([[1, 2], [3, 1]])
asg.asg_loss_and_grad(em, tr, tg, [6, 5], [2, 1])
assert not asg._norm_log.signatures and not asg._num_log.signatures, "compiled eagerly"
assert not asg._asg_batch_exact.signatures, "compiled eagerly"
_numerics._compile_both = True
asg.asg_loss_and_grad(em, tr, tg, [6, 5], [2, 1])
assert len(asg._asg_batch_exact.signatures) == 1
print("OK")
"""


def test_a_call_without_fallback_does_not_compile_the_log_space_paths():
    assert run_with_empty_cache(_FRESH).strip().endswith("OK")
