# Export: the latest checkpoint as one SavedModel (token ids -> waveform) that loads with TensorFlow
# alone, its vocab.json and export.json, and the TFLite models when export.tflite is true.
# The one declared output is the export's stamp (pipeline.export.STAMP), written last into the new
# folder before it replaces the old one: Snakemake deletes a job's outputs before it runs, and the
# previous export must stay whole until the new one is (an interrupted export keeps it). The TFLite
# models are not outputs: export leaves out one that fails its check (export.json says why).
# Only the keys the export reads are passed: new synthesize.sentences do not rerun it. With a trained
# vocoder kind the final vocoder (runs/{name}/vocoder.json) is an input: a new vocoder re-exports.

# A kind export cannot build (transformer_tts, a user's own): the default target leaves export out,
# and `snakemake export` (or its output's path) stops before any job, as the export job would after training
EXPORT_PROBLEM = pmodels.export_problem(config["model"])
if EXPORT_PROBLEM and ppreflight.asks_for(
    ppreflight.snakemake_targets(sys.argv), "export", RUN / "export"
):
    stop_planning(EXPORT_PROBLEM)
EXPORT_VOCODER_KEYS = ["kind"] + (
    [config["vocoder"]["kind"]] if VOCODER else []
)  # the model's sizes, to build it


rule export:
    input:
        rules.train.output.summary,
        VOCODER,
    output:
        stamp=RUN / "export/.exported",
    log:
        LOGS / "export.log",
    benchmark:
        str(REPORT / "benchmarks/export.tsv")
    conda:
        "../environment.yml"
    threads: 1  # ~0.7 core busy, on the CPU (pipeline.placement.cpu_only)
    params:
        config=config_without(
            "synthesize",
            "evaluate",
            "diagnose",
            "reports_dir",
            "vocoder",
            keep={
                "synthesize": ["max_seconds", "griffin_lim_iters"],
                "vocoder": EXPORT_VOCODER_KEYS,
            },
        ),
        out=RUN / "export",
    shell:
        "python -m pipeline.export --config {params.config:q} --out {params.out:q} > {log:q} 2>&1"


EXPORTED = [] if EXPORT_PROBLEM else rules.export.output
