"""Placement choice: `auto` from this host's last diagnose report, and where a multiworker cluster comes from.

There is no GPU here: the tests plant diagnose reports and stand in two GPU names for the devices
TensorFlow lists; nothing in them runs on a device.
"""
import json
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf
from conftest import ROOT

from pipeline import placement
from pipeline.placement import PlacementError

TRAIN = {"placement": "auto", "data_device": "/GPU:0", "model_device": "/GPU:1", "jit_compile": "auto",
         "mixed_precision": "auto"}
HOST = {"hostname": "gpu-box", "gpus": ["NVIDIA A100", "NVIDIA A100"]}


def plant(tmp_path, host=HOST, split=10.0, mirrored=12.5):
    path = tmp_path / "diagnose.json"
    placements = {"split": {"verdict": "compute_bound", "steps_per_s": split, "input_wait_fraction": 0.01},
                  "mirrored": {"verdict": "compute_bound", "steps_per_s": mirrored, "input_wait_fraction": 0.01}}
    path.write_text(json.dumps({"verdict": "compute_bound", "placements": placements, "host": host}))
    return path


@pytest.mark.parametrize("split, mirrored, best", [(10.0, 12.5, "mirrored"), (12.5, 10.0, "split")])
def test_auto_picks_the_faster_placement_this_host_measured(tmp_path, split, mirrored, best):
    path = plant(tmp_path, split=split, mirrored=mirrored)
    name, why = placement.auto_choice(["/GPU:0", "/GPU:1"], TRAIN, path, HOST)
    assert name == best
    assert "12.50 steps/s against 10.00" in why and "this host" in why and str(path) in why


def test_auto_ignores_another_hosts_report_and_says_why(tmp_path):
    path = plant(tmp_path, host={"hostname": "other-box", "gpus": ["NVIDIA V100", "NVIDIA V100"]})
    name, why = placement.auto_choice(["/GPU:0", "/GPU:1"], TRAIN, path, HOST)
    assert name == "split"
    assert "measured on other-box" in why and "not on gpu-box" in why and "snakemake --cores all diagnose" in why
    # the same host name with other GPUs (another CUDA_VISIBLE_DEVICES, a swapped card) is not this machine either
    path = plant(tmp_path, host={"hostname": "gpu-box", "gpus": ["NVIDIA A100"]})
    assert placement.auto_choice(["/GPU:0", "/GPU:1"], TRAIN, path, HOST)[0] == "split"


def test_auto_without_a_usable_report_keeps_the_rule_and_says_which_and_why(tmp_path):
    name, why = placement.auto_choice(["/GPU:0", "/GPU:1"], TRAIN, tmp_path / "diagnose.json", HOST)
    assert name == "split" and "2 GPUs" in why and "no diagnose report at" in why
    one_gpu = tmp_path / "one.json"  # a report from a run that could not compare placements
    one_gpu.write_text(json.dumps({"verdict": "compute_bound", "host": HOST}))
    name, why = placement.auto_choice(["/GPU:0", "/GPU:1"], TRAIN, one_gpu, HOST)
    assert name == "split" and "did not compare split and mirrored" in why
    # the vocoder's diagnosis (diagnose.target: vocoder) goes to the same file: it says nothing of the
    # acoustic model's placements, and auto says which report it found rather than "rerun diagnose"
    vocoder = tmp_path / "vocoder.json"
    vocoder.write_text(json.dumps({"verdict": "compute_bound", "host": HOST, "target": "vocoder"}))
    name, why = placement.auto_choice(["/GPU:0", "/GPU:1"], TRAIN, vocoder, HOST)
    assert name == "split" and "diagnosed the vocoder (diagnose.target: vocoder)" in why and "target: acoustic" in why
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert "not valid JSON" in placement.auto_choice(["/GPU:0", "/GPU:1"], TRAIN, broken, HOST)[1]
    # fewer than two GPUs: the report is not consulted at all
    assert placement.auto_choice(["/GPU:0"], TRAIN, plant(tmp_path), HOST) == ("single", "auto: one GPU")
    assert placement.auto_choice([], TRAIN, plant(tmp_path), HOST)[0] == "cpu"


