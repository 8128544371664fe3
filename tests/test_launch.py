"""The local launcher's own processes, pipes and output (pipeline.launch), with stand-in workers.

The workers here are small Python modules (no TensorFlow); tests/test_multiworker.py trains real ones.
"""
import io
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from pipeline import launch
from pipeline.errors import PipelineError

# the launcher as `python -m pipeline.launch` runs it (errors.cli around launch()), with a stand-in module
LAUNCH = ("import sys; from pipeline import launch; from pipeline.errors import cli; "
          "cli(lambda argv=None: launch.launch(int(sys.argv[1]), [], module=sys.argv[2]))()")
# a worker that says where it is, then logs a line every 10 ms for a minute
CHATTY = """
import json, os, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print(f"worker {index} pid {os.getpid()}", flush=True)
for step in range(6000):
    print(f"worker {index} step {step}", flush=True)
    time.sleep(0.01)
"""


def _env(tmp_path):
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), CUDA_VISIBLE_DEVICES="")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_launcher_whose_output_is_closed_stops_its_workers_and_exits(tmp_path):
    # `python -m pipeline.launch ... | head`, or a `tee` that died: the threads forwarding the workers' lines
    # failed (BrokenPipeError, a traceback each), so no one read the workers' output any more; they blocked
    # on a full pipe and the launcher waited for them for ever
    (tmp_path / "chatty.py").write_text(CHATTY)
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, "2", "chatty"], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = {}
    try:
        while len(pids) < 2:  # the workers' first lines, forwarded: then the reader goes
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            if " pid " in line and line.startswith("[worker"):
                pids[line.split()[1]] = int(line.split()[-1])
        proc.stdout.close()
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert rc == 0, err  # as any command whose reader has what it wanted
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    deadline = time.monotonic() + 10
    while any(map(_alive, pids.values())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, pids.values())), pids



def test_a_launch_leaves_no_pipe_open_in_the_process_that_ran_it(tmp_path):
    # each worker's output pipe stayed open after the launch returned, one file per worker and launch
    # (ResourceWarning: unclosed file) for the life of a process that launches, such as a benchmark's
    (tmp_path / "brief.py").write_text("print('up')\n")
    code = ("import gc, io, sys; from pipeline import launch; "
            "launch.launch(2, [], module='brief', out=io.StringIO()); gc.collect(); print('launched')")
    proc = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", code], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "launched\n", proc.stderr
    assert "ResourceWarning" not in proc.stderr, proc.stderr


def _cgroups(root, proc_line, limits):
    """A cgroup tree under `root` (folder -> {file: text}) and a /proc/self/cgroup of one line."""
    for folder, files in limits.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (root / folder / name).write_text(text)
    (root / "proc-self-cgroup").write_text(proc_line + "\n")


def test_cpu_workers_are_bounded_by_a_cgroup_cpu_quota_as_by_the_cores(tmp_path, monkeypatch):
    # a container held to 2 CPUs (docker --cpus 2, a Kubernetes limit) on a 64-core host: its affinity lists
    # 64, so --workers 16 started 16 TensorFlow processes on 2 CPUs' worth of time
    (tmp_path / "brief.py").write_text("print('up')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(launch.os, "sched_getaffinity", lambda pid: set(range(64)))
    root = tmp_path / "cgroup"
    monkeypatch.setattr(launch, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(launch, "PROC_CGROUP", str(root / "proc-self-cgroup"))
    # cgroup v2: the job's own cgroup has no quota, its parent's is 2 CPUs
    _cgroups(root, "0::/user.slice/job", {"user.slice": {"cpu.max": "200000 100000\n"},
                                          "user.slice/job": {"cpu.max": "max 100000\n"}})
    assert launch.cgroup_cpu_quota() == 2.0 and launch.usable_cores()[0] == 2
    with pytest.raises(PipelineError, match=r"--workers 16: more CPU workers than the 2 CPUs its cgroup's CPU "
                                            r"quota allows \(2 of this host's 64 cores\).*--workers 2 or fewer"):
        launch.launch(16, [], module="brief", out=io.StringIO())
    assert launch.launch(2, [], module="brief", out=io.StringIO()) == 0
    # cgroup v1 (cpu,cpuacct), 1.5 CPUs: two workers at most
    _cgroups(root, "4:cpu,cpuacct:/docker/4f1e", {"cpu,cpuacct/docker/4f1e": {"cpu.cfs_quota_us": "150000\n",
                                                                              "cpu.cfs_period_us": "100000\n"}})
    assert launch.cgroup_cpu_quota() == 1.5 and launch.usable_cores()[0] == 2
    with pytest.raises(PipelineError, match="--workers 3: more CPU workers than the 2 CPUs"):
        launch.launch(3, [], module="brief", out=io.StringIO())
    # no quota (v1's -1, v2's max), no cgroup files: the cores
    _cgroups(root, "4:cpu,cpuacct:/docker/4f1e", {"cpu,cpuacct/docker/4f1e": {"cpu.cfs_quota_us": "-1\n"}})
    assert launch.cgroup_cpu_quota() is None and launch.usable_cores() == (64, "this host's 64 cores")
    _cgroups(root, "0::/", {".": {"cpu.max": "max 100000\n"}})
    assert launch.cgroup_cpu_quota() is None
    monkeypatch.setattr(launch, "PROC_CGROUP", str(root / "absent"))
    assert launch.usable_cores()[0] == 64


def test_a_worker_killed_by_a_signal_python_has_no_name_for_is_one_line(tmp_path, monkeypatch):
    # a real-time signal (SIGRTMIN+6 on Linux, which Python's signal.Signals does not list) ended worker 1:
    # the launcher's report of it was a ValueError traceback in place of the worker's failure
    (tmp_path / "rt_worker.py").write_text(
        "import json, os, signal, time\n"
        "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
        "    os.kill(os.getpid(), signal.SIGRTMIN + 6)\n"
        "time.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(ROOT)]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    number = int(signal.SIGRTMIN) + 6
    with pytest.raises(launch.WorkerFailed, match=rf"^worker 1 \(pid \d+\) was killed by signal {number}; "
                                                   r"stopped the other 1$"):
        launch.launch(2, [], module="rt_worker", out=io.StringIO())
