"""The vocoder's segment loader: Python-free graph, one static shape, exact mel/audio pairing,
padding of short clips, and the same batches after a resume."""
import numpy as np
import pytest
import tensorflow as tf

from pipeline import audio, config, data
from pipeline.graphscan import find_pyfunc_ops
from pipeline.vocoder.segments import build_segments


def _cfg(path, **vocoder):
    return config.load_config(path, {"vocoder": vocoder} if vocoder else None)


def test_segment_graph_holds_no_python_ops_and_has_one_static_shape(built_cache):
    cfg = _cfg(built_cache, segment_frames=16, batch_size=3)
    ds = build_segments(cfg, "train")
    assert find_pyfunc_ops(ds) == []
    planted = ds.map(lambda b: dict(b, audio=tf.numpy_function(lambda a: a, [b["audio"]], tf.float32)))
    assert any("PyFunc" in op for op in find_pyfunc_ops(planted))  # the scan sees one when there is one
    hop, n_mels = cfg["audio"]["hop_length"], cfg["audio"]["n_mels"]
    assert ds.element_spec["mel"].shape == (3, 16, n_mels)
    assert ds.element_spec["audio"].shape == (3, 16 * hop)
    assert ds.element_spec["f0"].shape == (3, 16) and ds.element_spec["f0"].dtype == tf.float32
    assert ds.options().autotune.enabled is False  # as every loader (data.loader_options)


def _cached(cfg, kind):
    """{clip id: array} of every shard of cache `kind`."""
    from pipeline import shards
    out = {}
    for entry in data.read_index(cfg)["shards"]:
        meta, arrays = shards.read(config.cache_dir(cfg) / entry[kind], kind)
        out.update(zip(meta["ids"], arrays))
    return out


def test_each_f0_crop_is_the_pitch_cache_on_its_mel_crops_frames(built_cache):
    cfg = _cfg(built_cache, segment_frames=12, batch_size=4)
    mels, pitch = _cached(cfg, "mels"), _cached(cfg, "pitch")
    where = {}  # a cached mel frame's bytes -> (clip, frame): where a crop was cut from
    for cid, mel in mels.items():
        for t in range(len(mel)):
            where.setdefault(mel[t].astype(np.float32).tobytes(), (cid, t))
    found = voiced = 0
    for batch in build_segments(cfg, "train").take(4):
        for mel, f0 in zip(batch["mel"].numpy(), batch["f0"].numpy()):
            cid, t = where[mel[0].tobytes()]
            n = min(12, len(mels[cid]) - t)
            np.testing.assert_array_equal(mel[:n], mels[cid][t:t + n].astype(np.float32))  # the crop we found
            np.testing.assert_array_equal(f0[:n], pitch[cid][t:t + n])               # its F0, frame for frame
            assert np.all(f0[n:] == 0)                                                # padding is unvoiced
            found += 1
            voiced += int(np.any(f0 > 0) and np.any(f0 == 0) or np.all(f0 > 0))
    assert found == 16 and voiced >= 8  # real F0 tracks, not zeros


