"""GPU sampler: per-GPU utilisation and memory from NVML, in a background thread.

Reads NVML through `nvidia-ml-py` (module `pynvml`); writes nothing. No config keys: the
diagnose phase starts one `GpuSampler` around its measured loop. Without a driver, NVML library or
GPU the sampler is simply unavailable (`available=False`, one-line `reason`), never an error.

NVML `utilization.gpu` is the share of a 1/6-1 s window in which any kernel ran, so polling faster
than a few Hz only repeats the same number; 0.2 s is the default interval.

    python -m pipeline.gpumon            # samples for 2 s and prints the summary
"""
import threading
import time

import numpy as np

DEFAULT_INTERVAL_S = 0.2  # NVML averages over >= 1/6 s: faster polling adds nothing
_MB = 1024 * 1024


def _text(value):
    # older pynvml versions return bytes
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuSampler:
    """Samples every GPU's utilisation (%) and used memory (MB) until stopped.

    `nvml` is a module with pynvml's function names; tests pass a fake. Use as a context manager
    or call start()/stop(); summary() gives one dict per GPU.
    """

    def __init__(self, interval_s=DEFAULT_INTERVAL_S, nvml=None):
        self.interval_s = float(interval_s)
        self._nvml = nvml
        self._handles = []
        self.names = []
        self.available = False
        self.reason = None
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
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
            self._mem_total = [nvml.nvmlDeviceGetMemoryInfo(h).total / _MB for h in self._handles]
        except (error, OSError) as e:
            self.reason = f"NVML unavailable ({type(e).__name__}: {e})"
            self._handles, self.names = [], []
            return
        if not self._handles:
            self.reason = "NVML found no GPU"
            return
        self.available = True

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
        if not self.available:
            return
        nvml = self._nvml
        try:
            util = [float(nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._handles]
            mem = [nvml.nvmlDeviceGetMemoryInfo(h).used / _MB for h in self._handles]
        except getattr(nvml, "NVMLError", Exception) as e:
            # a GPU that falls off the bus mid-run ends sampling, not the diagnosis
            self.reason = f"NVML sampling stopped ({type(e).__name__}: {e})"
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
            self.sample_once()  # here, not in the thread: a loop shorter than one interval still gets a sample
            self._stop.clear()
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
        """One dict per GPU: index, name, util_mean, util_cv, mem_used_mb (peak) and the series.

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


def main():
    with GpuSampler() as s:
        time.sleep(2.0)
    if not s.available:
        print(s.reason)
    for g in s.summary():
        print(f"GPU {g['index']} {g['name']}: util {g['util_mean']:.1f} % (CV {g['util_cv']:.2f}), "
              f"peak memory {g['mem_used_mb']:.0f} MB over {g['samples']} samples")


if __name__ == "__main__":
    main()
