"""Several speakers and languages through the loader, the models, synthesis and evaluation: batches
carry speaker/language ids (and a single-speaker cache's do not), FastPitch, the aligner and a user's
own model get the speaker tables, synthesis per speaker and its one-line errors, per-speaker pitch
normalisation, the speaker-similarity measure, an export that takes speaker and language ids.

    python -m pytest -q tests/test_voices.py
"""
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, TINY_ALIGNER, TINY_FASTPITCH, load_json, snakemake, write_config

from pipeline import align, config, data, manifest, metrics, shards, synthesize, train
from pipeline.durations import mas
from pipeline.graphscan import scan_pyfunc_ops
from pipeline.models import aligner_numpy

SPEAKERS = {"anna": "en-us", "bob": "en-us", "cy": "en-gb"}


@pytest.fixture(scope="session")
def voices_cache(tmp_path_factory, corpus_template):
    """A csv-format corpus of three speakers (8 clips each, cy in en-gb) with caches and durations."""
    tmp = tmp_path_factory.mktemp("voices")
    root = tmp / "voices"
    (root / "wavs").mkdir(parents=True)
    rows = ["audio_file|text|speaker|language"]
    dealt = {True: 0, False: 0}  # speakers dealt in turn among validation and training clips apart
    for line in (corpus_template / "metadata.csv").read_text().splitlines():
        cid, text = line.split("|")[0], line.split("|")[-1]
        val = manifest.is_validation(f"v-{cid}", 0.5)
        speaker = list(SPEAKERS)[dealt[val] % 3]
        dealt[val] += 1
        shutil.copy(corpus_template / "wavs" / f"{cid}.wav", root / "wavs")
        rows.append(f"wavs/{cid}.wav|{text}|{speaker}|{SPEAKERS[speaker]}")
    (root / "metadata.csv").write_text("\n".join(rows) + "\n")
    path = write_config(tmp, root, dataset={"sources": [{"root": str(root), "format": "csv", "name": "v"}],
                                            "val_fraction": 0.5},  # validation clips of every speaker
                        aligner=TINY_ALIGNER, model={"kind": "fastpitch", "fastpitch": TINY_FASTPITCH},
                        train={"batch_size": 4, "buckets": 2, "learning_rate": 0.003, "warmup_steps": 5,
                               "log_every": 5, "summary_every": 1000},
                        synthesize={"max_seconds": 1.0, "griffin_lim_iters": 4}, vocoder={"kind": "griffin_lim"})
    snakemake("durations", config=path)
    return path


def _speaker_of_clip(cfg):
    rows = (config.load_config(cfg)["dataset"]["sources"][0]["root"] + "/metadata.csv")
    lines = open(rows).read().splitlines()[1:]
    return {"v-" + line.split("|")[0].split("/")[1][:-4]: line.split("|")[2] for line in lines}


@pytest.mark.slow
def test_batches_carry_speaker_and_language_ids(voices_cache):
    cfg = config.load_config(voices_cache)
    index = data.read_index(cfg)
    assert index["speakers"] == ["anna", "bob", "cy"] and index["languages"] == ["en-gb", "en-us"]
    ids = data.clip_ids(cfg, "all")
    ds = data.build_dataset(cfg, "all", repeat=False, shuffle=False, drop_remainder=False, with_clip_index=True)
    assert scan_pyfunc_ops(ds) == []
    truth, seen = _speaker_of_clip(voices_cache), 0
    for batch in ds:
        assert batch["speaker"].dtype == tf.int32 and batch["language"].dtype == tf.int32
        assert batch["speaker"].shape == batch["token_lengths"].shape
        for clip, s, lang in zip(batch["clip"].numpy(), batch["speaker"].numpy(), batch["language"].numpy()):
            speaker = truth[ids[clip]]
            assert index["speakers"][s] == speaker and index["languages"][lang] == SPEAKERS[speaker]
            seen += 1
    assert seen == len(ids) == 24
    # train.balance: speaker keeps the bucket shapes and stays free of Python ops
    balanced = data.build_dataset(cfg, "train", balance=True)
    assert scan_pyfunc_ops(balanced) == []
    shapes = {tuple(s) for s in data.bucket_shapes(cfg)[1]}
    for batch in balanced.take(4):
        assert (batch["tokens"].shape[1], batch["mel"].shape[1]) in shapes and batch["speaker"].shape == (4,)


