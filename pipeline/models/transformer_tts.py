"""Transformer TTS text-to-mel model, its loss and autoregressive inference, all in this file.

References: Li et al. 2019, "Neural Speech Synthesis with Transformer Network" (arXiv:1809.08895);
Shen et al. 2018 (Tacotron 2: pre-net dropout at inference, post-net, stop token);
Tachibana et al. 2017 (guided attention loss, arXiv:1710.08969).

Config keys used: `model.transformer_tts` (configs/config.yaml); `build` picks the architecture
keys, `tts_loss` takes guided_attention_sigma, guided_attention_weight and stop_weight, `infer` uses
stop_threshold. The model interface (needs, call, tts_loss, infer) is documented in docs/models.md.

Masks are built from lengths with tf.sequence_mask and passed explicitly (Keras masks do not cross
tf.function boundaries). Shapes are static under XLA; softmax and layer norms run in float32 under
mixed precision; every output is float32.
"""
import math

import keras
import numpy as np
import tensorflow as tf

from pipeline.models import ModelError

ARCH_KEYS = ("d_model", "heads", "encoder_layers", "decoder_layers", "ffn_dim", "encoder_conv_layers",
             "encoder_conv_kernel", "prenet_dim", "prenet_dropout", "dropout", "reduction",
             "postnet_channels", "postnet_layers", "postnet_kernel")
LOSS_KEYS = ("guided_attention_sigma", "guided_attention_weight", "stop_weight")
OTHER_KEYS = ("stop_threshold",)
STOP_POS_WEIGHT = 5.0  # about one positive stop step per utterance against ~100 negatives
NEG_INF = -1e9         # added in float32 only, so it cannot overflow float16
INFER_SEED = (20180416, 1809)  # pre-net dropout seed without training, folded with each clip's tokens (_clip_seeds)


class ScaledPositions(keras.layers.Layer):
    """x + alpha * sinusoid(position), alpha a learned scalar (Li et al. 2019). Output (B, T, d_model)."""

    def __init__(self, d_model, max_positions=4096, **kwargs):
        super().__init__(**kwargs)
        assert d_model % 2 == 0, f"d_model must be even for sin/cos positions, got {d_model}"
        self.d_model, self.max_positions = d_model, max_positions

    def build(self, input_shape=None):
        self.alpha = self.add_weight(name="alpha", shape=(), initializer="ones")

    def call(self, x):
        T = x.shape[1]
        assert T is None or T <= self.max_positions, f"{T} positions > max_positions={self.max_positions}"
        pos = tf.cast(tf.range(tf.shape(x)[1]), tf.float32)[:, None]                          # (T, 1)
        inv_freq = 1.0 / 10000.0 ** (np.arange(0, self.d_model, 2, dtype=np.float32) / self.d_model)
        angle = pos * inv_freq[None, :]                                                       # (T, D/2)
        pe = tf.concat([tf.sin(angle), tf.cos(angle)], axis=-1)                               # (T, D)
        return x + tf.cast(self.alpha * pe, x.dtype)[None]

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "max_positions": self.max_positions}


