"""The mel definition (DESIGN.md): pipeline.audio.mel_spectrogram against librosa's own
melspectrogram on real espeak-ng speech, at the default and at another setting.

    python -m pytest -q tests/test_audio.py
"""
import librosa
import numpy as np
import pytest
import soundfile as sf

from pipeline import audio

SR = 22050


def _reference(y, *, sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax):
    """HiFi-GAN's mel, spelled out with librosa's public API."""
    mel = librosa.feature.melspectrogram(y=y, sr=sample_rate, n_fft=n_fft, hop_length=hop_length,
                                         win_length=win_length, window="hann", center=True,
                                         pad_mode="reflect", power=1.0, n_mels=n_mels, fmin=fmin,
                                         fmax=fmax, norm="slaney", htk=False)
    return np.log(np.clip(mel, 1e-5, None)).T


@pytest.fixture(scope="module")
def speech(corpus_template):
    """Three real espeak clips (float32, 22050 Hz), one short, one long."""
    wavs = sorted((corpus_template / "wavs").glob("*.wav"))
    clips = [sf.read(str(p), dtype="float32")[0] for p in wavs]
    clips.sort(key=len)
    return [clips[0], clips[len(clips) // 2], clips[-1]]


SETTINGS = {
    "default": dict(sample_rate=SR, n_fft=1024, hop_length=256, win_length=1024, n_mels=80, fmin=0, fmax=8000),
    "other": dict(sample_rate=SR, n_fft=1024, hop_length=200, win_length=800, n_mels=64, fmin=50, fmax=7600),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_mel_matches_librosa(speech, name):
    s = SETTINGS[name]
    for y in speech:
        mel = audio.mel_spectrogram(y, **s)
        ref = _reference(y, **s)
        assert mel.dtype == np.float32
        assert mel.shape == (1 + len(y) // s["hop_length"], s["n_mels"]) == ref.shape
        assert np.max(np.abs(mel - ref)) <= 1e-4
        # real speech, not a degenerate signal: the clamp is hit only in part of the cells
        assert np.log(1e-5) - 1e-4 <= mel.min() and mel.max() > np.log(1e-2)


def test_default_config_is_the_hifigan_setting():
    from pipeline import config
    cfg = config.load_config(None, check_paths=False)
    assert cfg["audio"] == SETTINGS["default"]


def test_mel_of_silence_is_the_clamp_and_shapes_follow_hop():
    for n in (1024, 1279, 1280, 1281, 22050):
        mel = audio.mel_spectrogram(np.zeros(n, np.float32), **SETTINGS["default"])
        assert mel.shape == (1 + n // 256, 80)
        np.testing.assert_allclose(mel, np.log(1e-5), rtol=0, atol=1e-6)


def test_mel_from_file_reads_and_keeps_the_signal(corpus_template):
    wav = sorted((corpus_template / "wavs").glob("*.wav"))[0]
    y, sr = sf.read(str(wav), dtype="float32")
    assert sr == SR
    mel = audio.mel_from_file(wav, SETTINGS["default"], max_seconds=20.0)
    np.testing.assert_allclose(mel, _reference(y, **SETTINGS["default"]), rtol=0, atol=1e-4)
