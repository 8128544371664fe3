"""Shard caches: token shards, mel shards and the dataset index that ties them together.

Each shard is a raw little-endian array (`.bin`, read by the loader with tf.io.read_file +
tf.io.decode_raw alone) and a JSON index beside it: ids, lengths, offsets, and the provenance
(a digest of the config section and the feature code that made it), so the loader can refuse
to mix shards built under different settings. Mel shards also keep per-clip mel sums
(`.stats.npy`), from which `index` computes the train split's mean/std without a second pass.

    python -m pipeline.cache tokens --config CFG --shard 3 --out cache/demo/tokens/shard-003
    python -m pipeline.cache mels   --config CFG --shard 3 --out cache/demo/mels/shard-003
    python -m pipeline.cache index  --config CFG --tokens T1 T2 .. --mels M1 M2 .. --out cache/demo/index.json

Config keys: dataset.*, cache.shards, audio.*, text.cleaners. Writes are atomic: the `.bin`
first, the `.json` last, each through a temporary file, so an interrupted job leaves no shard
that loads.
"""
import argparse
import functools
import io
import json
import time
from pathlib import Path

import numpy as np

from pipeline import audio, config, dataset, text
from pipeline.errors import PipelineError, cli

TOKEN_DTYPE, MEL_DTYPE = "int32", "float16"  # mels stay float16 until they are on the device


def _write_shard(out, array, meta):
    out = Path(out)
    config.atomic_write_bytes(out.with_suffix(".bin"), np.ascontiguousarray(array).tobytes())
    meta["bytes"] = int(array.nbytes)
    config.atomic_write_text(out.with_suffix(".json"), json.dumps(meta, indent=1))


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist() if lengths else []


def build_token_shard(cfg, shard, out, log=functools.partial(print, flush=True)):
    clips = dataset.load_manifest(cfg["dataset"], cfg["cache"]["shards"])[shard]
    ids, lengths, chunks, dropped = [], [], [], {}
    for c in clips:
        seq, n_dropped = text.text_to_ids(c.text, cfg["text"]["cleaners"])
        ids.append(c.id)
        lengths.append(len(seq))
        chunks.append(np.asarray(seq, dtype=TOKEN_DTYPE))
        if n_dropped:
            dropped[c.id] = n_dropped
    array = np.concatenate(chunks) if chunks else np.zeros(0, TOKEN_DTYPE)
    meta = dict(kind="tokens", format=dataset.FORMAT, shard=shard, provenance=dataset.provenance("tokens", cfg),
                dtype=TOKEN_DTYPE, ids=ids, lengths=lengths, offsets=_offsets(lengths), dropped=dropped)
    _write_shard(out, array, meta)
    log(f"token shard {shard}: {len(ids)} clips, {int(array.size)} tokens, "
        f"{sum(dropped.values())} characters outside the vocabulary dropped")


def build_mel_shard(cfg, shard, out, log=functools.partial(print, flush=True)):
    ds = cfg["dataset"]
    clips = dataset.load_manifest(ds, cfg["cache"]["shards"])[shard]
    ids, frames, mels, sums, rejected = [], [], [], [], []
    seconds, start = 0.0, time.time()
    a = cfg["audio"]
    basis = audio.mel_basis_memo(Path(out).parent, sample_rate=a["sample_rate"], n_fft=a["n_fft"],
                                 n_mels=a["n_mels"], fmin=a["fmin"], fmax=a["fmax"])
    for i, c in enumerate(clips, start=1):
        path = dataset.audio_path(ds["root"], ds["audio_dir"], c.id)
        try:
            if path is None:
                raise audio.BadAudio(f"missing file (no {c.id}.wav, .flac or .ogg)")
            mel = audio.mel_from_file(path, cfg["audio"], ds["max_seconds"], basis)  # (F, n_mels)
        except audio.BadAudio as e:
            where = path or Path(ds["root"]) / ds["audio_dir"] / f"{c.id}.*"
            rejected.append(dict(id=c.id, path=str(where), reason=str(e)))
            log(f"rejected {where}: {e}")
            continue
        ids.append(c.id)
        frames.append(int(mel.shape[0]))
        mels.append(mel.astype(MEL_DTYPE))
        sums.append([mel.sum(0, dtype=np.float64), np.square(mel).sum(0, dtype=np.float64)])  # for mean/std
        seconds += mel.shape[0] * cfg["audio"]["hop_length"] / cfg["audio"]["sample_rate"]
        if i % 50 == 0 or i == len(clips):
            rate = i / max(time.time() - start, 1e-9)
            log(f"mel shard {shard}: {i}/{len(clips)} clips, {rate:.1f} clips/s, "
                f"eta {(len(clips) - i) / rate:.0f} s")
    if rejected and ds["bad_audio"] == "fail":
        listing = "; ".join(f"{r['path']}: {r['reason']}" for r in rejected)
        raise audio.BadAudio(f"mel shard {shard}: {len(rejected)} bad clip(s) with dataset.bad_audio: fail: {listing}")
    n_mels = cfg["audio"]["n_mels"]
    array = np.concatenate(mels) if mels else np.zeros((0, n_mels), MEL_DTYPE)
    stats = np.asarray(sums, dtype=np.float64).reshape(len(ids), 2, n_mels)
    config.atomic_write_bytes(Path(out).with_suffix(".stats.npy"), _npy_bytes(stats))
    meta = dict(kind="mels", format=dataset.FORMAT, shard=shard, provenance=dataset.provenance("mels", cfg),
                dtype=MEL_DTYPE, n_mels=n_mels, ids=ids, frames=frames, offsets=_offsets(frames),
                seconds=round(seconds, 3), rejected=rejected)
    _write_shard(out, array, meta)
    log(f"mel shard {shard}: {len(ids)} clips, {seconds:.1f} s of audio, {len(rejected)} rejected")


