# Training from the caches, and synthesis from the latest checkpoint.
# The checkpoint folder is deliberately not an output: Snakemake deletes outputs before a job
# runs, and a rerun after an interruption must resume from it. Models that train on durations
# (model.kind fastpitch or a user's own) wait for every duration shard.


def train_durations(wildcards):
    if not pmodels.needs_durations(config["model"]):
        return []
    return expand(CACHE / "durations/shard-{shard}.json", shard=SHARDS)


rule train:
    input:
        index=rules.cache_index.output.index,
        durations=train_durations,
    output:
        summary=RUN / "train.json",
    params:
        # reports_dir stays: train.placement auto reads the last diagnose report
        config=config_without("synthesize", "evaluate", "diagnose", "aligner", keep={"synthesize": ["griffin_lim_iters"]}),
    threads: 32
    resources:
        gpu=gpus_wanted(),
    log:
        LOGS / "train.log",
    benchmark:
        str(REPORT / "benchmarks/train.tsv")
    conda:
        "../environment.yml"
    shell:
        "python -m pipeline.train --config {params.config:q} --out {output.summary} --threads {threads} 2>&1 | tee {log}"


rule synthesize:
    input:
        rules.train.output.summary,
    output:
        wavs=expand(RUN / "samples/{i:02d}.wav", i=range(len(config["synthesize"]["sentences"]))),
        mels=expand(RUN / "samples/{i:02d}.npy", i=range(len(config["synthesize"]["sentences"]))),
    params:
        config=config_without("evaluate", "diagnose", "reports_dir"),
        out=RUN / "samples",
    threads: 8
    resources:
        gpu=min(gpus_wanted(), 1),
    log:
        LOGS / "synthesize.log",
    conda:
        "../environment.yml"
    shell:
        "python -m pipeline.synthesize --config {params.config:q} --out {params.out} > {log} 2>&1"
