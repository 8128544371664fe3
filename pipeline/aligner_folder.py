"""Fill one aligner folder, runs/{name}/aligner/<key>/: with the weights of a sibling folder trained
under the same training key when there is one, else by training (pipeline.align).

The folder's key (rules/functions/align.smk ALIGNER_KEY) holds everything train_aligner's and the
duration shards' params hold, so Snakemake sees any change as a missing output. Three parts of it do
not change what the aligner learns: the `pitch:` section (the aligner's loader checks the index's
provenance with it), aligner.max_token_seconds (it judges the durations made after training) and the
duration shards' code. The rest is the training key (TRAIN_KEY: the
`aligner:` section, the text and audio settings and code, the aligner's code), which was the whole
folder key before. A folder whose training key matches a sibling's is that sibling's aligner: its
weights are copied and the new aligner.json records `copied_from`, as pipeline.align does for a
folder whose caches' content is unchanged. A sibling made before the key had two parts is found by
its folder's name, which is its training key; of several, the newest. A forced train_aligner
(`--forcerun train_aligner`: a folder made before and run again, its `.made` marker; or a new folder
while the run forces the rule, FORCED_ENV) trains.

copy_by_key repeats pipeline.align.copy_trained's copy on purpose: align.py's bytes are part of every
training key, so moving a shared helper into it would retrain every run's aligner once.

    python -m pipeline.aligner_folder --config CFG --out runs/{name}/aligner/<key>/aligner.json --train-key KEY [--threads N]
"""
import argparse
import functools
import json
import os
import shutil
from pathlib import Path

from pipeline import config, files, shards
from pipeline.errors import cli

MADE = ".made"  # pipeline.align.MADE (not imported: align imports TensorFlow, which a copy does not need)
FORCED_ENV = "PIPELINE_FORCED_RULES"  # the rules the Snakemake run forces, comma-separated ("*": all)


def copy_by_key(out, train_key, log):
    """The info of a sibling aligner of `out` trained under `train_key` (recorded in its aligner.json,
    or its folder named by it), copied beside `out`; None if none, or if `out`'s folder was made before."""
    out = Path(out)
    if out.with_name(MADE).exists():
        return None  # a forced rerun: align.train_aligner says so and trains
    for other in _newest_first(out.parent.parent.glob(f"*/{out.name}")):
        if other.parent == out.parent:
            continue
        try:
            info = json.loads(other.read_text(encoding="utf-8"))
            if not isinstance(info, dict) or train_key not in (info.get("train_key"), other.parent.name) or any(
                    shards.file_digest(other.with_name(info[f])) != info[f"{f}_digest"] for f in ("weights", "arrays")):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue                                            # damaged or half-written: not a source
        for f in ("weights", "arrays"):
            source = other.with_name(info[f])
            files.atomic_write(out.with_name(info[f]), lambda tmp, source=source: shutil.copyfile(source, tmp),
                               suffix=source.suffix)
        info = {**info, "copied_from": other.parent.name, "train_key": train_key}
        files.atomic_write_text(out, json.dumps(info, indent=1))
        files.atomic_write_text(out.with_name(MADE), train_key + "\n")
        log(f"aligner: {other.parent} was trained under the same training key ({train_key}; only `pitch:`, "
            f"aligner.max_token_seconds or the duration shards' code differ): copied its weights instead of training again")
        return info
    return None


def _newest_first(paths):
    """aligner.json files, the last written first: of siblings under one training key, the newest is
    what this run last had (an aligner retrained with --forcerun, not the folder it was forced over)."""
    def written(path):
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return 0
    return sorted(paths, key=lambda path: (-written(path), str(path)))


def forced():
    """Whether the Snakemake run that started this job forces train_aligner (--forcerun/-R
    train_aligner, or --forceall): FORCED_ENV, which the run sets before its first job."""
    rules = os.environ.get(FORCED_ENV, "").split(",")
    return "train_aligner" in rules or "*" in rules


def fill(cfg, out, train_key, threads=0, log=functools.partial(print, flush=True)):
    """runs/{name}/aligner/<key>/aligner.json: copied (copy_by_key) or trained (align.train_aligner, on
    `threads` CPU threads, 0: all), with `train_key` recorded in it. A forced train_aligner trains, in
    a new folder too: its `.made` marker is written first, which align.train_aligner reads as a rerun."""
    if forced():
        files.atomic_write_text(Path(out).with_name(MADE), "forced\n")
    elif copied := copy_by_key(out, train_key, log):
        return copied
    import tensorflow as tf  # only to train

    from pipeline import align
    assert align.MADE == MADE
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    align.train_aligner(cfg, out, log=log)
    info = {**json.loads(Path(out).read_text(encoding="utf-8")), "train_key": train_key}
    files.atomic_write_text(out, json.dumps(info, indent=1))
    return info


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Fill one aligner folder: a copy of its sibling trained under "
                                                 "the same training key, else a trained aligner.")
    config.add_arguments(parser)
    parser.add_argument("--out", required=True, help="runs/{name}/aligner/<key>/aligner.json")
    parser.add_argument("--train-key", required=True, help="the training part of the folder's key")
    config.add_threads_argument(parser)
    args = parser.parse_args(argv)
    fill(config.from_args(args), args.out, args.train_key, args.threads)


if __name__ == "__main__":
    main()
