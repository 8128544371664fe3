"""Speak the config's held-out sentences with the latest checkpoint: runs/{name}/samples/NN.wav + NN.npy.

    python -m pipeline.synthesize --config configs/config.yaml --out runs/demo/samples
    snakemake synthesize --config 'synthesize={pace: 1.2}'

Reads runs/{name}/checkpoints (the model only) and what the run carries, runs/{name}/run.json
(pipeline/runinfo.py: its vocabulary, mel statistics and the `model:`, `text:` and `audio:` it was
trained with; never the current cache index, which may have been rebuilt since), config keys
`synthesize:` (sentences, speaker, language, max_seconds, pace, pitch_shift, griffin_lim_iters). A
sentence is text, or {text, speaker, language} overriding synthesize.speaker and .language; an
unknown speaker or language is a one-line error listing the run's. Any model kind works: each
sentence is one compiled `model.infer` call (docs/models.md), never a Python loop over frames.
Writes NN.wav (the run's vocoder, or Griffin-Lim; a vocoder that uses F0 gets the model's pitch per
frame in Hz, `frame_f0`, where its own voicing head hears voicing), NN.npy (the log-mel, float32 (frames, n_mels),
the project's HiFi-GAN-compatible mel, so any HiFi-GAN trained on it can voice it) and
sentences.json (checkpoint, step, pace, pitch shift, text and length of each sample, and `cut`: true for a
sentence cut at synthesize.max_seconds, which stderr says too). The command refuses
what it can before TensorFlow and the model load (check_before_loading): no checkpoint, a pace or pitch
shift out of range, an unknown speaker, language or symbol, a control character (a NUL: espeak-ng
would stop there), no trained vocoder; a sentence whose mel or audio comes out NaN or infinite (diverged
weights) stops it after loading, one line naming the sentence and checkpoint, nothing written. In the --out folder it replaces, and removes, only the previous
run's samples (those its sentences.json lists; in runs/{name}/samples, the run's own folder, whose
sentences.json `snakemake synthesize` deletes before the job, every NN.wav and NN.npy): anything else
there stays as it is, and a file it would write over that is not the previous run's (a user's 00.wav,
a sentences.json it did not write) is refused before anything loads (check_out).

    from pipeline.synthesize import load_synthesizer
    synth = load_synthesizer(cfg)          # MissingCheckpoint when nothing is trained
    log_mel = synth.mel("Hello there.")    # np.float32 (frames, n_mels)
"""
import argparse
import functools
import inspect
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline import config, files, markup, models, runinfo, text
from pipeline.errors import MissingCheckpoint, PipelineError, cli, located
from pipeline.vocoder import inputs, kinds
from pipeline.wavfile import save_wav

_print = functools.partial(print, flush=True)

F0_SMOOTH_FRAMES = 5  # a TTS model's token pitch is a staircase: averaged over ~60 ms, a contour
PACE = (0.1, 10.0)           # synthesize.pace's range (configs/schema.yaml): > 1 speaks faster
PITCH_SHIFT = (-24.0, 24.0)  # synthesize.pitch_shift's, in semitones; the exported graph checks both too


def check_prosody(pace, pitch_shift, prefix=""):
    """PipelineError naming {prefix}pace or {prefix}pitch_shift unless each is a finite number in its
    range (a NaN pitch shift gives NaN audio, a pace near 0 or infinite an endless or empty clip)."""
    for key, value, (lo, hi) in (("pace", pace, PACE), ("pitch_shift", pitch_shift, PITCH_SHIFT)):
        try:
            ok = lo <= float(value) <= hi  # False for NaN
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise PipelineError(f"{prefix}{key}: {value!r} must be a finite number in {lo:g}..{hi:g}")


