"""Export a trained run as one TensorFlow graph, token ids -> waveform, loadable without this package.

Reads the latest checkpoint in runs/{name}/checkpoints and what the run carries (runs/{name}/run.json:
vocabulary, mel statistics, its `audio:` and `model:`; `runinfo.run_vocabulary`), config keys `train.steps`,
`synthesize:` (max_seconds, griffin_lim_iters: the exported graph speaks as `snakemake synthesize`
does), `vocoder:` (kind and the model's sizes; the trained vocoder from runs/{name}/vocoder.json)
and `export.tflite`.
Writes runs/{name}/export/ (or --out), replaced as a whole only once everything is written. --out
must be new, empty or a previous export (only the files below, export.json among them; or only its
TFLite models, what `snakemake export` leaves once it has removed its outputs): any other folder is
refused before any work, one line, so an export never deletes a run or a user's files; so is a name
too long for the temporary folder export makes beside it (config.NAME_MAX). One export at a time
writes a folder (it holds `.NAME.lock` beside it: lock_path, files.exclusive); a second stops at its
start, one line naming the holder. The folder holds:

  saved_model/          serving signature `synthesize(tokens int32 [1, T], pace float32 [],
                        pitch_shift float32 []) -> {"audio": float32 [1, N]}`: acoustic model, mel
                        de-normalisation and vocoder in one graph (N = frames * hop_length); a model
                        of several speakers (languages) also takes `speaker int32 []` (`language
                        int32 []`): an index into export.json's `speakers` (`languages`); and
                        `log_mel` (same inputs) -> {"log_mel": float32 [1, frames, n_mels]}
  vocab.json            the ids the model takes: `symbols` in id order, pad/eos ids and the front end
                        (frontend, language, cleaners, espeak-ng version) that makes them
  export.json           format (pipeline.voice.EXPORT_FORMAT), run, checkpoint, step, audio settings,
                        sample rate, speakers and languages (names in id order), the signature's
                        inputs, vocoder, TFLite ops, and `files`: bytes and sha256 of each file of
                        saved_model/ and the TFLite models, which a voice checks before it loads
  model.tflite          with --tflite or `export.tflite: true`: float32, and model_float16.tflite
                        (float16 weights, float32 arithmetic)

The vocoder is chosen by `export_vocoder` alone, the one `snakemake synthesize` speaks with: the run's
trained vocoder (runs/{name}/vocoder.json, vocoder.kind source_filter, vocos or hifigan; its STFTs
are pipeline.dft.transforms', built-in TFLite ops), or Griffin-Lim (pipeline/vocoder/griffin_lim.py) with vocoder.kind
griffin_lim; export.json says which. A vocoder fine-tuned on the GTA mels of another acoustic checkpoint
than the one exported (acoustic training went on, and this command ran without `snakemake export`, which
fine-tunes it again first) is exported as it is, with one `note:` line on stderr (and in export.json's
`notes`) naming both and `snakemake --cores all vocoder`, as pipeline.vocoder.inputs.finetuned_elsewhere
words it. Griffin-Lim runs on TensorFlow's FFT in the SavedModel (the very
audio `snakemake synthesize` writes), on pipeline.dft's real-FFT pair in the TFLite models (TFLite
has RFFT2D but no IRFFT; built-in ops only), or its DFT matmuls when audio.n_fft is not a power of two.
Bad input inside the graph: a token, speaker or language id outside its table, a pace that is not a
finite number in 0.1..10 (synthesize.pace's range; > 1 speaks faster) or a pitch_shift that is not a
finite number in -24..24 semitones, fails with InvalidArgumentError (tf.debugging); an empty token
list gives empty audio, shape [1, 0].
The export runs on the CPU (`placement.cpu_only`): it asks no GPU turn in the DAG, so it never takes
GPU memory from a job beside it.

    python -m pipeline.export --config configs/config.yaml [--out DIR] [--tflite]
    snakemake --cores all export

    import tensorflow as tf                              # nothing else: not this package
    voice = tf.saved_model.load("runs/demo/export/saved_model")
    audio = voice.synthesize(tf.constant([ids], tf.int32), tf.constant(1.0), tf.constant(0.0))["audio"]
    # several speakers: voice.signatures["synthesize"](tokens=..., pace=..., pitch_shift=..., speaker=tf.constant(2))
"""
import argparse
import functools
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline import config, dft, files, models, placement, runinfo
from pipeline.audio import LOG_CLAMP
from pipeline.errors import PipelineError, cli
from pipeline.synthesize import PACE, PITCH_SHIFT, frame_f0, load_synthesizer
from pipeline.vocoder import inputs
from pipeline.vocoder.griffin_lim import griffin_lim_graph
from pipeline.voice import EXPORT_FORMAT, file_digests, symbols_digest

