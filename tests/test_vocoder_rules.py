"""The vocoder in the DAG: the session's real `snakemake synthesize vocoder` on a tiny corpus (aligner,
FastPitch, Vocos, GTA shards, fine-tuning: conftest.trained_run), then the staleness contract with
exact job counts, and `pipeline.vocode` on a synthesized NN.npy with its one-line errors.

    python -m pytest -q tests/test_vocoder_rules.py
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from conftest import ROOT, edited_copy, planned_jobs, snakemake

from pipeline import config, manifest, runinfo, shards

pytestmark = pytest.mark.slow
SHARDS = 2  # conftest.trained_run's cache.shards


@pytest.fixture
def trained(trained_run):
    """The session's trained run (conftest.trained_run): these tests only plan edits (dry runs), restore
    what they change, and add only `snakemake export`'s own outputs."""
    return trained_run


def test_the_vocoder_phases_and_gta_mels_have_the_recorded_frame_counts(trained):
    run, cache = trained.run, config.cache_dir(trained.cfg)
    final = json.loads((run / "vocoder.json").read_text())
    assert final["kind"] == "vocos" and final["phase"] == "finetune"
    assert (final["steps"], final["finetune_steps"]) == (10, 4) and final["checkpoint"].endswith("ckpt-4")
    assert json.loads((run / "vocoder/train.json").read_text())["checkpoint"].endswith("ckpt-10")
    for k in range(SHARDS):
        gta = shards.read_meta(run / f"gta/shard-{k:03d}", "gta")
        mels = shards.read_meta(shards.prefix(cache, "mels", k), "mels")
        assert gta["ids"] == mels["ids"] and gta["lengths"] == mels["lengths"]  # exactly the recorded frames
    sentences = json.loads((run / "samples/sentences.json").read_text())
    assert sentences["vocoder"] == {"kind": "vocos", "steps": 10, "finetune_steps": 4, "finetune_share": 0.75}


def test_gta_mels_are_normalised_with_the_runs_statistics_not_the_caches(trained, tmp_path, monkeypatch):
    # a dataset edit moves the cache's statistics under the trained model; the GTA mels must still be
    # what the model makes of its inputs normalised as training normalised them (the run's run.json)
    from pipeline import data
    from pipeline.vocoder import gta
    moved = data.feature_stats(trained.cfg)
    moved = {k: np.asarray(v, np.float32) * 1.5 + 0.5 for k, v in moved.items()}
    monkeypatch.setattr(data, "feature_stats", lambda cfg, index=None: moved)
    gta.build_gta_shard(trained.cfg, 0, tmp_path / "shard-000", log=lambda *a: None)
    (meta, made), (kept_meta, kept) = shards.read(tmp_path / "shard-000", "gta"), shards.read(trained.run / "gta/shard-000", "gta")
    assert meta["ids"] == kept_meta["ids"] and len(made) == len(meta["ids"]) > 0
    for a, b in zip(made, kept):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=1e-2)


def test_fine_tuning_resumes_on_gta_mels_that_came_out_the_same(trained, tmp_path):
    # the fine-tuning's resume key names the GTA mels by content: a GTA rerun that made the same bytes
    # (another provenance: a code edit, a rerun on moved params) resumes; other mels restart it
    from pipeline.vocoder import train as vtrain
    phase = tmp_path / "finetune"
    shutil.copytree(trained.run / "vocoder/finetune", phase)
    meta_path = (trained.run / "gta/shard-000").with_suffix(".json")
    saved = meta_path.read_text()
    logged = []
    try:
        vtrain._forget_other_inputs(trained.cfg, "finetune", phase, logged.append)
        assert logged == [] and (phase / "checkpoints").exists()
        meta = json.loads(saved)
        meta_path.write_text(json.dumps({**meta, "provenance": "made by other code, the same bytes"}))
        vtrain._forget_other_inputs(trained.cfg, "finetune", phase, logged.append)
        assert logged == [] and (phase / "checkpoints").exists()
        meta_path.write_text(json.dumps({**meta, "checksum": "0123456789abcdef"}))   # other mels
        vtrain._forget_other_inputs(trained.cfg, "finetune", phase, logged.append)
        assert len(logged) == 1 and "set aside" in logged[0] and not (phase / "checkpoints").exists()
    finally:
        meta_path.write_text(saved)


