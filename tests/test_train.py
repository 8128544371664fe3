"""Training: trace counts, every placement on CPU stand-ins, resume after kill -9, synthesis, and a
failing train or synthesize that keeps the samples, loss history and checkpoints the run had made."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml
from conftest import (
    ROOT,
    TINY_ALIGNER,
    TINY_FASTPITCH,
    edited_copy,
    inflate_checkpoint,
    load_json,
    planned_jobs,
    snakemake,
    write_config,
)

from pipeline import config, runinfo
from pipeline import placement as placement_mod
from pipeline.runinfo import step_of

TINY_MODEL = {"kind": "transformer_tts",
              "transformer_tts": {"d_model": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ffn_dim": 64,
                                  "encoder_conv_layers": 1, "prenet_dim": 32, "postnet_channels": 32,
                                  "postnet_layers": 2}}


TINY_FASTPITCH_MODEL = {"kind": "fastpitch", "fastpitch": TINY_FASTPITCH}


def tiny_config(built_cache, tmp_path, model=TINY_MODEL, **train):
    """The built cache, a tiny model, and a run folder of this test's own. Two length buckets unless
    `buckets` says otherwise: tests whose subject is not bucketing pass buckets=1, one trace of the
    step fewer (~5-9 CPU s a training process here)."""
    cfg = config.load_config(built_cache)
    path = write_config(tmp_path, cfg["dataset"]["root"], model=model, aligner=TINY_ALIGNER,
                        train={"batch_size": 4, "buckets": 2, "learning_rate": 0.003, "warmup_steps": 5,
                               "log_every": 5, "summary_every": 1000, **train},
                        synthesize={"max_seconds": 1.0, "griffin_lim_iters": 4})
    text = path.read_text().replace(str(tmp_path / "cache"), cfg["cache"]["dir"])  # share the built cache
    path.write_text(text)
    return path


def latest_checkpoint(folder):
    """The prefix the `checkpoint` file in `folder` names as the latest (as tf.train.latest_checkpoint)."""
    name = re.search(r'^model_checkpoint_path: "([^"]+)"', (Path(folder) / "checkpoint").read_text(), re.M).group(1)
    return str(Path(folder) / name)


# The precision variants train one bucket: tracing once per bucket is the placements' subject, and an
# XLA compilation of the step costs ~25 CPU s a bucket here.
PLACEMENTS = [
    ("cpu", {}), ("split", {}), ("mirrored", {}), ("single", {}), ("auto", {}),
    ("cpu", {"jit_compile": True, "mixed_precision": "bfloat16", "buckets": 1}),  # the GPU defaults, on the CPU
    ("cpu", {"mixed_precision": "float16", "buckets": 1}),                        # pre-Ampere GPUs: loss scaling
]

# Every placement in one process (one TensorFlow start-up for all): each builds its own trainer
# (seed, precision policy and trace counter reset by build_trainer) and prints one JSON line, or the
# traceback that stopped it, so each placement's test fails alone. No dropout, and a gradient clip far
# under the gradient's norm (Adam's steps barely notice it): before training, the plain cpu and mirrored
# trainers each take one step on one global batch whose frames and tokens are all real (each replica's
# masked mean then weighs its half as the batch's mean does); the same weights after it show that
# clipping under a strategy clips the summed gradient. That step's batch has a bucket's shape: no trace
# of its own.
PLACEMENT_RUNS = """
    import json, traceback, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from pipeline import config, placement as pm, train as tr
    from pipeline.train import build_trainer
    all_finite, finite_devices = pm.all_finite, []
    def recorded(variables, device):  # where check_finite_state's reduction runs
        finite = all_finite(variables, device)
        finite_devices.append(finite.device)
        return finite
    pm.all_finite = recorded
    flat = lambda trainer: tf.concat([tf.reshape(v, [-1]) for v in trainer.model.trainable_variables], 0).numpy()
    batch, clipping = None, {{}}
    for placement, extra in {placements!r}:
        try:
            cfg = config.load_config({path!r}, {{
                "train": {{"data_device": "/CPU:0", "model_device": "/CPU:1", "grad_clip": 1e-3,
                           **({{}} if placement == "auto" else {{"mixed_precision": "off"}}), **extra}},
                "model": {{"transformer_tts": {{"dropout": 0.0, "prenet_dropout": 0.0}}}}}})
            trainer = build_trainer(cfg, placement=placement, log=lambda *a: None)
            trainer.measure_copy(repeats=1)
            if placement in ("cpu", "mirrored") and not extra:
                if batch is None:
                    batch = next(iter(trainer.build_dataset("train")))
                    batch = dict(batch, mel_lengths=tf.fill(tf.shape(batch["mel_lengths"]), tf.shape(batch["mel"])[1]),
                                 token_lengths=tf.fill(tf.shape(batch["token_lengths"]), tf.shape(batch["tokens"])[1]))
                given = batch
                if trainer.p.strategy is not None:  # split over the two replicas, as the loader's batches are
                    given = next(iter(trainer.p.strategy.experimental_distribute_dataset(
                        tf.data.Dataset.from_tensors(batch))))
                before = flat(trainer)
                trainer.step(given)
                clipping[placement] = (before, flat(trainer))
            losses, batches, step_device = [], trainer.batches(), None
            for i in range({steps} if placement != "auto" else 0):  # auto resolves to cpu here: trained above
                terms = trainer.step(next(batches))
                losses.append(float(terms["total"]))
                step_device = terms["total"].device  # where the step ran (its ops land with its outputs)
            finite_devices.clear()
            tr.check_finite_state(trainer, tr.Progress(trainer, {steps}, 5, print), {steps})
            out = {{"losses": losses, "traces": trainer.traces, "buckets": trainer.n_buckets,
                    "placement": trainer.placement, "devices": trainer.p.devices,
                    "variable_device": trainer.model.trainable_variables[0].value.device, "step_device": step_device,
                    "copy_ms": trainer.copy_ms, "context": trainer.context(), "finite_devices": list(finite_devices),
                    "optimizer": type(trainer.optimizer).__name__,
                    "update_traces": trainer.update.experimental_get_tracing_count() if trainer.update else None}}
        except Exception:
            out = {{"error": traceback.format_exc()}}
        print(json.dumps(out), flush=True)
    try:
        (b0, a0), (b1, a1) = clipping["cpu"], clipping["mirrored"]
        out = {{"clipping": {{"start_diff": float(abs(b0 - b1).max()), "step_diff": float(abs(a0 - a1).max()),
                             "step_size": float(abs(a0 - b0).max())}}}}
    except Exception:
        out = {{"clipping": {{"error": traceback.format_exc()}}}}
    print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def placement_runs(built_cache, tmp_path_factory):
    """40 training steps of the tiny model under each of PLACEMENTS (auto: built only, it resolves to cpu
    here), in one subprocess: [result per placement, then {"clipping": ...}]."""
    path = tiny_config(built_cache, tmp_path_factory.mktemp("placements"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(PLACEMENT_RUNS.format(
        path=str(path), placements=PLACEMENTS, steps=40))], capture_output=True, text=True, env=env, cwd=ROOT,
        timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(PLACEMENTS) + 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    return results  # one per placement, then {"clipping": ...}


def test_auto_precision_on_an_amx_cpu_is_bfloat16_for_the_acoustic_model_only(built_cache, monkeypatch):
    """On a CPU with AMX-BF16 (stood in here), `mixed_precision: auto` trains the acoustic model in bfloat16
    (FastPitch's step 1.19x faster there, docs/scaling.md; transformer_tts here, as this cache has no
    durations: the same trainer) and keeps the vocoder in float32 (slower in bfloat16)."""
    import keras

    from pipeline.train import build_trainer
    from pipeline.vocoder.train import VocoderTrainer
    monkeypatch.setattr(placement_mod, "cpu_has_amx_bf16", lambda: True)
    monkeypatch.setattr(placement_mod, "cpu_kernels", lambda: "oneDNN")
    cfg = config.merge(config.load_config(built_cache), {"model": TINY_MODEL,
                                                         "train": {"placement": "cpu", "mixed_precision": "auto"}})
    logged = []
    try:
        trainer = build_trainer(cfg, log=logged.append)
        assert trainer.p.mixed_precision == "bfloat16" and trainer.context()["mixed_precision"] == "bfloat16"
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
        small = {"dim": 16, "intermediate_dim": 32, "layers": 1, "kernel": 7, "f0_head_dim": 16, "f0_weight": 1.0}
        vocoder = VocoderTrainer(config.merge(cfg, {"vocoder": {"kind": "source_filter", "source_filter": small}}),
                                 log=logged.append)
        assert vocoder.p.mixed_precision == "off" and keras.mixed_precision.global_policy().name == "float32"
    finally:
        placement_mod.set_precision_policy("off")
    assert any("mixed precision bfloat16 (auto: this CPU has AMX-BF16)" in str(line) for line in logged), logged


def test_a_mirrored_float16_step_clips_by_the_gradients_norm_not_the_loss_scaled_one(built_cache, tmp_path):
    """Under a strategy the step clips the summed gradient itself; with float16 that gradient is the loss
    scale's multiple, and its norm is divided by the scale before it meets train.grad_clip. Compared
    undivided, a gradient 10x under the clip was cut to 1/25 (at a loss scale of 2^8 here; 2^15 by
    default): mirrored float16 runs barely trained. One replica (mirrored over the one CPU) against
    `cpu`, each with a loss-scaled plain SGD, whose step is proportional to the gradient."""
    import contextlib

    import keras
    import tensorflow as tf

    from pipeline.train import build_trainer
    cfg = config.load_config(tiny_config(built_cache, tmp_path, buckets=1), {
        "train": {"mixed_precision": "float16", "grad_clip": 1e9},
        "model": {"transformer_tts": {"dropout": 0.0, "prenet_dropout": 0.0}}})

    def flat(trainer):
        return tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in trainer.model.trainable_variables], 0).numpy()

    out, batch, clip = {}, None, None
    try:
        for placement in ("cpu", "mirrored"):
            trainer = build_trainer(cfg, placement=placement, log=lambda *a: None)
            if batch is None:
                batch = next(iter(trainer.build_dataset("train")))
                grads = [tf.cast(tf.convert_to_tensor(g), tf.float32) for g in trainer._grads(batch)[0]]
                clip = 10 * float(tf.linalg.global_norm(grads)) / float(trainer.optimizer.dynamic_scale)
            with trainer.p.strategy.scope() if trainer.p.strategy else contextlib.nullcontext():
                trainer.optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=0.01),
                                                                        initial_scale=2.0 ** 8)
                trainer.optimizer.build(trainer.model.trainable_variables)
            trainer.cfg = dict(trainer.cfg, train=dict(trainer.cfg["train"], grad_clip=clip))
            trainer.step = trainer._make_step()
            given = batch if trainer.p.strategy is None else next(iter(
                trainer.p.strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch))))
            before = flat(trainer)
            trainer.step(given)
            out[placement] = before, flat(trainer)
    finally:
        placement_mod.set_precision_policy("off")
    (b0, a0), (b1, a1) = out["cpu"], out["mirrored"]
    assert np.array_equal(b0, b1)
    size = np.abs(a0 - b0).max()
    assert size > 1e-6 and np.abs(a1 - a0).max() < 0.05 * size, (size, np.abs(a1 - a0).max())


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(PLACEMENTS)), ids=[
    f"{p}-extra{i}" for i, (p, _) in enumerate(PLACEMENTS)])
