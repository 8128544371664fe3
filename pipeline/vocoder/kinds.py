"""The vocoders behind one interface, picked by `vocoder.kind` (docs/vocoder.md).

    from pipeline.vocoder import kinds
    gen = kinds.build(cfg["vocoder"], cfg["audio"])   # a keras.Model: mel [B, F, n_mels] -> audio [B, F*hop]
    vocode = kinds.load(cfg)                          # the run's final trained vocoder (or Griffin-Lim)
    audio = vocode(log_mel, f0=None)                     # (F, n_mels) natural-log mel [+ (F,) F0 Hz] -> float32 (F*hop,)

Kinds: `vocos` (vocos.py), `hifigan` (hifigan.py, V1/V2 by vocoder.hifigan.size), `source_filter`
(source_filter.py: F0-driven harmonic + noise sources, a network for the filter), `griffin_lim`
(pipeline/vocoder/griffin_lim.py, no training).
A trainable kind is `build(vocoder_cfg, audio_cfg) -> keras.Model` taking the caches' log-mel
(float32, unnormalised) and returning float32 audio of exactly F * hop_length samples; the
spectral, adversarial and feature-matching losses are shared (discriminators.py). A kind registered
with `uses_f0=True` also takes `f0=` (B, F) Hz, 0 unvoiced (None: its own estimate from the mel),
and may define `auxiliary_loss(mel, f0) -> (loss, terms)`, added to its training loss; the other
kinds are called without F0, which they do not use.

`load` builds the trained vocoder from the `audio:` and `vocoder:` sections its summary records
(runs/{name}/vocoder.json), never the config's (one note on stderr names what the config gives
otherwise); a mel longer than CHUNK_FRAMES goes through in chunks with the kind's `context` frames
on both sides: the same audio, in memory bounded by the chunk (docs/vocoder.md, "Limits and errors").

Importing this module loads no TensorFlow: each kind's module (and TensorFlow with it) is imported
when a model is first built, so the registry, `trained_audio` and the vocode command's checks of its
input answer in a fraction of a second, and Snakemake's planning can ask `uses_f0`.
"""
import importlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from pipeline import config, runinfo
from pipeline.errors import MissingCheckpoint, PipelineError, located
from pipeline.registry import Registry
from pipeline.vocoder import inputs

# build(vocoder_cfg, audio_cfg) -> keras.Model for the trained kinds; None: no training (Griffin-Lim);
# uses_f0: the model takes f0= (training reads the pitch cache; synthesis passes the acoustic model's)
# context(vocoder_cfg, audio_cfg): mel frames each side that one output frame depends on (long mels are
# vocoded in chunks with that much context: the same audio, bounded memory); None: vocoded whole
KINDS = Registry("vocoder.kind", config.ConfigError, what="kind", build=None, uses_f0=False, context=None)
CHUNK_FRAMES = 2048  # mel frames per chunk when vocoding a long mel (pipeline.vocode; docs/vocoder.md)


def _builder(module):
    """The `build` of pipeline/vocoder/{module}.py, imported (TensorFlow with it) when first called."""
    def build(vocoder_cfg, audio_cfg):
        return importlib.import_module(f"pipeline.vocoder.{module}").build(vocoder_cfg, audio_cfg)
    build.__qualname__ = f"{module}.build"
    return build


