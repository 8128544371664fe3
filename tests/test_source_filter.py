"""The source-filter vocoder (pipeline/vocoder/source_filter.py): a coherent harmonic source from F0,
no harmonics where unvoiced, none above Nyquist or audio.fmax, the F0 head trained in the vocoder's
own job, the exported graph speaking as in-process synthesis, and the pitch cache as an input of the
vocoder jobs that read it."""
import numpy as np
import pytest
import tensorflow as tf

from pipeline import config
from pipeline.vocoder import kinds
from pipeline.vocoder import source_filter as sf

SR, HOP = 22050, 256
TINY = {"dim": 16, "intermediate_dim": 32, "layers": 1, "kernel": 7, "f0_head_dim": 16, "f0_weight": 1.0}


def _source(f0, limit=8000.0):
    return sf.harmonic_source(tf.constant(np.asarray(f0, np.float32)[None]), sample_rate=SR, hop_length=HOP,
                              limit=limit).numpy()[0]


@pytest.mark.parametrize("hz, frames", [(150.0, 40), (217.3, 2600)])  # 2600 frames: 30 s, float32 phase kept
def test_a_constant_f0_is_one_coherent_harmonic_series(hz, frames):
    y = _source(np.full(frames, hz))
    assert y.shape == (frames * HOP,)
    k = np.arange(1, int(np.ceil(8000.0 / hz)))                                      # every harmonic below 8 kHz
    w = np.clip(8000.0 / hz - k, 0, 1)                              # the top one fading out towards 8 kHz
    n = np.arange(frames * HOP, dtype=np.float64)
    inc = np.float64(np.float32(hz) * np.float32(2 * np.pi / SR))                   # the float32 step it takes
    start = n[:20 * HOP]
    np.testing.assert_allclose(y[:20 * HOP], np.cos(inc * np.outer(start, k)) @ w, atol=0.01 * len(k))
    end = n[-20 * HOP:]                      # after 30 s: each harmonic still at the exact series' phase
    drift = np.angle(np.exp(-1j * inc * np.outer(end, k)).T @ y[-20 * HOP:])      # (harmonics,) radians
    assert np.all(np.abs(drift) < 0.005 * k + 0.01)  # ~0.0013 k measured; one float32 cumsum: ~0.025 k
    steps = np.abs(np.diff(y[:40 * HOP]))                                             # across frame boundaries
    assert steps[HOP - 1::HOP].max() <= steps.max() + 1e-6
    spectrum = np.abs(np.fft.rfft(y[:8192] * np.hanning(8192)))
    freqs = np.fft.rfftfreq(8192, 1 / SR)
    peaks = freqs[[i for i in range(1, len(spectrum) - 1) if spectrum[i] >= spectrum[i - 1]
                   and spectrum[i] >= spectrum[i + 1] and spectrum[i] > 0.1 * spectrum.max()]]
    np.testing.assert_allclose(peaks / hz, np.round(peaks / hz), atol=0.02)           # peaks at k*F0 only
    assert len(peaks) == len(k)