def test_every_placement_trains_and_traces_once_per_bucket(placement_runs, i):
    placement, extra = PLACEMENTS[i]
    out = placement_runs[i]
    assert "error" not in out, out.get("error")
    if placement == "auto":
        assert out["placement"] == "cpu" and out["devices"] == ["/CPU:0"]  # no GPU here: the cpu run above
        # mixed precision: off on this CPU, or bfloat16 where it has AMX-BF16 (tests/test_placement.py)
        amx = placement_mod.cpu_kernels() == "oneDNN" and placement_mod.cpu_has_amx_bf16()
        assert out["context"]["jit_compile"] is False
        assert out["context"]["mixed_precision"] == ("bfloat16" if amx else "off")
        return
    first, last = np.mean(out["losses"][:5]), np.mean(out["losses"][-5:])
    assert last < 0.8 * first, out["losses"]  # ~0.7 without dropout here; a step that does not train stays ~1
    assert out["traces"] <= out["buckets"] + 1
    if placement != "mirrored":  # the optimizer's update is traced once, whatever the bucket (strategies: per trace)
        assert out["update_traces"] == 1, out
    if placement == "split":
        assert out["variable_device"].endswith("CPU:1") and out["copy_ms"] is not None
        # the step runs where the model lives: a tf.function's ops go where it is called, not where it was made
        assert out["step_device"].endswith("CPU:1"), out["step_device"]
    if placement in ("split", "single"):  # checked before each checkpoint, where the weights live (one read)
        assert [d[-5:] for d in out["finite_devices"]] == ["CPU:1"], out["finite_devices"]
    if placement == "mirrored":
        assert len(out["devices"]) == 2
    if placement == "single":
        assert out["variable_device"].endswith("CPU:1")  # the CPU stand-in for the GPU
        assert out["step_device"].endswith("CPU:1"), out["step_device"]
    if extra.get("jit_compile"):
        assert out["context"]["jit_compile"] and out["context"]["mixed_precision"] == "bfloat16"
    if extra.get("mixed_precision") == "float16":
        assert out["optimizer"] == "LossScaleOptimizer"


