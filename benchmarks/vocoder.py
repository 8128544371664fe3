"""Copy-synthesis quality of the run's trained vocoder against Griffin-Lim, on the validation clips.

A perfect acoustic model (the recorded mel itself) goes through both vocoders; evaluate's measures
(MCD, PESQ wideband at 16 kHz, STOI) against the recording. Reads runs/{name}/vocoder.json (train
it first: `snakemake --cores all vocoder`, or `python -m pipeline.vocoder.train --phase train --final`).

    python benchmarks/vocoder.py --config configs/config.yaml [--max-clips 20] [--summary runs/demo/vocoder/train.json]
    python benchmarks/vocoder.py --config configs/config.yaml --step-time vocos source_filter

`--step-time KIND ...`: seconds per training step of each kind (the config's sizes, one batch of the
demo's segments, spectral losses), measured in turns in one process, so that a loaded machine slows
them alike; prints each median and the ratios to the first kind. Needs only the caches.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import audio, config, evaluate  # noqa: E402
from pipeline.vocoder import kinds  # noqa: E402


def step_times(cfg, names, rounds=5, steps=10):
    """{kind: median seconds per training step}, the kinds timed in turns (warm, after their trace)."""
    from pipeline.vocoder.train import VocoderTrainer
    trainers = {}
    for kind in names:
        trainer = VocoderTrainer(dict(cfg, vocoder=dict(cfg["vocoder"], kind=kind)), "train", log=lambda *a: None)
        batch = next(iter(trainer.dataset("train")))
        float(trainer.step(batch, 0)["total"])                     # trace and warm up
        trainers[kind] = (trainer, batch)
    times = {kind: [] for kind in names}
    for _ in range(rounds):
        for kind, (trainer, batch) in trainers.items():
            t0 = time.perf_counter()
            for i in range(steps):
                terms = trainer.step(batch, i)
            float(terms["total"])
            times[kind].append((time.perf_counter() - t0) / steps)
    return {kind: sorted(t)[len(t) // 2] for kind, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--max-clips", type=int, default=20)
    parser.add_argument("--summary", help="a vocoder summary JSON (default runs/{name}/vocoder.json)")
    parser.add_argument("--step-time", nargs="+", metavar="KIND", help="time training steps of these kinds instead")
    args = parser.parse_args(argv)
    if args.step_time:
        times = step_times(config.from_args(args), args.step_time)
        first = times[args.step_time[0]]
        print(json.dumps({k: {"s_per_step": round(t, 4), "ratio": round(t / first, 3)} for k, t in times.items()}, indent=1))
        return
    cfg = config.load_config(args.config, {**config.parse_set(args.set), "evaluate": {"max_clips": args.max_clips}})
    voc = kinds.load(cfg, summary=args.summary)
    clips = evaluate.validation_clips(cfg)
    mels = {c.text: audio.mel_from_file(c.audio, cfg["audio"], cfg["dataset"]["max_seconds"]) for c in clips}
    t0 = time.perf_counter()
    frames = 0
    for m in mels.values():  # vocoder speed alone (after one warm-up call)
        voc(m)
    t0, frames = time.perf_counter(), 0
    for m in mels.values():
        voc(m)
        frames += len(m)
    seconds = frames * cfg["audio"]["hop_length"] / cfg["audio"]["sample_rate"]
    rtf = (time.perf_counter() - t0) / seconds
    result, _ = evaluate.compare(clips, mels.__getitem__, evaluate.Analyser(cfg, voc), log=lambda *a: None)
    out = {"clips": result["clips"], "vocoder": {"kind": voc.kind, "steps": voc.steps,
                                                 "finetune_steps": voc.finetune_steps},
           "mcd_db_griffin_lim": result["mcd_db_ceiling"], "mcd_db_vocoder": result["mcd_db_vocoder_ceiling"],
           "pesq": result["pesq"], "stoi": result["stoi"], "mos": result.get("mos"), "wer": result.get("wer"),
           "f0_gross_error_vocoder": result.get("f0_gross_error_vocoder_ceiling"),
           "vocoder_real_time_factor": round(rtf, 4)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
