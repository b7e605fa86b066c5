"""Calls of the public API as a user writes them, checked by mypy (tests/test_typing.py).

Not a test module: mypy reads it, pytest does not run it. ``assert_type`` pins the
result types the annotations promise; ``--strict`` makes a call to an unannotated
public function an error (``disallow_untyped_calls``).
"""
from __future__ import annotations

from typing import assert_type

import jax
import numpy as np
import torch

import duoloss
import duoloss.graphs as dg
import duoloss.gtn as gtn
import duoloss.jax as dj
import duoloss.torch as dt
from duoloss.gtn import Graph

# --- torch ---------------------------------------------------------------------------------
lp = torch.randn(6, 2, 5).log_softmax(-1)
tg = torch.tensor([[1, 2], [3, 0]])
il, tl = torch.tensor([6, 5]), [2, 1]
assert_type(dt.ctc_loss(lp, tg, il, tl), torch.Tensor)
assert_type(dt.CTCLoss(blank=0).forward(lp, tg, il, tl), torch.Tensor)  # module(...) is Any in torch's stubs
assert_type(dt.asg_loss(lp, None, tg, il, tl, reduction="sum"), torch.Tensor)
assert_type(dt.ASGLoss(5, device="cpu").forward(lp, tg, il, tl), torch.Tensor)
graphs = [dg.ctc_graph([1, 2]), dg.ctc_graph([3])]
assert_type(graphs[0], Graph)
assert_type(dg.ctc_graph([[1, 2], [3]]), list[Graph])  # a batch of targets
packed = dt.pack_graphs([dg.ctc_topo(5)], num_nodes=10)
assert_type(packed, dt.PackedGraphs)
assert_type(dt.graph_loss(lp, graphs, il, target_lengths=tl), torch.Tensor)
assert_type(dt.GraphLoss(0).forward(lp, graphs, il), torch.Tensor)
assert_type(dt.ctc_align(lp, tg, il, tl), tuple[torch.Tensor, torch.Tensor])
assert_type(dt.asg_align(lp, None, tg, il, tl), tuple[torch.Tensor, torch.Tensor])
assert_type(dt.asg_viterbi(lp, None, il), tuple[torch.Tensor, torch.Tensor])
assert_type(dt.graph_align(lp, graphs, il), tuple[torch.Tensor, torch.Tensor, torch.Tensor])
logits = torch.randn(2, 6, 3, 5)
assert_type(dt.rnnt_loss(logits, tg, il, tl, blank=0, reduction="none"), torch.Tensor)
assert_type(dt.RNNTLoss(blank=0).forward(logits, tg, il, tl), torch.Tensor)
assert_type(dt.rnnt_align(logits, tg, il, tl), tuple[torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dt.token_spans(dt.ctc_align(lp, tg, il, tl)[0], lp),
            tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dt.rnnt_loss_from_joiner(lambda e, p: e + p, torch.randn(2, 6, 5), torch.randn(2, 3, 5),
                                     tg, il, tl), torch.Tensor)
am, lm, sym = torch.randn(2, 6, 5), torch.randn(2, 3, 5), torch.tensor([[1, 2], [3, 4]])
bd = torch.tensor([[0, 0, 2, 6], [0, 0, 2, 5]])
loss_s = dt.rnnt_loss_simple(lm, am, sym, 0, bd)
loss_m = dt.rnnt_loss_smoothed(lm, am, sym, 0, 0.1, 0.1, bd)
px, py = dt.get_rnnt_logprobs(lm, am, sym, 0)
assert_type(px, torch.Tensor)
ranges = dt.get_rnnt_prune_ranges(px, py, bd, 2)
assert_type(ranges, torch.Tensor)
am_p, lm_p = dt.do_rnnt_pruning(am, lm, ranges)
assert_type(dt.rnnt_loss_pruned(am_p + lm_p, sym, ranges, 0, bd), torch.Tensor)
assert_type(dt.get_rnnt_logprobs_pruned(am_p + lm_p, sym, ranges, 0, bd), tuple[torch.Tensor, torch.Tensor])

# --- jax -----------------------------------------------------------------------------------
x = np.zeros((6, 2, 5), np.float32)
t, jl, jt = np.array([[1, 2], [3, 0]]), np.array([6, 5]), np.array([2, 1])
assert_type(dj.ctc_loss(x, t, jl, jt), jax.Array)
assert_type(dj.optax_ctc_loss(x, x[..., 0], t, np.zeros((2, 2))), jax.Array)
assert_type(dj.asg_loss(x, None, t, jl, jt), jax.Array)
assert_type(dj.graph_loss(x, graphs, jl), jax.Array)
assert_type(dj.pack_graphs(graphs), dj.PackedGraphs)
assert_type(dj.ctc_align(x, t, jl, jt), tuple[jax.Array, jax.Array])
assert_type(dj.asg_align(x, None, t, jl, jt), tuple[jax.Array, jax.Array])
assert_type(dj.asg_viterbi(x, None, jl), tuple[jax.Array, jax.Array])
assert_type(dj.graph_align(x, graphs, jl), tuple[jax.Array, jax.Array, jax.Array])
jlogits = np.zeros((2, 6, 3, 5), np.float32)
assert_type(dj.rnnt_loss(jlogits, t, jl, jt), jax.Array)
assert_type(dj.rnnt_align(jlogits, t, jl, jt), tuple[jax.Array, jax.Array, jax.Array])
assert_type(dj.token_spans(np.zeros((2, 6), np.int32), x),
            tuple[jax.Array, jax.Array, jax.Array, jax.Array])
assert_type(dj.rnnt_loss_from_joiner(lambda e, p: e + p, np.zeros((2, 6, 5)), np.zeros((2, 3, 5)),
                                     t, jl, jt), jax.Array)
jam, jlm, jsym, jbd = np.zeros((2, 6, 5)), np.zeros((2, 3, 5)), np.array([[1, 2], [3, 4]]), np.array([[0, 0, 2, 6]] * 2)
jloss = dj.rnnt_loss_simple(jlm, jam, jsym, 0, jbd)
jpx, jpy = dj.get_rnnt_logprobs(jlm, jam, jsym, 0)
jranges = dj.get_rnnt_prune_ranges(jpx, jpy, jbd, 2)
assert_type(jranges, jax.Array)
jam_p, jlm_p = dj.do_rnnt_pruning(jam, jlm, jranges)
assert_type(dj.rnnt_loss_pruned(jam_p + jlm_p, jsym, jranges, 0, jbd), jax.Array)
assert_type(dj.get_rnnt_logprobs_pruned(jam_p + jlm_p, jsym, jranges, 0, jbd), tuple[jax.Array, jax.Array])

# --- graph builders ------------------------------------------------------------------------
assert_type(dg.ctc_topo(5, modified=True), Graph)
g, idx = dg.asg_graph([0, 1], 2)
assert_type(g, Graph)
assert_type(dg.token_ngram_graph([[0, 1]], 2), Graph)
assert_type(dg.wordpiece_graph("ab", ["a", "b", "ab"]), Graph)

# --- transducer variants, spans, the joiner-side loss --------------------------------------
tdt_logits = torch.randn(2, 6, 3, 5 + 2)
assert_type(dt.tdt_loss(tdt_logits, tg, il, tl, blank=4, durations=[0, 1]), torch.Tensor)
assert_type(dt.TDTLoss(4, [0, 1]).forward(tdt_logits, tg, il, tl), torch.Tensor)
assert_type(dt.multiblank_rnnt_loss(logits, tg, il, tl, blank=4, big_blank_durations=[2]), torch.Tensor)
assert_type(dt.MultiblankRNNTLoss(4, [2]).forward(logits, tg, il, tl), torch.Tensor)
labels, _scores = dt.ctc_align(lp, tg, il, tl)
assert_type(dt.token_spans(labels, lp), tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor])
enc, pred = torch.randn(2, 6, 5), torch.randn(2, 3, 5)
assert_type(dt.rnnt_loss_from_joiner(lambda e, p: e + p, enc, pred, tg, il, tl), torch.Tensor)
assert_type(dj.tdt_loss(np.zeros((2, 6, 3, 7)), t, jl, jt, blank=4, durations=[0, 1]), jax.Array)
assert_type(dj.multiblank_rnnt_loss(jlogits, t, jl, jt, blank=4, big_blank_durations=[2]), jax.Array)
jlabels, _jscores = dj.ctc_align(x, t, jl, jt)
assert_type(dj.token_spans(jlabels, x), tuple[jax.Array, jax.Array, jax.Array, jax.Array])
assert_type(dj.rnnt_loss_from_joiner(lambda e, p: e + p, np.zeros((2, 6, 5)), np.zeros((2, 3, 5)), t, jl, jt),
            jax.Array)

