# The aligner stage: train the alignment model once, then one duration_shard job per shard.
# train_aligner sees the cache index as `ancient`: an edited line or a replaced clip rebuilds its own
# shards (and their duration shards) but never retrains the aligner. What does retrain it is in its
# params: the `aligner:` section and the text/audio settings and code (a new vocabulary or mel).
# `snakemake --forcerun train_aligner` retrains on purpose.


def aligner_settings(wildcards):
    return _inline(name=NAME, dataset=DS, cache=config["cache"], audio=config["audio"], text=config["text"],
                   aligner=config["aligner"], train={k: config["train"][k] for k in ("buckets", "seed")})


def aligner_inputs_code(wildcards):
    # the text and mel settings and feature code (not the data): a new vocabulary or mel retrains
    return pdataset.digest(PROVENANCE["tokens"], PROVENANCE["mels"], pdataset.file_digest(Path(workflow.basedir) / "pipeline/models/aligner.py"))


rule train_aligner:
    input:
        index=ancient(rules.cache_index.output.index),
    output:
        summary=RUN / "aligner/aligner.json",
        weights=RUN / "aligner/aligner.weights.h5",
    params:
        config=aligner_settings,
        code=aligner_inputs_code,
    threads: 32
    log:
        LOGS / "train_aligner.log",
    benchmark:
        str(REPORT / "benchmarks/train_aligner.tsv")
    conda:
        "../environment.yml"
    shell:
        "python -m pipeline.align --config {params.config:q} --index {input.index} --out {output.summary} --threads {threads} > {log} 2>&1"


rule duration_shard:
    input:
        aligner=rules.train_aligner.output.summary,
        tokens=CACHE / "tokens/shard-{shard}.json",
        mels=CACHE / "mels/shard-{shard}.json",
    output:
        bin=CACHE / "durations/shard-{shard}.bin",
        index=CACHE / "durations/shard-{shard}.json",
    params:
        config=lambda wildcards: _inline(name=NAME, cache=config["cache"], audio=config["audio"], aligner=config["aligner"]),
        out=lambda wildcards: CACHE / f"durations/shard-{wildcards.shard}",
    threads: 1
    log:
        LOGS / "duration_shard/{shard}.log",
    benchmark:
        str(REPORT / "benchmarks/duration_shard/{shard}.tsv")
    conda:
        "../environment.yml"
    shell:
        "python -m pipeline.durations --config {params.config:q} --shard {wildcards.shard} --aligner {input.aligner} --tokens {input.tokens} --mels {input.mels} --out {params.out} > {log} 2>&1"


rule aligner:
    input:
        rules.train_aligner.output,
    localrule: True


rule durations:
    input:
        expand(CACHE / "durations/shard-{shard}.json", shard=SHARDS),
    localrule: True