def frame_f0(model, out, speaker=None):
    """F0 in Hz per mel frame, float32 (B, F), from `model.infer`'s outputs: its token pitch (normalised,
    pitch_shift applied) de-normalised with the model's own pitch statistics (per speaker with several;
    `speaker` (B,) int32), expanded by the durations exactly as the mel is, and averaged over
    F0_SMOOTH_FRAMES frames; None for a model that predicts no pitch (transformer_tts). Graph ops only
    (the export runs it). Voicing is not decided here: the pitch is per token and its normalised 0 is
    the mean pitch, not silence; the vocoder's voicing head decides it from the mel (`voiced_f0`)."""
    import tensorflow as tf

    from pipeline.models.fastpitch import regulate_length
    stats = getattr(model, "pitch_stats", None)
    if stats is None or "pitch" not in out or "durations" not in out:
        return None
    if len(stats.shape) == 2:  # per speaker
        rows = tf.gather(stats, tf.zeros([1], tf.int32) if speaker is None else speaker)    # (B, 2)
        mean, std = rows[:, :1], rows[:, 1:]
    else:
        mean, std = stats[0], stats[1]
    hz = tf.maximum(tf.cast(out["pitch"], tf.float32) * std + mean, 0.0)                 # (B, T)
    f0 = regulate_length(tf.expand_dims(hz, -1), out["durations"], tf.shape(out["mel"])[1])      # (B, F, 1)
    return tf.nn.avg_pool1d(f0, F0_SMOOTH_FRAMES, 1, "SAME")[:, :, 0]                   # (B, F)


def resolve_voice(s, info, speaker="", language="", where="synthesize"):
    """(speaker id, language id, language name) in the run `info` (run.json) for names, "" meaning
    `s`'s (the config's synthesize:) speaker and language; PipelineError naming `where` and listing the
    run's speakers or languages."""
    speakers, languages, own = list(info.get("speakers", [])), list(info.get("languages", [])), info["vocab"]["language"]
    key = {f: f"{where}.{f}" if given else f"synthesize.{f}" for f, given in (("speaker", speaker), ("language", language))}
    speaker, language = speaker or s["speaker"], language or s["language"]
    if speaker and speaker not in speakers:  # a run of one speaker has no names: any is unknown
        known = ", ".join(speakers) or "none: the run has one speaker (leave it empty)"
        raise PipelineError(f"{key['speaker']}: unknown speaker {speaker!r}; known: {known}")
    if not language:
        language = own if own in languages or not languages else languages[0]
    elif languages and language not in languages:
        raise PipelineError(f"{key['language']}: unknown language {language!r}; known: {', '.join(languages)}")
    return speakers.index(speaker) if speaker else 0, languages.index(language) if language in languages else 0, language


def check_before_loading(cfg):
    """What `python -m pipeline.synthesize` can refuse before TensorFlow and the model load (seconds):
    no checkpoint, the run's record (run.json), pace and pitch shift, each sentence's speaker,
    language and symbols, and the trained vocoder's summary. The same one-line errors as later."""
    run = config.run_dir(cfg)
    if runinfo.latest_checkpoint(run / "checkpoints") is None:
        raise MissingCheckpoint(f"{located(run / 'checkpoints')}: no checkpoint; train first (`snakemake --cores all train --forcerun train`)")
    info = runinfo.load(run)
    s = cfg["synthesize"]
    check_prosody(s["pace"], s["pitch_shift"], prefix="synthesize.")
    check_sentences(s, info)
    if kinds.KINDS.get(cfg["vocoder"]["kind"]).build is not None:
        kinds.check_trained(cfg)


def check_sentences(s, info):
    """Each of synthesize.sentences (`s`: the synthesize section) against a run's `info` (its speakers,
    languages and vocab; pipeline.preflight passes what the run will have): its speaker, language,
    characters and symbols. One line naming synthesize.sentences[N]."""
    for i, x in enumerate(s["sentences"]):
        x = x if isinstance(x, dict) else {"text": x}
        where = f"synthesize.sentences[{i}]"
        _, _, language = resolve_voice(s, info, x.get("speaker", ""), x.get("language", ""), where)
        markup.check_characters(x["text"], lambda offset, w=where: f"{w}, character {offset + 1}")  # a NUL ends it
        try:
            text.encode(x["text"], dict(info["vocab"], language=language))  # an unseen symbol, nothing to say
        except text.TextError as e:
            raise text.TextError(f"{where}: {e}") from None


