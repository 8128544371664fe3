"""Griffin-Lim round trip against the project's mel definition, eager and as exported graphs; what
`python -m pipeline.vocode` says of an F0 it cannot take."""
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from pipeline.audio import LOG_CLAMP, mel_spectrogram
from pipeline.vocoder.griffin_lim import griffin_lim

AUDIO = dict(sample_rate=22050, n_fft=1024, hop_length=256, win_length=1024, n_mels=80, fmin=0, fmax=8000)


def log_mel(y):
    return mel_spectrogram(np.asarray(y, np.float32), **AUDIO)               # (F, n_mels), HiFi-GAN's grid


@pytest.fixture(scope="module")
def harmonic():
    sr = AUDIO["sample_rate"]
    t = np.arange(sr) / sr                                                     # 1 s
    y = sum(0.3 / k * np.sin(2 * np.pi * 220 * k * t) for k in range(1, 6))   # 220 Hz + 4 harmonics
    return y.astype(np.float32)


def test_round_trip_matches_log_mel(harmonic):
    target = log_mel(harmonic)
    audio = griffin_lim(target, **AUDIO, iters=32, power=1.0)  # power 1: keep magnitudes to compare them
    assert audio.dtype == np.float32 and audio.shape.rank == 1
    assert audio.shape[0] == target.shape[0] * AUDIO["hop_length"]           # n_frames(len) frames again
    assert target.shape[0] * AUDIO["hop_length"] <= harmonic.shape[0] < audio.shape[0] + AUDIO["hop_length"]
    diff = np.abs(log_mel(audio.numpy()) - target).mean()
    assert diff < 0.5, f"mean |log-mel difference| {diff:.3f}"


def test_default_power_sharpens_but_stays_finite(harmonic):
    target = log_mel(harmonic)
    audio = griffin_lim(target, **AUDIO, iters=4).numpy()
    assert audio.shape == (target.shape[0] * AUDIO["hop_length"],)
    assert np.all(np.isfinite(audio)) and np.abs(audio).max() > 0
    short = griffin_lim(target[:2], **AUDIO, iters=2)                         # shorter than the reflect pad
    assert short.shape == (2 * AUDIO["hop_length"],) and np.all(np.isfinite(short))
    single = griffin_lim(target[:1], **AUDIO, iters=2)
    assert single.shape == (AUDIO["hop_length"],) and np.all(np.isfinite(single))
    # a mel shorter than the reflect pad runs with silent frames after it: its own audio is that mel's
    silent = np.full((1, AUDIO["n_mels"]), np.log(LOG_CLAMP), np.float32)
    padded = griffin_lim(np.concatenate([target[:1], silent]), **AUDIO, iters=2)
    np.testing.assert_array_equal(single, padded[:AUDIO["hop_length"]])


def test_power_sharpens_the_magnitudes_but_keeps_the_level(harmonic):
    # power 1 keeps the mel's magnitudes, 1.5 moves away from them; the energy is rescaled, so the level stays
    target = log_mel(harmonic)
    kept, sharpened = (griffin_lim(target, **AUDIO, iters=32, power=p).numpy() for p in (1.0, 1.5))
    diffs = [np.abs(log_mel(audio) - target).mean() for audio in (kept, sharpened)]
    assert diffs[0] < diffs[1], diffs
    rms = [np.sqrt(np.mean(audio ** 2)) for audio in (kept, sharpened)]
    assert 0.8 < rms[1] / rms[0] < 1.25, rms


