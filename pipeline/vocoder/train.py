"""Train the vocoder from the caches: phase `train` on recorded mels, phase `finetune` on the acoustic
model's teacher-forced (GTA) mels, starting from phase one's weights.

Reads the mel, audio and pitch shards (pipeline/vocoder/segments.py: F0 for the kinds that use it;
`finetune` reads runs/{name}/gta/ instead of the mel shards); writes runs/{name}/vocoder/{phase}/
(checkpoints: generator, discriminators, both optimizers; TensorBoard losses and audio of a few
validation clips) and a summary JSON (`--out`).
A rerun resumes from the phase's last checkpoint, exactly: the segment stream is a pure function
of (seed, step), so a run killed with kill -9 and rerun ends with the weights of an uninterrupted one.
With `--final` the summary also goes to runs/{name}/vocoder.json, what synthesize/evaluate/vocode load.
Its `steps` / `finetune_steps` are those the shipped weights trained (a config lowered below a checkpoint
trains nothing more); fine-tuning's also names the acoustic checkpoints its GTA mels came from (`gta_from`).
A loss or weights that turn NaN or infinite stop the run with one line (pipeline.train.Diverged, naming
the step and vocoder.learning_rate) before anything non-finite is saved; checkpoints that older code
saved non-finite are moved to checkpoints/diverged/ instead of being resumed, as in pipeline/train.py.

Spectral losses (the project's mel, L1, + multi-resolution STFT) from step 0; from
vocoder.gan_start_step on, least-squares GAN losses with multi-period and multi-resolution
discriminators and feature matching, a second optimizer for the discriminators. That step counts
both phases' steps: fine-tuning continues the first phase's schedule (_gan_from). Placement, XLA and
mixed precision follow `train:` (pipeline/placement.py); the vocoder runs on one device.

    python -m pipeline.vocoder.train --config configs/config.yaml --phase train --out runs/demo/vocoder/train.json

Config keys: vocoder.*, audio.*, train.{placement, data_device, model_device, jit_compile,
mixed_precision, seed}, dataset/cache (via the caches).
"""
import argparse
import functools
import json
import math
import os
import shutil
import time

import keras
import tensorflow as tf

from pipeline import config, data, files, optim, runinfo, shards
from pipeline import placement as placement_mod
from pipeline import train as acoustic
from pipeline.errors import MissingCheckpoint, PipelineError, cli, located
from pipeline.vocoder import discriminators as D
from pipeline.vocoder import inputs, kinds, segments

N_AUDIO = 3  # validation clips in TensorBoard


