"""The recipe's JAX model (flax linen) and training loop: the twin of ``train_torch.py``.

Same layers and sizes as the torch model: a convolutional encoder (or convolutions and two
bidirectional GRU layers with ``arch="gru"``), a CTC head trained with :func:`duoloss.jax.ctc_loss`, and a
transducer predictor (embedding + GRU) and joiner trained with :func:`duoloss.jax.rnnt_loss`.
The training step is one ``jax.jit`` (optax AdamW); batches are padded to a few shapes
(``common.PAD_FRAMES``/``PAD_TOKENS``) so that it compiles once per shape, a dozen or so
times per model.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import duoloss.jax as dj
from common import BLANK, JOINT_STACK, TOKENS, batches, join_histories, train_loop

V = len(TOKENS)

#: torch's default weight initialisation (``kaiming_uniform_(a=sqrt(5))``: U(+-1/sqrt(fan_in)),
#: variance 1 / (3 fan_in)) so that the two frameworks start from the same distribution
TORCH_INIT = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
Dense = functools.partial(nn.Dense, kernel_init=TORCH_INIT)
Conv = functools.partial(nn.Conv, kernel_init=TORCH_INIT)
#: torch's LayerNorm epsilon (flax's default is 1e-6)
LayerNorm = functools.partial(nn.LayerNorm, epsilon=1e-5)


def GRUCell(hidden):
    """A flax GRU cell initialised as ``torch.nn.GRU``: every weight and bias
    U(+-1/sqrt(hidden)) (flax's defaults: LeCun-normal input weights, orthogonal recurrent
    ones, zero biases)."""
    bound = 1.0 / hidden ** 0.5

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return nn.GRUCell(hidden, kernel_init=init, recurrent_kernel_init=init, bias_init=init)


def frame_mask(out_lens, n_frames, dtype=jnp.float32):
    """``(N, T', 1)`` mask of the frames ``t < out_lens[n]`` (``train_torch.frame_mask``):
    padded frames are zeroed after every layer that mixes time, so that encodings do not
    depend on the batch's padding."""
    return (jnp.arange(n_frames)[None, :] < jnp.asarray(out_lens)[:, None])[..., None].astype(dtype)


def _mix32(h):
    """A 32-bit integer finaliser (xor-shift-multiply, the "lowbias32" constants of
    C. Wellons' hash prospector): every output bit depends on every input bit."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def hash_dropout(x, rate, key):
    """Inverted dropout whose mask is a counter-based hash: element ``i`` is kept when
    ``mix(mix(i + s0) ^ s1) >= rate * 2**32`` for two seed words ``s0, s1`` drawn from
    ``key``, and kept values are scaled by ``1 / (1 - rate)``.

    Same distribution as ``flax.linen.Dropout`` (each element kept independently with
    probability ``1 - rate``, to within ``2**-32``), but the mask costs a few integer
    operations per element that XLA fuses into the surrounding elementwise work, where
    threefry's bits for the recipe's seven dropout layers took about a sixth of a training
    step on the 2-core CPU (``docs/recipe.md``)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"hash_dropout: rate must be in [0, 1), got {rate}")
    if x.size >= 2 ** 32:
        raise ValueError(f"hash_dropout: at most 2**32 - 1 elements, got shape {x.shape}")
    s0, s1 = jax.random.bits(key, (2,), jnp.uint32)
    idx = jax.lax.iota(jnp.uint32, x.size).reshape(x.shape)  # the row-major element index
    keep = _mix32(_mix32(idx + s0) ^ s1) >= jnp.uint32(min(round(rate * 2 ** 32), 2 ** 32 - 1))
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
    """``flax.linen.Dropout``'s interface (rng stream ``"dropout"``) with `hash_dropout`'s mask."""

    rate: float
    deterministic: bool = False

    @nn.compact
    def __call__(self, x):
        if self.deterministic or self.rate == 0.0:
            return x
        return hash_dropout(x, self.rate, self.make_rng("dropout"))


