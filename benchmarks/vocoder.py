"""Copy-synthesis quality of the run's trained vocoder against Griffin-Lim, on the validation clips.

A perfect acoustic model (the recorded mel itself) goes through both vocoders; evaluate's measures
(MCD, also split by the recording's voicing, PESQ wideband at 16 kHz, STOI) against the recording.
Reads runs/{name}/vocoder.json (train it first: `snakemake --cores all vocoder`, or
`python -m pipeline.vocoder.train --phase train --final`).

    python benchmarks/vocoder.py --config configs/config.yaml [--max-clips 20] [--summary runs/demo/vocoder/train.json]
    python benchmarks/vocoder.py --config configs/config.yaml --heldout 1000:40
    python benchmarks/vocoder.py --config configs/config.yaml --step-time vocos source_filter

`--heldout START:COUNT`: the same copy-synthesis on COUNT lines of data/ljspeech_transcripts.csv
from line START, spoken here by espeak-ng (`--voice`, default text.language) into
--workdir/vocoder_heldout/VOICE/ (kept for the next run), instead of the run's validation clips:
sentences the run never saw (the demo's corpus is the first 90 lines), as many as wanted, so that
the naturalness lead over Griffin-Lim's copy (`mos_leads`, with evaluate's 95 % bootstrap interval)
rests on more clips than the demo's 9. Their F0 is evaluate's analysis of the audio (`pitch.method`,
as the pitch cache's).

`--world`: also WORLD's own analysis-synthesis of each recording (pyworld: DIO + StoneMask,
CheapTrick, D4C at a 5 ms frame period), the source-filter reference the naturalness target was set
against: its median naturalness and its leads over Griffin-Lim's copy and the recording, paired per
clip as `mos_leads` (`world`).

`synthesized` in the output is the recorded mel through the vocoder with its own F0 head's F0 (what
`pipeline.vocode` does without --f0); with `--tts`, the run's acoustic model saying each clip's text,
as `evaluate` measures it (its MCD, F0 errors, PESQ, STOI, naturalness and WER, and its lead over the
recording), so that the TTS targets, too, can be judged on more sentences than the demo's 9.

`--step-time KIND ...`: seconds per training step of each kind (the config's sizes, one batch of the
demo's segments, spectral losses), measured in turns in one process (`--rounds` turns of 10 steps
each), so that a loaded machine slows them alike. Prints each kind's median and fastest turn, and
its ratio to the first kind: the median over the rounds of the ratio within each round (a drift in
the machine's speed cancels within a round), with the lowest and highest of those ratios. Needs only
the caches.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import audio, config, evaluate, make_corpus  # noqa: E402
from pipeline.vocoder import kinds  # noqa: E402
from pipeline.wavfile import as_heard, save_wav  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def step_times(cfg, names, rounds=5, steps=10):
    """{kind: [seconds per training step in each round]}, the kinds timed in turns (warm, after their trace)."""
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
    return times


def step_summary(times):
    """Each kind's median and fastest turn (s per step) and its ratio to the first kind's: the median of
    the per-round ratios, with their lowest and highest."""
    first = next(iter(times.values()))
    out = {}
    for kind, t in times.items():
        ratios = sorted(x / y for x, y in zip(t, first))
        out[kind] = {"s_per_step": round(float(np.median(t)), 4), "fastest": round(min(t), 4),
                     "ratio": round(float(np.median(ratios)), 3), "ratio_range": [round(ratios[0], 3), round(ratios[-1], 3)]}
    return out


def line_range(spec):
    """"START:COUNT" -> (START, COUNT); ValueError unless START >= 0 and COUNT >= 1."""
    start, count = (int(x) for x in spec.split(":"))
    if start < 0 or count < 1:
        raise ValueError(spec)
    return start, count


def heldout_clips(spec, voice, folder):
    """[evaluate.Clip] of the transcript lines START..START+COUNT (spec "START:COUNT"), spoken by espeak-ng
    into folder/voice/ (a wav already there is kept), their F0 left to evaluate's analysis."""
    start, count = line_range(spec)
    folder = folder / voice
    folder.mkdir(parents=True, exist_ok=True)
    clips = []
    for cid, text, _ in make_corpus.read_transcripts(ROOT / "data/ljspeech_transcripts.csv", start=start, count=count):
        path = folder / f"{cid}.wav"
        if not path.exists():
            y, sr = make_corpus.speak(text, voice=voice)
            save_wav(path, y, sr)
        clips.append(evaluate.Clip(cid, text, path))
    return clips


