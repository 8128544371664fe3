"""Exportable STFT and inverse STFT on the project's mel framing, as matmuls with a fixed DFT basis.

The frame grid is pipeline.audio's (HiFi-GAN's): the signal is reflect-padded by (n_fft - hop)/2 on
both sides and framed without centring, so n samples give n // hop frames; the window is a periodic
Hann of win_length centred in n_fft. The transforms use only tf.pad, tf.signal.frame, matmul and an
overlap-add of pads and reshapes (tf.signal.overlap_and_add's ellipsis slices are not TFLite
built-ins), so a graph built on them converts to TFLite with built-in ops only (TFLite has no native
RFFT/IRFFT: tf.signal.stft and inverse_stft need Flex ops) and runs in TensorFlow alone.

Spectra are (real, imag) float32 pairs shaped [..., frames, n_fft // 2 + 1] (tf.signal.stft's order;
pipeline.audio.stft_magnitude returns the transpose). istft is the least-squares inverse (windowed
overlap-add divided by the summed squared window), so istft(stft(x)) == x[:frames * hop]; it returns
frames * hop samples, the length of a clip with that many mel frames.

    real, imag = stft(audio, n_fft=1024, hop_length=256, win_length=1024)   # audio [..., n]
    # rfft_stft / rfft_istft: the same transforms through tf.signal.rfft (TFLite RFFT2D, n_fft 2^k)
    stft, istft = transforms(n_fft=1024, hop_length=256, win_length=1024)  # a model's pair: FFT at 2^k
    audio = istft(real, imag, n_fft=1024, hop_length=256, win_length=1024)  # [..., frames * 256]
    mag = magnitude(real, imag)                                             # sqrt(re^2 + im^2 + 1e-9)
    log_mel = log_mel_spectrogram(audio, **cfg["audio"])                   # [..., frames, n_mels]
"""
import functools

import numpy as np
import tensorflow as tf

from pipeline.audio import LOG_CLAMP, frame_padding, hann_window, mel_basis

EPSILON = 1e-9  # inside the square root of the magnitude, as pipeline.audio.stft_magnitude


@functools.lru_cache(maxsize=8)
def dft_bases(*, n_fft, win_length):
    """Float32 numpy (forward_real, forward_imag, inverse_real, inverse_imag) for the windowed DFT.

    forward_*: (n_fft, K) with the analysis window folded in: real = frames @ forward_real.
    inverse_*: (K, n_fft) with the synthesis window folded in: the windowed irfft of each frame is
    real @ inverse_real + imag @ inverse_imag (irfft ignores the imaginary DC and Nyquist parts).
    """
    k_bins = n_fft // 2 + 1
    n = np.arange(n_fft)
    angle = 2.0 * np.pi * np.outer(n, np.arange(k_bins)) / n_fft           # (n_fft, K), float64
    window = hann_window(n_fft=n_fft, win_length=win_length).astype(np.float64)
    forward_real = window[:, None] * np.cos(angle)
    forward_imag = -window[:, None] * np.sin(angle)
    weight = np.full(k_bins, 2.0 / n_fft)                                   # each bin stands for +k and -k
    weight[0] = 1.0 / n_fft
    if n_fft % 2 == 0:
        weight[-1] = 1.0 / n_fft                                            # Nyquist is its own mirror
    inverse_real = weight[:, None] * np.cos(angle.T) * window[None, :]
    inverse_imag = -weight[:, None] * np.sin(angle.T) * window[None, :]
    return tuple(b.astype(np.float32) for b in (forward_real, forward_imag, inverse_real, inverse_imag))


def _check(n_fft, hop_length, win_length):
    assert 0 < hop_length <= win_length <= n_fft, \
        f"need 0 < hop_length ({hop_length}) <= win_length ({win_length}) <= n_fft ({n_fft})"


def _frames(audio, *, n_fft, hop_length, win_length):
    """audio float32 [..., n] -> frames [..., n // hop_length, n_fft] on the mel's grid: reflect-padded
    by (n_fft - hop) / 2 on both sides, uncentred (HiFi-GAN's framing, as pipeline.audio frames)."""
    _check(n_fft, hop_length, win_length)
    audio = tf.convert_to_tensor(audio, tf.float32)
    rank = audio.shape.rank
    assert rank is not None and rank >= 1, f"audio needs a known rank >= 1, got {audio.shape}"
    left, right = frame_padding(n_fft=n_fft, hop_length=hop_length)
    padded = tf.pad(audio, [[0, 0]] * (rank - 1) + [[left, right]], mode="REFLECT")
    return tf.signal.frame(padded, n_fft, hop_length)


