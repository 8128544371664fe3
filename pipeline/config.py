"""Configuration: the shipped defaults, a user's overrides, one JSON schema.

Reads configs/config.yaml (defaults) and configs/schema.yaml. `load_config(path)` merges a user's
YAML/JSON file (or an inline JSON object, which is how Snakemake rules pass the sections a job
needs) over the defaults and validates the result, so the Python side, the Snakefile and the tests
report the same one-line errors naming the key.

    python -m pipeline.config --config my.yaml      # prints the merged, validated config
"""
import argparse
import copy
import errno
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from pipeline.errors import PipelineError, cli, disk_full

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "configs" / "config.yaml"
SCHEMA = ROOT / "configs" / "schema.yaml"


class ConfigError(PipelineError):
    """A config problem, with the key (or file) it concerns in the message."""


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: every job reads the defaults and schema


def _read_yaml(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_LOADER)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
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


def _coerce_strings(cfg, defaults):
    # Snakemake's `--config 'audio={n_mels: 64}'` delivers nested values as strings: read those
    # as YAML where the default is a number or a boolean, or where they spell a boolean
    for key, value in cfg.items():
        default = defaults.get(key) if isinstance(defaults, dict) else None
        if isinstance(value, dict):
            _coerce_strings(value, default)
        elif isinstance(value, str) and default is not None and not isinstance(default, (list, dict)):
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                continue
            if isinstance(parsed, bool) or (isinstance(parsed, (int, float)) and not isinstance(default, str)):
                cfg[key] = parsed


def normalise(cfg):
    """Types as the schema wants them, whichever way the values arrived (in place; returns cfg)."""
    _coerce_strings(cfg, _read_yaml(DEFAULTS))
    # YAML 1.1 reads a bare `off` as False; the schema accepts both spellings, code sees one.
    train = cfg.get("train", {})
    if train.get("mixed_precision") is False:
        train["mixed_precision"] = "off"
    return cfg