# --- duoloss.gtn and duoloss.warmup --------------------------------------------------------
a, b = gtn.linear_graph(2, 3), gtn.scalar_graph(1.0)
assert_type(gtn.forward_score(a), Graph)
assert_type(gtn.forward_score([a, a]), list[Graph])
assert_type(gtn.compose(a, a), Graph)
assert_type(gtn.intersect([a], [a]), list[Graph])
gtn.backward(gtn.forward_score(a))
assert_type(gtn.to_dot(a), str)
assert_type(gtn.graph_arrays(a)[0], int)
assert_type(duoloss.warmup(["ctc"], verbose=False), dict[str, float])

# --- duoloss.core (numpy in, numpy out) ----------------------------------------------------
import duoloss.core as dc  # noqa: E402

core_losses, core_grad = dc.ctc_loss_and_grad(x.astype(np.float64), t, jl, jt)
assert_type(core_losses, np.ndarray)
assert_type(core_grad, np.ndarray | None)
assert_type(dc.transducer_viterbi(np.zeros((1, 2, 4)), np.zeros((1, 3, 3))), tuple[np.ndarray, np.ndarray])

# --- decoding: CTC greedy, transducer greedy and beam search ---------------------------------
assert_type(dt.ctc_greedy_decode(lp, il), tuple[torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dt.ctc_greedy_decode(lp, [6, 5], 0, batch_first=False), tuple[torch.Tensor, torch.Tensor, torch.Tensor])
t_pred = lambda tok, st: (tok.float()[:, None], st)  # noqa: E731
assert_type(dt.rnnt_greedy_decode(enc, il, t_pred, lambda e, p: e + p, max_symbols_per_frame=2),
            tuple[torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dt.tdt_greedy_decode(enc, il, t_pred, lambda e, p: e + p, 2, [0, 1]),
            tuple[torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dt.multiblank_greedy_decode(enc, il, t_pred, lambda e, p: e + p, 4, [2]),
            tuple[torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dt.rnnt_beam_search(enc, il, t_pred, lambda e, p: e + p, beam=2),
            tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dt.tdt_beam_search(enc, il, t_pred, lambda e, p: e + p, 2, [0, 1], beam=2),
            tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor])
assert_type(dj.ctc_greedy_decode(x, jl), tuple[jax.Array, jax.Array, jax.Array])
j_pred = lambda tok, st: (tok[:, None] * 1.0, st)  # noqa: E731
assert_type(dj.rnnt_greedy_decode(np.zeros((2, 6, 5)), jl, j_pred, lambda e, p: e + p),
            tuple[jax.Array, jax.Array, jax.Array])
assert_type(dj.tdt_greedy_decode(np.zeros((2, 6, 5)), jl, j_pred, lambda e, p: e + p, 2, [0, 1]),
            tuple[jax.Array, jax.Array, jax.Array])
assert_type(dj.multiblank_greedy_decode(np.zeros((2, 6, 5)), jl, j_pred, lambda e, p: e + p, 4, [2]),
            tuple[jax.Array, jax.Array, jax.Array])
assert_type(dj.rnnt_beam_search(np.zeros((2, 6, 5)), jl, j_pred, lambda e, p: e + p, beam=2),
            tuple[jax.Array, jax.Array, jax.Array, jax.Array])
assert_type(dj.tdt_beam_search(np.zeros((2, 6, 5)), jl, j_pred, lambda e, p: e + p, 2, [0, 1]),
            tuple[jax.Array, jax.Array, jax.Array, jax.Array])

# --- decoding: WFST (graph_decode, lexicon_graph, arpa_graph) ---------------------------------
from duoloss.core.decoding.wfst import GraphHypothesis  # noqa: E402

w_lex = dg.lexicon_graph({"ab": [[1, 2]]}, ["-", "a", "b"], words=["ab"], sil=0)
assert_type(w_lex, Graph)
w_graph = gtn.compose(dg.ctc_topo(3), w_lex)
assert_type(dt.graph_decode(torch.zeros((1, 4, 3)), w_graph, lengths=[4], beam=10.0, max_active=None),
            list[list[GraphHypothesis]])
assert_type(dj.graph_decode(np.zeros((1, 4, 3)), w_graph, lengths=np.array([4]), max_active=50),
            list[list[GraphHypothesis]])
