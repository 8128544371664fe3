"""Configuration: the shipped defaults, a user's overrides, one JSON schema.

Reads configs/config.yaml (defaults) and configs/schema.yaml. `load_config(path)` merges a user's
YAML/JSON file (or an inline JSON object, which is how Snakemake rules pass the sections a job
needs) over the defaults and validates the result, so the Python side, the Snakefile and the tests
report the same one-line errors naming the key (a long value they repeat cut short, with its length).

    python -m pipeline.config --config my.yaml      # prints the merged, validated config
"""
import argparse
import copy
import functools
import hashlib
import json
import math
import os
import re
import sys
from pathlib import Path

import yaml

from pipeline.errors import PipelineError, cli, unique_pairs
from pipeline.files import atomic_write, atomic_write_text  # noqa: F401  (audio.py and align.py write through here: their bytes are cache and aligner digests)

ROOT = Path(__file__).resolve().parent.parent
# configs/ beside the package in a checkout (or an editable install); inside it, as pipeline/configs/,
# in a wheel (`pip install .`: pyproject.toml ships configs/*.yaml as that package data)
CONFIGS = next((d for d in (ROOT / "configs", Path(__file__).resolve().parent / "configs")
                if (d / "schema.yaml").is_file()), ROOT / "configs")
DEFAULTS = CONFIGS / "config.yaml"
SCHEMA = CONFIGS / "schema.yaml"


class ConfigError(PipelineError):
    """A config problem, with the key (or file) it concerns in the message."""


# What a config error repeats of a value or key, at most: a 1 MB string or a 50,000-item list given for
# a key made a message as long. A path may take PATH_MAX (the longest one the system opens): cut
# shorter, the part that tells two folders apart would go.
SHOWN_CHARS = 80
PATH_MAX = 4096


def abbreviated(text, size=None, limit=SHOWN_CHARS):
    """`text` as an error repeats it: whole up to `limit` characters, else its start, "..." and its full
    size (`size`, else its length in characters)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({size or f'{len(text):,} characters'})"


def shown(value, limit=SHOWN_CHARS):
    """repr(value), abbreviated: what every config error that repeats a value says of it."""
    size = (f"{len(value):,} characters" if isinstance(value, str) else
            f"{len(value):,} items" if isinstance(value, (list, dict)) else None)
    return abbreviated(repr(value), size, limit)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: every job reads the defaults and schema


class UniqueKeyLoader(_LOADER):
    """YAML that refuses a key given twice in one mapping, where PyYAML keeps the last one silently
    (a second `train:` section would drop the first)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {shown(key)} given twice (first on line {seen[key] + 1}); "
                        "YAML would keep only the last", key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


class AmbiguousNumber(yaml.constructor.ConstructorError):
    """A plain scalar YAML 1.1 reads as a number its writer may not have meant."""


# YAML 1.1 (PyYAML, Snakemake's loader) reads these plain scalars as numbers: `10:00` as 600 (base 60),
# `010` as 8 (octal), `0x10` as 16 and `0b10` as 2; YAML 1.2 and JSON read none of them so
NOT_DECIMAL = re.compile(r"[-+]?(?:[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?|0[0-9_]+|0[xXbB][0-9a-fA-F_]*)")
BASES = (("0x", "hexadecimal"), ("0b", "binary"), ("0", "octal"))


def _decimal_only(constructor):
    """A YAML int or float constructor that refuses base-60, octal, hexadecimal and binary spellings
    (AmbiguousNumber, at the value's line): a duration written `10:00` or a seed written `010` would
    reach the jobs as 600 or 8 without a word."""
    def construct(loader, node):
        value = constructor(loader, node)
        text = str(node.value)
        if NOT_DECIMAL.fullmatch(text) and not _same_in_decimal(text, value):
            digits = text.lstrip("+-").lower()
            base = "base 60" if ":" in text else next(name for prefix, name in BASES if digits.startswith(prefix))
            if len(text) > 40:   # shown in part; its value would be hundreds of digits
                raise AmbiguousNumber(None, None, f"{text[:20]}... ({len(text)} characters) is read in {base} "
                                      "(YAML 1.1): write the decimal number you mean", node.start_mark)
            raise AmbiguousNumber(None, None, f"{text} is read as {value!r} ({base}, YAML 1.1): write the decimal "
                                  f"number you mean, or quote it (\"{text}\") for text", node.start_mark)
        return value
    return construct


def _same_in_decimal(text, value):
    """Whether `text` read in decimal is `value` too (`00`, `07`: octal and decimal agree)."""
    digits = text.replace("_", "")
    return digits.lstrip("+-").isdigit() and int(digits, 10) == value


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _decimal_only(_LOADER.construct_yaml_int))
UniqueKeyLoader.add_constructor("tag:yaml.org,2002:float", _decimal_only(_LOADER.construct_yaml_float))


def _read_yaml(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=UniqueKeyLoader)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a folder, not a config file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start + 1})") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(yaml_problem(path, e)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data


