"""What the pipeline changes in Snakemake's scheduling of a run whose jobs run on this machine.

Snakemake's command line limits how fast jobs are submitted (`--max-jobs-per-timespan`, default
100/1s). Its scheduler enforces the limit with a timer: every scheduling round that leaves jobs
waiting starts a one-second `threading.Timer` that wakes the scheduler again, and that round, if
jobs still wait, starts the next one. Each job that ends while others wait starts one more such
chain. So while a build has jobs waiting for cores, the scheduler wakes about once a second for
every job that has ended so far, and each wake-up goes over every waiting job. The build's
scheduling cost grows with the square of its job count. On the 13,100-clip corpus (385 shard jobs on
2 cores) Snakemake's own process took 64.0 CPU s with the limit and 18.7 CPU s without it
(benchmarks/RESULTS.md).

A local run gains nothing from the limit: --cores bounds its jobs, and the scheduler also wakes
whenever a job ends. `unthrottle_local(workflow)`, called from `onstart` (rules/common.smk), drops
the command line's default limit for such runs. Snakemake's Python API has no limit by default
either (`SchedulingSettings.max_jobs_per_timespan` is None). Two cases keep the limit:
- a run whose jobs go to a cluster (an executor plugin, such as SLURM's), where the limit protects
  the cluster's scheduler;
- a limit the user gave on the command line or in a profile, unless it is the default itself
  (100/1s given by hand cannot be told apart from the default).
"""
CLI_DEFAULT = (100, 1)  # snakemake's --max-jobs-per-timespan default, 100/1s: (jobs, seconds)


def unthrottle_local(workflow):
    """Drop Snakemake's default job-rate limit from `workflow`'s scheduler when its jobs run on this
    machine. Call it from `onstart`, after Snakemake made the scheduler and before it schedules.
    Returns True when the limit was dropped."""
    scheduler = getattr(workflow, "scheduler", None)
    limiter = getattr(scheduler, "job_rate_limiter", None)
    if limiter is None or not getattr(workflow, "local_exec", False):
        return False
    if (limiter.max_jobs, limiter.timespan) != CLI_DEFAULT:
        return False  # the user's own limit
    scheduler.job_rate_limiter = None
    return True
