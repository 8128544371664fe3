"""A run carries what made it (runs/{name}/run.json): the vocabulary, the feature statistics and
the config that shaped the model; synthesis reads the run's own, resume refuses a moved vocabulary
or setting in one line, and the logged loss is the mean since the last log line.

    python -m pytest -q tests/test_runinfo.py
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, load_json
from test_train import tiny_config

from pipeline import config, data, runinfo, symbols, text
from pipeline import train as train_mod
from pipeline.errors import PipelineError

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))


@pytest.fixture(scope="module")
def trained(built_cache, tmp_path_factory):
    """A tiny transformer_tts trained 6 steps in this process, logging every 3; each step's loss recorded."""
    tmp = tmp_path_factory.mktemp("runinfo")
    path = tiny_config(built_cache, tmp, steps=6, log_every=3, checkpoint_every=6, buckets=1)
    cfg = config.load_config(path)
    seen = []

    def recording(*args, **kwargs):
        trainer = train_mod.Trainer(*args, **kwargs)
        step = trainer.step

        def step_and_record(batch):
            terms = step(batch)
            seen.append(float(terms["total"]))
            return terms
        step_and_record.experimental_get_tracing_count = step.experimental_get_tracing_count
        trainer.step = step_and_record
        return trainer

    original, train_mod.build_trainer = train_mod.build_trainer, recording
    try:
        summary = train_mod.train(cfg, config.run_dir(cfg) / "train.json", log=lambda *a: None)
    finally:
        train_mod.build_trainer = original
    return path, cfg, summary, seen


@pytest.mark.slow
def test_logged_loss_is_the_mean_since_the_last_log_line(trained):
    _, _, summary, seen = trained
    assert [h["step"] for h in summary["history"]] == [3, 6] and [h["steps"] for h in summary["history"]] == [3, 3]
    for h, window in zip(summary["history"], (seen[:3], seen[3:])):
        assert h["total"] == pytest.approx(np.mean(window), rel=1e-5)
    assert len(set(seen)) > 1  # batches differ, so a single batch's loss would not match the mean


