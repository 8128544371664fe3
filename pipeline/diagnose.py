"""Diagnose a training loop: is it input-bound, compute-bound or retracing?

Runs any tf.data.Dataset of batches and any step function three ways (loader alone, step alone on
the loader's first batches already on the device, the real loop with the wait for each batch timed
apart from the step), then the real loop fed by a dataset of one constant batch (the wait no
loader can go below: tf.data's fixed cost of handing a batch to Python), samples the utilisation
of the GPUs this process may use with NVML, scans the input graph for Python ops, counts step
traces and looks for cycles in the step times. A step of the real loop that traces (a first call
on a new batch shape) is left out of its timings unless the loop keeps retracing. `diagnose()`
returns the report dict (its fields are listed in docs/architecture.md);
pipeline/diagnose_report.py turns it into sentences and files.

Reads the config (`diagnose.steps`, `diagnose.warmup`, `diagnose.target`, `reports_dir`, `name`, and
through pipeline.train the whole `train:` section; with `diagnose.target: vocoder`, the vocoder's
segment loader and step from pipeline.vocoder.train and the `vocoder:` section instead); writes
{reports_dir}/{name}/diagnose.{json,md,png}.

    python -m pipeline.diagnose --config configs/config.yaml [--out DIR] [--set diagnose.steps=20]
    python -m pipeline.diagnose --config configs/config.yaml --set diagnose.target=vocoder
"""
import argparse
import collections
import sys
import time

import numpy as np
import tensorflow as tf

# compare_placements and write_report are public here too: `from pipeline.diagnose import ...`
from pipeline.diagnose_report import (
    MIN_GPU_COVERAGE,
    OSC_MIN_UTIL_SPREAD,
    compare_placements,
    cv,
    cycle_of_shapes,
    detect_oscillation,
    phase_medians,
    plural,
    recommend,
    report_paths,
    write_report,
)
from pipeline.errors import cli
from pipeline.gpumon import GpuSampler
from pipeline.graphscan import find_pyfunc_ops, pyfunc_line, scan_pyfunc_ops  # noqa: F401 (public here too)
from pipeline.placement import OnDevice, host_id

# --- verdict ------------------------------------------------------------------------------
INPUT_BOUND_WAIT = 0.05         # the TF profiler's input-pipeline analyzer: >= 5 % wait is "moderately" input-bound
HIGHLY_INPUT_BOUND_WAIT = 0.20  # ... and >= 20 % "highly" input-bound
RETRACE_SLACK = 1               # one trace beyond the shapes is normal: a first call that creates variables traces twice
FLOOR_STEPS = 10                # steps of the floor loop (one constant batch), at most diagnose.steps
# --- batches ------------------------------------------------------------------------------
def _walk(x, path=()):
    """(path, tensor) leaves of a batch; dict keys sorted, PerReplica values as 'replicaN'."""
    if isinstance(x, dict):
        for k in sorted(x, key=str):
            yield from _walk(x[k], path + (str(k),))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _walk(v, path + (str(i),))
    elif type(x).__name__ == "PerReplica":
        for i, v in enumerate(x.values):
            yield from _walk(v, path + (f"replica{i}",))
    else:
        yield path, x


def _dims(t):
    return [d if d is not None else -1 for d in getattr(t, "shape", ())]


def shape_key(batch):
    """A batch's shapes as one string, e.g. 'mel[16,400,80] mel_lengths[16] tokens[16,64] ...'."""
    parts = []
    for path, t in _walk(batch):
        dims = ",".join("?" if d < 0 else str(d) for d in _dims(t))
        parts.append(f"{'/'.join(path)}[{dims}]")
    return " ".join(parts)


