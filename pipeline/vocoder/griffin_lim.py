"""Griffin-Lim vocoder in TensorFlow: natural-log mel (the project's mel definition) -> waveform.

For TensorBoard audio and quick listening; a trained HiFi-GAN on the same mel gives far better speech.
Config keys used by callers: `audio:` (sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax) and
`synthesize.griffin_lim_iters`.

    audio = griffin_lim(log_mel, **cfg["audio"], iters=32)   # log_mel (F, n_mels)
    wavfile.save_wav("out.wav", audio, cfg["audio"]["sample_rate"])   # pipeline/wavfile.py

`griffin_lim_graph` is the same computation as plain TensorFlow ops for a graph of one's own (the
exported SavedModel and TFLite model, pipeline/export.py): "fft" transforms give the very audio
`griffin_lim` gives; "dft" and "rfft" (pipeline.dft's matmuls or real-FFT pair: TFLite built-ins)
agree to ~1e-4. The
starting phase is a fixed table, not a random op, so every runtime starts from the same phase.
"""
import functools

import numpy as np
import tensorflow as tf

from pipeline import dft
from pipeline.audio import LOG_CLAMP, frame_padding, mel_basis

MOMENTUM = 0.99  # fast Griffin-Lim (Perraudin et al. 2013), librosa's default; converges in fewer iterations
NNLS_ITERS = 50  # refinements of the mel pseudo-inverse (cheap: two (F, K) x (K, M) products each)
TINY = 1e-7      # divisions' floor; float16 holds it (1e-10 would round to 0 in a float16 TFLite model: 0/0)
PHASE_FRAMES = 64  # rows of the fixed random starting phase, repeated over longer mels


def _window_fn(n_fft, win_length):
    """Periodic Hann of win_length centred in n_fft samples, as librosa pads it."""
    def window_fn(frame_length, dtype=tf.float32):  # frame_length is always n_fft here
        left = (n_fft - win_length) // 2
        return tf.pad(tf.signal.hann_window(win_length, periodic=True, dtype=dtype),
                      [[left, n_fft - win_length - left]])
    return window_fn


def _fft_transforms(n_fft, hop_length, win_length):
    """(stft, istft) on (real, imag) pairs through TensorFlow's FFT: fastest, but TFLite needs Flex
    ops for it. The same grid and least-squares inverse as pipeline.dft (tests/test_dft.py)."""
    window_fn = _window_fn(n_fft, win_length)
    inverse_window_fn = tf.signal.inverse_stft_window_fn(hop_length, forward_window_fn=window_fn)
    left, right = frame_padding(n_fft=n_fft, hop_length=hop_length)
    frame_weight = window_fn(n_fft) * inverse_window_fn(n_fft, tf.float32)    # (n_fft,)

    def stft(x):
        x = tf.pad(x, [[left, right]], mode="REFLECT")
        spec = tf.signal.stft(x, n_fft, hop_length, fft_length=n_fft, window_fn=window_fn)  # (F, K)
        return tf.math.real(spec), tf.math.imag(spec)

    def istft(real, imag):
        frames = tf.shape(real)[0]
        length = frames * hop_length
        x = tf.signal.inverse_stft(tf.complex(real, imag), n_fft, hop_length, fft_length=n_fft,
                                   window_fn=inverse_window_fn)
        # inverse_stft normalises for full overlap; the first and last frames overlap less: undo that there
        overlap = tf.signal.overlap_and_add(tf.tile(frame_weight[None], [frames, 1]), hop_length)
        return x[left:left + length] / overlap[left:left + length]            # > 0: every sample is covered

    return stft, istft


def initial_phase(frames, k_bins):
    """(cos, sin) float32 (frames, k_bins) of Griffin-Lim's starting phase: a fixed table of uniform
    random phases (seed 0), repeated every PHASE_FRAMES frames. A constant, not a random op, so every
    runtime (TensorFlow, a SavedModel, TFLite) starts from the same phase and gives the same audio."""
    phase = np.random.default_rng(0).uniform(0, 2 * np.pi, (PHASE_FRAMES, k_bins))
    repeats = frames // PHASE_FRAMES + 1
    cos = tf.tile(tf.constant(np.cos(phase), tf.float32), tf.stack([repeats, 1]))[:frames]
    sin = tf.tile(tf.constant(np.sin(phase), tf.float32), tf.stack([repeats, 1]))[:frames]
    return cos, sin


