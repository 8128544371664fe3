"""FastPitch and the model interface: shapes, masks, learning, XLA, pace and pitch control, user kinds."""
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipeline import config, models
from pipeline.models.fastpitch import FastPitch

TINY = dict(n_symbols=12, n_mels=8, d_model=32, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=32,
            ffn_kernel=3, dropout=0.0, predictor_channels=16, predictor_kernel=3, predictor_dropout=0.0,
            loss_args=dict(duration_weight=0.1, pitch_weight=0.1, energy_weight=0.1))


def make_batch(durations=((3, 1, 4, 2, 2), (2, 5, 1, 0, 0)), F=16, seed=0, garbage=0.0):
    """Real content from per-token durations; padded tokens and frames hold `garbage`."""
    rng = np.random.default_rng(seed)
    d = np.asarray(durations, np.int32)
    B, T = d.shape
    token_lengths = (d > 0).sum(1).astype(np.int32)
    mel_lengths = d.sum(1).astype(np.int32)
    tokens = rng.integers(1, TINY["n_symbols"], (B, T)).astype(np.int32)
    mel = rng.normal(size=(B, F, TINY["n_mels"])).astype(np.float32)
    pitch = np.where(rng.random((B, F)) < 0.7, rng.normal(size=(B, F)), 0.0).astype(np.float32)
    energy = rng.normal(size=(B, F)).astype(np.float32)
    for b in range(B):
        tokens[b, token_lengths[b]:] = garbage
        for x in (mel, pitch, energy):
            x[b, mel_lengths[b]:] = garbage
    return {"tokens": tf.constant(tokens), "token_lengths": tf.constant(token_lengths), "mel": tf.constant(mel),
            "mel_lengths": tf.constant(mel_lengths), "pitch": tf.constant(pitch), "energy": tf.constant(energy),
            "durations": tf.constant(d)}


def test_shapes_loss_terms_and_padding_invariance():
    model = FastPitch(**TINY)
    batch = make_batch()
    out = model(batch)
    assert out["mel"].shape == (2, 16, 8) and out["log_duration"].shape == (2, 5)
    assert all(v.dtype == tf.float32 for v in out.values())
    total, terms = model.tts_loss(out, batch)
    assert set(terms) == {"mel", "duration", "pitch", "energy", "total"}
    np.testing.assert_allclose(total, terms["mel"] + 0.1 * (terms["duration"] + terms["pitch"] + terms["energy"]),
                               rtol=1e-6)
    # more padding, filled with other garbage: the real outputs and the loss do not move
    wide = make_batch(durations=((3, 1, 4, 2, 2, 0, 0), (2, 5, 1, 0, 0, 0, 0)), F=24, garbage=7.0)
    wide = {**wide, **{k: tf.pad(batch[k], [[0, 0], [0, 8]] + [[0, 0]] * (batch[k].shape.rank - 2),
                                 constant_values=7.0) for k in ("mel", "pitch", "energy")}}
    wide["tokens"] = tf.pad(batch["tokens"], [[0, 0], [0, 2]], constant_values=5)
    out_wide = model(wide)
    for b, (t, f) in enumerate(zip(batch["token_lengths"].numpy(), batch["mel_lengths"].numpy())):
        np.testing.assert_allclose(out_wide["mel"][b, :f], out["mel"][b, :f], atol=1e-5)
        np.testing.assert_allclose(out_wide["log_duration"][b, :t], out["log_duration"][b, :t], atol=1e-5)
        assert not np.any(out_wide["mel"][b, f:])
    for k, v in model.tts_loss(out_wide, wide)[1].items():
        np.testing.assert_allclose(v, terms[k], rtol=1e-5, err_msg=k)


