"""The frame grid and mel definition: pipeline.audio against a direct NumPy transcription of
HiFi-GAN's mel_spectrogram (reflect-pad (n_fft - hop)/2, uncentred frames, periodic Hann,
sqrt(re^2 + im^2 + 1e-9), slaney filterbank, log clamp 1e-5) on real espeak-ng speech.

    python -m pytest -q tests/test_audio.py
"""
import os
import subprocess
import sys

import librosa
import numpy as np
import pytest
import soundfile as sf
from conftest import ROOT

from pipeline import audio

SR = 22050


def _reference(y, *, sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax):
    """HiFi-GAN's meldataset.mel_spectrogram, transcribed line by line into float64 NumPy."""
    y = np.asarray(y, np.float64)
    pad = (n_fft - hop_length) // 2                               # int((n_fft - hop_size) / 2)
    y = np.pad(y, (pad, pad), mode="reflect")                     # F.pad(..., mode='reflect')
    window = np.zeros(n_fft)                                      # torch.hann_window(win_size), centred
    left = (n_fft - win_length) // 2
    window[left:left + win_length] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win_length) / win_length)
    count = (len(y) - n_fft) // hop_length + 1                    # torch.stft(center=False)
    frames = np.stack([y[t * hop_length:t * hop_length + n_fft] * window for t in range(count)])
    spec = np.fft.rfft(frames, axis=1).T                          # (K, F)
    spec = np.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    basis = librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
    return np.log(np.clip(basis.astype(np.float64) @ spec, 1e-5, None)).T  # (F, n_mels)


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
def test_mel_is_hifigans(speech, name):
    s = SETTINGS[name]
    for y in speech:
        mel = audio.mel_spectrogram(y, **s)
        ref = _reference(y, **s)
        assert mel.dtype == np.float32
        assert mel.shape == (len(y) // s["hop_length"], s["n_mels"]) == ref.shape
        assert audio.n_frames(len(y), s["hop_length"]) == mel.shape[0]
        assert np.max(np.abs(mel - ref)) <= 5e-4
        assert np.mean(np.abs(mel - ref)) <= 1e-5
        # real speech, not a degenerate signal: the clamp is hit only in part of the cells
        assert np.log(1e-5) - 1e-4 <= mel.min() and mel.max() > np.log(1e-2)


def test_frames_sit_half_a_hop_after_librosas_centred_frames(speech):
    """Frame t is centred on sample t*hop + hop/2: HiFi-GAN's grid, not librosa's centre=True one."""
    s, y = SETTINGS["default"], speech[1]
    hop = s["hop_length"]
    shifted = np.concatenate([y[hop // 2:], np.zeros(hop // 2, np.float32)])  # sample t*hop+hop/2 -> t*hop
    centred = librosa.feature.melspectrogram(y=shifted, sr=SR, n_fft=1024, hop_length=hop, power=1.0,
                                             n_mels=80, fmin=0, fmax=8000, center=True, pad_mode="reflect")
    centred = np.log(np.clip(centred, 1e-5, None)).T
    mel = audio.mel_spectrogram(y, **s)
    inner = slice(4, mel.shape[0] - 4)  # away from the differently padded ends
    assert np.mean(np.abs(mel[inner] - centred[inner])) < 1e-3


def test_energy_is_the_l2_norm_of_the_magnitude(speech):
    s = SETTINGS["default"]
    spec = audio.stft_magnitude(speech[0], n_fft=s["n_fft"], hop_length=s["hop_length"], win_length=s["win_length"])
    assert spec.shape == (s["n_fft"] // 2 + 1, audio.n_frames(len(speech[0]), s["hop_length"]))
    energy = audio.energy_from_magnitude(spec)
    assert energy.dtype == np.float32 and energy.shape == (spec.shape[1],)
    np.testing.assert_allclose(energy, np.linalg.norm(spec.astype(np.float64), axis=0), rtol=1e-5)


def test_default_config_is_the_hifigan_setting():
    from pipeline import config
    cfg = config.load_config(None, check_paths=False)
    assert cfg["audio"] == SETTINGS["default"]


def test_mel_of_silence_is_the_clamp_and_shapes_follow_hop():
    for n in (1024, 1279, 1280, 1281, 22050):
        mel = audio.mel_spectrogram(np.zeros(n, np.float32), **SETTINGS["default"])
        assert mel.shape == (n // 256, 80) and audio.n_frames(n, 256) == n // 256
        np.testing.assert_allclose(mel, np.log(1e-5), rtol=0, atol=1e-6)
    odd = dict(SETTINGS["default"], hop_length=255)  # odd n_fft - hop: the grid still holds
    assert audio.mel_spectrogram(np.ones(1000, np.float32), **odd).shape == (1000 // 255, 80)


def test_mel_from_file_reads_and_keeps_the_signal(corpus_template, tmp_path):
    wav = sorted((corpus_template / "wavs").glob("*.wav"))[0]
    y, sr = sf.read(str(wav), dtype="float32")
    assert sr == SR
    mel = audio.mel_from_file(wav, SETTINGS["default"], max_seconds=20.0)
    np.testing.assert_allclose(mel, _reference(y, **SETTINGS["default"]), rtol=0, atol=5e-4)
    sf.write(tmp_path / "short.wav", y[len(y) // 2:len(y) // 2 + 255], SR)  # speech, under one hop
    with pytest.raises(audio.BadAudio, match="too short"):
        audio.mel_from_file(tmp_path / "short.wav", SETTINGS["default"], max_seconds=20.0)


MEL = dict(sample_rate=16000, n_fft=512, n_mels=40, fmin=20.0, fmax=7000.0)


def test_mel_basis_is_librosas_kept_in_a_memo_a_later_job_reads_without_librosa(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    audio.mel_basis.cache_clear()
    expected = librosa.filters.mel(sr=16000, n_fft=512, n_mels=40, fmin=20.0, fmax=7000.0).astype(np.float32)
    assert np.array_equal(audio.mel_basis(**MEL), expected)
    [memo] = (tmp_path / "tts-pipeline").iterdir()
    assert np.array_equal(np.load(memo), expected)
    # a later job (a fresh interpreter) reads the memo and never imports librosa
    code = ("import sys; from pipeline import audio; b = audio.mel_basis(**%r); "
            "print(b.shape, 'librosa' in sys.modules)" % MEL)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT)))
    assert proc.stdout.split() == ["(40,", "257)", "False"], proc.stderr[-2000:]
    # a damaged memo is made again; a folder that cannot be written still gives the filterbank
    memo.write_bytes(memo.read_bytes()[:200])
    audio.mel_basis.cache_clear()
    assert np.array_equal(audio.mel_basis(**MEL), expected) and np.array_equal(np.load(memo), expected)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("not a folder")
    audio.mel_basis.cache_clear()
    assert np.array_equal(audio.mel_basis(**MEL), expected)
    audio.mel_basis.cache_clear()
