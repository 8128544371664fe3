"""The loader: Python-free graph, exact contents, bucket shapes, and refusal of bad caches."""
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import write_config
from pipeline import audio, config, data, dataset, models, text
from pipeline.graphscan import find_pyfunc_ops


def _cfg(path, **overrides):
    return config.load_config(path, overrides or None)


def test_loader_graph_holds_no_python_ops(built_cache):
    ds = data.build_dataset(_cfg(built_cache), "train")
    assert find_pyfunc_ops(ds) == []
    # the scan itself must see a Python op when there is one, or the assertion above proves nothing
    planted = ds.map(lambda b: dict(b, tokens=tf.numpy_function(lambda t: t, [b["tokens"]], tf.int32)))
    assert any("PyFunc" in op for op in find_pyfunc_ops(planted))


@pytest.mark.parametrize("group_bytes", [data.GROUP_BYTES, 1])  # all shards in one group; a group per shard
def test_loader_returns_the_cached_arrays(built_cache, group_bytes):
    cfg = _cfg(built_cache)
    ids = data.clip_ids(cfg, "all")
    rows = {c.id: c for c in dataset.read_metadata(built_cache.parent / "data" / "metadata.csv")}
    ds = data.build_dataset(cfg, "all", with_clip_index=True, group_bytes=group_bytes)
    seen = []
    r = models.frame_multiple(cfg["model"])
    _, shapes = data.bucket_shapes(cfg)
    for batch in ds:
        assert batch["mel"].dtype == tf.float16 and batch["tokens"].dtype == tf.int32
        t_max, f_max = batch["tokens"].shape[1], batch["mel"].shape[1]
        assert (t_max, f_max) in shapes and f_max % r == 0
        for i, clip in enumerate(batch["clip"].numpy()):
            cid = ids[clip]
            seen.append(cid)
            n_tok, n_frames = int(batch["token_lengths"][i]), int(batch["mel_lengths"][i])
            want_tokens, _ = text.text_to_ids(rows[cid].text, cfg["text"]["cleaners"])
            np.testing.assert_array_equal(batch["tokens"][i, :n_tok].numpy(), want_tokens)
            assert not batch["tokens"][i, n_tok:].numpy().any()  # pad id 0
            wav = dataset.audio_path(cfg["dataset"]["root"], "wavs", cid)
            want_mel = audio.mel_from_file(wav, cfg["audio"], cfg["dataset"]["max_seconds"])
            got = batch["mel"][i, :n_frames].numpy().astype(np.float32)
            np.testing.assert_allclose(got, want_mel, atol=np.abs(want_mel).max() * 2 ** -10)
            assert np.all(batch["mel"][i, n_frames:].numpy() == np.float16(data.PAD_LOG_MEL))
    assert sorted(seen) == sorted(ids)  # every clip exactly once


@pytest.mark.parametrize("group_bytes", [data.GROUP_BYTES, 1])
def test_training_batches_mix_shards_and_have_fixed_shapes(built_cache, group_bytes):
    cfg = _cfg(built_cache)
    ids = data.clip_ids(cfg, "train")
    _, shapes = data.bucket_shapes(cfg)
    shards, per_batch, seen = set(), [], set()
    ds = data.build_dataset(cfg, "train", with_clip_index=True, group_bytes=group_bytes)
    for batch in ds.take(40):
        assert batch["tokens"].shape[0] == cfg["train"]["batch_size"]
        assert (batch["tokens"].shape[1], batch["mel"].shape[1]) in shapes
        batch_shards = {dataset.shard_of(ids[c], cfg["cache"]["shards"]) for c in batch["clip"].numpy()}
        per_batch.append(len(batch_shards))
        shards |= batch_shards
        seen |= set(batch["clip"].numpy().tolist())
    assert len(shards) == cfg["cache"]["shards"]  # every shard is visited
    assert len(seen) > 0.8 * len(ids)              # and (nearly) every clip within a few epochs
    if group_bytes == data.GROUP_BYTES:
        assert max(per_batch) > 1                  # one group: batches mix clips of several shards


@pytest.fixture
def cache_copy(built_cache, tmp_path):
    """A private copy of the built cache that a test may damage."""
    cfg = _cfg(built_cache)
    shutil.copytree(config.cache_dir(cfg), tmp_path / "cache" / cfg["name"])
    path = write_config(tmp_path, cfg["dataset"]["root"], train={"batch_size": 4, "buckets": 2})
    return _cfg(path)


def test_truncated_shard_is_refused(cache_copy):
    mel_bin = config.cache_dir(cache_copy) / "mels" / "shard-001.bin"
    mel_bin.write_bytes(mel_bin.read_bytes()[:-1000])
    with pytest.raises(data.CacheError, match="shard-001.bin.*truncated"):
        data.build_dataset(cache_copy, "train")


def test_shard_whose_lengths_disagree_with_its_bytes_is_refused(cache_copy):
    meta_path = config.cache_dir(cache_copy) / "tokens" / "shard-002.json"
    meta = json.loads(meta_path.read_text())
    meta["lengths"][0] += 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(data.CacheError, match="shard-002.bin"):
        data.build_dataset(cache_copy, "train")


def test_shard_with_other_provenance_is_refused(cache_copy):
    meta_path = config.cache_dir(cache_copy) / "mels" / "shard-000.json"
    meta = json.loads(meta_path.read_text())
    meta["provenance"] = "0123456789abcdef"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(data.CacheError, match="shard-000.bin.*other settings"):
        data.build_dataset(cache_copy, "train")


def test_cache_built_under_other_audio_settings_is_refused(cache_copy):
    changed = config.merge(cache_copy, {"audio": {"n_mels": 64}})
    with pytest.raises(data.CacheError, match="audio"):
        data.build_dataset(changed, "train")