@pytest.mark.slow
def test_mirrored_clips_the_summed_gradient_as_one_device_clips_the_batch(placement_runs):
    # Keras's global_clipnorm clips each replica's share before its all-reduce: the step then differs
    # from one device's wherever the shares' norms differ. The trainer clips the sum itself.
    out = placement_runs[-1]["clipping"]
    assert "error" not in out, out.get("error")
    assert out["start_diff"] == 0.0  # the same initial weights (seed) under both placements
    assert out["step_size"] > 1e-5   # the step moved the weights
    assert out["step_diff"] < 0.01 * out["step_size"], out


# One global batch of 5 clips, every frame and token real, one step each: on one device, and mirrored over
# 3 replicas, which TensorFlow splits as 2, 2 and 1. Each replica's mean loss must weigh as its part of
# the batch: counted alike, the lone clip weighs 2.5x the others and the step is not the batch's. (Clips
# of equal length: with shorter ones, each replica's means over real frames weigh them otherwise than
# one device's mean over the batch; docs/scaling.md gives the difference.)
UNEVEN_RUN = """
    import json, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
    from pipeline import config
    from pipeline.train import build_trainer
    flat = lambda trainer: tf.concat([tf.reshape(v, [-1]) for v in trainer.model.trainable_variables], 0).numpy()
    cfg = config.load_config({path!r}, {{
        "train": {{"grad_clip": 1e-3, "mixed_precision": "off", "batch_size": 5, "buckets": 1}},
        "model": {{"transformer_tts": {{"dropout": 0.0, "prenet_dropout": 0.0}}}}}})
    out, batch = {{}}, None
    for placement in ("cpu", "mirrored"):
        trainer = build_trainer(cfg, placement=placement, log=lambda *a: None)
        if batch is None:
            batch = next(iter(trainer.build_dataset("train")))
            batch = dict(batch, mel_lengths=tf.fill(tf.shape(batch["mel_lengths"]), tf.shape(batch["mel"])[1]),
                         token_lengths=tf.fill(tf.shape(batch["token_lengths"]), tf.shape(batch["tokens"])[1]))
        given = batch
        if trainer.p.strategy is not None:
            given = next(iter(trainer.p.strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch))))
            out["shares"] = [int(t.shape[0]) for t in trainer.p.strategy.experimental_local_results(given["tokens"])]
        before = flat(trainer)
        terms = trainer.step(given)
        out[placement] = {{"before": before.tolist(), "after": flat(trainer).tolist(), "total": float(terms["total"])}}
    print(json.dumps(out), flush=True)
"""


