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
    """(the worker's shards, its batch size, bucket weights, lift) for worker=(index, count).

    Shard k belongs to worker k % count, so workers read disjoint shards. train.batch_size is the
    global batch: each worker batches batch_size / count. Every worker must run the same bucket
    shape at each step (the step's collectives are traced per shape), so all draw the bucket
    sequence from the same seed, weighted by each bucket's train clips over all workers. A bucket
    some worker has no clip of cannot be drawn, so its clips train in a larger bucket's shape
    instead (`lift`: bucket -> the bucket whose shape it trains in; see `lift_buckets`): no clip is
    left out.
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
    if not per_worker.sum(axis=1).all():
        raise CacheError(f"{config.cache_dir(cfg)}: worker(s) {np.flatnonzero(per_worker.sum(axis=1) == 0).tolist()} "
                         f"of {count} hold no training clip (shard k belongs to worker k % {count}); use fewer "
                         f"workers or more cache.shards")
    lift = lift_buckets(per_worker)
    weights = np.bincount(lift, weights=per_worker.sum(axis=0), minlength=len(edges)).astype(np.float64)
    return [int(k) for k in shards_held if k % count == index], batch // count, weights / weights.sum(), lift


def lift_buckets(per_worker):
    """per_worker (workers, buckets) train clip counts -> lift (buckets,): the bucket whose shape each
    bucket's clips train in. Going up from the shortest, a bucket some worker has no clip of joins the
    next larger one, until every worker has clips in the merged set; the longest buckets, if still
    short of a worker, join the last complete set (a shape only ever grows, so nothing is cut)."""
    n = per_worker.shape[1]
    lift = np.arange(n)
    pending, have, last = [], np.zeros(per_worker.shape[0], np.int64), None
    for b in range(n):
        pending.append(b)
        have += per_worker[:, b]
        if (have > 0).all():
            lift[pending] = b
            last, pending, have = b, [], np.zeros_like(have)
    if pending:  # the longest buckets lack a worker: they and the last complete set train at the top shape
        merged = pending + ([] if last is None else np.flatnonzero(lift == last).tolist())
        lift[merged] = pending[-1]
    return lift


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
    # not converted by AutoGraph: it would write the lambda's source to $TMPDIR, left there if the job is killed
    choice = tf.data.Dataset.random(seed=seed).map(tf.autograph.experimental.do_not_convert(
        lambda x: tf.random.stateless_categorical(logits, 1, tf.stack([x, tf.constant(seed, tf.int64)]))[0, 0]))
    return tf.data.Dataset.choose_from_datasets(streams, choice)
