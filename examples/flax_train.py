"""Train a small CTC model with duoloss on synthetic data (Flax NNX + optax), data parallel.

The batch is split over every available device (``jax.devices()``) and the
step runs under ``jax.shard_map``: each device computes the loss of its own
shard (one host callback per device, in parallel) and the gradients of the
replicated parameters are summed over the devices -- JAX inserts the ``psum``
because duoloss marks its outputs as varying over the mesh axis (no
``check_vma=False`` needed).  Try it on 4 host CPU devices::

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python examples/flax_train.py

(Plain ``jit`` on a sharded batch also gives the right numbers, but XLA gathers
the batch to one device for the host callback; ``shard_map`` keeps it local.)

The loss is :func:`duoloss.jax.optax_ctc_loss`, a drop-in for
``optax.ctc_loss`` (same arguments, exact log-space numbers).  Exits non-zero
if the loss did not go down.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import duoloss.jax as dj

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import synthetic_batch as _torch_batch  # noqa: E402  (numpy inside)


def synthetic_batch(rng, batch, n_cls, t_max=32, s_max=6):
    """optax layout: ``(B, T, F)`` features, ``(B, T)`` frame paddings, ``(B, S)`` labels and
    label paddings; padded to fixed ``(t_max, s_max)`` so the step compiles once."""
    x, tg, il, tl = (a.numpy() for a in _torch_batch(rng, batch, n_cls, max_len=s_max))
    feats = np.zeros((batch, t_max, n_cls), np.float32)
    feats[:, :x.shape[0]] = x.transpose(1, 0, 2)[:, :t_max]
    pads = (np.arange(t_max)[None, :] >= il[:, None]).astype(np.float32)
    lpads = (np.arange(s_max)[None, :] >= tl[:, None]).astype(np.float32)
    return feats, pads, tg.astype(np.int32), lpads


class Model(nnx.Module):
    def __init__(self, n_feat, n_cls, hidden=32, *, rngs):
        self.conv1 = nnx.Conv(n_feat, hidden, kernel_size=(3,), rngs=rngs)
        self.conv2 = nnx.Conv(hidden, hidden, kernel_size=(5,), rngs=rngs)
        self.out = nnx.Linear(hidden, n_cls, rngs=rngs)

    def __call__(self, x):  # (B, T, F) -> (B, T, C) logits
        h = jax.nn.relu(self.conv1(x))
        h = jax.nn.relu(self.conv2(h))
        return self.out(h)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch", type=int, default=16, help="global batch (split over devices)")
    p.add_argument("--classes", type=int, default=6, help="including the blank (0)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    devices = jax.devices()
    if args.batch % len(devices):
        raise SystemExit(f"--batch {args.batch} must be a multiple of {len(devices)} devices")
    mesh = jax.make_mesh((len(devices),), ("data",), axis_types=(AxisType.Auto,))
    data_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    model = Model(args.classes, args.classes, rngs=nnx.Rngs(args.seed))
    graphdef, params = nnx.split(model)
    params = jax.device_put(params, replicated)
    tx = optax.adam(args.lr)
    opt_state = tx.init(params)

    def local_loss(params, feats, pads, labels, lpads):
        """Sum of the losses of this device's shard."""
        logits = nnx.merge(graphdef, params)(feats)
        return dj.optax_ctc_loss(logits, pads, labels, lpads).sum()

    def shard_step(params, *batch):
        loss, grads = jax.value_and_grad(local_loss)(params, *batch)
        # the parameters are replicated: their gradient arrives summed over the shards
        scale = 1.0 / args.batch
        return jax.lax.psum(loss, "data") * scale, jax.tree.map(lambda g: g * scale, grads)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.shard_map(shard_step, mesh=mesh, in_specs=(P(),) + (P("data"),) * 4,
                                    out_specs=(P(), P()))(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(args.seed)
    losses = []
    start = time.perf_counter()
    for i in range(args.steps):
        batch = jax.device_put(synthetic_batch(rng, args.batch, args.classes), data_sharding)
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
        if i % 10 == 0 or i == args.steps - 1:
            print(f"step {i:4d}  loss {losses[-1]:.4f}")
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    print(f"mean loss first 5 steps {first:.4f} -> last 5 steps {last:.4f} "
          f"({time.perf_counter() - start:.1f} s, {len(devices)} device(s))")
    if not last < 0.7 * first:
        raise SystemExit("the loss did not go down")


if __name__ == "__main__":
    main()
