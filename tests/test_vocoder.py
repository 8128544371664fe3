"""Griffin-Lim round trip against the project's mel definition, and 16-bit wav writing."""
import os

import librosa
import numpy as np
import pytest
import soundfile as sf

from pipeline.vocoder import griffin_lim, save_wav

AUDIO = dict(sample_rate=22050, n_fft=1024, hop_length=256, win_length=1024, n_mels=80, fmin=0, fmax=8000)


def log_mel(y):
    a = AUDIO  # the golden definition (DESIGN.md): slaney mel of a reflect-padded magnitude STFT, log clamp 1e-5
    mel = librosa.feature.melspectrogram(
        y=y, sr=a["sample_rate"], n_fft=a["n_fft"], hop_length=a["hop_length"], win_length=a["win_length"],
        window="hann", center=True, pad_mode="reflect", power=1.0, n_mels=a["n_mels"], fmin=a["fmin"],
        fmax=a["fmax"], norm="slaney", htk=False)
    return np.log(np.clip(mel, 1e-5, None)).T                                  # (F, n_mels)


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
    assert audio.shape[0] == (target.shape[0] - 1) * AUDIO["hop_length"]     # librosa's centred istft length
    assert abs(audio.shape[0] - harmonic.shape[0]) < AUDIO["hop_length"]
    diff = np.abs(log_mel(audio.numpy()) - target).mean()
    assert diff < 0.5, f"mean |log-mel difference| {diff:.3f}"


def test_default_power_sharpens_but_stays_finite(harmonic):
    target = log_mel(harmonic)
    audio = griffin_lim(target, **AUDIO, iters=4).numpy()
    assert audio.shape == ((target.shape[0] - 1) * AUDIO["hop_length"],)
    assert np.all(np.isfinite(audio)) and np.abs(audio).max() > 0
    short = griffin_lim(target[:2], **AUDIO, iters=2)                         # shorter than the reflect pad
    assert short.shape == (AUDIO["hop_length"],) and np.all(np.isfinite(short))


def test_save_wav_writes_16_bit_and_normalises_clipping(tmp_path):
    path = tmp_path / "sub" / "out.wav"
    audio = 2.0 * np.sin(np.linspace(0, 200 * np.pi, 4000)).astype(np.float32)  # peak 2: would clip
    save_wav(str(path), audio, 22050)
    info = sf.info(str(path))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (22050, 1, 4000, "PCM_16")
    back, _ = sf.read(str(path), dtype="float32")
    assert 0.9 < np.abs(back).max() <= 0.951
    assert os.listdir(path.parent) == ["out.wav"]                              # no temp file left behind

    quiet = 0.5 * audio / 2.0
    save_wav(str(path), quiet, 16000)                                          # overwrite; not rescaled
    back, sr = sf.read(str(path), dtype="float32")
    assert sr == 16000 and np.allclose(back, quiet, atol=1e-4)
