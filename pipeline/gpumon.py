"""GPU sampler: per-GPU utilisation and memory from NVML, in a background thread.

Reads NVML through `nvidia-ml-py` (module `pynvml`) and the environment variables
CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER; writes nothing. No config keys: the diagnose phase
starts one `GpuSampler` around its measured loop. Without a driver, NVML library or GPU the sampler
is simply unavailable (`available=False`, one-line `reason`), never an error.

Only the GPUs this process can use are sampled, those CUDA_VISIBLE_DEVICES leaves visible, and each
is labelled by its position in that list: TensorFlow's /GPU:i. NVML numbers GPUs in PCI bus order;
CUDA numbers them fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so a number in
CUDA_VISIBLE_DEVICES means the same GPU to both only under that setting or on identical GPUs.

NVML `utilization.gpu` is the share of a 1/6-1 s window in which any kernel ran, so polling faster
than a few Hz only repeats the same number; 0.2 s is the default interval.

    python -m pipeline.gpumon            # samples for 2 s and prints the summary
"""
import os
import threading
import time

import numpy as np

DEFAULT_INTERVAL_S = 0.2  # NVML averages over >= 1/6 s: faster polling adds nothing
_MB = 1024 * 1024


def _text(value):
    # older pynvml versions return bytes
    return value.decode() if isinstance(value, bytes) else str(value)


def _by_uuid(nvml, entry, count):
    """The handle of the GPU `entry` names: its whole UUID, or (as CUDA takes them) a prefix only one GPU's
    UUID starts with; None if none or several."""
    error = getattr(nvml, "NVMLError", Exception)
    try:
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    except error:
        pass
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        found = [h for h in handles if _text(nvml.nvmlDeviceGetUUID(h)).startswith(entry)]
    except error:
        return None
    return found[0] if len(found) == 1 else None


