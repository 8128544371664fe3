"""Loader benchmark: examples/s of `pipeline.data.build_dataset(cfg, "train")` against two baselines.

    python benchmarks/loader.py                    # the demo corpus (caches built into .bench/loader if missing), ~2 min
    python benchmarks/loader.py --config .bench/preprocess/full/config-s64.yaml   # the 13,100-clip corpus of
                                                   # benchmarks/preprocess.py (its caches must be built; ~5 min)
    python benchmarks/loader.py --batches 100 --repeats 5 --warmup 10

The targets: loader examples/s >= 5x a per-utterance `.npy` loader using `np.load` in
`tf.numpy_function` over the same mels and batch size, and >= 0.8x padding and batching the same
data from RAM. All three run in one process on the same train-split clips (tokens int32, mels
float16 exactly as cached; the product also delivers pitch and energy, the baselines do not), the same batch size (the config's train.batch_size), the same padding
value, and each is a repeating, shuffled stream of fixed-size batches:

  product   pipeline.data.build_dataset(cfg, "train"): shard files read with tf.io.read_file +
            decode_raw, each file's checksum verified in the graph (tf.fingerprint), examples sliced
            out, bucketed (group_by_window) and padded to bucket shapes.
  unverified  the product without the checksum verification (pipeline.data.verified replaced by
            the identity while its graph is built): product / unverified is the checksum's cost.
            A shard file is read (and hashed) once per iterator for a cache of one shard group, once
            per epoch with several: `--group-bytes 1` makes every shard its own group, so every epoch
            re-reads and re-hashes every file (the worst case; LJSpeech has two groups).
  npy       the usual GPU-starving loader: one .npy file per utterance per array (written from the
            cache into {workdir}), Dataset.from_tensor_slices(paths).shuffle(N).repeat()
            .map(tf.numpy_function(np.load ...), num_parallel_calls=AUTOTUNE).padded_batch(B).prefetch.
  ram       the same arrays already in memory: Dataset.from_tensor_slices over tf.RaggedTensors
            (no Python per example), .shuffle(SHUFFLE_BUFFER).repeat().map(identity: ragged slice ->
            dense tensor).padded_batch(B).prefetch.
            This is the fair "from RAM" baseline because the product has no Python per example either;
  ram-gen   Dataset.from_generator over the in-memory numpy arrays (Python per example), for reference.
  batch-gather  a prototype of a faster design, for reference (not the product): the index rows are
            shuffled and bucketed, batched, then one vectorized gather per batch from in-memory arrays
            pads them to the same bucket shapes as the product.

Each repeat makes a fresh iterator per loader (in rotating order, so that no loader's background
prefetch threads run while another is timed), pulls --warmup batches, then times --batches batches
and counts examples, in two modes: batches pulled by next() from Python (the headline figure: that
is how pipeline.train and pipeline.diagnose consume the loader) and pulled inside one tf.function
(no Python per batch: the loader's own capacity). The median over --repeats is reported; figures go to {workdir}/loader-{name}.json.
"""
import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ROOT  # noqa: E402

PY_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc")
TOKENS_TARGET, RAM_TARGET = 5.0, 0.8
CHECKSUM_TARGET = 0.97  # product / unverified: the checksum costs at most 3 %
SHUFFLE_BUFFER = 256  # the ram baselines' shuffle buffer (train.shuffle_buffer of the demo config before that key went)


def log(*a):
    print(*a, flush=True)


def ensure_caches(cfg_path, cfg):
    """Build (or bring up to date) the config's caches with `snakemake --cores 2 caches` when the
    index is missing or was built by other settings/feature code than the current ones."""
    from pipeline import data

    try:
        data.read_index(cfg)
        return False
    except data.CacheError as e:
        log(f"{e}\n-> running `snakemake --cores 2 caches --configfile {cfg_path}` ...")
    res = common.snakemake("caches", config=cfg_path)
    log(f"   caches built in {res['wall']:.0f} s")
    return True