def test_tiny_model_learns_and_compiles_under_xla_with_bfloat16():
    keras.utils.set_random_seed(0)
    model = FastPitch(**TINY)
    opt = keras.optimizers.Adam(3e-3)
    opt.build(model.trainable_variables)
    batch = make_batch()

    @tf.function(jit_compile=True)
    def step(batch):
        with tf.GradientTape() as tape:
            total, terms = model.tts_loss(model(batch, training=True), batch)
        opt.apply(tape.gradient(total, model.trainable_variables), model.trainable_variables)
        return terms

    losses = [float(step(batch)["total"]) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert step.experimental_get_tracing_count() == 1


def test_mixed_bfloat16_outputs_stay_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = FastPitch(**TINY)
        out = model(make_batch())
        assert model.mel_out.compute_dtype == "bfloat16"
        assert all(v.dtype == tf.float32 for v in out.values())
        assert np.isfinite(model.tts_loss(out, make_batch())[0])
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_infer_pace_scales_lengths_and_pitch_shift_moves_pitch_in_semitones():
    model = FastPitch(**TINY)
    model.duration_predictor.out.bias.assign([np.log(1 + 6.0)])  # ~6 frames a token, whatever the input
    model.duration_predictor.out.kernel.assign(tf.zeros_like(model.duration_predictor.out.kernel))
    model.adapt({"pitch_mean": 200.0, "pitch_std": 50.0})
    tokens, lengths = tf.constant([[3, 4, 5, 6, 7, 8, 9, 10]]), tf.constant([8])
    n = {pace: int(model.infer(tokens, lengths, pace=pace, max_frames=1000)["lengths"][0]) for pace in (0.5, 1, 2)}
    assert n[1] == 48 and n[0.5] == 96 and n[2] == 24
    capped = model.infer(tokens, lengths, pace=0.5, max_frames=50)
    assert int(capped["lengths"][0]) == 50 and capped["mel"].shape[1] == 50
    base = model.infer(tokens, lengths, max_frames=1000)
    up = model.infer(tokens, lengths, pitch_shift=12.0, max_frames=1000)
    hz, hz_up = base["pitch"][0] * 50 + 200, up["pitch"][0] * 50 + 200
    np.testing.assert_allclose(hz_up / hz, 2.0, rtol=1e-4)                   # an octave up
    with pytest.raises(ValueError, match="pace"):
        model.infer(tokens, lengths, pace=0.0, max_frames=10)
    two = model.infer(tf.constant([[3, 4, 5, 0], [6, 7, 8, 9]]), tf.constant([3, 4]), max_frames=1000)
    assert two["lengths"].numpy().tolist() == [18, 24]  # another batch and length: the same graph
    # a diverged duration predictor (e^25 frames a token) is cut at max_frames; past int32, lengths
    # went negative and the voice said nothing, with no word of a cut
    model.duration_predictor.out.bias.assign([25.0])
    wild = model.infer(tokens, lengths, max_frames=1000)
    assert int(wild["lengths"][0]) == 1000 and wild["mel"].shape[1] == 1000
    assert wild["durations"].numpy().min() >= 0 and wild["durations"].numpy().sum() == 1000
    assert model._infer.experimental_get_tracing_count() == 1


def test_an_utterance_of_no_frames_decodes_a_silent_frame_and_runs_in_tflite():
    # every token under half a frame (a short text at a fast pace, an undertrained predictor): the
    # decoder still runs on a frame, which lengths 0 leaves out. On zero frames the exported TFLite
    # graph failed ("XNNPack delegate failed to reshape runtime")
    import tempfile

    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    model = FastPitch(**TINY)
    model.duration_predictor.out.bias.assign([np.log(1 + 0.5)])  # half a frame a token, whatever the input
    model.duration_predictor.out.kernel.assign(tf.zeros_like(model.duration_predictor.out.kernel))
    model.adapt({"pitch_mean": 200.0, "pitch_std": 50.0})
    tokens = tf.constant([[3, 4, 5]])
    for out in (model.infer(tokens, tf.constant([3]), pace=10.0, max_frames=100),
                model.infer_at(tokens, tf.constant([3]), tf.zeros([1, 3], tf.int32))):
        assert out["lengths"].numpy().tolist() == [0] and out["mel"].shape[1] >= 1 and not np.any(out["mel"])

    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32), tf.TensorSpec([], tf.float32)])
    def mel(tokens, pace):   # as pipeline.export folds the weights in
        out = model.infer(tokens, tf.shape(tokens)[1:], pace=pace, max_frames=100)
        return {"mel": out["mel"][0], "lengths": out["lengths"]}
    frozen = convert_variables_to_constants_v2(mel.get_concrete_function())
    module = tf.Module()
    module.graph, module.mel = frozen, tf.function(lambda tokens, pace: dict(zip(("lengths", "mel"), tf.nest.flatten(
        frozen(tokens, pace)))), input_signature=mel.input_signature)
    with tempfile.TemporaryDirectory() as folder:
        tf.saved_model.save(module, folder, signatures={"mel": module.mel.get_concrete_function()})
        converter = tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys=["mel"])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        runner = tf.lite.Interpreter(model_content=converter.convert()).get_signature_runner("mel")
    for pace, frames in ((1.0, 2), (10.0, 0)):
        got = runner(tokens=np.array([[3, 4, 5]], np.int32), pace=np.float32(pace))
        assert got["lengths"].tolist() == [frames] and len(got["mel"]) >= frames


