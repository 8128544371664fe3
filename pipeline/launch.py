"""Run N local training workers as one multiworker cluster on 127.0.0.1.

    python -m pipeline.launch --workers 2 -- --config my.yaml
    python -m pipeline.launch --workers 4 -- --config my.yaml --set train.steps=20000 --threads 4

Each worker is `python -m pipeline.train <the arguments after -->` with train.placement set to
multiworker and TF_CONFIG naming every worker (127.0.0.1 and a free port each) and its own index;
worker 0 is the chief. On a GPU host each worker gets an equal share of the GPUs
(CUDA_VISIBLE_DEVICES); workers never share a GPU. Their output is forwarded line by line as
`[worker i] ...`. When one worker fails, the launcher stops the others (SIGTERM, then SIGKILL) and
exits with that worker's error. When the launcher's own output goes (the reader of its pipe has
closed it, a full disk) it stops the workers too, as one training process would stop.
Workers also die with the launcher (Linux). Reads the config only to check it before starting.
The workers reach each other on 127.0.0.1, but TensorFlow's server in each listens on every network
interface (0.0.0.0) with no authentication: the log says so; keep those ports from other machines.
Across nodes, SLURM's `srun` starts the workers instead: scripts/train-multiworker.sbatch.
"""
import argparse
import collections
import ctypes
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from pipeline import config
from pipeline.errors import PipelineError, cli

STOP_GRACE_S = 10  # seconds a stopped worker gets between SIGTERM and SIGKILL
_EXCEPTION = re.compile(r"^(error: |[\w.]*(Error|Exception|Interrupt|Exit)\b)")  # a worker's last words