def test_resolve_auto_uses_the_report_through_the_trainers_path(tmp_path, monkeypatch):
    # two GPU names stand in for what TensorFlow would list; MirroredStrategy only records them here
    monkeypatch.setattr(placement, "_logical", lambda kind: ["/GPU:0", "/GPU:1"] if kind == "GPU" else ["/CPU:0"])
    path = plant(tmp_path, host=placement.host_id(), split=10.0, mirrored=12.5)
    p = placement.resolve(TRAIN, report=path)
    assert p.name == "mirrored" and p.devices == ["/GPU:0", "/GPU:1"] and "12.50 steps/s" in p.describe()
    plant(tmp_path, host=placement.host_id(), split=14.0, mirrored=12.5)
    p = placement.resolve(TRAIN, report=path)
    assert p.name == "split" and p.model_device == "/GPU:1" and "14.00 steps/s" in p.reason


CPUINFO = "processor\t: {n}\nmodel name\t: a CPU\nflags\t\t: fpu sse2 avx2 avx512f{extra}\n\n"


def test_amx_bf16_is_read_from_the_cpus_flags(tmp_path):
    amx, plain = tmp_path / "amx", tmp_path / "plain"
    amx.write_text("".join(CPUINFO.format(n=n, extra=" avx512_bf16 amx_bf16 amx_tile") for n in range(2)))
    plain.write_text(CPUINFO.format(n=0, extra=" avx512_bf16"))  # bfloat16 dot products, no AMX tiles
    assert placement.cpu_has_amx_bf16(amx) is True
    assert placement.cpu_has_amx_bf16(plain) is False
    assert placement.cpu_has_amx_bf16(tmp_path / "absent") is False  # not Linux: no file, no guess


@pytest.mark.parametrize("wants, kernels, amx, expected", [
    (True, "oneDNN", True, "bfloat16"),   # the acoustic trainer on an AMX CPU
    (True, "oneDNN", False, "off"),       # no AMX: bfloat16 would be emulated, slower
    (True, "Eigen", True, "off"),         # TF_ENABLE_ONEDNN_OPTS=0: Eigen has no AMX kernels
    (False, "oneDNN", True, "off"),       # the vocoders: no faster in bfloat16 on the CPU
])
def test_auto_mixed_precision_on_a_cpu(monkeypatch, wants, kernels, amx, expected):
    monkeypatch.setattr(placement, "cpu_kernels", lambda: kernels)
    monkeypatch.setattr(placement, "cpu_has_amx_bf16", lambda: amx)
    p = placement.resolve(dict(TRAIN, placement="cpu"), cpu_bfloat16=wants)
    assert p.mixed_precision == expected
    assert ("mixed precision bfloat16 (auto: this CPU has AMX-BF16)" in p.describe()) == (expected == "bfloat16")
    for explicit in ("off", "bfloat16", "float16"):  # a value the config names is kept, whatever the CPU
        assert placement.resolve(dict(TRAIN, placement="cpu", mixed_precision=explicit),
                                 cpu_bfloat16=wants).mixed_precision == explicit


@pytest.mark.parametrize("capability, expected", [((8, 0), "bfloat16"), ((9, 0), "bfloat16"), ((7, 5), "float16")])
def test_on_one_gpu_auto_trains_on_it_with_xla_and_the_cards_mixed_precision(monkeypatch, capability, expected):
    # one GPU stands in (its name and compute capability as TensorFlow would report them): `single` and
    # `auto` train on it, not on a CPU; XLA `auto` is on; mixed precision `auto` is bfloat16 from Ampere
    # (compute capability 8.0, the A100) on, and float16 (with loss scaling) on the cards before it
    monkeypatch.setattr(placement, "_logical", lambda kind: ["/GPU:0"] if kind == "GPU" else ["/CPU:0"])
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device: {"compute_capability": capability})
    assert placement._gpu_supports_bf16() is (expected == "bfloat16")
    for name in ("auto", "single"):
        p = placement.resolve(dict(TRAIN, placement=name))
        assert p.name == "single" and p.model_device == "/GPU:0" and p.devices == ["/GPU:0"], p
        assert p.jit_compile is True and p.mixed_precision == expected, p
        assert "(no GPU visible" not in p.reason
    p = placement.resolve(dict(TRAIN, placement="cpu"))  # the CPU beside it: neither
    assert p.model_device == "/CPU:0" and p.jit_compile is False and p.mixed_precision == "off"


