"""Where training runs: device placement, XLA and mixed precision, resolved from `train:`.

    split     the input pipeline's output prefetched onto train.data_device, the model's variables
              and step on train.model_device; each batch is copied across while the previous step
              runs (two-GPU workstations; `snakemake diagnose` measures it against mirrored)
    mirrored  data parallel over every GPU with tf.distribute.MirroredStrategy
    single    one GPU
    cpu       the CPU
    auto      split with two or more GPUs, single with one, cpu with none

With no GPU, split, mirrored and single run on logical CPU devices when the process has
configured them (tests do this with tf.config.set_logical_device_configuration), so every mode
runs anywhere; the log line says when a CPU stands in for a GPU.
"""
from dataclasses import dataclass

import keras
import tensorflow as tf

from pipeline.errors import PipelineError


class PlacementError(PipelineError):
    """A placement the machine cannot honour; the message names the config key."""


@dataclass
class Placement:
    name: str
    reason: str
    data_device: str
    model_device: str
    devices: list          # replicas for mirrored, else [model_device]
    jit_compile: bool
    mixed_precision: str   # "off" | "bfloat16" | "float16"
    strategy: object = None

    def describe(self):
        return (f"placement {self.name} ({self.reason}); data on {self.data_device}, model on "
                f"{', '.join(self.devices)}; XLA {'on' if self.jit_compile else 'off'}; "
                f"mixed precision {self.mixed_precision}")


def _logical(kind):
    return ["/" + d.name.split("device:")[-1] for d in tf.config.list_logical_devices(kind)]  # "/GPU:0"


def _gpu_supports_bf16():
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return False
    cc = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0))
    return tuple(cc) >= (8, 0)  # Ampere and newer have bfloat16 tensor cores


def resolve(train_cfg, override=None):
    """The Placement for `train:` (or `override`), with the reason for `auto` spelled out."""
    gpus, cpus = _logical("GPU"), _logical("CPU")
    name = override or train_cfg["placement"]
    reason = f"train.placement: {name}"
    if name == "auto":
        if len(gpus) >= 2:
            name, reason = "split", f"auto: {len(gpus)} GPUs, so data on {train_cfg['data_device']} and model on {train_cfg['model_device']}"
        elif len(gpus) == 1:
            name, reason = "single", "auto: one GPU"
        else:
            name, reason = "cpu", "auto: no GPU visible to TensorFlow"
    if name == "split":
        data_dev, model_dev = train_cfg["data_device"], train_cfg["model_device"]
        for key, dev in (("train.data_device", data_dev), ("train.model_device", model_dev)):
            if dev not in gpus + cpus:
                raise PlacementError(f"{key}: {dev} does not exist here (devices: {', '.join(gpus + cpus)})")
        devices = [model_dev]
    elif name == "mirrored":
        devices = gpus or cpus
        if len(devices) < 2:
            reason += f" (only {len(devices)} device: mirrored runs one replica)"
        data_dev, model_dev = "/CPU:0", devices[0]
    elif name == "single":
        # one accelerator; without a GPU the last CPU device stands in (a second logical CPU in tests)
        model_dev = gpus[0] if gpus else cpus[-1]
        if not gpus:
            reason += f" (no GPU visible: {model_dev} stands in)"
        data_dev, devices = "/CPU:0", [model_dev]
    elif name == "cpu":
        data_dev, model_dev, devices = "/CPU:0", "/CPU:0", ["/CPU:0"]
    else:
        raise PlacementError(f"train.placement: unknown value {name!r}")
    on_gpu = any("GPU" in d for d in devices)

    jit = train_cfg["jit_compile"]
    # XLA compiles each bucket shape up front (~15 s each on a 2-core CPU, benchmarks/step.py); fused
    # GPU kernels repay that at once, while on a CPU the ~1.3x it gives takes most of a short run to pay back
    jit = on_gpu if jit == "auto" else bool(jit)
    mp = train_cfg["mixed_precision"]
    if mp == "auto":
        mp = ("bfloat16" if _gpu_supports_bf16() else "float16") if on_gpu else "off"
    strategy = tf.distribute.MirroredStrategy(devices) if name == "mirrored" else None
    return Placement(name, reason, data_dev, model_dev, devices, jit, mp, strategy)


def set_precision_policy(mixed_precision):
    """Keras' global dtype policy; float16 also needs a LossScaleOptimizer (the trainer adds it)."""
    keras.mixed_precision.set_global_policy(
        {"off": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}[mixed_precision])