class WorkerFailed(PipelineError):
    """A worker exited non-zero or was killed; the message carries its error."""


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (held open together, so none repeats). They are closed
    again before the workers bind them, seconds later: another process may take one meanwhile. That
    worker then fails with a one-line "port is in use" error (pipeline.placement), and the launcher
    stops the others; a rerun picks new ports."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def tf_config(ports, index):
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def visible_gpus():
    """The GPU ids this host offers: CUDA_VISIBLE_DEVICES when set, else what `nvidia-smi -L` lists.
    As in CUDA, the list ends at the first entry that is neither a GPU's number nor its UUID, so
    `CUDA_VISIBLE_DEVICES=-1` (the usual way to hide the GPUs) leaves none: CPU workers."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        gpus = []
        for entry in (g.strip() for g in os.environ["CUDA_VISIBLE_DEVICES"].split(",")):
            if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
                break
            gpus.append(entry)
        return gpus
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i in range(sum(line.startswith("GPU ") for line in listing.splitlines()))]


CGROUP_ROOT = "/sys/fs/cgroup"  # where the cgroup file systems are mounted
PROC_CGROUP = "/proc/self/cgroup"  # this process's cgroups: "0::/path" (v2), "4:cpu,cpuacct:/path" (v1)


def cgroup_cpu_quota():
    """The CPUs this process's cgroup lets it keep busy, rounded up (docker --cpus 2, a Kubernetes limit:
    cpu.max in cgroup v2, cpu.cfs_quota_us / cpu.cfs_period_us in v1; the lowest of its cgroup's and
    their parents'), None without a quota. The quota shows in no CPU list: a container held to 2 CPUs
    on a 64-core host has 64 in its affinity."""
    try:
        lines = Path(PROC_CGROUP).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    quotas = []
    for line in (x for x in lines if x.count(":") >= 2):
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            folders = [Path(CGROUP_ROOT)]
        elif "cpu" in controllers.split(","):
            folders = [Path(CGROUP_ROOT, controllers), Path(CGROUP_ROOT, "cpu")]
        else:
            continue
        for top in folders:
            # its own cgroup and its parents (a container sees its own as the root)
            for folder in [top.joinpath(*Path(path).parts[1:i]) for i in range(len(Path(path).parts), 0, -1)]:
                quotas.append(_cpu_quota(folder))
    found = [q for q in quotas if q]
    return min(found) if found else None


def _cpu_quota(folder):
    """CPUs the cgroup in `folder` allows (a fraction), None for no quota or no such files."""
    try:
        if (folder / "cpu.max").is_file():
            quota, period = (folder / "cpu.max").read_text(encoding="ascii").split()[:2]
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text(encoding="ascii").strip()
            period = (folder / "cpu.cfs_period_us").read_text(encoding="ascii").strip()
        return int(quota) / int(period) if quota not in ("max", "-1") and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def usable_cores():
    """(the CPUs this process may keep busy, how the launcher's message names them): those it may run on
    (its affinity: SLURM's CPUs, taskset, a cpuset), at most its cgroup's CPU quota."""
    cores = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota()
    if quota is None or math.ceil(quota) >= cores:
        return cores, f"this host's {max(2, cores)} cores"
    return math.ceil(quota), (f"the {max(2, math.ceil(quota))} CPUs its cgroup's CPU quota allows ({quota:g} "
                              f"of this host's {cores} cores)")


def gpu_split(gpus, workers, log=print):
    """Each worker's CUDA_VISIBLE_DEVICES (an equal share of `gpus`), or None for all without GPUs.
    Workers must mirror over equal numbers of GPUs (MultiWorkerMirroredStrategy), so GPUs left over
    from an uneven split stay idle: the log names them."""
    if not gpus:
        return [None] * workers
    if workers > len(gpus):
        raise PipelineError(f"--workers {workers}: this host has {len(gpus)} GPUs ({','.join(gpus)}) and workers do "
                            f"not share one; use --workers {len(gpus)} or fewer (or CUDA_VISIBLE_DEVICES= for CPU workers)")
    share = len(gpus) // workers
    idle = gpus[share * workers:]
    if idle:
        log(f"launch: GPU{'s' if len(idle) > 1 else ''} {','.join(idle)} left idle: {len(gpus)} GPUs do not split "
            f"evenly over {workers} workers (each gets {share}); --workers {len(gpus)} or a divisor of it uses them all")
    return [",".join(gpus[i * share:(i + 1) * share]) for i in range(workers)]


def worker_args(train_args, log):
    """The train arguments with train.placement: multiworker, after checking the config loads."""
    parser = argparse.ArgumentParser(add_help=False)
    config.add_arguments(parser)
    placement = config.from_args(parser.parse_known_args(train_args)[0])["train"]["placement"]
    if placement == "multiworker":
        return list(train_args)
    log(f"launch: train.placement is {placement!r} in the config; the workers run 'multiworker'")
    argv = [*train_args, "--set", "train.placement=multiworker"]  # --set repeats; the last value wins
    config.from_args(parser.parse_known_args(argv)[0])  # a bad config fails here, not in every worker
    return argv


def _die_with_parent():
    # Linux: the worker gets SIGTERM when the launcher dies, even by SIGKILL
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _last_error(lines, killed):
    """The worker's error line; else its last line, unless a signal (not an error of its own) ended it."""
    for line in reversed(lines):
        if _EXCEPTION.match(line.strip()):
            return ": " + line.strip()
    return "" if killed else ": " + next((x.strip() for x in reversed(lines) if x.strip()), "no output")


def _stop(procs, grace):
    """SIGTERM to the workers still running, SIGKILL to those still there after `grace` s -> their indexes."""
    running = [i for i, p in enumerate(procs) if p.poll() is None]
    for i in running:
        procs[i].terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return running


def launch(workers, train_args, *, module="pipeline.train", out=None, grace=STOP_GRACE_S):
    """Run `workers` processes of `python -m module train_args...`; 0 when all succeed, else WorkerFailed."""
    out = out or sys.stdout
    lock = threading.Lock()

    def log(line):
        with lock:
            print(line, file=out, flush=True)

    gpus = visible_gpus()
    cores, where = usable_cores()
    cores = max(2, cores)  # the smallest cluster runs even on one core
    if not gpus and workers > cores:  # on GPUs, gpu_split bounds them; both before any per-worker list
        raise PipelineError(f"--workers {workers}: more CPU workers than {where} (each is a "
                            f"TensorFlow process with its own threads); use --workers {cores} or fewer")
    devices = gpu_split(gpus, workers, log)
    argv = worker_args(train_args, log) if module == "pipeline.train" else list(train_args)
    ports = free_ports(workers)
    log(f"launch: the workers' TensorFlow servers listen on port{'s' if workers > 1 else ''} "
        f"{','.join(map(str, ports))} of every network interface, not only 127.0.0.1 (TensorFlow binds 0.0.0.0), "
        "and obey whoever connects: run on a host whose ports other machines cannot reach (a firewall)")
    procs, readers, tails = [], [], [collections.deque(maxlen=200) for _ in range(workers)]
    try:
        for i in range(workers):
            env = dict(os.environ, TF_CONFIG=tf_config(ports, i), PYTHONUNBUFFERED="1")
            if devices[i] is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices[i]
            procs.append(subprocess.Popen([sys.executable, "-m", module, *argv], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                          errors="replace", preexec_fn=_die_with_parent))  # noqa: PLW1509 (no thread yet)
            gpus = f", GPUs {devices[i]}" if devices[i] is not None else ""
            log(f"launch: worker {i} pid {procs[i].pid} on 127.0.0.1:{ports[i]}{gpus}{' (chief)' if i == 0 else ''}")

        failed = _watch(procs, tails, log, readers)
    except BaseException:  # Ctrl-C, the log's output gone, a launcher bug: never leave workers behind
        _stop(procs, grace)
        for p in procs[len(readers):]:  # the output of workers started before one failed to start
            p.stdout.close()
        raise
    stopped = _stop(procs, grace)
    for r in readers:
        r.join(timeout=5)
    if failed is None:
        log(f"launch: all {workers} workers finished")
        return 0
    raise WorkerFailed(_failure(procs, failed, list(tails[failed]), stopped))


def _watch(procs, tails, log, readers):
    """Forward each worker's lines as `[worker i] ...` (the last ones kept in `tails`), from threads added
    to `readers`, until every worker has exited or one has failed -> the first to fail, None if none did.
    What writing the log raised (a closed pipe, a full disk) is raised here, and the launch stops."""
    ended = {}  # worker -> when it exited: the first to fail is the cause, the others may follow it
    gone = []

    def forward(i):
        with procs[i].stdout as lines:  # closed at the worker's end: a launch in a longer process leaks no pipe
            for line in lines:
                tails[i].append(line)
                if not gone:
                    try:
                        log(f"[worker {i}] {line.rstrip()}")
                    except Exception as e:  # reading goes on: a worker must never block on a full pipe
                        gone.append(e)
        procs[i].wait()
        ended[i] = time.monotonic()

    # readers start after every fork: preexec_fn is unsafe while other threads run
    readers.extend(threading.Thread(target=forward, args=(i,), daemon=True) for i in range(len(procs)))
    for r in readers:
        r.start()
    failed = []
    while not failed and not gone and len(ended) < len(procs):
        time.sleep(0.1)
        failed = sorted((t, i) for i, t in list(ended.items()) if procs[i].returncode != 0)
    if gone:  # as one command whose output went: errors.cli says why (nothing, for a pipe's reader gone)
        raise gone[0]
    return failed[0][1] if failed else None


def _failure(procs, failed, tail, stopped):
    """What failed: worker `failed` (the first to), how, its last error line in `tail`, and the others
    it stopped: those still running then, not one that had finished or failed after it."""
    rc = procs[failed].returncode
    how = f"was killed by {_signal_name(-rc)}" if rc < 0 else f"exited with status {rc}"
    others = "" if not stopped else f"; stopped the other {len(stopped)}" if len(stopped) == len(procs) - 1 else \
        f"; stopped {' and '.join(f'worker {i}' for i in stopped)}, still running"
    return f"worker {failed} (pid {procs[failed].pid}) {how}{_last_error(tail, killed=rc < 0)}{others}"


def _signal_name(number):
    """SIGKILL for 9; a signal Python has no name for (SIGRTMIN+1 to SIGRTMAX-1 on Linux) by its number."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@cli
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     usage="python -m pipeline.launch --workers N -- [pipeline.train arguments]")
    parser.add_argument("--workers", type=int, required=True, help="worker processes on this host (>= 1)")
    args = parser.parse_args(ours)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    launch(args.workers, train_args)


if __name__ == "__main__":
    main()