def test_each_audio_crop_makes_its_mel_crop_on_interior_frames(built_cache):
    cfg = _cfg(built_cache, segment_frames=24, batch_size=4)
    a = cfg["audio"]
    edge = -(-(a["n_fft"] - a["hop_length"]) // 2 // a["hop_length"]) + 1  # frames that see reflect padding
    checked = 0
    for batch in build_segments(cfg, "train").take(3):
        for mel, wav in zip(batch["mel"].numpy(), batch["audio"].numpy()):
            assert np.any(wav != 0)
            ours = audio.mel_spectrogram(wav, **a)                                    # (S, n_mels)
            assert ours.shape == mel.shape
            inner = slice(edge, len(mel) - edge)
            # the cache stores float16: equal up to its rounding (~0.008 at |log mel| ~ 11)
            np.testing.assert_allclose(ours[inner], mel[inner], atol=2e-2)
            if np.all(mel[inner] > np.log(1e-5) + 1e-3):  # speech throughout: one hop off is far from it
                shifted = audio.mel_spectrogram(np.roll(wav, a["hop_length"]), **a)
                assert np.abs(shifted[inner] - mel[inner]).mean() > 10 * np.abs(ours[inner] - mel[inner]).mean()
                checked += 1
    assert checked >= 4


def test_validation_crops_are_each_clips_middle_every_time(built_cache):
    # the validation losses compare one fixed crop per clip, its middle (docs/vocoder.md): a crop that moved
    # between evaluations would move the curve with it
    from pipeline import shards
    from pipeline.vocoder import segments
    cfg = _cfg(built_cache, segment_frames=16, batch_size=4)
    S = cfg["vocoder"]["segment_frames"]
    clips, _ = segments._sources(cfg, "val", "recorded", lambda *a: None)
    f0 = {}
    for entry in data.read_index(cfg)["shards"]:
        meta, tracks = shards.read(config.cache_dir(cfg) / entry["pitch"], "pitch")
        f0.update(zip(meta["ids"], tracks))
    crops = np.concatenate([b["f0"].numpy() for b in build_segments(cfg, "val")])
    assert len(crops) == len(clips.ids)
    checked = 0
    for cid, frames, crop in zip(clips.ids, clips.frames, crops):
        start = min((max(frames - S, 0) + 1) // 2, max(frames - S, 0))
        track = f0[cid][start:start + S]
        np.testing.assert_array_equal(crop[:len(track)], track)
        checked += frames > S + 2 and np.any(track > 0)
    assert checked >= 2
    again = np.concatenate([b["f0"].numpy() for b in build_segments(cfg, "val")])
    np.testing.assert_array_equal(again, crops)


def test_short_clips_are_padded_not_dropped(built_cache):
    frames = data.load_clips(_cfg(built_cache), "all")[0].frames
    S = int(np.sort(frames)[len(frames) // 2])  # a middle clip's length: half the clips are shorter, one is S
    cfg = _cfg(built_cache, segment_frames=S, batch_size=5)
    lines = []
    batches = list(build_segments(cfg, "all", repeat=False, log=lines.append))
    assert any("shorter than vocoder.segment_frames" in line and "padded" in line for line in lines)
    assert any(f"{np.sum(frames < S)} of {len(frames)} all clips are shorter" in line for line in lines), lines
    mels = np.concatenate([b["mel"].numpy() for b in batches])
    wavs = np.concatenate([b["audio"].numpy() for b in batches])
    assert len(mels) == len(frames)                       # every clip, once
    hop = cfg["audio"]["hop_length"]
    for f, mel, wav in zip(frames, mels, wavs):
        n = min(f, S)
        assert np.all(mel[n:] == np.float32(np.log(1e-5))) and np.all(wav[n * hop:] == 0)
        assert np.any(wav[:n * hop] != 0)


def test_crops_pair_frames_and_samples_exactly_from_the_first_start_to_the_last():
    # three clips laid end to end as the shards are (mel rows, samples, F0 values numbered by position,
    # F0 voiced everywhere): crop start t = floor(u * (room + 1)), room = frames - S, so u in [0, 1) reaches
    # every start from 0 to the clip's last S frames; frames [t, t+S), samples [t*hop, (t+S)*hop) and
    # the F0 of the same frames, the rest of a short clip padded (silence, zeros, unvoiced)
    from pipeline.vocoder import segments
    S, hop, n_mels = 4, 3, 2
    frames = np.array([10, 4, 2])
    first = np.concatenate([[0], np.cumsum(frames)[:-1]])
    table = tf.constant(np.stack([first, first * hop, first, frames], 1), tf.int64)
    total = int(frames.sum())
    mel = tf.constant(np.repeat(np.arange(total, dtype=np.float16)[:, None], n_mels, 1))
    wav, f0 = tf.range(total * hop, dtype=tf.float32) + 1.0, tf.range(total, dtype=tf.float32) + 100.0
    crops = segments._cropper(table, S, hop)
    for clip, u, t in ((0, 0.0, 0), (0, 0.999, 6), (0, 0.5, 3), (1, 0.999, 0), (2, 0.7, 0)):
        got = crops(mel, wav, f0, tf.constant([clip], tf.int64), tf.constant([u], tf.float32))
        n = min(S, frames[clip] - t)
        at = first[clip] + t + np.arange(n)
        np.testing.assert_array_equal(got["mel"].numpy()[0][:, 0], np.r_[at, np.full(S - n, segments.PAD_LOG_MEL)].astype(np.float32))
        np.testing.assert_array_equal(got["f0"].numpy()[0], np.r_[at + 100.0, np.zeros(S - n)])
        samples = (first[clip] + t) * hop + np.arange(n * hop) + 1.0
        np.testing.assert_array_equal(got["audio"].numpy()[0], np.r_[samples, np.zeros((S - n) * hop)])


def test_a_missing_audio_shard_is_named_before_the_loader_runs(built_cache, tmp_path):
    # the audio shards' JSON and .bin are checked against each other when the dataset is built: a missing
    # .bin is one CacheError naming it and what rebuilds it, not a failure inside the input graph
    import shutil

    from conftest import write_config

    from pipeline.shards import CacheError
    cfg = _cfg(built_cache)
    shutil.copytree(config.cache_dir(cfg), tmp_path / "cache" / cfg["name"])
    cfg = _cfg(write_config(tmp_path, cfg["dataset"]["root"]), segment_frames=16, batch_size=3)
    (config.cache_dir(cfg) / "audio" / "shard-002.bin").unlink()
    with pytest.raises(CacheError, match=r"audio/shard-002\.bin: missing; run `snakemake --cores all caches`"):
        build_segments(cfg, "all")


def test_a_resumed_stream_gives_the_same_batches(built_cache):
    cfg = _cfg(built_cache, segment_frames=8, batch_size=2)
    whole = [b["audio"].numpy() for b in build_segments(cfg, "train").take(6)]
    resumed = [b["audio"].numpy() for b in build_segments(cfg, "train", start_step=4).take(2)]
    np.testing.assert_array_equal(np.stack(whole[4:]), np.stack(resumed))
    assert not np.array_equal(whole[0], whole[1])


def test_gta_source_pairs_gta_mels_with_the_same_audio(built_cache, tmp_path):
    from pipeline import shards
    from pipeline.vocoder import segments
    cfg = _cfg(built_cache, segment_frames=8, batch_size=4)
    cfg["runs_dir"] = str(tmp_path)
    for entry in data.read_index(cfg)["shards"]:  # GTA shards holding the recorded mels, + 1 (a visible change)
        meta, mels = shards.read(config.cache_dir(cfg) / entry["mels"], "mels")
        shards.write(segments.gta_prefix(cfg, entry["shard"]), "gta", meta["ids"], [m + 1 for m in mels],
                     provenance="test", width=meta["width"])
    recorded = list(build_segments(cfg, "train").take(3))
    gta = list(build_segments(cfg, "train", source="gta").take(3))
    for r, g in zip(recorded, gta):
        np.testing.assert_array_equal(r["audio"].numpy(), g["audio"].numpy())
        np.testing.assert_allclose(g["mel"].numpy(), r["mel"].numpy() + 1, atol=1e-2)
    # fine-tuning's mix: per crop, the recorded mel instead of the GTA one, the crops and audio unchanged
    mixed = list(build_segments(cfg, "train", source="gta", recorded_fraction=0.5).take(3))
    assert [b["mel"].numpy().tolist() for b in mixed] == \
        [b["mel"].numpy().tolist() for b in build_segments(cfg, "train", source="gta", recorded_fraction=0.5).take(3)]
    picks = []
    for r, g, m in zip(recorded, gta, mixed):
        np.testing.assert_array_equal(m["audio"].numpy(), r["audio"].numpy())
        np.testing.assert_array_equal(m["f0"].numpy(), r["f0"].numpy())
        is_recorded = np.all(m["mel"].numpy() == r["mel"].numpy(), axis=(1, 2))
        is_gta = np.all(m["mel"].numpy() == g["mel"].numpy(), axis=(1, 2))
        assert np.all(is_recorded != is_gta)  # each crop wholly one or the other
        picks += is_recorded.tolist()
    assert 0 < sum(picks) < len(picks)
    every = next(iter(build_segments(cfg, "train", source="gta", recorded_fraction=1.0)))
    np.testing.assert_array_equal(every["mel"].numpy(), recorded[0]["mel"].numpy())
    val = [b["mel"].numpy() for b in build_segments(cfg, "val", source="gta", recorded_fraction=1.0)]
    np.testing.assert_array_equal(np.concatenate(val), np.concatenate(
        [b["mel"].numpy() for b in build_segments(cfg, "val", source="gta")]))  # validation stays on GTA mels
    with pytest.raises(ValueError, match="recorded_fraction"):
        build_segments(cfg, "train", source="gta", recorded_fraction=1.5)


def test_every_vocoder_kind_gives_frames_times_hop_samples():
    import tensorflow as tf

    from pipeline.vocoder import kinds
    cfg = config.load_config(overrides={"vocoder": {"vocos": {"dim": 16, "intermediate_dim": 32, "layers": 1}}})
    for kind, size in (("vocos", None), ("hifigan", "v2")):
        v = dict(cfg["vocoder"], kind=kind, hifigan={"size": size or "v2"})
        out = kinds.build(v, cfg["audio"])(tf.zeros([2, 5, cfg["audio"]["n_mels"]]) - 5.0)
        assert out.shape == (2, 5 * cfg["audio"]["hop_length"]) and out.dtype == tf.float32, kind
    with pytest.raises(config.ConfigError, match="audio.hop_length"):
        kinds.build(dict(cfg["vocoder"], kind="hifigan"), dict(cfg["audio"], hop_length=250))


@pytest.mark.parametrize("kind", ["audio", "mels", "pitch"])
def test_a_flipped_byte_in_any_shard_the_vocoder_reads_stops_its_loader(built_cache, tmp_path, kind):
    # the vocoder's loader read its shards unchecked: a flipped audio byte (mtime kept) trained on 3e38
    import shutil

    from conftest import write_config
    from test_staleness import flip_byte

    from pipeline import errors
    cfg = _cfg(built_cache)
    shutil.copytree(config.cache_dir(cfg), tmp_path / "cache" / cfg["name"])
    cfg = _cfg(write_config(tmp_path, cfg["dataset"]["root"]), segment_frames=16, batch_size=3)
    next(iter(build_segments(cfg, "train")))  # intact: reads
    flip_byte(config.cache_dir(cfg) / kind / "shard-002.bin")
    for split in ("train", "val"):
        with pytest.raises(tf.errors.InvalidArgumentError) as caught:
            next(iter(build_segments(cfg, split)))
        line = errors._one_line(caught.value)
        assert f"{kind}/shard-002.bin" in line and "checksum mismatch" in line and "snakemake --cores all caches" in line


def test_fine_tuning_skips_the_clips_a_gta_shard_left_out(built_cache, tmp_path):
    """A GTA shard leaves out the clips the durations stage rejected (listed in its `rejected`); the
    fine-tuning's loader raised CacheError on the first such clip. Now it leaves them out and says so;
    a clip missing from a GTA shard without a record (a shard older than the cache) is still an error."""
    from pipeline import shards
    from pipeline.shards import CacheError
    from pipeline.vocoder import segments
    cfg = _cfg(built_cache, segment_frames=8, batch_size=4)
    cfg["runs_dir"] = str(tmp_path)
    entries, gone = data.read_index(cfg)["shards"], []
    for entry in entries:
        meta, mels = shards.read(config.cache_dir(cfg) / entry["mels"], "mels")
        gone.append(meta["ids"][0])
        shards.write(segments.gta_prefix(cfg, entry["shard"]), "gta", meta["ids"][1:], mels[1:], provenance="test",
                     width=meta["width"], rejected=[dict(id=meta["ids"][0], path="d.json", stage="durations",
                                                         reason="the audio does not carry its text")])
    logged = []
    clips, _ = segments._sources(cfg, "all", "gta", logged.append)
    assert set(gone).isdisjoint(clips.ids) and len(clips.ids) == len(data.load_clips(cfg, "all")[0].ids) - len(gone)
    assert any(f"{len(gone)} of" in line and "have no GTA mel" in line for line in logged), logged
    assert next(iter(build_segments(cfg, "train", source="gta", recorded_fraction=0.5)))["mel"].shape[0] == 4
    list(build_segments(cfg, "val", source="gta"))
    meta = shards.read_meta(segments.gta_prefix(cfg, entries[0]["shard"]), "gta")   # no record: stale, an error
    shards.write(segments.gta_prefix(cfg, entries[0]["shard"]), "gta", meta["ids"], shards.arrays(
        meta, segments.gta_prefix(cfg, entries[0]["shard"])), provenance="test", width=meta["width"])
    with pytest.raises(CacheError, match=f"{gone[0]} has no gta items"):
        segments._sources(cfg, "all", "gta", logged.append)
    # a clip whose GTA mel is a frame short of its recorded mel (a shard made from other mels): crops
    # would pair the wrong frames with the audio, so it is refused, naming both lengths
    meta, mels = shards.read(config.cache_dir(cfg) / entries[0]["mels"], "mels")
    shards.write(segments.gta_prefix(cfg, entries[0]["shard"]), "gta", meta["ids"], [mels[0][:-1], *mels[1:]],
                 provenance="test", width=meta["width"])
    with pytest.raises(CacheError, match=rf"{meta['ids'][0]} has {len(mels[0]) - 1} gta items, its mel has "
                                         rf"{len(mels[0])} frames \(expected {len(mels[0])}\)"):
        segments._sources(cfg, "all", "gta", logged.append)


def test_a_new_train_seed_restarts_the_vocoder_instead_of_resuming_on_its_batches(tmp_path):
    # batches are a function of (train.seed, step) and the initial weights of train.seed: a new seed reran
    # the vocoder's jobs (a param), which resumed the old seed's checkpoints at their last step on the new
    # seed's batches, a run neither seed makes; the phase restarts now, and the old seed's set comes back
    import json

    from pipeline.vocoder import inputs
    cfg = config.load_config(overrides={"runs_dir": str(tmp_path), "vocoder": {"kind": "vocos"}}, check_paths=False)
    other = dict(cfg, train={**cfg["train"], "seed": cfg["train"]["seed"] + 1})
    folder, logged = config.run_dir(cfg) / "vocoder" / "train", []

    def trained(key, step):
        inputs.switch(folder, key, logged.append)
        (folder / "checkpoints").mkdir(exist_ok=True)
        (folder / "checkpoints" / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')

    trained(inputs.settings(cfg), 5)
    seed = cfg["train"]["seed"]
    [note] = inputs.notes(other)
    assert note.startswith(f"note: train.seed {seed} -> {seed + 1} since the vocoder's train phase was trained"), note
    trained(inputs.settings(other), 3)
    assert f"train.seed {seed} -> {seed + 1}" in logged[-1] and "set aside" in logged[-1]
    inputs.switch(folder, inputs.settings(cfg), logged.append)                 # back to the first seed: its set
    assert "resuming" in logged[-1] and "ckpt-5" in (folder / "checkpoints" / "checkpoint").read_text()
    # inputs recorded before they held train.seed resume as before (nothing says which seed made them)
    inputs.path(folder).write_text(json.dumps({k: v for k, v in inputs.settings(cfg).items() if k != "train"}))
    assert inputs.notes(other) == []
    logged.clear()
    inputs.switch(folder, inputs.settings(other), logged.append)
    assert logged == [] and inputs.read(folder)["train"] == {"seed": seed + 1}


def test_gta_shards_of_another_mel_width_are_refused_naming_the_shard(built_cache, tmp_path):
    # GTA shards made at another audio.n_mels (a direct `python -m pipeline.vocoder.train --phase finetune`
    # after the setting changed) have the recorded frame counts, so every length check passed, and their
    # bytes were cut into rows of n_mels: fine-tuning trained on mels that were no frames of the audio
    from pipeline import shards
    from pipeline.shards import CacheError
    from pipeline.vocoder import segments
    cfg = _cfg(built_cache, segment_frames=8, batch_size=4)
    cfg["runs_dir"] = str(tmp_path)
    entries = data.read_index(cfg)["shards"]
    for entry in entries:
        meta, mels = shards.read(config.cache_dir(cfg) / entry["mels"], "mels")
        shards.write(segments.gta_prefix(cfg, entry["shard"]), "gta", meta["ids"], [np.concatenate([m, m], 1) for m in mels],
                     provenance="test", width=2 * meta["width"])
    n_mels = cfg["audio"]["n_mels"]
    for split in ("train", "val"):
        with pytest.raises(CacheError, match=rf"gta/shard-000\.json: GTA mels of {2 * n_mels} bins, audio.n_mels is "
                                             rf"{n_mels} \(made at other settings\); run `snakemake --cores all vocoder`"):
            build_segments(cfg, split, source="gta")


def test_validation_losses_weigh_every_crop_the_same_whatever_batch_it_falls_in(built_cache):
    # validation gives each clip once in batches of up to B, the last one partial (the demo: 9 clips, batches
    # of 8 and 1); the losses were the mean of the batches' means, so the last batch's clips weighed more
    # (the demo's ninth clip half the score). Now the mel L1 is the mean of every crop's own.
    from types import SimpleNamespace

    from pipeline.vocoder import discriminators as D
    from pipeline.vocoder import train
    cfg = _cfg(built_cache, segment_frames=16, batch_size=16)
    val = build_segments(cfg, "all", repeat=False)
    sizes = [len(b["audio"]) for b in val]
    assert sizes == [16, 8]                                                      # 24 clips: one partial batch
    trainer = SimpleNamespace(device="/cpu:0", uses_f0=False, cfg=cfg)
    quiet = lambda mel, training: tf.zeros([mel.shape[0], mel.shape[1] * cfg["audio"]["hop_length"]])  # noqa: E731
    losses, _ = train._val_losses(trainer, quiet, val)
    each = [float(D.mel_l1(a[None], tf.zeros_like(a)[None], cfg["audio"])) for b in val for a in b["audio"]]
    assert len(each) == 24 and np.std(each) > 0.05                               # the crops differ
    np.testing.assert_allclose(losses["mel"], np.mean(each), rtol=1e-5)
