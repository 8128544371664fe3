"""Snakemake's own cost against the shard count: planning and scheduling CPU per shard, tiny clips.

    python benchmarks/snakemake_scale.py                              # plan at 128, 512, 1,024 shards; build at 48
    python benchmarks/snakemake_scale.py --plan 128,512,1024 --build 128
    python benchmarks/snakemake_scale.py --project /path/to/other/checkout --json .bench/scale-old.json

One corpus of --clips tiny clips (0.3 s harmonic tones, the first words of the LJSpeech transcript
lines as text, wav at 22,050 Hz: made once under --workdir) is planned (`snakemake -n caches` on
the unbuilt cache: wall time and Snakemake's CPU) at each --plan shard count, and built for real
(`snakemake --cores 2 caches` from scratch: Snakemake's own CPU, its jobs' CPU, wall) at each
--build shard count, then planned again once built (`-n caches`: what every later command pays).
Snakemake's CPU is its process's getrusage; the jobs' CPU is its children's. `--project` runs
another checkout's Snakefile on the same corpus (same cache layout), for a before/after ratio in
one run. Figures go to {workdir}/snakemake_scale.json (or --json), with the load average.
"""
import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SR = 22050


def make_corpus(root, clips):
    """`clips` tiny clips: 0.3 s of a 10-harmonic tone at 110-220 Hz, text from the transcripts."""
    if (root / "metadata.csv").exists() and len((root / "metadata.csv").read_text().splitlines()) == clips:
        return root
    shutil.rmtree(root, ignore_errors=True)
    (root / "wavs").mkdir(parents=True)
    lines = common.TRANSCRIPTS.read_text(encoding="utf-8").splitlines()
    t = np.arange(int(0.3 * SR)) / SR
    rows = []
    for i in range(clips):
        f0 = 110 + 110 * (i % 97) / 97
        y = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 11)) * 0.1
        cid = f"T{i:06d}"
        sf.write(str(root / "wavs" / f"{cid}.wav"), y.astype(np.float32), SR, subtype="PCM_16")
        words = lines[i % len(lines)].split("|")[1].split()[:2]
        rows.append(f"{cid}|{' '.join(words)}|")
    (root / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def config_for(workdir, root, shards, tag):
    cfg = {"name": f"scale{shards}", "dataset": {"root": str(root)},
           "cache": {"dir": str(workdir / f"cache-{tag}"), "shards": shards},
           "runs_dir": str(workdir / f"runs-{tag}"), "reports_dir": str(workdir / f"reports-{tag}")}
    path = workdir / f"config-{tag}-{shards}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, Path(cfg["cache"]["dir"]) / cfg["name"]


def snakemake(project, *args, config, scheduler=None):
    res = common.snakemake(*args, *(["--scheduler", scheduler] if scheduler else []), config=config, project=project)
    return dict(wall=round(res["wall"], 3), snakemake_cpu=round(res["self_cpu"], 3), jobs_cpu=round(res["jobs_cpu"], 3))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR / "scale")
    p.add_argument("--project", type=Path, default=common.ROOT, help="the checkout whose Snakefile runs")
    p.add_argument("--clips", type=int, default=1024)
    p.add_argument("--plan", type=lambda s: [int(x) for x in s.split(",") if x], default=[128, 512, 1024])
    p.add_argument("--build", type=lambda s: [int(x) for x in s.split(",") if x], default=[48])
    p.add_argument("--scheduler", choices=["greedy", "ilp"], default=None,
                   help="Snakemake's --scheduler for the builds (default: the profile's)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    project = args.project.resolve()
    tag = "x" + str(abs(hash(str(project))) % 10**6)
    root = make_corpus(args.workdir / f"corpus{args.clips}", args.clips)
    result = dict(machine=common.machine_info(), project=str(project), clips=args.clips, plan={}, build={},
                  scheduler=args.scheduler,
                  load_start=os.getloadavg())
    for shards in args.plan:
        config, cache = config_for(args.workdir, root, shards, tag)
        shutil.rmtree(cache, ignore_errors=True)
        r = snakemake(project, "caches", "-n", "--quiet", "rules", config=config)
        r["per_shard_ms"] = round(1000 * r["snakemake_cpu"] / shards, 2)
        result["plan"][shards] = r
        print(f"plan {shards} shards (unbuilt): {r}", flush=True)
    for shards in args.build:
        config, cache = config_for(args.workdir, root, shards, tag)
        shutil.rmtree(cache, ignore_errors=True)
        t = time.time()
        r = snakemake(project, "caches", "--quiet", "all", config=config, scheduler=args.scheduler)
        r["per_shard_ms"] = round(1000 * r["snakemake_cpu"] / shards, 2)
        r["snakemake_share_of_jobs"] = round(r["snakemake_cpu"] / max(r["jobs_cpu"], 1e-9), 3)
        r["planned_built"] = snakemake(project, "caches", "-n", "--quiet", "rules", config=config)
        result["build"][shards] = r
        print(f"build {shards} shards: {r} ({time.time() - t:.0f} s)", flush=True)
    result["load_end"] = os.getloadavg()
    out = args.json or args.workdir / "snakemake_scale.json"
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out}; load average {result['load_start'][0]:.1f} -> {result['load_end'][0]:.1f}")


if __name__ == "__main__":
    main()
