"""pipeline.diagnose on planted pipelines: real tf.data loaders and tf.functions, on the CPU.

    python -m pytest -q tests/test_diagnose.py
"""
import itertools
import json
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_config

from pipeline import diagnose as diagnose_mod
from pipeline.diagnose import compare_placements, diagnose, find_pyfunc_ops
from pipeline.diagnose_report import cycle_of_shapes, detect_oscillation, write_report
from pipeline.errors import PipelineError
from pipeline.gpumon import GpuSampler

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["verdict", "input_wait_fraction", "loader", "step", "combined", "pyfunc_ops", "step_time_cv",
          "oscillation", "traces", "gpus", "recommendations"]


def _sleep_20ms(x):
    time.sleep(0.02)
    return x


def _cheap_step():
    @tf.function
    def step(batch):
        return {"loss": tf.reduce_mean(batch)}
    return step


def _nvml_works():
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


class FakeNVML(types.ModuleType):
    """pynvml's function names over fixed per-GPU series; records what it hands out.

    GPU i's handle is i and its UUID 'GPU-fake-i-5e1f'; `fail_after` samples of a GPU's utilisation, NVML
    fails (a GPU lost mid-run); `attempts` counts the utilisation reads, failed ones too."""

    class NVMLError(Exception):
        pass

    def __init__(self, util, mem_mb, fail_init=False, fail_after=None, names=None):
        super().__init__("fake_nvml")
        self.util, self.mem, self.fail_init, self.fail_after = util, mem_mb, fail_init, fail_after
        self.names = names or ["Fake GPU"] * len(util)
        self.emitted_util = [[] for _ in util]
        self.emitted_mem = [[] for _ in util]
        self.attempts = [0 for _ in util]
        self.shut = False

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.util)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):  # the whole UUID only, as NVML
        if uuid not in [f"GPU-fake-{i}-5e1f" for i in range(len(self.util))]:
            raise self.NVMLError("Not Found")
        return int(uuid.split("-")[2])

    def nvmlDeviceGetIndex(self, h):
        return h

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-fake-{h}-5e1f".encode()  # old pynvml returns bytes

    def nvmlDeviceGetName(self, h):
        return self.names[h].encode()  # old pynvml returns bytes

    def nvmlDeviceGetUtilizationRates(self, h):
        self.attempts[h] += 1
        if self.fail_after is not None and len(self.emitted_util[h]) >= self.fail_after:
            raise self.NVMLError("GPU is lost")
        v = self.util[h][len(self.emitted_util[h]) % len(self.util[h])]
        self.emitted_util[h].append(v)
        return types.SimpleNamespace(gpu=v, memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        i = len(self.emitted_util[h]) - 1
        if i < 0:  # the init call, before any sample
            return types.SimpleNamespace(used=0, total=16 * 2**30, free=16 * 2**30)
        used = self.mem[h][i % len(self.mem[h])] * 2**20
        self.emitted_mem[h].append(used / 2**20)
        return types.SimpleNamespace(used=used, total=16 * 2**30, free=16 * 2**30 - used)


@pytest.fixture
def cuda_env(monkeypatch):
    """No CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER unless a test sets them: every fake GPU visible."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    return monkeypatch


def _tensorflow_sees(monkeypatch, n_gpus):
    # what diagnose records as the GPUs TensorFlow sees, whatever this machine has
    monkeypatch.setattr(diagnose_mod, "host_id", lambda: {"hostname": "test", "gpus": ["Fake GPU"] * n_gpus})


@pytest.fixture(scope="module")
def pyfunc_report():
    # (a) a Python map that sleeps 20 ms per batch, a cheap step
    ds = (tf.data.Dataset.range(10_000)
          .map(lambda i: tf.fill([8, 16], tf.cast(i, tf.float32)))
          .map(lambda x: tf.numpy_function(_sleep_20ms, [x], tf.float32))
          .prefetch(2))
    return diagnose(ds, _cheap_step(), steps=12, warmup=2)


@pytest.fixture(scope="module")
def heavy_report():
    # (b) a clean loader and a step of large matmuls
    w = tf.random.stateless_normal([1024, 1024], seed=[1, 2]) * 0.03
    ds = tf.data.Dataset.from_tensors(tf.fill([256, 1024], 1e-3)).repeat()

    @tf.function
    def step(x):  # ~30 ms on 2 cores: the ~0.2 ms of next() stays far below 5 %, even on a busy machine
        for _ in range(8):
            x = tf.tanh(tf.matmul(x, w))
        return {"loss": tf.reduce_mean(x)}
    report = diagnose(ds, step, steps=24, warmup=3)
    if report["oscillation"]:
        # The suite's other workers share these 2 cores, and a cycle in their load (a training loop, a
        # Snakemake run's jobs) can show in 24 steps of ~30 ms (once in CI at 8aa0adb). A cycle of the
        # step itself shows again in a second measurement; theirs rarely lines up twice.
        report = diagnose(ds, step, steps=24, warmup=3)
    return report


def test_python_map_is_input_bound(pyfunc_report):
    r = pyfunc_report
    assert r["verdict"] == "input_bound"
    assert r["input_wait_fraction"] >= 0.5
    assert r["loader"]["batches_per_s"] < r["step"]["steps_per_s"]
    assert r["loader"]["examples_per_s"] == pytest.approx(8 * r["loader"]["batches_per_s"])
    assert len(r["pyfunc_ops"]) == 1 and r["pyfunc_ops"][0].startswith("map #2: PyFunc")
    assert "map #2 (PyFunc)" in r["recommendations"][0]


def test_heavy_step_is_compute_bound_and_steady(heavy_report):
    r = heavy_report
    assert r["verdict"] == "compute_bound", (r["input_wait_fraction"], r["recommendations"])
    assert r["pyfunc_ops"] == []
    assert r["oscillation"] is False and r["oscillation_period"] is None
    assert r["traces"] == 1
    assert r["loader"]["batches_per_s"] > r["step"]["steps_per_s"]
    assert any("not input-bound" in s for s in r["recommendations"])


def test_find_pyfunc_ops_names_each_transformation():
    clean = tf.data.Dataset.range(8).map(lambda i: i + 1).batch(2).prefetch(1)
    assert find_pyfunc_ops(clean) == []
    ds = (tf.data.Dataset.range(8)
          .map(lambda i: i + 1)
          .filter(lambda i: tf.py_function(lambda v: v > 2, [i], tf.bool))
          .map(lambda i: tf.cond(i > 3, lambda: tf.numpy_function(lambda v: v, [i], tf.int64), lambda: i),
               num_parallel_calls=2))
    ops = find_pyfunc_ops(ds)
    assert len(ops) == 2, ops
    assert ops[0].startswith("filter #1: EagerPyFunc")
    assert ops[1].startswith("map #2: PyFunc (ParallelMapDataset")  # inside a cond branch
    gen = tf.data.Dataset.from_generator(lambda: iter(range(3)), output_signature=tf.TensorSpec([], tf.int64))
    assert find_pyfunc_ops(gen)[0].startswith("from_generator in flat_map #1: PyFunc (GeneratorDataset")


def test_find_pyfunc_ops_names_fused_case_sampled_and_distributed_loaders_one_line_per_op():
    npf = lambda x: tf.numpy_function(lambda v: v, [x], tf.int64)  # noqa: E731
    pyf = lambda x: tf.py_function(lambda v: v, [x], tf.int64)  # noqa: E731
    r = tf.data.Dataset.range(8)
    # a fused map-and-batch is its own transformation, not a map
    fused = find_pyfunc_ops(r.apply(tf.data.experimental.map_and_batch(npf, 2)))
    assert len(fused) == 1 and fused[0].startswith("map_and_batch #1: PyFunc (MapAndBatchDataset"), fused
    # a switch_case names its branches as a list of functions
    case = find_pyfunc_ops(r.map(lambda i: tf.switch_case(tf.cast(i % 2, tf.int32), [lambda: npf(i), lambda: i])))
    assert len(case) == 1 and case[0].startswith("map #1: PyFunc (MapDataset"), case
    # sample_from_datasets' DirectedInterleaveDataset runs no function: the interleave after it is the first
    sampled = tf.data.Dataset.sample_from_datasets([r, r], seed=1)
    inter = find_pyfunc_ops(sampled.interleave(lambda i: tf.data.Dataset.from_tensors(npf(i)), cycle_length=1))
    assert len(inter) == 1 and inter[0].startswith("interleave #1: PyFunc (InterleaveDataset"), inter
    # one line per place and op: two kinds of Python op in one map are two lines (a generator's
    # init/next/finalize functions one: below)
    both = find_pyfunc_ops(r.map(lambda i: npf(i) + pyf(i)))
    assert sorted(line.split(" (")[0] for line in both) == ["map #1: EagerPyFunc", "map #1: PyFunc"], both
    # the loader a tf.distribute strategy hands out is scanned as the dataset it wraps
    strategy = tf.distribute.MirroredStrategy(["/CPU:0"])
    dist = find_pyfunc_ops(strategy.experimental_distribute_dataset(r.map(npf).batch(2)))
    assert len(dist) == 1 and dist[0].startswith("map #1: PyFunc (MapDataset"), dist


def test_a_loader_made_by_a_dataset_function_is_scanned_and_diagnosed():
    # multiworker's loader is strategy.distribute_datasets_from_function(...), which holds the datasets
    # its function made and has no graph of its own: diagnose under multiworker stopped at the scan
    npf = lambda x: tf.numpy_function(lambda v: v, [x], tf.int64)  # noqa: E731
    strategy = tf.distribute.MirroredStrategy(["/CPU:0"])
    planted = strategy.distribute_datasets_from_function(lambda ctx: tf.data.Dataset.range(8).map(npf).batch(2))
    [line] = find_pyfunc_ops(planted)
    assert line.startswith("map #1: PyFunc (MapDataset"), line
    clean = strategy.distribute_datasets_from_function(lambda ctx: tf.data.Dataset.from_tensors(tf.ones([4, 8])).repeat())
    r = diagnose(clean, _cheap_step(), steps=3, warmup=1)
    assert r["pyfunc_ops"] == [] and r["combined"]["steps_per_s"] > 0


def test_splits_loader_copied_to_a_device_is_scanned_and_diagnosed():
    # split's loader ends in prefetch_to_device, a generator over remote calls that tf.data cannot
    # serialize: the scan reads the graph the copy reads (diagnose under split stopped here before)
    npf = lambda x: tf.numpy_function(lambda v: v, [x], tf.int64)  # noqa: E731
    to_device = tf.data.experimental.prefetch_to_device("/CPU:0", buffer_size=2)
    planted = tf.data.Dataset.range(8).map(npf).batch(2).apply(to_device)
    with pytest.raises(tf.errors.FailedPreconditionError):
        planted._as_serialized_graph()
    [line] = find_pyfunc_ops(planted)
    assert line.startswith("map #1: PyFunc (MapDataset"), line
    clean = tf.data.Dataset.from_tensors(tf.ones([4, 8])).repeat().apply(to_device)
    r = diagnose(clean, _cheap_step(), steps=3, warmup=1)
    assert r["pyfunc_ops"] == [] and r["wait_floor"]["steps"] == 3 and r["combined"]["steps_per_s"] > 0


def _sleep_if_odd(i):
    if i % 2:
        time.sleep(0.025)  # a sleep, not work: the cycle stays clear on a busy 2-core machine
    return np.full([4, 4], i, np.float32)


def test_alternating_loader_oscillates_with_period_2():
    # (c) odd batches take 25 ms to arrive, even batches none
    opts = tf.data.Options()  # keep one batch at a time, in order: no injected prefetch
    opts.experimental_optimization.inject_prefetch = False
    ds = (tf.data.Dataset.range(10_000)
          .map(lambda i: tf.numpy_function(_sleep_if_odd, [i], tf.float32))
          .with_options(opts))
    r = diagnose(ds, _cheap_step(), steps=24, warmup=2)
    assert r["oscillation"] is True and r["oscillation_period"] == 2, [round(t, 1) for t in r["combined"]["step_times_ms"]]
    assert any("cycle with a period of 2 steps" in s for s in r["recommendations"])
    assert r["oscillation_by_shape"] is None  # one batch shape: the step's own cycle


def test_bucketed_shapes_taking_turns_are_named_as_the_cycle():
    # (d) batches of three shapes in turn (a bucketed loader), a step whose time grows with the batch:
    # the step times cycle with period 3, and the cause is the shapes, not work done every 3 steps
    ds = tf.data.Dataset.range(10_000).map(lambda i: tf.zeros([8 * (1 + i % 3), 4]))

    def step(batch):  # a sleep, not work: 15/30/45 ms, a cycle that stays clear on a busy 2-core machine
        time.sleep(0.015 * batch.shape[0] / 8)
        return {"loss": tf.reduce_mean(batch)}
    r = diagnose(ds, step, steps=24, warmup=2)
    assert r["oscillation"] is True and r["oscillation_period"] == 3, [round(t, 1) for t in r["combined"]["step_times_ms"]]
    by_shape = r["oscillation_by_shape"]
    assert sorted(by_shape) == sorted(f"[{n},4]" for n in (8, 16, 24))
    assert by_shape["[8,4]"] < by_shape["[16,4]"] < by_shape["[24,4]"]
    line = next(s for s in r["recommendations"] if "cycle with a period of 3 steps" in s)
    assert "3 batch shapes (buckets) in turn" in line and "logging" not in line


def test_cycle_of_shapes_only_when_the_shapes_explain_the_cycle():
    rng = np.random.default_rng(0)
    shapes = ["a", "b", "c"] * 14
    base = {"a": 430.0, "b": 300.0, "c": 205.0}
    times = np.array([base[s] for s in shapes]) + rng.normal(0, 3, len(shapes))
    assert detect_oscillation(times) == 3
    assert cycle_of_shapes(times, shapes) == pytest.approx(base, abs=5)
    # a cycle of its own on top (every other step 150 ms more): not the shapes' doing
    assert detect_oscillation(times + 150 * (np.arange(len(times)) % 2)) is not None
    assert cycle_of_shapes(times + 150 * (np.arange(len(times)) % 2), shapes) is None
    assert cycle_of_shapes(times, ["a"] * len(times)) is None   # one shape explains nothing


def test_detect_oscillation_series():
    rng = np.random.default_rng(0)
    assert detect_oscillation([1.0, 10.0] * 20) == 2
    assert detect_oscillation(([10.0, 1.0, 1.0] * 14) + rng.normal(0, 0.3, 42)) == 3
    assert detect_oscillation(np.linspace(20, 5, 40)) is None  # a trend is not a cycle
    assert detect_oscillation([5.0] * 40) is None
    for seed in range(20):  # noise, also heavy-tailed noise with spikes, never cycles
        r = np.random.default_rng(seed)
        assert detect_oscillation(10 + r.normal(0, 2, 40)) is None
        spiky = 10 + r.exponential(1, 40)
        spiky[r.integers(0, 40, 2)] += 50
        assert detect_oscillation(spiky) is None
        hiccup = np.tile([1.0, 9.0], 20) + r.normal(0, 0.3, 40)
        hiccup[r.integers(0, 40)] = 200.0  # one stall does not hide the cycle
        assert detect_oscillation(hiccup) == 2
    # recorded by GpuSampler on an H200 running matmuls 0.5 s on, 0.5 s off: a 1 s cycle at 0.2 s
    h200 = [46, 100, 100, 90, 0, 0, 100, 100, 100, 0, 0, 94, 100, 100, 0, 0, 77, 100, 100, 0, 0,
            62, 99, 100, 0, 0, 43, 100, 100, 0]
    assert detect_oscillation(h200, min_rel=0.0, min_abs=10.0) == 5
    assert detect_oscillation([71] + [100] * 24, min_rel=0.0, min_abs=10.0) is None  # the same GPU kept busy
    util = np.tile([100.0, 100.0, 0.0, 0.0], 10)  # a GPU that idles half the time, with ties
    assert detect_oscillation(util, min_rel=0.0, min_abs=10.0) == 4
    assert detect_oscillation(util * 0.05 + 50, min_rel=0.0, min_abs=10.0) is None  # 5 points: noise


def test_new_shape_every_batch_is_retracing():
    # (d) a tf.function without input_signature, fed a new shape each batch
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.zeros(tf.stack([i + 1, 4])))
    r = diagnose(ds, _cheap_step(), steps=10, warmup=2)
    assert r["verdict"] == "retracing"
    assert r["traces"] == len(r["trace_shapes"]) == 12
    assert r["retrace_shapes"]
    assert r["recommendations"][0].startswith("Step traced 12 times")
    # the step alone traced shapes 1-10; the loop's last two traced, and retracing keeps them in its figures
    assert r["combined"]["traced_steps"] == 2 and r["combined"]["traced_steps_left_out"] == 0
    assert len(r["combined"]["compute_times_ms"]) == 10


def _trace_slowly():
    @tf.function
    def step(batch):
        time.sleep(0.3)  # Python: runs while tracing only, like a model's trace and XLA compile
        return {"loss": tf.reduce_mean(batch)}
    return step


def test_a_first_trace_in_the_loop_is_left_out_of_its_figures(tmp_path):
    # two bucket shapes; the second first turns up in the real loop (batch 10: after the step alone's
    # 10 batches, within the loop's 2 + 10), so the loop's call on it traces, taking 300 ms
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.zeros(tf.stack([tf.where(i < 10, 4, 8), 4])))
    r = diagnose(ds, _trace_slowly(), steps=10, warmup=2, expected_shapes=2)
    co = r["combined"]
    assert len(co["compute_times_ms"]) == 9 and max(co["compute_times_ms"]) < 250, co["compute_times_ms"]
    assert r["verdict"] != "retracing" and r["traces"] == 2
    assert co["traced_steps"] == co["traced_steps_left_out"] == 1
    assert co["loop_seconds"] - co["seconds"] >= 0.3 and co["steps_per_s"] == pytest.approx(9 / co["seconds"])
    assert len(co["step_times_ms"]) == len(co["wait_times_ms"]) == 9
    assert any(s.startswith("Left out of the real loop's figures: 1 step during which") for s in r["notes"])
    assert any(s.startswith("Left out of the real loop's figures") for s in r["recommendations"])
    assert "(mean), 1 tracing step left out;" in write_report(r, tmp_path)["md"].read_text()


def test_a_loop_that_only_traces_keeps_its_steps():
    # warmup >= steps: every measured step meets a shape neither the step alone nor the warmup had
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.zeros(tf.stack([i + 1, 4])))
    r = diagnose(ds, _cheap_step(), steps=3, warmup=3, expected_shapes=100)
    assert r["verdict"] != "retracing"
    assert any(s.startswith("Every step of the real loop (3) traced") for s in r["notes"]), r["notes"]
    assert r["combined"]["traced_steps"] == 3 and r["combined"]["traced_steps_left_out"] == 0
    assert len(r["combined"]["compute_times_ms"]) == 3


def _sleep_half_ms_per_row(x):
    time.sleep(0.0005 * x.shape[0])
    return np.float32(x.sum())


def test_step_alone_times_the_mix_of_shapes_the_loop_sees():
    # a bucketed loader whose first batch is the small bucket: 2 ms for it, 20 ms for the big one
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.zeros(tf.stack([tf.where(i % 4 == 0, 4, 40), 16])))

    @tf.function
    def step(x):
        return {"loss": tf.numpy_function(_sleep_half_ms_per_row, [x], tf.float32)}
    r = diagnose(ds, step, steps=8, warmup=1, expected_shapes=2)
    st = r["step"]
    assert st["step_ms_median"] >= 15, st   # 6 of the 8 batches are big
    assert st["step_ms_mean"] == pytest.approx((2 * 2 + 6 * 20) / 8, rel=0.5)
    assert st["batch_shape"] == "[4,16]" and st["batch_shapes"] == {"[4,16]": 2, "[40,16]": 6}
    assert sum(r["trace_shapes"].values()) == 8 + 1 + 8   # the step alone's batches, the loop's warmup and steps
    assert r["traces"] == 2 and r["verdict"] != "retracing"


@pytest.mark.parametrize("expected", [3, None])
def test_three_bucket_shapes_are_not_retracing(expected):
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.zeros(tf.stack([4 * (i % 3 + 1), 4])))
    r = diagnose(ds, _cheap_step(), steps=12, warmup=2, expected_shapes=expected)
    assert r["traces"] == 3 and len(r["trace_shapes"]) == 3
    assert r["verdict"] != "retracing"


def test_gpu_sampler_matches_numpy_on_known_series(cuda_env):
    util = [[10, 90, 30, 70, 50, 55], [0, 0, 100, 100, 0, 0]]
    mem = [[1000, 1200, 1100, 1500, 1300, 1250], [200, 200, 300, 300, 250, 250]]
    fake = FakeNVML(util, mem)
    s = GpuSampler(interval_s=3600, nvml=fake).start()  # start() takes the first sample, the thread none
    for _ in range(5):
        s.sample_once()
    s.stop()
    assert fake.shut
    out = s.summary()
    assert [g["index"] for g in out] == [0, 1] and out[0]["name"] == "Fake GPU"
    assert [g["nvml_index"] for g in out] == [0, 1] and s.notes == [] and s.stopped is None
    for g, u, m in zip(out, util, mem):
        assert g["util_mean"] == pytest.approx(np.mean(u))
        assert g["util_cv"] == pytest.approx(np.std(u) / np.mean(u))
        assert g["mem_used_mb"] == pytest.approx(np.max(m))
        assert g["util_series"] == u and g["samples"] == 6

    fake = FakeNVML([[20, 80]], [[500, 700]])  # the thread, sampling at 100 Hz
    with GpuSampler(interval_s=0.01, nvml=fake) as s:
        time.sleep(0.15)
    (g,) = s.summary()
    assert g["samples"] >= 3 and g["util_mean"] == pytest.approx(np.mean(fake.emitted_util[0]))
    assert g["util_cv"] == pytest.approx(np.std(fake.emitted_util[0]) / np.mean(fake.emitted_util[0]))
    assert g["mem_used_mb"] == pytest.approx(np.max(fake.emitted_mem[0]))


def test_gpu_sampler_idle_gpu_memory_total_and_coverage(cuda_env):
    # an idle GPU's utilisation does not vary (CV 0, not 0/0); the memory total in MB as the used memory is;
    # each sample stands for the interval after it, so start()'s one sample covers an hour of a 2 h loop
    fake = FakeNVML([[0, 0, 0]], [[500, 600, 700]])
    t0 = time.perf_counter()
    s = GpuSampler(interval_s=3600, nvml=fake).start()
    s.stop()
    (g,) = s.summary()
    assert g["samples"] == 1 and g["util_mean"] == 0.0 and g["util_cv"] == 0.0
    assert g["mem_total_mb"] == 16 * 1024 and g["mem_used_mb"] == 500
    cov = s.coverage(t0, t0 + 7200)
    assert cov["samples"] == 1 and cov["fraction"] == pytest.approx(0.5, abs=0.01)
    assert cov["seconds"] == pytest.approx(3600, abs=60)
    assert s.coverage(t0, t0 + 1800)["fraction"] == 1.0


def test_gpu_sampler_without_nvml_never_crashes():
    s = GpuSampler(nvml=FakeNVML([[1]], [[1]], fail_init=True)).start()
    s.stop()
    assert s.available is False and "Driver Not Loaded" in s.reason and s.summary() == []


@pytest.mark.parametrize("visible, order, names, nvml_indices, note", [
    (None, None, ["A100", "A100", "A100"], [0, 1, 2], None),           # unset: all; identical GPUs
    (None, None, ["A100", "T4", "A100"], [0, 1, 2], "CUDA_DEVICE_ORDER=PCI_BUS_ID or identical GPUs"),
    ("2,0", None, ["A100", "T4", "A100"], [2, 0], "CUDA_DEVICE_ORDER=PCI_BUS_ID or identical GPUs"),
    ("2,0", "PCI_BUS_ID", ["A100", "T4", "A100"], [2, 0], None),
    ("1,7,0", None, None, [1], "NVML knows no GPU '7'"),                # CUDA stops at an unknown entry
    ("GPU-fake-2-5e1f, GPU-nope,0", None, ["A100", "T4", "A100"], [2], "NVML knows no GPU 'GPU-nope'"),
    # a UUID's prefix, as CUDA takes it, when only one GPU's UUID starts with it
    ("GPU-fake-1,GPU-fake-", None, None, [1], "NVML knows no GPU 'GPU-fake-'"),
    ("MIG-4f1e2a", None, None, [], "a MIG instance, whose utilisation NVML does not report"),
    ("MIG-4f1e2a,0", None, None, [], "a MIG instance, whose utilisation NVML does not report"),   # ends the list
    ("1,3,0", None, None, [1], "NVML knows no GPU '3'"),                # NVML numbers 0..2: 3 ends it too
    ("", None, None, [], None),
    ("-1", None, None, [], None),
    ("none", None, None, [], None),
])
def test_gpu_sampler_samples_only_the_gpus_cuda_visible_devices_leaves(cuda_env, visible, order, names,
                                                                        nvml_indices, note):
    if visible is not None:
        cuda_env.setenv("CUDA_VISIBLE_DEVICES", visible)
    if order is not None:
        cuda_env.setenv("CUDA_DEVICE_ORDER", order)
    fake = FakeNVML([[10], [20], [30]], [[100], [200], [300]], names=names)
    s = GpuSampler(interval_s=3600, nvml=fake).start()
    s.stop()
    out = s.summary()
    assert [len(e) for e in fake.emitted_util] == [int(i in nvml_indices) for i in range(3)]  # no other GPU read
    assert [g["util_mean"] for g in out] == [10.0 * (i + 1) for i in nvml_indices]
    assert [g["index"] for g in out] == list(range(len(nvml_indices)))   # TensorFlow's /GPU:i
    assert [g["nvml_index"] for g in out] == nvml_indices
    assert (note is None and s.notes == []) or (len(s.notes) == 1 and note in s.notes[0]), s.notes
    if not nvml_indices:
        assert s.available is False and s.reason.startswith(f"CUDA_VISIBLE_DEVICES={visible!r} leaves this process")


def test_gpus_tensorflow_cannot_use_get_no_gpu_advice(tmp_path, cuda_env):
    # NVML lists another user's busy GPU 0 and an idle GPU 1; TensorFlow sees no GPU
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.fill([4, 8], tf.cast(i, tf.float32)))
    _tensorflow_sees(cuda_env, 0)
    kw = dict(steps=10, warmup=1, placement="cpu",
              context={"placement": "cpu", "jit_compile": False, "mixed_precision": "off", "copy_ms": None})
    fake = FakeNVML([[97, 100], [0, 0]], [[70000], [300]])
    r = diagnose(ds, _cheap_step(), gpu_sampler=GpuSampler(interval_s=0.005, nvml=fake), **kw)
    assert len(r["gpus"]) == 2
    assert any(s.startswith("TensorFlow sees no GPU, yet NVML lists 2 GPUs this process may use")
               for s in r["recommendations"]), r["recommendations"]
    assert not any("idle" in s or "'split'" in s or "Mixed precision" in s or "XLA" in s
                   for s in r["recommendations"]), r["recommendations"]
    assert not any(src.startswith("GPU") for src in r["oscillation_sources"])
    md = write_report(r, tmp_path)["md"].read_text()
    assert "TensorFlow sees none of them" in md

    cuda_env.setenv("CUDA_VISIBLE_DEVICES", "")  # the process may use no GPU: none is sampled
    fake = FakeNVML([[97, 100], [0, 0]], [[70000], [300]])
    r = diagnose(ds, _cheap_step(), gpu_sampler=GpuSampler(interval_s=0.005, nvml=fake), **kw)
    assert r["gpus"] == [] and fake.emitted_util == [[], []]
    assert "GPU utilisation was not sampled: CUDA_VISIBLE_DEVICES='' leaves this process none of the 2 GPU(s)" \
        in " ".join(r["recommendations"])
    assert not any("GPU 1" in s or "Mixed precision" in s for s in r["recommendations"])


def _sleep_10ms(x):
    time.sleep(0.01)
    return np.float32(x.sum())


@pytest.mark.parametrize("fail_after", [0, 3])
def test_nvml_failing_says_how_much_of_the_loop_was_sampled(tmp_path, cuda_env, fail_after):
    # NVML fails on the first sample, or after 3 of the ~40 a 200 ms loop takes at 5 ms
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.fill([4, 8], tf.cast(i, tf.float32))).prefetch(2)
    step = tf.function(lambda x: {"loss": tf.numpy_function(_sleep_10ms, [x], tf.float32)})
    fake = FakeNVML([[35], [35]], [[9000], [9000]], fail_after=fail_after)
    _tensorflow_sees(cuda_env, 2)
    r = diagnose(ds, step, steps=20, warmup=1, placement="mirrored",
                 gpu_sampler=GpuSampler(interval_s=0.005, nvml=fake),
                 context={"placement": "mirrored", "jit_compile": True, "mixed_precision": "bfloat16"})
    assert f"NVML sampling stopped after {fail_after} sample(s) (NVMLError: GPU is lost)" in r["gpu_sampling"]
    cov = r["gpu_coverage"]
    assert cov["samples"] == fail_after and cov["fraction"] < 0.5 and cov["seconds"] < 0.5 * cov["loop_seconds"]
    assert f"{fail_after} samples covering {cov['seconds']:.2f} s" in r["gpu_sampling"]
    assert fake.attempts[0] == fail_after + 1  # no retry after the failure
    assert not any("35 %" in s or s.startswith("GPU 0") for s in r["recommendations"]), r["recommendations"]
    assert any(s.startswith("GPU utilisation was not judged: the samples span under 50% of the loop")
               for s in r["recommendations"])
    md = write_report(r, tmp_path)["md"].read_text()
    gpu_lines = [line for line in md.splitlines() if line.startswith("- GPU ")]
    assert len(gpu_lines) == 2 and "NVML sampling stopped" in md
    if fail_after == 0:
        assert all(line.endswith("Fake GPU: not measured (no sample)") for line in gpu_lines), gpu_lines
    else:
        assert all("utilisation 35 % mean" in line for line in gpu_lines), gpu_lines


@pytest.mark.skipif(_nvml_works(), reason="this machine has an NVIDIA driver")
def test_an_nvml_binding_raising_another_error_ends_sampling_with_its_reason(cuda_env):
    # not an NVMLError (a binding's own bug, a ctypes error): sampling ends and says why, no thread traceback
    nvml = FakeNVML([[50.0] * 5], [[100.0] * 5])
    reads = nvml.nvmlDeviceGetUtilizationRates

    def flaky(h):
        if nvml.attempts[h] >= 2:
            raise RuntimeError("driver hiccup")
        return reads(h)
    nvml.nvmlDeviceGetUtilizationRates = flaky
    s = GpuSampler(interval_s=0.01, nvml=nvml).start()
    time.sleep(0.2)
    s.stop()
    assert s.stopped == "NVML sampling stopped after 2 sample(s) (RuntimeError: driver hiccup)"
    assert s.summary()[0]["samples"] == 2 and nvml.shut


def test_real_no_nvml_path(pyfunc_report):
    assert pyfunc_report["gpus"] == []
    assert any(s.startswith("GPU utilisation was not sampled: NVML") for s in pyfunc_report["recommendations"])


def test_fake_gpus_in_diagnose_and_report_files(tmp_path, pyfunc_report, cuda_env):
    fake = FakeNVML([[30, 40, 35], [0, 0, 0]], [[900, 950, 1000], [10, 10, 10]])
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.fill([4, 8], tf.cast(i, tf.float32))).prefetch(2)
    step = tf.function(lambda x: {"loss": tf.numpy_function(_sleep_10ms, [x], tf.float32)})  # a 200 ms loop
    _tensorflow_sees(cuda_env, 2)
    r = diagnose(ds, step, steps=20, warmup=2, device="/GPU:0", placement="single",
                 gpu_sampler=GpuSampler(interval_s=0.005, nvml=fake),
                 context={"placement": "single", "jit_compile": False, "mixed_precision": "off", "copy_ms": None})
    assert [g["index"] for g in r["gpus"]] == [0, 1] and [g["nvml_index"] for g in r["gpus"]] == [0, 1]
    assert r["gpus"][0]["util_mean"] == pytest.approx(np.mean(fake.emitted_util[0]))
    assert r["gpu_coverage"]["fraction"] >= 0.5 and r["gpu_sampling"].startswith("2 GPUs sampled every 0.005 s: ")
    assert any(s.startswith("GPU 0 (Fake GPU) utilisation") for s in r["recommendations"])
    assert any(s.startswith("GPU 1 (Fake GPU) was idle") for s in r["recommendations"])
    assert any("Mixed precision is off" in s for s in r["recommendations"])
    assert not any("not sampled" in s or "not judged" in s for s in r["recommendations"])

    for report, sub in ((r, "gpu"), (pyfunc_report, "cpu")):
        paths = write_report(report, tmp_path / sub)
        loaded = json.loads(paths["json"].read_text())
        assert all(f in loaded for f in FIELDS)
        assert loaded["verdict"] == report["verdict"] and loaded["pyfunc_ops"] == report["pyfunc_ops"]
        assert {"examples_per_s", "batches_per_s", "mb_per_s"} <= set(loaded["loader"])
        png = paths["png"].read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        assert f"# Diagnose: {report['verdict']}" in paths["md"].read_text()
        assert sorted(p.name for p in (tmp_path / sub).iterdir()) == ["diagnose.json", "diagnose.md", "diagnose.png"]


def test_compare_placements_picks_the_faster():
    def rep(sps, wait, verdict="compute_bound"):
        return {"combined": {"steps_per_s": sps, "examples_per_s": 16 * sps}, "input_wait_fraction": wait,
                "verdict": verdict}
    out = compare_placements({"split": rep(8.0, 0.15, "input_bound"), "mirrored": rep(12.0, 0.01)})
    assert out[0].startswith("Use placement 'mirrored'") and "1.50x" in out[0]
    assert any("Under 'split'" in s for s in out)
    assert "within 5%" in compare_placements({"split": rep(10.0, 0.0), "mirrored": rep(10.2, 0.0)})[0]
    assert compare_placements({"split": rep(1.0, 0.0)})[0].startswith("Placements were not compared")


def test_cli_with_a_stub_trainer(tmp_path, monkeypatch):
    # the real trainer needs built caches; the CLI's wiring is what is under test here
    root = tmp_path / "data"
    (root / "wavs").mkdir(parents=True)
    (root / "metadata.csv").write_text("")
    cfg_path = write_config(tmp_path, root, diagnose={"steps": 6, "warmup": 1})

    class StubTrainer:
        placement, model_device, n_buckets = "cpu", "/CPU:0", 1
        dataset = tf.data.Dataset.range(100).map(lambda i: {"mel": tf.fill([2, 5, 3], tf.cast(i, tf.float32))})
        loop_batches = 0

        def __init__(self):
            self.step = tf.function(lambda batch: {"loss": tf.reduce_mean(batch["mel"])})

        def context(self):
            return {"placement": "cpu", "jit_compile": False, "mixed_precision": "off", "copy_ms": None}

        def batches(self):
            for b in self.dataset:
                StubTrainer.loop_batches += 1
                yield b

    built = []
    stub = types.ModuleType("pipeline.train")
    stub.build_trainer = lambda cfg, placement=None: built.append(placement) or StubTrainer()
    monkeypatch.setitem(sys.modules, "pipeline.train", stub)
    diagnose_mod.main(["--config", str(cfg_path), "--set", "diagnose.steps=8"])

    out = tmp_path / "reports" / "t"
    r = json.loads((out / "diagnose.json").read_text())
    assert all(f in r for f in FIELDS) and r["steps"] == 8 and r["placement"] == "cpu"
    assert StubTrainer.loop_batches >= 9  # the real loop ran on the trainer's own batches
    assert built == [None] and r["placement_comparison"][0].startswith("Placements were not compared")
    assert (out / "diagnose.png").stat().st_size > 5000 and (out / "diagnose.md").exists()


def test_diagnose_target_vocoder_measures_the_segment_loader_and_the_vocoder_step(built_cache):
    from conftest import TINY_VOCODER

    from pipeline import config
    cfg = config.load_config(built_cache, {"vocoder": TINY_VOCODER, "diagnose": {"target": "vocoder", "steps": 6,
                                                                                "warmup": 2}})
    report = diagnose_mod._diagnose_vocoder(cfg)
    assert all(k in report for k in FIELDS) and report["target"] == "vocoder"
    assert report["pyfunc_ops"] == [] and report["traces"] == 1      # one static segment shape, one trace
    assert report["vocoder_step"] == "spectral" and report["verdict"] in ("input_bound", "compute_bound")
    assert report["loader"]["examples_per_s"] > 0 and report["combined"]["steps_per_s"] > 0


VOCODER_ON_CPU1 = """
import json, types, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from pipeline import diagnose as dmod

class Trainer:  # VocoderTrainer's face: its model and steps made on its device, which is not the default
    device = "/CPU:1"
    p = types.SimpleNamespace(name="single", jit_compile=False, mixed_precision="off")

    def __init__(self, cfg):
        with tf.device(self.device):
            self.v = tf.Variable(tf.ones([4, 4]))
        self.gan_step = tf.function(lambda b: {"loss": tf.reduce_sum(tf.matmul(b, self.v))}, autograph=False)
        self.spectral_step = self.gan_step

    def dataset(self, split):
        return tf.data.Dataset.from_tensors(tf.ones([4, 4])).repeat()

stub = types.ModuleType("pipeline.vocoder.train")
stub.VocoderTrainer = Trainer
sys.modules["pipeline.vocoder.train"] = stub
seen, real = set(), dmod.diagnose

def spy(dataset, step_fn, **kw):
    def step(batch):
        out = step_fn(batch)
        seen.add(out["loss"].device)
        return out
    step.experimental_get_tracing_count = step_fn.experimental_get_tracing_count
    return real(dataset, step, **kw)
dmod.diagnose = spy
r = dmod._diagnose_vocoder({"vocoder": {"gan_start_step": 0}, "diagnose": {"steps": 3, "warmup": 1}})
print(json.dumps({"devices": sorted(seen), "traces": r["traces"]}))
"""


def test_diagnose_runs_the_vocoder_step_on_the_trainers_device():
    # training calls the step under tf.device(trainer.device), and a tf.function's ops go where the call
    # is scoped: two logical CPUs stand in for split's model GPU, in a process of their own
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(VOCODER_ON_CPU1)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == ["/job:localhost/replica:0/task:0/device:CPU:1"] and out["traces"] == 1, out


def test_the_verdict_weighs_the_wait_and_the_loaders_margin():
    fast_loader, slow_loader, step = {"batches_per_s": 100.0}, {"batches_per_s": 5.0}, {"steps_per_s": 10.0}
    verdict_of = diagnose_mod.verdict_of
    assert verdict_of(False, 0.10, fast_loader, step) == "input_bound"     # waits 10 %: moderately input-bound
    assert verdict_of(False, 0.05, fast_loader, step) == "input_bound"     # the TF profiler's 5 % threshold itself
    assert verdict_of(False, 0.0, slow_loader, step) == "input_bound"      # no wait yet, but the loader is slower
    assert verdict_of(False, 0.01, fast_loader, step) == "compute_bound"
    assert verdict_of(True, 0.5, slow_loader, step) == "retracing"


def test_a_second_trace_for_one_shape_is_not_retracing():
    # a first call that creates variables traces twice: RETRACE_SLACK allows one trace beyond the shapes
    assert diagnose_mod.check_traces(2, ["[8,4]"] * 6, None)[0] is False
    assert diagnose_mod.check_traces(3, ["[8,4]"] * 6, None)[0] is True


def test_the_wait_fraction_is_of_the_loops_time_without_the_steps_left_out():
    # four steps, the last of which traced (1 s): left out of every figure, its wait too
    loop = {"waits": [0.01, 0.02, 0.06, 0.01], "computes": [0.01, 0.01, 0.01, 1.0],
            "traced": [False, False, False, True], "shapes": ["a"] * 4, "examples": [8] * 4, "seconds": 1.13}
    combined, shapes, notes = diagnose_mod.loop_figures(loop, retracing=False)
    assert combined["seconds"] == pytest.approx(0.12) and combined["traced_steps_left_out"] == 1
    assert combined["input_wait_fraction"] == pytest.approx(0.09 / 0.12)   # waited 90 ms of the 120 ms kept
    assert combined["steps_per_s"] == pytest.approx(25.0) and combined["examples_per_s"] == pytest.approx(200.0)
    assert combined["wait_ms_mean"] == pytest.approx(30.0) and combined["compute_ms_mean"] == pytest.approx(10.0)
    assert shapes == ["a"] * 3 and any("1.01 s in all" in n for n in notes)


def test_retraces_on_one_batch_shape_are_blamed_on_the_arguments_not_the_shapes():
    # a Python number passed to the tf.function: a new trace every call, on a single batch shape
    import itertools
    inner = tf.function(lambda x, k: tf.reduce_mean(x) + k)
    counter = itertools.count()

    def step(batch):
        return {"loss": inner(batch, next(counter))}
    step.experimental_get_tracing_count = inner.experimental_get_tracing_count
    ds = tf.data.Dataset.from_tensors(tf.zeros([4, 4])).repeat()
    r = diagnose(ds, step, steps=6, warmup=1)
    assert r["verdict"] == "retracing" and r["trace_bound"] == 2 and len(r["trace_shapes"]) == 1
    assert r["recommendations"][0].startswith(f"Step traced {r['traces']} times although only 1 batch shape reached it")


def test_step_alone_figures_on_a_known_clock(monkeypatch):
    # the step's own times set by a fake clock: mean, median and 90th percentile of exactly those
    ms = [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 50.0]
    clock = [0.0]
    monkeypatch.setattr(diagnose_mod, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def step(batch):
        clock[0] += ms[int(batch[0])] / 1e3
        return {"loss": batch}
    figures, shapes = diagnose_mod.time_step_alone(
        lambda: iter([tf.constant([i]) for i in range(10)]), step, steps=10, warmup=0, device=None)
    assert figures["step_ms_mean"] == pytest.approx(np.mean(ms)) and figures["step_ms_median"] == pytest.approx(2.0)
    assert figures["step_ms_p90"] == pytest.approx(np.percentile(ms, 90)) and figures["step_ms_p90"] > 6.0
    assert figures["steps_per_s"] == pytest.approx(10 / (sum(ms) / 1e3))


class PerReplica:  # tf.distribute's per-replica values, as _walk recognises them (by name)
    def __init__(self, values):
        self.values = values


def test_a_mirrored_batch_counts_the_examples_of_every_replica():
    # mirrored placement: each replica holds its share of the batch; examples/s ranks the placements
    batch = {"mel": PerReplica([tf.zeros([4, 10, 3]), tf.zeros([4, 10, 3])]),
             "tokens": PerReplica([tf.zeros([4, 7], tf.int32), tf.zeros([4, 7], tf.int32)])}
    examples, nbytes = diagnose_mod._batch_stats(batch)
    assert examples == 8 and nbytes == 2 * (4 * 10 * 3 * 4 + 4 * 7 * 4)


def test_the_report_counts_the_traces_diagnose_itself_made(pyfunc_report, tmp_path):
    assert pyfunc_report["traces_during_diagnose"] == pyfunc_report["traces"] == 1   # a fresh step function
    written = json.loads(write_report(pyfunc_report, tmp_path)["json"].read_text())
    assert written["traces_during_diagnose"] == 1 and written["trace_bound"] == 2


def test_cycle_figures_are_of_the_loops_wall_times(pyfunc_report):
    from pipeline.diagnose_report import cv
    walls = np.tile([1.0, 10.0], 10)
    fields = diagnose_mod._oscillation_fields(walls, 2, ["step times (period 2 steps)"], ["a"] * 20)
    assert fields["oscillation"] is True and fields["oscillation_phase_ms"] == [1.0, 10.0]
    # the step-time CV is of each step's wall time (wait + step), what the loop pays
    co = pyfunc_report["combined"]
    assert pyfunc_report["step_time_cv"] == pytest.approx(cv(co["step_times_ms"]))
    assert pyfunc_report["step_time_cv"] != pytest.approx(cv(co["compute_times_ms"]))


def test_gpus_tensorflow_does_not_use_are_no_source_of_the_loops_cycles(monkeypatch):
    # NVML lists a GPU whose utilisation cycles (another process's job); TensorFlow sees no GPU
    class Sampler:
        interval_s = 0.1

        def summary(self, t0):
            return [{"index": 0, "util_series": [0, 0, 100, 100] * 5}]

        def coverage(self, start, end):
            return {"fraction": 1.0, "samples": 20, "seconds": end - start, "loop_seconds": end - start}
    loop = {"t0": 0.0, "seconds": 2.0}
    _tensorflow_sees(monkeypatch, 0)
    gpus, coverage, host, loop_gpus = diagnose_mod._gpu_figures(Sampler(), loop)
    assert len(gpus) == 1 and coverage["fraction"] == 1.0 and loop_gpus == []
    _tensorflow_sees(monkeypatch, 1)
    assert diagnose_mod._gpu_figures(Sampler(), loop)[3] == gpus


def test_a_cycle_is_blamed_on_the_wait_or_on_the_step_whichever_cycles():
    from pipeline.diagnose_report import _oscillation_advice
    base = {"input_wait_fraction": 0.4, "oscillation_period": 2, "oscillation_phase_ms": [11.0, 36.0],
            "oscillation_by_shape": None, "step_time_cv": 0.5}
    from_input = {**base, "combined": {"wait_times_ms": [1.0, 26.0] * 6, "compute_times_ms": [10.0] * 12}}
    [(gain, line)] = _oscillation_advice(from_input)
    assert "the wait for input cycles" in line and "the step itself" not in line
    assert gain == pytest.approx(0.399)                 # no more than the wait it is a symptom of
    from_step = {**base, "combined": {"wait_times_ms": [1.0] * 12, "compute_times_ms": [10.0, 35.0] * 6}}
    [(gain, line)] = _oscillation_advice(from_step)
    assert "the step itself cycles: something runs every 2 steps" in line and "wait for input" not in line
    assert gain == pytest.approx((23.5 - 11.0) / 23.5)  # down to the fast phase: the share of the time it saves


def _advice_report(wait, loader_bps=50.0, step_sps=10.0, **fields):
    return {"input_wait_fraction": wait, "loader": {"batches_per_s": loader_bps}, "step": {"steps_per_s": step_sps},
            "thresholds": dict(diagnose_mod.THRESHOLDS), **fields}


def test_the_input_advice_says_how_input_bound_and_what_removing_the_wait_gains():
    from pipeline.diagnose_report import _input_advice
    [(gain, line)] = _input_advice(_advice_report(0.10))
    assert gain == 0.10 and "waited for input 10% of the wall time (moderately input-bound" in line
    assert "up to 1.11x faster" in line                      # 1 / (1 - 0.10)
    [(gain, line)] = _input_advice(_advice_report(0.50))
    assert "(highly input-bound" in line and "up to 2.00x faster" in line and "(5.00x)" in line
    [(gain, line)] = _input_advice(_advice_report(0.01, loader_bps=8.0))
    assert gain == pytest.approx(0.2) and "delivers only 0.80x what the step consumes" in line


def test_an_under_used_gpu_is_fed_faster_only_when_the_loop_waits_for_input():
    from pipeline.diagnose_report import _gpu_advice
    gpu = {"index": 0, "name": "Fake GPU", "util_mean": 40.0, "util_cv": 0.3, "mem_used_mb": 900.0}
    r = _advice_report(0.01, verdict="compute_bound", gpus=[gpu], host={"gpus": ["Fake GPU"]},
                       gpu_coverage={"fraction": 1.0}, gpu_sampling="1 GPU sampled", placement="single")
    [(gain, line)] = _gpu_advice(r)
    assert gain == pytest.approx(0.3) and "idles 60 % of the time; give each launch more work" in line
    [(gain, line)] = _gpu_advice({**r, "verdict": "input_bound", "input_wait_fraction": 0.3})
    assert "idles 60 % of the time; feed it faster (see the input advice above)" in line


def test_a_copy_of_a_tenth_of_the_step_is_worth_hiding():
    from pipeline.diagnose_report import _copy_advice
    r = {"combined": {"wait_ms_mean": 1.0, "compute_ms_mean": 19.0}, "placement": "split",
         "context": {"placement": "split", "copy_ms": 2.0}}
    [(gain, line)] = _copy_advice(r)
    assert gain == pytest.approx(0.1) and line.startswith("Copying a batch to the model device takes 2.0 ms, 10% of")
    assert _copy_advice({**r, "context": {"placement": "split", "copy_ms": 0.5}}) == []   # 2.5 %: not worth it


def test_diagnose_md_says_the_wait_and_the_step_times_as_measured(pyfunc_report, tmp_path):
    r, co = pyfunc_report, pyfunc_report["combined"]
    md = write_report(r, tmp_path)["md"].read_text()
    assert f"it waited for input {r['input_wait_fraction']:.1%} of the wall time" in md
    assert f"| real loop | {co['steps_per_s']:.2f} | wait {co['wait_ms_mean']:.2f} ms, step {co['compute_ms_mean']:.2f} ms" in md
    # a Python map's 20 ms against a cheap step: the wait leads. Not by a fixed factor: on a loaded
    # machine the cheap step slows too (16.9 ms against 4.1 ms once in CI at 83087b2)
    assert co["wait_ms_mean"] > co["compute_ms_mean"]


def test_a_non_finite_figure_is_written_as_null(pyfunc_report, tmp_path):
    # JSON has no NaN or Infinity: such a figure (a step of no measurable time) is null, not a failed write
    r = {**pyfunc_report, "step": {**pyfunc_report["step"], "steps_per_s": float("inf"), "step_ms_p90": np.float32("nan")}}
    written = json.loads(write_report(r, tmp_path)["json"].read_text())
    assert written["step"]["steps_per_s"] is None and written["step"]["step_ms_p90"] is None


def test_a_folder_where_a_report_file_goes_is_refused_before_profiling_and_the_old_report_stays(
        pyfunc_report, tmp_path, monkeypatch, capsys):
    # diagnose.png a folder: refused before minutes of profiling, not after diagnose.json was replaced
    out = tmp_path / "out"
    (out / "diagnose.png").mkdir(parents=True)
    (out / "diagnose.json").write_text("old\n")
    with pytest.raises(PipelineError, match="diagnose.png: a folder"):
        write_report(pyfunc_report, out)
    assert (out / "diagnose.json").read_text() == "old\n" and not (out / "diagnose.md").exists()
    root = tmp_path / "data"
    (root / "wavs").mkdir(parents=True)
    (root / "metadata.csv").write_text("")
    stub = types.ModuleType("pipeline.train")
    stub.build_trainer = lambda cfg, placement=None: pytest.fail("profiled before refusing --out")
    monkeypatch.setitem(sys.modules, "pipeline.train", stub)
    with pytest.raises(SystemExit) as stop:
        diagnose_mod.main(["--config", str(write_config(tmp_path, root)), "--out", str(out)])
    assert stop.value.code == 2 and f"--out {out / 'diagnose.png'}: a folder" in capsys.readouterr().err


def test_a_step_without_a_tracing_count_is_not_said_to_have_traced(pyfunc_report, tmp_path):
    # a plain Python step function: no count of its traces, so the report gives none ("traced None times")
    md = write_report({**pyfunc_report, "traces": None}, tmp_path)["md"].read_text()
    assert "(step traces not counted; placement None)" in md and "None times" not in md


def test_python_ops_rank_by_the_wait_even_in_a_loop_that_also_retraces():
    from pipeline.diagnose_report import _pyfunc_advice
    r = _advice_report(0.3, verdict="retracing", pyfunc_ops=["map #1: PyFunc"],
                       pyfunc_locations=[{"transformation": "map #1", "op": "PyFunc"}])
    [(gain, line)] = _pyfunc_advice(r)
    assert gain == pytest.approx(0.31) and "map #1 (PyFunc)" in line


def test_compare_placements_ranks_by_examples_when_a_step_holds_more_of_them():
    # mirrored puts twice the examples in a step: fewer steps/s, more examples/s
    def rep(sps, per_step):
        return {"combined": {"steps_per_s": sps, "examples_per_s": per_step * sps}, "input_wait_fraction": 0.0,
                "verdict": "compute_bound"}
    out = compare_placements({"split": rep(10.0, 16), "mirrored": rep(8.0, 32)})
    assert out[0].startswith("Use placement 'mirrored'") and "1.60x the examples/s" in out[0]


def test_loader_figures_on_a_known_clock(monkeypatch):
    # 4 batches of 1000 float32 examples x 250: 1 MB each (10^6 bytes), one every 0.5 s
    clock = [0.0]
    monkeypatch.setattr(diagnose_mod, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def batches():
        for _ in range(100):
            clock[0] += 0.5
            yield tf.zeros([1000, 250])
    figures = diagnose_mod.time_loader(batches, steps=4, warmup=1)
    assert figures["seconds"] == pytest.approx(2.0) and figures["batches_per_s"] == pytest.approx(2.0)
    assert figures["examples_per_s"] == pytest.approx(2000.0) and figures["mb_per_s"] == pytest.approx(2.0)


def test_a_generators_python_op_is_named_by_its_next_function_whatever_the_attributes_order():
    """protobuf's map order follows Python's string hash (PYTHONHASHSEED): diagnose named a
    from_generator's PyFunc by its next, init or finalize function, differently in each process."""
    from pipeline import graphscan
    names = {"init_func": "init_fn", "next_func": "next_fn", "finalize_func": "finalize_fn"}
    seen = set()
    for order in itertools.permutations(names):
        node = types.SimpleNamespace(attr={k: tf.compat.v1.AttrValue(func=tf.compat.v1.NameAttrList(name=names[k]))
                                           for k in order})
        seen.add(tuple(graphscan._func_refs(node)))
    assert seen == {("next_fn", "finalize_fn", "init_fn")}
    ds = tf.data.Dataset.from_generator(lambda: iter(range(3)), output_signature=tf.TensorSpec([], tf.int64))
    [line] = graphscan.find_pyfunc_ops(ds)   # one line for its init, next and finalize functions
    assert line.startswith("from_generator in flat_map #1: PyFunc (GeneratorDataset, function ") \
        and "generator_next_fn" in line, line


def test_a_wait_that_one_constant_batch_also_waits_is_tf_datas_fixed_cost_not_the_loaders():
    from pipeline.diagnose_report import _gpu_advice, _input_advice
    # a 2 ms step (a fast GPU's) beside tf.data's ~0.2 ms per batch: 9 % wait, 8 % of it the floor
    floor = {"wait_ms_mean": 0.18, "wait_fraction": 0.08, "steps": 20}
    [(gain, line)] = _input_advice(_advice_report(0.09, loader_bps=4000.0, step_sps=450.0, wait_floor=floor))
    assert gain == 0.09 and "one constant batch waited 8% (0.18 ms a step)" in line
    assert "tf.data's fixed cost" in line and "larger batch size" in line and "parallelise" not in line
    gpu = {"index": 0, "name": "Fake GPU", "util_mean": 40.0, "util_cv": 0.3, "mem_used_mb": 900.0}
    r = _advice_report(0.09, verdict="input_bound", wait_floor=floor, gpus=[gpu], host={"gpus": ["Fake GPU"]},
                       gpu_coverage={"fraction": 1.0}, gpu_sampling="1 GPU sampled", placement="single")
    assert "give each launch more work" in _gpu_advice(r)[0][1]
    # the loader adds 5 % or more beyond the floor, or the floor is under half the wait: the loader's
    for wait, fraction in ((0.14, 0.08), (0.12, 0.05)):
        [(_, line)] = _input_advice(_advice_report(wait, wait_floor={**floor, "wait_fraction": fraction}))
        assert "parallelise the map" in line and "fixed cost" not in line
        assert "feed it faster" in _gpu_advice({**r, "input_wait_fraction": wait,
                                                "wait_floor": {**floor, "wait_fraction": fraction}})[0][1]
    [(_, line)] = _input_advice(_advice_report(0.015, wait_floor={**floor, "wait_fraction": 0.012}))
    assert "waited 1.5% of the time (1.2% with one constant batch: tf.data's fixed cost per batch)" in line


def test_the_floor_loop_runs_the_real_step_on_one_constant_batch(pyfunc_report, heavy_report, tmp_path):
    # a Python map sleeping 20 ms a batch: the loop waits on it; one constant batch waits a fraction of that
    slow, clean = pyfunc_report["wait_floor"], heavy_report["wait_floor"]
    assert slow["steps"] == clean["steps"] == 10            # FLOOR_STEPS (diagnose.steps, 12 and 24, if fewer)
    assert slow["wait_ms_mean"] < 0.2 * pyfunc_report["combined"]["wait_ms_mean"]
    assert 0 < clean["wait_fraction"] < 0.05 and clean["wait_ms_mean"] > 0
    assert heavy_report["traces"] == 1                          # its batch's shape: no new trace
    write_report(heavy_report, tmp_path)
    md = (tmp_path / "diagnose.md").read_text()
    assert f"| real loop, one constant batch | | wait {clean['wait_ms_mean']:.2f} ms" in md
    assert json.loads((tmp_path / "diagnose.json").read_text())["wait_floor"]["steps"] == 10


def test_per_replica_batches_have_no_floor_and_a_note_says_why(monkeypatch):
    from tensorflow.python.distribute.values import PerReplica
    two = {"x": PerReplica((tf.ones([2]), tf.ones([2])))}  # what a two-replica strategy's iterator yields
    notes = []
    assert diagnose_mod.time_floor(two, _cheap_step(), steps=2, warmup=0, notes=notes) is None
    assert notes == ["The wait floor (one constant batch in the same loop) was not measured: the batches are "
                     "per-replica values of a distributed dataset."]
    # one replica: plain tensors, and the strategy's step runs on the constant batch like any other
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    ds = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(tf.ones([4, 8])).repeat())
    step = tf.function(lambda b: strategy.run(tf.reduce_mean, args=(b,)))
    r = diagnose(ds, step, steps=3, warmup=1)
    assert r["wait_floor"]["steps"] == 3 and r["wait_floor"]["wait_ms_mean"] > 0
    real = diagnose_mod.time_floor
    monkeypatch.setattr(diagnose_mod, "time_floor", lambda batch, *a, **k: real({"x": two["x"]}, *a, **k))
    r = diagnose(ds, step, steps=3, warmup=1)
    assert r["wait_floor"] is None and notes[0] in r["notes"] and notes[0] in r["recommendations"]


@pytest.mark.parametrize("key, value, says", [("warmup", 0, "0 is less than the minimum of 1"),
                                              ("steps", 1001, "1001 is greater than the maximum of 1000")])
def test_a_diagnose_warmup_of_0_or_more_steps_than_it_holds_is_refused_naming_the_key(key, value, says):
    # warmup 0 timed the loader's start-up as the first step's input wait (an input_bound verdict of its
    # own making); the step alone holds diagnose.steps batches on the device at once
    from pipeline import config
    with pytest.raises(config.ConfigError) as refused:
        config.load_config(None, {"diagnose": {key: value}}, check_paths=False)
    assert str(refused.value).endswith(f"diagnose.{key}: {says}") and "\n" not in str(refused.value), refused.value
