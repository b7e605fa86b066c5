"""The catalogue of bad inputs tried against every public function.

Each :class:`Case` names a public function, the argument it breaks and how; the
same case is run through ``duoloss.torch`` and ``duoloss.jax`` by
``tests/test_bad_inputs.py`` (identical exception type and message required, and
no kernel or callback may run).  ``python tests/bad_inputs.py`` prints the
table of the README's "Hardening" section (function, input, exception, message) from the
very same cases, so the documentation cannot drift from what is tested.

Good inputs use int32/float32 so JAX (``jax_enable_x64`` off) and torch see the
same dtypes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

import numpy as np

T, N, C, S = 6, 2, 5, 3


def _graph(target, n_cls=C):
    from duoloss.gtn import Graph

    g = Graph(calc_grad=False)
    g.add_node(start=True, accept=len(target) == 0)
    for i, k in enumerate(target):
        g.add_node(accept=i == len(target) - 1)
        g.add_arc(i, i + 1, k)
        g.add_arc(i + 1, i + 1, k)
    return g


def good(fn: str) -> Dict[str, Any]:
    """Valid keyword arguments of ``fn`` as numpy arrays / Python objects."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, N, C)).astype(np.float32)
    lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)
    tg = np.array([[1, 2, 3], [2, 2, 0]], np.int32)
    il = np.array([6, 5], np.int32)
    tl = np.array([3, 2], np.int32)
    tr = rng.standard_normal((C, C)).astype(np.float32)
    st = rng.standard_normal(C).astype(np.float32)
    if fn in ("ctc_loss", "ctc_align"):
        return dict(log_probs=lp, targets=tg, input_lengths=il, target_lengths=tl)
    if fn in ("asg_loss", "asg_align"):
        return dict(emissions=x, transitions=tr, targets=tg, input_lengths=il,
                    target_lengths=tl, start_transitions=st)
    if fn == "asg_viterbi":
        return dict(emissions=x, transitions=tr, input_lengths=il, start_transitions=st)
    if fn in ("graph_loss", "graph_align"):
        return dict(emissions=x, graphs=[_graph([1, 2, 3]), _graph([2, 2])], input_lengths=il,
                    weights=np.zeros(3, np.float32),
                    arc_weight_index=[np.array([0, 1, -1, 2, 0, 1], np.int32),
                                      np.array([0, 1, -1, 2], np.int32)])
    if fn == "optax_ctc_loss":
        pad = np.zeros((N, T), np.float32)
        pad[1, 5:] = 1
        lpad = np.zeros((N, S), np.float32)
        lpad[1, 2:] = 1
        return dict(logits=x.transpose(1, 0, 2).copy(), logit_paddings=pad, labels=tg,
                    label_paddings=lpad)
    if fn in _K2_FNS:  # k2-style RNN-T (helper F2)
        return _k2_good(fn)
    if fn in _DECODE_FNS:  # decoders (helper H)
        return _decode_good(fn)
    # RNN-T (transducer helper F1): logits (N, T, U + 1, V), blank = V - 1
    if fn in ("rnnt_loss", "rnnt_align"):
        return dict(logits=rng.standard_normal((N, T, S + 1, C)).astype(np.float32),
                    targets=tg, logit_lengths=il, target_lengths=tl)
    # TDT: V = C tokens (blank 4) + 3 durations; multi-blank: blank 5, big blank 4
    if fn == "tdt_loss":
        return dict(logits=rng.standard_normal((N, T, S + 1, C + 3)).astype(np.float32),
                    targets=tg, logit_lengths=il, target_lengths=tl, blank=C - 1,
                    durations=[0, 1, 2])
    if fn == "multiblank_rnnt_loss":
        return dict(logits=rng.standard_normal((N, T, S + 1, C + 1)).astype(np.float32),
                    targets=tg, logit_lengths=il, target_lengths=tl, blank=C,
                    big_blank_durations=[2])
    raise KeyError(fn)


def _packed():
    from duoloss.core import pack_graphs

    d = good("graph_loss")
    return pack_graphs(d["graphs"], d["arc_weight_index"])


@dataclasses.dataclass
class Case:
    """One bad input: ``fn`` called with ``good(fn)`` updated by ``change``."""

    fn: str
    arg: str                      # the argument the message must name
    what: str                     # human description for the table
    change: Callable[[Dict[str, Any]], None]
    exc: type = ValueError
    frameworks: tuple = ("torch", "jax")
    # Extra substring expected in the message (e.g. the offending value).
    expect: Optional[str] = None
    # For single-framework APIs (modules, pack_graphs, duoloss.gtn): a thunk
    # that makes the call, and the message prefix required instead of
    # "<fn>: argument '<arg>'" (GTN's own messages read "<fn>: <arg> must ...").
    run: Optional[Callable[[], Any]] = None
    prefix: Optional[str] = None
    # A known gap in a file this catalogue's owner may not edit: the test is a
    # strict xfail until the fix lands (then it must be removed).
    gap: Optional[str] = None


def _set(**kw):
    def change(d):
        for k, v in kw.items():
            if v is _DEL:
                d.pop(k, None)
            else:
                d[k] = v(d) if callable(v) and not isinstance(v, type) else v
    return change


_DEL = object()


def _ctc_family(fn):
    """Bad inputs shared by ctc_loss and ctc_align."""
    cs = [
        Case(fn, "log_probs", "int32 log_probs", _set(log_probs=lambda d: d["log_probs"].astype(np.int32)), TypeError, expect="got int32"),
        Case(fn, "log_probs", "complex64 log_probs (float16/bfloat16 are accepted)", _set(log_probs=lambda d: d["log_probs"].astype(np.complex64)), TypeError, expect="got complex64"),
        Case(fn, "log_probs", "bool log_probs", _set(log_probs=lambda d: d["log_probs"] > 0), TypeError, expect="got bool"),
        Case(fn, "log_probs", "1-D log_probs", _set(log_probs=lambda d: d["log_probs"][:, 0, 0].copy()), expect="(6,)"),
        Case(fn, "log_probs", "4-D log_probs", _set(log_probs=lambda d: d["log_probs"][None]), expect="(1, 6, 2, 5)"),
        Case(fn, "log_probs", "zero classes (C = 0)", _set(log_probs=np.zeros((T, N, 0), np.float32)), expect="C >= 1"),
        Case(fn, "targets", "float targets", _set(targets=lambda d: d["targets"].astype(np.float32)), TypeError, expect="got float32"),
        Case(fn, "targets", "bool targets", _set(targets=lambda d: d["targets"] > 0), TypeError, expect="got bool"),
        Case(fn, "targets", "3-D targets", _set(targets=lambda d: d["targets"][None]), expect="(1, 2, 3)"),
        Case(fn, "targets", "targets with N+1 rows", _set(targets=np.ones((N + 1, S), np.int32)), expect="(3, 3)"),
        Case(fn, "targets", "batch-first (N, T, C) log_probs (the rows of targets then differ)", _set(log_probs=lambda d: np.ascontiguousarray(d["log_probs"].transpose(1, 0, 2))), expect="must be time-first (T, N, C)"),
        Case(fn, "targets", "label >= C", _set(targets=lambda d: np.where(d["targets"] == 3, C, d["targets"]).astype(np.int32)), expect="got 5 at sequence 0, position 2"),
        Case(fn, "targets", "negative label", _set(targets=np.array([[1, -1, 3], [2, 2, 0]], np.int32)), expect="got -1 at sequence 0, position 1"),
        Case(fn, "targets", "blank inside a target", _set(targets=np.array([[1, 0, 3], [2, 2, 0]], np.int32)), expect="blank index (0)"),
        Case(fn, "targets", "blank=2 inside a target", _set(blank=2), expect="blank index (2)"),
        Case(fn, "blank", "blank = C", _set(blank=C), expect="[0, 5), got 5"),
        Case(fn, "blank", "blank = -1", _set(blank=-1), expect="got -1"),
        Case(fn, "blank", "float blank", _set(blank=0.0), TypeError, expect="got float"),
        Case(fn, "blank", "bool blank", _set(blank=True), TypeError, expect="got bool"),
        Case(fn, "input_lengths", "input length > T", _set(input_lengths=np.array([7, 5], np.int32)), expect="got 7 at index 0"),
        Case(fn, "input_lengths", "negative input length", _set(input_lengths=np.array([6, -1], np.int32)), expect="got -1 at index 1"),
        Case(fn, "input_lengths", "float input_lengths", _set(input_lengths=np.array([6.0, 5.0], np.float32)), TypeError, expect="got float32"),
        Case(fn, "input_lengths", "(N+1,) input_lengths", _set(input_lengths=np.array([6, 5, 4], np.int32)), expect="(3,)"),
        Case(fn, "input_lengths", "(N, 1) input_lengths", _set(input_lengths=np.array([[6], [5]], np.int32)), expect="(2, 1)"),
        Case(fn, "target_lengths", "target length > S", _set(target_lengths=np.array([4, 2], np.int32)), expect="got 4 at index 0"),
        Case(fn, "target_lengths", "negative target length", _set(target_lengths=np.array([3, -2], np.int32)), expect="got -2 at index 1"),
        Case(fn, "target_lengths", "float target_lengths", _set(target_lengths=np.array([3.0, 2.0], np.float32)), TypeError, expect="got float32"),
        Case(fn, "target_lengths", "(N-1,) target_lengths", _set(target_lengths=np.array([3], np.int32)), expect="(1,)"),
        Case(fn, "target_lengths", "concatenated targets, lengths sum too large", _set(targets=np.array([1, 2, 3, 2, 2], np.int32), target_lengths=np.array([3, 3], np.int32)), expect="got sum 6"),
        Case(fn, "target_lengths", "concatenated targets, negative length", _set(targets=np.array([1, 2, 3, 2, 2], np.int32), target_lengths=np.array([4, -1], np.int32)), expect="got -1 at index 1"),
        Case(fn, "targets", "concatenated targets with blank", _set(targets=np.array([1, 2, 3, 0, 2], np.int32)), expect="blank index (0)"),
        Case(fn, "targets", "unbatched (T, C) input with 2-D targets", _set(log_probs=lambda d: d["log_probs"][:, 0].copy(), input_lengths=np.array(6, np.int32), target_lengths=np.array(3, np.int32)), expect="1-D (S,)"),
        Case(fn, "input_lengths", "unbatched (T, C) input with (2,) input_lengths", _set(log_probs=lambda d: d["log_probs"][:, 0].copy(), targets=np.array([1, 2, 3], np.int32), target_lengths=np.array(3, np.int32)), expect="scalar"),
    ]
    for c in cs:  # ctc_align has no reduction; all else is the same
        c.fn = fn
    return cs


