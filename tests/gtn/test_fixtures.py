"""duoloss.gtn against golden values computed by real GTN (facebookresearch and gtn-org).

Where a GTN build departs from the mathematics (``math_check`` false), the other
build's value or an independent float64 reference is used instead.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import duoloss.gtn as gtn
from duoloss import graphs

from ._fixtures import case_ids, get_case, parse_graph
from ._reference import brute_forward, dag_forward_backward, language


def mk(text, num_nodes, calc_grad=True):
    n, src, dst, il, ol, w, st, ac = parse_graph(text, num_nodes)
    return gtn.Graph.from_arrays(n, src, dst, il, ol, w, st, ac, calc_grad=calc_grad)


def close(a, b, rtol=1e-5, atol=1e-5):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)


def grad_close(a, b, S=0.0):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    assert a.shape == b.shape
    tol = (1e-4 + 1e-6 * S) * np.maximum(1.0, np.abs(b))
    ok = (np.abs(a - b) <= tol) | (np.isnan(a) & np.isnan(b)) | (a == b)
    assert ok.all(), (a[~ok], b[~ok])


def lang_close(got: dict, want):
    want_d = {(tuple(i), tuple(o)): w for i, o, w in want}
    assert set(got) == set(want_d), (sorted(got), sorted(want_d))
    for k, w in want_d.items():
        g = got[k]
        if math.isinf(w) or math.isinf(g):
            assert g == w, (k, g, w)
        else:
            assert abs(g - w) <= 1e-4 * max(1.0, abs(w)), (k, g, w)


# ------------------------------------------------------------------ graph_ops
def _run_op(case, inputs):
    op = case["op"]
    if op in ("intersect", "compose"):
        return getattr(gtn, op)(inputs[0], inputs[1])
    if op in ("union", "concat"):
        return getattr(gtn, op)(inputs)
    if op == "closure":
        return gtn.intersect(gtn.closure(inputs[0]), inputs[1])
    if op in ("project_input", "project_output", "remove", "negate"):
        return getattr(gtn, op)(inputs[0])
    if op in ("add", "subtract"):
        return getattr(gtn, op)(inputs[0], inputs[1])
    raise AssertionError(op)


@pytest.mark.parametrize("case_id", case_ids("graph_ops"))
def test_graph_ops(case_id):
    case = get_case("graph_ops", case_id)
    inputs = [mk(t, n) for t, n in zip(case["inputs"], case["input_num_nodes"])]
    if case.get("arc_sort"):
        for g, how in zip(inputs, case["arc_sort"]):
            if how:
                g.arc_sort(olabel=(how == "olabel"))
    out = _run_op(case, inputs)
    op = case["op"]
    if op in ("negate", "add", "subtract"):
        assert out.num_arcs() == 1 and out.num_nodes() == 2
        close(out.item(), case["value"], rtol=1e-6, atol=0)
        gtn.backward(out)
        for g, want in zip(inputs, case["grad_value"]):
            close(g.grad().weights_to_list(), want)
        return

    org = case.get("gtn_org", {})
    if op == "remove":
        # GTN drops weights: compare the string set with GTN, weights with the input's
        # algebraic language (epsilon removal preserves the weighted language).
        want_lang = language(inputs[0])
        got_lang = language(out)
        assert set(got_lang) == {(tuple(i), tuple(o)) for i, o, _ in case["language"]}
        assert set(got_lang) == set(want_lang)
        for k in want_lang:
            assert abs(got_lang[k] - want_lang[k]) <= 1e-4 * max(1.0, abs(want_lang[k]))
        # d forward_score(remove(g)) / d w == d forward_score(g) / d w
        s = gtn.forward_score(out)
        gtn.backward(s)
        g2 = gtn.Graph.from_arrays(*gtn.graph_arrays(inputs[0]))
        s2 = gtn.forward_score(g2)
        gtn.backward(s2)
        close(s.item(), s2.item())
        grad_close(inputs[0].grad().weights_to_numpy(), g2.grad().weights_to_numpy())
        return

    if case["language_matches_inputs"]:
        ref = case
    else:  # facebookresearch dropped paths (epsilon composition): gtn-org is right
        assert org.get("language_matches_inputs") is True
        ref = {**case, **org}
    lang_close(language(out), ref["language"])

    score = gtn.forward_score(out)
    close(score.item(), ref["forward_score"])
    gtn.backward(score, retain_graph=True)  # `out` is reused for the viterbi checks
    S = abs(ref["forward_score"]) if np.isfinite(ref["forward_score"]) else 0.0
    for g, want in zip(inputs, ref["grad_forward_score"]):
        grad_close(g.grad().weights_to_numpy(), want, S)
        g.zero_grad()

    vs = gtn.viterbi_score(out)
    close(vs.item(), ref["viterbi_score"])
    path = gtn.viterbi_path(out)
    if np.isfinite(ref["viterbi_score"]):
        close(sum(path.weights_to_list()), ref["viterbi_score"], rtol=1e-5, atol=1e-5)
    else:
        assert path.num_nodes() == 0  # no path: the empty graph
    if not case["viterbi_tie"]:
        gtn.backward(vs)
        for g, want in zip(inputs, ref["grad_viterbi_score"]):
            close(g.grad().weights_to_numpy(), want)
        vp = ref["viterbi_path"]  # epsilon placement may differ: compare label strings
        strip = lambda xs: [x for x in xs if x != gtn.epsilon]
        assert strip(path.labels_to_list()) == strip(vp["ilabels"])
        assert strip(path.labels_to_list(False)) == strip(vp["olabels"])


# -------------------------------------------------------------- forward_score
def _pick(case, field):
    """(value, source) of the mathematically right reference for ``field``."""
    mc = case.get("math_check") or {}
    fb = (mc.get("facebookresearch") or {}).get(field)
    og = (mc.get("gtn_org") or {}).get(field)
    if fb:
        return case[field], "facebookresearch"
    if og:
        return case.get("gtn_org", {}).get(field, case[field]), "gtn_org"
    return None, None


@pytest.mark.parametrize("case_id", case_ids("forward_score"))
def test_forward_score(case_id):
    case = get_case("forward_score", case_id)
    g = mk(case["graph"], case["num_nodes"])
    if "cyclic" in case["tags"]:
        with pytest.raises(ValueError, match="cycle"):
            gtn.forward_score(g)
        with pytest.raises(ValueError, match="cycle"):
            gtn.viterbi_score(g)
        with pytest.raises(ValueError, match="cycle"):
            gtn.viterbi_path(g)
        return
    if "nan_weight" in case["tags"]:
        # Deliberate difference: a NaN weight on a path makes that path's weight and
        # hence the score NaN (IEEE semantics); GTN silently drops it.
        assert math.isnan(gtn.forward_score(g).item())
        return
    s = gtn.forward_score(g)
    gtn.backward(s)
    got_grad = g.grad().weights_to_numpy().astype(np.float64) if g.num_arcs() else np.zeros(0)
    ref_Z, ref_grad = dag_forward_backward(g)  # independent float64 DP, always checked
    want, src = _pick(case, "forward_score")
    if want is not None:
        close(s.item(), want)
    close(s.item(), ref_Z, rtol=1e-5, atol=1e-5)
    wgrad, gsrc = _pick(case, "grad_forward_score")
    S = abs(ref_Z) if np.isfinite(ref_Z) else 0.0
    if "pos_inf" in case["tags"]:
        assert s.item() == math.inf  # gradient undefined (NaN), as in both GTN builds
    else:
        assert not np.isnan(got_grad).any()
        grad_close(got_grad, ref_grad, S)
        if wgrad is not None:
            grad_close(got_grad, wgrad, S)

    v = gtn.viterbi_score(g)
    wv, _ = _pick(case, "viterbi_score")
    if wv is not None:
        close(v.item(), wv)
    path = gtn.viterbi_path(g)
    if np.isfinite(v.item()):
        close(sum(path.weights_to_list()), v.item())
        if not case["viterbi_tie"] and wv is not None and case.get("viterbi_path"):
            g.zero_grad()
            gtn.backward(v)
            # facebookresearch zeroes gradients behind dead ends; gtn-org is right there
            ref_v = case.get("gtn_org", {}).get("grad_viterbi_score", case["grad_viterbi_score"])
            close(g.grad().weights_to_numpy(), ref_v)


# -------------------------------------------------------------------- viterbi
def ctc_graph(target, blank):
    return graphs.ctc_graph(list(target), blank=blank)


def asg_trans(N, transitions, start):
    g = gtn.Graph(True)
    g.add_node(True)
    for i in range(N):
        g.add_node(False, True)
    for k in range(N):
        g.add_arc(0, k + 1, k)
    for i in range(N):
        for j in range(N):
            g.add_arc(j + 1, i + 1, i)
    g.set_weights(np.concatenate([np.asarray(start, np.float32).ravel(),
                                  np.asarray(transitions, np.float32).ravel()]))
    return g


@pytest.mark.parametrize("case_id", case_ids("viterbi"))
def test_viterbi(case_id):
    case = get_case("viterbi", case_id)
    T = case["T"]
    if case["kind"] == "ctc":
        C = case["C"]
        E = gtn.linear_graph(T, C)
        E.set_weights(np.asarray(case["logp"], np.float32))
        I = gtn.intersect(ctc_graph(case["target"], case["blank"]), E)
    else:
        N = case["N"]
        E = gtn.linear_graph(T, N)
        E.set_weights(np.asarray(case["emissions"], np.float32))
        Tr = asg_trans(N, case["transitions"], case["start"])
        I = gtn.compose(E, Tr)
    score = gtn.viterbi_score(I)
    close(score.item(), case["score"])
    path = gtn.viterbi_path(I)
    if not np.isfinite(case["score"]):
        assert path.num_nodes() == 0
        return
    assert path.num_nodes() == case["path_num_nodes"]
    close(path.weights_to_list(), case["path_arc_weights"]) if not case["viterbi_tie"] else None
    close(sum(path.weights_to_list()), case["score"], rtol=1e-5, atol=1e-4)
    if not case["viterbi_tie"]:
        assert path.labels_to_list() == case["path_labels"]
        gtn.backward(score)
        close(E.grad().weights_to_numpy().reshape(T, -1), case["grad_emissions"])
        if case["kind"] == "asg":
            gt = Tr.grad().weights_to_numpy()
            N = case["N"]
            close(gt[:N], case["grad_start"])
            close(gt[N:].reshape(N, N), case["grad_transitions"])
    if case.get("free_score") is not None:
        free = gtn.viterbi_score(E)
        close(free.item(), case["free_score"])


# ----------------------------------------------------- seed example (GTN docs)
def test_seed_example_all_alignments():
    """GTN's bindings/python/examples/pytorch_loss.py, unchanged except the import."""
    torch = pytest.importorskip("torch")
    import duoloss.gtn as gtn  # noqa: F811  (the only change: `import gtn`)

    class GTNLossFunction(torch.autograd.Function):
        @staticmethod
        def make_target_graph(target):
            g = gtn.Graph(False)
            L = len(target)
            g.add_node(True)
            for l in range(1, L + 1):
                g.add_node(False, l == L)
                g.add_arc(l - 1, l, target[l - 1])
                g.add_arc(l, l, target[l - 1])
            g.arc_sort(True)
            return g

        @staticmethod
        def forward(ctx, inputs, targets):
            B, T, C = inputs.shape
            losses = [None] * B
            emissions_graphs = [None] * B
            device = inputs.device
            inputs = inputs.cpu()
            targets = targets.cpu()

            def forward_single(b):
                emissions = gtn.linear_graph(T, C, inputs.requires_grad)
                data = inputs[b].contiguous()
                emissions.set_weights(data.data_ptr())
                target = GTNLossFunction.make_target_graph(targets[b])
                target_score = gtn.forward_score(gtn.intersect(target, emissions))
                norm = gtn.forward_score(emissions)
                loss = gtn.subtract(norm, target_score)
                losses[b] = loss
                emissions_graphs[b] = emissions

            gtn.parallel_for(forward_single, range(B))
            ctx.auxiliary_data = (losses, emissions_graphs, inputs.shape)
            return torch.tensor([l.item() for l in losses]).to(device)

        @staticmethod
        def backward(ctx, grad_output):
            losses, emissions_graphs, in_shape = ctx.auxiliary_data
            B, T, C = in_shape
            input_grad = torch.empty((B, T, C))

            def backward_single(b):
                gtn.backward(losses[b])
                emissions = emissions_graphs[b]
                grad = emissions.grad().weights_to_numpy()
                input_grad[b] = torch.from_numpy(grad).view(1, T, C)

            gtn.parallel_for(backward_single, range(B))
            return input_grad.to(grad_output.device), None

    GTNLoss = GTNLossFunction.apply
    cases = get_case("all_alignments", "public/all_alignments/000") and \
        [get_case("all_alignments", cid) for cid in case_ids("all_alignments")]
    for case in cases:
        B, T, C, U = case["B"], case["T"], case["C"], case["U"]
        inputs = torch.tensor(np.asarray(case["inputs"], np.float32), requires_grad=True)
        targets = torch.tensor(np.asarray(case["targets"], np.int64).reshape(B, U))
        losses = GTNLoss(inputs, targets)
        losses.sum().backward()
        want = np.asarray(case["losses"], np.float64)
        got = losses.detach().numpy().astype(np.float64)
        assert np.array_equal(np.isinf(got), np.isinf(want)), case["id"]
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5, err_msg=case["id"])
        S = float(np.nanmax(np.abs(case["forward_score_E"]))) if B else 0.0
        grad_close(inputs.grad.numpy(), np.asarray(case["grads"], np.float64).reshape(B, T, C), S)
