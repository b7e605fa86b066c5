"""ctc_greedy_decode (torch and JAX) against a plain-loop numpy reference.

The reference walks each sequence frame by frame (argmax, skip blanks and repeats), the
textbook definition of CTC best-path decoding; the frontends use vectorised scatters.
Also: both layouts and unbatched input, padded and zero lengths, T = 0, ties, torch ==
JAX, ``torch.compile(fullgraph=True)``, ``jax.jit`` and ``jax.vmap``, and bad input.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import duoloss.torch as dt

jax = pytest.importorskip("jax")
jnp = jax.numpy
import duoloss.jax as dj  # noqa: E402

# "aot_eager" traces the whole graph as inductor does (fullgraph: no graph break allowed) in
# a fraction of inductor's cold start; DUOLOSS_TEST_INDUCTOR=1 runs the real backend
BACKEND = "inductor" if os.environ.get("DUOLOSS_TEST_INDUCTOR") else "aot_eager"


def reference(lp_tnc: np.ndarray, lengths, blank: int):
    """Per sequence: (tokens, first frames), by a plain loop over frames."""
    out = []
    for n, length in enumerate(lengths):
        toks, frames, prev = [], [], None
        for t in range(int(length)):
            row = lp_tnc[t, n]
            best = max(range(len(row)), key=lambda c: (row[c], -c))  # first maximum
            if best != blank and best != prev:
                toks.append(best)
                frames.append(t)
            prev = best
        out.append((toks, frames))
    return out


def _unpad(tokens, lengths, frames):
    tokens, lengths, frames = (np.asarray(x) for x in (tokens, lengths, frames))
    out = []
    for n in range(tokens.shape[0]):
        k = int(lengths[n])
        assert (tokens[n, k:] == -1).all() and (frames[n, k:] == -1).all()
        out.append((tokens[n, :k].tolist(), frames[n, :k].tolist()))
    return out


def _case(seed, t_max=12, n=5, c=4, coarse=True):
    rng = np.random.default_rng(seed)
    if coarse:  # few distinct values: many repeats and exact ties
        lp = rng.integers(0, 3, size=(t_max, n, c)).astype(np.float32)
    else:
        lp = rng.standard_normal((t_max, n, c)).astype(np.float32)
    lengths = rng.integers(0, t_max + 1, size=n)
    lengths[0], lengths[-1] = t_max, 0
    return lp, lengths


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("blank", [0, 2])
def test_matches_the_loop_reference_in_both_frameworks(seed, blank):
    lp, lengths = _case(seed, coarse=seed % 2 == 0)
    want = reference(lp, lengths, blank)
    got_t = dt.ctc_greedy_decode(torch.from_numpy(lp), torch.from_numpy(lengths), blank)
    got_j = dj.ctc_greedy_decode(jnp.asarray(lp), jnp.asarray(lengths), blank)
    assert all(x.dtype == torch.int64 for x in got_t)
    assert tuple(got_t[0].shape) == tuple(got_j[0].shape) == (lp.shape[1], lp.shape[0])
    assert _unpad(*got_t) == want
    assert _unpad(*got_j) == want
    for a, b in zip(got_t, got_j):
        np.testing.assert_array_equal(a.numpy(), np.asarray(b))


def test_batch_first_unbatched_and_length_forms():
    lp, lengths = _case(7, coarse=False)
    want = reference(lp, lengths, 0)
    bf = np.ascontiguousarray(lp.transpose(1, 0, 2))
    assert _unpad(*dt.ctc_greedy_decode(torch.from_numpy(bf), lengths.tolist(), batch_first=True)) == want
    assert _unpad(*dj.ctc_greedy_decode(jnp.asarray(bf), tuple(lengths.tolist()), batch_first=True)) == want
    for n in range(lp.shape[1]):
        for dec, arr in ((dt.ctc_greedy_decode, torch.from_numpy), (dj.ctc_greedy_decode, jnp.asarray)):
            toks, k, frames = dec(arr(lp[:, n]), int(lengths[n]))
            assert np.asarray(k).shape == () and np.asarray(toks).shape == (lp.shape[0],)
            assert _unpad(np.asarray(toks)[None], np.asarray(k)[None], np.asarray(frames)[None]) == [want[n]]


def test_zero_frames_and_float64_half():
    for dec, arr in ((dt.ctc_greedy_decode, torch.from_numpy), (dj.ctc_greedy_decode, jnp.asarray)):
        toks, k, frames = dec(arr(np.zeros((0, 3, 4), np.float32)), arr(np.zeros(3, np.int64)))
        assert np.asarray(toks).shape == (3, 0) and np.asarray(k).tolist() == [0, 0, 0]
    lp, lengths = _case(3, coarse=False)
    want = reference(lp, lengths, 1)
    assert _unpad(*dt.ctc_greedy_decode(torch.from_numpy(lp).double(), torch.from_numpy(lengths), 1)) == want
    assert _unpad(*dt.ctc_greedy_decode(torch.from_numpy(lp).bfloat16(), torch.from_numpy(lengths), 1)) == \
        reference(torch.from_numpy(lp).bfloat16().float().numpy(), lengths, 1)


def test_torch_compile_fullgraph():
    """One inductor compile (same shapes for both calls): valid lengths, then out-of-range
    lengths, which a traced call cannot check and clamps into [0, T]."""
    lp, lengths = _case(11, coarse=True)
    fn = torch.compile(dt.ctc_greedy_decode, fullgraph=True, dynamic=False, backend=BACKEND)
    assert _unpad(*fn(torch.from_numpy(lp), torch.from_numpy(lengths))) == reference(lp, lengths, 0)
    wild = np.array([lp.shape[0] + 5, -3, 2, lp.shape[0], 0])
    want = reference(lp, np.clip(wild, 0, lp.shape[0]), 0)
    assert _unpad(*fn(torch.from_numpy(lp), torch.from_numpy(wild))) == want


def test_jax_jit_and_vmap():
    lp, lengths = _case(12, coarse=True)
    want = reference(lp, lengths, 0)
    assert _unpad(*jax.jit(dj.ctc_greedy_decode)(jnp.asarray(lp), jnp.asarray(lengths))) == want
    # vmap over sequences of unbatched (T, C) inputs: same results as the batched call
    toks, k, frames = jax.vmap(dj.ctc_greedy_decode, in_axes=(1, 0))(jnp.asarray(lp), jnp.asarray(lengths))
    assert _unpad(toks, k, frames) == want


def test_jit_lengths_out_of_range_are_clamped():
    lp, _ = _case(5)
    t_max = lp.shape[0]
    lengths = np.array([t_max + 5, -3, 2, t_max, 0])
    want = reference(lp, np.clip(lengths, 0, t_max), 0)
    assert _unpad(*jax.jit(dj.ctc_greedy_decode)(jnp.asarray(lp), jnp.asarray(lengths))) == want


@pytest.mark.parametrize("frontend", ["torch", "jax"])
def test_bad_input(frontend):
    dec, arr = ((dt.ctc_greedy_decode, torch.from_numpy) if frontend == "torch"
                else (dj.ctc_greedy_decode, jnp.asarray))
    lp = np.zeros((4, 2, 3), np.float32)
    ok = np.array([4, 2])
    with pytest.raises(ValueError, match=r"ctc_greedy_decode: argument 'input_lengths' must be in \[0, 4\].*got 5"):
        dec(arr(lp), arr(np.array([5, 2])))
    with pytest.raises(ValueError, match=r"ctc_greedy_decode: argument 'input_lengths' must be in \[0, 4\].*got -1"):
        dec(arr(lp), [-1, 2])
    with pytest.raises(ValueError, match=r"ctc_greedy_decode: argument 'input_lengths' must be shape \(2,\)"):
        dec(arr(lp), arr(np.array([4, 2, 1])))
    with pytest.raises(ValueError, match=r"ctc_greedy_decode: argument 'blank' must be in \[0, 3\), got 3"):
        dec(arr(lp), arr(ok), 3)
    with pytest.raises(TypeError, match=r"ctc_greedy_decode: argument 'blank' must be an int"):
        dec(arr(lp), arr(ok), "0")
    with pytest.raises(ValueError, match=r"ctc_greedy_decode: argument 'log_probs' must be \(T, N, C\)"):
        dec(arr(lp[0, 0]), arr(ok))
    with pytest.raises(TypeError, match=r"ctc_greedy_decode: argument 'log_probs' must have a floating dtype"):
        dec(arr(lp.astype(np.int64)), arr(ok))
    with pytest.raises(TypeError, match=r"ctc_greedy_decode: argument 'input_lengths' must have an integer dtype"):
        dec(arr(lp), arr(ok.astype(np.float32)))
    with pytest.raises(TypeError, match=r"ctc_greedy_decode: argument 'batch_first' must be a bool"):
        dec(arr(lp), arr(ok), batch_first=1)
    with pytest.raises(TypeError, match=r"ctc_greedy_decode: argument 'log_probs' must be a"):
        dec(lp.tolist() if frontend == "torch" else "x", arr(ok))