def _asg_family(fn):
    has_tl = fn != "asg_viterbi"
    cs = [
        Case(fn, "emissions", "int32 emissions", _set(emissions=lambda d: d["emissions"].astype(np.int32)), TypeError, expect="got int32"),
        Case(fn, "emissions", "complex64 emissions (float16/bfloat16 are accepted)", _set(emissions=lambda d: d["emissions"].astype(np.complex64)), TypeError, expect="got complex64"),
        Case(fn, "emissions", "2-D emissions", _set(emissions=lambda d: d["emissions"][:, 0].copy()), expect="(6, 5)"),
        Case(fn, "emissions", "zero classes (C = 0)", _set(emissions=np.zeros((T, N, 0), np.float32), transitions=None, start_transitions=None), expect="C >= 1"),
        Case(fn, "transitions", "(C, C+1) transitions", _set(transitions=np.zeros((C, C + 1), np.float32)), expect="(5, 6)"),
        Case(fn, "transitions", "(C,) transitions", _set(transitions=np.zeros(C, np.float32)), expect="(5,)"),
        Case(fn, "transitions", "int32 transitions", _set(transitions=np.zeros((C, C), np.int32)), TypeError, expect="got int32"),
        Case(fn, "transitions", "complex64 transitions (float16/bfloat16 are accepted)", _set(transitions=np.zeros((C, C), np.complex64)), TypeError, expect="got complex64"),
        Case(fn, "start_transitions", "(C+1,) start_transitions", _set(start_transitions=np.zeros(C + 1, np.float32)), expect="(6,)"),
        Case(fn, "start_transitions", "int32 start_transitions", _set(start_transitions=np.zeros(C, np.int32)), TypeError, expect="got int32"),
        Case(fn, "input_lengths", "input length > T", _set(input_lengths=np.array([7, 5], np.int32)), expect="got 7 at index 0"),
        Case(fn, "input_lengths", "negative input length", _set(input_lengths=np.array([6, -1], np.int32)), expect="got -1 at index 1"),
        Case(fn, "input_lengths", "float input_lengths", _set(input_lengths=np.array([6.0, 5.0], np.float32)), TypeError, expect="got float32"),
        Case(fn, "input_lengths", "(N+1,) input_lengths", _set(input_lengths=np.array([6, 5, 4], np.int32)), expect="(3,)"),
    ]
    if has_tl:
        cs += [
            Case(fn, "targets", "float targets", _set(targets=lambda d: d["targets"].astype(np.float32)), TypeError, expect="got float32"),
            Case(fn, "targets", "3-D targets", _set(targets=lambda d: d["targets"][None]), expect="(1, 2, 3)"),
            Case(fn, "targets", "targets with N+1 rows", _set(targets=np.ones((N + 1, S), np.int32)), expect="(3, 3)"),
            Case(fn, "targets", "token >= C", _set(targets=np.array([[1, 2, 5], [2, 2, 0]], np.int32)), expect="got 5 at sequence 0, position 2"),
            Case(fn, "targets", "negative token", _set(targets=np.array([[1, 2, 3], [-3, 2, 0]], np.int32)), expect="got -3 at sequence 1, position 0"),
            Case(fn, "target_lengths", "target length > S", _set(target_lengths=np.array([4, 2], np.int32)), expect="got 4 at index 0"),
            Case(fn, "target_lengths", "negative target length", _set(target_lengths=np.array([-1, 2], np.int32)), expect="got -1 at index 0"),
            Case(fn, "target_lengths", "float target_lengths", _set(target_lengths=np.array([3.0, 2.0], np.float32)), TypeError, expect="got float32"),
            Case(fn, "target_lengths", "(N+1,) target_lengths", _set(target_lengths=np.array([3, 2, 1], np.int32)), expect="(3,)"),
            Case(fn, "target_lengths", "concatenated targets, lengths sum too small", _set(targets=np.array([1, 2, 3, 2, 2], np.int32), target_lengths=np.array([3, 1], np.int32)), expect="got sum 4"),
        ]
    return cs


def _graph_family(fn):
    from duoloss.gtn import Graph

    eps = Graph(calc_grad=False)
    eps.add_node(start=True)
    eps.add_node(accept=True)
    eps.add_arc(0, 1, -1)
    eps.add_arc(1, 0, -1)  # an epsilon cycle
    cs = [
        Case(fn, "emissions", "int32 emissions", _set(emissions=lambda d: d["emissions"].astype(np.int32)), TypeError, expect="got int32"),
        Case(fn, "emissions", "2-D emissions", _set(emissions=lambda d: d["emissions"][:, 0].copy()), expect="(6, 5)"),
        Case(fn, "input_lengths", "input length > T", _set(input_lengths=np.array([7, 5], np.int32)), expect="got 7 at index 0"),
        Case(fn, "input_lengths", "negative input length", _set(input_lengths=np.array([-1, 5], np.int32)), expect="got -1 at index 0"),
        Case(fn, "input_lengths", "float input_lengths", _set(input_lengths=np.array([6.0, 5.0], np.float32)), TypeError, expect="got float32"),
        Case(fn, "input_lengths", "(N+1,) input_lengths", _set(input_lengths=np.array([6, 5, 4], np.int32)), expect="(3,)"),
        Case(fn, "graphs", "a single Graph instead of a list", _set(graphs=lambda d: d["graphs"][0], weights=None, arc_weight_index=None), TypeError, expect="got Graph"),
        Case(fn, "graphs", "N-1 graphs", _set(graphs=lambda d: d["graphs"][:1], arc_weight_index=lambda d: d["arc_weight_index"][:1]), expect="got 1"),
        Case(fn, "graphs", "a non-Graph in the list", _set(graphs=lambda d: [d["graphs"][0], "g"], weights=None, arc_weight_index=None), TypeError, expect="got str at index 1"),
        Case(fn, "graphs", "arc label >= C", _set(graphs=lambda d: [d["graphs"][0], _graph([2, 7])], weights=None, arc_weight_index=None), expect="got 7 at graph 1, arc 2"),
        Case(fn, "graphs", "epsilon cycle", _set(graphs=lambda d: [d["graphs"][0], eps], weights=None, arc_weight_index=None), expect="got one in graph 1"),
        Case(fn, "weights", "int32 weights", _set(weights=np.zeros(3, np.int32)), TypeError, expect="got int32"),
        Case(fn, "weights", "float64 weights with float32 emissions", _set(weights=np.zeros(3, np.float64)), TypeError, frameworks=("torch",), expect="got float64"),
        Case(fn, "weights", "2-D weights", _set(weights=np.zeros((3, 1), np.float32)), expect="(3, 1)"),
        Case(fn, "arc_weight_index", "weights without arc_weight_index", _set(arc_weight_index=None), expect="arc_weight_index"),
        Case(fn, "weights", "arc_weight_index without weights", _set(weights=None), expect="got None"),
        Case(fn, "arc_weight_index", "index >= K", _set(arc_weight_index=lambda d: [d["arc_weight_index"][0], np.array([0, 3, -1, 2], np.int32)]), expect="got 3 at graph 1, arc 1"),
        Case(fn, "arc_weight_index", "index < -1", _set(arc_weight_index=lambda d: [np.array([0, -2, -1, 2, 0, 1], np.int32), d["arc_weight_index"][1]]), expect="got -2 at graph 0, arc 1"),
        Case(fn, "arc_weight_index", "one index too few", _set(arc_weight_index=lambda d: [d["arc_weight_index"][0], np.array([0, 1, -1], np.int32)]), expect="got (3,)"),
        Case(fn, "arc_weight_index", "float indices", _set(arc_weight_index=lambda d: [d["arc_weight_index"][0], np.zeros(4, np.float32)]), TypeError, expect="got dtype float32"),
        Case(fn, "arc_weight_index", "N-1 index arrays", _set(arc_weight_index=lambda d: d["arc_weight_index"][:1]), expect="of length 1"),
        Case(fn, "graphs", "PackedGraphs: arc dst outside its graph", _set(graphs=lambda d: _packed_bad_dst(), arc_weight_index=None), expect="bad node id at graph 1, arc 0"),
        Case(fn, "graphs", "PackedGraphs: decreasing offsets", _set(graphs=lambda d: _packed_bad_off(), arc_weight_index=None), expect="'arc_off' must rise"),
        Case(fn, "graphs", "PackedGraphs for N+1 graphs", _set(graphs=lambda d: _packed_n3(), arc_weight_index=None), expect="got 3"),
        Case(fn, "graphs", "PackedGraphs: 'dst' shorter than 'src'", _set(graphs=lambda d: _packed_short(), arc_weight_index=None), expect="got 10 and 9"),
        Case(fn, "arc_weight_index", "PackedGraphs plus arc_weight_index", _set(graphs=lambda d: _packed(), ), expect="must be None"),
        Case(fn, "weights", "PackedGraphs with tied indices but no weights", _set(graphs=lambda d: _packed(), arc_weight_index=None, weights=None), expect="got None"),
    ]
    return cs


