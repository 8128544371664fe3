"""GTA mels: clips batched through the acoustic model give each clip its own teacher-forced mel, in its
own voice, exactly as one clip at a time would (pipeline.vocoder.gta.teacher_forced_mels)."""
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from pipeline.models.fastpitch import FastPitch
from pipeline.models.transformer_tts import TransformerTTS
from pipeline.vocoder.gta import teacher_forced_mels

N_MELS = 8
FASTPITCH = dict(n_symbols=12, n_mels=N_MELS, d_model=32, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=32,
                 ffn_kernel=3, dropout=0.0, predictor_channels=16, predictor_kernel=3, predictor_dropout=0.0,
                 n_speakers=3)
TRANSFORMER = dict(n_symbols=12, n_mels=N_MELS, d_model=32, heads=2, encoder_layers=1, decoder_layers=2, ffn_dim=64,
                   encoder_conv_layers=2, encoder_conv_kernel=3, prenet_dim=32, prenet_dropout=0.0, dropout=0.0,
                   reduction=2, postnet_channels=16, postnet_layers=3, postnet_kernel=3)
NORM = {k: tf.constant(v, tf.float32) for k, v in dict(
    mel_mean=np.full(N_MELS, -5.0), mel_std=np.full(N_MELS, 2.0), pitch_mean=150.0, pitch_std=30.0,
    energy_mean=1.0, energy_std=0.5, speaker_pitch_mean=[120.0, 200.0, 160.0], speaker_pitch_std=[20.0, 35.0, 25.0]).items()}


