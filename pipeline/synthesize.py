"""Speak the config's held-out sentences with the latest checkpoint: runs/{name}/samples/NN.wav.

    python -m pipeline.synthesize --config configs/config.yaml --out runs/demo/samples
    snakemake synthesize

Reads runs/{name}/checkpoints (the model only), the vocabulary and mel statistics saved with the
caches (so the text front end is the one training used), config keys `synthesize:`, `audio:`,
`model:`. Decoding is one compiled autoregressive loop that ends at the stop token or at
synthesize.max_seconds (with a warning); Griffin-Lim (TensorFlow STFT ops) turns mels into wavs.
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


def synthesize(cfg, out, log=functools.partial(print, flush=True)):
    index = data.read_index(cfg)
    vocab = index["vocab"]
    if vocab["symbols"] != text.SYMBOLS:
        raise data.CacheError("the cached vocabulary differs from pipeline/text.py's symbols; rebuild the caches and retrain")
    model, latest = load_model(cfg, index)
    mean, std = data.mel_stats(cfg, index)
    s, a = cfg["synthesize"], cfg["audio"]
    r = cfg["model"]["reduction"]
    max_steps = int(np.ceil(s["max_seconds"] * a["sample_rate"] / a["hop_length"] / r))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"synthesizing {len(s['sentences'])} sentences from {latest}")
    paths = []
    for i, sentence in enumerate(s["sentences"]):
        ids, dropped = text.text_to_ids(sentence, vocab["cleaners"])
        res = model.infer(tf.constant([ids], tf.int32), tf.constant([len(ids)], tf.int32),
                          max_steps=max_steps, stop_threshold=s["stop_threshold"])
        n = int(res["lengths"][0])
        if not bool(res["stopped"][0]):
            log(f"warning: sentence {i} never reached the stop threshold; cut at synthesize.max_seconds "
                f"= {s['max_seconds']} s (the model may need more training)")
        mel = res["mel"][0, :n].numpy() * std + mean  # back to log-mel
        audio = griffin_lim(mel, iters=s["griffin_lim_iters"], **a)
        path = out / f"{i:02d}.wav"
        save_wav(path, np.asarray(audio), a["sample_rate"])
        log(f"{path}: {n * a['hop_length'] / a['sample_rate']:.2f} s"
            f"{f', {dropped} characters outside the vocabulary dropped' if dropped else ''}: {sentence!r}")
        paths.append(str(path))
    config.atomic_write_text(out / "sentences.json", json.dumps(
        {"checkpoint": latest, "samples": dict(zip(paths, s["sentences"]))}, indent=1))
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