def test_infer_at_given_durations_and_pitch_is_infer_on_that_timing():
    model = FastPitch(**TINY)
    model.duration_predictor.out.bias.assign([np.log(1 + 6.0)])  # 6 frames a token, whatever the input
    model.duration_predictor.out.kernel.assign(tf.zeros_like(model.duration_predictor.out.kernel))
    model.adapt({"pitch_mean": 200.0, "pitch_std": 50.0})
    tokens, lengths = tf.constant([[3, 4, 5, 6, 0], [7, 8, 9, 10, 11]]), tf.constant([4, 5])
    free = model.infer(tokens, lengths, max_frames=1000)
    same = model.infer_at(tokens, lengths, free["durations"])  # the timing infer chose: infer's outputs
    for k in ("mel", "lengths", "durations", "pitch", "energy"):
        np.testing.assert_allclose(same[k], free[k], atol=1e-5, err_msg=k)
    durations = tf.constant([[1, 9, 2, 4, 0], [3, 3, 0, 5, 1]])  # a recording's timing (0: a skipped token)
    timed = model.infer_at(tokens, lengths, durations)
    assert timed["lengths"].numpy().tolist() == [16, 12] and timed["mel"].shape[1] == 16
    assert not np.any(timed["mel"][1, 12:])
    np.testing.assert_allclose(timed["pitch"], free["pitch"], atol=1e-5)  # token pitch: the timing's no input
    recorded = tf.constant([[1.0, -1.0, 0.5, 2.0, 0.0], [0.0, 1.5, -0.5, 1.0, -2.0]])
    forced = model.infer_at(tokens, lengths, durations, pitch=recorded)
    np.testing.assert_allclose(forced["pitch"], recorded * tf.sequence_mask(lengths, 5, tf.float32))
    assert np.abs(forced["mel"] - timed["mel"]).max() > 1e-3  # the decoder hears the pitch it is given


def test_checkpoint_restores_every_weight_including_pitch_stats(tmp_path):
    model, fresh = FastPitch(**TINY), FastPitch(**TINY)
    model.adapt({"pitch_mean": 180.0, "pitch_std": 40.0})
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=fresh).read(path).assert_consumed()
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert list(fresh.pitch_stats.numpy()) == [180.0, 40.0]


