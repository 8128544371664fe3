"""A user's own acoustic model kind, the example docs/models.md walks through (tests/test_train.py
trains it through the real loop and synthesizes with it).

    cp docs/examples/my_tts.py .        # beside the Snakefile, or anywhere on PYTHONPATH
    snakemake --cores all train --config 'model={kind: "my_tts:build", options: {width: 64, frame_multiple: 2}}'

Each token's embedding predicts a mel frame; the tokens' frames are stretched evenly over the
clip, two frames per step (`frame_multiple`), so it learns an average voice, not speech: a
template to replace with a real model, not one to listen to.
"""
import keras
import tensorflow as tf


class MyTTS(keras.Model):
    needs = ("tokens", "token_lengths", "mel", "mel_lengths")  # the batch fields it trains on

    def __init__(self, n_symbols, n_mels, width, frame_multiple):
        super().__init__()
        self.frame_multiple = frame_multiple  # the loader pads frames to a multiple of it (model.options)
        self.embed = keras.layers.Embedding(n_symbols, width)  # id 0 is the padding symbol
        self.out = keras.layers.Dense(n_mels * frame_multiple)

    def _frames(self, tokens, token_lengths, n_frames):
        """(B, n_frames, n_mels): token t's prediction on the frames evenly given to it."""
        steps = n_frames // self.frame_multiple
        pos = tf.range(steps, dtype=tf.float32)[None] / tf.cast(steps, tf.float32)               # (1, S)
        which = tf.cast(pos * tf.cast(token_lengths, tf.float32)[:, None], tf.int32)              # (B, S)
        h = tf.gather(self.embed(tokens), which, batch_dims=1)                                    # (B, S, W)
        mel = self.out(h)                                                                         # (B, S, r*M)
        return tf.reshape(mel, [tf.shape(tokens)[0], n_frames, -1])                               # (B, F, M)

    def call(self, batch, training=False):
        return {"mel": self._frames(batch["tokens"], batch["token_lengths"], tf.shape(batch["mel"])[1])}

    def tts_loss(self, outputs, batch):
        mask = tf.sequence_mask(batch["mel_lengths"], tf.shape(batch["mel"])[1], tf.float32)[:, :, None]
        mel = tf.cast(outputs["mel"], tf.float32)  # bfloat16/float16 under mixed precision: the loss in float32
        loss = tf.reduce_sum(tf.abs(mel - batch["mel"]) * mask) / tf.reduce_sum(mask)
        loss = loss / tf.cast(tf.shape(batch["mel"])[2], tf.float32)
        return loss, {"mel": loss, "total": loss}

    def infer(self, tokens, token_lengths, *, pace=1.0, pitch_shift=0.0, max_frames):
        if pitch_shift:
            raise ValueError("synthesize.pitch_shift: this model cannot shift pitch; set it to 0")
        r = self.frame_multiple
        n = min(int(tokens.shape[1] * 6 / pace) // r * r, max_frames // r * r)  # ~6 frames per token
        return {"mel": self._frames(tokens, token_lengths, n), "lengths": tf.fill([tf.shape(tokens)[0]], n)}


def build(model_cfg, vocab, n_mels):
    """vocab: the run's symbol list (id = position, 0 = pad); model_cfg: the `model:` section."""
    options = model_cfg["options"]
    return MyTTS(len(vocab), n_mels, width=options.get("width", 64), frame_multiple=options.get("frame_multiple", 1))
