"""The frame grid and mel definition: pipeline.audio against a direct NumPy transcription of
HiFi-GAN's mel_spectrogram (reflect-pad (n_fft - hop)/2, uncentred frames, periodic Hann,
sqrt(re^2 + im^2 + 1e-9), slaney filterbank, log clamp 1e-5) on real espeak-ng speech.

    python -m pytest -q tests/test_audio.py
"""
import os
import struct
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


def test_mel_basis_memo_is_keyed_by_every_setting_and_librosas_version(tmp_path, monkeypatch):
    """A job never reads the filterbank of another setting, nor one another librosa version made."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    variants = [MEL, dict(MEL, sample_rate=22050), dict(MEL, fmin=0.0), dict(MEL, fmax=6000.0)]
    for settings in variants + variants:  # the second round reads the memos
        audio.mel_basis.cache_clear()
        want = librosa.filters.mel(sr=settings["sample_rate"], n_fft=512, n_mels=40, fmin=settings["fmin"],
                                   fmax=settings["fmax"]).astype(np.float32)
        assert np.array_equal(audio.mel_basis(**settings), want), settings
    memos = tmp_path / "tts-pipeline"
    assert len(list(memos.iterdir())) == len(variants)
    monkeypatch.setattr(audio, "version", lambda name: "0.0.0-another")  # another librosa: a memo of its own
    audio.mel_basis.cache_clear()
    audio.mel_basis(**MEL)
    assert len(list(memos.iterdir())) == len(variants) + 1
    audio.mel_basis.cache_clear()


def test_a_memo_of_non_finite_values_or_another_dtype_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    audio.mel_basis.cache_clear()
    want = librosa.filters.mel(sr=16000, n_fft=512, n_mels=40, fmin=20.0, fmax=7000.0).astype(np.float32)
    audio.mel_basis(**MEL)
    [memo] = (tmp_path / "tts-pipeline").iterdir()
    nan = want.copy()
    nan[3, 7] = np.nan
    for bad in (nan, want.astype(np.float64)):
        np.save(memo, bad)
        audio.mel_basis.cache_clear()
        got = audio.mel_basis(**MEL)
        assert got.dtype == np.float32 and np.array_equal(got, want)
        assert np.load(memo).dtype == np.float32 and np.array_equal(np.load(memo), want)
    audio.mel_basis.cache_clear()


def test_an_odd_n_fft_minus_hop_pads_the_extra_sample_on_the_right(speech):
    """(n_fft - hop) / 2 each side, the right taking the odd sample: frame t is the n_fft samples from
    t*hop - left, and a clip of a whole number of hops keeps n // hop frames."""
    n_fft, hop = 1024, 255
    left, right = (n_fft - hop) // 2, (n_fft - hop) // 2 + 1
    assert audio.frame_padding(n_fft=n_fft, hop_length=hop) == (left, right)
    y = speech[0][:20 * hop]
    spec = audio.stft_magnitude(y, n_fft=n_fft, hop_length=hop, win_length=n_fft)
    assert spec.shape == (n_fft // 2 + 1, 20)
    padded = np.pad(y.astype(np.float64), (left, right), mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    for t in (0, 9, 19):
        want = np.abs(np.fft.rfft(padded[t * hop:t * hop + n_fft] * window))
        np.testing.assert_allclose(spec[:, t], np.sqrt(want ** 2 + 1e-9), rtol=1e-3, atol=1e-4)


def _wav_with_an_odd_chunk_first(pcm):
    """A 16-bit mono RIFF/WAVE: fmt, then a 5-byte LIST chunk and its pad byte, then the data chunk."""
    body = (b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, SR, 2 * SR, 2, 16)
            + b"LIST" + struct.pack("<I", 5) + b"INFOx\0" + b"data" + struct.pack("<I", len(pcm)) + pcm)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_cut_wav_is_truncated_by_the_bytes_it_lost_after_an_odd_sized_chunk(speech, tmp_path):
    y = np.round(speech[1] * 32767).astype("<i2")
    raw = _wav_with_an_odd_chunk_first(y.tobytes())
    (tmp_path / "whole.wav").write_bytes(raw)
    assert audio.wav_shortfall(tmp_path / "whole.wav") == 0
    np.testing.assert_array_equal(audio.load_audio(tmp_path / "whole.wav", sample_rate=SR, max_seconds=20.0),
                                  y / np.float32(32768))
    for lost in (1, len(y)):
        (tmp_path / "cut.wav").write_bytes(raw[:-lost])
        assert audio.wav_shortfall(tmp_path / "cut.wav") == lost
        with pytest.raises(audio.BadAudio, match=rf"^truncated \(the WAV header declares {lost} more bytes"):
            audio.load_audio(tmp_path / "cut.wav", sample_rate=SR, max_seconds=20.0)


def test_a_file_soundfile_cannot_open_is_bad_audio_not_a_crash(tmp_path):
    (tmp_path / "clip.raw").write_bytes(bytes(4000))  # headerless PCM: soundfile wants its rate (TypeError)
    with pytest.raises(audio.BadAudio, match=r"^not readable as audio \(samplerate must be specified\)"):
        audio.load_audio(tmp_path / "clip.raw", sample_rate=SR, max_seconds=20.0)


def test_max_seconds_is_measured_at_the_files_own_rate_and_a_clip_of_exactly_it_is_kept(speech, tmp_path):
    y = speech[2][:int(1.6 * 16000)]   # 1.6 s of samples, stored as a 16 kHz file
    sf.write(tmp_path / "x.wav", y, 16000, subtype="FLOAT")
    assert len(audio.load_audio(tmp_path / "x.wav", sample_rate=SR, max_seconds=1.6)) == round(1.6 * SR)
    with pytest.raises(audio.BadAudio, match=r"^too long \(1\.6 s > dataset\.max_seconds 1\.5\)"):
        audio.load_audio(tmp_path / "x.wav", sample_rate=SR, max_seconds=1.5)


def test_a_16_khz_file_keeps_its_band_to_7_khz_when_resampled(tmp_path):
    """The mel's top bands (to audio.fmax 8000) come from what a 16 kHz file holds: a 7 kHz tone arrives
    within -60 dB of the exact 22,050 Hz signal."""
    sf.write(tmp_path / "tone.wav", 0.5 * np.sin(2 * np.pi * 7000 * np.arange(16000) / 16000), 16000, subtype="FLOAT")
    got = audio.load_audio(tmp_path / "tone.wav", sample_rate=SR, max_seconds=20.0)
    want = 0.5 * np.sin(2 * np.pi * 7000 * np.arange(SR) / SR)
    assert len(got) == SR
    inner = slice(SR // 10, -SR // 10)  # away from the ends, where the filter starts and stops
    assert np.max(np.abs(got[inner] - want[inner])) < 1e-3


def test_every_sample_is_kept_and_one_hop_is_one_frame(speech, tmp_path):
    y = np.round(speech[0][:SR + 1] * 32767).astype(np.int16)  # an odd number of samples
    sf.write(tmp_path / "odd.wav", y, SR, subtype="PCM_16")
    np.testing.assert_array_equal(audio.load_audio(tmp_path / "odd.wav", sample_rate=SR, max_seconds=20.0),
                                  y / np.float32(32768))
    s = SETTINGS["default"]
    middle = np.flatnonzero(np.abs(y) > 3000)[0]  # speech, not silence
    sf.write(tmp_path / "hop.wav", y[middle:middle + s["hop_length"]], SR, subtype="PCM_16")
    assert audio.mel_from_file(tmp_path / "hop.wav", s, max_seconds=20.0).shape == (1, s["n_mels"])
