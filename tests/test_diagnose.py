"""pipeline.diagnose on planted pipelines: real tf.data loaders and tf.functions, on the CPU.

    python -m pytest -q tests/test_diagnose.py
"""
import json
import sys
import time
import types

import numpy as np
import pytest
import tensorflow as tf
from conftest import write_config

from pipeline import diagnose as diagnose_mod
from pipeline.diagnose import compare_placements, diagnose, find_pyfunc_ops
from pipeline.diagnose_report import cycle_of_shapes, detect_oscillation, write_report
from pipeline.gpumon import GpuSampler

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
    """pynvml's function names over fixed per-GPU series; records what it hands out."""

    class NVMLError(Exception):
        pass

    def __init__(self, util, mem_mb, fail_init=False):
        super().__init__("fake_nvml")
        self.util, self.mem, self.fail_init = util, mem_mb, fail_init
        self.emitted_util = [[] for _ in util]
        self.emitted_mem = [[] for _ in util]
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

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"  # old pynvml returns bytes

    def nvmlDeviceGetUtilizationRates(self, h):
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


@pytest.mark.parametrize("expected", [3, None])
def test_three_bucket_shapes_are_not_retracing(expected):
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.zeros(tf.stack([4 * (i % 3 + 1), 4])))
    r = diagnose(ds, _cheap_step(), steps=12, warmup=2, expected_shapes=expected)
    assert r["traces"] == 3 and len(r["trace_shapes"]) == 3
    assert r["verdict"] != "retracing"


def test_gpu_sampler_matches_numpy_on_known_series():
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


def test_gpu_sampler_without_nvml_never_crashes():
    s = GpuSampler(nvml=FakeNVML([[1]], [[1]], fail_init=True)).start()
    s.stop()
    assert s.available is False and "Driver Not Loaded" in s.reason and s.summary() == []


@pytest.mark.skipif(_nvml_works(), reason="this machine has an NVIDIA driver")
def test_real_no_nvml_path(pyfunc_report):
    assert pyfunc_report["gpus"] == []
    assert any(s.startswith("NVML found no GPU") for s in pyfunc_report["recommendations"])


def test_fake_gpus_in_diagnose_and_report_files(tmp_path, pyfunc_report):
    fake = FakeNVML([[30, 40, 35], [0, 0, 0]], [[900, 950, 1000], [10, 10, 10]])
    ds = tf.data.Dataset.range(1000).map(lambda i: tf.fill([4, 8], tf.cast(i, tf.float32))).prefetch(2)
    r = diagnose(ds, _cheap_step(), steps=20, warmup=2, device="/GPU:0", placement="single",
                 gpu_sampler=GpuSampler(interval_s=0.005, nvml=fake),
                 context={"placement": "single", "jit_compile": False, "mixed_precision": "off", "copy_ms": None})
    assert [g["index"] for g in r["gpus"]] == [0, 1]
    assert r["gpus"][0]["util_mean"] == pytest.approx(np.mean(fake.emitted_util[0]))
    assert any(s.startswith("GPU 0 (Fake GPU) utilisation") for s in r["recommendations"])
    assert any("Mixed precision is off" in s for s in r["recommendations"])
    assert not any("NVML found no GPU" in s for s in r["recommendations"])

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
