# Input and params functions of the aligner stage (rules/align.smk): its settings and key, and the duration shards' code digest.


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


# the code that turns a trained aligner into durations (its NumPy forward pass, MAS)
DURATION_CODE = pshards.code_digest("durations.py", "models/aligner_numpy.py")[:12]
# What the aligner learns from: its settings, the text and mel settings and code, its own code (the
# whole folder key before it had two parts: a folder of that time is named by it).
# aligner.max_token_seconds only judges the durations made after training (pipeline.durations): it is
# held at its default here, so a new threshold reruns the duration shards and its new folder copies
# the trained weights, and a key made before it was held stays the same at the default.
TRAIN_KEY = pshards.digest(
    _inline(
        **{
            **_aligner_sections(),
            "aligner": {**config["aligner"], "max_token_seconds": 1.0},
        }
    ),
    PROVENANCE["tokens"],
    PROVENANCE["mels"],
    pshards.code_digest("models/aligner.py", "align.py"),
)[:12]
# The folder's key: the training key, and the rest of what train_aligner's and the duration shards'
# params hold (`pitch:`, which its loader checks the index with, and the duration shards' code), so any
# change is a missing output. Snakemake 9 never checks the params or markers of a job downstream of a
# job that reruns when it is reached only through an ancient input (train_aligner from cache_index, and
# the duration shards through it); a missing output it does find, from the jobs that read the
# aligner's folder directly (train, `durations`). A new folder whose training key a sibling has copies
# its weights (pipeline.aligner_folder), so a `pitch:` or duration code change trains nothing.
ALIGNER_KEY = pshards.digest(TRAIN_KEY, aligner_settings(None), DURATION_CODE)[:12]
ALIGNER = RUN / "aligner" / ALIGNER_KEY


def publish_forced_rules():
    """Before the jobs start: the rules this run forces (--forcerun/-R, or "*" for --forceall), for the
    jobs in pipeline.aligner_folder's FORCED_ENV: a forced train_aligner trains even in a new folder,
    where its weights would otherwise be copied. Snakemake knows them only once the DAG is built.
    """
    ds = getattr(workflow, "dag_settings", None)
    rules = sorted(ds.forcerun) + ["*"] * bool(ds.forceall) if ds is not None else []
    os.environ[paligner_folder.FORCED_ENV] = ",".join(rules)


def duration_repair(wildcards):
    """repair("durations"), and a duration shard that is damaged or no longer pairs with the token
    and mel shards it was aligned to (one rebuilt by `snakemake caches` before) set aside in
    cache/{name}/.repair/ (kept): its job's output is then missing. Snakemake 9 checks no job
    behind train_aligner's ancient index input while the index reruns (another edit), neither its
    times nor its repair marker; it does plan a missing output that `durations` or `train` reads.
    """
    out = pshards.prefix(CACHE, "durations", wildcards.shard)
    made = [
        CACHE / f"{kind}/shard-{wildcards.shard}.json" for kind in ("tokens", "mels")
    ]
    marker, damaged = mark_damaged(("durations",), CACHE, wildcards.shard)
    reason = None
    if not ANOTHER_RUN and Path(f"{out}.json").exists():
        reason = pshards.stale_durations(out, *made) or (
            "damaged (a file missing, or a .bin unlike its JSON)" if damaged else None
        )
    if reason:
        # an input function's error only drops the job: stop rather than plan around it
        try:
            pshards.set_aside(out, CACHE / ".repair", reason)
        except OSError as e:
            stop_planning(
                perrors.PipelineError(
                    f"{out}.json: {reason}, and it cannot be set aside in {CACHE / '.repair'} "
                    f"({e.strerror or e}); make that a writable folder and rerun"
                )
            )
        print(
            f"{out}.json: {reason}; set aside in {CACHE / '.repair'}", file=sys.stderr
        )
    return [marker] if marker.exists() else []


# `--forcerun train_aligner` on the command line (rules/align.smk): its index input is then not ancient
FORCED_ALIGNER = "train_aligner" in ppreflight.forced_rules(sys.argv)
