"""Vocoder training: it learns (spectral then adversarial steps), a run killed with kill -9 and
rerun ends with exactly the weights of an uninterrupted run, and float16 steps train."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, inflate_checkpoint

SETTINGS = ["vocoder.kind=vocos", "vocoder.steps=8", "vocoder.checkpoint_every=4", "vocoder.gan_start_step=5",
            "vocoder.log_every=1", "vocoder.summary_every=8", "vocoder.batch_size=2", "vocoder.segment_frames=16",
            "vocoder.vocos={dim: 16, intermediate_dim: 32, layers: 1, kernel: 7}"]


def _cmd(config, runs):
    return [sys.executable, "-m", "pipeline.vocoder.train", "--config", str(config), "--phase", "train",
            "--out", str(runs / "train.json"), "--set", *SETTINGS, f"runs_dir={runs}"]


def _weights(checkpoint):
    reader = tf.train.load_checkpoint(checkpoint)
    # every variable: generator and discriminators (saved under their optimizers' paths) and both optimizers' slots
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k != "_CHECKPOINTABLE_OBJECT_GRAPH" and not k.startswith("save_counter")}


@pytest.mark.slow
def test_vocoder_resumes_exactly_after_kill_9(built_cache, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # the uninterrupted run and the one to kill start together (separate run folders; their start-ups overlap)
    uninterrupted = subprocess.Popen(_cmd(built_cache, whole), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
    proc = subprocess.Popen(_cmd(built_cache, killed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    marker = killed / "t/vocoder/train/checkpoints/checkpoint"
    deadline = time.time() + 300
    while not (marker.exists() and "ckpt-4" in marker.read_text()) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "train.json").exists(), "killed after the end: the test proves nothing"
    log = uninterrupted.communicate(timeout=600)[0]
    assert uninterrupted.returncode == 0, log[-3000:]
    summary = json.loads((whole / "train.json").read_text())
    losses = [h["total"] for h in summary["history"]]
    assert "adversarial" in summary["history"][-1] and "discriminator" in summary["history"][-1]  # GAN phase ran
    assert summary["traces"] == 2                          # one spectral and one GAN step trace, one shape

    out = subprocess.run(_cmd(built_cache, killed), check=True, cwd=ROOT, env=env, capture_output=True, text=True)
    assert "resumed from" in out.stdout and "at step 4" in out.stdout and "already reached" not in out.stdout
    resumed = json.loads((killed / "train.json").read_text())
    assert resumed["resumed_from"] == 4
    a, b = _weights(summary["checkpoint"]), _weights(resumed["checkpoint"])
    assert a.keys() == b.keys() and len(a) > 100
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert [h["total"] for h in resumed["history"]] == losses[4:]
    _loaded_vocoder_is_the_trained_one(built_cache, whole, summary["checkpoint"])


def _loaded_vocoder_is_the_trained_one(config_path, runs, checkpoint):
    """vocode/synthesize/evaluate (kinds.load: the generator alone) and fine-tuning (generator and
    discriminators alone) restore every weight the training loop saved."""
    from pipeline import config
    from pipeline.vocoder import kinds
    from pipeline.vocoder.train import VocoderTrainer

    cfg = config.load_config(config_path, config.parse_set(SETTINGS + [f"runs_dir={runs}"]))
    full = VocoderTrainer(cfg)
    tf.train.Checkpoint(generator=full.generator, disc=full.disc, g_opt=full.g_opt,
                        d_opt=full.d_opt).restore(checkpoint).assert_existing_objects_matched()
    loaded = kinds.load(cfg, summary=runs / "train.json").model
    partial = VocoderTrainer(cfg)
    tf.train.Checkpoint(generator=partial.generator, disc=partial.disc).restore(checkpoint).expect_partial()
    for a, b, c in zip(full.generator.weights, loaded.weights, partial.generator.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
        np.testing.assert_array_equal(a.numpy(), c.numpy(), err_msg=a.path)
    for a, c in zip(full.disc.weights, partial.disc.weights):
        np.testing.assert_array_equal(a.numpy(), c.numpy(), err_msg=a.path)


def test_a_float16_run_gives_the_generator_and_discriminators_gradients(built_cache):
    """train.mixed_precision float16 (what `auto` picks on a GPU without bfloat16): the loss-scaled
    spectral and GAN steps reach the generator's and the discriminators' weights and stay finite, as
    the float32 ones do. Every kind goes through the same step (the default kind here)."""
    import keras

    from pipeline import config, placement
    from pipeline.vocoder.train import VocoderTrainer
    cfg = config.load_config(built_cache, config.parse_set([
        "vocoder.kind=source_filter", "vocoder.batch_size=2", "vocoder.segment_frames=16", "vocoder.gan_start_step=3",
        "vocoder.source_filter={dim: 16, intermediate_dim: 32, layers: 1, kernel: 7, f0_head_dim: 16, f0_weight: 1.0}",
        "train.mixed_precision=float16", "train.placement=cpu"]))
    try:
        trainer = VocoderTrainer(cfg, log=lambda *a: None)
        assert trainer.p.mixed_precision == "float16"
        assert isinstance(trainer.g_opt, keras.optimizers.LossScaleOptimizer)
        batch = next(iter(trainer.dataset("train")))
        models = (trainer.generator, trainer.disc)
        before = [[w.numpy().copy() for w in m.trainable_weights] for m in models]
        # 3 spectral steps, then 6 GAN steps: the dynamic loss scale starts at 2^15 and halves at each step
        # whose gradients overflow (skipped); at these sizes the first three of either model's often are
        totals = [float(trainer.step(batch, i)["total"]) for i in range(9)]
        assert np.isfinite(totals).all()
        for model, weights in zip(models, before):  # the loss scale may skip steps that overflow, not all of them
            assert any(not np.array_equal(b, w.numpy()) for b, w in zip(weights, model.trainable_weights)), model.name
    finally:
        placement.set_precision_policy("off")


# Two logical CPUs stand in for split's GPUs (set before TensorFlow starts: a process of its own); the
# generator's weights on /CPU:1, the model device, as VocoderTrainer builds them there.
VALIDATION_DEVICE = """
import json, types
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from pipeline.vocoder import train as vt
with tf.device("/CPU:1"):
    kernel = tf.Variable(tf.fill([80, 256], 1e-3))