def _batch_stats(batch):
    """(examples, bytes): the first tensor's leading dimension (summed over replicas), total nbytes."""
    leaves = list(_walk(batch))
    if not leaves:
        return 0, 0
    strip = lambda p: tuple(x for x in p if not x.startswith("replica"))  # noqa: E731
    first = strip(leaves[0][0])
    examples = sum((_dims(t) or [1])[0] for p, t in leaves if strip(p) == first)
    nbytes = 0
    for _, t in leaves:
        for part in tf.nest.flatten(t, expand_composites=True):  # ragged/sparse: their dense parts
            try:
                nbytes += int(np.prod(part.shape)) * part.dtype.size
            except (AttributeError, TypeError, ValueError):  # strings have no fixed size
                pass
    return max(examples, 0), nbytes


def _copied_to(device, batch):
    """The batch's tensors copied to `device`, anything else as it is."""
    with tf.device(device):
        return tf.nest.map_structure(lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, batch)


def _block(out):
    # GPU dispatch is asynchronous: a step has finished only once its outputs can be read
    for leaf in tf.nest.flatten(out, expand_composites=True):
        if hasattr(leaf, "numpy"):
            leaf.numpy()


class _Batches:
    """next() over fresh iterators from `make`, restarting at the end (an epoch boundary, so it stays timed)."""

    def __init__(self, make):
        self.make, self.restarts = make, 0
        self._it = make()

    def next(self):
        try:
            return next(self._it)
        except StopIteration:
            self._it, self.restarts = self.make(), self.restarts + 1
            try:
                return next(self._it)
            except StopIteration:
                raise ValueError("the dataset yields no batches") from None


# --- shapes -------------------------------------------------------------------------------
def _shape_bound(expected_shapes, shapes):
    """How many distinct batch shapes the step may legitimately see."""
    counts = collections.Counter(shapes)
    if expected_shapes is not None:
        return int(expected_shapes)
    # No bucket count given: if no new shape turned up in the second half, the set has saturated
    # (fixed buckets); otherwise only shapes that recur count, so a new shape per batch stays unexplained.
    half = len(shapes) // 2
    if set(shapes[half:]) <= set(shapes[:half]):
        return len(counts)
    return max(1, sum(c >= 2 for c in counts.values()))


# --- measurement --------------------------------------------------------------------------
def time_loader(make_iter, *, steps, warmup):
    """1. The loader alone: `steps` batches after `warmup`, nothing else running."""
    src = _Batches(make_iter)
    for _ in range(warmup):
        src.next()
    examples = nbytes = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        e, b = _batch_stats(src.next())
        examples, nbytes = examples + e, nbytes + b
    seconds = time.perf_counter() - t0
    return {"examples_per_s": examples / seconds, "batches_per_s": steps / seconds,
            "mb_per_s": nbytes / 1e6 / seconds, "batches": steps, "seconds": seconds}


def time_step_alone(make_iter, step_fn, *, steps, warmup, device):
    """2. The step alone on the mix of shapes the loop sees: `steps` batches taken up front and copied
    to `device` (no input wait possible), one untimed call on each distinct shape (first calls trace)
    and `warmup` more, then one timed call per batch.

    Returns (figures, the batches' shapes in order)."""
    src = _Batches(make_iter)
    batches = [src.next() for _ in range(steps)]
    if device:
        batches = [_copied_to(device, b) for b in batches]
    shapes = [shape_key(b) for b in batches]
    for s in dict.fromkeys(shapes):
        _block(step_fn(batches[shapes.index(s)]))
    for i in range(warmup):
        _block(step_fn(batches[i % steps]))
    alone = []
    for b in batches:
        t = time.perf_counter()
        _block(step_fn(b))
        alone.append(time.perf_counter() - t)
    alone_ms = 1e3 * np.asarray(alone)
    figures = {"steps_per_s": steps / float(np.sum(alone)), "step_ms_mean": float(alone_ms.mean()),
               "step_ms_median": float(np.median(alone_ms)), "step_ms_p90": float(np.percentile(alone_ms, 90)),
               "device": device, "batch_shape": shapes[0], "batch_shapes": dict(collections.Counter(shapes))}
    return figures, shapes


