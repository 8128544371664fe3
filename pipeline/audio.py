"""The one frame grid and mel definition, and the audio reading that feeds them.

HiFi-GAN's mel exactly (its meldataset.mel_spectrogram): the signal is reflect-padded by
(n_fft - hop)/2 on both sides and framed without centring, so a clip of n samples has
`n_frames(n, hop) = n // hop` frames, frame t centred on sample t*hop + hop/2; periodic Hann window
of win_length centred in n_fft; magnitude sqrt(re^2 + im^2 + 1e-9); librosa's slaney mel
filterbank; natural log clamped at 1e-5; at the config's `audio:` rate, n_fft, hop, window, n_mels,
fmin, fmax. Preprocessing, the loss targets, Griffin-Lim, pitch, energy and evaluation all use this
grid, so a public HiFi-GAN vocoder trained on the same settings voices our mels, and pitch and
energy never drift from the mel frames.

Any edit here changes the mel code digest, so every mel shard rebuilds (and no token shard).
"""
import functools
import hashlib
import json
import os
import struct
from importlib.metadata import version
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from pipeline.errors import PipelineError

LOG_CLAMP = 1e-5  # HiFi-GAN's dynamic-range floor: log(1e-5) ~ -11.5 is "silence"
SILENCE_PEAK = 1e-4  # a clip whose peak stays below this (-80 dBFS) holds no speech


class BadAudio(PipelineError):
    """A clip that cannot become a mel; the message says why (reported, or fatal with bad_audio: fail)."""


def _librosa_mel_basis(*, sample_rate, n_fft, n_mels, fmin, fmax):
    import librosa  # here, not at the top: importing it costs a job ~1.5 CPU s

    return librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax,
                               htk=False, norm="slaney").astype(np.float32)


