"""FastPitch text-to-mel model: parallel, non-autoregressive, all in this file.

References: Łańcucki 2021, "FastPitch: Parallel Text-to-speech with Pitch Prediction" (arXiv:2006.06873);
Ren et al. 2021, "FastSpeech 2" (arXiv:2006.04558: energy predictor, token-averaged variances).

Tokens -> encoder (FFT blocks: self-attention + convolutional FFN) -> duration, pitch and energy
predictors; the true (training) or predicted (inference) token pitch and energy are embedded and
added; the length regulator repeats each token's vector for its duration in frames; decoder (FFT
blocks) -> mel. Durations come from the aligner stage (integer frames per token, summing to the
clip's frames); pitch and energy are per-frame caches, averaged over each token's frames here
(pitch over voiced frames only). Batches arrive normalised (mel, pitch with unvoiced = 0, energy):
see docs/models.md.

Config keys used: `model.fastpitch` (configs/config.yaml). The length regulator is a gather by
frame index inside the graph: static shapes in training (the bucket's frame count), one compiled
call per sentence at inference. New axes come from tf.expand_dims, not x[:, :, None]: TFLite's
strided slice has no new-axis form for dynamic shapes, and the exported graph (pipeline/export.py)
converts with built-in ops only.
"""
import keras
import numpy as np
import tensorflow as tf

from pipeline.models.transformer_tts import Attention, ScaledPositions, build_token_tables, voice_ids

ARCH_KEYS = ("d_model", "heads", "encoder_layers", "decoder_layers", "ffn_dim", "ffn_kernel", "dropout",
             "predictor_channels", "predictor_kernel", "predictor_dropout")
LOSS_KEYS = ("duration_weight", "pitch_weight", "energy_weight")
SEMITONE = 2.0 ** (1.0 / 12.0)


# --- length regulator --------------------------------------------------------------------------
def frame_tokens(durations, n_frames):
    """durations (B, T) int32 >= 0 -> (token index of each frame (B, F) int32, frame is real (B, F) bool).
    Frame f belongs to the token whose span [start, end) holds it; frames past sum(durations) are not real."""
    ends = tf.cumsum(durations, axis=1)                                          # (B, T)
    frames = tf.range(n_frames, dtype=durations.dtype)                           # (F,)
    idx = tf.reduce_sum(tf.cast(tf.expand_dims(ends, 1) <= frames[None, :, None], tf.int32), axis=-1)  # (B, F)
    real = frames[None, :] < ends[:, -1:]                                        # (B, F)
    return tf.minimum(idx, tf.shape(durations)[1] - 1), real


def regulate_length(x, durations, n_frames):
    """Repeat x[b, t] durations[b, t] times: x (B, T, D) -> (B, n_frames, D), zero past sum(durations).
    Exact (a gather, no interpolation); n_frames is the static bucket size in training."""
    idx, real = frame_tokens(durations, n_frames)
    y = tf.gather(x, idx, batch_dims=1)                                          # (B, F, D)
    return y * tf.expand_dims(tf.cast(real, y.dtype), -1)


def token_average(values, durations, only_nonzero):
    """Mean of per-frame values (B, F) over each token's frames -> (B, T) float32 (0 for empty tokens).
    only_nonzero: average the non-zero frames only (pitch: unvoiced frames are 0)."""
    values = tf.cast(values, tf.float32)
    idx, real = frame_tokens(durations, tf.shape(values)[1])
    onehot = tf.one_hot(idx, tf.shape(durations)[1]) * tf.expand_dims(tf.cast(real, tf.float32), -1)    # (B, F, T)
    counted = tf.cast(tf.not_equal(values, 0.0), tf.float32) if only_nonzero else tf.ones_like(values)
    sums = tf.einsum("bft,bf->bt", onehot, values)
    counts = tf.einsum("bft,bf->bt", onehot, counted)
    return sums / tf.maximum(counts, 1.0)


