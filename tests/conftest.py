"""Shared fixtures: a small espeak-ng corpus, configs pointing into tmp folders, Snakemake runs.

The corpus is spoken from the first lines of data/ljspeech_transcripts.csv (what the demo uses),
so tests run on real speech through the real cache code.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import snakemake_cli
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's intra-op pool: one thread in every TensorFlow process the tests start (this one, the
# jobs, the workers), and Snakemake gives every job one thread (`--max-threads 1` below). The tests'
# models are tiny, so a second thread mostly waits on the first: alone on the two cores, the placements'
# process took 86-95 CPU s with TensorFlow's default pool and 67 CPU s (67 s wall) with one thread. Three
# pytest workers already share the cores. What threads change in the product: benchmarks/cpu_kernels.py.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
# numpy's OpenBLAS the same: it starts a thread a core, and after each call the idle one spins. A loop
# of 40 five-second mels and small matrix products took 1.3-1.6 CPU s with two threads against 0.46-0.49
# with one, in the same wall time. Snakemake's jobs already get one (OMP_NUM_THREADS=1); this covers the
# test processes and the commands they start themselves.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Python writes a module's bytecode once (__pycache__/, ignored by git) and every later process reads it.
# A shell that sets PYTHONDONTWRITEBYTECODE (some CI images do) had each of the suite's ~840 Python
# processes, the Snakemake runs and the jobs they start, compile the project's modules from source
# again: measured per process, ~0.12 CPU s a Snakemake dry run (0.44 -> 0.32), ~0.1 a cache job, ~0.4 a
# TensorFlow job; about 110 CPU s of the suite's 2,570.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

from pipeline import config, make_corpus  # noqa: E402

TRANSCRIPTS = ROOT / "data" / "ljspeech_transcripts.csv"


@pytest.fixture(scope="session")
def corpus_template(tmp_path_factory):
    """24 clips at 22050 Hz wav, made once per session; copy it before changing anything."""
    out = tmp_path_factory.mktemp("corpus_template")
    make_corpus.make_corpus(TRANSCRIPTS, out, count=24, fmt="wav", sample_rate=22050, jobs=2)
    return out


def write_config(tmp, dataset_root, **overrides):
    """A config file in `tmp` whose caches, runs and reports stay in `tmp`; Griffin-Lim unless a test
    asks for a vocoder (TINY_VOCODER), so acoustic tests train no vocoder."""
    cfg = {"name": "t", "dataset": {"root": str(dataset_root)},
           "cache": {"dir": str(tmp / "cache"), "shards": 4},
           "runs_dir": str(tmp / "runs"), "reports_dir": str(tmp / "reports"), "vocoder": {"kind": "griffin_lim"}}
    for key, value in overrides.items():
        section, _, leaf = key.partition("__")
        if leaf:
            cfg.setdefault(section, {})[leaf] = value
        else:
            cfg[section] = value
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def corpus(tmp_path, corpus_template):
    """A private copy of the template corpus and a config for it: (root, config path)."""
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    return root, write_config(tmp_path, root)


def snakemake(*args, config=None, check=True, cwd=ROOT, cores=2):
    """Run the real snakemake CLI on this project's Snakefile; returns the CompletedProcess (snakemake_cli
    says how it is started). cores=None: no --cores, as a cluster profile's documented command."""
    cmd = ["--snakefile", str(ROOT / "Snakefile"), "--directory", str(cwd)]
    if cores is not None:
        cmd += ["--cores", str(cores), "--max-threads", "1"]
    if Path(cwd) == ROOT:
        # Tests on every xdist worker share the project's .snakemake/ while writing to their own
        # temporary caches. Snakemake's unlock deletes the whole .snakemake/locks/ folder, so a run
        # finishing on one worker can remove it under another's lock write (FileNotFoundError on
        # locks/0.input.lock). The outputs never overlap, so these runs take no lock.
        cmd.append("--nolock")
    cmd += list(args)
    if config:  # last: --configfile takes several values and would swallow a target after it
        cmd += ["--configfile", str(config)]
    proc = snakemake_cli.run(cmd, cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def planned_jobs(config, target="caches", *extra):
    """{rule: count} of the jobs `snakemake -n` would run, from its job-stats table."""
    proc = snakemake(target, *extra, "-n", "--quiet", "rules", config=config)
    counts = {}
    for line in (proc.stdout + proc.stderr).splitlines():
        m = re.match(r"^\s*(\w+)\s+(\d+)\s*$", line)
        if m and m.group(1) not in ("total", "job", "count"):
            counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture(scope="session")
def built_cache(tmp_path_factory, corpus_template):
    """A corpus with its caches built by `snakemake caches`, shared read-only by loader/train tests."""
    tmp = tmp_path_factory.mktemp("built")
    root = tmp / "data"
    shutil.copytree(corpus_template, root)
    cfg_path = write_config(tmp, root, train={"batch_size": 4, "buckets": 2})
    snakemake("caches", config=cfg_path)
    return cfg_path


def killed_job(tmp_path, script):
    """(the files, its stdout, its stderr) that a Python `script` leaves when it ends with os._exit, as a
    killed job would (no exit handlers run), the files being those in its own $TMPDIR: AutoGraph writes
    each function it converts there, and phonemizer copied libespeak-ng there."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "-c", script + "\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n"],
                          check=True, capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp),
                               "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                           os.environ.get("PYTHONPATH")]))})
    return sorted(p.name for p in tmp.iterdir()), proc.stdout, proc.stderr


def left_in_tmpdir(tmp_path, script):
    """The files in its $TMPDIR that a Python `script` ended as a killed job leaves (killed_job)."""
    return killed_job(tmp_path, script)[0]


def load_json(path):
    return json.loads(Path(path).read_text())


TINY_ALIGNER = {"steps": 30, "batch_size": 4, "d_model": 16, "learning_rate": 0.005, "temperature": 1.0}
TINY_VOCODER = {"kind": "vocos", "steps": 10, "learning_rate": 0.001, "finetune_steps": 4, "finetune_recorded": 0.5,
                "finetune_share": 0.75,
                "batch_size": 2, "segment_frames": 16,
                "checkpoint_every": 5, "log_every": 5, "summary_every": 10,
                "vocos": {"dim": 16, "intermediate_dim": 32, "layers": 1, "kernel": 7}}
TINY_FASTPITCH = {"d_model": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ffn_dim": 32,
                  "predictor_channels": 16}

SPEAK = dict(max_seconds=3.0, griffin_lim_iters=4, pace=1.25, pitch_shift=2.0)  # the synthesize: of run_config


def run_config(cache_config, tmp, vocoder=None, **train):
    """A tiny fastpitch run of its own on an already built cache (Griffin-Lim unless `vocoder` is given)."""
    cfg = config.load_config(cache_config)
    path = write_config(tmp, cfg["dataset"]["root"], model={"kind": "fastpitch", "fastpitch": TINY_FASTPITCH},
                        aligner=TINY_ALIGNER, synthesize=SPEAK, vocoder=vocoder or {"kind": "griffin_lim"},
                        train={"batch_size": 4, "buckets": 2, "summary_every": 1000, **train})
    path.write_text(path.read_text().replace(str(tmp / "cache"), cfg["cache"]["dir"]))  # share the built cache
    return path


def write_untrained_checkpoint(path, step):
    """A checkpoint and run.json as the trainer writes them, with no training step: initial weights,
    the cache's statistics, and a duration predictor biased to about 5 frames a token so it speaks."""
    import numpy as np
    import tensorflow as tf

    from pipeline import data, models, runinfo
    cfg = config.load_config(path)
    index = data.read_index(cfg)
    stats = data.feature_stats(cfg, index)
    tf.keras.utils.set_random_seed(0)  # the same initial weights every run: the float16 gap below depends on them
    model = models.build(cfg["model"], index["vocab"], index["n_mels"])
    model(models.dummy_batch(8, 16, index["n_mels"]))
    model.adapt(stats)
    model.duration_predictor.out.bias.assign([np.log(6.0)])
    run = config.run_dir(cfg)
    runinfo.write(run, runinfo.for_training(cfg, index, stats, run, resuming=False))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run / "checkpoints", 1).save(checkpoint_number=step)


