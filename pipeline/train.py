"""Train the acoustic model (`model.kind`) from the caches, resuming from the last checkpoint.

    python -m pipeline.train --config configs/config.yaml --out runs/demo/train.json
    snakemake --cores all train                     # the same, after rebuilding stale caches

Reads the cache index and shards (pipeline.data; the duration shards too when the model's `needs`
list them), config keys `model:` and `train:`. Any model kind works through the interface of
pipeline/models (docs/models.md): the trainer normalises mel, pitch and energy, calls the model and
its `tts_loss`, and never looks inside. Writes runs/{name}/run.json (what the run carries, written
when it starts: vocabulary, feature statistics, model/text/audio/pitch config; pipeline/runinfo.py),
checkpoints/ (tf.train.CheckpointManager: model, optimizer state, step), config.json (the whole
config), .train.lock (held while it trains: a second `train` of the run stops with one line), history.jsonl (every logged loss across reruns: not a Snakemake output, so a failing rerun,
whose train.json Snakemake deletes first, loses none of it), rejected.tsv (every clip this training leaves out), TensorBoard events in runs/{name}/
(losses, lr, steps/s, input-wait fraction, mel and alignment images, Griffin-Lim audio),
alignment.png (the attention, or the durations' hard alignment), and finally the summary --out.
Each logged loss is the mean over the steps since the previous log line (Keras Mean trackers).
A rerun after an interruption (kill -9 included) continues at the saved step with the saved
optimizer state and the run's own vocabulary and statistics until train.steps; a vocabulary or a
text/audio/pitch setting that changed under the checkpoints is a one-line error naming it. A loss or
weights that turn NaN or infinite stop the run with one line (Diverged) before anything non-finite is
saved, naming the checkpoint a rerun resumes from; a checkpoint the run diverges from again right
after resuming, at a lower train.learning_rate than before (checkpoints/diverged.json), or one that
older code saved non-finite, is moved to checkpoints/diverged/.

`train()` reads as its steps: start_run (resume or start: the run's info), build_trainer,
record_run, restore, left_out, run_steps (Progress: log lines; validate_and_draw), finish.

With train.placement: multiworker (`python -m pipeline.launch --workers N -- --config ...` on one
host, `srun` across nodes; docs/scaling.md) every worker runs this same loop on its own share of
the shards; the chief alone writes the checkpoints, config.json, TensorBoard events and the summary,
the other workers save into a temporary folder of their own (every worker takes part in a save),
and all of them restore the chief's latest checkpoint on a rerun.
"""
import argparse
import contextlib
import errno
import functools
import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from pipeline import config, data, files, models, optim, runinfo
from pipeline import placement as placement_mod
from pipeline.errors import PipelineError, cli, disk_full


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `peak`, then inverse square-root decay (Transformer schedule)."""

    def __init__(self, peak, warmup_steps):
        self.peak, self.warmup_steps = peak, warmup_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = tf.cast(max(self.warmup_steps, 1), tf.float32)
        return self.peak * tf.minimum(step / warmup, tf.sqrt(warmup / step))

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps}


def traced_once_update(optimizer, variables):
    """The optimizer's update of `variables` as a tf.function of its own, traced once: (apply, function).

    Its inputs (one dense gradient per variable) have the variables' shapes whatever the batch's, so a
    step traced again for another bucket shape calls it instead of building the optimizer's ops again
    (about half a trace). apply(grads), called inside that step, makes an embedding's IndexedSlices
    dense, as Adam uses them. Under a tf.distribute strategy the update stays in strategy.run."""
    function = tf.function(lambda grads: optimizer.apply(grads, variables), autograph=False)

    def apply(grads):
        return function([tf.convert_to_tensor(g) for g in grads])
    return apply, function


def _to_device(batch, device):
    with tf.device(device):
        return {k: tf.identity(v) for k, v in batch.items()}


class Trainer:
    """The model, optimizer, input pipeline and compiled step for one config and placement."""

    def __init__(self, cfg, placement=None, log=print, info=None):
        """`info`: what the run carries (pipeline/runinfo.py: vocab, stats, n_mels); the cache's when None."""
        self.cfg, self.log = cfg, log
        self.index = data.read_index(cfg)
        info = info or {"vocab": self.index["vocab"], "stats": data.feature_stats(cfg, self.index),
                        "n_mels": self.index["n_mels"]}
        self.vocab, self.n_mels = info["vocab"], info["n_mels"]
        self.voices = {k: info.get(k, self.index.get(k, [])) for k in ("speakers", "languages")}  # sorted name tables
        # the first TensorFlow op: multiworker creates its strategy here; auto may read the last diagnose report
        # bfloat16 on an AMX CPU only for the built-in kinds: a model of the user's own may assume float32
        self.p = placement_mod.resolve(cfg["train"], placement, report=config.report_dir(cfg) / "diagnose.json",
                                       cpu_bfloat16=cfg["model"]["kind"] in models.KINDS)
        placement_mod.set_precision_policy(self.p.mixed_precision)
        keras.utils.set_random_seed(cfg["train"]["seed"])
        clips = data.load_clips(cfg, "all", self.index)[0]  # every shard's JSON read and checked once here
        self.edges, self.shapes = data.bucket_shapes(cfg, clips=clips)
        self.n_buckets = len(self.shapes)
        self.placement, self.model_device = self.p.name, self.p.model_device
        self.copy_ms = None
        self.start_step = 0  # the step it resumes at (restore)
        with self._scope():
            self.stats = {k: np.asarray(v, np.float32) for k, v in info["stats"].items()}
            self.norm = {k: tf.constant(v, tf.float32) for k, v in self.stats.items()}
            self.model = models.build(cfg["model"], self.vocab, self.n_mels, **self.voices)
            check_frame_multiple(cfg["model"], self.model)
            self.needs = tuple(self.model.needs)
            self.model(self._dummy_batch(), training=False)  # create the variables now, in this scope
            # after the first call: layers such as MultiHeadAttention(dropout=...) make their seed
            # generator in build(); train.seed's masks then differ per replica
            placement_mod.per_replica_dropout(self.model, self.p.strategy)
            if hasattr(self.model, "adapt"):
                self.model.adapt(self.stats)
            tcfg = cfg["train"]
            # Under a strategy the step clips the replicas' summed gradient itself (_make_step): Keras
            # would clip each replica's share before its all-reduce.
            clip = None if self.p.strategy else tcfg["grad_clip"]
            opt = optim.AdamW(learning_rate=WarmupSchedule(tcfg["learning_rate"], tcfg["warmup_steps"]),
                              weight_decay=1e-6, beta_2=0.98, global_clipnorm=clip)
            if self.p.mixed_precision == "float16":
                opt = keras.optimizers.LossScaleOptimizer(opt)  # float16 gradients underflow without it
            opt.build(self.model.trainable_variables)  # slots exist before a restore fills them
            self.optimizer = opt
        if "durations" in self.needs:  # the clips the duration shards leave out are in no split's batches
            clips = data.load_clips(cfg, "all", self.index, durations=True)[0]
        self.has_val = bool(clips.val.any())
        self.dataset = self._distribute(self._train_dataset)
        self.val_dataset = self.build_dataset("val") if self.has_val else None  # built once, iterated per validation
        self.update = None  # the optimizer's update, a function of its own where it can be (_make_step)
        self.step = self._make_step()
        # Validation is not XLA-compiled: one trace with every dimension unknown serves every bucket and
        # the last, smaller batch (a trace per shape cost ~1-4 s of start-up each, for a few batches).
        self._eval = None if self.val_dataset is None else tf.function(self._forward, autograph=False, input_signature=[
            tf.nest.map_structure(lambda s: tf.TensorSpec([None] * s.shape.rank, s.dtype), self.val_dataset.element_spec)])
        self.log(self.p.describe())

    # --- construction -------------------------------------------------------------------------
    def _scope(self):
        return self.p.strategy.scope() if self.p.strategy else tf.device(self.p.model_device)

    def build_dataset(self, split, **kwargs):
        """The loader for `split`, with the duration shards when the model needs them."""
        if "durations" in self.needs:
            kwargs["durations"] = True
        return data.build_dataset(self.cfg, split, balance=self.cfg["train"]["balance"] == "speaker", **kwargs)

    def _dummy_batch(self):
        t, f = self.shapes[0]
        return models.dummy_batch(t, f, self.n_mels, data.voice_fields(self.index))

    def _train_dataset(self, input_context=None):
        if self.p.name != "multiworker":
            return self.build_dataset("train")
        # this worker's own shards, each batch split among the worker's local replicas
        local = self.p.strategy.num_replicas_in_sync // self.p.worker[1]
        return data.build_worker_dataset(self.cfg, self.p.worker, local_replicas=local,
                                         durations="durations" in self.needs,
                                         balance=self.cfg["train"]["balance"] == "speaker")

    def _distribute(self, make):
        if self.p.name == "multiworker":
            return self.p.strategy.distribute_datasets_from_function(make)
        ds = make()
        if self.p.strategy is not None:
            return self.p.strategy.experimental_distribute_dataset(ds)
        if self.p.name == "split":
            # must be the last transformation: batches land on data_device ahead of the step
            return ds.apply(tf.data.experimental.prefetch_to_device(self.p.data_device, buffer_size=2))
        return ds

    def _normalise(self, batch):
        return normalise(batch, self.norm)  # on the model device

    def _forward(self, batch):
        batch = self._normalise(batch)
        out = self.model(batch, training=False)
        return self.model.tts_loss(out, batch)[1], out

    def _grads(self, batch, share=None):
        """The gradient of the loss times `share`, this replica's part of the global batch (None: one
        device, or replicas with even parts)."""
        batch = self._normalise(batch)
        with tf.GradientTape() as tape:
            out = self.model(batch, training=True)
            loss, terms = self.model.tts_loss(out, batch)
            scaled = loss / tf.distribute.get_strategy().num_replicas_in_sync if share is None else loss * share
            if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
                scaled = self.optimizer.scale_loss(scaled)
        return tape.gradient(scaled, self.model.trainable_variables), terms

    def _make_step(self):
        # No AutoGraph in the step, the validation pass or the update: the loss and the models branch
        # with tf.where / tf.cond, never a Python `if` on a tensor (docs/models.md), so converting them
        # changed nothing in the graph and cost ~1 CPU s in every training process's first trace.
        variables = self.model.trainable_variables
        if self.p.strategy is None:
            update, self.update = traced_once_update(self.optimizer, variables)  # each bucket's trace reuses it

            def step(batch):
                grads, terms = self._grads(batch)
                update(grads)
                return terms
            return placement_mod.OnDevice(tf.function(step, jit_compile=self.p.jit_compile, autograph=False),
                                          self.p.model_device)
        # mirrored: XLA compiles each replica's forward/backward; the all-reduce and update run outside it
        grads_fn = tf.function(self._grads, jit_compile=self.p.jit_compile, autograph=False)
        strategy = self.p.strategy
        clip = self.cfg["train"]["grad_clip"]

        def replica_step(batch):
            # Each replica's mean loss weighs as its part of the global batch: TensorFlow splits 16 clips
            # over 3 replicas as 6, 6 and 4, and the 4 clips' mean must not count as much as the 6's.
            context = tf.distribute.get_replica_context()
            clips = tf.cast(tf.shape(batch["tokens"])[0], tf.float32)
            share = clips / context.all_reduce(tf.distribute.ReduceOp.SUM, clips)
            grads, terms = grads_fn(batch, share)
            grads = [tf.convert_to_tensor(g) for g in grads]
            # Clipped by the global norm of the summed gradient, as one device clips the whole batch's
            # (Keras's global_clipnorm would clip each replica's share before summing): every replica
            # scales its share by the same factor, and optimizer.apply sums them.
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            norm = tf.linalg.global_norm(total)
            if isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
                norm = norm / tf.cast(self.optimizer.dynamic_scale, norm.dtype)  # the loss scale's
            # A non-finite sum (a float16 overflow on any replica) makes every replica's share NaN, so the
            # loss-scale optimizer skips the step on all replicas alike, never on one while another sums.
            factor = tf.where(tf.math.is_finite(norm), clip / tf.maximum(norm, clip), float("nan"))
            self.optimizer.apply([g * tf.cast(factor, g.dtype) for g in grads], variables)
            return {k: v * tf.cast(share, v.dtype) for k, v in terms.items()}  # summed: the batch's mean

        @functools.partial(tf.function, autograph=False)
        def step(batch):
            terms = strategy.run(replica_step, args=(batch,))
            return {k: strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in terms.items()}
        return step

    def wait_for_all(self):
        """multiworker: return when every worker got here (one all-reduce). A worker that exits while
        another still works fails TensorFlow's shutdown barrier and can leave the other hanging."""
        if self.p.name == "multiworker":
            s = self.p.strategy
            # in a tf.function: collectives run eagerly make TensorFlow warn about their overhead
            tf.function(lambda: s.reduce(tf.distribute.ReduceOp.SUM, s.run(lambda: tf.constant(1.0)), axis=None),
                        autograph=False)()

    # --- the loop pieces ----------------------------------------------------------------------
    @property
    def traces(self):
        return self.step.experimental_get_tracing_count()

    def context(self):
        return {"placement": self.p.name, "jit_compile": self.p.jit_compile,
                "mixed_precision": self.p.mixed_precision, "copy_ms": self.copy_ms,
                "buckets": self.n_buckets, "devices": self.p.devices, "worker": list(self.p.worker),
                "cpu_kernels": placement_mod.cpu_kernels()}

    def batches(self):
        """Training batches ready for the step. With split, each batch is copied to the model
        device one step ahead, so the copy runs while the previous step computes."""
        it = iter(self.dataset)
        if self.p.name != "split" or self.p.data_device == self.p.model_device:
            yield from it
            return
        ahead = _to_device(next(it), self.p.model_device)
        for batch in it:
            current, ahead = ahead, _to_device(batch, self.p.model_device)  # async copy of the next one
            yield current

    def measure_copy(self, repeats=5):
        """Milliseconds to copy one batch from data_device to model_device (split only)."""
        if self.p.name != "split":
            return None
        batch = next(iter(self.dataset))
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            copied = _to_device(batch, self.p.model_device)
            copied["mel_lengths"].numpy()  # waits for the copy
            times.append(time.perf_counter() - t)
        self.copy_ms = 1000 * float(np.median(times))
        mb = sum(v.numpy().nbytes for v in batch.values()) / 1e6
        self.log(f"split: copying a {mb:.1f} MB batch {self.p.data_device} -> {self.p.model_device} "
                 f"takes {self.copy_ms:.2f} ms; it overlaps the previous step")
        return self.copy_ms

    def validate(self, max_batches=8):
        """Mean validation loss terms and the first batch's outputs (for images), or None without val clips."""
        if not self.has_val:
            return None, None, None  # val_fraction 0, or a corpus too small to hold a validation clip
        sums, n, first = {}, 0, None
        with tf.device(self.p.model_device):
            for batch in self.val_dataset.take(max_batches):
                terms, out = self._eval(batch)
                for k, v in terms.items():
                    sums[k] = sums.get(k, 0.0) + float(v)
                n += 1
                first = first or (batch, out)
        return ({k: v / n for k, v in sums.items()}, *first) if n else (None, None, None)


