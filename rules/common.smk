# What every stage shares: config validation and the pre-job checks, the dataset manifest (read once
# per Snakemake invocation), the folders, and the helpers several stages' rules call. Each stage's own
# input and params functions sit in its rules file (cache.smk, align.smk, train.smk, vocoder.smk).
# No shard job lists metadata.csv or the whole config as an input: each gets a digest of just its own
# rows and settings as params, so an edit reruns only the shards it touches (Snakemake's params
# trigger), and `touch metadata.csv` reruns nothing. Those params are compared with what .snakemake/
# recorded: a checkout without that folder (or a run from another --directory) cannot see edits;
# `snakemake --forcerun caches` rebuilds then.
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
    aligner_folder as paligner_folder,
    config as pconfig,
    errors as perrors,
    files as pfiles,
    formats as pformats,
    manifest as pmanifest,
    models as pmodels,
    preflight as ppreflight,
    scheduling as pscheduling,
    shards as pshards,
    text as ptext,
)


def stop_planning(error):
    """A bad config or dataset (a PipelineError): its one line, and Snakemake's exit status for a
    workflow error, before any job. Raised as a WorkflowError it came framed by this file's name and
    line, twice, as if the workflow were at fault."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.exit(1)


try:
    # configs/schema.yaml, with one-line messages naming the key (it sets no defaults, so
    # snakemake.utils.validate would only check the same schema a second time)
    # a key given twice in a --configfile (YAML keeps the last silently)
    pconfig.check_configfiles(workflow.configfiles)
    pconfig.validate(pconfig.normalise(config))
    # paths, espeak-ng voice, model.kind, a trained run's settings: before any job deletes an output
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
    # train.balance's speakers; what evaluate needs when the command's targets build it
    ppreflight.check_manifest(config, MANIFEST, ppreflight.snakemake_targets(sys.argv))
except perrors.PipelineError as e:
    stop_planning(e)
# the jobs started from here inherit this and skip re-validating the sections they get
os.environ[pconfig.VALIDATED_ENV] = pconfig.schema_digest()
# ... and the trainers' logging keys, which no job's params hold: editing them reruns nothing
os.environ[pconfig.LOGGING_ENV] = pconfig.logging_env(config)

NAME = config["name"]
CACHE = Path(config["cache"]["dir"]) / NAME
RUN = Path(config["runs_dir"]) / NAME
# the jobs' `python -m pipeline.X` find the project from any working folder, as planning does
ppreflight.jobs_find_code(workflow.basedir)
# Another Snakemake holds a lock on this run's cache or run folder (.snakemake/locks/): planning then
# marks no shard damaged and sets none aside, since that run may be writing it. A job that a run's
# executor starts as Snakemake again (a SLURM job) finds its own run's lock, and so leaves them too.
ANOTHER_RUN = ppreflight.another_run(Path(".snakemake", "locks"), [CACHE, RUN])
# what shard jobs that were killed (SIGKILL, SIGTERM: a SLURM time limit) left half-written, for good
for left in [] if ANOTHER_RUN else pshards.remove_leftovers(CACHE, RUN):
    print(f"removed {left}: what a stopped shard job left", file=sys.stderr)
REPORT = Path(config["reports_dir"]) / NAME
LOGS = REPORT / "logs"
SHARDS = [f"{k:03d}" for k in range(config["cache"]["shards"])]
DS = config["dataset"]


wildcard_constraints:
    shard=r"\d{3}|[1-9]\d{3}",  # shard-000 .. shard-4095: the names f"{k:03d}" makes


def _inline(**sections):
    """The config sections a job needs, as the inline JSON that `--config` accepts (less the trainers'
    logging keys, dataset.bad_audio as "skip": pipeline.config.job_params)."""
    return json.dumps(pconfig.job_params(sections), sort_keys=True)


def shard_files(kind, *suffixes):
    return [
        CACHE / f"{kind}/shard-{shard}{suffix}"
        for shard in SHARDS
        for suffix in suffixes
    ]


def config_without(*sections, keep=None, omit=None):
    """The config minus sections a job ignores, so editing those does not rerun it; `keep` names
    the few keys of a dropped section the job still reads, e.g. keep={"synthesize": ["griffin_lim_iters"]};
    `omit` the keys of a kept section it does not, e.g. omit={"synthesize": ["sentences"]}.
    The job sees only what this passes: reading a dropped key is a KeyError naming it.
    """
    keep, omit = keep or {}, omit or {}

    def params(wildcards):
        cfg = {k: v for k, v in config.items() if k not in sections}
        cfg.update({s: {k: config[s][k] for k in keys} for s, keys in keep.items()})
        cfg.update(
            {
                s: {k: v for k, v in cfg[s].items() if k not in keys}
                for s, keys in omit.items()
            }
        )
        return json.dumps(pconfig.job_params(cfg), sort_keys=True)

    return params


def gpus_wanted():
    """GPUs a GPU rule declares, so `--resources gpu=N` can cap concurrent GPU jobs.

    At most N: profiles/default sets gpu=1 (GPU jobs take turns, each using every visible GPU),
    and a job asking more than the budget would be an error rather than a wait. The budget counts
    turns and assigns no GPU: two one-GPU jobs under gpu=2 would both see every GPU (docs/scaling.md).
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
        # auto: split, or mirrored over every GPU where the host's last diagnose measured it faster
        wanted = 2 if placement == "split" else count
    budget = workflow.global_resources.get(
        "gpu"
    )  # a snakemake.resources.Resource, or None
    budget = (
        None if budget is None else budget.value
    )  # None: no --resources gpu=N given
    return wanted if budget is None else min(wanted, budget)


# --- used by several stages' rules ---
FINETUNE = config["vocoder"]["finetune_steps"]
VOCODER = [] if config["vocoder"]["kind"] == "griffin_lim" else [RUN / "vocoder.json"]
# train_aligner and train_vocoder need only the caches, so they can run side by side: each asks half
# the cores where the config trains both, even in a run where one has nothing to do (threads are fixed
# before Snakemake knows which jobs run); all, up to 32, where it trains one. The demo's small vocoder is no
# faster on 2 threads than on 1, so on 2 cores the pair takes ~145 s instead of ~190 s one after the
# other (benchmarks/RESULTS.md). With GPU turns they still take turns; profiles set their own threads.
BESIDE = 1 + bool(VOCODER and pmodels.needs_durations(config["model"]))
# --cores N; a cluster profile gives none (each job gets its own CPUs, profiles/slurm's set-threads),
# and there `workflow.cores` raises: read the value it reads, None when not given
CORES = workflow.global_resources["_cores"].value
THREADS_BESIDE = max(1, min(32, (CORES or 32) // BESIDE))


# Before the first job (Snakemake keeps one onstart handler): each shard's clip list
# (rules/functions/cache.smk), the rules the run forces (rules/functions/align.smk), and for a local
# run a scheduler without the job-rate limit's timers, which wake it once a second per finished job
# (pipeline/scheduling.py).
onstart:
    publish_clip_lists()
    publish_forced_rules()
    pscheduling.unthrottle_local(workflow)
