"""Griffin-Lim round trip against the project's mel definition, eager and as exported graphs."""

import numpy as np
import pytest

from pipeline.audio import mel_spectrogram
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


def test_graph_transforms_agree_and_match_the_eager_call(harmonic):
    """The exported graphs' Griffin-Lim: TensorFlow's FFT gives griffin_lim's audio exactly; pipeline.dft's
    matmuls or real-FFT pair (TFLite built-ins) the same audio to float tolerance, for any frame count."""
    import tensorflow as tf

    from pipeline.vocoder.griffin_lim import griffin_lim_graph
    target = log_mel(harmonic)[:40]
    eager = griffin_lim(target, **AUDIO, iters=8).numpy()
    spec = tf.TensorSpec([None, AUDIO["n_mels"]], tf.float32)
    for transforms, atol in (("fft", 0.0), ("dft", 1e-4 * np.abs(eager).max()), ("rfft", 1e-4 * np.abs(eager).max())):
        graph = tf.function(lambda m: griffin_lim_graph(m, **AUDIO, iters=8, transforms=transforms),  # noqa: B023
                            input_signature=[spec])
        np.testing.assert_allclose(graph(target).numpy(), eager, atol=atol, rtol=0)
        assert graph(target[:1]).shape == (AUDIO["hop_length"],) and graph(target[:0]).shape == (0,)
