"""WFST decoding: ``graph_decode`` (beam-pruned, on the fly) vs Viterbi on the full composition.

A synthetic task: ``V`` random words over 26 letters, a bigram ARPA model with ``NB``
bigrams (read by duoloss), ``L`` from the words' spellings (``word l e t t e r s |``),
``HLG = compose(ctc_topo(28, modified=True), compose(L, G))``, and simulated peaky
emissions of ``B`` utterances of ``T`` frames (random word sequences spelled with CTC
frames, plus Gaussian noise).  Two ways to find each utterance's best path:

* ``graph_decode``: the batch in one call (``--beam``, ``--max-active``), the emissions
  composed with ``HLG`` on the fly;
* ``viterbi(compose)``: per utterance, the full composition
  ``gtn.compose(E_b, HLG)`` and ``gtn.viterbi_path`` (the exact result; memory grows with
  ``T`` times the graph).

The table gives both times (paired rounds, median), their ratio, how many utterances got
the same best path (score within 1e-4), the arcs of the largest full composition and the
most traceback records ``graph_decode`` kept for one utterance, and the word error rate of
the decoded words against the spelled ones.

    python benchmarks/decode_wfst.py                       # B,T,V,NB = 4,100,300,3000
    python benchmarks/decode_wfst.py --sizes "8,200,1000,20000" --rounds 3
    python -m benchmarks.decode_wfst --quick               # a smoke run
"""
from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

if __package__ in (None, ""):  # ``python benchmarks/decode_wfst.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

DEFAULT_SIZES = [(4, 100, 300, 3000)]
QUICK_SIZES = [(2, 20, 20, 60)]
DECODE, FULL = "graph_decode", "viterbi(compose)"


def task(B, T, V, NB, seed=0):
    """The synthetic words, ARPA model (path), HLG, emissions and spelled word sequences."""
    from duoloss import gtn
    from duoloss.core.decoding import read_arpa
    from duoloss.graphs import arpa_graph, ctc_topo, lexicon_graph

    rng = np.random.default_rng(seed)
    letters = [chr(ord("a") + i) for i in range(26)]
    tokens = ["-", "|"] + letters
    words = sorted({"".join(rng.choice(letters, int(rng.integers(2, 8)))) for _ in range(V)})
    V = len(words)
    NB = min(NB, V * V)
    lines = ["\\data\\", f"ngram 1={V + 2}", f"ngram 2={NB}", "", "\\1-grams:",
             "-99\t<s>\t-0.3", "-1.5\t</s>"]
    lines += [f"{-rng.uniform(2, 4):.4f}\t{w}\t{-rng.uniform(0.1, 0.8):.4f}" for w in words]
    lines += ["", "\\2-grams:"]
    seen = set()
    while len(seen) < NB:
        a, b = (int(x) for x in rng.integers(V, size=2))
        if (a, b) not in seen:
            seen.add((a, b))
            lines.append(f"{-rng.uniform(0.5, 2):.4f}\t{words[a]} {words[b]}")
    lines += ["", "\\end\\", ""]
    path = os.path.join(tempfile.mkdtemp(), "lm.arpa")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    lm = read_arpa(path)
    G = arpa_graph(lm)
    L = lexicon_graph({w: [list(w) + ["|"]] for w in words}, tokens, words=lm.words)
    HLG = gtn.compose(ctc_topo(len(tokens), modified=True), gtn.compose(L, G))
    C = len(tokens)
    em = np.full((B, T, C), -8.0)
    truth = []
    for b in range(B):
        seq, frames = [], []
        while True:   # whole words while they fit, then blank frames (trailing silence)
            w = words[int(rng.integers(V))]
            spelled = []
            for ch in list(w) + ["|"]:
                spelled += [tokens.index(ch)] * int(rng.integers(1, 3)) + [0] * int(rng.integers(0, 3))
            if len(frames) + len(spelled) > T:
                break
            seq.append(w)
            frames += spelled
        truth.append(seq)
        cut = frames + [0] * (T - len(frames))
        em[b, np.arange(T), cut] = -0.1
    em += rng.normal(size=em.shape) * 1.5
    em -= np.log(np.exp(em).sum(-1, keepdims=True))
    em = em.astype(np.float32).astype(np.float64)   # float32-exact, as the graph engine's weights
    return lm, G, HLG, em, truth


