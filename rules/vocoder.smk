# The vocoder: a first phase on the recorded mels (needs only the caches, so it can run beside
# acoustic training), one gta_shard job per shard (the trained acoustic model, teacher-forced, writes
# mels with the recorded frame counts), then fine-tuning on those when vocoder.finetune_steps > 0.
# Checkpoints live in runs/{name}/vocoder/{train,finetune}/ (not outputs: a rerun resumes from them).


include: "functions/vocoder.smk"


from pipeline.vocoder import inputs as pvinputs, kinds as pvkinds

# the kinds registered with uses_f0 train on F0 from the pitch cache (pipeline/vocoder/kinds.py)
VOCODER_USES_F0 = pvkinds.uses_f0(config["vocoder"])

# said before any job runs, dry runs too: each phase whose checkpoints a changed setting sets aside
for _note in pvinputs.notes(config, VOCODER_USES_F0):
    print(_note, file=sys.stderr)


rule train_vocoder:
    input:
        index=rules.cache_index.output.index,
        audio=shard_files("audio", ".json"),
        audio_bin=shard_files("audio", ".bin"),
        pitch=shard_files("pitch", ".json", ".bin") if VOCODER_USES_F0 else [],
    output:
        **vocoder_outputs("train"),
    log:
        LOGS / "train_vocoder.log",
    benchmark:
        str(REPORT / "benchmarks/train_vocoder.tsv")
    conda:
        "../environment.yml"
    threads: THREADS_BESIDE  # half the cores beside train_aligner (rules/common.smk)
    resources:
        gpu=min(gpus_wanted(), 1),
    params:
        config=vocoder_settings("train"),
        final="--final" if FINETUNE == 0 else "",
    shell:
        "python -m pipeline.vocoder.train --config {params.config:q} --phase train --out {output.summary:q} {params.final} --threads {threads} 2>&1 | tee {log:q}"


# A damaged GTA shard (size or checksum) gets a repair marker in runs/{name}/.repair/ as cache shards
# do (rules/functions/cache.smk `repair`), so the rerun its error message names rebuilds exactly it.
rule gta_shard:
    input:
        repair=repair("gta", root=RUN),
        acoustic=rules.train.output.summary,
    output:
        bin=RUN / "gta/shard-{shard}.bin",
        index=RUN / "gta/shard-{shard}.json",
    log:
        LOGS / "gta_shard/{shard}.log",
    conda:
        "../environment.yml"
    threads: 1  # ~1 core a job (TensorFlow's start-up, then clips 16 at a time); on the CPU, no GPU turn
    params:
        config=gta_settings,
        code=GTA_CODE,
        out=lambda wildcards: RUN / f"gta/shard-{wildcards.shard}",
    shell:
        "python -m pipeline.vocoder.gta --config {params.config:q} --shard {wildcards.shard} --out {params.out:q} > {log:q} 2>&1"


if FINETUNE > 0:

    rule finetune_vocoder:
        input:
            first=RUN / "vocoder/train.json",
            gta=expand(RUN / "gta/shard-{shard}.json", shard=SHARDS),
            pitch=shard_files("pitch", ".json", ".bin") if VOCODER_USES_F0 else [],
        output:
            **vocoder_outputs("finetune"),
        log:
            LOGS / "finetune_vocoder.log",
        benchmark:
            str(REPORT / "benchmarks/finetune_vocoder.tsv")
        conda:
            "../environment.yml"
        threads: 32
        resources:
            gpu=min(gpus_wanted(), 1),
        params:
            config=vocoder_settings("finetune"),
        shell:
            "python -m pipeline.vocoder.train --config {params.config:q} --phase finetune --out {output.summary:q} --final --threads {threads} 2>&1 | tee {log:q}"


rule vocoder:
    input:
        VOCODER,
    localrule: True
