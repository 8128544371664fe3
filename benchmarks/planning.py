"""Planning time: `snakemake -n train` and `-n caches` on a built 13,100-clip corpus, this checkout against another.

    python benchmarks/planning.py --against /path/to/a/checkout/of/the/previous/commit   # ~2 min once built
    python benchmarks/planning.py --clips 2000 --shards 32                                # a smaller corpus

The corpus and config are part b's of benchmarks/preprocess.py (espeak-ng clips under
{workdir}/corpus, 128 shards, config {workdir}/preprocess/full/config-s128.yaml); its caches are
built first with this checkout when they are not up to date. Then, for --repeats rounds, each
command runs once per checkout, the order alternating round by round, so both see the same machine.
Both checkouts plan against the same caches (the config's paths are absolute), and the baseline
gets a copy of this checkout's .snakemake/metadata records (Snakemake reads one per output file to
check params and code; without them it plans faster than any checkout that built the caches). Figures: wall time (the target: `-n train` <= 2 s on an idle machine), CPU
(Snakemake and everything it started), Snakemake's peak RSS, and the jobs each planned, which must
agree. Also Snakemake's own floor: `snakemake -n` of a one-rule Snakefile, the same CLI and
plugins, nothing of ours.

Figures go to {workdir}/planning.json.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ROOT  # noqa: E402

TARGET_S = 2.0


def log(*a):
    print(*a, flush=True)


def one_rule_floor(workdir, repeats):
    """`snakemake -n` on a Snakefile of one rule: Snakemake's start-up, CLI and plugins alone."""
    d = Path(tempfile.mkdtemp(prefix="floor-", dir=workdir))
    (d / "Snakefile").write_text('rule a:\n    output:\n        "a.txt"\n    shell:\n        "touch {output}"\n')
    runs = [common.run_timed([sys.executable, "-m", "snakemake", "--cores", "2", "-n"], cwd=d) for _ in range(repeats)]
    return {"wall_s": common.median([r["wall"] for r in runs]), "cpu_s": common.median([r["cpu"] for r in runs])}


def summarise(runs):
    return {"wall_s": round(common.median([r["wall"] for r in runs]), 3),
            "wall_min_max": [round(min(r["wall"] for r in runs), 3), round(max(r["wall"] for r in runs), 3)],
            "cpu_s": round(common.median([r["cpu"] for r in runs]), 3),
            "snakemake_peak_rss_mb": round(common.median([r["self_maxrss_mb"] for r in runs]), 1),
            "planned": common.parse_planned(runs[0]["out"])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    p.add_argument("--against", type=Path, default=None, help="another checkout (the baseline), e.g. the previous commit's")
    p.add_argument("--clips", type=int, default=13100)
    p.add_argument("--shards", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    workdir = args.workdir.resolve()
    out = {"benchmark": "planning", "command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
           "machine": common.machine_info()}
    log(common.machine_line(out["machine"]))

    corpus = workdir / "corpus" / f"lj-{args.clips}-flac22050"
    made = common.ensure_corpus(corpus, args.clips, log=log)
    bdir = workdir / "preprocess" / "full"
    cfg = common.bench_config(bdir / f"config-s{args.shards}.yaml", name=f"lj{args.clips}-s{args.shards}",
                              dataset_root=corpus, workdir=bdir, shards=args.shards)
    log(f"{made['clips']} clips, {args.shards} shards: bringing the caches up to date ...")
    common.snakemake("caches", config=cfg)

    projects = {"this checkout": ROOT}
    if args.against:
        projects["baseline"] = args.against.resolve()
        out["baseline"] = {"path": str(projects["baseline"]),
                           "commit": common.run_timed(["git", "rev-parse", "--short", "HEAD"], cwd=projects["baseline"],
                                                      check=False)["out"].strip()}  # "fatal: ..." outside git
        # Snakemake reads each output's record (.snakemake/metadata) to check params and code: the
        # baseline gets this checkout's records, or it would plan without reading any, faster than
        # a user's checkout that built the caches does
        shutil.copytree(ROOT / ".snakemake" / "metadata", projects["baseline"] / ".snakemake" / "metadata",
                        dirs_exist_ok=True)
    runs = {(name, target): [] for name in projects for target in ("train", "caches")}
    for target in ("train", "caches"):  # one warm-up each, not counted: the page cache, .snakemake/
        for project in projects.values():
            common.snakemake(target, "-n", config=cfg, project=project)
    t0 = time.perf_counter()
    for k in range(args.repeats):
        order = list(projects.items()) if k % 2 == 0 else list(projects.items())[::-1]
        for target in ("train", "caches"):
            for name, project in order:
                runs[(name, target)].append(common.snakemake(target, "-n", config=cfg, project=project))
    out["loadavg_after_runs"] = [round(x, 2) for x in os.getloadavg()]
    out["runs_s"] = round(time.perf_counter() - t0, 1)
    out["results"] = {f"{name}: -n {target}": summarise(r) for (name, target), r in runs.items()}
    out["snakemake_one_rule_floor"] = one_rule_floor(workdir, args.repeats)

    rows = [[key, r["wall_s"], f"{r['wall_min_max'][0]}-{r['wall_min_max'][1]}", r["cpu_s"], r["snakemake_peak_rss_mb"],
             sum(r["planned"].values())] for key, r in out["results"].items()]
    rows.append(["Snakemake alone: one-rule Snakefile, -n", out["snakemake_one_rule_floor"]["wall_s"], "",
                 out["snakemake_one_rule_floor"]["cpu_s"], "", 1])
    log(common.table(rows, ["", "wall s (median)", "min-max", "CPU s", "Snakemake peak RSS MB", "jobs planned"]))
    here = out["results"]["this checkout: -n train"]
    out["train_target_s"] = TARGET_S
    out["train_target_met"] = here["wall_s"] <= TARGET_S
    if args.against:
        base = out["results"]["baseline: -n train"]
        out["train_wall_ratio"] = round(base["wall_s"] / here["wall_s"], 3)
        out["same_plans"] = all(out["results"][f"this checkout: -n {t}"]["planned"] == out["results"][f"baseline: -n {t}"]["planned"]
                                for t in ("train", "caches"))
        log(f"-n train: {base['wall_s']:.2f} s -> {here['wall_s']:.2f} s ({out['train_wall_ratio']:.2f}x); "
            f"same jobs planned: {out['same_plans']}")
    log(f"-n train <= {TARGET_S} s: {common.verdict(out['train_target_met'])} "
        f"(load average after the runs {out['loadavg_after_runs'][0]})")
    path = common.write_json(args.json or workdir / "planning.json", out)
    log(f"figures in {path}")


if __name__ == "__main__":
    main()
