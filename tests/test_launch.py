"""The local launcher's own processes, pipes and output (pipeline.launch), with stand-in workers.

The workers here are small Python modules (no TensorFlow); tests/test_multiworker.py trains real ones.
"""
import os
import subprocess
import sys
import time

from conftest import ROOT

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
