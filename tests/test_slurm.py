"""The caches built on a real SLURM: scripts/local-slurm.sh starts a single-node cluster (munged,
MariaDB, slurmdbd, slurmctld, slurmd), Snakemake submits every job through profiles/slurm, and
`sacct` (SLURM's own accounting) must show each of them as a completed SLURM job.

Needs root and the Debian packages that install.sh installs as root (`scripts/local-slurm.sh install`):
skips without root or apt, and fails when a package the project's files install is missing.
About 2.5 minutes on 2 cores, SLURM's start and stop included.
"""
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_VOCODER, snakemake, write_config

from pipeline import manifest

SCRIPT = ROOT / "scripts" / "local-slurm.sh"
PROFILE = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
TOOLS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd", "sbatch", "sacct")
SHARDS = 2
LOCAL_RULES = {"caches"}  # localrule: runs in the submitting Snakemake, never a SLURM job
# Snakemake's SLURM executor first asks sacct this long after a submission, then 10 s later each
# time, and sooner again once a job finishes: 5 s suits these 10-20 s jobs (the profile says 20).
STATUS_ARGS = ("--slurm-init-seconds-before-status-checks", "5")


def why_not_here():
    """Why this machine cannot run a local SLURM, or None. Only what the project's own files cannot
    install is a reason to skip (no root, no apt); a missing Python package, the executor plugin
    included, or SLURM missing where install.sh could have installed it, is a failure."""
    importlib.metadata.version("snakemake-executor-plugin-slurm")  # requirements.txt installs it
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    if os.geteuid() != 0:
        return "needs root: the local SLURM's daemons run as root (scripts/local-slurm.sh)"
    if missing and not shutil.which("apt-get"):
        return f"SLURM packages absent ({', '.join(missing)}) and no apt-get to install them with"
    assert not missing, f"SLURM packages absent ({', '.join(missing)}): `bash install.sh` as root installs them"
    return None


def tail(path, lines=30):
    path = Path(path)
    return f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


@pytest.fixture(scope="module")
def local_slurm():
    """A running local SLURM for this module; stopped (and its folder deleted) even on failure."""
    reason = why_not_here()
    if reason:
        pytest.skip(reason)
    state = Path(tempfile.mkdtemp(prefix="local-slurm-test-")) / "slurm"  # short: socket paths
    state.parent.chmod(0o755)  # munged wants its socket's folders open to every user
    env = {**os.environ, "LOCAL_SLURM_DIR": str(state)}
    try:
        start = subprocess.run(["bash", str(SCRIPT), "start"], check=False, env=env, capture_output=True, text=True, timeout=240)
        assert start.returncode == 0, f"local SLURM did not start:\n{start.stdout}{start.stderr}"
        yield state
    finally:
        stop = subprocess.run(["bash", str(SCRIPT), "stop"], check=False, env=env, capture_output=True, text=True, timeout=240)
        shutil.rmtree(state.parent, ignore_errors=True)
        assert stop.returncode == 0, f"local SLURM did not stop cleanly:\n{stop.stdout}{stop.stderr}"