def _packed_bad_dst():
    p = _packed()
    dst = p.dst.copy()
    dst[6] = 9  # graph 1 has 3 nodes
    return p._replace(dst=dst)


def _packed_bad_off():
    p = _packed()
    return p._replace(arc_off=np.array([0, 7, 6], np.int64))


def _packed_n3():
    from duoloss.core import pack_graphs

    d = good("graph_loss")
    return pack_graphs(d["graphs"] + [d["graphs"][0]],
                       d["arc_weight_index"] + [d["arc_weight_index"][0]])


def _packed_short():
    p = _packed()
    return p._replace(dst=p.dst[:-1])


def _reduction_cases(fn):
    return [
        Case(fn, "reduction", "reduction='avg'", _set(reduction="avg"), expect="got 'avg'"),
        Case(fn, "reduction", "reduction=None", _set(reduction=None), expect="got None"),
        Case(fn, "reduction", "reduction='MEAN'", _set(reduction="MEAN"), expect="got 'MEAN'"),
        Case(fn, "zero_infinity", "zero_infinity=1", _set(zero_infinity=1), TypeError, expect="got int"),
    ]


def _optax_cases():
    fn = "optax_ctc_loss"
    return [
        Case(fn, "logits", "2-D logits", _set(logits=lambda d: d["logits"][0].copy()), frameworks=("jax",), expect="(6, 5)"),
        Case(fn, "logits", "int32 logits", _set(logits=lambda d: d["logits"].astype(np.int32)), TypeError, frameworks=("jax",), expect="got int32"),
        Case(fn, "logit_paddings", "logit_paddings of shape (B, T+1)", _set(logit_paddings=np.zeros((N, T + 1), np.float32)), frameworks=("jax",), expect="(2, 7)"),
        Case(fn, "labels", "labels with B+1 rows", _set(labels=np.ones((N + 1, S), np.int32), label_paddings=np.zeros((N + 1, S), np.float32)), frameworks=("jax",), expect="(3, 3)"),
        Case(fn, "label_paddings", "label_paddings of shape (B, N+1)", _set(label_paddings=np.zeros((N, S + 1), np.float32)), frameworks=("jax",), expect="(2, 4)"),
        Case(fn, "labels", "float labels", _set(labels=lambda d: d["labels"].astype(np.float32)), TypeError, frameworks=("jax",), expect="got float32"),
        Case(fn, "labels", "label >= K", _set(labels=np.array([[1, 2, 5], [2, 2, 0]], np.int32)), frameworks=("jax",), expect="got 5"),
        Case(fn, "labels", "blank_id inside labels", _set(labels=np.array([[1, 0, 3], [2, 2, 0]], np.int32)), frameworks=("jax",), expect="blank_id (0)"),
        Case(fn, "blank_id", "blank_id = K", _set(blank_id=C), frameworks=("jax",), expect="got 5"),
        Case(fn, "logit_paddings", "left-padded logit_paddings", _set(logit_paddings=np.array([[0] * 6, [1, 0, 0, 0, 0, 0]], np.float32)), frameworks=("jax",), expect="right"),
        Case(fn, "label_paddings", "label_paddings not 0/1", _set(label_paddings=np.array([[0, 0, 0], [0, 0, 0.5]], np.float32)), frameworks=("jax",), expect="0.5"),
    ]


def _type_cases():
    """Wrong Python types where an array/tensor is expected (both frontends)."""
    cs = []
    for fn, arg in (("ctc_loss", "log_probs"), ("ctc_loss", "targets"),
                    ("ctc_loss", "input_lengths"), ("asg_loss", "emissions"),
                    ("asg_loss", "transitions"), ("asg_loss", "targets"),
                    ("graph_loss", "emissions"), ("graph_loss", "weights"),
                    ("ctc_align", "log_probs"), ("asg_align", "emissions"),
                    ("asg_viterbi", "emissions"), ("graph_align", "emissions")):
        cs.append(Case(fn, arg, f"{arg} as a str", _set(**{arg: "abc"}), TypeError, expect="got str"))
        if arg not in ("transitions", "weights"):
            cs.append(Case(fn, arg, f"{arg} = None", _set(**{arg: None}), TypeError, expect="got NoneType"))
    cs.append(Case("ctc_loss", "input_lengths", "input_lengths as a list with a float",
                   _set(input_lengths=[6, 5.0]), TypeError, expect="non-int"))
    return cs


def all_cases():
    cases = []
    for fn in ("ctc_loss", "ctc_align"):
        cases += _ctc_family(fn)
    cases += _reduction_cases("ctc_loss")
    for fn in ("asg_loss", "asg_align", "asg_viterbi"):
        cases += _asg_family(fn)
    cases += _reduction_cases("asg_loss")
    for fn in ("graph_loss", "graph_align"):
        cases += _graph_family(fn)
    cases += _reduction_cases("graph_loss")
    cases += [
        Case("graph_loss", "normalize", "normalize='yes'", _set(normalize="yes"), TypeError, expect="got str"),
        Case("graph_loss", "target_lengths", "(N+1,) target_lengths", _set(target_lengths=np.array([1, 2, 3], np.int32)), expect="(3,)"),
    ]
    cases += _wfst_cases()  # WFST: denominators, graph builders (helper E)
    cases += _optax_cases()
    cases += _type_cases()
    cases += _single_framework_cases()
    cases += _rnnt_k2_cases()
    cases += _rnnt_cases()  # RNN-T (transducer helper F1)
    cases += _tdt_cases()  # TDT and multi-blank (helper H7)
    cases += _decode_cases()  # decoders (helper H)
    return cases


def _tdt_cases():
    fn, mb = "tdt_loss", "multiblank_rnnt_loss"
    return [
        Case(fn, "durations", "durations=[0] (no positive duration)", _set(durations=[0]), expect="at least one positive"),
        Case(fn, "durations", "negative duration", _set(durations=[0, -1, 2]), expect=">= 0, got [0, -1, 2]"),
        Case(fn, "durations", "duplicate durations", _set(durations=[0, 1, 1]), expect="distinct"),
        Case(fn, "durations", "a float duration", _set(durations=[0, 1.0, 2]), TypeError, expect="type float"),
        Case(fn, "logits", "last axis = D (no token logits)", _set(logits=lambda d: d["logits"][..., :3].copy()), expect="D = len(durations) = 3"),
        Case(fn, "blank", "blank = V", _set(blank=C), expect="[-5, 5), got 5"),
        Case(fn, "targets", "the blank inside a target", _set(targets=np.array([[1, 4, 3], [2, 2, 0]], np.int32)), expect="the blank (4)"),
        Case(fn, "omega", "omega=1.5", _set(omega=1.5), expect="[0, 1], got 1.5"),
        Case(fn, "sigma", "sigma=nan", _set(sigma=float("nan")), expect="finite"),
        Case(fn, "impl", "impl='gpu'", _set(impl="gpu"), expect="got 'gpu'"),
        Case(mb, "big_blank_durations", "big blank duration 0", _set(big_blank_durations=[0]), expect=">= 1, got [0]"),
        Case(mb, "blank", "no room for the big blanks (blank=0)", _set(blank=0), expect="blank = 0"),
        Case(mb, "targets", "a big blank inside a target", _set(targets=np.array([[1, 4, 3], [2, 2, 0]], np.int32)), expect="big blank (4)"),
    ]


