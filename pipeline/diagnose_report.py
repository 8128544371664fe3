"""Diagnose report: cycle detection, recommendations in plain sentences, diagnose.{json,md,png}.

pipeline/diagnose.py measures; this module interprets and writes. Reads the report dict that
pipeline.diagnose.diagnose() builds (no config keys); writes
diagnose.json (every field), diagnose.md (a short human report) and diagnose.png (step and wait
times of the real loop, GPU utilisation) into one folder, each file atomically.

    python -m pipeline.diagnose --config configs/config.yaml     # measures, then calls write_report
"""
import io
import json
import math
from pathlib import Path

import numpy as np

from pipeline.files import atomic_write_bytes, target

# --- oscillation --------------------------------------------------------------------------
OSC_MIN_SAMPLES = 8         # fewer points cannot show four cycles of even period 2
OSC_MIN_ACF = 0.5           # autocorrelation at the period, and the depth of the trough before it
OSC_MIN_R2 = 0.5            # variance the per-phase means explain (adjusted): lone spikes k apart fail this
OSC_MIN_REL = 0.10          # step times: phase medians closer than 10 % of the median are CPU noise
OSC_MIN_UTIL_SPREAD = 10.0  # GPU utilisation: phase medians closer than 10 points are NVML noise
# --- sentences ----------------------------------------------------------------------------
LOW_GPU_UTIL = 80.0        # % mean: below this the GPU idles enough to be worth a sentence
MIN_GPU_COVERAGE = 0.5     # GPU samples spanning less of the loop than this say too little to advise on
COPY_SHARE = 0.05          # a host-to-device copy above 5 % of the loop's time per step is worth hiding
SAME_SPEED = 0.05          # placements within 5 % are a tie
_VERDICTS = {"input_bound": "waits for its input", "compute_bound": "is limited by the step itself",
             "retracing": "keeps retracing the step"}


def cv(x):
    """Coefficient of variation (population std / mean); 0 for an empty or zero-mean series."""
    x = np.asarray(x, dtype=float)
    return float(x.std() / x.mean()) if len(x) and x.mean() > 0 else 0.0


def phase_medians(series, period):
    """Median of every phase t % period: the shape of one cycle, blind to a stray spike."""
    x = np.asarray(series, dtype=float)
    return [float(np.median(x[p::period])) for p in range(period)]


def _drop_outliers(x):
    # beyond Tukey's fences -> the median: one 100 ms stall must not own the variance, while the
    # two levels of a cycle stay inside the fences
    q1, q3 = np.percentile(x, [25, 75])
    inside = (x >= q1 - 1.5 * (q3 - q1)) & (x <= q3 + 1.5 * (q3 - q1))
    return np.where(inside, x, np.median(x))


def _cycle(d):
    """Smallest lag k >= 2 at which d cycles (see detect_oscillation), or None."""
    n = len(d)
    d = d - d.mean()
    var = float((d * d).sum())
    if var == 0:
        return None
    max_lag = n // 4  # at least four cycles: with three, noise at long lags passes too often
    acf = [1.0] + [float((d[:-k] * d[k:]).sum() / var) for k in range(1, max_lag + 2)]
    for k in range(2, max_lag + 1):
        peak = acf[k] >= OSC_MIN_ACF and acf[k] >= acf[k - 1] and acf[k] >= acf[k + 1]
        if not peak or min(acf[1:k]) > acf[k] - OSC_MIN_ACF:
            continue
        fitted = np.asarray([d[p::k].mean() for p in range(k)])[np.arange(n) % k]
        r2 = 1.0 - float(((d - fitted) ** 2).sum()) / var
        if 1.0 - (1.0 - r2) * (n - 1) / (n - k) >= OSC_MIN_R2:  # adjusted for k fitted means
            return k
    return None


