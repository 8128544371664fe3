"""Griffin-Lim vocoder in TensorFlow: natural-log mel (the project's mel definition) -> waveform.

For TensorBoard audio and quick listening; a trained HiFi-GAN on the same mel gives far better speech.
Config keys used by callers: `audio:` (sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax) and
`synthesize.griffin_lim_iters`.

    audio = griffin_lim(log_mel, **cfg["audio"], iters=32)   # log_mel (F, n_mels)
    save_wav("out.wav", audio, cfg["audio"]["sample_rate"])
"""

import numpy as np
import soundfile as sf
import tensorflow as tf

from pipeline.audio import LOG_CLAMP, frame_padding, mel_basis
from pipeline.config import atomic_write

MOMENTUM = 0.99  # fast Griffin-Lim (Perraudin et al. 2013), librosa's default; converges in fewer iterations
NNLS_ITERS = 50  # refinements of the mel pseudo-inverse (cheap: two (F, K) x (K, M) products each)
PEAK = 0.95      # clipping audio is scaled to this peak before 16-bit conversion


def _window_fn(n_fft, win_length):
    """Periodic Hann of win_length centred in n_fft samples, as librosa pads it."""
    def window_fn(frame_length, dtype=tf.float32):  # frame_length is always n_fft here
        left = (n_fft - win_length) // 2
        return tf.pad(tf.signal.hann_window(win_length, periodic=True, dtype=dtype),
                      [[left, n_fft - win_length - left]])
    return window_fn


@tf.function(reduce_retracing=True)
def _griffin_lim(magnitude, iters, n_fft, hop_length, win_length):
    """magnitude (F, n_fft//2+1) float32 -> audio (F*hop,). Both transforms follow the mel's HiFi-GAN
    framing (reflect-pad (n_fft-hop)/2, uncentred frames; trimming out), so phase recovery targets
    exactly the STFT the mel was made from."""
    window_fn = _window_fn(n_fft, win_length)
    inverse_window_fn = tf.signal.inverse_stft_window_fn(hop_length, forward_window_fn=window_fn)
    left, right = frame_padding(n_fft=n_fft, hop_length=hop_length)
    length = tf.shape(magnitude)[0] * hop_length
    # inverse_stft normalises for full overlap; the first and last frames overlap less: undo that there
    frame_weight = window_fn(n_fft) * inverse_window_fn(n_fft, tf.float32)    # (n_fft,)
    overlap = tf.signal.overlap_and_add(tf.tile(frame_weight[None], [tf.shape(magnitude)[0], 1]), hop_length)
    overlap = overlap[left:left + length]                                      # > 0: every sample is covered

    def stft(x):
        x = tf.pad(x, [[left, right]], mode="REFLECT")
        return tf.signal.stft(x, n_fft, hop_length, fft_length=n_fft, window_fn=window_fn)  # (F, K)

    def istft(spec):
        x = tf.signal.inverse_stft(spec, n_fft, hop_length, fft_length=n_fft, window_fn=inverse_window_fn)
        return x[left:left + length] / overlap

    magnitude_c = tf.complex(magnitude, 0.0)
    phase = tf.random.stateless_uniform(tf.shape(magnitude), seed=[0, 0], maxval=2 * np.pi)
    angles = tf.exp(tf.complex(0.0, phase))                                    # (F, K) unit phasors
    previous = tf.zeros_like(angles)
    for _ in tf.range(iters):
        rebuilt = stft(istft(magnitude_c * angles))                            # nearest consistent STFT
        accelerated = rebuilt - tf.cast(MOMENTUM / (1 + MOMENTUM), tf.complex64) * previous
        angles = accelerated / tf.complex(tf.abs(accelerated) + 1e-16, 0.0)
        previous = rebuilt
    return istft(magnitude_c * angles)


def griffin_lim(log_mel, *, sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax, iters=32,
                power=1.5):
    """log_mel (F, n_mels) natural-log magnitude mel -> float32 audio (F*hop_length,), the length of a
    clip with F mel frames. power > 1 sharpens harmonics before phase recovery (Tacotron; the total
    energy is kept); 1.0 keeps the magnitudes. Run save_wav or clip before playback: peaks may exceed 1."""
    log_mel = tf.convert_to_tensor(log_mel, tf.float32)
    assert log_mel.shape.rank == 2 and log_mel.shape[1] == n_mels, f"expected (F, {n_mels}), got {log_mel.shape}"
    frames = log_mel.shape[0]
    length = frames * hop_length
    min_frames = frame_padding(n_fft=n_fft, hop_length=hop_length)[1] // hop_length + 1  # reflect pad < signal
    if frames < min_frames:                     # e.g. a decoder that stopped at once: pad with silence
        log_mel = tf.pad(log_mel, [[0, min_frames - frames], [0, 0]], constant_values=float(np.log(LOG_CLAMP)))
    basis = mel_basis(sample_rate=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)  # (M, K)
    mel = tf.exp(log_mel)                                                      # (F, M)
    magnitude = tf.nn.relu(mel @ tf.constant(np.linalg.pinv(basis).T, tf.float32))  # (F, K)
    # The pseudo-inverse leaks strong bands into weak ones; multiplicative non-negative least-squares
    # updates (Lee & Seung) shrink those leaks geometrically: mel error ~0.35 -> ~0.07 nats in 50 steps.
    basis = tf.constant(basis)
    target = mel @ basis                                                       # (F, K)
    for _ in range(NNLS_ITERS):
        magnitude *= target / ((magnitude @ tf.transpose(basis)) @ basis + 1e-10)
    sharpened = magnitude ** power
    sharpened *= tf.norm(magnitude) / (tf.norm(sharpened) + 1e-10)            # same energy: level unchanged
    return _griffin_lim(sharpened, tf.constant(iters), n_fft, hop_length, win_length)[:length]


def save_wav(path, audio, sample_rate):
    """Write 16-bit PCM atomically (temp file + rename); audio that would clip is scaled to a 0.95 peak."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak > 1.0:
        audio = audio * (PEAK / peak)
    atomic_write(path, lambda tmp: sf.write(tmp, audio, int(sample_rate), subtype="PCM_16", format="WAV"))