@pytest.mark.slow
def test_run_carries_vocabulary_statistics_and_config(trained):
    path, cfg, _, _ = trained
    run = config.run_dir(cfg)
    info = runinfo.load(run)
    index = data.read_index(cfg)
    assert info["vocab"] == index["vocab"] == text.vocabulary(cfg["text"], espeak=text.espeak_version())
    assert info["vocab"]["symbols"] == symbols.inventory("phonemes")
    np.testing.assert_allclose(info["stats"]["mel_mean"], index["mel_mean"], atol=1e-6)
    assert info["stats"]["pitch_mean"] == pytest.approx(index["pitch_mean"], abs=1e-4)
    assert info["config"]["model"] == cfg["model"] and info["config"]["audio"] == cfg["audio"]
    assert info["n_mels"] == cfg["audio"]["n_mels"]

    # synthesis reads the run's statistics, not the index's: a run.json with shifted means shows up
    saved = runinfo.path(run).read_text()
    try:
        shifted = json.loads(saved)
        shifted["stats"]["mel_mean"] = [m + 1.0 for m in shifted["stats"]["mel_mean"]]
        runinfo.path(run).write_text(json.dumps(shifted))
        from pipeline.synthesize import load_synthesizer
        synth = load_synthesizer(cfg, log=lambda *a: None)
        np.testing.assert_allclose(synth.mean, np.asarray(index["mel_mean"]) + 1.0, atol=1e-5)
        assert synth.vocab == info["vocab"]
        with pytest.raises(text.TextError, match="'س' \\(arabic letter seen\\)"):  # synthesis: one line naming them
            synth.infer("He said سلام to me.")
        with pytest.raises(text.TextError, match="gives no phonemes"):
            synth.infer("   ")

        # resuming after the data changed (other statistics): the run keeps its own, and says so
        proc = subprocess.run([sys.executable, "-m", "pipeline.train", "--config", str(path), "--set",
                               "train.steps=7"], cwd=ROOT, env=ENV, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "resuming with the run's own feature statistics" in proc.stdout
        assert json.loads(runinfo.path(run).read_text())["stats"] == shifted["stats"]
        assert load_json(run / "train.json")["resumed_from"] == 6
    finally:
        runinfo.path(run).write_text(saved)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_torn_checkpoint_is_one_line_where_the_run_speaks(trained, damage):
    # synthesize, evaluate, gta and export load the newest checkpoint: a torn one was a traceback
    from pipeline.errors import MissingCheckpoint
    from pipeline.synthesize import load_synthesizer
    _, cfg, _, _ = trained
    latest = Path(runinfo.latest_checkpoint(config.run_dir(cfg) / "checkpoints"))
    data = next(latest.parent.glob(latest.name + ".data-*"))
    raw = data.read_bytes()
    try:
        data.write_bytes(raw[:len(raw) // 2] if damage == "truncated" else raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:])
        with pytest.raises(MissingCheckpoint, match=rf"{latest.name}: does not read whole into the run's transformer_tts "
                                                    r"model \(.+\); rerun `snakemake --cores all train --forcerun train`, which sets"):
            load_synthesizer(cfg, log=lambda *a: None)
    finally:
        data.write_bytes(raw)
    assert load_synthesizer(cfg, log=lambda *a: None).checkpoint == str(latest)


@pytest.mark.slow
def test_a_speaker_the_run_does_not_have_is_one_line(trained):
    # refused before the model loads, naming the run's speakers: for the config's speaker and a sentence's
    _, cfg, _, _ = trained
    from pipeline import synthesize
    from pipeline.errors import PipelineError
    synthesize.check_before_loading(cfg)  # no name: the run's one voice
    cfg = json.loads(json.dumps(cfg))
    cfg["synthesize"]["speaker"] = "zed"
    with pytest.raises(PipelineError, match=r"^synthesize.speaker: unknown speaker 'zed'; known: data$"):
        synthesize.check_before_loading(cfg)
    cfg["synthesize"].update(speaker="", sentences=["Hi.", {"text": "Hello.", "speaker": "zed"}])
    with pytest.raises(PipelineError, match=r"^synthesize.sentences\[1\].speaker: unknown speaker 'zed'"):
        synthesize.check_before_loading(cfg)
    # a run recorded without a speaker table (its index had none): one line too, not a ValueError traceback
    info = runinfo.load(config.run_dir(cfg))
    del info["speakers"]
    with pytest.raises(PipelineError, match=r"^synthesize.speaker: unknown speaker 'zed'; known: none: the run has one"):
        synthesize.resolve_voice({"speaker": "zed", "language": ""}, info)


@pytest.mark.slow
@pytest.mark.parametrize("state_file", ["kept", "lost"])
def test_resume_on_a_moved_vocabulary_is_one_line(trained, state_file):
    # with the checkpoints' state file lost the trainer still resumes them (it lists them again), so the
    # vocabulary is checked then too: it was taken as a fresh start, run.json overwritten, and the old
    # weights trained on with the new ids
    path, cfg, _, _ = trained
    run = config.run_dir(cfg)
    saved = runinfo.path(run).read_text()
    state = run / "checkpoints" / "checkpoint"
    kept = state.read_bytes()
    if state_file == "lost":
        state.unlink()
    try:
        old = json.loads(saved)
        old["vocab"]["symbols"].remove("ʘ")  # a run trained before a symbol was added to the inventory
        runinfo.path(run).write_text(json.dumps(old))
        proc = subprocess.run([sys.executable, "-m", "pipeline.train", "--config", str(path)], cwd=ROOT, env=ENV,
                              capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        first = symbols.inventory("phonemes").index("ʘ")
        assert last.startswith(f"error: {run / 'checkpoints'}: the vocabulary changed (187 -> 188 symbols, "
                               f"first at id {first}")
        assert "give this run another `name`" in last
        assert runinfo.path(run).read_text() == json.dumps(old)     # the run's record untouched
    finally:
        runinfo.path(run).write_text(saved)
        state.write_bytes(kept)


def test_what_moved_under_a_checkpoint_is_named(tmp_path):
    cfg = config.load_config()
    index = {"n_mels": 80, "vocab": text.vocabulary(cfg["text"]), "provenance": {}, "counts": {}}
    stats = {"mel_mean": np.zeros(80), "mel_std": np.ones(80), "pitch_mean": 120.0, "pitch_std": 20.0,
             "energy_mean": 1.0, "energy_std": 1.0}
    now = runinfo.describe(cfg, index, stats)
    runinfo.write(tmp_path, now)
    assert runinfo.for_training(cfg, index, stats, tmp_path, resuming=True) == json.loads(json.dumps(now))
    other = config.load_config(overrides={"audio": {"fmax": 7000.0}, "text": {"cleaners": "basic"}})
    with pytest.raises(runinfo.RunChanged) as e:
        runinfo.for_training(other, index, stats, tmp_path, resuming=True)
    assert "text.cleaners changed ('english' -> 'basic'); audio.fmax changed (8000 -> 7000)" in str(e.value)
    chars = dict(index, vocab=text.vocabulary(dict(cfg["text"], frontend="characters")))
    with pytest.raises(runinfo.RunChanged, match=r"the vocabulary changed \(188 -> 48 symbols, first at id 2"):
        runinfo.for_training(cfg, chars, stats, tmp_path, resuming=True)
    runinfo.path(tmp_path).unlink()
    with pytest.raises(runinfo.RunChanged, match="made before runs carried their vocabulary"):
        runinfo.for_training(cfg, index, stats, tmp_path, resuming=True)
    with pytest.raises(runinfo.MissingCheckpoint, match="train first"):
        runinfo.load(tmp_path)


@pytest.mark.parametrize("text", ['{"format": 1}', "[]", '{"format": 1, "config": [], "stats": {}}'])
def test_a_run_record_of_another_shape_is_one_line(tmp_path, text):
    info = json.loads(text)
    if isinstance(info, dict):
        info["format"] = runinfo.FORMAT
    runinfo.path(tmp_path).write_text(json.dumps(info))
    with pytest.raises(PipelineError, match=r"run\.json: not a run record \(no config and stats mappings\)"):
        runinfo.load(tmp_path)


@pytest.mark.parametrize("drop", ["vocab", "n_mels", "vocab.symbols", "stats.energy_std"])
def test_a_run_record_lacking_what_a_resume_reads_is_one_line(tmp_path, drop):
    # a run.json holding config and stats but no vocabulary (hand-edited, say) stopped the resume with
    # a KeyError traceback; one without n_mels or a statistic, deeper in the trainer
    cfg = config.load_config()
    index = {"n_mels": 80, "vocab": text.vocabulary(cfg["text"]), "provenance": {}, "counts": {}}
    stats = {"mel_mean": np.zeros(80), "mel_std": np.ones(80), "pitch_mean": 120.0, "pitch_std": 20.0,
             "energy_mean": 1.0, "energy_std": 1.0}
    info = json.loads(json.dumps(runinfo.describe(cfg, index, stats)))
    section, _, key = drop.rpartition(".")
    del (info[section] if section else info)[key]
    runinfo.write(tmp_path, info)
    with pytest.raises(PipelineError, match=rf"run\.json: not a whole run record \(no {re.escape(drop)}\): restore it"):
        runinfo.for_training(cfg, index, stats, tmp_path, resuming=True)


def test_planning_refuses_an_audio_setting_the_trained_run_was_not_made_with(tmp_path, monkeypatch):
    # preflight (what Snakemake calls when it reads the config) runs the trained run's check: without it
    # planning rebuilt the caches in place at the new hop length and deleted train.json, and only then
    # did the train job refuse the run's checkpoints
    from pipeline import preflight
    cfg = config.load_config(overrides={"runs_dir": str(tmp_path), "cache": {"dir": str(tmp_path / "cache")}},
                             check_paths=False)
    monkeypatch.setattr(config, "check_dataset_paths", lambda cfg: None)  # no corpus here: the run's record alone
    index = {"n_mels": 80, "vocab": text.vocabulary(cfg["text"]), "provenance": {}, "counts": {}}
    stats = {"mel_mean": np.zeros(80), "mel_std": np.ones(80), "pitch_mean": 120.0, "pitch_std": 20.0,
             "energy_mean": 1.0, "energy_std": 1.0}
    run = config.run_dir(cfg)
    _write_trained(run, runinfo.describe(cfg, index, stats))
    preflight.preflight(cfg)                                                   # the settings it was made with
    with pytest.raises(runinfo.RunChanged, match=r"run 'demo' was trained with other settings: audio\.hop_length"):
        preflight.preflight(dict(cfg, audio={**cfg["audio"], "hop_length": 200}))


def _write_trained(run, info):
    """A run folder as training leaves it, as far as planning looks: run.json (`info`) and a checkpoint."""
    runinfo.write(run, info)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "ckpt-5.index").write_bytes(b"")


def _planning_record(tmp_path):
    """(config with its runs and caches under tmp_path, an index, statistics): what run.json is made of."""
    cfg = config.load_config(overrides={"runs_dir": str(tmp_path), "cache": {"dir": str(tmp_path / "cache")}},
                             check_paths=False)
    index = {"n_mels": 80, "vocab": text.vocabulary(cfg["text"]), "provenance": {}, "counts": {}}
    stats = {"mel_mean": np.zeros(80), "mel_std": np.ones(80), "pitch_mean": 120.0, "pitch_std": 20.0,
             "energy_mean": 1.0, "energy_std": 1.0}
    return cfg, index, stats


def test_a_cache_index_made_at_another_validation_fraction_stops_training(tmp_path):
    # a copied cache, not rebuilt after a dataset.val_fraction edit: the loader split by the index's
    # fraction while run.json recorded the config's, so the run said one split and trained on another
    cfg, index, stats = _planning_record(tmp_path)
    index = dict(index, val_fraction=0.1)
    edited = dict(cfg, dataset={**cfg["dataset"], "val_fraction": 0.0})
    where = re.escape(str(config.cache_dir(edited) / "index.json"))
    for resuming in (False, True):
        if resuming:
            runinfo.write(config.run_dir(cfg), runinfo.describe(edited, index, stats))
        with pytest.raises(runinfo.PipelineError, match=rf"^{where}: made with dataset\.val_fraction 0\.1, the config "
                                                        r"says 0\.0, and training splits by the index's: remake it "):
            runinfo.for_training(edited, index, stats, config.run_dir(cfg), resuming=resuming)
    assert runinfo.for_training(dict(cfg, dataset={**cfg["dataset"], "val_fraction": 0.1}), index, stats,
                                config.run_dir(cfg), resuming=False)["split"] == {"val_fraction": 0.1}


def test_a_new_validation_fraction_or_loss_scaling_on_a_trained_run_stops_planning(tmp_path):
    # raising it moved clips the model trained on into validation, where evaluate scored them as unseen;
    # nothing refused it (the split is a hash of each id against the fraction)
    cfg, index, stats = _planning_record(tmp_path)
    run = config.run_dir(cfg)
    info = runinfo.describe(cfg, index, stats)
    _write_trained(run, info)
    raised = dict(cfg, dataset={**cfg["dataset"], "val_fraction": 0.2})
    runinfo.check_unchanged(cfg)
    with pytest.raises(runinfo.RunChanged, match=r"run 'demo' was trained with other settings: dataset\.val_fraction "
                                                 r"changed \(0\.1 -> 0\.2: clips move between training and validation\)"):
        runinfo.check_unchanged(raised)
    # and the trainer itself, resuming
    with pytest.raises(runinfo.RunChanged, match=r"dataset\.val_fraction changed \(0\.1 -> 0\.2"):
        runinfo.for_training(raised, index, stats, run, resuming=True)
    # a run recorded before the split was: the cache index's fraction, which it last trained against
    runinfo.write(run, {k: v for k, v in info.items() if k != "split"})
    runinfo.check_unchanged(raised)  # no index: nothing says
    cache = config.cache_dir(cfg)
    cache.mkdir(parents=True)
    (cache / "index.json").write_text(json.dumps({"val_fraction": 0.1}))
    with pytest.raises(runinfo.RunChanged, match=r"dataset\.val_fraction changed \(0\.1 -> 0\.2"):
        runinfo.check_unchanged(raised)
    runinfo.check_unchanged(cfg)
    # float16's loss scaling keeps other optimizer state: the train job refused its checkpoints only
    # after Snakemake had deleted train.json; `auto` is judged where the job runs
    (run / "train.json").write_text(json.dumps({"context": {"mixed_precision": "off"}}))
    with pytest.raises(runinfo.RunChanged, match=r"train\.mixed_precision changed \('off' -> 'float16': its "
                                                 r"checkpoints were saved without float16's loss scaling"):
        runinfo.check_unchanged(dict(cfg, train={**cfg["train"], "mixed_precision": "float16"}))
    for fine in ("auto", "off", "bfloat16"):
        runinfo.check_unchanged(dict(cfg, train={**cfg["train"], "mixed_precision": fine}))


def test_a_new_seed_on_a_trained_run_stops_planning_and_training(tmp_path):
    # train.seed draws the initial weights and the batch order: a new seed resumed the old seed's
    # checkpoints (at train.steps already: no step) and train.json then reported the new seed
    cfg, index, stats = _planning_record(tmp_path)
    run = config.run_dir(cfg)
    info = runinfo.describe(cfg, index, stats)
    assert info["train"] == {"seed": cfg["train"]["seed"]}
    _write_trained(run, info)
    seed = cfg["train"]["seed"]
    reseeded = dict(cfg, train={**cfg["train"], "seed": seed + 1})
    runinfo.check_unchanged(cfg)
    with pytest.raises(runinfo.RunChanged, match=rf"run 'demo' was trained with other settings: train\.seed changed "
                                                 rf"\({seed} -> {seed + 1}: .*Nothing was run"):
        runinfo.check_unchanged(reseeded)
    with pytest.raises(runinfo.RunChanged, match=rf"train\.seed changed \({seed} -> {seed + 1}"):
        runinfo.for_training(reseeded, index, stats, run, resuming=True)
    assert runinfo.for_training(cfg, index, stats, run, resuming=True) == info
    # a run recorded before the seed was: nothing says which seed made it
    runinfo.write(run, {k: v for k, v in info.items() if k != "train"})
    runinfo.check_unchanged(reseeded)
    runinfo.for_training(reseeded, index, stats, run, resuming=True)


def test_a_voice_the_run_lacks_and_a_vocoder_without_weights_stop_planning(tmp_path):
    # both failed only inside the evaluate or diagnose job, after Snakemake had deleted its finished report
    cfg = config.load_config(overrides={"runs_dir": str(tmp_path)}, check_paths=False)
    index = {"n_mels": 80, "vocab": text.vocabulary(cfg["text"]), "provenance": {}, "counts": {}}
    stats = {"mel_mean": np.zeros(80), "mel_std": np.ones(80), "pitch_mean": 120.0, "pitch_std": 20.0,
             "energy_mean": 1.0, "energy_std": 1.0}
    runinfo.write(config.run_dir(cfg), dict(runinfo.describe(cfg, index, stats), speakers=["anna"], languages=["en-us"]))
    runinfo.check_unchanged(cfg)
    runinfo.check_unchanged(dict(cfg, synthesize=dict(cfg["synthesize"], speaker="anna")))
    with pytest.raises(PipelineError, match=r"^synthesize\.speaker: unknown speaker 'bob' in run 'demo'; known: anna$"):
        runinfo.check_unchanged(dict(cfg, synthesize=dict(cfg["synthesize"], speaker="bob")))
    with pytest.raises(PipelineError, match=r"^synthesize\.language: unknown language 'de'"):
        runinfo.check_unchanged(dict(cfg, synthesize=dict(cfg["synthesize"], language="de")))
    with pytest.raises(config.ConfigError, match=r"^diagnose\.target: vocoder, but vocoder\.kind griffin_lim"):
        config.load_config(overrides={"diagnose": {"target": "vocoder"}, "vocoder": {"kind": "griffin_lim"}},
                           check_paths=False)


def test_a_runs_dir_tensorflow_would_read_as_a_pattern_is_refused():
    # tf.train.latest_checkpoint globs: in runs[1]/ it found no checkpoint and a trained run began again
    with pytest.raises(config.ConfigError, match=r"runs_dir: 'runs\[1\]' holds \[ \], which TensorFlow reads"):
        config.load_config(overrides={"runs_dir": "runs[1]"}, check_paths=False)


def test_latest_checkpoint_is_tensorflows_without_tensorflow(tmp_path):
    import tensorflow as tf
    folder = tmp_path / "checkpoints"
    assert runinfo.latest_checkpoint(folder) is None is tf.train.latest_checkpoint(str(folder))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(folder), max_to_keep=2,
                                         checkpoint_name="ckpt")
    for step in (4, 8, 12):
        manager.save(checkpoint_number=step)
        assert runinfo.latest_checkpoint(folder) == tf.train.latest_checkpoint(str(folder)) == str(folder / f"ckpt-{step}")
    (folder / "ckpt-12.index").unlink()                                          # its index gone: no checkpoint
    assert runinfo.latest_checkpoint(folder) is None is tf.train.latest_checkpoint(str(folder))
    (folder / "checkpoint").write_bytes(b"\xff\xfe damaged")
    assert runinfo.latest_checkpoint(folder) is None


def test_a_checkpoint_retrained_under_the_same_path_is_another_identity(tmp_path):
    """What was made from a checkpoint (GTA mels, a vocoder fine-tuned on them) names it by its weights:
    a model trained again from scratch to the same step, at the same path, is not taken for the old one."""
    import shutil

    import tensorflow as tf

    def save(folder, value):
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(tf.fill([64], value))), str(folder),
                                             max_to_keep=1, checkpoint_name="ckpt")
        return manager.save(checkpoint_number=800)

    first = save(tmp_path / "checkpoints", 1.0)
    before = runinfo.checkpoint_identity(first)
    assert before.startswith(f"{first}@") and before == runinfo.checkpoint_identity(first)
    assert runinfo.checkpoint_path(before) == first == runinfo.checkpoint_path(first)  # a bare path (older records)
    shutil.rmtree(tmp_path / "checkpoints")                                     # "delete runs/{name}/checkpoints"
    again = save(tmp_path / "checkpoints", 2.0)                                 # ... and train to the same step
    assert again == first and runinfo.checkpoint_identity(again) != before
    shutil.rmtree(tmp_path / "checkpoints")
    assert runinfo.checkpoint_identity(save(tmp_path / "checkpoints", 1.0)) == before  # the same weights: the same


