"""The vocoder's input pipeline: random hop-aligned (mel, audio, F0) crops from the shard caches.

`build_segments(cfg, split)` reads the mel (or GTA) shards, the audio shards (the waveform cut to
the mel's frame grid, written by mel_shard) and the pitch shards (F0 in Hz per mel frame, 0
unvoiced) with tf.io.read_file + tf.io.decode_raw, once, and makes every batch by gathers alone: no
Python op, one static shape [B, S, n_mels] / [B, S*hop] / [B, S] (S = vocoder.segment_frames,
B = vocoder.batch_size), so a compiled step traces once.

Training batches are a pure function of (train.seed, step): batch i picks B clips and one crop
start each with stateless random numbers, so a run resumed at step i (`start_step=i`) sees exactly
the batches an uninterrupted run would. Crop t of a clip is frames [t, t+S) of its mel and F0 and samples
[t*hop, (t+S)*hop) of its audio: `pipeline.audio` computes that mel from those samples on every
interior frame (the edge frames see reflect padding instead of their neighbours). A clip shorter
than S frames is padded (mel with log(1e-5), silence; audio with zeros; F0 0), never dropped; how many
were padded is logged when the dataset is built. The validation split (repeat=False) gives each
clip once, its middle crop, in batches of up to B.

The split's shards are held in memory (float32 audio: about 4 bytes x 22050 a second of speech,
~7.6 GB for LJSpeech).

Config keys: audio.n_mels, audio.hop_length, vocoder.segment_frames, vocoder.batch_size, train.seed,
dataset.val_fraction (via the index).
"""
import functools
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline import config, shards
from pipeline.audio import LOG_CLAMP
from pipeline.data import load_clips, loader_options, read_index, verified
from pipeline.shards import CacheError

PAD_LOG_MEL = float(np.log(LOG_CLAMP))  # padding is silence, as in the acoustic loader

SOURCES = ("recorded", "gta")
_print = functools.partial(print, flush=True)


def gta_prefix(cfg, shard):
    """runs/{name}/gta/shard-NNN: the acoustic model's teacher-forced mels of one shard."""
    return shards.prefix(config.run_dir(cfg), "gta", shard)


def _offsets(cfg, index, clips, kind, prefix_of, length_of, read=None):
    """Per clip of `clips`, its offset (items) in shard `prefix_of(k)` of `kind`, checking its length.
    `read`: {index position: the shard's JSON} already read (each is read once)."""
    out = np.zeros(len(clips.ids), np.int64)
    where, metas = {}, {}
    for pos in np.unique(clips.shard):
        entry = index["shards"][pos]
        prefix = prefix_of(entry["shard"])
        meta = metas[pos] = (read or {}).get(pos) or shards.read_meta(prefix, kind)
        shards.check(meta, prefix)
        where[pos] = (prefix, {cid: (o, n) for cid, o, n in zip(meta["ids"], meta["offsets"], meta["lengths"])})
    for i, (cid, pos) in enumerate(zip(clips.ids, clips.shard)):
        prefix, table = where[pos]
        if cid not in table or table[cid][1] != length_of(clips.frames[i]):
            have = table[cid][1] if cid in table else "no"
            raise CacheError(f"{prefix}.json: {cid} has {have} {kind} items, its mel has {clips.frames[i]} frames "
                             f"(expected {length_of(clips.frames[i])}); run `{shards.KINDS[kind].target}`")
        out[i] = table[cid][0]
    files = [str(where[pos][0].with_suffix(".bin")) for pos in sorted(where)]
    rebase = dict(zip(sorted(where), np.cumsum([0] + [sum(metas[pos]["lengths"]) for pos in sorted(where)])))  # items
    sums = [shards.checksum_int64(metas[pos]["checksum"]) for pos in sorted(where)]
    return out + np.array([rebase[p] for p in clips.shard], np.int64), files, sums


def _cached_offsets(paths, kind, clips, item_bytes):
    """(offset of each clip in the concatenated `kind` shards of its split, [those shards' .bin paths],
    [their checksums as int64])."""
    present = sorted(set(clips.shard.tolist()))
    sizes = np.cumsum([0] + [shards.read_meta(Path(paths[kind][p]).with_suffix(""))["bytes"] // item_bytes
                             for p in present])
    base = dict(zip(present, sizes))
    return (clips.offsets[kind] + np.array([base[p] for p in clips.shard], np.int64), [paths[kind][p] for p in present],
            [clips.checksums[kind][p] for p in present])


