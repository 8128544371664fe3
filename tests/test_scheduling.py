"""A local run's scheduler wakes when a job ends, not on the timers of Snakemake's job-rate limit
(pipeline/scheduling.py): with the command line's default limit, each finished job kept one more
timer waking it every second while other jobs waited."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, snakemake

# the snakemake command, counting the threading.Timer threads its process starts
COUNTING_SNAKEMAKE = r"""
import atexit, json, os, runpy, sys, threading
started = []
start = threading.Timer.start
def counted(timer):
    started.append(timer.interval)
    start(timer)
threading.Timer.start = counted
atexit.register(lambda: open(os.environ["TIMERS_OUT"], "w").write(json.dumps(started)))
sys.argv[0] = "snakemake"
runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
"""


def snakemake_counting_timers(tmp_path, *args, config):
    """Run snakemake in its own process; the intervals of the Timer threads it started."""
    out = tmp_path / f"timers-{len(list(tmp_path.glob('timers-*')))}.json"
    cmd = [sys.executable, "-c", COUNTING_SNAKEMAKE, "--snakefile", str(ROOT / "Snakefile"), "--cores", "2",
           "--max-threads", "1", "--directory", str(ROOT), "--nolock", *args, "--configfile", str(config)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TIMERS_OUT": str(out)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_a_local_build_schedules_without_rate_limit_timers_unless_the_user_sets_a_limit(tmp_path, corpus):
    root, config = corpus
    # 13 shard jobs on 2 cores: jobs wait for cores in most scheduling rounds
    assert snakemake_counting_timers(tmp_path, "caches", config=config) == []
    cache = tmp_path / "cache" / "t"
    assert sorted(p.name for p in (cache / "mels").glob("shard-*.bin")) == [f"shard-00{k}.bin" for k in range(4)]
    assert (cache / "index.json").exists()
    # the same scheduler counts them when a limit of the user's own stays: 4 token jobs, then the index
    timers = snakemake_counting_timers(tmp_path, "caches", "--forcerun", "token_shard", "--max-jobs-per-timespan", "50/1s",
                             config=config)
    assert timers and set(timers) == {1}
    plan = snakemake("caches", "-n", config=config)
    assert "Nothing to be done" in plan.stdout + plan.stderr


def test_only_a_local_run_with_the_command_lines_default_limit_loses_it():
    """A run whose jobs go to a cluster (an executor plugin that does not run them here) and a limit of
    the user's own keep Snakemake's job-rate limiter; a local run with the command line's default drops it."""
    from types import SimpleNamespace

    from snakemake.cli import get_argument_parser
    from snakemake.scheduling.job_scheduler import JobRateLimiter
    from snakemake.settings.types import MaxJobsPerTimespan

    from pipeline.scheduling import unthrottle_local

    default = get_argument_parser().get_default("max_jobs_per_timespan")  # what `snakemake` gets unless told

    def workflow(limit, local_exec):
        limiter = JobRateLimiter(MaxJobsPerTimespan.parse_choice(limit)) if limit else None
        return SimpleNamespace(scheduler=SimpleNamespace(job_rate_limiter=limiter), local_exec=local_exec)

    local = workflow(default, local_exec=True)
    assert unthrottle_local(local) is True and local.scheduler.job_rate_limiter is None
    for kept in (workflow(default, local_exec=False), workflow("50/1s", local_exec=True),
                 workflow("100/10s", local_exec=True)):
        before = kept.scheduler.job_rate_limiter
        assert unthrottle_local(kept) is False and kept.scheduler.job_rate_limiter is before
    dry = workflow(None, local_exec=True)  # a dry run: Snakemake made no limiter
    assert unthrottle_local(dry) is False and dry.scheduler.job_rate_limiter is None
