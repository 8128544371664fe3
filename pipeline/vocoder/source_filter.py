"""A source-filter vocoder: F0 makes the excitation, a small network at the mel's frame rate makes the filter.

    f0 [B, F] Hz (0: unvoiced) -> F0 per sample (linear between frame centres t*hop + hop/2)
        -> phase: within a frame, a fixed (4, hop) matrix of the frame's F0 ramps (a ramp's running sum
           in closed form, no per-sample cumulative sum); across frames, the frames' advances wrapped to
           [0, 2 pi), cumulated in two levels and wrapped again (float32 keeps ~1e-4 rad over minutes)
        -> harmonic source: every harmonic k*F0 below min(sample_rate / 2, audio.fmax) - F0 at
           amplitude 1, the next one fading to 0 at that limit, all in phase (a band-limited pulse
           train: the Dirichlet kernel's closed form), faded out over a hop where frames turn unvoiced
        -> its STFT on the mel's grid (pipeline.dft.transforms: the real FFT at n_fft 2^k) S_h
    mel [B, F, n_mels], log F0, voicing -> embed conv -> `layers` ConvNeXt blocks (vocos.py's)
        -> per frame and STFT bin: a harmonic gain and a noise gain, each a correction of the mel's
           pseudo-inverse (the spectral envelope), zero above audio.fmax
    audio = istft(gain_h * S_h + gain_n * N)        N: unit-magnitude noise of fixed random phase

The filter is zero-phase, so the harmonics keep the source's phase: each harmonic's phase is the
running integral of k*F0, coherent across frames by construction (what a frame-rate network like
Vocos has to learn and, at CPU step counts, does not). The noise's phases are a fixed table (frame
index mod NOISE_FRAMES), so the same mel and F0 give the same audio in-process and in the export.

A small F0 + voicing head (three convs over the mel) learns the pitch cache's F0 in the same training
job (`auxiliary_loss`); the vocoder uses it only when no F0 is given (`python -m pipeline.vocode`
without --f0), and `voiced_f0` uses its voicing to gate another model's F0 (a TTS model's pitch,
which says nothing of voicing within a token).

Built-in TFLite ops only: convs, dense, matmuls, cumsum, floormod, sin/cos, gathers and pipeline.dft's transforms
(RFFT2D, or matmuls where n_fft is not a power of two).
Config: vocoder.source_filter {dim, intermediate_dim, layers, kernel, f0_head_dim, f0_weight};
audio.{sample_rate, n_fft, hop_length, win_length, n_mels, fmin, fmax}.
"""
import keras
import numpy as np
import tensorflow as tf

from pipeline import dft
from pipeline.audio import LOG_CLAMP, mel_basis
from pipeline.vocoder.vocos import MAX_LOG_MAGNITUDE, ConvNeXtBlock

TWO_PI = 2.0 * np.pi
NOISE_FRAMES = 128     # rows of the fixed noise-phase table; frame t uses row t mod NOISE_FRAMES
F0_REFERENCE = 150.0   # Hz: the F0 head predicts log(F0 / F0_REFERENCE); the network sees it too
F0_RANGE = (40.0, 1000.0)  # the head's F0 is kept within this (Hz)
PHASE_BLOCK = 64       # frames summed together before the phase is cumulated across blocks (frame_offsets)


def _ramps(hop_length):
    """The per-sample shapes of a frame's F0, as numpy constants: (basis (4, hop), its exclusive cumulative
    sum along hop (4, hop), its sums (4,)). Within frame t the F0 is linear between frame centres, so it
    is ends . basis, with ends = (left, right) of the half before the centre and of the half after it."""
    j = np.arange(hop_length, dtype=np.float64)
    second = j >= hop_length / 2.0                                                  # the half after the centre
    w = np.where(second, (j - hop_length / 2.0) / hop_length, 1.0 + (j - hop_length / 2.0) / hop_length)
    basis = np.stack([(1.0 - w) * ~second, w * ~second, (1.0 - w) * second, w * second])
    exclusive = np.concatenate([np.zeros((4, 1)), np.cumsum(basis, 1)[:, :-1]], 1)
    return basis.astype(np.float32), exclusive.astype(np.float32), basis.sum(1).astype(np.float32)