SIGNATURE = "synthesize"
TFLITE_FILES = {"float32": "model.tflite", "float16": "model_float16.tflite"}
# everything an export folder holds: name -> is a folder (check_out: what replacing it may delete)
# written last into the new export, before it replaces the old one: `snakemake export`'s one declared output.
# Snakemake deletes a job's outputs before it runs (and a failed job's): only this goes, so an interrupted
# export keeps the previous one whole, and a folder without it (deleted, or interrupted) exports again.
STAMP = ".exported"
WRITES = {"saved_model": True, "vocab.json": False, "export.json": False, STAMP: False,
          **dict.fromkeys(TFLITE_FILES.values(), False)}
EMPTY_TOKENS = "an empty token list gives empty audio, shape [1, 0]"


class ExportError(PipelineError):
    """A run that cannot be exported as it is; the message says what to change or run."""


class Held:
    """A Keras model kept out of a tf.Module's object graph; the module tracks its variables instead.

    tf.saved_model.save saves every tf.function it finds on every object it saves, whether a
    signature calls it or not. On a Keras model that includes Keras's own `serving_default` (a
    trace of the model alone) and the model's own tf.functions (FastPitch's `_infer`). For the
    demo voice those two were half of saved_model.pb: the vocoder's DFT bases a second time. They
    also made its load slower. The signatures capture the same variables either way."""

    def __init__(self, model):
        self.model = model


class TrainedVocoder(tf.Module):
    """The run's trained vocoder (pipeline.vocoder.kinds) as a graph function: log-mel (F, n_mels) ->
    audio (F * hop,), the very model `pipeline.vocode` and `snakemake synthesize` call; its weights are
    tracked, so the SavedModel carries them."""

    def __init__(self, model, hop_length, floor, uses_f0=False, min_frames=1):
        super().__init__(name="vocoder")
        self._held, self.generator_variables = Held(model), list(model.variables)  # see Held
        self._hop, self._floor, self._uses_f0 = int(hop_length), float(floor), bool(uses_f0)
        self._min_frames = int(min_frames)  # the fewest the model takes (pipeline.vocoder.kinds.min_frames)

    @property
    def generator(self):
        return self._held.model

    def __call__(self, log_mel, f0=None):
        """f0 (F,) Hz: the acoustic model's (synthesize.frame_f0), for a kind that uses F0, gated by its
        voicing head as `snakemake synthesize` does; None: the vocoder's own F0 head's."""
        # fewer frames than the model takes (an empty token list; source_filter's STFT needs two at
        # n_fft 1024, hop 256): run silent frames after them, keep only the audio of the mel's own
        frames = tf.shape(log_mel)[0]
        empty = tf.maximum(self._min_frames - frames, 0)
        silence = tf.fill(tf.stack([empty, tf.shape(log_mel)[1]]), self._floor)
        log_mel = tf.concat([log_mel, silence], 0)  # keeps the static n_mels: TFLite's CONV_2D needs it
        if not self._uses_f0:
            return self.generator(log_mel[None], training=False)[0, :frames * self._hop]
        if f0 is not None:
            f0 = self.generator.voiced_f0(log_mel[None], tf.expand_dims(tf.concat([f0, tf.zeros([empty])], 0), 0))
        return self.generator(log_mel[None], f0=f0, training=False)[0, :frames * self._hop]