class VocoderTrainer:
    """Generator, discriminators, two optimizers and the compiled steps for one config and phase."""

    def __init__(self, cfg, phase="train", log=print):
        self.cfg, self.log, self.phase = cfg, log, phase
        v = cfg["vocoder"]
        # one device (devices[0]): train.batch_size is not split over replicas here
        self.p = placement_mod.resolve(cfg["train"], report=config.report_dir(cfg) / "diagnose.json",
                                       splits_batch=False)
        placement_mod.set_precision_policy(self.p.mixed_precision)
        keras.utils.set_random_seed(cfg["train"]["seed"])
        self.device = self.p.devices[0]
        self.source = "gta" if phase == "finetune" else "recorded"
        self.uses_f0 = kinds.uses_f0(v)
        with tf.device(self.device):
            self.generator = kinds.build(v, cfg["audio"])
            self.disc = D.Discriminators()
            self.disc(tf.zeros([1, v["segment_frames"] * cfg["audio"]["hop_length"]]))
            self.g_opt = self._optimizer(self.generator)
            self.d_opt = self._optimizer(self.disc)
        self.start_step = 0  # the step it resumes at (_checkpoints)
        self.gan_from = _gan_from(cfg, phase)  # the phase's first adversarial step
        self.weights = dict(mel=v["mel_weight"], stft=v["stft_weight"], feature=v["feature_weight"])
        jit = self.p.jit_compile
        # Not converted by AutoGraph: the steps and the losses branch only on Python values (the
        # generator and discriminators are Keras models, which AutoGraph never converts)
        self.spectral_step = tf.function(self._spectral_step, jit_compile=jit, autograph=False)
        self.gan_step = tf.function(self._gan_step, jit_compile=jit, autograph=False)
        log(self.p.describe() + (f"; the vocoder trains on {self.device} alone" if len(self.p.devices) > 1
                                 or self.p.name in ("split", "mirrored", "multiworker") else ""))

    def _optimizer(self, model):
        opt = optim.AdamW(self.cfg["vocoder"]["learning_rate"], beta_1=0.8, beta_2=0.99,
                          weight_decay=0.01, global_clipnorm=1000.0)
        if self.p.mixed_precision == "float16":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        opt.build(model.trainable_variables)
        return opt

    def dataset(self, split="train", start_step=0, **kw):
        mix = self.cfg["vocoder"]["finetune_recorded"] if self.source == "gta" else 0.0
        return segments.build_segments(self.cfg, split, source=self.source, recorded_fraction=mix,
                                       start_step=start_step, log=self.log, **kw)

    def _apply(self, opt, tape, loss, variables):
        """The gradients of `loss` (recorded on `tape`) applied by `opt`. With float16 the backward pass
        starts from the loss scale (output_gradients: the gradient of scale x loss, as the
        LossScaleOptimizer expects), since a loss scaled here, after the tape, would have no gradient."""
        seed = None
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            seed = opt.scale_loss(tf.ones_like(loss))
        opt.apply(tape.gradient(loss, variables, output_gradients=seed), variables)

    def _generate(self, batch):
        """The generator's audio for a batch: with the batch's F0 (the pitch cache's) for kinds that use F0."""
        if self.uses_f0:
            return self.generator(batch["mel"], f0=batch["f0"], training=True)
        return self.generator(batch["mel"], training=True)

    def _auxiliary(self, batch):
        """(loss, terms) of the kind's own extra loss (source_filter: its F0 head), (0, {}) for the others."""
        if not hasattr(self.generator, "auxiliary_loss"):
            return 0.0, {}
        return self.generator.auxiliary_loss(batch["mel"], batch["f0"])

    def _spectral_step(self, batch):
        with tf.GradientTape() as tape:
            fake = self._generate(batch)
            total, terms = D.spectral_loss(batch["audio"], fake, self.cfg["audio"], mel_weight=self.weights["mel"],
                                           stft_weight=self.weights["stft"])
            aux, aux_terms = self._auxiliary(batch)
            total, terms = total + aux, {**terms, **aux_terms}
        self._apply(self.g_opt, tape, total, self.generator.trainable_variables)
        self.d_opt.iterations.assign_add(0)
        return {"total": total, **terms}

    def _gan_step(self, batch):
        """One adversarial step, the generator run once (as HiFi-GAN's reference): its tape records the
        forward pass, stops recording while the discriminators step on the stop-gradient fake, then records
        their verdict on the same fake with the weights they have after that step (the order of the two
        updates is as when the generator ran twice; being deterministic, its second run gave this fake)."""
        real = batch["audio"]
        with tf.GradientTape() as tape:
            fake = self._generate(batch)
            with tape.stop_recording():
                d_loss = self._discriminator_update(real, fake)
            spectral, terms = D.spectral_loss(real, fake, self.cfg["audio"], mel_weight=self.weights["mel"],
                                              stft_weight=self.weights["stft"])
            real_outs, fake_outs = self.disc(real), self.disc(fake)
            adv, fm = D.generator_loss(fake_outs), D.feature_loss(real_outs, fake_outs)
            aux, aux_terms = self._auxiliary(batch)
            total, terms = spectral + adv + self.weights["feature"] * fm + aux, {**terms, **aux_terms}
        self._apply(self.g_opt, tape, total, self.generator.trainable_variables)
        return {"total": total, **terms, "adversarial": adv, "feature": fm, "discriminator": d_loss}

    def _discriminator_update(self, real, fake):
        """The discriminators' step on real audio against the generator's `fake` (no gradient to it) -> their loss."""
        with tf.GradientTape() as tape:
            d_loss = D.discriminator_loss(self.disc(real), self.disc(tf.stop_gradient(fake)))
        self._apply(self.d_opt, tape, d_loss, self.disc.trainable_variables)
        return d_loss

    def step(self, batch, step):
        with tf.device(self.device):
            if step >= self.gan_from:
                return self.gan_step(batch)
            return self.spectral_step(batch)

    @property
    def traces(self):
        return sum(f.experimental_get_tracing_count() for f in (self.spectral_step, self.gan_step))


