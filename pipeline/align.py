"""Train the alignment model (pipeline/models/aligner.py) from the caches: the `aligner` target.

    python -m pipeline.align --config configs/config.yaml --out runs/demo/aligner/KEY/aligner.json
    snakemake --cores all aligner

Reads the cache index and the token and mel shards through the training loader (the same bucket
shapes, no Python per example). Config keys: `aligner:` (steps, batch_size, learning_rate, d_model,
temperature, prior_scaling), train.buckets, train.seed. Writes
runs/{name}/aligner/aligner.weights.h5; aligner.npz, the same weights as plain named arrays, which
the duration shard jobs (pipeline/durations.py) run through pipeline/models/aligner_numpy.py
without TensorFlow; and, last, aligner.json: the steps, the loss history, the mel statistics and
vocabulary it trained with, with several speakers (languages) the index's sorted `speakers` and
`languages` tables its ids index, and the digests of both weight files (duration shards record the
first as their provenance; the jobs check the second before they use the arrays).
`load_aligner` and `log_probs` here are the TensorFlow forward pass of the same model, the reference
the tests and benchmarks/durations.py compare that one with.
Training starts from scratch each time: `snakemake --forcerun train_aligner` retrains. aligner.json
records what the weights were trained from (`trained_from`: the aligner's settings and code and the
bytes of the token and mel shards, not the code that made them), so when a new aligner key comes
from code that left every shard's content as it was (a text.py edit that changes no token), the job
copies the aligner of the same `trained_from` from its sibling folder instead of training it again:
the same durations follow, and nothing downstream trains again either. A forced rerun of a folder
(`--forcerun train_aligner`: its `.made` marker is still there) always trains.
"""
import argparse
import functools
import json
import math
import shutil
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from pipeline import config, data, shards
from pipeline.errors import PipelineError, cli
from pipeline.models import aligner as aligner_mod
from pipeline.models import aligner_numpy, symbols
from pipeline.train import traced_once_update

PAD_TOKENS, PAD_FRAMES = 16, 64  # inference pads to multiples of these: few traced shapes
MADE = ".made"  # beside aligner.json once it is trained or copied (not an output: a forced rerun finds it)


def loader_config(cfg):
    """The config the loader sees for aligner training: the aligner's batch size; frames padded to
    any multiple (the aligner has no reduction factor, whatever model.kind is)."""
    out = dict(cfg)
    out["train"] = {**cfg["train"], "batch_size": cfg["aligner"]["batch_size"]}
    out["model"] = {"kind": "fastpitch"}
    return out


def voice_tables(index):
    """{"speakers": [...], "languages": [...]} of the index when it has several speakers or languages
    (the aligner's tables; both recorded in aligner.json), else {} (no table, an aligner.json as before)."""
    tables = data.voice_tables(index)
    return tables if data.voice_fields(index) else {}


def trained_from(cfg, index):
    """Digest of what an aligner trained on these caches is made from: its settings (aligner:, the
    loader's buckets and seed) and code, the index less its provenance (the clips, splits, vocabulary,
    statistics) and each token and mel shard's table and checksum, less its provenance."""
    cache = config.cache_dir(cfg)
    tables = []
    for entry in index["shards"]:
        for kind in ("tokens", "mels"):
            table = shards.read_meta(cache / entry[kind], kind)
            tables.append({k: v for k, v in table.items() if k not in ("provenance", "espeak")})
    return shards.digest(json.dumps({"aligner": dict(cfg["aligner"]), "buckets": cfg["train"]["buckets"],
                                     "seed": cfg["train"]["seed"]}, sort_keys=True),
                         shards.code_digest("models/aligner.py", "align.py"),
                         json.dumps({k: v for k, v in index.items() if k != "provenance"}, sort_keys=True),
                         json.dumps(tables, sort_keys=True))


def copy_trained(out, made_from, log):
    """The info of an aligner in a sibling folder of `out`'s (runs/{name}/aligner/*/) trained from
    `made_from`, its weight files checked and copied beside `out` with a new aligner.json; None if none,
    or if `out`'s folder was made before (its MADE marker: a forced rerun, which trains)."""
    out = Path(out)
    if out.with_name(MADE).exists():  # Snakemake deleted this folder's outputs to run it again: a retrain
        log(f"aligner: {out.parent} was made before and its job runs again (`--forcerun train_aligner`, or its "
            f"files deleted): training anew, not copying")
        return None
    for other in sorted(out.parent.parent.glob(f"*/{out.name}")):
        if other.parent == out.parent:
            continue
        try:
            info = json.loads(other.read_text(encoding="utf-8"))
            if info.get("trained_from") != made_from or any(
                    shards.file_digest(other.with_name(info[f])) != info[f"{f}_digest"] for f in ("weights", "arrays")):
                continue
        except (OSError, ValueError, KeyError):
            continue                                            # damaged or half-written: not a source
        for f in ("weights", "arrays"):
            source = other.with_name(info[f])
            config.atomic_write(out.with_name(info[f]), lambda tmp, source=source: shutil.copyfile(source, tmp),
                                suffix=source.suffix)
        info = {**info, "copied_from": other.parent.name}
        config.atomic_write_text(out, json.dumps(info, indent=1))
        config.atomic_write_text(out.with_name(MADE), made_from + "\n")
        log(f"aligner: the caches' content is unchanged since {other.parent} (trained from {made_from}): "
            f"copied its weights instead of training again")
        return info
    return None


