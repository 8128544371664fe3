"""The aligner stage's pieces on synthetic tensors: MAS, the length regulator, the prior, the forward-sum loss."""
import json

import numpy as np
import pytest
import tensorflow as tf

from pipeline.durations import check, even_durations, mas
from pipeline.models import aligner as al
from pipeline.models.fastpitch import regulate_length, token_average


def planted(durations, rng, noise=0.5):
    """Log-probs (F, T) that favour the planted alignment, with noise."""
    F, T = int(sum(durations)), len(durations)
    lp = np.full((F, T), np.log(0.2 / T))
    lp[np.arange(F), np.repeat(np.arange(T), durations)] = np.log(0.8)
    return lp + rng.normal(0, noise, size=lp.shape)


def test_mas_recovers_planted_durations():
    rng = np.random.default_rng(0)
    for _ in range(20):
        d = rng.integers(1, 12, size=rng.integers(1, 40))
        out = mas(planted(d, rng))
        np.testing.assert_array_equal(out, d)
        assert out.dtype == np.int32


def test_mas_paths_are_monotonic_cover_every_frame_and_give_every_token_a_frame():
    rng = np.random.default_rng(1)
    for F, T in [(5, 5), (9, 1), (30, 7), (200, 60)]:
        d = mas(rng.normal(size=(F, T)))  # no structure at all: still a valid path
        assert d.sum() == F and d.min() >= 1 and len(d) == T
    lp = np.zeros((6, 3))
    lp[:, 1] = 5.0  # token 1 is best everywhere, yet tokens 0 and 2 each keep one frame
    np.testing.assert_array_equal(mas(lp), [1, 4, 1])


def test_fallback_and_sanity_checks():
    d = even_durations(7, 4)
    assert d.sum() == 4 and len(d) == 7
    assert "4 mel frames for 7 tokens: the audio is too short" in check(d, 4, 100)
    assert "token 1 lasts 50 frames" in check(np.array([2, 50, 3], np.int32), 55, 40)
    assert check(np.array([2, 5, 3], np.int32), 10, 40) is None
    assert "sum to 10" in check(np.array([2, 5, 3], np.int32), 11, 40)
    assert check(np.ones(3, np.int32), 3, 40) is None                  # a frame a token: short, not too short
    assert check(np.array([2, 40, 3], np.int32), 45, 40) is None       # a token of exactly the longest allowed


def test_length_regulator_is_exact_inside_an_xla_graph_with_static_shapes():
    rng = np.random.default_rng(2)
    B, T, D, F = 3, 11, 4, 64
    durations = rng.integers(0, 6, size=(B, T)).astype(np.int32)
    durations[2, 7:] = 0                                        # a padded clip
    x = rng.normal(size=(B, T, D)).astype(np.float32)
    fn = tf.function(lambda x, d: regulate_length(x, d, F), jit_compile=True)
    y = fn(tf.constant(x), tf.constant(durations)).numpy()
    assert y.shape == (B, F, D)
    for b in range(B):
        ref = np.repeat(x[b], durations[b], axis=0)
        np.testing.assert_array_equal(y[b, :len(ref)], ref)  # bit-exact: a gather, no interpolation
        assert not y[b, len(ref):].any()


def test_token_average_of_pitch_skips_unvoiced_frames():
    d = tf.constant([[2, 3, 1]], tf.int32)
    pitch = tf.constant([[100.0, 0.0, 200.0, 220.0, 0.0, 0.0, 999.0]])  # last frame is padding
    np.testing.assert_allclose(token_average(pitch, d, only_nonzero=True), [[100.0, 210.0, 0.0]])
    np.testing.assert_allclose(token_average(pitch, d, only_nonzero=False), [[50.0, 140.0, 0.0]], rtol=1e-6)


def test_beta_binomial_prior_is_a_distribution_over_tokens_on_the_diagonal():
    logp = al.beta_binomial_log_prior(tf.constant([5, 3]), tf.constant([20, 9]), 6, 24, 1.0).numpy()
    probs = np.exp(logp[0, :20, :5])
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-4)
    peaks = probs.argmax(-1)
    assert peaks[0] == 0 and peaks[-1] == 4 and np.all(np.diff(peaks) >= 0)
    assert not logp[1, 9:].any() and not logp[1, :, 3:].any()  # outside the clip: 0 (no masking by the prior)