def _phase_dir(cfg, phase):
    return config.run_dir(cfg) / "vocoder" / phase


def _gan_from(cfg, phase):
    """The phase's step from which its steps are adversarial. vocoder.gan_start_step counts the steps of
    both phases: fine-tuning continues the first phase's schedule from the step of the checkpoint it starts
    from (the phase's own checkpoints started from that one: _forget_other_inputs). So a first phase
    trained adversarially fine-tunes adversarially from its first step, with the discriminators it trained,
    and one trained on spectral losses alone (the demo's) stays so unless both phases' steps reach it."""
    start = cfg["vocoder"]["gan_start_step"]
    if phase != "finetune":
        return start
    first = tf.train.latest_checkpoint(str(_phase_dir(cfg, "train") / "checkpoints"))
    done = runinfo.step_of(first) if first else None
    return max(0, start - (cfg["vocoder"]["steps"] if done is None else done))


def _val_losses(trainer, generator, val):
    """({term: mean spectral loss} of `generator` over the validation crops, each crop weighing the same
    (a batch's terms times its crops: the last, partial batch is not one batch's weight), (audio, vocoded)
    of the first batch); (None, None) without validation crops."""
    sums, n, first = {}, 0, None
    with tf.device(trainer.device):  # where the weights and the steps are (split: train.model_device), not the default
        for batch in val:
            fake = generator(batch["mel"], f0=batch["f0"], training=False) if trainer.uses_f0 \
                else generator(batch["mel"], training=False)
            _, terms = D.spectral_loss(batch["audio"], fake, trainer.cfg["audio"], mel_weight=1.0, stft_weight=1.0)
            crops = int(batch["audio"].shape[0])
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + float(v) * crops
            n += crops
            first = first or (batch["audio"], fake)
    return ({k: v / n for k, v in sums.items()}, first) if n else (None, None)


def _validate(trainer, step, val, log):
    """Validation spectral losses over the validation crops, and TensorBoard audio of a few clips."""
    out, first = _val_losses(trainer, trainer.generator, val)
    if out is None:
        return None
    sr = trainer.cfg["audio"]["sample_rate"]
    tf.summary.audio("val/recorded", first[0][:N_AUDIO, :, None], sr, step=step, max_outputs=N_AUDIO)
    tf.summary.audio("val/vocoded", tf.clip_by_value(first[1][:N_AUDIO, :, None], -1, 1), sr, step=step,
                     max_outputs=N_AUDIO)
    for k, v in out.items():
        tf.summary.scalar(f"val/{k}", v, step=step)
    log(f"step {step}: validation mel L1 {out['mel']:.4f}, stft {out['stft']:.4f}")
    return out


