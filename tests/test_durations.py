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

import numpy as np
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
def test_duration_shards_are_the_tensorflow_aligners_durations(project):
    """The jobs run the aligner in NumPy (no TensorFlow start-up); every clip's durations must be the
    ones the TensorFlow model itself gives (pipeline.align.log_probs, what the jobs ran before)."""
    from pipeline import align, durations
    from pipeline.models import aligner_numpy

    aligner_json = next(Path(project.tmp / "runs/t/aligner").glob("*/aligner.json"))
    model, info = align.load_aligner(None, aligner_json)
    _, weights = aligner_numpy.load(aligner_json)
    assert set(weights) == set(aligner_numpy.arrays_of(model))
    for name, array in aligner_numpy.arrays_of(model).items():  # the .npz holds the .h5's weights
        np.testing.assert_array_equal(weights[name], array, err_msg=name)
    to_id = {ord(s): i for i, s in enumerate(info["vocab"])}
    compared = 0
    for k in range(SHARDS):
        _, written = shards.read(shards.prefix(project.cache, "durations", k), "durations")
        tmeta, tokens = shards.read(shards.prefix(project.cache, "tokens", k), "tokens")
        mmeta, mels = shards.read(shards.prefix(project.cache, "mels", k), "mels")
        mel_of = dict(zip(mmeta["ids"], mels))
        for cid, points, d in zip(tmeta["ids"], tokens, written):
            if cid not in mel_of or len(mel_of[cid]) < len(points):
                continue
            ids = np.array([to_id[int(c)] for c in points], np.int32)
            np.testing.assert_array_equal(d, durations.mas(align.log_probs(model, info, ids, mel_of[cid])), err_msg=cid)
            compared += 1
    assert compared >= 20


def test_a_damaged_or_missing_aligner_npz_stops_the_duration_job_with_one_line(project, tmp_path, capsys):
    from pipeline import durations

    src = next(Path(project.tmp / "runs/t/aligner").glob("*/aligner.json"))
    folder = tmp_path / "aligner"
    shutil.copytree(src.parent, folder)
    args = ["--config", str(project.config), "--shard", "0", "--aligner", str(folder / "aligner.json"),
            "--tokens", str(shards.prefix(project.cache, "tokens", 0).with_suffix(".json")),
            "--mels", str(shards.prefix(project.cache, "mels", 0).with_suffix(".json")),
            "--out", str(tmp_path / "durations/shard-000")]

    def fails(match):
        with pytest.raises(SystemExit) as caught:
            durations.main(args)
        assert caught.value.code != 0
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and match in err and "train_aligner" in err, err
        assert not (tmp_path / "durations").exists()  # nothing written

    data = (folder / "aligner.npz").read_bytes()
    (folder / "aligner.npz").write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    fails("digest")
    (folder / "aligner.npz").unlink()
    fails("missing")
    info = json.loads((folder / "aligner.json").read_text())
    del info["arrays"]
    (folder / "aligner.json").write_text(json.dumps(info))
    fails("older version")


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
        # forced, the aligner retrains on the rebuilt index: Snakemake 9 dropped a --forcerun behind the
        # ancient index input while a shard reruns
        forced = plan(project, "--forcerun", "train_aligner")
        forced.pop("pitch_shard", None)
        assert forced == {"mel_shard": 1, "cache_index": 1, "train_aligner": 1, "duration_shard": SHARDS,
                          "durations": 1}
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


@pytest.mark.slow
def test_a_pitch_change_moves_the_aligner_key_in_the_same_run_as_its_shards(project):
    # train_aligner's params hold `pitch:` (its loader checks the index's provenance); behind the
    # ancient index input Snakemake 9 never checks them while a pitch shard reruns, so the aligner and
    # every duration shard ran one invocation late, after `train` had trained on the old ones
    cfg = yaml.safe_load(project.config.read_text())
    counts = planned_jobs(_config_with(project, pitch={**cfg.get("pitch", {}), "fmax": 550.0}), "durations")
    assert counts == {"pitch_shard": SHARDS, "cache_index": 1, "train_aligner": 1, "duration_shard": SHARDS,
                      "durations": 1}