def on_slurm(config, state, since):
    """`snakemake --workflow-profile profiles/slurm caches`; returns Snakemake's plan ({rule: jobs}
    from the job stats it prints first, less the local rules) and {(rule, shard): (state, exit)}
    of the SLURM jobs it submitted, as sacct records them (Snakemake names every job of one run by
    its run ID and puts rule and wildcards into the job's comment). Each job must have asked SLURM
    for the memory and time limit the profile gives its rule."""
    # as documented, without --cores (each SLURM job has its own CPUs): planning once stopped on it
    run = snakemake("--workflow-profile", "profiles/slurm", "caches", *STATUS_ARGS, config=config, check=False,
                    cores=None)
    logs = "\n".join(tail(state / "log" / name) for name in ("slurmctld.log", "slurmd.log"))
    out = run.stdout + run.stderr
    assert run.returncode == 0, f"snakemake on SLURM failed:\n{out[-6000:]}\n{logs}"
    stats = out[out.index("Job stats:"):].split("\ntotal")[0]
    plan = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, flags=re.MULTILINE)}
    plan = {rule: n for rule, n in plan.items() if rule not in LOCAL_RULES}
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    sacct = subprocess.run(["sacct", "-X", "-a", "-n", "-P", "--name", run_id, "-S", since,
                            "-o", "JobIDRaw,State,ExitCode,Comment,ReqMem,Timelimit"],
                           capture_output=True, text=True, check=True)
    jobs = {}
    for line in sacct.stdout.splitlines():
        job_id, job_state, exit_code, comment, mem, limit = line.split("|")
        m = re.fullmatch(r"rule_(\w+?)(?:_wildcards_(\d+))?", comment)
        assert m, f"SLURM job {job_id} has no Snakemake rule in its comment: {comment!r}"
        assert m.groups() not in jobs, f"two SLURM jobs for {m.groups()}:\n{sacct.stdout}"
        jobs[m.groups()] = (job_state, exit_code)
        wanted = {**PROFILE["default-resources"], **PROFILE["set-resources"].get(m.group(1), {})}
        assert (mem, limit) == (f"{wanted['mem_mb']}M", f"{wanted['runtime'] // 60:02d}:{wanted['runtime'] % 60:02d}:00")
    submitted = len(re.findall(r"has been submitted with SLURM jobid", out))
    assert submitted == len(jobs), f"Snakemake submitted {submitted} jobs, sacct knows {len(jobs)}:\n{sacct.stdout}"
    return plan, jobs


@pytest.mark.slow
def test_caches_on_local_slurm_then_one_edit_one_token_job(local_slurm, tmp_path, corpus_template):
    since = (datetime.now() - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    config = write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": SHARDS})

    plan, jobs = on_slurm(config, local_slurm, since)
    shard_rules = sorted(rule for rule in plan if rule.endswith("_shard"))
    assert {"token_shard", "mel_shard"} <= set(shard_rules) and all(plan[r] == SHARDS for r in shard_rules)
    assert Counter(rule for rule, _ in jobs) == plan
    for rule in shard_rules:  # every shard of every per-shard rule ran as its own SLURM job
        assert {shard for r, shard in jobs if r == rule} == {f"{k:03d}" for k in range(SHARDS)}
    assert all(s == ("COMPLETED", "0:0") for s in jobs.values()), jobs
    assert (tmp_path / "cache" / "t" / "index.json").exists()

    # edit one line's text: exactly one token_shard job, the edited clip's shard
    meta = root / "metadata.csv"
    lines = meta.read_text().splitlines()
    clip_id, text, *rest = lines[0].split("|")
    lines[0] = "|".join([clip_id, text + " Edited.", *(r + " Edited." for r in rest)])
    meta.write_text("\n".join(lines) + "\n")
    plan, jobs = on_slurm(config, local_slurm, since)
    assert {rule: n for rule, n in plan.items() if rule.endswith("_shard")} == {"token_shard": 1}, plan
    assert Counter(rule for rule, _ in jobs) == plan
    k = manifest.shard_of(clip_id, SHARDS)
    assert [shard for rule, shard in jobs if rule == "token_shard"] == [f"{k:03d}"]
    assert all(s == ("COMPLETED", "0:0") for s in jobs.values()), jobs
    # the SLURM job read its clips from the list the submitting run wrote (sbatch --export=ALL)
    lists = list((tmp_path / "cache" / "t" / ".clips").iterdir())
    assert len(lists) == 1 and f"clips from {lists[0] / f'shard-{k:03d}.json'}" in \
        (tmp_path / "reports" / "t" / "logs" / "token_shard" / f"{k:03d}.log").read_text()


def rules_asking_gpus():
    """Rules whose `resources:` name a gpu, read from rules/*.smk."""
    found = set()
    for smk in (ROOT / "rules").glob("*.smk"):
        for block in re.split(r"^(?=rule )", smk.read_text(), flags=re.MULTILINE):
            m = re.match(r"rule (\w+):", block)
            if m and re.search(r"^\s+gpu=", block, flags=re.MULTILINE):
                found.add(m.group(1))
    return found


def test_slurm_profile_gives_every_gpu_rule_its_gpus():
    # on a login node gpus_wanted() finds no GPU, so the profile must say what each GPU rule gets
    gpu_rules = rules_asking_gpus()
    assert {"train", "diagnose"} <= gpu_rules
    missing = {rule for rule in gpu_rules if "gpu" not in PROFILE["set-resources"].get(rule, {})}
    assert not missing, f"profiles/slurm/config.yaml: set-resources gives no gpu to {sorted(missing)}"


def planned_jobs_resources(out):
    """(rule, what its block prints before `resources:`, [its resources]) of each job in a dry run's output."""
    for m in re.finditer(r"^rule (\w+):\n(.*?)^\s+resources: ([^\n]*)", out, flags=re.MULTILINE | re.DOTALL):
        yield m.group(1), m.group(2), m.group(3).split(", ")


@pytest.mark.parametrize(("extra", "gpus"), [((), 1), (("--resources", "gpu=0"), 0)])
def test_default_profile_gpu_budget_caps_what_train_asks(tmp_path, corpus_template, extra, gpus):
    # profiles/default sets gpu=1; a rule asks at most the budget, so GPU jobs take turns
    config = write_config(tmp_path, corpus_template, train={"placement": "single"})
    out = snakemake("train", "-n", *extra, config=config).stdout
    asked = next(resources for rule, _, resources in planned_jobs_resources(out) if rule == "train")
    assert f"gpu={gpus}" in asked, asked


# NVML as a four-GPU host reports it, for the planning process alone (gpus_wanted() in rules/common.smk)
FOUR_GPUS = "def nvmlInit(): pass\ndef nvmlShutdown(): pass\ndef nvmlDeviceGetCount(): return 4\n"


@pytest.mark.parametrize(("placement", "gpus"), [("auto", 4), ("split", 2)])
def test_train_asks_every_gpu_its_placement_may_use(tmp_path, corpus_template, placement, gpus):
    # auto may choose mirrored over all four (the faster one by the host's last diagnose): it asked for
    # two, so under --resources gpu=4 another GPU job could start beside a train that uses every GPU
    (tmp_path / "nvml").mkdir()
    (tmp_path / "nvml" / "pynvml.py").write_text(FOUR_GPUS)
    config = write_config(tmp_path, corpus_template, train={"placement": placement})
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory",
                           str(ROOT), "--nolock", "--cores", "2", "train", "-n", "--resources", "gpu=8",
                           "--configfile", str(config)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "nvml")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    asked = next(resources for rule, _, resources in planned_jobs_resources(proc.stdout) if rule == "train")
    assert f"gpu={gpus}" in asked, asked


