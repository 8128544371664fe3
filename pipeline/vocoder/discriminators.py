"""The vocoder's adversaries and its losses: multi-period (HiFi-GAN) and multi-resolution (UnivNet,
Vocos) discriminators, least-squares GAN losses, feature matching, and the spectral losses (the
project's mel, L1, plus multi-resolution STFT), small pure functions as in HiFi-GAN's models.py.

    disc = Discriminators(); outs = disc(audio)         # [(logits, [features...]) per sub-discriminator]
    total, terms = spectral_loss(real, fake, audio_cfg, mel_weight=45, stft_weight=1)
"""
import keras
import tensorflow as tf

from pipeline import dft

PERIODS = (2, 3, 5, 7, 11)                                   # HiFi-GAN's multi-period discriminator
RESOLUTIONS = ((512, 128, 512), (1024, 256, 1024), (2048, 512, 2048))  # (n_fft, hop, win)
LRELU = 0.1


class PeriodDiscriminator(keras.layers.Layer):
    """Audio folded into [B, T/p, p] columns, 2-D convs along time (kernel (5, 1))."""

    def __init__(self, period, channels=(16, 32, 64), **kwargs):
        super().__init__(**kwargs)
        self.period = period
        self.n_convs = len(channels)
        for i, c in enumerate(channels):
            setattr(self, f"conv{i}", keras.layers.Conv2D(c, (5, 1), strides=(3, 1), padding="same"))
        self.post = keras.layers.Conv2D(1, (3, 1), padding="same", dtype="float32")

    def call(self, audio):                                    # (B, T)
        n = tf.shape(audio)[1]
        pad = (self.period - n % self.period) % self.period
        x = tf.pad(audio, [[0, 0], [0, pad]], mode="REFLECT")
        x = tf.reshape(x, [tf.shape(x)[0], -1, self.period, 1])  # (B, T/p, p, 1)
        feats = []
        for i in range(self.n_convs):
            x = tf.nn.leaky_relu(getattr(self, f"conv{i}")(x), LRELU)
            feats.append(x)
        return tf.reshape(self.post(x), [tf.shape(x)[0], -1]), feats


class ResolutionDiscriminator(keras.layers.Layer):
    """2-D convs over one resolution's log-magnitude spectrogram [B, frames, bins]."""

    def __init__(self, resolution, channels=(16, 16, 16), **kwargs):
        super().__init__(**kwargs)
        self.n_fft, self.hop, self.win = resolution
        self.n_convs = len(channels)
        for i, c in enumerate(channels):
            setattr(self, f"conv{i}", keras.layers.Conv2D(c, (3, 9), strides=(1, 2), padding="same"))
        self.post = keras.layers.Conv2D(1, (3, 3), padding="same", dtype="float32")

    def call(self, audio):
        spec = tf.abs(tf.signal.stft(tf.cast(audio, tf.float32), self.win, self.hop, self.n_fft))
        x = tf.math.log(spec + 1e-5)[..., None]               # (B, frames, bins, 1)
        feats = []
        for i in range(self.n_convs):
            x = tf.nn.leaky_relu(getattr(self, f"conv{i}")(x), LRELU)
            feats.append(x)
        return tf.reshape(self.post(x), [tf.shape(x)[0], -1]), feats


class Discriminators(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        subs = [PeriodDiscriminator(p) for p in PERIODS] + [ResolutionDiscriminator(r) for r in RESOLUTIONS]
        self.n_subs = len(subs)
        for i, d in enumerate(subs):  # attributes, not a list: checkpoints find them by name (see vocos.py)
            setattr(self, f"sub{i}", d)

    def call(self, audio):
        return [getattr(self, f"sub{i}")(audio) for i in range(self.n_subs)]


def discriminator_loss(real_outs, fake_outs):
    """Least-squares GAN: real -> 1, fake -> 0, summed over sub-discriminators."""
    return tf.add_n([tf.reduce_mean(tf.square(1.0 - tf.cast(r, tf.float32))) + tf.reduce_mean(tf.square(tf.cast(f, tf.float32)))
                     for (r, _), (f, _) in zip(real_outs, fake_outs)])


def generator_loss(fake_outs):
    return tf.add_n([tf.reduce_mean(tf.square(1.0 - tf.cast(f, tf.float32))) for f, _ in fake_outs])


def feature_loss(real_outs, fake_outs):
    """Feature matching: L1 between the discriminators' activations on real and generated audio."""
    return tf.add_n([tf.reduce_mean(tf.abs(tf.cast(a, tf.float32) - tf.cast(b, tf.float32)))
                     for (_, ra), (_, fa) in zip(real_outs, fake_outs) for a, b in zip(ra, fa)])


def mel_l1(real, fake, audio_cfg):
    """L1 between the project's log-mels (pipeline.dft's TensorFlow twin of pipeline.audio's) of both."""
    return tf.reduce_mean(tf.abs(dft.log_mel_spectrogram(real, **audio_cfg) - dft.log_mel_spectrogram(fake, **audio_cfg)))


def stft_loss(real, fake):
    """Multi-resolution STFT loss (Parallel WaveGAN): spectral convergence + log-magnitude L1, averaged."""
    total = 0.0
    for n_fft, hop, win in RESOLUTIONS:
        r = tf.abs(tf.signal.stft(real, win, hop, n_fft)) + 1e-7
        f = tf.abs(tf.signal.stft(fake, win, hop, n_fft)) + 1e-7
        total += tf.norm(r - f) / (tf.norm(r) + 1e-7) + tf.reduce_mean(tf.abs(tf.math.log(r) - tf.math.log(f)))
    return total / len(RESOLUTIONS)


def spectral_loss(real, fake, audio_cfg, *, mel_weight, stft_weight):
    """(total, {mel, stft}) for audio [B, T] float32."""
    fake = tf.cast(fake, tf.float32)
    mel, stft = mel_l1(real, fake, audio_cfg), stft_loss(real, fake)
    return mel_weight * mel + stft_weight * stft, {"mel": mel, "stft": stft}