@pytest.mark.slow
def test_the_aligner_hears_each_clips_speaker_and_language(voices_cache):
    cfg = config.load_config(voices_cache)
    aligner_json = next((config.run_dir(cfg) / "aligner").glob("*/aligner.json"))
    info = load_json(aligner_json)
    assert info["speakers"] == ["anna", "bob", "cy"] and info["languages"] == ["en-gb", "en-us"]
    model, info = align.load_aligner(cfg, aligner_json)
    assert model.speaker_embedding.input_dim == 3 and model.language_embedding.input_dim == 2
    assert {"speaker_embedding", "language_embedding"} <= {v.path.split("/")[-2] for v in model.trainable_weights}
    assert aligner_numpy.voice_ids(info, "cy", "en-gb") == {"speaker": 2, "language": 0}
    assert aligner_numpy.voice_ids(info, "zed", "fr") == {"speaker": -1, "language": -1}   # a source added since
    meta, arrays = shards.read(shards.prefix(config.cache_dir(cfg), "tokens", 0), "tokens")
    mels = dict(zip(*(lambda m, a: (m["ids"], a))(*shards.read(shards.prefix(config.cache_dir(cfg), "mels", 0), "mels"))))
    to_id = {ord(c): i for i, c in enumerate(info["vocab"])}
    ids = np.array([to_id[int(c)] for c in arrays[0]], np.int32)
    mel = mels[meta["ids"][0]]
    heard = [align.log_probs(model, info, ids, mel, {"speaker": s, "language": 1}) for s in (0, 1, -1)]
    assert heard[0].shape == (len(mel), len(ids)) and all(np.isfinite(h).all() for h in heard)
    assert not np.allclose(heard[0], heard[1])                                     # the speaker's vector counts
    assert not np.allclose(heard[0], align.log_probs(model, info, ids, mel, {"speaker": 0, "language": 0}))
    # the duration shards were made with each clip's own speaker and language, from this aligner (its
    # NumPy forward pass in the jobs: the TensorFlow model's durations, clip for clip in shard 0)
    for k in range(cfg["cache"]["shards"]):
        dmeta, durations = shards.read(shards.prefix(config.cache_dir(cfg), "durations", k), "durations")
        assert dmeta["provenance"]["aligner"] == info["weights_digest"]
        assert all(d.sum() == f for d, f in zip(durations, dmeta["frames"]))
        if k == 0:
            for i, (cid, points, d) in enumerate(zip(meta["ids"], arrays, durations)):
                if cid not in mels or len(mels[cid]) < len(points):
                    continue
                voices = aligner_numpy.voice_ids(info, meta["speakers"][i], meta["languages"][i])
                ids = np.array([to_id[int(c)] for c in points], np.int32)
                want = mas(align.log_probs(model, info, ids, mels[cid], voices))
                np.testing.assert_array_equal(d, want, err_msg=cid)


def test_a_single_speaker_aligner_has_no_voice_table():
    from pipeline.models import aligner
    acfg = config.load_config(None, {"aligner": TINY_ALIGNER}, check_paths=False)["aligner"]
    one = {"speakers": ["lj"], "languages": ["en-us"]}
    assert align.voice_tables(one) == {}                                           # aligner.json as before
    model = aligner.build(acfg, ["_", "~", "a", "b"], 8, **align.voice_tables(one))
    assert model.speaker_embedding is None and model.language_embedding is None
    assert sorted("/".join(v.path.split("/")[-2:]) for v in model.weights) == [  # the weights of before
        "embedding/embeddings", "key0/bias", "key0/kernel", "key1/bias", "key1/kernel", "query0/bias",
        "query0/kernel", "query1/bias", "query1/kernel", "query2/bias", "query2/kernel"]
    assert model.needs == ("tokens", "token_lengths", "mel", "mel_lengths")
    two = aligner.build(acfg, ["_", "~", "a", "b"], 8, languages=["de", "en"])      # languages alone
    assert two.speaker_embedding is None and two.language_embedding.input_dim == 2 and "language" in two.needs