def test_forward_sum_loss_prefers_the_monotonic_alignment_and_ignores_padding():
    rng = np.random.default_rng(3)
    d = np.array([3, 2, 4])
    good = planted(d, rng, noise=0.0)
    bad = good[::-1].copy()                                       # the reversed (non-monotonic) alignment
    norm = lambda lp: tf.nn.log_softmax(tf.constant(lp[None], tf.float32), -1)  # noqa: E731
    tl, fl = tf.constant([3]), tf.constant([9])
    loss_good, loss_bad = al.forward_sum_loss(norm(good), tl, fl), al.forward_sum_loss(norm(bad), tl, fl)
    assert float(loss_good) < float(loss_bad) - 1.0
    padded = np.pad(good, [(0, 0), (0, 2)], constant_values=-1e4)  # padded tokens: as the aligner masks them
    padded = np.pad(padded, [(0, 5), (0, 0)], constant_values=-3.0)  # padded frames: anything
    np.testing.assert_allclose(al.forward_sum_loss(norm(padded), tl, fl), loss_good, rtol=1e-5)


def test_aligner_learns_a_planted_alignment():
    # tokens whose embedding must match mel frames: frame f shows token(f)'s one-hot pattern
    rng = np.random.default_rng(4)
    tf.keras.utils.set_random_seed(4)
    B, T, n_mels, n_sym = 4, 6, 8, 8
    durations = rng.integers(2, 6, size=(B, T))
    F = int(durations.sum(1).max())
    tokens = np.stack([rng.permutation(np.arange(1, n_sym))[:T] for _ in range(B)]).astype(np.int32)
    mel = np.zeros((B, F, n_mels), np.float32)
    for b in range(B):
        seq = np.repeat(tokens[b], durations[b])
        mel[b, :len(seq)] = np.eye(n_mels)[seq] * 3 + rng.normal(0, 0.1, (len(seq), n_mels))
    batch = {"tokens": tf.constant(tokens), "token_lengths": tf.constant([T] * B),
             "mel": tf.constant(mel), "mel_lengths": tf.constant(durations.sum(1).astype(np.int32))}
    model = al.Aligner(n_symbols=n_sym, n_mels=n_mels, d_model=16, temperature=0.05, prior_scaling=1.0)
    opt = tf.keras.optimizers.Adam(0.01)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss, _ = model.tts_loss(model(batch, training=True), batch)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    losses = [float(step()) for _ in range(150)]
    assert losses[-1] < 0.5 * losses[0], losses[::25]
    lp = model(batch)["log_probs"].numpy()
    for b in range(B):  # the forward-sum loss leaves a boundary frame's side free: within one frame
        found = mas(lp[b, :durations[b].sum()].astype(np.float64))
        assert np.abs(np.cumsum(found) - np.cumsum(durations[b])).max() <= 1, (found, durations[b])


@pytest.mark.parametrize("F", [1, 3])
def test_mas_single_token(F):
    np.testing.assert_array_equal(mas(np.zeros((F, 1))), [F])


@pytest.mark.parametrize("speakers, languages", [((), ()), (("ann", "bob", "cy"), ("en-us", "fr-fr"))])
def test_numpy_forward_is_the_tensorflow_aligner_to_float32_rounding(speakers, languages):
    """The duration jobs' forward pass (pipeline/models/aligner_numpy.py) against the model's own call,
    on random weights: every cell, padding left out, a speaker and language it never saw (-1)."""
    from pipeline.models import aligner_numpy

    cfg = {"d_model": 16, "temperature": 0.0005, "prior_scaling": 0.05}
    model = al.build(cfg, [chr(0x61 + i) for i in range(12)], 20, speakers=speakers, languages=languages)
    init = np.random.default_rng(7)
    for layer in model.layers:  # non-zero biases too, so a padding mistake would show
        layer.set_weights([init.normal(0, 0.3, w.shape).astype(np.float32) for w in layer.get_weights()])
    weights = aligner_numpy.arrays_of(model)
    info = {"aligner": cfg, "_stats": (np.zeros(20, np.float32), np.ones(20, np.float32))}  # the mel as it is
    rng = np.random.default_rng(5)
    voices = [{}] if not speakers else [{"speaker": 2, "language": 0}, {"speaker": -1, "language": -1}]
    for T, F in [(1, 3), (7, 40), (23, 130)]:
        for v in voices:
            tokens = rng.integers(1, 12, size=T).astype(np.int32)
            mel = rng.normal(size=(F, 20)).astype(np.float32)
            batch = {"tokens": np.pad(tokens, (0, 16 - T % 16))[None], "token_lengths": np.array([T], np.int32),
                     "mel": np.pad(mel, ((0, 64 - F % 64), (0, 0)))[None], "mel_lengths": np.array([F], np.int32),
                     **{f: np.array([i], np.int32) for f, i in v.items()}}
            want = model(batch)["log_probs"].numpy()[0, :F, :T]
            got = aligner_numpy.log_probs(weights, info, tokens, mel, v)
            assert got.shape == (F, T) and got.dtype == np.float64
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            np.testing.assert_array_equal(mas(got), mas(want.astype(np.float64)))


