"""Ground-truth-aligned (GTA) mels for vocoder fine-tuning: one shard's clips through the trained
acoustic model, teacher-forced with their cached durations, pitch and energy (transformer_tts: with
the recorded mel as decoder input), so each predicted mel has exactly the recorded frame count. With
several speakers or languages, each clip in its own (its pitch normalised with its speaker's
statistics), as training saw it, normalised with the statistics the run trained with (its run.json),
not the cache's, which a dataset edit moves. Clips of similar lengths go through the model together
(`teacher_forced_mels`).

Reads the token, mel, energy, pitch (and duration) shards of one shard and the acoustic model's
latest checkpoint (runs/{name}/checkpoints); writes runs/{name}/gta/shard-NNN.{bin,json} (kind
`gta`, float16 log-mel, the mel shard's ids and lengths) whose provenance names the checkpoint and
its weights.

    python -m pipeline.vocoder.gta --config configs/config.yaml --shard 3 --out runs/demo/gta/shard-003

Config keys: model.*, audio.n_mels, cache.*, dataset.* (via the caches).
Runs on the CPU (`placement.cpu_only`): the rule asks no GPU turn, so it never takes GPU memory from
a training job beside it, and two of its jobs share a 2-core machine (`threads: 1`).
"""
import argparse
import functools

import numpy as np
import tensorflow as tf

from pipeline import config, data, placement, runinfo, shards
from pipeline.errors import PipelineError, cli
from pipeline.synthesize import load_synthesizer
from pipeline.train import normalise

_print = functools.partial(print, flush=True)


GTA_BATCH = 16  # clips a teacher-forced call, of similar lengths: eagerly, one call costs about as much as
                # one clip's (~0.3 s of Python for the demo's FastPitch), and padding changes no output


def _padded(rows, key, width, value=0):
    """rows' arrays under `key` padded with `value` along their first axis to `width` and stacked."""
    return np.stack([np.pad(x[key], [(0, width - len(x[key]))] + [(0, 0)] * (x[key].ndim - 1), constant_values=value)
                     for x in rows])


