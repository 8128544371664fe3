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


@pytest.mark.parametrize("method", ["dio", "praat", "swiftf0"])
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