seen = []
def generator(mel, training=False):
    audio = tf.reshape(tf.matmul(mel, kernel), [tf.shape(mel)[0], -1])
    seen.append(audio.device)
    return audio
audio = {"sample_rate": 22050, "n_fft": 1024, "hop_length": 256, "win_length": 1024, "n_mels": 80, "fmin": 0, "fmax": 8000}
trainer = types.SimpleNamespace(device="/CPU:1", uses_f0=False, cfg={"audio": audio})
vt._val_losses(trainer, generator, [{"mel": tf.ones([2, 16, 80]), "audio": tf.zeros([2, 16 * 256])}])
print(json.dumps(seen))
"""


def test_validation_runs_the_generator_on_the_vocoders_device():
    # the steps run under tf.device(trainer.device); validation ran unscoped, on the default device: under
    # split that is train.data_device's GPU, every weight copied across for each validation pass
    proc = subprocess.run([sys.executable, "-c", VALIDATION_DEVICE], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["/job:localhost/replica:0/task:0/device:CPU:1"]


def test_a_loss_scaled_vocoder_update_is_the_step_of_the_losss_own_gradient():
    """Under float16 the backward pass starts from the loss scale, and the LossScaleOptimizer divides it
    out again: the update is the loss's own gradient step (plain SGD here, which scales with the
    gradient). Without the seed the optimizer divided an unscaled gradient by 2^15: steps 32768 times
    too small, and float16 gradients underflowed to zero, while the run looked finite and moving."""
    import keras

    from pipeline.vocoder.train import VocoderTrainer
    v = tf.Variable([1.0, -2.0])
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = 3.0 * v[0] + 0.5 * v[1]
    VocoderTrainer._apply(None, opt, tape, loss, [v])   # the method uses nothing of the trainer
    np.testing.assert_allclose(v.numpy(), [1.0 - 0.1 * 3.0, -2.0 - 0.1 * 0.5], rtol=1e-6)


def test_a_diverging_vocoder_saves_no_nan_and_sets_aside_what_older_code_saved(built_cache, tmp_path, monkeypatch,
                                                                                capsys):
    """A vocoder blowing up (resumed from a checkpoint whose weights are finite but huge), checkpoints every
    step and the loss logged only every 3rd: a run without the check at saving (what older code did) saves
    NaN checkpoints; the rerun sets those aside instead of resuming them, saves nothing non-finite, and
    stops with one `error:` line (exit status 2) naming the step and vocoder.learning_rate, not a
    FloatingPointError traceback."""
    from pipeline import train
    from pipeline.vocoder import train as vocoder_train
    def argv(steps, out="train.json"):
        return ["--config", str(built_cache), "--phase", "train", "--out", str(tmp_path / out), "--set", *SETTINGS,
                f"vocoder.steps={steps}", "vocoder.log_every=3", "vocoder.checkpoint_every=1",
                "vocoder.learning_rate=1.0", f"runs_dir={tmp_path}"]
    folder = tmp_path / "t/vocoder/train/checkpoints"
    vocoder_train.main(argv(1, "first.json"))  # the highest rate the schema takes: finite after a step
    inflate_checkpoint(folder / "ckpt-1", "g_opt/_trainable_variables/")
    capsys.readouterr()
    with monkeypatch.context() as older:
        older.setattr(vocoder_train, "_check_finite", lambda *a: None, raising=False)
        with pytest.raises((SystemExit, FloatingPointError)):  # the loss checked at the log step (older: a traceback)
            vocoder_train.main(argv(3))
    saved = train._checkpoints(folder)
    assert saved and not all(map(train._finite_checkpoint, saved)), "the run did not diverge: the test proves nothing"
    capsys.readouterr()

    with pytest.raises(SystemExit) as stopped:
        vocoder_train.main(argv(3))
    out, err = capsys.readouterr()
    assert stopped.value.code == 2
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in err, err[-3000:]
    assert error[0].startswith("error: training diverged: the vocoder's ") and " at step 2" in error[0], error
    assert error[0].endswith("lower vocoder.learning_rate (now 1) and rerun"), error
    assert "set aside" in out and "(non-finite or unreadable weights)" in out, out
    assert all(map(train._finite_checkpoint, train._checkpoints(folder)))
    assert list((folder / "diverged").glob("ckpt-*.index"))
    assert not (tmp_path / "train.json").exists()


def test_a_vocoder_checkpoint_named_for_another_step_than_it_trained_is_refused_in_one_line(built_cache, tmp_path,
                                                                                           capsys):
    """A resume through spectral and adversarial steps goes on (the generator's optimizer steps once a step);
    ckpt-3 renamed ckpt-9 resumed at step 9, six steps of the crops and GAN schedule skipped, and saved
    other weights under names they do not have. Now it is one line naming the name its files should have."""
    from pipeline.train import write_state
    from pipeline.vocoder import train as vocoder_train
    argv = ["--config", str(built_cache), "--phase", "train", "--out", str(tmp_path / "train.json"), "--set",
            *SETTINGS, "vocoder.gan_start_step=1", "vocoder.summary_every=100", f"runs_dir={tmp_path}"]
    folder = tmp_path / "t/vocoder/train/checkpoints"
    vocoder_train.main(argv + ["vocoder.steps=2"])
    vocoder_train.main(argv + ["vocoder.steps=3"])
    assert f"resumed from {folder / 'ckpt-2'} at step 2" in capsys.readouterr().out
    for f in folder.glob("ckpt-3.*"):
        f.rename(f.with_name(f.name.replace("ckpt-3", "ckpt-9")))
    write_state(folder, ["ckpt-9"])
    with pytest.raises(SystemExit) as stopped:
        vocoder_train.main(argv + ["vocoder.steps=10"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err, err[-3000:]
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: {folder / 'ckpt-9'}: named for step 9, but its optimizer applied 3 updates (renamed, or copied under "
        f"another step's name?); give its .index and .data files back the name ckpt-3, or move them out of {folder}"]
    assert sorted(p.name for p in folder.glob("ckpt-*.index")) == ["ckpt-2.index", "ckpt-9.index"]


def test_the_summary_reports_the_steps_the_shipped_weights_trained_not_a_lowered_config(built_cache, tmp_path, capsys):
    """vocoder.steps lowered below the step the checkpoints reached trains nothing and ships those weights:
    the summaries (vocoder/train.json, vocoder.json) say the steps they trained, with a note. Before, they
    said the config's. Fine-tuning's summary gives the first phase's step it started from, and its own."""
    from pipeline import config
    from pipeline.vocoder import inputs
    from pipeline.vocoder import train as vocoder_train
    argv = ["--config", str(built_cache), "--phase", "train", "--out", str(tmp_path / "train.json"), "--final",
            "--set", *SETTINGS, "vocoder.gan_start_step=100", f"runs_dir={tmp_path}"]
    vocoder_train.main(argv + ["vocoder.steps=4"])
    capsys.readouterr()
    vocoder_train.main(argv + ["vocoder.steps=2"])
    out = capsys.readouterr().out
    for summary in (tmp_path / "train.json", tmp_path / "t/vocoder.json"):
        made = json.loads(summary.read_text())
        assert made["steps"] == 4 and made["checkpoint"].endswith("ckpt-4"), (summary, made["steps"])
    assert f"note: vocoder.steps is 2, but {tmp_path / 't/vocoder/train/checkpoints'} already trained 4 steps" in out
    cfg = config.load_config(built_cache, config.parse_set(SETTINGS + ["vocoder.finetune_steps=2", f"runs_dir={tmp_path}"]))
    folder, logged = tmp_path / "finetune", []
    first = f"{tmp_path}/t/vocoder/train/checkpoints/ckpt-12@{'0' * 16}"       # what fine-tuning started from
    inputs.switch(folder, {**inputs.settings(cfg, "finetune"), "from": first}, log=logged.append)
    assert vocoder_train._trained_steps(cfg, "finetune", folder, 2, logged.append) == {"steps": 12, "finetune_steps": 2}
    assert vocoder_train._trained_steps(cfg, "finetune", folder, 3, logged.append)["finetune_steps"] == 3
    assert logged[-1].startswith("note: vocoder.finetune_steps is 2, but ") and "already trained 3 steps" in logged[-1]


def test_the_last_step_is_saved_and_shipped_when_checkpoint_every_does_not_divide_the_steps(built_cache, tmp_path):
    """vocoder.steps 3 with checkpoint_every 2: the run saves ckpt-2 on the way and ckpt-3 at its end, and
    ships ckpt-3. Without the save at the last step the summary said 3 steps and shipped ckpt-2's weights,
    and a rerun trained step 3 again."""
    from pipeline import config
    from pipeline.vocoder import train as vocoder_train
    cfg = config.load_config(built_cache, config.parse_set(SETTINGS + [
        "vocoder.steps=3", "vocoder.checkpoint_every=2", "vocoder.gan_start_step=100", f"runs_dir={tmp_path}"]))
    summary = vocoder_train.train_vocoder(cfg, "train", tmp_path / "train.json", log=lambda *a: None)
    folder = tmp_path / "t/vocoder/train/checkpoints"
    assert summary["steps"] == 3 and summary["checkpoint"] == str(folder / "ckpt-3")
    assert tf.train.latest_checkpoint(str(folder)) == str(folder / "ckpt-3")


def test_a_phase_trained_to_its_planned_steps_ships_them_without_a_note(tmp_path):
    """The note about a lowered vocoder.steps is for a checkpoint past the config's steps, not every run
    that reached them."""
    from pipeline import config
    from pipeline.vocoder import train as vocoder_train
    cfg = config.load_config(None, {"runs_dir": str(tmp_path), "vocoder": {"steps": 4}}, check_paths=False)
    logged = []
    assert vocoder_train._trained_steps(cfg, "train", tmp_path, 4, logged.append) == {"steps": 4, "finetune_steps": 0}
    assert logged == []
    assert vocoder_train._trained_steps(cfg, "train", tmp_path, 5, logged.append)["steps"] == 5
    assert len(logged) == 1 and "already trained 5 steps" in logged[0]


def test_fine_tuning_refuses_a_first_phase_of_other_sizes_in_one_line(built_cache, tmp_path):
    """A first phase trained with 4 Vocos layers and fine-tuning run with 2 (`--phase finetune` after
    lowering vocoder.vocos.layers): before, the restore matched the 2 layers the model has and dropped
    the other 2 silently, and the WiSE-FT blend did the same; a wider one raised a ValueError traceback.
    Now each is one line naming the key, and the sizes it was trained with still fine-tune."""
    from pipeline import config
    from pipeline.errors import PipelineError
    from pipeline.vocoder import inputs, kinds
    from pipeline.vocoder import train as vocoder_train

    def cfg(**vocos):
        sizes = {"dim": 16, "intermediate_dim": 32, "layers": 4, "kernel": 7, **vocos}
        return config.load_config(built_cache, config.parse_set(SETTINGS + [f"runs_dir={tmp_path}",
                                  "vocoder.vocos={" + ", ".join(f"{k}: {v}" for k, v in sizes.items()) + "}"]))

    first_cfg, quiet = cfg(), lambda *a: None
    first = vocoder_train.VocoderTrainer(first_cfg, log=quiet)
    folder = vocoder_train._phase_dir(first_cfg, "train")
    inputs.switch(folder, inputs.settings(first_cfg, "train"), quiet)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(generator=first.generator, disc=first.disc),
                                         folder / "checkpoints", max_to_keep=1)
    saved = manager.save(checkpoint_number=3)
    for changed, key in (({"layers": 2}, "vocoder.vocos.layers 2 (the checkpoint's: 4)"),
                         ({"dim": 24}, "vocoder.vocos.dim 24 (the checkpoint's: 16)")):
        tuned = vocoder_train.VocoderTrainer(cfg(**changed), "finetune", log=quiet)
        with pytest.raises(PipelineError) as refused:
            vocoder_train._checkpoints(cfg(**changed), "finetune", tuned, tmp_path / f"ft{changed}", quiet)
        assert key in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
        with pytest.raises(PipelineError) as blended:  # the WiSE-FT blend's restore
            kinds.restore(tuned.generator, saved, "x", "vocos", built_with=cfg(**changed)["vocoder"],
                          trained_with=first_cfg["vocoder"])
        assert key in str(blended.value), str(blended.value)
    same = vocoder_train.VocoderTrainer(first_cfg, "finetune", log=quiet)
    vocoder_train._checkpoints(first_cfg, "finetune", same, tmp_path / "ft", quiet)
    for a, b in zip(first.generator.weights, same.generator.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_fine_tuning_continues_the_first_phases_gan_schedule(built_cache, tmp_path):
    """vocoder.gan_start_step counts both phases' steps. Before, fine-tuning counted from its own step 0:
    a first phase trained adversarially (12 steps, GAN from step 10) was fine-tuned on spectral losses
    alone until its own step 10, and a spectral-only one could turn the GAN on mid-fine-tuning. Now the
    first case is adversarial from fine-tuning's first step, the demo's (GAN past both phases) never, and
    gan_start_step 0 (configs/ljspeech.yaml) in every step of both."""
    from pipeline import config
    from pipeline.vocoder import train as vocoder_train

    def ran(gan_start, phase, steps):
        cfg = config.load_config(built_cache, config.parse_set(SETTINGS + [
            f"runs_dir={tmp_path}", f"vocoder.gan_start_step={gan_start}", "vocoder.finetune_steps=4"]))
        trainer = vocoder_train.VocoderTrainer(cfg, phase, log=lambda *a: None)
        trainer.gan_step, trainer.spectral_step = (lambda batch: "gan"), (lambda batch: "spectral")
        return [trainer.step(None, step) for step in steps]

    saved = tmp_path / "t/vocoder/train/checkpoints"
    tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), saved, 1).save(checkpoint_number=12)
    assert ran(10, "train", [9, 10]) == ["spectral", "gan"]
    assert ran(10, "finetune", range(4)) == ["gan"] * 4                          # 12 + 0 >= 10
    assert ran(14, "finetune", range(4)) == ["spectral"] * 2 + ["gan"] * 2       # from 12 + 2
    assert ran(100000, "finetune", range(4)) == ["spectral"] * 4                 # configs/config.yaml's
    assert ran(0, "finetune", range(4)) == ["gan"] * 4                           # configs/ljspeech.yaml's