def _frame_ends(f0):
    """f0 (B, F) Hz -> (ends (B, F, 4) Hz, their voicing (B, F, 4) 0/1): the two F0s each half of a frame
    interpolates between: (the previous frame's, this frame's) before the centre, (this frame's, the
    next frame's) after it; the clip's edges hold. An unvoiced end takes its partner's F0 and the
    voicing ramps instead, so a voiced stretch starts and ends without a pitch glide."""
    f0 = tf.cast(f0, tf.float32)
    padded = tf.concat([f0[:, :1], f0, f0[:, -1:]], 1)                              # (B, F + 2)
    before, here, after = padded[:, :-2], padded[:, 1:-1], padded[:, 2:]
    hold = lambda x, y: tf.where(x > 0, x, y)  # noqa: E731
    ends = tf.stack([hold(before, here), hold(here, before), hold(here, after), hold(after, here)], -1)
    voiced = tf.cast(tf.stack([before > 0, here > 0, here > 0, after > 0], -1), tf.float32)
    return ends, voiced


def _wrapped_cumsum(x, axis):
    """Exclusive cumulative sum of values in [0, 2 pi) along `axis`, wrapped to [0, 2 pi)."""
    return tf.math.floormod(tf.cumsum(x, axis=axis, exclusive=True), TWO_PI)


def frame_offsets(totals):
    """totals (B, F) each frame's phase advance, wrapped -> (B, F) the phase at each frame's start.

    Summed in two levels, within blocks of PHASE_BLOCK frames and across the blocks' wrapped totals,
    so no float32 running sum exceeds 2 pi * max(PHASE_BLOCK, F / PHASE_BLOCK): its rounding stays near
    1e-4 rad over minutes of audio (one level: 0.03 rad after 30 s, 1 rad at the 36th harmonic)."""
    n = tf.shape(totals)[1]
    padded = tf.pad(totals, [[0, 0], [0, (PHASE_BLOCK - n % PHASE_BLOCK) % PHASE_BLOCK]])
    blocks = tf.reshape(padded, [tf.shape(totals)[0], -1, PHASE_BLOCK])            # (B, F / block, block)
    starts = _wrapped_cumsum(tf.math.floormod(tf.reduce_sum(blocks, 2), TWO_PI), 1)  # (B, F / block)
    offsets = tf.math.floormod(tf.expand_dims(starts, -1) + _wrapped_cumsum(blocks, 2), TWO_PI)
    return tf.reshape(offsets, [tf.shape(totals)[0], -1])[:, :n]


def phase(f0, *, sample_rate, hop_length):
    """f0 (B, F) Hz -> (frequency, voicing, running phase wrapped to [0, 2 pi)), each (B, F, hop).

    The phase is the exclusive running sum of 2 pi f / sample_rate. Within a frame the frequency is
    two linear ramps, so the sum since the frame's start is a fixed (4, hop) matrix of the frame's ends
    (no per-sample cumulative sum); only the frames' wrapped totals are cumulated (frame_offsets), so
    float32 keeps its precision."""
    ends, voiced = _frame_ends(f0)
    basis, exclusive, sums = _ramps(hop_length)
    rad = ends * (TWO_PI / sample_rate)                                             # (B, F, 4) radians per sample
    within = tf.matmul(rad, tf.constant(exclusive))                                 # phase since the frame's start
    totals = tf.reduce_sum(rad * tf.constant(sums), -1)                            # (B, F) each frame's advance
    offsets = frame_offsets(tf.math.floormod(totals, TWO_PI))
    basis = tf.constant(basis)
    return (tf.matmul(ends, basis), tf.matmul(voiced, basis),
            tf.math.floormod(tf.expand_dims(offsets, -1) + within, TWO_PI))


def harmonic_source(f0, *, sample_rate, hop_length, limit):
    """f0 (B, F) Hz -> (B, F * hop): sum over k >= 1 of w_k cos(k * phase), times the voicing. w_k = 1
    below limit - F0, falling linearly to 0 at `limit` (checked per sample): every harmonic in phase,
    none at or above the limit, and one that crosses it as F0 moves fades instead of clicking."""
    freq, voiced, phi = phase(f0, sample_rate=sample_rate, hop_length=hop_length)
    room = tf.maximum(limit / tf.maximum(freq, 1.0) - 1.0, 0.0) * tf.cast(freq > 0, tf.float32)
    k = tf.floor(room)                                                               # harmonics at full amplitude
    half = tf.sin(0.5 * phi)
    near = tf.abs(half) < 1e-4                                                       # at phase 0 the sum is k
    dirichlet = tf.sin((k + 0.5) * phi) / (2.0 * tf.where(near, tf.ones_like(half), half)) - 0.5
    top = (room - k) * tf.cos((k + 1.0) * phi)                                        # harmonic k+1, fading
    source = (tf.where(near, k, dirichlet) + top) * voiced                           # (B, F, hop)
    return tf.reshape(source, [tf.shape(f0)[0], -1])