USER_MODEL = '''
    """A user's own model kind: one dense layer from token embeddings, repeated by durations."""
    import tensorflow as tf
    import keras


    class Tiny(keras.Model):
        needs = ("tokens", "token_lengths", "mel", "mel_lengths")

        def __init__(self, n_symbols, n_mels, width):
            super().__init__()
            self.embed = keras.layers.Embedding(n_symbols, width)
            self.out = keras.layers.Dense(n_mels)

        def call(self, batch, training=False):
            h = tf.reduce_mean(self.embed(batch["tokens"]), axis=1, keepdims=True)        # (B, 1, W)
            frames = tf.shape(batch["mel"])[1]
            return {"mel": tf.tile(self.out(h), [1, frames, 1])}

        def tts_loss(self, outputs, batch):
            mask = tf.sequence_mask(batch["mel_lengths"], tf.shape(batch["mel"])[1], tf.float32)[:, :, None]
            loss = tf.reduce_sum(tf.abs(outputs["mel"] - batch["mel"]) * mask) / tf.reduce_sum(mask) / 8.0
            return loss, {"mel": loss, "total": loss}

        def infer(self, tokens, token_lengths, *, pace=1.0, pitch_shift=0.0, max_frames):
            frames = min(int(20 / pace), max_frames)
            mel = tf.tile(self.out(tf.reduce_mean(self.embed(tokens), axis=1, keepdims=True)), [1, frames, 1])
            return {"mel": mel, "lengths": tf.fill([tf.shape(tokens)[0]], frames)}


    def build(model_cfg, vocab, n_mels):
        return Tiny(len(vocab), n_mels, **model_cfg["options"])


    def broken(model_cfg, vocab, n_mels):
        return keras.Sequential([keras.layers.Dense(n_mels)])
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    pkg = tmp_path / "user_models"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tiny.py").write_text(textwrap.dedent(USER_MODEL))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("user_models.tiny", None)
    sys.modules.pop("user_models", None)


def test_user_model_kind_is_built_and_checked(user_package):
    cfg = config.load_config(overrides={"model": {"kind": "user_models.tiny:build", "options": {"width": 8}}})
    model = models.build(cfg["model"], {"symbols": list("abcdef")}, 80)
    assert type(model).__name__ == "Tiny" and models.frame_multiple(cfg["model"]) == 1
    with pytest.raises(models.ModelError, match="without"):
        models.build({**cfg["model"], "kind": "user_models.tiny:broken"}, list("abc"), 80)
    with pytest.raises(models.ModelError, match="no function 'nope'"):
        models.build({**cfg["model"], "kind": "user_models.tiny:nope"}, list("abc"), 80)
    with pytest.raises(models.ModelError, match="cannot import"):
        models.build({**cfg["model"], "kind": "not_there.mod:build"}, list("abc"), 80)
    with pytest.raises(config.ConfigError, match="model.kind"):
        config.load_config(overrides={"model": {"kind": "no colon"}})
    # a built-in kind never silently ignores options meant for a user's model
    with pytest.raises(models.ModelError, match="model.options"):
        models.build({**cfg["model"], "kind": "fastpitch"}, {"symbols": list("abcdef")}, 80)


@pytest.mark.parametrize("source, message", [
    ("def build(model_cfg, vocab, n_mels):\n    return (\n", "broken.py:2: SyntaxError: '(' was never closed"),
    ("import json\nraise RuntimeError('needs a GPU')\n", "broken.py:2: RuntimeError: needs a GPU"),
    # its own dependency missing: not "put it on PYTHONPATH", which it is
    ("import not_installed_dep\n", "broken.py:1: ModuleNotFoundError: No module named 'not_installed_dep'"),
])
def test_a_user_kind_that_fails_to_import_is_one_line_naming_its_file_and_line(user_package, source, message):
    # a syntax error or an exception in the user's module came out of planning as Snakemake's traceback
    (user_package / "user_models" / "broken.py").write_text(source)
    try:
        with pytest.raises(models.ModelError) as caught:
            models.check_kind({"kind": "user_models.broken:build"})
    finally:
        sys.modules.pop("user_models.broken", None)
    text = str(caught.value)
    assert text.startswith("model.kind: importing 'user_models.broken' failed: ") and "\n" not in text
    assert text.endswith(message) and str(user_package / "user_models") in text, text


def test_frame_multiple_comes_from_the_config_and_the_model_must_agree(user_package):
    from pipeline.train import check_frame_multiple
    cfg = config.load_config(overrides={"model": {"kind": "user_models.tiny:build", "options": {"width": 8}}})["model"]
    model = models.build(cfg, {"symbols": list("abcdef")}, 80)
    check_frame_multiple(cfg, model)  # neither says anything: 1
    model.frame_multiple = 2
    with pytest.raises(models.ModelError, match="has frame_multiple 2, but the config gives 1; set "
                                                "model.options.frame_multiple: 2"):
        check_frame_multiple(cfg, model)
    with_option = dict(cfg, options={"width": 8, "frame_multiple": 2})
    assert models.frame_multiple(with_option) == 2
    check_frame_multiple(with_option, model)
    with pytest.raises(models.ModelError, match="model.options.frame_multiple: 0"):
        models.frame_multiple(dict(cfg, options={"frame_multiple": 0}))


def test_loss_terms_are_the_masked_means_of_their_definitions():
    # from the batch alone: mel L1 over real frames and bands; MSE over real tokens of log(1 + duration),
    # and of the token means of pitch (voiced frames only) and energy; the total weights each term
    weights = dict(duration_weight=0.2, pitch_weight=0.3, energy_weight=0.5)
    model = FastPitch(**{**TINY, "loss_args": weights})
    batch = make_batch()
    out = model(batch)
    total, terms = model.tts_loss(out, batch)
    d, tokens, frames = (batch[k].numpy() for k in ("durations", "token_lengths", "mel_lengths"))
    pitch, energy = batch["pitch"].numpy(), batch["energy"].numpy()
    mel_l1 = np.mean(np.concatenate([np.abs(out["mel"][b, :f] - batch["mel"][b, :f]).ravel() for b, f in enumerate(frames)]))
    pitch_target, energy_target = np.zeros(d.shape), np.zeros(d.shape)
    for b in range(len(d)):
        for t, (start, end) in enumerate(zip(np.cumsum(d[b]) - d[b], np.cumsum(d[b]))):
            voiced = pitch[b, start:end][pitch[b, start:end] != 0]
            pitch_target[b, t] = voiced.mean() if len(voiced) else 0.0
            energy_target[b, t] = energy[b, start:end].mean() if end > start else 0.0
    np.testing.assert_allclose(out["pitch_target"], pitch_target, atol=1e-6)
    np.testing.assert_allclose(out["energy_target"], energy_target, atol=1e-6)

    def mse(pred, target):
        return np.mean(np.concatenate([(np.asarray(pred)[b, :t] - target[b, :t]) ** 2 for b, t in enumerate(tokens)]))
    expected = {"mel": mel_l1, "duration": mse(out["log_duration"], np.log1p(d)),
                "pitch": mse(out["pitch"], pitch_target), "energy": mse(out["energy"], energy_target)}
    for k, v in expected.items():
        np.testing.assert_allclose(terms[k], v, rtol=1e-5, err_msg=k)
    np.testing.assert_allclose(total, expected["mel"] + sum(w * expected[k.split("_")[0]] for k, w in weights.items()),
                               rtol=1e-5)


def test_the_decoder_hears_the_token_pitch_and_energy_of_the_batch():
    model = FastPitch(**TINY)
    batch = make_batch()
    mel = model(batch)["mel"]
    voiced = tf.cast(tf.not_equal(batch["pitch"], 0.0), tf.float32)
    for key, moved in (("pitch", batch["pitch"] + voiced), ("energy", batch["energy"] + 1.0)):
        assert np.abs(model({**batch, key: moved})["mel"] - mel).max() > 1e-3, key


def test_pitch_shift_moves_each_speakers_pitch_in_semitones_on_that_speakers_statistics():
    model = FastPitch(**TINY, n_speakers=2)
    mean, std = np.array([100.0, 220.0]), np.array([10.0, 40.0])
    model.adapt({"speaker_pitch_mean": mean, "speaker_pitch_std": std})
    tokens, lengths, speaker = tf.constant([[3, 4, 5, 6]] * 2), tf.constant([4, 4]), tf.constant([0, 1])
    base, up = (model.infer(tokens, lengths, pitch_shift=shift, max_frames=100, speaker=speaker)["pitch"].numpy()
                for shift in (0.0, 12.0))
    hz, hz_up = base * std[:, None] + mean[:, None], up * std[:, None] + mean[:, None]
    assert hz.min() > 0
    np.testing.assert_allclose(hz_up / hz, 2.0, rtol=1e-4)                   # an octave up, for each voice