def _generator_weights(summary, checkpoint):
    """{variable path: value} of the generator in `checkpoint`, built as the vocoder `summary` was trained."""
    from pipeline.vocoder import kinds
    model = kinds.build(summary["vocoder"], summary["audio"])
    kinds.restore(model, checkpoint, "the run's vocoder.json", summary["vocoder"]["kind"])
    return {w.path: w.numpy() for w in model.weights}


def test_the_shipped_vocoder_interpolates_the_first_phase_and_the_fine_tuned_weights(trained):
    final = json.loads((trained.run / "vocoder.json").read_text())
    first = json.loads((trained.run / "vocoder/train.json").read_text())["checkpoint"]
    share = final["finetune_share"]  # conftest.TINY_VOCODER's 0.75: the two sides' weights differ
    assert share == 0.75 and final["checkpoint"].endswith(os.path.join("finetune", "shipped", "ckpt-4"))
    assert final["trained_checkpoint"].endswith(os.path.join("finetune", "checkpoints", "ckpt-4"))
    # the fine-tuning names the first phase and the GTA mels by their weights, not their paths alone
    assert json.loads((trained.run / "vocoder/finetune/inputs.json").read_text())["from"] == runinfo.checkpoint_identity(first)
    acoustic = runinfo.latest_checkpoint(trained.run / "checkpoints")
    for k in range(SHARDS):
        assert shards.read_meta(trained.run / f"gta/shard-{k:03d}", "gta")["provenance"] == shards.digest(
            shards.provenance("mels", trained.cfg), runinfo.checkpoint_identity(acoustic),
            shards.code_digest("vocoder/gta.py"))
    shipped, a, b = (list(_generator_weights(final, c).items())
                     for c in (final["checkpoint"], first, final["trained_checkpoint"]))
    assert len(shipped) > 4 and all(len(x) == len(shipped) for x in (a, b))
    assert any(not np.allclose(x, y) for (_, x), (_, y) in zip(a, b))  # fine-tuning moved the weights
    for (name, w), (_, x), (_, y) in zip(shipped, a, b):
        np.testing.assert_allclose(w, (1 - share) * x + share * y, rtol=1e-6, atol=1e-7, err_msg=name)
    # both sides scored on the same validation crops, so a bad interpolation shows in the summary
    losses = final["shipped_val_loss"]
    assert set(losses) == {"shipped", "fine_tuned"} and losses["shipped"] != losses["fine_tuned"]
    assert all(np.isfinite(v[k]) and v[k] > 0 for v in losses.values() for k in ("mel", "stft"))


def test_nothing_changed_means_nothing_to_do(trained):
    assert planned_jobs(trained.path, "vocoder") == {}


def test_new_acoustic_checkpoint_reruns_gta_and_finetuning_not_the_first_phase(trained):
    assert planned_jobs(trained.path, "vocoder", "--forcerun", "train") == {
        "train": 1, "gta_shard": SHARDS, "finetune_vocoder": 1, "vocoder": 1}


def test_a_vocoder_setting_reruns_only_vocoder_jobs(trained):
    both = {"train_vocoder": 1, "finetune_vocoder": 1, "vocoder": 1}
    lr = edited_copy(trained.path, "lr.yaml", vocoder={"learning_rate": 0.002})
    assert planned_jobs(lr, "vocoder") == both
    assert planned_jobs(lr, "synthesize") == {"train_vocoder": 1, "finetune_vocoder": 1, "synthesize": 1}
    for key, value in (("finetune_steps", 6), ("finetune_recorded", 0.25), ("finetune_share", 1.0)):  # that phase alone
        edited = edited_copy(trained.path, f"{key}.yaml", vocoder={key: value})
        assert planned_jobs(edited, "vocoder") == {"finetune_vocoder": 1, "vocoder": 1}, key