def time_loop(make_iter, step_fn, *, steps, warmup, sampler=None):
    """3. The real loop: the wait for each batch timed apart from its step, GPUs sampled meanwhile
    (`sampler`; None: none).

    Returns the per-step record: waits and computes (s), shapes, examples, traced (the step
    function's tracing count rose during the step), warmup_shapes, seconds, t0 (its start), notes."""
    tracing = getattr(step_fn, "experimental_get_tracing_count", lambda: 0)
    src, notes = _Batches(make_iter), []
    loop = {"waits": [], "computes": [], "shapes": [], "examples": [], "traced": [], "warmup_shapes": []}
    for _ in range(warmup):
        b = src.next()
        loop["warmup_shapes"].append(shape_key(b))
        _block(step_fn(b))
    if sampler:
        sampler.start()
    t0 = time.perf_counter()
    try:
        for _ in range(steps):
            t = time.perf_counter()
            b = src.next()
            before = tracing()
            t1 = time.perf_counter()
            _block(step_fn(b))
            t2 = time.perf_counter()
            loop["waits"].append(t1 - t)
            loop["computes"].append(t2 - t1)
            loop["traced"].append(tracing() > before)
            loop["shapes"].append(shape_key(b))
            loop["examples"].append(_batch_stats(b)[0])
        loop["batch"] = b  # the last batch: time_floor's
    finally:
        seconds = time.perf_counter() - t0
        if sampler:
            sampler.stop()
    if src.restarts:
        notes.append(f"The dataset ended {src.restarts} time(s) during the real loop; restarts were timed as waits.")
    return {**loop, "seconds": seconds, "t0": t0, "notes": notes}


def _distributed(batch):
    return any(isinstance(leaf, tf.distribute.DistributedValues) for leaf in tf.nest.flatten(batch))


def time_floor(batch, step_fn, *, steps, warmup, notes):
    """4. The floor: the real loop (time_loop) fed by a dataset of one constant batch (`batch`, copied
    to the host), which does no work per batch. Its wait is tf.data's fixed cost of handing a batch to Python
    after a step (cold caches, a thread's wake-up): no loader, however fast, waits less in this loop.

    Returns {wait_ms_mean, wait_fraction, steps}, or None for a distributed batch (per-replica values:
    its dataset is the strategy's to build), with a line in `notes` saying so."""
    if _distributed(batch):
        notes.append("The wait floor (one constant batch in the same loop) was not measured: the batches are "
                     "per-replica values of a distributed dataset.")
        return None
    constant = tf.data.Dataset.from_tensors(_copied_to("/CPU:0", batch)).repeat().prefetch(1)
    loop = time_loop(lambda: iter(constant), step_fn, steps=steps, warmup=warmup)
    return {"wait_ms_mean": 1e3 * float(np.mean(loop["waits"])),
            "wait_fraction": float(np.sum(loop["waits"]) / loop["seconds"]), "steps": steps}


