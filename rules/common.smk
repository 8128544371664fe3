# Config validation, the dataset manifest and the per-shard inputs and params.
# The manifest is read once per Snakemake invocation. No shard job lists metadata.csv or the whole
# config as an input: each gets a digest of just its own rows and settings as params, so an edit
# reruns only the shards it touches (Snakemake's params trigger), and `touch metadata.csv` reruns nothing.
# Those params are compared with what .snakemake/ recorded: a checkout without that folder (or a run
# from another --directory) cannot see edits; `snakemake --forcerun caches` rebuilds then.
import gc
import json
import os
import sys
import time
from pathlib import Path

# Snakemake's own modules, out of the cyclic collector's reach before ours make garbage (the end
# of the Snakefile says why)
gc.freeze()
sys.path.insert(0, workflow.basedir)
from pipeline import (
    config as pconfig,
    files as pfiles,
    formats as pformats,
    manifest as pmanifest,
    models as pmodels,
    preflight as ppreflight,
    shards as pshards,
    text as ptext,
)

try:
    # configs/schema.yaml, with one-line messages naming the key (it sets no defaults, so
    # snakemake.utils.validate would only check the same schema a second time)
    pconfig.validate(pconfig.normalise(config))
    # paths, espeak-ng voice, model.kind: before any job deletes an output
    ppreflight.preflight(config)
    if config["dataset"].get("sources") == []:
        raise pformats.DatasetError(
            "dataset.sources: lists no source (remove the key for the single-folder form)"
        )
    MANIFEST = pmanifest.load_manifest(config["dataset"], config["cache"]["shards"])
    SOURCES = pformats.normalised(config["dataset"].get("sources", []))
    if SOURCES and config["text"]["frontend"] == "phonemes":
        pformats.check_languages(
            (c for clips in MANIFEST.values() for c in clips),
            ptext.espeak_languages(),
            config["text"]["language"],
        )
except (pconfig.ConfigError, pformats.DatasetError, ptext.TextError) as e:
    raise WorkflowError(str(e))
# the jobs started from here inherit this and skip re-validating the sections they get
os.environ[pconfig.VALIDATED_ENV] = pconfig.schema_digest()

NAME = config["name"]
CACHE = Path(config["cache"]["dir"]) / NAME
RUN = Path(config["runs_dir"]) / NAME
REPORT = Path(config["reports_dir"]) / NAME
LOGS = REPORT / "logs"
SHARDS = [f"{k:03d}" for k in range(config["cache"]["shards"])]
DS = config["dataset"]


wildcard_constraints:
    shard=r"\d{3}|[1-9]\d{3}",  # shard-000 .. shard-4095: the names f"{k:03d}" makes


def _inline(**sections):
    """The config sections a job needs, as the inline JSON that `--config` accepts."""
    return json.dumps(sections, sort_keys=True)


def _shard_sources(shard, keys):
    """The sources holding clips of this shard, with just `keys`: adding a source, or changing one
    source's language, changes only the settings of the shards holding its clips."""
    names = sorted({c.source for c in MANIFEST[int(shard)]})
    return [{k: SOURCES[n][k] for k in keys if k in SOURCES[n]} for n in names]


def token_settings(wildcards):
    if SOURCES:
        dataset = {
            "sources": _shard_sources(
                wildcards.shard, ("root", "format", "name", "speaker", "language")
            )
        }
    else:
        dataset = {k: DS[k] for k in ("root", "metadata", "audio_dir")}
    return _inline(
        dataset=dataset,
        cache={"shards": config["cache"]["shards"]},
        text=config["text"],
    )


def token_rows(wildcards):
    clips = MANIFEST[int(wildcards.shard)]
    return pshards.digest(PROVENANCE["tokens"], *(c.line for c in clips))


def _audio_job_dataset(shard):
    # val_fraction only changes cache_index (the statistics), never a mel or a pitch track;
    # a source's speaker and language never change audio
    if SOURCES:
        return {
            "bad_audio": DS["bad_audio"],
            "max_seconds": DS["max_seconds"],
            "sources": _shard_sources(shard, ("root", "format", "name")),
        }
    return {k: v for k, v in DS.items() if k != "val_fraction"}


