"""Training-step time: compiled (tf.function) vs eager, and XLA on vs off, in one process.

    python benchmarks/step.py                          # default config, demo corpus caches
    python benchmarks/step.py --config configs/ljspeech.yaml --steps 20

Every variant runs the same default model on the same batches (one batch per bucket shape,
already on the device), after a warm-up that absorbs tracing and XLA compilation; the figure is
the median step time over --steps steps cycling through the buckets. Compilation time is
reported separately. Writes .bench/step.json.
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
    if not (config.cache_dir(cfg) / "index.json").exists():
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "caches", "--quiet"], cwd=ROOT, check=True)
    results = {}
    plain = build_trainer(config.merge(cfg, {"train": {"jit_compile": False}}), log=lambda *a: None)
    batches = one_batch_per_bucket(plain)
    results["eager"] = time_variant(plain.step.python_function, batches, max(3, args.steps // 3))
    results["tf.function"] = time_variant(plain.step, batches, args.steps)
    xla = build_trainer(config.merge(cfg, {"train": {"jit_compile": True}}), log=lambda *a: None)
    results["tf.function + XLA"] = time_variant(xla.step, batches, args.steps)
    base = results["eager"]["median_ms"]
    shapes = [tuple(b["mel"].shape) for b in batches]
    print(f"default model, batches {shapes}, {platform.processor() or platform.machine()}, TF {tf.__version__}")
    print(f"{'variant':<20}{'median ms/step':>16}{'vs eager':>10}{'warm-up s':>11}")
    for name, r in results.items():
        print(f"{name:<20}{r['median_ms']:>16.1f}{base / r['median_ms']:>9.2f}x{r['warmup_s']:>11.1f}")
    xla_gain = results["tf.function"]["median_ms"] / results["tf.function + XLA"]["median_ms"]
    print(f"XLA vs no XLA: {xla_gain:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"shapes": shapes, "results": results, "xla_speedup": xla_gain,
                                          "device": plain.model_device, "tf": tf.__version__}, indent=1))


if __name__ == "__main__":
    main()