# --- layers ------------------------------------------------------------------------------------
class FFTBlock(keras.layers.Layer):
    """Pre-LN self-attention + conv FFN (kernel `kernel`), pads zeroed. call(x (B, T, D), mask (B, T)) -> (B, T, D)."""

    def __init__(self, d_model, heads, ffn_dim, kernel, dropout, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.ffn_dim = d_model, ffn_dim
        self.norm_attn = keras.layers.LayerNormalization(epsilon=1e-5)
        self.attn = Attention(d_model, heads, name="attn")
        self.norm_ffn = keras.layers.LayerNormalization(epsilon=1e-5)
        self.conv_in = keras.layers.Conv1D(ffn_dim, kernel, padding="same", activation="relu", name="conv_in")
        self.conv_out = keras.layers.Conv1D(d_model, 1, name="conv_out")
        self.drop = keras.layers.Dropout(dropout)

    def build(self, input_shape=None):
        for layer in (self.norm_attn, self.attn, self.norm_ffn, self.conv_in):
            layer.build((None, None, self.d_model))
        self.conv_out.build((None, None, self.ffn_dim))

    def call(self, x, mask, training=False):
        keep = tf.expand_dims(tf.cast(mask, x.dtype), -1)                        # (B, T, 1)
        h = self.norm_attn(x)
        h, _ = self.attn(h, h, tf.expand_dims(tf.expand_dims(mask, 1), 1))       # keys: real positions only
        x = x + self.drop(h, training=training)
        h = self.conv_out(self.conv_in(self.norm_ffn(x) * keep) * keep)          # (B, T, D)
        return (x + self.drop(h, training=training)) * keep


class Predictor(keras.layers.Layer):
    """Two conv + ReLU + LayerNorm + dropout layers, then one value per token. (B, T, D) -> (B, T) float32."""

    def __init__(self, d_model, channels, kernel, dropout, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.channels = d_model, channels
        self.convs = tuple(keras.layers.Conv1D(channels, kernel, padding="same", activation="relu", name=f"conv{i}")
                           for i in range(2))
        self.norms = tuple(keras.layers.LayerNormalization(epsilon=1e-5) for _ in range(2))
        self.out = keras.layers.Dense(1, name="out")
        self.drop = keras.layers.Dropout(dropout)

    def build(self, input_shape=None):
        self.convs[0].build((None, None, self.d_model))
        self.convs[1].build((None, None, self.channels))
        for norm in self.norms:
            norm.build((None, None, self.channels))
        self.out.build((None, None, self.channels))

    def call(self, x, mask, training=False):
        keep = tf.expand_dims(tf.cast(mask, x.dtype), -1)
        for conv, norm in zip(self.convs, self.norms):
            x = self.drop(norm(conv(x * keep)), training=training)
        return tf.cast(self.out(x)[..., 0], tf.float32) * tf.cast(mask, tf.float32)


# --- the model ---------------------------------------------------------------------------------
class FastPitch(keras.Model):
    """call(batch) -> mel (B, F, n_mels), log_duration / pitch / energy predictions and their token
    targets (B, T). All float32. infer(...) -> mel, lengths, durations, pitch, energy."""

    needs = ("tokens", "token_lengths", "mel", "mel_lengths", "pitch", "energy", "durations")
    frame_multiple = 1

    def __init__(self, *, n_symbols, n_mels, d_model, heads, encoder_layers, decoder_layers, ffn_dim, ffn_kernel,
                 dropout, predictor_channels, predictor_kernel, predictor_dropout, loss_args=None,
                 max_positions=4096, n_speakers=1, n_languages=1):
        super().__init__(name="fastpitch")
        self.args = dict(n_symbols=n_symbols, n_mels=n_mels, d_model=d_model, heads=heads,
                         encoder_layers=encoder_layers, decoder_layers=decoder_layers, ffn_dim=ffn_dim,
                         ffn_kernel=ffn_kernel, dropout=dropout, predictor_channels=predictor_channels,
                         predictor_kernel=predictor_kernel, predictor_dropout=predictor_dropout,
                         max_positions=max_positions, n_speakers=n_speakers, n_languages=n_languages)
        self.loss_args = {k: float(v) for k, v in (loss_args or {}).items()}
        self.n_mels, self.d_model = n_mels, d_model
        L = keras.layers
        block = lambda name: FFTBlock(d_model, heads, ffn_dim, ffn_kernel, dropout, name=name)  # noqa: E731
        predictor = lambda name: Predictor(d_model, predictor_channels, predictor_kernel,  # noqa: E731
                                           predictor_dropout, name=name)
        self.embedding = L.Embedding(n_symbols, d_model, name="embedding")
        # several speakers / languages: a learned vector each, added to the encoder's output (speaker:
        # what the duration, pitch and energy predictors and the decoder see) and input (language:
        # how the same symbols are said); one speaker and one language make no table and no op
        self.speaker_embedding = L.Embedding(n_speakers, d_model, name="speaker_embedding") if n_speakers > 1 else None
        self.language_embedding = L.Embedding(n_languages, d_model, name="language_embedding") if n_languages > 1 else None
        self.n_speakers = n_speakers
        self.enc_pos = ScaledPositions(d_model, max_positions, name="enc_pos")
        self.encoder = tuple(block(f"enc{i}") for i in range(encoder_layers))  # tuples: tf.train.Checkpoint sees them
        self.enc_norm = L.LayerNormalization(epsilon=1e-5)
        self.duration_predictor = predictor("duration_predictor")
        self.pitch_predictor = predictor("pitch_predictor")
        self.energy_predictor = predictor("energy_predictor")
        self.pitch_embed = L.Conv1D(d_model, 3, padding="same", name="pitch_embed")
        self.energy_embed = L.Conv1D(d_model, 3, padding="same", name="energy_embed")
        self.dec_pos = ScaledPositions(d_model, max_positions, name="dec_pos")
        self.decoder = tuple(block(f"dec{i}") for i in range(decoder_layers))
        self.dec_norm = L.LayerNormalization(epsilon=1e-5)
        self.mel_out = L.Dense(n_mels, name="mel_out")
        self.build()

    def build(self, input_shape=None):
        D = self.d_model
        build_token_tables(self)
        for layer in (self.enc_pos, *self.encoder, self.enc_norm, self.duration_predictor, self.pitch_predictor,
                      self.energy_predictor, self.dec_pos, *self.decoder, self.dec_norm, self.mel_out):
            layer.build((None, None, D))
        self.pitch_embed.build((None, None, 1))
        self.energy_embed.build((None, None, 1))
        # Hz statistics of the training pitch (set by adapt, saved in checkpoints): pitch_shift needs them
        # (one row per speaker: pitch is normalised per speaker when there are several)
        shape = (self.n_speakers, 2) if self.n_speakers > 1 else (2,)  # one speaker: as checkpoints always had it
        self.pitch_stats = self.add_weight(name="pitch_stats", shape=shape, trainable=False,
                                           initializer=keras.initializers.Constant([0.0, 1.0]))  # broadcast per row
        self.built = True

    def adapt(self, stats):
        """Store the cache's pitch mean/std (Hz; per speaker with several) so infer can shift pitch in semitones."""
        if self.n_speakers > 1:
            self.pitch_stats.assign(np.stack([stats["speaker_pitch_mean"], stats["speaker_pitch_std"]], 1))
        else:
            self.pitch_stats.assign([float(stats["pitch_mean"]), float(stats["pitch_std"])])

    def encode(self, tokens, token_lengths, training=False, speaker=None, language=None):
        mask = tf.sequence_mask(token_lengths, tf.shape(tokens)[1])             # (B, T)
        x = self.embedding(tokens)                                              # (B, T, D)
        if self.language_embedding is not None:
            x += self.language_embedding(voice_ids(language, tokens))[:, None, :]
        x = self.enc_pos(x)
        for blk in self.encoder:
            x = blk(x, mask, training=training)
        h = self.enc_norm(x)
        if self.speaker_embedding is not None:
            h += self.speaker_embedding(voice_ids(speaker, tokens))[:, None, :]
        return h * tf.expand_dims(tf.cast(mask, x.dtype), -1), mask

    def _variances(self, h, mask, pitch, energy):
        """Add the embedded token pitch and energy (B, T) to h (B, T, D)."""
        keep = tf.expand_dims(tf.cast(mask, h.dtype), -1)
        p = tf.expand_dims(tf.cast(pitch, h.dtype), -1) * keep
        e = tf.expand_dims(tf.cast(energy, h.dtype), -1) * keep
        return h + (self.pitch_embed(p) + self.energy_embed(e)) * keep

    def decode(self, frames, mel_lengths, training=False):
        mask = tf.sequence_mask(mel_lengths, tf.shape(frames)[1])               # (B, F)
        x = self.dec_pos(frames)
        for blk in self.decoder:
            x = blk(x, mask, training=training)
        mel = self.mel_out(self.dec_norm(x))                                    # (B, F, n_mels)
        return tf.cast(mel, tf.float32) * tf.expand_dims(tf.cast(mask, tf.float32), -1)

    def call(self, batch, training=False):
        h, mask = self.encode(batch["tokens"], batch["token_lengths"], training=training,
                              speaker=batch.get("speaker"), language=batch.get("language"))
        durations = tf.cast(batch["durations"], tf.int32)                       # (B, T) frames per token
        pitch_target = token_average(batch["pitch"], durations, only_nonzero=True)   # (B, T)
        energy_target = token_average(batch["energy"], durations, only_nonzero=False)
        out = {"log_duration": self.duration_predictor(h, mask, training=training),
               "pitch": self.pitch_predictor(h, mask, training=training),
               "energy": self.energy_predictor(h, mask, training=training),
               "pitch_target": pitch_target, "energy_target": energy_target}
        h = self._variances(h, mask, pitch_target, energy_target)              # teacher forcing: true values
        frames = regulate_length(h, durations, tf.shape(batch["mel"])[1])      # (B, F, D)
        out["mel"] = self.decode(frames, batch["mel_lengths"], training=training)
        return out

    def tts_loss(self, outputs, batch):
        """Masked mel L1 + weighted MSE of log(1 + duration), token pitch and token energy. -> (total, terms)."""
        mel = tf.cast(batch["mel"], tf.float32)                                 # (B, F, M)
        frame_mask = tf.cast(tf.sequence_mask(batch["mel_lengths"], tf.shape(mel)[1]), tf.float32)[:, :, None]
        mel_l1 = tf.reduce_sum(tf.abs(outputs["mel"] - mel) * frame_mask) / (
            tf.reduce_sum(frame_mask) * tf.cast(tf.shape(mel)[2], tf.float32))
        token_mask = tf.cast(tf.sequence_mask(batch["token_lengths"], tf.shape(batch["tokens"])[1]), tf.float32)
        n_tokens = tf.reduce_sum(token_mask)

        def mse(pred, target):
            return tf.reduce_sum(tf.square(pred - target) * token_mask) / n_tokens

        log_dur = tf.math.log1p(tf.cast(batch["durations"], tf.float32))       # (B, T)
        terms = {"mel": mel_l1, "duration": mse(outputs["log_duration"], log_dur),
                 "pitch": mse(outputs["pitch"], outputs["pitch_target"]),
                 "energy": mse(outputs["energy"], outputs["energy_target"])}
        a = self.loss_args
        total = (mel_l1 + a["duration_weight"] * terms["duration"] + a["pitch_weight"] * terms["pitch"]
                 + a["energy_weight"] * terms["energy"])
        return total, {**terms, "total": total}

    def infer(self, tokens, token_lengths, *, pace=1.0, pitch_shift=0.0, max_frames, speaker=None, language=None):
        """One compiled call: predicted durations / pace (> 1 faster; the running total is rounded, so
        lengths scale by 1/pace within a frame), pitch shifted by `pitch_shift`
        semitones, at most max_frames frames; speaker / language: int32 (B,) ids (default 0). -> mel (B, F, n_mels) normalised, zero past lengths;
        lengths (B,) int32; durations (B, T) int32; pitch, energy (B, T) normalised."""
        if not tf.is_tensor(pace) and pace <= 0:  # a tensor (an exported graph) is checked by its caller
            raise ValueError(f"pace must be > 0, got {pace}")
        tokens = tf.convert_to_tensor(tokens, tf.int32)
        # eagerly: one compiled graph for every batch and length; inside a caller's trace (export),
        # the ops themselves, shaped by that caller's signature
        infer = self._infer_ops if tf.inside_function() else self._infer
        return infer(tokens, tf.convert_to_tensor(token_lengths, tf.int32), tf.cast(pace, tf.float32),
                     tf.cast(pitch_shift, tf.float32), tf.cast(max_frames, tf.int32), voice_ids(speaker, tokens),
                     voice_ids(language, tokens))

    def _infer_ops(self, tokens, token_lengths, pace, pitch_shift, max_frames, speaker, language):
        h, mask = self.encode(tokens, token_lengths, speaker=speaker, language=language)
        frames_f = tf.maximum(tf.exp(self.duration_predictor(h, mask)) - 1.0, 0.0) / pace       # (B, T)
        frames_f *= tf.cast(mask, tf.float32)
        # round the running total, not each token: the length stays within half a frame of sum / pace;
        # at most max_frames (a diverged predictor's exp() would pass int32's range: lengths < 0, no audio)
        ends = tf.minimum(tf.cumsum(frames_f, axis=1), tf.cast(max_frames, tf.float32))
        ends = tf.cast(tf.round(ends), tf.int32)                                                 # (B, T)
        durations = ends - tf.pad(ends[:, :-1], [[0, 0], [1, 0]])
        return self._at_durations(h, mask, durations, pitch_shift, max_frames, speaker)

    def infer_at(self, tokens, token_lengths, durations, *, pitch=None, speaker=None, language=None):
        """Eagerly, at given durations (B, T) frames per token (a recording's, from the duration cache)
        instead of predicted ones: the mel the predicted pitch and energy make there, or with `pitch`
        (B, T) normalised token pitch (a recording's) in place of the predicted. What the duration and
        pitch predictions cost (benchmarks/tts_gap.py). -> the dict `infer` returns."""
        tokens = tf.convert_to_tensor(tokens, tf.int32)
        durations = tf.convert_to_tensor(durations, tf.int32)
        speaker = voice_ids(speaker, tokens)
        h, mask = self.encode(tokens, tf.convert_to_tensor(token_lengths, tf.int32), speaker=speaker,
                              language=voice_ids(language, tokens))
        return self._at_durations(h, mask, durations, tf.constant(0.0), tf.reduce_max(tf.reduce_sum(durations, 1)),
                                  speaker, pitch)

    def _at_durations(self, h, mask, durations, pitch_shift, max_frames, speaker, pitch=None):
        """The encoder's h (B, T, D) decoded at durations (B, T) -> infer's dict; pitch: teacher-forced
        normalised token pitch (B, T), None: the predictor's, shifted by pitch_shift semitones."""
        if self.n_speakers > 1:
            stats = tf.gather(self.pitch_stats, speaker)                         # (B, 2)
            mean, std = stats[:, :1], stats[:, 1:]                               # (B, 1) each
        else:
            mean, std = self.pitch_stats[0], self.pitch_stats[1]
        if pitch is None:
            pitch = self.pitch_predictor(h, mask)                                # normalised
            pitch = (((pitch * std + mean) * SEMITONE ** pitch_shift) - mean) / std  # shifted in Hz
        pitch = tf.cast(pitch, tf.float32)
        energy = self.energy_predictor(h, mask)
        h = self._variances(h, mask, pitch, energy)
        lengths = tf.minimum(tf.reduce_sum(durations, axis=1), max_frames)     # (B,)
        n_frames = tf.maximum(tf.reduce_max(lengths), 1)
        mel = self.decode(regulate_length(h, durations, n_frames), lengths)
        return {"mel": mel, "lengths": lengths, "durations": durations, "pitch": pitch * tf.cast(mask, tf.float32),
                "energy": energy}

    # Not converted by AutoGraph: _infer_ops and what it calls branch only on Python values (as the
    # model's call does in training, where Keras calls it unconverted); ~0.4 CPU s less a first call.
    _infer = tf.function(_infer_ops, autograph=False, input_signature=[
        tf.TensorSpec([None, None], tf.int32, name="tokens"), tf.TensorSpec([None], tf.int32, name="token_lengths"),
        tf.TensorSpec([], tf.float32, name="pace"), tf.TensorSpec([], tf.float32, name="pitch_shift"),
        tf.TensorSpec([], tf.int32, name="max_frames"), tf.TensorSpec([None], tf.int32, name="speaker"),
        tf.TensorSpec([None], tf.int32, name="language")])

    def get_config(self):
        return dict(self.args)


def build(model_cfg, vocab, n_mels, *, speakers=(), languages=()):
    """The model for a validated config's `model:` section (its `fastpitch` keys); `speakers` and
    `languages`: the cache's tables (an embedding each when it lists more than one)."""
    cfg = model_cfg["fastpitch"]
    if cfg["d_model"] % cfg["heads"]:
        raise ValueError(f"model.fastpitch.d_model {cfg['d_model']} is not divisible by heads {cfg['heads']}")
    return FastPitch(n_symbols=len(vocab), n_mels=n_mels, loss_args={k: cfg[k] for k in LOSS_KEYS},
                     n_speakers=max(len(speakers), 1), n_languages=max(len(languages), 1),
                     **{k: cfg[k] for k in ARCH_KEYS})
