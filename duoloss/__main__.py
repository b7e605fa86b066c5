"""``python -m duoloss``: the demo (default) and the kernel warm-up.

    python -m duoloss [demo] [--steps 30] [--batch 16] [--plot duoloss-demo.png | --no-plot]
    python -m duoloss warmup [--families ctc,rnnt,...] [--quiet]

**demo** -- train the same tiny CTC model in PyTorch and in JAX, side by side.
Built-in synthetic data: frame features are noisy embeddings of a hidden
frame-level labelling (blank, tokens repeated over several frames).  A linear
model (features -> classes) is trained with plain SGD from the *same* initial
weights in every installed framework, with ``duoloss.torch.ctc_loss`` and
``duoloss.jax.ctc_loss``; with both installed the per-step losses agree to
float32 rounding.  Either framework alone is enough: the demo runs what is
installed.

With matplotlib installed (``pip install "duoloss[plot]"``) it also writes a PNG:
the loss curves of both frameworks, and for one utterance the model's frame
posteriors next to the CTC posterior (the occupancy of each class at each frame
under all alignments of the target: minus duoloss's gradient w.r.t. the
log-probabilities) with the best alignment (``ctc_align``) drawn over it.

**warmup** -- compile and cache the numba kernels now (``duoloss.warmup``), e.g.
``RUN python -m duoloss warmup`` in a Dockerfile, so that later processes' first
calls load them from the cache instead of compiling.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time

import numpy as np

N_CLS, DIM, S_MAX = 8, 16, 6


def make_data(rng, batch, t_max, n_cls, s_max, dim):
    """Synthetic (features (T, N, D), padded targets, input lengths, target lengths, frame labels)."""
    embed = rng.normal(size=(n_cls, dim))
    feats = np.zeros((t_max, batch, dim))
    targets = np.zeros((batch, s_max), np.int64)
    frame_labels = np.full((batch, t_max), -1, np.int64)
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
        frame_labels[b, : il[b]] = frames
        feats[: il[b], b] = embed[frames] + 0.5 * rng.normal(size=(il[b], dim))
    return feats.astype(np.float32), targets, il, tl, frame_labels


def _available(name: str) -> bool:
    """Whether ``name`` imports (a missing or a blocked package both count as absent)."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


class _TorchRun:
    name = "torch"

    def __init__(self, w0, b0, feats, targets, il, tl, lr):
        import torch

        import duoloss.torch as dt

        self.torch, self.dt = torch, dt
        self.w = torch.tensor(w0, requires_grad=True)
        self.b = torch.tensor(b0, requires_grad=True)
        self.x = torch.from_numpy(feats)
        self.opt = torch.optim.SGD([self.w, self.b], lr=lr)
        self.args = tuple(torch.from_numpy(a) for a in (targets, il, tl))

    def step(self) -> float:
        self.opt.zero_grad()
        logp = self.torch.log_softmax(self.x @ self.w + self.b, dim=-1)
        loss = self.dt.ctc_loss(logp, *self.args)
        loss.backward()
        self.opt.step()
        return loss.item()

    def posteriors(self, b: int):
        """(frame posteriors (T, C), CTC posterior (T, C), best-path labels (T,)) of sequence b."""
        torch = self.torch
        with torch.no_grad():
            logp = torch.log_softmax(self.x[:, b:b + 1] @ self.w + self.b, dim=-1)
        logp.requires_grad_(True)
        tg, il, tl = (a[b:b + 1] for a in self.args)
        self.dt.ctc_loss(logp, tg, il, tl, reduction="sum").backward()
        labels, _ = self.dt.ctc_align(logp.detach(), tg, il, tl)
        return (logp.detach()[:, 0].exp().numpy(), -logp.grad[:, 0].numpy(), labels[0].numpy())