def test_with_a_chief_task_in_tf_config_the_workers_are_numbered_after_it(monkeypatch):
    # worker 0 of a cluster with a chief is its second process: numbered 0 too, it would be a second
    # chief writing the checkpoints and the summary, and take the chief's share of the shards
    for var in ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"]}
    for kind, index, expected in (("chief", 0, (0, 3, True)), ("worker", 0, (1, 3, False)), ("worker", 1, (2, 3, False))):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}))
        assert placement._worker_of(placement.cluster_resolver()[0]) == expected, (kind, index)


def test_split_refuses_a_device_this_machine_does_not_have_naming_the_key(monkeypatch):
    # two GPUs here: /GPU:2 is a typo or another machine's; TensorFlow's soft placement would put the
    # ops somewhere else without a word, so `split` would not be split at all
    monkeypatch.setattr(placement, "_logical", lambda kind: ["/GPU:0", "/GPU:1"] if kind == "GPU" else ["/CPU:0"])
    assert placement.resolve(dict(TRAIN, placement="split")).model_device == "/GPU:1"
    for key, device in (("data_device", "/GPU:2"), ("model_device", "/GPU:7")):
        with pytest.raises(PlacementError, match=re.escape(f"train.{key}: {device} does not exist here "
                                                           "(devices: /GPU:0, /GPU:1, /CPU:0)")):
            placement.resolve(dict(TRAIN, placement="split", **{key: device}))


def test_all_finite_reads_every_floating_value_and_passes_over_counters():
    weights = [tf.Variable(tf.ones([3, 4])), tf.Variable(tf.zeros([5], tf.float16))]
    step = tf.Variable(7, dtype=tf.int64)  # an optimizer's iteration count: not a weight
    assert bool(placement.all_finite([*weights, step], "/CPU:0"))
    assert bool(placement.all_finite([step], "/CPU:0")) and bool(placement.all_finite([], "/CPU:0"))
    for bad in (float("nan"), float("inf")):
        weights[1].assign(tf.constant([0, 0, bad, 0, 0], tf.float16))  # one value of the last variable
        assert not bool(placement.all_finite([*weights, step], "/CPU:0"))


def test_host_id_names_this_machine():
    host = placement.host_id()
    assert host["hostname"] and host["gpus"] == []  # no GPU on this machine


def test_cluster_from_tf_config_and_one_worker_without_a_cluster(monkeypatch):
    for var in ("TF_CONFIG", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    assert placement.cluster_resolver() == (None, "no TF_CONFIG and no SLURM step: a cluster of one")
    assert placement._worker_of(None) == (0, 1, True)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]},
                                                "task": {"type": "worker", "index": 2}}))
    resolver, where = placement.cluster_resolver()
    assert where == "cluster of 3 from TF_CONFIG" and placement._worker_of(resolver) == (2, 3, False)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["h:1"], "worker": ["h:2"]},
                                                "task": {"type": "chief", "index": 0}}))
    assert placement._worker_of(placement.cluster_resolver()[0]) == (0, 2, True)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(PlacementError, match="TF_CONFIG: not a cluster description"):
        placement.cluster_resolver()