def test_a_moving_f0_is_interpolated_between_frame_centres_and_its_phase_is_the_running_sum():
    """The phase in closed form (a ramp's running sum per frame) against numpy: F0 linear between frame
    centres t*hop + hop/2, held at voicing edges while the voicing ramps, and the phase the float64
    running sum of 2 pi f / sr, for a moving contour with unvoiced stretches and an odd hop."""
    rng = np.random.default_rng(3)
    f0 = rng.uniform(80.0, 300.0, 400)
    f0[50:70] = 0.0
    f0[200] = 0.0
    f0[-5:] = 0.0
    for hop in (HOP, 275):
        freq, voiced, phi = (x.numpy()[0].ravel() for x in sf.phase(tf.constant(f0[None], tf.float32),
                                                                    sample_rate=SR, hop_length=hop))
        centres = np.arange(len(f0)) * hop + hop / 2.0
        n = np.arange(len(f0) * hop)
        t = np.searchsorted(centres, n, side="right")                   # n lies between centres t-1 and t
        left, right = f0[np.clip(t - 1, 0, len(f0) - 1)], f0[np.clip(t, 0, len(f0) - 1)]
        w = np.clip((n - centres[np.clip(t - 1, 0, len(f0) - 1)]) / hop, 0.0, 1.0)
        w = np.where(t == 0, 0.0, np.where(t == len(f0), 0.0, w))       # before the first / after the last centre
        expected_voicing = (left > 0) + w * ((right > 0).astype(float) - (left > 0))
        held_l, held_r = np.where(left > 0, left, right), np.where(right > 0, right, left)
        expected_freq = held_l + w * (held_r - held_l)
        np.testing.assert_allclose(freq, expected_freq, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(voiced, expected_voicing, atol=1e-6)
        running = np.concatenate([[0.0], np.cumsum(expected_freq * 2 * np.pi / SR)[:-1]])
        error = np.angle(np.exp(1j * (phi - running)))
        assert np.abs(error).max() < 2e-3                               # radians, over 400 frames


def test_frame_phase_offsets_keep_float32_precision_over_minutes():
    # 20,000 frames (the most vocode takes whole, ~4 min): each frame's start phase is the running sum of
    # the frames' wrapped advances, to within a few 1e-3 rad (measured 1.7e-3; summing the blocks'
    # totals unwrapped: 3e-2, which the 30th harmonic multiplies to a radian)
    totals = np.random.default_rng(0).uniform(0.0, 2 * np.pi, (1, 20000)).astype(np.float32)
    offsets = sf.frame_offsets(tf.constant(totals)).numpy()[0]
    running = np.concatenate([[0.0], np.cumsum(totals[0].astype(np.float64))[:-1]])
    assert np.abs(np.angle(np.exp(1j * (offsets - running)))).max() < 5e-3


def test_unvoiced_frames_give_no_harmonics():
    f0 = np.r_[np.full(10, 140.0), np.zeros(20), np.full(10, 140.0)]
    y = _source(f0)
    assert np.all(y[11 * HOP:29 * HOP] == 0)                    # unvoiced, beyond the one-hop fade
    assert np.abs(y[:9 * HOP]).max() > 10 and np.abs(y[31 * HOP:]).max() > 10
    assert np.all(_source(np.zeros(30)) == 0)


def test_harmonics_fade_out_over_the_hop_where_frames_turn_unvoiced():
    # no click at a voicing edge: the source ramps linearly to 0 from the last voiced frame's centre to the next's
    y, steady = _source(np.r_[np.full(10, 140.0), np.zeros(20)]), _source(np.full(30, 140.0))
    start = 9 * HOP + HOP // 2
    np.testing.assert_allclose(y[:start], steady[:start], atol=1e-3)
    np.testing.assert_allclose(y[start:start + HOP], steady[start:start + HOP] * (1 - np.arange(HOP) / HOP), atol=1e-3)
    assert np.all(y[start + HOP:] == 0)


@pytest.mark.parametrize("limit", [4000.0, SR / 2])
def test_the_harmonic_at_the_limit_is_silent_and_one_just_below_it_fades(limit):
    # harmonic m of F0 at amplitude min(1, (limit - m F0) / F0): none at the limit (audio.fmax, or
    # Nyquist, where a harmonic folds back), one a quarter or three quarters of F0 below it in part
    def amplitudes(hz, harmonics, frames=60):
        y = _source(np.full(frames, hz), limit=limit)
        n = np.arange(len(y), dtype=np.float64)
        inc = np.float64(np.float32(hz) * np.float32(2 * np.pi / SR))                # the float32 step it takes
        w = np.hanning(len(y))
        return np.abs(np.exp(-1j * inc * np.outer(harmonics, n)) @ (w * y)) / (w.sum() / 2)

    m = 16 if limit == 4000.0 else 4
    at = amplitudes(limit / m, [m - 1, m])            # harmonic m at the limit (at Nyquist, m + 1 is m - 1's alias)
    np.testing.assert_allclose(at, [1.0, 0.0], atol=0.01)
    for fraction in (0.25, 0.75):                                          # harmonic m `fraction` F0 below it
        np.testing.assert_allclose(amplitudes(limit / (m + fraction), [m - 1, m, m + 1]), [1.0, fraction, 0.0],
                                   atol=0.01)


def _model(fmax=8000, **source_filter):
    cfg = config.load_config(overrides={"audio": {"fmax": fmax}})
    v = dict(cfg["vocoder"], kind="source_filter", source_filter=dict(TINY, **source_filter))
    tf.keras.utils.set_random_seed(0)
    return kinds.build(v, cfg["audio"]), cfg["audio"]


def _harmonicity(y, hz):
    """Mean spectrum at k*F0 over the mean half-way between: ~1 for noise, well above for harmonics."""
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    at = lambda f: spectrum[np.round(f * len(y) / SR).astype(int)]  # noqa: E731
    k = np.arange(2, int(3000 / hz))
    return at(k * hz).mean() / at((k + 0.5) * hz).mean()


def test_voiced_frames_sound_harmonic_and_unvoiced_ones_do_not():
    model, a = _model()
    mel = tf.fill([1, 80, a["n_mels"]], -4.0)                    # a flat envelope
    voiced = model(mel, f0=tf.fill([1, 80], 180.0)).numpy()[0]
    unvoiced = model(mel, f0=tf.zeros([1, 80])).numpy()[0]
    assert voiced.shape == unvoiced.shape == (80 * a["hop_length"],)
    assert _harmonicity(voiced, 180.0) > 3 and _harmonicity(unvoiced, 180.0) < 1.6
    assert np.abs(unvoiced).max() > 0                           # the noise source still speaks
    # untrained (zero gains), the harmonics speak at the mel's level: its envelope, scaled by F0
    from pipeline import audio
    assert abs(np.median(audio.mel_spectrogram(voiced, **a)) - (-4.0)) < 1.0
    # the noise's phases are a table of NOISE_FRAMES rows, frame t taking row t mod NOISE_FRAMES: past the
    # table's length it is still noise, not one row repeated every hop (a buzz at sample_rate / hop)
    long = model(tf.fill([1, 3 * sf.NOISE_FRAMES, a["n_mels"]], -4.0), f0=tf.zeros([1, 3 * sf.NOISE_FRAMES]))
    tail = long.numpy()[0][-sf.NOISE_FRAMES * a["hop_length"]:]
    assert _harmonicity(tail, a["sample_rate"] / a["hop_length"]) < 1.6


def test_the_heads_two_gains_steer_the_harmonics_and_the_noise():
    # the head's first n_bins outputs scale the harmonic source, the others the noise: either silenced
    # (a gain of e^-30) leaves the other as it was
    model, a = _model()
    mel = tf.fill([1, 80, a["n_mels"]], -4.0)
    f0 = tf.fill([1, 80], 180.0)
    both = model(mel, f0=f0).numpy()[0]
    k = model.n_bins
    for harmonic_gain, noise_gain in ((-30.0, 0.0), (0.0, -30.0)):
        model.head.bias.assign(np.r_[np.full(k, harmonic_gain), np.full(k, noise_gain)].astype(np.float32))
        out = model(mel, f0=f0).numpy()[0]
        assert np.abs(out).max() > 0.1 * np.abs(both).max()              # the other source still speaks
        assert (_harmonicity(out, 180.0) > 3) == (harmonic_gain == 0.0), (harmonic_gain, noise_gain)
    assert np.abs(model(mel, f0=tf.zeros([1, 80])).numpy()[0]).max() < 1e-6 * np.abs(both).max()  # noise off: silent


def test_without_f0_the_model_speaks_its_heads_f0_within_range_where_it_hears_voicing():
    # the head forced by its output bias: voiced at log(F0 / F0_REFERENCE) = b, or unvoiced
    model, a = _model()
    mel = tf.fill([1, 40, a["n_mels"]], -4.0)
    head = model.f0_head.out
    head.kernel.assign(tf.zeros_like(head.kernel))
    for log_f0, logit, hz in ((np.log(200.0 / sf.F0_REFERENCE), 10.0, 200.0), (10.0, 10.0, sf.F0_RANGE[1]),
                              (-10.0, 10.0, sf.F0_RANGE[0]), (0.0, -10.0, 0.0)):
        head.bias.assign([log_f0, logit])
        estimate, p = model.estimate_f0(mel)
        np.testing.assert_allclose(estimate.numpy(), np.float32(hz) if hz else sf.F0_REFERENCE, rtol=1e-5)
        np.testing.assert_allclose(model(mel).numpy(), model(mel, f0=tf.fill([1, 40], float(hz))).numpy(), atol=1e-6)
        # another model's F0 kept where the head hears voicing (a negative one as unvoiced), 0 elsewhere
        other = np.tile([-5.0, 0.0, 120.0, 95.5], 10)[None].astype(np.float32)
        np.testing.assert_array_equal(model.voiced_f0(mel, tf.constant(other)).numpy(),
                                      np.maximum(other, 0.0) if logit > 0 else np.zeros_like(other))


def test_the_f0_heads_loss_is_weighted_voicing_entropy_and_log_f0_error_on_voiced_frames_only():
    model, a = _model(f0_weight=0.5)
    mel = tf.constant(np.random.default_rng(2).normal(-4.0, 1.0, (1, 30, a["n_mels"])), tf.float32)
    f0 = np.where(np.arange(30) % 3 == 0, 0.0, np.linspace(90.0, 250.0, 30))[None].astype(np.float32)
    log_f0, logit = (x.numpy() for x in model.f0_head(mel))
    voiced = f0 > 0
    entropy = np.mean(np.logaddexp(0.0, logit) - voiced * logit)           # sigmoid cross-entropy
    pitch = np.mean(np.abs(log_f0 - np.log(np.maximum(f0, 1.0) / sf.F0_REFERENCE))[voiced])
    loss, terms = model.auxiliary_loss(mel, tf.constant(f0))
    assert terms["voicing"].numpy() == pytest.approx(entropy, rel=1e-5)
    assert terms["f0"].numpy() == pytest.approx(pitch, rel=1e-5)
    assert loss.numpy() == pytest.approx(0.5 * (entropy + pitch), rel=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_training_hears_the_f0_and_mel_it_is_given(policy):
    # train.mixed_precision (auto on a GPU: bfloat16) builds the vocoder under a mixed policy; Keras cast
    # its mel and f0 to that dtype before call, so its harmonics ran at F0 rounded (217.3 Hz -> 217 in
    # bfloat16: harmonic 36 some 11 Hz off, out of phase with the recording within a segment). Untrained
    # (zero gains, whatever the network computes in), it speaks what the float32 model does
    reference, a = _model()
    mel = tf.constant(np.random.default_rng(4).normal(-6.0, 2.0, (1, 48, a["n_mels"])), tf.float32)
    f0 = tf.constant(np.r_[np.full(32, 217.3), np.zeros(16)][None], tf.float32)
    want = reference(mel, f0=f0).numpy()[0]
    tf.keras.mixed_precision.set_global_policy(policy)
    try:
        model, _ = _model()
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    model.set_weights(reference.get_weights())
    np.testing.assert_allclose(model(mel, f0=f0).numpy()[0], want, atol=1e-5 * np.abs(want).max())


def test_nothing_above_nyquist_or_fmax():
    limit = 4000.0
    glide = np.linspace(90.0, 600.0, 60)                         # harmonics sweep up to the limit and out
    y = _source(glide, limit=limit)
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y)))) ** 2
    freqs = np.fft.rfftfreq(len(y), 1 / SR)
    assert spectrum[freqs > limit + 100].sum() < 1e-5 * spectrum.sum()
    nyquist = _source(np.full(30, 3000.0), limit=SR / 2)         # 3 kHz: harmonics at 3..9 kHz, none at 12
    spectrum = np.abs(np.fft.rfft(nyquist * np.hanning(len(nyquist)))) ** 2
    freqs = np.fft.rfftfreq(len(nyquist), 1 / SR)
    assert spectrum[np.abs(freqs - 9000) < 50].sum() > 0.1 * spectrum.sum() / 3     # the 3rd harmonic is there
    assert spectrum[freqs > SR / 2 - 1500].sum() < 1e-5 * spectrum.sum()            # no 4th (12 kHz) folded back
    model, a = _model(fmax=limit)
    out = model(tf.fill([1, 60, a["n_mels"]], -3.0), f0=tf.constant(glide[None], tf.float32)).numpy()[0]
    spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out)))) ** 2
    freqs = np.fft.rfftfreq(len(out), 1 / SR)
    assert spectrum[freqs > limit + 100].sum() < 1e-4 * spectrum.sum()            # harmonics and noise alike


