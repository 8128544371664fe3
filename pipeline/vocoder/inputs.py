"""What a vocoder phase's checkpoints were made from, and what happens to them when that changes.

runs/{name}/vocoder/{phase}/inputs.json holds the settings the phase's checkpoints were trained
with (`vocoder:` less the keys a rerun continues with, `audio:`) and, for `finetune`, the first
phase's checkpoint and the GTA shards' checksums (pipeline/vocoder/train.py adds those). When they
change, `switch` sets the checkpoints aside in vocoder/{phase}/set_aside/<digest>/ (the last `KEEP`
sets are kept) and the phase trains from its start; when the same inputs come back, their set is
moved back and training resumes from it. `notes` says so at planning time, before any job runs
(rules/vocoder.smk prints them, so `snakemake -n vocoder` shows them); it reads two small JSON files
and needs no TensorFlow.

    from pipeline.vocoder import inputs
    inputs.notes(cfg)              # lines for the phases whose checkpoints the next vocoder job sets aside
    inputs.switch(folder, key, log)  # before a phase trains: the checkpoints made from `key` in place

Config keys: vocoder.*, audio.*, runs_dir, name.
"""
import hashlib
import json
import os
import shutil
from pathlib import Path

from pipeline import config, files

FILE = "inputs.json"
# a rerun continues (finetune_share is applied after fine-tuning: a change only writes the shipped weights again)
RESUMABLE = ("steps", "finetune_steps", "finetune_share", "checkpoint_every", "log_every", "summary_every")
FINETUNE_ONLY = ("finetune_recorded", "finetune_share")  # read by the second phase alone: a change reruns only that
AS_BEFORE = {"finetune_recorded": 0}  # at this value a key trains as before it existed: left out, so
                                      # checkpoints recorded without it stay valid
KEEP = 2  # sets of checkpoints kept aside per phase (at the demo's sizes, ~3 MB each)
PHASES = ("train", "finetune")


def path(folder):
    return Path(folder) / FILE


def settings(cfg, phase="train"):
    """The settings a phase's checkpoints depend on, JSON-ready: a change of any restarts the phase.
    The first phase does not depend on the keys of fine-tuning alone (`FINETUNE_ONLY`)."""
    skip = RESUMABLE + (FINETUNE_ONLY if phase == "train" else ())
    vocoder = {k: v for k, v in cfg["vocoder"].items() if k not in skip and not (k in AS_BEFORE and v == AS_BEFORE[k])}
    return json.loads(json.dumps({"vocoder": vocoder, "audio": cfg["audio"]}))


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
    a, b = _flat({k: made.get(k) for k in ("vocoder", "audio")}, ""), _flat({k: now.get(k) for k in ("vocoder", "audio")}, "")
    out = [f"{k[1:]} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    out += [what for key, what in (("from", "the first phase's weights"), ("gta", "the GTA mels"))
            if made.get(key) != now.get(key)]
    return out


def _digest(made):
    return hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:12]


def _has_checkpoints(folder):
    return (Path(folder) / "checkpoints" / "checkpoint").exists()


def switch(folder, key, log):
    """Before phase folder `folder` trains from inputs `key`: checkpoints made from other inputs are set
    aside (one `log` line naming what changed and where they went), and a set made from `key` earlier
    comes back in their place. Then `key` is recorded."""
    folder, key = Path(folder), json.loads(json.dumps(key))
    made, ckpts, aside = read(folder), folder / "checkpoints", folder / "set_aside"
    if made is not None and made != key and ckpts.exists():
        target = aside / _digest(made)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shutil.copy2(path(folder), path(target))
        os.replace(ckpts, target / "checkpoints")
        log(f"{folder}: its checkpoints were made with {'; '.join(changes(made, key))}: set aside in {target} "
            f"(these inputs back restore them); training this phase from its start")
        for old in sorted(aside.iterdir(), key=lambda p: p.stat().st_mtime)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    # `key` recorded before its set moves back: a job killed between the two leaves the folder saying
    # `key` with no checkpoints (the next one moves the set back), never another key's name over this
    # set's checkpoints (which the next job would file under that key, overwriting its set)
    files.atomic_write_text(path(folder), json.dumps(key, indent=1, sort_keys=True))
    back = aside / _digest(key)
    if not ckpts.exists() and _has_checkpoints(back):
        os.replace(back / "checkpoints", ckpts)
        shutil.rmtree(back, ignore_errors=True)
        log(f"{folder}: resuming from the checkpoints set aside when these inputs last changed")


def notes(cfg):
    """Planning-time lines: for each phase whose checkpoints were made with other settings than `cfg`'s,
    what changed and that its job will set them aside and train that phase from its start. [] when
    nothing would be set aside (and for vocoder.kind griffin_lim, which trains nothing)."""
    if cfg["vocoder"]["kind"] == "griffin_lim":
        return []
    out = []
    for phase in PHASES[:1 + (cfg["vocoder"]["finetune_steps"] > 0)]:
        now, folder = settings(cfg, phase), config.run_dir(cfg) / "vocoder" / phase
        made = read(folder)
        moved = [] if made is None or not _has_checkpoints(folder) else changes(
            {k: made[k] for k in ("vocoder", "audio")}, now)
        if moved:
            back = " (a set made with these settings is kept aside: it resumes from that)" \
                if read(folder / "set_aside" / _digest(now)) == now else ""  # the first phase's key is settings alone
            out.append(f"note: {', '.join(moved)} since the vocoder's {phase} phase was trained: its job sets "
                       f"{folder / 'checkpoints'} aside and trains that phase from its start{back}")
    return out