def load_arrays(cfg, split="train"):
    """(ids, [tokens int32], [mel float16 (F, n_mels)]) of a split, read straight from the shard files."""
    import numpy as np

    from pipeline import data

    index = data.read_index(cfg)
    clips, paths = data.load_clips(cfg, split, index)
    n_mels = index["n_mels"]
    table = data.token_table(index["vocab"])  # token shards hold code points; batches carry vocabulary ids
    toks = [table[np.fromfile(p, dtype=np.int32)] for p in paths["tokens"]]
    mels = [np.fromfile(p, dtype=np.float16).reshape(-1, n_mels) for p in paths["mels"]]
    tokens, mel = [], []
    for k, to, tl, mo, fr in zip(clips.shard, clips.offsets["tokens"], clips.n_tokens, clips.offsets["mels"],
                                 clips.frames):
        tokens.append(toks[k][to:to + tl].copy())
        mel.append(mels[k][mo:mo + fr].copy())
    return clips.ids, tokens, mel


def write_npy(folder, ids, tokens, mels, stamp):
    """One {id}.tokens.npy and {id}.mel.npy per clip, rewritten only when the cache changed."""
    import numpy as np

    folder = Path(folder)
    marker = folder / ".stamp.json"
    tok_paths = [str(folder / f"{i}.tokens.npy") for i in ids]
    mel_paths = [str(folder / f"{i}.mel.npy") for i in ids]
    if marker.exists() and json.loads(marker.read_text()) == stamp and all(map(os.path.exists, mel_paths)):
        return tok_paths, mel_paths
    folder.mkdir(parents=True, exist_ok=True)
    for t, m, tp, mp in zip(tokens, mels, tok_paths, mel_paths):
        np.save(tp, t)
        np.save(mp, m)
    marker.write_text(json.dumps(stamp))
    return tok_paths, mel_paths