def slurm_step(monkeypatch, procid, node, nodes="node[1-2]", per_node="2,1", tasks=3, local=None, **more):
    """SLURM's variables for task `procid` of an srun step, set by hand, as srun sets them on `node`."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for var in ("SLURM_STEP_RESV_PORTS", "SLURM_GPUS_ON_NODE", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    env = {"SLURM_PROCID": procid, "SLURM_STEP_NUM_TASKS": tasks, "SLURM_NTASKS": tasks, "SLURM_STEP_NODELIST": nodes,
           "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_JOB_ID": "4321", "SLURM_STEP_ID": "0",
           "SLURMD_NODENAME": node, **({} if local is None else {"SLURM_LOCALID": local}), **more}
    for var, value in env.items():
        monkeypatch.setenv(var, str(value))
    return placement.cluster_resolver()


def test_cluster_from_a_slurm_step_on_a_cpu_node(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    resolver, where = slurm_step(monkeypatch, 1, "node1", local=1)
    port = int(resolver.cluster_spec().as_dict()["worker"][0].split(":")[1])
    assert where.startswith("cluster of 3 from SLURM, ports from ") and 20000 <= port < 32768
    assert resolver.cluster_spec().as_dict() == {"worker": [f"node1:{port}", f"node1:{port + 1}", f"node2:{port}"]}
    assert placement._worker_of(resolver) == (1, 3, False)
    assert resolver.num_accelerators() == {"GPU": 0}  # a CPU node: TensorFlow runs the worker on its CPU
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # SLURM's own GPU binding is left alone
    # inside the allocation but not in an srun step: an error saying how to start the workers
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    with pytest.raises(PlacementError, match="srun python -m pipeline.train"):
        placement.cluster_resolver()


@pytest.mark.parametrize("nodes, per_node, hosts", [
    ("node[9-10]", "1(x2)", ["node9", "node10"]),  # TensorFlow's resolver sorted these as text: node10 first
    ("gpu[10,2],cpu[08-09]-ib,login1", "2,1(x4)", ["gpu10", "gpu10", "gpu2", "cpu08-ib", "cpu09-ib", "login1"]),
])
def test_each_slurm_task_takes_the_address_of_its_own_host(monkeypatch, nodes, per_node, hosts):
    # SLURM numbers tasks node by node in its host list's order (`scontrol show hostnames`)
    for procid, host in enumerate(hosts):
        local = hosts[:procid].count(host)
        resolver, _ = slurm_step(monkeypatch, procid, host, nodes=nodes, per_node=per_node, tasks=len(hosts), local=local)
        workers = resolver.cluster_spec().as_dict()["worker"]
        assert [w.split(":")[0] for w in workers] == hosts
        assert workers[resolver.task_id].split(":")[0] == host and placement._worker_of(resolver)[2] == (procid == 0)
    # tasks spread another way (srun --distribution=cyclic) would claim each other's ports: an error
    with pytest.raises(PlacementError, match="task 1 runs on node10 .*srun --distribution=block"):
        slurm_step(monkeypatch, 1, "node10", nodes="node[9-10]", per_node="2(x2)", tasks=4)
    with pytest.raises(PlacementError, match="SLURM_STEP_NODELIST: cannot read"):
        slurm_step(monkeypatch, 0, "node1", nodes="node[a-b]", per_node="1(x2)", tasks=2)


def test_a_slurm_worker_mirrors_over_every_gpu_it_sees(monkeypatch):
    # no GPU here: TensorFlow's physical device list stands in for a node's GPUs as SLURM binds them
    fake = {"n": 4}
    listed = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: [f"GPU:{i}" for i in range(fake["n"])] if kind == "GPU" else listed(kind))
    resolver, _ = slurm_step(monkeypatch, 0, "node9", nodes="node[9-10]", per_node="1(x2)", tasks=2,
                             SLURM_GPUS_ON_NODE=4)
    assert resolver.num_accelerators() == {"GPU": 4}  # was {'GPU': 1}: 3 of 4 GPUs idle
    # one task a GPU: each task sees its own one (srun --gpus-per-task=1) ...
    fake["n"] = 1
    resolver, _ = slurm_step(monkeypatch, 5, "node10", nodes="node[9-10]", per_node="4(x2)", tasks=8, local=1,
                             SLURM_GPUS_ON_NODE=4)
    assert resolver.num_accelerators() == {"GPU": 1}
    # ... while four tasks that each see the node's four would all mirror over the same GPUs
    fake["n"] = 4
    with pytest.raises(PlacementError, match="4 tasks on node10 each see the node's 4 GPUs.*--gpus-per-task=1"):
        slurm_step(monkeypatch, 5, "node10", nodes="node[9-10]", per_node="4(x2)", tasks=8, local=1,
                   SLURM_GPUS_ON_NODE=4)


def test_slurm_ports_come_from_srun_or_differ_between_jobs(monkeypatch):
    resolver, where = slurm_step(monkeypatch, 0, "node1", SLURM_STEP_RESV_PORTS="31000-31003")
    assert resolver.cluster_spec().as_dict()["worker"] == ["node1:31000", "node1:31001", "node2:31000"]
    assert "ports 31000-31003 reserved by srun" in where
    with pytest.raises(PlacementError, match="srun reserved 1 ports .* use --resv-ports=2"):
        slurm_step(monkeypatch, 0, "node1", SLURM_STEP_RESV_PORTS="31000")
    # without reserved ports: jobs 1042 and 2042 (the same base before) get ports of their own
    spans = []
    for job in (1042, 2042, 3042):
        ports, _ = placement.slurm_ports({"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0"}, 20)
        assert ports == list(range(ports[0], ports[0] + 20)) and 20000 <= ports[0] and ports[-1] < 32768
        spans.append(set(ports))
    assert not (spans[0] & spans[1] or spans[0] & spans[2] or spans[1] & spans[2])


def test_multiworker_records_the_devices_its_strategy_mirrors_over(monkeypatch):
    # four visible GPUs, a strategy over one (what TensorFlow made of a resolver reporting one)
    extended = type("Extended", (), {"worker_devices": ("/job:worker/replica:0/task:1/device:GPU:0",)})
    strategy = type("Strategy", (), {"extended": extended})
    monkeypatch.setattr(placement, "multiworker_strategy", lambda: (strategy, (1, 2), False, "cluster of 2 from SLURM"))
    monkeypatch.setattr(placement, "_logical", lambda kind: [f"/GPU:{i}" for i in range(4)] if kind == "GPU" else ["/CPU:0"])
    monkeypatch.setattr(placement, "_gpu_supports_bf16", lambda: True)
    p = placement.resolve(dict(TRAIN, placement="multiworker"))
    assert p.devices == ["/GPU:0"] and "model on /GPU:0;" in p.describe()


def test_mirrored_splits_an_uneven_batch_and_refuses_one_that_leaves_a_replica_empty(monkeypatch):
    from pipeline.config import ConfigError
    gpus = ["/GPU:0", "/GPU:1", "/GPU:2"]
    monkeypatch.setattr(placement, "_logical", lambda kind: gpus if kind == "GPU" else ["/CPU:0"])
    # TensorFlow splits 16 over 3 replicas as 6, 6 and 4, and 5 as 2, 2 and 1: both train
    for batch in (16, 5, 3):
        assert placement.resolve(dict(TRAIN, placement="mirrored", batch_size=batch)).devices == gpus
    # a replica with no clip: fewer clips than replicas, and 4 over 3 (2, 2, 0), which a rule on the
    # count alone let through
    for batch, shares, fits in ((2, [1, 1, 0], 3), (4, [2, 2, 0], 5)):
        with pytest.raises(ConfigError, match=re.escape(f"train.batch_size: {batch} over the 3 replicas of "
                                                        f"train.placement mirrored is {shares} clips each")
                           + f".*use {fits} or a multiple of 3$"):
            placement.resolve(dict(TRAIN, placement="mirrored", batch_size=batch))
    # a caller that trains on one device alone splits nothing
    assert placement.resolve(dict(TRAIN, placement="mirrored", batch_size=1), splits_batch=False).devices == gpus


SHARES_RUN = """
import json, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1", "/CPU:2"])
shares = {}
for batch in (4, 5, 16):
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.range(batch).batch(batch))
    shares[batch] = [int(t.shape[0]) for t in strategy.experimental_local_results(next(iter(data)))]