# -- WFST: LF-MMI denominators and the duoloss.graphs builders (helper E) -----
def _wfst_cases():
    from duoloss import graphs as gb
    from duoloss.core import pack_graphs
    from duoloss.gtn import Graph

    cyc = Graph(calc_grad=False)
    cyc.add_node(start=True)
    cyc.add_node(accept=True)
    cyc.add_arc(0, 1, 1)
    cyc.add_arc(1, 0, -1)
    cyc.add_arc(0, 1, -1)
    cyc.add_arc(1, 1, -1)  # an epsilon self-loop: a cycle
    den = _graph([1, 2])  # 3 nodes, 4 arcs
    idx = np.array([0, 1, -1, 2], np.int32)
    fn = "graph_loss"
    cs = [
        Case(fn, "denominator", "denominator as a str", _set(denominator="den"), TypeError, expect="got str"),
        Case(fn, "denominator", "a list of N-1 denominators", _set(denominator=[den]), expect="got a list of 1"),
        Case(fn, "denominator", "denominator label >= C", _set(denominator=_graph([7])), expect="got 7 at graph 0, arc 0"),
        Case(fn, "denominator", "denominator with an epsilon cycle", _set(denominator=cyc), expect="got one in graph 0"),
        Case(fn, "denominator", "PackedGraphs of N+1 denominators", _set(denominator=pack_graphs([den] * 3)), expect="1 or N = 2 graphs, got 3"),
        Case(fn, "normalize", "normalize=True with a denominator", _set(denominator=den, normalize=True), expect="must be False"),
        Case(fn, "denominator_arc_weight_index", "denominator_arc_weight_index without denominator", _set(denominator_arc_weight_index=idx), expect="needs a 'denominator'"),
        Case(fn, "denominator_arc_weight_index", "one index too few", _set(denominator=den, denominator_arc_weight_index=idx[:3]), expect="got (3,)"),
        Case(fn, "denominator_arc_weight_index", "index >= K", _set(denominator=den, denominator_arc_weight_index=np.array([0, 3, -1, 2], np.int32)), expect="got 3 at graph 0, arc 1"),
        Case(fn, "denominator_arc_weight_index", "float indices", _set(denominator=den, denominator_arc_weight_index=np.zeros(4, np.float32)), TypeError, expect="got dtype float32"),
        Case(fn, "denominator_arc_weight_index", "index with a PackedGraphs denominator", _set(denominator=pack_graphs([den]), denominator_arc_weight_index=idx), expect="must be None"),
    ]
    core = "core"
    cs += [
        _single("ctc_graph", "targets", "blank inside a target", lambda: gb.ctc_graph([1, 0, 2]), expect="got it at position 1", framework=core),
        _single("ctc_graph", "targets", "float targets", lambda: gb.ctc_graph([1.0, 2.0]), TypeError, expect="dtype float64", framework=core),
        _single("ctc_graph", "blank", "blank=-1", lambda: gb.ctc_graph([1], blank=-1), expect="got -1", framework=core),
        _single("ctc_graph", "modified", "modified='yes'", lambda: gb.ctc_graph([1], modified="yes"), TypeError, expect="got str", framework=core),
        _single("ctc_topo", "num_classes", "num_classes=0", lambda: gb.ctc_topo(0), expect="got 0", framework=core),
        _single("ctc_topo", "blank", "blank >= num_classes", lambda: gb.ctc_topo(3, blank=3), expect="[0, 3), got 3", framework=core),
        _single("asg_graph", "target", "token >= num_classes", lambda: gb.asg_graph([1, 5], 4), expect="[0, 4), got 5", framework=core),
        _single("asg_graph", "num_classes", "num_classes=2.5", lambda: gb.asg_graph([1], 2.5), TypeError, expect="got float", framework=core),
        _single("token_ngram_graph", "discount", "discount=1", lambda: gb.token_ngram_graph([[1]], 3, discount=1.0), expect="got 1.0", framework=core),
        _single("token_ngram_graph", "order", "order=0", lambda: gb.token_ngram_graph([[1]], 3, order=0), expect="got 0", framework=core),
        _single("token_ngram_graph", "sequences", "a str", lambda: gb.token_ngram_graph("abc", 3), TypeError, expect="got str", framework=core),
        _single("token_ngram_graph", "sequences[1]", "a token >= num_classes", lambda: gb.token_ngram_graph([[1], [0, 3]], 3), expect="got 3", framework=core),
        _single("wordpiece_graph", "words", "a word without decomposition", lambda: gb.wordpiece_graph(["ab", "z"], [None, "a", "b"]), expect="word 1 ('z')", framework=core),
        _single("wordpiece_graph", "vocabulary", "a str vocabulary", lambda: gb.wordpiece_graph("ab", "ab"), TypeError, expect="got str", framework=core),
        _single("wordpiece_graph", "words", "an int", lambda: gb.wordpiece_graph(3, ["a"]), TypeError, expect="got int", framework=core),
    ]
    return cs


def _g2():
    from duoloss.gtn import Graph

    g = Graph()
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, 0, 0, 1.0)
    return g


def _single(fn, arg, what, run, exc=ValueError, expect=None, prefix=None, gap=None,
            framework="torch"):
    return Case(fn, arg, what, None, exc, frameworks=(framework,), expect=expect, run=run,
                prefix=prefix, gap=gap)




def _single_framework_cases():
    import io

    import duoloss.gtn as gtn
    from duoloss.core import pack_graphs

    cs = []
    # torch modules
    def module(name, **kw):
        import duoloss.torch as dt

        return lambda: getattr(dt, name)(**kw)

    cs += [
        _single("ASGLoss", "num_classes", "num_classes=0", module("ASGLoss", num_classes=0), expect="got 0"),
        _single("ASGLoss", "num_classes", "num_classes=2.0", module("ASGLoss", num_classes=2.0), expect="got 2.0"),
        _single("ASGLoss", "reduction", "reduction='avg'", module("ASGLoss", num_classes=3, reduction="avg"), expect="got 'avg'"),
        _single("GraphLoss", "num_weights", "num_weights=-1", module("GraphLoss", num_weights=-1), expect="got -1"),
        _single("GraphLoss", "reduction", "reduction='avg'", module("GraphLoss", reduction="avg"), expect="got 'avg'"),
    ]
    d = good("graph_loss")
    cs += [
        _single("pack_graphs", "graphs", "a Graph, not a list", lambda: pack_graphs(d["graphs"][0]), TypeError, expect="got Graph", framework="core"),
        _single("pack_graphs", "num_nodes", "num_nodes below the total", lambda: pack_graphs(d["graphs"], num_nodes=3), expect="got 3", framework="core"),
        _single("pack_graphs", "num_arcs", "num_arcs=True", lambda: pack_graphs(d["graphs"], num_arcs=True), expect="got True", framework="core"),
        _single("pack_graphs", "arc_weight_index", "index array with a wrong length", lambda: pack_graphs(d["graphs"], [np.zeros(6, np.int64), np.zeros(5, np.int64)]), expect="got (5,)", framework="core"),
    ]
    gt = "gtn"
    cs += [
        _single("Graph.add_arc", "dst_node", "arc to a missing node", lambda: _g2().add_arc(0, 5, 0), expect="got 0 and 5", prefix="Graph.add_arc: src_node and dst_node", framework=gt),
        _single("Graph.add_arc", "src_node", "arc from node -1", lambda: _g2().add_arc(-1, 0, 0), expect="got -1 and 0", prefix="Graph.add_arc: src_node and dst_node", framework=gt),
        _single("Graph.add_arc", "olabel", "olabel -2", lambda: _g2().add_arc(0, 1, 0, -2), expect="olabel=-2", prefix="Graph.add_arc: labels", framework=gt),
        _single("Graph.from_arrays", "dst", "dst outside [0, num_nodes)", lambda: gtn.Graph.from_arrays(2, [0], [5], [0]), expect="[0, 2)", prefix="Graph.from_arrays: dst", framework=gt),
        _single("Graph.from_arrays", "num_nodes", "num_nodes=-1", lambda: gtn.Graph.from_arrays(-1, [], [], []), expect="got -1", prefix="Graph.from_arrays: num_nodes", framework=gt),
        _single("Graph.from_arrays", "weight", "weight of the wrong size", lambda: gtn.Graph.from_arrays(2, [0], [1], [0], weight=[1.0, 2.0]), expect="got (2,)", prefix="Graph.from_arrays: weight", framework=gt),
        _single("Graph.set_weights", "weights", "wrong number of weights", lambda: _g2().set_weights(np.zeros(3)), expect="got 3", prefix="Graph.set_weights:", framework=gt),
        _single("Graph.item", "self", "item() of a 4-arc graph", lambda: gtn.linear_graph(2, 2).item(), expect="got 4", prefix="Graph.item:", framework=gt),
        _single("compose", "g2", "a str as second graph", lambda: gtn.compose(_g2(), "x"), TypeError, expect="got Graph and str", prefix="compose:", framework=gt),
        _single("intersect", "g1", "None as first graph", lambda: gtn.intersect(None, _g2()), TypeError, expect="NoneType", prefix="intersect:", framework=gt),
        _single("compose", "graphs2", "lists of different lengths", lambda: gtn.compose([_g2()], [_g2(), _g2()]), expect="got 1 and 2", prefix="compose:", framework=gt),
        _single("negate", "g", "a 4-arc graph", lambda: gtn.negate(gtn.linear_graph(2, 2)), expect="got 4", prefix="negate: g", framework=gt),
        _single("add", "g1", "a 4-arc graph", lambda: gtn.add(gtn.linear_graph(2, 2), _g2()), expect="got 4", prefix="add: g1", framework=gt),
        _single("subtract", "g2", "a float", lambda: gtn.subtract(_g2(), 1.0), TypeError, expect="float", prefix="subtract:", framework=gt),
        _single("union", "graphs", "a single Graph", lambda: gtn.union(_g2()), TypeError, expect="single Graph", prefix="union: graphs", framework=gt),
        _single("union", "graphs", "a list holding an int", lambda: gtn.union([_g2(), 3]), TypeError, expect="got int", prefix="union: graphs[1]", framework=gt),
        _single("concat", "g2", "an int", lambda: gtn.concat(_g2(), 3), TypeError, prefix="concat:", framework=gt),
        _single("closure", "g", "a str", lambda: gtn.closure("g"), TypeError, expect="got str", prefix="closure:", framework=gt),
        _single("forward_score", "g", "an int", lambda: gtn.forward_score(3), TypeError, expect="got int", prefix="forward_score:", framework=gt),
        _single("viterbi_path", "g", "a str", lambda: gtn.viterbi_path("g"), TypeError, expect="got str", prefix="viterbi_path:", framework=gt),
        _single("project_input", "g", "an int", lambda: gtn.project_input(1), TypeError, expect="got int", prefix="project_input:", framework=gt),
        _single("linear_graph", "M", "M=-1", lambda: gtn.linear_graph(-1, 2), expect="M=-1", prefix="linear_graph: M", framework=gt),
        _single("graph_arrays", "g", "an int", lambda: gtn.graph_arrays(3), TypeError, expect="got int", prefix="graph_arrays: g", framework=gt),
        _single("parallel_for", "function", "a non-callable", lambda: gtn.parallel_for(3, [1]), TypeError, expect="got int", prefix="parallel_for: function", framework=gt),
        _single("loadtxt", "file_name", "an unparsable arc line", lambda: gtn.loadtxt(io.StringIO("0\n1\n0 x 1\n")), expect="line 3", prefix="loadtxt:", framework=gt),
        # Known gaps (strict xfail until the GTN engine owner fixes them).
        _single("Graph.add_arc", "ilabel", "ilabel=0.5", lambda: _g2().add_arc(0, 1, 0.5), TypeError, prefix="Graph.add_arc: ilabel", framework=gt),
        _single("Graph.add_arc", "src_node", "src_node='a'", lambda: _g2().add_arc("a", 1, 0), TypeError, prefix="Graph.add_arc: src_node", framework=gt),
        _single("Graph.add_arc", "weight", "weight='x'", lambda: _g2().add_arc(0, 1, 0, 0, "x"), TypeError, prefix="Graph.add_arc: weight", framework=gt),
        _single("remove", "ilabel", "ilabel=-5", lambda: gtn.remove(_g2(), -5), prefix="remove:", framework=gt),
        _single("linear_graph", "M", "M=2.5", lambda: gtn.linear_graph(2.5, 2), TypeError, prefix="linear_graph: M", framework=gt),
        _single("scalar_graph", "weight", "weight='x'", lambda: gtn.scalar_graph("x"), TypeError, prefix="scalar_graph: weight", framework=gt),
        _single("backward", "grad", "grad='x'", lambda: gtn.backward(gtn.forward_score(_g2()), "x"), TypeError, prefix="backward: grad", framework=gt),
        _single("parallel_for", "inputs", "inputs=3", lambda: gtn.parallel_for(lambda x: x, 3), TypeError, prefix="parallel_for: inputs", framework=gt),
        _single("sample", "max_length", "max_length=-1", lambda: gtn.sample(_g2(), -1), prefix="sample: max_length", framework=gt),
        # GTN parity and huge labels (helper D: issue #12 item 1, issue #10 point 7)
        _single("Graph.add_arc", "ilabel", "ilabel=2**63 (beyond int64)", lambda: _g2().add_arc(0, 1, 2 ** 63), expect="ilabel=9223372036854775808", prefix="Graph.add_arc: labels must lie in [-1, 2**63 - 1]", framework=gt),
        _single("Graph.add_arc", "label", "label= together with ilabel", lambda: _g2().add_arc(0, 1, 0, label=1), TypeError, prefix="Graph.add_arc: label=", framework=gt),
        _single("Graph.from_arrays", "ilabel", "uint64 label 2**63", lambda: gtn.Graph.from_arrays(2, [0], [1], np.array([2 ** 63], np.uint64)), expect="9223372036854775808", prefix="Graph.from_arrays: ilabel must fit int64", framework=gt),
        _single("loadtxt", "file_name", "label 2**63 in an arc line", lambda: gtn.loadtxt(io.StringIO(f"0\n1\n0 1 {2 ** 63}\n")), expect="line 3", prefix="loadtxt: line 3: labels must lie in", framework=gt),
        _single("loadtxt", "file_name", "a single line", lambda: gtn.loadtxt(io.StringIO("0\n")), expect="got 1 line", prefix="loadtxt: expected a start-node line", framework=gt),
        _single("save", "graph", "a label beyond int32", lambda: gtn.save(io.BytesIO(), gtn.Graph.from_arrays(2, [0], [1], [2 ** 31], start=[0], accept=[1])), expect="got 2147483648", prefix="save: labels must lie in [-1, 2**31 - 1]", framework=gt),
        _single("save", "graph", "two paths, no graph", lambda: gtn.save("a.bin", "b.bin"), TypeError, expect="got str", prefix="save: graph must be a Graph", framework=gt),
        _single("load", "file_name", "truncated data", lambda: gtn.load(io.BytesIO(b"\x02\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00")), expect="needs 44 bytes, got 16", prefix="load: the header", framework=gt),
        _single("savetxt", "file_name", "file_name=3", lambda: gtn.savetxt(3, _g2()), TypeError, expect="got int", prefix="savetxt: file_name", framework=gt),
        _single("backward", "grads", "2 seeds for 3 graphs", lambda: gtn.backward([gtn.negate(gtn.scalar_graph(1.0)) for _ in range(3)], [gtn.scalar_graph(1.0)] * 2), expect="got 2", prefix="backward: grads must have 1 or 3 entries", framework=gt),
    ]
    return cs