def detect_oscillation(series, *, min_rel=OSC_MIN_REL, min_abs=0.0):
    """Period (in samples) of a cycle in `series`, or None.

    A cycle needs an autocorrelation peak >= OSC_MIN_ACF at a lag k >= 2 with a trough OSC_MIN_ACF
    deeper at a shorter lag (a trend has none), per-phase means that explain most of the variance
    (two lone spikes k apart do not), and phase medians apart by min_rel of the median and by
    min_abs. Tried on the raw series (a spike every 10 steps is a cycle) and with outliers replaced
    (one 100 ms stall must not hide a cycle).
    """
    x = np.asarray(series, dtype=float)
    if len(x) < OSC_MIN_SAMPLES or x.std() == 0:
        return None
    for candidate in (x, _drop_outliers(x)):
        k = _cycle(candidate)
        if k is None:
            continue
        phases = phase_medians(x, k)
        spread = max(phases) - min(phases)
        if spread >= min_abs and spread >= min_rel * abs(float(np.median(x))):
            return k
    return None


def shape_medians(series, shapes):
    """{batch shape: median of `series` over the steps that had it}."""
    x = np.asarray(series, dtype=float)
    return {s: float(np.median(x[[i for i, t in enumerate(shapes) if t == s]])) for s in dict.fromkeys(shapes)}


def cycle_of_shapes(series, shapes):
    """{batch shape: median ms} when a cycle in the step times `series` is the batches' shapes taking
    turns (a bucketed loader: a bigger bucket's step takes longer), i.e. when no cycle is left once each
    step's shape median is taken out; None with one shape, or when a cycle of its own remains."""
    if len(set(shapes)) < 2 or len(shapes) != len(series):
        return None
    x = np.asarray(series, dtype=float)
    by_shape = shape_medians(x, shapes)
    rest = x - np.asarray([by_shape[s] for s in shapes]) + float(np.median(x))
    return None if detect_oscillation(rest) else by_shape


def plural(n, word):
    return f"{n} {word}{'' if n == 1 else 's'}"


def _off(value):
    # None means "not told", not "off"
    return value is False or (isinstance(value, str) and value.lower() in ("off", "false", "none"))


def _tf_sees_gpu(r, device=None):
    # the GPUs TensorFlow sees (report["host"]); a report without them: whether any GPU was sampled
    # (or `device`, the step's, names one)
    host = r.get("host") or {}
    return bool(host["gpus"]) if "gpus" in host else bool(r["gpus"]) or "GPU" in str(device or "").upper()


def _gpu_label(g):
    # TensorFlow's number, and NVML's where it differs
    nvml = g.get("nvml_index", g["index"])
    return f"GPU {g['index']}" + (f" (NVML GPU {nvml})" if nvml != g["index"] else "")


def _input_bound(r):
    """The loop waits for its loader: not when the wait is tf.data's fixed cost per batch (_fixed_cost)."""
    w, threshold = r["input_wait_fraction"], r["thresholds"]["input_bound_wait"]
    return (r["verdict"] == "input_bound" or w >= threshold) and not _fixed_cost(w, r.get("wait_floor"), threshold)


def _retrace_advice(r):
    """Retracing: too many batch shapes, or retraces from something else."""
    recs = []
    if r["verdict"] == "retracing":
        n_shapes, expected = len(r["trace_shapes"]), r["expected_shapes"]
        given = plural(expected, "bucket shape") if expected is not None else \
            plural(r["trace_bound"] - 1, "recurring shape")
        if n_shapes > r["trace_bound"] - 1:
            shown = "; ".join(r["retrace_shapes"][:3])
            recs.append((10.0, f"Step traced {r['traces']} times for {given} ({n_shapes} distinct batch shapes "
                               f"reached it, e.g. {shown}): bound the batch shapes (bucketing with fixed per-bucket "
                               f"shapes: group_by_window + padded_batch) or give the tf.function an input_signature; "
                               f"every trace, and every XLA compile, costs seconds."))
        else:
            recs.append((10.0, f"Step traced {r['traces']} times although only {plural(n_shapes, 'batch shape')} "
                               f"reached it: the retraces come from something else (Python numbers or new objects "
                               f"passed as arguments, changing dtypes, or a new tf.function built per call)."))
    return recs


def _pyfunc_advice(r):
    """Python ops in the input graph."""
    recs = []
    w, input_bound = r["input_wait_fraction"], _input_bound(r)
    if r["pyfunc_ops"]:
        where = " and ".join(f"{e['transformation']} ({e['op']})" for e in r["pyfunc_locations"])
        recs.append((w + 0.01 if input_bound else 0.01,
                     f"The input graph calls Python in {where}: move that work into the cache rule or rewrite it "
                     f"with TensorFlow ops; Python ops hold the GIL, so parallel map calls cannot overlap them."))
    return recs