def train_vocoder(cfg, phase, out, final=False, log=functools.partial(print, flush=True)):
    v = cfg["vocoder"]
    total = v["steps"] if phase == "train" else v["finetune_steps"]
    folder = _phase_dir(cfg, phase)
    files.check_folder(folder, "runs_dir")  # runs/{name} a file: one line, before the build
    trainer = VocoderTrainer(cfg, phase, log)
    folder.mkdir(parents=True, exist_ok=True)
    gta_from = _forget_other_inputs(cfg, phase, folder, log)
    manager = _checkpoints(cfg, phase, trainer, folder, log)
    step = start = trainer.start_step
    batches = iter(trainer.dataset("train", start_step=step))
    val = trainer.dataset("val", batch_size=v["batch_size"]).take(2) if _has_val(cfg) else None
    writer = tf.summary.create_file_writer(str(folder))
    history, val_history, waited, t_log, t_start = [], [], 0.0, time.perf_counter(), time.perf_counter()
    resumed = manager.latest_checkpoint  # the checkpoint this run started from (None: step 0 or fine-tuning's start)
    if resumed:
        acoustic.note_no_steps(step, total, "vocoder.steps" if phase == "train" else "vocoder.finetune_steps", log)
    with writer.as_default():
        try:
            while step < total:
                t0 = time.perf_counter()
                batch = next(batches)
                waited += time.perf_counter() - t0
                terms = trainer.step(batch, step)
                step += 1
                if step % v["log_every"] == 0 or step == total:
                    history.append(_report(phase, step, total, terms, v["log_every"], waited, t_log, log))
                    waited, t_log = 0.0, time.perf_counter()
                saving = step % v["checkpoint_every"] == 0 or step == total
                if saving:
                    _check_finite(trainer, terms, step)  # before validation draws a diverged generator
                if val is not None and (step % v["summary_every"] == 0 or step == total):
                    result = _validate(trainer, step, val, log)
                    if result:
                        val_history.append({"step": step, **result})
                    t_log = time.perf_counter()
                if saving:
                    acoustic.save_checkpoint(manager, step)
        except acoustic.NonFinite as e:
            raise _diverged(str(e), manager, v, resumed, log) from None
    if manager.latest_checkpoint is None:  # 0 steps: the untrained (or first-phase) weights
        acoustic.save_checkpoint(manager, step)
    shipped, share, blend = _shipped(cfg, trainer, folder, manager, log)
    shipped_val = _shipped_val_losses(trainer, blend, val, log)
    summary = {"name": cfg["name"], "kind": v["kind"], "phase": phase, **_trained_steps(cfg, phase, folder, step, log),
               "finetune_share": share, **({"gta_from": gta_from} if phase == "finetune" else {}),
               "resumed_from": start, "traces": trainer.traces,
               "seconds": round(time.perf_counter() - t_start, 1), "checkpoint": shipped,
               "trained_checkpoint": manager.latest_checkpoint,
               "placement": trainer.p.describe(), "train_loss": history[-1] if history else None,
               "val_loss": val_history, "shipped_val_loss": shipped_val, "history": history,
               "audio": cfg["audio"], "vocoder": cfg["vocoder"]}  # what it was trained with: kinds.load builds from these
    text = json.dumps(summary, indent=1)
    files.atomic_write_text(out, text)
    if final:
        files.atomic_write_text(kinds.summary_path(cfg), text)
    weights = sum(float(tf.reduce_sum(tf.cast(w, tf.float64))) for w in trainer.generator.trainable_variables)
    log(f"vocoder {phase} done: {step} steps, checkpoint {manager.latest_checkpoint}, weights checksum {weights:.12g}")
    return summary


def _shipped_val_losses(trainer, blend, val, log):
    """{"shipped", "fine_tuned": validation losses} of the interpolated and the fine-tuned weights on the
    same validation crops, so a bad interpolation shows; None without a blend or validation crops."""
    if blend is None or val is None:
        return None
    out = {"shipped": _val_losses(trainer, blend, val)[0], "fine_tuned": _val_losses(trainer, trainer.generator, val)[0]}
    log("validation mel L1 / stft: " + ", ".join(f"the {k.replace('_', '-')} weights {v['mel']:.4f} / {v['stft']:.4f}"
                                                for k, v in out.items()))
    return out


