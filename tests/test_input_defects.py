"""Small input defects of issue 19 (points 6, 7), each pinned here.

* graph builders refuse sizes they cannot hold (before allocating anything) and
  reject bools where integers are expected;
* ``gtn.loadtxt`` / ``gtn.load`` refuse node ids and counts beyond the limit with a
  ``ValueError`` naming the function and the line;
* module constructors reject argument types that used to fail only at call time;
* a batch-first ``(N, T, C)`` tensor passed where ``(T, N, C)`` is due says so.
"""
from __future__ import annotations

import io
import time

import numpy as np
import pytest
import torch

import duoloss.gtn as gtn
import duoloss.jax as dj
import duoloss.torch as dt
from duoloss import graphs as gb


class _Huge:
    """A sequence that claims 10**9 entries and must never be read."""

    def __len__(self):
        return 10 ** 9

    def __iter__(self):  # pragma: no cover - reading it is the defect
        raise AssertionError("the builder read a sequence it should have refused")

    __array__ = __iter__


# ---------------------------------------------------------------- graph builders


def test_ctc_topo_refuses_sizes_it_cannot_hold_quickly():
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"ctc_topo: argument 'num_classes' = 1000000 \(C\*\*2\) "
                                         r"would need 1000000000000 arcs, more than the limit "
                                         r"of 268435456"):
        gb.ctc_topo(10 ** 6)
    with pytest.raises(ValueError, match=r"ctc_topo: .* \(3C - 2\) would need 3000000001 arcs"):
        gb.ctc_topo(10 ** 9 + 1, modified=True)
    assert time.perf_counter() - t0 < 1.0  # refused before any loop or allocation


def test_other_builders_refuse_huge_inputs():
    with pytest.raises(ValueError, match=r"ctc_graph: argument 'targets' of length 1000000000 "
                                         r"would need 6000000003 arcs"):
        gb.ctc_graph(_Huge())
    with pytest.raises(ValueError, match=r"asg_graph: argument 'target' of length 1000000000 "
                                         r"would need 2000000000 arcs"):
        gb.asg_graph(_Huge(), 5)
    with pytest.raises(ValueError, match=r"token_ngram_graph: argument 'num_classes' = "
                                         r"1000000000000 \(C arcs from the empty history\)"):
        gb.token_ngram_graph([[1, 2]], 10 ** 12)


def test_token_ngram_order_beyond_the_data_is_cheap():
    """Histories are bounded by the sequences, so a huge order costs nothing more
    and builds the graph of any order above the longest context."""
    seqs = [[1, 2, 0], [2, 2]]
    g_big = gb.token_ngram_graph(seqs, 3, order=10 ** 9)
    g_ref = gb.token_ngram_graph(seqs, 3, order=5)  # > longest context (BOS + 3 tokens)
    assert gtn.equal(g_big, g_ref)


@pytest.mark.parametrize("call", [
    lambda: gb.ctc_graph([True, 2]),
    lambda: gb.ctc_graph([[1, 2], [np.True_]]),
    lambda: gb.ctc_graph(np.array([True, False])),
    lambda: gb.ctc_graph([1], blank=np.True_),
    lambda: gb.ctc_topo(True),
    lambda: gb.ctc_topo(np.True_),
    lambda: gb.asg_graph([1, False], 3),
    lambda: gb.asg_graph([1], True),
    lambda: gb.token_ngram_graph([[True, 1]], 3),
    lambda: gb.token_ngram_graph([[1]], 3, order=True),
], ids=["ctc_graph-list", "ctc_graph-batch", "ctc_graph-bool-array", "ctc_graph-blank",
        "ctc_topo-bool", "ctc_topo-np-bool", "asg_graph-target", "asg_graph-C",
        "token_ngram-seq", "token_ngram-order"])
def test_builders_reject_bools_as_integers(call):
    with pytest.raises(TypeError, match=r"^(ctc_graph|ctc_topo|asg_graph|token_ngram_graph): "
                                        r"argument '.*'.*bool"):
        call()


