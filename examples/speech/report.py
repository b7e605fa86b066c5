"""The recipe's figure and its results table (markdown)."""
from __future__ import annotations

import numpy as np

from common import BLANK, SUBSAMPLE, TOKENS


def _smooth(x, k=10):
    x = np.asarray(x, float)
    if len(x) < k:
        return x
    return np.convolve(x, np.ones(k) / k, mode="valid")


def figure(path, histories, example, *, frame_s):
    """Write the PNG: loss curves of both frameworks, and one test utterance.

    Args:
        path: the PNG to write.
        histories: ``{framework: {"ctc": [...], "rnnt": [...]}}``.
        example: ``{"feats": (T, F), "log_probs": (T', V), "text", "hyp", "aligned": (starts,
            ends), "true": (starts, ends), "title"}`` (times in seconds).
        frame_s: seconds per feature frame.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(12, 9), constrained_layout=True)
    gs = fig.add_gridspec(3, 2, height_ratios=[1.1, 1, 1])
    ax = fig.add_subplot(gs[0, :])
    colors = {"torch": "tab:red", "jax": "tab:blue"}
    for fw, h in histories.items():
        k = h["phase_steps"]  # the CTC model's steps, then the transducer model's
        ctc = _smooth(h["ctc"][:k])
        ax.plot(np.arange(len(ctc)), ctc, color=colors.get(fw), label=f"{fw} CTC model: CTC")
        rnnt = _smooth(h["rnnt"][k:])
        ax.plot(k + np.arange(len(rnnt)), rnnt, color=colors.get(fw), ls="--",
                label=f"{fw} transducer model: RNN-T")
        ax.axvline(k, color="0.6", lw=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("step (the CTC model's, then the transducer model's from its encoder)")
    ax.set_ylabel("loss per token (10-step mean)")
    ax.set_title("training loss: duoloss ctc_loss, then rnnt_loss (+ ctc_loss), torch and JAX")
    ax.legend(ncol=4)

    feats, lp = example["feats"], example["log_probs"]
    dur = len(feats) * frame_s
    ax1 = fig.add_subplot(gs[1, :])
    ax1.imshow(feats.T, origin="lower", aspect="auto", extent=[0, dur, 0, feats.shape[1]],
               cmap="magma")
    ax1.set_ylabel("log-mel band")
    ax1.set_title(f"{example['title']}\nref: {example['text']}\nhyp: {example['hyp']}",
                  fontsize=9)
    for s in example["true"][0]:
        if s is not None:
            ax1.axvline(s, color="cyan", lw=1.2)
    for s, e in zip(*example["aligned"]):
        ax1.axvline(s, color="lime", lw=1.2, ls="--")
    ax1.plot([], [], color="cyan", label="eSpeak NG word start")
    ax1.plot([], [], color="lime", ls="--", label="ctc_align word start (dev latency taken off)")
    ax1.legend(loc="upper right", fontsize=8)

    ax2 = fig.add_subplot(gs[2, :], sharex=ax1)
    t = np.arange(len(lp)) * SUBSAMPLE * frame_s
    probs = np.exp(lp)
    ax2.plot(t, probs[:, BLANK], color="0.7", lw=1, label="blank")
    best = probs[:, 1:].argmax(1) + 1
    for k in range(1, lp.shape[1]):
        if probs[:, k].max() > 0.3:
            ax2.plot(t, probs[:, k], lw=1)
    for i in range(len(t)):
        if best[i] != BLANK and probs[i, best[i]] > 0.5 and (i == 0 or best[i - 1] != best[i]):
            ax2.text(t[i], probs[i, best[i]] + 0.02, TOKENS[best[i]], fontsize=8, ha="center")
    starts, ends = example["aligned"]
    words = example["text"].split()
    for w, s, e in zip(words, starts, ends):
        ax2.annotate("", xy=(s, -0.08), xytext=(e, -0.08),
                     arrowprops=dict(arrowstyle="<->", color="green", lw=0.8))
        ax2.text((s + e) / 2, -0.2, w, ha="center", fontsize=8, color="green")
    for s, e, w in zip(example["true"][0], example["true"][1], words):
        if s is not None and e is not None:
            ax2.annotate("", xy=(s, -0.32), xytext=(e, -0.32),
                         arrowprops=dict(arrowstyle="<->", color="tab:cyan", lw=0.8))
    ax2.set_ylim(-0.4, 1.12)
    ax2.set_xlabel("time (s)")
    ax2.set_ylabel("CTC posterior")
    ax2.set_title("CTC posteriors (torch model); aligned words (green) vs eSpeak NG's "
                  "(cyan)", fontsize=9)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(results):
    """A markdown table of the WERs and alignment errors."""
    rows = ["| framework | model | decoder | test WER % |", "| --- | --- | --- | --- |"]
    names = {"ctc_greedy": ("CTC", "greedy (`ctc_greedy_decode`)"),
             "ctc_beam_lm": ("CTC", "beam 50 + lexicon + 3-gram LM (`ctc_decoder`)"),
             "rnnt_greedy": ("transducer", "greedy (`rnnt_greedy_decode`)"),
             "rnnt_beam": ("transducer", "beam 4 (`rnnt_beam_search`)")}
    for fw, r in results["frameworks"].items():
        for k, (model, dec) in names.items():
            rows.append(f"| {fw} | {model} | {dec} | {r['wer'][k]:.2f} |")
    rows += ["", "| framework | model | steps | training wall (min) | training CPU (min, all "
             "threads) |", "| --- | --- | --- | --- | --- |"]
    for fw, r in results["frameworks"].items():
        k = r["train_steps_ctc"]
        rows.append(f"| {fw} | CTC | {k} | {r['train_s_ctc'] / 60:.1f} | "
                    f"{r['train_cpu_s_ctc'] / 60:.1f} |")
        rows.append(f"| {fw} | transducer (from the CTC encoder) | {r['train_steps'] - k} | "
                    f"{r['train_s_transducer'] / 60:.1f} | "
                    f"{r['train_cpu_s_transducer'] / 60:.1f} |")
    rows += ["", "| framework | boundaries | latency | median error (ms) | within 100 ms | "
             "starts: median (ms) | ends: median (ms) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for fw, r in results["frameworks"].items():
        for label, key in (("raw", "alignment"), ("dev latency taken off", "alignment_calibrated")):
            a = r.get(key)
            if not a or not a["boundaries"]:
                continue
            if key == "alignment_calibrated":
                ds, de = a["dev_latency_ms"]
                label = f"{label} ({ds:.0f} / {de:.0f} ms)"
            rows.append(f"| {fw} | {a['boundaries']} | {label} | {a['median_ms']:.1f} | "
                        f"{100 * a['within_100ms']:.1f}% | {a['start_median_ms']:.1f} | "
                        f"{a['end_median_ms']:.1f} |")
    return "\n".join(rows)
