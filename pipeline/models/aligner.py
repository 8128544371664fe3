"""Alignment model: which token each mel frame belongs to, learnt without labels.

References: Shih et al. 2021, "RAD-TTS: Parallel Flow-Based TTS with Robust Alignment Learning";
Badlani et al. 2022, "One TTS Alignment To Rule Them All" (arXiv:2108.10447), as in NeMo's FastPitch.

A text encoder (embedding + 2 convs) and a mel encoder (3 convs) map tokens and frames into one
space (with several languages a learned language vector is added to the token embeddings, with several
speakers a learned speaker vector to the mel encoder's first hidden layer: one speaker and one language
make no table and no op); the soft alignment of frame f is a softmax over tokens of -temperature * squared distance,
times a beta-binomial prior that favours the diagonal early in training. The forward-sum loss is
the CTC loss of the token sequence 0..T-1 against the frames' log-probabilities (a blank column with
a fixed small probability added), i.e. the likelihood summed over every monotonic path, so no
alignment labels are needed. The hard durations (monotonic alignment search over `log_probs`) are
made ahead of time by pipeline/durations.py, never inside a training step.

Config keys used: `aligner:` (d_model, temperature, prior_scaling; the rest by pipeline/align.py).
"""
import keras
import tensorflow as tf

BLANK_LOGPROB = -1.0  # NeMo's ForwardSumLoss: the blank column's constant log-score
NEG = -1e4            # log-score of a padded token: exp() underflows to 0 in float32


def beta_binomial_log_prior(token_lengths, mel_lengths, n_tokens, n_frames, scaling):
    """log P(token t | frame f) of a beta-binomial(T-1, a=scaling*(f+1), b=scaling*(F-f)) per clip.
    -> (B, n_frames, n_tokens) float32, 0 outside the clip (so it never masks by itself)."""
    T = tf.cast(token_lengths, tf.float32)[:, None, None]                      # (B, 1, 1)
    F = tf.cast(mel_lengths, tf.float32)[:, None, None]
    k = tf.cast(tf.range(n_tokens), tf.float32)[None, None, :]                 # (1, 1, T)
    f = tf.cast(tf.range(n_frames), tf.float32)[None, :, None]                 # (1, F, 1)
    n = T - 1.0
    a, b = scaling * (f + 1.0), scaling * (F - f)
    b = tf.maximum(b, 1e-3)                                                    # padded frames: any finite value

    def lbeta(x, y):
        return tf.math.lgamma(x) + tf.math.lgamma(y) - tf.math.lgamma(x + y)

    kk = tf.minimum(k, tf.maximum(n, 0.0))                                     # padded tokens: any valid k
    log_choose = tf.math.lgamma(n + 1.0) - tf.math.lgamma(kk + 1.0) - tf.math.lgamma(n - kk + 1.0)
    logp = log_choose + lbeta(kk + a, n - kk + b) - lbeta(a, b)                # (B, F, T)
    inside = tf.logical_and(k < T, f < F)
    return tf.where(inside, logp, 0.0)


def forward_sum_loss(log_probs, token_lengths, mel_lengths):
    """CTC over tokens 0..T-1 of each clip: -log sum over monotonic alignments, per token, batch mean.
    log_probs (B, F, T) float32, log-softmax over real tokens. The sparse-label CTC kernel is ~20x
    faster on CPUs than the dense-label one; a clip with fewer frames than tokens contributes 0."""
    T = tf.shape(log_probs)[2]
    token_mask = tf.sequence_mask(token_lengths, T)                            # (B, T)
    logits = tf.pad(log_probs, [[0, 0], [0, 0], [0, 1]], constant_values=BLANK_LOGPROB)  # (B, F, T+1) blank last
    logits = tf.where(tf.pad(token_mask, [[0, 0], [0, 1]], constant_values=True)[:, None, :], logits, NEG)
    where = tf.where(token_mask)                                               # (N, 2) [clip, token]
    labels = tf.SparseTensor(where, tf.cast(where[:, 1], tf.int32), tf.shape(token_mask, out_type=tf.int64))
    loss = tf.compat.v1.nn.ctc_loss(labels, logits, mel_lengths, preprocess_collapse_repeated=False,
                                    ctc_merge_repeated=True, ignore_longer_outputs_than_inputs=True,
                                    time_major=False)                          # (B,) -log p, softmax inside
    return tf.reduce_mean(loss / tf.cast(token_lengths, tf.float32))


def voice_vectors(table, ids):
    """table's rows for int32 ids (B,); an id < 0 (a speaker or language the aligner never saw, e.g. a
    source added after it was trained) gets the mean of its rows."""
    ids = tf.reshape(tf.cast(ids, tf.int32), [-1])
    rows = table(tf.maximum(ids, 0))                                           # (B, D)
    mean = tf.reduce_mean(table.embeddings, axis=0, keepdims=True)            # (1, D)
    return tf.where(tf.expand_dims(ids < 0, -1), mean, rows)


