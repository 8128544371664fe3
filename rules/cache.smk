# Preprocessing: one token_shard, mel_shard (mels + energy + audio on the mel grid) and pitch_shard job per
# shard, then the index. The audio shards are the vocoder's (rules/vocoder.smk), not the index's.
# Each job's params carry a digest of just its own rows/files and settings (rules/functions/cache.smk); its
# one input is a repair marker that planning writes when the shard is damaged (truncated .bin).


include: "functions/cache.smk"


rule token_shard:
    input:
        repair("tokens"),
    output:
        bin=CACHE / "tokens/shard-{shard}.bin",
        index=CACHE / "tokens/shard-{shard}.json",
    log:
        LOGS / "token_shard/{shard}.log",
    benchmark:
        str(REPORT / "benchmarks/token_shard/{shard}.tsv")
    conda:
        "../environment.yml"
    params:
        config=token_settings,
        rows=token_rows,
        out=lambda wildcards: CACHE / f"tokens/shard-{wildcards.shard}",
    shell:
        "python -m pipeline.cache tokens --config {params.config:q} --shard {wildcards.shard} --out {params.out:q} > {log:q} 2>&1"


# No audio file is an input: Snakemake re-stats every input of every ready job whenever a job
# finishes, which on 13,100 clips was 44 % of the build's CPU. The `clips` param records each
# clip's file, size and mtime instead, so an added, removed or replaced file reruns its shard.
rule mel_shard:
    input:
        repair("mels", "energy", "audio"),
    output:
        bin=CACHE / "mels/shard-{shard}.bin",
        index=CACHE / "mels/shard-{shard}.json",
        stats=CACHE / "mels/shard-{shard}.stats.npy",
        energy_bin=CACHE / "energy/shard-{shard}.bin",
        energy_index=CACHE / "energy/shard-{shard}.json",
        energy_stats=CACHE / "energy/shard-{shard}.stats.npy",
        audio_bin=CACHE / "audio/shard-{shard}.bin",
        audio_index=CACHE / "audio/shard-{shard}.json",
    log:
        LOGS / "mel_shard/{shard}.log",
    benchmark:
        str(REPORT / "benchmarks/mel_shard/{shard}.tsv")
    priority: 1
    conda:
        "../environment.yml"
    params:
        config=mel_settings,
        clips=mel_clips,
        out=lambda wildcards: CACHE / f"mels/shard-{wildcards.shard}",
        energy=lambda wildcards: CACHE / f"energy/shard-{wildcards.shard}",
        audio=lambda wildcards: CACHE / f"audio/shard-{wildcards.shard}",
    shell:
        "python -m pipeline.cache mels --config {params.config:q} --shard {wildcards.shard} --out {params.out:q} --energy {params.energy:q} --audio {params.audio:q} > {log:q} 2>&1"


# The pitch job reads the waveforms the mel job put in the audio shard, when that shard records the
# same clip files and decode settings (pipeline/cache.py, decode_key), else decodes the clips itself:
# the same F0 bytes either way. The audio shard is not an input: an n_mels or fmax edit reruns the mel
# jobs and must not rerun pitch, and Snakemake's ancient() would hide the pitch job's own reasons
# (its params) whenever the mel job reruns too. mel_shard's priority starts the mel jobs first, so
# with fewer cores than jobs the pitch jobs find their audio shards written.
rule pitch_shard:
    input:
        repair("pitch"),
    output:
        bin=CACHE / "pitch/shard-{shard}.bin",
        index=CACHE / "pitch/shard-{shard}.json",
        stats=CACHE / "pitch/shard-{shard}.stats.npy",
    log:
        LOGS / "pitch_shard/{shard}.log",
    benchmark:
        str(REPORT / "benchmarks/pitch_shard/{shard}.tsv")
    conda:
        "../environment.yml"
    params:
        config=pitch_settings,
        clips=pitch_clips,
        out=lambda wildcards: CACHE / f"pitch/shard-{wildcards.shard}",
        audio=lambda wildcards: CACHE / f"audio/shard-{wildcards.shard}",
    shell:
        "python -m pipeline.cache pitch --config {params.config:q} --shard {wildcards.shard} --out {params.out:q} --audio {params.audio:q} > {log:q} 2>&1"


# The inputs are the JSON files of tokens, mels and pitch alone (3 a shard: each is the last file its
# job writes, so a rerun shard reruns the index). Listing every .bin, .json and .stats.npy (11 a
# shard) made Snakemake re-check ~1,400 files as jobs finished. A deleted .bin, .stats.npy or energy
# file is still rebuilt: planning's repair check (rules/functions/cache.smk) reruns a job with a file missing.
# The job finds the shards from the config: one path per input on its command line would overflow
# Linux's 128 KiB limit on one argument (`bash -c ...`) from about 1,000 shards on.
rule cache_index:
    input:
        tokens=shard_files("tokens", ".json"),
        mels=shard_files("mels", ".json"),
        pitch=shard_files("pitch", ".json"),
    output:
        index=CACHE / "index.json",
        vocab=CACHE / "vocab.json",
        rejected=CACHE / "rejected.tsv",
    log:
        LOGS / "cache_index.log",
    conda:
        "../environment.yml"
    params:
        config=index_settings,
    shell:
        "python -m pipeline.cache index --config {params.config:q} --out {output.index:q} > {log:q} 2>&1"


# With dataset.bad_audio: fail, an index whose shards left clips out for bad audio records them, and
# every job that reads it refuses (pipeline.data.read_index); this last job of `caches` refuses too.
# It writes a record, so after a refusal the next `snakemake caches` checks again.
rule caches:
    input:
        rules.cache_index.output,
    output:
        checked=CACHE / "caches.json",
    log:
        LOGS / "caches.log",
    localrule: True
    conda:
        "../environment.yml"
    params:
        config=lambda wildcards: _inline(name=NAME, cache=config["cache"]),
    shell:
        "python -m pipeline.cache check --config {params.config:q} --out {output.checked:q} > {log:q} 2>&1"
