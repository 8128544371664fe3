"""Does the trained model say the sentences? MCD, duration and F0 of held-out clips, with references.

    python -m pipeline.evaluate --config configs/config.yaml [--out reports/demo]
    snakemake --cores all evaluate

For each validation clip (held out from training by id hash; at most `evaluate.max_clips`, by id),
the latest checkpoint speaks the clip's text (`pipeline.synthesize.load_synthesizer`, so every model
kind works alike), Griffin-Lim turns the mel into audio, and the audio is compared with the recording
(pipeline/metrics.py): mel-cepstral distortion (MCD, DTW-aligned, c0 excluded), length ratio, and F0
RMSE on the DTW pairs voiced in both. Every figure has two references beside it: the same measure
for Griffin-Lim resynthesis of the recording's own mel (the ceiling this vocoder allows) and for
the synthesized audio against OTHER clips' recordings (chance: the model says something, not this).

Reads the run's own vocabulary and mel statistics (runs/{name}/run.json, through the synthesizer),
the caches' index (the split), the recordings' F0 from the pitch
cache (pipeline.pitch makes the synthesized audio's), duration shards where they exist (the
`aligner` block), the dataset's audio and metadata, runs/{name}/checkpoints; config keys
`evaluate:`, `audio:`, `pitch:`, `dataset:`, `synthesize:` (what the synthesizer honours), `model:`.
Writes evaluate.json, evaluate.md, evaluate.png (pipeline/evaluate_report.py), the synthesized
audio it measured (evaluate_audio/{id}.wav) and TensorBoard scalars `evaluate/*` at the
checkpoint's step in runs/{name}/.
"""
import argparse
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import audio, config, manifest, metrics, pitch, shards
from pipeline.errors import PipelineError, cli

GL_POWER = 1.0  # Griffin-Lim without the listening sharpening (power 1.5 tilts the spectrum: +4 dB MCD)
ARRAYS = ("recorded_mel", "synthesized_mel", "path", "synthesized_audio")  # per-clip rows, not in the JSON
MIN_FRAMES = 2  # a decoder that stops at once still yields a (silent) signal to compare

_print = functools.partial(print, flush=True)


class NoValidationClips(PipelineError):
    """The split holds no clip out of training, so nothing can be compared."""


@dataclass
class Clip:
    id: str
    text: str
    audio: Path
    f0: np.ndarray = None  # recorded F0 per mel frame from the pitch cache; None: extracted here


def validation_clips(cfg):
    """[Clip] of the cached validation split, sorted by id, at most evaluate.max_clips, each with its
    recorded F0 from the pitch cache."""
    from pipeline import data  # TensorFlow: only when a model is evaluated

    clips, paths = data.load_clips(cfg, "val")
    ds = cfg["dataset"]
    texts = {c.id: c.text for c in manifest.read_metadata(Path(ds["root"]) / ds["metadata"])}
    order = sorted((cid, k) for k, cid in enumerate(clips.ids) if cid in texts)[:cfg["evaluate"]["max_clips"]]
    if not order:
        raise NoValidationClips(
            f"no validation clip: dataset.val_fraction = {ds['val_fraction']} holds none of the cached clips "
            "out of training; raise it (e.g. 0.05), then rerun `snakemake --cores all evaluate` (this retrains)")
    out, pitch = [], {}  # pitch: shard -> {id: F0}, each shard read (and checked) once
    for cid, k in order:
        shard = clips.shard[k]
        if shard not in pitch:
            meta, tracks = shards.read(Path(paths["pitch"][shard]).with_suffix(""), "pitch")
            pitch[shard] = dict(zip(meta["ids"], tracks))
        out.append(Clip(cid, texts[cid], manifest.audio_path(ds["root"], ds["audio_dir"], cid), pitch[shard][cid]))
    return out


def _lengths(prefix, kind):
    meta = shards.read_meta(prefix, kind)
    return dict(zip(meta["ids"], meta["lengths"]))


def aligner_check(cfg):
    """{clips, sums_ok, monotonic} over every clip of the duration shards (None where there are none):
    the shares whose durations sum to the clip's mel frames, and that give every token, in order, a
    whole number >= 0 of frames (a monotonic path through all tokens)."""
    from pipeline import data

    root, index = config.cache_dir(cfg), data.read_index(cfg)
    clips = sums_ok = monotonic = 0
    for entry in index["shards"]:
        prefix = shards.prefix(root, "durations", entry["shard"])
        if not prefix.with_suffix(".json").exists():
            continue
        meta, durations = shards.read(prefix, "durations")
        frames, tokens = _lengths(root / entry["mels"], "mels"), _lengths(root / entry["tokens"], "tokens")
        for cid, d in zip(meta["ids"], durations):
            clips += 1
            sums_ok += int(d.sum()) == frames.get(cid)
            monotonic += len(d) == tokens.get(cid) and bool((d >= 0).all())
    if not clips:
        return None
    return {"clips": clips, "sums_ok": sums_ok / clips, "monotonic": monotonic / clips}


class Analyser:
    """Audio -> what the measures need: F0 (pipeline.pitch, as the pitch cache) and mel-cepstra, on the
    mel frame grid."""

    def __init__(self, cfg):
        self.a, self.pitch, self.iters = cfg["audio"], cfg["pitch"], cfg["evaluate"]["griffin_lim_iters"]
        self.max_seconds = cfg["dataset"]["max_seconds"]

    def vocode(self, log_mel):
        from pipeline.vocoder import griffin_lim

        y = np.asarray(griffin_lim(log_mel, iters=self.iters, power=GL_POWER, **self.a))
        return np.pad(y, (0, max(0, MIN_FRAMES * self.a["hop_length"] - len(y))))

    def f0(self, y):
        sr, hop = self.a["sample_rate"], self.a["hop_length"]
        return pitch.f0(y, sample_rate=sr, hop_length=hop, n_frames=audio.n_frames(len(y), hop), **self.pitch)

    def __call__(self, y, f0=None):
        f0 = self.f0(y) if f0 is None else f0
        return {"f0": f0, "mc": metrics.mel_cepstra(y, f0, sample_rate=self.a["sample_rate"],
                                                    hop_length=self.a["hop_length"], f0_floor=self.pitch["fmin"])}


