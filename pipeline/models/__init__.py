"""The acoustic models behind one interface, picked by `model.kind`.

    from pipeline import models
    model = models.build(cfg["model"], vocab, n_mels)   # a keras.Model

Kinds: `fastpitch` (fastpitch.py: non-autoregressive, trained from durations, pitch and energy),
`transformer_tts` (transformer_tts.py: autoregressive, attention), or "package.module:function", a
user's own `function(model_cfg, vocab, n_mels) -> keras.Model` (vocab: the symbol list) importable from the working directory
(its keys go under `model.options`). Every model has:

    model.needs                              batch fields it trains on, e.g. ("tokens", ..., "durations")
    model(batch, training=...) -> dict       float32 outputs; batch mel/pitch/energy already normalised
    model.tts_loss(outputs, batch) -> (total float32 scalar, {term: float32 scalar, "total": ...})
    model.infer(tokens, token_lengths, *, pace, pitch_shift, max_frames)
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
from pathlib import Path

from pipeline.config import ConfigError

KINDS = ("fastpitch", "transformer_tts")
BATCH_FIELDS = ("tokens", "token_lengths", "mel", "mel_lengths", "pitch", "energy", "durations")
INTERFACE = ("needs", "tts_loss", "infer")


class ModelError(ConfigError):
    """A model kind that cannot be loaded or does not keep the interface."""


def symbols(vocab):
    """The symbol list of a cache vocabulary (the index's `vocab` dict, or already a list)."""
    return list(vocab["symbols"]) if isinstance(vocab, dict) else list(vocab)


def frame_multiple(model_cfg):
    """Padded frame counts must be a multiple of this, from the config alone (Snakemake and the loader
    need it before any model exists): transformer_tts's `reduction`, a user's kind's
    `model.options.frame_multiple` (default 1). The trainer checks a model's own `frame_multiple` against it."""
    if model_cfg["kind"] == "transformer_tts":
        return int(model_cfg["transformer_tts"]["reduction"])
    if model_cfg["kind"] not in KINDS:
        value = model_cfg.get("options", {}).get("frame_multiple", 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelError(f"model.options.frame_multiple: {value!r} is not a positive integer")
        return value
    return 1


def needs_durations(model_cfg):
    """Whether `train` must first make the aligner's durations (from the config alone, for Snakemake):
    fastpitch does, transformer_tts does not, a user's own kind gets them in case its `needs` lists them."""
    return model_cfg["kind"] != "transformer_tts"


def _user_builder(kind):
    module_name, sep, attr = kind.partition(":")
    if not sep or not module_name or not attr:
        raise ModelError(f"model.kind: {kind!r} is neither {' nor '.join(KINDS)} nor 'package.module:function'")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.append(cwd)  # a user's package beside the Snakefile
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ModelError(f"model.kind: cannot import {module_name!r} ({e}); put it on PYTHONPATH") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ModelError(f"model.kind: {module_name!r} has no function {attr!r}")
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        raise ModelError(f"model.kind: {kind!r} does not take (model_cfg, vocab, n_mels) "
                         f"(its signature is {attr}{_signature(fn)}); see docs/models.md") from None
    except ValueError:  # a builtin without a signature: the call itself will tell
        pass
    return fn


def _signature(fn):
    try:
        return str(inspect.signature(fn))
    except ValueError:
        return "(...)"


def check_kind(model_cfg):
    """ModelError unless model.kind is a built-in kind or an importable `function(model_cfg, vocab,
    n_mels)`: checked when the config is read, before any job starts. Imports a user's module."""
    if model_cfg["kind"] not in KINDS:
        _user_builder(model_cfg["kind"])


def dummy_batch(n_tokens, n_frames, n_mels):
    """A one-clip batch with every loader field, to create a model's variables before a restore."""
    import numpy as np
    import tensorflow as tf
    durations = np.diff(np.linspace(0, n_frames, n_tokens + 1).round().astype(np.int32))  # sums to n_frames
    return {"tokens": tf.ones([1, n_tokens], tf.int32), "token_lengths": tf.constant([n_tokens], tf.int32),
            "mel": tf.zeros([1, n_frames, n_mels]), "mel_lengths": tf.constant([n_frames], tf.int32),
            "pitch": tf.zeros([1, n_frames]), "energy": tf.zeros([1, n_frames]),
            "durations": tf.constant(durations[None])}


def build(model_cfg, vocab, n_mels):
    """The keras.Model for a validated `model:` section, a vocabulary (the run's dict, or its symbol
    list; the builder always gets the list) and the mel channels."""
    kind = model_cfg["kind"]
    if kind in ("fastpitch", "transformer_tts") and model_cfg.get("options"):
        raise ModelError(f"model.options: {sorted(model_cfg['options'])} are for a user's own model kind; "
                         f"{kind!r} is configured under model.{kind}")
    if kind == "fastpitch":
        from pipeline.models import fastpitch
        fn = fastpitch.build
    elif kind == "transformer_tts":
        from pipeline.models import transformer_tts
        fn = transformer_tts.build
    else:
        fn = _user_builder(kind)
    model = fn(model_cfg, symbols(vocab), n_mels)
    missing = [name for name in INTERFACE if not hasattr(model, name)]
    if missing:
        raise ModelError(f"model.kind: {kind!r} built a {type(model).__name__} without {missing}; "
                         "see docs/models.md for the interface")
    unknown = sorted(set(model.needs) - set(BATCH_FIELDS))
    if unknown:
        raise ModelError(f"model.kind: {kind!r} needs batch fields {unknown}; the loader has {list(BATCH_FIELDS)}")
    return model
