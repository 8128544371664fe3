"""Real-time factor of the exported voice: SavedModel and TFLite next to pipeline.synthesize.

    python benchmarks/export.py                        # demo-size FastPitch + source-filter vocoder, untrained, in .bench/export
    python benchmarks/export.py --vocoder vocos        # the same with the Vocos (or griffin_lim) in the graph
    python benchmarks/export.py --config my.yaml       # a trained run of yours, exported into --workdir

RTF = wall seconds of one synthesis / seconds of audio it made (token ids -> waveform; the front
end's espeak-ng call is outside the exported graph and inside pipeline.synthesize's figure).
Each runtime runs in a fresh process: the SavedModel and TFLite processes import TensorFlow alone
(`python -I`, this package not importable); "first" is the first call after loading (load and
import reported apart), "warm" the median of 3 calls after one at that length. Targets (DESIGN):
warm RTF <= 0.05 for the SavedModel (<= 0.02 with the source-filter vocoder), its first call <= 2 s,
TFLite float32 no slower. Separate processes' wall times can differ by 2x on a shared machine, so
"no slower" is judged apart: one more process loads both and calls them in turns (ROUNDS each per
length, alternating which goes first), and the verdict reads the median of the paired ratios.

Without --config the benchmark builds the caches of a 24-clip espeak-ng corpus and writes a
checkpoint of the demo's model sizes (configs/config.yaml) with its initial weights, the duration
predictor set to 6 frames a token (about real speech at hop 256), so the lengths and the
compute per second of audio are the demo's; speed does not depend on trained weights. With
`--vocoder source_filter` (the default, as configs/config.yaml) or `vocos` it also writes a demo-size
vocoder of that kind with its initial weights as the run's final vocoder (runs/{name}/vocoder.json).
Prints a Markdown table and writes every figure to {workdir}/export.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import common  # noqa: E402

SENTENCES = {
    "short": "Hello there.",
    "medium": "The quick brown fox jumps over the lazy dog.",
    "long": "Printing, in the only sense with which we are at present concerned, differs from most "
            "of the arts and crafts.",
}
ROUNDS = 9  # paired calls per length in the TFLite-against-SavedModel comparison

TIMER = """
    import json, os, statistics, sys, time
    t0 = time.perf_counter()
    import numpy as np
    import tensorflow as tf
    imported = time.perf_counter() - t0
    IDS, SR = {ids!r}, {sample_rate}

    def timed(call, ids):
        w, c = time.perf_counter(), time.process_time()
        n = call(ids)
        return time.perf_counter() - w, time.process_time() - c, n / SR

    def measure(load, call):
        t = time.perf_counter()
        load()
        out = {{"import_s": imported, "load_s": time.perf_counter() - t}}
        wall, cpu, sec = timed(call, IDS["medium"])
        out["first"] = {{"wall_s": wall, "cpu_s": cpu, "audio_s": sec, "rtf": wall / sec}}
        for name, ids in IDS.items():
            timed(call, ids)
            runs = [timed(call, ids) for _ in range(3)]
            wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            out[name] = {{"wall_s": wall, "cpu_s": cpu, "audio_s": runs[0][2], "rtf": wall / runs[0][2],
                         "cpu_rtf": cpu / runs[0][2]}}
        print(json.dumps(out))
"""

SAVED_MODEL = """
    state = {{}}
    def load():
        state["fn"] = tf.saved_model.load({path!r}).signatures["synthesize"]
    def call(ids):
        out = state["fn"](tokens=tf.constant([ids], tf.int32), pace=tf.constant(1.0), pitch_shift=tf.constant(0.0))
        return out["audio"].shape[1]
    measure(load, call)
"""

TFLITE = """
    state = {{}}
    def load():
        state["run"] = tf.lite.Interpreter(model_path={path!r}, num_threads=2).get_signature_runner("synthesize")
    def call(ids):
        out = state["run"](tokens=np.array([ids], np.int32), pace=np.float32(1.0), pitch_shift=np.float32(0.0))
        return out["audio"].shape[1]
    measure(load, call)
