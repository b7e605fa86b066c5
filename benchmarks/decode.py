"""CTC decoding speed: duoloss's ``ctc_decoder`` against flashlight-text and pyctcdecode.

A synthetic speech-like task (``tests/_decode_peers.py``): a vocabulary of ``V`` words over
``a``-``z``, a 4-gram ARPA LM with at least ``N`` n-grams estimated from sentences of a random
word Markov chain, a lexicon of the ``V`` words, and ``B`` utterances of ``T`` frames and ``C``
classes (blank, ``|``, ``a``-``z`` and fillers) whose emissions are noisy smoothed alignments of
such sentences, log-softmaxed.  In paired rounds (rotating order) it times, on the whole batch:

* ``duoloss lexicon+LM``: ``duoloss.torch.ctc_decoder(tokens, lexicon, lm=ARPA)`` with
  ``beam_size`` (default 50), torchaudio's tutorial weights (``lm_weight=3.23``,
  ``word_score=-0.26``); the search runs on duoloss's batch threads (``NUMBA_NUM_THREADS``,
  default: one per core);
* ``flashlight lexicon+LM``: flashlight-text 0.0.7's ``LexiconDecoder`` with KenLM, wired as
  torchaudio's ``ctc_decoder`` wires it (one thread, utterance after utterance, as torchaudio
  runs it), same options;
* ``pyctcdecode LM``: pyctcdecode 0.5.0 with the same ARPA (through the ``kenlm`` package),
  the lexicon's words as its unigrams, ``beam_width`` = beam, ``alpha = lm_weight / ln 10``,
  ``beta = word_score`` (needs ``kenlm``; skipped otherwise);
* ``duoloss lexicon-free`` and ``flashlight lexicon-free``: no lexicon, no LM;
* ``duoloss +hotwords``: the lexicon+LM decoder with ``--hotwords`` (default 200) hotwords
  (single lexicon words and two-word phrases);
* ``duoloss greedy``: ``duoloss.torch.ctc_greedy_decode`` on the same emissions.

Besides wall time, the table gives each decoder's CPU time (all of its threads: duoloss uses
several, flashlight and pyctcdecode one).

Targets (issue 25): lexicon+LM <= 1x flashlight and <= 0.1x pyctcdecode; lexicon-free
<= 0.5x flashlight; 200 hotwords <= 1.2x none; greedy <= 0.05x the beam search.  The table
also gives each decoder's WER against the reference sentences and how often duoloss's best
words equal flashlight's.

    python benchmarks/decode.py                 # B,T,C,V,N = 100,500,30,10000,100000
    python benchmarks/decode.py --rounds 5 --skip pyctcdecode
    python -m benchmarks.decode --quick         # a smoke run

Sizes are ``B,T,C,V,N``: utterances, frames, classes (>= 28), lexicon words, minimum number
of n-grams of the 4-gram LM.
"""
from __future__ import annotations

import importlib.util
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

if __package__ in (None, ""):  # ``python benchmarks/decode.py``: time this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import _harness as H

sys.path.insert(0, os.path.join(H.ROOT, "tests"))
import _decode_peers as P  # noqa: E402

sys.path.pop(0)

DEFAULT_SIZES = [(100, 500, 30, 10000, 100000)]
QUICK_SIZES = [(4, 60, 30, 200, 1500)]
LM_WEIGHT, WORD_SCORE = 3.23, -0.26   # torchaudio's LibriSpeech tutorial values
ORDER = 4
FILLERS = ["'", "#", "$", "%", "&", "*", "+", "/"]

DU_LM, FL_LM, PY_LM = "duoloss lexicon+LM", "flashlight lexicon+LM", "pyctcdecode LM"
DU_FREE, FL_FREE = "duoloss lexicon-free", "flashlight lexicon-free"
DU_HOT, DU_GREEDY = "duoloss +hotwords", "duoloss greedy"
TARGETS = [  # (num, den, target ratio)
    (DU_LM, FL_LM, 1.0), (DU_LM, PY_LM, 0.1), (DU_FREE, FL_FREE, 0.5),
    (DU_HOT, DU_LM, 1.2), (DU_GREEDY, DU_LM, 0.05),
]


