"""The vocoder's input pipeline: random hop-aligned (mel, audio) crops from the shard caches.

`build_segments(cfg, split)` reads the mel (or GTA) shards and the audio shards (the waveform cut to
the mel's frame grid, written by mel_shard) with tf.io.read_file + tf.io.decode_raw, once, and
makes every batch by gathers alone: no Python op, one static shape [B, S, n_mels] / [B, S*hop]
(S = vocoder.segment_frames, B = vocoder.batch_size), so a compiled step traces once.

Training batches are a pure function of (train.seed, step): batch i picks B clips and one crop
start each with stateless random numbers, so a run resumed at step i (`start_step=i`) sees exactly
the batches an uninterrupted run would. Crop t of a clip is frames [t, t+S) of its mel and samples
[t*hop, (t+S)*hop) of its audio: `pipeline.audio` computes that mel from those samples on every
interior frame (the edge frames see reflect padding instead of their neighbours). A clip shorter
than S frames is padded (mel with log(1e-5), silence; audio with zeros), never dropped; how many
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
from pipeline.data import load_clips, read_index
from pipeline.shards import CacheError

PAD_LOG_MEL = float(np.log(LOG_CLAMP))  # padding is silence, as in the acoustic loader

SOURCES = ("recorded", "gta")
_print = functools.partial(print, flush=True)


def gta_prefix(cfg, shard):
    """runs/{name}/gta/shard-NNN: the acoustic model's teacher-forced mels of one shard."""
    return shards.prefix(config.run_dir(cfg), "gta", shard)


def _offsets(cfg, index, clips, kind, prefix_of, length_of):
    """Per clip of `clips`, its offset (items) in shard `prefix_of(k)` of `kind`, checking its length."""
    out = np.zeros(len(clips.ids), np.int64)
    where = {}
    for pos in np.unique(clips.shard):
        entry = index["shards"][pos]
        prefix = prefix_of(entry["shard"])
        meta = shards.read_meta(prefix, kind)
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
    items = [sum(shards.read_meta(where[pos][0])["lengths"]) for pos in sorted(where)]  # frames or samples
    rebase = dict(zip(sorted(where), np.cumsum([0] + items)))
    return out + np.array([rebase[p] for p in clips.shard], np.int64), files


def build_segments(cfg, split="train", *, source="recorded", repeat=None, start_step=0, batch_size=None,
                   log=_print):
    """tf.data.Dataset of dict batches `mel` float32 [B, S, n_mels], `audio` float32 [B, S*hop].

    split: "train", "val" or "all"; source: "recorded" (the mel caches) or "gta" (runs/{name}/gta);
    repeat (default: split == "train"): endless stateless-random crops from `start_step` on, else
    each clip once (its middle crop). CacheError naming the shard and what to run when one is missing.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {source!r}")
    repeat = split == "train" if repeat is None else repeat
    hop, n_mels = cfg["audio"]["hop_length"], cfg["audio"]["n_mels"]
    S, B = cfg["vocoder"]["segment_frames"], batch_size or cfg["vocoder"]["batch_size"]
    index = read_index(cfg)
    clips, paths = load_clips(cfg, split, index)
    if not clips.ids:
        raise CacheError(f"{config.cache_dir(cfg)}: no clips in the {split!r} split")
    root = config.cache_dir(cfg)
    if source == "recorded":
        mel_files = [paths["mels"][p] for p in sorted(set(clips.shard.tolist()))]
        present = sorted(set(clips.shard.tolist()))
        sizes = np.cumsum([0] + [shards.read_meta(Path(paths["mels"][p]).with_suffix(""))["bytes"] // (2 * n_mels)
                                 for p in present])
        base = dict(zip(present, sizes))
        mel_off = clips.offsets["mels"] + np.array([base[p] for p in clips.shard], np.int64)
    else:
        mel_off, mel_files = _offsets(cfg, index, clips, "gta", lambda k: gta_prefix(cfg, k), lambda f: f)
    audio_off, audio_files = _offsets(cfg, index, clips, "audio", lambda k: shards.prefix(root, "audio", k),
                                      lambda f: f * hop)
    short = int(np.sum(clips.frames < S))
    if short:
        log(f"segments: {short} of {len(clips.ids)} {split} clips are shorter than vocoder.segment_frames {S}: "
            f"padded (mel with silence, audio with zeros)")

    table = tf.constant(np.stack([mel_off, audio_off, clips.frames], 1), tf.int64)   # (clips, 3)
    n_clips, seed = len(clips.ids), cfg["train"]["seed"]

    def read(files, dt):
        blobs = tf.map_fn(tf.io.read_file, tf.constant(files), fn_output_signature=tf.string)
        return tf.io.decode_raw(tf.strings.reduce_join(blobs), dt)

    def crops(mel, wav, idx, u):
        """idx (b,) clip rows, u (b,) in [0, 1): where in the clip the crop starts."""
        rows = tf.gather(table, idx)                                                  # (b, 3)
        frames = rows[:, 2]
        start = tf.cast(u * tf.cast(tf.maximum(frames - S, 0) + 1, tf.float32), tf.int64)  # (b,)
        start = tf.minimum(start, tf.maximum(frames - S, 0))
        t = tf.range(S, dtype=tf.int64)[None]                                         # (1, S)
        keep = t < (frames - start)[:, None]                                          # (b, S)
        fi = tf.where(keep, rows[:, :1] + start[:, None] + t, 0)
        m = tf.where(keep[..., None], tf.cast(tf.gather(mel, fi), tf.float32), PAD_LOG_MEL)  # (b, S, n_mels)
        s = tf.range(S * hop, dtype=tf.int64)[None]                                   # (1, S*hop)
        keep_s = s < ((frames - start) * hop)[:, None]
        si = tf.where(keep_s, rows[:, 1:2] + start[:, None] * hop + s, 0)
        a = tf.where(keep_s, tf.gather(wav, si), 0.0)                                 # (b, S*hop)
        return {"mel": m, "audio": a}

    def from_arrays(_):
        mel = tf.reshape(read(mel_files, tf.float16), [-1, n_mels])                       # (all frames, n_mels)
        wav = read(audio_files, tf.float32)                                           # (all samples,)
        if repeat:
            def batch(step):
                idx = tf.random.stateless_uniform([B], seed=tf.stack([seed, step]), maxval=n_clips, dtype=tf.int64)
                u = tf.random.stateless_uniform([B], seed=tf.stack([seed + 1, step]))
                return crops(mel, wav, idx, u)
            steps = tf.data.Dataset.range(start_step, np.iinfo(np.int64).max)
            return steps.map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        rows = tf.data.Dataset.range(n_clips).batch(B)
        return rows.map(lambda idx: crops(mel, wav, idx, tf.fill(tf.shape(idx), 0.5)))

    return tf.data.Dataset.range(1).flat_map(from_arrays).prefetch(tf.data.AUTOTUNE)
