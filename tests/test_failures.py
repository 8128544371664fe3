"""Bad input and failures cost no finished work: config values checked before any job starts, a
full disk is one line and leaves no temporary files, a checkpoint interrupted by one keeps the
previous one. Real Snakemake runs where Snakemake's behaviour (deleting a job's outputs) matters.
A failing train or synthesize keeping the previous outputs: tests/test_train.py, on the run it trains.

    python -m pytest -q tests/test_failures.py
"""
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, snakemake
from test_train import tiny_config

from pipeline import config, errors, preflight, shards

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")


def files(folder):
    """{relative path: (mtime_ns, size)} of every file under `folder`."""
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def module(name, *args, cwd=ROOT, env=ENV):
    return subprocess.run([sys.executable, "-m", name, *args], capture_output=True, text=True, cwd=cwd, env=env)


# --- checked before any job starts ------------------------------------------------------------
@pytest.mark.parametrize("override, message", [
    ("text={language: xx-nonexistent}", "text.language: espeak-ng has no voice 'xx-nonexistent'"),
    ("model={kind: 'nonexistent.module:build'}", "model.kind: cannot import 'nonexistent.module'"),
    ("model={kind: 'json:dumps'}", "model.kind: 'json:dumps' does not take (model_cfg, vocab, n_mels)"),
    ("dataset={root: /nonexistent/corpus}", "dataset.root: folder not found"),
    ("model={options: {a: 1}}", "model.options: ['a'] are for a user's own model kind; 'fastpitch' is configured"),
])
def test_bad_values_stop_snakemake_before_any_job_deletes_an_output(built_cache, override, message):
    cache = config.cache_dir(config.load_config(built_cache))
    before = files(cache)
    proc = snakemake("--forcerun", "token_shard", "train", "--config", override, config=built_cache, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and message in out, out[-2000:]
    assert "Select jobs to execute" not in out  # no job started, so none had its outputs deleted
    assert files(cache) == before


def test_an_empty_audio_folder_stops_planning_before_any_shard_is_rewritten(built_cache, tmp_path):
    # an unmounted or emptied folder rewrote every mel and pitch shard with no clip, then failed the
    # index (deleting it); putting the folder back rebuilt them all
    empty = tmp_path / "wavs"
    empty.mkdir()
    cache = config.cache_dir(config.load_config(built_cache))
    before = files(cache)
    proc = snakemake("caches", "--config", f"dataset={{audio_dir: {empty}}}", config=built_cache, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and f"dataset.audio_dir: {empty} holds none of the 24 clips' audio files" in out, out[-2000:]
    assert "Select jobs to execute" not in out and "Traceback" not in out
    assert files(cache) == before


VAL_NONE = "dataset.val_fraction: 0.0 puts none of the 24 clips in the validation split, which evaluate compares"


@pytest.mark.parametrize("targets, override, message", [
    (["evaluate"], "dataset={val_fraction: 0}", VAL_NONE),
    ([], "dataset={val_fraction: 0}", VAL_NONE),  # the default target, all
    (["train", "--forcerun", "evaluate"], "dataset={val_fraction: 0}", VAL_NONE),
    (["train"], "train={balance: speaker}", "train.balance: speaker needs several speakers; the dataset has ['data'] "
                                            "(set train.balance: none)"),
    (["synthesize"], 'synthesize={sentences: ["Hello.", "!!!"]}',  # synthesis's own check, before training
     "synthesize.sentences[1]: '!!!': gives no phonemes (nothing to say)"),
    ([], 'synthesize={sentences: ["Привет"]}', "synthesize.sentences[0]: 'Привет': 'П' (cyrillic capital letter pe)"),
    ([], 'synthesize={sentences: ["Hello.", "Good\\0bye."]}',  # espeak-ng would stop at the NUL
     "synthesize.sentences[1], character 5: control character U+0000 is not plain text"),
])
def test_what_a_late_job_would_refuse_stops_planning(built_cache, targets, override, message):
    # each passed `snakemake -n` and failed after the caches were built and the model trained
    proc = snakemake(*targets, "-n", "--config", override, config=built_cache, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and message in out and "Traceback" not in out, out[-2000:]


@pytest.mark.parametrize("override", ["dataset={val_fraction: 0}", 'synthesize={sentences: ["!!!"]}'])
def test_training_alone_needs_no_validation_clip_nor_sentences(built_cache, override):
    snakemake("train", "-n", "--config", override, config=built_cache)


def test_the_targets_of_a_snakemake_command_line():
    from snakemake import __file__ as package
    main = str(Path(package).parent / "__main__.py")  # `python -m snakemake`
    assert preflight.snakemake_targets([main, "-n", "--cores", "2"]) == {"all"}
    assert preflight.snakemake_targets(["/venv/bin/snakemake", "train", "--forcerun", "evaluate"]) == {"train", "evaluate"}
    # a job Snakemake starts on a cluster node reads the Snakefile again: planning has checked
    assert preflight.snakemake_targets([main, "--mode", "remote", "--target-jobs", "train:"]) is None
    assert preflight.snakemake_targets(["/usr/bin/pytest", "tests"]) is None  # the API: not known


def test_only_a_lock_on_this_runs_own_files_counts_as_another_run(tmp_path):
    # planning marks no shard damaged while another Snakemake holds a lock on this run's cache or run
    # folder (rules/common.smk ANOTHER_RUN); a lock on the files of run `demo2` or `demo-old` is not one
    # on run `demo`'s, whose damaged shards must still be marked and rebuilt
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    cache, run = tmp_path / "cache" / "demo", tmp_path / "runs" / "demo"
    assert not preflight.another_run(locks, [cache, run])
    lock = locks / "0.output.lock"
    for other in (tmp_path / "cache" / "demo2" / "mels" / "shard-000.bin", tmp_path / "runs" / "demo-old" / "train.json"):
        lock.write_text(f"{other}\n")
        assert not preflight.another_run(locks, [cache, run]), other
    for mine in (cache / "mels" / "shard-000.bin", run / "train.json", run):
        lock.write_text(f"{tmp_path / 'elsewhere'}\n{mine}\n")
        assert preflight.another_run(locks, [cache, run]), mine
    assert not preflight.another_run(tmp_path / "no-such-folder", [cache, run])


def test_yaml_syntax_error_is_one_line_with_file_and_line(tmp_path):
    bad = tmp_path / "my.yaml"
    bad.write_text("name: x\ntrain:\n  steps: [1, 2\n  batch_size: 3\n")
    proc = module("pipeline.config", "--config", str(bad))
    assert proc.returncode == errors.EXIT_EXPECTED
    assert proc.stderr.strip().splitlines() == [
        f"error: {bad}:4:13: not valid YAML: did not find expected ',' or ']' (while parsing a flow sequence)"]


@pytest.mark.slow
def test_a_model_kind_with_the_wrong_signature_is_one_line_from_the_job_too(built_cache, tmp_path):
    path = tiny_config(built_cache, tmp_path, model={"kind": "json:dumps"})
    proc = module("pipeline.train", "--config", str(path))
    assert proc.returncode == errors.EXIT_EXPECTED, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: model.kind: 'json:dumps' does not take (model_cfg, vocab, n_mels)")
    assert "Traceback" not in proc.stderr


# --- failures inside a job --------------------------------------------------------------------
# (a failing `snakemake synthesize` and `train` on a trained run: tests/test_train.py, which trains that run)
def test_the_loss_history_keeps_earlier_runs_up_to_the_restored_step(tmp_path):
    from pipeline import train  # TensorFlow, no training
    (tmp_path / "history.jsonl").write_text("".join(json.dumps({"step": k, "total": 1.0 / k}) + "\n"
                                                    for k in (5, 10, 15)))  # killed after step 15, ckpt-10
    assert [r["step"] for r in train.past_history(tmp_path, 10)] == [5, 10]
    assert (tmp_path / "history.jsonl").read_text().count("\n") == 2  # step 15 is trained again


def test_each_logged_loss_is_recorded_at_the_step_it_was_logged_and_the_last_step_saved(tmp_path):
    # history.jsonl (and the summary's history) by step: the resume cuts it back to the restored step
    # (past_history above), and the curves are drawn by it; steps 7 with log_every 3 and checkpoint_every 4
    # log at 3, 6 and 7 (the means of 3, 3 and 1 steps) and save at 4 and 7
    import tensorflow as tf

    from pipeline import train

    class Trainer:  # what run_steps uses of one: the steps' loss terms, the weights it checks before a save, on its model device
        start_step, model_device = 0, "/CPU:0"
        model = type("Model", (), {"variables": [tf.Variable([1.0])]})()
        optimizer = type("Optimizer", (), {"learning_rate": tf.Variable(1e-3), "variables": []})()

        def batches(self):
            while True:
                yield None

        def step(self, batch):
            return {"total": tf.constant(0.5)}

    class Manager:
        latest_checkpoint, saved = None, []

        def save(self, checkpoint_number):
            self.saved.append(checkpoint_number)

    manager, history_file = Manager(), tmp_path / "history.jsonl"
    tcfg = {"steps": 7, "log_every": 3, "checkpoint_every": 4, "summary_every": 1000, "learning_rate": 1e-3}
    step, history, _, _ = train.run_steps(Trainer(), manager, tcfg, False, lambda *a: None, history_file=history_file)
    assert step == 7 and [(r["step"], r["steps"]) for r in history] == [(3, 3), (6, 3), (7, 1)]
    assert [json.loads(line)["step"] for line in history_file.read_text().splitlines()] == [3, 6, 7]
    assert manager.saved == [4, 7]


def test_a_loss_line_torn_by_a_kill_does_not_block_the_resume(tmp_path, capsys):
    from pipeline import train
    (tmp_path / "history.jsonl").write_text(json.dumps({"step": 5, "total": 0.2}) + "\n"
                                            + '{"step": 10, "steps": 10, "total": 0.3')  # kill -9 mid-append
    assert [r["step"] for r in train.past_history(tmp_path, 10)] == [5]
    assert "history.jsonl:2: not a whole JSON line" in capsys.readouterr().out
    assert (tmp_path / "history.jsonl").read_text() == json.dumps({"step": 5, "total": 0.2}) + "\n"


# --- a full disk ------------------------------------------------------------------------------
def test_full_disk_while_writing_a_shard_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", no_space)
    out = tmp_path / "cache/t/mels/shard-000"

    @errors.cli
    def main(argv=None):
        shards.write(out, "mels", ["a"], [np.zeros((7, 4), np.float16)], provenance="p", width=4)

    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == errors.EXIT_EXPECTED
    assert capsys.readouterr().err == (f"error: no space left on device writing {out}.bin; free space and rerun\n")
    assert os.listdir(out.parent) == []  # neither the temporary .shard-000.bin.tmpPID nor a .json


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_disk_while_checkpointing_keeps_the_previous_checkpoint(built_cache, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        path = tiny_config(built_cache, tmp_path, steps=5, checkpoint_every=5, buckets=1)
        path.write_text(path.read_text().replace(str(tmp_path / "runs"), str(disk / "runs")))
        assert module("pipeline.train", "--config", str(path)).returncode == 0
        ckpt = disk / "runs/t/checkpoints"
        size = sum(p.stat().st_size for p in ckpt.glob("ckpt-5.*"))
        free = shutil.disk_usage(disk).free
        (disk / "filler").write_bytes(b"\0" * (free - size // 2))  # room for logs, not for a checkpoint
        path.write_text(path.read_text().replace("steps: 5", "steps: 10"))
        proc = module("pipeline.train", "--config", str(path))
        assert proc.returncode == errors.EXIT_EXPECTED, proc.stderr[-3000:]
        assert proc.stderr.strip().splitlines()[-1].startswith("error: no space left on device writing ")
        assert proc.stderr.strip().splitlines()[-1].endswith("; free space and rerun")
        assert "Traceback" not in proc.stderr
        assert not [p for p in disk.rglob("*") if "_temp" in p.name or ".tmp" in p.name]
        assert not list(ckpt.glob("ckpt-10*"))
        assert 'model_checkpoint_path: "ckpt-5"' in (ckpt / "checkpoint").read_text()  # still the latest
        assert (ckpt / "ckpt-5.index").exists()
    finally:
        subprocess.run(["umount", "-l", str(disk)])