def mel_settings(wildcards):
    return _inline(
        dataset=_audio_job_dataset(wildcards.shard),
        cache={"shards": config["cache"]["shards"]},
        audio=config["audio"],
    )


def pitch_settings(wildcards):
    return _inline(
        dataset=_audio_job_dataset(wildcards.shard),
        cache={"shards": config["cache"]["shards"]},
        **pshards.settings("pitch", config),
    )


if SOURCES:  # each clip names its own file
    AUDIO = {
        c.id: pmanifest.audio_stamp(c.audio) for cs in MANIFEST.values() for c in cs
    }
else:  # one directory scan, not 3 stats a clip
    AUDIO = pmanifest.audio_files(DS["root"], DS["audio_dir"])
PROVENANCE = {kind: pshards.provenance(kind, config) for kind in pshards.CACHE_KINDS}


def publish_clip_lists():
    """Before the jobs start: each shard's clips, from the manifest read above, where the shard jobs
    read theirs (pipeline/manifest.py, shard_manifest) instead of reading the whole dataset each.
    Unchanged data writes nothing. If it cannot be written, the jobs read the dataset as before.
    """
    dataset = {"sources": list(SOURCES.values())} if SOURCES else DS
    try:
        folder = pmanifest.write_clip_lists(
            MANIFEST, config["cache"]["shards"], CACHE / ".clips", dataset
        )
    except OSError as e:
        print(
            f"clip lists not written ({e}); shard jobs read the dataset",
            file=sys.stderr,
        )
        return
    os.environ[pmanifest.CLIP_LISTS_ENV] = str(folder.resolve())


onstart:
    publish_clip_lists()


# shard: its clips' entries, made once for both mel_shard and pitch_shard
_CLIP_FILES = {}


def _clip_files(kind, shard):
    # each clip's id, the file it resolves to, its size and mtime: adding, removing, renaming or
    # replacing a clip changes this, even a replacement moved in with an older mtime (mv, cp -p)
    if shard not in _CLIP_FILES:
        _CLIP_FILES[shard] = [f"{c.id}={AUDIO.get(c.id)}" for c in MANIFEST[int(shard)]]
    return pshards.digest(PROVENANCE[kind], *_CLIP_FILES[shard])


def mel_clips(wildcards):
    return _clip_files("mels", wildcards.shard)


def pitch_clips(wildcards):
    return _clip_files("pitch", wildcards.shard)


def repair(*kinds):
    """Input function that makes a damaged shard's job stale: when a shard's .bin no longer has the
    size its JSON records (truncated, overwritten), planning writes a fresh marker,
    cache/{name}/.repair/{kind}-NNN, newer than the shard and with new content (Snakemake skips an
    mtime change when the checksum is the same), so the mtime trigger reruns exactly that job. A
    marker, once made, stays listed so the input set does not change again. Nothing is deleted.
    A job with some of its files deleted (a .bin, a .stats.npy, the energy shard) is damaged too:
    cache_index lists only the token, mel and pitch JSON files, so no one else would ask for them.
    """

    def inputs(wildcards):
        marker = CACHE / ".repair" / f"{kinds[0]}-{wildcards.shard}"
        if (
            pshards.intact(
                *(pshards.prefix(CACHE, kind, wildcards.shard) for kind in kinds)
            )
            != "ok"
        ):
            pfiles.atomic_write_text(
                marker, f"damaged shard found at {time.time_ns()}\n"
            )
        return [marker] if marker.exists() else []

    return inputs


def shard_files(kind, *suffixes):
    return [
        CACHE / f"{kind}/shard-{shard}{suffix}"
        for shard in SHARDS
        for suffix in suffixes
    ]


def config_without(*sections, keep=None):
    """The config minus sections a job ignores, so editing those does not rerun it; `keep` names
    the few keys of a dropped section the job still reads, e.g. keep={"synthesize": ["griffin_lim_iters"]}.
    The job sees only what this passes: reading a dropped key is a KeyError naming it.
    """
    keep = keep or {}

    def params(wildcards):
        cfg = {k: v for k, v in config.items() if k not in sections}
        cfg.update({s: {k: config[s][k] for k in keys} for s, keys in keep.items()})
        return json.dumps(cfg, sort_keys=True)

    return params


