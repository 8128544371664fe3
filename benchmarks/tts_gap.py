"""Where the TTS's PESQ goes: a ladder from the TTS as `evaluate` hears it to the vocoder's copy.

On the run's held-out clips (evaluate's, pipeline.evaluate.validation_clips), each rung gives the
acoustic model one more thing the recording knows, and measures what `evaluate` measures against the
recording (PESQ wideband, STOI, MCD):

    tts        the TTS as `evaluate` measures it: predicted durations, re-timed onto the recording along
               the MCD's DTW path (pipeline.metrics.warp_to)
    durations  the recording's durations (its duration cache) instead: the recording's length, nothing
               re-timed; pitch and energy predicted, voicing from the vocoder's F0 head (as synthesize)
    voicing    + the recording's voicing (its pitch cache) instead of the F0 head's
    staircase  + the recording's token pitch (its F0 averaged over each token's voiced frames, expanded
               and smoothed as synthesize does) driving the vocoder instead of the predicted: what a
               perfect token pitch predictor would give it (the decoder still hears predicted pitch)
    contour    + the recording's F0 contour itself driving the vocoder: what the shape within tokens
               adds to the staircase
    pitch      + the recording's token pitch in the decoder too (teacher-forced pitch: what the
               vocoder's GTA fine-tuning sees, energy still predicted)
    copy       the vocoder from the recorded mel and F0: `evaluate`'s vocoder ceiling

With a source-filter vocoder it also gives how often its F0 head's voicing (synthesize's gate on the
acoustic model's pitch) disagrees with the recording's, on the recorded, the pitch rung's and the
durations rung's mels.

A vocoder that takes no F0 (vocos, hifigan, griffin_lim) skips the voicing, staircase and contour
rungs. Needs
a trained FastPitch and vocoder (`snakemake --cores all evaluate` first) and the duration caches.

    python benchmarks/tts_gap.py --config configs/config.yaml [--out .bench/tts_gap.json]
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from pipeline import audio, config, evaluate, metrics  # noqa: E402

RUNGS = ("tts", "durations", "voicing", "staircase", "contour", "pitch", "copy")


def recorded_durations(cfg):
    """{clip id: durations (tokens,) int32} from every duration shard of the cache."""
    return {cid: d for _, meta, durations in evaluate.duration_shards(cfg) for cid, d in zip(meta["ids"], durations)}


def token_pitch(model, f0, durations, speaker):
    """The recording's F0 (F,) Hz as the model's normalised token pitch (1, T): voiced frames averaged."""
    import tensorflow as tf

    from pipeline.models.fastpitch import token_average
    stats = model.pitch_stats.numpy()
    mean, std = stats[speaker] if stats.ndim == 2 else stats
    norm = np.where(f0 > 0, (f0 - mean) / std, 0.0).astype(np.float32)
    return token_average(tf.constant(norm[None]), tf.constant(durations[None], tf.int32), only_nonzero=True)


def voicing_error(vocoder, log_mel, f0):
    """The share of frames where the vocoder's F0 head hears voicing in log_mel (F, n_mels) and the
    recording's F0 (F,) does not, or the other way round."""
    _, p = vocoder.estimate_f0(np.asarray(log_mel, np.float32)[None])
    return float(np.mean((p[0].numpy() > 0.5) != (f0 > 0)))


def _fmt(x):
    return "-" if x is None else f"{x:.2f}"


