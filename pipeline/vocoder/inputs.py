"""What a vocoder phase's checkpoints were made from, and what happens to them when that changes.

runs/{name}/vocoder/{phase}/inputs.json holds the settings the phase's checkpoints were trained
with (`vocoder:` less the keys a rerun continues with, `audio:`, `train.seed`, which picks every
batch and the initial weights) and, for `finetune`, the first
phase's checkpoint and the GTA shards' checksums (pipeline/vocoder/train.py adds those). When they
change, `switch` sets the checkpoints aside in vocoder/{phase}/set_aside/<digest>/ (the last `KEEP`
sets are kept) and the phase trains from its start; when the same inputs come back, their set is
moved back and training resumes from it. Checkpoints with no readable inputs.json (deleted, damaged)
are not resumed either, whatever the settings: nothing says what they were trained with, so they go to
vocoder/{phase}/set_aside/unrecorded-<time>/ with a reason.txt, never pruned. `notes` says so at
planning time, before any job runs (rules/vocoder.smk prints them, so `snakemake -n vocoder` shows
them); it reads two small JSON files and needs no TensorFlow.

    from pipeline.vocoder import inputs
    inputs.notes(cfg, uses_f0)     # lines for the phases whose checkpoints the next vocoder job sets aside
    inputs.switch(folder, key, log)  # before a phase trains: the checkpoints made from `key` in place
    inputs.finetuned_elsewhere(cfg, summary, checkpoint)  # a note when the vocoder was fine-tuned for another acoustic model

Config keys: vocoder.*, audio.*, train.seed, pitch.* (kinds that take F0), runs_dir, name.
"""
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from pipeline import config, files, runinfo

FILE = "inputs.json"
# a rerun continues (finetune_share is applied after fine-tuning: a change only writes the shipped weights again)
RESUMABLE = ("steps", "finetune_steps", "finetune_share", "checkpoint_every", "log_every", "summary_every")
FINETUNE_ONLY = ("finetune_recorded", "finetune_share")  # read by the second phase alone: a change reruns only that
AS_BEFORE = {"finetune_recorded": 0}  # at this value a key trains as before it existed: left out, so
                                      # checkpoints recorded without it stay valid
KEEP = 2  # sets of checkpoints kept aside per phase (at the demo's sizes, ~3 MB each)
UNRECORDED = "unrecorded-"  # set_aside/unrecorded-<time>/: checkpoints no inputs.json vouched for; never pruned
PHASES = ("train", "finetune")
UNCONFIRMED = "@unconfirmed"  # a `gta_from` entry's suffix: a GTA shard that the weights now at its path did not
                              # make, nor says which did (pipeline/vocoder/train.py _gta_from)


def path(folder):
    return Path(folder) / FILE


def settings(cfg, phase="train", uses_f0=False):
    """The settings a phase's checkpoints depend on, JSON-ready: a change of any restarts the phase.
    The first phase does not depend on the keys of fine-tuning alone (`FINETUNE_ONLY`). A kind that
    trains on F0 from the pitch cache (`uses_f0`: kinds.uses_f0, which imports this module) depends on
    `pitch:` too: a new pitch method resumed the phase at its last step, trained on the old F0. Every
    phase depends on `train.seed`, which draws its initial weights and its batches (segments.py): a new
    seed resumed the phase at its last step on the new seed's batches, neither run's. Inputs recorded
    before they held `pitch` or `train` are compared without it (LATER)."""
    skip = RESUMABLE + (FINETUNE_ONLY if phase == "train" else ())
    vocoder = {k: v for k, v in cfg["vocoder"].items() if k not in skip and not (k in AS_BEFORE and v == AS_BEFORE[k])}
    made = {"vocoder": vocoder, "audio": cfg["audio"], "train": {"seed": cfg["train"]["seed"]}}
    if uses_f0:
        made["pitch"] = cfg["pitch"]
    return _kind_only(json.loads(json.dumps(made)))


SECTIONS = ("vocoder", "audio", "pitch", "train")  # what settings() records; `pitch` only for kinds that take F0
LATER = ("pitch", "train")  # sections inputs did not always record: compared only where both sides hold them


