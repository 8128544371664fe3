"""Evaluate report: evaluate.json (every field), evaluate.md (plain words), evaluate.png (a few clips).

pipeline/evaluate.py measures; this module places the model between its two references and writes.
Reads the report dict and per-clip rows that pipeline.evaluate.compare() builds (no config keys).

    python -m pipeline.evaluate --config configs/config.yaml     # measures, then calls write_report
"""
import io
import json
from pathlib import Path

import numpy as np

from pipeline.files import atomic_write_bytes, atomic_write_text

NEAR_CEILING = 0.25  # within a quarter of the ceiling-to-chance gap: as good as this vocoder allows
AT_CHANCE = 0.8      # past four fifths of the gap: no nearer its own sentence than to others
PLOT_CLIPS = 3       # clips drawn in evaluate.png


VOCODER_NAMES = {"vocos": "Vocos", "hifigan": "HiFi-GAN"}


def mcd_ceiling(report):
    """The MCD ceiling the synthesized row is held to: the trained vocoder's copy-synthesis when the
    synthesized audio went through it (the same vocoder), else Griffin-Lim's."""
    voc = report.get("mcd_db_vocoder_ceiling")
    return report["mcd_db_ceiling"] if voc is None else voc


def _vocoder_name(report):
    """The vocoder the synthesized row was heard through: Griffin-Lim unless a trained one made it."""
    kind = (report.get("vocoder") or {}).get("kind")
    if report.get("mcd_db_vocoder_ceiling") is None or not kind:
        return "Griffin-Lim"
    return VOCODER_NAMES.get(kind, kind)


def position(report):
    """Where mcd_db lies from the ceiling (0) to chance (1); None without both references."""
    ceiling, chance = mcd_ceiling(report), report["mcd_db_other"]
    if chance is None or ceiling is None or chance <= ceiling:
        return None
    return (report["mcd_db"] - ceiling) / (chance - ceiling)


def verdict(report):
    """One plain sentence: at chance, near the ceiling, or between."""
    p = position(report)
    if report["mcd_db_other"] is None:
        return ("No chance reference: it needs at least two validation clips (raise dataset.val_fraction), "
                "so only the ceiling row below places the model.")
    if p is None:
        return ("The references do not separate (resynthesis is no nearer the recordings than other sentences "
                "are), so the MCD says little here: check the corpus and audio settings.")
    if p >= AT_CHANCE:
        return ("At chance: the synthesized speech is about as far from its own recording as from other "
                "sentences' recordings, so the model does not yet say the sentences. Train longer, or check "
                "the alignment images in TensorBoard.")
    if p <= NEAR_CEILING:
        return (f"Near the ceiling: the synthesized speech is about as close to the recordings as {_vocoder_name(report)} "
                "resynthesis of the recordings themselves; a better vocoder, not more training, is the next gain.")
    return (f"Between chance and the ceiling ({100 * p:.0f} % of the way from the ceiling to chance): the synthesized "
            "speech is nearer its own sentence than other sentences, but short of what the vocoder allows; more "
            "training or data should bring it nearer the ceiling.")


def _fmt(v, digits=2):
    return "n/a" if v is None else f"{v:.{digits}f}"


def _pct(v):
    return "n/a" if v is None else f"{100 * v:.1f} %"


def speaker_lines(report):
    """With several speakers: speaker similarity and the main figures per speaker."""
    if "per_speaker" not in report:
        return []
    sim = report.get("speaker_similarity")
    out = [f"Speaker similarity: {_pct(sim['accuracy'])} of {sim['clips']} synthesized clips are nearest their own "
           f"speaker's recordings (chance {_pct(sim['chance'])}; voice = mean mel-cepstrum, mean and spread of log F0)."
           if sim else "Speaker similarity: n/a (too few validation clips per speaker).", "",
           "| speaker | clips | MCD dB | chance dB | length ratio | F0 RMSE Hz |", "|---|---|---|---|---|---|"]
    for name, r in report["per_speaker"].items():
        out.append(f"| {name} | {r['clips']} | {_fmt(r['mcd_db'])} | {_fmt(r['mcd_db_other'])} "
                   f"| {_fmt(r['duration_ratio'])} | {_fmt(r['f0_rmse_hz'], 1)} |")
    return out + [""]


def _rows(report):
    """(label, synthesized, [ceilings...], chance) lines of the summary table; the ceilings are the trained
    vocoder's copy-synthesis (when there is one) and Griffin-Lim's."""
    voc = report.get("mcd_db_vocoder_ceiling") is not None
    ceilings = (["vocoder_ceiling"] if voc else []) + ["ceiling"]
    pesq, stoi = report.get("pesq") or {}, report.get("stoi") or {}
    heard = {"vocoder_ceiling": "vocoder_ceiling", "ceiling": "griffin_lim_ceiling"}
    return [("MCD, dB (lower is better)", _fmt(report["mcd_db"]),
             [_fmt(report.get(f"mcd_db_{c}")) for c in ceilings], _fmt(report["mcd_db_other"])),
            ("F0 RMSE, Hz, frames voiced in both", _fmt(report["f0_rmse_hz"], 1),
             [_fmt(report.get(f"f0_rmse_hz_{c}"), 1) for c in ceilings], ""),
            ("F0 gross errors (> 20 % off, mostly octave jumps), share of those frames",
             _pct(report.get("f0_gross_error")), [_pct(report.get(f"f0_gross_error_{c}")) for c in ceilings], ""),
            ("length, synthesized / recorded", _fmt(report["duration_ratio"]), ["1.00" for _ in ceilings], ""),
            ("PESQ wideband, 1-4.6 (higher is better)", _fmt(pesq.get("synthesized")),
             [_fmt(pesq.get(heard[c])) for c in ceilings], ""),
            ("STOI, 0-1 (higher is better)", _fmt(stoi.get("synthesized"), 3),
             [_fmt(stoi.get(heard[c]), 3) for c in ceilings], "")], ceilings