def _ctc_forward_sum(lp, blank):
    """-log of the summed probability of every CTC path of tokens 0..T-1 through frames lp (F, T)
    (log-probabilities over the tokens, a blank column of constant log-score `blank` beside them, all
    renormalised together), by the textbook forward recursion over the blank-interleaved labels."""
    F, T = lp.shape
    if F < T:
        return 0.0                                                   # no path: left out of the loss
    cols = np.concatenate([lp, np.full((F, 1), blank)], axis=1)
    y = cols - np.logaddexp.reduce(cols, axis=1, keepdims=True)
    ext = [T if s % 2 == 0 else s // 2 for s in range(2 * T + 1)]   # blank, 0, blank, 1, ..., blank
    alpha = np.full(2 * T + 1, -np.inf)
    alpha[0], alpha[1] = y[0, T], y[0, 0]
    for f in range(1, F):
        prev = alpha.copy()
        for s in range(2 * T + 1):
            terms = [prev[s]] + ([prev[s - 1]] if s >= 1 else []) + ([prev[s - 2]] if s >= 2 and ext[s] != T else [])
            alpha[s] = np.logaddexp.reduce(terms) + y[f, ext[s]]
    return -np.logaddexp(alpha[-1], alpha[-2])


def test_forward_sum_loss_is_the_ctc_likelihood_per_token_averaged_over_clips():
    """Each clip's -log P(its tokens in order | frames), blank column at log-score -1 as in NeMo, divided
    by its token count, the batch's mean; a clip with fewer frames than tokens has no path and adds 0."""
    rng = np.random.default_rng(8)
    shapes = [(9, 4), (14, 6), (3, 5)]                              # (frames, tokens); the last: too few frames
    F, T = max(f for f, _ in shapes), max(t for _, t in shapes)
    padded = np.full((len(shapes), F, T), -1e4, np.float32)          # padded tokens: as the aligner masks them
    want = []
    for b, (f, t) in enumerate(shapes):
        lp = rng.normal(0, 2, (f, t))
        lp -= np.logaddexp.reduce(lp, axis=1, keepdims=True)
        padded[b, :f, :t] = lp
        padded[b, f:, :t] = rng.normal(0, 2, (F - f, t))             # padded frames: anything
        want.append(_ctc_forward_sum(lp.astype(np.float32).astype(np.float64), -1.0) / t)
    got = al.forward_sum_loss(tf.constant(padded), tf.constant([t for _, t in shapes]),
                              tf.constant([f for f, _ in shapes]))
    assert want[2] == 0.0 and np.isfinite(float(got))
    np.testing.assert_allclose(float(got), np.mean(want), rtol=1e-4)


def _random_aligner(cfg, n_mels=20, **voices):
    """An aligner of 12 symbols with random weights, biases too (so a padding mistake shows)."""
    model = al.build(cfg, [chr(0x61 + i) for i in range(12)], n_mels, **voices)
    init = np.random.default_rng(7)
    for layer in model.layers:
        layer.set_weights([init.normal(0, 0.3, w.shape).astype(np.float32) for w in layer.get_weights()])
    return model


def test_aligner_log_probs_of_a_clip_are_the_same_whatever_its_batch_padding_holds():
    """Training pads each clip to its bucket (frames at the loader's silence value after normalisation,
    tokens with some id): the clip's log-probabilities are still the ones it gets alone, unpadded, as the
    duration jobs compute them."""
    model = _random_aligner({"d_model": 16, "temperature": 0.05, "prior_scaling": 1.0},
                            speakers=("ann", "bob"), languages=("de", "en"))
    rng = np.random.default_rng(9)
    shapes, F, T = [(20, 5), (33, 9)], 64, 16
    clips = [(rng.integers(1, 12, t).astype(np.int32), rng.normal(size=(f, 20)).astype(np.float32)) for f, t in shapes]

    def voices(n, speaker):
        return {"speaker": np.full(n, speaker, np.int32), "language": np.full(n, 1 - speaker, np.int32)}

    tokens = rng.integers(1, 12, (2, T)).astype(np.int32)             # padding: not the clips' tokens
    mel = np.full((2, F, 20), -2.5, np.float32) + rng.normal(0, 1, (2, F, 20)).astype(np.float32)
    for b, (tok, m) in enumerate(clips):
        tokens[b, :len(tok)], mel[b, :len(m)] = tok, m
    batched = model({"tokens": tokens, "token_lengths": np.array([t for _, t in shapes], np.int32), "mel": mel,
                     "mel_lengths": np.array([f for f, _ in shapes], np.int32),
                     "speaker": np.array([0, 1], np.int32), "language": np.array([1, 0], np.int32)})["log_probs"].numpy()
    for b, (tok, m) in enumerate(clips):
        alone = model({"tokens": tok[None], "token_lengths": np.array([len(tok)], np.int32), "mel": m[None],
                       "mel_lengths": np.array([len(m)], np.int32), **voices(1, b)})["log_probs"].numpy()[0]
        np.testing.assert_allclose(batched[b, :len(m), :len(tok)], alone, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("temperature, prior_scaling, atol", [(100.0, 1.0, 0.05), (1.0, 0.0005, 1e-4)])
def test_numpy_forward_is_the_tensorflow_aligners_at_the_settings_extremes(temperature, prior_scaling, atol):
    """Scores far below exp()'s float32 range (a high temperature: squared distances of hundreds) and a
    prior scaling below 1e-3 (both valid settings): the duration jobs' forward pass still gives the
    TensorFlow model's log-probabilities of an unpadded clip, finite everywhere."""
    from pipeline.models import aligner_numpy

    cfg = {"d_model": 16, "temperature": temperature, "prior_scaling": prior_scaling}
    model = _random_aligner(cfg)
    info = {"aligner": cfg, "_stats": (np.zeros(20, np.float32), np.ones(20, np.float32))}
    rng = np.random.default_rng(10)
    for T, F in [(7, 40), (15, 90)]:
        tokens = rng.integers(1, 12, size=T).astype(np.int32)
        mel = rng.normal(size=(F, 20)).astype(np.float32)
        want = model({"tokens": tokens[None], "token_lengths": np.array([T], np.int32), "mel": mel[None],
                      "mel_lengths": np.array([F], np.int32)})["log_probs"].numpy()[0]
        got = aligner_numpy.log_probs(aligner_numpy.arrays_of(model), info, tokens, mel)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)


def test_a_saved_aligner_runs_on_mels_normalised_with_its_statistics_in_both_forward_passes(tmp_path):
    """aligner.json's mel statistics normalise a clip's log-mel before the model sees it, in the
    TensorFlow pass (align.load_aligner / log_probs) and in the duration jobs' NumPy pass (aligner_numpy);
    a speaker or language name the aligner never saw gets id -1, the mean of its table's vectors."""
    from pipeline import align, shards
    from pipeline.errors import PipelineError
    from pipeline.models import aligner_numpy

    cfg = {"d_model": 16, "temperature": 0.05, "prior_scaling": 1.0}
    voices = {"speakers": ["ann", "bob", "cy"], "languages": ["en", "fr"]}
    model = _random_aligner(cfg, **voices)
    model.save_weights(str(tmp_path / "aligner.weights.h5"))
    np.savez(tmp_path / "aligner.npz", **aligner_numpy.arrays_of(model))
    rng = np.random.default_rng(11)
    mean, std = rng.normal(-4, 1, 20).astype(np.float32), rng.uniform(0.5, 3, 20).astype(np.float32)
    (tmp_path / "aligner.json").write_text(json.dumps({
        "weights": "aligner.weights.h5", "arrays": "aligner.npz", "aligner": cfg, "n_mels": 20,
        "arrays_digest": shards.file_digest(tmp_path / "aligner.npz"), "vocab": [chr(0x61 + i) for i in range(12)],
        "mel_mean": mean.tolist(), "mel_std": std.tolist(), **voices}))
    with pytest.raises(PipelineError, match="no trained aligner; run `snakemake --cores all aligner`"):
        align.load_aligner(None, tmp_path / "elsewhere" / "aligner.json")
    tf_model, tf_info = align.load_aligner(None, tmp_path / "aligner.json")
    np_info, weights = aligner_numpy.load(tmp_path / "aligner.json")
    assert aligner_numpy.voice_ids(np_info, "bob", "fr") == {"speaker": 1, "language": 1}
    assert aligner_numpy.voice_ids(np_info, "zed", "fr") == {"speaker": -1, "language": 1}
    for T, F, (speaker, language) in [(5, 30, ("bob", "fr")), (11, 70, ("zed", "en"))]:
        tokens = rng.integers(1, 12, T).astype(np.int32)
        mel = rng.normal(-4, 2, (F, 20)).astype(np.float32)
        ids = aligner_numpy.voice_ids(np_info, speaker, language)
        assert set(ids) == {"speaker", "language"}
        want = model({"tokens": tokens[None], "token_lengths": np.array([T], np.int32), "mel": ((mel - mean) / std)[None],
                      "mel_lengths": np.array([F], np.int32),
                      **{f: np.array([i], np.int32) for f, i in ids.items()}})["log_probs"].numpy()[0]
        np.testing.assert_allclose(align.log_probs(tf_model, tf_info, tokens, mel, ids), want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(aligner_numpy.log_probs(weights, np_info, tokens, mel, ids), want, rtol=1e-5, atol=1e-4)
    # no voices given: both passes use the tables' mean vectors
    np.testing.assert_allclose(aligner_numpy.log_probs(weights, np_info, tokens, mel),
                               align.log_probs(tf_model, tf_info, tokens, mel), rtol=1e-5, atol=1e-4)