def _trained_steps(cfg, phase, folder, step, log):
    """The summary's {"steps", "finetune_steps"}: what the shipped weights trained, from the checkpoints, not
    the config. A vocoder.steps (finetune_steps) lowered below the step a checkpoint reached trains nothing
    and ships that checkpoint (one note). Fine-tuning's `steps`: the first phase's checkpoint it started from."""
    key = "steps" if phase == "train" else "finetune_steps"
    planned = cfg["vocoder"][key]
    if step > planned:
        log(f"note: vocoder.{key} is {planned}, but {folder / 'checkpoints'} already trained {step} steps: the "
            f"summary and the weights shipped are those {step}; move that folder away to train {planned} from the start")
    if phase == "train":
        return {"steps": step, "finetune_steps": 0}
    first = (inputs.read(folder) or {}).get("from")  # recorded by _forget_other_inputs before this phase trained
    return {"steps": runinfo.step_of(first) if first else cfg["vocoder"]["steps"],
            "finetune_steps": step}


def _shipped(cfg, trainer, folder, manager, log):
    """(checkpoint, share, the interpolated generator or None): what the run ships. The phase's last checkpoint, except after fine-tuning with
    vocoder.finetune_share < 1: then the generator's weights interpolated between the first phase's
    (the checkpoint fine-tuning started from, weight 1 - share) and the fine-tuned ones (weight share),
    as in WiSE-FT (Wortsman et al., CVPR 2022), saved as vocoder/finetune/shipped/ckpt-<step>. Fine-tuning
    on the acoustic model's mels serves the TTS but moves the vocoder away from recorded mels; the
    interpolation keeps most of both (docs/vocoder.md gives the figures). share: None for the first phase."""
    if trainer.phase != "finetune":
        return manager.latest_checkpoint, None, None
    share = float(cfg["vocoder"]["finetune_share"])
    if share == 1.0:
        return manager.latest_checkpoint, share, None
    first = runinfo.checkpoint_path(inputs.read(folder)["from"])  # recorded by _forget_other_inputs before this phase trained
    if not os.path.exists(f"{first}.index"):
        raise MissingCheckpoint(f"{first}: the first phase's checkpoint that fine-tuning started from is gone; "
                                f"set vocoder.finetune_share: 1, or train both phases again "
                                f"(`snakemake --cores all vocoder -R train_vocoder`)")
    with tf.device(trainer.device):
        blend = kinds.build(cfg["vocoder"], cfg["audio"])
    kinds.restore(blend, first, inputs.path(folder), cfg["vocoder"]["kind"], cfg["vocoder"], _first_phase_settings(cfg))
    for mine, tuned in zip(blend.weights, trainer.generator.weights, strict=True):  # the same build: the same order
        mine.assign((1.0 - share) * mine + share * tuned if tf.as_dtype(mine.dtype).is_floating else tuned)
    step = runinfo.step_of(manager.latest_checkpoint)
    ckpt = tf.train.CheckpointManager(tf.train.Checkpoint(generator=blend), folder / "shipped", max_to_keep=1)
    path = acoustic.save_checkpoint(ckpt, step)  # a full disk: one line, no ckpt-N_temp/ left
    log(f"shipped: {1 - share:g} x the first phase ({first}) + {share:g} x the fine-tuned weights "
        f"({manager.latest_checkpoint}) in {path}")
    return path, share, blend


