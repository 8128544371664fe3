"""What made a run, carried with it: the vocabulary, the feature statistics and the config sections
that shaped the model, in runs/{name}/run.json beside its checkpoints.

A checkpoint alone is a set of numbers: which id is which phoneme, what mean and spread the mels were
normalised with, and which mel definition the model learned live here, written by `train` when a
run starts (atomically) and never rewritten while its checkpoints exist. Synthesis, evaluation (and
GTA and export) read the run's own copy, never the current cache index, so a cache rebuilt on other
data cannot change what a trained model means. Resuming after the data changed keeps the run's
statistics, and a vocabulary or a text, audio or pitch setting that moved under the checkpoints is a
one-line error naming what changed.

    from pipeline import runinfo
    info = runinfo.load(config.run_dir(cfg))   # {vocab, speakers, languages, stats, config, n_mels}; MissingCheckpoint if untrained
    runinfo.path(run_dir)                      # runs/{name}/run.json
    runinfo.latest_checkpoint(run_dir / "checkpoints")   # runs/{name}/checkpoints/ckpt-N, or None
    runinfo.checkpoint_identity("runs/demo/checkpoints/ckpt-800")   # that path @ a digest of its weights
    runinfo.checkpoint_path(identity)                                # and back to the path

Config keys: none read here; `SECTIONS` of the config are stored.
"""
import hashlib
import json
import re
from pathlib import Path

import numpy as np

from pipeline import config, files, symbols
from pipeline.errors import MissingCheckpoint, PipelineError, located

FORMAT = 1
FILE = "run.json"
SECTIONS = ("model", "text", "audio", "pitch")  # the config that shaped the model and its features
_ARRAY_STATS = ("mel_mean", "mel_std",           # per mel channel
                "speaker_pitch_mean", "speaker_pitch_std")  # per speaker (several); the others are scalars


class RunChanged(PipelineError):
    """The data or settings under a run's checkpoints changed: resuming would restore wrong weights."""


def path(run_dir):
    return Path(run_dir) / FILE


def latest_checkpoint(folder):
    """The latest checkpoint in `folder` as tf.train.latest_checkpoint names it (`folder/ckpt-N`, from the
    `checkpoint` state file, and only if its .index exists), else None; read without TensorFlow."""
    try:
        state = (Path(folder) / "checkpoint").read_text()
    except (OSError, UnicodeDecodeError):
        return None
    found = re.search(r'^model_checkpoint_path: "([^"\\]+)"$', state, re.M)
    if found is None:
        return None
    latest = Path(found.group(1)) if Path(found.group(1)).is_absolute() else Path(folder) / found.group(1)
    return str(latest) if Path(f"{latest}.index").is_file() else None


def step_of(checkpoint):
    """The step checkpoint `checkpoint` (.../ckpt-N, or its identity) was saved at, None for another
    name (one put there by hand). The trainers name each by the steps they took, which under float16
    loss scaling can be more than the optimizer's iterations: a step whose gradients overflowed is
    skipped, not counted."""
    found = re.search(r"ckpt-(\d+)$", checkpoint_path(str(checkpoint)))
    return int(found.group(1)) if found else None


def checkpoint_identity(prefix):
    """`prefix` (runs/{name}/checkpoints/ckpt-N) and which weights it holds: `prefix@digest`, the digest of
    its .index file, which records every saved tensor's CRC32C. A model trained again to the same step
    under the same name has the same path but another identity, so what was made from the old one
    (GTA mels, a fine-tuned vocoder) is not taken for the new one's. Read without TensorFlow."""
    digest = hashlib.sha256(Path(f"{prefix}.index").read_bytes()).hexdigest()[:16]
    return f"{prefix}@{digest}"


_DIGEST = re.compile(r"@([0-9a-f]{16})$")  # checkpoint_identity's suffix


def checkpoint_path(identity):
    """The checkpoint a `checkpoint_identity` names (a bare path, as recorded before identities: itself)."""
    return _DIGEST.sub("", identity)


def checkpoint_digest(identity):
    """The weights' digest a `checkpoint_identity` names; None for a bare path (recorded before identities)."""
    found = _DIGEST.search(identity)
    return found and found.group(1)


