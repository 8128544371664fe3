# Preprocessing: one token_shard and one mel_shard job per shard, then the dataset index.


rule token_shard:
    output:
        bin=CACHE / "tokens/shard-{shard}.bin",
        index=CACHE / "tokens/shard-{shard}.json",
    params:
        config=token_settings,
        rows=token_rows,
        out=lambda wildcards: CACHE / f"tokens/shard-{wildcards.shard}",
    log:
        LOGS / "token_shard/{shard}.log",
    benchmark:
        str(REPORT / "benchmarks/token_shard/{shard}.tsv")
    conda:
        "../environment.yml"
    shell:
        "python -m pipeline.cache tokens --config {params.config:q} --shard {wildcards.shard} --out {params.out} > {log} 2>&1"


# No audio file is an input: Snakemake re-stats every input of every ready job whenever a job
# finishes, which on 13,100 clips was 44 % of the build's CPU. The `clips` param records each
# clip's file, size and mtime instead, so an added, removed or replaced file reruns its shard.
rule mel_shard:
    output:
        bin=CACHE / "mels/shard-{shard}.bin",
        index=CACHE / "mels/shard-{shard}.json",
        stats=CACHE / "mels/shard-{shard}.stats.npy",
    params:
        config=mel_settings,
        clips=mel_clips,
        out=lambda wildcards: CACHE / f"mels/shard-{wildcards.shard}",
    log:
        LOGS / "mel_shard/{shard}.log",
    benchmark:
        str(REPORT / "benchmarks/mel_shard/{shard}.tsv")
    conda:
        "../environment.yml"
    shell:
        "python -m pipeline.cache mels --config {params.config:q} --shard {wildcards.shard} --out {params.out} > {log} 2>&1"


rule cache_index:
    input:
        tokens=expand(CACHE / "tokens/shard-{shard}.json", shard=SHARDS),
        mels=expand(CACHE / "mels/shard-{shard}.json", shard=SHARDS),
        stats=expand(CACHE / "mels/shard-{shard}.stats.npy", shard=SHARDS),
    output:
        index=CACHE / "index.json",
        vocab=CACHE / "vocab.json",
        rejected=CACHE / "rejected.tsv",
    params:
        config=lambda wildcards: _inline(name=NAME, dataset=DS, cache=config["cache"], audio=config["audio"], text=config["text"]),
    log:
        LOGS / "cache_index.log",
    conda:
        "../environment.yml"
    shell:
        "python -m pipeline.cache index --config {params.config:q} --tokens {input.tokens} --mels {input.mels} --out {output.index} > {log} 2>&1"


rule caches:
    input:
        rules.cache_index.output,
    localrule: True