def cpu_and_mirrored(script, built_cache, tmp_path):
    """(shares, cpu's, mirrored's) from `script` (UNEVEN_RUN or a variant) run in its own process."""
    path = tiny_config(built_cache, tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script.format(path=str(path)))],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["shares"], *({k: np.array(v) if k != "total" else v for k, v in out[p].items()}
                            for p in ("cpu", "mirrored"))


@pytest.mark.slow
def test_mirrored_weighs_an_uneven_split_as_one_device_weighs_the_batch(built_cache, tmp_path):
    shares, one, three = cpu_and_mirrored(UNEVEN_RUN, built_cache, tmp_path)
    assert shares == [2, 2, 1]
    assert np.array_equal(one["before"], three["before"])            # the same seeded weights
    assert three["total"] == pytest.approx(one["total"], rel=1e-5)   # the loss it reports is the batch's
    size = np.abs(one["after"] - one["before"]).max()
    assert size > 1e-5 and np.abs(three["after"] - one["after"]).max() < 0.01 * size


# UNEVEN_RUN's step with plain SGD (a step proportional to the gradient, unlike Adam's first) and a
# gradient clip far over the gradient's norm
UNCLIPPED_RUN = UNEVEN_RUN.replace('"grad_clip": 1e-3', '"grad_clip": 1e9').replace(
    "        trainer = build_trainer(cfg, placement=placement, log=lambda *a: None)\n",
    "        trainer = build_trainer(cfg, placement=placement, log=lambda *a: None)\n"
    "        import contextlib, keras\n"
    "        with trainer.p.strategy.scope() if trainer.p.strategy else contextlib.nullcontext():\n"
    "            trainer.optimizer = keras.optimizers.SGD(learning_rate=0.01)\n"
    "            trainer.optimizer.build(trainer.model.trainable_variables)\n"
    "        trainer.step = trainer._make_step()\n")


@pytest.mark.slow
def test_mirrored_leaves_a_gradient_under_train_grad_clip_as_one_device_does(built_cache, tmp_path):
    # the strategy's own clip scales the summed gradient by clip / max(norm, clip): a gradient whose norm
    # is under train.grad_clip is not touched, as on one device (the test above clips at 1e-3: always over)
    assert UNCLIPPED_RUN.count("SGD") == 1 and '"grad_clip": 1e9' in UNCLIPPED_RUN
    _, one, three = cpu_and_mirrored(UNCLIPPED_RUN, built_cache, tmp_path)
    assert np.array_equal(one["before"], three["before"])
    size = np.abs(one["after"] - one["before"]).max()
    assert size > 1e-6 and np.abs(three["after"] - one["after"]).max() < 0.01 * size, size


def _train(path, *extra, check=True):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, "-m", "pipeline.train", "--config", str(path), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, check=check)


def _saved_step(folder):
    """The step of the checkpoint the `checkpoint` file in `folder` names as the latest; 0 before there is one."""
    try:
        return step_of(latest_checkpoint(folder))
    except FileNotFoundError:
        return 0


def _optimizer_states(*checkpoints):
    """[{step, slots}] of each checkpoint prefix: the optimizer's step and the sums of its first five
    slot variables, read from the checkpoint files (this process already has TensorFlow)."""
    import tensorflow as tf
    def state(reader):
        value = lambda name: reader.get_tensor(f"optimizer/{name}/.ATTRIBUTES/VARIABLE_VALUE")  # noqa: E731
        return {"step": int(value("_iterations")),
                "slots": [float(np.abs(value(f"_variables/{k}")).sum()) for k in range(1, 6)]}
    return [state(tf.train.load_checkpoint(str(prefix))) for prefix in checkpoints]


