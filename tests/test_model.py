"""TransformerTTS: shapes, masks, causality, learning, XLA + mixed precision, inference. Tiny models, CPU."""
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from conftest import left_in_tmpdir

from pipeline import models
from pipeline.models.transformer_tts import STOP_POS_WEIGHT, Attention, Block, ScaledPositions, TransformerTTS, tts_loss

# dropouts 0 so outputs are deterministic; tests that need dropout set it
TINY = dict(n_symbols=12, n_mels=8, d_model=32, heads=2, encoder_layers=1, decoder_layers=2, ffn_dim=64,
            encoder_conv_layers=2, encoder_conv_kernel=3, prenet_dim=32, prenet_dropout=0.0, dropout=0.0,
            reduction=2, postnet_channels=16, postnet_layers=3, postnet_kernel=3)
LOSS = dict(guided_attention_sigma=0.2, guided_attention_weight=10.0, stop_weight=1.0)
R = TINY["reduction"]


def make_batch(token_lengths=(9, 6), mel_lengths=(16, 11), T=9, F=16, seed=0, mel_dtype=tf.float32):
    """Random real content; padding filled with garbage (not zeros) so only the masks can hide it."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, TINY["n_symbols"], (len(token_lengths), T))
    mel = rng.normal(size=(len(mel_lengths), F, TINY["n_mels"]))
    return {"tokens": tf.constant(tokens, tf.int32), "token_lengths": tf.constant(token_lengths, tf.int32),
            "mel": tf.constant(mel, mel_dtype), "mel_lengths": tf.constant(mel_lengths, tf.int32)}


def repad(batch, T, F, seed=1):
    """The same real content (the frames of every real decoder step, which the loss trains toward the
    padding the loader puts past the end) with more (different) garbage padding."""
    other = make_batch(batch["token_lengths"].numpy(), batch["mel_lengths"].numpy(), T, F, seed)
    keep_t = tf.sequence_mask(batch["token_lengths"], T)
    keep_f = tf.sequence_mask(-(-batch["mel_lengths"] // R) * R, F)[:, :, None]
    t0, f0 = batch["tokens"].shape[1], batch["mel"].shape[1]
    tokens = tf.pad(batch["tokens"], [[0, 0], [0, T - t0]])
    mel = tf.pad(batch["mel"], [[0, 0], [0, F - f0], [0, 0]])
    return {**other, "tokens": tf.where(keep_t, tokens, other["tokens"]),
            "mel": tf.where(keep_f, mel, other["mel"])}


@pytest.fixture
def policy():
    """Set a global dtype policy for one test, then restore float32."""
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy("float32")


def train_step_fn(model, optimizer, compile=True):
    def step(batch):
        with tf.GradientTape() as tape:
            outputs = model(batch, training=True)
            total, terms = tts_loss(outputs, batch, reduction=model.reduction, **LOSS)
            scaled = optimizer.scale_loss(total)  # identity unless a LossScaleOptimizer (mixed_float16)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return terms
    return tf.function(step) if compile else step


def test_shapes_dtypes_and_loss_terms():
    model = TransformerTTS(**TINY)
    batch = make_batch(mel_dtype=tf.float16)
    out = model(batch)
    B, T, F, M = 2, 9, 16, TINY["n_mels"]
    assert out["mel_before"].shape == out["mel_after"].shape == (B, F, M)
    assert out["stop_logits"].shape == (B, F // R) and out["alignment"].shape == (B, F // R, T)
    assert all(v.dtype == tf.float32 for v in out.values())
    np.testing.assert_allclose(tf.reduce_sum(out["alignment"], -1), 1.0, atol=1e-5)
    assert np.all(out["alignment"][1, :, 6:] == 0)                           # padded tokens get no attention
    total, terms = tts_loss(out, batch, reduction=R, **LOSS)
    assert set(terms) == {"mel_before", "mel_after", "stop", "guided_attention", "total"}
    assert all(v.dtype == tf.float32 and np.isfinite(v) for v in terms.values())
    expected = (terms["mel_before"] + terms["mel_after"] + terms["stop"] + 10.0 * terms["guided_attention"])
    np.testing.assert_allclose(total, expected, rtol=1e-6)


def test_padding_does_not_change_real_outputs_or_loss():
    model = TransformerTTS(**TINY)
    batch = make_batch()
    padded = repad(batch, T=14, F=24)
    a, b = model(batch), model(padded)
    for i, (t, f) in enumerate(zip(batch["token_lengths"].numpy(), batch["mel_lengths"].numpy())):
        s = -(-f // R)                                                         # real decoder steps
        for key in ("mel_before", "mel_after"):
            np.testing.assert_allclose(a[key][i, :f], b[key][i, :f], atol=1e-5, err_msg=key)
        np.testing.assert_allclose(a["stop_logits"][i, :s], b["stop_logits"][i, :s], atol=1e-5)
        np.testing.assert_allclose(a["alignment"][i, :s, :t], b["alignment"][i, :s, :t], atol=1e-6)
    loss_a, loss_b = tts_loss(a, batch, reduction=R, **LOSS)[1], tts_loss(b, padded, reduction=R, **LOSS)[1]
    for key in loss_a:
        np.testing.assert_allclose(loss_a[key], loss_b[key], rtol=1e-5, err_msg=key)


def test_decoder_is_causal():
    model = TransformerTTS(**TINY)
    batch = make_batch(mel_lengths=(16, 16))
    k = 3                                                                      # decoder step
    changed = dict(batch, mel=tf.concat([batch["mel"][:, :k * R], 5.0 + batch["mel"][:, k * R:]], axis=1))
    a, b = model(batch), model(changed)
    # frames from group k on feed steps k+1.. (teacher forcing shifts by one step): steps <= k are untouched
    np.testing.assert_allclose(a["mel_before"][:, :(k + 1) * R], b["mel_before"][:, :(k + 1) * R], atol=1e-6)
    np.testing.assert_allclose(a["stop_logits"][:, :k + 1], b["stop_logits"][:, :k + 1], atol=1e-6)
    np.testing.assert_allclose(a["alignment"][:, :k + 1], b["alignment"][:, :k + 1], atol=1e-6)
    assert np.abs(a["mel_before"][:, (k + 1) * R:] - b["mel_before"][:, (k + 1) * R:]).max() > 1e-3


def test_tiny_model_overfits_one_batch():
    keras.utils.set_random_seed(0)
    model = TransformerTTS(**{**TINY, "prenet_dropout": 0.5, "dropout": 0.1})
    optimizer = keras.optimizers.Adam(3e-3)
    step = train_step_fn(model, optimizer)
    batch = make_batch(token_lengths=(9, 7, 5, 8), mel_lengths=(24, 20, 13, 17), T=9, F=24)
    losses = [float(step(batch)["total"]) for _ in range(100)]
    first, last = losses[0], np.mean(losses[-10:])
    assert last < 0.5 * first, f"loss {first:.3f} -> {last:.3f}"


def test_step_under_mixed_bfloat16(policy):
    # eager: the step compiled by XLA under mixed bfloat16 is the placements' (tests/test_train.py)
    policy("mixed_bfloat16")
    model = TransformerTTS(**{**TINY, "prenet_dropout": 0.5, "dropout": 0.1})
    assert model.mel_out.compute_dtype == "bfloat16" and model.mel_out.kernel.dtype == "float32"
    step = train_step_fn(model, keras.optimizers.SGD(1e-2), compile=False)
    batch = make_batch(mel_dtype=tf.float16)
    before = [v.numpy() for v in model.trainable_variables]
    terms = [step(batch) for _ in range(2)][-1]
    assert all(v.dtype == tf.float32 and np.isfinite(v) for v in terms.values())
    assert all(np.any(v.numpy() != b) for v, b in zip(model.trainable_variables, before))
    assert all(v.dtype == tf.float32 for v in model(batch).values())


def test_step_under_mixed_float16_with_loss_scaling(policy):
    policy("mixed_float16")
    model = TransformerTTS(**TINY)
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    step = train_step_fn(model, optimizer, compile=False)  # eager: tracing this adds ~10 s for no new coverage
    terms = step(make_batch(mel_dtype=tf.float16))
    assert all(v.dtype == tf.float32 and np.isfinite(v) for v in terms.values())


def test_infer_shapes_stop_and_teacher_forcing_agreement():
    model = TransformerTTS(**TINY)
    tokens, lengths = tf.constant([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0]]), tf.constant([5, 3])
    model.stop_out.bias.assign([-30.0])                                        # never stops
    out = model.decode_autoregressive(tokens, lengths, max_steps=6, stop_threshold=0.5)
    assert out["mel"].shape == (2, 6 * R, TINY["n_mels"]) and out["mel"].dtype == tf.float32
    assert out["alignment"].shape == (2, 6, 5)
    assert out["lengths"].dtype == tf.int32 and list(out["lengths"].numpy()) == [12, 12]
    assert out["stopped"].dtype == tf.bool and not np.any(out["stopped"])
    # feeding the generated frames back with teacher forcing must reproduce them (no dropout here)
    forced = model({"tokens": tokens, "token_lengths": lengths, "mel": out["mel_before"],
                    "mel_lengths": out["lengths"]})
    np.testing.assert_allclose(forced["mel_before"], out["mel_before"], atol=1e-4)
    np.testing.assert_allclose(forced["mel_after"], out["mel"], atol=1e-4)
    np.testing.assert_allclose(forced["alignment"], out["alignment"], atol=1e-5)

    model.stop_out.bias.assign([30.0])                                         # stops at the first step
    out = model.decode_autoregressive(tokens, lengths, max_steps=6, stop_threshold=0.5)
    assert list(out["lengths"].numpy()) == [R, R] and np.all(out["stopped"])
    assert np.all(out["mel"][:, R:] == 0)


def test_build_from_shipped_config_and_the_interface():
    with open(Path(__file__).resolve().parents[1] / "configs" / "config.yaml") as f:
        cfg = yaml.safe_load(f)["model"]
    cfg["kind"] = "transformer_tts"
    model = models.build(cfg, {"symbols": list("abcdefghij")}, 80)
    assert model.reduction == cfg["transformer_tts"]["reduction"] == models.frame_multiple(cfg)
    assert model.count_params() > 0 and set(model.needs) == {"tokens", "token_lengths", "mel", "mel_lengths"}
    again = TransformerTTS(**model.get_config())
    assert again.count_params() == model.count_params()
    with pytest.raises(TypeError, match="bogus"):
        TransformerTTS(**model.get_config(), bogus=1)
    with pytest.raises(ValueError, match="d_model"):
        models.build({**cfg, "transformer_tts": {k: v for k, v in cfg["transformer_tts"].items() if k != "d_model"}},
                     list("abc"), 80)


def test_infer_interface_pace_resamples_and_pitch_shift_is_refused():
    model = TransformerTTS(**TINY, stop_threshold=0.5)
    model.stop_out.bias.assign([-30.0])                                        # never stops: 6 steps = 12 frames
    tokens, lengths = tf.constant([[3, 4, 5, 6, 7]]), tf.constant([5])
    base = model.infer(tokens, lengths, max_frames=12)
    assert int(base["lengths"][0]) == 12 and base["mel"].shape == (1, 12, TINY["n_mels"])
    slow = model.infer(tokens, lengths, pace=0.5, max_frames=24)
    assert int(slow["lengths"][0]) == 24 and slow["mel"].shape == (1, 24, TINY["n_mels"])
    np.testing.assert_allclose(slow["mel"][0, ::2][:11], base["mel"][0, :11], atol=1e-5)  # same frames, spread
    # max_frames bounds the paced mel, as FastPitch's: a sentence cut there has exactly that many frames at
    # any pace (faster: decoded until its paced mel reaches them; slower: no more), and did not stop
    for pace in (0.5, 2.0, 3.0):
        out = model.infer(tokens, lengths, pace=pace, max_frames=12)
        assert int(out["lengths"][0]) == 12 and out["mel"].shape == (1, 12, TINY["n_mels"]), pace
        assert not out["stopped"][0], pace
    with pytest.raises(models.ModelError, match="pitch"):  # one line from synthesize or serve, no traceback
        model.infer(tokens, lengths, pitch_shift=2.0, max_frames=12)


def test_checkpoint_restores_every_weight(tmp_path):
    # the trainer saves with tf.train.Checkpoint, which misses Keras 3 layers kept in Python lists
    model, fresh = TransformerTTS(**TINY), TransformerTTS(**TINY)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_inference_from_one_checkpoint_is_the_same_in_every_model_and_call(tmp_path):
    """Pre-net dropout stays on at inference (Tacotron 2), but its masks came from an unseeded
    SeedGenerator advanced at every call: two `synthesize` runs of one checkpoint gave other mels
    (max |diff| ~1 in log-mel). Now the seed is fixed by the sentence's tokens: fresh models restored
    from one checkpoint, and repeated calls, give the same mel; other sentences still get their own masks."""
    cfg = dict(TINY, prenet_dropout=0.5)
    path = tf.train.Checkpoint(model=TransformerTTS(**cfg)).write(str(tmp_path / "ckpt"))
    tokens, lengths = tf.constant([[3, 4, 5, 6, 7]]), tf.constant([5])
    mels = []
    for _ in range(2):
        model = TransformerTTS(**cfg)
        tf.train.Checkpoint(model=model).read(path).assert_existing_objects_matched()
        model.stop_out.bias.assign([-30.0])                                    # never stops: 6 steps
        mels += [model.infer(tokens, lengths, max_frames=12)["mel"].numpy() for _ in range(2)]
    for mel in mels[1:]:
        np.testing.assert_array_equal(mel, mels[0])
    no_dropout = TransformerTTS(**dict(cfg, prenet_dropout=0.0))
    tf.train.Checkpoint(model=no_dropout).read(path).expect_partial()
    no_dropout.stop_out.bias.assign([-30.0])
    assert not np.allclose(no_dropout.infer(tokens, lengths, max_frames=12)["mel"], mels[0])  # dropout is on


def test_a_sentence_decoded_in_a_batch_speaks_as_alone_and_as_its_teacher_forced_mel():
    """Pre-net dropout stays on at inference, seeded by the sentence's tokens; but the seed was folded
    from the whole batch's tokens, so a sentence decoded beside another got other masks than alone (and
    than its teacher-forced GTA mel): max |diff| ~1.5 in the normalised mel. Now each sentence's own."""
    model = TransformerTTS(**dict(TINY, prenet_dropout=0.5))
    model.stop_out.bias.assign([-30.0])                                           # never stops: 6 steps
    tokens, lengths = tf.constant([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10]]), tf.constant([3, 5])
    both = model.infer(tokens, lengths, max_frames=12)
    for b, n in enumerate(lengths.numpy()):
        alone = model.infer(tokens[b:b + 1, :n], lengths[b:b + 1], max_frames=12)
        np.testing.assert_allclose(both["mel"][b], alone["mel"][0], atol=1e-5, err_msg=f"sentence {b}")
    forced = model({"tokens": tokens, "token_lengths": lengths, "mel": both["mel_before"],
                    "mel_lengths": both["lengths"]})
    np.testing.assert_allclose(forced["mel_after"], both["mel"], atol=1e-4)


