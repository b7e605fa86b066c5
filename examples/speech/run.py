"""Speech end to end: synthesise a corpus, train CTC + transducer models in torch and JAX with
duoloss's losses, decode with duoloss's decoders, score WER and word alignment, report.

Run from the repository root::

    python examples/speech/run.py                 # the full recipe (make recipe)
    python examples/speech/run.py --smoke         # a few dozen utterances, every stage
    python examples/speech/run.py --frameworks torch --epochs 4

Writes ``results.json``, ``results.md`` (the tables), ``recipe.png``, the ARPA LM and the
lexicon into ``--out`` (default ``build/recipe``); the corpus is cached there too.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402


class _Bar:
    """A minimal progress bar (used when tqdm is not installed)."""

    def __init__(self, iterable=None, total=None, desc=""):
        self.iterable, self.total, self.desc, self.n = iterable, total, desc, 0
        self.t0 = time.perf_counter()

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.update(1)
        self.close()

    def update(self, k):
        self.n += k
        if self.total and (self.n == self.total or self.n % max(1, self.total // 20) == 0):
            print(f"\r{self.desc}: {self.n}/{self.total} ({time.perf_counter() - self.t0:.0f} s)",
                  end="", file=sys.stderr, flush=True)

    def set_postfix(self, **kw):
        pass

    def close(self):
        print(file=sys.stderr)


def _progress(quiet, position=None):
    if quiet:
        return None
    try:
        from tqdm import tqdm
        return lambda it=None, total=None, desc="": tqdm(it, total=total, desc=desc,
                                                          mininterval=2.0, position=position)
    except ImportError:
        return _Bar


def _run_framework(job):
    """Train one framework's model, tune the LM weight on dev, decode and align the test set."""
    fw, data, args, sizes, lexicon, arpa, position = job
    import decode
    progress = _progress(args.quiet, position)
    stages = {}
    test_refs = [u["text"] for u in data["test"]["utts"]]
    dev_refs = [u["text"] for u in data["dev"]["utts"]]
    t, cpu = time.perf_counter(), time.process_time()
    if fw == "torch":
        import torch
        torch.set_num_threads(args.threads)
        import train_torch
        ctc_model, model, hist = train_torch.train(
            data, ctc_epochs=args.ctc_epochs, epochs=args.epochs, batch_size=args.batch_size,
            lr=args.lr, seed=args.seed, progress=progress, max_steps=args.max_steps,
            sizes=sizes)
        side = decode.TorchSide(model)

        def encode_split(split, transducer=False):
            enc, lp = train_torch.encode_split(model if transducer else ctc_model, split)
            return [e.numpy() for e in enc], [x.numpy() for x in lp]
    else:
        import train_jax
        model, ctc_params, params, hist = train_jax.train(
            data, ctc_epochs=args.ctc_epochs, epochs=args.epochs, batch_size=args.batch_size,
            lr=args.lr, seed=args.seed, progress=progress, max_steps=args.max_steps,
            sizes=sizes)
        side = decode.JaxSide(model, params)

        def encode_split(split, transducer=False):
            return train_jax.encode_split(model, params if transducer else ctc_params, split)
    stages[f"{fw}_train"] = time.perf_counter() - t
    stages[f"{fw}_train_ctc"], stages[f"{fw}_train_transducer"] = hist["phase_s"]
    train_cpu_s = time.process_time() - cpu

    # the LM weight and word score: a small grid on the dev split (never the test set)
    t = time.perf_counter()
    _, lp_d = encode_split(data["dev"])
    lps, lens = decode._pad(lp_d)
    best = None
    for lm_weight in (0.5, 1.0, 2.0):
        for word_score in (-1.0, 0.0, 1.0):
            dec = side.ctc_decoder(tokens=decode.TOKENS, lexicon=str(lexicon), lm=str(arpa),
                                   beam_size=args.beam_size, lm_weight=lm_weight,
                                   word_score=word_score,
                                   blank_token=decode.TOKENS[decode.BLANK],
                                   sil_token=decode.TOKENS[decode.SPACE])
            hyps = [" ".join(h[0].words) if h else "" for h in side.beam_ctc(dec, lps, lens)]
            w = decode.wer(dev_refs, hyps)
            if best is None or w < best[0]:
                best = (w, lm_weight, word_score)
    stages[f"{fw}_tune_lm"] = time.perf_counter() - t

    t = time.perf_counter()
    _, lp = encode_split(data["test"])  # the CTC model
    enc, _ = encode_split(data["test"], transducer=True)  # the transducer model's encoder
    decoded = decode.run_decoders(side, enc, lp, test_refs, lexicon=lexicon, arpa=arpa,
                                  beam_size=args.beam_size, lm_weight=best[1],
                                  word_score=best[2], rnnt_beam=args.rnnt_beam,
                                  progress=progress)
    stages[f"{fw}_decode"] = time.perf_counter() - t
    t = time.perf_counter()
    aligned = decode.word_boundaries(side, lp, test_refs, data["frame_s"])
    align = decode.boundary_errors(aligned, data["test"]["utts"])
    # the aligner's constant latency, estimated on dev, taken off the test boundaries
    offsets = decode.latency(decode.word_boundaries(side, lp_d, dev_refs, data["frame_s"]),
                             data["dev"]["utts"])
    aligned_cal = decode.shift(aligned, offsets)
    align_cal = decode.boundary_errors(aligned_cal, data["test"]["utts"])
    align_cal["dev_latency_ms"] = [1000 * offsets[0], 1000 * offsets[1]]
    stages[f"{fw}_align"] = time.perf_counter() - t
    # the test set's CTC log-probabilities and aligned word times, for later analysis
    np.savez(Path(args.out) / f"test-{fw}.npz", *lp)
    (Path(args.out) / f"aligned-{fw}.json").write_text(json.dumps(
        {"raw": aligned, "calibrated": aligned_cal}, default=float))
    res = {
        "wer": {k: v[0] for k, v in decoded.items()},
        "lm_weight": best[1], "word_score": best[2], "dev_wer_beam_lm": best[0],
        "alignment": align, "alignment_calibrated": align_cal,
        "train_steps": len(hist["ctc"]), "train_s": stages[f"{fw}_train"],
        "train_steps_ctc": hist["phase_steps"],
        "train_s_ctc": hist["phase_s"][0], "train_s_transducer": hist["phase_s"][1],
        "train_cpu_s": train_cpu_s, "train_cpu_s_ctc": hist["phase_cpu_s"][0],
        "train_cpu_s_transducer": hist["phase_cpu_s"][1],
        "final_loss": {"ctc": float(np.mean(hist["ctc"][hist["phase_steps"]-10:hist["phase_steps"]])),
                       "rnnt": float(np.mean(hist["rnnt"][-10:]))},
        "examples": [{"ref": r, **{k: v[1][i] for k, v in decoded.items()}}
                     for i, r in enumerate(test_refs[:8])]}
    print(f"{fw}: WER " + ", ".join(f"{k} {v[0]:.2f}%" for k, v in decoded.items())
          + ("" if not align["boundaries"] else
             f"; word boundaries: median {align['median_ms']:.1f} ms, "
             f"{100 * align['within_100ms']:.1f}% within 100 ms; with the dev latency "
             f"({1000 * offsets[0]:.0f}/{1000 * offsets[1]:.0f} ms) taken off: median "
             f"{align_cal['median_ms']:.1f} ms, {100 * align_cal['within_100ms']:.1f}% within "
             f"100 ms"), flush=True)
    i = next((i for i, a in enumerate(data["test"]["audio"]) if a is not None), 0)
    u = data["test"]["utts"][i]
    example = {"feats": data["test"]["feats"][i], "log_probs": lp[i], "text": test_refs[i],
               "hyp": decoded["ctc_beam_lm"][1][i], "aligned": aligned_cal[i],
               "true": (u["word_starts"] or [], u["word_ends"] or []),
               "title": f"test utterance {i} ({u['voice']}, rate {u['rate']}, "
                        f"SNR {u['snr_db'] or 0:.0f} dB), {fw} model"}
    return res, hist, example, stages


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="build/recipe")
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-dev", type=int, default=150)
    p.add_argument("--n-test", type=int, default=300)
    p.add_argument("--ctc-epochs", type=int, default=30, help="epochs of the CTC model")
    p.add_argument("--epochs", type=int, default=10,
                   help="epochs of the transducer model (from the CTC model's encoder)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--max-steps", type=int, default=None, help="cap on training steps")
    p.add_argument("--frameworks", default="torch,jax")
    p.add_argument("--threads", type=int, default=2,
                   help="torch and numba threads per framework")
    p.add_argument("--arch", choices=("gru", "conv"), default="conv",
                   help="encoder: convolutions + bidirectional GRUs, or convolutions only")
    p.add_argument("--conv", type=int, default=256, help="convolution channels")
    p.add_argument("--hidden", type=int, default=128, help="GRU units per direction")
    p.add_argument("--layers", type=int, default=2, help="GRU layers")
    p.add_argument("--dropout", type=float, default=0.1,
                   help="dropout in the convolutional encoder's blocks")
    p.add_argument("--jobs", type=int, default=1,
                   help="frameworks trained at once: 1 (one after the other, each on the 2 "
                   "cores) or 2 (side by side: give --threads 1)")
    p.add_argument("--workers", type=int, default=None, help="corpus processes")
    p.add_argument("--beam-size", type=int, default=50)
    p.add_argument("--rnnt-beam", type=int, default=4)
    p.add_argument("--smoke", action="store_true",
                   help="a few dozen utterances and a few steps (every stage runs)")
    p.add_argument("--no-figure", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-dir", help="a real corpus to train on instead of the synthetic one "
                   "(LibriSpeech layout or name.wav + name.txt; see real_corpus.py)")
    p.add_argument("--dev-dir", help="its dev set (default: 5%% of --train-dir held out)")
    p.add_argument("--test-dir", help="its test set (required with --train-dir)")
    args = p.parse_args(argv)
    if args.smoke:
        args.n_train, args.n_dev, args.n_test = 32, 8, 16
        args.ctc_epochs, args.epochs, args.max_steps, args.batch_size = 1, 1, 2, 16
        args.jobs, args.threads = 2, 1  # the two frameworks side by side
    sizes = dict(conv=args.conv, hidden=args.hidden, layers=args.layers, arch=args.arch,
                 dropout=args.dropout)
    if args.smoke:
        sizes.update(conv=32, hidden=32, pred=32, joint=32)
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    os.environ.setdefault("DUOLOSS_QUIET_COMPILE", "1")

    import common
    import corpus
    import lm
    import report

    if args.smoke:  # one padded shape: one jit compile of the JAX step
        common.PAD_FRAMES, common.PAD_TOKENS = 512, 64
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    progress = _progress(args.quiet)
    stages = {}
    results = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                          f"{platform.processor() or platform.platform()}",
               "args": vars(args), "frameworks": {}, "stages_s": stages}

    t = time.perf_counter()
    if args.train_dir:
        import real_corpus
        from features import FRAME_S
        if not args.test_dir:
            raise SystemExit("run.py: --train-dir needs --test-dir")
        data = {"train": real_corpus.load(args.train_dir), "test": real_corpus.load(args.test_dir),
                "frame_s": FRAME_S}
        if args.dev_dir:
            data["dev"] = real_corpus.load(args.dev_dir)
        else:
            k = max(1, len(data["train"]["utts"]) // 20)
            data["dev"] = {key: v[-k:] for key, v in data["train"].items()}
            data["train"] = {key: v[:-k] for key, v in data["train"].items()}
        words = sorted({w for u in data["train"]["utts"] for w in u["text"].split()})
    else:
        data = corpus.build(out, n_train=args.n_train, n_dev=args.n_dev, n_test=args.n_test,
                            seed=args.seed, workers=args.workers, progress=progress)
        words = corpus.vocabulary()
    stages["corpus"] = time.perf_counter() - t
    hours = {s: sum(u["duration_s"] for u in data[s]["utts"]) / 3600 for s in data
             if s in ("train", "dev", "test")}
    results["corpus"] = {s: {"utterances": len(data[s]["utts"]), "hours": round(h, 3)}
                         for s, h in hours.items()}
    results["corpus"]["vocabulary"] = len(words)
    print(f"corpus: {results['corpus']} ({stages['corpus']:.0f} s)", flush=True)

    t = time.perf_counter()
    train_texts = [u["text"] for u in data["train"]["utts"]]
    arpa, lexicon = out / "lm.arpa", out / "lexicon.txt"
    lm.write_arpa(lm.estimate(train_texts, words, order=3), arpa)
    lm.write_lexicon(words, lexicon)
    stages["lm"] = time.perf_counter() - t

    fws = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for fw in fws:
        if fw not in ("torch", "jax"):
            raise SystemExit(f"run.py: unknown framework {fw!r} (torch, jax)")
    jobs = [(fw, data, args, sizes, lexicon, arpa, i if args.jobs > 1 and len(fws) > 1 else None)
            for i, fw in enumerate(fws)]
    if len(fws) > 1:
        # one process per framework (torch and JAX never share a process); --jobs 1 (the
        # default): one after the other, each with --threads threads; --jobs 2: side by side
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        if args.jobs > 1:
            with ProcessPoolExecutor(min(args.jobs, len(fws)),
                                     mp_context=mp.get_context("fork")) as ex:
                parts = list(ex.map(_run_framework, jobs))
        else:
            parts = []
            for job in jobs:
                with ProcessPoolExecutor(1, mp_context=mp.get_context("fork")) as ex:
                    parts.append(ex.submit(_run_framework, job).result())
    else:
        parts = [_run_framework(job) for job in jobs]
    histories, example = {}, None
    for fw, (res, hist, ex_, st) in zip(fws, parts):
        results["frameworks"][fw] = res
        histories[fw] = hist
        stages.update(st)
        example = example or ex_

    if not args.no_figure and histories:
        t = time.perf_counter()
        report.figure(out / "recipe.png", histories, example, frame_s=data["frame_s"])
        stages["figure"] = time.perf_counter() - t
    md = report.table(results)
    (out / "results.md").write_text(md + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2, default=float))
    print(md)
    print("stages (s): " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}"
          + ("" if args.no_figure else f", {out / 'recipe.png'}"))
    return results


if __name__ == "__main__":
    main()
