"""How multi-worker training shares the cache: whose shards, what batch, which bucket at each step.

`pipeline.data.build_worker_dataset(cfg, (index, count))` uses these two functions; the
trainer calls it under `train.placement: multiworker` (docs/scaling.md). Reads nothing
itself; config keys train.batch_size, train.seed, cache.shards (through the clips it is given).
"""
import numpy as np
import tensorflow as tf

from pipeline import config
from pipeline.shards import CacheError


def worker_share(cfg, clips, edges, worker):
    """(the worker's shards, its batch size, bucket weights) for worker=(index, count).

    Shard k belongs to worker k % count, so workers read disjoint shards. train.batch_size is the
    global batch: each worker batches batch_size / count. Every worker must run the same bucket
    shape at each step (the step's collectives are traced per shape), so all draw the bucket
    sequence from the same seed, weighted by each bucket's train clips over all workers; a bucket
    some worker has no clip of is never drawn.
    """
    index, count = worker
    owner = clips.shard % count
    shards_held = np.unique(clips.shard)
    if len(shards_held) < count:
        raise CacheError(f"cache.shards: only {len(shards_held)} shards hold training clips, fewer than the {count} "
                         f"workers; set cache.shards to at least {count} and rerun `snakemake --cores all caches`")
    batch = cfg["train"]["batch_size"]
    if batch % count:
        raise config.ConfigError(f"train.batch_size: {batch} is not divisible by the {count} workers "
                                 f"(it is the global batch; each worker takes an equal share)")
    bucket = np.searchsorted(edges, clips.frames)
    per_worker = np.array([np.bincount(bucket[owner == w], minlength=len(edges)) for w in range(count)])
    weights = np.where(per_worker.min(axis=0) > 0, per_worker.sum(axis=0), 0).astype(np.float64)
    if not weights.any():
        raise CacheError(f"{config.cache_dir(cfg)}: no length bucket has training clips on all {count} workers; "
                         f"use fewer workers or fewer train.buckets")
    return [int(k) for k in shards_held if k % count == index], batch // count, weights / weights.sum()


def aligned_batches(rows, bucket_col, weights, batch, seed, index):
    """Batches of row-table rows (B, columns) whose bucket (column `bucket_col`) at each step follows the
    seeded sequence every worker shares; each bucket's rows are reshuffled and repeated forever."""
    streams = []
    for b in range(len(weights)):
        in_b = rows[rows[:, bucket_col] == b]
        if len(in_b) == 0:
            in_b = rows[:1]  # never drawn (weight 0); keeps the stream list aligned with bucket ids
        streams.append(tf.data.Dataset.from_tensor_slices(in_b).shuffle(len(in_b), seed=seed + 1 + index)
                       .repeat().batch(batch, drop_remainder=True))
    logits = tf.math.log(tf.constant(weights, tf.float32))[None]  # (1, buckets); log 0 = never drawn
    choice = tf.data.Dataset.random(seed=seed).map(
        lambda x: tf.random.stateless_categorical(logits, 1, tf.stack([x, tf.constant(seed, tf.int64)]))[0, 0])
    return tf.data.Dataset.choose_from_datasets(streams, choice)
