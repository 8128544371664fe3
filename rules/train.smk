# Training from the caches, and synthesis from the latest checkpoint.
# The checkpoint folder and runs/{name}/history.jsonl (the loss history) are deliberately not
# outputs: Snakemake deletes outputs before a job runs (and a failed job's), and a rerun after an
# interruption or a failure must resume from them. Models that train on durations
# (model.kind fastpitch or a user's own) wait for every duration shard.


include: "functions/train.smk"


rule train:
    input:
        index=rules.cache_index.output.index,
        durations=train_durations,
    output:
        summary=RUN / "train.json",
    log:
        LOGS / "train.log",
    benchmark:
        str(REPORT / "benchmarks/train.tsv")
    conda:
        "../environment.yml"
    threads: 32
    resources:
        gpu=gpus_wanted(),
    params:
        # reports_dir stays: train.placement auto reads the last diagnose report
        config=config_without(
            "synthesize",
            "evaluate",
            "diagnose",
            "export",
            "aligner",
            "vocoder",
            keep={"synthesize": ["griffin_lim_iters"]},
        ),
    shell:
        "python -m pipeline.train --config {params.config:q} --out {output.summary:q} --threads {threads} 2>&1 | tee {log:q}"


# Its output is shown as well as logged (tee, as train's): a sentence cut at synthesize.max_seconds
# is said where the user looks. The one declared output is sentences.json, written last: Snakemake
# deletes a job's outputs before it runs, and the job writes NN.wav/NN.npy beside a temporary folder
# first, so a failing synthesize keeps the previous samples.
rule synthesize:
    input:
        rules.train.output.summary,
        VOCODER,
    output:
        sentences=RUN / "samples/sentences.json",
    log:
        LOGS / "synthesize.log",
    conda:
        "../environment.yml"
    threads: 1  # a few sentences: ~1 core busy
    resources:
        gpu=min(gpus_wanted(), 1),
    params:
        config=config_without("evaluate", "diagnose", "export", "reports_dir"),
        out=RUN / "samples",
    shell:
        "python -m pipeline.synthesize --config {params.config:q} --out {params.out:q} 2>&1 | tee {log:q}"