def _input_advice(r):
    """How much the loop waited for input, and the loader's margin over the step."""
    recs = []
    w = r["input_wait_fraction"]
    loader_bps, step_sps = r["loader"]["batches_per_s"], r["step"]["steps_per_s"]
    ratio = loader_bps / step_sps if step_sps else float("inf")
    waits_much = w >= r["thresholds"]["input_bound_wait"]
    floor = r.get("wait_floor")
    if waits_much and _fixed_cost(w, floor, r["thresholds"]["input_bound_wait"]):
        recs.append((w, f"The loop waited for input {w:.0%} of the wall time, but the same step fed one constant "
                        f"batch waited {floor['wait_fraction']:.0%} ({floor['wait_ms_mean']:.2f} ms a step): that is "
                        f"tf.data's fixed cost of handing each batch to Python, not this loader's, which delivers "
                        f"{ratio:.1f}x what the step consumes. Parallel maps and prefetching cannot remove it; fewer, "
                        f"longer steps can (a larger batch size)."))
    elif waits_much:
        level = "highly" if w >= r["thresholds"]["highly_input_bound_wait"] else "moderately"
        recs.append((w, f"The loop waited for input {w:.0%} of the wall time ({level} input-bound by the TF "
                        f"profiler's measure); the loader alone delivers {loader_bps:.1f} batches/s against "
                        f"{step_sps:.1f} steps/s for the step alone ({ratio:.2f}x), and removing the wait would make "
                        f"training up to {1 / max(1 - w, 1e-6):.2f}x faster: parallelise the map "
                        f"(num_parallel_calls=tf.data.AUTOTUNE), prefetch, or move the work into the cache."))
    elif ratio < 1:
        recs.append((1 - ratio, f"The loader alone delivers only {ratio:.2f}x what the step consumes "
                                f"({loader_bps:.1f} batches/s against {step_sps:.1f} steps/s): a faster step will "
                                f"soon wait for input."))
    else:
        floor_words = (f" ({floor['wait_fraction']:.1%} with one constant batch: tf.data's fixed cost per batch)"
                       if floor else "")
        recs.append((0.02, f"The loader alone delivers {ratio:.1f}x what the step consumes and the loop waited "
                           f"{w:.1%} of the time{floor_words}: training is not input-bound; speed up the step itself."))
    return recs


def _fixed_cost(wait, floor, threshold):
    """Whether the loop's wait is mostly tf.data's fixed cost per batch: the floor (one constant batch in
    the same loop) is at least half of it, and what the loader adds stays below the input-bound threshold."""
    return bool(floor) and floor["wait_fraction"] >= wait / 2 and wait - floor["wait_fraction"] < threshold


def _oscillation_advice(r):
    """Cycles in the step times: from the input or from the step itself."""
    recs = []
    w = r["input_wait_fraction"]
    by_shape = r.get("oscillation_by_shape")
    if r["oscillation_period"] and by_shape:  # the buckets taking turns: no cost to remove, so no gain
        ms = sorted(by_shape.values())
        recs.append((0.0, f"Step wall times cycle with a period of {r['oscillation_period']} steps because the "
                          f"loader takes its {len(ms)} batch shapes (buckets) in turn: the steps of each shape take "
                          f"a median {', '.join(f'{m:.1f}' for m in ms)} ms. A bigger bucket costs more; nothing "
                          f"else runs every few steps."))
    elif r["oscillation_period"]:
        p, phases = r["oscillation_period"], r["oscillation_phase_ms"]
        waits = np.asarray(r["combined"]["wait_times_ms"])
        computes = np.asarray(r["combined"]["compute_times_ms"])
        from_input = np.ptp(phase_medians(waits, p)) >= np.ptp(phase_medians(computes, p))
        gain = (np.mean(phases) - min(phases)) / np.mean(phases)
        if from_input:  # the same time the input sentence already counts: a symptom, listed after it
            gain = min(gain, w) - 0.001
        cause = ("the wait for input cycles: batches arrive unevenly, so prefetch (tf.data.AUTOTUNE) to let slow "
                 "batches overlap the step and look for work done every few batches" if from_input else
                 f"the step itself cycles: something runs every {p} steps (logging, summaries, host syncs); move "
                 f"it off the hot path or do it less often")
        recs.append((gain, f"Step wall times cycle with a period of {p} steps (phase medians "
                           f"{', '.join(f'{m:.1f}' for m in phases)} ms, CV {r['step_time_cv']:.2f}): {cause}."))
    return recs


