"""Demo: train the same tiny CTC model in PyTorch and in JAX, side by side.

    python -m duoloss [--steps 30] [--batch 16]

Built-in synthetic data: frame features are noisy embeddings of a hidden
frame-level labelling (blank, tokens repeated over several frames).  A linear
model (features -> classes) is trained with plain SGD from the *same* initial
weights in both frameworks, with ``duoloss.torch.ctc_loss`` and
``duoloss.jax.ctc_loss``.  The per-step losses agree to float32 rounding.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def make_data(rng, batch, t_max, n_cls, s_max, dim):
    """Synthetic (features (T, N, D), padded targets, input lengths, target lengths)."""
    embed = rng.normal(size=(n_cls, dim))
    feats = np.zeros((t_max, batch, dim))
    targets = np.zeros((batch, s_max), np.int64)
    il = np.zeros(batch, np.int64)
    tl = rng.integers(s_max // 2, s_max + 1, size=batch)
    for b in range(batch):
        labels = rng.integers(1, n_cls, size=tl[b])
        targets[b, : tl[b]] = labels
        frames = []
        for y in labels:
            frames += [0] * int(rng.integers(0, 2)) + [int(y)] * int(rng.integers(1, 3))
        frames += [0] * int(rng.integers(1, 3))
        frames = frames[:t_max]
        il[b] = len(frames)
        feats[: il[b], b] = embed[frames] + 0.5 * rng.normal(size=(il[b], dim))
    return feats.astype(np.float32), targets, il, tl


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import torch

    import duoloss.jax as dj
    import duoloss.torch as dt

    rng = np.random.default_rng(args.seed)
    n_cls, dim, s_max = 8, 16, 6
    t_max = 4 * s_max + 3
    feats, targets, il, tl = make_data(rng, args.batch, t_max, n_cls, s_max, dim)
    w0 = (0.1 * rng.normal(size=(dim, n_cls))).astype(np.float32)
    b0 = np.zeros(n_cls, np.float32)

    # --- PyTorch ---------------------------------------------------------------
    w_t = torch.tensor(w0, requires_grad=True)
    b_t = torch.tensor(b0, requires_grad=True)
    x_t = torch.from_numpy(feats)
    opt = torch.optim.SGD([w_t, b_t], lr=args.lr)
    tg_t, il_t, tl_t = (torch.from_numpy(a) for a in (targets, il, tl))

    # --- JAX -------------------------------------------------------------------
    def jax_loss(params, x):
        w, b = params
        logp = jax.nn.log_softmax(x @ w + b, axis=-1)
        return dj.ctc_loss(logp, targets, il, tl)

    @jax.jit
    def jax_step(params, x):
        loss, grads = jax.value_and_grad(jax_loss)(params, x)
        return loss, jax.tree_util.tree_map(lambda p, g: p - args.lr * g, params, grads)

    params = (jnp.asarray(w0), jnp.asarray(b0))
    x_j = jnp.asarray(feats)

    print(f"duoloss demo: linear CTC model, batch {args.batch}, T={t_max}, C={n_cls}, "
          f"{args.steps} SGD steps from identical weights")
    print(f"{'step':>4} {'torch loss':>12} {'jax loss':>12} {'|diff|':>10}")
    t0 = time.perf_counter()
    worst = 0.0
    for step in range(args.steps):
        opt.zero_grad()
        logp = torch.log_softmax(x_t @ w_t + b_t, dim=-1)
        loss_t = dt.ctc_loss(logp, tg_t, il_t, tl_t)
        loss_t.backward()
        opt.step()
        loss_j, params = jax_step(params, x_j)
        lt, lj = loss_t.item(), float(loss_j)
        worst = max(worst, abs(lt - lj))
        if step < 5 or step % 5 == 4 or step == args.steps - 1:
            print(f"{step:>4} {lt:>12.6f} {lj:>12.6f} {abs(lt - lj):>10.2e}")
    print(f"largest |torch - jax| over {args.steps} steps: {worst:.2e} "
          f"(float32 matmuls differ between frameworks; the loss core is shared); "
          f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