print(json.dumps(shares))
"""


def test_replica_shares_are_how_tensorflow_splits_a_batch():
    # measured, not assumed: the shares the check refuses by are the ones a mirrored strategy makes
    proc = subprocess.run([sys.executable, "-c", SHARES_RUN], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured == {str(b): placement.replica_shares(b, 3) for b in (4, 5, 16)}
    assert measured["4"] == [2, 2, 0]  # the case a rule on the count alone let through


def test_the_vocoder_on_a_mirrored_config_is_not_held_to_its_replica_count(monkeypatch, tmp_path):
    # the vocoder trains on devices[0] alone: train.batch_size 1 with two replicas is no error there
    from pipeline import config
    from pipeline.vocoder import train as vocoder_train
    monkeypatch.setattr(placement, "_logical", lambda kind: ["/GPU:0", "/GPU:1"] if kind == "GPU" else ["/CPU:0"])
    resolved, real = [], placement.resolve

    def resolve(*args, **kwargs):
        resolved.append(real(*args, **kwargs))
        raise KeyboardInterrupt  # stop before the vocoder builds anything

    monkeypatch.setattr(placement, "resolve", resolve)
    cfg = config.load_config(None, {"train": {"placement": "mirrored", "batch_size": 1},
                                    "runs_dir": str(tmp_path / "runs")}, check_paths=False)
    with pytest.raises(KeyboardInterrupt):
        vocoder_train.VocoderTrainer(cfg)
    assert resolved[0].devices == ["/GPU:0", "/GPU:1"]


def test_multiworker_after_another_tensorflow_op_is_an_error_naming_the_rule(monkeypatch):
    tf.constant(1.0) + 1.0  # this process already ran TensorFlow ops
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                                "task": {"type": "worker", "index": 0}}))
    monkeypatch.setattr(placement, "_MULTIWORKER", None)
    with pytest.raises(PlacementError, match="before the strategy was created"):
        placement.resolve(dict(TRAIN, placement="multiworker"))


def test_jobs_without_a_gpu_turn_hide_the_gpus_before_anything_else(monkeypatch, tmp_path):
    # no GPU here: two stand in for what TensorFlow would list, and hiding them is recorded
    hidden = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0", "GPU:1"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda devices, kind=None: hidden.append((list(devices), kind)))
    assert placement.cpu_only() == 2 and hidden == [([], "GPU")]
    # gta_shard's and export's jobs (tests/test_slurm.py CPU_ONLY) hide them first: before their config
    # is read, so before any op (the missing config is then their one-line error)
    from pipeline import export
    from pipeline.vocoder import gta
    for main, extra in ((gta.main, ["--shard", "0", "--out", str(tmp_path / "shard-000")]), (export.main, [])):
        hidden.clear()
        with pytest.raises(SystemExit):
            main(["--config", str(tmp_path / "missing.yaml"), *extra])
        assert hidden == [([], "GPU")], main.__module__


@pytest.mark.parametrize("threads", ["-1", "4097"])
def test_the_trainers_refuse_a_thread_count_out_of_range_before_any_work(tmp_path, capsys, threads):
    # a rule passes its `threads:`; a hand-typed --threads -1 (or a digit too many) is refused by name, before
    # the config is read (pipeline.align keeps its own --threads: it is part of the aligner's code digest, and
    # an edit there would retrain every run's aligner; the rule runs pipeline.aligner_folder)
    from pipeline import aligner_folder, train
    from pipeline.vocoder import train as vocoder_train
    for main, extra in ((train.main, []), (vocoder_train.main, ["--out", str(tmp_path / "v.json")]),
                        (aligner_folder.main, ["--out", str(tmp_path / "a.json"), "--train-key", "k"])):
        with pytest.raises(SystemExit) as exit_:
            main(["--config", str(tmp_path / "missing.yaml"), "--threads", threads, *extra])
        assert exit_.value.code == 2, main.__module__
        assert f"argument --threads: invalid thread count (0 to 4096) value: '{threads}'" in capsys.readouterr().err


# Two logical CPUs stand in for two GPUs; the real model (transformer_tts: Keras dropout in its blocks,
# a stateless pre-net dropout seeded by its own SeedGenerator) gets the same clip on both replicas.
DROPOUT_RUN = """
import json, yaml, keras, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from pipeline import config, models, placement
model_cfg = config.merge(yaml.safe_load(config.DEFAULTS.read_text())["model"], {model!r})
strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])
keras.utils.set_random_seed(0)
with strategy.scope():
    model = models.build(model_cfg, ["_", "a", "b", "c"], 8)
    changed = placement.per_replica_dropout(model, strategy)
    batch = models.dummy_batch(6, 16, 8)
    model(batch, training=False)
