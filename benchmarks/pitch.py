"""Pitch extractor benchmark: speed and accuracy of pitch.method dio | harvest | pyin.

    python benchmarks/pitch.py                  # 40 espeak-ng clips (spoken once into .bench/pitch), ~2 min on 2 cores
    python benchmarks/pitch.py --clips 100

Speed: audio-seconds per CPU-second of `pipeline.pitch.f0` over the same espeak-ng clips (22,050 Hz,
hop 256, fmin 65, fmax 600), one process. Accuracy, where the truth is known: voice-like tones (10
harmonics, amplitude 1/k) whose F0 glides exponentially between 80 and 320 Hz, with 50 ms
silences, on the mel's frame grid: median and 95th-percentile relative error on frames that are
voiced in the truth and in the estimate, and the voicing decision's error rate. Agreement on the
espeak-ng speech itself, where no truth exists: the share of frames where each method and Harvest
agree within 5 % (both voiced). Figures go to {workdir}/pitch.json and are copied into RESULTS.md by hand.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT))
from pipeline import audio, make_corpus, pitch  # noqa: E402

SR, HOP, FMIN, FMAX = 22050, 256, 65.0, 600.0


def glide(seconds, low, high, rng):
    """A voice-like tone gliding low -> high, 50 ms of silence at both ends; its F0 per mel frame."""
    n = int(SR * seconds)
    t = np.arange(n) / SR
    rate = np.log(high / low) / seconds
    phase = 2 * np.pi * low * np.expm1(rate * t) / rate + rng.uniform(0, 2 * np.pi)
    y = sum(0.3 / k * np.sin(k * phase) for k in range(1, 11))
    y += 0.003 * rng.standard_normal(n)
    quiet = int(0.05 * SR)
    y[:quiet] = y[-quiet:] = 0.003 * rng.standard_normal(quiet)
    frames = audio.n_frames(n, HOP)
    centres = np.arange(frames) * HOP + HOP / 2
    truth = low * np.exp(rate * centres / SR)
    truth[(centres < quiet + HOP) | (centres > n - quiet - HOP)] = 0
    return y.astype(np.float32), truth


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    p.add_argument("--clips", type=int, default=40)
    args = p.parse_args(argv)
    corpus = args.workdir.resolve() / "pitch" / f"corpus-{args.clips}"
    if not (corpus / "metadata.csv").exists():
        make_corpus.make_corpus(ROOT / "data" / "ljspeech_transcripts.csv", corpus, count=args.clips, fmt="wav",
                                sample_rate=SR, jobs=2)
    clips = [audio.load_audio(w, sample_rate=SR, max_seconds=60) for w in sorted((corpus / "wavs").glob("*.wav"))]
    seconds = sum(len(y) for y in clips) / SR
    rng = np.random.default_rng(0)
    tones = [glide(s, lo, hi, rng) for s, lo, hi in [(1.5, 80, 320), (1.0, 320, 80), (2.0, 100, 200), (0.8, 150, 300)]]
    out = {"machine": common.machine_info(), "clips": len(clips), "audio_seconds": round(seconds, 1), "methods": {}}
    tracks = {}
    for method in pitch.METHODS:
        kw = dict(sample_rate=SR, hop_length=HOP, fmin=FMIN, fmax=FMAX, method=method)
        t0 = time.process_time()
        tracks[method] = [pitch.f0(y, n_frames=audio.n_frames(len(y), HOP), **kw) for y in clips]
        cpu = time.process_time() - t0
        errors, voicing = [], []
        for y, truth in tones:
            f = pitch.f0(y, n_frames=len(truth), **kw)
            both = (f > 0) & (truth > 0)
            errors.append(np.abs(f[both] - truth[both]) / truth[both])
            voicing.append((f > 0) != (truth > 0))
        errors, voicing = np.concatenate(errors), np.concatenate(voicing)
        out["methods"][method] = {"audio_s_per_cpu_s": round(seconds / cpu, 1), "cpu_s": round(cpu, 2),
                                  "median_rel_error": round(float(np.median(errors)), 4),
                                  "p95_rel_error": round(float(np.percentile(errors, 95)), 4),
                                  "voicing_error": round(float(voicing.mean()), 3),
                                  "voiced_share_speech": round(float(np.mean(np.concatenate(tracks[method]) > 0)), 3)}
    ref = np.concatenate(tracks["harvest"])
    for method in pitch.METHODS:
        f = np.concatenate(tracks[method])
        both = (f > 0) & (ref > 0)
        agree = np.abs(f[both] - ref[both]) / ref[both] < 0.05
        out["methods"][method]["agrees_with_harvest"] = round(float(agree.mean()), 3)
    rows = [[m, r["audio_s_per_cpu_s"], r["median_rel_error"], r["p95_rel_error"], r["voicing_error"],
             r["voiced_share_speech"], r["agrees_with_harvest"]] for m, r in out["methods"].items()]
    print(common.machine_line(out["machine"]))
    print(f"{len(clips)} espeak-ng clips, {seconds:.0f} s of audio")
    print(common.table(rows, ["method", "audio-s / CPU-s", "median rel. error (tones)", "p95 rel. error",
                              "voicing error (tones)", "voiced share (speech)", "agrees with harvest (speech)"]))
    path = common.write_json(args.workdir.resolve() / "pitch.json", out)
    print(f"figures in {path}")


if __name__ == "__main__":
    main()