def describe(cfg, index, stats):
    """What a run started now from `index` (the cache's) would carry: JSON-ready."""
    return {"format": FORMAT, "name": cfg["name"], "n_mels": int(index["n_mels"]), "vocab": index["vocab"],
            "speakers": list(index.get("speakers", [])), "languages": list(index.get("languages", [])),
            "stats": {k: np.asarray(v, np.float64).round(6).tolist() for k, v in stats.items()},
            "config": {k: json.loads(json.dumps(cfg[k])) for k in SECTIONS},
            "split": {"val_fraction": cfg["dataset"]["val_fraction"]},
            "train": {"seed": cfg["train"]["seed"]},
            "cache": {"provenance": index["provenance"], "counts": index.get("counts")}}


def _index_fraction(cfg):
    """The cache index's dataset.val_fraction (None where there is no readable index)."""
    try:
        value = json.loads((config.cache_dir(cfg) / "index.json").read_text(encoding="utf-8")).get("val_fraction")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def precision_changes(run, cfg):
    """A sentence when train.mixed_precision, set to float16 or to off/bfloat16, would resume checkpoints
    saved the other way (train.json's context says how they trained): a loss-scaled optimizer keeps
    other state, so the train job refused them, but only after Snakemake had deleted train.json. `auto`
    depends on the machine the job runs on, so the job alone judges it (train.check_loss_scale)."""
    asked = cfg["train"]["mixed_precision"]
    try:
        trained = json.loads((Path(run) / "train.json").read_text(encoding="utf-8"))["context"]["mixed_precision"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if asked == "auto" or not isinstance(trained, str) or (asked == "float16") == (trained == "float16"):
        return []
    return [f"train.mixed_precision changed ({trained!r} -> {asked!r}: its checkpoints were saved "
            f"{'with' if trained == 'float16' else 'without'} float16's loss scaling; set "
            f"{'float16' if trained == 'float16' else 'off'} or auto to resume them)"]


def split_changes(saved, now, index_fraction=None):
    """A sentence when dataset.val_fraction `now` differs from the one a run recorded (`split`), or, for
    a run recorded before it was, from `index_fraction` (the cache index's, which the run last trained
    against): the split is a hash of each id against it, so a new fraction moves clips the model
    trained on into validation, where evaluate would score them as unseen."""
    before = saved.get("split", {}).get("val_fraction") if isinstance(saved.get("split"), dict) else None
    before = index_fraction if before is None else before
    if before is None or before == now:
        return []
    return [f"dataset.val_fraction changed ({before!r} -> {now!r}: clips move between training and validation)"]


def write(run_dir, info):
    files.atomic_write_text(path(run_dir), json.dumps(info, indent=1, ensure_ascii=False))


def _read(run_dir):
    p = path(run_dir)
    try:
        info = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise PipelineError(f"{p}: unreadable ({e}); delete {Path(run_dir) / 'checkpoints'} and {p} to train anew") from None
    if isinstance(info, dict) and info.get("format") != FORMAT:
        raise PipelineError(f"{p}: written in run format {info.get('format')}, this code reads {FORMAT}; "
                            f"delete {Path(run_dir) / 'checkpoints'} to train anew")
    if not isinstance(info, dict) or not all(isinstance(info.get(k), dict) for k in ("config", "stats")):
        raise PipelineError(f"{p}: not a run record (no config and stats mappings): restore it, or delete "
                            f"{Path(run_dir) / 'checkpoints'} and {p} to train anew")
    return info


def loaded(info):
    """`info` with its statistics as float32 arrays and floats."""
    stats = {k: np.asarray(v, np.float32) if k in _ARRAY_STATS else float(v) for k, v in info["stats"].items()}
    return dict(info, stats=stats)


def voice_tables(info):
    """{"speakers": [...], "languages": [...]}: the run's sorted name tables (what models.build takes)."""
    return {k: list(info.get(k, [])) for k in ("speakers", "languages")}


def voice_fields(info):
    """The batch fields the run's model was trained with: ("speaker",) with several speakers, ("language",)
    with several languages, both or ()."""
    return tuple(f for f, t in (("speaker", "speakers"), ("language", "languages")) if len(info.get(t, [])) > 1)


def load(run_dir):
    """{vocab, stats, config, n_mels, ...} of a trained run (stats as float32 arrays and floats);
    MissingCheckpoint naming the command when the run has none."""
    info = _read(run_dir)
    if info is None:
        raise MissingCheckpoint(f"{located(path(run_dir))}: no run here (or one trained before runs carried their vocabulary); "
                                f"train first (`snakemake --cores all train`)")
    return loaded(info)


def changes(saved, now):
    """Sentences naming what differs between a saved run's info and the current one that matters to
    its weights: the vocabulary's symbols or settings, the text, audio and pitch sections, the split and
    train.seed."""
    out = []
    old, new = saved["vocab"], now["vocab"]
    if old["symbols"] != new["symbols"]:
        moved = [i for i, (a, b) in enumerate(zip(old["symbols"], new["symbols"])) if a != b]
        first = f", first at id {moved[0]} ({old['symbols'][moved[0]]!r} -> {new['symbols'][moved[0]]!r})" if moved else ""
        out.append(f"the vocabulary changed ({len(old['symbols'])} -> {len(new['symbols'])} symbols{first})")
    for table in ("speakers", "languages"):  # a speaker's id is its position: a new table moves them
        if saved.get(table, []) != now[table] and _matters(table, saved.get(table, []), now[table]):
            out.append(f"the {table} changed ({', '.join(saved.get(table, [])) or 'none'} -> {', '.join(now[table])})")
    return (out + setting_changes(saved, now["config"]) + split_changes(saved, now["split"]["val_fraction"])
            + seed_changes(saved, now["train"]["seed"]))


def seed_changes(saved, now):
    """A sentence when train.seed `now` differs from the one a run recorded (`train`): it drew the run's
    initial weights and its batch order, so the checkpoints are the old seed's, and a run at train.steps
    already would take no step and be reported as trained on the new one. A run recorded before the
    seed was says nothing."""
    before = saved.get("train", {}).get("seed") if isinstance(saved.get("train"), dict) else None
    if before is None or before == now:
        return []
    return [f"train.seed changed ({before!r} -> {now!r}: the checkpoints' initial weights and batches are the old seed's)"]


def _matters(table, old, new):
    """Whether a speakers or languages table that changed from `old` to `new` moves what the weights
    learned: a table of several (each id is a position), or one language for another (a clip's language
    decides how its text becomes phonemes: a one-language run of en-us data retrained on de would learn
    German phonemes under a run.json still saying en-us). One speaker renamed is only a label."""
    return len(old) + len(new) > 2 or (table == "languages" and bool(old) and bool(new))


def setting_changes(saved, cfg):
    """Sentences naming each text, audio or pitch key of the config that differs from what the run
    recorded in run.json (`saved`): the settings its caches, vocabulary and weights were made with."""
    out = []
    for section in ("text", "audio", "pitch"):
        a, b = saved["config"].get(section, {}), json.loads(json.dumps(cfg[section]))
        keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        out += [f"{section}.{k} changed ({a.get(k)!r} -> {b.get(k)!r})" for k in keys]
    return out


BUILT_IN_KINDS = config.KIND_SECTIONS["model"]  # model.{kind} sections; only the one in use shapes a run


def model_changes(before, now):
    """Sentences naming each `model:` key that differs between `before` (a run's record) and `now`,
    leaving out the sections of built-in kinds neither of them uses (editing transformer_tts's
    stop_threshold changes nothing in a fastpitch run)."""
    before, now = json.loads(json.dumps(before or {})), json.loads(json.dumps(now))
    unused = set(BUILT_IN_KINDS) - {before.get("kind"), now.get("kind")}
    out = []
    for key in sorted((set(before) | set(now)) - unused, key=lambda k: (k != "kind", k)):
        a, b = before.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"model.{key}.{k} changed ({a.get(k)!r} -> {b.get(k)!r})"
                    for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        elif a != b:
            out.append(f"model.{key} changed ({a!r} -> {b!r})")
    return out


def check_unchanged(cfg):
    """RunChanged, before any job runs, when the config's text, audio, pitch or model settings (or
    dataset.val_fraction: split_changes, or train.seed: seed_changes) differ from those of the trained run of the same `name`:
    planning would otherwise rebuild the caches in place and
    delete the run's train.json before `train` refused. Nothing to check before a run exists; once its
    checkpoints are deleted (README: "delete runs/{name}/checkpoints to start over") `train` starts afresh
    with the new settings, so they are no longer refused either."""
    run = config.run_dir(cfg)
    saved = _read(run)
    if saved is None:
        return
    diff = (setting_changes(saved, cfg) + split_changes(saved, cfg["dataset"]["val_fraction"], _index_fraction(cfg))
            + seed_changes(saved, cfg["train"]["seed"]) + precision_changes(run, cfg))
    if "model" in saved["config"]:  # the train job would refuse it after Snakemake deleted train.json
        diff += model_changes(saved["config"]["model"], cfg["model"])
    _refuse(cfg, run, diff)
    # the voice synthesize and evaluate speak in (pipeline.synthesize.resolve_voice says the same after
    # loading the model): here, before Snakemake deletes those jobs' finished reports
    s, speakers, languages = cfg["synthesize"], list(saved.get("speakers", [])), list(saved.get("languages", []))
    if s["speaker"] and s["speaker"] not in speakers:
        known = ", ".join(speakers) or "none: the run has one speaker (leave it empty)"
        raise PipelineError(f"synthesize.speaker: unknown speaker {s['speaker']!r} in run {cfg['name']!r}; known: {known}")
    if s["language"] and languages and s["language"] not in languages:
        raise PipelineError(f"synthesize.language: unknown language {s['language']!r} in run {cfg['name']!r}; "
                            f"known: {', '.join(languages)}")


def _trained(run):
    """Whether the run folder holds a checkpoint: one the trainers saved, or one put there by hand that
    the `checkpoint` state file names (train.restore resumes from it)."""
    return any((run / "checkpoints").glob("ckpt-*.index")) or latest_checkpoint(run / "checkpoints") is not None


def _refuse(cfg, run, diff):
    """RunChanged naming `diff` when the run of cfg's `name` has checkpoints (nothing to refuse before)."""
    if diff and _trained(run):
        raise RunChanged(f"{path(run)}: run {cfg['name']!r} was trained with other settings: {'; '.join(diff)}. "
                         f"Nothing was run. Give this configuration another `name` (--config name=...) to build it "
                         f"beside the trained run, restore the settings, or delete {run / 'checkpoints'} to train anew")


def check_voices(cfg, names, kept=None, log=None):
    """RunChanged, at planning, when a speaker or language of the trained run has no clip left in the
    dataset (`names`: the manifest's, pipeline.preflight.voices): renamed or removed, so `train` would
    refuse the new table after the token shards were rebuilt in place and Snakemake had deleted
    train.json. A name the manifest adds is only said (`log`), not refused: a job may yet reject every
    clip of it (bad audio), and planning cannot know that before the jobs read the audio (a deleted
    or moved cache, a speaker whose every clip was rejected). `kept`: the names of the clips the built
    cache has not left out (default `names`), so a name it left out whole is not said to be new."""
    run = config.run_dir(cfg)
    saved = _read(run)
    if saved is None:
        return
    kept = names if kept is None else kept
    diff = []
    for table in ("speakers", "languages"):  # a single-speaker run has no table to move
        old = list(saved.get(table, []))
        gone = [n for n in old if n not in names[table]]
        added = [n for n in kept[table] if n not in old]
        if gone and (len(old) > 1 or table == "languages" and bool(names[table])):  # one language for another too
            diff.append(f"the {table} changed ({', '.join(old)} -> {', '.join(names[table])}: no clip of "
                        f"{', '.join(gone)} is left)")
        elif added and len(old) + len(kept[table]) > 2 and log is not None and _trained(run):  # what `train` refuses
            log(f"note: the dataset has {table} that run {cfg['name']!r} did not train on ({', '.join(added)}); its "
                f"model has no place for them, so `train` stops unless the caches leave out every clip of them: "
                f"give this configuration another `name` to train a model with them")
    _refuse(cfg, run, diff)


def for_training(cfg, index, stats, run_dir, resuming, log=print):
    """What a training run carries (JSON-ready; `loaded` gives arrays): the saved info when resuming
    (RunChanged when the cache's vocabulary or settings moved under the checkpoints), else the
    current one. The chief writes it (`write`) before the first step."""
    now = describe(cfg, index, stats)
    if not resuming:
        check_index_split(cfg, index)
        return now
    saved = _read(run_dir)
    if saved is None:
        raise RunChanged(f"{Path(run_dir) / 'checkpoints'}: made before runs carried their vocabulary (no {FILE}); "
                         f"delete that folder to train anew, or give this run another `name`")
    lacking = _lacking(saved, now)
    diff = changes(saved, now) if not {"vocab", "vocab.symbols"} & set(lacking) else []
    if diff:
        raise RunChanged(f"{Path(run_dir) / 'checkpoints'}: {'; '.join(diff)} since this run started; "
                         f"restore the old settings, give this run another `name`, or delete that folder to train anew")
    if lacking:
        raise PipelineError(f"{path(run_dir)}: not a whole run record (no {', '.join(lacking)}): restore it, or delete "
                            f"{Path(run_dir) / 'checkpoints'} and {path(run_dir)} to train anew")
    check_index_split(cfg, index)
    if saved["stats"] != now["stats"]:
        log(f"resuming with the run's own feature statistics ({path(run_dir)}); the cache's have changed since")
    return saved


def check_index_split(cfg, index):
    """PipelineError when the cache index was made with another dataset.val_fraction than the config's:
    the loader splits by the index's, while run.json records the config's (a cache Snakemake has no
    record of, copied in, is not rebuilt after the edit), so the run would say one split and train on
    another."""
    made, now = index.get("val_fraction"), cfg["dataset"]["val_fraction"]
    if isinstance(made, (int, float)) and not isinstance(made, bool) and made != now:
        raise PipelineError(f"{config.cache_dir(cfg) / 'index.json'}: made with dataset.val_fraction {made!r}, the "
                            f"config says {now!r}, and training splits by the index's: remake it "
                            "(`snakemake --cores all caches --forcerun cache_index`) "   # shards.REBUILD: shards imports this
                            f"or set dataset.val_fraction {made!r}")


def _lacking(saved, now):
    """The keys a resume reads (those of `now`, what a run started now would carry) that the run record
    `saved` has no value of the same kind for: a hand-edited run.json, say."""
    out = [k for k in ("vocab", "n_mels") if not isinstance(saved.get(k), type(now[k]))]
    if "vocab" not in out and not isinstance(saved["vocab"].get("symbols"), list):
        out.append("vocab.symbols")
    return out + [f"stats.{k}" for k in now["stats"] if k not in saved["stats"]]


def run_vocabulary(cfg):
    """What the run's model was trained with -> {vocab, n_mels, mel_mean, mel_std, audio, model}: THE one
    place export reads them, from the run's own runs/{name}/run.json (pipeline/runinfo.py), as
    pipeline.synthesize does; MissingCheckpoint naming `train` when the run has none."""
    info = load(config.run_dir(cfg))
    return {"vocab": info["vocab"], "n_mels": int(info["n_mels"]), "mel_mean": info["stats"]["mel_mean"],
            "mel_std": info["stats"]["mel_std"], "audio": dict(info["config"]["audio"]),
            "model": info["config"]["model"]}


def _spoken(vocab, languages):
    """The vocabulary with the language its clips were spoken in where the run has one: a source's own
    `language`, which text.language (the vocabulary's) need not be; several: the vocabulary's."""
    return dict(vocab, language=languages[0]) if languages and len(languages) == 1 else vocab


def _exported(folder):
    """(vocab, where) of an export folder: its vocab.json, spoken in export.json's one language."""
    meta = folder / "export.json"
    languages = json.loads(meta.read_text(encoding="utf-8")).get("languages") if meta.is_file() else None
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    try:
        symbols.inventory(vocab["frontend"])   # a front end this pipeline has
    except (KeyError, TypeError):
        raise PipelineError(f"{folder / 'vocab.json'}: not a vocabulary an export writes (no front end this "
                            "pipeline has: characters or phonemes); export the voice again") from None
    return _spoken(vocab, languages), str(folder / "vocab.json")


def ids_vocabulary(run=None, config_path=None):
    """(vocab, where it came from) for `pipeline.text --ids`: {run}/vocab.json or {run}/export/vocab.json
    when `run` is given; else the config's run's export/vocab.json; else, before any export, the
    run's own vocabulary (run_vocabulary). Its language is the one the run's clips were spoken in,
    where they were all in one (a German source under the default text.language: de, not en-us)."""
    if run is not None:
        for folder in (Path(run), Path(run) / "export"):
            if (folder / "vocab.json").is_file():
                return _exported(folder)
        raise PipelineError(f"--run {run}: no vocab.json there nor in its export/; run `snakemake export` first")
    cfg = config.load_config(config_path, check_paths=False)
    folder = config.run_dir(cfg) / "export"
    if (folder / "vocab.json").is_file():
        return _exported(folder)
    info = load(config.run_dir(cfg))
    return _spoken(info["vocab"], info.get("languages")), f"the vocabulary of run {cfg['name']!r} (not exported yet)"