def _two_pass_gan_step(self, batch):
    """The GAN step as it was before the generator ran once per step: the discriminators' update on one
    forward pass, the generator's losses on a second, after that update."""
    from pipeline.vocoder import discriminators as D
    real = batch["audio"]
    fake = self._generate(batch)
    with tf.GradientTape() as tape:
        d_loss = D.discriminator_loss(self.disc(real), self.disc(tf.stop_gradient(fake)))
    self._apply(self.d_opt, tape, d_loss, self.disc.trainable_variables)
    with tf.GradientTape() as tape:
        fake = self._generate(batch)
        spectral, _ = D.spectral_loss(real, fake, self.cfg["audio"], mel_weight=self.weights["mel"],
                                      stft_weight=self.weights["stft"])
        real_outs, fake_outs = self.disc(real), self.disc(fake)
        total = spectral + D.generator_loss(fake_outs) + self.weights["feature"] * D.feature_loss(real_outs, fake_outs)
    self._apply(self.g_opt, tape, total, self.generator.trainable_variables)
    return {"total": total}


def test_a_gan_step_runs_the_generator_once_and_trains_as_two_passes_did(built_cache):
    """A GAN step cost two generator forward passes (one for the discriminators' fake, one for the
    generator's losses); it now records one and reuses it. The weights after two GAN steps are those
    of the two-pass step: the discriminators step on the stop-gradient fake first, and the generator's
    adversarial loss sees them after that step, as before."""
    from pipeline import config
    from pipeline.vocoder.train import VocoderTrainer
    cfg = config.load_config(built_cache, config.parse_set(SETTINGS + ["vocoder.gan_start_step=0"]))
    once, twice = (VocoderTrainer(cfg, log=lambda *a: None) for _ in range(2))  # the same seed: the same weights
    calls, generate = [], once._generate
    once._generate = lambda batch: calls.append(1) or generate(batch)  # counted as the step is traced
    twice.gan_step = tf.function(lambda batch: _two_pass_gan_step(twice, batch), autograph=False)
    batch = next(iter(once.dataset("train")))
    for _ in range(2):
        once.step(batch, 0), twice.step(batch, 0)
    assert len(calls) == 1
    for model in ("generator", "disc"):
        for a, b in zip(getattr(once, model).weights, getattr(twice, model).weights, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)