class GpuSampler:
    """Samples the utilisation (%) and used memory (MB) of every GPU this process can use until stopped.

    `nvml` is a module with pynvml's function names; tests pass a fake. Use as a context manager
    or call start()/stop(); summary() gives one dict per GPU, coverage() how much of a stretch of
    time the samples span. `stopped` says why sampling ended early (NVML failed), `notes` what the
    GPU numbering assumes.
    """

    def __init__(self, interval_s=DEFAULT_INTERVAL_S, nvml=None):
        self.interval_s = float(interval_s)
        self._nvml = nvml
        self._handles = []
        self.names = []
        self.nvml_indices = []       # NVML's number of each sampled GPU; its position is TensorFlow's
        self.available = False
        self.reason = None
        self.stopped = None
        self.notes = []
        self._t = []                 # sample times, time.perf_counter() seconds
        self._util = []              # per sample: list of % per GPU
        self._mem = []               # per sample: list of MB per GPU
        self._mem_total = []
        self._stop = threading.Event()
        self._thread = None
        self._initialised = False

    # --- NVML lifecycle -------------------------------------------------------------------
    def _init(self):
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as e:
                self.reason = f"NVML is not installed (pip install nvidia-ml-py): {e}"
                return
            self._nvml = nvml
        error = getattr(nvml, "NVMLError", Exception)
        try:
            nvml.nvmlInit()
            self._initialised = True
            count = int(nvml.nvmlDeviceGetCount())
            visible = self._visible(nvml, count)
            self._handles = [h for h, _ in visible]
            self.nvml_indices = [i for _, i in visible]
            self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
            self._mem_total = [nvml.nvmlDeviceGetMemoryInfo(h).total / _MB for h in self._handles]
        except (error, OSError) as e:
            self.reason = f"NVML unavailable ({type(e).__name__}: {e})"
            self._handles, self.names, self.nvml_indices, self.notes = [], [], [], []
            return
        if not count:
            self.reason = "NVML found no GPU"
        elif not self._handles:
            self.reason = (f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r} leaves this process "
                           f"none of the {count} GPU(s) NVML lists")
        else:
            self.available = True

    def _visible(self, nvml, count):
        """(handle, NVML index) of each GPU CUDA_VISIBLE_DEVICES leaves this process, in CUDA's order.

        Unset: every GPU. Entries are NVML indices or `GPU-<uuid>`s (a unique prefix is enough, as in
        CUDA); like CUDA, the list ends at the first entry that names no GPU, so '', '-1' and 'none'
        leave none. A MIG instance (`MIG-...`) ends it too, with a note: NVML reports no utilisation
        for one.
        """
        spec = os.environ.get("CUDA_VISIBLE_DEVICES")
        entries = [str(i) for i in range(count)] if spec is None else [e.strip() for e in spec.split(",")]
        visible = []
        for entry in entries:
            if entry.isdigit() and int(entry) < count:
                visible.append((nvml.nvmlDeviceGetHandleByIndex(int(entry)), int(entry)))
                continue
            handle = _by_uuid(nvml, entry, count) if entry.startswith("GPU-") else None
            if entry.startswith("MIG-"):
                self.notes.append(f"CUDA_VISIBLE_DEVICES={spec!r}: {entry!r} is a MIG instance, whose utilisation NVML "
                                  f"does not report: not sampled.")
                break
            if handle is None:
                if visible:
                    self.notes.append(f"CUDA_VISIBLE_DEVICES={spec!r}: NVML knows no GPU {entry!r}, so, as in "
                                      f"CUDA, the visible GPUs end before it.")
                break
            visible.append((handle, int(nvml.nvmlDeviceGetIndex(handle))))
        by_number = any(e.isdigit() for e in entries[:len(visible)])
        if not by_number or os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
            return visible
        names = {_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(count)}
        if len(names) > 1:
            self.notes.append(f"GPU numbers were matched to TensorFlow's assuming CUDA orders the GPUs as NVML does "
                              f"(by PCI bus), which holds only with CUDA_DEVICE_ORDER=PCI_BUS_ID or identical GPUs, "
                              f"and this host mixes {', '.join(sorted(names))}: set CUDA_DEVICE_ORDER=PCI_BUS_ID.")
        return visible

    def _shutdown(self):
        if self._initialised:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down must never hide the measurement
                pass
            self._initialised = False

    # --- sampling -------------------------------------------------------------------------
    def sample_once(self):
        """Take one sample of every GPU now (the thread calls this every interval_s)."""
        if not self.available or self.stopped:
            return
        nvml = self._nvml
        try:
            util = [float(nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._handles]
            mem = [nvml.nvmlDeviceGetMemoryInfo(h).used / _MB for h in self._handles]
        except Exception as e:  # NVMLError, or whatever else a driver's binding raises
            # a GPU that falls off the bus mid-run ends sampling, not the diagnosis (nor a traceback from the thread)
            self.stopped = f"NVML sampling stopped after {len(self._t)} sample(s) ({type(e).__name__}: {e})"
            self._stop.set()
            return
        self._t.append(time.perf_counter())
        self._util.append(util)
        self._mem.append(mem)

    def _run(self):
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def start(self):
        self._init()
        if self.available:
            self._stop.clear()  # before the first sample, which sets it if NVML fails
            self.sample_once()  # here, not in the thread: a loop shorter than one interval still gets a sample
        if self.available and not self.stopped:
            self._thread = threading.Thread(target=self._run, name="GpuSampler", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._shutdown()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    # --- results --------------------------------------------------------------------------
    def summary(self, t0=None):
        """One dict per GPU: index (TensorFlow's), nvml_index, name, util_mean, util_cv, mem_used_mb
        (peak) and the series; util_mean and the like are None for a GPU without a sample.

        `t0` (a perf_counter time) makes `t_s` relative to it; default: the first sample.
        """
        if not self.available:
            return []
        times = np.asarray(self._t, dtype=float)
        if t0 is None:
            t0 = times[0] if len(times) else 0.0
        out = []
        for i, name in enumerate(self.names):
            util = np.asarray([u[i] for u in self._util], dtype=float)
            mem = np.asarray([m[i] for m in self._mem], dtype=float)
            mean = float(util.mean()) if len(util) else None
            # CV is undefined at zero mean; all-zero utilisation does not vary, so call it 0
            cv = float(util.std() / util.mean()) if len(util) and util.mean() > 0 else (0.0 if len(util) else None)
            out.append({
                "index": i,
                "nvml_index": self.nvml_indices[i],
                "name": name,
                "util_mean": mean,
                "util_cv": cv,
                "mem_used_mb": float(mem.max()) if len(mem) else None,   # peak over the run
                "mem_used_mb_mean": float(mem.mean()) if len(mem) else None,
                "mem_total_mb": float(self._mem_total[i]) if i < len(self._mem_total) else None,
                "samples": int(len(util)),
                "interval_s": self.interval_s,
                "t_s": [float(t - t0) for t in times],
                "util_series": [float(u) for u in util],
                "mem_series_mb": [float(m) for m in mem],
            })
        return out

    def coverage(self, t0, t1):
        """How much of [t0, t1] (perf_counter times) the samples cover: {samples, seconds, fraction}.

        Each sample stands for the interval_s after it, so a run that sampled to its end covers all of
        it and one whose NVML failed covers up to its last sample.
        """
        span = max(t1 - t0, 0.0)
        seconds = min(max(self._t[-1] + self.interval_s, t0), t1) - t0 if self._t else 0.0
        return {"samples": len(self._t), "seconds": seconds, "loop_seconds": span,
                "fraction": seconds / span if span > 0 else (1.0 if self._t else 0.0)}


def main():
    with GpuSampler() as s:
        time.sleep(2.0)
    if not s.available:
        print(s.reason)
    for line in [s.stopped, *s.notes]:
        if line:
            print(line)
    for g in s.summary():
        label = f"GPU {g['index']} (NVML {g['nvml_index']}) {g['name']}"
        print(f"{label}: not measured" if g["util_mean"] is None else
              f"{label}: util {g['util_mean']:.1f} % (CV {g['util_cv']:.2f}), "
              f"peak memory {g['mem_used_mb']:.0f} MB over {g['samples']} samples")


if __name__ == "__main__":
    main()