def stft(audio, *, n_fft, hop_length, win_length):
    """audio float32 [..., n] -> (real, imag) float32 [..., n // hop_length, n_fft // 2 + 1].

    n must exceed the reflect padding, (n_fft - hop_length) / 2 rounded up (two frames at the
    HiFi-GAN settings); the last n % hop_length samples fall outside the frame grid."""
    frames = _frames(audio, n_fft=n_fft, hop_length=hop_length, win_length=win_length)  # [..., F, n_fft]
    forward_real, forward_imag, _, _ = dft_bases(n_fft=n_fft, win_length=win_length)
    return (tf.matmul(frames, tf.constant(forward_real)), tf.matmul(frames, tf.constant(forward_imag)))


def istft(real, imag, *, n_fft, hop_length, win_length):
    """(real, imag) float32 [..., F, n_fft // 2 + 1] -> audio float32 [..., F * hop_length].

    The least-squares inverse on the same grid: windowed irfft frames, overlap-added, divided by the
    overlap-added squared window, with the reflect padding trimmed off."""
    _check(n_fft, hop_length, win_length)
    real = tf.convert_to_tensor(real, tf.float32)
    imag = tf.convert_to_tensor(imag, tf.float32)
    _, _, inverse_real, inverse_imag = dft_bases(n_fft=n_fft, win_length=win_length)
    frames = tf.matmul(real, tf.constant(inverse_real)) + tf.matmul(imag, tf.constant(inverse_imag))
    return _overlap_trim(frames, n_fft=n_fft, hop_length=hop_length, win_length=win_length)


def _overlap_trim(frames, *, n_fft, hop_length, win_length):
    """Windowed frames [..., F, n_fft] -> audio [..., F * hop]: overlap-add, divide by the summed
    squared window, trim the reflect padding."""
    rank = frames.shape.rank
    assert rank is not None and rank >= 2, f"spectra need a known rank >= 2, got {frames.shape}"
    signal = overlap_add(frames, hop_length)                                # [..., (F - 1) * hop + n_fft]
    envelope = _window_envelope(tf.shape(frames)[-2], n_fft=n_fft, hop_length=hop_length, win_length=win_length)
    left, _ = frame_padding(n_fft=n_fft, hop_length=hop_length)
    length = tf.shape(frames)[-2] * hop_length
    signal = tf.slice(signal, [0] * (rank - 2) + [left], tf.stack([-1] * (rank - 2) + [length]))
    return signal / tf.slice(envelope, [left], [length])


def rfft_stft(audio, *, n_fft, hop_length, win_length):
    """stft through tf.signal.rfft: the same (real, imag), O(n log n). TFLite converts it to its built-in
    RFFT2D, which needs n_fft a power of two (fft_ok)."""
    frames = _frames(audio, n_fft=n_fft, hop_length=hop_length, win_length=win_length) \
        * hann_window(n_fft=n_fft, win_length=win_length)
    spec = tf.signal.rfft(frames)                                           # [..., F, K] complex64
    return tf.math.real(spec), tf.math.imag(spec)