class Encoder(nn.Module):
    """``(N, T, F)`` features -> ``(N, T', 2 * hidden)`` encodings."""

    conv: int = 192
    hidden: int = 128
    layers: int = 2

    @nn.compact
    def __call__(self, x, out_lens, train=False):
        h = nn.relu(Conv(self.conv, (3,), strides=(2,), padding=[(1, 1)])(x))
        h = h * frame_mask(out_lens, h.shape[1], h.dtype)
        h = LayerNorm()(nn.relu(Conv(self.conv, (3,), padding=[(1, 1)])(h)))
        for _ in range(self.layers):
            h = nn.Bidirectional(nn.RNN(GRUCell(self.hidden)),
                                 nn.RNN(GRUCell(self.hidden), reverse=True, keep_order=True)
                                 )(h, seq_lengths=out_lens)
        return h


def stack(enc):
    """``(N, T', D)`` -> ``(N, ceil(T'/S), S D)``: ``S = JOINT_STACK`` frames side by side (zero padded)."""
    n, t, d = enc.shape
    enc = jnp.pad(enc, ((0, 0), (0, (-t) % JOINT_STACK), (0, 0)))
    return enc.reshape(n, -1, JOINT_STACK * d)


def _shifted_sum(x, w, before):
    """``sum_i x[:, t + i - before, :] w[i]`` over ``t < T`` (zeros outside ``x``):
    ``x (N, T, C)`` padded with ``before`` frames in front and ``K - 1 - before`` behind."""
    k, t = w.shape[0], x.shape[1]
    xp = jnp.pad(x, ((0, 0), (before, k - 1 - before), (0, 0)))
    return sum(xp[:, i: i + t, :] * w[i] for i in range(k))


