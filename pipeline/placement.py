"""Where training runs: device placement, XLA and mixed precision, resolved from `train:`.

    split     the input pipeline's output prefetched onto train.data_device, the model's variables
              and step on train.model_device; each batch is copied across while the previous step
              runs (two-GPU workstations; `snakemake diagnose` measures it against mirrored)
    mirrored  data parallel over every GPU with tf.distribute.MirroredStrategy
    multiworker  data parallel over several processes or nodes with
              tf.distribute.MultiWorkerMirroredStrategy (each worker mirrors over its own GPUs, or
              runs on its CPU); the cluster comes from TF_CONFIG (`python -m pipeline.launch`
              sets it), else from SLURM inside an `srun` step, else the process is a cluster of one
    single    one GPU
    cpu       the CPU
    auto      with two or more GPUs, the faster of split and mirrored as the last `snakemake diagnose`
              on this host measured it ({reports_dir}/{name}/diagnose.json), split without such a
              report; single with one GPU, cpu with none

With no GPU, split, mirrored and single run on logical CPU devices when the process has
configured them (tests do this with tf.config.set_logical_device_configuration), so every mode
runs anywhere; the log line says when a CPU stands in for a GPU.

MultiWorkerMirroredStrategy must exist before any other TensorFlow op runs in the process:
`resolve` creates it first thing for multiworker (pipeline.train calls nothing else of TensorFlow
before), and raises PlacementError if something else came first.
"""
import atexit
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import keras
import tensorflow as tf

from pipeline.config import ConfigError
from pipeline.errors import PipelineError


class PlacementError(PipelineError):
    """A placement the machine cannot honour; the message names the config key."""


class OnDevice:
    """A tf.function called under `device`'s scope. TensorFlow places a function's ops by the device
    scope at the call, not where the function was made, so a step made under the model device and
    called without it runs on the default device (the data's GPU under `split`). Attributes (the
    tracing count) are the function's."""

    def __init__(self, fn, device):
        self.fn, self.device = fn, device

    def __call__(self, *args, **kwargs):
        with tf.device(self.device):
            return self.fn(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.fn, name)


def all_finite(variables, device):
    """A scalar bool tensor: every floating value among `variables` (weights, optimizer state) is finite.
    One reduction on `device`, where a placement keeps them, read back once by its caller: unscoped, each
    check ran on the default device (the data's GPU under `split`) with every variable copied there."""
    values = [tf.convert_to_tensor(v) for v in variables]
    with tf.device(device):
        checks = [tf.reduce_all(tf.math.is_finite(x)) for x in values if x.dtype.is_floating]
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


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
    worker: tuple = (0, 1)  # (index, count) of this process among the multiworker workers
    chief: bool = True      # writes checkpoints, TensorBoard events and the summary
    precision_note: str = ""  # why `auto` chose mixed precision on a CPU, for the log line

    def describe(self):
        return (f"placement {self.name} ({self.reason}); data on {self.data_device}, model on "
                f"{', '.join(self.devices)}; XLA {'on' if self.jit_compile else 'off'}; "
                f"mixed precision {self.mixed_precision}{self.precision_note}; CPU kernels {cpu_kernels()}")


def cpu_kernels():
    """TensorFlow's CPU kernels in this process: "oneDNN" or "Eigen" (TF_ENABLE_ONEDNN_OPTS, which
    pipeline/__init__.py turns on unless the environment set it; docs/scaling.md, "CPU kernels")."""
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # a TensorFlow without this module: say so rather than guess
        return "unknown"
    return "oneDNN" if _pywrap_util_port.IsMklEnabled() else "Eigen"


def _logical(kind):
    return ["/" + d.name.split("device:")[-1] for d in tf.config.list_logical_devices(kind)]  # "/GPU:0"


def _gpu_supports_bf16():
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return False
    cc = tf.config.experimental.get_device_details(gpus[0]).get("compute_capability", (0, 0))
    return tuple(cc) >= (8, 0)  # Ampere and newer have bfloat16 tensor cores


