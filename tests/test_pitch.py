"""pipeline.pitch: F0 on the mel's frame grid, within 2 % of the truth for a sine sweep; every method
within a few percent on a voice-like glide, 0 on silence, finite and within pitch.fmin..fmax.

    python -m pytest -q tests/test_pitch.py
"""
import numpy as np
import pytest
import yaml

from pipeline import audio, config, pitch
from pipeline.errors import PipelineError

SR, HOP = 22050, 256


def _sweep(seconds=2.0, low=90.0, high=330.0, harmonics=1):
    """An exponential sweep (a sine, or `harmonics` of amplitude 1/k) and its true F0 at each mel
    frame's centre (sample t*hop + hop/2)."""
    t = np.arange(int(SR * seconds)) / SR
    rate = np.log(high / low) / seconds
    phase = 2 * np.pi * low * np.expm1(rate * t) / rate  # the integral of low * e^(rate t)
    y = sum(0.5 / k * np.sin(k * phase) for k in range(1, harmonics + 1))
    n = audio.n_frames(len(y), HOP)
    centres = (np.arange(n) * HOP + HOP / 2) / SR
    return y.astype(np.float32), low * np.exp(rate * centres)


def test_sine_sweep_within_two_percent_on_the_mel_grid():
    y, truth = _sweep()
    f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=len(truth), fmin=65.0, fmax=600.0, method="dio")
    assert f0.dtype == np.float32 and f0.shape == (len(truth),) == (audio.n_frames(len(y), HOP),)
    voiced = f0 > 0
    assert voiced.mean() > 0.95
    assert np.max(np.abs(f0[voiced] - truth[voiced]) / truth[voiced]) < 0.02


@pytest.mark.parametrize("method", ["dio", "harvest", "praat", "swiftf0"])
def test_half_a_hop_matters(method):
    """The grid is the mel's: measured against frame starts instead of centres, the sweep is off."""
    # a fast sweep: half a hop is ~1 % of F0; harmonics, as SwiftF0 calls a bare sine unvoiced
    y, truth = _sweep(seconds=0.5, low=100.0, high=400.0, harmonics=10)
    f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=len(truth), fmin=65.0, fmax=600.0, method=method)
    early = truth * np.exp(-np.log(4.0) / 0.5 * (HOP / 2) / SR)
    inner = slice(3, len(truth) - 3)
    voiced = f0[inner] > 0
    assert np.median(np.abs(f0[inner][voiced] - truth[inner][voiced])) < \
        np.median(np.abs(f0[inner][voiced] - early[inner][voiced]))