def test_frames_of_the_last_decoder_step_past_the_end_learn_the_padding():
    """Inference emits whole decoder steps (lengths = stop step x r), so up to r - 1 frames past a
    sentence's end; the loss masked them out, so they were never trained and spoke whatever came out.
    Now the mel terms cover them, toward the loader's padding (silence); frames past the last real
    step still add nothing, and the post-net sees the frames inference gives it."""
    model = TransformerTTS(**TINY)
    batch = make_batch()                               # row 1: 11 frames, so step 6's frame 11 is past the end
    out = model(batch)

    def loss(frame, shift=3.0):
        mel = batch["mel"].numpy()
        mel[1, frame] += shift
        return tts_loss(out, dict(batch, mel=tf.constant(mel)), reduction=R, **LOSS)[1]["mel_before"]

    base = tts_loss(out, batch, reduction=R, **LOSS)[1]["mel_before"]
    assert not np.isclose(loss(11), base)                                      # trained toward its target
    np.testing.assert_allclose(loss(12), base, rtol=1e-6)                      # past the last real step
    forced = model(dict(batch, mel_lengths=tf.constant([16, 12])))             # what inference post-nets
    np.testing.assert_allclose(forced["mel_after"][1, :12], out["mel_after"][1, :12], atol=1e-6)