def test_the_models_source_fades_its_harmonics_out_at_audio_fmax():
    # the band keeps the STFT bins at or below fmax, not a harmonic's window leaking into them: the
    # source itself must stop at fmax (made up to Nyquist, one at fmax - F0/4 sounded at 0.7 of its
    # neighbour's level instead of 0.18, one at fmax itself at 0.055 instead of 0.001)
    model, a = _model(fmax=4000)

    def relative(hz):                    # harmonic 16's amplitude in the model's audio over harmonic 15's
        y = model(tf.fill([1, 60, a["n_mels"]], -3.0), f0=tf.fill([1, 60], np.float32(hz))).numpy()[0]
        n = np.arange(len(y), dtype=np.float64)
        inc = np.float64(np.float32(hz) * np.float32(2 * np.pi / SR))
        w = np.hanning(len(y))
        amp = np.abs(np.exp(-1j * inc * np.outer([15, 16], n)) @ (w * y))
        return amp[1] / amp[0]
    assert relative(4000.0 / 16.25) < 0.35 and relative(4000.0 / 16) < 0.02


def test_nothing_above_fmax_whatever_the_gains():
    # a trained head's gains are not zero: the band alone keeps the noise and the harmonics under audio.fmax
    limit = 4000.0
    model, a = _model(fmax=limit)
    rng = np.random.default_rng(5)
    mel = tf.constant(rng.normal(-4.0, 1.5, (1, 60, a["n_mels"])), tf.float32)
    model(mel, f0=tf.zeros([1, 60]))
    for w in model.head.weights:                                     # large random gains in every bin
        w.assign(rng.normal(0.0, 3.0, w.shape))
    for f0, most in ((np.zeros(60), 1e-5), (np.linspace(90.0, 400.0, 60), 1e-7)):    # noise alone; with harmonics
        out = model(mel, f0=tf.constant(f0[None], tf.float32)).numpy()[0]
        spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out)))) ** 2
        freqs = np.fft.rfftfreq(len(out), 1 / SR)
        above = spectrum[freqs > limit + 2 * SR / a["n_fft"]].sum()             # 2 bins: the window's leakage
        # measured 4e-7 and 1e-9 of the energy below; without the band 0.6 (noise) and 5e-6 (harmonics alone)
        assert above < most * spectrum[freqs <= limit].sum(), above / spectrum[freqs <= limit].sum()