def test_a_run_folder_that_is_a_file_is_one_line_naming_runs_dir_for_both_trainers(built_cache, tmp_path):
    # runs/{name} a file (a download saved under the run's name, say): FileExistsError and
    # NotADirectoryError tracebacks from the trainers' mkdir
    path = tiny_config(built_cache, tmp_path, steps=2, buckets=1)
    run = config.run_dir(config.load_config(path))
    run.parent.mkdir(parents=True, exist_ok=True)
    run.write_text("not a run\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    for module, extra in (("pipeline.train", []), ("pipeline.vocoder.train", ["--out", str(tmp_path / "v.json")])):
        proc = subprocess.run([sys.executable, "-m", module, "--config", str(path), *extra], capture_output=True,
                              text=True, cwd=ROOT, env=env)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert len(errors) == 1 and "runs_dir" in errors[0] and "not a folder" in errors[0], errors
        assert str(run) in errors[0], errors
    assert run.read_text() == "not a run\n"                                     # left as it was


def test_a_second_train_of_a_run_being_trained_stops_in_one_line_writing_nothing(built_cache, tmp_path):
    # two trainers of one run folder (one by hand beside Snakemake's, say) both trained, saving their
    # checkpoints over each other's and appending both loss histories to history.jsonl
    import fcntl

    from pipeline.train import LOCK
    path = tiny_config(built_cache, tmp_path, steps=2, buckets=1)
    run = config.run_dir(config.load_config(path))
    run.mkdir(parents=True)
    with open(run / LOCK, "w") as held:
        held.write("process 1 on elsewhere\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)                                        # the first train, training
        proc = _train(path, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert len(errors) == 1 and f"{run}: another `train` is training this run now (process 1 on elsewhere " \
        f"holds {run / LOCK})" in errors[0], errors
    assert sorted(p.name for p in run.iterdir()) == [LOCK]                      # nothing written
    from pipeline.train import run_lock
    with run_lock(run, chief=True):                                             # released: the next one trains
        assert (run / LOCK).read_text().startswith(f"process {os.getpid()} on ")


def test_a_resumed_run_draws_another_batch_order_than_the_one_it_began_with(built_cache, tmp_path):
    # each run built its loader from train.seed alone: a job resumed (preempted, say) more often than
    # once an epoch kept training on the start of the same shuffled order
    from pipeline import data
    from pipeline.train import reseeded
    cfg = config.load_config(tiny_config(built_cache, tmp_path, buckets=1))

    def first_batches(c, n=4):
        ds = data.build_dataset(c, "train", with_clip_index=True)
        return [b["clip"].numpy().tolist() for b in ds.take(n)]

    fresh = first_batches(cfg)
    assert reseeded(cfg, 0) is cfg and first_batches(cfg) == fresh
    resumed = first_batches(reseeded(cfg, 8))
    assert resumed != fresh and first_batches(reseeded(cfg, 8)) == resumed      # another order; its own each time
    assert reseeded(cfg, 8)["train"]["seed"] == cfg["train"]["seed"] + 8 and cfg["train"] is not reseeded(cfg, 8)["train"]


def test_the_seed_of_a_resumed_run_is_the_step_it_resumes_at_past_diverged_checkpoints(tmp_path):
    # the reseed step was the newest checkpoint's, counted before a diverged one was set aside: the
    # first resume drew from seed + 4 while resuming ckpt-2, a rerun from ckpt-2 from seed + 2
    import tensorflow as tf

    from pipeline.train import resume_step
    folder = tmp_path / "checkpoints"
    assert resume_step(folder) == 0
    v = tf.Variable([1.0, 2.0])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(folder), max_to_keep=5)
    manager.save(checkpoint_number=2)
    v.assign([np.nan, 2.0])
    manager.save(checkpoint_number=4)                                           # diverged
    assert resume_step(folder) == 2
    (folder / "checkpoint").unlink()                                            # its state file lost too
    assert resume_step(folder) == 2
    assert step_of(folder / "ckpt-4") == 4 and step_of(folder / "best") is None  # a name put there by hand
    # a save killed before the state file named it: restore takes the state file's latest, so does the seed
    v.assign([1.0, 2.0])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(tmp_path / "killed"), max_to_keep=5)
    manager.save(checkpoint_number=2)
    state = (tmp_path / "killed" / "checkpoint").read_text()
    manager.save(checkpoint_number=6)
    (tmp_path / "killed" / "checkpoint").write_text(state)
    assert resume_step(tmp_path / "killed") == 2
    # a checkpoint named otherwise: the optimizer's count it holds, a loss-scaled one's inner count
    import keras
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    opt.build([v])
    for _ in range(3):
        opt.apply([tf.ones_like(v)], [v])
    tf.train.Checkpoint(optimizer=opt, v=v).write(str(tmp_path / "named" / "best"))
    from pipeline.train import reseeded, write_state
    write_state(tmp_path / "named", ["best"])
    assert resume_step(tmp_path / "named") == int(opt.iterations.numpy()) == 3
    cfg = config.load_config(overrides={"train": {"seed": 2 ** 32 - 1}}, check_paths=False)
    assert reseeded(cfg, 3)["train"]["seed"] == 2                               # within what Keras takes


def test_a_damaged_config_json_beside_checkpoints_is_judged_by_run_json_not_a_traceback(tmp_path):
    # a torn or edited runs/{name}/config.json stopped every rerun with a JSONDecodeError (or an
    # AttributeError for JSON that is no mapping) before anything was trained
    from pipeline.errors import PipelineError
    from pipeline.train import check_same_model
    cfg = config.load_config(write_config(tmp_path, tmp_path / "data", model=TINY_MODEL), check_paths=False)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "ckpt-4.index").write_bytes(b"")
    for damaged in ('{"name": "t", "model": {"ki', "[1]", '{"model": 3}', "\udcff"):
        (run / "config.json").write_text(damaged, encoding="utf-8", errors="surrogateescape")
        runinfo.write(run, {"format": runinfo.FORMAT, "config": {"model": cfg["model"]}, "stats": {}})
        check_same_model(cfg, run)                                              # the same model: resumes
        other = dict(cfg["model"], transformer_tts=dict(cfg["model"]["transformer_tts"], d_model=64))
        runinfo.write(run, {"format": runinfo.FORMAT, "config": {"model": other}, "stats": {}})
        with pytest.raises(PipelineError, match=r"model\.transformer_tts\.d_model changed \(64 -> 32\)"):
            check_same_model(cfg, run)