def cpu_has_amx_bf16(cpuinfo="/proc/cpuinfo"):
    """Whether this CPU multiplies bfloat16 matrices in hardware (Intel AMX-BF16: Xeon Sapphire Rapids and
    later), as /proc/cpuinfo's flags say (False where there is no such file: not Linux)."""
    try:
        lines = Path(cpuinfo).read_text(errors="replace").splitlines()
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags") and ":" in line), [])
    return "amx_bf16" in flags


def host_id():
    """What makes a diagnose measurement this machine's: the host name and the GPUs TensorFlow sees."""
    gpus = [tf.config.experimental.get_device_details(g).get("device_name", g.name)
            for g in tf.config.list_physical_devices("GPU")]
    return {"hostname": socket.gethostname(), "gpus": gpus}


def measured_choice(report_path, host):
    """('split' | 'mirrored', why) from the diagnose report at `report_path` if it compared both
    placements on `host`, else (None, why not)."""
    path = Path(report_path)
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, f"no diagnose report at {path} (`snakemake --cores all diagnose` measures split against mirrored)"
    except json.JSONDecodeError:
        return None, f"{path} is not valid JSON (rerun `snakemake --cores all diagnose`)"
    if report.get("host") != host:
        other = (report.get("host") or {}).get("hostname", "an unrecorded host")
        return None, (f"{path} was measured on {other} with GPUs {(report.get('host') or {}).get('gpus')}, "
                      f"not on {host['hostname']} with {host['gpus']} (rerun `snakemake --cores all diagnose` here)")
    if report.get("target") == "vocoder":  # `snakemake diagnose` with diagnose.target: vocoder writes the same file
        return None, (f"{path} diagnosed the vocoder (diagnose.target: vocoder), not the acoustic model (rerun "
                      "`snakemake --cores all diagnose` with diagnose.target: acoustic)")
    rates = {n: r["steps_per_s"] for n, r in (report.get("placements") or {}).items() if n in ("split", "mirrored")}
    if len(rates) < 2:
        return None, f"{path} did not compare split and mirrored (rerun `snakemake --cores all diagnose`)"
    best, other = sorted(rates, key=rates.get, reverse=True)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))
    return best, (f"auto: {best} ran {rates[best]:.2f} steps/s against {rates[other]:.2f} for {other} "
                  f"in the diagnose report of {when} on this host ({path})")


def auto_choice(gpus, train_cfg, report_path=None, host=None):
    """(placement, reason) for `auto` given the visible GPUs and, with two or more, the last diagnose report."""
    if len(gpus) >= 2:
        best, why = measured_choice(report_path, host or host_id()) if report_path else (None, "no report path given")
        if best:
            return best, why
        return "split", (f"auto: {len(gpus)} GPUs, so data on {train_cfg['data_device']} and model on "
                         f"{train_cfg['model_device']}; {why}")
    if len(gpus) == 1:
        return "single", "auto: one GPU"
    return "cpu", "auto: no GPU visible to TensorFlow"


# --- multiworker ---------------------------------------------------------------------------
_MULTIWORKER = None  # TensorFlow allows one collective setup per process: the strategy, once made


def cluster_resolver():
    """(resolver or None, description) for this process: TF_CONFIG, else a SLURM step, else one worker."""
    environ = os.environ
    if environ.get("TF_CONFIG"):
        try:
            spec = json.loads(environ["TF_CONFIG"])
            workers = len(spec["cluster"].get("chief", [])) + len(spec["cluster"].get("worker", []))
            spec["task"]["type"], spec["task"]["index"]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise PlacementError(f"TF_CONFIG: not a cluster description ({e}); "
                                 f"expected {{\"cluster\": {{\"worker\": [host:port, ...]}}, \"task\": {{...}}}}") from None
        return tf.distribute.cluster_resolver.TFConfigClusterResolver(), f"cluster of {workers} from TF_CONFIG"
    tasks = int(environ.get("SLURM_STEP_NUM_TASKS", "1"))
    if tasks > 1 and "SLURM_PROCID" in environ:
        return slurm_resolver(environ, tasks)
    if int(environ.get("SLURM_NTASKS", "1")) > 1:
        raise PlacementError(f"train.placement: multiworker: this SLURM job has {environ['SLURM_NTASKS']} tasks but "
                             f"this process is not one of an `srun` step's; start the workers with `srun python -m pipeline.train ...`")
    return None, "no TF_CONFIG and no SLURM step: a cluster of one"


