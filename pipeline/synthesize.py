"""Speak the config's held-out sentences with the latest checkpoint: runs/{name}/samples/NN.wav (+ NN.npy mel).

    python -m pipeline.synthesize --config configs/config.yaml --out runs/demo/samples
    snakemake synthesize

Reads runs/{name}/checkpoints (the model only), the vocabulary and mel statistics saved with the
caches (so the text front end is the one training used), config keys `synthesize:`, `audio:`,
`model:`. Decoding is one compiled autoregressive loop that ends at the stop token or at
synthesize.max_seconds (with a warning); Griffin-Lim (TensorFlow STFT ops) turns mels into wavs.

`load_synthesizer(cfg)` is the one way other stages (evaluate) turn text into a mel, for any model:

    synth = load_synthesizer(cfg)          # MissingCheckpoint when runs/{name}/checkpoints is empty
    log_mel = synth.mel("Hello there.")    # (frames, n_mels) float32; synth.checkpoint, synth.step
"""
import argparse
import functools
import json
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline import config, data, text
from pipeline.errors import MissingCheckpoint, cli
from pipeline.model import build_model
from pipeline.vocoder import griffin_lim, save_wav

_print = functools.partial(print, flush=True)


def load_model(cfg, index):
    model = build_model(cfg["model"], n_symbols=len(index["vocab"]["symbols"]), n_mels=index["n_mels"])
    ckpt_dir = config.run_dir(cfg) / "checkpoints"
    latest = tf.train.latest_checkpoint(str(ckpt_dir))
    if latest is None:
        raise MissingCheckpoint(f"{ckpt_dir}: no checkpoint; train first (`snakemake --cores all train`)")
    t, f = 8, 4 * cfg["model"]["reduction"]
    model({"tokens": tf.ones([1, t], tf.int32), "token_lengths": tf.constant([t]),
           "mel": tf.zeros([1, f, index["n_mels"]]), "mel_lengths": tf.constant([f])})
    tf.train.Checkpoint(model=model).restore(latest).expect_partial()
    return model, latest


class Synthesizer:
    """Text -> denormalised log-mel with the latest checkpoint: `.mel(text)` (frames, n_mels) float32,
    ready for Griffin-Lim or a HiFi-GAN. `.checkpoint` is the checkpoint path, `.step` its step."""

    def __init__(self, cfg, model, checkpoint, index, log):
        self.model, self.checkpoint, self.log = model, checkpoint, log
        self.step = int(checkpoint.rsplit("-", 1)[1])
        self.vocab = index["vocab"]
        self.mean, self.std = data.mel_stats(cfg, index)
        self.max_seconds, self.stop_threshold = cfg["synthesize"]["max_seconds"], cfg["synthesize"]["stop_threshold"]
        a, r = cfg["audio"], cfg["model"]["reduction"]
        self.max_steps = int(np.ceil(self.max_seconds * a["sample_rate"] / a["hop_length"] / r))

    def mel(self, sentence):
        ids = text.encode(sentence, self.vocab)  # as training mapped it; TextError naming an unseen symbol
        res = self.model.infer(tf.constant([ids], tf.int32), tf.constant([len(ids)], tf.int32),
                               max_steps=self.max_steps, stop_threshold=self.stop_threshold)
        n = int(res["lengths"][0])
        if not bool(res["stopped"][0]):
            self.log(f"warning: never reached the stop threshold; cut at synthesize.max_seconds = "
                     f"{self.max_seconds} s (the model may need more training): {sentence!r}")
        return res["mel"][0, :n].numpy() * self.std + self.mean  # (frames, n_mels) back to log-mel


def load_synthesizer(cfg, log=_print):
    """The latest checkpoint of runs/{name}/ as a Synthesizer; MissingCheckpoint when there is none."""
    index = data.read_index(cfg)
    model, latest = load_model(cfg, index)
    return Synthesizer(cfg, model, latest, index, log)


def synthesize(cfg, out, log=_print):
    synth = load_synthesizer(cfg, log)
    s, a = cfg["synthesize"], cfg["audio"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"synthesizing {len(s['sentences'])} sentences from {synth.checkpoint}")
    paths = []
    for i, sentence in enumerate(s["sentences"]):
        mel = synth.mel(sentence)
        np.save(out / f"{i:02d}.npy", mel.astype(np.float32))
        audio = griffin_lim(mel, iters=s["griffin_lim_iters"], **a)
        path = out / f"{i:02d}.wav"
        save_wav(path, np.asarray(audio), a["sample_rate"])
        log(f"{path}: {len(mel) * a['hop_length'] / a['sample_rate']:.2f} s: {sentence!r}")
        paths.append(str(path))
    config.atomic_write_text(out / "sentences.json", json.dumps(
        {"checkpoint": synth.checkpoint, "samples": dict(zip(paths, s["sentences"]))}, indent=1))
    return paths


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Synthesize the config's sentences from the latest checkpoint.")
    config.add_arguments(parser)
    parser.add_argument("--out", help="folder for the wavs (default runs/{name}/samples)")
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    synthesize(cfg, args.out or config.run_dir(cfg) / "samples")


if __name__ == "__main__":
    main()