@pytest.mark.slow
def test_a_shard_edited_before_is_aligned_again_while_another_edit_reruns_the_index(project):
    # edit a line, build the caches (its token shard, not its durations), edit a line of another shard:
    # Snakemake skipped every job behind the aligner's ancient index input once the index reran, so
    # `snakemake durations` remade the second shard's durations and not the first's (exit 0), and
    # `train` stopped on them; a damaged duration shard's repair marker waited a run too
    from conftest import snakemake

    from pipeline import config as pconfig
    from pipeline import data
    original = project.meta.read_bytes()

    def edit(shard):
        lines = project.meta.read_text().splitlines()
        i, cid = _clip_in_shard(project, shard)
        lines[i] = "|".join([cid] + [c + " Indeed." for c in lines[i].split("|")[1:]])
        project.meta.write_text("\n".join(lines) + "\n")

    try:
        edit(1)
        snakemake("caches", config=project.config)
        edit(2)
        assert plan(project) == {"token_shard": 1, "cache_index": 1, "duration_shard": 2, "durations": 1}
        (project.cache / "durations" / "shard-003.bin").unlink()  # its repair marker, in the same run too
        assert plan(project) == {"token_shard": 1, "cache_index": 1, "duration_shard": 3, "durations": 1}
        snakemake("durations", config=project.config)
        assert plan(project) == {}
        data.load_clips(pconfig.load_config(project.config), durations=True)  # every duration shard pairs with its tokens
    finally:
        project.meta.write_bytes(original)
        snakemake("durations", config=project.config)
    assert plan(project) == {}


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


@pytest.mark.slow
def test_durations_of_an_older_token_shard_are_refused_by_the_loader(project):
    # a transcript fixed without changing its token count, its token shard rebuilt by hand
    # (`python -m pipeline.cache tokens ...`) and the durations not: the loader paired the new
    # tokens with durations aligned to the old text
    from pipeline import config as pconfig
    from pipeline import data
    cfg = pconfig.load_config(project.config)
    prefix = shards.prefix(project.cache, "tokens", 1)
    index_path = project.cache / "index.json"
    saved = {s: prefix.with_suffix(s).read_bytes() for s in (".json", ".bin")}
    stat = {s: prefix.with_suffix(s).stat() for s in saved}
    saved_index, index_stat = index_path.read_bytes(), index_path.stat()
    meta, arrays = shards.read(prefix, "tokens")
    arrays[0] = np.roll(arrays[0][:-1], 1).tolist() + [arrays[0][-1]]  # other symbols, as many, end-of-sequence kept
    extra = {k: v for k, v in meta.items() if k not in ("kind", "format", "provenance", "dtype", "width", "ids",
                                                         "lengths", "offsets", "bytes", "checksum", "rejected")}
    new = shards.write(prefix, "tokens", meta["ids"], [np.asarray(a) for a in arrays], provenance=meta["provenance"],
                       rejected=meta["rejected"], **extra)
    index = json.loads(saved_index)
    index["shards"][1]["checksums"]["tokens"] = new["checksum"]  # the index rebuilt too (`python -m pipeline.cache index`)
    index_path.write_text(json.dumps(index))
    try:
        assert shards.read(prefix, "tokens")[0]["lengths"] == meta["lengths"]  # the old check saw nothing
        with pytest.raises(data.CacheError, match=r"durations/shard-001\.json: durations aligned to another "
                                                  r".*tokens/shard-001\.json.*snakemake --cores all durations"):
            data.build_dataset(cfg, "train", durations=True)
        data.build_dataset(cfg, "train")  # without durations the tokens are fine
    finally:
        for s, content in saved.items():
            prefix.with_suffix(s).write_bytes(content)
            os.utime(prefix.with_suffix(s), ns=(stat[s].st_atime_ns, stat[s].st_mtime_ns))
        index_path.write_bytes(saved_index)
        os.utime(index_path, ns=(index_stat.st_atime_ns, index_stat.st_mtime_ns))
    data.build_dataset(cfg, "train", durations=True)
    assert plan(project) == {}


def test_planning_sets_aside_durations_aligned_to_a_mel_or_token_shard_since_rebuilt(tmp_path):
    # a replaced wav rebuilds its mel shard (`snakemake caches`): the duration shard aligned to the old
    # mels no longer pairs with them, and planning (rules/functions/align.smk) must see it, for the mels
    # as for the tokens, naming the one that moved
    tokens, mels, out = tmp_path / "tokens.json", tmp_path / "mels.json", tmp_path / "durations"
    tokens.write_text('{"ids": ["a"]}')
    mels.write_text('{"ids": ["a"], "lengths": [40]}')
    made = {"tokens": shards.file_digest(tokens), "mels": shards.file_digest(mels)}
    (tmp_path / "durations.json").write_text(json.dumps({"provenance": made}))
    assert shards.stale_durations(out, tokens, mels) is None
    mels.write_text('{"ids": ["a"], "lengths": [41]}')
    assert shards.stale_durations(out, tokens, mels) == f"aligned to another {mels} than the one on disk (stale)"
    tokens.write_text('{"ids": ["a", "b"]}')
    assert shards.stale_durations(out, tokens, mels) == f"aligned to another {tokens} and {mels} than the one on disk (stale)"
    assert shards.stale_durations(tmp_path / "absent", tokens, mels) is None  # its own job makes it