@pytest.mark.parametrize("shard", ["names its weights", "from before it did"])
def test_fine_tuning_on_gta_mels_of_a_replaced_checkpoint_stays_noted(tmp_path, shard):
    """An acoustic model trained again to the same step (ckpt-800, other weights) and fine-tuning rerun on
    the old GTA shards: the summary recorded the bare path, the note compared ckpt-800 with ckpt-800 by name
    and said nothing, so synthesize, evaluate and export spoke as if the vocoder were fine-tuned for it."""
    from pipeline import config, runinfo
    from pipeline.vocoder import inputs
    from pipeline.vocoder import train as vtrain
    cfg = config.load_config(None, {"runs_dir": str(tmp_path / "runs"), "name": "t"}, check_paths=False)
    ckpt = config.run_dir(cfg) / "checkpoints" / "ckpt-800"
    ckpt.parent.mkdir(parents=True)
    Path(f"{ckpt}.index").write_bytes(b"the weights that made the GTA mels")
    meta = {"checkpoint": str(ckpt), "provenance": "of the old weights"}
    if shard == "names its weights":
        meta["weights"] = runinfo.checkpoint_identity(str(ckpt))
    Path(f"{ckpt}.index").write_bytes(b"the weights trained again")                 # same step, same path
    summary = {"phase": "finetune", "gta_from": vtrain._gta_from(cfg, [meta])}
    note = inputs.finetuned_elsewhere(cfg, summary, str(ckpt))
    assert note is not None and "snakemake --cores all vocoder" in note
    now = runinfo.checkpoint_identity(str(ckpt))
    assert f"not of {now}, " in note                                                 # not "ckpt-800, not of ckpt-800"
    said = meta["weights"] if shard == "names its weights" else "out of date"
    assert f"GTA mels of {ckpt}" in note and said in note, note
    assert json.loads(json.dumps(summary)) == summary                                # what vocoder.json keeps
    assert inputs.finetuned_elsewhere(cfg, {"phase": "finetune", "gta_from": [now]}, str(ckpt)) is None