@jax.custom_vjp
def depthwise_conv(x, w):
    """``y[n, t, c] = sum_i x[n, t + i - K // 2, c] w[i, c]`` (zeros outside): ``x (N, T, C)``,
    ``w (K, C)``. Forward and backward are written as shifted multiply-adds: XLA's CPU
    grouped convolution (``feature_group_count = C``) took 5.6 times as long, and
    differentiating the shifted adds automatically 10 times as long as this backward (XLA
    fuses the ``K`` weight-gradient reductions over offset slices into one slow loop; one
    reduction per step of a ``lax.map`` is fast)."""
    return _shifted_sum(x, w, w.shape[0] // 2)


def _depthwise_fwd(x, w):
    return depthwise_conv(x, w), (x, w)


def _depthwise_bwd(res, g):
    x, w = res
    k, t = w.shape[0], x.shape[1]
    # dx[s] = sum_i g[s - i + K // 2] w[i]: the same shifted sum over g with w reversed
    dx = _shifted_sum(g, w[::-1], k - 1 - k // 2)
    # dw[i] = sum_{n, t} x[n, t + i - K // 2] g[n, t]
    xp = jnp.pad(x, ((0, 0), (k // 2, k - 1 - k // 2), (0, 0)))
    dw = jax.lax.map(lambda i: jnp.sum(jax.lax.dynamic_slice_in_dim(xp, i, t, 1) * g, (0, 1)),
                     jnp.arange(k))
    return dx, dw.astype(w.dtype)


depthwise_conv.defvjp(_depthwise_fwd, _depthwise_bwd)


class DepthwiseConv(nn.Module):
    """A depthwise convolution along time (``'same'`` padding), ``(N, T, C) -> (N, T, C)``
    (`depthwise_conv`). Parameters and initialisers as the module's other convolutions'
    (``kernel`` ``(K, 1, C)`` from ``TORCH_INIT``, ``bias`` ``(C,)`` zeros)."""

    kernel_size: int

    @nn.compact
    def __call__(self, x):
        k, c = self.kernel_size, x.shape[-1]
        w = self.param("kernel", TORCH_INIT, (k, 1, c), x.dtype)
        b = self.param("bias", nn.initializers.zeros, (c,), x.dtype)
        return depthwise_conv(x, w[:, 0, :]) + b


class ConvEncoder(nn.Module):
    """Convolutions only (the twin of ``train_torch.ConvEncoder``)."""

    conv: int = 256
    hidden: int = 128
    blocks: int = 6
    kernel: int = 11
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, out_lens, train=False):
        drop = Dropout(self.dropout, deterministic=not train)
        h = LayerNorm()(nn.relu(Conv(self.conv, (5,), strides=(2,), padding=[(2, 2)])(x)))
        mask = frame_mask(out_lens, h.shape[1], h.dtype)
        h = h * mask
        for _ in range(self.blocks):
            y = DepthwiseConv(self.kernel)(h)
            y = Dense(self.conv)(y)
            h = (h + drop(nn.relu(LayerNorm()(y)))) * mask
        return Dense(2 * self.hidden)(drop(h))


class SpeechModel(nn.Module):
    """Encoder + CTC head + transducer predictor and joiner."""

    conv: int = 192
    hidden: int = 128
    pred: int = 128
    joint: int = 96
    layers: int = 2
    arch: str = "gru"
    dropout: float = 0.0

    def setup(self):
        self.encoder = (Encoder(self.conv, self.hidden, self.layers) if self.arch == "gru" else
                        ConvEncoder(self.conv, self.hidden, dropout=self.dropout))
        self.ctc_head = Dense(V)
        self.embed = nn.Embed(V, self.pred, embedding_init=nn.initializers.normal(1.0))
        self.pred_cell = GRUCell(self.pred)
        self.pred_rnn = nn.RNN(self.pred_cell, return_carry=True)
        self.join_enc = Dense(self.joint)
        self.join_pred = Dense(self.joint)
        self.join_out = Dense(V)

    def __call__(self, x, out_lens, prev, train=False):
        """Encodings, CTC log-probabilities and the ``(N, T', U + 1, V)`` joiner logits."""
        enc = self.encode(x, out_lens, train)
        _, pred = self.predictor(prev)
        enc2 = stack(enc)
        return enc, self.ctc_log_probs(enc), self.joiner(enc2[:, :, None, :], pred[:, None, :, :])

    def encode(self, x, out_lens, train=False):
        return self.encoder(x, out_lens, train)

    def ctc_only(self, x, out_lens, train=False):
        """CTC log-probabilities alone (the CTC phase: no predictor or joiner work)."""
        return self.ctc_log_probs(self.encoder(x, out_lens, train))

    def ctc_log_probs(self, enc):
        return jax.nn.log_softmax(self.ctc_head(enc), -1)

    def predictor(self, tokens, carry=None):
        """``(N, U)`` previous tokens -> (final carry, ``(N, U, pred)`` outputs)."""
        return self.pred_rnn(self.embed(tokens), initial_carry=carry)

    def joiner(self, enc, pred):
        return self.join_out(jnp.tanh(self.join_enc(enc) + self.join_pred(pred)))


def params_from_torch(model) -> dict:
    """The flax parameters of a ``train_torch.SpeechModel`` (either ``arch``): the same
    function in the other framework. Convolution and linear weights are transposed to
    flax's ``(..., in, out)`` layout; a torch GRU's ``(r, z, n)`` blocks become flax's
    per-gate kernels, its two ``r``/``z`` biases one sum (flax has one), ``b_hn`` the
    recurrent ``n`` bias. ``tests/test_recipe_smoke.py`` checks both models' outputs agree."""
    sd = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}

    def dense(name):
        return {"kernel": sd[f"{name}.weight"].T, "bias": sd[f"{name}.bias"]}

    def conv(name):  # torch (out, in, k) -> flax (k, in, out)
        return {"kernel": sd[f"{name}.weight"].transpose(2, 1, 0), "bias": sd[f"{name}.bias"]}

    def norm(name):
        return {"scale": sd[f"{name}.weight"], "bias": sd[f"{name}.bias"]}

    def gru(prefix, suffix):
        w_ih, w_hh = sd[f"{prefix}.weight_ih_{suffix}"], sd[f"{prefix}.weight_hh_{suffix}"]
        b_ih, b_hh = sd[f"{prefix}.bias_ih_{suffix}"], sd[f"{prefix}.bias_hh_{suffix}"]
        r, z, n = (slice(i * w_hh.shape[1], (i + 1) * w_hh.shape[1]) for i in range(3))
        return {"ir": {"kernel": w_ih[r].T, "bias": b_ih[r] + b_hh[r]},
                "iz": {"kernel": w_ih[z].T, "bias": b_ih[z] + b_hh[z]},
                "in": {"kernel": w_ih[n].T, "bias": b_ih[n]},
                "hr": {"kernel": w_hh[r].T}, "hz": {"kernel": w_hh[z].T},
                "hn": {"kernel": w_hh[n].T, "bias": b_hh[n]}}

    enc = model.encoder
    if hasattr(enc, "dw"):  # ConvEncoder
        e = {"Conv_0": conv("encoder.conv1"), "LayerNorm_0": norm("encoder.norm1"),
             f"Dense_{len(enc.dw)}": dense("encoder.out")}
        for i in range(len(enc.dw)):
            w = sd[f"encoder.dw.{i}.weight"]  # (C, 1, K) -> (K, 1, C)
            e[f"DepthwiseConv_{i}"] = {"kernel": w.transpose(2, 1, 0),
                                       "bias": sd[f"encoder.dw.{i}.bias"]}
            e[f"Dense_{i}"] = {"kernel": sd[f"encoder.pw.{i}.weight"][:, :, 0].T,
                               "bias": sd[f"encoder.pw.{i}.bias"]}
            e[f"LayerNorm_{i + 1}"] = norm(f"encoder.norms.{i}")
    else:  # the GRU encoder: layer l's forward and backward cells are GRUCell_2l, _2l+1
        e = {"Conv_0": conv("encoder.conv1"), "Conv_1": conv("encoder.conv2"),
             "LayerNorm_0": norm("encoder.norm")}
        for layer in range(enc.rnn.num_layers):
            e[f"GRUCell_{2 * layer}"] = gru("encoder.rnn", f"l{layer}")
            e[f"GRUCell_{2 * layer + 1}"] = gru("encoder.rnn", f"l{layer}_reverse")
    params = {"encoder": e, "ctc_head": dense("ctc_head"),
              "embed": {"embedding": sd["embed.weight"]}, "pred_cell": gru("pred_rnn", "l0"),
              "join_enc": dense("join_enc"), "join_pred": dense("join_pred"),
              "join_out": dense("join_out")}
    return jax.tree_util.tree_map(lambda a: jnp.asarray(np.ascontiguousarray(a)), params)


def _same_shape(a, b):
    if a.shape != b.shape:
        raise ValueError(f"params_from_torch: shape {b.shape} where flax has {a.shape}")


def _loss_fn(params, model, x, out_lens, joint_lens, y, y_lens, key):
    prev = jnp.pad(y, ((0, 0), (1, 0)), constant_values=BLANK)
    _, lp, logits = model.apply({"params": params}, x, out_lens, prev, True,
                                rngs={"dropout": key})
    ctc = dj.ctc_loss(jnp.swapaxes(lp, 0, 1), y, out_lens, y_lens, blank=BLANK, reduction="mean")
    rnnt = dj.rnnt_loss(logits, y, joint_lens, y_lens, blank=BLANK, reduction="none")
    rnnt = jnp.mean(rnnt / y_lens)
    return ctc + rnnt, (ctc, rnnt)


#: the parameters of the CTC model (the CTC phase trains these alone)
CTC_PARAMS = ("encoder", "ctc_head")


def _ctc_loss_fn(sub, rest, model, x, out_lens, y, y_lens, key):
    lp = model.apply({"params": {**rest, **sub}}, x, out_lens, True, method=SpeechModel.ctc_only,
                     rngs={"dropout": key})
    return dj.ctc_loss(jnp.swapaxes(lp, 0, 1), y, out_lens, y_lens, blank=BLANK,
                       reduction="mean")


def train(data, *, ctc_epochs=30, epochs=10, batch_size=32, lr=3e-3, seed=0, progress=None,
          log=print, max_steps=None, sizes=None, augment_from=2, warmup=50,
          init_from_torch=True):
    """Train the two models on ``data["train"]`` (the schedule of ``train_torch.train``:
    the CTC model with ``ctc_loss`` alone, then the transducer model from a copy of it with
    ``rnnt_loss`` + ``ctc_loss``; the same batches as the torch run). With
    ``init_from_torch`` (the default) training starts from the torch run's initial weights
    (`params_from_torch` of ``train_torch.initial_model(seed)``), so that the two runs
    differ only in their dropout masks and the frameworks' arithmetic; else from flax's
    initialisers (``TORCH_INIT``, `GRUCell`).

    Returns:
        ``(model, ctc_params, params, history)``: the flax module, the CTC model's and the
        transducer model's parameters, and the history of ``common.join_histories``.
    """
    model = SpeechModel(**(sizes or {}))
    feats = data["train"]["feats"]
    texts = [u["text"] for u in data["train"]["utts"]]
    first = next(batches(feats, texts, batch_size))
    params = model.init(jax.random.key(seed), jnp.asarray(first.feats[:2]),
                        jnp.asarray(first.out_lens[:2]),
                        jnp.zeros((2, first.targets.shape[1] + 1), jnp.int32))["params"]
    if init_from_torch:
        import train_torch
        torch_params = params_from_torch(train_torch.initial_model(first.feats.shape[2], seed,
                                                                   sizes))
        jax.tree_util.tree_map(_same_shape, params, torch_params)
        params = torch_params

    def make_opt():
        return optax.chain(optax.clip_by_global_norm(5.0),
                           optax.inject_hyperparams(optax.adamw)(learning_rate=lr,
                                                                 weight_decay=1e-2))

    opt = make_opt()
    sub = {k: v for k, v in params.items() if k in CTC_PARAMS}
    rest = {k: v for k, v in params.items() if k not in CTC_PARAMS}

    @jax.jit
    def ctc_step(sub, opt_state, lr_now, x, out_lens, y, y_lens, key):
        ctc, grads = jax.value_and_grad(_ctc_loss_fn)(sub, rest, model, x, out_lens, y, y_lens,
                                                      key)
        opt_state[1].hyperparams["learning_rate"] = lr_now
        updates, opt_state = opt.update(grads, opt_state, sub)
        return optax.apply_updates(sub, updates), opt_state, ctc

    state = {"params": sub, "opt_state": opt.init(sub)}

    keys = iter(jax.random.split(jax.random.key(seed + 1), 1_000_000))

    def one_ctc_step(batch, lr_now):
        # the CTC step's cost hardly depends on the targets' padding: pad them to a
        # multiple of 64 tokens (fewer shapes, fewer compiles)
        y = np.pad(batch.targets, ((0, 0), (0, (-batch.targets.shape[1]) % 64)))
        state["params"], state["opt_state"], ctc = ctc_step(
            state["params"], state["opt_state"], jnp.float32(lr_now), batch.feats,
            batch.out_lens, y, batch.target_lens, next(keys))
        return float(ctc), float("nan")

    kw = dict(batch_size=batch_size, lr=lr, seed=seed, progress=progress, log=log,
              max_steps=max_steps, warmup=warmup)
    h1 = train_loop("jax ctc", feats, texts, one_ctc_step, epochs=ctc_epochs,
                    augment_from=augment_from, **kw)
    ctc_params = {**rest, **state["params"]}

    opt = make_opt()

    @jax.jit
    def step_fn(params, opt_state, lr_now, x, out_lens, joint_lens, y, y_lens, key):
        (_, (ctc, rnnt)), grads = jax.value_and_grad(_loss_fn, has_aux=True)(
            params, model, x, out_lens, joint_lens, y, y_lens, key)
        opt_state[1].hyperparams["learning_rate"] = lr_now
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, ctc, rnnt

    state = {"params": ctc_params, "opt_state": opt.init(ctc_params)}

    def one_step(batch, lr_now):
        state["params"], state["opt_state"], ctc, rnnt = step_fn(
            state["params"], state["opt_state"], jnp.float32(lr_now), batch.feats,
            batch.out_lens, batch.joint_lens, batch.targets, batch.target_lens, next(keys))
        return float(ctc), float(rnnt)

    h2 = train_loop("jax transducer", feats, texts, one_step, epochs=epochs, augment_from=0,
                    **kw)
    return model, ctc_params, state["params"], join_histories(h1, h2)


def encode_split(model, params, split, batch_size=64):
    """Encoder outputs and CTC log-probabilities of every utterance of a split (numpy)."""
    feats = split["feats"]
    texts = [u["text"] for u in split["utts"]]

    @jax.jit
    def run(x, out_lens):
        def f(m):
            enc = m.encode(x, out_lens)
            return enc, m.ctc_log_probs(enc)
        return nn.apply(f, model)({"params": params})

    enc_out, lp_out = [None] * len(feats), [None] * len(feats)
    for batch in batches(feats, texts, batch_size):
        enc, lp = run(batch.feats, batch.out_lens)
        enc, lp = np.asarray(enc), np.asarray(lp)
        for row, i in enumerate(batch.index):
            n = int(batch.out_lens[row])
            enc_out[i], lp_out[i] = enc[row, :n], lp[row, :n]
    return enc_out, lp_out