class Synthesizer:
    """A trained model with its vocabulary and mel statistics. `.checkpoint`, `.step`, `.mel(text)`."""

    def __init__(self, cfg, model, checkpoint, info, log=print):
        self.cfg, self.model, self.checkpoint, self.log = cfg, model, checkpoint, log
        self.step = runinfo.step_of(checkpoint)  # None for a checkpoint put there by hand (no ckpt-N)
        self.vocab, self.audio = info["vocab"], info["config"]["audio"]  # the run's own
        self.model_kind = info["config"]["model"]["kind"]
        self.mean, self.std = info["stats"]["mel_mean"], info["stats"]["mel_std"]
        self.speakers, self.languages = list(info.get("speakers", [])), list(info.get("languages", []))
        self.info = info
        self.voiced = [f for f in runinfo.voice_fields(info) if f in inspect.signature(model.infer).parameters]

    @property
    def max_frames(self):
        """synthesize.max_seconds in frames of the run's grid: read only where text is spoken, so a job
        that runs the model otherwise (teacher-forced GTA) is not given, nor rerun by, that key."""
        a = self.audio
        return int(np.ceil(self.cfg["synthesize"]["max_seconds"] * a["sample_rate"] / a["hop_length"]))

    def voice(self, speaker="", language="", where="synthesize"):
        """(speaker id, language id, language name) for names ("" = the defaults, see the module doc);
        PipelineError naming `where` and listing the known ones."""
        return resolve_voice(self.cfg["synthesize"], self.info, speaker, language, where)

    def encode(self, sentence, language=None):
        """Token ids of a sentence with the cache's text front end (in `language`'s voice)."""
        vocab = dict(self.vocab, language=language) if language else self.vocab
        return text.encode(sentence, vocab)  # as training mapped it; TextError naming an unseen symbol

    def infer(self, sentence, pace=None, pitch_shift=None, speaker="", language="", where="synthesize"):
        """The model's outputs for one sentence (one compiled call), mel denormalised to log-mel."""
        import tensorflow as tf

        s = self.cfg["synthesize"]
        check_prosody(*(s[k] if v is None else v for k, v in (("pace", pace), ("pitch_shift", pitch_shift))),
                      prefix="synthesize." if pace is None and pitch_shift is None else "")
        pace = s["pace"] if pace is None else pace
        pitch_shift = s["pitch_shift"] if pitch_shift is None else pitch_shift
        s_id, l_id, language = self.voice(speaker, language, where)
        ids = self.encode(sentence, language)
        ids_of = {"speaker": s_id, "language": l_id}
        max_frames = self.max_frames
        out = self.model.infer(tf.constant([ids], tf.int32), tf.constant([len(ids)], tf.int32),
                               pace=pace, pitch_shift=pitch_shift,
                               max_frames=max_frames, **{f: tf.constant([ids_of[f]], tf.int32) for f in self.voiced})
        n = int(out["lengths"][0])
        cut = n >= max_frames or not bool(out.get("stopped", [True])[0])   # a decoder that never stopped: cut too
        mel = out["mel"][0, :n].numpy().astype(np.float32) * self.std + self.mean   # (frames, n_mels) log-mel
        f0 = frame_f0(self.model, out, tf.constant([s_id], tf.int32))
        return {"mel": mel, "f0": None if f0 is None else f0[0, :n].numpy(), "frames": n, "cut": cut, "tokens": len(ids),
                "speaker": self.speakers[s_id] if self.speakers else "", "language": language}

    def mel(self, sentence, speaker="", language=""):
        """Log-mel (frames, n_mels) float32 for `sentence`, honouring synthesize.pace and pitch_shift."""
        return self.infer(sentence, speaker=speaker, language=language)["mel"]

    def mel_f0(self, sentence, speaker="", language=""):
        """(log-mel (frames, n_mels), F0 Hz (frames,) or None: frame_f0, whether it was cut at
        synthesize.max_seconds) for `sentence`."""
        res = self.infer(sentence, speaker=speaker, language=language)
        return res["mel"], res["f0"], bool(res["cut"])