def _stft_magnitude(x, n_fft, hop, win):
    """|STFT| in numpy on tf.signal.stft's grid: unpadded frames, a periodic Hann window, [..., frames, bins]."""
    frames = np.lib.stride_tricks.sliding_window_view(x, win, axis=-1)[..., ::hop, :]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)
    return np.abs(np.fft.rfft(frames * window, n=n_fft))


def test_the_vocoders_losses_are_their_formulas():
    """HiFi-GAN's least-squares and feature-matching losses, the project's mel L1 (pipeline.audio's mel in
    numpy) and Parallel WaveGAN's multi-resolution STFT loss, each against its formula computed in numpy."""
    from pipeline import audio, config
    from pipeline.vocoder import discriminators as D
    rng = np.random.default_rng(0)
    shapes = [((2, 5), [(2, 3, 4), (2, 6)]), ((2, 7), [(2, 2)])]  # (logits, [features]) per sub-discriminator

    def outs():
        return [(rng.normal(size=s).astype(np.float32), [rng.normal(size=f).astype(np.float32) for f in fs])
                for s, fs in shapes]
    real_outs, fake_outs = outs(), outs()

    def close(got, want):
        np.testing.assert_allclose(float(got), want, rtol=1e-4)
    close(D.discriminator_loss(real_outs, fake_outs),
          sum(np.mean((1 - r) ** 2) + np.mean(f ** 2) for (r, _), (f, _) in zip(real_outs, fake_outs)))
    close(D.generator_loss(fake_outs), sum(np.mean((1 - f) ** 2) for f, _ in fake_outs))
    close(D.feature_loss(real_outs, fake_outs), sum(np.mean(np.abs(a - b)) for (_, ra), (_, fa)
                                                    in zip(real_outs, fake_outs) for a, b in zip(ra, fa)))
    a = config.load_config(check_paths=False)["audio"]
    t = np.arange(6000) / a["sample_rate"]
    real = np.stack([0.5 * np.sin(2 * np.pi * 220 * t), 0.3 * np.sin(2 * np.pi * (300 * t + 500 * t ** 2))])
    real += rng.normal(0, 0.01, real.shape)                                   # a noise floor far above float32's
    fake = 0.8 * real + rng.normal(0, 0.05, real.shape)
    real, fake = real.astype(np.float32), fake.astype(np.float32)

    want_stft = np.mean([np.linalg.norm(r - f) / (np.linalg.norm(r) + 1e-7) + np.mean(np.abs(np.log(r) - np.log(f)))
                         for r, f in ((_stft_magnitude(real, *res) + 1e-7, _stft_magnitude(fake, *res) + 1e-7)
                                      for res in D.RESOLUTIONS)])
    want_mel = np.mean([np.abs(audio.mel_spectrogram(r, **a) - audio.mel_spectrogram(f, **a)) for r, f in zip(real, fake)])
    total, terms = D.spectral_loss(tf.constant(real), tf.constant(fake), a, mel_weight=45.0, stft_weight=2.0)
    close(terms["stft"], want_stft)
    close(terms["mel"], want_mel)
    close(total, 45.0 * want_mel + 2.0 * want_stft)


