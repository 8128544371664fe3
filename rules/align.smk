# The aligner stage: train the alignment model once, then one duration_shard job per shard.
# train_aligner sees the cache index as `ancient`: an edited line or a replaced clip rebuilds its own
# shards (and their duration shards) but never retrains the aligner. What does retrain it is named
# in its folder, runs/{name}/aligner/<key>/: a digest of its params (the `aligner:` section, the
# text and audio settings and code: a new vocabulary or mel), its own code and the duration shards'.
# A changed key is a missing output, which the jobs reading the folder directly (train, `durations`)
# find even while a rerun shard upstream keeps Snakemake from checking params behind the ancient
# input; a key that differs only in `pitch:` or the duration code copies the weights
# (pipeline/aligner_folder.py). `snakemake --forcerun train_aligner` retrains on purpose.


include: "functions/align.smk"


rule train_aligner:
    input:
        # str(): ancient() flags its argument in place. Forced, it is not ancient: Snakemake 9 drops a
        # --forcerun behind an ancient input whose job reruns (an edited line), and trains after it
        index=(
            str(rules.cache_index.output.index)
            if FORCED_ALIGNER
            else ancient(str(rules.cache_index.output.index))
        ),
    output:
        summary=ALIGNER / "aligner.json",
        weights=ALIGNER / "aligner.weights.h5",
        arrays=ALIGNER / "aligner.npz",  # the same weights for the duration jobs' NumPy forward pass
    log:
        LOGS / "train_aligner.log",
    benchmark:
        str(REPORT / "benchmarks/train_aligner.tsv")
    conda:
        "../environment.yml"
    threads: THREADS_BESIDE  # half the cores beside train_vocoder (rules/common.smk)
    resources:
        gpu=min(gpus_wanted(), 1),  # TensorFlow trains it on a GPU when one is visible: it takes a turn
    params:
        config=aligner_settings,
        train_key=TRAIN_KEY,
    shell:
        "python -m pipeline.aligner_folder --config {params.config:q} --out {output.summary:q} --train-key {params.train_key:q} --threads {threads} > {log:q} 2>&1"


# Like every cache shard, a damaged duration shard (size or checksum) makes planning write its
# repair marker (rules/functions/cache.smk `repair`), so `snakemake durations` reruns exactly that job.
rule duration_shard:
    input:
        repair=duration_repair,  # a damaged or stale one reruns (rules/functions/align.smk)
        aligner=rules.train_aligner.output.summary,
        tokens=CACHE / "tokens/shard-{shard}.json",
        mels=CACHE / "mels/shard-{shard}.json",
    output:
        bin=CACHE / "durations/shard-{shard}.bin",
        index=CACHE / "durations/shard-{shard}.json",
    log:
        LOGS / "duration_shard/{shard}.log",
    benchmark:
        str(REPORT / "benchmarks/duration_shard/{shard}.tsv")
    conda:
        "../environment.yml"
    threads: 1
    params:
        config=lambda wildcards: _inline(
            name=NAME,
            cache=config["cache"],
            audio=config["audio"],
            aligner=config["aligner"],
        ),
        out=lambda wildcards: CACHE / f"durations/shard-{wildcards.shard}",
        code=DURATION_CODE,
    shell:
        "python -m pipeline.durations --config {params.config:q} --shard {wildcards.shard} --aligner {input.aligner:q} --tokens {input.tokens:q} --mels {input.mels:q} --out {params.out:q} > {log:q} 2>&1"


rule aligner:
    input:
        rules.train_aligner.output,
        rules.cache_index.output.index,  # not ancient here: a rebuilt cache reaches a new aligner key
    localrule: True


rule durations:
    input:
        expand(CACHE / "durations/shard-{shard}.json", shard=SHARDS),
        # a new aligner key is found from here (rules/functions/align.smk); the index, not ancient, so
        # this target is reached when a shard upstream reruns
        rules.train_aligner.output.summary,
        rules.cache_index.output.index,
    localrule: True
