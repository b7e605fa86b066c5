"""The model's weights as the transducer searches read them (issue 35, items 1 and 9).

* JAX: arrays that ``predict``/``join`` read from their enclosing scope (a flax model's
  params closed over, a dict updated in place) are read on every call, never kept from the
  call that compiled the search: after the weights change, every search decodes with the
  new ones, as torch does (torch with the same weights is the oracle); a Python value the
  callables read (a flag) is honoured too.
* JAX: a dropped model is freed (nothing keeps the callables or their arrays), and the
  compiled searches kept are bounded.
* torch: the first call of ``predict`` is the documented one, ``start_token`` for every row
  (no probe on token 0), when the start token is known without the class count.
"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import duoloss.torch as dt

jax = pytest.importorskip("jax")
jnp = jax.numpy
import duoloss.jax as dj  # noqa: E402
from duoloss.jax import _decode_transducer as _jdec  # noqa: E402

from test_decode_transducer import H, J, make_weights, torch_model, x64  # noqa: E402,F401


def jax_model_over(jw):
    """The LSTM predictor and tanh joiner of test_decode_transducer, reading the weights
    from the dict ``jw`` at call time (the closure every flax user writes)."""
    def predict(tokens, state):
        n = tokens.shape[0]
        if state is None:
            state = (jnp.zeros((n, H), jw["wx"].dtype), jnp.zeros((n, H), jw["wx"].dtype))
        h, c = state
        g = jw["emb"][tokens] @ jw["wx"] + h @ jw["wh"] + jw["b"]
        i, f, gg, o = jnp.split(g, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(gg)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, (h, c)

    def join(e, p):
        return jnp.tanh(e + p @ jw["p"]) @ jw["wo"] + jw["bo"]

    return predict, join


def _torch(name, enc, lengths, w, args, kw):
    p, j = torch_model(w)
    got = getattr(dt, name)(torch.from_numpy(enc), torch.from_numpy(lengths), p, j, *args, **kw)
    return [x.numpy() for x in got]


def _same(want, got):
    for a, b in zip(want, got):
        b = np.asarray(b)
        assert a.shape == b.shape
        if a.dtype.kind == "f":
            np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
        else:
            np.testing.assert_array_equal(b, a)


SEARCHES = [  # (name, classes V, logits V', positional arguments, keywords)
    ("rnnt_greedy_decode", 5, 5, (), dict(blank=4, max_symbols_per_frame=2)),
    ("tdt_greedy_decode", 4, 6, (3, [0, 1]), dict(max_symbols_per_frame=2)),
    ("multiblank_greedy_decode", 6, 6, (5, [2]), dict(max_symbols_per_frame=2)),
    ("rnnt_beam_search", 5, 5, (), dict(blank=4, beam=3)),
    ("tdt_beam_search", 4, 6, (3, [0, 1]), dict(beam=3)),
]


@pytest.mark.parametrize("name,n_cls,n_out,args,kw", SEARCHES, ids=[s[0] for s in SEARCHES])
def test_jax_searches_decode_with_the_current_weights(name, n_cls, n_out, args, kw, x64):
    rng = np.random.default_rng(3)
    enc = rng.standard_normal((3, 6, J))
    lengths = np.array([6, 4, 1])
    blank = args[0] if args else kw["blank"]
    w1 = make_weights(21, n_cls, n_out, blank, scale=1.5)
    w2 = make_weights(22, n_cls, n_out, blank, scale=1.5)
    want1 = _torch(name, enc, lengths, w1, args, kw)
    want2 = _torch(name, enc, lengths, w2, args, kw)
    assert any(not np.array_equal(a, b) for a, b in zip(want1, want2))  # the weights matter
    jw = {k: jnp.asarray(v) for k, v in w1.items()}
    predict, join = jax_model_over(jw)
    search = getattr(dj, name)
    _same(want1, search(jnp.asarray(enc), lengths, predict, join, *args, **kw))
    jw.update({k: jnp.asarray(v) for k, v in w2.items()})          # the model is updated
    _same(want2, search(jnp.asarray(enc), lengths, predict, join, *args, **kw))
    jw.update({k: jnp.asarray(v) for k, v in w1.items()})          # and back
    _same(want1, search(jnp.asarray(enc), lengths, predict, join, *args, **kw))


def test_the_issue_snippet_decodes_with_the_new_weights():
    """issue 35's snippet: the joiner reads ``params["W"]``; zeroing it must matter."""
    w0 = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4)), jnp.float32)
    params = {"W": w0}
    enc = jnp.asarray(np.random.default_rng(1).standard_normal((1, 6, 3)), jnp.float32)

    def predict(tokens, state):
        return jax.nn.one_hot(tokens, 3), state

    def join(f, p):
        return (f + p) @ params["W"]

    a = dj.rnnt_beam_search(enc, [6], predict, join, beam=2)
    params["W"] = jnp.zeros((3, 4))
    b = dj.rnnt_beam_search(enc, [6], predict, join, beam=2)
    fresh = dj.rnnt_beam_search(enc, [6], predict, lambda f, p: (f + p) @ jnp.zeros((3, 4)),
                                beam=2)                             # a joiner built for W = 0
    assert not np.allclose(np.asarray(a[2]), np.asarray(fresh[2]))
    for x, y in zip(fresh, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    params["W"] = w0
    c = dj.rnnt_beam_search(enc, [6], predict, join, beam=2)
    for x, y in zip(a, c):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_python_value_read_by_the_model_is_honoured():
    """A flag the joiner reads (not an array): changing it changes the decode."""
    cfg = {"favour": 0}
    enc = jnp.zeros((1, 3, 1))

    def predict(tokens, state):
        return tokens, state

    def join(f, last):
        return jax.nn.one_hot(jnp.where(last == cfg["favour"], 2, cfg["favour"]), 3) + 0 * f

    got = [dj.rnnt_greedy_decode(enc, [3], predict, join) for cfg["favour"] in (0, 1)]
    assert [np.asarray(t)[0, :int(n[0])].tolist() for t, n, _ in got] == [[0], [1]]


def test_dropped_models_are_freed_and_the_cache_is_bounded():
    """Nothing outlives the call but the compiled search, which holds no array of the
    model: a dropped model's weights are freed (a weakref to them dies)."""
    refs = []
    for k in range(3):
        big = jnp.full((1 << 20,), float(k), jnp.float32)          # 4 MB of "weights"
        refs.append(weakref.ref(big))

        def predict(tokens, state, big=big):
            return jnp.zeros((tokens.shape[0], 2)) + big[:2], state

        def join(f, p, big=big):
            return (f + p) @ jnp.ones((2, 3)) + big[2:5]

        dj.rnnt_beam_search(jnp.zeros((1, 2, 2)), [2], predict, join, beam=2)
        dj.rnnt_greedy_decode(jnp.zeros((1, 2, 2)), [2], predict, join)
        del big, predict, join
    gc.collect()
    assert [r() is None for r in refs] == [True] * 3
    for k in range(_jdec._CACHE_SIZE + 3):                        # many model structures
        dj.rnnt_greedy_decode(jnp.zeros((1, 1, 2)), [1], lambda t, s: (jnp.zeros((1, 2)), s),
                              lambda f, p, k=k: jnp.tile(f + p, (1, k + 2)))
    assert len(_jdec._COMPILED) <= _jdec._CACHE_SIZE


# ------------------------------------------------------------------------------ item 9
def _recording(w):
    p, j = torch_model(w)
    calls = []

    def predict(tokens, state):
        calls.append((tokens.tolist(), state is None))
        return p(tokens, state)

    return predict, j, calls


@pytest.mark.parametrize("name,args,kw,rows,start", [
    ("rnnt_greedy_decode", (), dict(blank=2), 2, 2),
    ("rnnt_greedy_decode", (), dict(blank=-1, start_token=1), 2, 1),
    ("rnnt_beam_search", (), dict(blank=2, beam=3), 6, 2),
    ("tdt_greedy_decode", (1, [0, 1]), {}, 2, 1),
    ("tdt_beam_search", (1, [1, 2]), dict(beam=2, start_token=2), 4, 2),
    ("multiblank_greedy_decode", (2, [2]), {}, 2, 2),
])
def test_torch_first_predict_call_is_the_documented_one(name, args, kw, rows, start):
    """``predict(start_token for every row, None)`` is the first call, and the only one
    with no state: no probe with token 0 before it."""
    n_out = 3 + (len(args[1]) if name.startswith("tdt") else 0)
    predict, join, calls = _recording(make_weights(5, 3, n_out, 0))
    enc = torch.from_numpy(np.random.default_rng(2).standard_normal((2, 4, J)))
    getattr(dt, name)(enc, [4, 3], predict, join, *args, **kw)
    assert calls[0] == ([start] * rows, True)
    assert [c for c in calls if c[1]] == [calls[0]]


def test_torch_negative_blank_learns_v_from_one_documented_row_first():
    """With a negative ``blank`` and no ``start_token`` the start token depends on ``V``:
    one row of token 0 learns it (documented), then the documented first call."""
    predict, join, calls = _recording(make_weights(5, 3, 3, 2))
    enc = torch.zeros(2, 3, J, dtype=torch.float64)
    dt.rnnt_greedy_decode(enc, [3, 3], predict, join)
    assert calls[:2] == [([0], True), ([2, 2], True)]


def test_torch_bad_start_token_is_named_before_the_model_fails():
    predict, join, _ = _recording(make_weights(5, 3, 3, 0))
    enc = torch.zeros(1, 2, J, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"rnnt_greedy_decode: argument 'start_token' must be "
                                         r"in \[0, 3\), got 7"):
        dt.rnnt_greedy_decode(enc, [2], predict, join, blank=0, start_token=7)
    with pytest.raises(ValueError, match=r"rnnt_greedy_decode: argument 'blank' must be in "
                                         r"\[-3, 3\), got 5"):
        dt.rnnt_greedy_decode(enc, [2], predict, join, blank=5)
