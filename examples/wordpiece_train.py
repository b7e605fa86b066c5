"""Learn word pieces by marginalising over every decomposition (PyTorch).

As in the word-piece experiment of Hannun et al. (2020): the target of a
sentence is not one token string but the graph of *all* its decompositions into
pieces of a vocabulary (``duoloss.graphs.wordpiece_graph``), composed with the
CTC topology (``gtn.compose(ctc_topo(C), ...)``) into a frame-level graph.  The
loss sums over every decomposition and every alignment, so the model chooses
which pieces to emit.

Synthetic data: each character of a word lasts 2 frames of a noisy one-hot; a
1-D convolution (it sees several characters) emits piece scores.

Run::

    python examples/wordpiece_train.py --steps 40

Exits non-zero if the loss did not go down.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import duoloss.torch as dt
from duoloss import gtn
from duoloss.graphs import ctc_topo, wordpiece_graph

CHARS = "abcd"
VOCAB = [None, "a", "b", "c", "d", "ab", "cd", "abc", "ba", "dc"]  # entry 0: blank
WORDS = ["abcd", "cab", "dab", "bad", "cd", "dcba"]


def batch(rng, size, topo, noise=0.4):
    feats, graphs = [], []
    for _ in range(size):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), rng.integers(1, 3))]
        rows = [CHARS.index(ch) for w in words for ch in w for _ in range(2)]
        feats.append(np.eye(len(CHARS))[rows] + noise * rng.standard_normal((len(rows), 4)))
        # The piece graph of the sentence (words concatenated), then the frames.
        graphs.append(gtn.compose(topo, wordpiece_graph(["".join(words)], VOCAB)))
    t_max = max(len(f) for f in feats)
    x = np.zeros((size, len(CHARS), t_max), np.float32)
    for b, f in enumerate(feats):
        x[b, :, :len(f)] = f.T
    return torch.from_numpy(x), graphs, np.array([len(f) for f in feats])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    topo = ctc_topo(len(VOCAB))
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 32, 5, padding=2), torch.nn.Tanh(),
                                torch.nn.Conv1d(32, len(VOCAB), 3, padding=1))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        x, graphs, il = batch(rng, 8, topo)
        em = model(x).permute(2, 0, 1).log_softmax(-1)  # (T, N, C)
        loss = dt.graph_loss(em, graphs, il, reduction="mean")
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    print(f"word pieces: mean loss first 5 steps {first:.3f}, last 5 steps {last:.3f} "
          f"({time.perf_counter() - t0:.1f} s)")
    if not last < 0.7 * first:
        raise SystemExit("the loss did not go down")


if __name__ == "__main__":
    main()