# TensorFlow's SlurmClusterResolver is not used: it lists the hosts sorted as text (node10 before
# node9) while SLURM_PROCID follows SLURM's own order, and it gives TensorFlow one GPU per task however
# many the task sees. The cluster is built here from the same variables instead.
PORT_LOW, PORT_HIGH = 20000, 32768  # below Linux's ephemeral ports, which outgoing connections take


def expand_hostlist(text):
    """SLURM's compressed host list ("node[9-10],gpu[01,03]") in SLURM's own order, the order
    `scontrol show hostnames` prints and tasks are numbered in: node9 before node10."""
    items = re.findall(r"(?:[^,\[\]]|\[[^\]]*\])+", text)  # commas inside brackets do not split
    try:
        return [host for item in items for host in _expand_item(item)]
    except ValueError:
        raise PlacementError(f"SLURM_STEP_NODELIST: cannot read the host list {text!r}") from None


def _expand_item(item):
    match = re.match(r"([^\[]*)\[([^\]]*)\](.*)$", item)
    if not match:
        return [item]
    prefix, ranges, rest = match.groups()
    hosts = []
    for part in ranges.split(","):
        width = len(part.partition("-")[0])  # "01-03" keeps its zero padding
        for n in _span(part):
            hosts += [f"{prefix}{n:0{width}d}{tail}" for tail in _expand_item(rest)]
    return hosts


def _span(part):
    """SLURM's "12-15" (or "12") as range(12, 16)."""
    low, _, high = part.partition("-")
    return range(int(low), int(high or low) + 1)


def _counts(text):
    """SLURM's "2(x3),1" (2 tasks on each of 3 nodes, then 1) as [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        n, _, times = part.partition("(x")
        counts += [int(n)] * int(times.rstrip(")") or 1)
    return counts


def _port_list(text):
    """srun's reserved ports, "12000-12003,12010", as a list."""
    return [port for part in text.split(",") for port in _span(part)]


def slurm_ports(environ, per_node):
    """(the ports of a node's tasks 0..per_node-1, where they come from). srun --resv-ports reserves
    them for this step on every node; else a hash of job and step id picks them, so two jobs sharing
    a node rarely meet (and a port in use is a one-line error: multiworker_strategy)."""
    if environ.get("SLURM_STEP_RESV_PORTS"):
        ports = _port_list(environ["SLURM_STEP_RESV_PORTS"])
        if len(ports) < per_node:
            raise PlacementError(f"train.placement: multiworker: srun reserved {len(ports)} ports "
                                 f"({environ['SLURM_STEP_RESV_PORTS']}) for {per_node} tasks a node; use --resv-ports={per_node}")
        return ports[:per_node], f"ports {environ['SLURM_STEP_RESV_PORTS']} reserved by srun"
    key = f"{environ.get('SLURM_JOB_ID', '0')}.{environ.get('SLURM_STEP_ID', '0')}"
    base = PORT_LOW + zlib.crc32(key.encode()) % (PORT_HIGH - PORT_LOW - per_node)
    return list(range(base, base + per_node)), f"ports from {base} (job {key} hashed; srun --resv-ports reserves them)"