class Aligner(keras.Model):
    """call(batch) -> {"log_probs": (B, F, T) float32 log-softmax over real tokens, prior included}.
    With several speakers (languages) the batch also holds `speaker` (`language`) int32 (B,)."""

    needs = ("tokens", "token_lengths", "mel", "mel_lengths")

    def __init__(self, *, n_symbols, n_mels, d_model, temperature, prior_scaling, n_speakers=1, n_languages=1):
        super().__init__(name="aligner")
        voices = dict(n_speakers=n_speakers, n_languages=n_languages) if n_speakers > 1 or n_languages > 1 else {}
        self.args = dict(n_symbols=n_symbols, n_mels=n_mels, d_model=d_model, temperature=temperature,
                         prior_scaling=prior_scaling, **voices)  # one speaker and language: as before
        self.n_mels, self.d_model = n_mels, d_model
        self.temperature, self.prior_scaling = float(temperature), float(prior_scaling)
        L = keras.layers
        self.embedding = L.Embedding(n_symbols, d_model, name="embedding")
        # a speaker's voice changes the frames (the mel encoder's hidden state), a language how the
        # symbols sound (the token embeddings); one speaker / one language: no table, no op
        self.speaker_embedding = L.Embedding(n_speakers, 2 * d_model, name="speaker_embedding") if n_speakers > 1 else None
        self.language_embedding = L.Embedding(n_languages, d_model, name="language_embedding") if n_languages > 1 else None
        self.needs = Aligner.needs + tuple(f for f, t in (("speaker", self.speaker_embedding),
                                                          ("language", self.language_embedding)) if t is not None)
        self.key_convs = (L.Conv1D(2 * d_model, 3, padding="same", activation="relu", name="key0"),
                          L.Conv1D(d_model, 1, name="key1"))
        self.query_convs = (L.Conv1D(2 * d_model, 3, padding="same", activation="relu", name="query0"),
                            L.Conv1D(d_model, 1, activation="relu", name="query1"),
                            L.Conv1D(d_model, 1, name="query2"))
        self.build()

    def build(self, input_shape=None):
        D = self.d_model
        self.embedding.build((None, None))
        for table in (self.speaker_embedding, self.language_embedding):
            if table is not None:
                table.build((None,))
        self.key_convs[0].build((None, None, D))
        self.key_convs[1].build((None, None, 2 * D))
        self.query_convs[0].build((None, None, self.n_mels))
        self.query_convs[1].build((None, None, 2 * D))
        self.query_convs[2].build((None, None, D))
        self.built = True

    def call(self, batch, training=False):
        tokens, token_lengths = batch["tokens"], batch["token_lengths"]
        mel, mel_lengths = tf.cast(batch["mel"], tf.float32), batch["mel_lengths"]
        T, F = tf.shape(tokens)[1], tf.shape(mel)[1]
        token_mask = tf.sequence_mask(token_lengths, T)                        # (B, T)
        frame_mask = tf.sequence_mask(mel_lengths, F)                          # (B, F)
        k = self.embedding(tokens)
        if self.language_embedding is not None:
            k += voice_vectors(self.language_embedding, batch["language"])[:, None, :]
        k *= tf.cast(token_mask, tf.float32)[:, :, None]
        for conv in self.key_convs:
            k = conv(k) * tf.cast(token_mask, tf.float32)[:, :, None]          # (B, T, D)
        q = mel * tf.cast(frame_mask, tf.float32)[:, :, None]
        for i, conv in enumerate(self.query_convs):
            q = conv(q)
            if i == 0 and self.speaker_embedding is not None:                  # (B, F, 2D) hidden state
                q += voice_vectors(self.speaker_embedding, batch["speaker"])[:, None, :]
            q *= tf.cast(frame_mask, tf.float32)[:, :, None]                   # (B, F, D) last
        # squared distances without a (B, F, T, D) tensor: |q|^2 - 2 q.k + |k|^2
        dist = (tf.reduce_sum(q * q, -1)[:, :, None] - 2.0 * tf.matmul(q, k, transpose_b=True)
                + tf.reduce_sum(k * k, -1)[:, None, :])                        # (B, F, T)
        scores = -self.temperature * dist
        scores = tf.where(token_mask[:, None, :], scores, NEG)
        log_probs = tf.nn.log_softmax(scores, axis=-1)
        log_probs += beta_binomial_log_prior(token_lengths, mel_lengths, T, F, self.prior_scaling)
        log_probs = tf.where(token_mask[:, None, :], tf.nn.log_softmax(log_probs, axis=-1), NEG)
        return {"log_probs": log_probs}

    def tts_loss(self, outputs, batch):
        loss = forward_sum_loss(outputs["log_probs"], batch["token_lengths"], batch["mel_lengths"])
        return loss, {"forward_sum": loss, "total": loss}

    def get_config(self):
        return dict(self.args)


def build(aligner_cfg, vocab, n_mels, *, speakers=(), languages=()):
    """The aligner for a validated `aligner:` section; `speakers` / `languages`: the cache index's sorted
    tables (a table each when it lists more than one)."""
    return Aligner(n_symbols=len(vocab), n_mels=n_mels, d_model=aligner_cfg["d_model"],
                   temperature=aligner_cfg["temperature"], prior_scaling=aligner_cfg["prior_scaling"],
                   n_speakers=max(len(speakers), 1), n_languages=max(len(languages), 1))