def test_vectorised_builders_keep_the_documented_structure():
    """Arc counts and labels from the docstrings (C**2 / 3C - 2 arcs for ctc_topo,
    output epsilon on blanks and repeats), checked arc by arc."""
    c, blank = 4, 1
    n, src, dst, il, ol, w, start, accept = gtn.graph_arrays(gb.ctc_topo(c, blank))
    assert n == c and len(src) == c * c and start.tolist() == [k == blank for k in range(c)]
    assert accept.all() and not w.any()
    for s, d, i, o in zip(src, dst, il, ol):
        assert i == d and o == (-1 if d in (blank, s) else d)
    n, src, dst, il, ol, *_ = gtn.graph_arrays(gb.ctc_topo(c, blank, modified=True))
    arcs = set(zip(src.tolist(), dst.tolist(), il.tolist(), ol.tolist()))
    want = {(blank, blank, blank, -1)}
    for j in set(range(c)) - {blank}:
        want |= {(blank, j, j, j), (j, j, j, -1), (j, blank, -1, -1)}
    assert len(src) == 3 * c - 2 and arcs == want
    # ctc_graph of [2, 2, 3]: 7 nodes, 7 self-loops, 6 advances, skip 3 -> 5 only
    n, src, dst, il, *_ = gtn.graph_arrays(gb.ctc_graph([2, 2, 3]))
    lab = [0, 2, 0, 2, 0, 3, 0]
    assert n == 7 and len(src) == 7 + 6 + 1
    assert {(s, d) for s, d in zip(src.tolist(), dst.tolist()) if d - s == 2} == {(3, 5)}
    assert all(il[a] == lab[dst[a]] for a in range(len(src)))


# ---------------------------------------------------------------- gtn I/O


@pytest.mark.parametrize("text, line", [
    ("0\n1\n0 1000000000000 2\n", 3),
    ("0\n1\n0 1 2\n1 -4 2\n", 4),
    ("1000000000000\n1\n", 1),
    ("0\n1 -1\n", 2),
])
def test_loadtxt_refuses_node_ids_beyond_the_limit(text, line):
    with pytest.raises(ValueError, match=rf"^loadtxt: line {line}: node ids must lie in "
                                         rf"\[0, 2\*\*28\)"):
        gtn.loadtxt(io.StringIO(text))


def test_loadtxt_num_nodes_and_binary_header_are_bounded():
    with pytest.raises(ValueError, match=r"loadtxt: num_nodes must lie in \[2, 2\*\*28\]"):
        gtn.loadtxt(io.StringIO("0\n1\n"), num_nodes=10 ** 12)
    with pytest.raises(ValueError, match=r"loadtxt: num_nodes must lie in \[2, 2\*\*28\] .*, got 1$"):
        gtn.loadtxt(io.StringIO("0\n1\n"), num_nodes=1)
    with pytest.raises(TypeError, match=r"loadtxt: num_nodes must be an int, got bool"):
        gtn.loadtxt(io.StringIO("0\n1\n"), num_nodes=True)
    assert gtn.loadtxt(io.StringIO("0\n1\n"), num_nodes=5).num_nodes() == 5
    header = np.array([2 ** 31 - 1, 0, 0, 0], "<i4").tobytes()
    with pytest.raises(ValueError, match=r"^load: the header asks for 2147483647 nodes"):
        gtn.load(io.BytesIO(header))


# ---------------------------------------------------------------- constructors