def test_each_period_discriminator_sees_its_periods_phases_apart_and_each_resolution_one_a_spectrogram():
    """HiFi-GAN's multi-period discriminator folds the audio, reflect-padded to whole periods, into one
    column per phase and convolves along time only; the multi-resolution one convolves an STFT's frames x bins."""
    from pipeline.vocoder import discriminators as D
    disc = D.Discriminators()
    n = 2 * 3 * 5 * 7 * 11                                                   # whole periods of every period
    x = np.random.default_rng(0).normal(0, 0.1, (1, n)).astype(np.float32)
    outs = disc(x)
    assert len(outs) == len(D.PERIODS) + len(D.RESOLUTIONS) == 8              # five periods, three resolutions
    for k, p in enumerate(D.PERIODS):
        sub = getattr(disc, f"sub{k}")
        moved = x.copy()
        moved[0, ::p] += 0.5                                                  # phase 0 of every period
        (logits, feats), (_, changed) = sub(x), sub(moved)
        rows = n // p
        assert len(feats) == 3
        for f, g in zip(feats, changed):
            rows = -(-rows // 3)                                               # stride 3 along time
            assert f.shape[:3] == (1, rows, p), (p, f.shape)
            diff = np.abs(f.numpy() - g.numpy())
            assert diff[:, :, 0].max() > 0 and diff[:, :, 1:].max() <= 1e-6 * diff[:, :, 0].max(), p
        assert logits.shape == (1, rows * p)
        cut = x[:, :n - 1 - p]                                                # not whole periods: reflect-padded
        padded = np.pad(cut, [(0, 0), (0, -(cut.shape[1]) % p)], mode="reflect")
        np.testing.assert_allclose(sub(cut)[0].numpy(), sub(padded)[0].numpy(), rtol=1e-5, atol=1e-6)
    for k, (n_fft, hop, win) in enumerate(D.RESOLUTIONS, start=len(D.PERIODS)):
        logits, feats = outs[k]
        frames, bins = 1 + (n - win) // hop, n_fft // 2 + 1
        for f in feats:
            bins = -(-bins // 2)                                               # stride 2 along frequency
            assert f.shape[:3] == (1, frames, bins), (n_fft, f.shape)
    # the first layer sees the log-magnitude spectrogram: a conv passing its centre tap on shows it (LeakyReLU 0.1)
    sub, (n_fft, hop, win) = getattr(disc, f"sub{len(D.PERIODS)}"), D.RESOLUTIONS[0]
    centre = np.zeros(sub.conv0.kernel.shape, np.float32)
    centre[1, 4, 0, :] = 1.0                                                  # kernel (3 frames, 9 bins)
    sub.conv0.kernel.assign(centre)
    sub.conv0.bias.assign(tf.zeros_like(sub.conv0.bias))
    log_spec = np.log(_stft_magnitude(x, n_fft, hop, win) + 1e-5)[:, :, ::2]  # stride 2 along frequency
    want = np.where(log_spec > 0, log_spec, 0.1 * log_spec)
    np.testing.assert_allclose(sub(x)[1][0].numpy()[..., 0], want, rtol=1e-4, atol=1e-4)