def call(case: Case, framework: str):
    """Run ``case`` through ``framework``; returns the raised exception (or None)."""
    import importlib

    if case.run is not None:
        try:
            case.run()
        except Exception as err:  # noqa: BLE001 - the test inspects it
            return err
        return None
    mod = importlib.import_module(f"duoloss.{framework}")
    kw = good(case.fn)
    case.change(kw)
    kw = {k: _convert(v, framework) for k, v in kw.items()}
    if case.fn in _DECODE_FNS:  # decoders (helper H)
        return _call_decoder(case, mod, kw)
    pos = {
        "ctc_loss": ("log_probs", "targets", "input_lengths", "target_lengths"),
        "ctc_align": ("log_probs", "targets", "input_lengths", "target_lengths"),
        "asg_loss": ("emissions", "transitions", "targets", "input_lengths", "target_lengths"),
        "asg_align": ("emissions", "transitions", "targets", "input_lengths", "target_lengths"),
        "asg_viterbi": ("emissions", "transitions", "input_lengths"),
        "graph_loss": ("emissions", "graphs", "input_lengths"),
        "graph_align": ("emissions", "graphs", "input_lengths"),
        "optax_ctc_loss": ("logits", "logit_paddings", "labels", "label_paddings"),
        **_K2_FNS,
        # RNN-T (transducer helper F1)
        "rnnt_loss": ("logits", "targets", "logit_lengths", "target_lengths"),
        "rnnt_align": ("logits", "targets", "logit_lengths", "target_lengths"),
        "tdt_loss": ("logits", "targets", "logit_lengths", "target_lengths", "blank",
                     "durations"),
        "multiblank_rnnt_loss": ("logits", "targets", "logit_lengths", "target_lengths", "blank",
                                 "big_blank_durations"),
    }[case.fn]
    args = [kw.pop(p) for p in pos]
    try:
        getattr(mod, case.fn)(*args, **kw)
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return err
    return None


def _convert(v, framework):
    if not isinstance(v, np.ndarray):
        return v
    if framework == "torch":
        import torch

        if v.dtype == np.uint16:
            return v
        return torch.from_numpy(v)
    import jax.numpy as jnp

    return jnp.asarray(v)