def _npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def read_shard_meta(path):
    path = Path(path).with_suffix(".json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipelineError(f"{path}: shard index missing (run `snakemake --cores all caches`)") from None


def build_index(cfg, token_paths, mel_paths, out, log=functools.partial(print, flush=True)):
    """index.json + vocab.json + rejected.tsv from every shard's JSON (and the mel sums)."""
    out = Path(out)
    want = {"tokens": dataset.provenance("tokens", cfg), "mels": dataset.provenance("mels", cfg)}
    shards, rejected = [], []
    n_mels = cfg["audio"]["n_mels"]
    total = np.zeros((2, n_mels)); frames_train = 0
    counts = dict(clips=0, train=0, val=0, rejected=0, seconds=0.0)
    for tp, mp in zip(sorted(token_paths), sorted(mel_paths)):
        tok, mel = read_shard_meta(tp), read_shard_meta(mp)
        for kind, meta, p in (("tokens", tok, tp), ("mels", mel, mp)):
            if meta["provenance"] != want[kind]:
                raise PipelineError(f"{p}: built with other {kind} settings or code "
                                 f"(provenance {meta['provenance']}, expected {want[kind]}); rerun `snakemake caches`")
        stats = np.load(Path(mp).with_suffix(".stats.npy"))
        usable = set(tok["ids"])
        val = 0
        for i, cid in enumerate(mel["ids"]):
            if cid not in usable:
                continue
            if dataset.is_validation(cid, cfg["dataset"]["val_fraction"]):
                val += 1
            else:
                total += stats[i]
                frames_train += mel["frames"][i]
        n = len(usable & set(mel["ids"]))
        counts["clips"] += n; counts["val"] += val; counts["train"] += n - val
        counts["rejected"] += len(mel["rejected"]); counts["seconds"] += mel["seconds"]
        rejected += mel["rejected"]
        shards.append(dict(tokens=str(Path(tp).with_suffix("").relative_to(out.parent)),
                           mels=str(Path(mp).with_suffix("").relative_to(out.parent)), clips=n, val=val))
    if frames_train == 0:
        raise PipelineError(f"no training clips in {cfg['dataset']['root']}: every clip was rejected or in validation "
                         f"(see {out.parent / 'rejected.tsv'})")
    mean = total[0] / frames_train
    std = np.sqrt(np.maximum(total[1] / frames_train - mean ** 2, 1e-6))
    vocab = text.vocabulary(cfg["text"]["cleaners"])
    index = dict(name=cfg["name"], format=dataset.FORMAT, provenance=want, n_mels=n_mels, audio=cfg["audio"],
                 text=cfg["text"], val_fraction=cfg["dataset"]["val_fraction"], counts=counts,
                 mel_mean=mean.round(6).tolist(), mel_std=std.round(6).tolist(), vocab=vocab, shards=shards)
    counts["seconds"] = round(counts["seconds"], 2)
    lines = ["id\tpath\treason"] + [f"{r['id']}\t{r['path']}\t{r['reason']}" for r in rejected]
    config.atomic_write_text(out.parent / "rejected.tsv", "\n".join(lines) + "\n")
    config.atomic_write_text(out.parent / "vocab.json", json.dumps(vocab, indent=1))
    config.atomic_write_text(out, json.dumps(index, indent=1))
    log(f"index: {counts['clips']} clips ({counts['train']} train, {counts['val']} validation), "
        f"{counts['seconds'] / 3600:.2f} h of audio, {counts['rejected']} rejected (listed in {out.parent / 'rejected.tsv'})")


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Build token shards, mel shards and the cache index.")
    parser.add_argument("what", choices=["tokens", "mels", "index"])
    config.add_arguments(parser)
    parser.add_argument("--shard", type=int)
    parser.add_argument("--out", required=True, help="shard path without suffix, or index.json")
    parser.add_argument("--tokens", nargs="*", default=[])
    parser.add_argument("--mels", nargs="*", default=[])
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    if args.what == "index":
        build_index(cfg, args.tokens, args.mels, args.out)
        return
    if args.shard is None or not 0 <= args.shard < cfg["cache"]["shards"]:
        raise config.ConfigError(f"--shard must be in 0..{cfg['cache']['shards'] - 1}")
    build = build_token_shard if args.what == "tokens" else build_mel_shard
    build(cfg, args.shard, args.out)


if __name__ == "__main__":
    main()
