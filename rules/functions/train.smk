# Input and params functions of training (rules/train.smk).


def train_durations(wildcards):
    if not pmodels.needs_durations(config["model"]):
        return []
    # with the aligner's summary: a new aligner key is found from here (rules/functions/align.smk)
    return expand(CACHE / "durations/shard-{shard}.json", shard=SHARDS) + [
        rules.train_aligner.output.summary
    ]