def gpus_wanted():
    """GPUs a GPU rule declares, so `--resources gpu=N` can cap concurrent GPU jobs.

    At most N: profiles/default sets gpu=1 (GPU jobs take turns, each using every visible GPU),
    and a job asking more than the budget would be an error rather than a wait.
    """
    placement = config["train"]["placement"]
    if placement == "cpu":
        return 0
    if placement == "single":
        wanted = 1
    else:
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            pynvml.nvmlShutdown()
        except Exception:  # no driver: TensorFlow will run on the CPU
            return 0
        wanted = {"split": 2, "mirrored": count, "multiworker": count}.get(
            placement, min(count, 2)
        )
    budget = workflow.global_resources.get(
        "gpu"
    )  # a snakemake.resources.Resource, or None
    budget = (
        None if budget is None else budget.value
    )  # None: no --resources gpu=N given
    return wanted if budget is None else min(wanted, budget)


# --- the aligner stage (rules/align.smk) and training (rules/train.smk) ---
def _aligner_sections():
    # with sources, the aligner reads the caches alone: a source added or edited reruns its shards
    # (and their duration shards), not the aligner, as an edited line does
    dataset = (
        {k: DS[k] for k in ("bad_audio", "max_seconds", "val_fraction")}
        if SOURCES
        else DS
    )
    return dict(
        name=NAME,
        dataset=dataset,
        cache=config["cache"],
        audio=config["audio"],
        text=config["text"],
        aligner=config["aligner"],
        train={k: config["train"][k] for k in ("buckets", "seed")},
    )


def aligner_settings(wildcards):
    # pitch: only so the loader can check the index's provenance; it does not change an alignment
    return _inline(**_aligner_sections(), pitch=config["pitch"])


ALIGNER_KEY = pshards.digest(
    _inline(**_aligner_sections()),
    PROVENANCE["tokens"],
    PROVENANCE["mels"],
    pshards.code_digest("models/aligner.py", "align.py"),
)[:12]
ALIGNER = RUN / "aligner" / ALIGNER_KEY
# the code that turns a trained aligner into durations (its NumPy forward pass, MAS): a duration_shard
# param, so an edit reruns every duration shard and does not retrain the aligner
DURATION_CODE = pshards.code_digest("durations.py", "models/aligner_numpy.py")[:12]


def train_durations(wildcards):
    if not pmodels.needs_durations(config["model"]):
        return []
    return expand(CACHE / "durations/shard-{shard}.json", shard=SHARDS)


# --- the vocoder (rules/vocoder.smk) ---
FINETUNE = config["vocoder"]["finetune_steps"]
VOCODER = [] if config["vocoder"]["kind"] == "griffin_lim" else [RUN / "vocoder.json"]
_CACHE_SECTIONS = (
    "name",
    "dataset",
    "cache",
    "audio",
    "text",
    "pitch",
)  # what reading the index checks
_PLACEMENT = (
    "placement",
    "data_device",
    "model_device",
    "jit_compile",
    "mixed_precision",
    "seed",
)


def vocoder_outputs(phase):
    """train_vocoder writes the final runs/{name}/vocoder.json itself when there is no fine-tuning."""
    out = {"summary": RUN / f"vocoder/{phase}.json"}
    if phase == "finetune" or FINETUNE == 0:
        out["final"] = RUN / "vocoder.json"
    return out


def vocoder_settings(phase):
    """The first phase does not see finetune_steps, so changing it reruns fine-tuning alone."""
    v = dict(config["vocoder"])
    if phase == "train":
        v.pop("finetune_steps")

    def params(wildcards):
        return _inline(
            **{k: config[k] for k in _CACHE_SECTIONS + ("runs_dir", "reports_dir")},
            train={k: config["train"][k] for k in _PLACEMENT},
            vocoder=v,
        )

    return params


def gta_settings(wildcards):
    return _inline(
        **{k: config[k] for k in _CACHE_SECTIONS + ("runs_dir", "model")},
        synthesize={"max_seconds": config["synthesize"]["max_seconds"]},
    )
