"""Vocos (Siuzdak 2023): a ConvNeXt backbone at the mel's frame rate predicts each frame's STFT
magnitude and phase; an inverse STFT on the mel's own grid (pipeline/dft.py: a fixed DFT basis as a
matmul plus overlap-add, so it exports to TFLite with built-in ops) turns them into audio.

    mel [B, F, n_mels] (natural-log, the caches' mel) -> embed conv (kernel 7) -> LayerNorm
    -> `layers` x ConvNeXt block (depthwise conv, LayerNorm, dim -> intermediate_dim -> dim, GELU,
       layer scale, residual) -> LayerNorm -> Dense(2 K) -> magnitude exp(min(x, log 100)),
       phase (cos, sin) of the second half -> istft(n_fft, hop, win) -> audio [B, F * hop]

Config: vocoder.vocos {dim, intermediate_dim, layers, kernel}; audio.{n_fft, hop_length, win_length, n_mels}.
"""
import keras
import numpy as np
import tensorflow as tf

from pipeline import dft

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
        self.blocks = [ConvNeXtBlock(v["dim"], v["intermediate_dim"], v["kernel"], 1.0 / v["layers"])
                       for _ in range(v["layers"])]
        self.norm_out = keras.layers.LayerNormalization(epsilon=1e-6)
        self.head = keras.layers.Dense(2 * self.n_bins, dtype="float32")  # magnitude and phase in float32

    def call(self, mel, training=False):
        x = self.norm_in(self.embed(mel))
        for block in self.blocks:
            x = block(x)
        x = self.head(tf.cast(self.norm_out(x), tf.float32))            # (B, F, 2K)
        log_mag, p = x[..., :self.n_bins], x[..., self.n_bins:]
        mag = tf.exp(tf.minimum(log_mag, MAX_LOG_MAGNITUDE))
        real, imag = mag * tf.cos(p), mag * tf.sin(p)                     # (B, F, K) each
        a = self.audio_cfg
        return dft.istft(real, imag, n_fft=a["n_fft"], hop_length=a["hop_length"], win_length=a["win_length"])


def build(vocoder_cfg, audio_cfg):
    return Vocos(vocoder_cfg["vocos"], audio_cfg, name="vocos")
