"""Copy-synthesis quality of the run's trained vocoder against Griffin-Lim, on the validation clips.

A perfect acoustic model (the recorded mel itself) goes through both vocoders; evaluate's measures
(MCD, PESQ wideband at 16 kHz, STOI) against the recording. Reads runs/{name}/vocoder.json (train
it first: `snakemake --cores all vocoder`, or `python -m pipeline.vocoder.train --phase train --final`).

    python benchmarks/vocoder.py --config configs/config.yaml [--max-clips 20] [--summary runs/demo/vocoder/train.json]
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import audio, config, evaluate  # noqa: E402
from pipeline.vocoder import kinds  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--max-clips", type=int, default=20)
    parser.add_argument("--summary", help="a vocoder summary JSON (default runs/{name}/vocoder.json)")
    args = parser.parse_args(argv)
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
           "pesq": result["pesq"], "stoi": result["stoi"], "vocoder_real_time_factor": round(rtf, 4)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
