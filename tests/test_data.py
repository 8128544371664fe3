"""The loader: Python-free graph, exact contents, bucket shapes, and refusal of bad caches."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_config

from pipeline import audio, config, data, errors, formats, manifest, models, shards, text
from pipeline.graphscan import find_pyfunc_ops


def _cfg(path, **overrides):
    return config.load_config(path, overrides or None)


def test_loader_graph_holds_no_python_ops(built_cache):
    ds = data.build_dataset(_cfg(built_cache), "train")
    assert find_pyfunc_ops(ds) == []
    # the scan itself must see a Python op when there is one, or the assertion above proves nothing
    planted = ds.map(lambda b: dict(b, tokens=tf.numpy_function(lambda t: t, [b["tokens"]], tf.int32)))
    assert any("PyFunc" in op for op in find_pyfunc_ops(planted))


def test_loaders_run_without_the_autotuner(built_cache):
    """Deleting an iterator whose autotuner sleeps (up to 60 s) sometimes waited out the sleep: a
    training job idled that long after its last checkpoint. Every loader the trainers iterate is
    untuned (data.loader_options), the multi-worker one too, and ordered: every run of a config trains
    on its seeded shuffle's batches, whatever the threads' timing."""
    cfg = _cfg(built_cache)
    for ds in (data.build_dataset(cfg, "train"), data.build_dataset(cfg, "val"),
               data.build_dataset(cfg, "train", worker=(0, 2))):
        assert ds.options().autotune.enabled is False and ds.options().deterministic is True


def test_training_batches_come_in_the_seeds_order_every_time(built_cache):
    """Two loaders of one config give the same shuffled batches in the same order (what lets a
    training run repeat itself bit for bit); another seed gives another order."""
    def batches(cfg):
        return [(b["mel_lengths"].numpy().tolist(), b["tokens"].numpy().tolist())
                for b in data.build_dataset(cfg, "train").take(24)]
    cfg = _cfg(built_cache)
    first = batches(cfg)
    assert batches(cfg) == first
    assert batches(_cfg(built_cache, train={"seed": cfg["train"]["seed"] + 1})) != first


@pytest.mark.parametrize("group_bytes", [data.GROUP_BYTES, 1])  # all shards in one group; a group per shard
def test_loader_returns_the_cached_arrays(built_cache, group_bytes):
    cfg = _cfg(built_cache)
    ids = data.clip_ids(cfg, "all")
    rows = {c.id: c for c in formats.read_metadata(built_cache.parent / "data" / "metadata.csv")}
    ds = data.build_dataset(cfg, "all", with_clip_index=True, group_bytes=group_bytes)
    seen = []
    r = models.frame_multiple(cfg["model"])
    _, shapes = data.bucket_shapes(cfg)
    vocab = data.read_index(cfg)["vocab"]
    cached = {}  # id -> (pitch, energy) read back with NumPy through the shard format
    for k in range(cfg["cache"]["shards"]):
        p_meta, p_arrays = shards.read(shards.prefix(config.cache_dir(cfg), "pitch", k), "pitch")
        e_meta, e_arrays = shards.read(shards.prefix(config.cache_dir(cfg), "energy", k), "energy")
        assert p_meta["ids"] == e_meta["ids"]
        cached.update({cid: (p, e) for cid, p, e in zip(p_meta["ids"], p_arrays, e_arrays)})
    for batch in ds:
        assert batch["mel"].dtype == tf.float16 and batch["tokens"].dtype == tf.int32
        assert batch["pitch"].dtype == tf.float32 == batch["energy"].dtype
        t_max, f_max = batch["tokens"].shape[1], batch["mel"].shape[1]
        assert (t_max, f_max) in shapes and f_max % r == 0
        assert batch["pitch"].shape == batch["energy"].shape == batch["mel"].shape[:2]
        for i, clip in enumerate(batch["clip"].numpy()):
            cid = ids[clip]
            seen.append(cid)
            n_tok, n_frames = int(batch["token_lengths"][i]), int(batch["mel_lengths"][i])
            np.testing.assert_array_equal(batch["tokens"][i, :n_tok].numpy(), text.encode(rows[cid].text, vocab))
            assert not batch["tokens"][i, n_tok:].numpy().any()  # pad id 0
            wav = manifest.audio_path(cfg["dataset"]["root"], "wavs", cid)
            want_mel = audio.mel_from_file(wav, cfg["audio"], cfg["dataset"]["max_seconds"])
            got = batch["mel"][i, :n_frames].numpy().astype(np.float32)
            np.testing.assert_allclose(got, want_mel, atol=np.abs(want_mel).max() * 2 ** -10)
            assert np.all(batch["mel"][i, n_frames:].numpy() == np.float16(data.PAD_LOG_MEL))
            np.testing.assert_array_equal(batch["pitch"][i, :n_frames].numpy(), cached[cid][0])
            np.testing.assert_array_equal(batch["energy"][i, :n_frames].numpy(), cached[cid][1])
            assert not batch["pitch"][i, n_frames:].numpy().any() and not batch["energy"][i, n_frames:].numpy().any()
    assert sorted(seen) == sorted(ids)  # every clip exactly once


@pytest.mark.parametrize("group_bytes", [data.GROUP_BYTES, 1])
def test_training_batches_mix_shards_and_have_fixed_shapes(built_cache, group_bytes):
    cfg = _cfg(built_cache)
    ids = data.clip_ids(cfg, "train")
    _, shapes = data.bucket_shapes(cfg)
    visited, per_batch, seen = set(), [], set()
    ds = data.build_dataset(cfg, "train", with_clip_index=True, group_bytes=group_bytes)
    for batch in ds.take(40):
        assert batch["tokens"].shape[0] == cfg["train"]["batch_size"]
        assert (batch["tokens"].shape[1], batch["mel"].shape[1]) in shapes
        batch_shards = {manifest.shard_of(ids[c], cfg["cache"]["shards"]) for c in batch["clip"].numpy()}
        per_batch.append(len(batch_shards))
        visited |= batch_shards
        seen |= set(batch["clip"].numpy().tolist())
    assert len(visited) == cfg["cache"]["shards"]  # every shard is visited
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


def test_cache_of_an_older_format_is_refused_with_what_to_run(cache_copy):
    path = config.cache_dir(cache_copy) / "index.json"
    index = json.loads(path.read_text())
    index["format"] = 1  # a cache from before phonemes, pitch and energy
    path.write_text(json.dumps(index))
    with pytest.raises(data.CacheError, match=r"format 1 .*snakemake --cores all caches"):
        data.build_dataset(cache_copy, "train")


def _plant_durations(cfg, reject=()):
    """Duration shards as the aligner stage writes them (shards.write), each clip's frames shared among
    its tokens at random, the clips `reject` lists under `rejected`; {id: its durations}."""
    root, rng, planted = config.cache_dir(cfg), np.random.default_rng(0), {}
    for k in range(cfg["cache"]["shards"]):
        tok = shards.read_meta(shards.prefix(root, "tokens", k), "tokens")
        mel = shards.read_meta(shards.prefix(root, "mels", k), "mels")
        frames = dict(zip(mel["ids"], mel["lengths"]))
        arrays = []
        for cid, n in zip(tok["ids"], tok["lengths"]):  # n tokens sharing the clip's frames at random
            cuts = np.sort(rng.integers(0, frames[cid] + 1, n - 1))
            arrays.append(np.diff(np.concatenate([[0], cuts, [frames[cid]]])).astype(np.int32))
            planted[cid] = arrays[-1]
        made_from = {kind: shards.file_digest(shards.prefix(root, kind, k).with_suffix(".json")) for kind in ("tokens", "mels")}
        rejected = [dict(id=cid, path="planted", stage="durations", reason="planted") for cid in tok["ids"] if cid in reject]
        shards.write(shards.prefix(root, "durations", k), "durations", tok["ids"], arrays, provenance=made_from,
                     rejected=rejected)
    return planted


def test_planted_duration_shards_load_through_build_dataset(cache_copy):
    """The aligner stage writes durations with shards.write; build_dataset(durations=True) reads them."""
    root = config.cache_dir(cache_copy)
    with pytest.raises(data.CacheError, match="durations/shard-000.json: shard missing; run `snakemake --cores all durations`"):
        data.build_dataset(cache_copy, "train", durations=True)
    planted = _plant_durations(cache_copy)
    ids = data.clip_ids(cache_copy, "all")
    ds = data.build_dataset(cache_copy, "all", durations=True, with_clip_index=True)
    seen = 0
    for batch in ds:
        assert batch["durations"].dtype == tf.int32 and batch["durations"].shape == batch["tokens"].shape
        np.testing.assert_array_equal(tf.reduce_sum(batch["durations"], 1), batch["mel_lengths"])
        for i, clip in enumerate(batch["clip"].numpy()):
            n = int(batch["token_lengths"][i])
            np.testing.assert_array_equal(batch["durations"][i, :n], planted[ids[clip]])
            seen += 1
    assert seen == len(ids)
    # durations whose provenance names no token and mel shard are not vouched for
    meta, arrays = shards.read(shards.prefix(root, "durations", 2), "durations")
    shards.write(shards.prefix(root, "durations", 2), "durations", meta["ids"], arrays, provenance="planted")
    with pytest.raises(data.CacheError, match=r"durations/shard-002\.json: durations aligned to another .*tokens"):
        data.build_dataset(cache_copy, "train", durations=True)
    shards.write(shards.prefix(root, "durations", 2), "durations", meta["ids"], arrays, provenance=meta["provenance"])
    # durations that no longer sum to the mel (stale after a mel rebuild) are refused
    meta, arrays = shards.read(shards.prefix(root, "durations", 1), "durations")
    arrays[0] = arrays[0] + 1
    shards.write(shards.prefix(root, "durations", 1), "durations", meta["ids"], arrays, provenance=meta["provenance"])
    with pytest.raises(data.CacheError, match=f"durations of {meta['ids'][0]} sum to .*snakemake --cores all durations"):
        data.build_dataset(cache_copy, "train", durations=True)


def test_the_clip_field_names_the_clip_whose_fields_it_carries_with_durations(cache_copy):
    """clip_ids(cfg, split)[clip] is the clip a row's tokens, mel and durations are, also when the
    duration shards reject a clip; before, the field indexed the list less the rejects, so every
    clip after one named its neighbour."""
    first = data.clip_ids(cache_copy, "all")[0]
    planted = _plant_durations(cache_copy, reject={first})
    ids = data.clip_ids(cache_copy, "all")
    seen = []
    for batch in data.build_dataset(cache_copy, "all", durations=True, with_clip_index=True):
        for i, clip in enumerate(batch["clip"].numpy()):
            seen.append(ids[clip])
            np.testing.assert_array_equal(batch["durations"][i, :batch["token_lengths"][i]], planted[ids[clip]])
    assert sorted(seen) == sorted(set(ids) - {first})


def test_a_cut_short_index_is_one_line_naming_it(cache_copy):
    path = config.cache_dir(cache_copy) / "index.json"
    path.write_text(path.read_text()[:3000])
    with pytest.raises(data.CacheError, match=r"index\.json: unreadable .*snakemake --cores all caches"):
        data.build_dataset(cache_copy, "train")


def test_a_deleted_rejected_tsv_is_one_line_naming_it(cache_copy):
    # the trainer lists the cache's left-out clips in runs/{name}/rejected.tsv: with the cache's file
    # deleted (a log, it looks like) `python -m pipeline.train` stopped with a FileNotFoundError traceback
    path = config.cache_dir(cache_copy) / "rejected.tsv"
    assert data.left_out(cache_copy) == []                                      # the built cache rejected none
    path.unlink()
    with pytest.raises(data.CacheError, match=rf"^{re.escape(str(path))}: missing .*`snakemake --cores all caches "
                                             r"--forcerun cache_index` \(it rebuilds no shard\)$"):
        data.left_out(cache_copy)


def test_a_shard_json_whose_offsets_are_not_its_lengths_sums_is_refused(cache_copy):
    # the checksum covers the .bin only: an offset moved in the JSON read one clip's mel from inside the next's
    meta_path = config.cache_dir(cache_copy) / "mels" / "shard-003.json"
    meta = json.loads(meta_path.read_text())
    meta["offsets"][1] += 10
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(data.CacheError, match=r"mels/shard-003\.json: its offsets are not its lengths' running sums"):
        data.build_dataset(cache_copy, "train")


def test_a_shard_json_that_repeats_an_id_is_refused(cache_copy):
    # the checksum covers the .bin only: a JSON naming one clip twice would train on one clip's arrays
    # under two entries and lose the other clip
    meta_path = config.cache_dir(cache_copy) / "pitch" / "shard-001.json"
    meta = json.loads(meta_path.read_text())
    meta["ids"][1] = meta["ids"][0]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(data.CacheError, match=r"pitch/shard-001\.json: .*or an id repeats"):
        data.build_dataset(cache_copy, "train")
    with pytest.raises(shards.CacheError, match=r"or an id repeats"):
        shards.read(meta_path.with_suffix(""), "pitch")


@pytest.mark.parametrize("edit", ["one id fewer", "one id more", "lengths swapped", "a negative length",
                                  "another dtype", "no checksum"])
def test_a_shard_json_that_disagrees_with_itself_is_refused(cache_copy, edit):
    # the .bin's size and checksum still agree with these JSONs: an id fewer shifted every later clip onto
    # another's offsets, swapped lengths gave one clip's frames to the next, a float32 dtype read float16 mels
    meta_path = config.cache_dir(cache_copy) / "mels" / "shard-002.json"
    meta = json.loads(meta_path.read_text())
    if edit == "one id fewer":
        meta["ids"].pop()
    elif edit == "one id more":
        meta["ids"].append("zz-extra")
    elif edit == "lengths swapped":
        meta["lengths"][:2] = meta["lengths"][1::-1]
        meta["offsets"] = shards.offsets(meta["lengths"])
        assert meta["lengths"][0] != meta["lengths"][1]
    elif edit == "a negative length":
        meta["lengths"][:2] = [-1, meta["lengths"][0] + meta["lengths"][1] + 1]
        meta["offsets"] = shards.offsets(meta["lengths"])
    elif edit == "another dtype":
        meta["dtype"], meta["width"] = "<f4", meta["width"] // 2
        meta["bytes"] = shards.expected_bytes(meta)
    else:
        del meta["checksum"]
    meta_path.write_text(json.dumps(meta))
    said = r"no checksum \(a damaged" if edit == "no checksum" else r"its ids and lengths disagree in number"
    if edit == "lengths swapped":
        with pytest.raises(data.CacheError):   # the durations and energy no longer agree: refused before too
            data.build_dataset(cache_copy, "train")
        return
    with pytest.raises(shards.CacheError, match=rf"mels/shard-002\.json: {said}"):
        shards.read(meta_path.with_suffix(""), "mels")
    with pytest.raises(data.CacheError, match=r"mels/shard-002"):
        data.build_dataset(cache_copy, "train")


def test_a_cut_short_stats_file_is_one_line_saying_what_to_do(tmp_path):
    from pipeline import cache
    path = tmp_path / "shard-000.stats.npy"
    np.save(path, np.ones((4, 3)))
    written = shards.checksum(path.read_bytes())
    assert cache._stats(path, 4, written).shape == (4, 3)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(shards.CacheError, match=r"shard-000\.stats\.npy: damaged \(.*\); delete it and run "
                                                r"`snakemake --cores all caches`"):
        cache._stats(path, 4, written)
    np.save(path, np.ones((3, 3)))
    with pytest.raises(shards.CacheError, match=r"damaged \(float64 \(3, 3\), not 4 rows of float64\)"):
        cache._stats(path, 4, shards.checksum(path.read_bytes()))


def test_a_shard_of_another_kind_where_one_belongs_is_refused(cache_copy):
    # a mels shard copied over a pitch shard (both files, so sizes and checksums agree with each other)
    root = config.cache_dir(cache_copy)
    for suffix in (".json", ".bin"):
        shutil.copyfile(root / "mels" / f"shard-002{suffix}", root / "pitch" / f"shard-002{suffix}")
    with pytest.raises(shards.CacheError, match=r"pitch/shard-002\.json: a mels shard where a pitch shard belongs"):
        shards.read(root / "pitch" / "shard-002", "pitch")
    with pytest.raises(data.CacheError, match=r"pitch/shard-002"):
        data.build_dataset(cache_copy, "train")


@pytest.mark.parametrize("index_records_checksums", [True, False])
def test_an_index_older_than_its_shards_is_refused(cache_copy, index_records_checksums):
    # a shard rebuilt by hand (or `snakemake caches` stopped before cache_index): the index's clip
    # lists, statistics and exclusions describe other shards, and the loader trained on the mix
    from pipeline import shards
    root = config.cache_dir(cache_copy)
    index_path = root / "index.json"
    index = json.loads(index_path.read_text())
    assert all("checksums" in entry for entry in index["shards"])  # what cache_index writes now
    if not index_records_checksums:  # an index written before they were recorded: the clip count still tells
        for entry in index["shards"]:
            entry.pop("checksums")
        index_path.write_text(json.dumps(index))
    data.build_dataset(cache_copy, "train")
    prefix = root / "tokens" / "shard-001"
    meta, arrays = shards.read(prefix, "tokens")
    extra = {k: (v[1:] if isinstance(v, list) and len(v) == len(meta["ids"]) else v) for k, v in meta.items()
             if k not in ("kind", "format", "provenance", "dtype", "width", "ids", "lengths", "offsets", "bytes",
                          "checksum", "rejected")}
    shards.write(prefix, "tokens", meta["ids"][1:], arrays[1:], provenance=meta["provenance"], **extra)  # one clip fewer
    match = r"tokens/shard-001\.bin than the one on disk" if index_records_checksums else r"counts \d+ usable clips in shard 1"
    with pytest.raises(data.CacheError, match=rf"index\.json: .*{match}.*snakemake --cores all caches"):
        data.build_dataset(cache_copy, "train")


def test_a_flipped_byte_in_a_later_shard_group_fails_the_first_read(cache_copy):
    # with a group per shard, every group's first read is checked, not only the first group's
    path = config.cache_dir(cache_copy) / "mels" / "shard-003.bin"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"mels/shard-003\.bin.*checksum mismatch"):
        for _ in data.build_dataset(cache_copy, "all", group_bytes=1):
            pass


@pytest.mark.parametrize("kind", ["mels", "energy", "pitch"])
def test_an_index_older_than_a_rebuilt_frame_shard_is_refused(cache_copy, kind):
    # the same clips and lengths, other bytes (a shard rebuilt after the index): every kind's checksum is compared
    prefix = config.cache_dir(cache_copy) / kind / "shard-001"
    meta, arrays = shards.read(prefix, kind)
    arrays[0] = arrays[0] + 1
    extra = {k: v for k, v in meta.items() if k not in ("kind", "format", "provenance", "dtype", "width", "ids",
                                                        "lengths", "offsets", "bytes", "checksum", "rejected")}
    shards.write(prefix, kind, meta["ids"], arrays, provenance=meta["provenance"], width=meta["width"], **extra)
    with pytest.raises(data.CacheError, match=rf"index\.json: built from another .*{kind}/shard-001\.bin"):
        data.build_dataset(cache_copy, "train")


def test_pitch_frames_that_are_not_the_mels_are_refused(cache_copy):
    root = config.cache_dir(cache_copy)
    prefix = root / "pitch" / "shard-001"
    meta, arrays = shards.read(prefix, "pitch")
    arrays[0] = np.concatenate([arrays[0], [0.0]]).astype(np.float32)  # one frame more than its mel
    new = shards.write(prefix, "pitch", meta["ids"], arrays, provenance=meta["provenance"])
    index_path = root / "index.json"
    index = json.loads(index_path.read_text())
    index["shards"][1]["checksums"]["pitch"] = new["checksum"]  # an index that vouches for it
    index_path.write_text(json.dumps(index))
    with pytest.raises(data.CacheError, match=rf"pitch/shard-001\.json: {meta['ids'][0]} has \d+ pitch frames but "
                                              r"\d+ mel frames"):
        data.load_clips(cache_copy)


def test_durations_for_other_token_counts_are_refused(cache_copy):
    root = config.cache_dir(cache_copy)
    for k in range(cache_copy["cache"]["shards"]):
        tok = shards.read_meta(shards.prefix(root, "tokens", k), "tokens")
        mel = shards.read_meta(shards.prefix(root, "mels", k), "mels")
        frames = dict(zip(mel["ids"], mel["lengths"]))
        arrays = []
        for cid, n in zip(tok["ids"], tok["lengths"]):
            d = np.full(n + (k == 1 and not arrays), 0, np.int32)  # shard 1's first clip: one token too many
            d[-1] = frames[cid]
            arrays.append(d)
        made_from = {kind: shards.file_digest(shards.prefix(root, kind, k).with_suffix(".json"))
                     for kind in ("tokens", "mels")}
        shards.write(shards.prefix(root, "durations", k), "durations", tok["ids"], arrays, provenance=made_from)
    with pytest.raises(data.CacheError, match=r"durations/shard-001\.json: durations for other clips or tokens"):
        data.load_clips(cache_copy, durations=True)


@pytest.mark.parametrize("reduction", [3, 4, 7])
def test_bucket_shapes_hold_their_longest_clip_rounded_up_to_the_frame_multiple(built_cache, reduction):
    cfg = _cfg(built_cache, model={"kind": "transformer_tts", "transformer_tts": {"reduction": reduction}})
    edges, shapes = data.bucket_shapes(cfg)
    clips = data.load_clips(cfg, "all")[0]
    bucket = np.searchsorted(edges, clips.frames)
    for b, (tokens, frames) in enumerate(shapes):
        assert frames % reduction == 0
        assert frames >= clips.frames[bucket == b].max() and tokens >= clips.n_tokens[bucket == b].max()


def test_one_pass_over_several_groups_gives_every_training_clip(built_cache):
    # complete batches: each bucket's rows are topped up to a multiple of the batch, so none is dropped
    cfg = _cfg(built_cache)
    ids = data.clip_ids(cfg, "train")
    seen = set()
    for batch in data.build_dataset(cfg, "train", repeat=False, group_bytes=1, with_clip_index=True):
        assert batch["tokens"].shape[0] == cfg["train"]["batch_size"]
        seen |= set(batch["clip"].numpy().tolist())
    assert seen == set(range(len(ids)))


def test_a_loader_of_several_groups_mixes_new_batches_every_epoch(built_cache):
    """A cache read in several shard groups (over GROUP_BYTES: LJSpeech is two) reshuffles each group's
    rows every epoch, as a one-group loader does; before, every epoch repeated the first one's batches,
    clip for clip. In a process with a global seed too, as every trainer's (a tensor seed for the shuffle
    failed there in tf.data's seed check)."""
    cfg = _cfg(built_cache, train={"batch_size": 2, "buckets": 2})
    try:
        for global_seed in (None, 0, 3):  # 0: tf.data compares the seed pair with (0, 0)
            tf.random.set_seed(global_seed)
            one_epoch = [tuple(sorted(b["clip"].numpy().tolist()))
                         for b in data.build_dataset(cfg, "train", repeat=False, group_bytes=1, with_clip_index=True)]
            three = [tuple(sorted(b["clip"].numpy().tolist())) for b in
                     data.build_dataset(cfg, "train", group_bytes=1, with_clip_index=True).take(3 * len(one_epoch))]
            assert set(one_epoch) <= set(three)
            assert len(set(three)) > len(set(one_epoch))  # the later epochs pair other clips
    finally:
        tf.random.set_seed(None)


