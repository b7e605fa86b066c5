"""Train a small LF-MMI model with duoloss on synthetic data (PyTorch and JAX).

Each sequence spells a random token string drawn from a bigram "language"; each
token occupies a few frames of noisy one-hot features, with blank frames around.
The loss is lattice-free MMI:

    loss_b = -log Z(num_b o E_b) + log Z(den o E_b)

with the numerator the CTC graph of the target (``duoloss.graphs.ctc_graph``)
and one shared denominator, the CTC topology composed with a back-off token
bigram estimated from the training targets
(``gtn.compose(ctc_topo(C), token_ngram_graph(targets, C))``, with epsilon
back-off arcs).  The denominator is packed once and reused by every step; the
model is a two-layer per-frame MLP (its raw scores are the emissions: the
denominator normalises them, no log-softmax needed).  The numerator carries no
language-model weights, so the loss can go below zero.

Run::

    python examples/mmi_train.py --steps 40              # both frameworks
    python examples/mmi_train.py --framework jax

Exits non-zero if the loss did not go down.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from duoloss import gtn
from duoloss.core.losses.graph_loss import pack_graphs
from duoloss.graphs import ctc_graph, ctc_topo, token_ngram_graph

N_CLS = 6  # blank + 5 tokens
T_PAD = 24  # >= the longest synthetic sequence (5 tokens * 4 frames + 2)


def token_string(rng, max_len=5):
    """A random string from a fixed bigram: token k is often followed by k + 1."""
    out = [int(rng.integers(1, N_CLS))]
    for _ in range(int(rng.integers(1, max_len))):
        nxt = out[-1] % (N_CLS - 1) + 1 if rng.random() < 0.7 else int(rng.integers(1, N_CLS))
        out.append(nxt)
    return out


def batch(rng, size, noise=0.5):
    targets = [token_string(rng) for _ in range(size)]
    feats = []
    for t in targets:
        rows = []
        for k in t:
            rows += [0] * int(rng.integers(0, 2)) + [k] * int(rng.integers(2, 4))
        rows += [0] * int(rng.integers(0, 2))
        feats.append(np.eye(N_CLS)[rows] + noise * rng.standard_normal((len(rows), N_CLS)))
    t_max = max(len(f) for f in feats)
    x = np.zeros((t_max, size, N_CLS), np.float32)
    for b, f in enumerate(feats):
        x[:len(f), b] = f
    return x, targets, np.array([len(f) for f in feats])


def denominator(rng):
    lm = token_ngram_graph([token_string(rng) for _ in range(200)], N_CLS, order=2)
    return pack_graphs([gtn.compose(ctc_topo(N_CLS), lm)])


def train_torch(steps, seed):
    import torch

    import duoloss.torch as dt

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    den = denominator(rng)
    model = torch.nn.Sequential(torch.nn.Linear(N_CLS, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, N_CLS))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(steps):
        x, targets, il = batch(rng, 8)
        em = model(torch.from_numpy(x))
        loss = dt.graph_loss(em, ctc_graph(targets), il, denominator=den, reduction="mean",
                             target_lengths=[len(t) for t in targets])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_jax(steps, seed):
    import jax
    import jax.numpy as jnp
    import optax

    import duoloss.jax as dj

    rng = np.random.default_rng(seed)
    den = denominator(rng)
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {"w1": jax.random.normal(k1, (N_CLS, 32)) * 0.4, "b1": jnp.zeros(32),
              "w2": jax.random.normal(k2, (32, N_CLS)) * 0.2, "b2": jnp.zeros(N_CLS)}
    opt = optax.adam(0.02)
    state = opt.init(params)

    def loss_fn(p, x, graphs, il, tl):
        em = jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
        return dj.graph_loss(em, graphs, il, denominator=den, reduction="mean",
                             target_lengths=tl)

    # Static shapes (frames padded to T_PAD, graphs to fixed totals): one trace.
    step = jax.jit(jax.value_and_grad(loss_fn))
    losses = []
    for _ in range(steps):
        x, targets, il = batch(rng, 8)
        x = np.pad(x, ((0, T_PAD - x.shape[0]), (0, 0), (0, 0)))
        graphs = pack_graphs(ctc_graph(targets), num_nodes=8 * 11, num_arcs=8 * 32)
        loss, g = step(params, jnp.asarray(x), graphs, il, np.array([len(t) for t in targets]))
        upd, state = opt.update(g, state)
        params = optax.apply_updates(params, upd)
        losses.append(float(loss))
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--framework", choices=["torch", "jax", "both"], default="both")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ok = True
    for fw in (["torch", "jax"] if args.framework == "both" else [args.framework]):
        t0 = time.perf_counter()
        losses = (train_torch if fw == "torch" else train_jax)(args.steps, args.seed)
        first, last = np.mean(losses[:5]), np.mean(losses[-5:])
        print(f"{fw}: LF-MMI mean loss first 5 steps {first:.3f}, last 5 steps {last:.3f} "
              f"({time.perf_counter() - t0:.1f} s)")
        ok &= bool(last < first - 0.5)
    if not ok:
        raise SystemExit("the LF-MMI loss did not go down")


if __name__ == "__main__":
    main()