def train_aligner(cfg, out, log=functools.partial(print, flush=True)):
    acfg = cfg["aligner"]
    index = data.read_index(cfg)
    made_from, made = trained_from(cfg, index), Path(out).with_name(MADE)
    if copied := copy_trained(out, made_from, log):
        return copied
    keras.utils.set_random_seed(cfg["train"]["seed"])
    vocab = symbols(index["vocab"])
    mean, std = data.mel_stats(cfg, index)
    voices = voice_tables(index)  # several speakers / languages: batches carry their ids
    model = aligner_mod.build(acfg, vocab, index["n_mels"], **voices)
    optimizer = keras.optimizers.Adam(acfg["learning_rate"])
    optimizer.build(model.trainable_variables)
    update, _ = traced_once_update(optimizer, model.trainable_variables)  # the step's two traces share it
    mel_mean, mel_std = tf.constant(mean), tf.constant(std)

    @tf.function(reduce_retracing=True, autograph=False)  # graph ops only: no AutoGraph (pipeline/train.py)
    def step(batch):
        batch = dict(batch, mel=(tf.cast(batch["mel"], tf.float32) - mel_mean) / mel_std)
        with tf.GradientTape() as tape:
            loss, _ = model.tts_loss(model(batch, training=True), batch)
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        update(grads)
        return loss

    # tf.data's autotuner off here: with it, this process hung at its end, in the iterator's destructor
    # (py-spy), for 60-62 s in 3 of 4 Snakemake runs beside train_vocoder, as long as the autotuner's
    # longest wait between optimisations (benchmarks/RESULTS.md); 0 of 2 without it. The loader
    # delivers ~400x what the step consumes, so there is nothing to tune.
    untuned = tf.data.Options()
    untuned.autotune.enabled = False
    batches = iter(data.build_dataset(loader_config(cfg), "train").with_options(untuned))
    history, t0, losses = [], time.perf_counter(), []
    for i in range(1, acfg["steps"] + 1):
        losses.append(float(step(next(batches))))
        if i % 25 == 0 or i == acfg["steps"]:
            loss = float(np.mean(losses))
            if not math.isfinite(loss):
                raise FloatingPointError(f"aligner loss became {loss} at step {i}; lower aligner.learning_rate")
            history.append({"step": i, "forward_sum": round(loss, 5)})
            log(f"aligner step {i}/{acfg['steps']}: forward-sum loss {loss:.4f} "
                f"({i / (time.perf_counter() - t0):.1f} steps/s)")
            losses = []
    out = Path(out)
    weights, arrays = out.with_name("aligner.weights.h5"), out.with_name("aligner.npz")
    config.atomic_write(weights, lambda tmp: model.save_weights(str(tmp)), suffix=".weights.h5")
    config.atomic_write(arrays, lambda tmp: np.savez(tmp, **aligner_numpy.arrays_of(model)), suffix=".npz")
    info = {"weights": weights.name, "weights_digest": shards.file_digest(weights),
            "arrays": arrays.name, "arrays_digest": shards.file_digest(arrays),
            "steps": acfg["steps"], "seconds": round(time.perf_counter() - t0, 1), "history": history,
            "aligner": acfg, "n_mels": index["n_mels"], "vocab": vocab,
            "mel_mean": mean.tolist(), "mel_std": std.tolist(), **voices, "trained_from": made_from}
    config.atomic_write_text(out, json.dumps(info, indent=1))
    config.atomic_write_text(made, made_from + "\n")
    log(f"aligner: {acfg['steps']} steps in {info['seconds']} s, weights {weights}")
    return info


def load_aligner(cfg, aligner_json):
    """(Aligner with its trained weights, its aligner.json dict)."""
    path = Path(aligner_json)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipelineError(f"{path}: no trained aligner; run `snakemake --cores all aligner`") from None
    model = aligner_mod.build(info["aligner"], info["vocab"], info["n_mels"], speakers=info.get("speakers", ()),
                              languages=info.get("languages", ()))
    model.load_weights(str(path.with_name(info["weights"])))
    info["_stats"] = (np.asarray(info["mel_mean"], np.float32), np.asarray(info["mel_std"], np.float32))
    info["_fn"] = tf.function(lambda b: model(b)["log_probs"], reduce_retracing=True, autograph=False)
    return model, info


def log_probs(model, info, tokens, mel, voices=None):
    """The aligner's log P(token | frame) for one clip: tokens (T,) int, mel (F, n_mels) log-mel -> (F, T)
    float64. voices: the clip's `aligner_numpy.voice_ids` (with several speakers or languages)."""
    T, F = len(tokens), len(mel)
    mean, std = info["_stats"]
    t_pad, f_pad = -(-T // PAD_TOKENS) * PAD_TOKENS, -(-F // PAD_FRAMES) * PAD_FRAMES
    tok = np.zeros((1, t_pad), np.int32)
    tok[0, :T] = tokens
    m = np.zeros((1, f_pad, len(mean)), np.float32)
    m[0, :F] = (np.asarray(mel, np.float32) - mean) / std
    batch = {"tokens": tok, "token_lengths": np.array([T], np.int32), "mel": m,
             "mel_lengths": np.array([F], np.int32)}
    for field in ("speaker", "language"):
        if field in model.needs:  # the aligner has its table
            batch[field] = np.array([(voices or {}).get(field, -1)], np.int32)
    out = info["_fn"](batch)
    return out.numpy()[0, :F, :T].astype(np.float64)


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Train the alignment model from the caches.")
    config.add_arguments(parser)
    parser.add_argument("--out", help="aligner.json (default runs/{name}/aligner/aligner.json)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for TensorFlow (0: all)")
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    train_aligner(cfg, args.out or config.run_dir(cfg) / "aligner" / "aligner.json")


if __name__ == "__main__":
    main()