@pytest.mark.parametrize("split", ["validation", "test", "Val"])
def test_a_split_name_no_loader_knows_is_refused_not_read_as_train(built_cache, split):
    """Any split name but train, val and all once gave the training clips (a score on "validation"
    then counted training clips as held out); every loader now refuses it, naming the three."""
    from pipeline.vocoder import segments
    cfg = _cfg(built_cache)
    for load in (lambda: data.build_dataset(cfg, split), lambda: data.clip_ids(cfg, split),
                 lambda: segments.build_segments(cfg, split, log=lambda _: None)):
        with pytest.raises(ValueError, match=f"split must be one of \\('train', 'val', 'all'\\), not '{split}'"):
            load()


def test_a_train_split_of_exactly_one_batch_is_enough(built_cache):
    n = len(data.clip_ids(_cfg(built_cache), "train"))
    batch = next(iter(data.build_dataset(_cfg(built_cache, train={"batch_size": n, "buckets": 1}), "train")))
    assert batch["tokens"].shape[0] == n


# --- the shard format itself (pipeline/shards.py), on shards written here ----------------------
def _mel_shard(cache, shard=0):
    """A two-clip mels shard of 4 mels a frame (with its .stats.npy) under `cache`/mels/; its path prefix."""
    out = shards.prefix(cache, "mels", shard)
    shards.write(out, "mels", ["a", "b"], [np.full((3, 4), 0.5, np.float32), np.arange(8, dtype=np.float32).reshape(2, 4)],
                 provenance="p", width=4, stats=np.zeros((2, 3)))
    return out