@pytest.mark.parametrize("method", ["harvest", "pyin", "praat", "swiftf0"])
def test_other_methods_keep_the_grid_and_silence_is_unvoiced(method):
    t = np.arange(SR // 4) / SR
    y = np.zeros(SR // 2, np.float32)
    y[: SR // 4] = sum(0.3 / k * np.sin(2 * np.pi * 150 * k * t) for k in range(1, 11))  # a voice-like tone
    n = audio.n_frames(len(y), HOP)
    f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=n, fmin=65.0, fmax=600.0, method=method)
    assert f0.shape == (n,) and f0.dtype == np.float32
    tone, quiet = f0[5:n // 2 - 5], f0[n // 2 + 5:]
    assert np.median(tone) == pytest.approx(150, rel=0.02)
    assert not quiet.any()


def test_pitch_fmax_above_nyquist_is_a_config_error(tmp_path):
    with pytest.raises(config.ConfigError, match="pitch.fmax"):
        config.load_config(None, {"pitch": {"fmax": 12000.0}})
    with pytest.raises(config.ConfigError, match="pitch.method"):
        config.load_config(None, {"pitch": {"method": "crepe"}})


def _voice_glide(rng, seconds=1.2, low=110.0, high=260.0, quiet=0.25, sample_rate=SR):
    """`quiet` s of silence, a 10-harmonic glide low -> high with 30 dB SNR white noise, silence again,
    at `sample_rate`; its true F0 per mel frame (0 in the silences)."""
    t = np.arange(int(sample_rate * seconds)) / sample_rate
    rate = np.log(high / low) / seconds
    phase = 2 * np.pi * low * np.expm1(rate * t) / rate
    tone = sum(0.3 / k * np.sin(k * phase) for k in range(1, 11))
    tone += rng.standard_normal(len(t)) * np.sqrt(np.mean(tone ** 2) / 1e3)
    pad = np.zeros(int(sample_rate * quiet))
    y = np.concatenate([pad, tone, pad]).astype(np.float32)
    n = audio.n_frames(len(y), HOP)
    centres = (np.arange(n) * HOP + HOP / 2) / sample_rate - quiet
    truth = np.where((centres >= 0) & (centres < seconds), low * np.exp(rate * np.clip(centres, 0, seconds)), 0.0)
    return y, truth


@pytest.mark.parametrize("method", ["praat", "swiftf0"])
def test_new_methods_follow_a_known_glide_on_the_mel_grid(method):
    y, truth = _voice_glide(np.random.default_rng(1))
    f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=len(truth), fmin=65.0, fmax=600.0, method=method)
    assert f0.dtype == np.float32 and f0.shape == (len(truth),) == (audio.n_frames(len(y), HOP),)
    assert np.isfinite(f0).all() and ((f0 == 0) | ((f0 >= 65.0) & (f0 <= 600.0))).all()
    inner = np.convolve(truth > 0, np.ones(7), "same") == 7  # voiced, 3 frames from either edge
    assert (f0[inner] > 0).mean() > 0.95
    voiced = inner & (f0 > 0)
    assert np.median(np.abs(f0[voiced] / truth[voiced] - 1)) < 0.01
    assert np.max(np.abs(f0[voiced] / truth[voiced] - 1)) < 0.03
    silent = np.convolve(truth == 0, np.ones(7), "same") == 7
    assert silent.sum() > 20 and not f0[silent].any()


@pytest.mark.parametrize("rate", [8000, 16000, 44100])
def test_praat_follows_the_glide_at_any_audio_rate(rate):
    """Praat analyses at pitch.praat_rate (8 kHz here): the same F0, on the same frame grid, whatever
    the rate the clip comes at (below it: as it is)."""
    y, truth = _voice_glide(np.random.default_rng(3), quiet=0.0, sample_rate=rate)
    n = len(truth)
    assert pitch.praat_rate(rate, 600.0) == min(rate, 8000)
    f0 = pitch.f0(y, sample_rate=rate, hop_length=HOP, n_frames=n, fmin=65.0, fmax=600.0, method="praat")
    inner = slice(3, n - 3)
    assert (f0[inner] > 0).mean() > 0.95
    voiced = f0[inner] > 0
    assert np.median(np.abs(f0[inner][voiced] / truth[inner][voiced] - 1)) < 0.01
    assert np.max(np.abs(f0[inner][voiced] / truth[inner][voiced] - 1)) < 0.03


def test_values_stay_within_fmin_and_fmax():
    """A glide that leaves the searched band: frames outside it are unvoiced or held at the bound."""
    y, truth = _voice_glide(np.random.default_rng(2), low=90.0, high=400.0)
    for method in ("praat", "swiftf0", "dio"):
        f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=len(truth), fmin=120.0, fmax=300.0, method=method)
        assert ((f0 == 0) | ((f0 >= 120.0) & (f0 <= 300.0))).all(), method
        assert (f0 > 0).sum() > 20, method


def test_unknown_method_is_refused_in_one_line_naming_the_key_and_the_methods():
    with pytest.raises(PipelineError) as e:
        pitch.f0(np.zeros(SR, np.float32), sample_rate=SR, hop_length=HOP, n_frames=86, fmin=65.0, fmax=600.0, method="crepe")
    message = str(e.value)
    assert "\n" not in message and message.startswith("pitch.method") and "crepe" in message
    assert all(name in message for name in ("dio", "harvest", "pyin", "praat", "swiftf0"))


def test_schema_lists_exactly_the_registered_methods_and_swiftf0_range():
    schema = yaml.safe_load(config.SCHEMA.read_text())
    assert schema["properties"]["pitch"]["properties"]["method"]["enum"] == list(pitch.METHODS)
    assert config.load_config(None)["pitch"]["method"] in pitch.METHODS
    with pytest.raises(config.ConfigError, match="pitch.fmin"):
        config.load_config(None, {"pitch": {"method": "swiftf0", "fmin": 40.0}})


def test_pyin_follows_a_fast_sweep_up_or_down_on_the_mel_grid():
    """pyin's 2048-sample frames are centred on the mel's (starting there would put them 4 hops late): a
    sweep rising or falling two octaves in 0.5 s is followed within a few percent."""
    for low, high in ((100.0, 400.0), (400.0, 100.0)):
        y, truth = _sweep(seconds=0.5, low=low, high=high, harmonics=10)
        f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=len(truth), fmin=65.0, fmax=600.0, method="pyin")
        inner = slice(3, len(truth) - 3)
        voiced = f0[inner] > 0
        assert voiced.mean() > 0.9
        assert np.median(np.abs(f0[inner][voiced] / truth[inner][voiced] - 1)) < 0.03, (low, high)