both = {{k: tf.concat([v, v], 0) for k, v in batch.items()}}
given = next(iter(strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(both))))
loss = tf.function(lambda b: model.tts_loss(model(b, training=True), b)[0], autograph=False)
runs = [strategy.experimental_local_results(strategy.run(loss, args=(given,))) for _ in range(2)]
print(json.dumps({{"changed": changed, "losses": [[float(x) for x in r] for r in runs],
                  "single": placement.per_replica_dropout(model, None)}}))
"""


def test_each_replica_draws_its_own_dropout_masks():
    tiny = {"kind": "transformer_tts", "transformer_tts": {
        "d_model": 32, "heads": 2, "encoder_layers": 1, "decoder_layers": 1, "ffn_dim": 64, "encoder_conv_layers": 1,
        "prenet_dim": 32, "postnet_channels": 32, "postnet_layers": 2, "dropout": 0.3, "prenet_dropout": 0.5}}
    proc = subprocess.run([sys.executable, "-c", DROPOUT_RUN.format(model=tiny)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["changed"] >= 2  # the blocks' Dropout layers and the pre-net's generator
    for first, second in out["losses"]:  # the same clip, dropout on: each replica's loss its own
        assert first != second
    assert out["losses"][0] != out["losses"][1]  # and new masks at the next step
    assert out["single"] == 0  # one device (no strategy): its masks are left as they were


# A user's own model.kind whose only dropout is a MultiHeadAttention's: Keras creates that layer's
# seed generator in build(), at the model's first call, so the trainer must fold replica ids in after it
ATTENTION_MODEL = '''
import keras, tensorflow as tf


class Attending(keras.Model):
    needs = ("tokens", "token_lengths", "mel", "mel_lengths")

    def __init__(self, n_symbols, n_mels):
        super().__init__()
        self.embed = keras.layers.Embedding(n_symbols, 8)
        self.attn = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5)
        self.out = keras.layers.Dense(n_mels)

    def call(self, batch, training=False):
        h = self.embed(batch["tokens"])
        h = tf.reduce_mean(self.attn(h, h, training=training), axis=1, keepdims=True)
        return {"mel": tf.tile(self.out(h), [1, tf.shape(batch["mel"])[1], 1])}

    def tts_loss(self, outputs, batch):
        loss = tf.reduce_mean(tf.abs(outputs["mel"] - batch["mel"]))
        return loss, {"mel": loss, "total": loss}

    def infer(self, tokens, token_lengths, *, pace=1.0, pitch_shift=0.0, max_frames):
        raise NotImplementedError


def build(model_cfg, vocab, n_mels):
    return Attending(len(vocab), n_mels)
'''

TRAINER_DROPOUT_RUN = """
import json, sys, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from pipeline import config, train
cfg = config.load_config(sys.argv[1], {"model": {"kind": "attention_model:build", "options": {"any": 1}},
                                       "train": {"placement": "mirrored", "buckets": 1}})