def npy_loader(tok_paths, mel_paths, batch, pad_mel, seed):
    import numpy as np
    import tensorflow as tf

    def load(t, m):
        return np.load(t.decode()), np.load(m.decode())

    def example(t, m):
        tokens, mel = tf.numpy_function(load, [t, m], [tf.int32, tf.float16])
        tokens.set_shape([None]); mel.set_shape([None, None])
        return {"tokens": tokens, "token_lengths": tf.shape(tokens)[0], "mel": mel, "mel_lengths": tf.shape(mel)[0]}

    ds = tf.data.Dataset.from_tensor_slices((tok_paths, mel_paths)).shuffle(len(tok_paths), seed=seed).repeat()
    ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.padded_batch(batch, padding_values={"tokens": 0, "token_lengths": 0, "mel": tf.constant(pad_mel, tf.float16),
                                                "mel_lengths": 0}, drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def ram_loader(tokens, mels, batch, pad_mel, seed, buffer):
    import numpy as np
    import tensorflow as tf

    tok_len = np.array([len(t) for t in tokens], np.int32)
    frames = np.array([len(m) for m in mels], np.int32)
    elems = {
        "tokens": tf.RaggedTensor.from_row_lengths(np.concatenate(tokens), tok_len),
        "token_lengths": tok_len,
        "mel": tf.RaggedTensor.from_row_lengths(np.concatenate(mels), frames),
        "mel_lengths": frames,
    }
    ds = tf.data.Dataset.from_tensor_slices(elems).shuffle(buffer, seed=seed).repeat()
    ds = ds.map(lambda e: e)  # a slice of a ragged tensor arrives as a RaggedTensor spec; in a map it is a plain Tensor
    ds = ds.padded_batch(batch, padding_values={"tokens": 0, "token_lengths": 0, "mel": tf.constant(pad_mel, tf.float16),
                                                "mel_lengths": 0}, drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def ram_generator_loader(tokens, mels, batch, pad_mel, seed, n_mels):
    import numpy as np
    import tensorflow as tf

    def gen():
        rng = np.random.default_rng(seed)
        while True:
            for i in rng.permutation(len(tokens)):
                yield {"tokens": tokens[i], "token_lengths": np.int32(len(tokens[i])), "mel": mels[i],
                       "mel_lengths": np.int32(len(mels[i]))}

    sig = {"tokens": tf.TensorSpec([None], tf.int32), "token_lengths": tf.TensorSpec([], tf.int32),
           "mel": tf.TensorSpec([None, n_mels], tf.float16), "mel_lengths": tf.TensorSpec([], tf.int32)}
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig)
    ds = ds.padded_batch(batch, padding_values={"tokens": 0, "token_lengths": 0, "mel": tf.constant(pad_mel, tf.float16),
                                                "mel_lengths": 0}, drop_remainder=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def batch_gather_loader(cfg, tokens, mels, batch, pad_mel, seed):
    """Prototype of a faster design (not the product): shuffle and bucket the tiny index rows, batch
    them, then ONE vectorized gather per batch from in-memory arrays, padded to the bucket shape.
    Same bucket shapes and batch contents as the product's contract; about 5 ops per batch instead
    of ~20 per example."""
    import numpy as np
    import tensorflow as tf

    from pipeline import data

    edges, shapes = data.bucket_shapes(cfg)
    tl = np.array([len(t) for t in tokens], np.int64)
    fr = np.array([len(m) for m in mels], np.int64)
    tok_flat, mel_flat = tf.constant(np.concatenate(tokens)), tf.constant(np.concatenate(mels))
    rows = np.stack([np.concatenate([[0], np.cumsum(tl)[:-1]]), tl, np.concatenate([[0], np.cumsum(fr)[:-1]]), fr,
                     np.searchsorted(edges, fr)], 1).astype(np.int64)
    max_tokens = tf.constant([s[0] for s in shapes], tf.int64)
    max_frames = tf.constant([s[1] for s in shapes], tf.int64)
    n_mels = mels[0].shape[1]

    def gather(r):
        n, b = tf.shape(r, out_type=tf.int64)[0], r[0, 4]
        tok = tf.gather(tok_flat, tf.ragged.range(r[:, 0], r[:, 0] + r[:, 1])).to_tensor(0, shape=tf.stack([n, max_tokens[b]]))
        mel = tf.gather(mel_flat, tf.ragged.range(r[:, 2], r[:, 2] + r[:, 3])).to_tensor(
            tf.constant(pad_mel, tf.float16), shape=tf.stack([n, max_frames[b], n_mels]))
        return {"tokens": tok, "token_lengths": tf.cast(r[:, 1], tf.int32), "mel": mel,
                "mel_lengths": tf.cast(r[:, 3], tf.int32)}

    ds = tf.data.Dataset.from_tensor_slices(rows).shuffle(len(rows), seed=seed).repeat()
    ds = ds.group_by_window(lambda r: r[4], lambda k, w: w.batch(batch, drop_remainder=True), window_size=batch)
    return ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def python_ops(ds):
    """Names of Python ops anywhere in a dataset's graph (functions included)."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph().numpy())
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
    return sorted({op for op in ops if op in PY_OPS})


def time_loader(ds, warmup, batches, mode):
    """(examples/s, examples, seconds, mean padded mel frames per example) over `batches` batches.

    mode "python": next() per batch from Python, as pipeline.train's loop and pipeline.diagnose do;
    mode "graph": the batches are pulled inside one tf.function (no Python per batch), i.e. the
    loader's own capacity.
    """
    import tensorflow as tf

    t_first = time.perf_counter()
    it = iter(ds)
    if mode == "python":
        next(it)
        first_batch_s = time.perf_counter() - t_first  # the first read of every file (and its checksum)
        for _ in range(warmup - 1):
            next(it)
        examples = padded = 0
        t0 = time.perf_counter()
        for _ in range(batches):
            b = next(it)
            n, f = b["mel"].shape[0], b["mel"].shape[1]
            examples += n
            padded += n * f
        seconds = time.perf_counter() - t0
    else:
        @tf.function
        def drain(iterator, k):
            n = f = tf.constant(0, tf.int64)
            for _ in tf.range(k):
                shape = tf.shape(next(iterator)["mel"], out_type=tf.int64)
                n += shape[0]
                f += shape[0] * shape[1]
            return n, f

        drain(it, tf.constant(max(warmup, 1)))  # traces, and warms up
        first_batch_s = None
        t0 = time.perf_counter()
        examples, padded = (int(x) for x in drain(it, tf.constant(batches)))
        seconds = time.perf_counter() - t0
    del it
    gc.collect()
    return examples / seconds, examples, seconds, padded / max(examples, 1), first_batch_s


def checksum_cost(cfg, repeats):
    """Seconds (min over `repeats`, alternating) to read every shard file of the cache whole, as the
    loader does (read_file, reduce_join, decode_raw), without and with pipeline.data.verified (one
    tf.fingerprint per file): what the checksum adds to a read, independent of the batching around it."""
    import tensorflow as tf

    from pipeline import data, shards

    clips, paths = data.load_clips(cfg, "all")
    names = tf.constant([p for kind in paths for p in paths[kind]])
    want = tf.constant([c for kind in paths for c in clips.checksums[kind]], tf.int64)
    total = sum(os.path.getsize(p) for kind in paths for p in paths[kind])

    def read(verify):
        blobs = tf.map_fn(tf.io.read_file, names, fn_output_signature=tf.string)
        if verify:
            blobs = data.verified(blobs, names, want, shards.REBUILD)
        return tf.size(tf.io.decode_raw(tf.strings.reduce_join(blobs), tf.uint8))

    fns = {v: tf.function(lambda v=v: read(v)) for v in (False, True)}
    times = {False: [], True: []}
    for r in range(repeats + 1):
        for v in ((False, True) if r % 2 else (True, False)):
            t = time.perf_counter()
            fns[v]().numpy()
            if r:  # the first round traces
                times[v].append(time.perf_counter() - t)
    return {"files": int(names.shape[0]), "bytes": total, "read_s": min(times[False]), "read_verified_s": min(times[True])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    p.add_argument("--config", type=Path, default=None,
                   help="a config whose caches to read (default: the demo corpus, caches in {workdir}/loader)")
    p.add_argument("--batches", type=int, default=100, help="timed batches per repeat")
    p.add_argument("--warmup", type=int, default=10, help="untimed batches first, per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-generator", action="store_true", help="skip the from_generator reference row")
    p.add_argument("--no-prototype", action="store_true", help="skip the batch-gather prototype row")
    p.add_argument("--group-bytes", type=int, default=None,
                   help="the product's shard group size (default pipeline.data.GROUP_BYTES); 1: one shard a group, "
                        "so every epoch re-reads and re-hashes every file")
    p.add_argument("--mode", choices=["python", "graph", "both"], default="both",
                   help="how batches are pulled: next() from Python (the headline: what pipeline.train does), "
                        "inside a tf.function (the loader's own capacity), or both")
    args = p.parse_args(argv)
    workdir = args.workdir.resolve()
    os.chdir(ROOT)  # relative paths in a config mean what they mean to Snakemake, which runs here
    t_start = time.perf_counter()
    out = {"benchmark": "loader", "command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
           "machine": common.machine_info()}
    log(common.machine_line(out["machine"]))

    from pipeline import config, data

    if args.config is None:
        cfg_path = common.bench_config(workdir / "loader" / "config.yaml", name="demo",
                                       dataset_root=ROOT / "data" / "demo", workdir=workdir / "loader")
    else:
        cfg_path = args.config.resolve()
    cfg = config.load_config(str(cfg_path))
    built = ensure_caches(cfg_path, cfg)

    import numpy as np
    import tensorflow as tf

    batch, seed = cfg["train"]["batch_size"], cfg["train"]["seed"]
    index = data.read_index(cfg)
    ids, tokens, mels = load_arrays(cfg, "train")
    n_mels = index["n_mels"]
    stamp = {"provenance": index["provenance"], "counts": index["counts"], "clips": len(ids)}
    tok_paths, mel_paths = write_npy(workdir / "loader" / "npy" / cfg["name"], ids, tokens, mels, stamp)
    mel_bytes = sum(m.nbytes for m in mels)
    log(f"\n{cfg['name']}: {len(ids)} train clips, {mel_bytes / 2**20:.1f} MiB of float16 mels, batch {batch}, "
        f"buckets {cfg['train']['buckets']}, {args.repeats} x ({args.warmup} warm-up + {args.batches} timed batches)")

    group_bytes = args.group_bytes or data.GROUP_BYTES
    verified = data.verified
    data.verified = lambda blobs, *rest: blobs  # the graph is built (traced) now: without the checksum
    unverified = data.build_dataset(cfg, "train", group_bytes=group_bytes)
    data.verified = verified
    loaders = {
        "product": data.build_dataset(cfg, "train", group_bytes=group_bytes),
        "unverified": unverified,
        "npy": npy_loader(tok_paths, mel_paths, batch, data.PAD_LOG_MEL, seed),
        "ram": ram_loader(tokens, mels, batch, data.PAD_LOG_MEL, seed, SHUFFLE_BUFFER),
    }
    if not args.no_prototype:
        loaders["batch-gather"] = batch_gather_loader(cfg, tokens, mels, batch, data.PAD_LOG_MEL, seed)
    if not args.no_generator:
        loaders["ram-gen"] = ram_generator_loader(tokens, mels, batch, data.PAD_LOG_MEL, seed, n_mels)
    pyops = {k: python_ops(ds) for k, ds in loaders.items()}

    modes = ["python", "graph"] if args.mode == "both" else [args.mode]
    runs = {m: {k: [] for k in loaders} for m in modes}
    names = list(loaders)
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for m in modes:
            for k in order:
                rate, n, s, pad, first = time_loader(loaders[k], args.warmup, args.batches, m)
                runs[m][k].append({"examples_per_s": rate, "examples": n, "seconds": s, "padded_frames_per_example": pad,
                                   "first_batch_s": first})
        log(f"  repeat {rep + 1}/{args.repeats}: " + "; ".join(
            f"{m}: " + ", ".join(f"{k} {runs[m][k][-1]['examples_per_s']:,.0f}" for k in names) for m in modes))

    mean_frames = float(np.mean([len(m) for m in mels]))
    med = {m: {k: common.median([r["examples_per_s"] for r in v]) for k, v in runs[m].items()} for m in modes}
    rows = []
    for m in modes:
        for k in names:
            rs = [r["examples_per_s"] for r in runs[m][k]]
            rows.append([m, k, med[m][k], f"{min(rs):,.0f} .. {max(rs):,.0f}", med[m]["product"] / med[m][k],
                         runs[m][k][0]["padded_frames_per_example"] / mean_frames, ", ".join(pyops[k]) or "none"])
    log(common.table(rows, ["batches pulled by", "loader", "examples/s (median)", "range", "product / this",
                            "padded / real frames", "Python ops in graph"]))
    ratios = {m: {"product_vs_npy": med[m]["product"] / med[m]["npy"], "product_vs_ram": med[m]["product"] / med[m]["ram"],
                  "ram_vs_npy": med[m]["ram"] / med[m]["npy"],
                  "product_vs_unverified": med[m]["product"] / med[m]["unverified"]} for m in modes}
    for m in modes:
        r = ratios[m]
        log(f"[{m}] product vs npy loader: {r['product_vs_npy']:.2f}x (target >= {TOKENS_TARGET}x): "
            f"{common.verdict(r['product_vs_npy'] >= TOKENS_TARGET)}; product vs RAM: {r['product_vs_ram']:.2f}x "
            f"(target >= {RAM_TARGET}x): {common.verdict(r['product_vs_ram'] >= RAM_TARGET)}; "
            f"(RAM itself is {r['ram_vs_npy']:.2f}x the npy loader); with checksums vs without: "
            f"{r['product_vs_unverified']:.3f}x (target >= {CHECKSUM_TARGET}): "
            f"{common.verdict(r['product_vs_unverified'] >= CHECKSUM_TARGET)}")
    cost = checksum_cost(cfg, max(args.repeats, 5) * 4)
    cost["ratio"] = cost["read_s"] / cost["read_verified_s"]
    extra = cost["read_verified_s"] - cost["read_s"]
    hashing = (f"{cost['bytes'] / 2**30 / extra:.1f} GiB/s of hashing" if extra > 0
               else "the checksums' cost below the timing's noise")
    log(f"reading all {cost['files']} shard files whole ({cost['bytes'] / 2**20:.1f} MiB), min of "
        f"{max(args.repeats, 5) * 4}: {1000 * cost['read_s']:.2f} ms, with the checksums {1000 * cost['read_verified_s']:.2f} ms "
        f"({cost['ratio']:.3f}x the speed; {hashing}): "
        f"{common.verdict(cost['ratio'] >= CHECKSUM_TARGET)} the {CHECKSUM_TARGET} target per whole-file read")
    out["checksum_read_cost"] = cost
    if "python" in modes:
        first = {k: common.median([r["first_batch_s"] for r in runs["python"][k]]) for k in ("product", "unverified")}
        log(f"first batch (every file read once, and hashed by the product): product {first['product']:.3f} s, "
            f"unverified {first['unverified']:.3f} s (medians)")
        out["first_batch_s_median"] = first
    head = modes[0]
    vs_npy, vs_ram = ratios[head]["product_vs_npy"], ratios[head]["product_vs_ram"]

    out.update({
        "config": str(cfg_path), "name": cfg["name"], "caches_built_now": built, "train_clips": len(ids),
        "mel_mib": round(mel_bytes / 2**20, 1), "mean_frames": mean_frames, "batch_size": batch,
        "buckets": cfg["train"]["buckets"], "shuffle_buffer": SHUFFLE_BUFFER, "group_bytes": group_bytes,
        "warmup_batches": args.warmup, "timed_batches": args.batches, "repeats": args.repeats,
        "ram_baseline": "Dataset.from_tensor_slices over tf.RaggedTensor (tokens, mels) + shuffle + padded_batch",
        "examples_per_s_median": med, "runs": runs, "python_ops": pyops, "ratios": ratios, "headline_mode": head,
        "product_vs_npy": vs_npy, "product_vs_ram": vs_ram,
        "product_vs_unverified": ratios[head]["product_vs_unverified"],
        "targets": {"vs_npy_min": TOKENS_TARGET, "vs_ram_min": RAM_TARGET, "vs_unverified_min": CHECKSUM_TARGET},
        "met": {"vs_npy": vs_npy >= TOKENS_TARGET, "vs_ram": vs_ram >= RAM_TARGET,
                "vs_unverified": ratios[head]["product_vs_unverified"] >= CHECKSUM_TARGET},
        "tensorflow_threads": {"intra": tf.config.threading.get_intra_op_parallelism_threads(),
                               "inter": tf.config.threading.get_inter_op_parallelism_threads()},
    })
    out["runtime_s"] = round(time.perf_counter() - t_start, 1)
    out["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    path = common.write_json(workdir / f"loader-{cfg['name']}.json", out)
    log(f"\nbenchmark runtime {out['runtime_s']:.0f} s; figures in {path}")


if __name__ == "__main__":
    main()
