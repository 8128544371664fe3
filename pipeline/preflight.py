"""What can be checked before any job starts: Snakemake calls `preflight(config)` when it reads the
config (rules/common.smk), so a bad value starts no job and so deletes no output.

Checks the dataset paths, that espeak-ng has the voice of `text.language` (phonemes front end), and
that `model.kind` loads (a user's own kind is imported and must take (model_cfg, vocab, n_mels)), and
that a trained run of the same `name` was made with the config's text, audio and pitch settings (else
planning would rebuild its caches in place). Each failure is one line naming the key.
`check_manifest`, once the manifest is read: `train.balance: speaker` needs several speakers, and
for the targets of the `snakemake` command that build them, evaluate needs a validation clip and
synthesize sentences it can speak.
"""
import os
import sys
from pathlib import Path

from pipeline import config, formats, manifest, models, runinfo


def preflight(cfg):
    """What can be checked before any job starts (Snakemake calls this when it reads the config, so a
    bad value starts no job and so deletes no output): the dataset paths, the espeak-ng voice of
    text.language for the phonemes front end, and a user's model.kind (it imports and takes
    (model_cfg, vocab, n_mels)). ConfigError naming the key."""
    config.check_dataset_paths(cfg)
    if cfg["text"]["frontend"] == "phonemes":
        voices = formats.espeak_voices()
        language = cfg["text"]["language"]
        if voices is not None and language not in voices:
            close = sorted(v for v in voices if v.split("-")[0] == language.split("-")[0])
            raise config.ConfigError(f"text.language: espeak-ng has no voice {language!r}"
                              + (f" (voices of that language: {', '.join(close)})" if close else "")
                              + "; `espeak-ng --voices` lists them")
    models.check_kind(cfg["model"])
    runinfo.check_unchanged(cfg)


def snakemake_targets(argv):
    """What a `snakemake` command line (`argv`: sys.argv) builds, read with Snakemake's own parser
    (Snakemake hands the workflow its targets only after it has read the Snakefile): its target rules
    and files, else the default target `all`, and its --forcerun and --until rules, which Snakemake
    adds to them. None when `argv` is no such command: the Python API, or a job Snakemake starts with
    --mode subprocess or remote (on a cluster node), which reads the Snakefile again."""
    if not argv or "snakemake" not in (Path(argv[0]).name, Path(argv[0]).parent.name):
        return None
    from snakemake import cli  # this process is Snakemake
    try:
        args = cli.get_argument_parser().parse_args(argv[1:])
    except (SystemExit, Exception):  # Snakemake read the same line, so not expected
        return None
    if args.mode != args.mode.DEFAULT or args.target_jobs:
        return None
    return {*(args.targets or ["all"]), *args.forcerun, *args.until}


def jobs_find_code(basedir):
    """Put the project's folder (`basedir`, the Snakefile's) first on the jobs' PYTHONPATH, so that their
    `python -m pipeline.X` runs from any working folder (`snakemake -s PATH/Snakefile`, --directory):
    they found no module named 'pipeline' outside the project."""
    os.environ["PYTHONPATH"] = os.pathsep.join([basedir, *filter(None, [os.environ.get("PYTHONPATH")])])


def asks_for(targets, rule, folder):
    """Whether Snakemake `targets` (snakemake_targets) name `rule`, or a file or folder in `folder`
    (where its outputs lie): `snakemake runs/demo/export/.exported` asks for the export as
    `snakemake export` does."""
    root = os.path.abspath(folder)
    return any(t == rule or os.path.abspath(t) == root or os.path.abspath(t).startswith(root + os.sep)
               for t in targets or ())


def another_run(locks, folders):
    """Whether another Snakemake holds a lock on this run's files: a lock file in `locks` (the working
    folder's .snakemake/locks/, where each run lists the files it reads and writes) naming a file
    under one of `folders` (the cache's and the run's). Locks of runs of another `name`, or of other
    projects sharing the folder, are not this run's business."""
    roots = [os.path.abspath(f) for f in folders]
    try:
        held = sorted(Path(locks).glob("*.lock"))
    except OSError:
        return False
    for lock in held:
        try:
            lines = lock.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue  # removed as we read: that run has ended
        for line in lines:
            path = os.path.abspath(line)
            if any(path == root or path.startswith(root + os.sep) for root in roots):
                return True
    return False


def forced_rules(argv):
    """The rules a `snakemake` command line forces (--forcerun/-R), read as snakemake_targets reads
    it; an empty set when `argv` is no such command (a job Snakemake starts reads the Snakefile again)."""
    if snakemake_targets(argv) is None:
        return set()
    from snakemake import cli
    return set(cli.get_argument_parser().parse_args(argv[1:]).forcerun)


def builds(targets, cfg, rule):
    """Whether `targets` (snakemake_targets; None: not known) build rule `evaluate` or `synthesize`:
    by its name, `all`, or a file it writes."""
    files = {"evaluate": [config.report_dir(cfg) / f"evaluate.{x}" for x in ("json", "md", "png")],
             "synthesize": [config.run_dir(cfg) / "samples" / "sentences.json"]}[rule]
    return targets is not None and (bool({"all", rule} & targets) or
                                    any(Path(t).resolve() == f.resolve() for t in targets for f in files))


