"""Shared helpers for the ratio benchmarks (benchmarks/preprocess.py, benchmarks/loader.py).

Nothing here reads /work/shared: corpora are spoken by espeak-ng from data/ljspeech_transcripts.csv
into the benchmark's work folder (default `.bench/`, git-ignored), and Snakemake runs on this
repository's Snakefile from the repository root, exactly as tests/conftest.py runs it.
"""
import datetime
import importlib.metadata
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
DEFAULT_WORKDIR = ROOT / ".bench"
# numpy's OpenBLAS (and OpenMP/MKL where present) to one thread: the "single-thread BLAS" condition
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TRANSCRIPTS = ROOT / "data" / "ljspeech_transcripts.csv"


# --- machine -----------------------------------------------------------------------------------

def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib():
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _git(*args):
    try:  # read-only git queries
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info():
    """What the figures were measured on: cores, CPU model, RAM, versions, load, date, commit."""
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() if shutil.which("nproc") else None
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": int(nproc) if nproc else len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "ram_gib": _ram_gib(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow"),
        "snakemake": _version("snakemake"),
        "librosa": _version("librosa"),
        "numpy": _version("numpy"),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def machine_line(m):
    return (f"{m['nproc']} cores ({m['cpu_model']}), {m['ram_gib']} GiB RAM, Python {m['python']}, "
            f"TensorFlow {m['tensorflow']}, Snakemake {m['snakemake']}, librosa {m['librosa']}, "
            f"load average at start {m['loadavg_at_start'][0]}; {m['date_utc']}, commit {m['git_commit']}"
            + (" (+ uncommitted changes)" if m["git_dirty"] else ""))


# --- timing ------------------------------------------------------------------------------------

def children_cpu():
    """CPU seconds (user + system) of every child process reaped so far, grandchildren included."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_timed(cmd, *, cwd=ROOT, env=None, check=True):
    """Run a command to completion: {wall, cpu (self + children, via RUSAGE_CHILDREN), rc, out}."""
    env = {**os.environ, **(env or {})}
    cpu0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    out = proc.stdout + proc.stderr
    load1 = round(os.getloadavg()[0], 2)  # other people's work on this machine inflates wall (and CPU) times
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{out[-4000:]}")
    return {"wall": wall, "cpu": cpu, "rc": proc.returncode, "out": out, "load1_after": load1}


# `python -m snakemake` that also reports, at exit, the CPU of the Snakemake process itself (all its
# threads) apart from that of its jobs, into the file named by $BENCH_RUSAGE_OUT.
SNAKEMAKE_WITH_RUSAGE = r"""
import atexit, json, os, resource, runpy, sys
def _dump():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.environ["BENCH_RUSAGE_OUT"], "w") as f:
        json.dump({"self": s.ru_utime + s.ru_stime, "jobs": c.ru_utime + c.ru_stime, "self_maxrss_kib": s.ru_maxrss}, f)