def _tone(f, seconds=0.5):
    """A voice-like tone (10 harmonics) at `f` Hz filling the whole clip."""
    t = np.arange(int(SR * seconds)) / SR
    return sum(0.3 / k * np.sin(2 * np.pi * f * k * t) for k in range(1, 11)).astype(np.float32)


def test_praat_voices_a_tone_to_both_ends_of_the_clip():
    """Praat's frames reach both ends of the clip: a tone that fills it is voiced on every mel frame."""
    for f in (110.0, 233.0):
        y = _tone(f)
        f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=audio.n_frames(len(y), HOP), fmin=65.0,
                      fmax=600.0, method="praat")
        assert (f0 > 0).all(), f
        assert np.median(np.abs(f0 / f - 1)) < 0.001 and np.max(np.abs(f0 / f - 1)) < 0.05, f


@pytest.mark.parametrize("method", ["dio", "praat", "swiftf0"])
def test_a_clip_without_voice_gives_an_all_unvoiced_track(method):
    noise = (0.1 * np.random.default_rng(0).standard_normal(SR // 2)).astype(np.float32)
    for y in (np.zeros(SR // 2, np.float32), noise):
        n = audio.n_frames(len(y), HOP)
        f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=n, fmin=65.0, fmax=600.0, method=method)
        assert f0.shape == (n,) and (f0 == 0).mean() > 0.95


def test_samples_after_the_last_frame_change_nothing():
    """Only y[:n_frames * hop] counts, so a clip decoded again gives the track of the audio shard's samples."""
    y, truth = _sweep(seconds=0.5, low=100.0, high=400.0, harmonics=10)
    n = len(truth)
    tail = np.random.default_rng(0).uniform(-1, 1, HOP - 1).astype(np.float32)  # a click, less than a hop
    for method in ("dio", "praat", "swiftf0"):
        kw = dict(sample_rate=SR, hop_length=HOP, n_frames=n, fmin=65.0, fmax=600.0, method=method)
        np.testing.assert_array_equal(pitch.f0(np.concatenate([y[:n * HOP], tail]), **kw),
                                      pitch.f0(y[:n * HOP], **kw), err_msg=method)


def test_a_methods_frames_off_the_band_are_unvoiced_and_those_just_past_a_bound_held_at_it(monkeypatch):
    """Whatever a method returns: beyond half of pitch.fmin or twice pitch.fmax, not finite or not positive:
    unvoiced; within those margins: held at the bound; too many frames cut, too few padded unvoiced."""
    fmin, fmax = 65.0, 600.0
    raw = np.array([100.0, 0.4 * fmin, 0.6 * fmin, 1.5 * fmax, 2.5 * fmax, np.nan, np.inf, -np.inf, -100.0, 0.0])
    want = np.float32([100.0, 0, fmin, fmax, 0, 0, 0, 0, 0, 0])
    y = np.zeros(20 * HOP, np.float32)
    for frames, n, expected in ((raw, 12, np.concatenate([want, [0, 0]])),
                                (np.concatenate([raw, raw]), 12, np.concatenate([want, want[:2]])), (raw, 10, want)):
        monkeypatch.setattr(pitch.METHODS.get("dio"), "track", lambda *args, out=frames: out)
        f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=n, fmin=fmin, fmax=fmax, method="dio")
        assert f0.dtype == np.float32
        np.testing.assert_array_equal(f0, expected)


def test_voiced_stats_give_the_mean_and_std_of_the_voiced_frames_alone():
    f = np.where(np.random.default_rng(0).random(500) < 0.6, np.random.default_rng(1).uniform(80, 300, 500), 0)
    f = f.astype(np.float32)
    count, total, squares = pitch.voiced_stats(f)
    voiced = f[f > 0].astype(np.float64)
    assert count == voiced.size and 0 < count < f.size
    assert total / count == pytest.approx(voiced.mean(), rel=1e-12)
    assert np.sqrt(squares / count - (total / count) ** 2) == pytest.approx(voiced.std(), rel=1e-9)


def test_a_band_outside_a_methods_range_is_refused_naming_the_key():
    """SwiftF0 scores 46.875..2093.75 Hz only: pitch.f0 refuses a band beyond it (as the schema does)."""
    for fmin, fmax, key in ((40.0, 600.0, "pitch.fmin"), (65.0, 2500.0, "pitch.fmax")):
        with pytest.raises(PipelineError, match=rf"^{key}: pitch.method swiftf0 searches 46.875..2093.75 Hz"):
            pitch.f0(np.zeros(SR, np.float32), sample_rate=SR, hop_length=HOP, n_frames=86, fmin=fmin, fmax=fmax,
                     method="swiftf0")
    then = yaml.safe_load(config.SCHEMA.read_text())["properties"]["pitch"]["then"]["properties"]
    swift = pitch.METHODS.get("swiftf0")
    assert (then["fmin"]["minimum"], then["fmax"]["maximum"]) == (swift.lowest, swift.highest) == (46.875, 2093.75)


def test_praat_rate_is_8_khz_or_four_times_fmax_never_above_the_audios():
    for rate, fmax, want in ((22050, 600.0, 8000), (22050, 2500.0, 10000), (44100, 3000.0, 12000),
                             (16000, 5000.0, 16000), (8000, 600.0, 8000), (6000, 600.0, 6000)):
        assert pitch.praat_rate(rate, fmax) == want, (rate, fmax)


def test_on_grid_interpolates_voicing_linearly_and_f0_in_log_frequency():
    """Between two voiced frames F0 moves linearly in log-frequency; an unvoiced frame carries the
    log-mean of its voiced neighbours; a mel frame is voiced where the interpolated voicing is >= 0.5."""
    times = np.array([0.0, 1.0, 2.0, 3.0])
    hz = np.array([100.0, 400.0, 0.0, 100.0])     # frame 2 unvoiced: it carries sqrt(400 * 100) = 200 Hz
    voicing = np.array([1.0, 1.0, 0.0, 1.0])
    centres = np.array([0.0, 0.5, 1.25, 1.5, 1.75, 2.5, 3.0])
    want = [100.0, 200.0, 400 ** 0.75 * 200 ** 0.25, np.sqrt(400.0 * 200.0), 0.0, np.sqrt(200.0 * 100.0), 100.0]
    np.testing.assert_allclose(pitch.on_grid(times, hz, voicing, centres), want, rtol=1e-12)
    assert not pitch.on_grid(times, np.zeros(4), np.zeros(4), centres).any()   # nothing voiced
