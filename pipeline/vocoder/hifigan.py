"""HiFi-GAN generator (Kong et al. 2020), V1 and V2 sizes: the log-mel is upsampled to the sample
rate by transposed convolutions, each followed by a multi-receptive-field fusion of residual blocks.

    mel [B, F, n_mels] -> Conv1D(7) -> 4 x (LeakyReLU, ConvTranspose(rate u, kernel 2u),
    MRF: mean of resblocks with kernels 3, 7, 11 and dilations 1, 3, 5) -> LeakyReLU -> Conv1D(7)
    -> tanh -> audio [B, F * hop]

The upsampling rates multiply to audio.hop_length (8, 8, 2, 2 for the HiFi-GAN/LJSpeech hop of 256;
other hops: a one-line error naming audio.hop_length). V1: 512 initial channels (quality, GPUs);
V2: 128 (small). Heavy at 22 kHz on a CPU: the demo uses Vocos. Config: vocoder.hifigan.size.
"""
import keras
import tensorflow as tf

from pipeline.config import ConfigError

SIZES = {"v1": 512, "v2": 128}
RATES = {256: (8, 8, 2, 2), 128: (8, 4, 2, 2), 200: (5, 5, 4, 2), 300: (5, 5, 4, 3)}
KERNELS = (3, 7, 11)
DILATIONS = (1, 3, 5)
LRELU = 0.1


class ResBlock(keras.layers.Layer):
    def __init__(self, channels, kernel, **kwargs):
        super().__init__(**kwargs)
        for i, d in enumerate(DILATIONS):
            setattr(self, f"c1_{i}", keras.layers.Conv1D(channels, kernel, dilation_rate=d, padding="same"))
            setattr(self, f"c2_{i}", keras.layers.Conv1D(channels, kernel, padding="same"))

    def call(self, x):
        for i in range(len(DILATIONS)):
            y = getattr(self, f"c1_{i}")(tf.nn.leaky_relu(x, LRELU))
            x = x + getattr(self, f"c2_{i}")(tf.nn.leaky_relu(y, LRELU))
        return x


class HiFiGAN(keras.Model):
    """mel [B, F, n_mels] float32 -> audio float32 [B, F * hop_length]."""

    def __init__(self, size, hop_length, **kwargs):
        super().__init__(**kwargs)
        if hop_length not in RATES:
            raise ConfigError(f"audio.hop_length: {hop_length} has no HiFi-GAN upsampling plan "
                              f"(vocoder.kind hifigan supports {sorted(RATES)}); use vocoder.kind vocos")
        ch, self.rates = SIZES[size], RATES[hop_length]
        self.pre = keras.layers.Conv1D(ch, 7, padding="same")
        for i, u in enumerate(self.rates):
            c = ch // 2 ** (i + 1)
            setattr(self, f"up{i}", keras.layers.Conv1DTranspose(c, 2 * u, strides=u, padding="same"))
            for j, k in enumerate(KERNELS):
                setattr(self, f"res{i}_{j}", ResBlock(c, k))
        self.post = keras.layers.Conv1D(1, 7, padding="same", dtype="float32")

    def call(self, mel, training=False):
        x = self.pre(mel)
        for i in range(len(self.rates)):
            x = getattr(self, f"up{i}")(tf.nn.leaky_relu(x, LRELU))
            x = tf.add_n([getattr(self, f"res{i}_{j}")(x) for j in range(len(KERNELS))]) / len(KERNELS)
        return tf.tanh(self.post(tf.nn.leaky_relu(x, LRELU)))[..., 0]              # (B, F * hop)


def build(vocoder_cfg, audio_cfg):
    return HiFiGAN(vocoder_cfg["hifigan"]["size"], audio_cfg["hop_length"], name="hifigan")
