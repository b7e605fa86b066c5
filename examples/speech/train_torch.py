"""The recipe's PyTorch models and training loop.

One ``nn.Module`` class with an encoder and two heads; `train` trains two models with it,
one after the other (see its docstring): the CTC model with :func:`duoloss.torch.ctc_loss`,
then the transducer model, from a copy of the CTC model, with :func:`duoloss.torch.rnnt_loss`
+ ``ctc_loss``.

* encoder (``arch="conv"``, the recipe's default): a stride-2 convolution over the log-mel
  frames, six residual blocks of depthwise + pointwise convolutions with LayerNorm and
  dropout (about +-0.6 s of context) and a linear map: ``(N, T, 64) -> (N, T', 256)``,
  ``T' = (T-1)//2+1`` (20 ms frames); or (``arch="gru"``) two convolutions and two
  bidirectional GRU layers, which cost several times more per step on a CPU and sat on the
  CTC plateau (loss ~2.9 per token) for ~150 steps here, where the convolutional encoder
  left it in ~30;
* CTC head: a linear layer to the 29 tokens;
* transducer: a predictor (embedding + one GRU layer over the previous tokens, the blank as
  start symbol) and a joiner (``tanh(W_e enc + W_p pred)`` then a linear layer to the
  tokens) on every encoder frame (``common.JOINT_STACK``).

The flax twin in ``train_jax.py`` has the same layers and sizes.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

import duoloss.torch as dt
from common import BLANK, JOINT_STACK, TOKENS, batches, join_histories, train_loop

V = len(TOKENS)


def frame_mask(out_lens, n_frames, dtype=torch.float32):
    """``(N, n_frames)`` mask (``dtype``) of the encoder frames ``t < out_lens[n]``: the
    encoders zero their padded frames after every layer that mixes time, so that a
    sequence's encodings do not depend on how much its batch is padded (training and
    evaluation batches are padded differently)."""
    lens = torch.as_tensor(out_lens)
    return (torch.arange(n_frames, device=lens.device)[None, :] < lens[:, None]).to(dtype)


class Encoder(nn.Module):
    """``(N, T, F)`` features -> ``(N, T', 2 * hidden)`` encodings."""

    def __init__(self, n_feats=64, conv=192, hidden=128, layers=2):
        super().__init__()
        self.conv1 = nn.Conv1d(n_feats, conv, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(conv, conv, 3, padding=1)
        self.norm = nn.LayerNorm(conv)
        self.rnn = nn.GRU(conv, hidden, num_layers=layers, bidirectional=True, batch_first=True)

    def forward(self, x, out_lens):
        h = torch.relu(self.conv1(x.transpose(1, 2)))
        h = h * frame_mask(out_lens, h.shape[2], h.dtype)[:, None]
        h = self.norm(torch.relu(self.conv2(h)).transpose(1, 2))
        packed = nn.utils.rnn.pack_padded_sequence(h, torch.as_tensor(out_lens).cpu(),
                                                   batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=h.shape[1])
        return out


class ConvEncoder(nn.Module):
    """Convolutions only: ``(N, T, F)`` -> ``(N, T', 2 * hidden)``.

    A stride-2 convolution (kernel 5), then ``blocks`` residual blocks of a depthwise
    convolution (kernel 11) and a pointwise one, each followed by LayerNorm and ReLU
    (receptive field about +-0.6 s), and a linear map to ``2 * hidden``. Frames past
    ``out_lens`` are zeroed after each block (`frame_mask`), so the depthwise convolutions
    see zeros there, as at the edges.
    """

    def __init__(self, n_feats=64, conv=256, hidden=128, blocks=6, kernel=11, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.conv1 = nn.Conv1d(n_feats, conv, 5, stride=2, padding=2)
        self.norm1 = nn.LayerNorm(conv)
        self.dw = nn.ModuleList(nn.Conv1d(conv, conv, kernel, padding=kernel // 2, groups=conv)
                                for _ in range(blocks))
        self.pw = nn.ModuleList(nn.Conv1d(conv, conv, 1) for _ in range(blocks))
        self.norms = nn.ModuleList(nn.LayerNorm(conv) for _ in range(blocks))
        self.out = nn.Linear(conv, 2 * hidden)

    def forward(self, x, out_lens):
        h = self.norm1(torch.relu(self.conv1(x.transpose(1, 2))).transpose(1, 2))
        mask = frame_mask(out_lens, h.shape[1], h.dtype)[:, :, None]
        h = h * mask
        for dw, pw, norm in zip(self.dw, self.pw, self.norms):
            y = pw(dw(h.transpose(1, 2))).transpose(1, 2)
            h = (h + self.drop(torch.relu(norm(y)))) * mask
        return self.out(self.drop(h))


class SpeechModel(nn.Module):
    """Encoder + CTC head + transducer predictor and joiner (see the module docstring)."""

    def __init__(self, n_feats=64, conv=192, hidden=128, pred=128, joint=96, layers=2,
                 arch="gru", dropout=0.0):
        super().__init__()
        self.encoder = (Encoder(n_feats, conv, hidden, layers) if arch == "gru" else
                        ConvEncoder(n_feats, conv, hidden, dropout=dropout))
        self.ctc_head = nn.Linear(2 * hidden, V)
        self.embed = nn.Embedding(V, pred)
        self.pred_rnn = nn.GRU(pred, pred, batch_first=True)
        self.join_enc = nn.Linear(2 * hidden * JOINT_STACK, joint)
        self.join_pred = nn.Linear(pred, joint)
        self.join_out = nn.Linear(joint, V)

    def ctc_log_probs(self, enc):
        """``(N, T', V)`` log-probabilities of the CTC head."""
        return self.ctc_head(enc).log_softmax(-1)

    def predictor(self, tokens, state=None):
        """``(N, U)`` previous tokens (the blank starts) -> ``(N, U, pred)`` and the GRU state."""
        out, state = self.pred_rnn(self.embed(tokens), state)
        return out, state

    @staticmethod
    def stack(enc):
        """``(N, T', D)`` -> ``(N, ceil(T'/S), S D)``: ``S = JOINT_STACK`` frames side by side (zero padded)."""
        n, t, d = enc.shape
        enc = torch.nn.functional.pad(enc, (0, 0, 0, (-t) % JOINT_STACK))
        return enc.reshape(n, -1, JOINT_STACK * d)

    def joiner(self, enc, pred):
        """``enc (..., 2H)`` and ``pred (..., P)`` broadcast -> ``(..., V)`` logits."""
        return self.join_out(torch.tanh(self.join_enc(enc) + self.join_pred(pred)))

    def losses(self, batch, transducer=True):
        """CTC and RNN-T losses of a :class:`common.Batch`, each per target token, batch mean
        (RNN-T: None when ``transducer`` is False)."""
        x = torch.from_numpy(batch.feats)
        out_lens = torch.from_numpy(batch.out_lens).long()
        y = torch.from_numpy(batch.targets).long()
        y_lens = torch.from_numpy(batch.target_lens).long()
        enc = self.encoder(x, out_lens)
        lp = self.ctc_log_probs(enc).transpose(0, 1)  # (T', N, V)
        ctc = dt.ctc_loss(lp, y, out_lens, y_lens, blank=BLANK, reduction="mean")
        if not transducer:
            return ctc, None
        # torch takes ragged shapes: the joint tensor is cut to the batch's longest sequence
        u_max, t_max = int(y_lens.max()), int(batch.joint_lens.max())
        y = y[:, :u_max]
        prev = torch.nn.functional.pad(y, (1, 0), value=BLANK)  # (N, U + 1)
        pred, _ = self.predictor(prev)
        enc2 = self.stack(enc)[:, :t_max]
        logits = self.joiner(enc2[:, :, None, :], pred[:, None, :, :])  # (N, T'/2, U + 1, V)
        rnnt = dt.rnnt_loss(logits, y.int(), torch.from_numpy(batch.joint_lens), y_lens.int(),
                            blank=BLANK, reduction="none")
        return ctc, (rnnt / y_lens).mean()


def initial_model(n_feats, seed=0, sizes=None):
    """The untrained model of a run: torch's default initialisation after
    ``torch.manual_seed(seed)`` (the JAX run starts from the same weights:
    ``train_jax.params_from_torch``)."""
    torch.manual_seed(seed)
    return SpeechModel(n_feats=n_feats, **(sizes or {}))


def train(data, *, ctc_epochs=30, epochs=10, batch_size=32, lr=3e-3, seed=0, progress=None,
          log=print, max_steps=None, sizes=None, augment_from=2, warmup=50):
    """Train the two models of the recipe on ``data["train"]``, one after the other.

    1. The **CTC model** (encoder + CTC head) with ``ctc_loss`` alone for ``ctc_epochs``
       (a CTC step costs a fraction of a transducer step on a CPU: the joint tensor is the
       costly part);
    2. the **transducer model**: a copy of the CTC model (its encoder CTC-pretrained) whose
       predictor and joiner are trained with ``rnnt_loss`` + ``ctc_loss`` (the CTC head as an
       auxiliary loss) for ``epochs``, SpecAugment throughout.

    Returns:
        ``(ctc_model, transducer_model, history)``: ``history`` as
        ``common.join_histories`` returns it. ``sizes`` overrides the layer sizes
        (``conv``, ``hidden``, ``pred``, ``joint``, ``dropout``); ``max_steps`` caps each
        phase.
    """
    model = initial_model(data["train"]["feats"][0].shape[1], seed, sizes)
    feats = data["train"]["feats"]
    texts = [u["text"] for u in data["train"]["utts"]]
    model.train()

    def stepper(opt, transducer):
        def step_fn(batch, lr_now):
            for g in opt.param_groups:
                g["lr"] = lr_now
            ctc, rnnt = model.losses(batch, transducer)
            opt.zero_grad()
            (ctc if rnnt is None else ctc + rnnt).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            return ctc.item(), float("nan") if rnnt is None else rnnt.item()
        return step_fn

    kw = dict(batch_size=batch_size, lr=lr, seed=seed, progress=progress, log=log,
                  max_steps=max_steps, warmup=warmup)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-2)
    h1 = train_loop("torch ctc", feats, texts, stepper(opt, False), epochs=ctc_epochs,
                    augment_from=augment_from, **kw)
    ctc_model = copy.deepcopy(model).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-2)
    h2 = train_loop("torch transducer", feats, texts, stepper(opt, True), epochs=epochs,
                    augment_from=0, **kw)
    model.eval()
    return ctc_model, model, join_histories(h1, h2)


@torch.no_grad()
def encode_split(model, split, batch_size=64):
    """Encoder outputs and CTC log-probabilities of every utterance of a split.

    Returns:
        ``(enc, log_probs)``: lists (in split order) of ``(T', 2H)`` and ``(T', V)`` tensors.
    """
    feats = split["feats"]
    texts = [u["text"] for u in split["utts"]]
    enc_out, lp_out = [None] * len(feats), [None] * len(feats)
    for batch in batches(feats, texts, batch_size):
        enc = model.encoder(torch.from_numpy(batch.feats), torch.from_numpy(batch.out_lens).long())
        lp = model.ctc_log_probs(enc)
        for row, i in enumerate(batch.index):
            n = int(batch.out_lens[row])
            enc_out[i], lp_out[i] = enc[row, :n], lp[row, :n]
    return enc_out, lp_out
