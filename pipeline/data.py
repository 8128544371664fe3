"""The training input pipeline: shard caches -> bucketed, padded batches, with no Python per example.

`build_dataset(cfg, split)` reads shard `.bin` files with tf.io.read_file + tf.io.decode_raw and
gathers examples out of them by the offsets in the shards' JSON; the JSON, the index and the file
sizes are checked once, in Python, when the dataset is built, never per example. Shards are read
in groups of about GROUP_BYTES (all of LJSpeech's mels fit in two): a group's index rows are
shuffled across its shards, grouped by length into `train.buckets` fixed (tokens, frames) shapes
so a compiled step sees at most that many shapes, batched, and each batch is assembled by ONE
vectorised gather from the group's arrays (not ~20 ops per example), which is what makes the loader
faster than padding the same arrays from RAM. Mels stay float16, as stored, and unnormalised: the
training step normalises them on the model device with `mel_stats(cfg)`, so the host moves half
the bytes.

Batches are dicts: tokens int32 [B, T], token_lengths int32 [B], mel float16 [B, F, n_mels],
mel_lengths int32 [B] (F a multiple of model.reduction, padding = log(1e-5), i.e. silence).
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline import config, dataset
from pipeline.models import frame_multiple
from pipeline.errors import PipelineError

PAD_LOG_MEL = float(np.log(1e-5))  # padded frames look like silence to the model
GROUP_BYTES = 1 << 30  # shards are read in groups of about this size; a batch mixes clips of one group


class CacheError(PipelineError):
    """A cache that must not be trained on; the message names the shard or file and what to run."""


@dataclass
class Clips:
    """Usable clips as flat columns (one row per clip)."""
    ids: list
    shard: np.ndarray       # which shard holds it
    tok_off: np.ndarray     # offset (in tokens) inside the shard's token file
    tok_len: np.ndarray
    mel_off: np.ndarray     # offset (in frames) inside the shard's mel file
    frames: np.ndarray
    val: np.ndarray         # in the validation split

    def split(self, name):
        """The rows of split `name`: "train", "val" or "all"."""
        keep = np.ones(len(self.ids), bool) if name == "all" else self.val == (name == "val")
        return Clips(ids=[i for i, k in zip(self.ids, keep) if k],
                     **{f: getattr(self, f)[keep] for f in ("shard", "tok_off", "tok_len", "mel_off", "frames", "val")})


def read_index(cfg):
    path = config.cache_dir(cfg) / "index.json"
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CacheError(f"{path}: no cache index; build it with `snakemake --cores all caches`") from None
    for kind in ("tokens", "mels"):
        want = dataset.provenance(kind, cfg)
        if index["provenance"][kind] != want:
            section = "text" if kind == "tokens" else "audio"
            raise CacheError(f"{path}: the {kind} cache was built with other `{section}:` settings or code "
                             f"than the current config; rerun `snakemake --cores all caches`")
    return index


def mel_stats(cfg, index=None):
    """(mean, std) float32 [n_mels] of the train split's log-mels, from the index."""
    index = index or read_index(cfg)
    return np.asarray(index["mel_mean"], np.float32), np.asarray(index["mel_std"], np.float32)


def _check_shard(meta, path, want, itemsize, per_item):
    if meta["provenance"] != want:
        raise CacheError(f"{path}: built with other settings than the index (provenance {meta['provenance']} "
                         f"!= {want}); rerun `snakemake --cores all caches`")
    lengths = meta["lengths"] if meta["kind"] == "tokens" else meta["frames"]
    expected = sum(lengths) * per_item * itemsize
    if meta["bytes"] != expected:
        raise CacheError(f"{path}: index records {meta['bytes']} bytes but its lengths add up to {expected}")
    size = os.path.getsize(path) if os.path.exists(path) else None
    if size != expected:
        raise CacheError(f"{path}: {size} bytes on disk, {expected} expected (truncated or corrupted); "
                         "delete it and rerun `snakemake --cores all caches`")


