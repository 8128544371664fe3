"""The real `snakemake` command for the tests, without paying its imports on every run.

`snakemake` spends ~1.5 of its ~2.2 CPU s per run here importing itself (its persistence database
layer, the executor plugins and pandas with them) before it reads the Snakefile. The suite runs it
~285 times. So each pytest worker keeps one helper process that has imported `snakemake.cli`, and
done what every run does before it reads a project file (collected the plugins, built the argument
parser from them, imported the planning modules and jsonschema: a forked dry run 0.89 -> 0.50 CPU s
median), and forks it for every run: the child sets the run's folder, environment and argv,
points its stdin at /dev/null and its stdout/stderr at files, and calls `snakemake.cli.main`, the
entry point of the `snakemake` command and of `python -m snakemake`. Everything after the import
(parsing the arguments, the profile, the Snakefile and the project's own modules, planning, the
jobs) happens in the child, as in a fresh process. The helper imports nothing of the project, so a
test's copied project with edited code is read from its copy.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading

SERVER = r"""
import atexit, json, os, sys, traceback
import snakemake.cli
# what every run does before it reads a project file, done once here: collect the plugins (executors,
# storage, reports, ...) and build the argument parser from them, and import the modules planning uses
snakemake.cli.get_argument_parser()
import jsonschema, smart_open, snakemake.api, snakemake.dag, snakemake.parser, snakemake.workflow
MAIN = os.path.join(os.path.dirname(snakemake.cli.__file__), "__main__.py")
REQUESTS, REPLIES = int(sys.argv[1]), int(sys.argv[2])
requests, replies = os.fdopen(REQUESTS, "r"), os.fdopen(REPLIES, "w")
for line in requests:
    job = json.loads(line)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(REQUESTS), os.close(REPLIES)
            os.chdir(job["cwd"])
            os.environ.clear()
            os.environ.update(job["env"])
            for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, job["stdout"], os.O_WRONLY),
                                   (2, job["stderr"], os.O_WRONLY)):
                opened = os.open(path, mode)
                os.dup2(opened, fd)
                os.close(opened)
            sys.argv = [MAIN, *job["argv"]]
            try:
                snakemake.cli.main(job["argv"])
                code = 0
            except SystemExit as e:  # as the interpreter treats it
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            atexit._run_exitfuncs()
        finally:
            try:
                sys.stdout.flush(), sys.stderr.flush()
            finally:
                os._exit(code)
    _, status, usage = os.wait4(pid, 0)  # the run's CPU with its jobs', for the caller's accounting
    replies.write(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime]) + "\n")
    replies.flush()
"""

_lock = threading.Lock()
_server = None
cpu_s = 0.0  # the CPU seconds of every run so far (this process's RUSAGE_CHILDREN never sees them)


def _start():
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(requests_r), str(replies_w)],
                            pass_fds=(requests_r, replies_w), stdin=subprocess.DEVNULL)
    os.close(requests_r), os.close(replies_w)
    return proc, os.fdopen(requests_w, "w"), os.fdopen(replies_r, "r")


def _stop():
    """End the helper (and forget it): a later run starts another."""
    global _server
    if _server is not None:
        proc, requests, replies = _server
        _server = None
        proc.kill()
        proc.wait()
        requests.close(), replies.close()


def run(argv, cwd):
    """`python -m snakemake *argv` in `cwd` with this process's environment: a CompletedProcess whose
    stdout and stderr are text, and whose `cpu_s` is the CPU seconds it and its jobs used."""
    global _server, cpu_s
    with _lock, tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        open(out, "w").close(), open(err, "w").close()
        job = {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": dict(os.environ), "stdout": out, "stderr": err}
        if _server is None or _server[0].poll() is not None:
            _stop()
            _server = _start()
        try:
            _server[1].write(json.dumps(job) + "\n")
            _server[1].flush()
            reply = _server[2].readline()
        except BaseException:  # e.g. a test's timeout: this run's late reply would answer the next one
            _stop()
            raise
        if not reply:
            _stop()
            raise RuntimeError(f"the snakemake helper process died running snakemake {' '.join(job['argv'])}")
        with open(out, encoding="utf-8", errors="replace") as f, open(err, encoding="utf-8", errors="replace") as g:
            code, cpu = json.loads(reply)
            done = subprocess.CompletedProcess([sys.executable, "-m", "snakemake", *job["argv"]], code, f.read(), g.read())
        done.cpu_s = cpu
        cpu_s += cpu
        return done