def test_a_shard_reads_back_the_arrays_it_was_written_from_in_its_kinds_dtype(tmp_path):
    out = _mel_shard(tmp_path)
    meta, arrays = shards.read(out, "mels")
    assert (meta["ids"], meta["lengths"], meta["offsets"], meta["dtype"]) == (["a", "b"], [3, 2], [0, 3], "<f2")
    assert [a.shape for a in arrays] == [(3, 4), (2, 4)] and {a.dtype for a in arrays} == {np.dtype("<f2")}
    assert np.array_equal(arrays[1], np.arange(8).reshape(2, 4))
    # width 1: one flat array a clip; int64 token ids (np.asarray of a list) are written as the kind's int32
    tokens = tmp_path / "tokens" / "shard-000"
    shards.write(tokens, "tokens", ["a", "b", "c"], [np.asarray([5, 6, 7]), np.asarray([]), np.asarray([9])],
                 provenance="p")
    meta, arrays = shards.read(tokens, "tokens")
    assert [a.tolist() for a in arrays] == [[5, 6, 7], [], [9]] and arrays[0].dtype == np.dtype("<i4")
    assert meta["bytes"] == 4 * 4


def _flip_a_byte_keeping_its_mtime(path):
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _edit_json(out, **changes):
    path = out.with_suffix(".json")
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