# Every job that runs TensorFlow either takes a GPU turn (TensorFlow uses every GPU it sees and
# reserves most of its memory) or keeps off the GPUs (pipeline.placement.cpu_only, tests/test_placement.py);
# the shard jobs run no TensorFlow. A new rule must be put in one of the three.
GPU_TURN = {"train_aligner", "train", "diagnose", "evaluate", "synthesize", "train_vocoder", "finetune_vocoder"}
CPU_ONLY = {"gta_shard", "export"}
NO_TENSORFLOW = {"token_shard", "mel_shard", "pitch_shard", "cache_index", "duration_shard"}


def test_every_tensorflow_job_takes_a_gpu_turn_or_keeps_off_the_gpus(tmp_path, corpus_template):
    # placement single: one GPU wanted without NVML; a trained vocoder, so its three rules are planned
    config = write_config(tmp_path, corpus_template, train={"placement": "single"}, vocoder=TINY_VOCODER)
    out = snakemake("all", "-n", config=config).stdout
    asked = {}
    for rule, _, resources in planned_jobs_resources(out):
        gpu = next((int(r.split("=")[1]) for r in resources if r.startswith("gpu=")), 0)
        asked.setdefault(rule, set()).add(gpu)
    asked.pop("all")  # the target: it runs nothing
    assert set(asked) == GPU_TURN | CPU_ONLY | NO_TENSORFLOW, sorted(asked)
    assert {rule for rule, gpus in asked.items() if gpus == {1}} == GPU_TURN, asked
    assert all(asked[rule] == {0} for rule in CPU_ONLY | NO_TENSORFLOW), asked


def planned_threads(config, cores):
    out = snakemake("all", "-n", "--cores", str(cores), "--max-threads", "64", config=config).stdout
    threads = {}
    for rule, before, _ in planned_jobs_resources(out):
        found = re.search(r"^\s+threads: (\d+)$", before, flags=re.MULTILINE)
        threads[rule] = int(found.group(1)) if found else 1  # Snakemake prints no threads: 1
    return threads