def _phase_recovery(magnitude, iters, stft, istft):
    """magnitude (F, K) -> audio (F*hop,): fast Griffin-Lim. Both transforms follow the mel's HiFi-GAN
    framing (reflect-pad (n_fft-hop)/2, uncentred frames; trimming out), so phase recovery targets
    exactly the STFT the mel was made from. Real arithmetic throughout (no complex tensors)."""
    def step(i, cos, sin, prev_re, prev_im):
        re, im = stft(istft(magnitude * cos, magnitude * sin))               # nearest consistent STFT
        acc_re, acc_im = re - MOMENTUM / (1 + MOMENTUM) * prev_re, im - MOMENTUM / (1 + MOMENTUM) * prev_im
        norm = tf.maximum(tf.sqrt(tf.square(acc_re) + tf.square(acc_im)), TINY)
        return i + 1, acc_re / norm, acc_im / norm, re, im

    cos, sin = initial_phase(tf.shape(magnitude)[0], magnitude.shape[-1])
    zeros = tf.zeros_like(magnitude)
    _, cos, sin, _, _ = tf.while_loop(lambda i, *_: i < iters, step, (tf.constant(0), cos, sin, zeros, zeros))
    return istft(magnitude * cos, magnitude * sin)


def griffin_lim_graph(log_mel, *, sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax, iters=32,
                      power=1.5, transforms="fft"):
    """griffin_lim as traceable TensorFlow ops for a graph of one's own (a SavedModel, a TFLite
    model): log_mel (F, n_mels) float32 with F unknown until run time -> audio (F * hop_length,).
    transforms: "fft" (TensorFlow's FFT), "dft" (pipeline.dft's matmuls) or "rfft" (pipeline.dft's
    real-FFT pair, n_fft a power of two); the last two convert to TFLite with built-in ops only."""
    min_frames = frame_padding(n_fft=n_fft, hop_length=hop_length)[1] // hop_length + 1  # reflect pad < signal
    frames = tf.shape(log_mel)[0]
    length = frames * hop_length
    # e.g. a decoder that stopped at once: pad with silence, cut after
    log_mel = tf.pad(log_mel, tf.stack([tf.stack([0, tf.maximum(min_frames - frames, 0)]), [0, 0]]),
                     constant_values=float(np.log(LOG_CLAMP)))
    basis = mel_basis(sample_rate=sample_rate, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)  # (M, K)
    mel = tf.exp(log_mel)                                                      # (F, M)
    magnitude = tf.nn.relu(tf.matmul(mel, tf.constant(np.linalg.pinv(basis).T, tf.float32)))  # (F, K)
    # The pseudo-inverse leaks strong bands into weak ones; multiplicative non-negative least-squares
    # updates (Lee & Seung) shrink those leaks geometrically: mel error ~0.35 -> ~0.07 nats in 50 steps.
    basis_t, basis = tf.constant(basis.T), tf.constant(basis)                 # (K, M), (M, K)
    target = tf.matmul(mel, basis)                                             # (F, K)
    _, magnitude = tf.while_loop(  # a loop in the graph: unrolled, its ~150 ops cost ~1 CPU s a first call
        lambda i, m: i < NNLS_ITERS,
        lambda i, m: (i + 1, m * (target / tf.maximum(tf.matmul(tf.matmul(m, basis_t), basis), TINY))),
        (tf.constant(0), magnitude))
    sharpened = magnitude ** power
    scale = tf.sqrt(tf.reduce_sum(tf.square(magnitude))) / tf.maximum(tf.sqrt(tf.reduce_sum(tf.square(sharpened))), TINY)
    grid = dict(n_fft=n_fft, hop_length=hop_length, win_length=win_length)
    stft, istft = _fft_transforms(**grid) if transforms == "fft" else dft.transforms(**grid, name=transforms)
    return _phase_recovery(sharpened * scale, iters, stft, istft)[:length]    # same energy: level unchanged


@functools.lru_cache(maxsize=None)
def _griffin_lim(audio):
    """The graph for one `audio:` setting (sorted items), traced once for every mel length."""
    audio = dict(audio)
    return tf.function(lambda log_mel, iters, power: griffin_lim_graph(log_mel, **audio, iters=iters, power=power),
                       autograph=False,  # its loops are tf.while_loop already: ~0.8 CPU s less a first call here
                       input_signature=[tf.TensorSpec([None, audio["n_mels"]], tf.float32),
                                        tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32)])


def griffin_lim(log_mel, *, sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax, iters=32,
                power=1.5):
    """log_mel (F, n_mels) natural-log magnitude mel -> float32 audio (F*hop_length,), the length of a
    clip with F mel frames. power > 1 sharpens harmonics before phase recovery (Tacotron; the total
    energy is kept); 1.0 keeps the magnitudes. Run wavfile.save_wav or clip before playback: peaks may exceed 1."""
    log_mel = tf.convert_to_tensor(log_mel, tf.float32)
    assert log_mel.shape.rank == 2 and log_mel.shape[1] == n_mels, f"expected (F, {n_mels}), got {log_mel.shape}"
    audio = dict(sample_rate=sample_rate, n_fft=n_fft, hop_length=hop_length, win_length=win_length,
                 n_mels=n_mels, fmin=fmin, fmax=fmax)
    return _griffin_lim(tuple(sorted(audio.items())))(log_mel, tf.constant(iters, tf.int32), tf.constant(float(power)))
