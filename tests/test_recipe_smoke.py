"""The speech recipe (examples/speech) cannot rot: its parts against independent facts, and a
smoke run of every stage (corpus, torch and JAX training, every decoder, alignment, report).

Independent references: the grammar's split rules (set arithmetic), eSpeak NG's word count
(the text's words), the mel scale's analytic band centres (a pure tone), the ARPA model's
normalisation (probabilities of every context sum to one) and a hand-computed back-off value,
jiwer's WER on a hand-counted case, and forced alignment of posteriors built from known
frames (the boundaries must come back exactly).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEECH = ROOT / "examples" / "speech"

pytest.importorskip("espeakng_loader")
pytest.importorskip("jiwer")


@pytest.fixture(scope="module")
def recipe():
    """The recipe's modules, imported from examples/speech (removed from sys.path after)."""
    sys.path.insert(0, str(SPEECH))
    try:
        import common
        import corpus
        import decode
        import features
        import lm
        yield {"common": common, "corpus": corpus, "decode": decode, "features": features,
               "lm": lm}
    finally:
        sys.path.remove(str(SPEECH))
        for name in ("common", "corpus", "decode", "features", "lm", "espeak"):
            sys.modules.pop(name, None)


def test_splits_differ_in_sentences_and_voices(recipe):
    corpus = recipe["corpus"]
    train, dev, test = corpus._texts(300, 20, 50, seed=3)
    assert len(train) == 300 and len(dev) == 20 and len(test) == 50
    assert not (set(test) | set(dev)) & set(train)
    vocab = set(corpus.vocabulary())
    assert 200 <= len(vocab) <= 400
    assert {w for s in train + test for w in s.split()} <= vocab
    assert not set(corpus.TRAIN_VOICES) & set(corpus.TEST_VOICES)
    assert not set(corpus.TRAIN_RATES) & set(corpus.TEST_RATES)
    assert not set(corpus.TRAIN_PITCH) & set(corpus.TEST_PITCH)


def test_espeak_reports_word_times(recipe):
    sys.path.insert(0, str(SPEECH))
    from espeak import ESpeak
    synth = ESpeak()
    out = synth.speak("call anna at nine", voice="en-us+m3", rate=175)
    duration = len(out.audio) / out.sample_rate
    assert out.sample_rate == 22050 and 0.5 < duration < 3.0
    assert float(np.abs(out.audio).max()) > 0.05
    positions = [p for p, _ in out.words]
    assert positions == [1, 6, 11, 14]  # 1-based character offsets of the four words
    starts = [s for _, s in out.words]
    assert starts == sorted(starts) and starts[-1] < duration
    assert len(out.phonemes) >= 8