def markdown_table(results) -> str:
    """``results``: list of (case, exception) from the torch run (jax where torch n/a)."""
    lines = ["| # | frontend | function | bad input | exception | message |",
             "|---|---|---|---|---|---|"]
    for i, (case, err) in enumerate(results, 1):
        fw = "torch = jax" if len(case.frameworks) == 2 else case.frameworks[0]
        if case.gap:
            want = case.prefix or f"{case.fn}: argument '{case.arg}'"
            exc, msg = "**gap**", f"(today: {type(err).__name__ if err else 'accepted'}: {err}) -- wanted {case.exc.__name__} ``{want} ...``"
        else:
            exc, msg = f"`{type(err).__name__}`", str(err)
        # (a '[' escaped: 'hotwords[0][1]' would read as a Markdown reference link)
        msg = msg.replace("|", "\\|").replace("\n", " ").replace("[", "\\[")
        lines.append(f"| {i} | {fw} | `{case.fn}` | {case.what} | {exc} | {msg} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- #
# RNN-T: rnnt_loss, rnnt_align, RNNTLoss (transducer helper F1)                #
# --------------------------------------------------------------------------- #
def _rnnt_cases():
    cs = []
    for fn in ("rnnt_loss", "rnnt_align"):
        cs += [
            Case(fn, "logits", "int32 logits", _set(logits=lambda d: d["logits"].astype(np.int32)), TypeError, expect="got int32"),
            Case(fn, "logits", "3-D logits", _set(logits=lambda d: d["logits"][:, :, 0].copy()), expect="(2, 6, 5)"),
            Case(fn, "logits", "zero classes (V = 0)", _set(logits=np.zeros((N, T, S + 1, 0), np.float32)), expect="V >= 1"),
            Case(fn, "logits", "logits as a str", _set(logits="abc"), TypeError, expect="got str"),
            Case(fn, "targets", "float targets", _set(targets=lambda d: d["targets"].astype(np.float32)), TypeError, expect="got float32"),
            Case(fn, "targets", "targets with U + 1 columns", _set(targets=np.ones((N, S + 1), np.int32)), expect="got (2, 4)"),
            Case(fn, "targets", "1-D targets", _set(targets=np.ones(S, np.int32)), expect="got shape (3,)"),
            Case(fn, "targets", "label >= V", _set(targets=np.array([[1, 2, 5], [2, 2, 0]], np.int32)), expect="got 5 at sequence 0, position 2"),
            Case(fn, "targets", "negative label", _set(targets=np.array([[1, -1, 3], [2, 2, 0]], np.int32)), expect="got -1 at sequence 0, position 1"),
            Case(fn, "targets", "blank (V - 1) inside a target", _set(targets=np.array([[1, 4, 3], [2, 2, 0]], np.int32)), expect="the blank (4)"),
            Case(fn, "targets", "blank=2 inside a target", _set(blank=2), expect="the blank (2)"),
            Case(fn, "blank", "blank = V", _set(blank=C), expect="[-5, 5), got 5"),
            Case(fn, "blank", "blank = -V - 1", _set(blank=-C - 1), expect="got -6"),
            Case(fn, "blank", "float blank", _set(blank=1.0), TypeError, expect="got float"),
            Case(fn, "logit_lengths", "logit length > T", _set(logit_lengths=np.array([7, 5], np.int32)), expect="got 7 at index 0"),
            Case(fn, "logit_lengths", "negative logit length", _set(logit_lengths=np.array([6, -1], np.int32)), expect="got -1 at index 1"),
            Case(fn, "logit_lengths", "float logit_lengths", _set(logit_lengths=np.array([6.0, 5.0], np.float32)), TypeError, expect="got float32"),
            Case(fn, "logit_lengths", "(N+1,) logit_lengths", _set(logit_lengths=np.array([6, 5, 4], np.int32)), expect="(3,)"),
            Case(fn, "logit_lengths", "logit_lengths as a list with a float", _set(logit_lengths=[6, 5.0]), TypeError, expect="non-int"),
            Case(fn, "target_lengths", "target length > U", _set(target_lengths=np.array([4, 2], np.int32)), expect="got 4 at index 0"),
            Case(fn, "target_lengths", "(N-1,) target_lengths", _set(target_lengths=np.array([3], np.int32)), expect="(1,)"),
            Case(fn, "fused_log_softmax", "fused_log_softmax=1", _set(fused_log_softmax=1), TypeError, expect="got int"),
        ]
    fn = "rnnt_loss"
    cs += [
        Case(fn, "reduction", "reduction='avg'", _set(reduction="avg"), expect="got 'avg'"),
        Case(fn, "clamp", "clamp='x'", _set(clamp="x"), TypeError, expect="got str"),
        Case(fn, "clamp", "clamp=inf", _set(clamp=float("inf")), expect="got inf"),
        Case(fn, "fastemit_lambda", "fastemit_lambda=-0.1", _set(fastemit_lambda=-0.1), expect=">= 0, got -0.1"),
        Case(fn, "delay_penalty", "delay_penalty=nan", _set(delay_penalty=float("nan")), expect="finite"),
        Case(fn, "delay_penalty", "delay_penalty=True", _set(delay_penalty=True), TypeError, expect="got bool"),
    ]

    def module(**kw):
        import duoloss.torch as dt

        return lambda: dt.RNNTLoss(**kw)

    cs += [
        _single("RNNTLoss", "reduction", "reduction='avg'", module(reduction="avg"), expect="got 'avg'"),
        _single("RNNTLoss", "fastemit_lambda", "fastemit_lambda=-1", module(fastemit_lambda=-1.0), expect="got -1.0"),
    ]
    return cs


# ---- k2-style simple / pruned RNN-T (helper F2): rnnt_loss_simple, rnnt_loss_pruned,
# get_rnnt_prune_ranges, do_rnnt_pruning.  Positional arguments of each function:
_K2_FNS = {
    "rnnt_loss_simple": ("lm", "am", "symbols", "termination_symbol"),
    "rnnt_loss_smoothed": ("lm", "am", "symbols", "termination_symbol"),
    "rnnt_loss_pruned": ("logits", "symbols", "ranges", "termination_symbol"),
    "get_rnnt_prune_ranges": ("px_grad", "py_grad", "boundary", "s_range"),
    "do_rnnt_pruning": ("am", "lm", "ranges"),
}


def _k2_good(fn):
    rng = np.random.default_rng(0)
    sym = np.array([[1, 2, 3], [2, 2, 1]], np.int32)
    bd = np.array([[0, 0, 3, 6], [0, 0, 2, 5]], np.int32)
    ranges = (np.minimum(np.arange(T), S - 1)[None, :, None] + np.arange(2)).repeat(N, 0)
    ranges = ranges.astype(np.int32)  # (N, T, 2), rows [r0, r0 + 1], r0 <= S - 1
    if fn in ("rnnt_loss_simple", "rnnt_loss_smoothed"):
        return dict(lm=rng.standard_normal((N, S + 1, C)).astype(np.float32),
                    am=rng.standard_normal((N, T, C)).astype(np.float32), symbols=sym,
                    termination_symbol=0, boundary=bd)
    if fn == "rnnt_loss_pruned":
        return dict(logits=rng.standard_normal((N, T, 2, C)).astype(np.float32), symbols=sym,
                    ranges=ranges, termination_symbol=0, boundary=bd)
    if fn == "get_rnnt_prune_ranges":
        return dict(px_grad=rng.random((N, S, T + 1)).astype(np.float32),
                    py_grad=rng.random((N, S + 1, T)).astype(np.float32), boundary=bd,
                    s_range=2)
    return dict(am=rng.standard_normal((N, T, 4)).astype(np.float32),
                lm=rng.standard_normal((N, S + 1, 3)).astype(np.float32), ranges=ranges)


def _rnnt_k2_cases():
    sl, pr, gr, dp = "rnnt_loss_simple", "rnnt_loss_pruned", "get_rnnt_prune_ranges", "do_rnnt_pruning"
    i32 = np.int32
    cs = [
        Case(sl, "am", "int32 am", _set(am=lambda d: d["am"].astype(i32)), TypeError, expect="got int32"),
        Case(sl, "am", "2-D am", _set(am=lambda d: d["am"][:, 0].copy()), expect="(2, 5)"),
        Case(sl, "am", "am as a str", _set(am="abc"), TypeError, expect="got str"),
        Case(sl, "lm", "lm with C+1 classes", _set(lm=np.zeros((N, S + 1, C + 1), np.float32)), expect="(2, 4, 6)"),
        Case(sl, "lm", "lm with N+1 rows", _set(lm=np.zeros((N + 1, S + 1, C), np.float32)), expect="(3, 4, 5)"),
        Case(sl, "lm", "float64 lm with float32 am", _set(lm=lambda d: d["lm"].astype(np.float64)), TypeError, frameworks=("torch",), expect="got float64"),
        Case(sl, "symbols", "float symbols", _set(symbols=lambda d: d["symbols"].astype(np.float32)), TypeError, expect="got float32"),
        Case(sl, "symbols", "symbols with S+1 columns", _set(symbols=np.ones((N, S + 1), i32)), expect="(2, 4)"),
        Case(sl, "symbols", "symbol >= C", _set(symbols=np.array([[1, 2, 5], [2, 2, 1]], i32)), expect="got 5 at sequence 0, position 2"),
        Case(sl, "symbols", "negative symbol", _set(symbols=np.array([[1, 2, 3], [2, -1, 1]], i32)), expect="got -1 at sequence 1, position 1"),
        Case(sl, "termination_symbol", "termination_symbol = C", _set(termination_symbol=C), expect="[0, 5), got 5"),
        Case(sl, "termination_symbol", "float termination_symbol", _set(termination_symbol=0.0), TypeError, expect="got float"),
        Case(sl, "rnnt_type", "rnnt_type='standard'", _set(rnnt_type="standard"), expect="got 'standard'"),
        Case(sl, "delay_penalty", "delay_penalty='x'", _set(delay_penalty="x"), TypeError, expect="got str"),
        Case(sl, "delay_penalty", "delay_penalty=nan", _set(delay_penalty=float("nan")), expect="got nan"),
        Case(sl, "reduction", "reduction='avg'", _set(reduction="avg"), expect="got 'avg'"),
        Case(sl, "return_grad", "return_grad=1", _set(return_grad=1), TypeError, expect="got int"),
        Case(sl, "boundary", "(N, 3) boundary", _set(boundary=np.zeros((N, 3), i32)), expect="(2, 3)"),
        Case(sl, "boundary", "float boundary", _set(boundary=lambda d: d["boundary"].astype(np.float32)), TypeError, expect="got float32"),
        Case(sl, "boundary", "s_end > S", _set(boundary=np.array([[0, 0, 4, 6], [0, 0, 2, 5]], i32)), expect="got [0, 0, 4, 6] at row 0"),
        Case(sl, "boundary", "t_end > T", _set(boundary=np.array([[0, 0, 3, 6], [0, 0, 2, 7]], i32)), expect="got [0, 0, 2, 7] at row 1"),
        Case(sl, "boundary", "t_begin > t_end", _set(boundary=np.array([[0, 4, 3, 3], [0, 0, 2, 5]], i32)), expect="got [0, 4, 3, 3] at row 0"),
        Case(sl, "boundary", "modified with more symbols than frames", _set(rnnt_type="modified", boundary=np.array([[0, 0, 3, 2], [0, 0, 2, 5]], i32)), expect="one symbol per frame"),
        Case(pr, "logits", "3-D logits", _set(logits=lambda d: d["logits"][:, :, 0].copy()), expect="(2, 6, 5)"),
        Case(pr, "logits", "int32 logits", _set(logits=lambda d: d["logits"].astype(i32)), TypeError, expect="got int32"),
        Case(pr, "logits", "s_range > S+1", _set(logits=np.zeros((N, T, S + 2, C), np.float32), ranges=lambda d: (np.zeros((N, T, 1), i32) + np.arange(S + 2)).astype(i32)), expect="s_range <= S+1 = 4"),
        Case(pr, "ranges", "ranges of shape (N, T, s_range+1)", _set(ranges=np.zeros((N, T, 3), i32)), expect="(2, 6, 3)"),
        Case(pr, "ranges", "float ranges", _set(ranges=lambda d: d["ranges"].astype(np.float32)), TypeError, expect="got float32"),
        Case(pr, "ranges", "non-consecutive row", _set(ranges=lambda d: np.where(np.arange(2) == 1, d["ranges"] + 1, d["ranges"]).astype(i32)), expect="consecutive"),
        Case(pr, "ranges", "row start > S+1-s_range", _set(ranges=lambda d: (d["ranges"] + 1).astype(i32)), expect="got 3 at sequence 0, frame 2"),
        Case(pr, "symbols", "symbols with N+1 rows", _set(symbols=np.ones((N + 1, S), i32)), expect="(3, 3)"),
        Case(pr, "symbols", "symbol >= C", _set(symbols=np.array([[1, 2, 3], [2, 7, 1]], i32)), expect="got 7 at sequence 1, position 1"),
        Case(pr, "termination_symbol", "termination_symbol = -1", _set(termination_symbol=-1), expect="got -1"),
        Case(pr, "boundary", "s_begin > s_end", _set(boundary=np.array([[0, 0, 3, 6], [3, 0, 2, 5]], i32)), expect="got [3, 0, 2, 5] at row 1"),
        Case(pr, "reduction", "reduction=None", _set(reduction=None), expect="got None"),
        Case(gr, "px_grad", "int32 px_grad", _set(px_grad=lambda d: d["px_grad"].astype(i32)), TypeError, expect="got int32"),
        Case(gr, "py_grad", "py_grad of shape (N, S, T)", _set(py_grad=np.zeros((N, S, T), np.float32)), expect="(2, 3, 6)"),
        Case(gr, "py_grad", "px_grad T+2 frames", _set(px_grad=np.zeros((N, S, T + 2), np.float32)), expect="(2, 3, 8)"),
        Case(gr, "boundary", "float boundary", _set(boundary=lambda d: d["boundary"].astype(np.float32)), TypeError, expect="got float32"),
        Case(gr, "boundary", "t_end > T", _set(boundary=np.array([[0, 0, 3, 9], [0, 0, 2, 5]], i32)), expect="got [0, 0, 3, 9] at row 0"),
        Case(gr, "s_range", "s_range = 0", _set(s_range=0), expect="got 0"),
        Case(gr, "s_range", "s_range = 2.0", _set(s_range=2.0), TypeError, expect="got float"),
        Case(dp, "lm", "2-D lm", _set(lm=lambda d: d["lm"][:, 0].copy()), expect="(2, 3)"),
        Case(dp, "ranges", "ranges for T-1 frames", _set(ranges=lambda d: d["ranges"][:, 1:].copy()), expect="(2, 5, 2)"),
        Case(dp, "ranges", "float ranges", _set(ranges=lambda d: d["ranges"].astype(np.float32)), TypeError, expect="got float32"),
        Case(dp, "ranges", "position > S", _set(ranges=lambda d: (d["ranges"] + 1).astype(i32)), expect="[0, 2]"),
        Case(dp, "lm", "lm with N+1 rows", _set(lm=np.zeros((N + 1, S + 1, 3), np.float32)), expect="(3, 4, 3)"),
        Case("rnnt_loss_smoothed", "lm_only_scale", "lm_only_scale='x'", _set(lm_only_scale="x"), TypeError, expect="got str"),
        Case("rnnt_loss_smoothed", "am_only_scale", "am_only_scale=inf", _set(am_only_scale=float("inf")), expect="got inf"),
        Case("rnnt_loss_smoothed", "symbols", "symbol >= C", _set(symbols=np.array([[1, 2, 3], [9, 2, 1]], i32)), expect="got 9 at sequence 1, position 0"),
        Case("rnnt_loss_smoothed", "am", "2-D am", _set(am=lambda d: d["am"][:, 0].copy()), expect="(2, 5)"),
    ]
    return cs


# --------------------------------------------------------------------------- #
# Decoders (issue 25): ctc_decoder (factory and call), graph_decode,            #
# ctc_greedy_decode, the transducer greedy and beam searches (helper H).       #
# --------------------------------------------------------------------------- #
_DECODE_TOKENS = ["-", "|", "a", "b", "c"]   # blank "-", silence "|": C = 5 classes
_TRANSDUCER_FNS = ("rnnt_greedy_decode", "tdt_greedy_decode", "multiblank_greedy_decode",
                   "rnnt_beam_search", "tdt_beam_search")
_DECODE_FNS = ("ctc_decoder", "graph_decode", "ctc_greedy_decode") + _TRANSDUCER_FNS
_decode_dir = []


def _decode_file(name, text):
    """A file in a private temporary folder (made once per process), for lexicons and LMs."""
    import atexit
    import os
    import shutil
    import tempfile

    if not _decode_dir:
        _decode_dir.append(tempfile.mkdtemp(prefix="duoloss-bad-inputs-"))
        atexit.register(shutil.rmtree, _decode_dir[0], True)
    path = os.path.join(_decode_dir[0], name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _predict(tokens, state):
    """A stateless predictor: its output is the last token (works on torch and jax arrays)."""
    return tokens, state


def _join(frame, last):
    """The joiner: the encoder frame's values are the logits."""
    return frame


def _decode_good(fn):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, T, C)).astype(np.float32)
    lp = (x - np.log(np.exp(x).sum(-1, keepdims=True))).astype(np.float32)  # (N, T, C)
    ln = np.array([6, 5], np.int32)
    if fn == "ctc_decoder":
        return dict(tokens=list(_DECODE_TOKENS), emissions=lp, lengths=ln)
    if fn == "graph_decode":
        from duoloss.graphs import ctc_topo

        return dict(emissions=lp, graph=ctc_topo(C), lengths=ln)
    if fn == "ctc_greedy_decode":
        return dict(log_probs=np.ascontiguousarray(lp.transpose(1, 0, 2)), input_lengths=ln)
    d = dict(encoder_out=x, encoder_lengths=ln, predict=_predict, join=_join)
    if fn.startswith("tdt"):  # V = 5 tokens (blank 4) + 3 durations
        d.update(encoder_out=rng.standard_normal((N, T, C + 3)).astype(np.float32), blank=C - 1,
                 durations=[0, 1, 2])
    if fn.startswith("multiblank"):  # V = 6: big blank 4, blank 5
        d.update(encoder_out=rng.standard_normal((N, T, C + 1)).astype(np.float32), blank=C,
                 big_blank_durations=[2])
    return d