def clips(n, durations=True, seed=0):
    """n clips of different lengths (3-11 tokens, 1-4 frames a token), speakers 0-2 in turn."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        d = rng.integers(1, 5, rng.integers(3, 12)).astype(np.int32)
        frames = int(d.sum())
        clip = {"tokens": rng.integers(1, 12, len(d)).astype(np.int32),
                "mels": rng.normal(-5.0, 2.0, (frames, N_MELS)).astype(np.float16),
                "pitch": np.where(rng.random(frames) < 0.7, rng.uniform(90, 250, frames), 0.0).astype(np.float32),
                "energy": rng.uniform(0.2, 2.0, frames).astype(np.float32), "speaker": i % 3}
        if durations:
            clip["durations"] = d
        out.append(clip)
    return out


def test_fastpitch_batched_clips_get_their_own_mels_in_their_own_voices():
    model = FastPitch(**FASTPITCH)
    model.speaker_embedding.embeddings.assign(tf.random.normal(model.speaker_embedding.embeddings.shape, seed=1))
    data = clips(11)
    batched = teacher_forced_mels(model, data, NORM, batch_size=4)   # unsorted input, uneven last batch
    alone = teacher_forced_mels(model, data, NORM, batch_size=1)
    assert [len(m) for m in batched] == [len(c["mels"]) for c in data]
    for a, b in zip(batched, alone):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # the voice is each clip's own: speaker 0 for everyone (what GTA mels were before) changes them
    as_first = teacher_forced_mels(model, [dict(c, speaker=0) for c in data], NORM, batch_size=4)
    moved = [np.abs(a - b).max() for a, b, c in zip(batched, as_first, data) if c["speaker"]]
    assert min(moved) > 1e-3


def test_transformer_tts_batched_clips_round_frames_up_to_its_reduction():
    model = TransformerTTS(**TRANSFORMER)
    data = [{k: v for k, v in c.items() if k in ("tokens", "mels", "pitch", "energy")} for c in clips(7, durations=False)]
    assert any(len(c["mels"]) % 2 for c in data)  # odd lengths: padded to the frame multiple
    batched = teacher_forced_mels(model, data, NORM, batch_size=3)
    for a, b, c in zip(batched, teacher_forced_mels(model, data, NORM, batch_size=1), data):
        assert a.shape == (len(c["mels"]), N_MELS)
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_transformer_tts_gta_mels_are_the_same_in_every_process_and_batch(tmp_path):
    """Pre-net dropout stays on when teacher-forced (Tacotron 2: GTA mels are what the model speaks with), but
    its masks came from an unrestored SeedGenerator: every process made other GTA mels (other checksums, so
    fine-tuning never resumed) and a clip's mel moved with the clips beside it. Now each clip's masks are
    seeded by its own tokens: fresh models from one checkpoint agree, in batches of 1 or 4."""
    cfg = dict(TRANSFORMER, prenet_dropout=0.5)
    path = tf.train.Checkpoint(model=TransformerTTS(**cfg)).write(str(tmp_path / "ckpt"))
    data = [{k: v for k, v in c.items() if k in ("tokens", "mels", "pitch", "energy")} for c in clips(7, durations=False)]
    runs = []
    for batch_size in (4, 1):
        model = TransformerTTS(**cfg)                                            # a fresh process's model
        tf.train.Checkpoint(model=model).read(path).assert_existing_objects_matched()
        model.seed_generator.next()                                              # whatever its generator is at
        runs.append(teacher_forced_mels(model, data, NORM, batch_size=batch_size))
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, atol=1e-5)
    no_dropout = TransformerTTS(**dict(cfg, prenet_dropout=0.0))
    tf.train.Checkpoint(model=no_dropout).read(path).expect_partial()
    off = teacher_forced_mels(no_dropout, data, NORM, batch_size=4)
    assert max(np.abs(a - b).max() for a, b in zip(runs[0], off)) > 1e-3  # dropout is on, as at inference


def _one_shard(tmp_path, data, rejected=(), speakers=("a", "b", "c")):
    """(cfg, synthesizer) of one cached shard of `data` (clips()) with durations rejecting `rejected` ids, and
    an untrained FastPitch standing for the run's model (what gta.load_synthesizer would give)."""
    from pipeline import config, shards
    cfg = config.load_config(None, {"cache": {"dir": str(tmp_path / "cache")}, "runs_dir": str(tmp_path / "runs"),
                                    "name": "t", "audio": {"n_mels": N_MELS}}, check_paths=False)
    root, ids = config.cache_dir(cfg), [f"clip{i}" for i in range(len(data))]
    symbols = [chr(ord("a") + i) for i in range(12)]
    arrays = {"tokens": [np.array([ord(symbols[t]) for t in c["tokens"]], np.int32) for c in data],
              **{k: [c[k] for c in data] for k in ("mels", "energy", "pitch", "durations")}}
    for kind, rows in arrays.items():
        shards.write(shards.prefix(root, kind, 0), kind, ids, rows, provenance="test",
                     width=N_MELS if kind == "mels" else 1,
                     rejected=[dict(id=i, path="d.json", stage="durations", reason="the audio does not carry its "
                                    "text") for i in rejected] if kind == "durations" else (),
                     **({"speakers": [speakers[c["speaker"]] for c in data]} if kind == "tokens" else {}))
    (tmp_path / "ckpt-5.index").write_bytes(b"weights")
    stats = {k: v.numpy().tolist() for k, v in NORM.items()}
    synth = SimpleNamespace(model=FastPitch(**FASTPITCH), vocab={"symbols": symbols}, checkpoint=str(tmp_path / "ckpt-5"),
                            info={"stats": stats, "speakers": ["a", "b", "c"]}, speakers=["a", "b", "c"],
                            languages=[], mean=stats["mel_mean"], std=stats["mel_std"])
    return cfg, synth