def note_audio_differences(cfg, info, run, log):
    """One log line when the config's `audio:` differs from the run's own (run.json): the run's mel
    grid and rate are what its model learned, so synthesis and export use them, never the config's."""
    if "audio" not in cfg:  # a Snakemake job given no audio section
        return
    mine, theirs = info["config"]["audio"], cfg["audio"]
    moved = [f"audio.{k} {theirs.get(k)!r} (the run's: {mine.get(k)!r})" for k in sorted(set(mine) | set(theirs))
             if mine.get(k) != theirs.get(k)]
    if moved:
        log(f"note: the config gives {', '.join(moved)}; using the run's own audio settings ({runinfo.path(run)}), "
            "which its model was trained with")


def load_synthesizer(cfg, log=_print):
    """The Synthesizer of the latest checkpoint in runs/{name}/checkpoints (MissingCheckpoint if none),
    built from what the run carries (runs/{name}/run.json)."""
    import tensorflow as tf

    from pipeline import placement
    run = config.run_dir(cfg)
    latest = runinfo.latest_checkpoint(run / "checkpoints")
    if latest is None:
        raise MissingCheckpoint(f"{located(run / 'checkpoints')}: no checkpoint; train first (`snakemake --cores all train --forcerun train`)")
    info = runinfo.load(run)
    note_audio_differences(cfg, info, run, log)
    model_cfg = info["config"]["model"]
    placement.set_precision_policy("off")  # synthesis runs in float32, whatever a trainer in this process set
    model = models.build(model_cfg, info["vocab"], info["n_mels"], **runinfo.voice_tables(info))
    r = models.frame_multiple(model_cfg)
    model(models.dummy_batch(8, 4 * r, info["n_mels"], runinfo.voice_fields(info)))  # create the variables, then fill them
    try:  # every weight of the model from the file; the optimizer's slots stay in it
        tf.train.Checkpoint(model=model).restore(latest).assert_existing_objects_matched().expect_partial()
    except (AssertionError, ValueError, IndexError, tf.errors.OpError) as e:  # torn (truncated, flipped) or not this model
        raise MissingCheckpoint(f"{latest}: does not read whole into the run's {model_cfg['kind']} model "
                                f"({(str(e).splitlines() or [type(e).__name__])[0][:200]}); rerun `snakemake --cores all "
                                f"train --forcerun train`, which sets a damaged checkpoint aside and resumes from the one "
                                f"before") from None
    return Synthesizer(cfg, model, latest, info, log)


SAMPLE = re.compile(r"(0\d|[1-9]\d+)\.(wav|npy)")  # the names `_synthesize_into` writes: f"{i:02d}.wav" and .npy


def previous_samples(cfg, out):
    """The names in folder `out` that the previous synthesize wrote, so this one may replace or remove
    them: those its sentences.json lists (each sample's wav and mel, or NN.wav/NN.npy by index where a
    sample names none) and that file itself; in the run's own runs/{name}/samples also every NN.wav and
    NN.npy and sentences.json whatever it holds, since `snakemake synthesize` deletes sentences.json (the
    rule's output) before the job. An older record's {wav path: sentence} counts as its list. None when
    out/sentences.json, elsewhere, is not a synthesize record (not JSON, no list of samples)."""
    out = Path(out)
    held = {p.name for p in out.iterdir()} if out.is_dir() else set()
    own = os.path.realpath(out) == os.path.realpath(config.run_dir(cfg) / "samples")   # the run's own: all of it
    ours = {name for name in held if SAMPLE.fullmatch(name) or name == "sentences.json"} if own else set()
    if "sentences.json" in held:
        samples = _recorded(out / "sentences.json")
        if samples is None:
            return ours if own else None
        for i, x in enumerate(samples):
            for key, suffix in (("wav", ".wav"), ("mel", ".npy")):
                name = Path(x[key]).name if isinstance(x, dict) and isinstance(x.get(key), str) else f"{i:02d}{suffix}"
                if SAMPLE.fullmatch(name):  # never another kind of file, whatever the record says
                    ours.add(name)
        ours.add("sentences.json")
    return ours & held