def test_the_aligner_and_the_vocoder_split_the_cores_only_when_both_train(tmp_path, corpus_template):
    # both need only the caches: on 4 cores each asks 2, so they run side by side; train asks them all
    both = planned_threads(write_config(tmp_path, corpus_template, vocoder=TINY_VOCODER), 4)
    assert (both["train_aligner"], both["train_vocoder"], both["train"], both["evaluate"]) == (2, 2, 4, 4), both
    # no vocoder to train (Griffin-Lim): the aligner has the cores to itself
    alone = planned_threads(write_config(tmp_path, corpus_template), 4)  # write_config's default
    assert "train_vocoder" not in alone and alone["train_aligner"] == 4, alone


def sbatch_template_srun(tmp_path, env, *args):
    """scripts/train-multiworker.sbatch run by bash as SLURM runs it, with stand-in srun (prints each
    argument it was given on a line) and scontrol (no MpiParams): srun's arguments."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "srun").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (bin_ / "scontrol").write_text("#!/bin/sh\necho 'ClusterName = demo'\n")
    for tool in ("srun", "scontrol"):
        (bin_ / tool).chmod(0o755)
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "train-multiworker.sbatch"), *args], capture_output=True,
                          text=True, timeout=60, env={**base, "PATH": f"{bin_}:{base['PATH']}", **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_sbatch_template_gives_each_worker_the_cpus_of_its_task(tmp_path):
    # Slurm 22.05 and later: srun no longer reads SLURM_CPUS_PER_TASK, so a step started without
    # --cpus-per-task ran each worker on one CPU of the 16 its task holds, with `--threads 16`
    config = tmp_path / "my runs" / "voice one.yaml"  # a path with spaces stays one argument
    srun = sbatch_template_srun(tmp_path, {"SLURM_CPUS_PER_TASK": "16"}, str(config), "--set", "train.steps=5")
    program = srun.index("python")
    assert "--cpus-per-task=16" in srun[:program], srun
    assert srun[program:] == ["python", "-m", "pipeline.train", "--config", str(config), "--threads", "16",
                              "--set", "train.steps=5", "--set", "train.placement=multiworker"]
    # the #SBATCH line removed (no SLURM_CPUS_PER_TASK): srun and training keep their own defaults
    srun = sbatch_template_srun(tmp_path, {}, "my.yaml")
    assert not any(a.startswith("--cpus-per-task") for a in srun) and srun[-3:-2] == ["0"], srun


def test_a_slurm_job_stops_on_a_clip_changed_after_planning(tmp_path, corpus_template):
    # A SLURM job reads the Snakefile again on its node (Snakemake's remote mode) before its command runs.
    # That planning recorded the file it found in the stamps memo the submitting run had named to the
    # jobs as what it read, so a clip changed while the job waited in the queue was built into the shard
    # under the old key, with no word: the job's check compared the file with itself
    import numpy as np
    import soundfile as sf

    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    config = write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": SHARDS})
    (tmp_path / "cache" / "t").mkdir(parents=True)
    snakemake("caches", "-n", config=config)  # the submitting run's planning records the memo
    memo = tmp_path / "cache" / "t" / manifest.STAMPS_FILE
    planned = memo.read_bytes()
    clip_id = (root / "metadata.csv").read_text().split("|")[0]
    wav = root / "wavs" / f"{clip_id}.wav"
    y, sr = sf.read(str(wav), dtype="int16")
    sf.write(str(wav), np.roll(y, 1), sr, subtype="PCM_16")  # the same size, other bytes
    shard = f"{manifest.shard_of(clip_id, SHARDS):03d}"
    # the job's command line as the SLURM executor's job step gives it (--mode remote, no onstart)
    job = snakemake("--mode", "remote", "--no-hooks", "--force", "--target-jobs", f"mel_shard:shard={shard}",
                    "--allowed-rules", "mel_shard", config=config, check=False)
    log = (tmp_path / "reports" / "t" / "logs" / "mel_shard" / f"{shard}.log").read_text()
    assert job.returncode != 0 and f"{wav}: changed while this run was under way" in log, log
    assert memo.read_bytes() == planned
    assert not (tmp_path / "cache" / "t" / "mels" / f"shard-{shard}.json").exists()
