"""The training input pipeline: shard caches -> bucketed, padded batches, with no Python per example.

`build_dataset(cfg, split)` reads shard `.bin` files with tf.io.read_file + tf.io.decode_raw and
gathers examples out of them by the offsets in the shards' JSON (pipeline/shards.py owns the
format); the JSON, the index and the file sizes are checked once, in Python, when the dataset is
built, never per example, and each file's checksum in the graph when the iterator first reads the
whole file (tf.fingerprint against the shard JSON's; a mismatch fails with the shard's name and the
command that rebuilds it; later epochs re-read the same files unhashed). Shards are read in
groups of about GROUP_BYTES (all of LJSpeech fits in two): a group's index rows are shuffled
across its shards (anew each epoch), grouped by length into `train.buckets` fixed (tokens, frames)
shapes so a compiled step sees at most that many shapes, batched, and each batch is assembled
by ONE vectorised gather per field from the group's arrays. Mels stay float16, as stored, and
unnormalised: the training step normalises on the model device with `feature_stats(cfg)`, so the
host moves half the bytes.

Batches are dicts: tokens int32 [B, T] (vocabulary ids: token shards hold code points, mapped by
one table gather per group), token_lengths int32 [B], mel float16 [B, F, n_mels] (padding =
log(1e-5), silence), mel_lengths int32 [B], pitch float32 [B, F] (Hz, 0 = unvoiced or padding),
energy float32 [B, F] (0 = padding); with durations=True also durations int32 [B, T] (frames per
token, rows summing to mel_lengths); with several speakers (languages) in the index, speaker
(language) int32 [B]: the clip's position in the index's sorted `speakers` (`languages`). F is a multiple of `models.frame_multiple(cfg["model"])`.

Clips are left out here, once, in Python: those cache_index lists under `excluded` (audio too
short for its text) and, with durations, those the duration shards reject (`left_out` lists them
all, with their stage and reason). `build_worker_dataset(cfg, (index, count))` is multi-worker
training's builder: one worker's shards, every worker on the same bucket shape at each step.
"""
import dataclasses
import functools
import os
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from pipeline import config, manifest, multiworker_data, shards
from pipeline.models import frame_multiple
from pipeline.shards import CacheError  # noqa: F401  (re-exported: callers catch data.CacheError)

PAD_LOG_MEL = float(np.log(1e-5))  # padded frames look like silence to the model
GROUP_BYTES = 1 << 30  # shards are read in groups of about this size; a batch mixes clips of one group
FRAME_KINDS = ("mels", "energy", "pitch")  # one row per mel frame, same ids and counts
SPLITS = ("train", "val", "all")  # what every loader's `split` names (val: held out by id hash)
_print = functools.partial(print, flush=True)
ROW = {name: i for i, name in enumerate(  # the columns of a group's row table
    ("clip", "tokens", "n_tokens", "mels", "frames", "bucket", "energy", "pitch", "durations", "speaker", "language"))}


def read_index(cfg):
    """index.json, refused (CacheError saying what to run) when built by other code or settings."""
    path = config.cache_dir(cfg) / "index.json"
    index = shards.read_index_json(path)
    if index.get("format") != shards.FORMAT:
        raise CacheError(f"{path}: a cache in format {index.get('format')} (this code reads format {shards.FORMAT}, with "
                         f"phonemes, pitch and energy); rebuild it with `{shards.REBUILD}`")
    for kind in shards.CACHE_KINDS:
        shards.check_provenance(path, kind, index["provenance"][kind], shards.provenance(kind, cfg))
    shards.refuse_bad_audio(path, index)  # built with dataset.bad_audio: fail while clips had bad audio
    return index


def feature_stats(cfg, index=None):
    """Train-split statistics from the index: mel_mean/mel_std float32 [n_mels]; pitch_mean/pitch_std
    (Hz, voiced frames), energy_mean/energy_std floats."""
    index = index or read_index(cfg)
    out = {k: np.asarray(index[k], np.float32) for k in ("mel_mean", "mel_std")}
    out.update({k: float(index[k]) for k in ("pitch_mean", "pitch_std", "energy_mean", "energy_std")})
    if "speaker" in voice_fields(index):  # speaker_pitch_mean/std float32 [speakers], in the index's order
        for k in ("pitch_mean", "pitch_std"):
            out[f"speaker_{k}"] = np.asarray([index["speaker_stats"][s][k] for s in index["speakers"]], np.float32)
    return out


