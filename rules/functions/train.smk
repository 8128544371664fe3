# Input and params functions of training (rules/train.smk).


def train_durations(wildcards):
    if not pmodels.needs_durations(config["model"]):
        return []
    return expand(CACHE / "durations/shard-{shard}.json", shard=SHARDS)