@pytest.mark.slow
def test_a_checkpoint_resumes_at_the_step_it_is_named_for_not_the_updates_applied(built_cache, tmp_path):
    # float16 loss scaling skips a step whose gradients overflow without counting it in the optimizer's
    # iterations: a resume read those, trained the skipped steps again and overwrote ckpt-N with other weights
    from pipeline import train as train_mod
    path = tiny_config(built_cache, tmp_path, steps=8, checkpoint_every=4, buckets=1, mixed_precision="float16")
    _train(path)
    cfg = config.load_config(path)
    run = config.run_dir(cfg)
    trainer = train_mod.build_trainer(cfg, log=lambda *a: None, info=runinfo.loaded(runinfo.load(run)))
    manager = train_mod.restore(trainer, run, log=lambda *a: None)
    trainer.optimizer.iterations.assign(6)                                      # as if two of its 8 were skipped
    manager.save(checkpoint_number=8)
    proc = _train(path, "--set", "train.steps=10")
    assert f"resumed from {run / 'checkpoints' / 'ckpt-8'} at step 8 (6 updates applied: float16 loss scaling " \
           "skipped the others)" in proc.stdout + proc.stderr
    summary = load_json(run / "train.json")
    assert summary["resumed_from"] == 8 and summary["steps"] == 10 and summary["checkpoint"].endswith("ckpt-10")
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(run / "checkpoints" / "ckpt-10"))
    applied = reader.get_tensor("optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE")
    assert 6 <= applied <= 8                                                    # 6 + the 2 steps it took, less any skipped