def ladder(cfg, log=print):
    """(per-clip rows, {rung: {pesq, stoi, mcd_db} medians}) on the held-out clips."""
    import tensorflow as tf

    from pipeline.synthesize import frame_f0, load_synthesizer
    from pipeline.vocoder import kinds

    synth, voc = load_synthesizer(cfg, log), kinds.load(cfg)
    model = synth.model
    if not hasattr(model, "infer_at"):
        sys.exit(f"tts_gap: model.kind {synth.model_kind!r} takes no durations; the ladder needs FastPitch")
    if voc.model is None and voc.kind != "griffin_lim":
        sys.exit("tts_gap: no trained vocoder; run `snakemake --cores all evaluate` first")
    durations, an = recorded_durations(cfg), evaluate.Analyser(cfg, voc if voc.model is not None else None)
    if not durations:
        sys.exit("tts_gap: no duration cache; run `snakemake --cores all evaluate` first")
    a = cfg["audio"]
    sr, hop = a["sample_rate"], a["hop_length"]
    rows = []
    for clip in evaluate.validation_clips(cfg):
        s_id, l_id, language = synth.voice(clip.speaker, clip.language)
        ids = synth.encode(clip.text, language)
        d = durations.get(clip.id)
        y = audio.load_audio(clip.audio, sample_rate=sr, max_seconds=an.max_seconds)
        mel = audio.mel_spectrogram(y, **a)
        if d is None or len(d) != len(ids) or int(d.sum()) != len(mel):
            log(f"{clip.id}: left out: its cached durations do not fit the text's {len(ids)} tokens and "
                f"{len(mel)} frames")
            continue
        ref, rec_f0 = y[:len(mel) * hop], clip.f0[:len(mel)]
        rec = an(y, clip.f0)
        voice = {f: tf.constant([{"speaker": s_id, "language": l_id}[f]]) for f in synth.voiced}
        tokens, lengths = tf.constant([ids], tf.int32), tf.constant([len(ids)], tf.int32)
        rec_pitch = token_pitch(model, rec_f0, d, s_id)

        def denorm(out, speaker=voice.get("speaker")):
            return out["mel"][0].numpy() * synth.std + synth.mean, frame_f0(model, out, speaker)

        signals = {}
        tts = synth.infer(clip.text, speaker=clip.speaker, language=clip.language)
        y_tts = an.vocode(tts["mel"], tts["f0"], gate=True)
        tts_mcd, path = metrics.mcd(an(y_tts)["mc"], rec["mc"])  # the path re-times it; its MCD is the rung's
        signals["tts"] = (metrics.warp_to(y_tts, path, n_frames=len(mel), hop_length=hop)
                          if len(tts["mel"]) != len(mel) else y_tts[:len(ref)], tts_mcd)
        timed_mel, timed_f0 = denorm(model.infer_at(tokens, lengths, d[None], **voice))
        timed_f0 = None if timed_f0 is None else timed_f0[0].numpy()
        signals["durations"] = an.vocode(timed_mel, timed_f0, gate=True)
        if voc.uses_f0:
            signals["voicing"] = an.vocode(timed_mel, np.where(rec_f0 > 0, timed_f0, 0.0).astype(np.float32))
            stairs = frame_f0(model, {"pitch": rec_pitch, "durations": tf.constant(d[None], tf.int32),
                                      "mel": timed_mel[None]}, voice.get("speaker"))[0].numpy()
            signals["staircase"] = an.vocode(timed_mel, np.where(rec_f0 > 0, stairs, 0.0).astype(np.float32))
            signals["contour"] = an.vocode(timed_mel, rec_f0)
        forced_mel, _ = denorm(model.infer_at(tokens, lengths, d[None], pitch=rec_pitch, **voice))
        signals["pitch"] = an.vocode(forced_mel, rec_f0)
        signals["copy"] = an.vocode(mel, rec_f0)
        row = {"id": clip.id}
        if hasattr(voc.model, "estimate_f0"):  # how often the F0 head's voicing (the gate) disagrees with the recording's
            row["head_voicing_error"] = {name: voicing_error(voc.model, m, rec_f0)
                                         for name, m in (("recorded", mel), ("pitch", forced_mel), ("durations", timed_mel))}
        for rung, x in signals.items():  # each rung's audio, at the recording's length but the TTS's (re-timed)
            heard, mcd_db = x if isinstance(x, tuple) else (x[:len(ref)], metrics.mcd(an(x)["mc"], rec["mc"])[0])
            row[rung] = {"pesq": metrics.pesq_wb(ref, heard, sr), "stoi": metrics.stoi(ref, heard, sr), "mcd_db": mcd_db}
        log(f"{clip.id}: PESQ " + ", ".join(f"{k} {_fmt(row[k]['pesq'])}" for k in RUNGS if k in row))
        rows.append(row)
    if not rows:
        sys.exit("tts_gap: no held-out clip with durations that fit it")
    # evaluate's median: of the values that are not None (PESQ finds no speech in some signals), else None
    medians = {rung: {m: evaluate._median([r[rung][m] for r in rows]) for m in ("pesq", "stoi", "mcd_db")}
               for rung in RUNGS if rung in rows[0]}
    if "head_voicing_error" in rows[0]:
        medians["head_voicing_error"] = {k: evaluate._median([r["head_voicing_error"][k] for r in rows])
                                         for k in rows[0]["head_voicing_error"]}
    return rows, medians


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--out", default=str(common.DEFAULT_WORKDIR / "tts_gap.json"))
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    machine = common.machine_info()
    rows, medians = ladder(cfg)
    print(common.table([[rung, m["pesq"], m["stoi"], m["mcd_db"]] for rung, m in medians.items() if rung in RUNGS],
                       ["rung", "PESQ", "STOI", "MCD dB"]))
    if "head_voicing_error" in medians:
        print("the F0 head's voicing against the recording's, frames wrong: "
              + ", ".join(f"{k} mel {v:.1%}" for k, v in medians["head_voicing_error"].items()))
    print(f"{len(rows)} held-out clips, medians; {common.machine_line(machine)}")
    common.write_json(args.out, {"benchmark": "tts_gap", "command": " ".join(["python benchmarks/tts_gap.py", *sys.argv[1:]]),
                                 "machine": machine, "clips": len(rows), "medians": medians, "per_clip": rows})


if __name__ == "__main__":
    main()
