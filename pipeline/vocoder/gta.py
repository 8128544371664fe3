"""Ground-truth-aligned (GTA) mels for vocoder fine-tuning: one shard's clips through the trained
acoustic model, teacher-forced with their cached durations, pitch and energy (transformer_tts: with
the recorded mel as decoder input), so each predicted mel has exactly the recorded frame count.

Reads the token, mel, energy, pitch (and duration) shards of one shard and the acoustic model's
latest checkpoint (runs/{name}/checkpoints); writes runs/{name}/gta/shard-NNN.{bin,json} (kind
`gta`, float16 log-mel, the mel shard's ids and lengths) whose provenance names the checkpoint and
its weights.

    python -m pipeline.vocoder.gta --config configs/config.yaml --shard 3 --out runs/demo/gta/shard-003

Config keys: model.*, audio.n_mels, cache.*, dataset.* (via the caches), synthesize.max_seconds.
Runs on the CPU (`placement.cpu_only`): the rule asks no GPU turn, so it never takes GPU memory from
a training job beside it, and two of its jobs share a 2-core machine (`threads: 1`).
"""
import argparse
import functools

import numpy as np
import tensorflow as tf

from pipeline import config, data, placement, runinfo, shards
from pipeline.errors import cli
from pipeline.synthesize import load_synthesizer
from pipeline.train import normalise

_print = functools.partial(print, flush=True)


def build_gta_shard(cfg, shard, out, log=_print):
    synth = load_synthesizer(cfg, log=log)
    model, root = synth.model, config.cache_dir(cfg)
    r = getattr(model, "frame_multiple", 1)
    kinds = ["tokens", "mels", "energy", "pitch"] + (["durations"] if "durations" in model.needs else [])
    read = {k: shards.read(shards.prefix(root, k, shard), k) for k in kinds}
    at = {k: {cid: i for i, cid in enumerate(meta["ids"])} for k, (meta, _) in read.items()}
    table = data.token_table(synth.vocab)
    norm = {k: tf.constant(v, tf.float32) for k, v in data.feature_stats(cfg).items()}
    ids, mels = [], []
    for cid in read["mels"][0]["ids"]:
        if not all(cid in at[k] for k in kinds):
            continue
        arr = {k: read[k][1][at[k][cid]] for k in kinds}
        frames = len(arr["mels"])
        padded = -(-frames // r) * r
        pad = [[0, padded - frames]]
        batch = {"tokens": tf.constant(table[arr["tokens"]][None]), "token_lengths": tf.constant([len(arr["tokens"])], tf.int32),
                 "mel": tf.constant(np.pad(arr["mels"].astype(np.float32), pad + [[0, 0]], constant_values=data.PAD_LOG_MEL)[None]),
                 "mel_lengths": tf.constant([frames], tf.int32),
                 "pitch": tf.constant(np.pad(arr["pitch"], pad)[None]), "energy": tf.constant(np.pad(arr["energy"], pad)[None])}
        if "durations" in arr:
            batch["durations"] = tf.constant(arr["durations"][None])
        predicted = model(normalise(batch, norm), training=False)["mel"][0, :frames].numpy()
        ids.append(cid)
        mels.append((predicted * synth.std + synth.mean).astype(np.float16))          # (frames, n_mels) log-mel
    # the checkpoint's weights, not only its path: a model retrained to the same step makes other GTA mels
    provenance = shards.digest(shards.provenance("mels", cfg), runinfo.checkpoint_identity(synth.checkpoint))
    shards.write(out, "gta", ids, mels, provenance=provenance, width=cfg["audio"]["n_mels"], checkpoint=synth.checkpoint)
    err = np.mean([np.abs(m.astype(np.float32) - read["mels"][1][at["mels"][c]].astype(np.float32)).mean()
                   for c, m in zip(ids, mels)]) if ids else float("nan")
    log(f"gta shard {shard}: {len(ids)} clips from {synth.checkpoint}, mean |GTA - recorded| {err:.3f} (log-mel)")


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Teacher-forced (GTA) mels of one shard for vocoder fine-tuning.")
    config.add_arguments(parser)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--out", required=True, help="shard path without suffix")
    args = parser.parse_args(argv)
    placement.cpu_only()  # teacher-forced inference of one shard: the CPU is enough, the GPU turn is train's
    cfg = config.from_args(args)
    build_gta_shard(cfg, args.shard, args.out)


if __name__ == "__main__":
    main()
