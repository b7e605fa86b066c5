"""WFST decoding (issue 25, point 3): ``graph_decode``, ``lexicon_graph``, ``arpa_graph``.

References, each independent of the search under test:
* ``duoloss.gtn.viterbi_path`` / ``viterbi_score`` of the full composition ``E ∘ graph``
  (the graph engine's static ``compose`` and DAG Viterbi);
* brute-force enumeration of every path of a tiny graph that reads exactly ``T`` frames;
* ARPA scores computed by hand (and E2b's ``ArpaLM.sentence_log10``), times ``ln 10``;
* the other framework (torch vs JAX: same hypotheses, bit-identical scores).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from duoloss import gtn
from duoloss.core.decoding import read_arpa
from duoloss.core.decoding.wfst import graph_decode, prepare_graph
from duoloss.graphs import arpa_graph, ctc_topo, lexicon_graph

LN10 = math.log(10.0)


# ------------------------------------------------------------------------- helpers
def random_graph(rng, n, arcs, C, K, eps_frac=0.25, accept_frac=0.4):
    """A random transducer: classes [0, C) or epsilon in, [0, K) or epsilon out; epsilon
    input arcs only go to higher node ids (no epsilon cycle); other arcs anywhere."""
    g = gtn.Graph(calc_grad=False)
    for i in range(n):
        g.add_node(start=i == 0, accept=bool(rng.random() < accept_frac) or i == n - 1)
    for _ in range(arcs):
        s = int(rng.integers(n))
        if rng.random() < eps_frac and s < n - 1:
            d = int(rng.integers(s + 1, n))
            il = -1
        else:
            d = int(rng.integers(n))
            il = int(rng.integers(C))
        ol = int(rng.integers(-1, K))
        g.add_arc(s, d, il, ol, float(rng.normal()))
    return g


def emission_graph(em):
    """The linear acceptor of a (T, C) matrix: arc t has label c and weight em[t, c]."""
    T, C = em.shape
    E = gtn.linear_graph(T, C, calc_grad=False)
    E.set_weights(em.astype(np.float32).reshape(-1))
    return E


def full_viterbi(em, graph):
    """Best path of the full composition (the reference the search must equal)."""
    comp = gtn.compose(emission_graph(em), graph)
    path = gtn.viterbi_path(comp)
    if path.num_nodes() == 0:
        return None
    il = path.labels_to_list()
    ol = path.labels_to_list(False)
    return (float(np.sum(np.asarray(path.weights_to_list(), np.float64))),
            [x for x in il if x >= 0], [x for x in ol if x >= 0], il, ol)


def brute_force(em, graph):
    """Max over every path of ``graph`` reading exactly T frames (depth-first search)."""
    n, src, dst, il, ol, w, start, accept = gtn.graph_arrays(graph)
    T = em.shape[0]
    best = [-np.inf, None]

    def dfs(s, t, score, outs):
        if t == T and accept[s] and score > best[0]:
            best[0], best[1] = score, list(outs)
        for a in np.flatnonzero(src == s):
            if il[a] < 0:
                dfs(int(dst[a]), t, score + float(w[a]), outs + ([int(ol[a])] if ol[a] >= 0 else []))
            elif t < T:
                dfs(int(dst[a]), t + 1, score + float(w[a]) + float(em[t, il[a]]),
                    outs + ([int(ol[a])] if ol[a] >= 0 else []))

    for s in np.flatnonzero(start):
        dfs(int(s), 0, 0.0, [])
    return best


def path_score(em, graph, hyp):
    """Score of a hypothesis's arcs, read off the graph's arrays (float64)."""
    n, src, dst, il, ol, w, start, accept = gtn.graph_arrays(graph)
    arcs = np.asarray(hyp.arcs)
    frames = il[arcs] >= 0
    return float(np.sum(w[arcs].astype(np.float64)) +
                 np.sum(em[np.arange(frames.sum()), il[arcs][frames]]))


def log_probs(rng, B, T, C):
    x = rng.normal(size=(B, T, C)) * 2
    x = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return x.astype(np.float32).astype(np.float64)   # float32-exact: the graph engine's weights


# ------------------------------------------------------------------------- exactness
def test_infinite_beam_equals_viterbi_path_of_the_full_composition(rng):
    C, K = 4, 5
    checked = 0
    for trial in range(25):
        g = random_graph(rng, n=int(rng.integers(3, 8)), arcs=int(rng.integers(6, 20)), C=C, K=K)
        T = int(rng.integers(1, 7))
        em = log_probs(rng, 1, T, C)
        [hyps] = graph_decode(em, g, beam=math.inf, max_active=None)
        ref = full_viterbi(em[0], g)
        if ref is None:
            assert hyps == []
            continue
        checked += 1
        [h] = hyps
        assert h.score == pytest.approx(ref[0], abs=1e-4)
        assert h.alignment.tolist() == ref[1]
        assert h.labels.tolist() == ref[2]
        n, src, dst, il, ol, w, st, ac = gtn.graph_arrays(g)
        assert il[h.arcs].tolist() == ref[3] and ol[h.arcs].tolist() == ref[4]
        assert h.score == pytest.approx(path_score(em[0], g, h), abs=1e-9)
    assert checked >= 15


def test_best_path_equals_brute_force_enumeration(rng):
    C, K = 3, 3
    for trial in range(12):
        g = random_graph(rng, n=4, arcs=9, C=C, K=K, eps_frac=0.3)
        T = int(rng.integers(0, 5))
        em = log_probs(rng, 1, T, C)
        [hyps] = graph_decode(em, g, beam=math.inf, max_active=None)
        score, outs = brute_force(em[0], g)
        if score == -np.inf:
            assert hyps == []
            continue
        [h] = hyps
        assert h.score == pytest.approx(score, abs=1e-9)
        assert h.labels.tolist() == outs
        assert len(h.alignment) == T


def test_lengths_decode_prefixes_and_nan_utterance_gets_no_hypothesis(rng):
    C = 4
    g = ctc_topo(C)
    em = log_probs(rng, 3, 7, C)
    em[1, 6, 2] = np.nan            # past its length: data it never reads
    em[2, 3, 1] = np.nan            # inside its length: no hypothesis
    out = graph_decode(em, g, lengths=np.array([7, 5, 7]))
    assert out[2] == []
    for b, T in ((0, 7), (1, 5)):
        [h] = out[b]
        score, outs = full_viterbi(em[b, :T], g)[:2]
        assert h.score == pytest.approx(score, abs=1e-4) and len(h.alignment) == T
        # CTC best path: the frame argmax, repeats merged, blanks dropped
        best = em[b, :T].argmax(-1)
        assert h.alignment.tolist() == best.tolist()
        merged = [int(c) for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1])]
        assert h.labels.tolist() == merged
        assert h.timesteps.tolist() == [i for i, c in enumerate(best)
                                        if c != 0 and (i == 0 or c != best[i - 1])]


def test_finite_beam_never_beats_the_exact_search_and_a_wide_one_equals_it(rng):
    C, K = 5, 6
    g = random_graph(rng, n=30, arcs=160, C=C, K=K)
    em = log_probs(rng, 4, 12, C)
    exact = graph_decode(em, g, beam=math.inf, max_active=None)
    narrow = graph_decode(em, g, beam=1.0, max_active=3)
    wide = graph_decode(em, g, beam=1e3, max_active=10 ** 6)
    assert all(len(e) == 1 for e in exact)
    for b, (e, nb, wd) in enumerate(zip(exact, narrow, wide)):
        assert [h.score for h in wd] == [h.score for h in e]
        if nb:   # a pruned search finds a real path, never a better one
            assert nb[0].score <= e[0].score + 1e-12
            assert nb[0].score == pytest.approx(path_score(em[b], g, nb[0]), abs=1e-9)


# ------------------------------------------------------------------------- L and G
ARPA = """\\data\\
ngram 1=5
ngram 2=5
ngram 3=2