def test_a_checkpoint_named_for_another_step_than_it_trained_is_refused_in_one_line(built_cache, tmp_path):
    # ckpt-2 renamed ckpt-9 resumed at step 9 (7 steps of schedule and batches skipped) and said that
    # float16 loss scaling had skipped them, with loss scaling off
    from pipeline.train import write_state
    path = tiny_config(built_cache, tmp_path, steps=2, checkpoint_every=2, buckets=1, mixed_precision="off")
    _train(path)
    folder = config.run_dir(config.load_config(path)) / "checkpoints"
    for f in folder.glob("ckpt-2.*"):
        f.rename(f.with_name(f.name.replace("ckpt-2", "ckpt-9")))
    write_state(folder, ["ckpt-9"])
    proc = _train(path, "--set", "train.steps=10", check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors == [f"error: {folder / 'ckpt-9'}: named for step 9, but its optimizer applied 2 updates (renamed, or "
                      "copied under another step's name?); give its .index and .data files back the name ckpt-2, or "
                      f"move them out of {folder}"], errors
    assert sorted(p.name for p in folder.glob("ckpt-*.index")) == ["ckpt-9.index"]  # nothing trained over it


@pytest.mark.slow
def test_rerun_after_kill_resumes_at_the_saved_step_with_optimizer_state(aligned_cache, tmp_path, capsys):
    path = tiny_config(aligned_cache, tmp_path, model=TINY_FASTPITCH_MODEL, steps=400, checkpoint_every=4, buckets=1)
    cfg = config.load_config(path)
    ckpt_dir = config.run_dir(cfg) / "checkpoints"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.train", "--config", str(path)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    # killed once the `checkpoint` file names step 8 or later: a checkpoint's files are written before
    # that file is (atomically) updated, and a kill between the two leaves the step before it the latest
    while time.time() < deadline and _saved_step(ckpt_dir) < 8:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the latest checkpoint the killed run left, kept aside: its optimizer state is read with the resumed one's
    latest = Path(latest_checkpoint(ckpt_dir))
    kept = tmp_path / "killed_at"
    kept.mkdir()
    for f in ckpt_dir.glob(latest.name + ".*"):
        shutil.copy2(f, kept / f.name)
    step = step_of(latest)
    assert step >= 8 and step % 4 == 0
    # resume: the summary says where it continued from, and it ends at train.steps
    target = step + 6
    _train(path, "--set", f"train.steps={target}", "train.checkpoint_every=100")
    summary = load_json(config.run_dir(cfg) / "train.json")
    assert summary["resumed_from"] == step and summary["steps"] == target
    assert summary["history"][-1]["step"] == target
    saved, after = _optimizer_states(kept / latest.name, ckpt_dir / f"ckpt-{target}")
    assert saved["step"] == step and any(saved["slots"])  # the optimizer state was checkpointed with the model
    assert after["step"] == target and after["slots"] != saved["slots"]
    # already at train.steps: a rerun does no step (the command's main() in this process, which has
    # TensorFlow already: the two runs above were the command's own processes)
    from pipeline.train import main as train_main
    capsys.readouterr()
    train_main(["--config", str(path), "--set", f"train.steps={target}"])
    assert load_json(config.run_dir(cfg) / "train.json")["resumed_from"] == target
    # and says so: after a data edit, the jobs after it rerun on a model that learned nothing of it
    assert f"train.steps = {target} already reached (resumed at step {target}): no step taken" in capsys.readouterr().out


@pytest.fixture(scope="module")
def synthesized(built_cache, tmp_path_factory):
    """A tiny model trained (20 steps, checkpoints at 10 and 20) and its samples written by one real
    `snakemake synthesize`: (config path, its folder). Read by the next test; the one after it makes
    train and synthesize fail on purpose, on a copy."""
    tmp = tmp_path_factory.mktemp("synthesized")
    path = tiny_config(built_cache, tmp, steps=20, checkpoint_every=10, summary_every=10, buckets=1)
    snakemake("synthesize", config=path)
    return path, tmp


@pytest.mark.slow
def test_snakemake_train_then_synthesize_writes_wavs(synthesized):
    path, _ = synthesized
    cfg = config.load_config(path)
    run = config.run_dir(cfg)
    summary = load_json(run / "train.json")
    assert summary["steps"] == 20 and summary["val_loss"]
    assert (run / "alignment.png").stat().st_size > 1000
    assert list(run.glob("events.out.tfevents.*"))
    for i in range(len(cfg["synthesize"]["sentences"])):
        audio, sr = sf.read(run / "samples" / f"{i:02d}.wav")
        assert sr == cfg["audio"]["sample_rate"] and len(audio) > 0.1 * sr
        assert np.isfinite(audio).all() and np.abs(audio).max() > 0
        mel = np.load(run / "samples" / f"{i:02d}.npy")  # the log-mel the wav was vocoded from
        assert mel.shape[1] == cfg["audio"]["n_mels"] and len(audio) == len(mel) * cfg["audio"]["hop_length"]
    assert load_json(run / "samples" / "sentences.json")["checkpoint"].endswith("ckpt-20")
    # the same synthesis as an API, for other stages (evaluate), in this process
    from pipeline.synthesize import load_synthesizer
    synth = load_synthesizer(cfg, log=lambda *a: None)
    mel = synth.mel("A short test sentence.")
    assert synth.step == 20 and synth.checkpoint.endswith("ckpt-20")
    assert mel.shape[0] > 0 and mel.shape[1] == cfg["audio"]["n_mels"]
    assert mel.dtype == np.float32 and np.isfinite(mel).all()
    # the checkpoints survive a forced rerun of train (they are not a rule output)
    assert list((run / "checkpoints").glob("ckpt-20.index"))


def samples_of(run):
    """{name: bytes} of the wavs and mels in runs/{name}/samples."""
    return {p.name: p.read_bytes() for p in (run / "samples").iterdir() if p.suffix in (".wav", ".npy")}


@pytest.mark.slow
def test_failing_synthesize_and_train_keep_the_samples_loss_history_and_checkpoints(synthesized, tmp_path):
    # Snakemake deletes a failed job's outputs: what the run had made before must survive that. On a
    # copy of the shared run (mtimes kept), so the tests that read it pass in any order.
    origin = synthesized[1]
    folder = tmp_path / "copy"
    shutil.copytree(origin, folder)
    good = folder / "config.yaml"
    good.write_text(good.read_text().replace(str(origin), str(folder)))
    run = config.run_dir(config.load_config(good))
    samples = samples_of(run)
    assert {"00.wav", "00.npy"} <= set(samples) and (run / "samples/sentences.json").exists()
    assert [r["step"] for r in load_json(run / "train.json")["history"]] == [5, 10, 15, 20]

    # a synthesize that fails inside (its checkpoint torn, which planning cannot see): the samples stay
    # (forced: the copy's outputs have no Snakemake metadata, so nothing else reruns)
    data = next((run / "checkpoints").glob("ckpt-20.data-*"))
    raw = data.read_bytes()
    try:
        data.write_bytes(raw[:len(raw) // 2])
        proc = snakemake("synthesize", "--forcerun", "synthesize", config=good, check=False)
    finally:
        data.write_bytes(raw)
    assert proc.returncode == 1, proc.stderr[-3000:]  # Snakemake's own exit status for a failed job
    assert "does not read whole" in (folder / "reports/t/logs/synthesize.log").read_text()
    assert "rule train" not in proc.stdout + proc.stderr  # training was up to date
    assert samples_of(run) == samples
    assert not list(run.glob(".samples.tmp*"))

    # a train that fails inside (the loss diverges, resumed from weights finite but blowing up, at the
    # highest rate the schema takes): Snakemake deletes train.json, nothing else is lost
    cfg = yaml.safe_load(good.read_text())
    bad = tmp_path / "config.yaml"
    cfg["train"].update(steps=40, learning_rate=1.0)
    bad.write_text(yaml.safe_dump(cfg))
    ckpt = {p: p.read_bytes() for p in (run / "checkpoints").glob("ckpt-20.*")}
    try:
        inflate_checkpoint(run / "checkpoints/ckpt-20", "model/")
        proc = snakemake("synthesize", "--forcerun", "train", config=bad, check=False)
    finally:
        for p, raw in ckpt.items():
            p.write_bytes(raw)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "loss became" in (folder / "reports/t/logs/train.log").read_text()
    assert not (run / "train.json").exists()
    assert [json.loads(line)["step"] for line in (run / "history.jsonl").read_text().splitlines()][:4] == [5, 10, 15, 20]
    assert (run / "checkpoints/ckpt-20.index").exists()
    assert samples_of(run) == samples

    # fewer sentences than the run before: none of its samples is left past the new last one
    from pipeline.synthesize import synthesize
    assert sorted(samples) == ["00.npy", "00.wav", "01.npy", "01.wav"]
    synthesize(config.merge(config.load_config(good), {"synthesize": {"sentences": ["Goodbye."]}}), run / "samples",
               log=lambda *a: None)
    assert sorted(samples_of(run)) == ["00.npy", "00.wav"]
    assert [s["wav"] for s in load_json(run / "samples/sentences.json")["samples"]] == [str(run / "samples/00.wav")]


REPORT_FIELDS = {"verdict", "input_wait_fraction", "loader", "step", "combined", "pyfunc_ops", "step_time_cv",
                 "oscillation", "traces", "gpus", "recommendations"}


@pytest.mark.slow
def test_snakemake_diagnose_writes_the_report_from_the_caches_alone(built_cache, tmp_path):
    path = tiny_config(built_cache, tmp_path)
    with open(path, "a") as f:
        f.write("diagnose: {steps: 12, warmup: 3}\n")
    snakemake("diagnose", config=path)
    cfg = config.load_config(path)
    report = config.report_dir(cfg)
    assert not (config.run_dir(cfg) / "train.json").exists()  # no training run was needed
    result = load_json(report / "diagnose.json")
    assert REPORT_FIELDS <= set(result)
    assert result["verdict"] in ("compute_bound", "input_bound", "retracing")
    assert result["pyfunc_ops"] == [] and result["gpus"] == []
    assert result["traces"] <= 2 + 1  # two buckets
    assert result["loader"]["examples_per_s"] > 0 and result["combined"]["steps_per_s"] > 0
    assert result["recommendations"] and "GPU" in " ".join(result["recommendations"])
    assert (report / "diagnose.md").read_text().startswith("# Diagnose")
    assert (report / "diagnose.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # how far training goes and how often it logs and saves do not rerun it (raising train.steps did);
    # the batch whose step it times does
    loop = edited_copy(path, "diagnose_loop.yaml", train={"steps": 999, "log_every": 7, "checkpoint_every": 7,
                                                          "summary_every": 7})
    assert planned_jobs(loop, "diagnose") == {}
    assert planned_jobs(edited_copy(path, "diagnose_batch.yaml", train={"batch_size": 3}), "diagnose") == {"diagnose": 1}


@pytest.mark.slow
def test_fastpitch_trains_from_the_durations_and_speaks_at_every_pace(aligned_cache, tmp_path):
    path = tiny_config(aligned_cache, tmp_path, model=TINY_FASTPITCH_MODEL, steps=60, checkpoint_every=60,
                       summary_every=60, learning_rate=0.005)
    _train(path)
    cfg = config.load_config(path)
    summary = load_json(config.run_dir(cfg) / "train.json")
    history = summary["history"]
    assert summary["steps"] == 60 and set(history[0]) >= {"mel", "duration", "pitch", "energy", "total"}
    # the validation loss (the same held-out batches at step 0 and 60), not single training batches,
    # whose loss depends more on which bucket they came from than on the step (e.g. 1.38, 0.91, 1.36, 0.84)
    before, after = summary["val_loss"][0], summary["val_loss"][-1]
    assert (before["step"], after["step"]) == (0, 60)
    assert after["total"] < 0.6 * before["total"] and after["mel"] < 0.9 * before["mel"], summary["val_loss"]
    assert summary["traces"] <= len(summary["buckets"]) + 1
    assert (config.run_dir(cfg) / "alignment.png").stat().st_size > 1000  # the durations' alignment
    from pipeline.synthesize import load_synthesizer, synthesize  # in this process, as evaluate calls them
    cfg = config.load_config(path, {"synthesize": {"max_seconds": 30.0}})
    synth = load_synthesizer(cfg, log=lambda *a: None)
    text = "The quick brown fox jumps over the lazy dog."
    n = {pace: len(synth.infer(text, pace=pace)["mel"]) for pace in (0.5, 1.0, 2.0)}
    assert synth.step == 60 and n[1.0] > 10
    assert abs(n[0.5] / n[1.0] - 2.0) <= 0.2 and abs(n[2.0] / n[1.0] - 0.5) <= 0.05, n
    for wav in synthesize(cfg, tmp_path / "samples", log=lambda *a: None):
        audio, sr = sf.read(wav)
        mel = np.load(wav.replace(".wav", ".npy"))
        assert mel.shape[1] == cfg["audio"]["n_mels"] and len(audio) == len(mel) * cfg["audio"]["hop_length"]


@pytest.mark.slow
def test_a_users_own_model_kind_trains_and_synthesizes(built_cache, tmp_path):
    """docs/models.md's example, docs/examples/my_tts.py, as a user runs it: copied beside the project,
    named by model.kind, trained through the real loop in mixed bfloat16 (what `auto` picks on recent
    GPUs), then synthesizing."""
    shutil.copy(ROOT / "docs" / "examples" / "my_tts.py", tmp_path / "my_tts.py")
    options = {"width": 8, "frame_multiple": 2}
    path = tiny_config(built_cache, tmp_path, model={"kind": "my_tts:build", "options": options}, steps=30,
                       mixed_precision="bfloat16")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    for module in ("pipeline.train", "pipeline.synthesize"):
        subprocess.run([sys.executable, "-m", module, "--config", str(path)], cwd=ROOT, env=env, check=True,
                       capture_output=True)
    cfg = config.load_config(path)
    summary = load_json(config.run_dir(cfg) / "train.json")
    assert summary["steps"] == 30 and summary["history"][-1]["mel"] < summary["history"][0]["mel"]
    assert all(frames % 2 == 0 for _, frames in summary["buckets"])  # the model's frame multiple, from the config
    samples = load_json(config.run_dir(cfg) / "samples" / "sentences.json")
    assert samples["model"] == "my_tts:build"
    assert all(0 < x["frames"] <= 86 and x["frames"] % 2 == 0 for x in samples["samples"])