def test_a_speaker_the_trained_run_had_and_the_dataset_lost_stops_planning(tmp_path, capsys):
    # renaming bob to carol in a sources' metadata rebuilt the token shards in place, and then `train`
    # refused the new speaker table after Snakemake had deleted train.json
    from pipeline import preflight
    from pipeline.formats import Clip
    cfg, index, stats = _planning_record(tmp_path)
    run = config.run_dir(cfg)
    runinfo.write(run, dict(runinfo.describe(cfg, index, stats), speakers=["alice", "bob"], languages=["en-us"]))

    def left_out(*ids):  # the built cache's rejected.tsv
        config.cache_dir(cfg).mkdir(parents=True, exist_ok=True)
        (config.cache_dir(cfg) / "rejected.tsv").write_text(
            "id\tshard\tstage\tpath\treason\n" + "".join(f"{i}\t000\tmels\tx.wav\tsilent\n" for i in ids))

    def manifest(*speakers):
        return {0: [Clip(id=f"c{i}", text="Hi.", line="", lineno=i + 1, speaker=s, language="en-us")
                    for i, s in enumerate(speakers)]}

    preflight.check_manifest(cfg, manifest("alice", "carol"))  # no checkpoints yet: nothing to keep
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "ckpt-5.index").write_bytes(b"")
    preflight.check_manifest(cfg, manifest("alice", "bob"))
    with pytest.raises(runinfo.RunChanged, match=r"run 'demo' was trained with other settings: the speakers changed "
                                                 r"\(alice, bob -> alice, carol: no clip of bob is left\)\. Nothing was run"):
        preflight.check_manifest(cfg, manifest("alice", "carol"))
    # a source of a new speaker added: said at planning, not refused (a job may yet reject all of its clips,
    # which planning cannot know: a deleted or moved cache, a speaker every clip of whom was rejected)
    preflight.check_manifest(cfg, manifest("alice", "bob", "dora"))
    note = capsys.readouterr().err
    assert note.startswith("note: the dataset has speakers that run 'demo' did not train on (dora); its model has no "
                           "place for them, so `train` stops unless the caches leave out every clip of them"), note
    left_out("c2")  # ... a speaker every clip of whom the built cache left out was never in the table: nothing said
    preflight.check_manifest(cfg, manifest("alice", "bob", "dora"))
    assert capsys.readouterr().err == ""
    # a single-speaker run renamed, beside a speaker all of whose clips the cache left out: train sees one name
    runinfo.write(run, dict(runinfo.describe(cfg, index, stats), speakers=["lj"], languages=["en-us"]))
    left_out("c1")
    preflight.check_manifest(cfg, manifest("linda", "bob"))
    assert capsys.readouterr().err == ""
    left_out()  # the cache deleted: planned all the same
    preflight.check_manifest(cfg, manifest("linda", "bob"))
    assert "did not train on (bob, linda)" in capsys.readouterr().err