trainer = train.Trainer(cfg, log=lambda *a: None)
attn, strategy = trainer.model.attn, trainer.p.strategy
generators = [g for layer in trainer.model._flatten_layers() for g in layer._seed_generators]
x = tf.random.stateless_uniform([1, 6, 8], [1, 2])  # the same input on both replicas, dropout on
outs = strategy.experimental_local_results(tf.function(lambda: strategy.run(lambda: attn(x, x, training=True)),
                                                       autograph=False)())
print(json.dumps({"generators": len(generators), "folded": sum("next" in vars(g) for g in generators),
                  "same": bool(tf.reduce_all(outs[0] == outs[1]))}))
"""


def test_the_trainer_folds_replica_ids_into_generators_a_model_creates_at_build(built_cache, tmp_path):
    (tmp_path / "attention_model.py").write_text(ATTENTION_MODEL)
    proc = subprocess.run([sys.executable, "-c", TRAINER_DROPOUT_RUN, str(built_cache)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=f"{ROOT}:{tmp_path}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["generators"] >= 1 and out["folded"] == out["generators"]  # the attention's, made in build()
    assert not out["same"]  # each replica its own attention-dropout mask


JOB_THREADS_RUN = """
import tensorflow as tf
from pipeline import placement
placement.cpu_only()
print(tf.config.threading.get_intra_op_parallelism_threads(), tf.config.threading.get_inter_op_parallelism_threads())
"""


@pytest.mark.parametrize("omp, expected", [("1", "1 1"), ("3", "3 3"), ("", "0 0"), ("x", "0 0")])
def test_jobs_without_a_gpu_turn_keep_to_the_threads_snakemake_gave_them(omp, expected):
    # Snakemake sets OMP_NUM_THREADS to a job's threads; TensorFlow sized its pools from the machine's
    # cores all the same: 32 one-thread gta_shard jobs on a 32-core host each ran 32-thread pools
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), OMP_NUM_THREADS=omp)
    proc = subprocess.run([sys.executable, "-c", JOB_THREADS_RUN], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == expected  # 0: TensorFlow's own choice


SET_THREADS_RUN = """
import sys
import tensorflow as tf
from pipeline import placement
placement.set_threads(int(sys.argv[1]))
print(tf.config.threading.get_intra_op_parallelism_threads())
"""


@pytest.mark.parametrize("threads, expected", [("1", "1"), ("3", "3"), ("0", "0")])
def test_a_trainers_threads_hold_tensorflows_pool_to_them(threads, expected):
    # --threads N (the rule's `threads:`) sets TensorFlow's intra-op pool, one thread included: a
    # one-thread job ran a pool of every core beside the other jobs; 0 keeps TensorFlow's own choice
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", SET_THREADS_RUN, threads], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == expected