def test_log_mel_peaks_at_a_pure_tone(recipe):
    f = recipe["features"]
    sr, tone = f.SAMPLE_RATE, 1000.0
    audio = np.sin(2 * np.pi * tone * np.arange(sr) / sr).astype(np.float32)
    feats = f.log_mel(audio, normalise=False)
    assert feats.shape == (1 + sr // f.HOP, f.N_MELS)

    def mel(x):
        return 2595 * math.log10(1 + x / 700)

    centres = [700 * (10 ** (m / 2595) - 1)
               for m in np.linspace(mel(20), mel(8000), f.N_MELS + 2)[1:-1]]
    best = int(np.argmax(feats[len(feats) // 2]))
    nearest = int(np.argmin([abs(c - tone) for c in centres]))
    assert abs(best - nearest) <= 1


def test_arpa_is_normalised_and_backs_off_by_hand(recipe, tmp_path):
    from duoloss.core.decoding.arpa import read_arpa
    lm = recipe["lm"]
    sentences = ["call anna", "call ben", "call anna now", "text ben now"]
    vocab = ["anna", "ben", "call", "now", "text", "zoe"]
    path = tmp_path / "lm.arpa"
    lm.write_arpa(lm.estimate(sentences, vocab, order=3, discount=0.5), path)
    model = read_arpa(path)
    words = vocab + ["</s>", "<unk>"]
    for context in [("<s>",), ("<s>", "call"), ("call", "anna"), ("anna",), ("zoe",), ()]:
        ctx = tuple(model.word_id(w) for w in context)
        total = sum(10 ** model.score(ctx, model.word_id(w))[0] for w in words)
        assert abs(total - 1.0) < 1e-5, (context, total)
    # p(call | <s>): "<s> call" seen 3 times out of 4 "<s> x" bigrams, discount 0.5
    assert abs(model.score((model.word_id("<s>"),), model.word_id("call"))[0]
               - math.log10((3 - 0.5) / 4)) < 1e-6


def test_wer_matches_a_hand_count(recipe):
    # one substitution and one deletion in six reference words
    assert abs(recipe["decode"].wer(["turn on the kitchen lights please"],
                                    ["turn off the kitchen lights"]) - 100 * 2 / 6) < 1e-9


def test_alignment_recovers_known_word_frames(recipe):
    pytest.importorskip("torch")
    common, decode = recipe["common"], recipe["decode"]
    text = "call ben now"
    ids = common.encode(text)
    # frame of each token (blank between), so the frames of every letter are known
    frames, t = [], 2
    for _ in ids:
        frames.append(t)
        t += 3
    T = t + 2
    lp = np.full((T, len(common.TOKENS)), math.log(1e-4), np.float32)
    lp[:, common.BLANK] = 0.0
    for k, fr in zip(ids, frames):
        lp[fr] = math.log(1e-4)
        lp[fr, k] = 0.0
    side = decode.TorchSide(model=None)
    frame_s = 0.01
    (starts, ends), = decode.word_boundaries(side, [lp], [text], frame_s)
    period = common.SUBSAMPLE * frame_s
    word_first = [0, 5, 9]   # token positions of c, b, n
    word_last = [3, 7, 11]   # token positions of l, n, w
    assert np.allclose(starts, [frames[i] * period for i in word_first])
    assert np.allclose(ends, [(frames[i] + 1) * period for i in word_last])


def test_latency_is_estimated_and_taken_off(recipe):
    """A constant aligner latency (70 ms late starts, 30 ms late ends) is found as the
    median signed error and removing it gives zero error; a start never crosses 0."""
    decode = recipe["decode"]
    utts = [{"word_starts": [0.0, 0.5, None], "word_ends": [0.5, 0.9, 1.4]},
            {"word_starts": [0.02, 0.3], "word_ends": [0.3, 0.8]}]
    aligned = [([s + 0.07 if s is not None else 0.6 for s in u["word_starts"]],
                [e + 0.03 for e in u["word_ends"]]) for u in utts]
    ds, de = decode.latency(aligned, utts)
    assert abs(ds - 0.07) < 1e-12 and abs(de - 0.03) < 1e-12
    a = decode.boundary_errors(decode.shift(aligned, (ds, de)), utts)
    assert a["median_ms"] < 1e-9 and a["within_100ms"] == 1.0 and a["boundaries"] == 9
    (starts, _), = decode.shift([([0.05], [0.2])], (0.07, 0.0))
    assert starts == [0.0]
    assert decode.latency(aligned, [{"word_starts": None, "word_ends": None}] * 2) == (0.0, 0.0)


def _speech_modules(*names):
    """The recipe's modules ``names`` (and the ``common`` they import), imported from
    examples/speech and dropped from ``sys.path``/``sys.modules`` again."""
    import importlib
    sys.path.insert(0, str(SPEECH))
    try:
        return tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(SPEECH))
        for name in (*names, "common"):
            sys.modules.pop(name, None)


def test_jax_depthwise_conv_matches_torch_grouped_conv1d():
    """The JAX model's hand-written depthwise convolution (shifted sums, a custom backward)
    equals torch's grouped ``conv1d`` (``groups = C``, ``'same'`` padding) in value and in
    both gradients, in float64, for odd and even kernels."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    train_jax, = _speech_modules("train_jax")
    rng = np.random.default_rng(3)
    for k in (11, 4, 1):
        x, w, g = (rng.standard_normal(s) for s in ((3, 9, 5), (k, 5), (3, 9, 5)))
        with jax.enable_x64(True):
            y, vjp = jax.vjp(train_jax.depthwise_conv, jax.numpy.asarray(x), jax.numpy.asarray(w))
            dx, dw = vjp(jax.numpy.asarray(g))
        xt = torch.tensor(x.transpose(0, 2, 1), requires_grad=True)
        wt = torch.tensor(w.T[:, None, :], requires_grad=True)
        yt = torch.nn.functional.conv1d(torch.nn.functional.pad(xt, (k // 2, k - 1 - k // 2)),
                                        wt, groups=5)
        yt.backward(torch.tensor(g.transpose(0, 2, 1)))
        np.testing.assert_allclose(np.asarray(y), yt.detach().numpy().transpose(0, 2, 1),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(dx), xt.grad.numpy().transpose(0, 2, 1),
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.asarray(dw), wt.grad.numpy()[:, 0, :].T, rtol=1e-12,
                                   atol=1e-12)


@pytest.mark.parametrize("arch", ["conv", "gru"])
def test_jax_model_from_torch_weights_computes_the_torch_function(arch):
    """``train_jax.params_from_torch`` gives the flax model the torch model's function:
    the same encodings, CTC log-probabilities, predictor outputs and joiner logits (eval
    mode, float32) for random features, lengths and token histories."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    train_jax, train_torch = _speech_modules("train_jax", "train_torch")
    sizes = dict(conv=24, hidden=8, pred=12, joint=10, layers=2, arch=arch)
    tm = train_torch.initial_model(16, seed=3, sizes=sizes).eval()
    params = train_jax.params_from_torch(tm)
    jm = train_jax.SpeechModel(**sizes)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 20, 16)).astype(np.float32)
    out_lens = np.array([10, 7, 10], np.int32)
    prev = rng.integers(0, train_jax.V, (3, 5)).astype(np.int32)
    enc_j, lp_j, logits_j = jm.apply({"params": params}, x, out_lens, prev)
    with torch.no_grad():
        enc_t = tm.encoder(torch.from_numpy(x), torch.from_numpy(out_lens).long())
        lp_t = tm.ctc_log_probs(enc_t)
        pred_t, _ = tm.predictor(torch.from_numpy(prev).long())
        logits_t = tm.joiner(tm.stack(enc_t)[:, :, None, :], pred_t[:, None, :, :])
    for b, n in enumerate(out_lens):  # (the GRU encoder's padded frames differ: masked)
        np.testing.assert_allclose(np.asarray(enc_j)[b, :n], enc_t.numpy()[b, :n], atol=2e-5)
        np.testing.assert_allclose(np.asarray(lp_j)[b, :n], lp_t.numpy()[b, :n], atol=2e-5)
        np.testing.assert_allclose(np.asarray(logits_j)[b, :n], logits_t.numpy()[b, :n],
                                   atol=2e-5)


@pytest.mark.parametrize("arch", ["conv", "gru"])
def test_encodings_do_not_depend_on_the_batch_padding(arch):
    """Both frameworks' encoders mask padded frames: a sequence's encodings are the same
    with 20 feature frames of padding or 52 (the JAX run pads batches to multiples of
    ``common.PAD_FRAMES``, the evaluation to its own batch lengths)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    train_jax, train_torch = _speech_modules("train_jax", "train_torch")
    sizes = dict(conv=24, hidden=8, pred=12, joint=10, layers=2, arch=arch)
    tm = train_torch.initial_model(16, seed=5, sizes=sizes).eval()
    for p in tm.parameters():  # no zero biases: padded frames would be non-zero unmasked
        p.data.add_(0.1)
    params = train_jax.params_from_torch(tm)
    jm = train_jax.SpeechModel(**sizes)
    rng = np.random.default_rng(1)
    feat_lens = np.array([20, 13, 7])
    x = rng.standard_normal((3, 20, 16)).astype(np.float32)
    x[np.arange(20)[None, :] >= feat_lens[:, None]] = 0.0
    out_lens = ((feat_lens - 1) // 2 + 1).astype(np.int32)
    x_long = np.concatenate([x, np.zeros((3, 32, 16), np.float32)], 1)
    with torch.no_grad():
        enc_t = [tm.encoder(torch.from_numpy(v), torch.from_numpy(out_lens).long()).numpy()
                 for v in (x, x_long)]
    enc_j = [np.asarray(jm.apply({"params": params}, v, out_lens, method=jm.encode))
             for v in (x, x_long)]
    for b, n in enumerate(out_lens):
        for short, long in (enc_t, enc_j):
            np.testing.assert_allclose(long[b, :n], short[b, :n], rtol=1e-5, atol=1e-5)


def test_hash_dropout_keeps_each_element_independently_with_probability_1_minus_rate():
    """``train_jax.hash_dropout`` against the binomial law of independent Bernoulli(0.9)
    keeps (6 standard deviations): the kept share, the share of neighbouring pairs (along
    every axis) both dropped (``rate ** 2``), and the agreement of two keys' masks
    (``rate ** 2 + (1 - rate) ** 2``); kept values scaled by ``1 / (1 - rate)`` exactly,
    the same key gives the same mask, ``rate = 0`` or deterministic mode is the identity."""
    jax = pytest.importorskip("jax")
    train_jax, = _speech_modules("train_jax")
    rate, shape = 0.1, (16, 128, 256)
    x = jax.numpy.asarray(np.random.default_rng(0).uniform(1.0, 2.0, shape).astype(np.float32))
    k1, k2 = jax.random.split(jax.random.key(7))
    y1 = np.asarray(jax.jit(train_jax.hash_dropout, static_argnums=1)(x, rate, k1))
    y2 = np.asarray(train_jax.hash_dropout(x, rate, k2))
    m1, m2 = y1 != 0, y2 != 0
    n = m1.size

    def near(share, p, count):
        assert abs(share - p) < 6 * math.sqrt(p * (1 - p) / count), (share, p)

    near(m1.mean(), 1 - rate, n)
    near(m2.mean(), 1 - rate, n)
    near((m1 == m2).mean(), rate ** 2 + (1 - rate) ** 2, n)
    for axis in range(3):
        a, b = np.swapaxes(~m1, 0, axis)[1:], np.swapaxes(~m1, 0, axis)[:-1]
        near((a & b).mean(), rate ** 2, a.size)
    np.testing.assert_array_equal(y1[m1], (np.asarray(x) * np.float32(1 / (1 - rate)))[m1])
    np.testing.assert_array_equal(np.asarray(train_jax.hash_dropout(x, rate, k1)), y1)
    np.testing.assert_array_equal(np.asarray(train_jax.hash_dropout(x, 0.0, k1)), np.asarray(x))
    drop = train_jax.Dropout(rate, deterministic=True)
    np.testing.assert_array_equal(np.asarray(drop.apply({}, x)), np.asarray(x))
    with pytest.raises(ValueError, match="hash_dropout: rate must be in"):
        train_jax.hash_dropout(x, 1.0, k1)


def test_smoke_run_every_stage(tmp_path):
    """The recipe's --smoke run: a few dozen utterances, a few steps, every stage."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(SPEECH / "run.py"), "--smoke", "--quiet",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    for fw in ("torch", "jax"):
        r = res["frameworks"][fw]
        assert set(r["wer"]) == {"ctc_greedy", "ctc_beam_lm", "rnnt_greedy", "rnnt_beam"}
        assert all(0 <= w <= 1000 for w in r["wer"].values())
        assert r["alignment"]["boundaries"] > 0
        assert r["alignment_calibrated"]["boundaries"] == r["alignment"]["boundaries"]
        assert r["train_steps"] == 4 and r["train_steps_ctc"] == 2  # 2 per model
        for stage in ("train", "train_ctc", "train_transducer", "tune_lm", "decode", "align"):
            assert res["stages_s"][f"{fw}_{stage}"] >= 0
    assert res["corpus"]["train"]["utterances"] == 32
    assert (tmp_path / "recipe.png").stat().st_size > 10_000
    assert (tmp_path / "lm.arpa").read_text().startswith("\n\\data\\")
    assert "| torch | CTC |" in (tmp_path / "results.md").read_text()


def test_real_corpus_reads_librispeech_layout(recipe, tmp_path):
    import wave
    sys.path.insert(0, str(SPEECH))
    import real_corpus
    f = recipe["features"]
    chapter = tmp_path / "19" / "198"
    chapter.mkdir(parents=True)
    lengths = {"19-198-0000": 16000, "19-198-0001": 8000}  # samples at 16 kHz
    for uid, n in lengths.items():
        with wave.open(str(chapter / f"{uid}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((np.sin(np.arange(n) * 0.3) * 8000).astype(np.int16).tobytes())
    (chapter / "19-198.trans.txt").write_text("19-198-0000 NORTHANGER ABBEY\n"
                                              "19-198-0001 IT'S CHAPTER ONE.\n")
    split = real_corpus.load(tmp_path)
    assert [u["text"] for u in split["utts"]] == ["northanger abbey", "it's chapter one"]
    for feats, n in zip(split["feats"], lengths.values()):
        resampled = n * f.SAMPLE_RATE // 16000  # 16 kHz -> 22.05 kHz
        assert feats.shape == (1 + resampled // f.HOP, f.N_MELS)