def yaml_problem(path, e):
    """One line for a YAML syntax error: file, line and column (yaml's problem_mark), the problem."""
    mark = getattr(e, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if isinstance(e, AmbiguousNumber):
        return f"{where}: {problem}"
    context = getattr(e, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def load_schema():
    return _read_yaml(SCHEMA)


def merge(base, override):
    """Deep-merge override into a copy of base (mappings merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _coerce_strings(cfg, defaults, where="", schema=None):
    # Snakemake's `--config 'audio={n_mels: 64}'` delivers nested values as strings: read those
    # as YAML where the default is a number or a boolean. Where the default is a string and the schema
    # also takes a boolean (`jit_compile: auto`, true or false), only true and false become booleans:
    # `name: "on"`, `name: "true"` and `language: "no"` (Norwegian) stay the strings they are, not YAML
    # 1.1's booleans. A whole number takes the schema's spelling (_spelled).
    schema = _schema() if schema is None else schema
    for key, value in cfg.items():
        default = defaults.get(key) if isinstance(defaults, dict) else None
        node = _property(schema, key)
        if isinstance(value, dict):  # {} under a key the schema leaves free (model.options): nothing re-spelled
            _coerce_strings(value, default, f"{where}{key}.", node if isinstance(node, dict) else {})
        elif isinstance(value, str) and isinstance(default, str):
            if value.strip().lower() in ("true", "false") and _takes_bool(node):
                cfg[key] = value.strip().lower() == "true"
        elif isinstance(value, str) and isinstance(default, (bool, int, float)):
            try:
                parsed = yaml.load(value, Loader=UniqueKeyLoader)
            except AmbiguousNumber:   # text (quoted, or Snakemake's --config) where a number goes
                raise ConfigError(f"{abbreviated(where + str(key))}: {shown(value)} is not a decimal number (YAML 1.1 reads it in "
                                  "another base); write the number you mean in decimal") from None
            except yaml.YAMLError:
                continue
            if isinstance(parsed, str) and not isinstance(default, bool):
                parsed = _plain_float(parsed)  # YAML 1.1 reads 1e-4 (no dot) as a string; 7.6e3 Hz where 8000 is
            if isinstance(parsed, (bool, int, float)):
                cfg[key] = _spelled(parsed, node)
        else:
            cfg[key] = _spelled(value, node)


@functools.lru_cache(maxsize=1)
def _schema():
    return load_schema()


def _takes_bool(node):
    """Whether the schema node takes a boolean (its type, or a boolean in its enum)."""
    if not isinstance(node, dict):
        return False
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    return "boolean" in types or any(isinstance(e, bool) for e in node.get("enum", ()))


def _property(schema, key):
    """The schema node of `key` under `schema` (through a $ref to $defs), or None."""
    node = (schema or {}).get("properties", {}).get(key)
    while isinstance(node, dict) and "$ref" in node:
        node = {**_schema()["$defs"][node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _spelled(value, node):
    """A whole number in one spelling for its key, whichever way the user wrote it: an int where the schema
    wants an integer, a float where it wants a number (600 where pitch.fmax is 600.0), an int where it
    marks `spelling: int` (audio.fmin and fmax, which runs have always been keyed with as ints). So one value
    reaches the jobs' params in one spelling and an edit to the same value reruns nothing, whether it is
    made in a user's config or in configs/config.yaml itself. Other values as they are."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(node, dict):
        return value
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    whole = isinstance(value, int) or value.is_integer()
    if not whole or not fits_int64(value) or "number" not in types and "integer" not in types:
        return value
    if "integer" in types or node.get("spelling") == "int":
        return int(value)
    return float(value)


# the config's folder and file paths: one spelling each ("data/demo/", "./data/demo" are "data/demo")
PATH_KEYS = (("runs_dir",), ("reports_dir",), ("cache", "dir"), ("dataset", "root"), ("dataset", "metadata"),
             ("dataset", "audio_dir"))


def plain_path(text):
    """`text` without empty or "." segments and trailing slashes (".." kept: through a symbolic link
    it can mean another folder than the one its spelling suggests)."""
    parts = [part for part in text.split("/") if part not in ("", ".")]
    return ("/" if text.startswith("/") else "") + "/".join(parts) or "."


def _plain_paths(cfg):
    for *parents, leaf in PATH_KEYS:
        node = cfg
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and isinstance(node.get(leaf), str) and node[leaf]:
            node[leaf] = plain_path(node[leaf])
    sources = cfg.get("dataset", {}).get("sources") if isinstance(cfg.get("dataset"), dict) else None
    for source in sources if isinstance(sources, list) else ():
        if isinstance(source, dict) and isinstance(source.get("root"), str) and source["root"]:
            source["root"] = plain_path(source["root"])


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _plain_float(text):
    """1e-4, 3E+2: exponent notation YAML 1.1 reads as a string (it wants 1.0e-4), as a float; else `text`."""
    return float(text) if _FLOAT.fullmatch(text.strip()) else text


MAX_VALUES = 100_000  # keys, list items and values in a whole config, YAML aliases expanded


def check_structure(cfg):
    """ConfigError unless `cfg` is a tree of at most MAX_VALUES values: YAML aliases (&a ... *a) make
    one mapping or list appear in several places, and nine nested lists of ten aliases are 10^9
    values in 600 bytes (every walk over the config, json.dumps of a job's section included, would
    run for hours), or a mapping that contains itself (every walk recurses forever). Each distinct
    mapping or list is counted once, so this costs one pass over what the file holds."""
    sizes, open_ = {}, {}

    def size(node, where):
        if not isinstance(node, (dict, list)):
            return 1
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise ConfigError(f"{where}: refers back to {open_[id(node)] or 'the top level'}, which holds it "
                              "(a YAML alias inside its own anchor)")
        open_[id(node)] = where
        total = 1
        for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
            total += size(value, (f"{where}.{key}" if where else str(key)) if isinstance(node, dict) else f"{where}[{key}]")
            if total > MAX_VALUES:
                raise ConfigError(f"{where or '(top level)'}: more than {MAX_VALUES:,} values once its YAML aliases "
                                  "(*name) are expanded; write the config out without them")
        del open_[id(node)]
        sizes[id(node)] = total
        return total

    try:
        size(cfg, "")
    except RecursionError:
        raise ConfigError("config: nested too deeply") from None


def normalise(cfg):
    """Types as the schema wants them, whichever way the values arrived (in place; returns cfg)."""
    check_structure(cfg)
    _coerce_strings(cfg, _read_yaml(DEFAULTS))
    _plain_paths(cfg)
    # YAML 1.1 reads a bare `off` as False; the schema accepts both spellings, code sees one.
    train = cfg.get("train")
    if isinstance(train, dict) and train.get("mixed_precision") is False:  # not a mapping: the schema names it
        train["mixed_precision"] = "off"
    return cfg


INT64_MAX = 2 ** 63 - 1  # the largest integer numpy and TensorFlow hold (int64): steps, seeds, sizes


def fits_int64(value):
    """Whether a whole number (an int, or a float that is one) is within numpy's and TensorFlow's int64."""
    return -INT64_MAX - 1 <= value <= INT64_MAX


JSON_TYPES = (str, int, float, bool, type(None))  # what a job's inline config (JSON) holds, beside lists and mappings


def check_finite(node, where=""):
    """ConfigError naming the first number that is NaN, infinite (YAML's .nan and .inf, JSON's NaN)
    or an integer beyond int64: the schema's ranges cannot catch those (every comparison with NaN is
    false, and most integer keys have no maximum), and one would reach a job as NaN mels, a NaN pace,
    an OverflowError or a MemoryError. Also a value JSON cannot hold, where the schema leaves a section
    free (model.options): YAML reads 2024-01-01 as a date, !!set and !!binary as a set and bytes, and
    planning stopped with a TypeError traceback when it wrote the jobs' configs."""
    if isinstance(node, dict):
        for key, value in node.items():
            check_finite(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            check_finite(value, f"{where}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        raise ConfigError(f"{abbreviated(where)}: {node} is not a finite number")
    elif isinstance(node, int) and not isinstance(node, bool) and not fits_int64(node):
        raise ConfigError(f"{abbreviated(where)}: an integer of {node.bit_length()} bits is beyond the 64-bit integers "
                          "numpy and TensorFlow hold")
    elif not isinstance(node, JSON_TYPES):
        what = {"date": "a date", "datetime": "a date and time", "set": "a set", "bytes": "binary data"}.get(
            type(node).__name__, f"a {type(node).__name__}")
        raise ConfigError(f"{abbreviated(where)}: {what} ({abbreviated(str(node))}), not a string, number, boolean, list or mapping; "
                          "quote it to give it as text")


def _slaney_mel(hz):
    """librosa's default (Slaney) mel scale: linear below 1 kHz, logarithmic above."""
    import numpy as np
    hz = np.asarray(hz, np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(hz >= 1000.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / log_step, hz * 3.0 / 200.0)


def _slaney_hz(mel):
    import numpy as np
    mel = np.asarray(mel, np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(mel >= 15.0, 1000.0 * np.exp(log_step * (mel - 15.0)), mel * 200.0 / 3.0)


def empty_mel_filters(a):
    """How many of the mel filterbank's triangles (audio.mel_basis: librosa's, Slaney) hold no FFT bin,
    the filters librosa warns about as empty (its rule: a triangle starting at 0 Hz never counts)."""
    import numpy as np  # planning only; a job's inline config skips check_rules
    edges = _slaney_hz(np.linspace(_slaney_mel(a["fmin"]), _slaney_mel(a["fmax"]), a["n_mels"] + 2))
    bins = np.linspace(0.0, a["sample_rate"] / 2.0, a["n_fft"] // 2 + 1)
    inside = np.searchsorted(bins, edges[2:], side="left") - np.searchsorted(bins, edges[:-2], side="right")
    return int(np.sum((inside <= 0) & (edges[:-2] > 0)))


def check_folders(cfg):
    """ConfigError naming a folder key that Snakemake or TensorFlow would read as a pattern, the jobs'
    commands as an option, or a shell as the home folder (never expanded here); runs_dir that is cache.dir."""
    folders = (("cache.dir", cfg["cache"]["dir"]), ("runs_dir", cfg["runs_dir"]), ("reports_dir", cfg["reports_dir"]))
    for key, folder in folders:
        if folder.startswith("~"):  # quoted everywhere, so a folder named "~" in the working folder
            raise ConfigError(f"{key}: {shown(folder, PATH_MAX)} starts with '~', which is not expanded to a home folder here (it "
                              f"would be a folder named '~' in {os.getcwd()}); give the full path "
                              f"({abbreviated(os.path.expanduser(folder), limit=PATH_MAX)})")
        if folder.startswith("-"):  # the jobs' `--out {output}` would take it for an option of their own
            raise ConfigError(f"{key}: {shown(folder, PATH_MAX)} starts with '-', which the jobs' commands would read as an option "
                              f"(error: argument --out: expected one argument); give its absolute path "
                              f"({abbreviated(os.path.abspath(folder), limit=PATH_MAX)}) or another name")
        braces = sorted(set("{}") & set(folder))
        if braces:  # the rules' output paths start with these folders: Snakemake would see a wildcard
            raise ConfigError(f"{key}: {shown(folder, PATH_MAX)} holds {' '.join(braces)}, which Snakemake reads as a wildcard in "
                              "the output paths of the rules; choose a folder name without them")
        own = os.path.join(folder, cfg["name"])
        long = next((part for part in own.split("/") if len(part.encode("utf-8")) > NAME_MAX), None)
        if long is not None:  # planning stopped in an OSError traceback (File name too long)
            raise ConfigError(f"{'name' if long == cfg['name'] else key}: {long[:20]}... is {len(long.encode('utf-8'))} "
                              f"bytes, more than a file or folder name may have ({NAME_MAX}); choose a shorter one")
        blocked = _not_a_folder(own)
        if blocked:  # Snakemake's scan of the outputs stopped on it with a NotADirectoryError traceback
            where = "" if blocked == own else f", so {own} cannot be made in it"
            raise ConfigError(f"{key}: {blocked} exists and is not a folder{where}; move it aside or set "
                              f"another {key}")
    if os.path.realpath(cfg["runs_dir"]) == os.path.realpath(cfg["cache"]["dir"]):  # both write {name}/rejected.tsv
        raise ConfigError(f"runs_dir: {shown(cfg['runs_dir'], PATH_MAX)} is also cache.dir; the two must be different folders (each "
                          "keeps its own {name}/rejected.tsv: the caches' left-out clips, and the run's)")
    glob = sorted(set("*?[]") & set(cfg["runs_dir"]))
    if glob:  # TensorFlow finds checkpoints by glob pattern: in runs/x[1]/ it would find none and start over
        raise ConfigError(f"runs_dir: {shown(cfg['runs_dir'], PATH_MAX)} holds {' '.join(glob)}, which TensorFlow reads as a "
                          "pattern when it looks for checkpoints (a trained run would start again from step 0); "
                          "choose a folder name without them")


NAME_MAX = 255  # bytes in one file or folder name (Linux's file systems)


def _not_a_folder(path):
    """`path`, or the nearest of its parents that exists, when that one is not a folder (a file, a link to
    nothing); else None."""
    for p in (path, *map(str, Path(path).parents)):
        if os.path.isdir(p):
            return None
        if os.path.lexists(p):
            return p
    return None


STFT_LOSS_LONGEST = 2048  # samples: the longest window of pipeline.vocoder.discriminators.RESOLUTIONS
TRANSFORMER_TTS_STEPS = 4096  # the decoder steps pipeline.models.transformer_tts has positions for (max_positions)


def check_rules(cfg):
    """The rules between keys that the schema cannot state; ConfigError naming the key."""
    check_folders(cfg)
    a, p, v = cfg["audio"], cfg["pitch"], cfg["vocoder"]
    nyquist = a["sample_rate"] / 2
    if a["fmax"] > nyquist:
        raise ConfigError(f"audio.fmax: {a['fmax']} is above the Nyquist frequency {nyquist}")
    if a["fmin"] >= a["fmax"]:
        raise ConfigError(f"audio.fmin: {a['fmin']} must be below audio.fmax {a['fmax']}")
    if a["win_length"] > a["n_fft"]:
        raise ConfigError(f"audio.win_length: {a['win_length']} is longer than audio.n_fft {a['n_fft']}")
    if 2 * a["hop_length"] > a["win_length"]:
        raise ConfigError(f"audio.hop_length: {a['hop_length']} is more than half of audio.win_length {a['win_length']}: "
                          f"frames overlapping by less than half leave the overlap-added Hann windows dipping between "
                          f"frames (to 1/8 of their peak at two thirds, to 0 at hop_length = win_length), where the "
                          f"vocoders and Griffin-Lim rebuild the waveform badly (clicks, NaN); "
                          f"2 * hop_length <= win_length <= n_fft")
    if p["fmax"] > nyquist:
        raise ConfigError(f"pitch.fmax: {p['fmax']} is above the Nyquist frequency {nyquist}")
    if p["fmin"] >= p["fmax"]:
        raise ConfigError(f"pitch.fmin: {p['fmin']} must be below pitch.fmax {p['fmax']}")
    if p["fmax"] < 2 * p["fmin"]:
        raise ConfigError(f"pitch.fmax: {p['fmax']} is less than an octave above pitch.fmin {p['fmin']}: one voice's F0 "
                          "spans more than that, and pyin and swiftf0 cannot search so narrow a band (default 65-600 Hz)")
    empty = empty_mel_filters(a)
    if empty:
        raise ConfigError(f"audio.n_mels: {empty} of the {a['n_mels']} mel filters between audio.fmin {a['fmin']} and "
                          f"audio.fmax {a['fmax']} Hz hold no FFT bin (bins are {a['sample_rate'] / a['n_fft']:.1f} Hz "
                          "apart): those mel channels would be constant; use fewer mels, a wider band or a larger n_fft")
    if v["kind"] != "griffin_lim" and v["segment_frames"] * a["hop_length"] < STFT_LOSS_LONGEST:
        raise ConfigError(f"vocoder.segment_frames: {v['segment_frames']} frames of audio.hop_length {a['hop_length']} "
                          f"are {v['segment_frames'] * a['hop_length']} samples, shorter than the vocoder's spectral "
                          f"loss's longest window ({STFT_LOSS_LONGEST}): its loss would be NaN; use at least "
                          f"{-(-STFT_LOSS_LONGEST // a['hop_length'])}")
    from pipeline import audio  # planning only, as numpy above (soundfile and soxr come with it)
    pad = audio.frame_padding(n_fft=a["n_fft"], hop_length=a["hop_length"])[1]  # the right side's, the larger
    if v["kind"] != "griffin_lim" and v["segment_frames"] * a["hop_length"] <= pad:
        raise ConfigError(f"vocoder.segment_frames: {v['segment_frames']} frames of audio.hop_length {a['hop_length']} "
                          f"are {v['segment_frames'] * a['hop_length']} samples, no more than the {pad} samples that "
                          f"the mel of a crop pads each side by at audio.n_fft {a['n_fft']}: training would stop in "
                          f"its mel loss; use at least {pad // a['hop_length'] + 1}")
    if cfg["diagnose"]["target"] == "vocoder" and cfg["vocoder"]["kind"] == "griffin_lim":
        raise ConfigError("diagnose.target: vocoder, but vocoder.kind griffin_lim has no trained model to diagnose "
                          "(set diagnose.target: acoustic, or a trained vocoder.kind)")
    if cfg["model"]["kind"] == "transformer_tts" and cfg["synthesize"]["pitch_shift"]:
        raise ConfigError(f"synthesize.pitch_shift: {cfg['synthesize']['pitch_shift']}, but model.kind transformer_tts "
                          "has no pitch control; set synthesize.pitch_shift: 0.0 or use model.kind: fastpitch")
    if cfg["model"]["kind"] == "transformer_tts":  # it decodes at most TRANSFORMER_TTS_STEPS steps of r frames
        r, seconds = cfg["model"]["transformer_tts"]["reduction"], cfg["synthesize"]["max_seconds"]
        if math.ceil(seconds * a["sample_rate"] / a["hop_length"] / r) > TRANSFORMER_TTS_STEPS:
            longest = TRANSFORMER_TTS_STEPS * r * a["hop_length"] / a["sample_rate"]
            raise ConfigError(f"synthesize.max_seconds: {seconds} s is more than model.kind transformer_tts decodes "
                              f"({TRANSFORMER_TTS_STEPS} steps of model.transformer_tts.reduction {r} frames: "
                              f"{math.floor(longest * 10) / 10:g} s); set at most that")
    for kind in ("fastpitch", "transformer_tts"):
        m = cfg["model"][kind]
        if m["d_model"] % m["heads"]:
            raise ConfigError(f"model.{kind}.heads: {m['heads']} does not divide model.{kind}.d_model "
                              f"{m['d_model']} (each head takes d_model / heads channels)")


@functools.lru_cache(maxsize=1)
def _strict_validator():
    """The schema's validator class, for which 8.0 is no integer: JSON Schema counts it as one, but
    range(8.0) and np.zeros(8.0) in a job do not."""
    import jsonschema  # ~0.1-0.2 CPU s: only where a config is validated, not in every shard job
    base = jsonschema.Draft202012Validator
    integer = base.TYPE_CHECKER.redefine("integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool))
    return jsonschema.validators.extend(base, type_checker=integer)


def whole_floats_to_int(cfg, errors):
    """Each whole-number float where the schema wants an integer (`shards: 8.0`, as YAML or a
    `--config` reads 8.0) made that int in `cfg`, in place, so every job gets the int; `errors`: the
    strict validator's. Whether any was. 8.5 stays, for the schema's message."""
    changed = False
    for e in errors:
        types = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
        if (e.validator == "type" and "integer" in types and isinstance(e.instance, float) and e.instance.is_integer()
                and fits_int64(e.instance)):  # 1e300 stays a float, for the schema's message
            *parents, leaf = e.absolute_path
            node = cfg
            for key in parents:
                node = node[key]
            node[leaf] = int(e.instance)
            changed = True
    return changed


def validate(cfg, source="config", rules=True):
    """Raise ConfigError naming the first offending key, e.g. `cache.shards: 0 is less than ...`:
    non-finite numbers first, then the schema (where it wants an integer, a whole-number float such as
    8.0 becomes that int in `cfg`: what planning hands its jobs), then the rules between keys (`check_rules`; not for
    a job's inline config, whose sections a rule may have trimmed to a few keys, merged over
    defaults that need not match them: planning checked the whole config)."""
    try:
        check_finite(cfg)  # after normalise, whose check_structure bounds this walk
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    validator = _strict_validator()(load_schema())
    errors = list(validator.iter_errors(cfg))
    if whole_floats_to_int(cfg, errors):
        errors = list(validator.iter_errors(cfg))
    errors = sorted(errors, key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        if rules:
            check_rules(cfg)
        return cfg
    e = errors[0]
    key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
    message = e.message.replace(repr(e.instance), shown(e.instance), 1)  # jsonschema repeats the value whole
    if e.validator == "additionalProperties":
        extra = sorted(set(e.instance) - set(e.schema.get("properties", {})))
        key = ".".join([*map(str, e.absolute_path), extra[0]]) if extra else key
        message = f"unknown key (valid keys here: {', '.join(sorted(e.schema.get('properties', {})))})"
    raise ConfigError(f"{source}: {abbreviated(key)}: {message}")


# Planning (rules/common.smk) validates the whole config once and then sets this variable, which the
# jobs it starts inherit, to `schema_digest()`. A job whose inline config comes from those rules (a
# subset of that validated config, merged over the same defaults) then skips the schema: jsonschema
# is ~0.1-0.2 CPU s of every shard job's ~0.4. Run by hand, or after an edit of the schema or the
# defaults, a job validates as before.
VALIDATED_ENV = "PIPELINE_CONFIG_VALIDATED"

# How often a trainer logs, checkpoints and writes summaries: a change takes effect at the next run of
# that trainer and reruns nothing. Rules leave these keys out of every job's params (what Snakemake
# compares); planning puts the config's values in LOGGING_ENV (logging_env), which the jobs inherit as
# they inherit VALIDATED_ENV, and load_config adds them to an inline config holding their section.
LOGGING_KEYS = {"train": ("log_every", "checkpoint_every", "summary_every"),
                "vocoder": ("log_every", "checkpoint_every", "summary_every")}
LOGGING_ENV = "PIPELINE_LOGGING"


def without_logging(cfg):
    """`cfg` (a whole config or some of its sections) less LOGGING_KEYS, for a rule's params."""
    return {name: {k: v for k, v in section.items() if k not in LOGGING_KEYS[name]}
            if name in LOGGING_KEYS and isinstance(section, dict) else section for name, section in cfg.items()}


def job_params(cfg):
    """`cfg` (a whole config or some of its sections) as a rule's params: less LOGGING_KEYS, and with
    dataset.bad_audio as "skip", what every shard job does with a bad clip: leave it out and list it.
    `fail` is the index job's alone (rules/functions/cache.smk index_settings; pipeline.cache
    bad_audio_record), so flipping the key reruns the index and what reads it, no shard and not the
    aligner; "skip" rather than no key keeps the params, and so the shards, of caches built before."""
    out = active_kinds(without_logging(cfg))
    if isinstance(out.get("dataset"), dict) and "bad_audio" in out["dataset"]:
        out["dataset"] = dict(out["dataset"], bad_audio="skip")
    return out


# the subsections of `model:` and `vocoder:` that only their own `kind` reads, and the built-in kinds
KIND_SECTIONS = {"model": ("fastpitch", "transformer_tts"), "vocoder": ("vocos", "hifigan", "source_filter")}
BUILT_IN_KINDS = {"model": KIND_SECTIONS["model"], "vocoder": KIND_SECTIONS["vocoder"] + ("griffin_lim",)}


def active_kinds(cfg):
    """`cfg` (a config or some of its sections) without the `model:` and `vocoder:` subsections of
    kinds other than the section's `kind` (a job merges their defaults back), so that editing, say,
    vocoder.vocos while the kind is source_filter reruns no job. A section without its `kind`, or whose
    kind is a user's own (model.kind "package.module:function", which may read a built-in kind's
    section besides `options`), is kept whole."""
    out = dict(cfg)
    for name, kinds in KIND_SECTIONS.items():
        section = out.get(name)
        if isinstance(section, dict) and section.get("kind") in BUILT_IN_KINDS[name]:
            out[name] = {k: v for k, v in section.items() if k not in kinds or k == section["kind"]}
    return out


def logging_env(cfg):
    """LOGGING_ENV's value for a validated config: its LOGGING_KEYS, as JSON."""
    return json.dumps({name: {k: cfg[name][k] for k in keys} for name, keys in LOGGING_KEYS.items()}, sort_keys=True)


def _inherited_logging(inline):
    """The LOGGING_KEYS planning passed in LOGGING_ENV, for the sections an inline job config holds."""
    text = os.environ.get(LOGGING_ENV)
    if not text:
        return {}
    try:
        given = json.loads(text)
        out = {name: {k: given[name][k] for k in LOGGING_KEYS[name]} for name in LOGGING_KEYS if name in inline}
    except (ValueError, TypeError, KeyError):
        out = None
    # the schema's posint, as planning validated it (a job that trusts VALIDATED_ENV does not validate again)
    if out is None or not all(type(v) is int and v >= 1 for section in out.values() for v in section.values()):
        raise ConfigError(f"environment variable {LOGGING_ENV}: not what Snakemake's planning writes "
                          f"(JSON of {', '.join(LOGGING_KEYS)} logging keys, whole steps >= 1); unset it")
    return out


def schema_digest():
    """Digest of the schema and the defaults: what a validation made at planning vouches for."""
    h = hashlib.sha256()
    for path in (SCHEMA, DEFAULTS):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class Section(dict):
    """A config mapping from which a Snakemake rule stripped some keys: reading one of those is a
    KeyError naming it, never a silent default (the rule must pass every key its job reads)."""

    def __init__(self, items, stripped, where=""):
        super().__init__(items)
        self.stripped, self.where = frozenset(stripped), where

    def _refuse(self, key):
        raise KeyError(f"config key {self.where}{key} was stripped by the rule that started this job; "
                       "add it to that rule's params in rules/*.smk")

    def __missing__(self, key):
        if key in self.stripped:
            self._refuse(key)
        raise KeyError(key)

    def get(self, key, default=None):
        if key in self.stripped and key not in self:
            self._refuse(key)
        return super().get(key, default)

    def __deepcopy__(self, memo):
        return Section(copy.deepcopy(dict(self), memo), self.stripped, self.where)

    def __reduce__(self):
        return (Section, (dict(self), self.stripped, self.where))


def restrict(cfg, given, where=""):
    """`cfg` limited to the keys present in `given` (an inline job config), as Sections that refuse
    the stripped keys. Values come from `cfg` (validated, normalised)."""
    out = {}
    for key, value in cfg.items():
        if key not in given:
            continue
        if isinstance(value, dict) and isinstance(given[key], dict):
            out[key] = restrict(value, given[key], f"{where}{key}.")
        else:
            out[key] = value
    return Section(out, set(cfg) - set(given), where)


def _unique_pairs(where):
    """A json object_pairs_hook refusing a key given twice in one object (json keeps the last)."""
    def refuse(key):
        raise ConfigError(f"{where}: key {shown(key)} given twice; JSON would keep only the last")
    return unique_pairs(refuse)


def inline_json(text):
    """The mapping of an inline JSON config (as Snakemake rules pass it); ConfigError saying where
    it is malformed, or which key it gives twice."""
    try:
        user = json.loads(text, object_pairs_hook=_unique_pairs("inline config"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"inline config: not valid JSON at column {e.colno}: {e.msg}") from None
    if not isinstance(user, dict):
        raise ConfigError(f"inline config: the top level must be a mapping of keys, got {type(user).__name__}")
    return user


def load_config(path=None, overrides=None, check_paths=True):
    """The validated config dict: defaults <- file or inline JSON at `path` <- `overrides` dict.

    An inline JSON config is what a Snakemake rule passes its job: only the sections (and keys) that
    job needs. It is validated merged over the defaults, but the job sees only what the rule passed:
    reading a key the rule left out raises KeyError naming it, so no job silently reads a default in
    place of the user's value.
    """
    cfg = _read_yaml(DEFAULTS)
    source = str(DEFAULTS)
    inline = None
    if path is not None:
        text = str(path).strip()
        user = inline_json(text) if text.startswith("{") else _read_yaml(path)
        if text.startswith("{"):  # a rule's job: its trainer's logging keys come from planning's environment
            user = merge(_inherited_logging(user), user)   # a key the inline config gives wins
        cfg = merge(cfg, user)
        source = "inline config" if text.startswith("{") else str(path)
        inline = user if text.startswith("{") else None
    if overrides:
        cfg = merge(cfg, overrides)
        source += " with --set"  # the key may come from either: the message names both
    if inline is not None and not overrides and os.environ.get(VALIDATED_ENV) == schema_digest():
        cfg = normalise(cfg)  # a rule's sections of the config planning validated
    else:
        cfg = validate(normalise(cfg), source, rules=inline is None)
    given = None if inline is None else merge(inline, overrides or {})
    if check_paths and (given is None or {"root", "sources"} & set(given.get("dataset") or {})):
        check_dataset_paths(cfg)  # a job's folders, not the defaults' (data/demo) where its rule gave none
    if given is not None:
        cfg = restrict(cfg, given)
    return cfg


def check_configfiles(paths):
    """The config files Snakemake read itself (the Snakefile's `configfile:` and each --configfile,
    `workflow.configfiles`) read again as load_config reads a file: Snakemake's loader keeps the
    last of a key given twice without a word. ConfigError naming the file, line and key."""
    for path in paths:
        try:
            json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=_unique_pairs(path))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            _read_yaml(path)  # not JSON: YAML (its errors are one line too)


def check_dataset_paths(cfg):
    # os.path's tests, not Path's: an over-long name is not found there, where Path's raise (File name too long)
    ds = cfg["dataset"]
    if "sources" in ds:  # several corpora (pipeline/formats.py); a job may get none of them
        for i, src in enumerate(ds["sources"]):
            if not os.path.isdir(src["root"]):
                raise ConfigError(f"dataset.sources[{i}].root: folder not found: {abbreviated(src['root'], limit=PATH_MAX)}")
    elif "root" in ds:  # a job that reads no clips gets no dataset folder
        root = Path(ds["root"])
        if not os.path.isdir(root):
            raise ConfigError(f"dataset.root: folder not found: {abbreviated(str(root), limit=PATH_MAX)}")
        meta = root / ds["metadata"]
        if not os.path.isfile(meta):
            raise ConfigError(f"dataset.metadata: file not found: {abbreviated(str(meta), limit=PATH_MAX)}")
        audio = root / ds["audio_dir"]
        if not os.path.isdir(audio):
            raise ConfigError(f"dataset.audio_dir: folder not found: {abbreviated(str(audio), limit=PATH_MAX)}")


def parse_set(items):
    """`--set train.steps=10` style overrides into a nested dict (values parsed as YAML)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {shown(item)}: expected key=value")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {shown(item)}: {p} was set to a value above, not a section")
        try:
            node[leaf] = yaml.load(value, Loader=UniqueKeyLoader)
        except AmbiguousNumber as e:
            raise ConfigError(f"--set {shown(item)}: {e.problem}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {shown(item)}: the value is {yaml_problem('', e).split(': ', 1)[1]}") from None
    return out


class _Once(argparse.Action):
    """An option given at most once: a second --config replaced the first without a word (a user
    who meant to merge two files evaluated another run's folders)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:
            parser.error(f"{option_string} given twice ({getattr(namespace, self.dest)}, then {values}): give one "
                         "file, with --set KEY=VALUE for single keys")
        setattr(namespace, self.dest, values)


def add_arguments(parser):
    parser.add_argument("--config", default=None, action=_Once,
                        help="YAML/JSON file merged over configs/config.yaml, or inline JSON as a Snakemake rule "
                             "passes it (the job then sees only the keys given)")
    parser.add_argument("--set", nargs="*", default=[], action="extend", metavar="KEY=VALUE",
                        help="extra overrides, e.g. train.steps=10 (repeatable; later values win)")


MAX_THREADS = 4096  # --threads: a typo (an extra digit) would have TensorFlow start that many threads


def add_threads_argument(parser):
    """A job's --threads N (its rule's `threads:`): TensorFlow's intra-op threads; 0: all cores
    (placement.set_threads). Here, with no TensorFlow import, so that aligner_folder parses it before it
    knows whether it trains (a copy needs no TensorFlow)."""
    def count(text):
        n = int(text)
        if not 0 <= n <= MAX_THREADS:
            raise ValueError(text)
        return n
    count.__name__ = f"thread count (0 to {MAX_THREADS})"  # argparse's message: "invalid thread count ... value"
    parser.add_argument("--threads", type=count, default=0, help="CPU threads for TensorFlow (0: all)")


def from_args(args, check_paths=True):
    return load_config(args.config, parse_set(args.set), check_paths=check_paths)


def cache_dir(cfg):
    return Path(cfg["cache"]["dir"]) / cfg["name"]


def run_dir(cfg):
    return Path(cfg["runs_dir"]) / cfg["name"]


def report_dir(cfg):
    return Path(cfg["reports_dir"]) / cfg["name"]


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    merged = yaml.safe_dump(json.loads(json.dumps(from_args(args))), sort_keys=False)  # an inline config's Sections as mappings
    if sys.stdout is None:   # started with it closed (`>&-`): print() would drop the config without a word
        raise ConfigError("standard output is closed: the merged config has nowhere to go; send it to a file or a pipe")
    print(merged)


if __name__ == "__main__":
    main()