@pytest.mark.parametrize("audio", [AUDIO, dict(AUDIO, win_length=768)])  # 768: a window centred in n_fft
def test_graph_transforms_agree_and_match_the_eager_call(harmonic, audio):
    """The exported graphs' Griffin-Lim: TensorFlow's FFT gives griffin_lim's audio exactly; pipeline.dft's
    matmuls or real-FFT pair (TFLite built-ins) the same audio to float tolerance, for any frame count."""
    import tensorflow as tf

    from pipeline.vocoder.griffin_lim import griffin_lim_graph
    target = mel_spectrogram(harmonic, **audio)[:40]
    eager = griffin_lim(target, **audio, iters=8).numpy()
    spec = tf.TensorSpec([None, audio["n_mels"]], tf.float32)
    for transforms, atol in (("fft", 0.0), ("dft", 1e-4 * np.abs(eager).max()), ("rfft", 1e-4 * np.abs(eager).max())):
        graph = tf.function(lambda m: griffin_lim_graph(m, **audio, iters=8, transforms=transforms),  # noqa: B023
                            input_signature=[spec])
        np.testing.assert_allclose(graph(target).numpy(), eager, atol=atol, rtol=0)
        assert graph(target[:1]).shape == (audio["hop_length"],) and graph(target[:0]).shape == (0,)


def test_fast_griffin_lims_momentum_reaches_a_more_consistent_spectrogram_than_plain_griffin_lim(harmonic,
                                                                                                monkeypatch):
    """Fast Griffin-Lim (Perraudin et al. 2013) extrapolates each projection away from the previous one;
    from a real signal's own STFT magnitude it ends far closer to that magnitude than Griffin-Lim
    without momentum does in the same number of iterations (about half the spectral convergence)."""
    import tensorflow as tf

    from pipeline.vocoder import griffin_lim as gl
    stft, istft = gl._fft_transforms(n_fft=AUDIO["n_fft"], hop_length=AUDIO["hop_length"],
                                     win_length=AUDIO["win_length"])
    re, im = stft(tf.constant(harmonic))
    magnitude = tf.sqrt(re ** 2 + im ** 2)                                    # consistent: a real signal's

    def spectral_convergence():  # || |STFT(audio)| - magnitude || / || magnitude ||, after 32 iterations
        r, i = stft(gl._phase_recovery(magnitude, 32, stft, istft))
        return float(tf.norm(tf.sqrt(r ** 2 + i ** 2) - magnitude) / tf.norm(magnitude))
    fast = spectral_convergence()
    monkeypatch.setattr(gl, "MOMENTUM", 0.0)                                 # plain Griffin-Lim
    plain = spectral_convergence()
    assert fast < 0.7 * plain, (fast, plain)


@pytest.mark.parametrize("f0, shown", [([0.0, 1e-7, 120.0, 0.0], "1e-07..120"),        # tiny, not "0.0": unvoiced
                                       ([0.0, -1e-7, 120.0, 0.0], "-1e-07..120"),
                                       ([0.0, 120.0, 3e38, 0.0], "120..3e+38"),        # huge, not 39 digits
                                       ([0.0, 19.99, 120.5, 0.0], "19.99..120.5")])
def test_vocode_shows_an_f0_it_refuses_as_given(tmp_path, f0, shown):
    # `vocode --f0` with values out of range names the range it found; rounded to 0.1 a tiny positive F0
    # read "0.0..120.0", as if unvoiced (Griffin-Lim here: the check comes before any vocoder loads)
    np.save(tmp_path / "mel.npy", np.full((4, AUDIO["n_mels"]), -5.0, np.float32))
    np.save(tmp_path / "f0.npy", np.array(f0, np.float32))
    proc = subprocess.run([sys.executable, "-m", "pipeline.vocode", "--config", str(ROOT / "configs" / "config.yaml"),
                           "--set", "vocoder.kind=griffin_lim", "--mel", "mel.npy", "--f0", "f0.npy", "--out", "x.wav"],
                          cwd=tmp_path, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2 and proc.stdout == "" and not (tmp_path / "x.wav").exists()
    assert proc.stderr == (f"error: f0.npy: values {shown} are not F0 in Hz (finite; 0 where unvoiced, else 20 Hz up "
                           "to below 8000 Hz, the vocoder's audio.fmax and half its rate)\n")