def test_a_one_language_run_whose_data_changed_language_is_refused(tmp_path):
    # a source's `language:` decides how its text becomes phonemes: en-us -> de passed (a table of one),
    # and the run went on learning German phonemes under a run.json saying en-us; a speaker renamed stays a label
    from pipeline import preflight
    from pipeline.formats import Clip
    cfg, index, stats = _planning_record(tmp_path)
    saved = dict(runinfo.describe(cfg, index, stats), speakers=["lj"], languages=["en-us"])
    now = dict(saved, speakers=["linda"], languages=["de"])
    assert runinfo.changes(saved, now) == ["the languages changed (en-us -> de)"]
    assert runinfo.changes(saved, dict(saved, speakers=["linda"])) == []
    run = config.run_dir(cfg)
    _write_trained(run, saved)
    clips = {0: [Clip(id="c0", text="Hallo.", line="", lineno=1, speaker="lj", language="de")]}
    with pytest.raises(runinfo.RunChanged, match=r"the languages changed \(en-us -> de: no clip of en-us is left\)"):
        preflight.check_manifest(cfg, clips)


def test_a_checkpoint_put_in_by_hand_counts_as_trained(tmp_path):
    # train.restore resumes from a checkpoint the state file names, whatever its name; planning looked for
    # ckpt-*.index only, so it refused nothing and the caches were rebuilt under the trained run
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    assert not runinfo._trained(tmp_path)
    (folder / "pretrained.index").write_bytes(b"")
    (folder / "checkpoint").write_text('model_checkpoint_path: "pretrained"\n')
    assert runinfo._trained(tmp_path) and runinfo.step_of(folder / "pretrained") is None
    # what speaks it said AttributeError ('NoneType' ... 'group') where it read the step from the name
    from types import SimpleNamespace

    from pipeline.synthesize import Synthesizer
    cfg, index, stats = _run_record(tmp_path / "record")
    info = json.loads(runinfo.path(tmp_path / "record").read_text())
    model = SimpleNamespace(infer=lambda tokens, lengths: None)
    assert Synthesizer(cfg, model, str(folder / "pretrained"), info).step is None
    assert Synthesizer(cfg, model, str(folder / "ckpt-7"), info).step == 7
    from pipeline import export
    acoustic = export._train_state(config.load_config(check_paths=False), None)
    assert acoustic["finished"] is False and export._notes({"acoustic": acoustic, "vocoder": {"trained": True}}) == [
        "the acoustic model is a checkpoint put in the run by hand: its step is not known"]