SHARD_DAMAGE = {  # name: (what is done to a written mels shard, what shards.read says)
    "a flipped byte": (lambda out: _flip_a_byte_keeping_its_mtime(out.with_suffix(".bin")),
                       r"mels/shard-000\.bin: checksum mismatch .*run `snakemake --cores all caches`"),
    "its .bin deleted": (lambda out: out.with_suffix(".bin").unlink(),
                         r"mels/shard-000\.bin: missing; run `snakemake --cores all caches`"),
    "its .bin cut short": (lambda out: out.with_suffix(".bin").write_bytes(out.with_suffix(".bin").read_bytes()[:-2]),
                           r"mels/shard-000\.bin: 38 bytes on disk, 40 expected"),
    "its JSON's byte count edited": (lambda out: _edit_json(out, bytes=44),
                                     r"mels/shard-000\.bin: its JSON records 44 bytes but its lengths add up to 40"),
    "its JSON cut short": (lambda out: out.with_suffix(".json").write_text(out.with_suffix(".json").read_text()[:50]),
                           r"mels/shard-000\.json: unreadable \(.*\); run `snakemake --cores all caches`"),
    "an older format": (lambda out: _edit_json(out, format=shards.FORMAT - 1),
                        rf"mels/shard-000\.json: written in cache format {shards.FORMAT - 1}, this code reads format "
                        rf"{shards.FORMAT}; rebuild it"),
}