def export_vocoder(cfg, audio, transforms):
    """THE choice of the exported graph's vocoder -> (fn(log_mel (F, n_mels)) -> audio (F * hop,), its
    export.json entry), the vocoder `snakemake synthesize` speaks with: the run's trained vocoder
    (runs/{name}/vocoder.json; MissingCheckpoint naming `snakemake --cores all vocoder` when there is none),
    or Griffin-Lim with `synthesize.griffin_lim_iters` when vocoder.kind is griffin_lim. audio: the run's
    mel settings. transforms: "fft" (SavedModel), "rfft" or "dft" (TFLite built-ins), for Griffin-Lim; a
    trained vocoder's STFTs are pipeline.dft.transforms' in both."""
    if cfg["vocoder"]["kind"] != "griffin_lim":
        from pipeline.vocoder import kinds
        trained = kinds.load(dict(cfg, audio=dict(audio)), mels_of="the acoustic run")  # as synthesize does
        info = {**trained.made, "trained": True, "phase": trained.summary.get("phase"),
                "checkpoint": trained.summary["checkpoint"], "summary": str(kinds.summary_path(cfg)),
                "gta_from": trained.summary.get("gta_from")}  # the acoustic checkpoints fine-tuning adapted it to
        info["f0"] = "the acoustic model's pitch (Hz, pitch_shift applied), voiced where the vocoder's head " \
            "hears voicing" if trained.uses_f0 else None
        return TrainedVocoder(trained.model, audio["hop_length"], np.log(LOG_CLAMP), trained.uses_f0,
                              trained.min_frames), info
    iters = int(cfg["synthesize"]["griffin_lim_iters"])
    gl = functools.partial(griffin_lim_graph, **audio, iters=iters, transforms=transforms)
    fn = lambda log_mel, f0=None: gl(log_mel)  # noqa: E731 (no use for F0)
    info = {"kind": "griffin_lim", "iters": iters, "trained": False,
            "note": "Griffin-Lim phase recovery inside the graph (vocoder.kind: griffin_lim); no trained vocoder"}
    return fn, info


def max_tokens(model):
    """The most tokens one call takes: the acoustic model's max_positions (FastPitch's 4096), the
    sequence length it is built for. Self-attention's memory grows with the square of the tokens
    (16,000 took ~3 GB; the demo voice at 4096: 1.0 GB peak RSS, TensorFlow included); pipeline.voice
    splits its calls below it."""
    return int(model.enc_pos.max_positions)


INPUTS = [tf.TensorSpec([1, None], tf.int32, name="tokens"), tf.TensorSpec([], tf.float32, name="pace"),
          tf.TensorSpec([], tf.float32, name="pitch_shift")]
VOICE_TABLES = {"speaker": "speakers", "language": "languages"}  # input -> its export.json table


def signature_inputs(voices=()):
    """The signature's inputs: INPUTS, then `speaker` / `language` int32 [] for the voice fields the
    model takes (only with several speakers / languages: a single-speaker export's signature is INPUTS)."""
    return INPUTS + [tf.TensorSpec([], tf.int32, name=field) for field in voices]


def _in_range(x, bounds, what):
    """An assertion that scalar `x` is finite and within `bounds` (InvalidArgumentError naming it)."""
    lo, hi = bounds
    ok = tf.logical_and(tf.math.is_finite(x), tf.logical_and(x >= lo, x <= hi))  # False for NaN
    return tf.debugging.Assert(ok, [f"{what} in {lo:g}..{hi:g}; got", x])