def loop_figures(loop, retracing):
    """The real loop's figures (the `combined` report field) and notes on the steps left out.

    A step during which the step function traced (a first call on a new batch shape: a trace, and
    with XLA a compile, of seconds) is no step training repeats, so it is left out of every figure,
    unless the loop keeps retracing (then the traces are what training pays) or every step traced."""
    traced = np.asarray(loop["traced"], dtype=bool)
    keep, notes = ~traced, []
    if traced.any() and retracing:
        keep[:] = True
        notes.append(f"Kept in the real loop's figures: {plural(int(traced.sum()), 'step')} during which the step "
                     f"function traced, since it keeps retracing and those traces are what training pays.")
    elif traced.all():
        keep[:] = True
        notes.append(f"Every step of the real loop ({len(traced)}) traced the step function (a first call on a batch "
                     f"shape), so none was left out and the loop's figures include tracing: raise diagnose.steps to "
                     f"measure steps that only compute.")
    waits, computes = np.asarray(loop["waits"]), np.asarray(loop["computes"])
    left_out_s = float((waits + computes)[~keep].sum())
    if not keep.all():
        notes.append(f"Left out of the real loop's figures: {plural(int((~keep).sum()), 'step')} during which the step "
                     f"function traced (a first call on a batch shape, {left_out_s:.2f} s in all); training traces "
                     f"each shape once.")
    seconds = loop["seconds"] - left_out_s
    waits_ms, computes_ms = 1e3 * waits[keep], 1e3 * computes[keep]
    combined = {"steps_per_s": int(keep.sum()) / seconds, "seconds": seconds,
                "examples_per_s": int(np.asarray(loop["examples"])[keep].sum()) / seconds,
                "wait_ms_mean": float(waits_ms.mean()), "compute_ms_mean": float(computes_ms.mean()),
                "step_times_ms": (waits_ms + computes_ms).tolist(), "wait_times_ms": waits_ms.tolist(),
                "compute_times_ms": computes_ms.tolist(), "loop_seconds": loop["seconds"],
                "traced_steps": int(traced.sum()), "traced_steps_left_out": int((~keep).sum()),
                "input_wait_fraction": float(waits_ms.sum() / 1e3 / seconds) if seconds > 0 else 0.0}
    return combined, [s for s, k in zip(loop["shapes"], keep) if k], notes


def find_oscillation(walls_ms, gpus, interval_s):
    """(period in steps or None, sources): cycles in the step times or in any GPU's utilisation."""
    period = detect_oscillation(walls_ms)
    sources = [f"step times (period {period} steps)"] if period else []
    for g in gpus:
        p = detect_oscillation(g["util_series"], min_rel=0.0, min_abs=OSC_MIN_UTIL_SPREAD)
        g["oscillation_period_s"] = p * interval_s if p else None
        if p:
            sources.append(f"GPU {g['index']} utilisation (period {p * interval_s:.1f} s)")
    return period, sources


def check_traces(traces, shapes, expected_shapes):
    """Traces against the distinct batch shapes the step saw: (retracing?, bound, {shape: count}, extra shapes)."""
    counts = collections.Counter(shapes)
    bound = _shape_bound(expected_shapes, shapes)
    retracing = traces is not None and traces > bound + RETRACE_SLACK
    extra = sorted(counts, key=lambda s: (counts[s], shapes.index(s)))[:max(0, len(counts) - bound)]
    return retracing, bound, counts, extra


def verdict_of(retracing, wait_fraction, loader, step):
    """retracing beats everything; then a loop that waits (or a loader slower than the step) is input-bound."""
    if retracing:
        return "retracing"
    if wait_fraction >= INPUT_BOUND_WAIT or loader["batches_per_s"] < step["steps_per_s"]:
        return "input_bound"
    return "compute_bound"


THRESHOLDS = {"input_bound_wait": INPUT_BOUND_WAIT, "highly_input_bound_wait": HIGHLY_INPUT_BOUND_WAIT,
              "retrace_slack": RETRACE_SLACK, "min_gpu_coverage": MIN_GPU_COVERAGE}


def _oscillation_fields(walls_ms, period, sources, shapes):
    return {"oscillation": bool(sources), "oscillation_period": period,
            "oscillation_phase_ms": phase_medians(walls_ms, period) if period else None,
            "oscillation_sources": sources,
            "oscillation_by_shape": cycle_of_shapes(walls_ms, shapes) if period else None}


def _gpu_sampling(sampler, gpus, coverage):
    """One line on what was sampled: how many GPUs, how often, how much of the loop, why it stopped."""
    if not gpus:
        return getattr(sampler, "reason", None) or "NVML found no GPU"
    line = (f"{plural(len(gpus), 'GPU')} sampled every {sampler.interval_s:g} s: {plural(coverage['samples'], 'sample')} "
            f"covering {coverage['seconds']:.2f} s of the {coverage['loop_seconds']:.2f} s loop "
            f"({coverage['fraction']:.0%})")
    stopped = getattr(sampler, "stopped", None)
    return f"{line}; {stopped}" if stopped else line


