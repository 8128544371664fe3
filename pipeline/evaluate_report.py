"""Evaluate report: evaluate.json (every field), evaluate.md (plain words), evaluate.png (a few clips).

pipeline/evaluate.py measures; this module places the model between its two references and writes.
Reads the report dict and per-clip rows that pipeline.evaluate.compare() builds (no config keys).

    python -m pipeline.evaluate --config configs/config.yaml     # measures, then calls write_report
"""
import functools
import io
import json
from pathlib import Path

import numpy as np

from pipeline.files import atomic_write_bytes, atomic_write_text

# within a tenth of the ceiling-to-chance gap: as good as this vocoder allows. On the demo (ceiling: the
# source-filter copy, 3.9 dB; chance 11.5 dB), FastPitch at 800 steps lay 20 % of the way (5.42 dB) and
# 1,600 steps took 0.42 dB off it, while 1,000 more vocoder steps took 0.10 dB: a fifth of the way was
# still the acoustic model's to gain (benchmarks/RESULTS.md)
NEAR_CEILING = 0.1
AT_CHANCE = 0.8      # past four fifths of the gap: no nearer its own sentence than to others
PLOT_CLIPS = 3       # clips drawn in evaluate.png
HEARD_CLIPS = 3      # clips whose transcripts evaluate.md quotes
SPECTRUM_HZ = 2000   # top of evaluate.png's spectrogram panel: the band where voiced harmonics show
SPECTRUM_FFT = 2048  # 10.8 Hz bins at 22.05 kHz: harmonics 100 Hz apart lie 9 bins apart
SPECTRUM_DB = 80     # dynamic range drawn, below the loudest bin of the four
# the spectrogram panel, left to right: (key in a row's signals, title)
PANEL = (("recording", "recording"), ("griffin_lim_ceiling", "Griffin-Lim copy"),
         ("vocoder_ceiling", "{vocoder} copy"), ("synthesized", "TTS through {through}"))


# each vocoder.kind as prose names it: "the source-filter copy", "the Vocos vocoder's own copy"
VOCODER_NAMES = {"vocos": "Vocos", "hifigan": "HiFi-GAN", "source_filter": "source-filter",
                 "griffin_lim": "Griffin-Lim"}
PROPER_NAMES = ("Vocos", "HiFi-GAN", "Griffin-Lim")  # "through Vocos"; any other "through the source-filter vocoder"


def mcd_ceiling(report):
    """The MCD ceiling the synthesized row is held to: the trained vocoder's copy-synthesis when the
    synthesized audio went through it (the same vocoder), else Griffin-Lim's."""
    voc = report.get("mcd_db_vocoder_ceiling")
    return report["mcd_db_ceiling"] if voc is None else voc


def vocoder_name(kind):
    """The name prose gives `vocoder.kind` (its config token where VOCODER_NAMES has none)."""
    return VOCODER_NAMES.get(kind, kind)


def through(name):
    """A vocoder's name after "through": a proper name alone, a descriptive one as "the source-filter vocoder"."""
    return name if name in PROPER_NAMES else f"the {name} vocoder"


def _vocoder_name(report):
    """The vocoder the synthesized row was heard through: Griffin-Lim unless a trained one made it."""
    kind = (report.get("vocoder") or {}).get("kind")
    if report.get("mcd_db_vocoder_ceiling") is None or not kind:
        return "Griffin-Lim"
    return vocoder_name(kind)


def position(report):
    """Where mcd_db lies from the ceiling (0) to chance (1); None without both references."""
    ceiling, chance = mcd_ceiling(report), report["mcd_db_other"]
    if chance is None or ceiling is None or chance <= ceiling:
        return None
    return (report["mcd_db"] - ceiling) / (chance - ceiling)