def _gpu_advice(r):
    """Idle or under-used GPUs, cycling utilisation; or why the samples cannot say."""
    recs = []
    input_bound = _input_bound(r)
    if not r["gpus"]:
        return [(0.0, f"GPU utilisation was not sampled: {r['gpu_sampling']}.")]
    if not _tf_sees_gpu(r):  # the loop ran on the CPU: the GPUs' load is other processes'
        return [(0.3, f"TensorFlow sees no GPU, yet NVML lists {plural(len(r['gpus']), 'GPU')} this process may use, "
                      f"so the loop ran on the CPU and their utilisation is other processes': if training should use "
                      f"them, install a TensorFlow with CUDA support (tf.config.list_physical_devices('GPU') is "
                      f"empty).")]
    minimum = r["thresholds"]["min_gpu_coverage"]
    if (r.get("gpu_coverage") or {}).get("fraction", 1.0) < minimum:
        return [(0.0, f"GPU utilisation was not judged: the samples span under {minimum:.0%} of the loop "
                      f"({r['gpu_sampling']}), too little to call a GPU idle or busy.")]
    for g in r["gpus"]:
        if g.get("oscillation_period_s"):
            recs.append((0.05, f"{_gpu_label(g)} utilisation cycles every {g['oscillation_period_s']:.2g} s: the GPU "
                               f"alternates between busy and idle, usually because batches arrive in bursts; a deeper "
                               f"prefetch buffer smooths it."))
        if g["util_mean"] is not None and g["util_mean"] < 1:
            why = (f"placement '{r['placement']}' should use it: check train.data_device / train.model_device"
                   if r.get("placement") in ("split", "mirrored") else
                   f"placement '{r.get('placement')}' leaves it out; 'mirrored' or 'split' would use it")
            recs.append((0.5, f"{_gpu_label(g)} ({g['name']}) was idle during the loop (0 % utilisation, "
                              f"{g['mem_used_mb']:.0f} MB used): {why}."))
        elif g["util_mean"] is not None and g["util_mean"] < LOW_GPU_UTIL:
            why = ("feed it faster (see the input advice above)" if input_bound else
                   "give each launch more work: a larger batch, XLA (jit_compile) or mixed precision")
            recs.append((0.5 * (1 - g["util_mean"] / 100), f"{_gpu_label(g)} ({g['name']}) utilisation "
                         f"{g['util_mean']:.0f} % mean with CV {g['util_cv']:.2f}: it idles "
                         f"{100 - g['util_mean']:.0f} % of the time; {why}."))
    return recs


def _precision_advice(r):
    """Mixed precision and XLA left off on a GPU."""
    recs = []
    ctx = r.get("context") or {}
    on_gpu = _tf_sees_gpu(r, r.get("device"))
    if on_gpu and _off(ctx.get("mixed_precision", "unknown")):
        recs.append((0.2, "Mixed precision is off on a GPU: train.mixed_precision: bfloat16 (Ampere or newer) "
                          "or float16 typically makes a step 1.5-3x faster on tensor cores."))
    if on_gpu and "jit_compile" in ctx and _off(ctx["jit_compile"]):
        recs.append((0.15, "XLA is off (jit_compile false): set train.jit_compile: true once the batch shapes are "
                           "bounded; it fuses the step's many small ops."))
    return recs


def _copy_advice(r):
    """The split placement's batch copy, when it takes a large share of a step."""
    recs = []
    ctx = r.get("context") or {}
    copy_ms = ctx.get("copy_ms")
    wall_ms = r["combined"]["wait_ms_mean"] + r["combined"]["compute_ms_mean"]
    if copy_ms and wall_ms and copy_ms / wall_ms >= COPY_SHARE:
        recs.append((copy_ms / wall_ms, f"Copying a batch to the model device takes {copy_ms:.1f} ms, "
                                        f"{copy_ms / wall_ms:.0%} of the {wall_ms:.1f} ms each step of the loop takes "
                                        f"(placement '{ctx.get('placement', r.get('placement'))}'): prefetch it to "
                                        f"that device (prefetch_to_device as the last transformation) or compare "
                                        f"'mirrored'."))
    return recs