def rfft_istft(real, imag, *, n_fft, hop_length, win_length):
    """istft with each inverse real DFT done by one forward real FFT (TFLite has RFFT2D, no IRFFT).

    Over the full circle, the even extension of `real` has a real spectrum A and the odd extension of
    `imag` (its DC and Nyquist parts dropped, as irfft ignores them) a purely imaginary one B, so one
    rfft of their sum gives both: C = A + B, Re C = A, Im C = B / i. Then irfft(X)[n] =
    (Re C + Im C)[n] / n_fft for n <= n_fft/2 and (Re C - Im C)[n_fft - n] / n_fft after."""
    _check(n_fft, hop_length, win_length)
    assert fft_ok(n_fft), f"rfft_istft needs n_fft a power of two, got {n_fft}"
    real = tf.convert_to_tensor(real, tf.float32)
    imag = tf.convert_to_tensor(imag, tf.float32)
    mirror = np.arange(n_fft // 2 - 1, 0, -1)                               # K-2 .. 1: bins n_fft/2+1 .. n_fft-1
    inner = np.ones(n_fft // 2 + 1, np.float32)
    inner[[0, -1]] = 0.0                                                    # imag at DC and Nyquist: ignored
    even = tf.concat([real, tf.gather(real, mirror, axis=-1)], -1)          # [..., F, n_fft]
    odd = tf.concat([imag * inner, -tf.gather(imag, mirror, axis=-1)], -1)
    both = tf.signal.rfft(even + odd)                                       # [..., F, K]
    re, im = tf.math.real(both), tf.math.imag(both)
    low = (re + im) / n_fft                                                 # samples 0 .. n_fft/2
    high = tf.gather((re - im) / n_fft, mirror, axis=-1)                    # n_fft/2+1 .. n_fft-1
    frames = tf.concat([low, high], -1) * hann_window(n_fft=n_fft, win_length=win_length)
    return _overlap_trim(frames, n_fft=n_fft, hop_length=hop_length, win_length=win_length)


def transform_name(n_fft):
    """The pair a graph takes at this n_fft: "rfft" (rfft_stft, rfft_istft) where n_fft is a power of
    two (fft_ok), else "dft" (the matmuls stft, istft)."""
    return "rfft" if fft_ok(n_fft) else "dft"


def transforms(*, n_fft, hop_length, win_length, name=None):
    """(stft, istft) on this grid for a graph, trained and exported alike: the pair `name` ("rfft" or
    "dft"; None: transform_name(n_fft)). The same spectra and audio within float32 rounding
    (tests/test_dft.py), and TFLite built-ins either way; the FFT costs O(n log n) a frame against the
    matmuls' O(n^2) and needs no basis constants (the matmuls' are 4 x n_fft x (n_fft / 2 + 1)
    floats: 8.4 MB at n_fft 1024)."""
    grid = dict(n_fft=n_fft, hop_length=hop_length, win_length=win_length)
    forward, inverse = {"rfft": (rfft_stft, rfft_istft), "dft": (stft, istft)}[name or transform_name(n_fft)]
    return functools.partial(forward, **grid), functools.partial(inverse, **grid)


def fft_ok(n_fft):
    """Whether rfft_stft / rfft_istft convert to TFLite built-ins: RFFT2D takes powers of two only."""
    return n_fft >= 4 and n_fft & (n_fft - 1) == 0


def overlap_add(frames, hop_length):
    """frames float32 [..., F, L] -> [..., (F - 1) * hop_length + L], each frame added in at
    t * hop_length: tf.signal.overlap_and_add without its ellipsis slices, which TFLite lacks."""
    rank = frames.shape.rank
    length = frames.shape[-1]
    assert rank is not None and rank >= 2 and length is not None, f"frames need a known rank and length: {frames.shape}"
    parts = -(-length // hop_length)                                        # hops per frame, rounded up
    frames = tf.pad(frames, [[0, 0]] * (rank - 1) + [[0, parts * hop_length - length]])
    outer = tf.shape(frames)[:-1]                                           # [..., F]
    frames = tf.reshape(frames, tf.concat([outer, [parts, hop_length]], 0))  # [..., F, parts, hop]
    total = 0
    for r, part in enumerate(tf.unstack(frames, num=parts, axis=rank - 1)):  # part r lands r hops later
        total += tf.pad(part, [[0, 0]] * (rank - 2) + [[r, parts - 1 - r], [0, 0]])  # [..., F + parts - 1, hop]
    n_frames = outer[-1]
    signal = tf.reshape(total, tf.concat([outer[:-1], [(n_frames + parts - 1) * hop_length]], 0))
    return tf.slice(signal, [0] * (rank - 1), tf.stack([-1] * (rank - 2) + [(n_frames - 1) * hop_length + length]))


def _window_envelope(n_frames, *, n_fft, hop_length, win_length):
    """(samples,) overlap-added squared window of n_frames frames; at least half its peak on the trimmed
    span when 2 * hop_length <= win_length, which the config requires (towards hop_length == win_length
    it falls to 0 at every hop-th sample: the periodic window's first value; samples outside any
    window are divided by 1, they are 0 anyway)."""
    window = hann_window(n_fft=n_fft, win_length=win_length)
    squared = tf.tile(tf.constant(np.square(window))[None], tf.stack([n_frames, 1]))  # (F, n_fft)
    envelope = overlap_add(squared, hop_length)
    return tf.where(envelope > 1e-8, envelope, tf.ones_like(envelope))


def magnitude(real, imag):
    """sqrt(re^2 + im^2 + 1e-9): pipeline.audio.stft_magnitude's magnitude (never 0, so its gradient is finite)."""
    return tf.sqrt(tf.square(real) + tf.square(imag) + EPSILON)


def polar(mag, phase):
    """(real, imag) of a spectrum given its magnitude and phase (radians), e.g. a vocoder's outputs."""
    return mag * tf.cos(phase), mag * tf.sin(phase)


def log_mel_spectrogram(audio, *, sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax):
    """audio float32 [..., n] -> natural-log mel float32 [..., n // hop_length, n_mels]: the project's
    mel (pipeline.audio.mel_spectrogram) as a differentiable, exportable TensorFlow graph."""
    forward, _ = transforms(n_fft=n_fft, hop_length=hop_length, win_length=win_length)
    real, imag = forward(audio)
    basis = mel_basis(sample_rate=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)  # (M, K)
    mel = tf.matmul(magnitude(real, imag), tf.constant(basis.T))            # [..., F, M]
    return tf.math.log(tf.maximum(mel, LOG_CLAMP))