def test_text_ids_speak_a_one_language_runs_language_not_text_languages(tmp_path):
    # a German-only source under the default text.language: `pipeline.text --ids` phonemized as en-us,
    # while the voice (export.json's languages) takes only de
    from pipeline import runinfo
    vocab = {"symbols": ["_", "a"], "pad_id": 0, "eos_id": 1, "frontend": "phonemes", "language": "en-us",
             "cleaners": "basic", "espeak": None}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    for languages, spoken in ((["de"], "de"), (["de", "en-us"], "en-us"), (None, "en-us")):
        (tmp_path / "export.json").write_text(json.dumps({} if languages is None else {"languages": languages}))
        got, where = runinfo.ids_vocabulary(run=tmp_path)
        assert got["language"] == spoken and where == str(tmp_path / "vocab.json")
        assert {k: v for k, v in got.items() if k != "language"} == {k: v for k, v in vocab.items() if k != "language"}


def _run_record(tmp_path, **index_fields):
    cfg = config.load_config()
    index = {"n_mels": 80, "vocab": text.vocabulary(cfg["text"]), "provenance": {}, "counts": {}, **index_fields}
    stats = {"mel_mean": np.zeros(80), "mel_std": np.ones(80), "pitch_mean": 120.0, "pitch_std": 20.0,
             "energy_mean": 1.0, "energy_std": 1.0}
    runinfo.write(tmp_path, runinfo.describe(cfg, index, stats))
    return cfg, index, stats