"""

PAIRED = """
    import statistics
    saved = tf.saved_model.load({saved!r}).signatures["synthesize"]
    lite = tf.lite.Interpreter(model_path={lite!r}, num_threads=2).get_signature_runner("synthesize")
    def call_saved(ids):
        out = saved(tokens=tf.constant([ids], tf.int32), pace=tf.constant(1.0), pitch_shift=tf.constant(0.0))
        return out["audio"].shape[1]
    def call_lite(ids):
        out = lite(tokens=np.array([ids], np.int32), pace=np.float32(1.0), pitch_shift=np.float32(0.0))
        return out["audio"].shape[1]
    out = {{}}
    for name, ids in IDS.items():
        call_saved(ids), call_lite(ids)
        walls = {{"saved": [], "lite": []}}
        for r in range({rounds}):                   # alternate which goes first: drift cancels
            order = (("saved", call_saved), ("lite", call_lite))
            for key, call in (order if r % 2 == 0 else order[::-1]):
                walls[key].append(timed(call, ids)[0])
        ratios = [b / a for a, b in zip(walls["saved"], walls["lite"])]
        out[name] = {{"saved_wall_s": statistics.median(walls["saved"]), "tflite_wall_s": statistics.median(walls["lite"]),
                     "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                     "rounds": {rounds}}}
    print(json.dumps(out))
"""

PIPELINE = """
    from pipeline import config
    from pipeline.vocoder import kinds
    from pipeline.synthesize import load_synthesizer
    cfg = config.load_config({path!r}, check_paths=False)
    state = {{}}
    TEXT = {{tuple(v): k for k, v in IDS.items()}}
    def load():
        state["synth"] = load_synthesizer(cfg, log=lambda *a: None)
        state["vocode"] = kinds.load(cfg)        # the run's vocoder, as synthesize loads it
    def call(ids):                                  # as `snakemake synthesize` does per sentence, less the wav
        mel = state["synth"].infer({sentences!r}[TEXT[tuple(ids)]])["mel"]
        return int(state["vocode"](mel).shape[0])
    measure(load, call)
"""


def run_worker(body, *, ids, sample_rate, clean, **fmt):
    code = textwrap.dedent(TIMER).format(ids=ids, sample_rate=sample_rate) + textwrap.dedent(body).format(**fmt)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [sys.executable, "-I", "-c", code] if clean else [sys.executable, "-c", code]
    if not clean:
        env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/" if clean else ROOT, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def demo_run(workdir, log, vocoder="source_filter"):
    """A config (demo model sizes) over a 24-clip corpus's caches, with an initial-weights checkpoint
    (and, unless vocoder is griffin_lim, an initial-weights final vocoder of that kind)."""
    import numpy as np
    import tensorflow as tf

    from pipeline import config, data, models, runinfo
    corpus = common.ensure_corpus(workdir / "corpus", 24, fmt="wav", log=log)
    path = common.bench_config(workdir / f"config-{vocoder}.yaml", name="export-bench",
                               dataset_root=workdir / "corpus", workdir=workdir, shards=2, train={"steps": 800},
                               vocoder={"kind": vocoder})
    common.snakemake("caches", config=path)
    cfg = config.load_config(path)
    ckpt_dir = config.run_dir(cfg) / "checkpoints"
    if tf.train.latest_checkpoint(str(ckpt_dir)) is None or not runinfo.path(ckpt_dir.parent).is_file():
        shutil.rmtree(ckpt_dir, ignore_errors=True)                             # one made before runs carried run.json
        index = data.read_index(cfg)
        stats = data.feature_stats(cfg, index)
        model = models.build(cfg["model"], index["vocab"], index["n_mels"])
        model(models.dummy_batch(8, 16, index["n_mels"]))
        model.adapt(stats)
        out = model.duration_predictor.out                                     # exactly 6 frames a token
        out.kernel.assign(np.zeros(out.kernel.shape, np.float32))
        out.bias.assign([np.log(7.0)])
        runinfo.write(ckpt_dir.parent, runinfo.for_training(cfg, index, stats, ckpt_dir.parent, resuming=False))
        tf.train.CheckpointManager(tf.train.Checkpoint(model=model), ckpt_dir, 1).save(checkpoint_number=1)
    if vocoder != "griffin_lim":
        demo_vocoder(cfg)
    return path, corpus


def demo_vocoder(cfg):
    """runs/{name}/vocoder.json and a checkpoint of the config's vocoder (demo sizes) with initial weights."""
    import tensorflow as tf

    from pipeline import config, files
    from pipeline.vocoder import kinds
    model = kinds.build(cfg["vocoder"], cfg["audio"])
    folder = config.run_dir(cfg) / "vocoder" / "bench" / "checkpoints"
    shutil.rmtree(folder, ignore_errors=True)
    checkpoint = tf.train.CheckpointManager(tf.train.Checkpoint(generator=model), folder, 1).save(checkpoint_number=0)
    summary = {"name": cfg["name"], "kind": cfg["vocoder"]["kind"], "phase": "bench", "steps": 0, "finetune_steps": 0,
               "checkpoint": checkpoint, "note": "initial weights: speed does not depend on training"}
    files.atomic_write_text(kinds.summary_path(cfg), json.dumps(summary, indent=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="a trained run's config (default: a demo-size untrained checkpoint)")
    parser.add_argument("--workdir", default=str(common.DEFAULT_WORKDIR / "export"))
    parser.add_argument("--vocoder", choices=["source_filter", "vocos", "griffin_lim"], default="source_filter",
                        help="the demo run's vocoder (ignored with --config: the run's own)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    machine = common.machine_info()
    from pipeline import config, export, text
    path, corpus = (Path(args.config), None) if args.config else demo_run(workdir, log, args.vocoder)
    cfg = config.load_config(path, check_paths=False)
    out = workdir / f"exported-{cfg['vocoder']['kind']}"
    t0 = time.perf_counter()
    meta = export.export(cfg, out, tflite=True, log=log)
    export_s = time.perf_counter() - t0
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    ids = {name: text.encode(s, vocab) for name, s in SENTENCES.items()}
    sr = cfg["audio"]["sample_rate"]
    results = {}
    for name, body, clean, target in (("SavedModel", SAVED_MODEL, True, out / "saved_model"),
                                      ("TFLite float32", TFLITE, True, out / "model.tflite"),
                                      ("TFLite float16", TFLITE, True, out / "model_float16.tflite"),
                                      ("pipeline.synthesize", PIPELINE, False, path)):
        log(f"measuring {name} ...")
        results[name] = run_worker(body, ids=ids, sample_rate=sr, clean=clean, path=str(target),
                                   sentences=SENTENCES)
    log("measuring TFLite float32 against the SavedModel, in one process, in turns ...")
    paired = run_worker(PAIRED, ids=ids, sample_rate=sr, clean=True, saved=str(out / "saved_model"),
                        lite=str(out / "model.tflite"), rounds=ROUNDS)
    rows = [[name, f"{r['import_s']:.1f} + {r['load_s']:.2f}", f"{r['first']['wall_s']:.2f} s",
             *(f"{r[k]['rtf']:.3f} ({r[k]['audio_s']:.1f} s)" for k in SENTENCES)]
            for name, r in results.items()]
    print(f"machine: {common.machine_line(machine)}; load average at end {os.getloadavg()[0]:.2f}")
    v = meta["vocoder"]
    vocoder = f"Griffin-Lim {v['iters']} iterations" if v["kind"] == "griffin_lim" else \
        f"{v['kind']} ({'trained' if v['steps'] else 'initial weights'})"
    print(f"export (SavedModel + 2 TFLite): {export_s:.0f} s; tokens {[len(v) for v in ids.values()]}; vocoder {vocoder}; "
          f"TFLite ops {meta['tflite']['float32']['ops']} {meta['tflite']['float32']['select_tf_ops'] or ''}")
    print(common.table(rows, ["runtime", "import + load s", "first call (medium)",
                              *(f"warm RTF {k} (audio)" for k in SENTENCES)]))
    saved = results["SavedModel"]
    warm = max(saved[k]["rtf"] for k in SENTENCES)
    print(f"TFLite float32 / SavedModel wall, one process, {ROUNDS} calls each in turns: " + "; ".join(
        f"{k} {p['ratio']:.2f}x ({p['ratio_min']:.2f}-{p['ratio_max']:.2f})" for k, p in paired.items()))
    print(f"SavedModel warm RTF <= 0.05: {common.verdict(warm <= 0.05)}, <= 0.02: {common.verdict(warm <= 0.02)} "
          f"(worst {warm:.3f}); first call <= 2 s: "
          f"{common.verdict(saved['first']['wall_s'] <= 2.0)} ({saved['first']['wall_s']:.2f} s); TFLite float32 "
          f"no slower (the paired medians): {common.verdict(all(p['ratio'] <= 1.0 for p in paired.values()))}")
    common.write_json(workdir / f"export-{cfg['vocoder']['kind']}.json", {
        "machine": machine, "loadavg_at_end": os.getloadavg(), "config": str(path), "corpus": corpus,
        "export_s": export_s, "vocoder": meta["vocoder"], "sentences": SENTENCES, "tokens": ids, "results": results,
        "tflite_over_saved_model": paired})


if __name__ == "__main__":
    main()
