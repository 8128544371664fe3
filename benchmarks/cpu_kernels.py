"""TensorFlow's CPU kernels, oneDNN against Eigen: the demo's FastPitch and vocoder steps, in fresh processes.

    python benchmarks/cpu_kernels.py                  # default config, demo corpus caches
    python benchmarks/cpu_kernels.py --rounds 3 --steps 15

TF_ENABLE_ONEDNN_OPTS is read once, when TensorFlow loads, so each setting runs in its own process:
each round starts one process per setting, in alternating order. Each process builds the training
step of FastPitch (the config's sizes, one batch per bucket shape) and of the configured vocoder (one
segment batch), warms them up (tracing), then times --steps steps of each; the figure is the median
step time. pipeline/__init__.py turns oneDNN on for the pipeline's own processes; this is the
measurement behind it. Writes .bench/cpu_kernels.json.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"Eigen": "0", "oneDNN": "1"}


def measure(config_path, steps):
    """One process's figures: {"fastpitch_ms", "vocoder_ms", "kernels"} (median ms per step)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    import tensorflow as tf
    from step import one_batch_per_bucket, time_variant

    from pipeline import config, placement
    from pipeline.train import build_trainer
    from pipeline.vocoder.train import VocoderTrainer

    cfg = config.load_config(config_path)

    trainer = build_trainer(config.merge(cfg, {"train": {"jit_compile": False}}), log=lambda *a: None)
    # step.py's timing: one warm-up call per shape, then the median of `steps` calls
    fastpitch = time_variant(trainer.step, one_batch_per_bucket(trainer), steps)["median_ms"]
    vocoder = VocoderTrainer(cfg, log=lambda *a: None)
    batch = next(iter(vocoder.dataset("train")))
    voc = time_variant(lambda b: vocoder.step(b, 0), [batch], steps)["median_ms"]
    return {"fastpitch_ms": fastpitch, "vocoder_ms": voc, "kernels": placement.cpu_kernels(), "tf": tf.__version__}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "config.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--out", default=str(ROOT / ".bench" / "cpu_kernels.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.config, args.steps)))
        return
    runs = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name in (list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]):
            env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=SETTINGS[name], TF_CPP_MIN_LOG_LEVEL="3")
            proc = subprocess.run([sys.executable, __file__, "--child", "--config", args.config, "--steps",
                                   str(args.steps)], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            assert got["kernels"] == name, got  # the setting took
            runs[name].append(got)
            print(f"round {r} {name:<7} FastPitch {got['fastpitch_ms']:7.1f} ms/step   vocoder {got['vocoder_ms']:6.1f} "
                  f"ms/step   load {os.getloadavg()[0]:.1f}", flush=True)
    med = {name: {k: sorted(g[k] for g in runs[name])[len(runs[name]) // 2] for k in ("fastpitch_ms", "vocoder_ms")}
           for name in SETTINGS}
    for k in ("fastpitch_ms", "vocoder_ms"):
        print(f"{k[:-3]:<10} Eigen {med['Eigen'][k]:7.1f} ms   oneDNN {med['oneDNN'][k]:7.1f} ms   "
              f"oneDNN {med['Eigen'][k] / med['oneDNN'][k]:.2f}x faster")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": runs, "median": med, "machine": platform.processor(),
                                          "cpu": _cpu_model(), "load_end": os.getloadavg()[0]}, indent=1))


def _cpu_model():
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


if __name__ == "__main__":
    main()