@pytest.mark.parametrize("damage", sorted(SHARD_DAMAGE))
def test_a_damaged_shard_is_refused_by_a_numpy_reader_naming_its_file(tmp_path, damage):
    do, message = SHARD_DAMAGE[damage]
    out = _mel_shard(tmp_path)
    do(out)
    with pytest.raises(shards.CacheError, match=message):
        shards.read(out, "mels")


def test_a_checksum_mismatch_a_reader_finds_makes_planning_hash_the_file_again(tmp_path):
    out = _mel_shard(tmp_path)
    assert shards.intact(out) == "ok"
    stamp = tmp_path / ".verified" / "mels-shard-000"
    assert stamp.is_file()
    # a disk's own bit rot: the bytes change, the stat planning compares does not (its stamp rewritten to match)
    _flip_a_byte_keeping_its_mtime(out.with_suffix(".bin"))
    st, checksum = out.with_suffix(".bin").stat(), stamp.read_text().split()[-1]
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {checksum}\n")
    assert shards.intact(out) == "ok"  # planning cannot see it
    with pytest.raises(shards.CacheError, match="checksum mismatch"):
        shards.read(out, "mels")
    assert not stamp.exists() and shards.intact(out) == "damaged"


INTACT_DAMAGE = {  # name: what is done to a shard planning verified already
    "a flipped byte, its mtime put back": lambda out: _flip_a_byte_keeping_its_mtime(out.with_suffix(".bin")),
    "its .stats.npy deleted": lambda out: out.with_suffix(".stats.npy").unlink(),
    "its .bin deleted": lambda out: out.with_suffix(".bin").unlink(),
    "its JSON without a checksum": lambda out: out.with_suffix(".json").write_text(json.dumps(
        {k: v for k, v in json.loads(out.with_suffix(".json").read_text()).items() if k != "checksum"})),
}