def _gpu_figures(sampler, loop):
    """(the sampled GPUs, how much of the loop their samples cover, the host, the GPUs whose series
    count for the loop): a GPU's cycle is the loop's only on a GPU TensorFlow uses (the host's GPUs:
    NVML's others are no GPUs of this loop), and only seen in samples of most of the loop."""
    gpus = sampler.summary(t0=loop["t0"])
    coverage = sampler.coverage(loop["t0"], loop["t0"] + loop["seconds"]) if gpus else None
    host = host_id()
    loop_gpus = gpus if host["gpus"] and coverage and coverage["fraction"] >= MIN_GPU_COVERAGE else []
    return gpus, coverage, host, loop_gpus


def diagnose(dataset, step_fn, *, steps, warmup, device=None, expected_shapes=None,
             gpu_sampler=None, placement=None, context=None, batches=None):
    """Measure loader, step and the real loop; return the report dict (fields in docs/architecture.md).

    device: where the step-alone batches are copied first; expected_shapes: bucket shapes (traces
    beyond them + RETRACE_SLACK are retracing); gpu_sampler: a started-on-demand GpuSampler
    (default: NVML); context: placement facts for the advice (jit_compile, mixed_precision,
    copy_ms); batches: a callable returning the training loop's own batch iterator for the real
    loop (e.g. one that copies each batch to the model device a step ahead); default iter(dataset).
    """
    assert steps >= 1 and warmup >= 0, f"steps={steps} must be >= 1 and warmup={warmup} >= 0"
    tracing = getattr(step_fn, "experimental_get_tracing_count", None)
    traces_before = tracing() if tracing else None
    raw = lambda: iter(dataset)  # noqa: E731
    sampler = gpu_sampler if gpu_sampler is not None else GpuSampler()

    loader = time_loader(raw, steps=steps, warmup=warmup)  # its prefetch threads are gone before the step runs
    step, step_shapes = time_step_alone(raw, step_fn, steps=steps, warmup=warmup, device=device)
    loop = time_loop(batches or raw, step_fn, steps=steps, warmup=warmup, sampler=sampler)
    floor = time_floor(loop.pop("batch"), step_fn, steps=min(steps, FLOOR_STEPS), warmup=min(warmup, 2),
                       notes=loop["notes"])
    traces = tracing() if tracing else None
    retracing, bound, counts, extra = check_traces(traces, [*step_shapes, *loop["warmup_shapes"], *loop["shapes"]],
                                                   expected_shapes)
    combined, kept_shapes, trace_notes = loop_figures(loop, retracing)
    wait_fraction = combined.pop("input_wait_fraction")
    walls_ms = np.asarray(combined["step_times_ms"])
    gpus, coverage, host, loop_gpus = _gpu_figures(sampler, loop)
    period, osc_sources = find_oscillation(walls_ms, loop_gpus, sampler.interval_s)
    pyfuncs = scan_pyfunc_ops(dataset)

    report = {
        "verdict": verdict_of(retracing, wait_fraction, loader, step),
        "input_wait_fraction": wait_fraction,
        "wait_floor": floor,
        "loader": loader,
        "step": step,
        "combined": combined,
        "pyfunc_ops": [pyfunc_line(e) for e in pyfuncs],
        "pyfunc_locations": pyfuncs,
        "step_time_cv": cv(walls_ms),
        **_oscillation_fields(walls_ms, period, osc_sources, kept_shapes),
        "traces": traces,
        "traces_during_diagnose": traces - traces_before if traces is not None else None,
        "expected_shapes": expected_shapes,
        "trace_bound": bound + RETRACE_SLACK, "trace_shapes": dict(counts),
        "retrace_shapes": extra[:10],
        "gpus": gpus,
        "gpu_sampling": _gpu_sampling(sampler, gpus, coverage),
        "gpu_coverage": coverage,
        # train.placement: auto trusts this report's placements on this host only
        "host": host,
        "placement": placement, "device": device,
        "context": dict(context or {}),
        "steps": steps, "warmup": warmup,
        "thresholds": dict(THRESHOLDS),
        "notes": loop["notes"] + trace_notes + list(getattr(sampler, "notes", [])),
    }
    report["recommendations"] = recommend(report)
    return report