def _recorded(path):
    """The samples a synthesize record at `path` lists (an older record's {wav path: sentence} as
    [{"wav": path}]), or None when it is not one (unreadable, not JSON, no list of samples)."""
    try:
        samples = json.loads(path.read_text(encoding="utf-8"))["samples"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None
    if isinstance(samples, dict):
        samples = [{"wav": wav} for wav in samples]
    return samples if isinstance(samples, list) else None


def check_out(cfg, out, flag="--out"):
    """Before TensorFlow and the model load: the names in `out` that this run may replace or remove
    (previous_samples), or PipelineError naming `flag`, the folder and the files this run would write
    over that no previous synthesize wrote there (a user's 01.wav; nothing is changed)."""
    out = Path(out)
    ours = previous_samples(cfg, out)
    if ours is None:
        raise PipelineError(f"{flag} {out}: holds sentences.json, which is not one synthesize wrote (not JSON "
                            "with a list of samples); give a new or empty folder, or move it away")
    n = len(cfg["synthesize"]["sentences"])
    writes = [f"{i:02d}{suffix}" for i in range(n) for suffix in (".wav", ".npy")] + ["sentences.json"]
    theirs = [name for name in writes if name not in ours and ((out / name).exists() or (out / name).is_symlink())]
    if theirs:
        shown, them = ", ".join(theirs[:4]) + (", ..." if len(theirs) > 4 else ""), "it" if len(theirs) == 1 else "them"
        raise PipelineError(f"{flag} {out}: holds {shown}, which no earlier synthesize wrote there (no sentences.json "
                            f"lists {them}) and this one would write over; give a new or empty folder, or move {them} away")
    return ours


def synthesize(cfg, out, log=_print):
    """Every sentence into a temporary folder beside `out`, then moved into `out`, sentences.json
    last: a failure leaves the previous samples as they were (the rule's one output is sentences.json,
    so Snakemake deletes nothing else before the job). Only the previous run's samples are replaced or
    removed (check_out); the folder's other files stay. Bad input is refused before TensorFlow and the
    model load (check_before_loading, check_out)."""
    check_before_loading(cfg)
    final = Path(out)
    previous = check_out(cfg, final)
    final.parent.mkdir(parents=True, exist_ok=True)
    files.remove_leftover_folders(final, "synthesize", log)
    out = temporary_folder(final)
    try:
        samples = _synthesize_into(cfg, out, final, log)
        final.mkdir(parents=True, exist_ok=True)
        made = sorted(p.name for p in out.iterdir())
        for name in made:  # sentences.json sorts after NN.npy/wav
            os.replace(out / name, final / name)
        for name in sorted(previous - set(made)):  # the previous run's samples past this run's last sentence
            (final / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return samples


def temporary_folder(final):
    """A new folder beside `final` to write the samples in, `.{name}.tmp{pid}.{start}-{host}-XXXX`: never
    one a killed synthesize left (whose pid this process may have got), and named so that a later run can
    tell when its writer is gone (files.remove_leftover_folders)."""
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp{files.process_tag()}-", dir=final.parent))


def _synthesize_into(cfg, out, final, log):
    """Write the samples into folder `out`; what sentences.json records are their paths in `final`."""
    synth = load_synthesizer(cfg, log)
    s, a = cfg["synthesize"], synth.audio
    sentences = [x if isinstance(x, dict) else {"text": x} for x in s["sentences"]]  # voices checked already
    # the run's trained vocoder, or Griffin-Lim with vocoder.kind griffin_lim: on the run's own audio settings
    vocode = kinds.load(dict(cfg, audio=dict(a)), mels_of="the acoustic run")
    # run directly after more acoustic training: a note (`snakemake synthesize` fine-tunes it again first)
    inputs.finetuned_elsewhere(cfg, vocode.summary, synth.checkpoint, then=", then synthesize again", log=log)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    log(f"synthesizing {len(s['sentences'])} sentences from {synth.checkpoint} "
        f"(pace {s['pace']}, pitch shift {s['pitch_shift']} semitones)")
    samples = []
    for i, x in enumerate(sentences):
        sentence = x["text"]
        res = synth.infer(sentence, speaker=x.get("speaker", ""), language=x.get("language", ""),
                          where=f"synthesize.sentences[{i}]")
        if res["cut"]:  # in the job's log and on stderr (once where the log is stdout), and in sentences.json
            _warn(f"warning: sentence {i} was cut at synthesize.max_seconds = {s['max_seconds']} s: "
                  f"{final / f'{i:02d}.wav'} stops there; raise synthesize.max_seconds to hear it whole", log)
        audio = vocode(res["mel"], f0=vocode.voiced_f0(res["mel"], res["f0"]))  # F0: the model's, voicing: the vocoder's
        for what, values, fix in ((f"the model's mel ({synth.checkpoint})", res["mel"], "rerun `snakemake --cores all "
                                   "train --forcerun train`, which sets a non-finite checkpoint aside"),
                                  (f"the vocoder's audio ({vocode.made['kind']})", audio, "train the vocoder again")):
            if not np.isfinite(values).all():  # said here: the wav writer would name the temporary file
                raise PipelineError(f"synthesize.sentences[{i}]: {what} has NaN or infinite values; nothing "
                                    f"written (its weights are diverged or damaged: {fix})")
        path = out / f"{i:02d}.wav"
        save_wav(path, np.asarray(audio), a["sample_rate"])
        files.atomic_write_bytes(path.with_suffix(".npy"), _npy_bytes(res["mel"]))
        seconds = res["frames"] * a["hop_length"] / a["sample_rate"]
        log(f"{final / path.name}: {seconds:.2f} s, {res['tokens']} tokens: {sentence!r}")
        samples.append({"wav": str(final / path.name), "mel": str(final / f"{i:02d}.npy"), "text": sentence,
                        "speaker": res["speaker"], "language": res["language"],
                        "frames": res["frames"], "seconds": round(seconds, 3), "cut": bool(res["cut"])})
    files.atomic_write_text(out / "sentences.json", json.dumps(
        {"checkpoint": synth.checkpoint, "step": synth.step, "model": synth.model_kind, "pace": s["pace"],
         "pitch_shift": s["pitch_shift"], "vocoder": vocode.made,
         "samples": samples}, indent=1))
    return [x["wav"] for x in samples]


def _warn(line, log):
    print(line, file=sys.stderr, flush=True)
    if log is not _print:  # a job's log (Snakemake's synthesize.log) or a caller's: it says so there too
        log(line)


def _npy_bytes(array):
    import io
    buf = io.BytesIO()
    np.save(buf, np.asarray(array, np.float32))
    return buf.getvalue()


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Synthesize the config's sentences from the latest checkpoint.")
    config.add_arguments(parser)
    parser.add_argument("--out", help="folder for the wavs and mels (default runs/{name}/samples)")
    args = parser.parse_args(argv)
    files.check_given(args.out, "--out", "the folder to write the samples in")  # never the run's own samples
    cfg = config.from_args(args)
    out = files.followed(config.run_dir(cfg) / "samples" if args.out is None else args.out)  # as export does
    files.check_folder(out)
    synthesize(cfg, out)


if __name__ == "__main__":
    main()