\\1-grams:
-1.0\t</s>
-99\t<s>\t-0.5
-0.7\tab\t-0.3
-0.6\tb\t-0.2
-1.2\tba\t-0.1

\\2-grams:
-0.2\t<s> ab\t-0.1
-0.4\tab b\t-0.2
-0.3\tb ab
-0.5\tb </s>
-0.6\tab ba

\\3-grams:
-0.1\t<s> ab b
-0.05\tab b ab

\\end\\
"""


@pytest.fixture
def arpa_path(tmp_path):
    p = tmp_path / "lm.arpa"
    p.write_text(ARPA)
    return p


def sentence_acceptor(ids):
    g = gtn.Graph(calc_grad=False)
    for i in range(len(ids) + 1):
        g.add_node(start=i == 0, accept=i == len(ids))
    for i, w in enumerate(ids):
        g.add_arc(i, i + 1, w)
    return g


# log10 by hand from ARPA above (backoff only where the n-gram is missing)
HAND = {
    ("ab",): -0.2 + (-0.1 + -0.3 + -1.0),          # p(ab|<s>) + bo(<s> ab) + bo(ab) + p(</s>)
    ("ab", "b"): -0.2 - 0.1 - 0.2 - 0.5,           # p(b|<s> ab) + bo(ab b) + p(</s>|b)
    ("ab", "b", "ab"): -0.2 - 0.1 - 0.05 - 0.3 - 1.0,      # bo(b ab) = 0: not given
    ("b",): -0.5 - 0.6 - 0.5,                      # bo(<s>) + p(b) + p(</s>|b)
    ("ba", "b"): -0.5 - 1.2 - 0.1 - 0.6 - 0.5,
}


def test_arpa_graph_path_weights_equal_the_arpa_scores(arpa_path):
    lm = read_arpa(arpa_path)
    G = arpa_graph(arpa_path)
    for words, log10 in HAND.items():
        assert lm.sentence_log10(list(words)) == pytest.approx(log10, abs=1e-12)
        comp = gtn.compose(sentence_acceptor([lm.word_index[w] for w in words]), G)
        # every path of the sentence through G (the tropical best: exact here, no backoff
        # path beats an explicit n-gram in this model)
        assert gtn.viterbi_score(comp).item() == pytest.approx(log10 * LN10, abs=1e-5)
    # ArpaLM given directly, and with the lexicon's word ids
    G2 = arpa_graph(lm, words=["b", "ab", "ba"])
    comp = gtn.compose(sentence_acceptor([1, 0]), G2)
    assert gtn.viterbi_score(comp).item() == pytest.approx(HAND[("ab", "b")] * LN10, abs=1e-5)
    # a word the LM does not know is scored as <unk> (the ARPA semantics); LM words outside
    # `words` get no arc
    G3 = arpa_graph(lm, words=["zz", "ab"])
    unk = lm.ngrams[0][(lm.unk,)][0]
    for sent, log10 in (([0], -0.5 + unk - 1.0), ([1], HAND[("ab",)])):
        comp = gtn.compose(sentence_acceptor(sent), G3)
        assert gtn.viterbi_score(comp).item() == pytest.approx(log10 * LN10, abs=1e-4)
        assert lm.sentence_log10(["zz"] if sent == [0] else ["ab"]) == pytest.approx(log10)
    assert set(G3.labels_to_list()) == {-1, 0, 1}


def test_arpa_graph_backoff_is_the_documented_approximation(tmp_path):
    # the explicit bigram "a a" is worse than backing off (bo(a) + p(a)): the tropical best
    # path takes the epsilon arc; the exact ARPA score is the explicit n-gram's
    p = tmp_path / "lm.arpa"
    p.write_text("\\data\\\nngram 1=3\nngram 2=1\n\n\\1-grams:\n-0.5\t</s>\n-99\t<s>\n"
                 "-0.3\ta\t-0.1\n\n\\2-grams:\n-2.0\ta a\n\n\\end\\\n")
    lm = read_arpa(p)
    G = arpa_graph(p, eos=False, bos=False)
    a = lm.word_index["a"]
    exact = lm.sentence_log10(["a", "a"], bos=False, eos=False)
    assert exact == pytest.approx(-0.3 - 2.0)
    best = gtn.viterbi_score(gtn.compose(sentence_acceptor([a, a]), G)).item()
    assert best == pytest.approx((-0.3 - 0.1 - 0.3) * LN10, abs=1e-5) and best >= exact * LN10
    # the exact path is one of the paths: log-sum over paths covers it
    # (every history accepts with eos=False: each path may also end with the backoff arc)
    paths = np.array([exact, -0.3 - 0.1 - 0.3, exact - 0.1, -0.3 - 0.1 - 0.3 - 0.1]) * LN10
    total = gtn.forward_score(gtn.compose(sentence_acceptor([a, a]), G)).item()
    assert total == pytest.approx(np.logaddexp.reduce(paths), abs=1e-5)


def test_lexicon_graph_from_file_dict_and_words(tmp_path):
    tokens = ["-", "|", "a", "b"]
    p = tmp_path / "lexicon.txt"
    p.write_text("ab a b |\nab a a b |\nba b a |\n")
    from_file = lexicon_graph(p, tokens)
    from_dict = lexicon_graph({"ab": [["a", "b", "|"], [2, 2, 3, 1]], "ba": [[3, 2, 1]]}, tokens)
    assert gtn.equal(from_file, from_dict)
    # words a token sequence reads: compose with a token acceptor, project the output
    for toks, words in (([2, 3, 1], [0]), ([2, 2, 3, 1, 3, 2, 1], [0, 1]), ([2, 3], None)):
        comp = gtn.compose(sentence_acceptor(toks), from_file)
        path = gtn.viterbi_path(comp)
        if words is None:
            assert path.num_nodes() == 0
        else:
            assert [x for x in path.labels_to_list(False) if x >= 0] == words
    # word ids from a vocabulary; a word outside it is left out
    L = lexicon_graph(p, tokens, words=["<unk>", "ba"])
    assert sorted(set(L.labels_to_list(False)) - {-1}) == [1]
    # optional silence between words
    Ls = lexicon_graph(p, tokens, sil="|", sil_weight=-1.5)
    comp = gtn.compose(sentence_acceptor([1, 2, 3, 1, 1]), Ls)
    assert gtn.viterbi_score(comp).item() == pytest.approx(-3.0)


def test_ctc_topo_lexicon_grammar_decoding_equals_full_composition(rng, arpa_path):
    tokens = ["-", "|", "a", "b"]
    lm = read_arpa(arpa_path)
    words = lm.words
    lexicon = {"ab": [["a", "b", "|"]], "b": [["b", "|"]], "ba": [["b", "a", "|"]]}
    L = lexicon_graph(lexicon, tokens, words=words)
    G = arpa_graph(lm)
    HLG = gtn.compose(ctc_topo(len(tokens)), gtn.compose(L, G))
    em = log_probs(rng, 3, 9, len(tokens))
    em[0, :, 2] += 1.0
    out = graph_decode(em, HLG, beam=math.inf, max_active=None)
    pruned = graph_decode(em, HLG, beam=30.0, max_active=1000)
    for b in range(3):
        ref = full_viterbi(em[b], HLG)
        [h] = out[b]
        assert h.score == pytest.approx(ref[0], abs=1e-4)
        assert h.labels.tolist() == ref[2] and h.alignment.tolist() == ref[1]
        assert all(words[w] in lexicon for w in h.labels.tolist())
        assert pruned[b][0].score == h.score
        # the score splits into the best CTC alignment of the spelling and the LM
        spelled = [t for w in h.labels.tolist() for t in
                   [tokens.index(x) for x in lexicon[words[w]][0]]]
        align = h.alignment.tolist()
        merged = [c for i, c in enumerate(align) if c != 0 and (i == 0 or c != align[i - 1])]
        assert merged == spelled
        # each word is emitted on its first token: its timestep is that token's first frame
        starts = [i for i, c in enumerate(align) if c != 0 and (i == 0 or c != align[i - 1])]
        first = np.cumsum([0] + [len(lexicon[words[w]][0]) for w in h.labels.tolist()])[:-1]
        assert h.timesteps.tolist() == [starts[k] for k in first]
        acoustic = float(em[b, np.arange(9), align].sum())
        lm_score = lm.sentence_log10([words[w] for w in h.labels.tolist()]) * LN10
        assert h.score == pytest.approx(acoustic + lm_score, abs=1e-5)


# ------------------------------------------------------------------------- memory
def test_large_grammar_decodes_in_beam_bounded_memory(rng):
    # a >= 100k-arc acceptor over 30 classes (2000 states x 50 arcs + epsilon backoffs)
    n, per, C = 2000, 50, 30
    src = np.repeat(np.arange(n), per)
    dst = rng.integers(0, n, n * per)
    il = rng.integers(0, C, n * per)
    w = rng.normal(size=n * per) - 2
    src = np.concatenate([src, np.arange(1, n)])
    dst = np.concatenate([dst, np.zeros(n - 1, np.int64)])        # backoff to the root
    il = np.concatenate([il, np.full(n - 1, -1)])
    w = np.concatenate([w, np.full(n - 1, -1.0)])
    G = gtn.Graph.from_arrays(n, src, dst, il, None, w, [0], np.arange(n), calc_grad=False)
    assert G.num_arcs() >= 100_000
    T, max_active = 200, 64
    em = log_probs(rng, 2, T, C)
    stats = {}
    out = graph_decode(em, G, beam=8.0, max_active=max_active, _stats=stats)
    assert all(len(h) == 1 and len(h[0].alignment) == T for h in out)
    dg = prepare_graph(G)
    assert (stats["peak_active"] <= max_active).all()
    # traceback records: at most max_active survivors per frame and their epsilon ancestors
    assert (stats["records"] <= (T + 1) * max_active * (dg.eps_depth + 1)).all()
    # the full composition would hold about T * |arcs| = 2e7 arcs
    assert stats["records"].max() < T * G.num_arcs() / 100
    for b in range(2):
        assert out[b][0].score == pytest.approx(path_score(em[b], G, out[b][0]), abs=1e-9)


# ------------------------------------------------------------------------- frontends
def test_torch_and_jax_give_identical_hypotheses(rng, arpa_path):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    import duoloss.jax as dj
    import duoloss.torch as dt
    tokens = ["-", "|", "a", "b"]
    L = lexicon_graph({"ab": [["a", "b", "|"]], "b": [["b", "|"]], "ba": [["b", "a", "|"]]},
                      tokens, words=read_arpa(arpa_path).words)
    HLG = gtn.compose(ctc_topo(4, modified=True), gtn.compose(L, arpa_graph(arpa_path)))
    em = log_probs(rng, 4, 11, 4)
    ln = [11, 8, 0, 5]
    a = dt.graph_decode(torch.tensor(em, dtype=torch.float32), HLG, lengths=torch.tensor(ln),
                        beam=15.0)
    b = dj.graph_decode(jnp.asarray(em, jnp.float32), HLG, lengths=ln, beam=15.0)
    core = graph_decode(em, HLG, lengths=np.array(ln), beam=15.0)
    assert len(a) == len(b) == 4
    for ha, hb, hc in zip(a, b, core):
        assert len(ha) == len(hb) == len(hc)
        for x, y, z in zip(ha, hb, hc):
            assert isinstance(x.labels, torch.Tensor) and x.labels.dtype == torch.int64
            assert x.score == y.score == z.score
            for f in ("labels", "alignment", "timesteps", "arcs"):
                assert np.asarray(getattr(x, f)).tolist() == np.asarray(getattr(y, f)).tolist() \
                    == getattr(z, f).tolist()


def test_jax_graph_decode_refuses_traced_arguments():
    jax = pytest.importorskip("jax")
    import duoloss.jax as dj
    with pytest.raises(TypeError, match="graph_decode: argument 'emissions' is a traced"):
        jax.jit(lambda x: dj.graph_decode(x, ctc_topo(3)))(jax.numpy.zeros((1, 2, 3)))


# ------------------------------------------------------------------------- bad input
def _cyclic_eps():
    g = gtn.Graph(calc_grad=False)
    g.add_node(start=True)
    g.add_node(accept=True)
    g.add_arc(0, 1, -1)
    g.add_arc(1, 0, -1)
    return g


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(emissions=np.zeros((2, 3))), ValueError, "argument 'emissions' must have shape"),
    (dict(emissions=np.zeros((1, 2, 3), np.int64)), TypeError, "argument 'emissions' must hold floating"),
    (dict(lengths=np.array([2, 2])), ValueError, r"argument 'lengths' must have shape \(1,\)"),
    (dict(lengths=np.array([3])), ValueError, r"argument 'lengths' must lie in \[0, T = 2\]"),
    (dict(lengths=np.array([-1])), ValueError, "argument 'lengths' must lie in"),
    (dict(lengths=np.array([1.0])), TypeError, "argument 'lengths' must hold integers"),
    (dict(graph=ctc_topo(4)), ValueError, "argument 'graph' has input label 3 but 'emissions' has C = 3"),
    (dict(graph=_cyclic_eps()), ValueError, "argument 'graph' has a cycle of input-epsilon arcs"),
    (dict(graph="HLG"), TypeError, "argument 'graph' must be a duoloss.gtn.Graph"),
    (dict(beam=0.0), ValueError, "argument 'beam' must be > 0"),
    (dict(beam=float("nan")), ValueError, "argument 'beam' must be > 0"),
    (dict(beam="wide"), TypeError, "argument 'beam' must be a float"),
    (dict(max_active=0), ValueError, "argument 'max_active' must be >= 1"),
    (dict(max_active=2.5), TypeError, "argument 'max_active' must be an int or None"),
])
def test_bad_input_names_graph_decode_and_the_argument(kwargs, err, match):
    args = dict(emissions=np.zeros((1, 2, 3)), graph=ctc_topo(3))
    args.update(kwargs)
    em, g = args.pop("emissions"), args.pop("graph")
    with pytest.raises(err, match="graph_decode: " + match):
        graph_decode(em, g, **args)


def test_bad_input_in_the_frontends():
    torch = pytest.importorskip("torch")
    import duoloss.torch as dt
    with pytest.raises(TypeError, match="graph_decode: argument 'emissions' must be a torch.Tensor"):
        dt.graph_decode(np.zeros((1, 2, 3)), ctc_topo(3))
    with pytest.raises(TypeError, match="graph_decode: argument 'emissions' must hold floating-point "
                       "scores, got dtype int64"):  # the message of JAX and the core
        dt.graph_decode(torch.zeros((1, 2, 3), dtype=torch.int64), ctc_topo(3))
    with pytest.raises(ValueError, match="graph_decode: argument 'graph' has input label 3"):
        dt.graph_decode(torch.zeros((1, 2, 3)), ctc_topo(4), lengths=[2])


def test_builders_bad_input(tmp_path, arpa_path):
    with pytest.raises(TypeError, match="lexicon_graph: reading the lexicon file .* needs argument 'tokens'"):
        lexicon_graph(str(arpa_path))
    with pytest.raises(ValueError, match="lexicon_graph: the word 'ab' is spelled with the token 'c'"):
        lexicon_graph({"ab": [["a", "c"]]}, ["-", "a"])
    with pytest.raises(ValueError, match="lexicon_graph: the word 'ab' has an empty spelling"):
        lexicon_graph({"ab": [[]]})
    with pytest.raises(ValueError, match="lexicon_graph: the word 'ab' is spelled with token id 5"):
        lexicon_graph({"ab": [[1, 5]]}, ["-", "a", "b"])
    p = tmp_path / "lex.txt"
    p.write_text("ab a b\nba b z\n")
    with pytest.raises(ValueError, match=r"lex.txt:2"):
        lexicon_graph(p, ["-", "a", "b"])
    with pytest.raises(TypeError, match="arpa_graph: argument 'lm' must be an ARPA file path or an ArpaLM"):
        arpa_graph(3)
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=2\n\n\\1-grams:\n-1.0\ta\n\n\\end\\\n")
    with pytest.raises(ValueError, match="bad.arpa"):
        arpa_graph(bad)


def reference_beam_search(em, graph, beam, max_active):
    """Token passing in plain Python: every move of every kept state, the epsilon closure
    by relaxation until nothing changes, then (but after the last frame) the beam and the
    max_active best.  States
    from which no accept state can be reached are never entered (the search trims them)."""
    n, src, dst, il, ol, w, start, accept = gtn.graph_arrays(graph)
    live = set(np.flatnonzero(accept).tolist())
    while True:
        more = {int(s) for s, d in zip(src, dst) if int(d) in live} - live
        if not more:
            break
        live |= more
    useful = np.array([int(d) in live for d in dst], bool)
    src, dst, il, w = src[useful], dst[useful], il[useful], w[useful]
    arc_id = np.flatnonzero(useful)
    tokens = {int(s): (0.0, []) for s in np.flatnonzero(start) if int(s) in live}

    def closure_and_prune(tok, last):
        changed = True
        while changed:
            changed = False
            for s, (sc, path) in list(tok.items()):
                for a in np.flatnonzero((src == s) & (il < 0)):
                    v = sc + float(w[a])
                    d = int(dst[a])
                    if v > tok.get(d, (-np.inf, None))[0]:
                        tok[d] = (v, path + [int(arc_id[a])])
                        changed = True
        if not tok or last:     # the last frame is not pruned
            return tok
        best = max(v for v, _ in tok.values())
        kept = sorted(((v, s) for s, (v, _) in tok.items() if v >= best - beam and v > -np.inf),
                      reverse=True)[:max_active]
        return {s: tok[s] for _, s in kept}

    T = em.shape[0]
    tokens = closure_and_prune(tokens, T == 0)
    for t in range(T):
        nxt = {}
        for s, (sc, path) in tokens.items():
            for a in np.flatnonzero((src == s) & (il >= 0)):
                v = sc + float(w[a]) + float(em[t, il[a]])
                d = int(dst[a])
                if v > nxt.get(d, (-np.inf, None))[0]:
                    nxt[d] = (v, path + [int(arc_id[a])])
        tokens = closure_and_prune(nxt, t == T - 1)
    final = [(v, p) for s, (v, p) in tokens.items() if accept[s]]
    return max(final) if final else None


def test_pruned_search_equals_a_plain_python_token_passing_reference(rng):
    C, K = 4, 5
    for trial in range(30):
        g = random_graph(rng, n=int(rng.integers(4, 12)), arcs=int(rng.integers(10, 40)), C=C, K=K)
        T = int(rng.integers(1, 8))
        em = log_probs(rng, 1, T, C)
        beam, max_active = float(rng.choice([0.5, 2.0, 5.0, math.inf])), int(rng.integers(1, 5))
        [hyps] = graph_decode(em, g, beam=beam, max_active=max_active)
        ref = reference_beam_search(em[0], g, beam, max_active)
        if ref is None:
            assert hyps == []
            continue
        [h] = hyps
        assert h.score == pytest.approx(ref[0], abs=1e-9)
        assert h.arcs.tolist() == ref[1]


def test_batch_on_the_thread_pool_equals_one_utterance_at_a_time(rng, monkeypatch):
    from duoloss.core import _pool
    monkeypatch.setattr(_pool, "num_threads", lambda: 3)     # split the batch over threads
    C = 6
    g = random_graph(rng, n=150, arcs=900, C=C, K=8)
    em = log_probs(rng, 16, 50, C)
    ln = rng.integers(30, 51, 16)
    calls = []
    real = _pool._run_batch
    monkeypatch.setattr(_pool, "_run_batch", lambda k, o, c, m, a: (calls.append(c >= m), real(k, o, c, m, a)))
    batch = graph_decode(em, g, lengths=ln, beam=6.0, max_active=120)
    assert calls == [True]
    for b in range(16):
        [one] = graph_decode(em[b:b + 1], g, lengths=ln[b:b + 1], beam=6.0, max_active=120)
        assert [(h.score, h.arcs.tolist()) for h in one] == [(h.score, h.arcs.tolist()) for h in batch[b]]