def verdict(report):
    """One plain sentence: at chance, near the ceiling, between, or past the ceiling (the synthesized audio
    nearer the recordings than the ceiling's copy, by more than NEAR_CEILING of the gap), with the figures."""
    p = position(report)
    if report["mcd_db_other"] is None:
        cap = report.get("max_clips")  # evaluate.max_clips of 1 caps the clips, whatever the split holds
        fix = (f"raise evaluate.max_clips, now {cap}" if cap is not None and cap < 2 else
               "raise dataset.val_fraction; this retrains")
        return (f"No chance reference: it needs at least two validation clips ({fix}), "
                "so only the ceiling row below places the model.")
    if p is None and report.get("mcd_db_vocoder_ceiling") is not None \
            and report["mcd_db_ceiling"] < report["mcd_db_other"] <= report["mcd_db_vocoder_ceiling"]:
        return (f"The {_vocoder_name(report)} vocoder's own copy of the recordings is no nearer them than other "
                f"sentences are (MCD {report['mcd_db_vocoder_ceiling']:.2f} dB, chance {report['mcd_db_other']:.2f}; "
                f"Griffin-Lim's copy {report['mcd_db_ceiling']:.2f}), so it cannot place the model: train the "
                "vocoder longer (vocoder.steps), or evaluate with vocoder.kind: griffin_lim.")
    if p is None:
        return ("The references do not separate (resynthesis is no nearer the recordings than other sentences "
                "are), so the MCD says little here: check the corpus and audio settings.")
    figures = (f"MCD {report['mcd_db']:.2f} dB, the ceiling {mcd_ceiling(report):.2f}, "
               f"chance {report['mcd_db_other']:.2f}")
    if p >= AT_CHANCE:
        share = "beyond it" if p > 1 else f"{100 * p:.0f} % of the way from the ceiling to chance"
        return (f"At chance ({share}: {figures}): the synthesized "
                "speech is about as far from its own recording as from other sentences' recordings, so the model "
                "does not yet say the sentences. Train longer, or check the alignment images in TensorBoard.")
    if p < -NEAR_CEILING:  # below the ceiling by more than the tolerance "near" allows above it
        return (f"Past the ceiling ({figures}): the synthesized speech measures nearer the recordings than "
                f"{_vocoder_name(report)} resynthesis of the recordings' own mels, so that copy bounds nothing "
                "here and MCD cannot say what is left to gain: read PESQ, STOI and the spectrograms in evaluate.png.")
    where = f"{'at it' if p < 0 else f'{100 * p:.0f} % of the way from the ceiling to chance'}: {figures}"
    if p <= NEAR_CEILING:
        return (f"Near the ceiling ({where}): the synthesized speech is about as close to the recordings as "
                f"{_vocoder_name(report)} resynthesis of the recordings themselves; a better vocoder, not more "
                "training, is the next gain.")
    return (f"Between chance and the ceiling ({where}): the synthesized speech is nearer its own sentence than "
            f"other sentences, but short of what the {_vocoder_name(report)} vocoder allows with the recorded mels; "
            "more training or data should bring it nearer the ceiling.")


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
           "| speaker | clips | MCD dB | ceiling dB | chance dB | length ratio | F0 RMSE Hz | MOS (recording) "
           "| WER (recording) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in report["per_speaker"].items():
        mos, wer = r.get("mos") or {}, r.get("wer") or {}
        out.append(f"| {name} | {r['clips']} | {_fmt(r['mcd_db'])} | {_fmt(mcd_ceiling(r))} | {_fmt(r['mcd_db_other'])} "
                   f"| {_fmt(r['duration_ratio'])} | {_fmt(r['f0_rmse_hz'], 1)} "
                   f"| {_fmt(mos.get('synthesized'))} ({_fmt(mos.get('recording'))}) "
                   f"| {_fmt(wer.get('synthesized'))} ({_fmt(wer.get('recording'))}) |")
    return out + [""]


LEAD_NAMES = {"vocoder_ceiling_over_griffin_lim_ceiling": "the {vocoder} copy over Griffin-Lim's",
              "synthesized_over_recording": "the synthesized audio over the recording"}


def lead_lines(report, vocoder):
    """The naturalness leads with their 95 % bootstrap intervals over the clips; [] without them. A lead
    counts only the clips where both its signals have a score (evaluate.lead): a clip the predictor could
    not score leaves it fewer than the report's, and the two leads may count different clips, each then
    named beside its own interval."""
    leads = {k: v for k, v in (report.get("mos_leads") or {}).items() if k in LEAD_NAMES}
    if not leads:
        return []
    counts, clips = {v["clips"] for v in leads.values()}, report.get("clips")

    def over(n):  # "8 of 9" where clips without a score were left out
        return f"{n} of {clips}" if clips is not None and n < clips else f"{n}"

    each = len(counts) > 1  # then each interval says its own count
    parts = [f"{LEAD_NAMES[k].format(vocoder=vocoder)} {v['lead']:+.3f} ({v['low']:+.3f} to {v['high']:+.3f}"
             + (f"; {over(v['clips'])} clips)" if each else ")") for k, v in leads.items()]
    n = min(counts)
    where = ("the clips where both its signals have a score" if each else
             f"the {over(n)} clips" + (" where both signals have a score" if over(n) != f"{n}" else ""))
    return [f"Naturalness leads, difference of medians (95 % bootstrap interval over {where}): {'; '.join(parts)}. "
            "A target inside an interval is not decided by this run alone.", ""]


