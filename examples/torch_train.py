"""Train a small CTC model with duoloss on synthetic data (PyTorch).

Each sequence spells a random label string; every label occupies a few frames
whose features are a noisy one-hot of the label, with silent frames between
labels.  A 1-D convolution and a GRU learn to emit the labels; the loss is
:func:`duoloss.torch.ctc_loss` (a drop-in for ``torch.nn.functional.ctc_loss``).

Run::

    python examples/torch_train.py --steps 60
    python examples/torch_train.py --compile   # torch.compile the model

Exits non-zero if the loss did not go down.  Uses CUDA when available (the loss
then makes one host round trip per call).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import duoloss.torch as dt


def synthetic_batch(rng, batch, n_cls, max_len=6, frames=(2, 4), feat_noise=0.3):
    """Padded ``(T, N, F)`` features, ``(N, S)`` targets and the two length vectors."""
    seqs, feats = [], []
    for _ in range(batch):
        labels = rng.integers(1, n_cls, rng.integers(2, max_len + 1))
        rows = []
        for lab in labels:
            rows += [0] * int(rng.integers(0, 2)) + [int(lab)] * int(rng.integers(*frames))
        rows += [0] * int(rng.integers(0, 2))
        f = np.eye(n_cls)[rows]
        f[:, 0] = 0.0  # silence has no feature
        feats.append(f + feat_noise * rng.standard_normal(f.shape))
        seqs.append(labels)
    t = max(len(f) for f in feats)
    x = np.zeros((t, batch, n_cls), np.float32)
    for b, f in enumerate(feats):
        x[:len(f), b] = f
    targets = np.zeros((batch, max_len), np.int64)
    for b, s in enumerate(seqs):
        targets[b, :len(s)] = s
    return (torch.from_numpy(x), torch.from_numpy(targets),
            torch.tensor([len(f) for f in feats]), torch.tensor([len(s) for s in seqs]))


class Model(torch.nn.Module):
    def __init__(self, n_feat, n_cls, hidden=32):
        super().__init__()
        self.conv = torch.nn.Conv1d(n_feat, hidden, 3, padding=1)
        self.rnn = torch.nn.GRU(hidden, hidden)
        self.out = torch.nn.Linear(hidden, n_cls)

    def forward(self, x):  # (T, N, F) -> (T, N, C) log-probabilities
        h = torch.relu(self.conv(x.permute(1, 2, 0))).permute(2, 0, 1)
        h, _ = self.rnn(h)
        return self.out(h).log_softmax(-1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--classes", type=int, default=6, help="including the blank (0)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Model(args.classes, args.classes).to(device)
    forward = torch.compile(model) if args.compile else model
    criterion = dt.CTCLoss(reduction="mean", zero_infinity=True)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        x, tg, il, tl = synthetic_batch(rng, args.batch, args.classes)
        loss = criterion(forward(x.to(device)), tg.to(device), il, tl)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {losses[-1]:.4f}")
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    print(f"mean loss first 5 steps {first:.4f} -> last 5 steps {last:.4f} "
          f"({time.perf_counter() - start:.1f} s, {device})")
    if not last < 0.7 * first:
        raise SystemExit("the loss did not go down")


if __name__ == "__main__":
    main()