@pytest.mark.parametrize("damage", sorted(INTACT_DAMAGE))
def test_planning_finds_a_shard_damaged_after_it_verified_it(tmp_path, damage):
    out = _mel_shard(tmp_path)
    assert shards.intact(out) == "ok" and shards.intact(out) == "ok"  # hashed, then known by its stamp
    INTACT_DAMAGE[damage](out)
    assert shards.intact(out) == "damaged"


def test_a_shard_whose_stamp_cannot_be_written_is_verified_not_damaged(tmp_path):
    # a cache this user may read but not write (a team's shared cache): every sound shard was called
    # damaged, planned for a rebuild it could not make, because planning could not remember its hash
    out = _mel_shard(tmp_path)
    stamps = shards._stamp(out.with_suffix(".bin")).parent
    stamps.write_text("a file where the stamps' folder goes: no stamp can be written, as in a read-only cache")
    assert shards.intact(out) == "ok" and shards.intact(out) == "ok"   # hashed each time, never remembered
    _flip_a_byte_keeping_its_mtime(out.with_suffix(".bin"))
    assert shards.intact(out) == "damaged"


def test_a_shard_job_none_of_whose_files_exist_is_not_damaged(tmp_path):
    assert shards.intact(shards.prefix(tmp_path, "mels", 0), shards.prefix(tmp_path, "energy", 0)) == "ok"