def test_a_trained_aligner_records_its_training_and_a_forced_rerun_trains_the_same_weights(project, tmp_path):
    """train_aligner on the project's caches: aligner.json holds the files' digests, the loss history
    (every 25 steps and the last), the mel statistics and vocabulary it trained with and the digest of
    what it trained from; aligner.npz holds the .h5's weights; the seed makes a retrain the same aligner."""
    from pipeline import align, config, data
    from pipeline.models import aligner_numpy, symbols

    cfg = config.load_config(project.config)
    cfg["aligner"] = {**cfg["aligner"], "steps": 2}
    index = data.read_index(cfg)
    out, logged = tmp_path / "aligner" / "k" / "aligner.json", []
    out.parent.mkdir(parents=True)
    info = align.train_aligner(cfg, out, log=logged.append)
    assert json.loads(out.read_text()) == info
    for f in ("weights", "arrays"):
        assert info[f + "_digest"] == shards.file_digest(out.with_name(info[f]))
    assert [h["step"] for h in info["history"]] == [2] and all(np.isfinite(h["forward_sum"]) for h in info["history"])
    mean, std = data.mel_stats(cfg, index)
    assert info["mel_mean"] == mean.tolist() and info["mel_std"] == std.tolist()
    assert info["vocab"] == symbols(index["vocab"]) and info["n_mels"] == index["n_mels"]
    assert info["trained_from"] == align.trained_from(cfg, index)
    for change in ({"aligner": {**cfg["aligner"], "learning_rate": 0.001}}, {"train": {**cfg["train"], "seed": 1}},
                   {"train": {**cfg["train"], "buckets": 3}}):
        assert align.trained_from({**cfg, **change}, index) != info["trained_from"], change
    model, _ = align.load_aligner(cfg, out)
    _, arrays = aligner_numpy.load(out)
    first = aligner_numpy.arrays_of(model)
    assert set(arrays) == set(first)
    for name in arrays:
        np.testing.assert_array_equal(arrays[name], first[name], err_msg=name)
    again = align.train_aligner(cfg, out, log=logged.append)                 # its folder made before: a retrain
    assert "copied_from" not in again and "training anew" in " ".join(logged)
    _, retrained = aligner_numpy.load(out)
    for name in arrays:
        np.testing.assert_allclose(retrained[name], arrays[name], atol=1e-4, err_msg=name)


def test_an_aligner_loss_that_is_not_finite_stops_training_with_one_line(project, tmp_path, monkeypatch):
    from pipeline import align, config, data

    cfg = config.load_config(project.config)
    cfg["aligner"] = {**cfg["aligner"], "steps": 1}
    mean, std = data.mel_stats(cfg)
    monkeypatch.setattr(data, "mel_stats", lambda cfg, index=None: (mean, np.zeros_like(std)))  # silence: inf
    out = tmp_path / "aligner.json"
    with pytest.raises(FloatingPointError, match=r"aligner loss became (nan|inf) at step 1; lower aligner.learning_rate"):
        align.train_aligner(cfg, out, log=lambda *a: None)
    assert not out.exists()


def test_an_aligners_training_digest_follows_its_shards_content_not_their_provenance(project, monkeypatch):
    """trained_from: a shard rebuilt by other code into the same bytes (only its provenance differs) is the
    same training data, so a new aligner key copies the aligner; the same sizes with other bytes (a
    replaced recording of the same length) is not."""
    from pipeline import align, config, data

    cfg = config.load_config(project.config)
    index = data.read_index(cfg)
    before, real, first = align.trained_from(cfg, index), shards.read_meta, index["shards"][0]["mels"]

    def edited(change):
        def read_meta(out, kind=None):
            meta = real(out, kind)
            return {**meta, **change} if kind == "mels" and str(out).endswith(first) else meta
        return read_meta

    monkeypatch.setattr(shards, "read_meta", edited({"provenance": "made by other code"}))
    assert align.trained_from(cfg, index) == before
    monkeypatch.setattr(shards, "read_meta", edited({"checksum": "0123456789abcdef"}))
    assert align.trained_from(cfg, index) != before