class F0Head(keras.layers.Layer):
    """log-mel (B, F, n_mels) -> (log(F0 / F0_REFERENCE), voicing logit), each (B, F)."""

    N_CONVS = 3

    def __init__(self, dim, **kwargs):
        super().__init__(**kwargs)
        for i in range(self.N_CONVS):  # attributes, not a list: a generator-only checkpoint restores them by name
            setattr(self, f"conv{i}", keras.layers.Conv1D(dim, 5, padding="same", activation="gelu"))
        self.out = keras.layers.Dense(2, dtype="float32")

    def call(self, mel):
        x = mel
        for i in range(self.N_CONVS):
            x = getattr(self, f"conv{i}")(x)
        y = self.out(tf.cast(x, tf.float32))
        return y[:, :, 0], y[:, :, 1]


class SourceFilter(keras.Model):
    """call(mel [B, F, n_mels], f0=None [B, F] Hz) -> audio float32 [B, F * hop_length]; f0 None: the F0 head's."""

    uses_f0 = True

    def __init__(self, sf_cfg, audio_cfg, **kwargs):
        # autocast off: under a mixed policy Keras would cast mel and f0 to float16 / bfloat16 before
        # call, and F0 rounded there (bfloat16: 1 Hz steps at 217 Hz) puts harmonic 36 up to 18 Hz off,
        # its phase wrong within a segment. The layers inside still compute in the policy's dtype.
        super().__init__(autocast=False, **kwargs)
        a, self.audio_cfg = audio_cfg, dict(audio_cfg)
        self.n_bins = a["n_fft"] // 2 + 1
        self.f0_weight = float(sf_cfg["f0_weight"])
        self.limit = float(min(a["sample_rate"] / 2.0, a["fmax"]))
        self.embed = keras.layers.Conv1D(sf_cfg["dim"], 7, padding="same")
        self.norm_in = keras.layers.LayerNormalization(epsilon=1e-6)
        self.n_blocks = sf_cfg["layers"]
        for i in range(self.n_blocks):  # attributes, not a list: a generator-only checkpoint finds them by name
            setattr(self, f"block{i}", ConvNeXtBlock(sf_cfg["dim"], sf_cfg["intermediate_dim"], sf_cfg["kernel"],
                                                     1.0 / self.n_blocks))
        self.norm_out = keras.layers.LayerNormalization(epsilon=1e-6)
        self.head = keras.layers.Dense(2 * self.n_bins, dtype="float32", kernel_initializer="zeros")
        self.f0_head = F0Head(sf_cfg["f0_head_dim"], name="f0_head")
        basis = mel_basis(sample_rate=a["sample_rate"], n_fft=a["n_fft"], n_mels=a["n_mels"], fmin=a["fmin"], fmax=a["fmax"])
        self.inverse = tf.constant(np.linalg.pinv(basis).T.astype(np.float32))    # (n_mels, K)
        freqs = np.arange(self.n_bins) * a["sample_rate"] / a["n_fft"]
        self.band = tf.constant((freqs <= a["fmax"]).astype(np.float32))          # (K,) nothing above fmax
        self.peak_scale = float(np.log(_harmonic_scale(a)))
        rng = np.random.default_rng(0)
        angle = rng.uniform(0.0, TWO_PI, (NOISE_FRAMES, self.n_bins))
        self.noise = tf.constant(np.stack([np.cos(angle), np.sin(angle)]).astype(np.float32))  # (2, P, K)

    def estimate_f0(self, mel):
        """The F0 head's (F0 Hz, voicing probability), each (B, F), from the log-mel alone."""
        log_f0, logit = self.f0_head(tf.cast(mel, tf.float32))
        hz = tf.clip_by_value(F0_REFERENCE * tf.exp(log_f0), *F0_RANGE)
        return hz, tf.sigmoid(logit)

    def voiced_f0(self, mel, f0):
        """Another model's F0 (B, F) Hz, kept where the F0 head hears voicing in `mel`, 0 elsewhere."""
        _, p = self.estimate_f0(mel)
        return tf.where(p > 0.5, tf.maximum(tf.cast(f0, tf.float32), 0.0), 0.0)

    def call(self, mel, f0=None, training=False):
        mel = tf.cast(mel, tf.float32)
        if f0 is None:
            hz, p = self.estimate_f0(mel)
            f0 = tf.where(p > 0.5, hz, 0.0)
        f0 = tf.cast(f0, tf.float32)
        voiced = tf.cast(f0 > 0, tf.float32)
        log_f0 = tf.math.log(tf.maximum(f0, 1.0) / F0_REFERENCE) * voiced
        x = self.norm_in(self.embed(tf.concat([mel, tf.expand_dims(log_f0, -1), tf.expand_dims(voiced, -1)], -1)))
        for i in range(self.n_blocks):
            x = getattr(self, f"block{i}")(x)
        gains = self.head(tf.cast(self.norm_out(x), tf.float32))                  # (B, F, 2K)
        envelope = tf.math.log(tf.maximum(tf.matmul(tf.exp(mel), self.inverse), LOG_CLAMP))  # (B, F, K)
        # a harmonic of amplitude A gives an STFT peak A * sum(window) / 2, while the mel's envelope is
        # the band's mean magnitude, about that peak * (the window's spectral width / F0): scale by F0
        harm = envelope + gains[:, :, :self.n_bins] + tf.expand_dims(tf.math.log(tf.maximum(f0, 1.0)) + self.peak_scale, -1)
        noise = envelope + gains[:, :, self.n_bins:]
        harm = tf.exp(tf.minimum(harm, MAX_LOG_MAGNITUDE)) * self.band
        noise = tf.exp(tf.minimum(noise, MAX_LOG_MAGNITUDE)) * self.band
        a = self.audio_cfg
        stft, istft = dft.transforms(n_fft=a["n_fft"], hop_length=a["hop_length"], win_length=a["win_length"])
        source = harmonic_source(f0, sample_rate=a["sample_rate"], hop_length=a["hop_length"], limit=self.limit)
        s_re, s_im = stft(source)                                                      # (B, F, K) each
        rows = tf.math.floormod(tf.range(tf.shape(mel)[1]), NOISE_FRAMES)
        n_re, n_im = tf.gather(self.noise[0], rows), tf.gather(self.noise[1], rows)    # (F, K) each
        return istft(harm * s_re + noise * n_re, harm * s_im + noise * n_im)

    def auxiliary_loss(self, mel, f0):
        """The F0 head against the pitch cache: voicing cross-entropy + L1 of log F0 on voiced frames,
        times vocoder.source_filter.f0_weight -> (loss, {"f0": ..., "voicing": ...})."""
        log_f0, logit = self.f0_head(tf.cast(mel, tf.float32))
        f0 = tf.cast(f0, tf.float32)
        voiced = tf.cast(f0 > 0, tf.float32)
        voicing = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=voiced, logits=logit))
        target = tf.math.log(tf.maximum(f0, 1.0) / F0_REFERENCE)
        pitch = tf.reduce_sum(tf.abs(log_f0 - target) * voiced) / tf.maximum(tf.reduce_sum(voiced), 1.0)
        return self.f0_weight * (voicing + pitch), {"f0": pitch, "voicing": voicing}


def _harmonic_scale(a):
    """A harmonic's amplitude per (envelope x F0): a unit cosine's spectrum summed over the bins, spread
    over the F0 / (sample_rate / n_fft) bins between harmonics, is the envelope's mean level."""
    window = dft.hann_window(n_fft=a["n_fft"], win_length=a["win_length"]).astype(np.float64)
    n = np.arange(a["n_fft"])
    spectrum = np.abs(np.fft.rfft(window * np.cos(TWO_PI * 0.25 * n)))              # a cosine at a bin centre
    return (a["n_fft"] / a["sample_rate"]) / spectrum.sum()


def build(vocoder_cfg, audio_cfg):
    return SourceFilter(vocoder_cfg["source_filter"], audio_cfg, name="source_filter")