def test_a_killed_job_leaves_no_generated_source_in_tmpdir(tmp_path):
    """A job killed mid-run (SIGKILL, a SLURM time limit) skips its exit handlers: any function AutoGraph
    converted leaves its generated source in $TMPDIR for good. Teacher-forced inference (the GTA mels'
    and validation's per-clip seeds and pre-net dropout) and autoregressive decoding convert nothing."""
    assert left_in_tmpdir(tmp_path, """
import tensorflow as tf
from test_model import TINY, make_batch
from pipeline.models.transformer_tts import TransformerTTS
model = TransformerTTS(**dict(TINY, prenet_dropout=0.5))
model(make_batch())
model.decode_autoregressive(tf.constant([[3, 4, 5]]), tf.constant([3]), max_steps=2, stop_threshold=0.5)
""") == []


def test_positions_add_alpha_times_the_sinusoids_of_each_position():
    """Li et al. 2019: x + alpha * [sin(p w_k), cos(p w_k)] with w_k = 10000^(-2k/d), alpha learned."""
    layer = ScaledPositions(8)
    layer.build()
    layer.alpha.assign(0.5)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
    angle = np.arange(5)[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)[None, :]          # (T, d/2)
    expected = x + 0.5 * np.concatenate([np.sin(angle), np.cos(angle)], axis=-1)[None]
    np.testing.assert_allclose(layer(tf.constant(x)), expected, atol=1e-5)


