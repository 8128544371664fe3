"""Vocos (Siuzdak 2023): a ConvNeXt backbone at the mel's frame rate predicts each frame's STFT
magnitude and phase; an inverse STFT on the mel's own grid (pipeline.dft.transforms: real FFTs, or a
fixed DFT basis as a matmul where n_fft is not a power of two, plus overlap-add, so it exports to
TFLite with built-in ops) turns them into audio.

    mel [B, F, n_mels] (natural-log, the caches' mel) -> embed conv (kernel 7) -> LayerNorm
    -> `layers` x ConvNeXt block (depthwise conv, LayerNorm, dim -> intermediate_dim -> dim, GELU,
       layer scale, residual) -> LayerNorm -> Dense(2 K) -> log-magnitude correction and phase
    magnitude = exp(min(log(mel pseudo-inverse) + correction, log 100)); (cos, sin) of the phase
    -> istft(n_fft, hop, win) -> audio [B, F * hop]

One departure from Vocos: the magnitude is predicted as a correction to the mel's pseudo-inverse
(a fixed (n_mels, K) matmul of exp(mel)), so the first steps already start from the right spectral
envelope, silence included, and the short training a CPU allows goes into phase and fine detail.

Config: vocoder.vocos {dim, intermediate_dim, layers, kernel}; audio.{n_fft, hop_length, win_length, n_mels}.
"""
import keras
import numpy as np
import tensorflow as tf

from pipeline import dft
from pipeline.audio import LOG_CLAMP, mel_basis

MAX_LOG_MAGNITUDE = float(np.log(100.0))  # Vocos clips the predicted log-magnitude here


class ConvNeXtBlock(keras.layers.Layer):
    def __init__(self, dim, intermediate_dim, kernel, layer_scale, **kwargs):
        super().__init__(**kwargs)
        self.dw = keras.layers.DepthwiseConv1D(kernel, padding="same")
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.up = keras.layers.Dense(intermediate_dim)
        self.down = keras.layers.Dense(dim)
        self.gamma = self.add_weight(shape=(dim,), initializer=keras.initializers.Constant(layer_scale), name="gamma")

    def call(self, x):                                                   # (B, F, dim)
        y = self.down(keras.activations.gelu(self.up(self.norm(self.dw(x)))))
        return x + tf.cast(self.gamma, y.dtype) * y


class Vocos(keras.Model):
    """mel [B, F, n_mels] float32 -> audio float32 [B, F * hop_length]."""

    def __init__(self, vocos_cfg, audio_cfg, **kwargs):
        super().__init__(**kwargs)
        v, self.audio_cfg = vocos_cfg, dict(audio_cfg)
        self.n_bins = audio_cfg["n_fft"] // 2 + 1
        self.embed = keras.layers.Conv1D(v["dim"], 7, padding="same")
        self.norm_in = keras.layers.LayerNormalization(epsilon=1e-6)
        # one attribute each: a checkpoint restoring the generator alone finds layers by attribute
        # name, and does not see into a Python list under Keras 3
        self.n_blocks = v["layers"]
        for i in range(v["layers"]):
            setattr(self, f"block{i}", ConvNeXtBlock(v["dim"], v["intermediate_dim"], v["kernel"], 1.0 / v["layers"]))
        self.norm_out = keras.layers.LayerNormalization(epsilon=1e-6)
        self.head = keras.layers.Dense(2 * self.n_bins, dtype="float32")  # magnitude and phase in float32
        basis = mel_basis(sample_rate=audio_cfg["sample_rate"], n_fft=audio_cfg["n_fft"], n_mels=audio_cfg["n_mels"],
                          fmin=audio_cfg["fmin"], fmax=audio_cfg["fmax"])          # (n_mels, K)
        self.inverse = tf.constant(np.linalg.pinv(basis).T.astype(np.float32))   # (n_mels, K)

    def call(self, mel, training=False):
        x = self.norm_in(self.embed(mel))
        for i in range(self.n_blocks):
            x = getattr(self, f"block{i}")(x)
        x = self.head(tf.cast(self.norm_out(x), tf.float32))            # (B, F, 2K)
        log_mag, p = x[..., :self.n_bins], x[..., self.n_bins:]
        prior = tf.matmul(tf.exp(tf.cast(mel, tf.float32)), self.inverse)   # (B, F, K) the mel's pseudo-inverse
        log_mag = tf.math.log(tf.maximum(prior, LOG_CLAMP)) + log_mag
        mag = tf.exp(tf.minimum(log_mag, MAX_LOG_MAGNITUDE))
        real, imag = mag * tf.cos(p), mag * tf.sin(p)                     # (B, F, K) each
        a = self.audio_cfg
        _, istft = dft.transforms(n_fft=a["n_fft"], hop_length=a["hop_length"], win_length=a["win_length"])
        return istft(real, imag)


def build(vocoder_cfg, audio_cfg):
    return Vocos(vocoder_cfg["vocos"], audio_cfg, name="vocos")