def _median(values):
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def _f0_rmse(f0_a, f0_b, path):
    rmse, frames = metrics.f0_rmse(f0_a, f0_b, path)
    return rmse if frames else None  # None: no frame voiced in both


def compare(clips, synth_mel, analyse, log=_print):
    """Per-clip rows and the summary fields of evaluate.json. `synth_mel(text)` -> log-mel."""
    a = analyse.a
    recorded, synthesized, rows = [], [], []
    for clip in clips:
        y = audio.load_audio(clip.audio, sample_rate=a["sample_rate"], max_seconds=analyse.max_seconds)
        mel = audio.mel_spectrogram(y, **a)                                     # (F, n_mels)
        rec, ceil = analyse(y, clip.f0), analyse(analyse.vocode(mel))
        smel = synth_mel(clip.text)                                             # (F', n_mels)
        y_syn = analyse.vocode(smel)
        syn = analyse(y_syn)
        mcd_db, path_ = metrics.mcd(syn["mc"], rec["mc"])
        mcd_ceiling, path_ceiling = metrics.mcd(ceil["mc"], rec["mc"])
        rows.append({"id": clip.id, "mcd_db": mcd_db, "mcd_db_ceiling": mcd_ceiling,
                     "duration_ratio": len(smel) / len(mel),
                     "f0_rmse_hz": _f0_rmse(syn["f0"], rec["f0"], path_),
                     "f0_rmse_hz_ceiling": _f0_rmse(ceil["f0"], rec["f0"], path_ceiling),
                     "f0_gross_error": metrics.f0_gross_error(syn["f0"], rec["f0"], path_),
                     "f0_gross_error_ceiling": metrics.f0_gross_error(ceil["f0"], rec["f0"], path_ceiling),
                     "recorded_mel": mel, "synthesized_mel": smel, "path": path_, "synthesized_audio": y_syn})
        recorded.append(rec)
        synthesized.append(syn)
        log(f"{clip.id}: MCD {mcd_db:.2f} dB (ceiling {mcd_ceiling:.2f}), {len(smel)} / {len(mel)} frames: "
            f"{clip.text!r}")
    for i, row in enumerate(rows):  # chance: this clip's synthesis against the other clips' recordings
        others = [metrics.mcd(synthesized[i]["mc"], recorded[j]["mc"])[0] for j in range(len(rows)) if j != i]
        row["mcd_db_other"] = float(np.median(others)) if others else None
    summary = {"clips": len(rows),
               **{k: _median([r[k] for r in rows])
                  for k in ("mcd_db", "mcd_db_other", "mcd_db_ceiling", "duration_ratio", "f0_rmse_hz",
                            "f0_rmse_hz_ceiling", "f0_gross_error", "f0_gross_error_ceiling")}}
    return summary, rows


def evaluate(cfg, out, log=_print):
    """Measure the latest checkpoint on the validation clips; write the report into `out`."""
    from pipeline.evaluate_report import write_report
    from pipeline.synthesize import load_synthesizer
    from pipeline.vocoder import save_wav

    synth = load_synthesizer(cfg, log)  # MissingCheckpoint first: the clearest thing to fix
    clips = validation_clips(cfg)
    log(f"evaluating {synth.checkpoint} (step {synth.step}) on {len(clips)} validation clips")
    summary, rows = compare(clips, synth.mel, Analyser(cfg), log)
    report = {**summary, "checkpoint": synth.checkpoint, "step": synth.step,
              "model": cfg["model"].get("kind"),
              "griffin_lim_iters": cfg["evaluate"]["griffin_lim_iters"],
              "per_clip": [{k: v for k, v in r.items() if k not in ARRAYS} for r in rows]}
    aligner = aligner_check(cfg)
    if aligner is not None:  # only where an aligner made duration caches
        report["aligner"] = aligner
    write_report(report, rows, out)
    listen = Path(out) / "evaluate_audio"  # what was measured, to listen to beside the recordings
    for old in listen.glob("*.wav"):
        old.unlink()
    for r in rows:
        save_wav(listen / f"{r['id']}.wav", r["synthesized_audio"], cfg["audio"]["sample_rate"])
    _tensorboard(cfg, report)
    log(f"MCD {report['mcd_db']:.2f} dB; ceiling {report['mcd_db_ceiling']:.2f}, chance "
        f"{report['mcd_db_other'] if report['mcd_db_other'] is None else round(report['mcd_db_other'], 2)}; "
        f"report in {out}")
    return report


def _tensorboard(cfg, report):
    """evaluate/* scalars at the checkpoint's step, beside the training curves."""
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(config.run_dir(cfg)))
    with writer.as_default():
        for key in ("mcd_db", "mcd_db_other", "mcd_db_ceiling", "duration_ratio", "f0_rmse_hz"):
            if report[key] is not None:
                tf.summary.scalar(f"evaluate/{key}", report[key], step=report["step"])
    writer.close()


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--out", help="report folder (default {reports_dir}/{name})")
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    evaluate(cfg, Path(args.out or config.report_dir(cfg)))


if __name__ == "__main__":
    main()