@pytest.mark.parametrize("make, exc, msg", [
    (lambda: dt.RNNTLoss(blank=1.5), TypeError, "RNNTLoss: argument 'blank' must be an int, got float"),
    (lambda: dt.RNNTLoss(blank="a"), TypeError, "RNNTLoss: argument 'blank' must be an int, got str"),
    (lambda: dt.RNNTLoss(blank=True), TypeError, "RNNTLoss: argument 'blank' must be an int, got bool"),
    (lambda: dt.CTCLoss(blank=1.0), TypeError, "CTCLoss: argument 'blank' must be an int, got float"),
    (lambda: dt.CTCLoss(blank=-1), ValueError, "CTCLoss: argument 'blank' must be in >= 0, got -1"),
    (lambda: dt.CTCLoss(reduction="avg"), ValueError, "CTCLoss: argument 'reduction' must be one of"),
    (lambda: dt.CTCLoss(zero_infinity="yes"), TypeError, "CTCLoss: argument 'zero_infinity' must be a bool"),
    (lambda: dt.ASGLoss(3, zero_infinity=1), TypeError, "ASGLoss: argument 'zero_infinity' must be a bool"),
    (lambda: dt.ASGLoss(3, learn_start="no"), TypeError, "ASGLoss: argument 'learn_start' must be a bool"),
    (lambda: dt.GraphLoss(normalize=1), TypeError, "GraphLoss: argument 'normalize' must be a bool"),
    (lambda: dt.GraphLoss(zero_infinity=None), TypeError, "GraphLoss: argument 'zero_infinity' must be a bool"),
    (lambda: dt.TDTLoss(blank=2.0, durations=[0, 1]), TypeError, "TDTLoss: argument 'blank' must be an int, got float"),
    (lambda: dt.MultiblankRNNTLoss(blank="a", big_blank_durations=[2]), TypeError, "MultiblankRNNTLoss: argument 'blank' must be an int, got str"),
])
def test_module_constructors_validate_what_calls_would(make, exc, msg):
    with pytest.raises(exc) as err:
        make()
    assert str(err.value).startswith(msg)


def test_module_constructors_keep_valid_arguments():
    assert dt.RNNTLoss(blank=-1).blank == -1 and dt.RNNTLoss(blank=np.int64(3)).blank == 3
    assert dt.CTCLoss(blank=2, reduction="sum", zero_infinity=True).zero_infinity is True


# ---------------------------------------------------------------- layout hints


def test_batch_first_log_probs_get_a_layout_hint():
    T, N, C, S = 20, 4, 6, 5
    lp = torch.randn(N, T, C).log_softmax(-1)  # the batch-first mistake
    tg = torch.ones(N, S, dtype=torch.long)
    il, tl = torch.full((N,), T), torch.full((N,), S)
    hint = r"looks batch-first \(N, T, C\), but it must be time-first \(T, N, C\)"
    with pytest.raises(ValueError, match=r"^ctc_loss: argument 'targets' must have N = 20 rows.*"
                                         + hint):
        dt.ctc_loss(lp, tg, il, tl)
    with pytest.raises(ValueError, match=r"^ctc_loss: argument 'input_lengths' .*" + hint):
        dt.ctc_loss(lp, tg.reshape(-1), il, tl)  # concatenated targets: the lengths differ
    with pytest.raises(ValueError, match=r"^ctc_loss: argument 'targets' .*" + hint):
        dj.ctc_loss(lp.numpy(), tg.numpy(), il.numpy(), tl.numpy())
    with pytest.raises(ValueError, match=r"^asg_loss: argument 'targets' .*emissions of shape "
                                         r"\(4, 20, 6\) looks batch-first"):
        dt.asg_loss(lp, torch.zeros(C, C), tg, il, tl)
    from duoloss.graphs import ctc_graph
    graphs = [ctc_graph([1, 2])] * N
    with pytest.raises(ValueError, match=r"^graph_loss: argument 'input_lengths' .*emissions of "
                                         r"shape \(4, 20, 6\) looks batch-first"):
        dt.graph_loss(lp, graphs, il)
    # no hint where the first axis is not the batch size: a plain mismatch
    with pytest.raises(ValueError) as err:
        dt.ctc_loss(torch.randn(T, N, C).log_softmax(-1), tg[:3], il, tl)
    assert "batch-first" not in str(err.value)