def test_a_single_speaker_cache_has_no_speaker_field(built_cache):
    cfg = config.load_config(built_cache)
    batch = next(iter(data.build_dataset(cfg, "all", repeat=False, shuffle=False, drop_remainder=False)))
    assert "speaker" not in batch and "language" not in batch
    assert data.read_index(cfg)["speakers"] == ["data"]  # the folder's name


def test_speaker_balance_repeats_the_smaller_speakers_clips():
    n = 13 + 4 + 1
    speaker = np.array([0] * 13 + [1] * 4 + [2])
    clips = data.Clips(ids=[f"c{i}" for i in range(n)], shard=np.zeros(n, np.int64), val=np.zeros(n, bool),
                       n_tokens=np.ones(n, np.int64), frames=np.arange(n), offsets={"mels": np.arange(n)},
                       speaker=speaker, language=np.zeros(n, np.int64))
    out = clips.balanced()
    assert np.bincount(out.speaker).tolist() == [13, 12, 13]  # 4 clips x 3, 1 clip x 13
    assert out.ids.count("c17") == 13 and out.ids.count("c0") == 1
    assert (out.offsets["mels"] == out.frames).all()  # every column moves with its row


def test_pitch_is_normalised_per_speaker():
    norm = {"mel_mean": tf.zeros([2]), "mel_std": tf.ones([2]), "pitch_mean": 150.0, "pitch_std": 50.0,
            "speaker_pitch_mean": tf.constant([100.0, 200.0]), "speaker_pitch_std": tf.constant([10.0, 20.0])}
    batch = {"mel": tf.zeros([2, 3, 2]), "pitch": tf.constant([[110.0, 0.0, 90.0], [220.0, 180.0, 0.0]]),
             "speaker": tf.constant([0, 1], tf.int32)}
    out = train.normalise(batch, norm)["pitch"].numpy()
    np.testing.assert_allclose(out, [[1.0, 0.0, -1.0], [1.0, -1.0, 0.0]])  # unvoiced stays 0


def test_speaker_similarity_and_its_chance():
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 5, (3, 4))
    speakers = [s for s in range(3) for _ in range(4)]
    recorded = centres[speakers] + rng.normal(0, 0.5, (12, 4))
    right = metrics.speaker_similarity(recorded, centres[speakers] + rng.normal(0, 0.5, (12, 4)), speakers)
    assert right == {"accuracy": 1.0, "chance": 1 / 3, "clips": 12}
    wrong = metrics.speaker_similarity(recorded, centres[[(s + 1) % 3 for s in speakers]], speakers)
    assert wrong["accuracy"] == 0.0
    assert metrics.speaker_similarity(recorded, recorded, [0] * 12) is None


def test_a_feature_the_recordings_do_not_spread_over_is_left_out():
    # recordings with under two voiced frames all have the pitch pair [0, 0]: scaled by 1e-9, a voiced
    # synthesis's pitch drowned every other feature and every clip went to the first speaker (chance)
    rng = np.random.default_rng(1)
    centres = np.array([[3.0, 3.0, 3.0, 0.0, 0.0], [-3.0, -3.0, -3.0, 0.0, 0.0]])   # apart in every cepstral one
    speakers = [s for s in range(2) for _ in range(3)]
    recorded = centres[speakers] + np.hstack([rng.normal(0, 0.3, (6, 3)), np.zeros((6, 2))])
    voiced = recorded + np.hstack([rng.normal(0, 0.3, (6, 3)), np.full((6, 2), [4.8, 0.1])])
    assert metrics.speaker_similarity(recorded, voiced, speakers) == {"accuracy": 1.0, "chance": 0.5, "clips": 6}
    assert metrics.speaker_similarity(np.zeros((6, 5)), voiced, speakers) is None   # nothing tells them apart