def slurm_resolver(environ, tasks):
    """(resolver, description) for a task of an `srun` step: SLURM's hosts in SLURM's order with each
    node's tasks on consecutive ports, this task at SLURM_PROCID, and as many GPUs as it sees."""
    hosts = expand_hostlist(environ["SLURM_STEP_NODELIST"])
    counts = _counts(environ["SLURM_STEP_TASKS_PER_NODE"])
    ports, where = slurm_ports(environ, max(counts))
    # srun's default (block) distribution numbers a node's tasks consecutively, node by node
    placed = [(host, local) for host, count in zip(hosts, counts) for local in range(count)]
    procid = int(environ["SLURM_PROCID"])
    if len(placed) != tasks or procid >= tasks:
        raise PlacementError(f"train.placement: multiworker: SLURM_STEP_NODELIST {environ['SLURM_STEP_NODELIST']} with "
                             f"SLURM_STEP_TASKS_PER_NODE {environ['SLURM_STEP_TASKS_PER_NODE']} is not the step's {tasks} tasks")
    host, local = placed[procid]
    actual = environ.get("SLURMD_NODENAME", host), int(environ.get("SLURM_LOCALID", local))
    if actual != (host, local):
        raise PlacementError(f"train.placement: multiworker: task {procid} runs on {actual[0]} (local task {actual[1]}), "
                             f"not {host} ({local}) as block distribution places it; start it with `srun --distribution=block`")
    # TensorFlow mirrors each worker over num_accelerators() GPUs: all this task sees (SLURM's binding)
    gpus = len(tf.config.list_physical_devices("GPU"))  # lists devices without starting TensorFlow's runtime
    here, on_node = counts[hosts.index(host)], int(environ.get("SLURM_GPUS_ON_NODE", "0"))
    if gpus and here > 1 and on_node and here * gpus > on_node:  # tasks that see the same GPUs would share them
        raise PlacementError(f"train.placement: multiworker: the {here} tasks on {host} each see the node's {gpus} "
                             f"GPUs; give each its own (`srun --gpus-per-task=1`) or run one task a node")
    spec = tf.train.ClusterSpec({"worker": [f"{h}:{ports[i]}" for h, i in placed]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type="worker", task_id=procid, num_accelerators={"GPU": gpus}, rpc_layer="grpc")
    return resolver, f"cluster of {tasks} from SLURM, {where}"


def _worker_of(resolver):
    """(index, count, chief) of this process; a `chief` task, if any, is worker 0."""
    if resolver is None:
        return 0, 1, True
    jobs = resolver.cluster_spec().as_dict()
    chiefs, workers = len(jobs.get("chief", [])), len(jobs.get("worker", []))
    kind, task = resolver.task_type, resolver.task_id or 0
    if kind not in ("chief", "worker"):
        raise PlacementError(f"train.placement: multiworker: task type {kind!r} is neither 'chief' nor 'worker'")
    index = 0 if kind == "chief" else chiefs + task
    return index, max(chiefs + workers, 1), index == 0


def _address(resolver):
    jobs = resolver.cluster_spec().as_dict()
    return jobs[resolver.task_type][resolver.task_id or 0]


def worker_devices(strategy):
    """The devices this worker's replicas run on, as "/GPU:0": the strategy's own, not merely those visible."""
    return ["/" + d.split("device:")[-1] for d in strategy.extended.worker_devices]


def multiworker_strategy():
    """(MultiWorkerMirroredStrategy, (index, count), chief, description), created at the first call."""
    global _MULTIWORKER
    if _MULTIWORKER is None:
        resolver, where = cluster_resolver()
        index, count, chief = _worker_of(resolver)
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
        except RuntimeError as e:
            if "program startup" not in str(e):
                raise
            raise PlacementError("train.placement: multiworker: TensorFlow ran an op before the strategy was created; "
                                 "create it first (pipeline.placement.multiworker_strategy())") from None
        except tf.errors.UnknownError as e:
            if "Could not start gRPC server" not in str(e):
                raise
            raise PlacementError(f"train.placement: multiworker: worker {index} cannot listen on {_address(resolver)}: "
                                 f"the port is in use (another job?); {where}") from None
        _MULTIWORKER = strategy, (index, count), chief, where
    return _MULTIWORKER


def replica_shares(batch, replicas):
    """How TensorFlow splits a global batch over mirrored replicas: ceil(batch / replicas) each, the
    last what is left (measured on logical CPUs: 16 over 3 is 6, 6, 4; 4 over 3 is 2, 2, 0)."""
    each = -(-batch // replicas)
    return [each] * (replicas - 1) + [batch - each * (replicas - 1)]


def check_replica_batch(train_cfg, replicas):
    """ConfigError when train.batch_size leaves a mirrored replica no clip (replica_shares: 4 over 3
    replicas is 2, 2, 0; an empty share is a NaN loss or an error far from the cause). A batch that does
    not divide evenly but fills every replica trains: 16 over 3 replicas is 6, 6 and 4."""
    batch = train_cfg.get("batch_size")
    if batch and min(replica_shares(batch, replicas)) <= 0:
        fits = next(b for b in range(batch, batch + replicas * replicas + 1) if min(replica_shares(b, replicas)) > 0)
        raise ConfigError(f"train.batch_size: {batch} over the {replicas} replicas of train.placement mirrored is "
                          f"{replica_shares(batch, replicas)} clips each (a replica with none); use {fits} or a "
                          f"multiple of {replicas}")


def resolve(train_cfg, override=None, report=None, cpu_bfloat16=False, splits_batch=True):
    """The Placement for `train:` (or `override`), with the reason for `auto` spelled out.
    `report`: the diagnose.json that `auto` consults with two or more GPUs. `cpu_bfloat16`: the caller's
    model trains faster in bfloat16 on a CPU with AMX-BF16 (the acoustic models: docs/scaling.md), so
    mixed_precision `auto` picks it there when oneDNN's kernels run; on other CPUs `auto` is off.
    `splits_batch`: the caller splits train.batch_size over the mirrored replicas, so a batch that leaves
    one of them no clip is refused; False for a caller that trains on devices[0] alone (the vocoder)."""
    name = override or train_cfg["placement"]
    if name == "multiworker":  # before any other TensorFlow op, listing devices included
        strategy, worker, chief, where = multiworker_strategy()
    gpus, cpus = _logical("GPU"), _logical("CPU")
    reason = f"train.placement: {name}"
    if name == "auto":
        name, reason = auto_choice(gpus, train_cfg, report)
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
        if splits_batch:
            check_replica_batch(train_cfg, len(devices))
    elif name == "single":
        # one accelerator; without a GPU the last CPU device stands in (a second logical CPU in tests)
        model_dev = gpus[0] if gpus else cpus[-1]
        if not gpus:
            reason += f" (no GPU visible: {model_dev} stands in)"
        data_dev, devices = "/CPU:0", [model_dev]
    elif name == "cpu":
        data_dev, model_dev, devices = "/CPU:0", "/CPU:0", ["/CPU:0"]
    elif name == "multiworker":
        devices = worker_devices(strategy)  # each worker mirrors over the GPUs its resolver reports
        data_dev, model_dev = "/CPU:0", devices[0]
        reason += f", {where}, worker {worker[0]} of {worker[1]}{' (the chief)' if chief else ''}"
    else:
        raise PlacementError(f"train.placement: unknown value {name!r}")
    on_gpu = any("GPU" in d for d in devices)

    jit = train_cfg["jit_compile"]
    # XLA compiles each bucket shape up front (~15 s each on a 2-core CPU, benchmarks/step.py); fused
    # GPU kernels repay that at once, while on a CPU the ~1.3x it gives takes most of a short run to pay back
    jit = on_gpu if jit == "auto" else bool(jit)
    mp, note = train_cfg["mixed_precision"], ""
    if mp == "auto" and on_gpu:
        mp = "bfloat16" if _gpu_supports_bf16() else "float16"
    elif mp == "auto":
        # oneDNN runs bfloat16 matmuls on AMX tiles; without AMX (or under Eigen) bfloat16 is emulated, slower
        amx = cpu_bfloat16 and cpu_kernels() == "oneDNN" and cpu_has_amx_bf16()
        mp, note = ("bfloat16", " (auto: this CPU has AMX-BF16)") if amx else ("off", "")
    if name == "multiworker":
        return Placement(name, reason, data_dev, model_dev, devices, jit, mp, strategy, worker, chief, note)
    strategy = tf.distribute.MirroredStrategy(devices) if name == "mirrored" else None
    return Placement(name, reason, data_dev, model_dev, devices, jit, mp, strategy, precision_note=note)


def per_replica_dropout(model, strategy):
    """Give each replica its own dropout masks under a strategy; -> how many seed generators changed.
    A Keras SeedGenerator's state is one mirrored variable, so without this every replica (of every
    worker) draws the same seed at each call: the clip at position i of each replica's share gets
    the same mask. The replica's id (global across workers) is folded into each drawn seed; replica 0
    keeps the seed as drawn, so one device trains as before."""
    if strategy is None or strategy.num_replicas_in_sync < 2:
        return 0
    generators = [g for layer in model._flatten_layers() for g in layer._seed_generators]
    for generator in generators:
        generator.next = _folded_in(generator.next)  # the instance's own: Keras's dropout calls seed.next()
    return len(generators)


def _folded_in(next_seed):
    def next(ordered=True):
        seed = next_seed(ordered)
        context = tf.distribute.get_replica_context()
        if context is None:  # cross-replica code: one seed for all
            return seed
        replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
        folded = tf.cast(tf.random.experimental.stateless_fold_in(seed, replica), seed.dtype)
        return tf.where(replica > 0, folded, seed)
    return next


def worker_checkpoint_folder(run, index):
    """The stem of non-chief worker `index`'s checkpoint folders for the run in folder `run`:
    node-local, in $TMPDIR (else /tmp), named after a digest of the run folder's absolute path, so a
    rerun of the run finds what a killed one left and another run's workers on the node have their own.
    Each process's own folder is this stem, a hyphen and a random suffix (worker_checkpoints)."""
    digest = hashlib.sha256(str(Path(run).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"tts-{digest}-worker-{index}"


def worker_checkpoints(run, index):
    """Non-chief worker `index`'s checkpoint folder (worker_checkpoint_folder): every worker takes part
    in a save, the chief's alone are kept. Node-local, not in the run folder: on a cluster that is
    shared storage, and every save would write a full checkpoint there per worker. Removed when the
    process exits, however training ended; a kill (SIGKILL, or the launcher's SIGTERM when a peer
    failed) skips that, so the next run's start empties what such a kill left: the folders of this
    stem that this user owns. A new one is made with mkdtemp (mode 0700, a random suffix): $TMPDIR is
    shared, and another user's folder made beforehand under a predictable name stopped the worker
    (FileExistsError) and could have been adopted."""
    stem = worker_checkpoint_folder(run, index)
    for old in [*stem.parent.glob(glob.escape(stem.name)), *stem.parent.glob(glob.escape(stem.name) + "-*")]:
        try:
            info = old.lstat()   # a link is not followed: not a folder here
        except OSError:
            continue   # removed as we looked
        if info.st_uid == os.getuid() and stat.S_ISDIR(info.st_mode):
            shutil.rmtree(old, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=stem.name + "-", dir=stem.parent))
    atexit.register(shutil.rmtree, folder, True)  # ignore_errors: finish() removed it already
    return folder


def set_threads(n):
    """TensorFlow's intra-op threads, before its first op; 0 keeps its default (every core)."""
    if n:
        tf.config.threading.set_intra_op_parallelism_threads(n)


def cpu_only():
    """Keep this process off the GPUs: for the jobs the DAG runs without a GPU turn (`gta_shard`,
    `export`; rules/common.smk `gpus_wanted`). TensorFlow would otherwise open every visible GPU and
    reserve most of its memory, while a training job beside it holds the GPU turn and needs that
    memory. Call it before any other TensorFlow op. -> how many GPUs this process now leaves alone.
    Its thread pools are held to the job's threads too (job_threads): TensorFlow sizes them from the
    machine's cores, so 32 one-thread GTA jobs on a 32-core host each ran 32-thread pools."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices([], "GPU")
    n = job_threads()
    if n:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)
    return len(gpus)


def job_threads():
    """The CPU threads Snakemake gave this job (it sets OMP_NUM_THREADS to the rule's `threads`); 0
    where that is not a whole number >= 1 (outside a job: TensorFlow's default)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) >= 1 else 0


def set_precision_policy(mixed_precision):
    """Keras' global dtype policy; float16 also needs a LossScaleOptimizer (the trainer adds it)."""
    keras.mixed_precision.set_global_policy(
        {"off": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}[mixed_precision])