ADVICE = (_retrace_advice, _pyfunc_advice, _input_advice, _oscillation_advice, _gpu_advice, _precision_advice,
          _copy_advice)


def recommend(r):
    """Sentences for a diagnose report, ordered by expected gain (a rough share of wall time)."""
    recs = [rec for advice in ADVICE for rec in advice(r)]
    recs += [(0.0, note) for note in r.get("notes", [])]
    recs.sort(key=lambda gs: -gs[0])  # stable: equal gains keep the order above
    return [s for _, s in recs]


def compare_placements(results):
    """Which placement to use, from diagnose reports keyed by placement name ('split', 'mirrored')."""
    rows = {name: r for name, r in results.items() if r}
    if len(rows) < 2:
        return [f"Placements were not compared: only {', '.join(map(repr, rows)) or 'none'} was measured."]
    # examples/s, not steps/s, when known: a placement may put more examples in one step
    unit = "examples_per_s" if all("examples_per_s" in r["combined"] for r in rows.values()) else "steps_per_s"
    ranked = sorted(rows, key=lambda name: rows[name]["combined"][unit], reverse=True)
    (best, b), (second, s) = [(n, rows[n]) for n in ranked[:2]]
    speed = b["combined"][unit] / max(s["combined"][unit], 1e-12)
    numbers = (f"{b['combined']['steps_per_s']:.2f} steps/s in the real loop against "
               f"{s['combined']['steps_per_s']:.2f} for '{second}' ({speed:.2f}x the {unit.replace('_per_s', '')}/s), "
               f"input wait {b['input_wait_fraction']:.0%} against {s['input_wait_fraction']:.0%}")
    if speed < 1 + SAME_SPEED:
        out = [f"Placements '{best}' and '{second}' are within {SAME_SPEED:.0%} of each other ({numbers}): "
               f"either works; 'mirrored' keeps every GPU busy as the model grows."]
    else:
        out = [f"Use placement '{best}' (train.placement: {best}): {numbers}."]
    for name in ranked:
        if rows[name]["verdict"] != "compute_bound":
            out.append(f"Under '{name}' the loop {_VERDICTS.get(rows[name]['verdict'], rows[name]['verdict'])} "
                       f"(input wait {rows[name]['input_wait_fraction']:.0%}).")
    return out