def _above_reference(mos, wer, heads):
    """A line naming the signals (`heads`: name -> its column's head) the listener measures score better
    than the recording, which is no upper bound for them; [] when none does."""
    better = [f"{measure} {heads[n]} ({_fmt(scores[n])} against {_fmt(scores['recording'])})"
              for measure, scores, sign in (("naturalness:", mos, 1), ("word error rate:", wer, -1))
              if scores.get("recording") is not None
              for n in heads if scores.get(n) is not None and sign * (scores[n] - scores["recording"]) > 0]
    noise = (" The recognizer is coarse: on the shipped demo's 9 clips, audio changed by one 16-bit step (inaudible) "
             "moved the recording's median word error rate from 0.84 to 0.75-0.79 and single clips by up to 0.2 "
             "(docs/evaluate.md), so a difference under about 0.1 is none."
             if any(b.startswith("word error rate:") for b in better) else "")
    return [f"Scored better than the recording: {'; '.join(better)}.{noise}", ""] if better else []


def _wer_clips(report):
    """How many clips the WER row covers, where the recognizer heard only some (the English ones)."""
    heard = report.get("wer_clips")
    return "" if heard is None or heard == report["clips"] else f", the {heard} of {report['clips']} clips in English"


def listener_lines(report):
    """The listener table: naturalness (MOS predictor) and WER for the recording, the synthesized audio,
    both copy-syntheses and chance; [] when the report has neither."""
    mos, wer = report.get("mos") or {}, report.get("wer") or {}
    if not mos and not wer:
        return []
    name, voc = _vocoder_name(report), "vocoder_ceiling" in mos
    names = ["recording", "synthesized", *(["vocoder_ceiling"] if voc else []), "griffin_lim_ceiling"]
    heads = ["recording (the reference)", f"synthesized (through {through(name)})",
             *([f"{name} copy-synthesis"] if voc else []), "Griffin-Lim copy-synthesis", "chance"]
    lines = ["| listener measure | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 1),
             "| naturalness: DNSMOS P.835 overall, 1-5 (higher is better) | "
             + " | ".join(_fmt(mos.get(n)) for n in names)
             + f" | {_fmt(report.get('mos_chance'))} (the recording's spectrogram with random phase) |",
             f"| word error rate, pocketsphinx en-us (lower is better){_wer_clips(report)} | "
             + " | ".join(_fmt(wer.get(n)) for n in names)
             + f" | {_fmt(report.get('wer_chance'))} (the recording's transcript against the other sentences) |", ""]
    return lines + _above_reference(mos, wer, dict(zip(names[1:], heads[1:]))) + lead_lines(report, name) + [(
        "Both judge each signal as it is saved and heard (16 kHz), with no reference signal: the recording's column "
        "is what they make of the real voice, the reference a model is held to; it is no upper bound (a smoother "
        "signal can score above it, as the lines above say where one does); chance is what they make of a signal "
        "that carries nothing of this sentence. The MOS predictor (trained on noisy and denoised human speech) rewards "
        "clean, smooth audio, so a muffled synthesis can score well: read it beside MCD, WER and the 0-2 kHz "
        "spectrograms in evaluate.png. The recognizer was trained on human speech: on a synthetic voice its WER is "
        "high even for the recording, so compare with the recording's, not with 0. No WER for clips in a language "
        "other than English."), ""]