def load_clips(cfg, split="all", index=None):
    """(Clips of `split`, token paths, mel paths), every shard checked against the index."""
    index = index or read_index(cfg)
    root = config.cache_dir(cfg)
    cols = {k: [] for k in ("ids", "shard", "tok_off", "tok_len", "mel_off", "frames", "val")}
    tok_paths, mel_paths = [], []
    for k, entry in enumerate(index["shards"]):
        tpath, mpath = root / f"{entry['tokens']}.bin", root / f"{entry['mels']}.bin"
        tok = json.loads(tpath.with_suffix(".json").read_text()) if tpath.with_suffix(".json").exists() else None
        mel = json.loads(mpath.with_suffix(".json").read_text()) if mpath.with_suffix(".json").exists() else None
        if tok is None or mel is None:
            raise CacheError(f"{tpath if tok is None else mpath}: shard index missing; rerun `snakemake caches`")
        _check_shard(tok, tpath, index["provenance"]["tokens"], 4, 1)
        _check_shard(mel, mpath, index["provenance"]["mels"], 2, index["n_mels"])
        tok_at = {cid: i for i, cid in enumerate(tok["ids"])}
        for j, cid in enumerate(mel["ids"]):
            i = tok_at.get(cid)
            if i is None:
                continue
            for name, value in (("ids", cid), ("shard", k), ("tok_off", tok["offsets"][i]),
                                ("tok_len", tok["lengths"][i]), ("mel_off", mel["offsets"][j]),
                                ("frames", mel["frames"][j]),
                                ("val", dataset.is_validation(cid, index["val_fraction"]))):
                cols[name].append(value)
        tok_paths.append(str(tpath)); mel_paths.append(str(mpath))
    clips = Clips(ids=cols.pop("ids"), val=np.asarray(cols.pop("val"), bool),
                  **{k: np.asarray(v, np.int64) for k, v in cols.items()})
    return clips.split(split), tok_paths, mel_paths


