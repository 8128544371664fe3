"""The acoustic models behind one interface, picked by `model.kind`.

    from pipeline import models
    model = models.build(cfg["model"], vocab, n_mels, speakers=index["speakers"], languages=index["languages"])

Kinds: `fastpitch` (fastpitch.py: non-autoregressive, trained from durations, pitch and energy),
`transformer_tts` (transformer_tts.py: autoregressive, attention), or "package.module:function", a
user's own `function(model_cfg, vocab, n_mels) -> keras.Model` (vocab: the symbol list) importable from the working directory
(its keys go under `model.options`); a function that also takes keyword arguments `speakers` and
`languages` gets the run's sorted name tables (the batch's `speaker` / `language` ids index them).
Every model has:

    model.needs                              batch fields it trains on, e.g. ("tokens", ..., "durations")
    model(batch, training=...) -> dict       float32 outputs; batch mel/pitch/energy already normalised
    model.tts_loss(outputs, batch) -> (total float32 scalar, {term: float32 scalar, "total": ...})
    model.infer(tokens, token_lengths, *, pace, pitch_shift, max_frames[, speaker, language])
                                -> {"mel": (B, F, n_mels) normalised, "lengths": (B,) int32, ...}

and optionally `model.adapt(stats)` (called once by the trainer with the run's feature statistics,
e.g. so pitch_shift in semitones can be applied in the normalised pitch domain) and
`model.frame_multiple`, which must equal `frame_multiple(model_cfg)` (the loader pads frame counts to
that multiple, known from the config alone; a user's kind sets it as `model.options.frame_multiple`).
`vocab` is the run's symbol list (id = position, 0 = pad). docs/models.md has the full contract;
docs/examples/my_tts.py is a user's kind that the tests train.
"""
import importlib
import inspect
import sys
import traceback
from pathlib import Path

from pipeline.config import ConfigError
from pipeline.registry import Registry

BATCH_FIELDS = ("tokens", "token_lengths", "mel", "mel_lengths", "pitch", "energy", "durations", "speaker", "language")
VOICE_FIELDS = ("speaker", "language")  # in a batch only with several speakers / languages
INTERFACE = ("needs", "tts_loss", "infer")


class ModelError(ConfigError):
    """A model kind that cannot be loaded or does not keep the interface."""


# module: where its `build(model_cfg, vocab, n_mels, ...)` lives (imported when a model is built: TensorFlow);
# needs_durations: `train` first makes the aligner's durations; frame_multiple(model_cfg): the loader pads
# frame counts to it; exportable: pipeline.export builds its voice (inference as one graph with pace and
# pitch_shift as tensors). A user's own "package.module:function" is no entry: it needs durations in case
# its `needs` lists them, sets `model.options.frame_multiple`, and is not exported.
KINDS = Registry("model.kind", ModelError, what="kind", module=None, needs_durations=True,
                 frame_multiple=lambda model_cfg: 1, exportable=False)
KINDS.add("fastpitch", module="pipeline.models.fastpitch", exportable=True)
KINDS.add("transformer_tts", module="pipeline.models.transformer_tts", needs_durations=False,
          frame_multiple=lambda model_cfg: int(model_cfg["transformer_tts"]["reduction"]))


def symbols(vocab):
    """The symbol list of a cache vocabulary (the index's `vocab` dict, or already a list)."""
    return list(vocab["symbols"]) if isinstance(vocab, dict) else list(vocab)