def test_a_vocabulary_of_the_same_size_in_another_order_is_refused_on_resume(tmp_path):
    # ids that would speak other phonemes under the checkpoint's weights
    cfg, index, stats = _run_record(tmp_path)
    symbols_now = list(index["vocab"]["symbols"])
    symbols_now[2], symbols_now[3] = symbols_now[3], symbols_now[2]
    n = len(symbols_now)
    with pytest.raises(runinfo.RunChanged, match=rf"the vocabulary changed \({n} -> {n} symbols, first at id 2"):
        runinfo.for_training(cfg, dict(index, vocab=dict(index["vocab"], symbols=symbols_now)), stats, tmp_path,
                             resuming=True)


def test_a_speaker_table_that_shrank_is_refused_on_resume(tmp_path):
    # a two-speaker run resumed on bob's clips alone would train them as anna (id 0)
    cfg, index, stats = _run_record(tmp_path, speakers=["anna", "bob"])
    with pytest.raises(runinfo.RunChanged, match=r"the speakers changed \(anna, bob -> bob\)"):
        runinfo.for_training(cfg, dict(index, speakers=["bob"]), stats, tmp_path, resuming=True)


def test_a_pitch_setting_that_moved_under_a_checkpoint_is_named(tmp_path):
    cfg, index, stats = _run_record(tmp_path)
    other = config.load_config(overrides={"pitch": {"fmax": 500.0}})
    with pytest.raises(runinfo.RunChanged, match=r"pitch\.fmax changed \(600\.0 -> 500\.0\)"):
        runinfo.for_training(other, index, stats, tmp_path, resuming=True)


def test_a_run_record_of_another_format_is_one_line(tmp_path):
    runinfo.path(tmp_path).write_text(json.dumps({"format": runinfo.FORMAT + 1, "config": {}, "stats": {}}))
    with pytest.raises(PipelineError, match=rf"written in run format {runinfo.FORMAT + 1}, this code reads "
                                            rf"{runinfo.FORMAT}"):
        runinfo.load(tmp_path)