def memo_folder():
    """Where mel_basis keeps its memo: $XDG_CACHE_HOME/tts-pipeline (default ~/.cache/tts-pipeline)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tts-pipeline"


@functools.lru_cache(maxsize=8)
def mel_basis(*, sample_rate, n_fft, n_mels, fmin, fmax):
    """(n_mels, n_fft // 2 + 1) float32: librosa's slaney filterbank, built once per setting and kept
    in a .npy memo in memo_folder(), keyed by the settings and librosa's version, so that only the
    first job (a shard job, training, synthesis, a vocoder) imports librosa to get it. A memo that does
    not load as the expected finite float32 array is made again; where the folder cannot be written,
    each job computes the filterbank."""
    params = dict(sample_rate=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
    key = hashlib.sha256(json.dumps({**params, "librosa": version("librosa")}, sort_keys=True).encode()).hexdigest()
    path = memo_folder() / f".mel_basis-{key[:16]}.npy"
    try:
        basis = np.load(path)
        if basis.dtype == np.float32 and basis.shape == (n_mels, n_fft // 2 + 1) and np.isfinite(basis).all():
            return basis
    except (OSError, ValueError):
        pass
    basis = _librosa_mel_basis(**params)
    from pipeline.errors import DiskFull
    from pipeline.files import atomic_write  # only when a memo is made
    try:
        atomic_write(path, lambda tmp: np.save(tmp, basis), suffix=".npy")
    except (OSError, DiskFull):
        pass  # a memo is a saving, never a reason to fail
    return basis


def n_frames(n_samples, hop_length):
    """THE frame count of a clip of n_samples (HiFi-GAN framing); mel, pitch and energy all have it."""
    return int(n_samples) // int(hop_length)


def hann_window(*, n_fft, win_length):
    """(n_fft,) float32 periodic Hann of win_length, centred in n_fft (torch.stft's placement)."""
    window = np.zeros(n_fft, np.float32)
    start = (n_fft - win_length) // 2
    window[start:start + win_length] = np.hanning(win_length + 1)[:-1]  # periodic Hann
    return window


def frame_padding(*, n_fft, hop_length):
    """(left, right) reflect padding: (n_fft - hop)/2 each side (the right takes the odd sample,
    so n_frames holds for any n_fft - hop; HiFi-GAN's settings are even)."""
    left = (n_fft - hop_length) // 2
    return left, n_fft - hop_length - left


def stft_magnitude(y, *, n_fft, hop_length, win_length):
    """(n_fft/2+1, n_frames) float32 sqrt(re^2 + im^2 + 1e-9) of HiFi-GAN's uncentred STFT."""
    y = np.asarray(y, np.float32)
    frames = n_frames(len(y), hop_length)
    padded = np.pad(y, frame_padding(n_fft=n_fft, hop_length=hop_length), mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length][:frames]  # (F, n_fft)
    spec = np.fft.rfft(windows * hann_window(n_fft=n_fft, win_length=win_length), axis=1)  # (F, K) complex64
    power = np.square(spec.real) + np.square(spec.imag)
    return np.sqrt(power + np.float32(1e-9)).T  # (K, F)


def energy_from_magnitude(spec):
    """(n_frames,) float32 L2 norm over frequency of an stft_magnitude (K, F)."""
    return np.sqrt(np.einsum("kf,kf->f", spec, spec, dtype=np.float32)).astype(np.float32)


def log_mel(spec, basis):
    """(F, n_mels) float32 natural-log mel of a magnitude (K, F) with a (n_mels, K) filterbank."""
    return np.log(np.maximum(basis @ spec, np.float32(LOG_CLAMP))).T.astype(np.float32, copy=False)


def mel_spectrogram(y, *, sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax, basis=None):
    """(n_frames, n_mels) float32 log-mel of mono float32 audio `y` at `sample_rate`."""
    spec = stft_magnitude(y, n_fft=n_fft, hop_length=hop_length, win_length=win_length)  # (n_fft/2+1, F)
    if basis is None:
        basis = mel_basis(sample_rate=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
    return log_mel(spec, basis)


def wav_shortfall(path):
    """Bytes a RIFF/WAVE file's data chunk declares beyond the end of the file (0 when whole).

    libsndfile reads a truncated WAV (a torn copy, a killed writer) as a shorter clip, silently;
    streamed WAVs, whose size field is a 0 or 0xFFFFFFFF placeholder, are left to libsndfile.
    """
    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return 0
        size, pos = f.seek(0, 2), 12
        while pos + 8 <= size:
            f.seek(pos)
            chunk, n = struct.unpack("<4sI", f.read(8))
            if chunk == b"data":
                return 0 if n in (0, 0xFFFFFFFF) else max(0, pos + 8 + n - size)
            pos += 8 + n + (n & 1)
    return 0


def load_audio(path, *, sample_rate, max_seconds):
    """Mono float32 audio at `sample_rate`, or BadAudio saying what is wrong with the file."""
    if not os.path.isfile(path):  # libsndfile reports a missing file as "System error."
        raise BadAudio("missing file")
    try:
        y, sr = sf.read(str(path), dtype="float32", always_2d=True)  # (samples, channels)
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadAudio(f"not readable as audio ({reason})") from None
    if y.shape[0] == 0:
        raise BadAudio("empty (no samples)")
    missing = wav_shortfall(path)
    if missing:
        raise BadAudio(f"truncated (the WAV header declares {missing} more bytes of audio than the file holds)")
    y = y.mean(axis=1)  # downmix
    if not np.all(np.isfinite(y)):
        raise BadAudio("holds NaN or infinite samples")
    seconds = y.shape[0] / sr
    if seconds > max_seconds:
        raise BadAudio(f"too long ({seconds:.1f} s > dataset.max_seconds {max_seconds})")
    if np.max(np.abs(y)) < SILENCE_PEAK:
        raise BadAudio("silent (peak below -80 dBFS)")
    if sr != sample_rate:
        y = soxr.resample(y, sr, sample_rate, quality="HQ")
    return np.ascontiguousarray(y, dtype=np.float32)


def mel_from_file(path, audio_cfg, max_seconds, basis=None):
    """(frames, n_mels) log-mel of an audio file, under the config's `audio:` section."""
    y = load_audio(path, sample_rate=audio_cfg["sample_rate"], max_seconds=max_seconds)
    check_length(y, audio_cfg["hop_length"])
    return mel_spectrogram(y, **audio_cfg, basis=basis)


def check_length(y, hop_length):
    """BadAudio for a clip too short to make one frame."""
    if n_frames(len(y), hop_length) == 0:
        raise BadAudio(f"too short ({len(y)} samples, fewer than audio.hop_length {hop_length})")
