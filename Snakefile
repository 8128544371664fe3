# Two-stage TTS pipeline: sharded token/mel caches, then training from them, then diagnosis.
#   snakemake --cores all              # caches, aligner, acoustic model, vocoder, samples, reports
#   snakemake --cores all train        # the main job on the shipped demo corpus
#   snakemake -n caches                # shows only the stale shards after a dataset edit
import os

from snakemake.utils import min_version

min_version("9.0")


# the defaults beside this Snakefile, whatever the working folder (`snakemake -s PATH/Snakefile`, or
# --directory): looked up in the working folder, they were skipped without a word there
configfile: os.path.join(workflow.basedir, "configs", "config.yaml")


include: "rules/common.smk"
include: "rules/cache.smk"
include: "rules/align.smk"
include: "rules/train.smk"
include: "rules/vocoder.smk"
include: "rules/evaluate.smk"
include: "rules/diagnose.smk"
include: "rules/export.smk"


rule all:
    default_target: True
    input:
        rules.train.output,
        rules.vocoder.input,
        rules.synthesize.output,
        rules.evaluate.output,
        rules.diagnose.output,
        EXPORTED,


# Snakemake keeps what parsing made (its modules, these rules, the manifest's row per clip) until it
# exits. gc.freeze() (here, and in rules/common.smk before our imports) puts those objects out of the
# cyclic collector's reach, so neither its full collections while the DAG is built nor the ones at
# exit walk them again: ~0.5 s of `snakemake -n train` on 13,100 clips (benchmarks/RESULTS.md).
# Parsing leaves a few dozen unreachable objects, which stay.
import gc

gc.freeze()