def run(B, T, V, NB, rounds, beam, max_active, label=""):
    from duoloss import gtn
    from duoloss.core.decoding.wfst import graph_decode

    lm, G, HLG, em, truth = task(B, T, V, NB)
    out = {}
    stats = {}

    def decode():
        out["decode"] = graph_decode(em, HLG, beam=beam, max_active=max_active, _stats=stats)

    def full():
        res = []
        arcs = 0
        for b in range(B):
            E = gtn.linear_graph(T, em.shape[2], calc_grad=False)
            E.set_weights(em[b].astype(np.float32).reshape(-1))
            comp = gtn.compose(E, HLG)
            arcs = max(arcs, comp.num_arcs())
            path = gtn.viterbi_path(comp)
            res.append((float(np.sum(np.asarray(path.weights_to_list(), np.float64))),
                        [x for x in path.labels_to_list(False) if x >= 0]))
        out["full"], out["full_arcs"] = res, arcs

    timing = H.paired({DECODE: decode, FULL: full}, rounds, label=label)
    same = sum(1 for hyps, (score, _) in zip(out["decode"], out["full"])
               if hyps and abs(hyps[0].score - score) <= 1e-4)
    hyp_words = [" ".join(lm.words[i] for i in h[0].labels.tolist()) if h else ""
                 for h in out["decode"]]
    ref_words = [" ".join(t) for t in truth]
    errors = sum(_edit(r.split(), h.split()) for r, h in zip(ref_words, hyp_words))
    wer = errors / max(1, sum(len(r.split()) for r in ref_words))
    return timing, {"same_best_path": same, "utterances": B, "G_arcs": G.num_arcs(),
                    "HLG_arcs": HLG.num_arcs(), "full_composition_arcs": out["full_arcs"],
                    "max_traceback_records": int(stats["records"].max()),
                    "peak_active": int(stats["peak_active"].max()), "wer": wer}


def _edit(a, b):
    """Levenshtein distance between two word lists."""
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[len(b)]


def main(argv=None):
    ap = H.parser(__doc__, names="B,T,V,NB", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                  rounds=5, threads=None,
                  threads_help="not used: graph_decode splits the batch over duoloss's pool")
    ap.add_argument("--beam", type=float, default=10.0, help="graph_decode's beam (default 10)")
    ap.add_argument("--max-active", type=int, default=1000,
                    help="graph_decode's max_active (default 1000)")
    args = H.finish_args(ap.parse_args(argv), "decode_wfst")
    rows, results = [], []
    for i, (B, T, V, NB) in enumerate(args.sizes):
        tm, ex = run(B, T, V, NB, args.rounds, args.beam, args.max_active,
                     label=H.size_label(i, len(args.sizes)))
        ratio = tm.ratio(DECODE, FULL)
        rows.append([f"{B},{T},{V},{NB}", str(ex["G_arcs"]), str(ex["HLG_arcs"]),
                     H.fmt_ms(tm.median(DECODE)), H.fmt_ms(tm.median(FULL)), H.fmt_ratio(ratio),
                     f"{ex['same_best_path']}/{B}", str(ex["full_composition_arcs"]),
                     str(ex["max_traceback_records"]), f"{ex['wer']:.3f}"])
        results.append(H.result((B, T, V, NB), tm, ratios=[ratio], extra=ex))
    text = "\n".join([
        f"beam {args.beam:g}, max_active {args.max_active}; cores: {os.cpu_count()}",
        "",
        H.table(["B,T,V,NB", "G arcs", "HLG arcs", "graph_decode ms", "viterbi(compose) ms",
                 "ratio", "same path", "composition arcs", "records", "WER"], rows,
                align="lrrrrrrrrr"),
        "",
        "ratio: graph_decode / viterbi(compose), median of per-round ratios (interquartile range);",
        "same path: utterances whose graph_decode score equals the full composition's best;",
        "composition arcs: the largest E_b ∘ HLG built by the reference; records: the most",
        "traceback records graph_decode held for one utterance (its memory besides one frame).",
    ])
    H.emit(args, results, text)


if __name__ == "__main__":
    main()
