"""A word n-gram LM estimated from the training texts, written as an ARPA file, and a lexicon.

Estimation is the textbook back-off model with absolute discounting (Ney, Essen & Kneser
1994): for an n-gram ``h w`` seen ``c(h w)`` times,

    p(w | h) = (c(h w) - D) / c(h)                         (seen)
    p(w | h) = alpha(h) * p(w | h')                        (unseen; h' drops h's first word)

with ``alpha(h)`` chosen so that ``p(. | h)`` sums to one over the vocabulary; unigrams
interpolate with the uniform distribution over the grammar's whole vocabulary (so that a
word absent from the training texts still has a probability).  The ARPA file stores
``log10 p`` of every seen n-gram and ``log10 alpha`` as the back-off weight of its context,
which is exactly what an ARPA reader computes back.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from pathlib import Path

BOS, EOS, UNK = "<s>", "</s>", "<unk>"


def estimate(sentences, vocabulary, order=3, discount=0.5):
    """``{n: {ngram tuple: (log10 p, log10 backoff or None)}}`` for ``n = 1..order``."""
    counts = [Counter() for _ in range(order + 1)]
    for s in sentences:
        words = [BOS, *s.split(), EOS]
        for n in range(1, order + 1):
            for i in range(max(0, 1 if n == 1 else 0), len(words) - n + 1):
                counts[n][tuple(words[i: i + n])] += 1
    vocab = sorted(set(vocabulary) | {w for (w,) in counts[1]} - {BOS}) + [UNK]
    # unigrams: absolute discounting interpolated with the uniform distribution
    total = sum(c for (w,), c in counts[1].items() if w != BOS)
    seen = sum(1 for (w,) in counts[1] if w != BOS)
    uniform = discount * seen / total / len(vocab)
    prob = {1: {}}
    for w in vocab:
        c = counts[1].get((w,), 0)
        prob[1][(w,)] = max(c - discount, 0.0) / total + uniform

    def p(ngram):
        """The back-off probability of the last word of ``ngram`` given the others."""
        n = len(ngram)
        if n == 1:
            return prob[1].get(ngram, prob[1][(UNK,)])
        if ngram in prob[n]:
            return prob[n][ngram]
        return alpha.get(ngram[:-1], 1.0) * p(ngram[1:])

    alpha = {}
    for n in range(2, order + 1):
        prob[n] = {}
        followers = defaultdict(list)
        for g, c in counts[n].items():
            followers[g[:-1]].append((g[-1], c))
        for h, fs in followers.items():
            ch = sum(c for _, c in fs)
            for w, c in fs:
                prob[n][h + (w,)] = (c - discount) / ch
        for h, fs in followers.items():
            left = discount * len(fs) / sum(c for _, c in fs)
            lower = sum(p(h[1:] + (w,)) for w, _ in fs)
            alpha[h] = left / max(1e-12, 1.0 - lower)
    table = {}
    for n in range(1, order + 1):
        table[n] = {}
        for g, pr in prob[n].items():
            bo = alpha.get(g) if n < order else None
            table[n][g] = (math.log10(pr), None if bo is None else math.log10(bo))
    # <s> is a context only: ARPA gives it log10 p = -99 and its back-off weight
    table[1][(BOS,)] = (-99.0, math.log10(alpha.get((BOS,), 1.0)))
    return table


def write_arpa(table, path):
    """Write an :func:`estimate` table as an ARPA file (tab-separated fields)."""
    lines = ["", "\\data\\"]
    for n in sorted(table):
        lines.append(f"ngram {n}={len(table[n])}")
    for n in sorted(table):
        lines += ["", f"\\{n}-grams:"]
        for g in sorted(table[n]):
            lp, bo = table[n][g]
            row = f"{lp:.6f}\t{' '.join(g)}"
            if bo is not None:
                row += f"\t{bo:.6f}"
            lines.append(row)
    lines += ["", "\\end\\", ""]
    Path(path).write_text("\n".join(lines))


def write_lexicon(words, path):
    """One line per word: ``word w o r d |`` (the spelling ends with the word separator)."""
    Path(path).write_text("".join(f"{w} {' '.join(w)} |\n" for w in words))
