# Input and params functions of the vocoder (rules/vocoder.smk): each phase's settings and outputs, the GTA shards' settings.


_CACHE_SECTIONS = (
    "name",
    "dataset",
    "cache",
    "audio",
    "text",
    "pitch",
)  # what reading the index checks
_PLACEMENT = (
    "placement",
    "data_device",
    "model_device",
    "jit_compile",
    "mixed_precision",
    "seed",
)


def vocoder_outputs(phase):
    """train_vocoder writes the final runs/{name}/vocoder.json itself when there is no fine-tuning."""
    out = {"summary": RUN / f"vocoder/{phase}.json"}
    if phase == "finetune" or FINETUNE == 0:
        out["final"] = RUN / "vocoder.json"
    return out


def vocoder_settings(phase):
    """The first phase does not see finetune_steps nor the keys of fine-tuning alone (pipeline.vocoder.inputs's
    FINETUNE_ONLY), so changing them reruns fine-tuning alone."""
    v = dict(config["vocoder"])
    if phase == "train":
        for key in ("finetune_steps",) + pvinputs.FINETUNE_ONLY:
            v.pop(key)

    def params(wildcards):
        return _inline(
            **{k: config[k] for k in _CACHE_SECTIONS + ("runs_dir", "reports_dir")},
            train={k: config["train"][k] for k in _PLACEMENT},
            vocoder=v,
        )

    return params


# the code that makes GTA mels: a gta_shard param, so an edit reruns every GTA shard (and the fine-tuning)
GTA_CODE = pshards.code_digest("vocoder/gta.py")[:12]


def gta_settings(wildcards):
    """Teacher-forced GTA speaks no text: synthesize.max_seconds (where text is cut) is not passed."""
    return _inline(**{k: config[k] for k in _CACHE_SECTIONS + ("runs_dir", "model")})