class _JaxRun:
    name = "jax"

    def __init__(self, w0, b0, feats, targets, il, tl, lr):
        import jax
        import jax.numpy as jnp

        import duoloss.jax as dj

        self.jax, self.dj = jax, dj
        self.data = (targets, il, tl)

        def loss_fn(params, x, tg, il_, tl_, reduction="mean"):
            w, b = params
            logp = jax.nn.log_softmax(x @ w + b, axis=-1)
            return dj.ctc_loss(logp, tg, il_, tl_, reduction=reduction)

        @jax.jit
        def step(params, x):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, *self.data)
            return loss, jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)

        self._step = step
        self.params = (jnp.asarray(w0), jnp.asarray(b0))
        self.x = jnp.asarray(feats)

    def step(self) -> float:
        loss, self.params = self._step(self.params, self.x)
        return float(loss)

    def posteriors(self, b: int):
        jax, dj = self.jax, self.dj
        w, bias = self.params
        logp = jax.nn.log_softmax(self.x[:, b:b + 1] @ w + bias, axis=-1)
        tg, il, tl = (a[b:b + 1] for a in self.data)
        grad = jax.grad(lambda lp: dj.ctc_loss(lp, tg, il, tl, reduction="sum"))(logp)
        labels, _ = dj.ctc_align(logp, tg, il, tl)
        return (np.exp(np.asarray(logp[:, 0])), -np.asarray(grad[:, 0]), np.asarray(labels[0]))