def test_a_clips_own_recording_is_left_out_of_its_speakers_centroid():
    # every synthesized clip a copy of its own recording, each speaker's other recording nearer the other
    # speaker's centroid: sharing the words must not count, so no clip reads as its own voice
    recorded = np.array([[0.0], [4.0], [1.5], [2.9]])
    assert metrics.speaker_similarity(recorded, recorded, ["a", "a", "b", "b"])["accuracy"] == 0.0


def test_speaker_features_are_weighed_by_their_spread_over_the_recordings():
    # feature 0 spreads widely within each voice (+-10) and tells them apart by 5; feature 1 spreads by
    # 0.1 and tells them apart by 1 (a voice's pitch register). z-scored, a clip 4 off its voice in
    # feature 0 and on it in feature 1 is that voice; in raw units feature 0 alone would decide
    recorded = np.array([[-10, 0.0], [10, 0.1], [-10, -0.1], [10, 0.0], [-5, 1.0], [15, 1.1], [-5, 0.9], [15, 1.0]])
    synthesized = np.array([[4, 0.0]] * 4 + [[1, 1.0]] * 4)
    assert metrics.speaker_similarity(recorded, synthesized, ["a"] * 4 + ["b"] * 4)["accuracy"] == 1.0


def test_a_smoother_copy_of_a_voice_still_reads_as_that_voice():
    # a synthesized clip is smoother than a recording (less cepstral movement over frames) whoever
    # speaks; the voice feature must follow the envelope's average and the pitch, not that spread
    # (the voices' spreads differ, as en-us+m3's and en-us+f2's do, so a smoothed "low" moves onto "high")
    rng = np.random.default_rng(1)
    frames, mean_f0, spread = 200, {"low": 100.0, "high": 110.0}, {"low": 1.0, "high": 0.75}
    envelope = {"low": rng.normal(0, 0.3, 25), "high": rng.normal(0, 0.3, 25)}

    def clip(name, smoothing):
        mc = envelope[name] + rng.normal(0, spread[name] * smoothing, (frames, 25))
        return mc, mean_f0[name] * np.exp(rng.normal(0, 0.1, frames))

    recorded = [metrics.speaker_feature(*clip(n, 1.0)) for n in ("low", "high") for _ in range(3)]
    smooth = [metrics.speaker_feature(*clip(n, 0.77)) for n in ("low", "high") for _ in range(3)]
    speakers = ["low"] * 3 + ["high"] * 3
    assert len(recorded[0]) == 24 + 2
    assert metrics.speaker_similarity(recorded, smooth, speakers)["accuracy"] == 1.0


def test_a_clips_pitch_features_are_measured_over_two_voiced_frames_or_more():
    # the mean and spread of log F0 over a clip's voiced frames; one voiced frame (a voicing blip in a
    # whisper) has no spread to measure and counts as none: both [0, 0], not a flat intonation at its F0
    mc, f0 = np.zeros((6, 25)), np.zeros(6)
    none = metrics.speaker_feature(mc, f0)
    f0[2] = 200.0
    one = metrics.speaker_feature(mc, f0)
    f0[4] = 100.0
    two = metrics.speaker_feature(mc, f0)
    assert none[-2:].tolist() == one[-2:].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(two[-2:], [np.log(np.sqrt(200.0 * 100.0)), np.log(2.0) / 2])


def _run(module, path, *args, check=True, cwd=ROOT, pythonpath=""):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(filter(None, [pythonpath, str(ROOT)])))
    proc = subprocess.run([sys.executable, "-m", module, "--config", str(path), *args], cwd=cwd, env=env,
                          capture_output=True, text=True)
    if check and proc.returncode:
        raise AssertionError(proc.stdout[-2000:] + proc.stderr[-3000:])
    return proc


def _main(module, path, *args):
    """`python -m module --config path *args` as its main in this process, which has TensorFlow already
    (a subprocess would import it again: ~6 CPU s). The fixture below trains in its own process."""
    importlib.import_module(module).main(["--config", str(path), *map(str, args)])


@pytest.fixture(scope="module")
def voices_run(voices_cache):
    """voices_cache's config, its FastPitch trained for 10 steps (runs/t)."""
    _run("pipeline.train", voices_cache, "--set", "train.steps=10")
    return voices_cache