class Attention(keras.layers.Layer):
    """Multi-head dot-product attention. call(x, source, allowed) -> ((B, Tq, D), weights (B, h, Tq, Tk) float32).
    `allowed` is a bool tensor broadcastable to (B, h, Tq, Tk)."""

    def __init__(self, d_model, heads, **kwargs):
        super().__init__(**kwargs)
        assert d_model % heads == 0, f"d_model {d_model} not divisible by heads {heads}"
        self.d_model, self.heads = d_model, heads
        self.query = keras.layers.Dense(d_model, name="query")
        self.key_value = keras.layers.Dense(2 * d_model, name="key_value")
        self.out = keras.layers.Dense(d_model, name="out")

    def build(self, input_shape=None):
        for layer in (self.query, self.key_value, self.out):
            layer.build((None, None, self.d_model))

    def _heads(self, x):  # (B, T, D) -> (B, h, T, D/h)
        B, T = tf.shape(x)[0], tf.shape(x)[1]
        return tf.transpose(tf.reshape(x, [B, T, self.heads, self.d_model // self.heads]), [0, 2, 1, 3])

    def call(self, x, source, allowed):
        q = self._heads(self.query(x)) * (self.d_model // self.heads) ** -0.5  # scale first: fp16 safe
        k, v = tf.split(self.key_value(source), 2, axis=-1)
        k, v = self._heads(k), self._heads(v)                                  # (B, h, Tk, hs)
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32)        # (B, h, Tq, Tk)
        weights = tf.nn.softmax(tf.where(allowed, scores, NEG_INF), axis=-1)   # padded keys get exactly 0
        y = tf.matmul(tf.cast(weights, v.dtype), v)                            # (B, h, Tq, hs)
        y = tf.transpose(y, [0, 2, 1, 3])                                      # (B, Tq, h, hs)
        y = tf.reshape(y, [tf.shape(x)[0], tf.shape(x)[1], self.d_model])      # (B, Tq, D)
        return self.out(y), weights

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "heads": self.heads}


class Block(keras.layers.Layer):
    """Pre-LN Transformer block: self-attention, optional cross-attention over `memory`, FFN.
    call(...) -> (x (B, T, D), weights of the last attention (B, h, T, Tk) float32)."""

    def __init__(self, d_model, heads, ffn_dim, dropout, cross=False, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.heads, self.ffn_dim, self.dropout, self.cross = d_model, heads, ffn_dim, dropout, cross
        self.norm_self = keras.layers.LayerNormalization(epsilon=1e-5)
        self.self_attn = Attention(d_model, heads, name="self_attn")
        if cross:
            self.norm_cross = keras.layers.LayerNormalization(epsilon=1e-5)
            self.cross_attn = Attention(d_model, heads, name="cross_attn")
        self.norm_ffn = keras.layers.LayerNormalization(epsilon=1e-5)
        self.ffn_in = keras.layers.Dense(ffn_dim, activation="relu")
        self.ffn_out = keras.layers.Dense(d_model)
        self.drop = keras.layers.Dropout(dropout)

    def build(self, input_shape=None):
        d = (None, None, self.d_model)
        for layer in (self.norm_self, self.self_attn, self.norm_ffn, self.ffn_in):
            layer.build(d)
        if self.cross:
            self.norm_cross.build(d)
            self.cross_attn.build(d)
        self.ffn_out.build((None, None, self.ffn_dim))

    def call(self, x, allowed, memory=None, memory_allowed=None, training=False):
        h = self.norm_self(x)
        h, weights = self.self_attn(h, h, allowed)
        x = x + self.drop(h, training=training)
        if self.cross:
            h, weights = self.cross_attn(self.norm_cross(x), memory, memory_allowed)
            x = x + self.drop(h, training=training)
        h = self.ffn_out(self.ffn_in(self.norm_ffn(x)))
        return x + self.drop(h, training=training), weights

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "heads": self.heads,
                "ffn_dim": self.ffn_dim, "dropout": self.dropout, "cross": self.cross}


class TransformerTTS(keras.Model):
    """Tokens -> mel frames. call(batch dict) -> mel_before, mel_after = mel (B, F, n_mels), stop_logits (B, F/r),
    alignment (B, F/r, T): last decoder layer's cross-attention averaged over heads. All float32."""

    needs = ("tokens", "token_lengths", "mel", "mel_lengths")

    def __init__(self, *, n_symbols, n_mels, d_model, heads, encoder_layers, decoder_layers, ffn_dim,
                 encoder_conv_layers, encoder_conv_kernel, prenet_dim, prenet_dropout, dropout, reduction,
                 postnet_channels, postnet_layers, postnet_kernel, max_positions=4096, stop_threshold=0.5,
                 loss_args=None, n_speakers=1, n_languages=1):
        super().__init__(name="transformer_tts")
        self.loss_args = dict(loss_args or {})
        self.stop_threshold = float(stop_threshold)
        assert postnet_layers >= 2, f"postnet_layers must be >= 2, got {postnet_layers}"
        self.args = dict(n_symbols=n_symbols, n_mels=n_mels, d_model=d_model, heads=heads,
                         encoder_layers=encoder_layers, decoder_layers=decoder_layers, ffn_dim=ffn_dim,
                         encoder_conv_layers=encoder_conv_layers, encoder_conv_kernel=encoder_conv_kernel,
                         prenet_dim=prenet_dim, prenet_dropout=prenet_dropout, dropout=dropout,
                         reduction=reduction, postnet_channels=postnet_channels, postnet_layers=postnet_layers,
                         postnet_kernel=postnet_kernel, max_positions=max_positions,
                         stop_threshold=stop_threshold)
        self.n_mels, self.d_model, self.reduction = n_mels, d_model, reduction
        self.frame_multiple = reduction  # padded frame counts are a multiple of it (the model interface)
        self.prenet_dropout, self.max_positions = float(prenet_dropout), max_positions
        L = keras.layers
        # --- encoder
        self.embedding = L.Embedding(n_symbols, d_model, name="embedding")  # id 0 = pad, zeroed by the mask
        # several speakers / languages: a vector each, added to the memory (speaker) and the token
        # embeddings (language); one of each makes no table and no op
        self.speaker_embedding = L.Embedding(n_speakers, d_model, name="speaker_embedding") if n_speakers > 1 else None
        self.language_embedding = L.Embedding(n_languages, d_model, name="language_embedding") if n_languages > 1 else None
        # layer collections are tuples: tf.train.Checkpoint does not see layers in lists under Keras 3
        self.enc_convs = tuple(L.Conv1D(d_model, encoder_conv_kernel, padding="same", name=f"enc_conv{i}")
                               for i in range(encoder_conv_layers))
        # layer norm, not batch norm: per position, so padding never leaks into the statistics
        self.enc_conv_norms = tuple(L.LayerNormalization(epsilon=1e-5) for _ in range(encoder_conv_layers))
        self.enc_proj = L.Dense(d_model, name="enc_proj")
        self.enc_pos = ScaledPositions(d_model, max_positions, name="enc_pos")
        self.encoder = tuple(Block(d_model, heads, ffn_dim, dropout, name=f"enc{i}")
                             for i in range(encoder_layers))
        self.enc_norm = L.LayerNormalization(epsilon=1e-5)
        # --- decoder
        self.prenet = tuple(L.Dense(prenet_dim, activation="relu", name=f"prenet{i}") for i in range(2))
        self.dec_proj = L.Dense(d_model, name="dec_proj")
        self.dec_pos = ScaledPositions(d_model, max_positions, name="dec_pos")
        self.decoder = tuple(Block(d_model, heads, ffn_dim, dropout, cross=True, name=f"dec{i}")
                             for i in range(decoder_layers))
        self.dec_norm = L.LayerNormalization(epsilon=1e-5)
        self.mel_out = L.Dense(n_mels * reduction, name="mel_out")
        self.stop_out = L.Dense(1, name="stop_out")
        self.postnet = tuple(L.Conv1D(n_mels if i == postnet_layers - 1 else postnet_channels, postnet_kernel,
                                      padding="same", name=f"postnet{i}") for i in range(postnet_layers))
        self.drop = L.Dropout(dropout)
        self.seed_generator = keras.random.SeedGenerator(name="prenet_seed")
        self.build()  # create every variable now, i.e. inside the caller's distribution-strategy scope

    def build(self, input_shape=None):
        D, M = self.d_model, self.n_mels
        build_token_tables(self)
        for conv, norm in zip(self.enc_convs, self.enc_conv_norms):
            conv.build((None, None, D))
            norm.build((None, None, D))
        for layer in [self.enc_proj, self.enc_pos, *self.encoder, self.enc_norm, self.dec_pos, *self.decoder,
                      self.dec_norm, self.mel_out, self.stop_out]:
            layer.build((None, None, D))
        self.prenet[0].build((None, None, M))
        self.prenet[1].build((None, None, self.prenet[0].units))
        self.dec_proj.build((None, None, self.prenet[1].units))
        channels = M
        for conv in self.postnet:
            conv.build((None, None, channels))
            channels = conv.filters
        self.built = True

    def encode(self, tokens, token_lengths, training=False, speaker=None, language=None):
        """-> memory (B, T, D), token_mask (B, T) bool; speaker / language int32 (B,) (default 0)."""
        token_mask = tf.sequence_mask(token_lengths, tf.shape(tokens)[1])       # (B, T)
        keep = tf.cast(token_mask, self.compute_dtype)[:, :, None]              # (B, T, 1)
        x = self.embedding(tokens)                                              # (B, T, D)
        if self.language_embedding is not None:
            x += self.language_embedding(voice_ids(language, tokens))[:, None, :]
        for conv, norm in zip(self.enc_convs, self.enc_conv_norms):
            x = conv(x * keep)  # zeroed pads look like 'same' padding, whatever the padded length
            x = self.drop(tf.nn.relu(norm(x)), training=training)
        x = self.enc_pos(self.enc_proj(x))
        allowed = token_mask[:, None, None, :]                                  # (B, 1, 1, T) keys
        for block in self.encoder:
            x, _ = block(x, allowed, training=training)
        x = self.enc_norm(x)
        if self.speaker_embedding is not None:
            x += self.speaker_embedding(voice_ids(speaker, tokens))[:, None, :]
        return x, token_mask

    def decode(self, dec_in, memory, token_mask, seed, training=False):
        """dec_in (B, S, n_mels) -> frames (B, S, n_mels*r), stop_logits (B, S), alignment (B, S, T) float32.
        Pre-net dropout is always on (Tacotron 2); stateless with `seed`, (2,) for the batch or (B, 2) one
        per clip, so equal seeds give equal masks."""
        x = dec_in
        for layer, layer_seed in zip(self.prenet, _split_seed(seed, 2)):
            x = layer(x)                                                        # (B, S, prenet_dim)
            if self.prenet_dropout > 0:
                x = _stateless_dropout(x, self.prenet_dropout, layer_seed)
        x = self.dec_pos(self.dec_proj(x))                                      # (B, S, D)
        S = tf.shape(x)[1]
        causal = (tf.range(S)[:, None] >= tf.range(S)[None, :])[None, None]     # (1, 1, S, S)
        memory_allowed = token_mask[:, None, None, :]                           # (B, 1, 1, T)
        for block in self.decoder:
            x, weights = block(x, causal, memory, memory_allowed, training=training)
        x = self.dec_norm(x)
        stop_logits = tf.cast(self.stop_out(x)[..., 0], tf.float32)             # (B, S)
        return self.mel_out(x), stop_logits, tf.reduce_mean(weights, axis=1)    # weights (B, h, S, T)

    def run_postnet(self, mel, frame_mask):
        """Residual conv post-net; pads are zeroed before each conv so they never leak into real frames."""
        keep = tf.cast(frame_mask, mel.dtype)[:, :, None]                       # (B, F, 1)
        x = mel
        for i, conv in enumerate(self.postnet):
            x = conv(x * keep)                                                  # (B, F, C)
            if i < len(self.postnet) - 1:
                x = tf.tanh(x)  # no dropout here: it would cost ~10% of a CPU step for little gain
        return mel + x

    def call(self, inputs, training=False):
        tokens, mel = inputs["tokens"], tf.cast(inputs["mel"], self.compute_dtype)
        B, F, M, r = tf.shape(mel)[0], mel.shape[1], self.n_mels, self.reduction
        assert F is None or F % r == 0, f"{F} mel frames is not a multiple of reduction {r}"
        memory, token_mask = self.encode(tokens, inputs["token_lengths"], training=training,
                                         speaker=inputs.get("speaker"), language=inputs.get("language"))
        # teacher forcing: step s sees the last frame of group s-1; step 0 sees a zero go frame
        last = mel[:, r - 1::r, :]                                              # (B, F/r, M)
        dec_in = tf.pad(last[:, :-1], [[0, 0], [1, 0], [0, 0]])                 # (B, F/r, M)
        # training draws fresh masks; teacher-forced inference (validation, GTA mels) seeds each clip's from
        # its tokens: the same mel in every process and whichever clips share its batch
        seed = self.seed_generator.next() if training else _clip_seeds(tokens)
        frames, stop_logits, alignment = self.decode(dec_in, memory, token_mask, seed, training=training)
        mel_before = tf.reshape(frames, [B, -1, M])                             # (B, F, M)
        # the frames of every real decoder step, as inference emits (and post-nets) them: see tts_loss
        frame_mask = tf.sequence_mask(step_frames(inputs["mel_lengths"], r), tf.shape(mel)[1])  # (B, F)
        mel_after = self.run_postnet(mel_before, frame_mask)
        mel_after = tf.cast(mel_after, tf.float32)
        return {"mel_before": tf.cast(mel_before, tf.float32), "mel_after": mel_after, "mel": mel_after,
                "stop_logits": stop_logits, "alignment": alignment}

    def infer(self, tokens, token_lengths, *, pace=1.0, pitch_shift=0.0, max_frames, speaker=None, language=None):
        """The model interface: autoregressive decoding, stopping at `stop_threshold`; pace resamples the
        mel in time (> 1 faster); at most max_frames frames of the paced mel, as FastPitch's: the decoder
        runs until the paced mel would pass max_frames (within max_positions steps), so a sentence cut
        there has exactly max_frames frames at any pace, and "stopped" False. No pitch control:
        pitch_shift != 0 is an error. -> {"mel" (B, F <= max_frames, n_mels), "lengths" (B,), "stopped" (B,)}."""
        if pitch_shift:
            raise ModelError("transformer_tts has no pitch control; set synthesize.pitch_shift: 0.0 "
                             "or use model.kind: fastpitch")
        max_frames, pace = int(max_frames), float(pace)
        steps = min(max(1, math.ceil(max_frames * pace / self.reduction)), self.max_positions)
        out = self.decode_autoregressive(tokens, token_lengths, max_steps=steps,
                                         stop_threshold=self.stop_threshold, speaker=speaker, language=language)
        if pace != 1.0:
            out = {**out, **_resample_time(out["mel"], out["lengths"], pace)}
        lengths = tf.minimum(out["lengths"], max_frames)
        return {**out, "mel": out["mel"][:, :max_frames], "lengths": lengths,
                "stopped": out["stopped"] & (out["lengths"] <= max_frames)}

    def decode_autoregressive(self, tokens, token_lengths, *, max_steps, stop_threshold, speaker=None, language=None):
        """Autoregressive decoding, at most max_steps decoder steps (max_steps * r frames).
        -> mel (B, max_steps*r, n_mels) after the post-net, zero past `lengths`; lengths int32 (B,) frames up
        to and including the stop step (max_steps*r if none); stopped bool (B,); alignment (B, max_steps, T);
        mel_before (B, max_steps*r, n_mels), the frames fed back, for diagnostics and tests."""
        if not 0 < max_steps <= self.max_positions:
            raise ValueError(f"max_steps must be in 1..max_positions={self.max_positions}, got {max_steps}")
        tokens = tf.convert_to_tensor(tokens, tf.int32)
        return self._infer(tokens, tf.convert_to_tensor(token_lengths, tf.int32), int(max_steps), float(stop_threshold),
                           voice_ids(speaker, tokens), voice_ids(language, tokens))

    @tf.function(reduce_retracing=True, autograph=False)  # tf.while_loop already: nothing to convert
    def _infer(self, tokens, token_lengths, max_steps, stop_threshold, speaker, language):
        # Each step re-runs the decoder over the whole fixed-size buffer (static shapes; the causal mask
        # makes the unfilled tail irrelevant). One seed a sentence for the loop: past frames keep their dropout
        # masks, and a sentence's masks are its own, whatever sentences share its batch.
        M, r = self.n_mels, self.reduction
        B, T = tf.shape(tokens)[0], tf.shape(tokens)[1]
        memory, token_mask = self.encode(tokens, token_lengths, speaker=speaker, language=language)
        seed = _clip_seeds(tokens)                                              # (B, 2)
        dec_in = tf.zeros([B, max_steps, M], self.compute_dtype)               # (B, S, M)
        frames = tf.zeros([B, max_steps, M * r], tf.float32)                    # (B, S, M*r)
        alignment = tf.zeros([B, max_steps, T], tf.float32)                     # (B, S, T)
        stop_step = tf.fill([B], max_steps)
        done = tf.zeros([B], tf.bool)

        def body(i, dec_in, frames, alignment, stop_step, done):
            out, stop_logits, weights = self.decode(dec_in, memory, token_mask, seed)
            here = tf.one_hot(i, max_steps)[None, :, None]                      # (1, S, 1) selects step i
            frames += here * tf.cast(out[:, i], tf.float32)[:, None, :]
            alignment += here * weights[:, i][:, None, :]
            after = tf.one_hot(i + 1, max_steps, dtype=dec_in.dtype)[None, :, None]  # zero past the end
            dec_in += after * out[:, i, -M:][:, None, :]                        # last frame of the group
            stop_now = tf.sigmoid(stop_logits[:, i]) > stop_threshold
            stop_step = tf.where(stop_now & ~done, i + 1, stop_step)
            return i + 1, dec_in, frames, alignment, stop_step, done | stop_now

        _, _, frames, alignment, stop_step, done = tf.while_loop(
            lambda i, *state: ~tf.reduce_all(state[-1]), body,
            (tf.constant(0), dec_in, frames, alignment, stop_step, done), maximum_iterations=max_steps)
        lengths = stop_step * r
        frame_mask = tf.sequence_mask(lengths, max_steps * r)                   # (B, S*r)
        mel = self.run_postnet(tf.cast(tf.reshape(frames, [B, -1, M]), self.compute_dtype), frame_mask)
        keep = tf.cast(frame_mask, tf.float32)[:, :, None]                      # (B, S*r, 1)
        return {"mel": tf.cast(mel, tf.float32) * keep, "lengths": lengths, "stopped": done,
                "alignment": alignment, "mel_before": tf.reshape(frames, [B, -1, M]) * keep}

    def tts_loss(self, outputs, batch):
        """The model interface: (total float32 scalar, {term: scalar}); see the module function."""
        return tts_loss(outputs, batch, reduction=self.reduction, **self.loss_args)

    def get_config(self):
        return dict(self.args)


def _position_sums(tokens):
    """(B,) int64: each row's tokens weighted by their position (1, 2, ...); padding ids 0 add nothing."""
    tokens = tf.cast(tokens, tf.int64)
    weights = tf.range(1, tf.shape(tokens)[1] + 1, dtype=tf.int64)[None, :]    # (1, T)
    return tf.reduce_sum(tokens * weights, axis=1)


# The functions tf.map_fn runs below are marked not to convert: AutoGraph writes each conversion's source
# to $TMPDIR and removes it only at a normal exit, so a killed job (SIGKILL, a SLURM time limit) left it.
@tf.autograph.experimental.do_not_convert
def _fold_seed(value):
    return tf.random.experimental.stateless_fold_in(tf.constant(INFER_SEED, tf.int64), value % (2 ** 31 - 1))


def _clip_seeds(tokens):
    """(B, 2): the stateless seeds of pre-net dropout without training (kept on, as in Tacotron 2), one a
    clip: INFER_SEED folded with the clip's tokens (position-weighted; padding ids 0 add nothing), not a
    SeedGenerator's next value. So one checkpoint speaks a sentence alike in every process and call, in any
    batch, with the masks its teacher-forced (GTA) mel has; sentences still get masks of their own."""
    return tf.map_fn(_fold_seed, _position_sums(tokens), fn_output_signature=tf.TensorSpec([2], tf.int64))


def _split_seed(seed, n):
    """n stateless seeds from `seed`: (2,) -> n of (2,); (B, 2) -> n of (B, 2), each clip's split alone."""
    if seed.shape.rank == 1:
        return tf.unstack(tf.random.experimental.stateless_split(seed, n))
    split = tf.autograph.experimental.do_not_convert(lambda s: tf.random.experimental.stateless_split(s, n))
    return tf.unstack(tf.map_fn(split, seed, fn_output_signature=tf.TensorSpec([n, 2], seed.dtype)), axis=1)


def _stateless_dropout(x, rate, seed):
    """Dropout of x (B, S, C) with masks from `seed`: (2,) for the batch, or (B, 2) each row by its own seed.
    A row's masks are Philox draws in frame order, so its first frames' masks do not depend on S (padding)."""
    if seed.shape.rank == 1:
        return tf.nn.experimental.stateless_dropout(x, rate, seed=seed)
    drop = tf.autograph.experimental.do_not_convert(lambda a: tf.nn.experimental.stateless_dropout(a[0], rate, seed=a[1]))
    return tf.map_fn(drop, (x, seed), fn_output_signature=x.dtype)


def _resample_time(mel, lengths, pace):
    """Linear resampling of each mel along time to lengths / pace frames. -> {"mel", "lengths"}."""
    F = tf.shape(mel)[1]
    new_lengths = tf.maximum(tf.cast(tf.round(tf.cast(lengths, tf.float32) / pace), tf.int32), 1)   # (B,)
    F_new = tf.reduce_max(new_lengths)
    # source position of every output frame, per example: i * length / new_length
    src = tf.cast(tf.range(F_new), tf.float32)[None, :] * tf.cast(lengths, tf.float32)[:, None] \
        / tf.cast(new_lengths, tf.float32)[:, None]                                               # (B, F')
    lo = tf.minimum(tf.cast(tf.floor(src), tf.int32), F - 1)
    hi = tf.minimum(lo + 1, tf.maximum(lengths[:, None] - 1, 0))
    w = (src - tf.cast(lo, tf.float32))[:, :, None]                                               # (B, F', 1)
    out = tf.gather(mel, lo, batch_dims=1) * (1 - w) + tf.gather(mel, hi, batch_dims=1) * w       # (B, F', M)
    keep = tf.cast(tf.sequence_mask(new_lengths, F_new), tf.float32)[:, :, None]
    return {"mel": out * keep, "lengths": new_lengths}


def step_frames(mel_lengths, reduction):
    """The frames of the decoder steps holding `mel_lengths` frames: rounded up to a multiple of r."""
    return (mel_lengths + reduction - 1) // reduction * reduction


def build_token_tables(model):
    """Builds a model's token embedding and its speaker and language tables (each None when absent)."""
    model.embedding.build((None, None))
    for table in (model.speaker_embedding, model.language_embedding):
        if table is not None:
            table.build((None,))


def voice_ids(ids, tokens):
    """int32 (B,) speaker or language ids; zeros when not given."""
    if ids is None:
        return tf.zeros(tf.shape(tokens)[:1], tf.int32)
    return tf.reshape(tf.cast(ids, tf.int32), [-1])


def build(model_cfg, vocab, n_mels, *, speakers=(), languages=()):
    """The model for a validated config's `model:` section (its `transformer_tts` keys); `speakers` /
    `languages`: the cache's tables (an embedding each when it lists more than one)."""
    cfg = model_cfg["transformer_tts"]
    missing = [k for k in ARCH_KEYS + LOSS_KEYS + OTHER_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"model.transformer_tts lacks keys {missing}")
    return TransformerTTS(n_symbols=len(vocab), n_mels=n_mels, stop_threshold=cfg["stop_threshold"],
                          loss_args={k: cfg[k] for k in LOSS_KEYS}, n_speakers=max(len(speakers), 1),
                          n_languages=max(len(languages), 1), **{k: cfg[k] for k in ARCH_KEYS})


def tts_loss(outputs, batch, *, reduction, guided_attention_sigma, guided_attention_weight, stop_weight):
    """Masked mel L1 (before and after the post-net) + stop BCE + guided attention. -> (total, dict), float32.
    Stop BCE: target 1 from the step holding the last real frame, positives weighted by STOP_POS_WEIGHT.
    Guided attention: mean of A * W over real (step, token) cells, as in Tachibana et al.
    Stop and attention terms cover only real decoder steps, so the loss is the same however much a bucket
    pads, and the model never learns from zero-padded decoder inputs that inference never produces. The
    mel terms cover every frame of those steps: the last one's r - 1 frames past the end, which inference
    emits too (lengths = stop step x r), learn the padding (the loader's silence) instead of nothing.
    Under a distribution strategy this is the per-replica mean: divide by the replica count before summing."""
    mel = tf.cast(batch["mel"], tf.float32)                                    # (B, F, M)
    mel_lengths, token_lengths = batch["mel_lengths"], batch["token_lengths"]
    frames = step_frames(mel_lengths, reduction)                               # (B,)
    frame_mask = tf.cast(tf.sequence_mask(frames, tf.shape(mel)[1]), tf.float32)[:, :, None]  # (B, F, 1)
    frame_count = tf.reduce_sum(frame_mask) * tf.cast(tf.shape(mel)[2], tf.float32)

    def l1(pred):
        return tf.reduce_sum(tf.abs(pred - mel) * frame_mask) / frame_count

    stop_logits, alignment = outputs["stop_logits"], outputs["alignment"]      # (B, S), (B, S, T)
    S, T = tf.shape(alignment)[1], tf.shape(alignment)[2]
    steps = (mel_lengths + reduction - 1) // reduction                         # (B,) real decoder steps N
    step_mask = tf.cast(tf.sequence_mask(steps, S), tf.float32)                # (B, S)
    stop_target = tf.cast(tf.range(S)[None, :] >= (steps - 1)[:, None], tf.float32)  # 1 from the last real step
    bce = tf.nn.weighted_cross_entropy_with_logits(stop_target, stop_logits, pos_weight=STOP_POS_WEIGHT)
    stop = tf.reduce_sum(bce * step_mask) / tf.reduce_sum(step_mask)

    # W[n, t] = 1 - exp(-(n/N - t/T)^2 / (2 g^2)) with each example's own N and T
    n = tf.cast(tf.range(S), tf.float32)[None, :, None] / tf.cast(steps, tf.float32)[:, None, None]
    t = tf.cast(tf.range(T), tf.float32)[None, None, :] / tf.cast(token_lengths, tf.float32)[:, None, None]
    w = 1.0 - tf.exp(-tf.square(n - t) / (2.0 * guided_attention_sigma ** 2))  # (B, S, T)
    token_mask = tf.cast(tf.sequence_mask(token_lengths, T), tf.float32)       # (B, T)
    attn_mask = step_mask[:, :, None] * token_mask[:, None, :]                 # (B, S, T)
    guided = tf.reduce_sum(alignment * w * attn_mask) / tf.reduce_sum(attn_mask)

    terms = {"mel_before": l1(outputs["mel_before"]), "mel_after": l1(outputs["mel_after"]),
             "stop": stop, "guided_attention": guided}
    total = (terms["mel_before"] + terms["mel_after"] + stop_weight * stop
             + guided_attention_weight * guided)
    return total, {**terms, "total": total}