def test_clips_the_durations_stage_rejected_get_no_gta_mel_and_say_why(tmp_path, monkeypatch):
    """Acoustic training leaves out the clips the durations stage rejected (their durations do not fit their
    audio); the GTA job made mels of them from those durations all the same, and fine-tuning paired them
    with their audio. Now they are left out of the GTA shard, listed in its `rejected` with the reason."""
    from pipeline import shards
    from pipeline.vocoder import gta
    cfg, synth = _one_shard(tmp_path, clips(5), rejected=["clip1", "clip3"])
    monkeypatch.setattr(gta, "load_synthesizer", lambda cfg, log: synth)
    logged = []
    gta.build_gta_shard(cfg, 0, tmp_path / "gta" / "shard-000", log=logged.append)
    meta, mels = shards.read(tmp_path / "gta" / "shard-000", "gta")
    assert meta["ids"] == ["clip0", "clip2", "clip4"] and len(mels) == 3
    assert [(r["id"], r["reason"]) for r in meta["rejected"]] == [("clip1", "the audio does not carry its text"),
                                                                  ("clip3", "the audio does not carry its text")]
    assert meta["weights"] == f"{synth.checkpoint}@{meta['weights'][-16:]}"   # which weights made them
    assert "2 left out" in logged[-1]


def test_a_voice_the_run_was_not_trained_with_is_one_line_not_the_first_voice(tmp_path, monkeypatch):
    from pipeline.errors import PipelineError
    from pipeline.vocoder import gta
    cfg, synth = _one_shard(tmp_path, clips(3), speakers=("a", "b", "newcomer"))
    monkeypatch.setattr(gta, "load_synthesizer", lambda cfg, log: synth)
    with pytest.raises(PipelineError) as e:
        gta.build_gta_shard(cfg, 0, tmp_path / "gta" / "shard-000", log=lambda *a: None)
    assert "\n" not in str(e.value)
    assert all(s in str(e.value) for s in ("tokens/shard-000.json", "clip2", "'newcomer'", "['a', 'b', 'c']", "run.json"))


def test_teacher_forced_mels_are_the_models_inference_on_each_clip_normalised_as_in_training():
    """Each clip's GTA mel is the model's own inference-mode output (dropout off) on that clip alone,
    its mel, pitch (per speaker) and energy normalised as training normalises them (train.normalise)."""
    from pipeline.train import normalise
    model = FastPitch(**dict(FASTPITCH, dropout=0.5, predictor_dropout=0.5))
    model.speaker_embedding.embeddings.assign(tf.random.normal(model.speaker_embedding.embeddings.shape, seed=2))
    data = clips(6, seed=3)
    got = teacher_forced_mels(model, data, NORM, batch_size=4)
    for clip, mel in zip(data, got):
        one = {"tokens": clip["tokens"][None], "token_lengths": np.array([len(clip["tokens"])], np.int32),
               "mel": clip["mels"][None].astype(np.float32), "mel_lengths": np.array([len(clip["mels"])], np.int32),
               "pitch": clip["pitch"][None], "energy": clip["energy"][None], "durations": clip["durations"][None],
               "speaker": np.array([clip["speaker"]], np.int32)}
        want = model(normalise({k: tf.constant(v) for k, v in one.items()}, NORM), training=False)["mel"].numpy()[0]
        np.testing.assert_allclose(mel, want, atol=1e-5)


def test_a_gta_shard_holds_each_clips_log_mel_in_its_own_voice_and_lists_the_clips_it_lacks(tmp_path, monkeypatch):
    """The written shard: the teacher-forced mels denormalised with the run's statistics (log-mel, float16),
    each clip with its own speaker (its row in the token shard) and the run's per-speaker pitch statistics;
    a clip the mel shard has but another shard lacks gets no mel and is listed with the shard it is missing from."""
    from pipeline import config, shards
    from pipeline.vocoder import gta
    data = clips(5, seed=4)
    cfg, synth = _one_shard(tmp_path, data)
    synth.model.speaker_embedding.embeddings.assign(tf.random.normal(synth.model.speaker_embedding.embeddings.shape, seed=3))
    kept = [0, 2, 4]                             # clip1 has no mel (so no GTA mel), clip3 no pitch
    for kind, width, without in (("mels", N_MELS, 1), ("pitch", 1, 3)):
        rows = [i for i in range(5) if i != without]
        shards.write(shards.prefix(config.cache_dir(cfg), kind, 0), kind, [f"clip{i}" for i in rows],
                     [data[i][kind] for i in rows], provenance="test", width=width)
    monkeypatch.setattr(gta, "load_synthesizer", lambda cfg, log: synth)
    gta.build_gta_shard(cfg, 0, tmp_path / "gta" / "shard-000", log=lambda *a: None)
    meta, mels = shards.read(tmp_path / "gta" / "shard-000", "gta")
    assert meta["ids"] == [f"clip{i}" for i in kept]
    assert [(r["id"], r["stage"], r["reason"]) for r in meta["rejected"]] == [("clip3", "gta", "not in the pitch shard")]
    norm = {k: tf.constant(np.asarray(v, np.float32)) for k, v in synth.info["stats"].items()}
    want = teacher_forced_mels(synth.model, [data[i] for i in kept], norm)
    for mel, w in zip(mels, want):
        assert mel.dtype == np.float16
        np.testing.assert_allclose(mel.astype(np.float32), w * np.float32(2.0) - np.float32(5.0), atol=0.02)