SF_VOCODER = {"kind": "source_filter", "steps": 120, "finetune_steps": 0, "batch_size": 4, "segment_frames": 16,
              "learning_rate": 0.003, "checkpoint_every": 120, "log_every": 40, "summary_every": 1000,
              "source_filter": TINY}


@pytest.fixture(scope="module")
def sf_run(built_cache, tmp_path_factory):
    """A tiny source-filter vocoder trained by the real `train_vocoder` job (120 steps) on built_cache,
    beside an untrained seeded FastPitch: (config path, config)."""
    from conftest import run_config, snakemake, write_untrained_checkpoint
    path = run_config(built_cache, tmp_path_factory.mktemp("sf"), vocoder=SF_VOCODER, steps=100)
    write_untrained_checkpoint(path, step=3)
    snakemake("train_vocoder", config=path)
    return path, config.load_config(path)


def test_the_f0_head_learns_voicing_in_the_vocoders_own_job(sf_run):
    from pipeline import data, shards
    _, cfg = sf_run
    voc = kinds.load(cfg)
    hits = total = voiced = 0
    for entry in data.read_index(cfg)["shards"]:
        root = config.cache_dir(cfg)
        (_, mels), (_, pitch) = shards.read(root / entry["mels"], "mels"), shards.read(root / entry["pitch"], "pitch")
        for mel, f0 in zip(mels, pitch):
            _, p = voc.model.estimate_f0(tf.constant(mel[None].astype(np.float32)))
            hits += int(np.sum((p.numpy()[0] > 0.5) == (f0 > 0)))
            total, voiced = total + len(f0), voiced + int(np.sum(f0 > 0))
    majority = max(voiced, total - voiced) / total
    assert hits / total > max(0.8, majority + 0.05), (hits / total, majority)