def _checkpoints(cfg, phase, trainer, folder, log):
    """The phase's CheckpointManager, its last checkpoint restored (a rerun resumes), or for a new
    `finetune`, the first phase's final weights (generator and discriminators) loaded."""
    ckpt = tf.train.Checkpoint(generator=trainer.generator, disc=trainer.disc, g_opt=trainer.g_opt, d_opt=trainer.d_opt)
    latest = acoustic.set_aside_diverged(folder / "checkpoints", True, log)  # older code saved NaN: not resumed
    manager = tf.train.CheckpointManager(ckpt, folder / "checkpoints", max_to_keep=2)
    if latest:
        acoustic.check_loss_scale(latest, {"g_opt": trainer.g_opt}, trainer.p.mixed_precision)  # d_opt: unbuilt before the GAN
        ckpt.restore(latest).assert_existing_objects_matched()
        # its name: the steps taken (what its batches follow); the generator's optimizer steps once a step,
        # spectral or adversarial, from the phase's step 0 (fine-tuning starts it anew); float16 skips some
        named, applied = runinfo.step_of(latest), int(trainer.g_opt.iterations.numpy())
        acoustic.check_named_step(latest, named, applied, isinstance(trainer.g_opt, keras.optimizers.LossScaleOptimizer))
        trainer.start_step = applied if named is None else named
        log(f"resumed from {latest} at step {trainer.start_step}")
    elif phase == "finetune":
        first = tf.train.latest_checkpoint(str(_phase_dir(cfg, "train") / "checkpoints"))
        if first is None:
            raise MissingCheckpoint(f"{located(_phase_dir(cfg, 'train'))}: no first-phase vocoder; run `snakemake --cores all train_vocoder`")
        # every weight built here from the first phase's, and nothing but them: one of other sizes would leave
        # new blocks at their start, or (fewer layers) drop its own
        why = kinds.unfit(trainer.generator, first, cfg["vocoder"]["kind"], cfg["vocoder"], _first_phase_settings(cfg))
        try:
            status = tf.train.Checkpoint(disc=trainer.disc).restore(first)
            status.expect_partial()  # its generator (above) and optimizers stay in the file
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError) as e:
            why = why or str(e).splitlines()[0][:200]
        if why:
            raise PipelineError(f"{first}: the first phase's vocoder does not fit the one these vocoder: settings "
                                f"build ({why}); train the first phase with them: `snakemake --cores all vocoder`")
        log(f"fine-tuning from {first}")
    return manager


def _first_phase_settings(cfg):
    """The `vocoder:` settings the first phase's checkpoints were trained with (its inputs.json), or None."""
    return (inputs.read(_phase_dir(cfg, "train")) or {}).get("vocoder")


def _report(phase, step, total, terms, every, waited, t_log, log):
    """Log and write to TensorBoard the loss terms at `step` and the rate since `t_log`; -> the history row.
    NonFinite when a loss is no longer finite."""
    values = {k: float(x) for k, x in terms.items()}
    interval = time.perf_counter() - t_log
    rate, wait = (every / interval, waited / interval) if interval > 0 else (0.0, 0.0)
    for k, x in values.items():
        tf.summary.scalar(f"train/{k}", x, step=step)
    tf.summary.scalar("perf/steps_per_s", rate, step=step)
    tf.summary.scalar("perf/input_wait_fraction", wait, step=step)
    done = step / total
    bar = "=" * int(30 * done) + ">" + " " * (30 - int(30 * done))
    log(f"vocoder {phase} step {step}/{total} [{bar}] loss {values['total']:.4f} "
        f"({', '.join(f'{k} {x:.4f}' for k, x in values.items() if k != 'total')}) "
        f"{rate:.2f} steps/s wait {100 * wait:.1f}% eta {(total - step) / rate if rate else 0:.0f}s")
    _check_loss(values, step)
    return {"step": step, **values}


def _check_loss(values, step):
    """NonFinite naming the first loss term of {term: float} that is NaN or infinite."""
    for k, x in values.items():
        if not math.isfinite(x):
            raise acoustic.NonFinite(f"the vocoder's {k} loss became {x} at step {step}")


def _check_finite(trainer, terms, step):
    """NonFinite unless the step's losses and everything a checkpoint holds (generator, discriminators,
    both optimizers' state) are finite: one reduction and one read, only at a checkpoint's step."""
    _check_loss({k: float(x) for k, x in terms.items()}, step)
    state = [*trainer.generator.variables, *trainer.disc.variables, *trainer.g_opt.variables, *trainer.d_opt.variables]
    if not bool(placement_mod.all_finite(state, trainer.device)):
        raise acoustic.NonFinite(f"the vocoder's weights became non-finite at step {step}")