def test_a_gta_shards_provenance_changes_with_the_checkpoints_weights_not_only_its_path(tmp_path, monkeypatch):
    """A model retrained to the same step under the same name (same checkpoint path, other weights) makes
    other GTA mels: the shard's provenance names the weights, so Snakemake remakes it."""
    from pipeline import shards
    from pipeline.vocoder import gta
    cfg, synth = _one_shard(tmp_path, clips(2))
    monkeypatch.setattr(gta, "load_synthesizer", lambda cfg, log: synth)
    gta.build_gta_shard(cfg, 0, tmp_path / "gta" / "shard-000", log=lambda *a: None)
    before = shards.read_meta(tmp_path / "gta" / "shard-000", "gta")["provenance"]
    assert before == gta.gta_provenance(cfg, synth.checkpoint)
    (tmp_path / "ckpt-5.index").write_bytes(b"retrained weights")
    assert gta.gta_provenance(cfg, synth.checkpoint) != before


def _gta_of_one_speaker(tmp_path, monkeypatch, cfg, synth, model, data):
    """The GTA shard `model` makes of `data` as a run of one speaker (no speaker table, no speaker
    statistics): each clip is in it, with its mel's frame count."""
    from pipeline import shards
    from pipeline.vocoder import gta
    synth.model, synth.speakers = model, []
    synth.info = {"stats": {k: v for k, v in synth.info["stats"].items() if not k.startswith("speaker_")}}
    monkeypatch.setattr(gta, "load_synthesizer", lambda cfg, log: synth)
    gta.build_gta_shard(cfg, 0, tmp_path / "gta" / "shard-000", log=lambda *a: None)
    meta, mels = shards.read(tmp_path / "gta" / "shard-000", "gta")
    assert meta["ids"] == ["clip0", "clip1", "clip2"] and [len(m) for m in mels] == [len(c["mels"]) for c in data]


def test_a_single_speaker_runs_gta_shard_needs_no_voice_ids(tmp_path, monkeypatch):
    """A run of one speaker has no speaker table (its run.json lists none) while its token shards still
    name each clip's speaker: its clips go through the model without a voice, not as unknown voices."""
    data = clips(3)
    cfg, synth = _one_shard(tmp_path, data, speakers=("lj", "lj", "lj"))
    _gta_of_one_speaker(tmp_path, monkeypatch, cfg, synth, FastPitch(**dict(FASTPITCH, n_speakers=1)), data)


def test_a_transformer_tts_runs_gta_shard_reads_no_duration_shard(tmp_path, monkeypatch):
    """transformer_tts learns its own alignment: a run of it has no duration shards, and its GTA job
    must not need one (nor leave clips out by one)."""
    from pipeline import config, shards
    data = clips(3)
    cfg, synth = _one_shard(tmp_path, data, speakers=("lj", "lj", "lj"))
    for suffix in (".bin", ".json"):
        shards.prefix(config.cache_dir(cfg), "durations", 0).with_suffix(suffix).unlink()
    _gta_of_one_speaker(tmp_path, monkeypatch, cfg, synth, TransformerTTS(**TRANSFORMER), data)
