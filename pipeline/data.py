"""The training input pipeline: shard caches -> bucketed, padded batches, with no Python per example.

`build_dataset(cfg, split)` reads each shard's `.bin` with tf.io.read_file + tf.io.decode_raw and
slices examples out of it by the offsets in the shard's JSON; the JSON, the index and the file
sizes are checked once, in Python, when the dataset is built, never per example. Examples are
shuffled across shards (interleave over shuffled shards) and within them (a shuffle buffer),
grouped by length into `train.buckets` fixed (tokens, frames) shapes so a compiled step sees at
most that many shapes, and batched. Mels stay float16, as stored, and unnormalised: the training
step normalises them on the model device with `mel_stats(cfg)`, so the host moves half the bytes.

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

PAD_LOG_MEL = float(np.log(1e-5))  # padded frames look like silence to the model


class CacheError(ValueError):
    """A cache that must not be trained on; the message names the shard or file and what to run."""


@dataclass
class Clips:
    """Every usable clip of a split, as flat columns (one row per clip)."""
    ids: list
    shard: np.ndarray       # which shard holds it
    tok_off: np.ndarray     # offset (in tokens) inside the shard's token file
    tok_len: np.ndarray
    mel_off: np.ndarray     # offset (in frames) inside the shard's mel file
    frames: np.ndarray


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


def load_clips(cfg, split, index=None):
    """(Clips of `split`, token paths, mel paths), every shard checked against the index."""
    index = index or read_index(cfg)
    root = config.cache_dir(cfg)
    n_mels = index["n_mels"]
    cols = {k: [] for k in ("ids", "shard", "tok_off", "tok_len", "mel_off", "frames")}
    tok_paths, mel_paths = [], []
    for k, entry in enumerate(index["shards"]):
        tpath, mpath = root / f"{entry['tokens']}.bin", root / f"{entry['mels']}.bin"
        tok = json.loads(tpath.with_suffix(".json").read_text()) if tpath.with_suffix(".json").exists() else None
        mel = json.loads(mpath.with_suffix(".json").read_text()) if mpath.with_suffix(".json").exists() else None
        if tok is None or mel is None:
            raise CacheError(f"{tpath if tok is None else mpath}: shard index missing; rerun `snakemake caches`")
        _check_shard(tok, tpath, index["provenance"]["tokens"], 4, 1)
        _check_shard(mel, mpath, index["provenance"]["mels"], 2, n_mels)
        tok_at = {cid: i for i, cid in enumerate(tok["ids"])}
        for j, cid in enumerate(mel["ids"]):
            i = tok_at.get(cid)
            if i is None:
                continue
            is_val = dataset.is_validation(cid, index["val_fraction"])
            if split != "all" and is_val != (split == "val"):
                continue
            for name, value in (("ids", cid), ("shard", k), ("tok_off", tok["offsets"][i]),
                                ("tok_len", tok["lengths"][i]), ("mel_off", mel["offsets"][j]),
                                ("frames", mel["frames"][j])):
                cols[name].append(value)
        tok_paths.append(str(tpath)); mel_paths.append(str(mpath))
    clips = Clips(ids=cols.pop("ids"), **{k: np.asarray(v, np.int64) for k, v in cols.items()})
    return clips, tok_paths, mel_paths


def bucket_shapes(cfg, index=None):
    """[(max tokens, max frames)] per bucket, from every clip of both splits, frames rounded up to r.

    Boundaries are frame-count quantiles, so buckets hold similar numbers of clips; each bucket's
    token length is the longest text among its clips, because text and audio lengths differ.
    """
    all_clips, _, _ = load_clips(cfg, "all", index)
    if not all_clips.ids:
        raise CacheError(f"{config.cache_dir(cfg)}: the cache holds no clips")
    r = cfg["model"]["reduction"]
    n = min(cfg["train"]["buckets"], len(all_clips.ids))
    edges = np.unique(np.quantile(all_clips.frames, np.linspace(0, 1, n + 1)[1:]).astype(np.int64))
    bucket = np.searchsorted(edges, all_clips.frames)  # clip -> bucket index
    shapes = []
    for b, edge in enumerate(edges):
        in_b = bucket == b
        tokens = int(all_clips.tok_len[in_b].max()) if in_b.any() else 1
        shapes.append((tokens, int(-(-edge // r) * r)))
    return edges, shapes


def build_dataset(cfg, split="train", *, repeat=None, shuffle=None, with_clip_index=False, drop_remainder=None):
    """tf.data.Dataset of dict batches for `split` ("train", "val" or "all"); see the module doc.

    Training (the default for split="train") repeats forever, shuffles and drops incomplete
    batches, so every batch has one of the bucket shapes exactly.
    """
    train = split == "train"
    repeat = train if repeat is None else repeat
    shuffle = train if shuffle is None else shuffle
    drop_remainder = train if drop_remainder is None else drop_remainder
    index = read_index(cfg)
    clips, tok_paths, mel_paths = load_clips(cfg, split, index)
    if not clips.ids:
        raise CacheError(f"{config.cache_dir(cfg)}: no clips in the {split!r} split")
    edges, shapes = bucket_shapes(cfg, index)
    n_mels, batch = index["n_mels"], cfg["train"]["batch_size"]
    seed = cfg["train"]["seed"]
    if drop_remainder and len(clips.ids) < batch:
        raise CacheError(f"the {split!r} split has {len(clips.ids)} clips, fewer than train.batch_size {batch}")

    order = np.argsort(clips.shard, kind="stable")
    shards_used = np.unique(clips.shard)
    # per shard: rows of (clip index, tok_off, tok_len, mel_off, frames, bucket), as one ragged table
    rows = np.stack([np.arange(len(clips.ids)), clips.tok_off, clips.tok_len, clips.mel_off, clips.frames,
                     np.searchsorted(edges, clips.frames)], axis=1)[order]
    table = tf.RaggedTensor.from_value_rowids(tf.constant(rows, tf.int64), clips.shard[order],
                                              nrows=len(tok_paths))
    tok_files, mel_files = tf.constant(tok_paths), tf.constant(mel_paths)
    max_tokens = tf.constant([s[0] for s in shapes], tf.int64)
    max_frames = tf.constant([s[1] for s in shapes], tf.int64)

    def shard_examples(k):
        tokens = tf.io.decode_raw(tf.io.read_file(tok_files[k]), tf.int32)  # all of the shard's tokens
        mels = tf.reshape(tf.io.decode_raw(tf.io.read_file(mel_files[k]), tf.float16), [-1, n_mels])
        ds = tf.data.Dataset.from_tensor_slices(table[k])
        if shuffle:
            ds = ds.shuffle(4096, seed=seed)

        def example(row):
            _, t_off, t_len, m_off, n_frames, b = tf.unstack(row)
            t_pad, f_pad = max_tokens[b] - t_len, max_frames[b] - n_frames
            out = {
                "tokens": tf.pad(tokens[t_off:t_off + t_len], [[0, t_pad]]),  # (T_b,)
                "token_lengths": tf.cast(t_len, tf.int32),
                "mel": tf.pad(mels[m_off:m_off + n_frames], [[0, f_pad], [0, 0]],
                              constant_values=PAD_LOG_MEL),  # (F_b, n_mels)
                "mel_lengths": tf.cast(n_frames, tf.int32),
                "bucket": b,
            }
            if with_clip_index:
                out["clip"] = tf.cast(row[0], tf.int32)
            return out

        return ds.map(example)

    shard_ds = tf.data.Dataset.from_tensor_slices(tf.constant(shards_used, tf.int64))
    if shuffle:
        shard_ds = shard_ds.shuffle(len(shards_used), seed=seed)
    if repeat:
        shard_ds = shard_ds.repeat()
    ds = shard_ds.interleave(shard_examples, cycle_length=min(4, len(shards_used)), block_length=8,
                             num_parallel_calls=tf.data.AUTOTUNE, deterministic=not shuffle)
    if shuffle:
        ds = ds.shuffle(cfg["train"]["shuffle_buffer"], seed=seed)

    def batch_bucket(key, window):
        return window.batch(batch, drop_remainder=drop_remainder)

    ds = ds.group_by_window(key_func=lambda ex: ex["bucket"], reduce_func=batch_bucket, window_size=batch)
    ds = ds.map(lambda b: {k: v for k, v in b.items() if k != "bucket"})
    options = tf.data.Options()
    options.deterministic = not shuffle
    options.autotune.enabled = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def clip_ids(cfg, split):
    """The ids behind the `clip` field of `build_dataset(..., with_clip_index=True)`."""
    return load_clips(cfg, split)[0].ids
