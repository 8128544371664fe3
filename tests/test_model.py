"""TransformerTTS: shapes, masks, causality, learning, XLA + mixed precision, inference. Tiny models, CPU."""
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from conftest import left_in_tmpdir

from pipeline import models
from pipeline.models.transformer_tts import TransformerTTS, tts_loss

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
    slow = model.infer(tokens, lengths, pace=0.5, max_frames=12)
    assert int(slow["lengths"][0]) == 24 and slow["mel"].shape == (1, 24, TINY["n_mels"])
    np.testing.assert_allclose(slow["mel"][0, ::2][:11], base["mel"][0, :11], atol=1e-5)  # same frames, spread
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