def bucket_shapes(cfg, index=None, clips=None):
    """(frame edges, [(max tokens, max frames)] per bucket), from every clip of both splits
    (`clips`, or the cache's), frames rounded up to r.

    Boundaries are frame-count quantiles, so buckets hold similar numbers of clips; each bucket's
    token length is the longest text among its clips, because text and audio lengths differ.
    """
    clips = clips or load_clips(cfg, "all", index)[0]
    if not clips.ids:
        raise CacheError(f"{config.cache_dir(cfg)}: the cache holds no clips")
    r = frame_multiple(cfg["model"])
    n = min(cfg["train"]["buckets"], len(clips.ids))
    edges = np.unique(np.quantile(clips.frames, np.linspace(0, 1, n + 1)[1:]).astype(np.int64))
    bucket = np.searchsorted(edges, clips.frames)  # clip -> bucket index
    shapes = []
    for b, edge in enumerate(edges):
        in_b = bucket == b
        tokens = int(clips.tok_len[in_b].max()) if in_b.any() else 1
        shapes.append((tokens, int(-(-edge // r) * r)))
    return edges, shapes


def shard_groups(sizes, group_bytes):
    """Consecutive shards packed into groups of about `group_bytes` (at least one shard each)."""
    groups, current, total = [], [], 0
    for k, size in enumerate(sizes):
        if current and total + size > group_bytes:
            groups.append(current)
            current, total = [], 0
        current.append(k)
        total += size
    return groups + [current] if current else groups


def build_dataset(cfg, split="train", *, repeat=None, shuffle=None, with_clip_index=False, drop_remainder=None,
                  group_bytes=GROUP_BYTES):
    """tf.data.Dataset of dict batches for `split` ("train", "val" or "all"); see the module doc.

    Training (the default for split="train") repeats forever, shuffles and drops incomplete
    batches, so every batch has one of the bucket shapes exactly.
    """
    train = split == "train"
    repeat = train if repeat is None else repeat
    shuffle = train if shuffle is None else shuffle
    drop_remainder = train if drop_remainder is None else drop_remainder
    everything, tok_paths, mel_paths = load_clips(cfg, "all")
    clips = everything.split(split)
    if not clips.ids:
        raise CacheError(f"{config.cache_dir(cfg)}: no clips in the {split!r} split")
    edges, shapes = bucket_shapes(cfg, clips=everything)
    n_mels, batch = cfg["audio"]["n_mels"], cfg["train"]["batch_size"]
    seed = cfg["train"]["seed"]
    if drop_remainder and len(clips.ids) < batch:
        raise CacheError(f"the {split!r} split has {len(clips.ids)} clips, fewer than train.batch_size {batch}")

    # Shards are read a group at a time (one read_file + decode_raw per file) and a group's arrays
    # concatenated; rows are rebased into them: (clip index, tok_off, tok_len, mel_off, frames, bucket)
    sizes = [os.path.getsize(t) + os.path.getsize(m) for t, m in zip(tok_paths, mel_paths)]
    groups = [g for g in shard_groups(sizes, group_bytes) if np.isin(clips.shard, g).any()]
    tok_len = [os.path.getsize(p) // 4 for p in tok_paths]
    mel_len = [os.path.getsize(p) // (2 * n_mels) for p in mel_paths]
    endless = repeat and len(groups) == 1  # one group: its rows repeat, so no batch remainder is ever lost
    rng = np.random.default_rng(seed)
    group_rows, group_files = [], []
    for g in groups:
        tok_base = dict(zip(g, np.cumsum([0] + [tok_len[k] for k in g])))
        mel_base = dict(zip(g, np.cumsum([0] + [mel_len[k] for k in g])))
        pick = np.flatnonzero(np.isin(clips.shard, g))
        group_rows.append(np.stack([pick, clips.tok_off[pick] + [tok_base[k] for k in clips.shard[pick]],
                                    clips.tok_len[pick], clips.mel_off[pick] + [mel_base[k] for k in clips.shard[pick]],
                                    clips.frames[pick], np.searchsorted(edges, clips.frames[pick])], axis=1))
        if drop_remainder and not endless:
            # complete each bucket's last batch with clips drawn again from the same bucket, so a
            # group's epoch drops nothing (and a small group still yields batches)
            rows, fill = group_rows[-1], []
            for b in np.unique(rows[:, 5]):
                in_b = np.flatnonzero(rows[:, 5] == b)
                fill.append(rows[rng.choice(in_b, -len(in_b) % batch)])
            group_rows[-1] = np.concatenate([rows, *fill])
        group_files.append(g)
    rows_table = tf.ragged.constant([r.tolist() for r in group_rows], dtype=tf.int64, ragged_rank=1)
    files_table = tf.ragged.constant([[tok_paths[k] for k in g] for g in group_files]), \
        tf.ragged.constant([[mel_paths[k] for k in g] for g in group_files])
    max_tokens = tf.constant([s[0] for s in shapes], tf.int64)
    max_frames = tf.constant([s[1] for s in shapes], tf.int64)

    def read_all(files, dtype):
        blobs = tf.map_fn(tf.io.read_file, files, fn_output_signature=tf.string)
        return tf.io.decode_raw(tf.strings.reduce_join(blobs), dtype)  # the files' arrays, concatenated

    def group_batches(g):
        tokens = read_all(files_table[0][g], tf.int32)                          # (group tokens,)
        mels = tf.reshape(read_all(files_table[1][g], tf.float16), [-1, n_mels])  # (group frames, n_mels)
        rows = tf.data.Dataset.from_tensor_slices(rows_table[g])
        if shuffle:
            rows = rows.shuffle(max(len(r) for r in group_rows), seed=seed)  # across the group's shards
        if endless:
            rows = rows.repeat()
        rows = rows.group_by_window(key_func=lambda r: r[5], window_size=batch,
                                    reduce_func=lambda key, w: w.batch(batch, drop_remainder=drop_remainder))

        def gather(r):  # one vectorised gather per batch, padded to the bucket's shape
            n, b = tf.shape(r, out_type=tf.int64)[0], r[0, 5]
            tok = tf.gather(tokens, tf.ragged.range(r[:, 1], r[:, 1] + r[:, 2]))
            mel = tf.gather(mels, tf.ragged.range(r[:, 3], r[:, 3] + r[:, 4]))
            out = {"tokens": tok.to_tensor(0, shape=tf.stack([n, max_tokens[b]])),            # (B, T_b)
                   "token_lengths": tf.cast(r[:, 2], tf.int32),
                   "mel": mel.to_tensor(tf.constant(PAD_LOG_MEL, tf.float16),
                                        shape=tf.stack([n, max_frames[b], n_mels])),        # (B, F_b, n_mels)
                   "mel_lengths": tf.cast(r[:, 4], tf.int32)}
            if with_clip_index:
                out["clip"] = tf.cast(r[:, 0], tf.int32)
            return out

        return rows.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)

    group_ids = tf.data.Dataset.range(len(groups))
    if shuffle:
        group_ids = group_ids.shuffle(len(groups), seed=seed)
    if repeat and not endless:
        group_ids = group_ids.repeat()
    # two groups in flight: the next group is read while batches come from the current one
    ds = group_ids.interleave(group_batches, cycle_length=min(2, len(groups)), num_parallel_calls=min(2, len(groups)),
                              deterministic=not shuffle)
    options = tf.data.Options()
    options.deterministic = not shuffle
    options.autotune.enabled = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def clip_ids(cfg, split):
    """The ids behind the `clip` field of `build_dataset(..., with_clip_index=True)`."""
    return load_clips(cfg, split)[0].ids
