"""The vocoders behind one interface, picked by `vocoder.kind` (docs/vocoder.md).

    from pipeline.vocoder import kinds
    gen = kinds.build(cfg["vocoder"], cfg["audio"])   # a keras.Model: mel [B, F, n_mels] -> audio [B, F*hop]
    vocode = kinds.load(cfg)                          # the run's final trained vocoder (or Griffin-Lim)
    audio = vocode(log_mel)                              # (F, n_mels) natural-log mel -> float32 (F*hop,)

Kinds: `vocos` (vocos.py), `hifigan` (hifigan.py, V1/V2 by vocoder.hifigan.size), `griffin_lim`
(pipeline/vocoder/griffin_lim.py, no training).
A trainable kind is `build(vocoder_cfg, audio_cfg) -> keras.Model` taking the caches' log-mel
(float32, unnormalised) and returning float32 audio of exactly F * hop_length samples; the
spectral, adversarial and feature-matching losses are shared (discriminators.py).
"""
import json
import os
import re

import numpy as np
import tensorflow as tf

from pipeline import config
from pipeline.errors import MissingCheckpoint
from pipeline.registry import Registry
from pipeline.vocoder import hifigan, vocos

# build(vocoder_cfg, audio_cfg) -> keras.Model for the trained kinds; None: no training (Griffin-Lim)
KINDS = Registry("vocoder.kind", config.ConfigError, what="kind", build=None)
KINDS.add("vocos", build=vocos.build)
KINDS.add("hifigan", build=hifigan.build)
KINDS.add("griffin_lim")


def build(vocoder_cfg, audio_cfg):
    kind = KINDS.get(vocoder_cfg["kind"])
    if kind.build is None:
        raise config.ConfigError(f"vocoder.kind: {kind.name!r} has no trainable model "
                                 f"(trained kinds: {', '.join(k for k in KINDS if KINDS.get(k).build)})")
    model = kind.build(vocoder_cfg, audio_cfg)
    model(tf.zeros([1, 8, audio_cfg["n_mels"]]))  # create the variables
    return model


def summary_path(cfg):
    """runs/{name}/vocoder.json: the final vocoder's summary (kind, steps, checkpoint)."""
    return config.run_dir(cfg) / "vocoder.json"


def step_of(checkpoint):
    return int(re.search(r"ckpt-(\d+)$", str(checkpoint)).group(1))


class Vocoder:
    """A callable log-mel (F, n_mels) -> float32 audio (F*hop,), with `.kind`, `.steps`, `.finetune_steps`."""

    def __init__(self, cfg, model=None, summary=None):
        self.cfg, self.model, self.kind = cfg, model, cfg["vocoder"]["kind"]
        self.summary = summary or {}
        self.steps = self.summary.get("steps", 0)
        self.finetune_steps = self.summary.get("finetune_steps", 0)
        if model is not None:
            self._call = tf.function(lambda m: model(m, training=False), reduce_retracing=True)

    def __call__(self, log_mel):
        log_mel = np.asarray(log_mel, np.float32)
        if self.model is None:
            from pipeline.vocoder.griffin_lim import griffin_lim
            return griffin_lim(log_mel, **self.cfg["audio"], iters=self.cfg["synthesize"]["griffin_lim_iters"]).numpy()
        return self._call(tf.constant(log_mel[None]))[0].numpy()


def load(cfg, summary=None):
    """The run's final vocoder from runs/{name}/vocoder.json, or Griffin-Lim with vocoder.kind griffin_lim.
    MissingCheckpoint naming the file and what to run when it is not trained yet."""
    if KINDS.get(cfg["vocoder"]["kind"]).build is None:
        return Vocoder(cfg)
    path = summary or summary_path(cfg)
    try:
        info = json.loads(open(path, encoding="utf-8").read())
    except FileNotFoundError:
        raise MissingCheckpoint(f"{path}: no trained vocoder; run `snakemake --cores all vocoder`") from None
    if info.get("kind") != cfg["vocoder"]["kind"]:
        raise MissingCheckpoint(f"{path}: a {info.get('kind')} vocoder, the config says vocoder.kind "
                                f"{cfg['vocoder']['kind']}; run `snakemake --cores all vocoder`")
    if not os.path.exists(f"{info['checkpoint']}.index"):
        raise MissingCheckpoint(f"{path}: its checkpoint {info['checkpoint']} is gone (pruned or deleted); "
                                f"run `snakemake --cores all vocoder`")
    model = build(cfg["vocoder"], cfg["audio"])
    tf.train.Checkpoint(generator=model).restore(info["checkpoint"]).expect_partial()
    return Vocoder(cfg, model, info)