def build_task(B, T, C, V, N, workdir, seed=0):
    """Vocabulary, lexicon file, 4-gram ARPA (>= N n-grams), emissions and references."""
    if C < len(P.TOKENS):
        raise SystemExit(f"decode.py: C must be >= {len(P.TOKENS)}, got {C}")
    rng = np.random.default_rng(seed)
    tokens = list(P.TOKENS) + FILLERS[: C - len(P.TOKENS)]
    tokens += [f"<x{i}>" for i in range(C - len(tokens))]
    vocab = P.make_vocabulary(rng, V, 2, 8)
    chain = P.WordChain(rng, vocab)
    lexicon = P.write_lexicon(os.path.join(workdir, "lexicon.txt"), vocab)
    # LM text: every word once (all lexicon words are unigrams), then chain sentences until
    # the 4-gram model has at least N n-grams.
    sentences = [vocab[i:i + 10] for i in range(0, V, 10)]
    seen = [set() for _ in range(ORDER)]
    while sum(len(s) for s in seen) < N:
        batch = chain.sentences(rng, 500, 4, 12)
        sentences += batch
        for s in batch:
            padded = ["<s>"] + s + ["</s>"]
            for k in range(1, ORDER + 1):
                for i in range(len(padded) - k + 1):
                    seen[k - 1].add(tuple(padded[i:i + k]))
    tables = P.estimate_ngrams(sentences, ORDER)
    arpa = P.write_arpa_tables(os.path.join(workdir, "lm4.arpa"), tables)
    n_ngrams = sum(len(t) for t in tables)
    # utterances: T frames each, about 3.5 frames per token
    refs, em = [], np.empty((B, T, C), np.float32)
    for b in range(B):
        words: list = []
        while len(P.sentence_tokens(words)) < T / 3.5:
            words += chain.sentences(rng, 1, 4, 12)[0]
        while len(P.sentence_tokens(words)) * 2 > T:
            words.pop()
        refs.append(words)
        em[b] = P.synth_emissions(rng, P.sentence_tokens(words), T, C, peak=8.0, noise=1.0,
                                  smooth=2, confusion=0.05)
    hot = [w for w in rng.choice(vocab, size=150, replace=False)]
    hot += [" ".join(rng.choice(vocab, size=2, replace=False)) for _ in range(50)]
    return dict(tokens=tokens, vocab=vocab, lexicon=lexicon, arpa=arpa, n_ngrams=n_ngrams,
                refs=refs, emissions=em, lengths=np.full(B, T, np.int64), hotwords=hot)