# --- command line -------------------------------------------------------------------------
def _diagnose_trainer(cfg, placement):
    from pipeline.train import build_trainer  # heavy: the model; only the CLI needs it
    trainer = build_trainer(cfg, placement=placement)
    if hasattr(trainer, "measure_copy"):  # split: fills context()["copy_ms"]
        trainer.measure_copy()
    d = cfg["diagnose"]
    return diagnose(trainer.dataset, trainer.step, steps=d["steps"], warmup=d["warmup"],
                    device=trainer.model_device, expected_shapes=trainer.n_buckets,
                    placement=trainer.placement, context=trainer.context(),
                    batches=getattr(trainer, "batches", None))


def _diagnose_vocoder(cfg):
    """diagnose.target: vocoder: the segment loader and the vocoder's compiled step (the GAN step when
    vocoder.gan_start_step is 0, else the spectral one), on the placement's first device."""
    from pipeline.vocoder.train import VocoderTrainer
    trainer = VocoderTrainer(cfg)
    gan = cfg["vocoder"]["gan_start_step"] == 0
    # as training calls it (VocoderTrainer.step): a tf.function's ops go where it is called
    step_fn = OnDevice(trainer.gan_step if gan else trainer.spectral_step, trainer.device)
    d = cfg["diagnose"]
    report = diagnose(trainer.dataset("train"), step_fn, steps=d["steps"], warmup=d["warmup"],
                      device=trainer.device, expected_shapes=1, placement=trainer.p.name,
                      context={"jit_compile": trainer.p.jit_compile, "mixed_precision": trainer.p.mixed_precision})
    report["target"] = "vocoder"
    report["vocoder_step"] = "gan" if gan else "spectral"
    return report


@cli
def main(argv=None):
    from pipeline import config, files
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--out", default=None, help="report folder (default: {reports_dir}/{name})")
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    out = args.out or config.report_dir(cfg)
    files.check_folder(out)  # before minutes of profiling, not after
    report_paths(out, "--out")  # a folder where diagnose.png goes, too

    vocoder = cfg["diagnose"]["target"] == "vocoder"
    report = _diagnose_vocoder(cfg) if vocoder else _diagnose_trainer(cfg, None)
    n_gpus = len(tf.config.list_logical_devices("GPU"))  # what pipeline.placement counts
    if vocoder:
        sentences = ["Placements were not compared: the vocoder trains on one device."]
    elif n_gpus >= 2:
        results = {report["placement"]: report}
        for name in ("mirrored", "split"):
            if name not in results:
                results[name] = _diagnose_trainer(cfg, name)
        sentences = compare_placements(results)
        report["placements"] = {name: {"verdict": r["verdict"], "steps_per_s": r["combined"]["steps_per_s"],
                                       "input_wait_fraction": r["input_wait_fraction"]}
                                for name, r in results.items()}
        best = max(results, key=lambda name: results[name]["combined"]["steps_per_s"])
        # a better placement than the one in use is worth more than tuning the current one
        if best != report["placement"]:
            report["recommendations"] = sentences + report["recommendations"]
        else:
            report["recommendations"] = report["recommendations"] + sentences
    else:
        sentences = [f"Placements were not compared: TensorFlow sees {'one GPU' if n_gpus == 1 else 'no GPU'}, "
                     f"and 'split' and 'mirrored' need two or more."]
    report["placement_comparison"] = sentences
    report["config_name"] = cfg["name"]

    paths = write_report(report, out)
    print(f"verdict: {report['verdict']} (input wait {report['input_wait_fraction']:.1%}, "
          f"{report['combined']['steps_per_s']:.2f} steps/s)")
    for line in report["recommendations"]:
        print(f"- {line}")
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)


if __name__ == "__main__":
    main()
