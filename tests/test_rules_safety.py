"""What the rules let a config do to the machine and to finished work: a path key never runs as shell,
and a setting changed under a trained run is refused before any job runs."""
import os

import yaml
from conftest import TINY_ALIGNER, TINY_FASTPITCH, edited_copy, load_json, snakemake, write_config

from pipeline import config


def test_a_cache_dir_with_spaces_and_shell_syntax_is_a_folder_name_not_a_command(corpus, tmp_path):
    root, _ = corpus
    marker = tmp_path / "injected"
    odd = tmp_path / f"my cache;touch$IFS{marker};#"  # what `cache={dir: ...}` on the command line can hold
    path = write_config(tmp_path, root, cache={"dir": str(odd), "shards": 2})
    proc = snakemake("caches", config=path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not marker.exists()
    index = load_json(odd / "t" / "index.json")
    assert index["counts"]["clips"] == 24 and (odd / "t" / "mels" / "shard-001.bin").is_file()


def _stamps(run):
    return {p: p.stat().st_mtime_ns for p in sorted(run.rglob("*")) if p.is_file()}


def test_an_audio_change_under_a_trained_run_is_refused_before_any_job_runs(trained_run):
    cache = config.cache_dir(trained_run.cfg)
    before = _stamps(trained_run.run) | _stamps(cache)
    hop = trained_run.cfg["audio"]["hop_length"]
    edited = edited_copy(trained_run.path, "hop.yaml", audio={"hop_length": hop // 2, "win_length": hop * 2})
    for extra in (("-n",), ()):  # planning alone, and a real run: neither starts a job
        proc = snakemake("train", *extra, config=edited, check=False)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        line = [x for x in out.splitlines() if "audio.hop_length changed" in x]
        assert line and f"({hop!r} -> {hop // 2!r})" in line[0] and "Nothing was run" in line[0], out[-3000:]
        assert "name" in line[0] and str(trained_run.run) in line[0]
    assert _stamps(trained_run.run) | _stamps(cache) == before
    assert (trained_run.run / "train.json").is_file()


def test_a_new_seed_under_a_trained_run_is_refused_before_any_job_runs(trained_run):
    # it reran the aligner and every duration shard, then `train` resumed the old seed's checkpoints at
    # train.steps (no step) and reported the run as made with the new seed
    cache = config.cache_dir(trained_run.cfg)
    before = _stamps(trained_run.run) | _stamps(cache)
    seed = trained_run.cfg["train"]["seed"]
    edited = edited_copy(trained_run.path, "seed.yaml", train={"seed": seed + 7})
    proc = snakemake("train", config=edited, check=False)
    out = proc.stdout + proc.stderr
    line = [x for x in out.splitlines() if "train.seed changed" in x]
    assert proc.returncode != 0 and line and f"({seed} -> {seed + 7}" in line[0] and "Nothing was run" in line[0], \
        out[-3000:]
    assert _stamps(trained_run.run) | _stamps(cache) == before


def test_the_same_change_under_another_name_plans_beside_the_trained_run(trained_run):
    cfg = yaml.safe_load(trained_run.path.read_text())
    cfg["name"] = "t-hop"
    cfg["audio"] = {**cfg.get("audio", {}), "hop_length": 128, "win_length": 512}
    edited = trained_run.path.parent / "hop-named.yaml"
    edited.write_text(yaml.safe_dump(cfg))
    proc = snakemake("caches", "-n", "--quiet", "rules", config=edited, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "mel_shard" in proc.stdout + proc.stderr
    assert not os.path.exists(trained_run.run.parent / "t-hop")


def test_a_configfile_with_a_key_given_twice_is_refused_before_planning(tmp_path, corpus):
    root, path = corpus
    text = path.read_text()
    path.write_text(text + "train:\n  steps: 3\ntrain:\n  batch_size: 2\n")
    proc = snakemake("-n", "caches", config=path, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "'train' given twice" in out and str(path) in out, out[-2000:]


def test_a_stale_duration_shard_that_cannot_be_set_aside_stops_planning(corpus, tmp_path):
    # set aside from an input function: its OSError came out as Snakemake's InputFunctionException and a
    # traceback, the stale shard left where training refuses it
    root, _ = corpus
    path = write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": 2}, aligner=TINY_ALIGNER,
                        model={"kind": "fastpitch", "fastpitch": TINY_FASTPITCH})
    snakemake("durations", config=path)
    cache = config.cache_dir(config.load_config(path))
    tokens = cache / "tokens" / "shard-001.json"
    tokens.write_text(tokens.read_text() + "\n")  # other bytes than the durations were aligned to
    if (cache / ".repair").exists():
        os.rename(cache / ".repair", tmp_path / "repair")
    (cache / ".repair").write_text("")  # a file where the folder goes (an unwritable folder is as good)
    proc = snakemake("-n", "durations", config=path, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Nothing to be done" not in out, out[-2000:]
    line = [x for x in out.splitlines() if x.startswith("error:")]
    assert line and str(cache / "durations" / "shard-001.json") in line[0] and "stale" in line[0], out[-2000:]
