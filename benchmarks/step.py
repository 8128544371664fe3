"""Training-step time of each model kind: compiled (tf.function) vs eager, XLA on vs off, in one process.

    python benchmarks/step.py                          # default config, demo corpus caches
    python benchmarks/step.py --config configs/ljspeech.yaml --steps 20

fastpitch and transformer_tts (their sizes from the config) run on the same batches (one per
bucket shape of the fastpitch loader, already on the device; frames padded to transformer_tts's
reduction factor for it), after a warm-up that absorbs tracing and XLA compilation; the figure is
the median step time over --steps steps cycling through the buckets. Compilation time is reported
separately. Writes .bench/step.json.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from pipeline import config, data  # noqa: E402
from pipeline.train import build_trainer  # noqa: E402


def one_batch_per_bucket(trainer):
    found = {}
    for batch in trainer.dataset:
        found.setdefault(batch["mel"].shape[1], batch)
        if len(found) == trainer.n_buckets:
            return list(found.values())
    return list(found.values())


def time_variant(step, batches, steps):
    t = time.perf_counter()
    for b in batches:  # warm-up: one trace (and XLA compile) per shape
        float(step(b)["total"])
    compile_s = time.perf_counter() - t
    times = []
    for i in range(steps):
        b = batches[i % len(batches)]
        t = time.perf_counter()
        float(step(b)["total"])  # .numpy() waits for the device
        times.append(time.perf_counter() - t)
    return {"median_ms": 1000 * float(np.median(times)), "mean_ms": 1000 * float(np.mean(times)),
            "warmup_s": round(compile_s, 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", default=str(ROOT / ".bench" / "step.json"))
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    if not (config.cache_dir(cfg) / "durations").exists():
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "durations", "--quiet"], cwd=ROOT, check=True)
    out = {}
    batches = None
    for kind in ("fastpitch", "transformer_tts"):
        kcfg = config.merge(cfg, {"model": {"kind": kind}, "train": {"jit_compile": False}})
        plain = build_trainer(kcfg, log=lambda *a: None)
        if batches is None:
            batches = one_batch_per_bucket(plain)  # fastpitch's loader: durations included
        mine = [pad_frames(b, plain.model) for b in batches]
        results = {"eager": time_variant(plain.step.python_function, mine, max(3, args.steps // 3)),
                   "tf.function": time_variant(plain.step, mine, args.steps)}
        xla = build_trainer(config.merge(kcfg, {"train": {"jit_compile": True}}), log=lambda *a: None)
        results["tf.function + XLA"] = time_variant(xla.step, mine, args.steps)
        out[kind] = {"results": results, "shapes": [tuple(b["mel"].shape) for b in mine],
                     "params": int(plain.model.count_params())}
    print(f"batches {out['fastpitch']['shapes']}, {platform.processor() or platform.machine()}, TF {tf.__version__}")
    print(f"{'model':<17}{'variant':<20}{'median ms/step':>16}{'vs eager':>10}{'warm-up s':>11}")
    for kind, r in out.items():
        base = r["results"]["eager"]["median_ms"]
        for name, v in r["results"].items():
            print(f"{kind:<17}{name:<20}{v['median_ms']:>16.1f}{base / v['median_ms']:>9.2f}x{v['warmup_s']:>11.1f}")
    ratio = (out["transformer_tts"]["results"]["tf.function"]["median_ms"]
             / out["fastpitch"]["results"]["tf.function"]["median_ms"])
    print(f"fastpitch vs transformer_tts (tf.function, same batches): {ratio:.2f}x faster per step")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"models": out, "fastpitch_speedup": ratio, "device": plain.model_device,
                                          "tf": tf.__version__}, indent=1))


def pad_frames(batch, model):
    """The batch with its frames padded to the model's frame multiple (silence; pitch, energy 0)."""
    r = getattr(model, "frame_multiple", getattr(model, "reduction", 1))
    extra = -batch["mel"].shape[1] % r
    if not extra:
        return batch
    out = dict(batch)
    out["mel"] = tf.pad(batch["mel"], [[0, 0], [0, extra], [0, 0]], constant_values=data.PAD_LOG_MEL)
    for k in ("pitch", "energy"):
        out[k] = tf.pad(batch[k], [[0, 0], [0, extra]])
    return out


if __name__ == "__main__":
    main()