# --- files --------------------------------------------------------------------------------
def _json_safe(x):
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, np.ndarray):
        return _json_safe(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None  # JSON has no NaN or Infinity
    if x is None or isinstance(x, str):
        return x
    return str(x)


def _traced(traces):
    # None: the step function has no tracing count (not a tf.function), so its traces were not counted
    return f"step traced {plural(traces, 'time')}" if traces is not None else "step traces not counted"


def _left_out(co):
    n = co.get("traced_steps_left_out")
    return f", {plural(n, 'tracing step')} left out" if n else ""


def _floor_row(floor):
    if not floor:
        return []
    return [f"| real loop, one constant batch | | wait {floor['wait_ms_mean']:.2f} ms ({floor['wait_fraction']:.1%}): "
            f"tf.data's fixed cost per batch, the least any loader waits here |"]


def _markdown(r):
    lo, st, co = r["loader"], r["step"], r["combined"]
    lines = [f"# Diagnose: {r['verdict']}", "",
             f"The training loop {_VERDICTS.get(r['verdict'], r['verdict'])}: it waited for input "
             f"{r['input_wait_fraction']:.1%} of the wall time and ran {co['steps_per_s']:.2f} steps/s "
             f"({_traced(r['traces'])}; placement {r.get('placement')}).", "",
             "| measurement | steps (batches)/s | other |", "|---|---|---|",
             f"| loader alone | {lo['batches_per_s']:.2f} | {lo['examples_per_s']:.1f} examples/s, {lo['mb_per_s']:.2f} MB/s |",
             f"| step alone | {st['steps_per_s']:.2f} | {st['step_ms_mean']:.2f} ms mean, {st['step_ms_p90']:.2f} ms p90 |",
             f"| real loop | {co['steps_per_s']:.2f} | wait {co['wait_ms_mean']:.2f} ms, step {co['compute_ms_mean']:.2f} ms "
             f"(mean){_left_out(co)}; step-time CV {r['step_time_cv']:.2f}; oscillation "
             f"{('yes (the bucket shapes in turn)' if r.get('oscillation_by_shape') else 'yes') if r['oscillation'] else 'no'} |",
             *_floor_row(r.get("wait_floor")),
             "", "## GPUs", ""]
    if r["gpus"]:
        lines.append(f"Sampled: {r['gpu_sampling']}.")
        if not _tf_sees_gpu(r):
            lines.append("TensorFlow sees none of them: the loop ran on the CPU, and their load is other processes'.")
        lines.append("")
        lines += [f"- {_gpu_label(g)} {g['name']}: not measured (no sample)" if g["util_mean"] is None else
                  f"- {_gpu_label(g)} {g['name']}: utilisation {g['util_mean']:.0f} % mean (CV {g['util_cv']:.2f}), "
                  f"peak memory {g['mem_used_mb']:.0f} MB" for g in r["gpus"]]
    else:
        lines.append(f"None sampled: {r['gpu_sampling']}.")
    lines += ["", "## Python ops in the input graph", ""]
    lines += [f"- {p}" for p in r["pyfunc_ops"]] or ["None."]
    lines += ["", "## Recommendations", ""] + [f"{i}. {s}" for i, s in enumerate(r["recommendations"], 1)]
    if r.get("placement_comparison"):
        lines += ["", "## Placements", ""] + [f"- {s}" for s in r["placement_comparison"]]
    return "\n".join(lines) + "\n"


def _png(r):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    co = r["combined"]
    fig, axes = plt.subplots(2, 1, figsize=(10, 7))
    x = np.arange(1, len(co["step_times_ms"]) + 1)
    ax = axes[0]
    ax.plot(x, co["step_times_ms"], marker="o", ms=3, label="wall per step (wait + step)")
    ax.plot(x, co["wait_times_ms"], marker=".", ms=3, label="wait for the batch")
    ax.plot(x, co["compute_times_ms"], lw=1, alpha=0.7, label="step")
    ax.set_xlabel("measured step of the real loop")
    ax.set_ylabel("time (ms)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", framealpha=0.8)
    ax = axes[1]
    if r["gpus"]:
        for g in r["gpus"]:
            ax.plot(g["t_s"], g["util_series"], label=f"{_gpu_label(g)} {g['name']}"
                    + (" (not measured)" if g["util_mean"] is None else ""))
        ax.set_ylim(-2, 102)
        ax.legend(loc="best", framealpha=0.8)
    else:
        ax.text(0.5, 0.5, f"GPU utilisation not sampled: {r['gpu_sampling']}", ha="center", va="center",
                wrap=True, transform=ax.transAxes)
    ax.set_xlabel("time since the real loop started (s)")
    ax.set_ylabel("GPU utilisation (%)")
    ax.grid(alpha=0.3)
    fig.suptitle(f"verdict: {r['verdict']} - input wait {r['input_wait_fraction']:.1%}, "
                 f"{co['steps_per_s']:.2f} steps/s, {_traced(r['traces'])}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def report_paths(out_dir, flag=None):
    """{'json','md','png': path} of the report in out_dir; PipelineError (naming `flag`) when one of them
    is something no file may replace (a folder, a device): checked before any measurement or write."""
    out = Path(out_dir)
    paths = {"json": out / "diagnose.json", "md": out / "diagnose.md", "png": out / "diagnose.png"}
    for path in paths.values():
        target(path, flag)
    return paths


def write_report(report, out_dir):
    """Write diagnose.json, diagnose.md and diagnose.png into out_dir; return {'json','md','png': path}.

    All three are made before any is written, and their paths checked, so a failure leaves the
    previous report whole rather than a new diagnose.json beside an old diagnose.png."""
    paths = report_paths(out_dir)
    made = {"json": (json.dumps(_json_safe(report), indent=2, allow_nan=False) + "\n").encode("utf-8"),
            "md": _markdown(report).encode("utf-8"), "png": _png(report)}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for key, path in paths.items():
        atomic_write_bytes(path, made[key])
    return paths
