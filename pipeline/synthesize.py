"""Speak the config's held-out sentences with the latest checkpoint: runs/{name}/samples/NN.wav + NN.npy.

    python -m pipeline.synthesize --config configs/config.yaml --out runs/demo/samples
    snakemake synthesize --config 'synthesize={pace: 1.2}'

Reads runs/{name}/checkpoints (the model only) and what the run carries, runs/{name}/run.json
(pipeline/runinfo.py: its vocabulary, mel statistics and the `model:`, `text:` and `audio:` it was
trained with; never the current cache index, which may have been rebuilt since), config keys
`synthesize:` (sentences, max_seconds, pace, pitch_shift, griffin_lim_iters). Any model kind works: each
sentence is one compiled `model.infer` call (docs/models.md), never a Python loop over frames.
Writes NN.wav (Griffin-Lim, TensorFlow STFT ops), NN.npy (the log-mel, float32 (frames, n_mels),
the project's HiFi-GAN-compatible mel, so any HiFi-GAN trained on it can voice it) and
sentences.json (checkpoint, step, pace, pitch shift, text and length of each sample).

    from pipeline.synthesize import load_synthesizer
    synth = load_synthesizer(cfg)          # MissingCheckpoint when nothing is trained
    log_mel = synth.mel("Hello there.")    # np.float32 (frames, n_mels)
"""
import argparse
import functools
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline import config, models, runinfo, text
from pipeline.errors import MissingCheckpoint, cli
from pipeline.models import vocoders
from pipeline.vocoder import save_wav


class Synthesizer:
    """A trained model with its vocabulary and mel statistics. `.checkpoint`, `.step`, `.mel(text)`."""

    def __init__(self, cfg, model, checkpoint, info, log=print):
        self.cfg, self.model, self.checkpoint, self.log = cfg, model, checkpoint, log
        self.step = int(re.search(r"ckpt-(\d+)$", checkpoint).group(1))
        self.vocab, self.audio = info["vocab"], info["config"]["audio"]  # the run's own
        self.model_kind = info["config"]["model"]["kind"]
        self.mean, self.std = info["stats"]["mel_mean"], info["stats"]["mel_std"]
        a = self.audio
        self.max_frames = int(np.ceil(cfg["synthesize"]["max_seconds"] * a["sample_rate"] / a["hop_length"]))

    def encode(self, sentence):
        """Token ids of a sentence with the cache's text front end."""
        return text.encode(sentence, self.vocab)  # as training mapped it; TextError naming what it cannot say

    def infer(self, sentence, pace=None, pitch_shift=None):
        """The model's outputs for one sentence (one compiled call), mel denormalised to log-mel."""
        s = self.cfg["synthesize"]
        ids = self.encode(sentence)
        out = self.model.infer(tf.constant([ids], tf.int32), tf.constant([len(ids)], tf.int32),
                               pace=s["pace"] if pace is None else pace,
                               pitch_shift=s["pitch_shift"] if pitch_shift is None else pitch_shift,
                               max_frames=self.max_frames)
        n = int(out["lengths"][0])
        mel = out["mel"][0, :n].numpy().astype(np.float32) * self.std + self.mean   # (frames, n_mels) log-mel
        return {"mel": mel, "frames": n, "cut": n >= self.max_frames, "tokens": len(ids)}

    def mel(self, sentence):
        """Log-mel (frames, n_mels) float32 for `sentence`, honouring synthesize.pace and pitch_shift."""
        return self.infer(sentence)["mel"]


def load_synthesizer(cfg, log=functools.partial(print, flush=True)):
    """The Synthesizer of the latest checkpoint in runs/{name}/checkpoints (MissingCheckpoint if none),
    built from what the run carries (runs/{name}/run.json)."""
    run = config.run_dir(cfg)
    latest = tf.train.latest_checkpoint(str(run / "checkpoints"))
    if latest is None:
        raise MissingCheckpoint(f"{run / 'checkpoints'}: no checkpoint; train first (`snakemake --cores all train`)")
    info = runinfo.load(run)
    model_cfg = info["config"]["model"]
    model = models.build(model_cfg, info["vocab"], info["n_mels"])
    r = models.frame_multiple(model_cfg)
    model(models.dummy_batch(8, 4 * r, info["n_mels"]))  # create the variables, then fill them
    tf.train.Checkpoint(model=model).restore(latest).expect_partial()
    return Synthesizer(cfg, model, latest, info, log)


def synthesize(cfg, out, log=functools.partial(print, flush=True)):
    """Every sentence into a temporary folder beside `out`, then moved into `out`, sentences.json
    last: a failure leaves the previous samples as they were (the rule's one output is sentences.json,
    so Snakemake deletes nothing else before the job)."""
    final = Path(out)
    out = config.temporary(final)
    try:
        samples = _synthesize_into(cfg, out, final, log)
        final.mkdir(parents=True, exist_ok=True)
        for name in sorted(p.name for p in out.iterdir()):  # sentences.json sorts after NN.npy/wav
            os.replace(out / name, final / name)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return samples


def _synthesize_into(cfg, out, final, log):
    """Write the samples into folder `out`; what sentences.json records are their paths in `final`."""
    synth = load_synthesizer(cfg, log)
    vocode = vocoders.load(cfg)  # the run's trained vocoder, or Griffin-Lim with vocoder.kind griffin_lim
    s, a = cfg["synthesize"], synth.audio
    out.mkdir(parents=True, exist_ok=True)
    log(f"synthesizing {len(s['sentences'])} sentences from {synth.checkpoint} "
        f"(pace {s['pace']}, pitch shift {s['pitch_shift']} semitones)")
    samples = []
    for i, sentence in enumerate(s["sentences"]):
        res = synth.infer(sentence)
        if res["cut"]:
            log(f"warning: sentence {i} was cut at synthesize.max_seconds = {s['max_seconds']} s")
        audio = vocode(res["mel"])
        path = out / f"{i:02d}.wav"
        save_wav(path, np.asarray(audio), a["sample_rate"])
        config.atomic_write_bytes(path.with_suffix(".npy"), _npy_bytes(res["mel"]))
        seconds = res["frames"] * a["hop_length"] / a["sample_rate"]
        log(f"{final / path.name}: {seconds:.2f} s, {res['tokens']} tokens: {sentence!r}")
        samples.append({"wav": str(final / path.name), "mel": str(final / f"{i:02d}.npy"), "text": sentence,
                        "frames": res["frames"], "seconds": round(seconds, 3)})
    config.atomic_write_text(out / "sentences.json", json.dumps(
        {"checkpoint": synth.checkpoint, "step": synth.step, "model": synth.model_kind, "pace": s["pace"],
         "pitch_shift": s["pitch_shift"], "vocoder": {"kind": vocode.kind, "steps": vocode.steps,
                                                       "finetune_steps": vocode.finetune_steps},
         "samples": samples}, indent=1))
    return [x["wav"] for x in samples]


def _npy_bytes(array):
    import io
    buf = io.BytesIO()
    np.save(buf, np.asarray(array, np.float32))
    return buf.getvalue()


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Synthesize the config's sentences from the latest checkpoint.")
    config.add_arguments(parser)
    parser.add_argument("--out", help="folder for the wavs and mels (default runs/{name}/samples)")
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    synthesize(cfg, args.out or config.run_dir(cfg) / "samples")


if __name__ == "__main__":
    main()