class Voice(tf.Module):
    """The exported graph: tokens -> acoustic model -> log-mel -> vocoder -> audio, one call.
    voice_sizes: {"speaker": n, "language": n} for the voice inputs the signature takes (in that
    order; {} for a single-speaker, single-language model)."""

    def __init__(self, model, vocab, mel_mean, mel_std, max_frames, vocoder, voice_sizes=None):
        super().__init__(name="voice")
        self._held, self.model_variables = Held(model), list(model.variables)  # see Held
        self._n_symbols, self._eos = len(vocab["symbols"]), int(vocab["eos_id"])
        self.max_tokens = max_tokens(model)
        self._mel_mean = tf.constant(mel_mean, tf.float32)
        self._mel_std = tf.constant(mel_std, tf.float32)
        self._max_frames, self._vocoder = int(max_frames), vocoder
        self.voice_sizes = dict(voice_sizes or {})
        self.voices = tuple(self.voice_sizes)
        spec = signature_inputs(self.voices)
        # Not converted by AutoGraph: everything the graph runs (the checks, the model's infer, frame_f0,
        # the vocoder, Griffin-Lim's tf.while_loops) branches only on Python values
        self.synthesize = tf.function(self._synthesize, input_signature=spec, autograph=False)
        self.log_mel = tf.function(self._log_mel_signature, input_signature=spec, autograph=False)

    @property
    def model(self):
        return self._held.model

    def _log_mel(self, tokens, pace, pitch_shift, voice_ids=(), with_f0=False):
        """tokens (1, T) -> log-mel (F, n_mels), as pipeline.synthesize makes it; checks the inputs.
        voice_ids: the speaker / language id scalars, in self.voices' order. with_f0: -> (log-mel,
        F0 (F,) Hz per frame or None: pipeline.synthesize.frame_f0)."""
        checks = [tf.debugging.assert_less_equal(tf.shape(tokens)[1], self.max_tokens, message=(
                      f"tokens: more than {self.max_tokens} (export.json max_tokens); split the text")),
                  tf.debugging.assert_non_negative(tokens, message="tokens: a negative token id"),
                  tf.debugging.assert_less(tokens, self._n_symbols, message="tokens: an id outside the vocabulary "
                                           f"(0..{self._n_symbols - 1}, vocab.json)"),
                  _in_range(pace, PACE, "pace must be a finite number"),
                  _in_range(pitch_shift, PITCH_SHIFT, "pitch_shift must be a finite number of semitones")]
        for field, ids in zip(self.voices, voice_ids):
            n = self.voice_sizes[field]
            checks += [tf.debugging.assert_non_negative(ids, message=f"{field}: a negative {field} id"),
                       tf.debugging.assert_less(ids, n, message=f"{field}: an id outside 0..{n - 1} "
                                                f"(export.json {VOICE_TABLES[field]})")]
        with tf.control_dependencies(checks):  # before the embedding's gather can fail on its own
            tokens, pace, pitch_shift = tf.identity(tokens), tf.identity(pace), tf.identity(pitch_shift)
            voice_ids = [tf.reshape(tf.identity(ids), [1]) for ids in voice_ids]
        tokens = self._refusable(tokens)
        # a negative speaker / language id: the table's size, which its gather refuses in TFLite too
        voice_ids = [tf.where(ids < 0, self.voice_sizes[field], ids) for field, ids in zip(self.voices, voice_ids)]
        empty = tf.cast(tf.equal(tf.shape(tokens)[1], 0), tf.int32)
        # no tokens: run one end-of-sequence token (the model needs one) and keep none of its frames
        tokens = tf.pad(tokens, tf.stack([[0, 0], tf.stack([0, empty])]), constant_values=self._eos)
        out = self.model.infer(tokens, tf.shape(tokens)[1:], pace=pace, pitch_shift=pitch_shift,
                               max_frames=self._max_frames, **dict(zip(self.voices, voice_ids)))
        frames = out["lengths"][0] * (1 - empty)
        mel = out["mel"][0, :frames] * self._mel_std + self._mel_mean                  # (F, n_mels)
        if not with_f0:
            return mel
        f0 = frame_f0(self.model, out, voice_ids[0] if "speaker" in self.voices[:1] else None)
        return mel, None if f0 is None else f0[0, :frames]                             # (F,) Hz

    def _refusable(self, tokens):
        """tokens with every negative id, and all of them past max_tokens, made n_symbols: an id the
        embedding's gather refuses. TFLite drops the tf.debugging assertions above, and Keras 3's `take`
        wraps a negative id numpy-style (-1 would speak as the last symbol); this way a TFLite model
        refuses such input too ("gather index out of bounds"). Built-in ops only (SELECT_V2)."""
        bad = tf.logical_or(tokens < 0, tf.shape(tokens)[1] > self.max_tokens)
        return tf.where(bad, tf.constant(self._n_symbols, tf.int32), tokens)

    def _synthesize(self, tokens, pace, pitch_shift, *voice_ids):
        """-> {"audio": (1, F * hop_length)}: the serving signature (`synthesize`)."""
        return {"audio": self._vocoder(*self._log_mel(tokens, pace, pitch_shift, voice_ids, with_f0=True))[None]}

    def _log_mel_signature(self, tokens, pace, pitch_shift, *voice_ids):
        """-> {"log_mel": (1, F, n_mels)}: the mel the vocoder hears (`log_mel`: for another vocoder, or checks)."""
        return {"log_mel": self._log_mel(tokens, pace, pitch_shift, voice_ids)[None]}