def heard_lines(report):
    """What the recognizer heard in the first clips, beside their sentences."""
    clips = [r for r in report["per_clip"] if "heard_recording" in r][:HEARD_CLIPS]
    if not clips:
        return []
    lines = ["| clip | sentence | recognizer on the recording | on the synthesized audio |", "|---|---|---|---|"]
    for r in clips:
        cells = [r.get("text", ""), r["heard_recording"], r.get("heard_synthesized", "")]
        lines.append(f"| {r['id']} | " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines + [""]


def _cover(report, key, text):
    """`text` (a median's cell) with how many clips it covers where some have no score (`key` in per_clip:
    no frame voiced in both, a recording too short for STOI, ...): a median over 1 of 9 clips is no
    median over the clips."""
    n, clips = sum(r.get(key) is not None for r in report["per_clip"]), report["clips"]
    return f"{text} ({n} of {clips} clips)" if text not in ("n/a", "") and 0 < n < clips else text


def _rows(report):
    """(label, synthesized, [ceilings...], chance) lines of the summary table; the ceilings are the trained
    vocoder's copy-synthesis (when there is one) and Griffin-Lim's. A cell whose median leaves clips out
    (no score for them) names how many it covers."""
    voc = report.get("mcd_db_vocoder_ceiling") is not None
    ceilings = (["vocoder_ceiling"] if voc else []) + ["ceiling"]
    heard = {"vocoder_ceiling": "vocoder_ceiling", "ceiling": "griffin_lim_ceiling"}

    def figure(base, fmt=_fmt):  # the synthesized cell and each ceiling's, of mcd_db, f0_rmse_hz, ...
        return (_cover(report, base, fmt(report.get(base))),
                [_cover(report, f"{base}_{c}", fmt(report.get(f"{base}_{c}"))) for c in ceilings])

    def listened(measure, digits):  # pesq / stoi: {synthesized, vocoder_ceiling, griffin_lim_ceiling}
        scores = report.get(measure) or {}
        return (_cover(report, f"{measure}_synthesized", _fmt(scores.get("synthesized"), digits)),
                [_cover(report, f"{measure}_{heard[c]}", _fmt(scores.get(heard[c]), digits)) for c in ceilings])

    f0 = functools.partial(_fmt, digits=1)
    return [("MCD, dB (lower is better)", *figure("mcd_db"), _fmt(report["mcd_db_other"])),
            (f"MCD on the frames the recording voices ({_pct(report.get('voiced_share'))} of them), dB",
             *figure("mcd_db_voiced"), ""),
            ("MCD on the others (unvoiced sounds, pauses), dB", *figure("mcd_db_unvoiced"), ""),
            ("F0 RMSE, Hz, frames voiced in both", *figure("f0_rmse_hz", f0), ""),
            ("F0 gross errors (> 20 % off, mostly octave jumps), share of those frames",
             *figure("f0_gross_error", _pct), ""),
            ("length, synthesized / recorded", _fmt(report["duration_ratio"]), ["1.00" for _ in ceilings], ""),
            ("PESQ wideband, 1-4.6 (higher is better)", *listened("pesq", 2), ""),
            ("STOI, 0-1 (higher is better)", *listened("stoi", 3), "")], ceilings


def markdown(report):
    name = _vocoder_name(report)
    rows, ceilings = _rows(report)
    heads = {"vocoder_ceiling": f"ceiling: {name} copy-synthesis of the recording",
             "ceiling": "reference: Griffin-Lim copy-synthesis" if len(ceilings) > 1 else
                        "ceiling: Griffin-Lim copy-synthesis of the recording"}
    cols = ["measure", f"synthesized (through {through(name)})", *[heads[c] for c in ceilings], "chance (other sentences)"]
    cut = ([f"Warning: {report['cut']} of the {report['clips']} syntheses were cut at synthesize.max_seconds: their "
            "figures measure a cut sentence (the length ratio below 1 is the cut, not the model's pace); raise "
            "synthesize.max_seconds, or keep clips shorter than it (dataset.max_seconds).", ""]
           if report.get("cut") else [])
    lines = [f"# Evaluate: {report['clips']} validation clips, checkpoint step {report['step']}", "",
             verdict(report), "", *cut, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join([label, syn, *ceil, chance]) + " |" for label, syn, ceil, chance in rows]
    lines.append("")
    if "aligner" in report:
        al = report["aligner"]
        left = (f"; {al['rejected']} clip(s) left out as audio that does not carry its text (rejected.tsv)"
                if al.get("rejected") else "")
        lines += [(f"Aligner durations: {al['clips']} clips; {100 * al['sums_ok']:.0f} % sum to their mel frames, "
                  f"{100 * al['monotonic']:.0f} % a monotonic path with every token at least one frame{left}."), ""]
    lines += listener_lines(report) + speaker_lines(report)
    voc = len(ceilings) > 1
    lines += [("Medians over the clips. MCD: mel-cepstral distortion (order 24, c0 excluded) of WORLD envelopes over the "
              "band the mel carries, frames paired by DTW; split by the recording's voicing (its F0), as the two kinds "
              "of frame differ: a vocoder can follow a voiced frame's envelope, while an unvoiced one is noise, whose "
              "envelope differs by several dB between any two renderings of one spectrum, so its MCD stays high for any "
              "copy, Griffin-Lim's included. The synthesized row is the model's mel through "
              f"{through(name)}; the ceiling rows resynthesize each recording's own mel "
              f"({'with the same vocoder, and with ' if voc else 'with '}Griffin-Lim, {report['griffin_lim_iters']} "
              "iterations). PESQ and STOI compare with the recording sample by sample: for the copy-syntheses they measure "
              "the vocoder alone; the synthesized audio is re-timed onto the recording along the DTW path (cross-faded "
              "where the path repeats or skips a frame), and what "
              "timing and pitch differences remain count against it as well. Chance compares each synthesized clip "
              "with the other clips' recordings."), "",
              f"| clip | MCD dB | {'vocoder ceiling dB | ' if voc else ''}Griffin-Lim ceiling dB | chance dB "
              "| length ratio | F0 RMSE Hz | MOS synthesized (recording) | WER synthesized (recording) |",
              "|---|---|---|---|---|---|---|---|" + ("---|" if voc else "")]
    for r in report["per_clip"]:
        vc = f"{_fmt(r.get('mcd_db_vocoder_ceiling'))} | " if voc else ""
        lines.append(f"| {r['id']} | {_fmt(r['mcd_db'])} | {vc}{_fmt(r['mcd_db_ceiling'])} | {_fmt(r['mcd_db_other'])} "
                     f"| {_fmt(r['duration_ratio'])} | {_fmt(r['f0_rmse_hz'], 1)} "
                     f"| {_fmt(r.get('mos_synthesized'))} ({_fmt(r.get('mos_recording'))}) "
                     f"| {_fmt(r.get('wer_synthesized'))} ({_fmt(r.get('wer_recording'))}) |")
    model = f"model `{report['model']}`, " if report.get("model") else ""
    lines += [""] + heard_lines(report) + [(
        f"{model}checkpoint `{report['checkpoint']}`. evaluate.png: recorded and synthesized mels of the first clips "
        "and the DTW path that pairs their frames (a straight diagonal = same timing), and the first clip's 0-2 kHz "
        "spectrograms (recording, copy-syntheses, TTS), where a voice's harmonics show as parallel lines; "
        "evaluate_audio/ holds the synthesized audio measured."), ""]
    return "\n".join(lines)


def _spectrogram(y, sample_rate):
    """(bins, frames) dB magnitude of `y` from 0 to SPECTRUM_HZ, and that top frequency."""
    import librosa

    spec = np.abs(librosa.stft(np.asarray(y, np.float32), n_fft=SPECTRUM_FFT, hop_length=SPECTRUM_FFT // 8))
    keep = np.fft.rfftfreq(SPECTRUM_FFT, 1.0 / sample_rate) <= SPECTRUM_HZ
    return 20 * np.log10(spec[keep] + 1e-6), (keep.sum() - 1) * sample_rate / SPECTRUM_FFT


def spectrogram_panel(axes, row, vocoder):
    """The row's signals side by side, 0-2 kHz on a linear axis, one colour scale for all; the clip's
    id once above them (a long id in each of four titles overlaps its neighbours')."""
    sample_rate, signals = row["signals"]
    shown = [(key, title.format(vocoder=vocoder, through=through(vocoder))) for key, title in PANEL if key in signals]
    specs = {key: _spectrogram(signals[key], sample_rate) for key, _ in shown}
    top = max(spec.max() for spec, _ in specs.values())
    half = sample_rate / SPECTRUM_FFT / 2  # each row is a bin, centred on its frequency
    for ax, (key, title) in zip(axes, shown):
        spec, hz = specs[key]
        ax.imshow(spec, origin="lower", aspect="auto", vmin=top - SPECTRUM_DB, vmax=top, cmap="magma",
                  extent=[0, len(signals[key]) / sample_rate, -half, hz + half], interpolation="nearest")
        ax.set_ylim(0, hz)
        ax.set_title(title)
        ax.set_xlabel("s")
    axes[0].set_ylabel("Hz")


def _mel_panels(axes, rows):
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


def figure(rows, vocoder):
    """PNG bytes: per clip, recorded mel | synthesized mel | DTW path; below, the first clip's 0-2 kHz
    spectrograms (recording, Griffin-Lim copy, vocoder copy, TTS) where the rows carry their signals.
    `vocoder`: the trained vocoder's name as prose gives it (vocoder_name)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rows[:PLOT_CLIPS]
    spectra = bool(rows) and "signals" in rows[0]
    fig = plt.figure(figsize=(15, 3.2 * (len(rows) + spectra)), layout="constrained")
    mels, below = fig.subfigures(2, 1, height_ratios=[len(rows), 1]) if spectra else (fig, None)
    _mel_panels(mels.subplots(len(rows), 3, squeeze=False, gridspec_kw={"width_ratios": [2, 2, 1]}), rows)
    if spectra:
        shown = sum(key in rows[0]["signals"][1] for key, _ in PANEL)
        spectrogram_panel(below.subplots(1, shown, sharey=True, squeeze=False)[0], rows[0], vocoder)
        below.suptitle(f"{rows[0]['id']}: 0-{SPECTRUM_HZ} Hz")
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
    atomic_write_bytes(out / "evaluate.png", figure(rows, _vocoder_name(report)))


def _json_default(v):
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")
