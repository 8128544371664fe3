"""pipeline.pitch: F0 on the mel's frame grid, within 2 % of the truth for a sine sweep.

    python -m pytest -q tests/test_pitch.py
"""
import numpy as np
import pytest

from pipeline import audio, config, pitch

SR, HOP = 22050, 256


def _sweep(seconds=2.0, low=90.0, high=330.0):
    """An exponential sine sweep and its true F0 at each mel frame's centre (sample t*hop + hop/2)."""
    t = np.arange(int(SR * seconds)) / SR
    rate = np.log(high / low) / seconds
    y = 0.5 * np.sin(2 * np.pi * low * np.expm1(rate * t) / rate)  # phase = integral of low * e^(rate t)
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


def test_half_a_hop_matters():
    """The grid is the mel's: measured against frame starts instead of centres, the sweep is off."""
    y, truth = _sweep(seconds=0.5, low=100.0, high=400.0)  # a fast sweep: half a hop is ~1 % of F0
    f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=len(truth), fmin=65.0, fmax=600.0, method="dio")
    early = truth * np.exp(-np.log(4.0) / 0.5 * (HOP / 2) / SR)
    inner = slice(3, len(truth) - 3)
    voiced = f0[inner] > 0
    assert np.median(np.abs(f0[inner][voiced] - truth[inner][voiced])) < \
        np.median(np.abs(f0[inner][voiced] - early[inner][voiced]))


@pytest.mark.parametrize("method", ["harvest", "pyin"])
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
