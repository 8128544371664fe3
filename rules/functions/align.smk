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