def normalise(batch, norm):
    """Mel, pitch (voiced frames only: unvoiced stays 0; per speaker with several) and energy to zero
    mean, unit variance."""
    out = dict(batch, mel=(tf.cast(batch["mel"], tf.float32) - norm["mel_mean"]) / norm["mel_std"])
    if "pitch" in batch:
        pitch = tf.cast(batch["pitch"], tf.float32)
        if "speaker" in batch and "speaker_pitch_mean" in norm:
            mean = tf.gather(norm["speaker_pitch_mean"], batch["speaker"])[:, None]   # (B, 1)
            std = tf.gather(norm["speaker_pitch_std"], batch["speaker"])[:, None]
        else:
            mean, std = norm["pitch_mean"], norm["pitch_std"]
        out["pitch"] = tf.where(pitch > 0, (pitch - mean) / std, 0.0)
    if "energy" in batch:
        out["energy"] = (tf.cast(batch["energy"], tf.float32) - norm["energy_mean"]) / norm["energy_std"]
    return out


def build_trainer(cfg, placement=None, log=print, info=None):
    """The interface diagnose uses: .dataset, .step, .n_buckets, .model_device, .placement, .context()."""
    return Trainer(cfg, placement=placement, log=log, info=info)


# --- training loop -----------------------------------------------------------------------------
def _image(x):
    """(H, W) array -> (1, H, W, 1) image in [0, 1], low rows at the bottom."""
    x = np.asarray(x, np.float32)
    x = (x - x.min()) / max(float(x.max() - x.min()), 1e-6)
    return x[::-1][None, :, :, None]