@pytest.mark.slow
def test_fastpitch_with_speakers_trains_and_speaks_each_voice(voices_run, tmp_path, capsys):
    voices_cache = voices_run
    cfg = config.load_config(voices_cache)
    sentences = [{"text": "Hello there.", "speaker": s} for s in SPEAKERS] + \
                [{"text": "Hello there.", "speaker": "cy", "language": "en-gb"}]
    over = tmp_path / "over.yaml"
    over.write_text(json.dumps({**json.loads(json.dumps(cfg)), "synthesize": {**cfg["synthesize"],
                                                                              "sentences": sentences}}))
    _main("pipeline.synthesize", over, "--out", tmp_path / "samples")
    samples = load_json(tmp_path / "samples" / "sentences.json")["samples"]
    assert [(x["speaker"], x["language"]) for x in samples] == [("anna", "en-us"), ("bob", "en-us"), ("cy", "en-us"),
                                                                ("cy", "en-gb")]
    mels = [np.load(x["mel"]) for x in samples]
    assert not np.allclose(mels[0][:5], mels[1][:5])  # the speaker embedding changes the output

    # the command's one-line errors (its main, in this process: the test process has TensorFlow already)
    def failing_synthesize(*args):
        with pytest.raises(SystemExit) as stop:
            synthesize.main(["--config", *map(str, args)])
        return stop.value.code, capsys.readouterr().err

    code, err = failing_synthesize(voices_cache, "--set", "synthesize.speaker=zed", "--out", tmp_path / "zed")
    assert code == 2 and err.strip().splitlines()[-1] == \
        "error: synthesize.speaker: unknown speaker 'zed'; known: anna, bob, cy"
    sentences[1]["language"] = "fr"
    over.write_text(json.dumps({**json.loads(json.dumps(cfg)), "synthesize": {**cfg["synthesize"],
                                                                              "sentences": sentences}}))
    code, err = failing_synthesize(over, "--out", tmp_path / "bad")
    assert code == 2 and "synthesize.sentences[1].language: unknown language 'fr'; known: en-gb, en-us" in err
    assert not (tmp_path / "bad" / "00.wav").exists() and not (tmp_path / "zed").exists()  # checked first
    # in a process of its own: refused before TensorFlow and the model load
    probe = ("import runpy, sys\ntry:\n    runpy.run_module('pipeline.synthesize', run_name='__main__')\n"
             "finally:\n    print('tensorflow loaded:', 'tensorflow' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe, "--config", str(over), "--out", str(tmp_path / "bad")],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout.strip() == "tensorflow loaded: False", proc.stderr[-3000:]
    assert proc.stderr.strip() == "error: synthesize.sentences[1].language: unknown language 'fr'; known: en-gb, en-us"

    # evaluate: every figure per speaker, and the speaker similarity with its chance level
    _main("pipeline.evaluate", voices_cache, "--out", tmp_path / "report", "--set", "evaluate.max_clips=9",
          "evaluate.griffin_lim_iters=4")
    report = load_json(tmp_path / "report" / "evaluate.json")
    per = report["per_speaker"]
    assert set(per) == set(SPEAKERS) and sum(r["clips"] for r in per.values()) == report["clips"] == 7
    assert sorted(r["clips"] for r in per.values()) == [2, 2, 3] and all(r["mcd_db"] > 0 for r in per.values())
    sim = report["speaker_similarity"]
    assert sim["chance"] == pytest.approx(1 / 3) and 0 <= sim["accuracy"] <= 1 and sim["clips"] == 7
    md = (tmp_path / "report" / "evaluate.md").read_text()
    assert "Speaker similarity" in md
    # ... every figure: the listening measures and the ceiling too (per speaker only MCD, F0 and length were)
    assert all({"recording", "synthesized"} <= set(r["mos"]) and "griffin_lim_ceiling" in r["pesq"]
               for r in per.values())
    assert "| speaker | clips | MCD dB | ceiling dB | chance dB | length ratio | F0 RMSE Hz | MOS (recording) |" in md


USER_MODEL = """
    import tensorflow as tf, keras

    class Tiny(keras.Model):
        needs = ("tokens", "token_lengths", "mel", "mel_lengths", "speaker")

        def __init__(self, n_symbols, n_mels, n_speakers):
            super().__init__()
            self.embed, self.out = keras.layers.Embedding(n_symbols, 8), keras.layers.Dense(n_mels)
            self.voice = keras.layers.Embedding(n_speakers, 8)

        def call(self, batch, training=False):
            h = tf.reduce_mean(self.embed(batch["tokens"]), axis=1) + self.voice(batch["speaker"])  # (B, 8)
            return {"mel": tf.tile(self.out(h)[:, None], [1, tf.shape(batch["mel"])[1], 1])}

        def tts_loss(self, outputs, batch):
            mask = tf.sequence_mask(batch["mel_lengths"], tf.shape(batch["mel"])[1], tf.float32)[:, :, None]
            loss = tf.reduce_sum(tf.abs(outputs["mel"] - batch["mel"]) * mask) / tf.reduce_sum(mask) / 80.0
            return loss, {"mel": loss, "total": loss}

        def infer(self, tokens, token_lengths, *, pace=1.0, pitch_shift=0.0, max_frames, speaker=None):
            h = tf.reduce_mean(self.embed(tokens), axis=1) + self.voice(speaker)
            return {"mel": tf.tile(self.out(h)[:, None], [1, 20, 1]), "lengths": tf.fill([tf.shape(tokens)[0]], 20)}

    def build(model_cfg, vocab, n_mels, *, speakers):
        assert speakers == ["anna", "bob", "cy"], speakers
        return Tiny(len(vocab), n_mels, len(speakers))
"""


@pytest.mark.slow
def test_a_users_own_model_receives_the_speakers(voices_cache, tmp_path):
    (tmp_path / "my_voices.py").write_text(textwrap.dedent(USER_MODEL))
    cfg = json.loads(json.dumps(config.load_config(voices_cache)))
    cfg["model"]["kind"] = "my_voices:build"
    cfg["runs_dir"] = str(tmp_path / "runs")
    path = tmp_path / "user.yaml"
    path.write_text(json.dumps(cfg))
    _run("pipeline.train", path, "--set", "train.steps=5", pythonpath=str(tmp_path))
    _run("pipeline.synthesize", path, "--set", "synthesize.speaker=bob", pythonpath=str(tmp_path))
    samples = load_json(tmp_path / "runs" / "t" / "samples" / "sentences.json")["samples"]
    assert {x["speaker"] for x in samples} == {"bob"} and all(x["frames"] == 20 for x in samples)


def test_shipped_voices_config_is_valid():
    cfg = config.load_config(ROOT / "configs" / "voices.yaml", check_paths=False)
    assert cfg["dataset"]["sources"] == [{"root": "data/voices", "format": "csv", "name": "voices"}]
    assert [x["speaker"] for x in cfg["synthesize"]["sentences"]] == ["en-us+m3", "en-us+f2", "en-gb+m1"]


@pytest.mark.parametrize("kind", ["fastpitch", "transformer_tts"])
def test_built_in_models_take_speaker_and_language_ids(kind):
    from pipeline import models
    cfg = config.load_config(None, {"model": {"kind": kind, "fastpitch": TINY_FASTPITCH,
                                              "transformer_tts": {"d_model": 16, "heads": 2, "ffn_dim": 16,
                                                                  "prenet_dim": 16, "postnet_channels": 8,
                                                                  "prenet_dropout": 0.0}}}, check_paths=False)
    one = models.build(cfg["model"], ["_", "~", "a", "b"], 8)
    many = models.build(cfg["model"], ["_", "~", "a", "b"], 8, speakers=["x", "y", "z"], languages=["de", "en"])
    assert "speaker_embedding" not in {v.path.split("/")[-2] for v in one.weights}  # one speaker: no table
    assert many.speaker_embedding.input_dim == 3 and many.language_embedding.input_dim == 2
    batch = models.dummy_batch(5, 8, 8, ("speaker", "language"))
    mels = [many(dict(batch, speaker=tf.constant([s], tf.int32)))["mel"].numpy() for s in (0, 1)]
    assert not np.allclose(mels[0], mels[1])  # the speaker's vector changes the output
    tokens, lengths = tf.constant([[2, 3, 2, 1]]), tf.constant([4])
    out = many.infer(tokens, lengths, max_frames=8, speaker=tf.constant([2]), language=tf.constant([1]))
    assert out["mel"].shape[-1] == 8


def test_speaker_balance_on_a_single_speaker_cache_is_an_error(built_cache):
    cfg = config.load_config(built_cache, {"train": {"balance": "speaker"}, "model": {"kind": "transformer_tts"}})
    with pytest.raises(config.ConfigError, match="train.balance: speaker needs several speakers"):
        train.Trainer(cfg)


@pytest.mark.slow
def test_export_takes_speaker_and_language_ids(voices_run, tmp_path, capsys):
    from pipeline import text
    from pipeline.synthesize import load_synthesizer
    cfg = config.load_config(voices_run)
    _main("pipeline.export", voices_run, "--out", tmp_path / "export", "--tflite")
    capsys.readouterr()  # the export's log: text --ids below prints the one line read
    meta = load_json(tmp_path / "export" / "export.json")
    assert meta["speakers"] == ["anna", "bob", "cy"] and meta["languages"] == ["en-gb", "en-us"]  # id order
    assert list(meta["signature"]["inputs"]) == ["tokens", "pace", "pitch_shift", "speaker", "language"]
    assert meta["signature"]["inputs"]["speaker"] == "int32 [], an index into speakers"
    voice = tf.saved_model.load(str(tmp_path / "export" / "saved_model"))
    synth = load_synthesizer(cfg, log=lambda *a: None)
    ids = tf.constant([synth.encode("Hello there.")], tf.int32)
    args = dict(tokens=ids, pace=tf.constant(1.0), pitch_shift=tf.constant(0.0), language=tf.constant(1))
    said = [voice.signatures["synthesize"](**args, speaker=tf.constant(s))["audio"].numpy()[0] for s in (0, 1)]
    assert said[0].shape != said[1].shape or not np.allclose(said[0], said[1])   # two voices, two audios
    mel = voice.log_mel(ids, args["pace"], args["pitch_shift"], tf.constant(1), tf.constant(1))["log_mel"][0]
    np.testing.assert_allclose(mel, synth.infer("Hello there.", speaker="bob")["mel"], atol=1e-5)  # as synthesize
    with pytest.raises(tf.errors.InvalidArgumentError, match="speaker: an id outside 0..2"):
        voice.signatures["synthesize"](**args, speaker=tf.constant(3))
    # TFLite: the same inputs, checked in the interpreter before it was written
    assert meta["tflite"]["float32"]["file"] == "model.tflite" and meta["tflite"]["float32"]["ops"] == "builtin"
    runner = tf.lite.Interpreter(model_path=str(tmp_path / "export" / "model.tflite")).get_signature_runner("synthesize")
    heard = runner(tokens=ids.numpy(), pace=np.float32(1.0), pitch_shift=np.float32(0.0), speaker=np.int32(1),
                   language=np.int32(1))["audio"][0]
    np.testing.assert_allclose(heard, said[1], atol=1e-3 * np.abs(said[1]).max())   # bob's voice, in TFLite too
    for field, bad in (("speaker", -1), ("language", -1), ("speaker", 3)):  # -1 spoke as the last voice
        with pytest.raises(RuntimeError, match="out of bounds"):
            runner(tokens=ids.numpy(), pace=np.float32(1.0), pitch_shift=np.float32(0.0),
                   **{"speaker": np.int32(1), "language": np.int32(1), field: np.int32(bad)})
    # the ids of a sentence in another of the model's languages
    text.main(["--ids", "Hello there.", "--run", str(tmp_path / "export"), "--language", "en-gb"])
    assert json.loads(capsys.readouterr().out) == synth.encode("Hello there.", "en-gb") != synth.encode("Hello there.")