def teacher_forced_mels(model, clips, norm, batch_size=GTA_BATCH):
    """The model's teacher-forced mels (frames, n_mels) normalised, one per clip, in the clips' order.
    clips: [{tokens (T,) model ids, mels (F, n_mels) log-mel, pitch (F,) Hz, energy (F,), and durations
    (T,), speaker, language (ids) where the model takes them}]. Clips of similar lengths go through the
    model together, padded (tokens to the longest, frames to the longest rounded up to the model's
    frame_multiple); each clip's mel has exactly its recorded frames."""
    r = getattr(model, "frame_multiple", 1)
    order = sorted(range(len(clips)), key=lambda i: len(clips[i]["mels"]))
    out = [None] * len(clips)
    for start in range(0, len(order), batch_size):
        rows = [clips[i] for i in order[start:start + batch_size]]
        frames = [len(x["mels"]) for x in rows]
        width = -(-max(frames) // r) * r
        tokens = max(len(x["tokens"]) for x in rows)
        batch = {"tokens": _padded(rows, "tokens", tokens).astype(np.int32),
                 "token_lengths": np.array([len(x["tokens"]) for x in rows], np.int32),
                 "mel": _padded(rows, "mels", width, data.PAD_LOG_MEL).astype(np.float32),
                 "mel_lengths": np.array(frames, np.int32),
                 "pitch": _padded(rows, "pitch", width).astype(np.float32),
                 "energy": _padded(rows, "energy", width).astype(np.float32)}
        if "durations" in rows[0]:
            batch["durations"] = _padded(rows, "durations", tokens).astype(np.int32)
        for field in ("speaker", "language"):
            if field in rows[0]:
                batch[field] = np.array([x[field] for x in rows], np.int32)
        mel = model(normalise({k: tf.constant(v) for k, v in batch.items()}, norm), training=False)["mel"].numpy()
        for j, i in enumerate(order[start:start + batch_size]):
            out[i] = mel[j, :frames[j]]
    return out


def gta_provenance(cfg, checkpoint):
    """What a GTA shard's mels depend on: the mel cache's provenance, the acoustic checkpoint's weights (not
    only its path: a model retrained to the same step makes other mels) and this module's code. The
    fine-tuning's resume key holds the shards' checksums instead: mels that came out the same resume."""
    return shards.digest(shards.provenance("mels", cfg), runinfo.checkpoint_identity(checkpoint),
                         shards.code_digest("vocoder/gta.py"))


def _voices(synth, tokens_meta):
    """{field: ({name: id} of the run's table, the token shard's name per clip)}: each clip in its own voice,
    the run's tables as training gave the ids (data.load_clips), for the fields the run tells apart."""
    return {f: ({name: i for i, name in enumerate(names)}, tokens_meta[f + "s"]) for f, names in
            (("speaker", synth.speakers), ("language", synth.languages))
            if f in runinfo.voice_fields(synth.info) and f + "s" in tokens_meta}


def _voice_ids(clip_id, voices, row, tokens_json, run):
    """{field: the run's id} of the clip at token-shard `row`; a voice the run's table lacks is an error,
    not the first voice (which would pair one voice's mels with another's audio)."""
    out = {}
    for field, (table_of, names) in voices.items():
        if names[row] not in table_of:
            raise PipelineError(f"{tokens_json}: {clip_id}'s {field} {names[row]!r} is not in the run's {field}s "
                                f"{sorted(table_of)} ({runinfo.path(run)}); the run was trained before this voice "
                                f"was in the cache: train it again or give it another `name`")
        out[field] = table_of[names[row]]
    return out


def _gta_clips(cfg, synth, read, jsons):
    """(ids, clips, left_out) of one shard's clips: `left_out` ({id, path, stage, reason}) the clips GTA mels are
    not made for: those the durations stage rejected (acoustic training left them out: their durations do not
    fit their audio) and those missing from a shard; the fine-tuning's loader skips them (vocoder.segments)."""
    at = {k: {cid: i for i, cid in enumerate(meta["ids"])} for k, (meta, _) in read.items()}
    table, tokens_meta = data.token_table(synth.vocab), read["tokens"][0]
    voices, kinds = _voices(synth, tokens_meta), list(read)
    rejected = {r["id"]: r for r in read["durations"][0].get("rejected", ())} if "durations" in read else {}
    ids, clips, left_out = [], [], []
    for cid in read["mels"][0]["ids"]:
        missing = [k for k in kinds if cid not in at[k]]
        if cid in rejected or missing:
            left_out.append(dict(rejected[cid]) if cid in rejected else dict(
                id=cid, path=str(jsons[missing[0]]), stage="gta",
                reason=f"not in the {missing[0]} shard"))
            continue
        clip = {k: read[k][1][at[k][cid]] for k in kinds}
        clip["tokens"] = table[clip["tokens"]]
        clip.update(_voice_ids(cid, voices, at["tokens"][cid], jsons["tokens"], config.run_dir(cfg)))
        ids.append(cid)
        clips.append(clip)
    return ids, clips, left_out


def build_gta_shard(cfg, shard, out, log=_print):
    synth = load_synthesizer(cfg, log=log)
    model, root = synth.model, config.cache_dir(cfg)
    kinds = ["tokens", "mels", "energy", "pitch"] + (["durations"] if "durations" in model.needs else [])
    prefixes = {k: shards.prefix(root, k, shard) for k in kinds}
    read = {k: shards.read(prefix, k) for k, prefix in prefixes.items()}
    # the statistics the model was trained with (its run.json), not the cache's: after a dataset edit
    # they differ, and the model must see its inputs as training normalised them
    norm = {k: tf.constant(np.asarray(v, np.float32)) for k, v in synth.info["stats"].items()}
    ids, clips, left_out = _gta_clips(cfg, synth, read, {k: p.with_suffix(".json") for k, p in prefixes.items()})
    mels = [(m * synth.std + synth.mean).astype(np.float16)                          # (frames, n_mels) log-mel
            for m in teacher_forced_mels(model, clips, norm)]
    # `weights`: which weights made these mels, kept with them, so a summary names them even after
    # the checkpoint's path holds others (pipeline/vocoder/train.py _gta_from)
    shards.write(out, "gta", ids, mels, provenance=gta_provenance(cfg, synth.checkpoint), width=cfg["audio"]["n_mels"],
                 rejected=left_out, checkpoint=synth.checkpoint, weights=runinfo.checkpoint_identity(synth.checkpoint))
    err = np.mean([np.abs(m.astype(np.float32) - c["mels"].astype(np.float32)).mean()
                   for c, m in zip(clips, mels)]) if ids else float("nan")
    log(f"gta shard {shard}: {len(ids)} clips from {synth.checkpoint}, mean |GTA - recorded| {err:.3f} (log-mel)"
        + (f"; {len(left_out)} left out (listed in {out}.json's `rejected`)" if left_out else ""))


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