def test_vocode_takes_f0_or_estimates_it(sf_run, tmp_path):
    from pipeline import data, shards
    from pipeline.vocoder import vocode
    _, cfg = sf_run
    entry = data.read_index(cfg)["shards"][0]
    _, mels = shards.read(config.cache_dir(cfg) / entry["mels"], "mels")
    _, pitch = shards.read(config.cache_dir(cfg) / entry["pitch"], "pitch")
    np.save(tmp_path / "mel.npy", mels[0].astype(np.float32))
    np.save(tmp_path / "f0.npy", pitch[0])
    own = vocode.vocode(cfg, tmp_path / "mel.npy", tmp_path / "own.wav")
    given = vocode.vocode(cfg, tmp_path / "mel.npy", tmp_path / "given.wav", f0_path=tmp_path / "f0.npy")
    assert own.shape == given.shape == (len(mels[0]) * cfg["audio"]["hop_length"],)
    assert np.isfinite(own).all() and np.abs(own - given).max() > 1e-3      # the given F0 is heard
    np.save(tmp_path / "short.npy", pitch[0][:-1])
    with pytest.raises(vocode.MelError, match="short.npy"):
        vocode.vocode(cfg, tmp_path / "mel.npy", tmp_path / "x.wav", f0_path=tmp_path / "short.npy")