def mel_stats(cfg, index=None):
    """(mean, std) float32 [n_mels] of the train split's log-mels, from the index."""
    s = feature_stats(cfg, index)
    return s["mel_mean"], s["mel_std"]


@dataclass
class Clips:
    """Usable clips as flat columns (one row per clip); offsets in items of each kind's shard."""
    ids: list
    shard: np.ndarray       # which shard holds it
    val: np.ndarray         # in the validation split
    n_tokens: np.ndarray
    frames: np.ndarray
    offsets: dict = field(default_factory=dict)  # kind -> offsets inside that kind's shard
    checksums: dict = field(default_factory=dict)  # kind -> the shard JSONs' checksums, one per shard
    speaker: np.ndarray = None  # index into the index's `speakers`
    language: np.ndarray = None  # index into the index's `languages`

    def split(self, name):
        """The rows of split `name`: "train", "val" or "all" (ValueError for any other name: "valid" or
        "test" once gave the training clips, which a score then counted as held out)."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {name!r}")
        keep = np.ones(len(self.ids), bool) if name == "all" else self.val == (name == "val")
        return self.take(np.flatnonzero(keep))

    def take(self, rows):
        """These rows (integer positions, repeats allowed)."""
        return Clips(ids=[self.ids[i] for i in rows], shard=self.shard[rows], val=self.val[rows],
                     n_tokens=self.n_tokens[rows], frames=self.frames[rows],
                     offsets={k: v[rows] for k, v in self.offsets.items()},
                     speaker=self.speaker[rows], language=self.language[rows], checksums=self.checksums)

    def balanced(self):
        """Speaker-balanced rows (train.balance: speaker): each clip repeated round(largest speaker's
        clips / its speaker's clips) times, so every speaker is about as often in an epoch."""
        counts = np.bincount(self.speaker)
        reps = np.maximum(np.round(counts.max() / counts[self.speaker]), 1).astype(np.int64)
        return self.take(np.repeat(np.arange(len(self.ids)), reps))


def _shard_metas(root, entry, kinds, index):
    """{kind: (meta, prefix)} of one index entry, each checked against the index and its .bin."""
    out = {}
    for kind in kinds:
        if kind == "durations":
            prefix = shards.prefix(root, "durations", entry["shard"])
            meta = shards.read_meta(prefix, "durations")
            shards.check(meta, prefix)
        else:
            prefix = root / entry[kind]
            meta = shards.read_meta(prefix, kind)
            shards.check(meta, prefix, index["provenance"][kind])
        out[kind] = (meta, prefix)
    return out


def _check_durations(meta, tok, prefix, mel_frames, made_from=None):
    """Durations must be made from the token and mel shards at hand (`made_from`: {kind: their JSON's
    path}; the duration shard's provenance holds those files' digests), cover the token shard 1:1 and
    sum to each clip's mel frames."""
    target = shards.KINDS["durations"].target
    made = meta["provenance"] if isinstance(meta["provenance"], dict) else {}
    for kind, path in (made_from or {}).items():
        if made.get(kind) != shards.file_digest(path):
            raise CacheError(f"{prefix}.json: durations aligned to another {path} than the one on disk (stale: "
                             f"its text or audio changed since); run `{target}`")
    if meta["ids"] != tok["ids"] or meta["lengths"] != tok["lengths"]:
        raise CacheError(f"{prefix}.json: durations for other clips or tokens than {tok['kind']} shard "
                         f"{prefix.name} (stale); run `{target}`")
    _, arrays = shards.read(prefix, "durations")
    for cid, d in zip(meta["ids"], arrays):
        if cid in mel_frames and int(d.sum()) != mel_frames[cid]:
            raise CacheError(f"{prefix}.bin: durations of {cid} sum to {int(d.sum())}, its mel has "
                             f"{mel_frames[cid]} frames (stale); run `{target}`")


def _check_entry(root, entry, metas, at, excluded):
    """CacheError unless the index was built from these shards: the checksums it recorded (indexes
    built since they record them) and the number of clips it counted in the shard (`at`: each kind's
    {clip id: position}, as load_clips made it)."""
    path = root / "index.json"
    for kind, want in entry.get("checksums", {}).items():
        if kind in metas and metas[kind][0]["checksum"] != want:
            raise CacheError(f"{path}: built from another {metas[kind][1]}.bin than the one on disk (a shard rebuilt "
                             f"after the index, or its index job did not finish); run `{shards.REBUILD}`")
    found = sum(cid not in excluded and all(cid in at[kind] for kind in shards.CACHE_KINDS)
                for cid in metas["mels"][0]["ids"])
    if found != entry["clips"]:
        raise CacheError(f"{path}: counts {entry['clips']} usable clips in shard {entry['shard']}, its shards hold "
                         f"{found} (a shard rebuilt after the index, or its index job did not finish); "
                         f"run `{shards.REBUILD}`")


def load_clips(cfg, split="all", index=None, durations=False):
    """(Clips of `split`, {kind: [.bin path per shard]}), every shard checked against the index."""
    index = index or read_index(cfg)
    root = config.cache_dir(cfg)
    kinds = shards.CACHE_KINDS + (("durations",) if durations else ())
    cols = {k: [] for k in ("ids", "shard", "val", "n_tokens", "frames", "speaker", "language", *kinds)}
    speaker_id = {name: i for i, name in enumerate(index.get("speakers", []))}
    language_id = {name: i for i, name in enumerate(index.get("languages", []))}
    paths = {k: [] for k in kinds}
    checksums = {k: [] for k in kinds}
    for k, entry in enumerate(index["shards"]):
        metas = _shard_metas(root, entry, kinds, index)
        tok, mel = metas["tokens"][0], metas["mels"][0]
        at = {kind: {cid: i for i, cid in enumerate(m["ids"])} for kind, (m, _) in metas.items()}
        mel_frames = dict(zip(mel["ids"], mel["lengths"]))
        left_out = set(entry.get("excluded", ()))  # cache_index: audio too short for the text
        _check_entry(root, entry, metas, at, left_out)
        if durations:
            _check_durations(metas["durations"][0], tok, metas["durations"][1], mel_frames,
                             {kind: metas[kind][1].with_suffix(".json") for kind in ("tokens", "mels")})
            left_out.update(r["id"] for r in metas["durations"][0].get("rejected", ()))
        for j, cid in enumerate(mel["ids"]):
            if cid in left_out or not all(cid in at[kind] for kind in kinds):
                continue
            for kind in ("energy", "pitch"):
                meta, prefix = metas[kind]
                if meta["lengths"][at[kind][cid]] != mel["lengths"][j]:
                    raise CacheError(f"{prefix}.json: {cid} has {meta['lengths'][at[kind][cid]]} {kind} frames but "
                                     f"{mel['lengths'][j]} mel frames; rerun `{shards.REBUILD}`")
            i = at["tokens"][cid]
            cols["ids"].append(cid); cols["shard"].append(k)
            cols["val"].append(manifest.is_validation(cid, index["val_fraction"]))
            cols["n_tokens"].append(tok["lengths"][i]); cols["frames"].append(mel["lengths"][j])
            cols["speaker"].append(speaker_id.get(tok["speakers"][i], 0) if "speakers" in tok else 0)
            cols["language"].append(language_id.get(tok["languages"][i], 0) if "languages" in tok else 0)
            for kind, (meta, _) in metas.items():
                cols[kind].append(meta["offsets"][at[kind][cid]])
        for kind, (meta, prefix) in metas.items():
            paths[kind].append(str(prefix.with_suffix(".bin")))
            checksums[kind].append(shards.checksum_int64(meta["checksum"]))
    clips = Clips(ids=cols["ids"], shard=np.asarray(cols["shard"], np.int64), val=np.asarray(cols["val"], bool),
                  n_tokens=np.asarray(cols["n_tokens"], np.int64), frames=np.asarray(cols["frames"], np.int64),
                  offsets={kind: np.asarray(cols[kind], np.int64) for kind in kinds}, checksums=checksums,
                  speaker=np.asarray(cols["speaker"], np.int64), language=np.asarray(cols["language"], np.int64))
    return clips.split(split), paths


def voice_tables(index):
    """{"speakers": [...], "languages": [...]}: the index's sorted name tables (what models.build takes)."""
    return {k: list(index.get(k, [])) for k in ("speakers", "languages")}


def voice_fields(index):
    """The batch fields a cache's clips differ by: ("speaker",) with several speakers, ("language",)
    with several languages, both, or () (a single-speaker corpus pays nothing)."""
    return tuple(f for f, table in (("speaker", "speakers"), ("language", "languages")) if len(index.get(table, [])) > 1)


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
        tokens = int(clips.n_tokens[in_b].max()) if in_b.any() else 1
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


def token_table(vocab):
    """int32 [max code point + 1]: vocabulary id of each symbol's code point (token shards hold code points)."""
    table = np.zeros(max(ord(s) for s in vocab["symbols"]) + 1, np.int32)
    for i, s in enumerate(vocab["symbols"]):
        table[ord(s)] = i
    return table


def _group_rows(clips, group, paths, edges, kinds, n_mels, batch, rng, complete, listed):
    """A group's row table (columns ROW): offsets rebased into the group's concatenated arrays.
    complete: repeat clips of each bucket so its last batch is full (nothing dropped per epoch).
    listed: each of `clips`' rows' position in clip_ids (the `clip` column: _Source.listed)."""
    width = {"mels": n_mels}
    base = {}
    for kind in kinds:
        items = [os.path.getsize(paths[kind][k]) // (np.dtype(shards.KINDS[kind].dtype).itemsize * width.get(kind, 1))
                 for k in group]
        base[kind] = dict(zip(group, np.cumsum([0] + items)))
    pick = np.flatnonzero(np.isin(clips.shard, group))
    rows = np.zeros((len(pick), len(ROW)), np.int64)
    rows[:, ROW["clip"]] = listed[pick]
    rows[:, ROW["n_tokens"]] = clips.n_tokens[pick]
    rows[:, ROW["frames"]] = clips.frames[pick]
    rows[:, ROW["bucket"]] = np.searchsorted(edges, clips.frames[pick])
    rows[:, ROW["speaker"]] = clips.speaker[pick]
    rows[:, ROW["language"]] = clips.language[pick]
    for kind in kinds:
        rows[:, ROW[kind]] = clips.offsets[kind][pick] + [base[kind][k] for k in clips.shard[pick]]
    if complete:
        fill = []
        for b in np.unique(rows[:, ROW["bucket"]]):
            in_b = np.flatnonzero(rows[:, ROW["bucket"]] == b)
            fill.append(rows[rng.choice(in_b, -len(in_b) % batch)])
        rows = np.concatenate([rows, *fill])
    return rows


@dataclass
class _Source:
    """What every builder needs: the split's clips, the bucket shapes and the shard files."""
    clips: Clips
    edges: np.ndarray
    shapes: list
    paths: dict
    table: np.ndarray  # code point -> vocabulary id
    voices: tuple = ()  # ("speaker", "language") fields, as voice_fields(index)
    listed: np.ndarray = None  # each clip's position in clip_ids(cfg, split): what the `clip` field holds

    @property
    def kinds(self):
        return tuple(self.paths)


def _source(cfg, split, durations, balance=False):
    index = read_index(cfg)
    everything, paths = load_clips(cfg, "all", index, durations=durations)
    clips = everything.split(split)
    if balance and split == "train":
        if "speaker" not in voice_fields(index):
            raise config.ConfigError(f"train.balance: speaker needs several speakers; the cache has "
                                     f"{index.get('speakers') or 'one'} (set train.balance: none)")
        clips = clips.balanced()  # more rows, the same static bucket shapes, no Python op
    if not clips.ids:
        raise CacheError(f"{config.cache_dir(cfg)}: no clips in the {split!r} split")
    # shapes from both splits (train and val agree), and with or without durations (clips the duration
    # shards leave out still shape the buckets), so every caller of bucket_shapes sees the same ones
    plain = load_clips(cfg, "all", index)[0] if durations else everything
    edges, shapes = bucket_shapes(cfg, clips=plain)
    # the `clip` field indexes clip_ids(cfg, split), which neither the duration shards' rejects nor
    # train.balance's repeats change: before, it indexed this list, so every id after a reject was another clip's
    at = {cid: i for i, cid in enumerate(plain.split(split).ids)}
    listed = np.asarray([at[cid] for cid in clips.ids], np.int64)
    return _Source(clips, edges, shapes, paths, token_table(index["vocab"]), voice_fields(index), listed)


def _group_arrays(src, groups, n_mels):
    """A function g -> {kind: the group's shards of that kind, concatenated} ((items,) or (items, n_mels)),
    token code points already mapped to ids by one table gather."""
    files = {kind: tf.ragged.constant([[src.paths[kind][k] for k in g] for g in groups]) for kind in src.kinds}
    sums = {kind: tf.ragged.constant([[src.clips.checksums[kind][k] for k in g] for g in groups], dtype=tf.int64)
            for kind in src.kinds}
    dtypes = {kind: tf.as_dtype(np.dtype(shards.KINDS[kind].dtype).newbyteorder("=")) for kind in src.kinds}
    table = tf.constant(src.table)

    def arrays(g, first=True):  # first: the iterator's first read of these files, checked (epoch 0)
        out = {}
        for kind in src.kinds:
            blobs = tf.map_fn(tf.io.read_file, files[kind][g], fn_output_signature=tf.string)
            check = functools.partial(verified, blobs, files[kind][g], sums[kind][g], shards.KINDS[kind].target)
            blobs = check() if first is True else tf.cond(first, check, lambda b=blobs: b)
            flat = tf.io.decode_raw(tf.strings.reduce_join(blobs), dtypes[kind])
            out[kind] = tf.reshape(flat, [-1, n_mels]) if kind == "mels" else flat
        out["tokens"] = tf.gather(table, out["tokens"])  # code points -> ids
        return out
    return arrays


def _gather_fn(src, arrays, n_mels, with_clip_index):
    return _padded_gather(arrays, src.kinds, tf.constant([s[0] for s in src.shapes], tf.int64),
                          tf.constant([s[1] for s in src.shapes], tf.int64), n_mels, with_clip_index, src.voices)


def build_dataset(cfg, split="train", *, repeat=None, shuffle=None, with_clip_index=False, drop_remainder=None,
                  group_bytes=GROUP_BYTES, durations=False, worker=None, balance=False):
    """tf.data.Dataset of dict batches for `split` ("train", "val" or "all"); see the module doc.

    Training (the default for split="train") repeats forever, shuffles and drops incomplete
    batches, so every batch has one of the bucket shapes exactly. durations=True adds the
    `durations` field (CacheError naming `snakemake --cores all durations` when they are missing).
    worker=(index, count): this worker's share, `build_worker_dataset` (multi-worker training).
    balance=True (the trainer's, with train.balance: speaker): speaker-balanced train rows (Clips.balanced).
    """
    if worker is not None:
        if split != "train" or repeat is False:
            raise ValueError("build_dataset(worker=...) is for the repeating train split")
        return build_worker_dataset(cfg, worker, durations=durations, with_clip_index=with_clip_index,
                                    balance=balance)
    train = split == "train"
    repeat, shuffle, drop_remainder = (train if v is None else v for v in (repeat, shuffle, drop_remainder))
    src = _source(cfg, split, durations, balance)
    n_mels, batch, seed = cfg["audio"]["n_mels"], cfg["train"]["batch_size"], cfg["train"]["seed"]
    if drop_remainder and len(src.clips.ids) < batch:
        raise CacheError(f"the {split!r} split has {len(src.clips.ids)} clips, fewer than train.batch_size {batch}")
    sizes = [sum(os.path.getsize(src.paths[kind][k]) for kind in src.kinds) for k in range(len(src.paths["tokens"]))]
    groups = [g for g in shard_groups(sizes, group_bytes) if np.isin(src.clips.shard, g).any()]
    endless = repeat and len(groups) == 1  # one group: its rows repeat, so no batch remainder is ever lost
    rng = np.random.default_rng(seed)
    group_rows = [_group_rows(src.clips, g, src.paths, src.edges, src.kinds, n_mels, batch, rng,
                              drop_remainder and not endless, src.listed) for g in groups]
    rows_table = tf.ragged.constant([r.tolist() for r in group_rows], dtype=tf.int64, ragged_rank=1)
    buffer = max(len(r) for r in group_rows) if shuffle else 0
    read = _group_arrays(src, groups, n_mels)

    @tf.autograph.experimental.do_not_convert  # see _interleave_groups
    def group_batches(g, epoch):
        rows = _bucketed_rows(epoch_rows(rows_table[g], seed, epoch), batch, shuffle=buffer, repeat=endless,
                              drop_remainder=drop_remainder, seed=seed)
        return rows.map(_gather_fn(src, read(g, epoch == 0), n_mels, with_clip_index),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    return _interleave_groups(group_batches, len(groups), shuffle=shuffle, repeat=repeat and not endless, seed=seed)


def _lifted(src, lift, worker, log):
    """`src` with each bucket's token width widened to hold the clips lifted into it (multiworker_data.lift_buckets)."""
    moved = np.flatnonzero(lift != np.arange(len(lift)))
    if not len(moved):
        return src
    bucket = np.searchsorted(src.edges, src.clips.frames)
    count = int(np.isin(bucket, moved).sum())
    if count:
        log(f"multi-worker: {count} training clips in {len(moved)} length bucket(s) that not all {worker[1]} workers "
            f"hold clips of train in the next larger shape (fewer workers or train.buckets avoid the padding)")
    shapes = [(max(src.shapes[b][0] for b in np.flatnonzero(lift == t)) if (lift == t).any() else tokens, frames)
              for t, (tokens, frames) in enumerate(src.shapes)]
    return dataclasses.replace(src, shapes=shapes)


def build_worker_dataset(cfg, worker, *, local_replicas=1, durations=False, with_clip_index=False, balance=False,
                         log=_print):
    """Worker `worker`=(index, count)'s endless train batches for multi-worker training: its own
    shards (k % count == index), batch train.batch_size / count split over `local_replicas`, and at
    each step the bucket every worker draws from the shared seed (pipeline/multiworker_data.py), so
    all workers run the same shape. tf.distribute's auto-sharding is off: the shards are shared here."""
    src = _source(cfg, "train", durations, balance)
    n_mels, seed = cfg["audio"]["n_mels"], cfg["train"]["seed"]
    mine, batch, weights, lift = multiworker_data.worker_share(cfg, src.clips, src.edges, worker)
    if batch % local_replicas:
        raise config.ConfigError(f"train.batch_size: {cfg['train']['batch_size']} does not split evenly over "
                                 f"{worker[1]} workers x {local_replicas} replicas each")
    rows = _group_rows(src.clips, mine, src.paths, src.edges, src.kinds, n_mels, batch, None, complete=False,
                       listed=src.listed)
    src = _lifted(src, lift, worker, log)
    rows[:, ROW["bucket"]] = lift[rows[:, ROW["bucket"]]]
    read = _group_arrays(src, [mine], n_mels)

    @tf.autograph.experimental.do_not_convert  # see _interleave_groups
    def group_batches(g):  # traced: the shard files are read by the graph, not embedded in it
        ds = multiworker_data.aligned_batches(rows, ROW["bucket"], weights, batch, seed, worker[0])
        return ds.map(_gather_fn(src, read(g), n_mels, with_clip_index), num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=True)

    ds = tf.data.Dataset.range(1).flat_map(group_batches)
    if local_replicas > 1:
        ds = ds.rebatch(batch // local_replicas)
    options = loader_options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def verified(blobs, names, want, target):
    """`blobs` (whole files' bytes), once each file's FarmHash Fingerprint64 equals `want` (int64,
    from the shard JSON); else the read fails naming the damaged files and the command that repairs them."""
    got = tf.bitcast(tf.fingerprint(blobs), tf.int64)                       # (files,)
    ok = tf.equal(got, want)
    check = tf.debugging.Assert(tf.reduce_all(ok), [
        f"{shards.DAMAGED}", tf.boolean_mask(names, tf.logical_not(ok)),
        f": checksum mismatch (the file changed after its job wrote it); run `{target}` "
        "(it rebuilds exactly the damaged shards)"], summarize=16)
    with tf.control_dependencies([check]):
        return tf.identity(blobs)


def epoch_rows(rows, seed, epoch):
    """A shard group's rows (int64 [n, len(ROW)]) as the read of it for `epoch` (int64 scalar tensor) of a
    several-group loader lists them: as they are in epoch 0, then permuted by a stateless draw from
    (train.seed, epoch), so the loader's seeded shuffle mixes each epoch's batches anew. Before, every
    read shuffled the same list with train.seed: each epoch repeated the first one's batches, clip for
    clip, in the same order. (The shuffle's own seed stays a Python int: a tensor seed fails in a
    process with a global seed, as every trainer's, in tf.data's seed check.)"""
    epoch = tf.cast(epoch, tf.int64)
    return tf.cond(epoch > 0,
                   lambda: tf.random.experimental.stateless_shuffle(rows, seed=tf.stack([tf.constant(seed, tf.int64),
                                                                                          epoch])),
                   lambda: tf.identity(rows))


def _bucketed_rows(rows, batch, *, shuffle, repeat, drop_remainder, seed):
    """Batches of one group's index rows, each batch from one length bucket; `shuffle` is the buffer
    (the group's row count, so rows mix across its shards) or 0."""
    rows = tf.data.Dataset.from_tensor_slices(rows)
    if shuffle:
        rows = rows.shuffle(shuffle, seed=seed)
    if repeat:
        rows = rows.repeat()
    return rows.group_by_window(key_func=lambda r: r[ROW["bucket"]], window_size=batch,
                                reduce_func=lambda key, w: w.batch(batch, drop_remainder=drop_remainder))


PADS = {"tokens": 0, "durations": 0, "mels": PAD_LOG_MEL, "energy": 0.0, "pitch": 0.0}  # what padding holds


def _padded_gather(arrays, kinds, max_tokens, max_frames, n_mels, with_clip_index, voices=()):
    """The map function from a batch of index rows to a batch dict: one vectorised gather per field,
    padded to the bucket's (tokens, frames) shape."""
    def gather(r):
        n, b = tf.shape(r, out_type=tf.int64)[0], r[0, ROW["bucket"]]
        lengths = {"tokens": r[:, ROW["n_tokens"]], "frames": r[:, ROW["frames"]]}
        out = {"token_lengths": tf.cast(lengths["tokens"], tf.int32), "mel_lengths": tf.cast(lengths["frames"], tf.int32)}
        for kind in kinds:
            unit = "tokens" if shards.KINDS[kind].unit == "token" else "frames"
            start = r[:, ROW[kind]]
            ragged = tf.gather(arrays[kind], tf.ragged.range(start, start + lengths[unit]))
            shape = [n, max_tokens[b] if unit == "tokens" else max_frames[b]] + ([n_mels] if kind == "mels" else [])
            name = {"mels": "mel"}.get(kind, kind)
            out[name] = ragged.to_tensor(tf.cast(PADS[kind], ragged.dtype), shape=tf.stack(shape))  # (B, T|F[, M])
        for name in voices:  # speaker / language ids, int32 [B]
            out[name] = tf.cast(r[:, ROW[name]], tf.int32)
        if with_clip_index:
            out["clip"] = tf.cast(r[:, ROW["clip"]], tf.int32)
        return out
    return gather


def loader_options():
    """The tf.data options every loader of the pipeline ends with (this module's, the vocoder's segments).

    Every loader is ordered: its batches come in the order its seeded shuffle made (train.seed),
    whatever the threads' timing, so every run of a config trains on the same batches in the same
    order. Its parallel maps are one vectorised gather per batch each, so keeping the order costs
    nothing measurable (benchmarks/loader.py).

    tf.data's autotuner is off. Its model thread sleeps between optimisations, up to 60 s once an
    iterator has lived a few minutes, and deleting the iterator sometimes waits out that sleep: a
    training job then sat idle for up to a minute after its last checkpoint (in 3 of 6 demo runs
    for `train`, 2 of 6 for `train_vocoder`; benchmarks/RESULTS.md). Without it, each `map` runs at the
    threadpool's parallelism and `prefetch(AUTOTUNE)` still sizes its own buffer; the loaders are
    gathers from memory that deliver tens to hundreds of times what their steps consume, and the
    demo's training loader measured the same batches/s either way. pipeline/align.py still sets
    the same option on its loader itself: its bytes are part of the aligner's key
    (rules/functions/align.smk), and a change there would retrain every run's aligner."""
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False
    return options


def _interleave_groups(group_batches, n_groups, *, shuffle, repeat, seed):
    """Batches of every shard group, two groups in flight (the next one is read while batches come
    from the current one), then the options and the final prefetch. group_batches(g, epoch) gets the
    epoch (int64 scalar) each read of group g is for: its rows' order (epoch_rows) and the checksum
    check of its first read (epoch 0) follow it.

    tf.data runs AutoGraph over every function it traces unless told not to. The loader's functions
    (group_batches and all it calls: the reads, the checksum check, the bucketing, the gather) have no
    Python `if` or loop on a tensor (tf.cond and tf.map_fn where they branch or loop), so AutoGraph
    would change nothing in their graphs; its source transformations alone cost CPU seconds in every
    process that builds a loader. So they are not converted (what they call inherits that)."""
    group_ids = tf.data.Dataset.range(n_groups)
    if shuffle:
        group_ids = group_ids.shuffle(n_groups, seed=seed)
    if repeat:
        group_ids = group_ids.repeat()
    reads = group_ids.enumerate().map(tf.autograph.experimental.do_not_convert(
        lambda i, g: (g, i // n_groups)))  # (group, the epoch it is read for: 0 is its first read)
    ds = reads.interleave(group_batches, cycle_length=min(2, n_groups), num_parallel_calls=min(2, n_groups),
                          deterministic=True)
    return ds.with_options(loader_options()).prefetch(tf.data.AUTOTUNE)


def clip_ids(cfg, split):
    """The ids behind the `clip` field of `build_dataset(..., with_clip_index=True)`, with or without
    durations=True and balance=True (the clips those leave out or repeat keep their places here)."""
    return load_clips(cfg, split)[0].ids


def left_out(cfg, index=None, durations=False):
    """[{id, shard, stage, path, reason}] of the clips training leaves out: every row of the cache's
    rejected.tsv (bad audio, text it cannot say, audio too short for its text) and, with durations,
    the duration shards' rejects (a token longer than aligner.max_token_seconds)."""
    index = index or read_index(cfg)
    root = config.cache_dir(cfg)
    rows = []
    try:
        lines = (root / "rejected.tsv").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:  # the index job writes it with index.json; deleted since, no job remakes it by itself
        raise CacheError(f"{root / 'rejected.tsv'}: missing (the clips the cache left out, which training lists); "
                         f"remake it with `{shards.REBUILD} --forcerun cache_index` (it rebuilds no shard)") from None
    header = lines[0].split("\t") if lines else []
    for line in lines[1:]:
        rows.append(dict(zip(header, line.split("\t", len(header) - 1))))
    if durations:
        for entry in index["shards"]:
            prefix = shards.prefix(root, "durations", entry["shard"])
            meta = shards.read_meta(prefix, "durations")
            listed = {r["id"] for r in rows}
            new = [dict(r, shard=entry["shard"]) for r in meta.get("rejected", ()) if r["id"] not in listed]
            if any(r["reason"].startswith("token ") for r in new):
                tokens = dict(zip(meta["ids"], map(len, shards.arrays(meta, prefix))))
                new = [dict(r, reason=at_an_end(r["reason"], tokens.get(r["id"], 0))) for r in new]
            rows += new
    return rows


def at_an_end(reason, n_tokens):
    """A duration reject's reason (pipeline.durations.check), saying so where the token too long is the
    first or the last of its clip's `n_tokens`: the aligner gives a clip's leading silence to its first
    token and its trailing silence to the end-of-sentence one, so there it is most often silence at the
    clip's ends, not text the audio does not carry (docs/datasets.md). Here, not in durations.py, whose
    bytes key every duration shard."""
    head, sep, _ = reason.partition(": the audio does not carry its text")
    token = head.split(" ", 2)[1] if head.startswith("token ") else ""
    if not sep or not token.isdigit() or int(token) not in (0, n_tokens - 1):
        return reason
    end, where = ("first", "start") if int(token) == 0 else ("last (end of sentence)", "end")
    return (f"{head}: the {end} token, which takes any silence at the clip's {where}: trim the clip's quiet ends "
            "(docs/datasets.md), or its audio does not carry its text")