def _as_recorded(now, made):
    """`now` less the sections `made` (inputs recorded earlier) does not hold: `pitch` and `train` were
    not recorded before they were keys, and checkpoints made then resume as they did."""
    return {k: v for k, v in now.items() if k in made or k not in SECTIONS}


def _same(made, key):
    """Whether checkpoints recorded as made from `made` were made from inputs `key`."""
    return _comparable(made) == _comparable(_as_recorded(key, made))


def _kind_only(made):
    """`made` (inputs) without the `vocoder:` subsections of other kinds than its own, which its weights do
    not depend on: inputs recorded with them compare equal to those recorded without (config.active_kinds)."""
    if isinstance(made, dict) and isinstance(made.get("vocoder"), dict):
        return {**made, "vocoder": config.active_kinds({"vocoder": made["vocoder"]})["vocoder"]}
    return made


def read(folder):
    """The inputs a phase's checkpoints were made from, or None (none recorded, or unreadable)."""
    try:
        made = json.loads(path(folder).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return made if isinstance(made, dict) and isinstance(made.get("audio"), dict) \
        and isinstance(made.get("vocoder"), dict) else None


def _flat(section, prefix):
    if not isinstance(section, dict):
        return {prefix: section}
    return {k: v for key, value in section.items() for k, v in _flat(value, f"{prefix}.{key}").items()}


def changes(made, now):
    """'key old -> new' for each setting that differs; the first phase's weights and the GTA mels by name."""
    made, now = _kind_only(made), _kind_only(_as_recorded(now, made))
    keys = [k for k in SECTIONS if k not in LATER or k in made and k in now]  # a kind without F0 has no pitch
    a, b = (_flat({k: _with_as_before(x, k) for k in keys}, "") for x in (made, now))
    out = [f"{k[1:]} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    made, now = _comparable(made), _comparable(now)
    out += [what for key, what in (("from", "the first phase's weights"), ("gta", "the GTA mels"))
            if made.get(key) != now.get(key)]
    return out


def _with_as_before(made, section):
    """`made`'s `section`, with the keys settings() leaves out at their AS_BEFORE value put back, so a
    note names the value the phase trained at (not None)."""
    value = made.get(section)
    return {**AS_BEFORE, **value} if section == "vocoder" and isinstance(value, dict) else value


def _comparable(made):
    """`made` without other kinds' sections (`_kind_only`), with the first phase's checkpoint (`from`: runinfo.checkpoint_identity's `path@digest`) named
    by its weights' digest alone: a run copied or moved under another name resumes its fine-tuning."""
    made = _kind_only(made)
    first = made.get("from")
    weights = runinfo.checkpoint_digest(first) if isinstance(first, str) else None   # damaged: compared as it is
    return {**made, "from": weights} if weights else made


def _digest(made):
    """A set's folder name under set_aside/: its inputs as `_comparable` gives them, so a copied run's key
    names the set its original set aside."""
    return hashlib.sha256(json.dumps(_comparable(made), sort_keys=True).encode()).hexdigest()[:12]


def _set_for(aside, key):
    """The set of checkpoints under `aside` made from inputs `key`, or None: by its name (or a name it
    had before inputs held `pitch` or `train`), else (a set named before names were comparable) by each
    set's inputs.json, compared as switch compares (_same)."""
    older = [{k: v for k, v in key.items() if k not in drop} for drop in ((), ("pitch",), ("train",), LATER)]
    for named in dict.fromkeys(aside / _digest(old) for old in older):
        if _has_checkpoints(named):
            return named
    sets = aside.iterdir() if aside.is_dir() else ()
    return next((p for p in sets if not p.name.startswith(UNRECORDED) and _has_checkpoints(p)
                 and (made := read(p)) is not None and _same(made, key)), None)


def _has_checkpoints(folder):
    return (Path(folder) / "checkpoints" / "checkpoint").exists()


def _unrecorded(folder):
    """Why the checkpoints in `folder` cannot be vouched for (a checkpoint there and no readable
    inputs.json), else None."""
    ckpts = Path(folder) / "checkpoints"
    if read(folder) is not None or not (_has_checkpoints(folder) or any(ckpts.glob("ckpt-*.index"))):
        return None
    return f"{path(folder)} is {'unreadable' if path(folder).exists() else 'missing'}"


def _set_aside_unrecorded(folder, why, log):
    """Checkpoints nothing vouches for (`why`: _unrecorded's) are not resumed: they move, with what is left
    of their inputs.json, to set_aside/unrecorded-<time>/ beside a reason.txt, never deleted."""
    target = folder / "set_aside" / f"{UNRECORDED}{time.strftime('%Y%m%d-%H%M%S')}"
    while target.exists():
        target = target.with_name(target.name + "-")
    target.mkdir(parents=True)
    files.atomic_write_text(target / "reason.txt", f"{why}: nothing says what settings these checkpoints were "
                                                   f"trained with, so {folder} trained from its start\n")
    if path(folder).exists():
        os.replace(path(folder), path(target))
    os.replace(folder / "checkpoints", target / "checkpoints")
    log(f"{folder}: {why}, so nothing says what its checkpoints were trained with: set aside in {target} "
        f"(kept, not resumed); training this phase from its start")


def switch(folder, key, log):
    """Before phase folder `folder` trains from inputs `key`: checkpoints made from other inputs are set
    aside (one `log` line naming what changed and where they went), and a set made from `key` earlier
    comes back in their place. Then `key` is recorded."""
    folder, key = Path(folder), json.loads(json.dumps(key))
    why = _unrecorded(folder)
    if why:  # deleted or damaged: whatever the settings now, these checkpoints may have been made with others
        _set_aside_unrecorded(folder, why, log)
    made, ckpts, aside = read(folder), folder / "checkpoints", folder / "set_aside"
    if made is not None and not _same(made, key) and ckpts.exists():
        target = aside / _digest(made)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shutil.copy2(path(folder), path(target))
        os.replace(ckpts, target / "checkpoints")
        log(f"{folder}: its checkpoints were made with {'; '.join(changes(made, key))}: set aside in {target} "
            f"(these inputs back restore them); training this phase from its start")
        # the unrecorded are kept until deleted by hand; so is the set `key` made, which comes back below
        coming_back = _set_for(aside, key)
        sets = [p for p in aside.iterdir() if not p.name.startswith(UNRECORDED) and p != coming_back]
        for old in sorted(sets, key=lambda p: p.stat().st_mtime)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    # `key` recorded before its set moves back: a job killed between the two leaves the folder saying
    # `key` with no checkpoints (the next one moves the set back), never another key's name over this
    # set's checkpoints (which the next job would file under that key, overwriting its set)
    files.atomic_write_text(path(folder), json.dumps(key, indent=1, sort_keys=True))
    back = None if ckpts.exists() else _set_for(aside, key)
    if back is not None:
        os.replace(back / "checkpoints", ckpts)
        shutil.rmtree(back, ignore_errors=True)
        log(f"{folder}: resuming from the checkpoints set aside when these inputs last changed")


def notes(cfg, uses_f0=False):
    """Planning-time lines: for each phase whose checkpoints were made with other settings than `cfg`'s,
    what changed and that its job will set them aside and train that phase from its start. [] when
    nothing would be set aside (and for vocoder.kind griffin_lim, which trains nothing)."""
    if cfg["vocoder"]["kind"] == "griffin_lim":
        return []
    out = []
    for phase in PHASES[:1 + (cfg["vocoder"]["finetune_steps"] > 0)]:
        now, folder = settings(cfg, phase, uses_f0), config.run_dir(cfg) / "vocoder" / phase
        made, why = read(folder), _unrecorded(folder)
        if why:
            out.append(f"note: {why}, so nothing says what {folder / 'checkpoints'} were trained with: the vocoder's "
                       f"{phase} job sets them aside in {folder / 'set_aside'}/{UNRECORDED}<time>/ (kept, not resumed) "
                       f"and trains that phase from its start")
            continue
        moved = [] if made is None or not _has_checkpoints(folder) else changes(
            {k: made[k] for k in SECTIONS if k in made}, now)
        if moved:
            back = " (a set made with these settings is kept aside: it resumes from that)" \
                if _set_for(folder / "set_aside", now) else ""  # the first phase's key is settings alone
            out.append(f"note: {', '.join(moved)} since the vocoder's {phase} phase was trained: its job sets "
                       f"{folder / 'checkpoints'} aside and trains that phase from its start{back}")
    return out


def _same_weights(a, b):
    """Whether checkpoint names `a` and `b` (runinfo.checkpoint_identity's `path@digest`, or a bare path)
    are the same weights: by digest where both have one (a copied run's paths differ), else by ckpt-N.
    A name marked UNCONFIRMED is no weights anyone can vouch for: never the same."""
    if a.endswith(UNCONFIRMED) or b.endswith(UNCONFIRMED):
        return False
    da, db = runinfo.checkpoint_digest(a), runinfo.checkpoint_digest(b)
    if da and db:
        return da == db
    return Path(runinfo.checkpoint_path(a)).name == Path(runinfo.checkpoint_path(b)).name


def _named(made, spoken):
    """How the note names checkpoint `made` (a `gta_from` entry) beside `spoken` (the path spoken with): by
    path, with its digest where the paths are the same, or as out of date where UNCONFIRMED."""
    if made.endswith(UNCONFIRMED):
        return (f"{made[:-len(UNCONFIRMED)]} as it was when they were made (their shards' provenance does not "
                f"match the weights now there: they are out of date)")
    return made if runinfo.checkpoint_path(made) == str(spoken) else runinfo.checkpoint_path(made)


def _gta_from_shards(cfg):
    """For a summary written before summaries recorded `gta_from`: the acoustic checkpoints the run's GTA
    shards name, when they are the shards fine-tuning trained on (their checksums in its inputs.json); else []."""
    run = config.run_dir(cfg)
    made = read(run / "vocoder" / "finetune") or {}
    numbered = sorted((p for p in (run / "gta").glob("shard-*.json") if p.stem[len("shard-"):].isdigit()),
                      key=lambda p: int(p.stem[len("shard-"):]))    # in shard order (1000 sorts after 999)
    metas = []
    for shard in numbered[:len(made.get("gta") or ())]:             # leftovers of a larger cache.shards: after
        try:
            metas.append(json.loads(shard.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return []
    if not metas or made.get("gta") != [m.get("checksum") for m in metas]:
        return []
    # the weights where the shard names them (pipeline/vocoder/gta.py since 2026-12-05), else its path
    return sorted({m["weights"] if isinstance(m.get("weights"), str) else m["checkpoint"] for m in metas
                   if isinstance(m.get("checkpoint"), str)})


def finetuned_elsewhere(cfg, summary, checkpoint, then="", log=None):
    """A one-line `note:` when the vocoder of `summary` (runs/{name}/vocoder.json as read, or export.json's
    `vocoder`) was fine-tuned on the GTA mels of another acoustic checkpoint than `checkpoint` (the latest,
    the one spoken with), else None; passed to `log` too when there is one. Snakemake reruns the GTA mels
    and the fine-tuning after acoustic training (gta_shard takes train.json); a direct command does not.
    `then`: appended to the advice."""
    if summary.get("phase") != "finetune":
        return None
    made = summary.get("gta_from")
    made = _gta_from_shards(cfg) if made is None else made
    if made and all(_same_weights(m, runinfo.checkpoint_identity(checkpoint)) for m in made):
        return None
    run = config.run_dir(cfg)
    tuned = ", ".join(_named(m, checkpoint) for m in made) if made else f"other mels than {run / 'gta'}'s"
    # one path on both sides (a model trained again to the same step): the digests tell them apart
    same_path = any(runinfo.checkpoint_path(m).removesuffix(UNCONFIRMED) == str(checkpoint) for m in made)
    spoken = runinfo.checkpoint_identity(checkpoint) if same_path else checkpoint
    note = (f"note: {run / 'vocoder.json'}: the vocoder was fine-tuned on the GTA mels of {tuned}, not of "
            f"{spoken}, the acoustic checkpoint spoken with; run `snakemake --cores all vocoder` to fine-tune it "
            f"on that one{then}")
    if log is not None:
        log(note)
    return note
