"""The fused AdamW (pipeline/optim.py) against keras.optimizers.AdamW, in one process: the training
step's graph, its warm-up (one trace and Grappler's pass per bucket shape) and its steps.

    python benchmarks/optimizer.py                                  # the demo config
    python benchmarks/optimizer.py --config configs/ljspeech.yaml --steps 20 --repeats 3

Each repeat builds the trainer of the config (its model, loader and placement) once with each
optimizer, in alternating order, takes one batch per bucket shape, then times a first step on each
(the warm-up: tracing, Grappler, first execution) and --steps steps cycling through them. Figures:
nodes in the step's graph (its functions included), warm-up wall and CPU seconds, median ms per
step. Writes .bench/optimizer.json.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from pipeline import config, optim  # noqa: E402
from pipeline import train as train_mod  # noqa: E402

VARIANTS = {"keras": keras.optimizers.AdamW, "fused": optim.AdamW}


class _Optimizers:
    """train.py's `optim` module with AdamW replaced by one variant's class."""

    def __init__(self, cls):
        self.AdamW = cls


def nodes(step, batch):
    graph = step.get_concrete_function(batch).graph.as_graph_def()
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)


def measure(cfg, name, steps):
    train_mod.optim = _Optimizers(VARIANTS[name])
    try:
        trainer = train_mod.build_trainer(cfg, log=lambda *a: None)
    finally:
        train_mod.optim = optim
    assert type(trainer.optimizer).__module__.startswith("pipeline" if name == "fused" else "keras")
    found = {}
    for batch in trainer.dataset:
        found.setdefault(batch["mel"].shape[1], batch)
        if len(found) == trainer.n_buckets:
            break
    batches = list(found.values())
    wall, cpu = time.perf_counter(), time.process_time()
    for b in batches:
        float(trainer.step(b)["total"])
    warmup = {"warmup_s": time.perf_counter() - wall, "warmup_cpu_s": time.process_time() - cpu}
    times = []
    for i in range(steps):
        t = time.perf_counter()
        float(trainer.step(batches[i % len(batches)])["total"])
        times.append(time.perf_counter() - t)
    return {**warmup, "median_ms": 1000 * float(np.median(times)), "nodes": nodes(trainer.step, batches[0]),
            "variables": len(trainer.model.trainable_variables), "shapes": [tuple(b["mel"].shape) for b in batches]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / ".bench" / "optimizer.json"))
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    runs = []
    for r in range(args.repeats):
        for name in (("keras", "fused") if r % 2 == 0 else ("fused", "keras")):
            runs.append({"variant": name, "repeat": r, **measure(cfg, name, args.steps)})
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for name in VARIANTS:
        mine = [x for x in runs if x["variant"] == name]
        summary[name] = {k: float(np.median([x[k] for x in mine])) for k in ("warmup_s", "warmup_cpu_s", "median_ms")}
        summary[name]["nodes"] = mine[0]["nodes"]
    k, f = summary["keras"], summary["fused"]
    print(f"{cfg['model']['kind']}, {runs[0]['variables']} variables, batches {runs[0]['shapes']}, "
          f"{platform.processor() or platform.machine()}, TF {tf.__version__}, load {os.getloadavg()[0]:.1f}")
    print(f"{'':<8}{'step graph nodes':>18}{'warm-up s':>11}{'warm-up CPU s':>15}{'ms/step':>9}")
    for name, s in summary.items():
        print(f"{name:<8}{s['nodes']:>18}{s['warmup_s']:>11.1f}{s['warmup_cpu_s']:>15.1f}{s['median_ms']:>9.1f}")
    print(f"fused / keras: nodes {f['nodes'] / k['nodes']:.2f}x, warm-up CPU {f['warmup_cpu_s'] / k['warmup_cpu_s']:.2f}x, "
          f"step {f['median_ms'] / k['median_ms']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": runs, "summary": summary, "model": cfg["model"]["kind"],
                                          "tf": tf.__version__, "keras": keras.__version__,
                                          "cpu": platform.processor(), "load": os.getloadavg()}, indent=1))


if __name__ == "__main__":
    main()