def _have(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def make_impls(task, args):
    """name -> (callable decoding the whole batch, function giving its best word lists)."""
    import torch

    import duoloss.torch as dt

    em_np, lens_np = task["emissions"], task["lengths"]
    em, lens = torch.from_numpy(em_np), torch.from_numpy(lens_np)
    opts = dict(beam_size=args.beam, lm_weight=LM_WEIGHT, word_score=WORD_SCORE)
    tokens = task["tokens"]
    impls = {}
    skip = set(args.skip)

    du_lm = dt.ctc_decoder(tokens, lexicon=task["lexicon"], lm=task["arpa"], **opts)
    impls[DU_LM] = (lambda: du_lm(em, lens), lambda out: [h[0].words if h else [] for h in out])
    if P.flashlight_available() and "flashlight" not in skip:
        fl_lm = P.FlashlightCTCDecoder(tokens, lexicon=task["lexicon"], lm=task["arpa"], **opts)
        impls[FL_LM] = (lambda: fl_lm(em_np, lens_np),
                        lambda out: [h[0]["words"] if h else [] for h in out])
    if _have("pyctcdecode") and _have("kenlm") and "pyctcdecode" not in skip:
        from pyctcdecode import build_ctcdecoder

        labels = ["" if t == "-" else " " if t == "|" else t for t in tokens]
        py = build_ctcdecoder(labels, kenlm_model_path=task["arpa"], unigrams=task["vocab"],
                              alpha=LM_WEIGHT / math.log(10), beta=WORD_SCORE)
        n_py = min(len(lens_np), args.pyctc_utts or len(lens_np))
        rows = [np.ascontiguousarray(em_np[b, : lens_np[b]]) for b in range(n_py)]
        impls[PY_LM] = (lambda: [py.decode(r, beam_width=args.beam) for r in rows],
                        lambda out: [s.split() for s in out])
    dec_free = dt.ctc_decoder(tokens, beam_size=args.beam)
    impls[DU_FREE] = (lambda: dec_free(em, lens), None)
    if P.flashlight_available() and "flashlight" not in skip:
        fl_free = P.FlashlightCTCDecoder(tokens, beam_size=args.beam)
        impls[FL_FREE] = (lambda: fl_free(em_np, lens_np), None)
    if args.hotwords > 0 and "hotwords" not in skip:
        du_hot = dt.ctc_decoder(tokens, lexicon=task["lexicon"], lm=task["arpa"],
                                hotwords=task["hotwords"][: args.hotwords], **opts)
        impls[DU_HOT] = (lambda: du_hot(em, lens), lambda out: [h[0].words if h else []
                                                                 for h in out])
    if "greedy" not in skip:
        impls[DU_GREEDY] = (lambda: dt.ctc_greedy_decode(em, lens, batch_first=True), None)
    return impls


def main(argv=None):
    p = H.parser(__doc__, names="B,T,C,V,N", sizes=DEFAULT_SIZES, quick_sizes=QUICK_SIZES,
                 rounds=3, quick_rounds=2)
    p.add_argument("--beam", type=int, default=50, help="beam size (default 50)")
    p.add_argument("--hotwords", type=int, default=200,
                   help="hotwords of the hotword case (default 200; 0 skips it)")
    p.add_argument("--pyctc-utts", type=int, default=None,
                   help="time pyctcdecode on the first K utterances only and scale its time "
                        "to the batch (default: 10 for B > 10; pure Python is slow)")
    p.add_argument("--skip", nargs="*", default=[],
                   choices=["flashlight", "pyctcdecode", "hotwords", "greedy"],
                   help="leave these implementations out")
    args = H.finish_args(p.parse_args(argv), "decode")
    if args.pyctc_utts is None and not args.quick:
        args.pyctc_utts = 10
    if args.threads:
        os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    results, blocks = [], []
    for i, size in enumerate(args.sizes):
        label = H.size_label(i, len(args.sizes))
        B, T, C, V, N = size
        with tempfile.TemporaryDirectory() as workdir:
            H.progress(f"{label}building the task (vocabulary, {ORDER}-gram LM, emissions)")
            t0 = time.perf_counter()
            task = build_task(B, T, C, V, N, workdir)
            build_s = time.perf_counter() - t0
            impls = make_impls(task, args)
            outputs, cpu_ms = {}, {k: [] for k in impls}

            def timed(name, fn):
                def run():
                    c0 = time.process_time()  # all threads of this process
                    outputs[name] = fn()
                    cpu_ms[name].append(1e3 * (time.process_time() - c0))
                return run

            tm = H.paired({k: timed(k, f) for k, (f, _) in impls.items()}, args.rounds,
                          label=label)
        n_py = min(B, args.pyctc_utts or B)
        if PY_LM in tm.rounds_ms and n_py < B:  # per-utterance time scaled to the batch
            tm.rounds_ms[PY_LM] = [ms * B / n_py for ms in tm.rounds_ms[PY_LM]]
        wers, agree = {}, None
        for k, (_, words) in impls.items():
            if words is not None:
                hyps = words(outputs[k])
                wers[k] = P.wer(task["refs"][: len(hyps)], hyps)
        if FL_LM in impls:
            a = impls[DU_LM][1](outputs[DU_LM])
            b = impls[FL_LM][1](outputs[FL_LM])
            agree = sum(x == y for x, y in zip(a, b)) / len(a)
        ratios = [tm.ratio(n, d) for n, d, _ in TARGETS if n in impls and d in impls]
        med = tm.medians()
        scale = {k: (B / n_py if k == PY_LM and n_py < B else 1.0) for k in impls}
        cpu = {k: statistics.median(v[1:] or v) * scale[k] for k, v in cpu_ms.items()}
        rows = [[k, H.fmt_ms(med[k]), H.fmt_ms(med[k] / B), H.fmt_ms(cpu[k] / B),
                 f"{wers[k]:.3f}" if k in wers else ""] for k in impls]
        text = H.table(["decoder", "ms (batch)", "ms / utterance", "CPU ms / utterance", "WER"],
                       rows)
        trows = []
        for n, d, target in TARGETS:
            r = next((r for r in ratios if r["num"] == n and r["den"] == d), None)
            if r is not None:
                trows.append([f"{n} / {d}", H.fmt_ratio(r), f"{cpu[n] / cpu[d]:.2f}x",
                              f"<= {target}x", "yes" if r["median"] <= target else "**no**"])
        text += "\n\n" + H.table(["ratio", "wall: median (IQR)", "CPU", "target", "met"],
                                   trows, "lrrrl")
        extra = {"cpu_ms": cpu,
                 "pyctcdecode_utterances": n_py if PY_LM in impls else None,
                 "n_ngrams": task["n_ngrams"], "lexicon_words": V, "beam": args.beam,
                 "hotwords": min(args.hotwords, len(task["hotwords"])), "wer": wers,
                 "same_best_words_as_flashlight": agree, "build_s": build_s,
                 "threads": None}
        try:
            from duoloss.core import _pool
            extra["threads"] = _pool.num_threads()
        except Exception:
            pass
        head = (f"B={B} utterances x T={T} frames, C={C}; lexicon {V} words; {ORDER}-gram LM "
                f"with {task['n_ngrams']} n-grams; beam {args.beam}; duoloss threads "
                f"{extra['threads']}")
        if agree is not None:
            head += f"; duoloss's best words = flashlight's on {agree:.0%} of the utterances"
        if PY_LM in impls and n_py < B:
            head += (f"; pyctcdecode timed on {n_py} utterances, its time scaled by {B}/{n_py} "
                     f"(its WER on those {n_py})")
        blocks.append(head + "\n\n" + text)
        results.append(H.result(size, tm, ratios=ratios, extra=extra))
    H.emit(args, results, "\n\n".join(blocks))


if __name__ == "__main__":
    main()
