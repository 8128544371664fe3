# Diagnosis: loader alone, step alone, both together; NVML sampling; a plain-words report.
# Depends on the caches (and the duration caches, for models trained on them), not on a finished training run.


# train: keys only the training loop reads (how far it trains, how often it logs, saves and
# summarizes): diagnose builds the trainer and times its step; raising train.steps does not rerun it
TRAINING_LOOP_KEYS = ["steps", "log_every", "checkpoint_every", "summary_every"]


rule diagnose:
    input:
        index=rules.cache_index.output.index,
        durations=train_durations,
    output:
        json=REPORT / "diagnose.json",
        md=REPORT / "diagnose.md",
        png=REPORT / "diagnose.png",
    log:
        LOGS / "diagnose.log",
    conda:
        "../environment.yml"
    threads: 32
    resources:
        gpu=gpus_wanted(),
    params:
        config=config_without(
            "synthesize",
            "evaluate",
            "export",
            "aligner",
            *(() if config["diagnose"]["target"] == "vocoder" else ("vocoder",)),
            omit={"train": TRAINING_LOOP_KEYS},
        ),
        out=REPORT,
    shell:
        "python -m pipeline.diagnose --config {params.config:q} --out {params.out:q} > {log:q} 2>&1"