def _vocos_context(vocoder_cfg, audio_cfg):
    """The embedding conv (kernel 7), each ConvNeXt block's depthwise conv, then the inverse STFT's
    overlapping windows (n_fft / hop frames), and a frame to spare."""
    v = vocoder_cfg["vocos"]
    return 3 + v["layers"] * (v["kernel"] // 2) + math.ceil(audio_cfg["n_fft"] / audio_cfg["hop_length"]) + 1


def _hifigan_context(vocoder_cfg, audio_cfg):
    """Input conv (kernel 7), then per upsampling stage one input sample each side (transposed conv) and
    the widest residual block's reach at that stage's rate, the output conv (kernel 7), and a frame to spare."""
    from pipeline.vocoder import hifigan
    reach = max(hifigan.KERNELS) // 2 * (sum(hifigan.DILATIONS) + len(hifigan.DILATIONS))  # samples at its rate
    frames, rate = 3.0, 1
    for u in hifigan.RATES.get(audio_cfg["hop_length"], ()):
        frames += 1 / rate
        rate *= u
        frames += reach / rate
    return math.ceil(frames + 3 / rate) + 1


KINDS.add("vocos", build=_builder("vocos"), context=_vocos_context)
KINDS.add("hifigan", build=_builder("hifigan"), context=_hifigan_context)
KINDS.add("source_filter", build=_builder("source_filter"), uses_f0=True)
KINDS.add("griffin_lim")


def build(vocoder_cfg, audio_cfg):
    import tensorflow as tf
    kind = KINDS.get(vocoder_cfg["kind"])
    if kind.build is None:
        raise config.ConfigError(f"vocoder.kind: {kind.name!r} has no trainable model "
                                 f"(trained kinds: {', '.join(k for k in KINDS if KINDS.get(k).build)})")
    model = kind.build(vocoder_cfg, audio_cfg)
    # create the variables on a mel as long as the kind takes (source_filter: 512 frames at n_fft 16384, hop 16)
    model(tf.zeros([1, max(8, min_frames(kind.name, audio_cfg)), audio_cfg["n_mels"]]))
    return model


def summary_path(cfg):
    """runs/{name}/vocoder.json: the final vocoder's summary (kind, steps, checkpoint)."""
    return config.run_dir(cfg) / "vocoder.json"


def uses_f0(vocoder_cfg):
    """Whether `vocoder.kind` takes F0 (its training reads the pitch cache)."""
    return KINDS.get(vocoder_cfg["kind"]).uses_f0


def min_frames(kind, audio_cfg):
    """The fewest mel frames vocoder `kind` takes at `audio_cfg`'s n_fft and hop_length: source_filter
    takes the STFT of its source (pipeline.dft), whose reflect padding of (n_fft - hop_length) / 2
    samples on the right must be shorter than the frames' audio; the other kinds take one frame
    (Griffin-Lim pads a short mel itself). `Vocoder` and the exported graph run silent frames after a
    shorter mel and keep only its own audio."""
    if kind != "source_filter":
        return 1
    from pipeline.audio import frame_padding
    _, right = frame_padding(n_fft=audio_cfg["n_fft"], hop_length=audio_cfg["hop_length"])
    return right // audio_cfg["hop_length"] + 1


def chunked(run, frames, hop, context, chunk_frames):
    """float32 audio (frames * hop,) from `run(start, stop)`, the audio of mel frames [start, stop): one
    call for at most `chunk_frames` frames (or `context` None), else one per chunk of `chunk_frames`
    frames, each run with `context` frames more on both sides and trimmed back to its own frames."""
    if context is None or chunk_frames is None or frames <= chunk_frames:
        return np.asarray(run(0, frames), np.float32)
    out = np.empty(frames * hop, np.float32)
    for start in range(0, frames, chunk_frames):
        stop = min(start + chunk_frames, frames)
        a, b = max(0, start - context), min(frames, stop + context)
        out[start * hop:stop * hop] = run(a, b)[(start - a) * hop:(stop - a) * hop]
    return out


class Vocoder:
    """A callable (log-mel (F, n_mels), f0=None (F,) Hz) -> float32 audio (F*hop,), with `.kind`,
    `.steps`, `.finetune_steps`, `.uses_f0`. Kinds without F0 ignore `f0`; with F0 and none given,
    the model's own F0 head estimates it from the mel."""

    def __init__(self, cfg, model=None, summary=None):
        self.cfg, self.model, self.kind = cfg, model, cfg["vocoder"]["kind"]
        self.audio = cfg["audio"]  # the settings it was trained with (load: the run's own)
        self.uses_f0 = uses_f0(cfg["vocoder"])
        context = KINDS.get(self.kind).context
        self.context = None if context is None else context(cfg["vocoder"], self.audio)
        self.min_frames = min_frames(self.kind, self.audio)
        self.summary = summary or {}
        self.steps = self.summary.get("steps", 0)
        self.finetune_steps = self.summary.get("finetune_steps", 0)
        self.finetune_share = self.summary.get("finetune_share")  # None: no fine-tuning or a summary from before it
        if model is not None:  # one trace for every mel length (chunks, sentences, clips)
            import tensorflow as tf
            mel, f0 = tf.TensorSpec([1, None, self.audio["n_mels"]], tf.float32), tf.TensorSpec([1, None], tf.float32)
            self._call = tf.function(lambda m: model(m, training=False), input_signature=[mel], autograph=False)
            if self.uses_f0:
                self._call_f0 = tf.function(lambda m, f: model(m, f0=f, training=False), input_signature=[mel, f0],
                                            autograph=False)

    def __call__(self, log_mel, f0=None, chunk_frames=CHUNK_FRAMES):
        """A mel longer than `chunk_frames` goes through in chunks, each with `self.context` frames of
        context each side, trimmed off: the unchunked audio (to float rounding) in bounded memory."""
        log_mel = np.asarray(log_mel, np.float32)
        if self.model is None:  # Griffin-Lim
            from pipeline.vocoder.griffin_lim import griffin_lim
            return griffin_lim(log_mel, **self.audio, iters=self.cfg["synthesize"]["griffin_lim_iters"]).numpy()
        if self.uses_f0 and f0 is not None:
            f0 = np.asarray(f0, np.float32)
            if f0.shape != log_mel.shape[:1]:
                raise ValueError(f"f0 has shape {f0.shape}, the mel {len(log_mel)} frames: one F0 per frame")
            if not np.all(np.isfinite(f0)):  # the network takes log F0: NaN audio from that frame's reach on
                raise ValueError(f"f0 holds NaN or infinite values (frame {int(np.argmin(np.isfinite(f0)))}): "
                                 f"F0 in Hz, 0 where unvoiced")
        frames, hop = len(log_mel), self.audio["hop_length"]
        if frames < self.min_frames:  # silent frames after it (as the exported graph runs), its own audio kept
            from pipeline.audio import LOG_CLAMP
            empty = self.min_frames - frames
            log_mel = np.concatenate([log_mel, np.full((empty, log_mel.shape[1]), np.log(LOG_CLAMP), np.float32)])
            f0 = np.concatenate([f0, np.zeros(empty, np.float32)]) if self.uses_f0 and f0 is not None else None
            return self(log_mel, f0, chunk_frames)[:frames * hop]
        if self.uses_f0 and f0 is not None:
            run = lambda a, b: self._call_f0(log_mel[None, a:b], f0[None, a:b])  # noqa: E731
        else:
            run = lambda a, b: self._call(log_mel[None, a:b])  # noqa: E731
        return chunked(lambda a, b: run(a, b)[0].numpy(), frames, hop, self.context, chunk_frames)

    @property
    def made(self):
        """What the reports say of it: kind, steps of each phase, the fine-tuned weights' share."""
        return {"kind": self.kind, "steps": self.steps, "finetune_steps": self.finetune_steps,
                "finetune_share": self.finetune_share}

    def voiced_f0(self, log_mel, f0):
        """(F,) another model's F0 gated by this vocoder's voicing head (f0 as it is for kinds without one)."""
        if self.model is None or not self.uses_f0 or f0 is None:
            return f0
        import tensorflow as tf
        mel = tf.constant(np.asarray(log_mel, np.float32)[None])
        return self.model.voiced_f0(mel, tf.constant(np.asarray(f0, np.float32)[None]))[0].numpy()


def _note(line):
    print(line, file=sys.stderr, flush=True)


def read_summary(path):
    """A vocoder summary (runs/{name}/vocoder.json, vocoder/{phase}.json) as a dict; MissingCheckpoint when
    there is none, one line naming the file and what to run when it is damaged."""
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingCheckpoint(f"{located(path)}: no trained vocoder; run `snakemake --cores all vocoder`") from None
    except (OSError, ValueError) as e:  # a folder, not UTF-8, not JSON (JSONDecodeError)
        info = e
    if not isinstance(info, dict) or not isinstance(info.get("checkpoint"), str):
        why = str(info).splitlines()[0][:120] if isinstance(info, Exception) else "no checkpoint named in it"
        raise PipelineError(f"{path}: damaged vocoder summary ({why}); delete it and run `snakemake --cores all "
                            f"vocoder`, which writes it again from the last checkpoint") from None
    for key in ("checkpoint", "trained_checkpoint"):
        if isinstance(info.get(key), str):
            info[key] = in_this_run(info[key], path)
    return info


def in_this_run(checkpoint, summary):
    """A vocoder checkpoint a summary names, in the run folder the summary sits in (runs/{name}/vocoder.json,
    or vocoder/{phase}.json one level down). Summaries record runs/{name}/vocoder/{phase}/{checkpoints,
    shipped}/ckpt-N as the run was named when it trained: a run copied or moved (`cp -a runs/a runs/b`)
    would otherwise load the first run's weights, and the ones it has once that run is retrained."""
    parts, summary = Path(checkpoint).parts, Path(summary)
    if summary.name == "vocoder.json":
        run = summary.parent
    elif summary.parent.name == "vocoder" and summary.stem in inputs.PHASES:
        run = summary.parent.parent
    else:
        return checkpoint  # a summary kept elsewhere: as recorded
    if len(parts) < 4 or parts[-4] != "vocoder" or parts[-3] not in inputs.PHASES \
            or parts[-2] not in ("checkpoints", "shipped"):
        return checkpoint  # not a layout this code writes: as recorded
    return str(run.joinpath(*parts[-4:]))


def trained_settings(cfg, info, path):
    """(audio, vocoder settings, where they were read): what the vocoder of summary `info` (read from
    `path`) was trained with. A summary from before summaries recorded them: its phase's inputs.json
    (pipeline/vocoder/inputs.py), else the run's run.json for `audio:` and the config for `vocoder:`."""
    if isinstance(info.get("audio"), dict) and isinstance(info.get("vocoder"), dict):
        return info["audio"], info["vocoder"], str(path)
    folder = Path(info["checkpoint"]).parent.parent
    made = inputs.read(folder)
    if made is not None:
        return made["audio"], {**cfg["vocoder"], **made["vocoder"]}, str(inputs.path(folder))
    run = config.run_dir(cfg)
    try:
        return runinfo.load(run)["config"]["audio"], cfg["vocoder"], str(runinfo.path(run))
    except MissingCheckpoint:
        return cfg["audio"], cfg["vocoder"], "the config"


def trained_audio(cfg, summary=None):
    """The `audio:` settings the run's vocoder was trained with (trained_settings; the config's for
    Griffin-Lim), read without building it: what its input mel must match."""
    if KINDS.get(cfg["vocoder"]["kind"]).build is None:
        return cfg["audio"]
    path = summary or summary_path(cfg)
    return trained_settings(cfg, read_summary(path), path)[0]


def _differences(cfg, audio, vocoder_cfg):
    """'key given (the vocoder's: used)' for each audio setting, and each setting of the kind's own
    section (vocoder.vocos, ...), where the config differs from what the vocoder was trained with."""
    given, kind = cfg.get("audio", audio), vocoder_cfg["kind"]
    pairs = [(f"audio.{k}", given.get(k), audio.get(k)) for k in sorted(set(audio) | set(given))]
    mine, theirs = vocoder_cfg.get(kind), cfg["vocoder"].get(kind)
    if isinstance(mine, dict) and isinstance(theirs, dict):
        pairs += [(f"vocoder.{kind}.{k}", theirs.get(k), mine.get(k)) for k in sorted(set(mine) | set(theirs))]
    return [f"{key} {a!r} (the vocoder's: {b!r})" for key, a, b in pairs if a != b]


def restore(model, checkpoint, where, kind, built_with=None, trained_with=None):
    """The generator's weights from `checkpoint`, every one of them; one line when they do not fit
    (`unfit`: the keys that differ when `built_with` and `trained_with` are given)."""
    why = unfit(model, checkpoint, kind, built_with, trained_with)
    if why:
        raise PipelineError(f"{checkpoint}: does not fit the {kind} vocoder built with the settings of {where} "
                            f"({why}); set vocoder.{kind} to the sizes it was trained with, or run "
                            f"`snakemake --cores all vocoder` to train one with these")


def unfit(model, checkpoint, kind, built_with=None, trained_with=None):
    """None when `checkpoint`'s generator weights, all of them, are now `model`'s; else why not, in a few
    words: a weight of other shape, one the file lacks, or one the model lacks (a checkpoint of more
    layers: restoring matches only the model's own weights and would drop the rest silently).
    `built_with`, `trained_with`: the `vocoder:` settings of the model and of the checkpoint, when
    known: then the words are the keys that differ."""
    import tensorflow as tf
    try:
        status = tf.train.Checkpoint(generator=model).restore(checkpoint)
        status.expect_partial()  # the discriminators and optimizers stay in the file
        status.assert_existing_objects_matched()
        held, built = saved_variables(checkpoint, "generator"), len(model.variables)
        if held != built:
            raise AssertionError(f"it holds {held} generator weights, this {kind} vocoder has {built}")
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        return _kind_changes(trained_with, built_with, kind) or str(e).splitlines()[0][:240]
    return None


def saved_variables(checkpoint, name):
    """How many variables `checkpoint` holds under its object `name` (its object graph: a model's weights
    are saved under whichever path reached them first, the optimizer's, but belong to the model too)."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(tf.train.load_checkpoint(checkpoint).get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    todo = [c.node_id for c in graph.nodes[0].children if c.local_name == name]
    seen = set()
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo += [c.node_id for c in graph.nodes[node].children]
    return sum(any(a.name == "VARIABLE_VALUE" for a in graph.nodes[n].attributes) for n in seen)


def _kind_changes(trained, now, kind):
    """'vocoder.{kind}.key A (the checkpoint's: B)' for each setting of the kind's own section where
    `now` (settings) differs from `trained`; "" when either is unknown (not dicts) or none differs."""
    mine, theirs = (x.get(kind) if isinstance(x, dict) else None for x in (trained, now))
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return ""
    return ", ".join(f"vocoder.{kind}.{k} {theirs.get(k)!r} (the checkpoint's: {mine.get(k)!r})"
                     for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k))


def check_trained(cfg, summary=None):
    """(summary path, summary) of the run's trained vocoder, checked without TensorFlow: MissingCheckpoint
    naming the file and what to run when it is missing, damaged, of another kind or its checkpoint gone."""
    path = summary or summary_path(cfg)
    info = read_summary(path)
    if info.get("kind") != cfg["vocoder"]["kind"]:
        raise MissingCheckpoint(f"{path}: a {info.get('kind')} vocoder, the config says vocoder.kind "
                                f"{cfg['vocoder']['kind']}; run `snakemake --cores all vocoder`")
    if not os.path.exists(f"{info['checkpoint']}.index"):
        raise MissingCheckpoint(f"{path}: its checkpoint {info['checkpoint']} is gone (pruned or deleted); "
                                f"run `snakemake --cores all vocoder -R train_vocoder` (forced: its summary is still there)")
    return path, info


def load(cfg, summary=None, log=_note, mels_of=None):
    """The run's final vocoder from runs/{name}/vocoder.json (or `summary`), built with the `audio:` and
    `vocoder:` settings it was trained with (trained_settings), whatever the config says: one `log`
    line (stderr) names what the config gives otherwise. Griffin-Lim with vocoder.kind griffin_lim.
    MissingCheckpoint naming the file and what to run when it is not trained yet. `mels_of`: who makes
    the mels it will be given on `cfg`'s audio settings (the acoustic run); then a vocoder trained on
    mels of other settings is a PipelineError, not a note (it would speak at another rate or grid)."""
    if KINDS.get(cfg["vocoder"]["kind"]).build is None:
        return Vocoder(cfg)
    path, info = check_trained(cfg, summary)
    audio, vocoder_cfg, where = trained_settings(cfg, info, path)
    grid = [k for k in sorted(set(audio) | set(cfg["audio"])) if audio.get(k) != cfg["audio"].get(k)]
    if mels_of and grid:
        raise MissingCheckpoint(
            f"{path}: the vocoder was trained on mels of {', '.join(f'audio.{k} {audio.get(k)!r}' for k in grid)}, "
            f"{mels_of} makes them with {', '.join(repr(cfg['audio'].get(k)) for k in grid)}; run "
            f"`snakemake --cores all vocoder` to train it on these mels")
    kind = vocoder_cfg["kind"]
    missing = sorted(set(cfg["vocoder"].get(kind) or {}) - set(vocoder_cfg.get(kind) or {}))
    if missing:  # a setting this version's network is built with did not exist when it was trained
        raise MissingCheckpoint(f"{path}: a {kind} vocoder trained before vocoder.{kind}.{missing[0]} existed "
                                f"(another network); run `snakemake --cores all vocoder` to train it again")
    moved = _differences(cfg, audio, vocoder_cfg)
    if moved:
        log(f"note: the config gives {', '.join(moved)}; using the vocoder's own settings ({where}), "
            f"which it was trained with")
    from pipeline import placement
    placement.set_precision_policy("off")  # inference in float32, whatever a trainer in this process set
    model = build(vocoder_cfg, audio)
    restore(model, info["checkpoint"], where, vocoder_cfg["kind"])
    return Vocoder(dict(cfg, audio=dict(audio), vocoder=vocoder_cfg), model, info)