def test_replacing_one_wav_reruns_its_shard_and_what_learns_from_it(trained):
    cid = next(line.split("|")[0] for line in (trained.root / "metadata.csv").read_text().splitlines()
               if manifest.shard_of(line.split("|")[0], SHARDS) == 1)
    wav = trained.root / "wavs" / f"{cid}.wav"
    saved = trained.tmp / "saved.wav"
    shutil.copy2(wav, saved)
    try:
        y, sr = sf.read(str(wav))
        sf.write(str(wav), np.concatenate([y, y[:sr // 2]]), sr, subtype="PCM_16")  # half a second longer
        counts = planned_jobs(trained.path, "vocoder")
        assert counts == {"mel_shard": 1, "pitch_shard": 1, "duration_shard": 1, "cache_index": 1, "train": 1,
                          "train_vocoder": 1, "gta_shard": SHARDS, "finetune_vocoder": 1, "vocoder": 1}
    finally:
        os.replace(saved, wav)
    assert planned_jobs(trained.path, "vocoder") == {}


def test_a_damaged_gta_shard_is_rebuilt_by_the_command_its_error_names(trained):
    # a truncated GTA shard stopped fine-tuning with "run snakemake --cores all vocoder (it rebuilds
    # damaged shards)", and that command planned nothing: gta_shard had no repair marker
    bin_path = trained.run / "gta/shard-000.bin"
    saved = bin_path.read_bytes()
    bin_path.write_bytes(saved[:1000])
    assert planned_jobs(trained.path, "vocoder") == {"gta_shard": 1, "finetune_vocoder": 1, "vocoder": 1}
    snakemake("vocoder", config=trained.path)
    assert bin_path.read_bytes() == saved                     # the same model's mels again
    assert planned_jobs(trained.path, "vocoder") == {}


def _vocode(trained, mel, out):
    return subprocess.run([sys.executable, "-m", "pipeline.vocode", "--config", str(trained.path), "--mel", str(mel),
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3"))


def test_vocode_a_synthesized_mel_and_its_one_line_errors(trained, capsys):
    from pipeline.vocoder.vocode import main as vocode_main
    mel_path = trained.run / "samples/00.npy"
    mel = np.load(mel_path)
    proc = _vocode(trained, mel_path, trained.tmp / "00.wav")
    assert proc.returncode == 0, proc.stderr[-2000:]
    y, sr = sf.read(str(trained.tmp / "00.wav"))
    assert sr == 22050 and len(y) == len(mel) * 256 and np.abs(y).max() > 1e-3
    bad = {"transposed.npy": mel.T, "other_n_mels.npy": mel[:, :64], "decibels.npy": 20 * mel / np.log(10) - 40}
    for name, array in bad.items():
        np.save(trained.tmp / name, array)
    (trained.tmp / "text.npy").write_text("not an array")
    # bad input: the command's main() in this process (the command above showed it runs as a process),
    # each error one line naming the file, exit 2, nothing written
    for name in [*bad, "text.npy", "missing.npy"]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            vocode_main(["--config", str(trained.path), "--mel", str(trained.tmp / name), "--out",
                         str(trained.tmp / "x.wav")])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert stop.value.code == 2 and len(lines) == 1 and str(trained.tmp / name) in lines[0], (name, err)
        assert "Traceback" not in err and not (trained.tmp / "x.wav").exists()


def test_snakemake_export_carries_the_final_vocoder_and_a_new_vocoder_reexports(trained):
    import tensorflow as tf

    from pipeline import text
    snakemake("export", config=trained.path)
    out = trained.run / "export"
    meta = json.loads((out / "export.json").read_text())
    final = json.loads((trained.run / "vocoder.json").read_text())
    assert {k: meta["vocoder"][k] for k in ("kind", "trained", "steps", "finetune_steps", "phase", "checkpoint")} == {
        "kind": "vocos", "trained": True, "steps": 10, "finetune_steps": 4, "phase": "finetune",
        "checkpoint": final["checkpoint"]}
    # the SavedModel speaks as `snakemake synthesize` did, through the same trained vocoder
    ids = text.encode(trained.cfg["synthesize"]["sentences"][0], json.loads((out / "vocab.json").read_text()))
    voice = tf.saved_model.load(str(out / "saved_model"))                     # held: its variables live on it
    audio = voice.synthesize(tf.constant([ids], tf.int32), tf.constant(1.0), tf.constant(0.0))["audio"].numpy()[0]
    wav, _ = sf.read(trained.run / "samples/00.wav", dtype="float32")
    peak = np.abs(audio).max()
    assert wav.shape == audio.shape and peak > 1e-3
    np.testing.assert_allclose(wav, audio * (0.95 / peak) if peak > 1.0 else audio, atol=1.5 / 32768)
    assert planned_jobs(trained.path, "export") == {}
    # a new vocoder re-exports; Griffin-Lim needs no vocoder job
    assert planned_jobs(edited_copy(trained.path, "lr.yaml", vocoder={"learning_rate": 0.002}), "export") == {
        "train_vocoder": 1, "finetune_vocoder": 1, "export": 1}
    assert planned_jobs(edited_copy(trained.path, "gl.yaml", vocoder={"kind": "griffin_lim"}), "export") == {"export": 1}


def _job_commands(path):
    """{module: [argv of each job]}: the commands `snakemake -n -p --forceall` prints for config `path`."""
    proc = snakemake("all", "-n", "-p", "--forceall", config=path)
    found = {}
    for line in (proc.stdout + proc.stderr).splitlines():
        command = line[line.find("python -m pipeline."):]  # after Snakemake's "Shell command: "
        if "python -m pipeline." in line and " --config " in command:
            argv = shlex.split(command.split(" | ")[0].split(" > ")[0].split(" 2>&1")[0])   # the command alone
            found.setdefault(argv[2], []).append(argv)
    return found


def _job_configs(trained):
    """{module: [inline config of each job]}: the commands `snakemake -n -p --forceall` prints for the run."""
    return {module: [json.loads(argv[argv.index("--config") + 1]) for argv in jobs]
            for module, jobs in _job_commands(trained.path).items()}


def test_logging_keys_rerun_nothing_and_still_reach_the_trainers(trained):
    # train.log_every and its like were in every job's params: editing one reran train, the GTA shards, the
    # fine-tuning, evaluate, synthesize, export and diagnose (train.json rewritten)
    every = {"log_every": 3, "checkpoint_every": 7, "summary_every": 11}
    before = planned_jobs(trained.path, "all")
    quiet = edited_copy(trained.path, "logging.yaml", train=every, vocoder=every)
    assert planned_jobs(quiet, "all") == before
    jobs = _job_commands(quiet)
    assert len(jobs["pipeline.train"]) == 1 and len(jobs["pipeline.vocoder.train"]) == 2
    assert not any(k in json.loads(argv[argv.index("--config") + 1]).get(section, {})
                   for argv in sum(jobs.values(), []) for section in ("train", "vocoder") for k in every)
    # the trainers still got the run's own values (5, where the defaults are 10 and 20) from planning's
    # environment (pipeline.config.LOGGING_ENV): a loss logged at step 5 of 10
    logs = config.report_dir(trained.cfg) / "logs"
    assert trained.cfg["train"]["log_every"] == trained.cfg["vocoder"]["log_every"] == 5
    assert "step 5/10 " in (logs / "train.log").read_text()
    assert "vocoder train step 5/10 " in (logs / "train_vocoder.log").read_text()


def test_synthesize_max_seconds_reruns_the_jobs_that_speak_text_not_the_gta_shards(trained):
    # teacher-forced GTA cuts no text: its jobs are not given the synthesize section
    gta = _job_configs(trained)["pipeline.vocoder.gta"]
    assert len(gta) == SHARDS and not any("synthesize" in job for job in gta)
    before = planned_jobs(trained.path, "all")  # evaluate, diagnose, export: planned if not made yet
    seconds = edited_copy(trained.path, "max_seconds.yaml", synthesize={"max_seconds": 3.0})
    assert planned_jobs(seconds, "vocoder") == {}
    assert planned_jobs(seconds, "all") == {**before, "synthesize": 1, "evaluate": 1, "export": 1}


def test_export_tflite_reruns_the_export_alone(trained):
    configs = _job_configs(trained)
    assert {"pipeline.train", "pipeline.synthesize", "pipeline.evaluate", "pipeline.diagnose"} <= set(configs)
    assert sorted(m for m, jobs in configs.items() if any("export" in job for job in jobs)) == ["pipeline.export"]
    before = planned_jobs(trained.path, "all")
    tflite = edited_copy(trained.path, "tflite.yaml", export={"tflite": True})
    assert planned_jobs(tflite, "all") == {**before, "export": 1}