def inflate_checkpoint(prefix, weights, factor=1e30):
    """Checkpoint `prefix` rewritten in place with the variables whose names start with `weights` times
    `factor`: finite, as every save checks, but a model already blowing up, whose next step overflows at
    any learning rate. A checkpoint names each variable by its first path: the acoustic model's weights
    are "model/", the vocoder's generator's "g_opt/_trainable_variables/" (its optimizer lists them
    before `generator` does). The optimizer's moments are left as they were."""
    import numpy as np
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(prefix))
    names = sorted(reader.get_variable_to_dtype_map())
    tensors = [reader.get_tensor(n) for n in names]
    scaled = [n.startswith(weights) and t.dtype.kind == "f" for n, t in zip(names, tensors)]
    assert any(scaled), names[:10]
    tensors = [t * np.asarray(factor, t.dtype) if s else t for s, t in zip(scaled, tensors)]
    tf.raw_ops.SaveV2(prefix=str(prefix), tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(t) for t in tensors])


@pytest.fixture(scope="session")
def exported_run(built_cache, tmp_path_factory):
    """(config path, export folder) of an untrained seeded run on built_cache (step 3 of 100),
    exported with --tflite by `python -m pipeline.export`: what test_export.py checks, and the voice
    `speak` and `serve` load (test_speak.py, test_serve.py, test_voice_bounds.py). One export for the
    four files (one worker: TRAINED_RUN below); tests may read it, never change it."""
    tmp = tmp_path_factory.mktemp("voice")
    path = run_config(built_cache, tmp, steps=100)
    write_untrained_checkpoint(path, step=3)
    proc = subprocess.run([sys.executable, "-m", "pipeline.export", "--config", str(path), "--tflite"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return path, config.run_dir(config.load_config(path)) / "export"


@pytest.fixture(scope="session")
def exported_voice(exported_run):
    """The export folder of exported_run: the voice `speak` and `serve` load."""
    return exported_run[1]


@pytest.fixture(scope="session")
def aligned_cache(tmp_path_factory, corpus_template):
    """A corpus with caches, a tiny aligner and duration shards built by `snakemake durations`
    (a tiny fastpitch config); tests that edit it must undo their edits."""
    tmp = tmp_path_factory.mktemp("aligned")
    root = tmp / "data"
    shutil.copytree(corpus_template, root)
    cfg_path = write_config(tmp, root, aligner=TINY_ALIGNER, model={"kind": "fastpitch", "fastpitch": TINY_FASTPITCH},
                            train={"batch_size": 4, "buckets": 2})
    snakemake("durations", config=cfg_path)
    return cfg_path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, corpus_template):
    """A corpus of its own, a tiny aligner, a tiny FastPitch (10 steps) and a tiny Vocos (10 steps + 4 on
    GTA mels) built, trained and synthesized by one real `snakemake synthesize vocoder`. Its own corpus
    and caches, not the aligned corpus's: the tests that edit that one cannot reach it (nor it them),
    in whatever order the test files run. Shared by the vocoder-rule, evaluate and export tests (kept
    on one xdist worker by the scheduler below, so it is built once): they may add what a target makes
    (export, evaluate) but never edit its config or files for good; a test that must change something
    works on a copy (e.g. an edited config written beside it) or restores it."""
    tmp = tmp_path_factory.mktemp("trained_run")
    root = tmp / "data"
    shutil.copytree(corpus_template, root)
    path = write_config(tmp, root, aligner=TINY_ALIGNER, model={"kind": "fastpitch", "fastpitch": TINY_FASTPITCH},
                        train={"batch_size": 4, "buckets": 1, "steps": 10, "checkpoint_every": 10, "log_every": 5,
                               "summary_every": 1000},
                        synthesize={"sentences": ["The quick brown fox."], "max_seconds": 2.0},
                        evaluate={"griffin_lim_iters": 8}, vocoder=TINY_VOCODER,
                        cache__shards=2)  # two GTA jobs, not four: ~20 CPU s less, the same rules
    snakemake("synthesize", "vocoder", config=path)
    cfg = config.load_config(path)
    return SimpleNamespace(tmp=tmp, root=root, path=path, cfg=cfg, run=config.run_dir(cfg))


def edited_copy(path, name, **sections):
    """A copy of config `path` beside it, named `name`, with `sections` ({section: {key: value}}) merged in."""
    cfg = yaml.safe_load(Path(path).read_text())
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    out = Path(path).parent / name
    out.write_text(yaml.safe_dump(cfg))
    return out


# pytest-xdist (`-n 3 --dist loadfile --no-loadscope-reorder`, pyproject.toml) hands each worker a
# whole test file at a time, in the order collected: module fixtures are built once, and the tests of
# a file that build on each other's edits run in order. The scheduler below (xdist's loadfile one,
# grouping by file name) also keeps the files sharing trained_run together, so it is trained once,
# not once per worker, and the files sharing aligned_cache with test_train.py go with it; xdist's own
# `xdist_group` marker cannot do that with pytest 9 (its hook sets a nodeid attribute pytest 9 no
# longer reads). The longest files go first (measured serially: the trained_run files ~11 min,
# test_train ~6, ...), so that no worker is left with a long one at the end.
TRAINED_RUN = {"test_evaluate.py", "test_export.py", "test_vocoder_rules.py", "test_rules_safety.py",
               "test_speak.py", "test_serve.py",  # these two and the next: built_cache and exported_voice,
               "test_voice_bounds.py"}            # built once (the export ~27 CPU s)
ALIGNED = {"test_durations.py", "test_rejected.py"}  # with test_train.py: aligned_cache built once (~26 CPU s)
LONGEST_FIRST = ["trained_run", "test_train.py", "test_voices.py", "test_multiworker.py", "test_staleness.py",
                 "test_failures.py", "test_slurm.py", "test_sources_staleness.py", "test_train_vocoder.py"]


def _group(path):
    name = Path(path).name
    return "trained_run" if name in TRAINED_RUN else "test_train.py" if name in ALIGNED else name


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item.path), len(rank)))  # stable: file order within a group


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return _group(nodeid.split("::", 1)[0])

    return ByGroup(config, log)