def test_export_speaks_as_in_process_synthesis(sf_run, tmp_path):
    from pipeline import export, synthesize
    _, cfg = sf_run
    meta = export.export(cfg, tmp_path / "export", tflite=True, log=lambda *a: None)
    assert meta["vocoder"]["kind"] == "source_filter" and meta["vocoder"]["f0"]
    assert meta["tflite"]["float32"]["ops"] == "builtin" and meta["tflite"]["float32"]["file"]
    synth = synthesize.load_synthesizer(cfg, log=lambda *a: None)
    sentence, s = "The quick brown fox.", cfg["synthesize"]
    res = synth.infer(sentence)
    voc = kinds.load(cfg)
    want = voc(res["mel"], f0=voc.voiced_f0(res["mel"], res["f0"]))           # what `snakemake synthesize` writes
    voice = tf.saved_model.load(str(tmp_path / "export" / "saved_model"))
    got = voice.synthesize(tf.constant([synth.encode(sentence)], tf.int32), tf.constant(float(s["pace"])),
                           tf.constant(float(s["pitch_shift"])))["audio"].numpy()[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-3 * np.abs(want).max() + 1e-6)
    gated = np.asarray(voc.voiced_f0(res["mel"], res["f0"]))
    # the export's voicing gate is checked: the F0 head hears some frames unvoiced, and keeps the others' F0
    assert res["f0"] is not None and np.any(gated == 0) and np.any(gated > 0)


def test_a_pitch_change_reruns_the_vocoder_and_a_vocoder_change_only_the_vocoder(sf_run):
    from conftest import edited_copy, planned_jobs
    path, cfg = sf_run
    assert planned_jobs(path, "vocoder") == {}
    run_json = config.run_dir(cfg) / "run.json"  # the acoustic run's guard refuses other pitch: settings
    run_json.rename(run_json.with_suffix(".aside"))
    try:
        pitch = planned_jobs(edited_copy(path, "pitch.yaml", pitch={"fmin": 70.0}), "vocoder")
    finally:
        run_json.with_suffix(".aside").rename(run_json)
    assert pitch.get("train_vocoder") == 1 and pitch.get("pitch_shard") == 4 and "mel_shard" not in pitch
    vocoder = planned_jobs(edited_copy(path, "vocoder.yaml", vocoder={"learning_rate": 0.002}), "vocoder")
    assert vocoder.get("train_vocoder") == 1 and not {"pitch_shard", "mel_shard", "token_shard"} & set(vocoder)