def markdown(report):
    name = _vocoder_name(report)
    rows, ceilings = _rows(report)
    heads = {"vocoder_ceiling": f"ceiling: {name} copy-synthesis of the recording",
             "ceiling": "reference: Griffin-Lim copy-synthesis" if len(ceilings) > 1 else
                        "ceiling: Griffin-Lim copy-synthesis of the recording"}
    cols = ["measure", f"synthesized (through {name})", *[heads[c] for c in ceilings], "chance (other sentences)"]
    lines = [f"# Evaluate: {report['clips']} validation clips, checkpoint step {report['step']}", "",
             verdict(report), "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join([label, syn, *ceil, chance]) + " |" for label, syn, ceil, chance in rows]
    lines.append("")
    if "aligner" in report:
        al = report["aligner"]
        lines += [(f"Aligner durations: {al['clips']} clips; {100 * al['sums_ok']:.0f} % sum to their mel frames, "
                  f"{100 * al['monotonic']:.0f} % monotonic."), ""]
    lines += speaker_lines(report)
    voc = len(ceilings) > 1
    lines += [("Medians over the clips. MCD: mel-cepstral distortion (order 24, c0 excluded) of WORLD envelopes over the "
              "band the mel carries, frames paired by DTW. The synthesized row is the model's mel through "
              f"{name if voc else 'Griffin-Lim'}; the ceiling rows resynthesize each recording's own mel "
              f"({'with the same vocoder, and with ' if voc else 'with '}Griffin-Lim, {report['griffin_lim_iters']} "
              "iterations). PESQ and STOI compare with the recording sample by sample: for the copy-syntheses they measure "
              "the vocoder alone; the synthesized audio is re-timed onto the recording along the DTW path, and what "
              "timing and pitch differences remain count against it as well. Chance compares each synthesized clip "
              "with the other clips' recordings."), "",
              f"| clip | MCD dB | {'vocoder ceiling dB | ' if voc else ''}Griffin-Lim ceiling dB | chance dB "
              "| length ratio | F0 RMSE Hz |", "|---|---|---|---|---|---|" + ("---|" if voc else "")]
    for r in report["per_clip"]:
        vc = f"{_fmt(r.get('mcd_db_vocoder_ceiling'))} | " if voc else ""
        lines.append(f"| {r['id']} | {_fmt(r['mcd_db'])} | {vc}{_fmt(r['mcd_db_ceiling'])} | {_fmt(r['mcd_db_other'])} "
                     f"| {_fmt(r['duration_ratio'])} | {_fmt(r['f0_rmse_hz'], 1)} |")
    model = f"model `{report['model']}`, " if report.get("model") else ""
    lines += ["", (f"{model}checkpoint `{report['checkpoint']}`. evaluate.png: recorded and synthesized mels of the "
              "first clips and the DTW path that pairs their frames (a straight diagonal = same timing); "
                   "evaluate_audio/ holds the synthesized audio measured."), ""]
    return "\n".join(lines)


def figure(rows):
    """PNG bytes: per clip, recorded mel | synthesized mel | DTW path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rows[:PLOT_CLIPS]
    fig, axes = plt.subplots(len(rows), 3, figsize=(15, 3.2 * len(rows)), squeeze=False,
                             gridspec_kw={"width_ratios": [2, 2, 1]})
    for ax, r in zip(axes, rows):
        lo = min(r["recorded_mel"].min(), r["synthesized_mel"].min())
        hi = max(r["recorded_mel"].max(), r["synthesized_mel"].max())
        for a, mel, title in ((ax[0], r["recorded_mel"], "recorded"), (ax[1], r["synthesized_mel"], "synthesized")):
            a.imshow(mel.T, origin="lower", aspect="auto", vmin=lo, vmax=hi, interpolation="nearest")
            a.set_title(f"{r['id']} {title}")
            a.set_xlabel("frame")
            a.set_ylabel("mel bin")
        path = r["path"]
        ax[2].plot(path[:, 1], path[:, 0], lw=1.5)
        ax[2].plot([0, path[-1, 1]], [0, path[-1, 0]], "k:", lw=0.8)
        ax[2].set_title(f"DTW path, MCD {r['mcd_db']:.1f} dB")
        ax[2].set_xlabel("recorded frame (analysis)")
        ax[2].set_ylabel("synthesized frame (analysis)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return buf.getvalue()


def write_report(report, rows, out):
    """evaluate.json, evaluate.md and evaluate.png into `out`, each atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "evaluate.json", json.dumps(report, indent=1, default=_json_default) + "\n")
    atomic_write_text(out / "evaluate.md", markdown(report))
    atomic_write_bytes(out / "evaluate.png", figure(rows))


def _json_default(v):
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