atexit.register(_dump)
sys.argv[0] = "snakemake"
runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
"""


def shard_job_command(kind, job_config, shard, out, *, audio=True):
    """`python -m pipeline.cache KIND ...` as rules/cache.smk writes it: `job_config` (JSON text) for
    shard `shard`, its files under `out`/{kind}/; a mel job also writes energy and (with `audio`) the
    waveform shard."""
    name = f"shard-{shard:03d}"
    cmd = [sys.executable, "-m", "pipeline.cache", kind, "--config", job_config, "--shard", str(shard),
           "--out", str(out / kind / name)]
    if kind == "mels":
        cmd += ["--energy", str(out / "energy" / name)] + (["--audio", str(out / "audio" / name)] if audio else [])
    return cmd


def snakemake_cmd(*args, config, python=None, project=ROOT):
    """The real snakemake CLI on this repo's Snakefile (or `project`'s), run from its root (as the tests do)."""
    head = [sys.executable, "-c", SNAKEMAKE_WITH_RUSAGE] if python == "rusage" else [sys.executable, "-m", "snakemake"]
    return [*head, "--snakefile", Path(project) / "Snakefile", "--cores", "2",
            "--directory", project, *args, "--configfile", config]  # --configfile last: it takes several values


def snakemake(*args, config, check=True, env=None, project=ROOT):
    """run_timed of a snakemake command, plus `self_cpu` (the Snakemake process) and `jobs_cpu` (its shells and jobs)."""
    fd, path = tempfile.mkstemp(prefix="bench-rusage-", suffix=".json")
    os.close(fd)
    try:
        res = run_timed(snakemake_cmd(*args, config=config, python="rusage", project=project), check=check,
                        cwd=project, env={**(env or {}), "BENCH_RUSAGE_OUT": path})
        try:
            split = json.loads(Path(path).read_text())
            res["self_cpu"], res["jobs_cpu"] = split["self"], split["jobs"]
            res["self_maxrss_mb"] = split["self_maxrss_kib"] / 1024
        except (OSError, ValueError):
            res["self_cpu"] = res["jobs_cpu"] = res["self_maxrss_mb"] = None
    finally:
        os.unlink(path)
    return res


def parse_planned(out):
    """{rule: count} from the job-stats table that `snakemake -n --quiet rules` prints."""
    counts = {}
    for line in out.splitlines():
        m = re.match(r"^\s*(\w+)\s+(\d+)\s*$", line)
        if m and m.group(1) not in ("total", "job", "count"):
            counts[m.group(1)] = int(m.group(2))
    return counts


def planned_jobs(config, target="caches"):
    res = snakemake(target, "-n", "--quiet", "rules", config=config)
    return parse_planned(res["out"]), res


def median(xs):
    return statistics.median(xs)


# --- corpora and configs -----------------------------------------------------------------------

def ensure_corpus(folder, count, *, fmt="flac", sample_rate=22050, jobs=2, log=print):
    """An espeak-ng corpus of the first `count` transcript lines at `folder`, made once and reused.

    A marker file records the request; make_corpus itself also skips clips it already made.
    Returns {"clips", "seconds", "made_s"} (made_s: generation wall time, 0 when reused).
    """
    from pipeline import make_corpus

    folder = Path(folder)
    marker = folder / ".bench-corpus.json"
    want = {"count": count, "fmt": fmt, "sample_rate": sample_rate, "transcripts": TRANSCRIPTS.name}
    if marker.exists() and (folder / "metadata.csv").exists():
        have = json.loads(marker.read_text())
        if {k: have.get(k) for k in want} == want:
            return {"clips": have["clips"], "seconds": have["seconds"], "made_s": 0.0}
    log(f"making a {count}-clip espeak-ng corpus ({fmt}, {sample_rate} Hz) in {folder} ...")
    t0 = time.perf_counter()
    stats = make_corpus.make_corpus(TRANSCRIPTS, folder, count=count, fmt=fmt, sample_rate=sample_rate, jobs=jobs,
                                    log=sys.stderr)
    made_s = time.perf_counter() - t0
    marker.write_text(json.dumps({**want, "clips": stats["clips"], "seconds": stats["seconds"]}))
    return {"clips": stats["clips"], "seconds": stats["seconds"], "made_s": made_s}


def write_config(path, cfg):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def bench_config(path, *, name, dataset_root, workdir, shards=None, **sections):
    """A config (merged by Snakemake over configs/config.yaml) whose caches/runs/reports stay in workdir."""
    workdir = Path(workdir).resolve()
    cfg = {"name": name, "dataset": {"root": str(Path(dataset_root).resolve())},
           "cache": {"dir": str(workdir / "cache")},
           "runs_dir": str(workdir / "runs"), "reports_dir": str(workdir / "reports")}
    if shards is not None:
        cfg["cache"]["shards"] = int(shards)
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    return write_config(path, cfg)


# --- output --------------------------------------------------------------------------------------

def table(rows, headers):
    """A plain-text (and Markdown-compatible) table."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]])


def _fmt(x):
    if isinstance(x, float):
        return f"{x:,.3g}" if abs(x) < 10 else f"{x:,.1f}"
    return str(x)


def verdict(ok):
    return "MET" if ok else "MISSED"


def write_json(path, obj):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    return path