def voices(cfg, clips):
    """{"speakers", "languages"}: the sorted names the cache's index (and so a run) will list for
    the manifest's `clips`, at most (a job may reject every clip of one)."""
    own = cfg["text"]["language"]
    folder = Path(cfg["dataset"].get("root", ".")).resolve().name  # the single-folder form's one speaker
    return {"speakers": sorted({c.speaker or folder for c in clips}), "languages": sorted({c.language or own for c in clips})}


def cache_rejected(cfg):
    """The ids of the clips the built cache's index left out (its rejected.tsv); none without one."""
    try:
        lines = (config.cache_dir(cfg) / "rejected.tsv").read_text(encoding="utf-8").splitlines()[1:]
    except (OSError, UnicodeDecodeError):
        return set()
    return {line.split("\t", 1)[0] for line in lines if line.strip()}


def check_manifest(cfg, clips_by_shard, targets=None):
    """What the dataset's manifest ({shard: clips}) can refuse before any job (rules/common.smk):
    speakers or languages other than a trained run's (runinfo.check_voices), train.balance: speaker with one speaker, and for `targets` (snakemake_targets) that build them,
    evaluate without a validation clip and synthesize.sentences. ConfigError naming the key."""
    clips = [c for group in clips_by_shard.values() for c in group]
    names = voices(cfg, clips)
    left_out = cache_rejected(cfg)
    runinfo.check_voices(cfg, names, voices(cfg, [c for c in clips if c.id not in left_out]) if left_out else names,
                         log=lambda line: print(line, file=sys.stderr))
    if cfg["train"]["balance"] == "speaker" and len(names["speakers"]) < 2:
        raise config.ConfigError(f"train.balance: speaker needs several speakers; the dataset has "
                                 f"{names['speakers'] or 'one'} (set train.balance: none)")
    fraction = cfg["dataset"]["val_fraction"]
    if builds(targets, cfg, "evaluate") and not any(manifest.is_validation(c.id, fraction) for c in clips):
        raise config.ConfigError(f"dataset.val_fraction: {fraction} puts none of the {len(clips)} clips in the "
                                 "validation split, which evaluate compares with their recordings; raise it "
                                 "(e.g. 0.05), or leave evaluate out (`snakemake train`)")
    if builds(targets, cfg, "synthesize"):
        check_sentences(cfg, names)


def check_audio(cfg, clips_by_shard, audio, twins=None):
    """ConfigError when the manifest lists clips but `audio` ({clip id: its file's stamp, None or
    absent when missing}, what planning digests per shard) finds none of their files, or, with
    dataset.sources, none of one source's: an empty or unmounted folder would rebuild every audio
    shard without those clips (a source's speaker gone from the index), then put them all back once
    the disk returns. Clips missing here and there are left out with their reason by the shard
    jobs, as before. In the single-folder form, also DatasetError for a clip with audio in several
    formats (`twins`, from manifest.audio_files) or two clips that are one file (a link), as
    formats.read_sources refuses for sources."""
    clips = [c for group in clips_by_shard.values() for c in group]
    d = cfg["dataset"]
    if d.get("sources"):
        by_source = {}
        for c in clips:
            by_source.setdefault(c.source, []).append(c)
        for i, src in enumerate(d["sources"]):
            name = formats.source_name(src, i)
            mine = by_source.get(name, [])
            if mine and not any(audio.get(c.id) for c in mine):
                raise config.ConfigError(
                    f"dataset.sources[{i}] ({name}, root {src['root']}): none of its {len(mine)} clips' audio files "
                    f"exists (the first: {mine[0].audio}); is a folder unmounted or moved? nothing was run, the "
                    "caches are as they were")
        return
    folder = Path(d["root"]) / d["audio_dir"]
    # before "none of the files": ids written as file names find none (the first line named)
    for c in sorted((c for c in clips if not audio.get(c.id)), key=lambda c: c.lineno):
        formats.not_a_file_name(c.id, audio.get, folder, manifest.clip_where(d, c))
    if clips and not any(audio.get(c.id) for c in clips):
        raise config.ConfigError(f"dataset.audio_dir: {folder} holds none of the {len(clips)} clips' audio files (an "
                                 f"empty or unmounted folder?); nothing was run, the caches are as they were")
    _check_folder_files(d, clips, audio, twins or {}, folder)


def _check_folder_files(d, clips, audio, twins, folder):
    paths, prefix = {}, os.path.join(folder, "")  # strings, not Paths: 13,100 clips in ~0.05 s
    for c in clips:
        if c.id in twins:
            formats.one_audio_file([prefix + name for name in twins[c.id]], c.id, manifest.clip_where(d, c))
        if audio.get(c.id):
            paths[c.id] = prefix + audio[c.id].partition(":")[0]
        else:  # not in the scan, yet maybe there on a disk that ignores case (a1.wav is A1.wav)
            found = manifest.audio_path(d["root"], d["audio_dir"], c.id)
            if found is not None:
                paths[c.id] = str(found)
    formats.check_same_audio([c for c in clips if c.id in paths], paths, lambda c: manifest.clip_where(d, c))


def check_sentences(cfg, names):
    """What synthesis refuses in synthesize.sentences (synthesize.check_sentences, as the job checks
    them), with the speakers and languages `names` the run will have and the config's vocabulary. The
    phonemes front end costs ~0.12 s (espeak-ng)."""
    from pipeline import synthesize, text  # only when the command synthesizes
    synthesize.check_sentences(cfg["synthesize"], {**names, "vocab": text.vocabulary(cfg["text"])})