def _with_gta_mels(cfg, index, clips, log):
    """(`clips` less those the GTA shards left out (their `rejected`: clips the durations stage rejected, which
    acoustic training left out too), {index position: the GTA shard's JSON}, for _offsets). A clip neither in a
    GTA shard nor listed there stays: a GTA shard older than the cache, which `_offsets` names with what to run.
    A shard of another width than audio.n_mels (made at other settings) is a CacheError: its frames would be
    cut at the wrong bytes and paired with the audio as silently as right ones."""
    left, metas, n_mels = {}, {}, cfg["audio"]["n_mels"]
    for pos in np.unique(clips.shard):
        prefix = gta_prefix(cfg, index["shards"][pos]["shard"])
        meta = metas[pos] = shards.read_meta(prefix, "gta")
        if meta.get("width") != n_mels:
            raise CacheError(f"{prefix}.json: GTA mels of {meta.get('width')} bins, audio.n_mels is {n_mels} (made at "
                             f"other settings); run `{shards.KINDS['gta'].target}`")
        left.update((r["id"], r.get("reason", "")) for r in meta.get("rejected", ()) if r.get("id") not in meta["ids"])
    dropped = [cid for cid in clips.ids if cid in left]
    if dropped:
        log(f"segments: {len(dropped)} of {len(clips.ids)} clips have no GTA mel (listed in their GTA shard's "
            f"`rejected`, e.g. {dropped[0]}: {left[dropped[0]]}): left out of fine-tuning")
    return clips.take(np.array([i for i, cid in enumerate(clips.ids) if cid not in left], np.int64)), metas


def _sources(cfg, split, source, log, recorded=False):
    """(Clips of the split, {"mel", "audio", "f0"}: (per-clip offsets, shard .bin files, their checksums)) of the caches;
    with `recorded` (source "gta"), also "recorded": the recorded mels'."""
    index = read_index(cfg)
    clips, paths = load_clips(cfg, split, index)
    gta_metas = {}
    if source == "gta":
        clips, gta_metas = _with_gta_mels(cfg, index, clips, log)
    if not clips.ids:
        raise CacheError(f"{config.cache_dir(cfg)}: no clips in the {split!r} split")
    root, hop, n_mels = config.cache_dir(cfg), cfg["audio"]["hop_length"], cfg["audio"]["n_mels"]
    where = {"f0": _cached_offsets(paths, "pitch", clips, 4)}                        # float32 Hz per frame
    if source == "recorded" or recorded:
        where["recorded"] = _cached_offsets(paths, "mels", clips, 2 * n_mels)        # float16 frames
    if source == "recorded":
        where["mel"] = where.pop("recorded")
    else:
        where["mel"] = _offsets(cfg, index, clips, "gta", lambda k: gta_prefix(cfg, k), lambda f: f, gta_metas)
    where["audio"] = _offsets(cfg, index, clips, "audio", lambda k: shards.prefix(root, "audio", k), lambda f: f * hop)
    S = cfg["vocoder"]["segment_frames"]
    short = int(np.sum(clips.frames < S))
    if short:
        log(f"segments: {short} of {len(clips.ids)} {split} clips are shorter than vocoder.segment_frames {S}: "
            f"padded (mel with silence, audio with zeros, F0 unvoiced)")
    return clips, where


def _read(parts, dtype):
    """The files' bytes, concatenated, as one flat tensor of `dtype` (read_file + decode_raw: no Python op).
    parts: [(files, their checksums as int64, the target that rebuilds them)]; each file's checksum is
    checked in the graph as the acoustic loader checks it (data.verified): damage stops the read."""
    blobs = []
    for files, sums, target in parts:
        names = tf.constant([str(f) for f in files])
        read = tf.map_fn(tf.io.read_file, names, fn_output_signature=tf.string)
        blobs.append(verified(read, names, tf.constant(sums, tf.int64), target))
    return tf.io.decode_raw(tf.strings.reduce_join(tf.concat(blobs, 0)), dtype)