_ARPA_OK = ("\\data\\\nngram 1=4\n\n\\1-grams:\n-99\t<s>\n-0.5\tab\n-0.7\t</s>\n-2.0\t<unk>\n"
            "\n\\end\\\n")


def _decode_cases():
    i32, f32 = np.int32, np.float32
    lex = _decode_file("lexicon.txt", "ab a b |\nba b a |\n")
    lex_x = _decode_file("lexicon_x.txt", "ab a b |\nax a x |\n")      # 'x' is no token
    lex_blank = _decode_file("lexicon_blank.txt", "ab a - b |\n")     # the blank in a spelling
    arpa = _decode_file("lm.arpa", _ARPA_OK)
    arpa_bad = _decode_file("bad.arpa", _ARPA_OK.replace("-0.5\tab", "x\tab"))
    tok_file = _decode_file("tokens.txt", "-\n|\na\nb\nc\n")
    fn = "ctc_decoder"
    cs = [
        # the factory: tokens, blank and silence, numbers, lexicon, LM, hotwords
        Case(fn, "blank_token", "blank_token not among the tokens", _set(blank_token="<b>"), expect="got '<b>'"),
        Case(fn, "sil_token", "sil_token not among the tokens", _set(sil_token="<sil>"), expect="got '<sil>'"),
        Case(fn, "blank_token", "blank_token = sil_token", _set(sil_token="-"), prefix="ctc_decoder: arguments 'blank_token' and 'sil_token' must be different", expect="got '-' and '-'"),
        Case(fn, "blank_token", "blank_token as an int", _set(blank_token=0), TypeError, expect="got int"),
        Case(fn, "tokens", "a token listed twice", _set(tokens=["-", "|", "a", "a", "c"]), expect="'a' twice"),
        Case(fn, "tokens", "no tokens", _set(tokens=[]), expect="got []"),
        Case(fn, "tokens", "a non-str token", _set(tokens=["-", "|", "a", 3, "c"]), TypeError, expect="int at index 3"),
        Case(fn, "tokens", "a missing tokens file", _set(tokens="/nonexistent/tokens.txt"), expect="does not exist"),
        Case(fn, "nbest", "nbest=0", _set(nbest=0), expect=">= 1, got 0"),
        Case(fn, "beam_size", "beam_size=1.5", _set(beam_size=1.5), TypeError, expect="got float"),
        Case(fn, "beam_size_token", "beam_size_token=0", _set(beam_size_token=0), expect="got 0"),
        Case(fn, "beam_threshold", "beam_threshold=-1", _set(beam_threshold=-1.0), expect=">= 0, got -1.0"),
        Case(fn, "lm_weight", "lm_weight=nan", _set(lm_weight=float("nan")), expect="got nan"),
        Case(fn, "word_score", "word_score='x'", _set(word_score="x"), TypeError, expect="got str"),
        Case(fn, "unk_score", "unk_score=+inf", _set(unk_score=float("inf")), expect="or -inf, got inf"),
        Case(fn, "log_add", "log_add=1", _set(log_add=1), TypeError, expect="got int"),
        Case(fn, "unk_word", "unk_word=None", _set(unk_word=None), TypeError, expect="got NoneType"),
        Case(fn, "lexicon", "lexicon as a dict", _set(lexicon={"ab": [["a", "b"]]}), TypeError, expect="got dict"),
        Case(fn, "lexicon", "a spelling with a token not in tokens", _set(lexicon=lex_x), prefix="read_lexicon:", expect="'x'"),
        Case(fn, "lexicon", "a spelling with the blank", _set(lexicon=lex_blank), expect="blank token '-'"),
        Case(fn, "lm", "lm=3", _set(lm=3), TypeError, expect="got int"),
        Case(fn, "lm", "a missing LM file", _set(lm="/nonexistent/lm.arpa"), expect="does not exist"),
        Case(fn, "lm", "an ARPA file with a non-numeric score", _set(lm=arpa_bad), prefix="read_arpa:", expect="bad.arpa:6: the log10 probability"),
        Case(fn, "hotwords", "hotwords as a str", _set(hotwords="ab"), TypeError, expect="got str"),
        Case(fn, "hotwords", "an empty phrase", _set(hotwords=["ab", " "]), expect="at index 1"),
        Case(fn, "hotwords", "a phrase no token spells", _set(hotwords=["axe"]), expect="'x'"),
        Case(fn, "hotwords", "a word not in the lexicon", _set(lexicon=lex, hotwords=["cab"]), expect="'cab'"),
        Case(fn, "hotwords[0][1]", "a phrase weight 'high'", _set(hotwords=[("ab", "high")]), TypeError, expect="got str"),
        Case(fn, "hotword_weight", "hotword_weight=inf", _set(hotword_weight=float("inf")), expect="got inf"),
        # the call: emissions and lengths
        Case(fn, "emissions", "int32 emissions", _set(emissions=lambda d: d["emissions"].astype(i32)), TypeError, expect="got int32"),
        Case(fn, "emissions", "2-D emissions", _set(emissions=lambda d: d["emissions"][0].copy()), expect="got shape (6, 5)"),
        Case(fn, "emissions", "C < len(tokens)", _set(emissions=np.zeros((N, T, C - 1), f32)), expect="at least C = len(tokens) = 5"),
        Case(fn, "lengths", "float lengths", _set(lengths=np.array([6.0, 5.0], f32)), TypeError, expect="got float32"),
        Case(fn, "lengths", "(N+1,) lengths", _set(lengths=np.array([6, 5, 4], i32)), expect="got (3,)"),
        Case(fn, "lengths", "length > T", _set(lengths=np.array([7, 5], i32)), expect="got 7 at index 0"),
        Case(fn, "lengths", "negative length", _set(lengths=np.array([6, -1], i32)), expect="got -1 at index 1"),
    ]
    cs += [
        Case(fn, "emissions", "a tokens file and emissions of another C", _set(tokens=tok_file, emissions=np.zeros((N, T, 4), f32)), expect="C = len(tokens) = 5"),
        Case(fn, "emissions", "emissions as a str", _set(emissions="abc"), TypeError, frameworks=("torch",), expect="got str"),
        Case(fn, "emissions", "emissions as a str", _set(emissions="abc"), TypeError, frameworks=("jax",), expect="got str"),
        # the hotwords are checked before the LM is compiled into its tables (a numba kernel)
        Case(fn, "hotwords", "a hotword outside the lexicon, with an LM", _set(lexicon=lex, lm=arpa, hotwords=["ab ba", "ba ab c"]), expect="the word 'c' of 'ba ab c'"),
    ]

    fn = "graph_decode"
    from duoloss.gtn import Graph

    cyc = Graph(calc_grad=False)
    cyc.add_node(start=True)
    cyc.add_node(accept=True)
    cyc.add_arc(0, 1, 1)
    cyc.add_arc(1, 0, -1)
    cyc.add_arc(0, 1, -1)
    cyc.add_arc(1, 1, -1)  # an epsilon self-loop: a cycle of input-epsilon arcs
    cs += [
        Case(fn, "emissions", "int32 emissions", _set(emissions=lambda d: d["emissions"].astype(i32)), TypeError, expect="got dtype int32"),
        Case(fn, "emissions", "complex64 emissions", _set(emissions=lambda d: d["emissions"].astype(np.complex64)), TypeError, expect="got dtype complex64"),
        Case(fn, "emissions", "2-D emissions", _set(emissions=lambda d: d["emissions"][0].copy()), expect="got shape (6, 5)"),
        Case(fn, "emissions", "emissions as a str", _set(emissions="abc"), TypeError, expect="got str"),
        Case(fn, "lengths", "float lengths", _set(lengths=np.array([6.0, 5.0], f32)), TypeError, expect="float32"),
        Case(fn, "lengths", "(N+1,) lengths", _set(lengths=np.array([6, 5, 4], i32)), expect="got shape (3,)"),
        Case(fn, "lengths", "length > T", _set(lengths=np.array([7, 5], i32)), expect="lengths[0] = 7"),
        Case(fn, "lengths", "negative length", _set(lengths=np.array([6, -1], i32)), expect="lengths[1] = -1"),
        Case(fn, "beam", "beam=0", _set(beam=0.0), expect="> 0"),
        Case(fn, "beam", "beam=True", _set(beam=True), TypeError, expect="got bool"),
        Case(fn, "beam", "beam='wide'", _set(beam="wide"), TypeError, expect="got str"),
        Case(fn, "max_active", "max_active=0", _set(max_active=0), expect="got 0"),
        Case(fn, "max_active", "max_active=1.5", _set(max_active=1.5), TypeError, expect="got float"),
        Case(fn, "graph", "graph input label >= C", _set(graph=lambda d: _graph([2, 7])), expect="input label 7"),
        Case(fn, "graph", "a cycle of input-epsilon arcs", _set(graph=cyc), expect="cycle"),
        Case(fn, "graph", "graph as a list of graphs", _set(graph=lambda d: [d["graph"]]), TypeError, expect="list"),
    ]

    fn = "ctc_greedy_decode"
    cs += [
        Case(fn, "log_probs", "int32 log_probs", _set(log_probs=lambda d: d["log_probs"].astype(i32)), TypeError, expect="got int32"),
        Case(fn, "log_probs", "4-D log_probs", _set(log_probs=lambda d: d["log_probs"][None]), expect="(1, 6, 2, 5)"),
        Case(fn, "log_probs", "zero classes (C = 0)", _set(log_probs=np.zeros((T, N, 0), f32)), expect="C = 0"),
        Case(fn, "blank", "blank = C", _set(blank=C), expect="got 5"),
        Case(fn, "blank", "float blank", _set(blank=0.0), TypeError, expect="got float"),
        Case(fn, "batch_first", "batch_first=1", _set(batch_first=1), TypeError, expect="got int"),
        Case(fn, "input_lengths", "input length > T", _set(input_lengths=np.array([7, 5], i32)), expect="got 7 at index 0"),
        Case(fn, "input_lengths", "float input_lengths", _set(input_lengths=np.array([6.0, 5.0], f32)), TypeError, expect="got float32"),
        Case(fn, "input_lengths", "(N+1,) input_lengths", _set(input_lengths=np.array([6, 5, 4], i32)), expect="got shape (3,)"),
        Case(fn, "input_lengths", "batch_first=True with (T, N, C) log_probs", _set(batch_first=True), expect="shape (6,)"),
    ]

    for fn in _TRANSDUCER_FNS:
        cs += [
            Case(fn, "encoder_out", "int32 encoder_out", _set(encoder_out=lambda d: d["encoder_out"].astype(i32)), TypeError, expect="got int32"),
            Case(fn, "encoder_out", "1-D encoder_out", _set(encoder_out=lambda d: d["encoder_out"][0, 0].copy()), expect="got shape"),
            Case(fn, "encoder_lengths", "encoder length > T", _set(encoder_lengths=np.array([7, 5], i32)), expect="got 7 at index 0"),
            Case(fn, "encoder_lengths", "float encoder_lengths", _set(encoder_lengths=np.array([6.0, 5.0], f32)), TypeError, expect="got float32"),
            Case(fn, "encoder_lengths", "(N+1,) encoder_lengths", _set(encoder_lengths=np.array([6, 5, 4], i32)), expect="got shape (3,)"),
            Case(fn, "predict", "predict not callable", _set(predict=3), TypeError, expect="got int"),
            Case(fn, "join", "join returns (N, V, 1)", _set(join=lambda d: (lambda frame, last: frame[..., None])), prefix=f"{fn}: 'join' must return (N, V) logits", expect="got (N, "),
            Case(fn, "blank", "blank out of range", _set(blank=99), expect="got 99"),
            Case(fn, "start_token", "start_token out of range", _set(start_token=-1), expect="got -1"),
        ]
        if fn.startswith("tdt"):
            cs += [
                Case(fn, "durations", "durations=[0]", _set(durations=[0]), expect="positive duration"),
                Case(fn, "durations", "a float duration", _set(durations=[0, 1.0, 2]), TypeError, expect="[0, 1.0, 2]"),
                Case(fn, "join", "V + D logits with V = 0", _set(durations=[0, 1, 2, 3, 4, 5, 6, 7]), prefix=f"{fn}: 'join' must return V + D logits", expect="got 8"),
            ]
        if fn.startswith("multiblank"):
            cs += [
                Case(fn, "big_blank_durations", "big blank duration 0", _set(big_blank_durations=[0]), expect=">= 1, got [0]"),
                Case(fn, "big_blank_durations", "no room for the big blanks (blank=0)", _set(blank=0), expect="blank = 0"),
            ]
        if fn != "rnnt_beam_search":
            cs.append(Case(fn, "max_symbols_per_frame", "max_symbols_per_frame=0", _set(max_symbols_per_frame=0), expect="got 0"))
        if "beam" in fn:
            cs += [
                Case(fn, "beam", "beam=0", _set(beam=0), expect="got 0"),
                Case(fn, "beam", "beam=1.5", _set(beam=1.5), TypeError, expect="got float"),
            ]
    return cs


_DECODE_POS = {
    "graph_decode": ("emissions", "graph"),
    "ctc_greedy_decode": ("log_probs", "input_lengths"),
    **{fn: ("encoder_out", "encoder_lengths", "predict", "join") for fn in _TRANSDUCER_FNS},
}


def _call_decoder(case, mod, kw):
    """``ctc_decoder(tokens, **options)(emissions, lengths)``, or a decoder called with its
    positional arguments; returns the exception (or None)."""
    try:
        if case.fn == "ctc_decoder":
            em, ln = kw.pop("emissions"), kw.pop("lengths")
            mod.ctc_decoder(kw.pop("tokens"), **kw)(em, ln)
        else:
            args = [kw.pop(p) for p in _DECODE_POS[case.fn]]
            getattr(mod, case.fn)(*args, **kw)
    except Exception as err:  # noqa: BLE001 - the test inspects it
        return err
    return None


if __name__ == "__main__":
    rows = []
    for case in all_cases():
        fw = case.frameworks[0]
        rows.append((case, call(case, fw)))
    print(markdown_table(rows))