def validate(cfg, source="config"):
    """Raise ConfigError naming the first offending key, e.g. `cache.shards: 0 is less than ...`."""
    import jsonschema  # ~0.1-0.2 CPU s: only where a config is validated, not in every shard job

    errors = sorted(jsonschema.Draft202012Validator(load_schema()).iter_errors(cfg),
                    key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return cfg
    e = errors[0]
    key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
    message = e.message
    if e.validator == "additionalProperties":
        extra = sorted(set(e.instance) - set(e.schema.get("properties", {})))
        key = ".".join([*map(str, e.absolute_path), extra[0]]) if extra else key
        message = f"unknown key (valid keys here: {', '.join(sorted(e.schema.get('properties', {})))})"
    raise ConfigError(f"{source}: {key}: {message}")


# Planning (rules/common.smk) validates the whole config once and then sets this variable, which the
# jobs it starts inherit, to `schema_digest()`. A job whose inline config comes from those rules (a
# subset of that validated config, merged over the same defaults) then skips the schema: jsonschema
# is ~0.1-0.2 CPU s of every shard job's ~0.4. Run by hand, or after an edit of the schema or the
# defaults, a job validates as before.
VALIDATED_ENV = "PIPELINE_CONFIG_VALIDATED"


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
        user = json.loads(text) if text.startswith("{") else _read_yaml(path)
        cfg = merge(cfg, user)
        source = "inline config" if text.startswith("{") else str(path)
        inline = user if text.startswith("{") else None
    if overrides:
        cfg = merge(cfg, overrides)
    if inline is not None and not overrides and os.environ.get(VALIDATED_ENV) == schema_digest():
        cfg = normalise(cfg)  # a rule's sections of the config planning validated
    else:
        cfg = validate(normalise(cfg), source)
    if check_paths:
        check_dataset_paths(cfg)
    if inline is not None:
        cfg = restrict(cfg, merge(inline, overrides or {}))
    return cfg


def check_dataset_paths(cfg):
    root = Path(cfg["dataset"]["root"])
    if not root.is_dir():
        raise ConfigError(f"dataset.root: folder not found: {root}")
    meta = root / cfg["dataset"]["metadata"]
    if not meta.is_file():
        raise ConfigError(f"dataset.metadata: file not found: {meta}")
    audio = root / cfg["dataset"]["audio_dir"]
    if not audio.is_dir():
        raise ConfigError(f"dataset.audio_dir: folder not found: {audio}")
    a = cfg["audio"]
    if a["fmax"] > a["sample_rate"] / 2:
        raise ConfigError(f"audio.fmax: {a['fmax']} is above the Nyquist frequency {a['sample_rate'] / 2}")
    if a["fmin"] >= a["fmax"]:
        raise ConfigError(f"audio.fmin: {a['fmin']} must be below audio.fmax {a['fmax']}")
    if a["win_length"] > a["n_fft"]:
        raise ConfigError(f"audio.win_length: {a['win_length']} is longer than audio.n_fft {a['n_fft']}")
    p = cfg["pitch"]
    if p["fmax"] > a["sample_rate"] / 2:
        raise ConfigError(f"pitch.fmax: {p['fmax']} is above the Nyquist frequency {a['sample_rate'] / 2}")
    if p["fmin"] >= p["fmax"]:
        raise ConfigError(f"pitch.fmin: {p['fmin']} must be below pitch.fmax {p['fmax']}")


def espeak_voices():
    """The voice names espeak-ng (and so phonemizer's espeak backend) accepts, from `espeak-ng --voices`
    (about 20 ms; phonemizer's own check costs half a second of imports); None without the program."""
    program = shutil.which("espeak-ng")
    if program is None:
        return None
    listing = subprocess.run([program, "--voices"], capture_output=True, text=True, check=False).stdout
    return {line.split()[1] for line in listing.splitlines()[1:] if len(line.split()) > 1}


def preflight(cfg):
    """What can be checked before any job starts (Snakemake calls this when it reads the config, so a
    bad value starts no job and so deletes no output): the dataset paths, the espeak-ng voice of
    text.language for the phonemes front end, and a user's model.kind (it imports and takes
    (model_cfg, vocab, n_mels)). ConfigError naming the key."""
    check_dataset_paths(cfg)
    if cfg["text"]["frontend"] == "phonemes":
        voices = espeak_voices()
        language = cfg["text"]["language"]
        if voices is not None and language not in voices:
            close = sorted(v for v in voices if v.split("-")[0] == language.split("-")[0])
            raise ConfigError(f"text.language: espeak-ng has no voice {language!r}"
                              + (f" (voices of that language: {', '.join(close)})" if close else "")
                              + "; `espeak-ng --voices` lists them")
    from pipeline import models  # imports this module: not at the top
    models.check_kind(cfg["model"])


def parse_set(items):
    """`--set train.steps=10` style overrides into a nested dict (values parsed as YAML)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value")
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(value)
    return out


def add_arguments(parser):
    parser.add_argument("--config", default=None,
                        help="YAML/JSON file merged over configs/config.yaml, or inline JSON as a Snakemake rule "
                             "passes it (the job then sees only the keys given)")
    parser.add_argument("--set", nargs="*", default=[], action="extend", metavar="KEY=VALUE",
                        help="extra overrides, e.g. train.steps=10 (repeatable; later values win)")


def from_args(args, check_paths=True):
    return load_config(args.config, parse_set(args.set), check_paths=check_paths)


def cache_dir(cfg):
    return Path(cfg["cache"]["dir"]) / cfg["name"]


def run_dir(cfg):
    return Path(cfg["runs_dir"]) / cfg["name"]


def report_dir(cfg):
    return Path(cfg["reports_dir"]) / cfg["name"]


def temporary(path, suffix=""):
    """The temporary name beside `path` that atomic writes use: `.NAME.tmpPID[suffix]`."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")


def atomic_write(path, write, suffix=""):
    """The one atomic write: `write(tmp)` writes a temporary file beside `path` (named by
    `temporary`; `suffix` for writers that insist on one), which is then renamed to `path`, so
    readers never see half a file. On any failure the temporary file is removed; a full disk
    (ENOSPC) becomes one line naming `path` (pipeline.errors.DiskFull)."""
    path = Path(path)
    tmp = temporary(path, suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise disk_full(path) from None
        raise


def atomic_write_bytes(path, data):
    """`data` to `path` atomically (and durably: fsync before the rename)."""
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    atomic_write(path, write)


def atomic_write_text(path, text):
    atomic_write_bytes(path, text.encode("utf-8"))


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    print(yaml.safe_dump(from_args(args), sort_keys=False))


if __name__ == "__main__":
    main()