def frame_multiple(model_cfg):
    """Padded frame counts must be a multiple of this, from the config alone (Snakemake and the loader
    need it before any model exists): transformer_tts's `reduction`, a user's kind's
    `model.options.frame_multiple` (default 1). The trainer checks a model's own `frame_multiple` against it."""
    if model_cfg["kind"] in KINDS:
        return KINDS.get(model_cfg["kind"]).frame_multiple(model_cfg)
    value = model_cfg.get("options", {}).get("frame_multiple", 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelError(f"model.options.frame_multiple: {value!r} is not a positive integer")
    return value


def needs_durations(model_cfg):
    """Whether `train` must first make the aligner's durations (from the config alone, for Snakemake):
    fastpitch does, transformer_tts does not, a user's own kind gets them in case its `needs` lists them."""
    return KINDS.get(model_cfg["kind"]).needs_durations if model_cfg["kind"] in KINDS else True


def export_problem(model_cfg):
    """Why `snakemake export` cannot export this kind (from the config alone, for Snakemake: the default
    target then leaves export out), or None."""
    kind = model_cfg["kind"]
    if kind in KINDS and KINDS.get(kind).exportable:
        return None
    able = ", ".join(k for k in KINDS if KINDS.get(k).exportable)
    return (f"model.kind: {kind!r} cannot be exported yet ({able} can: its inference is one graph with pace and "
            "pitch_shift as tensors); synthesize and evaluate use the run's checkpoint instead")


def _user_builder(kind):
    module_name, sep, attr = kind.partition(":")
    if not sep or not module_name or not attr:
        raise ModelError(f"model.kind: {kind!r} is neither {' nor '.join(KINDS)} nor 'package.module:function'")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)  # a user's package beside the Snakefile
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name + ".").startswith(e.name + "."):  # the module itself (or its package)
            raise ModelError(f"model.kind: cannot import {module_name!r} ({e}); put it on PYTHONPATH") from None
        raise ModelError(f"model.kind: importing {module_name!r} failed: {_raised_at(e)}") from None
    except Exception as e:  # the user's module is broken: its file and line, not Snakemake's traceback
        raise ModelError(f"model.kind: importing {module_name!r} failed: {_raised_at(e)}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ModelError(f"model.kind: {module_name!r} has no function {attr!r}")
    try:
        inspect.signature(fn).bind(None, None, None, **{k: () for k in ("speakers", "languages") if _takes(fn, k)})
    except TypeError:
        raise ModelError(f"model.kind: {kind!r} does not take (model_cfg, vocab, n_mels) "
                         f"(its signature is {attr}{_signature(fn)}); see docs/models.md") from None
    except ValueError:  # a builtin without a signature: the call itself will tell
        pass
    return fn


def _raised_at(error):
    """"file:line: Type: message" of an exception raised while importing a user's module (a syntax
    error's own file and line, else the innermost frame outside importlib), on one line."""
    if isinstance(error, SyntaxError):
        where, what = f"{error.filename}:{error.lineno}", error.msg
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith("<frozen")]
        where, what = (f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"), str(error)
    return f"{where}: {type(error).__name__}: {' '.join(what.split())}"


def _signature(fn):
    try:
        return str(inspect.signature(fn))
    except ValueError:
        return "(...)"


def check_kind(model_cfg):
    """ModelError unless model.kind is a built-in kind without `model.options` (a user's kind's keys)
    or an importable `function(model_cfg, vocab, n_mels)`: checked when the config is read, before any
    job starts. Imports a user's module."""
    kind = model_cfg["kind"]
    if kind not in KINDS:
        _user_builder(kind)
    elif model_cfg.get("options"):
        raise ModelError(f"model.options: {sorted(model_cfg['options'])} are for a user's own model kind; "
                         f"{kind!r} is configured under model.{kind}")


def dummy_batch(n_tokens, n_frames, n_mels, voices=()):
    """A one-clip batch with every loader field (and the `voices` fields), to create a model's
    variables before a restore."""
    import numpy as np
    import tensorflow as tf
    durations = np.diff(np.linspace(0, n_frames, n_tokens + 1).round().astype(np.int32))  # sums to n_frames
    return {"tokens": tf.ones([1, n_tokens], tf.int32), "token_lengths": tf.constant([n_tokens], tf.int32),
            "mel": tf.zeros([1, n_frames, n_mels]), "mel_lengths": tf.constant([n_frames], tf.int32),
            "pitch": tf.zeros([1, n_frames]), "energy": tf.zeros([1, n_frames]),
            "durations": tf.constant(durations[None]), **{f: tf.zeros([1], tf.int32) for f in voices}}


def _takes(fn, name):
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def build(model_cfg, vocab, n_mels, *, speakers=(), languages=()):
    """The keras.Model for a validated `model:` section, a vocabulary (the run's dict, or its symbol
    list; the builder always gets the list) and the mel channels;
    `speakers` / `languages`: the run's sorted tables, for the kinds (and user functions) that take them."""
    kind = model_cfg["kind"]
    if kind in KINDS:
        check_kind(model_cfg)  # model.options
    fn = importlib.import_module(KINDS.get(kind).module).build if kind in KINDS else _user_builder(kind)
    voices = {k: list(v) for k, v in (("speakers", speakers), ("languages", languages)) if _takes(fn, k)}
    model = fn(model_cfg, symbols(vocab), n_mels, **voices)
    missing = [name for name in INTERFACE if not hasattr(model, name)]
    if missing:
        raise ModelError(f"model.kind: {kind!r} built a {type(model).__name__} without {missing}; "
                         "see docs/models.md for the interface")
    unknown = sorted(set(model.needs) - set(BATCH_FIELDS))
    if unknown:
        raise ModelError(f"model.kind: {kind!r} needs batch fields {unknown}; the loader has {list(BATCH_FIELDS)}")
    return model
