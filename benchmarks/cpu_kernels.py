"""TensorFlow's CPU kernels, oneDNN against Eigen: the demo's FastPitch and vocoder steps, in fresh processes.

    python benchmarks/cpu_kernels.py                  # default config, demo corpus caches
    python benchmarks/cpu_kernels.py --rounds 3 --steps 15
    python benchmarks/cpu_kernels.py --voice runs/demo/export   # an exported voice's calls instead
    python benchmarks/cpu_kernels.py --compare threads          # 1 intra-op thread against 2 (oneDNN on)
    python benchmarks/cpu_kernels.py --compare precision        # the steps in float32 against mixed bfloat16

TF_ENABLE_ONEDNN_OPTS is read once, when TensorFlow loads, so each setting runs in its own process:
each round starts one process per setting, in alternating order. Each process builds the training
step of FastPitch (the config's sizes, one batch per bucket shape) and of the configured vocoder (one
segment batch), warms them up (tracing), then times --steps steps of each; the figure is the median
step time. pipeline/__init__.py turns oneDNN on for the pipeline's own processes; this is the
measurement behind it. With --voice, each process loads that export's SavedModel instead and times
--steps warm calls of its `synthesize` signature on one sentence of each of TOKENS token counts, as
`speak` and `serve` call it (benchmarks/serve.py makes a demo-size voice in .bench/serve/).
With --compare threads, the two settings are TensorFlow's intra-op pool at 1 and at 2 threads
(TF_NUM_INTRAOP_THREADS, what a rule's `--threads` sets), and each process also reports its CPU
seconds. With --compare precision, the two settings are `train.mixed_precision` off and bfloat16
(what `auto` picks for the acoustic model on a CPU with AMX-BF16, pipeline/placement.py), oneDNN on.
Writes .bench/cpu_kernels.json (.bench/cpu_threads.json, .bench/cpu_precision.json with --compare).
"""
import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPARE = {"kernels": ("TF_ENABLE_ONEDNN_OPTS", {"Eigen": "0", "oneDNN": "1"}),
           "threads": ("TF_NUM_INTRAOP_THREADS", {"2 threads": "2", "1 thread": "1"}),
           "precision": ("BENCH_MIXED_PRECISION", {"float32": "off", "bfloat16": "bfloat16"})}
TOKENS = (20, 60, 150)  # --voice: sentence lengths in token ids (~1.4, 4 and 10 s of speech at 6 frames a token)


def measure(config_path, steps):
    """One process's figures: {"fastpitch_ms", "vocoder_ms", "kernels"} (median ms per step)."""
    import tensorflow as tf
    from step import one_batch_per_bucket, time_variant

    from pipeline import config, placement
    from pipeline.train import build_trainer
    from pipeline.vocoder.train import VocoderTrainer

    cfg = config.load_config(config_path)
    cfg = config.merge(cfg, {"train": {"mixed_precision": os.environ.get("BENCH_MIXED_PRECISION", "off")}})

    trainer = build_trainer(config.merge(cfg, {"train": {"jit_compile": False}}), log=lambda *a: None)
    # step.py's timing: one warm-up call per shape, then the median of `steps` calls
    fastpitch = time_variant(trainer.step, one_batch_per_bucket(trainer), steps)["median_ms"]
    vocoder = VocoderTrainer(cfg, log=lambda *a: None)
    batch = next(iter(vocoder.dataset("train")))
    voc = time_variant(lambda b: vocoder.step(b, 0), [batch], steps)["median_ms"]
    return {"fastpitch_ms": fastpitch, "vocoder_ms": voc, "kernels": placement.cpu_kernels(), "tf": tf.__version__,
            "mixed_precision": [trainer.p.mixed_precision, vocoder.p.mixed_precision],
            "amx_bf16": placement.cpu_has_amx_bf16(),
            "cpu_s": sum(resource.getrusage(resource.RUSAGE_SELF)[:2])}


def measure_voice(voice, calls):
    """One process's figures for an exported voice: {"tokens_N_ms": median ms of a warm call, "kernels"}."""
    import numpy as np
    import tensorflow as tf
    from step import time_variant

    from pipeline import placement

    synthesize = tf.saved_model.load(str(Path(voice) / "saved_model")).signatures["synthesize"]
    symbols = len(json.loads((Path(voice) / "vocab.json").read_text())["symbols"])
    got = {"kernels": placement.cpu_kernels(), "tf": tf.__version__}
    for n in TOKENS:
        feed = {}
        for name, spec in synthesize.structured_input_signature[1].items():
            if name == "tokens":  # ids past pad and end-of-sentence, the same every run
                feed[name] = tf.constant(np.random.default_rng(n).integers(2, symbols, (1, n)), tf.int32)
            else:  # pace and pitch_shift 1.0 and 0.0 would both do; speaker and language ids 0
                feed[name] = tf.ones(spec.shape, spec.dtype) if name == "pace" else tf.zeros(
                    [1 if d is None else d for d in spec.shape], spec.dtype)
        call = lambda f: {"total": next(v for v in synthesize(**f).values() if v.dtype == tf.float32)[0, 0]}  # noqa: E731
        got[f"tokens_{n}_ms"] = time_variant(call, [feed], calls)["median_ms"]
    return got


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "config.yaml"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--voice", help="an export folder: time its SavedModel's calls, not the training steps")
    parser.add_argument("--compare", choices=sorted(COMPARE), default="kernels")
    parser.add_argument("--out", help="default .bench/cpu_kernels.json (.bench/cpu_threads.json: --compare threads)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # the project and step.py importable in this fresh process
        sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
        print(json.dumps(measure_voice(args.voice, args.steps) if args.voice else measure(args.config, args.steps)))
        return
    keys = [f"tokens_{n}_ms" for n in TOKENS] if args.voice else ["fastpitch_ms", "vocoder_ms"]
    variable, settings = COMPARE[args.compare]
    out = args.out or ROOT / ".bench" / f"cpu_{args.compare}.json"
    runs = {name: [] for name in settings}
    for r in range(args.rounds):
        for name in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **{variable: settings[name]})
            proc = subprocess.run([sys.executable, __file__, "--child", "--config", args.config, "--steps",
                                   str(args.steps), *(["--voice", args.voice] if args.voice else [])],
                                  env=env, cwd=ROOT, capture_output=True, text=True, check=True)
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            assert args.compare != "kernels" or got["kernels"] == name, got  # the setting took
            assert args.compare != "precision" or got["mixed_precision"] == [settings[name]] * 2, got
            runs[name].append(got)
            print(f"round {r} {name:<9} " + "   ".join(f"{k[:-3]} {got[k]:7.1f} ms" for k in keys) +
                  (f"   process {got['cpu_s']:.1f} CPU s" if "cpu_s" in got else "") +
                  f"   load {os.getloadavg()[0]:.1f}", flush=True)
    med = {name: {k: statistics.median(g[k] for g in runs[name]) for k in keys} for name in settings}
    base, other = settings  # the first setting is the baseline
    for k in keys:
        print(f"{k[:-3]:<10} {base} {med[base][k]:7.1f} ms   {other} {med[other][k]:7.1f} ms   "
              f"{other} {med[base][k] / med[other][k]:.2f}x faster")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"compare": args.compare, "runs": runs, "median": med, "voice": args.voice,
                                     "machine": platform.processor(), "cpu": _cpu_model(),
                                     "load_end": os.getloadavg()[0]}, indent=1))


def _cpu_model():
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


if __name__ == "__main__":
    main()