def _diverged(cause, manager, v, resumed, log):
    """pipeline.train.diverged's one line (what happened, where a rerun resumes, the checkpoint a run
    diverges from again at a lower rate set aside), its advice about vocoder.learning_rate."""
    return acoustic.diverged(cause, manager, {"learning_rate": v["learning_rate"]}, resumed, True, log,
                             key="vocoder.learning_rate")


def _has_val(cfg):
    return bool(data.load_clips(cfg, "val")[0].ids)


def clear(cfg, phase):
    """Forget a phase's checkpoints."""
    shutil.rmtree(_phase_dir(cfg, phase) / "checkpoints", ignore_errors=True)


def _forget_other_inputs(cfg, phase, folder, log):
    """A phase's checkpoints are resumed only when made from the same model settings (and, for
    `finetune`, the same first phase and GTA mels, by their shards' checksums: GTA jobs rerun for a
    reason that left the mels byte for byte the same resume): more steps continue; other inputs set
    them aside and restart (pipeline/vocoder/inputs.py), and inputs seen before resume their set.
    -> for `finetune`, the acoustic checkpoints its GTA mels came from (_gta_from), else None."""
    key, gta_from = inputs.settings(cfg, phase, kinds.uses_f0(cfg["vocoder"])), None
    if phase == "finetune":
        first = tf.train.latest_checkpoint(str(_phase_dir(cfg, "train") / "checkpoints"))
        key["from"] = first and runinfo.checkpoint_identity(first)  # its weights: a retrained first phase is another
        metas = [shards.read_meta(segments.gta_prefix(cfg, e["shard"]), "gta") for e in data.read_index(cfg)["shards"]]
        key["gta"], gta_from = [m["checksum"] for m in metas], _gta_from(cfg, metas)
    inputs.switch(folder, key, log)
    return gta_from


def _gta_from(cfg, metas):
    """The acoustic checkpoints GTA shards `metas` were made from, as `path@digest` (runinfo.checkpoint_identity):
    the weights the shard names (`weights`); for a shard from before it named them, the weights now at its
    path where its provenance confirms they made it, else `path` + inputs.UNCONFIRMED (other weights, mels or
    GTA code made it: out of date), never the bare path, which the note would take for the weights now there.
    The fine-tuned summary records them: synthesize, evaluate and export note a vocoder fine-tuned for another
    acoustic model (inputs.finetuned_elsewhere)."""
    from pipeline.vocoder.gta import gta_provenance
    out = set()
    for meta in metas:
        ckpt, weights = meta.get("checkpoint"), meta.get("weights")
        if isinstance(weights, str) and runinfo.checkpoint_digest(weights):
            out.add(weights)
        elif isinstance(ckpt, str):
            known = os.path.exists(f"{ckpt}.index") and gta_provenance(cfg, ckpt) == meta.get("provenance")
            out.add(runinfo.checkpoint_identity(ckpt) if known else ckpt + inputs.UNCONFIRMED)
    return sorted(out)


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Train the vocoder (resumes from the phase's last checkpoint).")
    config.add_arguments(parser)
    parser.add_argument("--phase", choices=["train", "finetune"], default="train")
    parser.add_argument("--out", required=True, help="summary JSON")
    parser.add_argument("--final", action="store_true", help="also write runs/{name}/vocoder.json")
    parser.add_argument("--restart", action="store_true", help="discard the phase's checkpoints first")
    config.add_threads_argument(parser)
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    placement_mod.set_threads(args.threads)
    if args.restart:
        clear(cfg, args.phase)
    train_vocoder(cfg, args.phase, args.out, final=args.final)


if __name__ == "__main__":
    main()