def test_attention_is_scaled_dot_product_attention_per_head():
    """Vaswani et al. 2017: softmax(Q_h K_h^T / sqrt(d_model / heads)) V_h per head, heads concatenated,
    then the output projection; keys that are not allowed get weight 0."""
    rng = np.random.default_rng(0)
    layer = Attention(8, 2)
    layer.build()
    for v in layer.weights:                                                       # large enough for the scale to matter
        v.assign(rng.normal(size=v.shape, scale=1.0))
    x, source = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 4, 8))
    allowed = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)[:, None, None, :]      # row 1: two padded keys
    y, weights = layer(tf.constant(x, tf.float32), tf.constant(source, tf.float32), tf.constant(allowed))
    (wq, bq), (wkv, bkv), (wo, bo) = [(d.kernel.numpy(), d.bias.numpy()) for d in (layer.query, layer.key_value, layer.out)]
    q, kv = x @ wq + bq, source @ wkv + bkv
    k, v = kv[..., :8], kv[..., 8:]
    heads = []
    for h in range(2):
        cols = slice(4 * h, 4 * h + 4)
        scores = np.einsum("bqc,bkc->bqk", q[..., cols], k[..., cols]) / np.sqrt(4)
        scores = np.where(allowed[:, 0], scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(weights[:, h], p, atol=1e-5)
        heads.append(p @ v[..., cols])
    np.testing.assert_allclose(y, np.concatenate(heads, -1) @ wo + bo, atol=1e-4)
    assert np.all(weights.numpy()[1, :, :, 2:] == 0)


def test_loss_terms_are_the_masked_means_of_the_paper_terms():
    """Mel L1 over every frame of the real decoder steps, stop BCE (positives weighted) and guided
    attention W = 1 - exp(-(n/N - t/T)^2 / 2g^2) over real (step, token) cells, recomputed in numpy."""
    rng = np.random.default_rng(3)
    r, lengths, tokens, S, T, M = 2, np.array([7, 12]), np.array([3, 5]), 6, 5, 4
    mel = rng.normal(size=(2, S * r, M))
    outputs = {"mel_before": rng.normal(size=mel.shape), "mel_after": rng.normal(size=mel.shape),
               "stop_logits": rng.normal(size=(2, S)) * 3, "alignment": rng.dirichlet(np.ones(T), size=(2, S))}
    batch = {"mel": tf.constant(mel, tf.float32), "mel_lengths": tf.constant(lengths, tf.int32),
             "token_lengths": tf.constant(tokens, tf.int32)}
    total, terms = tts_loss({k: tf.constant(v, tf.float32) for k, v in outputs.items()}, batch, reduction=r,
                            guided_attention_sigma=0.3, guided_attention_weight=3.0, stop_weight=0.7)
    N = -(-lengths // r)                                                          # real decoder steps
    frame = (np.arange(S * r)[None, :] < N[:, None] * r)[:, :, None]
    for key in ("mel_before", "mel_after"):
        expected = (np.abs(outputs[key] - mel) * frame).sum() / (frame.sum() * M)
        np.testing.assert_allclose(terms[key], expected, rtol=1e-5, err_msg=key)
    step = np.arange(S)[None, :] < N[:, None]
    target, p = np.arange(S)[None, :] >= N[:, None] - 1, 1 / (1 + np.exp(-outputs["stop_logits"]))
    bce = -(STOP_POS_WEIGHT * target * np.log(p) + (1 - target) * np.log(1 - p))
    np.testing.assert_allclose(terms["stop"], bce[step].mean(), rtol=1e-5)
    n, t = np.arange(S)[None, :, None] / N[:, None, None], np.arange(T)[None, None, :] / tokens[:, None, None]
    w = 1 - np.exp(-(n - t) ** 2 / (2 * 0.3 ** 2))
    cell = step[:, :, None] & (np.arange(T)[None, None, :] < tokens[:, None, None])
    np.testing.assert_allclose(terms["guided_attention"], (outputs["alignment"] * w)[cell].mean(), rtol=1e-5)
    expected = terms["mel_before"] + terms["mel_after"] + 0.7 * terms["stop"] + 3.0 * terms["guided_attention"]
    np.testing.assert_allclose(total, expected, rtol=1e-6)


def test_post_net_adds_its_residual_to_the_decoder_frames():
    """mel_after = mel_before + post-net(mel_before); the last conv is linear (Tacotron 2), so a last
    layer of zero weights and bias c adds exactly c to every frame."""
    model = TransformerTTS(**TINY)
    last = model.postnet[-1]
    last.kernel.assign(tf.zeros_like(last.kernel))
    last.bias.assign(tf.fill(last.bias.shape, 2.0))
    out = model(make_batch())
    np.testing.assert_allclose(out["mel_after"], out["mel_before"] + 2.0, atol=1e-5)


def _stopping_at_multiples_of_its_length(monkeypatch):
    """(a model, tokens, lengths): a batch of sentences of 2 and 5 tokens, and a model whose stop head is
    replaced by one firing at every decoder step that is a multiple of the sentence's token count (so a
    sentence of 2 tokens would stop at steps 2, 4, 6 ...)."""
    model = TransformerTTS(**TINY)
    decode = model.decode

    def decode_with_that_stop(dec_in, memory, token_mask, seed, training=False):
        frames, _, alignment = decode(dec_in, memory, token_mask, seed, training=training)
        steps = tf.range(1, tf.shape(dec_in)[1] + 1)[None, :]
        count = tf.reduce_sum(tf.cast(token_mask, tf.int32), axis=1)[:, None]
        return frames, tf.where(steps % count == 0, 30.0, -30.0), alignment
    monkeypatch.setattr(model, "decode", decode_with_that_stop)
    return model, tf.constant([[3, 4, 0, 0, 0], [5, 6, 7, 8, 9]]), tf.constant([2, 5])


def test_a_sentence_that_stopped_keeps_its_length_and_mel_while_the_batch_decodes_on(monkeypatch):
    model, tokens, lengths = _stopping_at_multiples_of_its_length(monkeypatch)
    out = model.decode_autoregressive(tokens, lengths, max_steps=8, stop_threshold=0.5)
    assert list(out["lengths"].numpy()) == [2 * R, 5 * R] and np.all(out["stopped"])
    assert np.all(out["mel"][0, 2 * R:] == 0) and np.all(out["mel"][1, 5 * R:] == 0)
    # the first sentence's mel is the one it gets alone, though the batch went on decoding past its end
    alone = model.decode_autoregressive(tokens[:1, :2], lengths[:1], max_steps=8, stop_threshold=0.5)
    assert int(alone["lengths"][0]) == 2 * R
    np.testing.assert_allclose(out["mel"][0, :2 * R], alone["mel"][0, :2 * R], atol=1e-5)


def test_pace_resamples_each_sentence_of_a_batch_over_its_own_length(monkeypatch):
    model, tokens, lengths = _stopping_at_multiples_of_its_length(monkeypatch)
    base = model.infer(tokens, lengths, max_frames=16)
    n = base["lengths"].numpy()                                                   # 4 and 10 frames
    slow = model.infer(tokens, lengths, pace=0.7, max_frames=16)
    new = np.round(n / 0.7).astype(int)                                           # 6 and 14 frames
    assert list(slow["lengths"].numpy()) == list(new)
    for b in range(2):                                                            # linear interpolation in time
        src = np.arange(new[b]) * n[b] / new[b]
        expected = np.stack([np.interp(src, np.arange(n[b]), base["mel"][b, :n[b], m]) for m in range(TINY["n_mels"])], -1)
        np.testing.assert_allclose(slow["mel"][b, :new[b]], expected, atol=1e-5)
        assert np.all(slow["mel"][b, new[b]:] == 0)
    fast = model.infer(tokens, lengths, pace=12.0, max_frames=16)                 # 4/12 rounds to 0: one frame
    assert list(fast["lengths"].numpy()) == [1, 1]


def test_infer_stops_at_the_models_stop_threshold_and_keeps_it_in_its_config():
    """p(stop) = 0.73 at every step: over the default 0.5 (the first step would end the sentence), under
    the model's 0.9, so it never stops, nor does the same model rebuilt from its config."""
    model = TransformerTTS(**TINY, stop_threshold=0.9)
    again = TransformerTTS(**model.get_config())
    assert again.stop_threshold == 0.9
    tokens, lengths = tf.constant([[3, 4, 5]]), tf.constant([3])
    model.stop_out.kernel.assign(tf.zeros_like(model.stop_out.kernel))
    model.stop_out.bias.assign([1.0])
    assert int(model.infer(tokens, lengths, max_frames=3 * R)["lengths"][0]) == 3 * R


def test_infer_cuts_a_sentence_at_max_frames_though_it_is_no_whole_step():
    """max_frames not a multiple of r: the last step is decoded whole and cut, so a sentence cut there has
    exactly max_frames frames (synthesize reports it cut) and has not stopped."""
    model = TransformerTTS(**TINY)
    model.stop_out.bias.assign([-30.0])                                           # never stops
    tokens, lengths = tf.constant([[3, 4, 5]]), tf.constant([3])
    for max_frames in (11, 1):
        out = model.infer(tokens, lengths, max_frames=max_frames)
        assert int(out["lengths"][0]) == max_frames and out["mel"].shape[1] == max_frames
        assert not out["stopped"][0]


def test_decoding_reaches_max_positions_steps_and_no_further():
    model = TransformerTTS(**TINY, max_positions=4)
    model.stop_out.bias.assign([-30.0])                                           # never stops
    tokens, lengths = tf.constant([[3, 4, 5]]), tf.constant([3])
    out = model.decode_autoregressive(tokens, lengths, max_steps=4, stop_threshold=0.5)
    assert int(out["lengths"][0]) == 4 * R
    with pytest.raises(ValueError, match="max_positions=4"):
        model.decode_autoregressive(tokens, lengths, max_steps=5, stop_threshold=0.5)


def test_the_language_id_changes_what_is_spoken():
    model = TransformerTTS(**TINY, n_languages=2)
    batch = make_batch()
    mels = [model(dict(batch, language=tf.constant([i, i], tf.int32)))["mel"].numpy() for i in (0, 1)]
    assert np.abs(mels[0] - mels[1]).max() > 1e-3


def test_a_block_whose_sublayers_add_nothing_passes_its_input_through():
    """Pre-LN residual blocks: x + attention(LN x) [+ cross-attention(LN x, memory)] + FFN(LN x); with each
    sublayer's output projection zero, what comes out is what went in."""
    rng = np.random.default_rng(0)
    block = Block(8, 2, 16, 0.0, cross=True)
    block.build()
    for dense in (block.self_attn.out, block.cross_attn.out, block.ffn_out):
        dense.kernel.assign(tf.zeros_like(dense.kernel))
        dense.bias.assign(tf.zeros_like(dense.bias))
    x, memory = tf.constant(rng.normal(size=(2, 3, 8)), tf.float32), tf.constant(rng.normal(size=(2, 4, 8)), tf.float32)
    y, weights = block(x, tf.ones([1, 1, 3, 3], bool), memory, tf.ones([2, 1, 1, 4], bool))
    np.testing.assert_allclose(y, x, atol=1e-6)
    assert weights.shape == (2, 2, 3, 4)                                          # the cross-attention's


def test_alignment_is_the_head_mean_of_the_last_decoders_cross_attention(monkeypatch):
    model = TransformerTTS(**TINY)
    cross, seen = model.decoder[-1].cross_attn, []
    call = cross.call

    def recording(x, source, allowed):
        y, weights = call(x, source, allowed)
        seen.append(weights)
        return y, weights
    monkeypatch.setattr(cross, "call", recording)
    out = model(make_batch())
    assert len(seen) == 1 and seen[0].shape[1] == TINY["heads"]
    assert np.abs(seen[0][:, 0] - seen[0][:, 1]).max() > 1e-4                    # the heads attend differently
    np.testing.assert_allclose(out["alignment"], tf.reduce_mean(seen[0], axis=1), atol=1e-6)
