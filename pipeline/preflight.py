"""What can be checked before any job starts: Snakemake calls `preflight(config)` when it reads the
config (rules/common.smk), so a bad value starts no job and so deletes no output.

Checks the dataset paths, that espeak-ng has the voice of `text.language` (phonemes front end), and
that `model.kind` loads (a user's own kind is imported and must take (model_cfg, vocab, n_mels)), and
that a trained run of the same `name` was made with the config's text, audio and pitch settings (else
planning would rebuild its caches in place). Each failure is one line naming the key.
"""
import shutil
import subprocess

from pipeline import config, models, runinfo


def espeak_voices():
    """The voice names espeak-ng (and so phonemizer's espeak backend) accepts, from `espeak-ng --voices`
    (about 20 ms; phonemizer's own check costs half a second of imports); None without the program."""
    program = shutil.which("espeak-ng")
    if program is None:
        return None
    listing = subprocess.run([program, "--voices"], capture_output=True, text=True, check=False).stdout
    return {line.split()[1] for line in listing.splitlines()[1:] if len(line.split()) > 1}


def preflight(cfg):
    """What can be checked before any job starts (Snakemake calls this when it reads the config, so a
    bad value starts no job and so deletes no output): the dataset paths, the espeak-ng voice of
    text.language for the phonemes front end, and a user's model.kind (it imports and takes
    (model_cfg, vocab, n_mels)). ConfigError naming the key."""
    config.check_dataset_paths(cfg)
    if cfg["text"]["frontend"] == "phonemes":
        voices = espeak_voices()
        language = cfg["text"]["language"]
        if voices is not None and language not in voices:
            close = sorted(v for v in voices if v.split("-")[0] == language.split("-")[0])
            raise config.ConfigError(f"text.language: espeak-ng has no voice {language!r}"
                              + (f" (voices of that language: {', '.join(close)})" if close else "")
                              + "; `espeak-ng --voices` lists them")
    models.check_kind(cfg["model"])
    runinfo.check_unchanged(cfg)
