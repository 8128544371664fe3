# Evaluation: the latest checkpoint speaks the validation clips' texts; MCD, length and F0 against
# the recordings, beside Griffin-Lim resynthesis (ceiling) and other sentences (chance).


rule evaluate:
    input:
        rules.train.output.summary,
        VOCODER,
    output:
        json=REPORT / "evaluate.json",
        md=REPORT / "evaluate.md",
        png=REPORT / "evaluate.png",
    log:
        LOGS / "evaluate.log",
    benchmark:
        str(REPORT / "benchmarks/evaluate.tsv")
    priority: 1  # the longest of the DAG's last jobs: it starts first when the cores are short
    conda:
        "../environment.yml"
    threads: 4  # processes that score what the clips sound like (MOS, WER), while this one synthesizes
    resources:
        gpu=min(gpus_wanted(), 1),
    params:
        # the sentences synthesize says are not evaluate's (it speaks the validation clips' texts)
        config=config_without("diagnose", "export", omit={"synthesize": ["sentences"]}),
        out=REPORT,
    shell:
        "python -m pipeline.evaluate --config {params.config:q} --out {params.out:q} --threads {threads} > {log:q} 2>&1"