def plot(path, curves, post, truth, target):
    """Write the demo figure; returns False (and says why) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no figure (pip install 'duoloss[plot]')")
        return False
    frame_post, ctc_post, best = post
    t_b = int((truth >= 0).sum())
    fig = plt.figure(figsize=(13, 4.6), layout="constrained")
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 1.6])
    ax = fig.add_subplot(grid[:, 0])
    styles = {"torch": dict(color="tab:red", lw=2.5), "jax": dict(color="tab:blue", lw=1.2, ls="--")}
    for name, losses in curves.items():
        ax.plot(np.arange(1, len(losses) + 1), losses, label=f"duoloss.{name}.ctc_loss",
                **styles[name])
    ax.set(xlabel="SGD step", ylabel="CTC loss (mean over the batch)",
           title="Training the same model in " + " and ".join(curves))
    ax.grid(alpha=0.3)
    ax.legend()
    frames = np.arange(t_b)
    for row, (img, title) in enumerate([
            (frame_post[:t_b].T, "model output p_t(k) after training"),
            (ctc_post[:t_b].T, "CTC posterior of the target (−∂loss/∂log p) and best alignment")]):
        ax = fig.add_subplot(grid[row, 1])
        im = ax.imshow(img, aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=1,
                       interpolation="nearest")
        ax.set(ylabel="class (0 = blank)", yticks=range(img.shape[0]), title=title)
        if row == 0:
            ax.plot(frames, truth[:t_b], "x", color="cyan", ms=6,
                    label="hidden frame labels of the data")
        else:
            ax.plot(frames, best[:t_b], "o", mfc="none", mec="cyan", ms=7,
                    label="ctc_align best path")
            ax.set_xlabel(f"frame t (target {' '.join(map(str, target))})")
        ax.legend(loc="upper right", fontsize=8, framealpha=0.8)
        fig.colorbar(im, ax=ax, pad=0.01)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


_PROG = "python -m duoloss"
_COMMANDS = ("demo", "warmup")


def _plain(text):
    """The module docstring as terminal text (no Markdown/reST markup)."""
    return text.replace("**", "").replace("``", "")


def _parser():
    p = argparse.ArgumentParser(prog=_PROG, description=_plain(__doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="{demo,warmup}",
                           help="demo (the default when no command is given) or warmup")
    d = sub.add_parser("demo", help="train a tiny CTC model in every installed framework",
                       description="Train the same tiny CTC model in PyTorch and JAX.")
    d.add_argument("--steps", type=int, default=30)
    d.add_argument("--batch", type=int, default=16)
    d.add_argument("--lr", type=float, default=0.5)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--plot", default="duoloss-demo.png", help="where to write the figure")
    d.add_argument("--no-plot", action="store_true", help="do not write the figure")
    from ._warmup import FAMILIES

    w = sub.add_parser("warmup", help="compile and cache the kernels ahead of time",
                       description="Compile and cache duoloss's numba kernels (duoloss.warmup), "
                       "one line per family on stderr.")
    w.add_argument("--families", default=None,
                   help=f"comma-separated, from {','.join(FAMILIES)} (default: all)")
    w.add_argument("--jobs", type=int, default=None,
                   help="families compiled at once, each in a worker process (default: "
                   "the number of CPUs; 1: in this process)")
    w.add_argument("--quiet", action="store_true", help="print nothing")
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _COMMANDS + ("-h", "--help"):
        argv.insert(0, "demo")  # ``python -m duoloss [--steps N ...]``: the demo, as before
    args = _parser().parse_args(argv)
    if args.command == "warmup":
        from ._warmup import warmup

        try:
            warmup(args.families, verbose=not args.quiet, jobs=args.jobs)
        except ValueError as exc:
            print(f"{_PROG}: {exc}", file=sys.stderr)
            return 2
        return 0
    return _demo(args)


def _demo(args):
    runners = [r for r, mod in ((_TorchRun, "torch"), (_JaxRun, "jax")) if _available(mod)]
    if not runners:
        print("python -m duoloss needs PyTorch or JAX: pip install 'duoloss[torch]' or "
              "'duoloss[jax]'", file=sys.stderr)
        return 2

    rng = np.random.default_rng(args.seed)
    t_max = 4 * S_MAX + 3
    feats, targets, il, tl, frame_labels = make_data(rng, args.batch, t_max, N_CLS, S_MAX, DIM)
    w0 = (0.1 * rng.normal(size=(DIM, N_CLS))).astype(np.float32)
    b0 = np.zeros(N_CLS, np.float32)
    runs = [r(w0, b0, feats, targets, il, tl, args.lr) for r in runners]
    names = [r.name for r in runs]
    missing = {"torch", "jax"} - set(names)

    print(f"duoloss demo: linear CTC model, batch {args.batch}, T={t_max}, C={N_CLS}, "
          f"{args.steps} SGD steps from identical weights in {' and '.join(names)}"
          + (f" ({missing.pop()} is not installed)" if missing else ""))
    header = f"{'step':>4}" + "".join(f" {n + ' loss':>12}" for n in names)
    print(header + (f" {'|diff|':>10}" if len(runs) == 2 else ""))
    t0 = time.perf_counter()
    curves = {n: [] for n in names}
    worst = 0.0
    for step in range(args.steps):
        losses = [r.step() for r in runs]
        for n, v in zip(names, losses):
            curves[n].append(v)
        diff = abs(losses[0] - losses[-1])
        worst = max(worst, diff)
        if step < 5 or step % 5 == 4 or step == args.steps - 1:
            row = f"{step:>4}" + "".join(f" {v:>12.6f}" for v in losses)
            print(row + (f" {diff:>10.2e}" if len(runs) == 2 else ""))
    if len(runs) == 2:
        print(f"largest |torch - jax| over {args.steps} steps: {worst:.2e} "
              f"(float32 matmuls differ between frameworks; the loss core is shared); "
              f"{time.perf_counter() - t0:.1f} s")
    else:
        print(f"{args.steps} steps in {time.perf_counter() - t0:.1f} s")

    if not args.no_plot and args.steps > 0:
        b = 0
        post = runs[0].posteriors(b)
        if plot(args.plot, curves, post, frame_labels[b], targets[b, : tl[b]].tolist()):
            print(f"figure: {args.plot} (loss curves; utterance {b}: frame posteriors, "
                  f"CTC posterior and best alignment)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