def _cropper(table, S, hop):
    """crops(mel, wav, f0, idx, u[, alternate]) -> one batch dict: clip rows `idx` (b,), crop starts at `u`
    (b,) in [0, 1) of each clip's room, each row's mel from the table's fifth column where `alternate`
    (b,) is true; frames [t, t+S) of mel and f0 and samples [t*hop, (t+S)*hop) of the audio, by the
    same start t, so the three stay paired."""
    def crops(mel, wav, f0, idx, u, alternate=None):
        rows = tf.gather(table, idx)                                                  # (b, 4|5) mel, audio, f0, frames[, alt mel]
        if alternate is not None:                                                     # (b,) bool: the row's other mel
            rows = tf.concat([tf.where(alternate[:, None], rows[:, 4:5], rows[:, :1]), rows[:, 1:4]], 1)
        frames = rows[:, 3]
        start = tf.cast(u * tf.cast(tf.maximum(frames - S, 0) + 1, tf.float32), tf.int64)  # (b,)
        start = tf.minimum(start, tf.maximum(frames - S, 0))
        t = tf.range(S, dtype=tf.int64)[None]                                         # (1, S)
        keep = t < (frames - start)[:, None]                                          # (b, S)
        fi = tf.where(keep, rows[:, :1] + start[:, None] + t, 0)
        m = tf.where(keep[..., None], tf.cast(tf.gather(mel, fi), tf.float32), PAD_LOG_MEL)  # (b, S, n_mels)
        pi = tf.where(keep, rows[:, 2:3] + start[:, None] + t, 0)
        p = tf.where(keep, tf.gather(f0, pi), 0.0)                                    # (b, S) Hz, padding unvoiced
        s = tf.range(S * hop, dtype=tf.int64)[None]                                   # (1, S*hop)
        keep_s = s < ((frames - start) * hop)[:, None]
        si = tf.where(keep_s, rows[:, 1:2] + start[:, None] * hop + s, 0)
        a = tf.where(keep_s, tf.gather(wav, si), 0.0)                                 # (b, S*hop)
        return {"mel": m, "audio": a, "f0": p}
    return crops


def build_segments(cfg, split="train", *, source="recorded", recorded_fraction=0.0, repeat=None, start_step=0,
                   batch_size=None, log=_print):
    """tf.data.Dataset of dict batches `mel` float32 [B, S, n_mels], `audio` float32 [B, S*hop] and
    `f0` float32 [B, S] (Hz from the pitch cache, 0 unvoiced), the three from the same crop.

    split: "train", "val" or "all"; source: "recorded" (the mel caches) or "gta" (runs/{name}/gta);
    recorded_fraction (source "gta", repeated crops only): each crop's mel is the recorded one instead,
    same frames, with this probability (a stateless draw per crop, so still a function of the step);
    repeat (default: split == "train"): endless stateless-random crops from `start_step` on, else
    each clip once (its middle crop). CacheError naming the shard and what to run when one is missing.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {source!r}")
    repeat = split == "train" if repeat is None else repeat
    hop, n_mels = cfg["audio"]["hop_length"], cfg["audio"]["n_mels"]
    S, B = cfg["vocoder"]["segment_frames"], batch_size or cfg["vocoder"]["batch_size"]
    if not 0.0 <= recorded_fraction <= 1.0:
        raise ValueError(f"recorded_fraction must be in [0, 1], not {recorded_fraction!r}")
    mix = source == "gta" and repeat and recorded_fraction > 0
    clips, where = _sources(cfg, split, source, log, recorded=mix)
    columns = [where["mel"][0], where["audio"][0], where["f0"][0], clips.frames]
    part = {k: (where[k][1], where[k][2], shards.KINDS[kind].target) for k, kind in
            (("mel", source if source == "gta" else "mels"), ("audio", "audio"), ("f0", "pitch"), ("recorded", "mels"))
            if k in where}
    mel_parts = [part["mel"]]
    if mix:  # the recorded mels follow the GTA ones in one array: their rows are shifted past them
        columns.append(where["recorded"][0] + sum(Path(f).stat().st_size for f in part["mel"][0]) // (2 * n_mels))
        mel_parts.append(part["recorded"])
    table = tf.constant(np.stack(columns, 1), tf.int64)
    n_clips, seed = len(clips.ids), cfg["train"]["seed"]
    crops = _cropper(table, S, hop)

    @tf.autograph.experimental.do_not_convert  # no Python branch on a tensor here: see data._interleave_groups
    def from_arrays(_):
        mel = tf.reshape(_read(mel_parts, tf.float16), [-1, n_mels])                  # (all frames, n_mels)
        wav = _read([part["audio"]], tf.float32)                                      # (all samples,)
        f0 = _read([part["f0"]], tf.float32)                                          # (all frames,)
        if repeat:
            def batch(step):
                idx = tf.random.stateless_uniform([B], seed=tf.stack([seed, step]), maxval=n_clips, dtype=tf.int64)
                u = tf.random.stateless_uniform([B], seed=tf.stack([seed + 1, step]))
                if not mix:
                    return crops(mel, wav, f0, idx, u)
                alternate = tf.random.stateless_uniform([B], seed=tf.stack([seed + 2, step])) < recorded_fraction
                return crops(mel, wav, f0, idx, u, alternate)
            steps = tf.data.Dataset.range(start_step, np.iinfo(np.int64).max)
            return steps.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        rows = tf.data.Dataset.range(n_clips).batch(B)
        return rows.map(lambda idx: crops(mel, wav, f0, idx, tf.fill(tf.shape(idx), 0.5)))

    ds = tf.data.Dataset.range(1).flat_map(from_arrays)
    return ds.with_options(loader_options()).prefetch(tf.data.AUTOTUNE)
