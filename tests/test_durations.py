"""The aligner stage end to end: a real `snakemake durations` on a small corpus, then its staleness.

One project is built once for the module (caches, a tiny aligner, a duration shard per shard). The
plan tests edit it, check `snakemake -n durations` plans exactly the stale jobs, and undo the edit.

    python -m pytest -q tests/test_durations.py
"""
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import TINY_ALIGNER, planned_jobs

from pipeline import manifest, shards

SHARDS = 4


@pytest.fixture(scope="module")
def project(aligned_cache):
    tmp = aligned_cache.parent
    return SimpleNamespace(tmp=tmp, root=tmp / "data", config=aligned_cache, cache=tmp / "cache" / "t",
                           meta=tmp / "data" / "metadata.csv")


def plan(p, *extra):
    return planned_jobs(p.config, "durations", *extra)


@pytest.mark.slow
def test_every_clip_has_durations_summing_to_its_mel_frames(project):
    aligner = json.loads(next(Path(project.tmp / "runs/t/aligner").glob("*/aligner.json")).read_text())
    clips = 0
    for k in range(SHARDS):
        dmeta, durations = shards.read(shards.prefix(project.cache, "durations", k), "durations")
        tmeta, _ = shards.read(shards.prefix(project.cache, "tokens", k), "tokens")
        mmeta, mels = shards.read(shards.prefix(project.cache, "mels", k), "mels")
        assert dmeta["ids"] == tmeta["ids"] and dmeta["lengths"] == tmeta["lengths"]
        assert set(dmeta["provenance"]) == {"aligner", "tokens", "mels"}
        assert dmeta["provenance"]["aligner"] == aligner["weights_digest"]
        frames = {cid: len(m) for cid, m in zip(mmeta["ids"], mels)}
        for cid, d in zip(dmeta["ids"], durations):
            assert d.sum() == frames[cid], cid
            assert d.min() >= 1 or frames[cid] < len(d), cid  # every token gets a frame when there are enough
            clips += 1
    assert clips == 24


@pytest.mark.slow
def test_nothing_changed_means_nothing_to_do(project):
    assert plan(project) == {}
    project.meta.touch()
    assert plan(project) == {}


def _clip_in_shard(p, shard):
    for i, line in enumerate(p.meta.read_text().splitlines()):
        if manifest.shard_of(line.split("|")[0], SHARDS) == shard:
            return i, line.split("|")[0]
    raise AssertionError(f"no clip in shard {shard}")


@pytest.mark.slow
def test_text_edit_reruns_its_token_and_duration_shard_not_the_aligner(project):
    original = project.meta.read_bytes()
    lines = original.decode().splitlines()
    i, cid = _clip_in_shard(project, 1)
    lines[i] = "|".join([cid] + [c + " Indeed." for c in lines[i].split("|")[1:]])
    project.meta.write_text("\n".join(lines) + "\n")
    try:
        assert plan(project) == {"token_shard": 1, "cache_index": 1, "duration_shard": 1, "durations": 1}
    finally:
        project.meta.write_bytes(original)
    assert plan(project) == {}


@pytest.mark.slow
def test_replaced_audio_reruns_its_mel_and_duration_shard_not_the_aligner(project):
    _, cid = _clip_in_shard(project, 2)
    wav = project.root / "wavs" / f"{cid}.wav"
    saved = project.tmp / "saved.wav"
    shutil.copy2(wav, saved)
    other = next(w for w in sorted(wav.parent.iterdir()) if w != wav)
    shutil.copy(other, wav)
    try:
        counts = plan(project)
        assert counts.pop("pitch_shard", 1) == 1  # where the pitch cache exists, its shard too
        assert counts == {"mel_shard": 1, "cache_index": 1, "duration_shard": 1, "durations": 1}
    finally:
        os.replace(saved, wav)
    assert plan(project) == {}


@pytest.mark.slow
def test_aligner_setting_retrains_it_and_remakes_every_duration_shard(project):
    counts = planned_jobs(_config_with(project, aligner={**TINY_ALIGNER, "steps": 31}), "durations")
    assert counts == {"train_aligner": 1, "duration_shard": SHARDS, "durations": 1}
    assert plan(project, "--forcerun", "train_aligner") == {"train_aligner": 1, "duration_shard": SHARDS,
                                                            "durations": 1}
    # settings the aligner does not read leave it alone
    other = _config_with(project, model={"kind": "fastpitch", "fastpitch": {"d_model": 64, "heads": 2}},
                         train={"batch_size": 4, "buckets": 2, "steps": 7}, synthesize={"pace": 1.5})
    assert planned_jobs(other, "durations") == {}


def _config_with(p, **sections):
    """The project's config file with some sections replaced, as a new file."""
    cfg = yaml.safe_load(p.config.read_text())
    path = p.tmp / "changed.yaml"
    path.write_text(yaml.safe_dump({**cfg, **sections}))
    return path


@pytest.mark.slow
def test_damaged_duration_shard_fails_the_loader_and_snakemake_durations_rebuilds_exactly_it(project, monkeypatch):
    import tensorflow as tf
    from conftest import snakemake
    from test_staleness import flip_byte

    from pipeline import config as pconfig
    from pipeline import data, errors
    path = project.cache / "durations/shard-001.bin"
    flip_byte(path)  # mtime kept: only the checksum tells
    cfg = pconfig.load_config(project.config)
    with pytest.raises(data.CacheError, match=r"shard-001\.bin: checksum mismatch.*snakemake --cores all durations"):
        shards.read(shards.prefix(project.cache, "durations", 1), "durations")
    # the loader checks the durations' sums in Python when it builds the dataset (shards.read, so the
    # checksum too), and in its graph on every read
    with pytest.raises(data.CacheError, match=r"durations/shard-001\.bin: checksum mismatch.*all durations`"):
        data.build_dataset(cfg, "train", durations=True)
    with monkeypatch.context() as m:
        m.setattr(data, "_check_durations", lambda *args: None)  # past the Python check: the graph's
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            next(iter(data.build_dataset(cfg, "train", durations=True)))
    line = errors._one_line(caught.value)
    assert "durations/shard-001.bin" in line and "run `snakemake --cores all durations`" in line
    assert plan(project) == {"duration_shard": 1, "durations": 1}  # the command it names has work to do
    proc = snakemake("durations", "-n", config=project.config)
    assert "shard=001" in proc.stdout + proc.stderr
    snakemake("durations", config=project.config)
    assert plan(project) == {}
    batch = next(iter(data.build_dataset(cfg, "train", durations=True)))
    assert (batch["durations"].numpy().sum(1) == batch["mel_lengths"].numpy()).all()