def build_voice(cfg, transforms="fft", synth=None, log=print):
    """(Voice, synthesizer, vocabulary, vocoder info) for the run's latest checkpoint."""
    synth = synth or load_synthesizer(cfg, log)
    run = runinfo.run_vocabulary(cfg)  # the vocabulary the synthesizer's model was built with (the same run.json)
    problem = models.export_problem(run["model"])
    if problem:
        raise ExportError(problem)
    vocoder, info = export_vocoder(cfg, run["audio"], transforms)
    tables = {"speaker": synth.speakers, "language": synth.languages}
    voice = Voice(synth.model, run["vocab"], run["mel_mean"], run["mel_std"], synth.max_frames, vocoder,
                  voice_sizes={f: len(tables[f]) for f in synth.voiced})  # several speakers / languages only
    return voice, synth, run, info


def frozen_module(voice):
    """A tf.Module whose `synthesize` is voice.synthesize with the weights folded in as constants:
    a TFLite model keeping them as variables fails at READ_VARIABLE (nothing initialises them)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    frozen = convert_variables_to_constants_v2(voice.synthesize.get_concrete_function())

    def synthesize(tokens, pace, pitch_shift, *voice_ids):
        return {"audio": tf.nest.flatten(frozen(tokens, pace, pitch_shift, *voice_ids))[0]}

    module = tf.Module(name="frozen")
    module.synthesize = tf.function(synthesize, input_signature=signature_inputs(getattr(voice, "voices", ())),
                                    autograph=False)
    module.graph = frozen  # tracked, so the saved function finds it
    return module


def convert_tflite(saved_model, float16=False):
    """(flatbuffer bytes, ops entry) of a SavedModel's `synthesize` signature: built-in ops only, else
    built-ins plus TF Select (Flex) ops, which the entry names (a runtime then needs the Flex delegate)."""
    def convert(ops):
        converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model), signature_keys=[SIGNATURE])
        converter.target_spec.supported_ops = ops
        if float16:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        return converter.convert()

    try:
        return convert([tf.lite.OpsSet.TFLITE_BUILTINS]), {"ops": "builtin", "select_tf_ops": []}
    except Exception as e:  # ConverterError naming the ops TFLite lacks
        named = sorted(set(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", str(e))))
        flat = convert([tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS])
        return flat, {"ops": "builtin+select_tf_ops", "select_tf_ops": named}


def speak_test_sentence(voice, vocab):
    """(the signature's inputs as numpy {name: value}, the audio (N,) `voice`'s graph gives them) for a
    test sentence: up to 8 symbols of the vocabulary, pace 1, no pitch shift."""
    n = len(vocab["symbols"])
    ids = [i for i in range(n) if i not in (0, int(vocab["eos_id"]))][:8]
    inputs = {"tokens": np.array([ids], np.int32), "pace": np.float32(1.0), "pitch_shift": np.float32(0.0)}
    # several speakers / languages: the last of each (an id other than the default 0)
    inputs.update({f: np.int32(n - 1) for f, n in getattr(voice, "voice_sizes", {}).items()})
    return inputs, np.asarray(voice.synthesize(*map(tf.constant, inputs.values()))["audio"])[0]


def _non_finite(audio, who):
    bad = int((~np.isfinite(audio)).sum())
    return f"{who} gave non-finite audio ({bad} of {audio.size} samples) for a test sentence" if bad else None


def checked_voice(cfg, log=print):
    """build_voice's for the SavedModel (transforms "fft") and its speak_test_sentence, once its graph has
    spoken the test sentence in finite samples, else ExportError naming the checkpoint: one with NaN or
    infinite weights (diverged, or saved by older code) is never exported silently."""
    voice, synth, run, info = build_voice(cfg, "fft", log=log)
    spoken = speak_test_sentence(voice, run["vocab"])
    refused = _non_finite(spoken[1], "the graph")
    if refused:
        raise ExportError(f"{synth.checkpoint}: {refused}, so it is not exported; a diverged or damaged checkpoint: "
                          "rerun `snakemake --cores all train --forcerun train`, which sets a non-finite checkpoint "
                          "aside and resumes from the one before")
    return voice, synth, run, info, spoken


def check_tflite(flat, voice, vocab, spoken=None):
    """None when the TFLite model speaks a test sentence as the SavedModel graph does, else the reason.
    A converter can write a model whose kernels misbehave in the interpreter (all-NaN audio has been
    seen with transposed convolutions); such a file is left out, never shipped silently. `spoken`: the
    SavedModel graph's speak_test_sentence, when the caller has it (checked_voice's), not spoken again."""
    inputs, want = spoken or speak_test_sentence(voice, vocab)
    runner = tf.lite.Interpreter(model_content=flat).get_signature_runner(SIGNATURE)
    got = runner(**inputs)["audio"][0]
    if got.shape != want.shape:
        return f"tf.lite.Interpreter gave {got.shape[0]} samples for a test sentence, the SavedModel {want.shape[0]}"
    return _non_finite(got, "tf.lite.Interpreter")


def signature_description(voices=()):
    """export.json's `signature.inputs`: {input name: "dtype [shape]"} in the signature's order."""
    out = {"tokens": "int32 [1, T]", "pace": "float32 []", "pitch_shift": "float32 []"}
    out.update({f: f"int32 [], an index into {VOICE_TABLES[f]}" for f in voices})
    return out


def _train_state(cfg, step):
    path = config.run_dir(cfg) / "train.json"
    planned = int(cfg["train"]["steps"])
    return {"step": step, "planned_steps": planned, "finished": step is not None and step >= planned,
            "summary": str(path) if path.is_file() else None}


def _notes(meta):
    """Plain sentences on what the export is not (yet): an unfinished run, no trained vocoder."""
    acoustic, notes = meta["acoustic"], []
    if acoustic["step"] is None:
        notes.append("the acoustic model is a checkpoint put in the run by hand: its step is not known")
    elif not acoustic["finished"]:
        notes.append(f"the acoustic model is exported at step {acoustic['step']} of train.steps "
                     f"{acoustic['planned_steps']}: not fully trained")
    if not meta["vocoder"]["trained"]:
        notes.append(f"vocoder: {meta['vocoder']['note']}")
    return notes


def check_out(out, flag="--out"):
    """Before any work: `out` as an absolute path (`.`, `..` and trailing slashes resolved), or
    PipelineError naming `flag` unless it is a folder export may replace whole: new, empty, or a
    previous export (WRITES only: export.json with it, or only the TFLite models, which is what
    `snakemake export` leaves once it has removed the rule's outputs), with a writable parent (the new
    export is written beside it, then renamed). A symbolic link is followed: the folder it leads to is
    replaced, the link kept (it was replaced by a folder, and the old link left beside it)."""
    files.check_given(out, flag, "the export folder to write")
    given = Path(os.path.abspath(out))
    if len(given.name.encode("utf-8")) > config.NAME_MAX:   # the OS refuses even to look: not a link
        check_name_length(given, flag)
    out = check_name_length(files.followed(given, flag), flag)  # the link stays, where it leads is replaced
    if not out.name:
        raise PipelineError(f"{flag} {out}: the root folder; give the export folder to write")
    files.check_folder(out, flag)
    files.check_writable(out, flag, out.parent)  # the new export is made beside it, then renamed
    held = sorted(out.iterdir()) if out.is_dir() else []
    other = [p.name + ("/" if p.is_dir() else "") for p in held
             if p.name not in WRITES or WRITES[p.name] != (p.is_dir() and not p.is_symlink())]
    names = {p.name for p in held}
    if other or (held and "export.json" not in names and not names <= set(TFLITE_FILES.values())):
        shown = ", ".join(other[:3] or sorted(names)[:3]) + (", ..." if len(other or names) > 3 else "")
        raise PipelineError(f"{flag} {out}: holds {shown}, not a previous export (export replaces its folder "
                            "whole); give a new or empty folder, or move those away")
    return out


def lock_path(out):
    """The lock file a running export to `out` holds: `.NAME.lock` beside it, in its parent folder, which
    outlives the renames that replace `out` whole."""
    return out.with_name(f".{out.name}.lock")


def check_name_length(out, flag="--out"):
    """`out`, or PipelineError naming `flag` and config.NAME_MAX when `out`'s name, or a name export makes
    beside it (its temporary folder `.NAME.tmp{files.process_tag()}-0`, the previous export's `.old`
    one, lock_path), is longer than a file or folder name may be: the temporary folder's failed only
    once the model was built and checked. The root folder (no name) is check_out's to refuse."""
    if not out.name:
        return out
    made = [out.name, files.tagged_folder(out).name, files.tagged_folder(out, "old").name, lock_path(out).name]
    longest, own = max(len(name.encode("utf-8")) for name in made), len(out.name.encode("utf-8"))
    if longest > config.NAME_MAX:
        raise PipelineError(f"{flag} {out}: a name of {own} bytes; export's temporary folder beside it would be "
                            f"named {longest}, more than a file or folder name may have ({config.NAME_MAX} bytes); "
                            f"give a name of at most {config.NAME_MAX - (longest - own)} bytes")
    return out