def world_naturalness(clips, sample_rate, max_seconds):
    """[naturalness of WORLD's analysis-synthesis of each clip's recording] (evaluate's MOS predictor)."""
    import pyworld

    from pipeline import metrics
    scores = []
    for clip in clips:
        y = audio.load_audio(clip.audio, sample_rate=sample_rate, max_seconds=max_seconds).astype(np.float64)
        f0, t = pyworld.dio(y, sample_rate, frame_period=5.0)
        f0 = pyworld.stonemask(y, f0, t, sample_rate)
        sp, ap = pyworld.cheaptrick(y, f0, t, sample_rate), pyworld.d4c(y, f0, t, sample_rate)
        copy = pyworld.synthesize(f0, sp, ap, sample_rate, 5.0)[:len(y)].astype(np.float32)
        scores.append(metrics.naturalness(as_heard(copy), sample_rate))  # as saved, as evaluate hears its signals
    return scores


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--max-clips", type=int, default=20)
    parser.add_argument("--summary", help="a vocoder summary JSON (default runs/{name}/vocoder.json)")
    parser.add_argument("--step-time", nargs="+", metavar="KIND", help="time training steps of these kinds instead")
    parser.add_argument("--rounds", type=int, default=15, help="--step-time: turns of 10 steps per kind")
    parser.add_argument("--heldout", metavar="START:COUNT", help="transcript lines spoken by espeak-ng instead of "
                        "the validation clips")
    parser.add_argument("--voice", default="", help="espeak-ng voice for --heldout (default text.language)")
    parser.add_argument("--workdir", default=str(ROOT / ".bench"))
    parser.add_argument("--world", action="store_true", help="also score WORLD's analysis-synthesis of each recording")
    parser.add_argument("--tts", action="store_true", help="`synthesized`: the acoustic model saying the text")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: 1 or more")
    if args.heldout:
        try:
            line_range(args.heldout)
        except ValueError:
            parser.error(f"--heldout {args.heldout!r}: START:COUNT, START 0 or more, COUNT 1 or more")
    if args.step_time:
        times = step_times(config.from_args(args), args.step_time, rounds=args.rounds)
        print(json.dumps({"rounds": args.rounds, **step_summary(times)}, indent=1))
        return
    cfg = config.load_config(args.config, {**config.parse_set(args.set), "evaluate": {"max_clips": args.max_clips}})
    voc = kinds.load(cfg, summary=args.summary)
    clips = (heldout_clips(args.heldout, args.voice or cfg["text"]["language"], Path(args.workdir) / "vocoder_heldout")
             if args.heldout else evaluate.validation_clips(cfg))
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
    synth_mel = mels.__getitem__
    if args.tts:
        from pipeline.synthesize import load_synthesizer
        synth_mel = load_synthesizer(cfg, log=lambda *a: None).mel_f0
    result, rows = evaluate.compare(clips, synth_mel, evaluate.Analyser(cfg, voc), log=lambda *a: None)
    if args.world:
        world = world_naturalness(clips, cfg["audio"]["sample_rate"], cfg["dataset"]["max_seconds"])
        result["mos"]["world"] = float(np.median(world))
        result["mos_leads"].update({f"world_over_{name}": evaluate.lead(world, [r.get(f"mos_{name}") for r in rows])
                                    for name in ("griffin_lim_ceiling", "recording")})
    out = {"clips": result["clips"], "vocoder": {"kind": voc.kind, "steps": voc.steps,
                                                 "finetune_steps": voc.finetune_steps},
           "mcd_db_griffin_lim": result["mcd_db_ceiling"], "mcd_db_vocoder": result["mcd_db_vocoder_ceiling"],
           "mcd_db_by_voicing": {name: {part: result[f"mcd_db_{part}_{suffix}"] for part in ("voiced", "unvoiced")}
                                 for name, suffix in (("griffin_lim", "ceiling"), ("vocoder", "vocoder_ceiling"))},
           "voiced_share": result["voiced_share"],
           "pesq": result["pesq"], "stoi": result["stoi"], "mos": result.get("mos"), "wer": result.get("wer"),
           "mos_leads": result.get("mos_leads"), "heldout": args.heldout,
           "synthesized": {"by": "the acoustic model" if args.tts else "the recorded mel, the F0 head's F0",
                           "mcd_db": result["mcd_db"], "mcd_db_chance": result["mcd_db_other"],
                           "f0_gross_error": result["f0_gross_error"], "duration_ratio": result["duration_ratio"]},
           "f0_gross_error_vocoder": result.get("f0_gross_error_vocoder_ceiling"),
           "vocoder_real_time_factor": round(rtf, 4)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