def _write_summaries(trainer, step, val, batch, out):
    from pipeline.vocoder.griffin_lim import griffin_lim
    mean, std = trainer.stats["mel_mean"], trainer.stats["mel_std"]
    n = int(batch["mel_lengths"][0]); t = int(batch["token_lengths"][0])
    target = (batch["mel"][0, :n].numpy().astype(np.float32))
    pred = out["mel"][0, :n].numpy() * std + mean
    if "alignment" in out:  # attention (decoder steps x tokens)
        align = out["alignment"][0, :, :t].numpy()
        align = align[: -(-n * align.shape[0] // out["mel"].shape[1])]
    elif "durations" in batch:  # the durations' hard alignment (frames x tokens)
        align = np.eye(t, dtype=np.float32)[np.repeat(np.arange(t), batch["durations"][0, :t].numpy())]
    else:  # a model with neither
        align = None
    for k, v in val.items():
        tf.summary.scalar(f"val/{k}", v, step=step)
    tf.summary.image("mel/target_vs_prediction", _image(np.concatenate([target, pred], 1).T), step=step)
    if align is not None:
        tf.summary.image("alignment", _image(align.T), step=step)
    audio = griffin_lim(pred, iters=trainer.cfg["synthesize"]["griffin_lim_iters"], **trainer.cfg["audio"])
    tf.summary.audio("griffin_lim", audio[None, :, None], trainer.cfg["audio"]["sample_rate"], step=step)
    return align


def _terms(values):
    return " ".join(f"{k} {v:.4f}" for k, v in values.items() if k != "total")


def save_alignment_png(align, path, step):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.imshow(np.asarray(align).T, origin="lower", aspect="auto", interpolation="none")
    ax.set(xlabel="decoder step or frame", ylabel="token", title=f"alignment (validation clip, step {step})")
    files.atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)


def has_checkpoints(folder):
    """Whether `folder` holds checkpoints to resume, its state file lost or not: restore lists them
    again (relist) and resumes, so whatever checks a resume must run on them too."""
    return tf.train.latest_checkpoint(str(folder)) is not None or any(Path(folder).glob("ckpt-*.index"))


def check_same_model(cfg, run):
    """Resuming needs the model that made the checkpoints: another `model:` (the sections of kinds the run
    does not use aside) is an error naming what changed, not a traceback. The run's config.json says
    what made them, else its run.json (config.json deleted or damaged: it is rewritten only after this check)."""
    if not has_checkpoints(run / "checkpoints"):
        return
    try:
        before = json.loads((run / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    before = before.get("model") if isinstance(before, dict) else None
    if not isinstance(before, dict):
        try:
            before = runinfo.load(run)["config"].get("model")
        except runinfo.MissingCheckpoint:
            before = None
    changed = runinfo.model_changes(before, cfg["model"]) if before is not None else []
    if changed:
        raise PipelineError(f"{run / 'checkpoints'}: made by another `model:` configuration (kind "
                            f"{before.get('kind')!r}, now {cfg['model']['kind']!r}: {'; '.join(changed)}); restore it, "
                            f"give this run another `name`, or delete {run / 'checkpoints'} to start over")


def check_frame_multiple(model_cfg, model):
    """The loader pads frames to `models.frame_multiple(model_cfg)`, known from the config before any
    model exists (Snakemake, the loader, diagnose); a model whose own `frame_multiple` says otherwise
    would get frame counts it cannot reduce, so that is an error naming the key to set."""
    want = getattr(model, "frame_multiple", 1)
    have = models.frame_multiple(model_cfg)
    if int(want) != have:
        raise models.ModelError(f"model.kind: {model_cfg['kind']!r} has frame_multiple {want}, but the config gives "
                                f"{have}; set model.options.frame_multiple: {want} (docs/models.md)")


# --- training loop: named steps ----------------------------------------------------------------
def start_run(cfg, run, log):
    """What the run carries (pipeline/runinfo.py, JSON-ready): its own when resuming, else the cache's.
    Refuses, before anything is built, checkpoints made by another model or on a moved vocabulary, and a
    run folder that is a file (or under one) or cannot be written: one line naming runs_dir."""
    files.check_folder(run, "runs_dir")
    run.mkdir(parents=True, exist_ok=True)
    check_same_model(cfg, run)
    resuming = has_checkpoints(run / "checkpoints")
    index = data.read_index(cfg)
    return runinfo.for_training(cfg, index, data.feature_stats(cfg, index), run, resuming, log=log)


LOCK = ".train.lock"  # in runs/{name}/: held (flock) by the chief of the `train` that is training the run


@contextlib.contextmanager
def run_lock(run, chief):
    """Hold runs/{name}/.train.lock while the chief trains (files.exclusive: removed when it ends, a killed
    process's taken over): a second `train` of the same run (by hand beside Snakemake's, say) stops with
    one line before it writes anything, instead of saving its checkpoints and loss history over the first
    one's. A file system without locks (some network mounts) trains unlocked, as before."""
    if not chief:
        yield
        return
    busy = lambda holder: (f"{run}: another `train` is training this run now ({holder} holds {run / LOCK}); "
                           "wait for it to end, or give this configuration another `name`")
    with files.exclusive(run / LOCK, busy):
        yield


def record_run(cfg, run, info):
    """The chief's record of what makes this run: config.json (the whole config) and run.json."""
    files.atomic_write_text(run / "config.json", json.dumps(cfg, indent=1))
    runinfo.write(run, info)


def _finite_checkpoint(path):
    """True when checkpoint `path` reads whole and every floating-point tensor in it is finite; False
    for a torn or damaged one too (a truncated .data file, a checksum mismatch), which is set aside
    like a diverged one rather than stopping every rerun with a traceback."""
    try:
        reader = tf.train.load_checkpoint(path)
        return all(np.isfinite(reader.get_tensor(name)).all()
                   for name, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating)
    except (tf.errors.OpError, IndexError, ValueError, OSError):
        return False


def _checkpoints(folder):
    """The checkpoints the state file in `folder` lists, oldest first, whose files exist."""
    state = tf.train.get_checkpoint_state(str(folder))
    return [p for p in (state.all_model_checkpoint_paths if state else []) if tf.io.gfile.exists(p + ".index")]


def write_state(folder, names):
    """The state file `checkpoint` of `folder` as CheckpointManager writes it: `names` (ckpt-N, relative
    to the folder, oldest first), the last one the latest."""
    files.atomic_write_text(Path(folder) / "checkpoint", "".join(
        [f'model_checkpoint_path: "{names[-1]}"\n', *(f'all_model_checkpoint_paths: "{n}"\n' for n in names)]))


def set_aside(folder, bad, why, log):
    """Move checkpoints `bad` of `folder` into `folder`/diverged/ (kept, not deleted) and point the
    state file at the newest one left (none left: no state file, a fresh start). -> that one or None."""
    keep = [p for p in _checkpoints(folder) if p not in bad]
    aside = Path(folder) / "diverged"
    aside.mkdir(exist_ok=True)
    for path in bad:
        for f in Path(path).parent.glob(Path(path).name + ".*"):
            os.replace(f, aside / f.name)
    if keep:
        write_state(folder, [Path(p).name for p in keep])
    else:
        os.replace(Path(folder) / "checkpoint", aside / "checkpoint")
    log(f"set aside {', '.join(Path(p).name for p in bad)} ({why}) in {aside}; the latest checkpoint is now "
        f"{keep[-1] if keep else 'none (a rerun starts from step 0)'}")
    return keep[-1] if keep else None


def _steps_on_disk(folder):
    """The steps of the ckpt-N checkpoints in `folder` whose .index file is there, in order: what relist
    lists, whatever the state file says."""
    return sorted(int(m.group(1)) for p in Path(folder).glob("ckpt-*.index")
                  if (m := re.fullmatch(r"ckpt-(\d+)\.index", p.name)))


def relist(folder, log):
    """Checkpoints in `folder` that its state file `checkpoint` does not name (the file deleted,
    damaged, or left out of a copy) listed again, oldest first: without it the trainer would start
    from step 0, cut the loss history back and overwrite them. -> the names relisted ([] if none)."""
    if tf.train.latest_checkpoint(str(folder)) is not None:
        return []
    names = [f"ckpt-{n}" for n in _steps_on_disk(folder)]
    if not names:
        return []
    write_state(folder, names)
    log(f"{Path(folder) / 'checkpoint'}: missing or unreadable while {', '.join(names)} are there: "
        f"listed them again; resuming from {names[-1]}")
    return names


def set_aside_diverged(folder, chief, log):
    """The newest checkpoint in `folder` holding only finite numbers (None if none): a run trained
    before checkpoints were checked may have saved diverged ones; the chief sets those aside. Checkpoints
    the state file lost are listed again first (relist)."""
    relist(folder, log)
    latest = tf.train.latest_checkpoint(str(folder))
    if latest is None or _finite_checkpoint(latest):  # the usual case: one read of the newest
        return latest
    keep = [p for p in _checkpoints(folder) if p != latest]
    while keep and not _finite_checkpoint(keep[-1]):
        keep.pop()
    bad = [p for p in [*_checkpoints(folder), latest] if p not in keep]
    if chief:
        set_aside(folder, list(dict.fromkeys(bad)), "non-finite or unreadable weights", log)
    return keep[-1] if keep else None


def resume_step(folder):
    """The step the trainer will resume at from `folder` (0: from the start), read before it is built
    (it seeds the loader: reseeded). The checkpoint is the one restore will take: the state file's
    latest (every ckpt-N on disk when that file is lost: relist), else, when it is not finite, the
    newest finite one it lists (set_aside_diverged); its step is its name's, or for a checkpoint
    named otherwise, the optimizer's count it holds (as restore then reads)."""
    latest = tf.train.latest_checkpoint(str(folder))
    if latest is None:  # no state file, or a damaged one: relist lists every ckpt-N on disk
        listed = [str(Path(folder) / f"ckpt-{n}") for n in _steps_on_disk(folder)]
    else:
        listed = [p for p in _checkpoints(folder) if p != latest] + [latest]
    while listed and not _finite_checkpoint(listed[-1]):
        listed.pop()
    if not listed:
        return 0
    step = runinfo.step_of(listed[-1])
    if step is None:  # the optimizer's count: a loss-scaled one's is its inner optimizer's (restore reads that)
        reader = tf.train.load_checkpoint(listed[-1])
        name = next((n for n in ("optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
                                 "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") if reader.has_tensor(n)), None)
        step = int(reader.get_tensor(name)) if name else 0
    return step


def check_loss_scale(latest, optimizers, mixed_precision):
    """PipelineError naming train.mixed_precision when checkpoint `latest` was saved by a loss-scaled
    optimizer (float16) and `optimizers` ({name in the checkpoint: optimizer}) are not, or the other way
    round: the two keep different state, and restoring one into the other is a TensorFlow traceback.
    `auto` gives each machine its own (float16 on a GPU without bfloat16, off on most CPUs)."""
    saved = {n for n, _ in tf.train.list_variables(latest)}
    for name, opt in optimizers.items():
        scaled = f"{name}/dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE" in saved
        if scaled != isinstance(opt, keras.optimizers.LossScaleOptimizer):
            was = "float16 (with loss scaling)" if scaled else "off or bfloat16 (no loss scaling)"
            raise PipelineError(f"{latest}: trained with train.mixed_precision {was}, resumed with "
                                f"{mixed_precision} here; set train.mixed_precision: "
                                f"{'float16' if scaled else 'off'} to resume it, or give this run another `name`")


def check_named_step(latest, named, applied, loss_scaled):
    """PipelineError when checkpoint `latest`, named for step `named`, holds another count of optimizer
    updates (`applied`): only float16 loss scaling applies fewer (it skips overflowing steps), never more.
    A checkpoint renamed or copied under another step's name would resume at that step, its schedule
    and batch order skipped or trained again, and its weights saved over under names they do not have."""
    if named is None or applied == named or (loss_scaled and applied < named):
        return
    raise PipelineError(f"{latest}: named for step {named}, but its optimizer applied {applied} updates "
                        f"(renamed, or copied under another step's name?); give its .index and .data files "
                        f"back the name ckpt-{applied}, or move them out of {Path(latest).parent}")


def restore(trainer, run, log):
    """The checkpoint manager (the chief's into run/checkpoints; a worker's into a node-local folder,
    emptied, keeping one: every worker takes part in a save, only the chief's are kept) after restoring
    the chief's latest finite checkpoint, if any."""
    ckpt = tf.train.Checkpoint(model=trainer.model, optimizer=trainer.optimizer)
    chief = trainer.p.chief
    latest = set_aside_diverged(run / "checkpoints", chief, log)  # every worker resumes from the chief's
    save_dir = run / "checkpoints" if chief else placement_mod.worker_checkpoints(run, trainer.p.worker[0])
    manager = tf.train.CheckpointManager(ckpt, save_dir, max_to_keep=3 if chief else 1)
    trainer.start_step = 0
    if latest:
        check_loss_scale(latest, {"optimizer": trainer.optimizer}, trainer.p.mixed_precision)
        ckpt.restore(latest).assert_existing_objects_matched()
        applied = int(trainer.optimizer.iterations.numpy())
        named = runinfo.step_of(latest)  # its name: the steps taken; the optimizer counts those it applied
        check_named_step(latest, named, applied, isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer))
        trainer.start_step = applied if named is None else named
        skipped = f" ({applied} updates applied: float16 loss scaling skipped the others)" \
            if applied != trainer.start_step else ""
        log(f"resumed from {latest} at step {trainer.start_step}{skipped}")
    return manager


def left_out(cfg, run, durations, log, write=True):
    """Count (and list in run/rejected.tsv) the clips this training leaves out: the cache's rejects
    (cache/{name}/rejected.tsv) and, with durations, the duration shards' (audio that cannot carry its text)."""
    rows = data.left_out(cfg, durations=durations)
    by_stage = {}
    for r in rows:
        by_stage[r["stage"]] = by_stage.get(r["stage"], 0) + 1
    if write:
        from pipeline.cache import write_rejected
        write_rejected(run / "rejected.tsv", rows)
    detail = ", ".join(f"{n} at {stage}" for stage, n in sorted(by_stage.items()))
    log(f"left out {len(rows)} clips{f' ({detail})' if rows else ''}; listed in {run / 'rejected.tsv'}")
    return {"total": len(rows), **by_stage}


class Progress:
    """The log line, TensorBoard scalars and loss history: each logged loss is the mean of every
    step since the previous log line (Keras Mean trackers), with steps/s and the input-wait share."""

    def __init__(self, trainer, total, log_every, log):
        self.trainer, self.total, self.log_every, self.log = trainer, total, log_every, log
        self.trackers, self.history = {}, []
        self.steps, self.waited, self.t_log = 0, 0.0, time.perf_counter()

    def update(self, terms, waited):
        for k, v in terms.items():
            if k not in self.trackers:
                self.trackers[k] = keras.metrics.Mean(name=k)
            self.trackers[k].update_state(v)
        self.steps += 1
        self.waited += waited

    def restart_clock(self):
        self.t_log = time.perf_counter()  # validation time is neither step nor input wait

    def report(self, step):
        values = {k: float(t.result()) for k, t in self.trackers.items()}  # syncs with the device
        for t in self.trackers.values():
            t.reset_state()
        interval = time.perf_counter() - self.t_log
        steps = self.steps
        rate = steps / interval if interval > 0 else 0.0
        wait_frac = self.waited / interval if interval > 0 else 0.0
        lr = float(self.trainer.optimizer.learning_rate.numpy())
        for k, v in values.items():
            tf.summary.scalar(f"train/{k}", v, step=step)
        tf.summary.scalar("train/lr", lr, step=step)
        tf.summary.scalar("perf/steps_per_s", rate, step=step)
        tf.summary.scalar("perf/input_wait_fraction", wait_frac, step=step)
        done = step / self.total
        bar = "=" * int(30 * done) + ">" + " " * (30 - int(30 * done))
        eta = (self.total - step) / rate if rate else float("nan")
        self.log(f"step {step}/{self.total} [{bar}] loss {values['total']:.4f} ({_terms(values)}) lr {lr:.2e} "
                 f"{rate:.2f} steps/s wait {100 * wait_frac:.1f}% eta {eta:.0f}s")
        if not math.isfinite(values["total"]):
            raise NonFinite(f"the loss became {values['total']} by step {step}")
        self.history.append({"step": step, "steps": steps, **values})
        self.steps, self.waited = 0, 0.0
        self.restart_clock()


class NonFinite(Exception):
    """The loss or the weights became NaN or infinite; run_steps turns it into Diverged."""


class Diverged(PipelineError):
    """Training diverged: nothing non-finite was saved; the message names the checkpoint a rerun
    resumes from and the setting to lower."""


def check_finite_state(trainer, progress, step):
    """NonFinite unless the weights and optimizer state a checkpoint would hold, and the loss of the
    steps since the last log line, are all finite: a diverged model is never saved."""
    pending = progress.trackers.get("total")
    if progress.steps and pending is not None and not math.isfinite(float(pending.result())):
        raise NonFinite(f"the loss became {float(pending.result())} by step {step}")
    if not bool(placement_mod.all_finite([*trainer.model.variables, *trainer.optimizer.variables],
                                         trainer.model_device)):
        raise NonFinite(f"the weights became non-finite by step {step}")


DIVERGED_FROM = "diverged.json"  # in checkpoints/: the checkpoint a run last diverged after, and at what rate


def diverged(cause, manager, tcfg, resumed, chief, log, key="train.learning_rate"):
    """The one line for a diverged run: what happened, where a rerun resumes, what to change. A run that
    diverges again right after resuming checkpoint C, at a lower train.learning_rate than the run that
    diverged after C, was given C already blowing up (finite, but past saving): C is set aside in
    checkpoints/diverged/, so following the advice starts further back instead of failing forever. A
    higher or equal rate keeps C (the rate is the likelier cause). `key`: the rate's config key, for the advice."""
    latest, lr, again = manager.latest_checkpoint, float(tcfg["learning_rate"]), ""
    if chief and latest is not None:
        folder = Path(latest).parent
        marker = folder / DIVERGED_FROM
        try:
            before = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = {}
        if not (isinstance(before, dict) and isinstance(before.get("learning_rate"), (int, float))):
            before = {}   # not the marker this writes (edited by hand, say): as if there were none
        if latest == resumed and before.get("checkpoint") == Path(latest).name and lr < before.get("learning_rate", 0):
            again = (f"it diverged again from {Path(latest).name} at a lower rate than before "
                     f"({before['learning_rate']:g}), so that checkpoint is set aside in {folder / 'diverged'}; ")
            latest = set_aside(folder, [latest], "diverged again after resuming from it", log)
            marker.unlink(missing_ok=True)
        else:
            files.atomic_write_text(marker, json.dumps({"checkpoint": Path(latest).name, "learning_rate": lr}))
    resume = (f"nothing non-finite was saved, {again}a rerun resumes from {latest}, the last checkpoint (all finite)"
              if latest else f"nothing non-finite was saved, {again}no checkpoint is left, so a rerun starts from step 0"
              if again else "no checkpoint was saved, so a rerun starts from step 0")
    advice = (f"rerun (lowering {key}, now {lr:g}, further if it diverges again)" if again
              else f"lower {key} (now {lr:g}) and rerun")
    return Diverged(f"training diverged: {cause}; {resume}: {advice}")


def validate_and_draw(trainer, step, val_history, log):
    """Validation loss, TensorBoard images and audio; the alignment drawn (or None)."""
    val, vbatch, vout = trainer.validate()
    if val is None:
        return None
    val_history.append({"step": step, **val})
    log(f"step {step}: validation loss {val['total']:.4f} ({_terms(val)})")
    return _write_summaries(trainer, step, val, vbatch, vout) if step else None


def save_checkpoint(manager, step):
    """manager.save(step). On a full disk: TensorFlow's half-written ckpt-N_temp/ and ckpt-N.* removed,
    the previous checkpoint (still the latest) kept, and one line naming the folder."""
    try:
        return manager.save(checkpoint_number=step)
    except (OSError, tf.errors.OpError) as e:
        if getattr(e, "errno", None) != errno.ENOSPC and "No space left on device" not in str(e):
            raise
        folder = Path(manager.directory)
        for leftover in [*folder.glob(f"ckpt-{step}_temp*"), *folder.glob(f"ckpt-{step}.*")]:
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        raise disk_full(folder / f"ckpt-{step}") from None


def past_history(run, step):
    """The logged losses of earlier runs up to `step` (the restored one), history.jsonl rewritten to
    them: a run killed after its last checkpoint logged steps that this run trains again."""
    path = run / "history.jsonl"
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    kept = []
    for n, line in enumerate(lines, start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:  # a line torn by a kill during its append: the rows after it are not vouched for
            print(f"{path}:{n}: not a whole JSON line (a run killed while logging?): the losses from here on "
                  "are dropped, the checkpoints are not touched", flush=True)
            break
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            kept.append(row)
    files.atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


def note_no_steps(step, total, key, log):
    """A resumed run already at its last step trains nothing: say so, or an edit to the data looks
    learned (the jobs after it rerun all the same)."""
    if step >= total:
        log(f"{key} = {total} already reached (resumed at step {step}): no step taken, so nothing changed "
            f"since is learned; raise {key} to train on it")


def run_steps(trainer, manager, tcfg, chief, log, history_file=None):
    """Steps from the restored one to train.steps: log, validate, checkpoint. (history, val_history, align).
    history_file: each logged loss is appended to it too (the chief's runs/{name}/history.jsonl)."""
    step, total = trainer.start_step, tcfg["steps"]
    resumed = manager.latest_checkpoint  # the checkpoint this run started from (None: step 0)
    progress, val_history, align = Progress(trainer, total, tcfg["log_every"], log), [], None
    if resumed:
        note_no_steps(step, total, "train.steps", log)
    if step == 0 and chief:  # the untrained model's validation loss: the baseline the curve falls from
        validate_and_draw(trainer, 0, val_history, log)
        progress.restart_clock()
    batches = trainer.batches()
    try:
        while step < total:
            t0 = time.perf_counter()
            batch = next(batches)
            waited = time.perf_counter() - t0
            progress.update(trainer.step(batch), waited)
            step += 1
            if step % tcfg["log_every"] == 0 or step == total:
                progress.report(step)
                if history_file is not None:
                    with open(history_file, "a", encoding="utf-8") as f:
                        f.write(json.dumps(progress.history[-1]) + "\n")
            saving = step % tcfg["checkpoint_every"] == 0 or step == total
            if saving:
                check_finite_state(trainer, progress, step)  # before validation draws a diverged model
            if chief and (step % tcfg["summary_every"] == 0 or step == total):
                drawn = validate_and_draw(trainer, step, val_history, log)
                align = align if drawn is None else drawn
                progress.restart_clock()
            if saving:
                save_checkpoint(manager, step)
    except NonFinite as e:
        raise diverged(str(e), manager, tcfg, resumed, chief, log) from None
    return step, progress.history, val_history, align


def finish(cfg, trainer, run, out, manager, result, started, log):
    """The chief's summary (--out) and alignment.png; a worker's cleanup. Every worker waits for all."""
    step, history, val_history, align, rejected, resumed_from = result
    weights = sum(float(tf.reduce_sum(tf.cast(v, tf.float64))) for v in trainer.model.trainable_variables)
    if not trainer.p.chief:
        shutil.rmtree(manager.directory, ignore_errors=True)
        trainer.wait_for_all()  # the chief still validates and writes
        log(f"worker {trainer.p.worker[0]} done: {step} steps, weights checksum {weights:.12g} "
            f"(the chief writes the checkpoints and the summary)")
        return None
    if align is not None:
        save_alignment_png(align, run / "alignment.png", step)
    summary = {"name": cfg["name"], "steps": step, "resumed_from": resumed_from, "placement": trainer.placement,
               "context": trainer.context(), "traces": trainer.traces, "buckets": trainer.shapes,
               "seconds": round(time.perf_counter() - started, 1), "checkpoint": manager.latest_checkpoint,
               "left_out": rejected, "train_loss": history[-1] if history else None, "val_loss": val_history,
               "history": history}
    files.atomic_write_text(out, json.dumps(summary, indent=1))
    trainer.wait_for_all()
    log(f"done: {step} steps, checkpoint {manager.latest_checkpoint}, summary {out}, weights checksum {weights:.12g}")
    return summary


def reseeded(cfg, step):
    """`cfg` for a trainer resuming at `step`: train.seed + step seeds its batch order and dropout, so a
    run resumed (a preempted job, say) goes on with another order instead of replaying the start of the
    one it began with, and its reruns draw the same. The recorded config keeps train.seed."""
    seed = (cfg["train"]["seed"] + step) % 2 ** 32  # what keras.utils.set_random_seed takes (the schema's range)
    return cfg if not step else dict(cfg, train=dict(cfg["train"], seed=seed))


def train(cfg, out, log=functools.partial(print, flush=True)):
    """Resume or start, train to train.steps, write the summary `out` (the chief's; None on other workers)."""
    started, run = time.perf_counter(), config.run_dir(cfg)
    info = start_run(cfg, run, log)
    trainer = build_trainer(reseeded(cfg, resume_step(run / "checkpoints")), log=log, info=runinfo.loaded(info))
    chief = trainer.p.chief  # False only on multiworker's other workers: they write nothing in run/
    with run_lock(run, chief):
        if chief:
            record_run(cfg, run, info)
        manager = restore(trainer, run, log)
        rejected = left_out(cfg, run, "durations" in trainer.needs, log, write=chief)
        resumed_from = trainer.start_step
        past = past_history(run, resumed_from) if chief else []  # earlier runs' losses: not a Snakemake output
        trainer.measure_copy()
        writer = tf.summary.create_file_writer(str(run)) if chief else tf.summary.create_noop_writer()
        with writer.as_default():
            step, history, val_history, align = run_steps(trainer, manager, cfg["train"], chief, log,
                                                          history_file=run / "history.jsonl" if chief else None)
        history = past + history
        return finish(cfg, trainer, run, out, manager, (step, history, val_history, align, rejected, resumed_from),
                      started, log)


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Train from the caches (resumes from the last checkpoint).")
    config.add_arguments(parser)
    parser.add_argument("--out", help="summary JSON (default runs/{name}/train.json)")
    config.add_threads_argument(parser)
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    placement_mod.set_threads(args.threads)
    if cfg["train"]["placement"] == "multiworker":
        placement_mod.multiworker_strategy()  # before any other TensorFlow op (a TensorFlow rule)
    train(cfg, args.out or config.run_dir(cfg) / "train.json")


if __name__ == "__main__":
    main()