def write_export_json(folder, meta, log=print):
    """Write `meta` as `folder`'s export.json, with `files`: the bytes and sha256 of every file of saved_model/
    and of the TFLite models there (pipeline.voice.file_digests), which a voice checks before it loads them,
    so a saved_model/ copied in from another export, or edited, is refused."""
    t0 = time.perf_counter()
    meta["files"] = file_digests(folder, ["saved_model", *(n for n in TFLITE_FILES.values() if (folder / n).is_file())])
    log(f"files: sha256 of {len(meta['files'])} ({time.perf_counter() - t0:.2f} s)")
    (folder / "export.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")


def export(cfg, out, tflite=None, log=functools.partial(print, flush=True)):
    """Write saved_model/, vocab.json, export.json (+ the TFLite models) into `out` (check_out's: new,
    empty or a previous export, replaced whole); -> export.json dict. A second export to `out` while
    this one runs stops at its start, one line naming the holder of lock_path(out)."""
    out = check_out(out)
    busy = lambda holder: (f"--out {out}: another export is writing it now ({holder} holds {lock_path(out)}); "
                           "wait for it to end, or give another --out")
    missing = [p for p in (out.parent, *out.parent.parents) if not p.exists()]  # deepest first
    out.parent.mkdir(parents=True, exist_ok=True)  # the lock goes beside --out, in a folder export makes anyway
    try:
        with files.exclusive(lock_path(out), busy):
            return _export(cfg, out, tflite, log)
    except BaseException:
        for folder in missing:  # an export refused before it wrote (no trained run, say) leaves no empty folders
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _export(cfg, out, tflite, log):
    """export's work, under its lock."""
    tflite = cfg["export"]["tflite"] if tflite is None else tflite
    voice, synth, run, vocoder, spoken = checked_voice(cfg, log=log)  # before anything is written
    # snakemake export fine-tunes the vocoder on the latest acoustic checkpoint first; a direct export says so
    stale = inputs.finetuned_elsewhere(cfg, vocoder, synth.checkpoint, then=", then export again",
                                       log=lambda note: print(note, file=sys.stderr, flush=True))
    files.remove_leftover_folders(out, "export", log)
    tmp = files.tagged_folder(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        t0 = time.perf_counter()
        tf.saved_model.save(voice, str(tmp / "saved_model"), signatures={SIGNATURE: voice.synthesize,
                                                                         "log_mel": voice.log_mel})
        log(f"saved_model: {time.perf_counter() - t0:.1f} s")
        a = run["audio"]
        meta = {
            "format": EXPORT_FORMAT, "run": cfg["name"], "run_dir": str(config.run_dir(cfg)), "checkpoint": synth.checkpoint,
            "step": synth.step, "model": run["model"]["kind"], "acoustic": _train_state(cfg, synth.step),
            "sample_rate": a["sample_rate"], "audio": dict(a), "n_mels": run["n_mels"],
            "max_seconds": cfg["synthesize"]["max_seconds"], "max_frames": synth.max_frames,
            "speakers": synth.speakers, "languages": synth.languages,        # names in id order
            "max_tokens": voice.max_tokens, "vocab_digest": symbols_digest(run["vocab"]["symbols"]),
            "signature": {"name": SIGNATURE, "inputs": signature_description(voice.voices),
                          "outputs": {"audio": "float32 [1, N], N = frames * hop_length"},
                          "empty_tokens": EMPTY_TOKENS},
            "vocoder": vocoder, "tensorflow": tf.__version__, "tflite": None,
        }
        meta["notes"] = _notes(meta) + ([stale.removeprefix("note: ")] if stale else [])
        if tflite:  # the same graph on pipeline.dft's transforms, through a SavedModel of its own
            transforms = dft.transform_name(a["n_fft"])   # the vocoders' pair: RFFT2D at powers of two
            voice_dft, *_ = build_voice(cfg, transforms, synth=synth, log=log)
            frozen = frozen_module(voice_dft)
            tf.saved_model.save(frozen, str(tmp / ".dft_model"), signatures={SIGNATURE: frozen.synthesize})
            meta["tflite"] = {"transforms": transforms}
            for kind, name in TFLITE_FILES.items():
                t0 = time.perf_counter()
                flat, ops = convert_tflite(tmp / ".dft_model", float16=kind == "float16")
                refused = check_tflite(flat, voice, run["vocab"], spoken)
                if refused:
                    meta["tflite"][kind] = {"file": None, "refused": refused, **ops}
                    log(f"{name}: left out: {refused}; use the SavedModel")
                    continue
                (tmp / name).write_bytes(flat)
                meta["tflite"][kind] = {"file": name, "bytes": len(flat), **ops}
                log(f"{name}: {len(flat) / 1e6:.1f} MB, {ops['ops']} ops {ops['select_tf_ops'] or ''} "
                    f"({time.perf_counter() - t0:.1f} s)")
            shutil.rmtree(tmp / ".dft_model")
        (tmp / "vocab.json").write_text(json.dumps(run["vocab"], indent=1, ensure_ascii=False), encoding="utf-8")
        write_export_json(tmp, meta, log)  # after every file it lists
        (tmp / STAMP).write_text(f"{synth.checkpoint}\n", encoding="utf-8")
        _replace_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    trained = f"trained, {vocoder['steps']} + {vocoder['finetune_steps']} steps" if vocoder["trained"] else "untrained"
    log(f"exported {synth.checkpoint} (step {synth.step}) to {out}: vocoder {vocoder['kind']} ({trained})")
    return meta


def _replace_folder(new, out):
    """Put folder `new` at `out`; an old `out` is moved aside first and removed only after. `out` is
    checked again first (check_out): what it holds may have changed while the export ran."""
    check_out(out)
    old = files.tagged_folder(out, "old")
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Export the run's latest checkpoint as a SavedModel (+ TFLite).")
    config.add_arguments(parser)
    parser.add_argument("--out", help="folder to write (default runs/{name}/export)")
    parser.add_argument("--tflite", action="store_true", default=None,
                        help="also write model.tflite and model_float16.tflite (default: export.tflite)")
    args = parser.parse_args(argv)
    placement.cpu_only()  # tracing, saving and checking the voice run on the CPU, beside GPU jobs
    cfg = config.from_args(args, check_paths=False)
    out = check_out(config.run_dir(cfg) / "export" if args.out is None else args.out)  # before any work
    export(cfg, out, tflite=args.tflite)


if __name__ == "__main__":
    main()