@pytest.mark.parametrize("suffix", [".bin", ".stats.npy"])
def test_a_shard_write_that_fails_leaves_no_json_that_would_load(tmp_path, suffix):
    # the .json is written last: a job stopped before it leaves no shard, and Snakemake reruns it
    out = shards.prefix(tmp_path, "mels", 0)
    out.with_suffix(suffix).mkdir(parents=True)  # what the write cannot replace
    with pytest.raises(errors.PipelineError, match=re.escape(f"{out.with_suffix(suffix)}: a folder")):
        _mel_shard(tmp_path)
    assert not out.with_suffix(".json").exists()


def test_a_shards_provenance_follows_what_its_content_depends_on(tmp_path, monkeypatch):
    cfg = config.load_config(None, check_paths=False)

    def prov(kind, espeak="1.51", **sections):
        return shards.provenance(kind, config.merge(cfg, sections), espeak=espeak)
    assert prov("pitch", audio={"hop_length": 200}) != prov("pitch") != prov("pitch", audio={"sample_rate": 16000})
    assert prov("pitch", audio={"n_mels": 64, "n_fft": 2048}) == prov("pitch")  # pitch reads no mel settings
    assert prov("mels", audio={"n_fft": 2048}) != prov("mels")
    # phonemes depend on the espeak-ng version; characters do not
    assert prov("tokens", espeak="1.52") != prov("tokens")
    assert prov("tokens", "1.52", text={"frontend": "characters"}) == prov("tokens", text={"frontend": "characters"})
    # an edit of pitch.py rebuilds the pitch shards
    code = tmp_path / "pipeline"
    shutil.copytree(shards.HERE, code, ignore=shutil.ignore_patterns("__pycache__"))
    before = prov("pitch")
    monkeypatch.setattr(shards, "HERE", code)
    assert prov("pitch") == before
    (code / "pitch.py").write_text((code / "pitch.py").read_text() + "\n# edited\n")
    assert prov("pitch") != before
    # a new shard format is a new provenance for every kind: planning reruns every shard job of a cache
    # written before, as it does after an edit of their code
    now = {kind: prov(kind) for kind in shards.CACHE_KINDS}
    monkeypatch.setattr(shards, "FORMAT", shards.FORMAT - 1)
    assert all(prov(kind) != now[kind] for kind in shards.CACHE_KINDS)


def test_durations_set_aside_are_moved_with_their_reason_not_deleted(tmp_path):
    out = shards.prefix(tmp_path / "cache", "durations", 2)
    shards.write(out, "durations", ["a"], [np.asarray([3, 4], np.int32)], provenance={"tokens": "x", "mels": "y"})
    written = out.with_suffix(".json").read_text()
    moved = shards.set_aside(out, tmp_path / "cache" / ".repair", "stale")
    assert not out.with_suffix(".json").exists() and moved.read_text() == written
    assert moved.with_suffix(".why").read_text() == "stale\n" and out.with_suffix(".bin").exists()
