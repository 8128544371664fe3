"""Two local `multiworker` workers against one worker: the same loss drop per example.

    python benchmarks/multiworker.py                   # seeds 0 1 2, 80 steps each
    python benchmarks/multiworker.py --seeds 0 --steps 40

On the demo corpus's caches (configs/config.yaml; `snakemake durations` builds them when missing) and
its FastPitch, each seed trains twice from the same initial weights (train.seed) with the same global
batch (train.batch_size): one worker (`python -m pipeline.train`) batching it from every shard, and two
workers (`python -m pipeline.launch --workers 2`, on 127.0.0.1) batching half of it each from disjoint
shards and averaging their gradients. Both see the same number of examples, so the validation loss
(the chief's validation clips, at step 0 and at the last step) should drop by the same amount. The
data order differs (each worker shuffles its own shards), so the drops are not equal to the bit.

Target: the drop ratio (two workers / one) within 1 +- 0.05 for every seed, and both workers' weights
equal at the end (the checksums they print). Wall and CPU are reported too; here the two workers share
the same two CPU cores, so they measure no speed-up. Runs go under .bench/multiworker/ (never runs/);
the figures to .bench/multiworker.json.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from pipeline import config  # noqa: E402

TOLERANCE = 0.05  # the test's tolerance (tests/test_multiworker.py): the data order moves the ratio ~1 %


def run_config(work, cfg, seed, kind, steps):
    """A config over configs/config.yaml: the demo's caches (same name, absolute folders), a runs and
    reports folder of this run's own under `work`, and the seed and step count."""
    folder = Path(work) / f"seed{seed}-{kind}"
    return common.write_config(folder / "config.yaml", {
        "dataset": {"root": str(Path(cfg["dataset"]["root"]).resolve())},
        "cache": {"dir": str(Path(cfg["cache"]["dir"]).resolve())},
        "runs_dir": str(folder / "runs"), "reports_dir": str(folder / "reports"),
        "train": {"steps": steps, "seed": seed, "checkpoint_every": steps, "summary_every": steps, "log_every": 10},
    })


def summary(path):
    cfg = config.load_config(path)
    return json.loads((config.run_dir(cfg) / "train.json").read_text())


def checksums(log):
    """{worker: weights checksum} from the launcher's prefixed output."""
    return {int(w): float(x) for w, x in re.findall(r"\[worker (\d)\] .*weights checksum ([-\d.e+]+)", log)}


def one_seed(work, cfg, seed, steps, log):
    row = {"seed": seed}
    for kind in ("one", "two"):
        path = run_config(work, cfg, seed, kind, steps)
        run = config.run_dir(config.load_config(path))
        shutil.rmtree(run, ignore_errors=True)  # a fresh run: never a resume of an earlier one
        cmd = ([sys.executable, "-m", "pipeline.train", "--config", path] if kind == "one" else
               [sys.executable, "-m", "pipeline.launch", "--workers", "2", "--", "--config", path])
        res = common.run_timed(cmd, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
        s = summary(path)
        (v0, v1) = (s["val_loss"][0]["total"], s["val_loss"][-1]["total"])
        row[kind] = {"val_start": v0, "val_end": v1, "drop": v0 - v1, "wall_s": round(res["wall"], 1),
                     "cpu_s": round(res["cpu"], 1), "placement": s["placement"], "steps": s["steps"]}
        if kind == "two":
            row[kind]["checksums"] = checksums(res["out"])
        log(f"seed {seed}, {kind} worker(s): validation loss {v0:.4f} -> {v1:.4f} (drop {v0 - v1:.4f}), "
            f"{res['wall']:.0f} s wall, {res['cpu']:.0f} CPU s, placement {s['placement']}")
    row["ratio"] = row["two"]["drop"] / row["one"]["drop"]
    sums = row["two"]["checksums"]
    row["same_weights"] = set(sums) == {0, 1} and abs(sums[0] - sums[1]) <= 1e-9 * max(1.0, abs(sums[0]))
    row["same_start"] = abs(row["one"]["val_start"] - row["two"]["val_start"]) < 1e-4
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--work", default=str(common.DEFAULT_WORKDIR / "multiworker"))
    parser.add_argument("--out", default=str(common.DEFAULT_WORKDIR / "multiworker.json"))
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    machine = common.machine_info()
    if not (config.cache_dir(cfg) / "durations").exists():
        subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "durations", "--quiet"], cwd=common.ROOT,
                       check=True)
    rows = [one_seed(args.work, cfg, seed, args.steps, print) for seed in args.seeds]
    met = all(abs(r["ratio"] - 1) <= TOLERANCE and r["same_weights"] and r["same_start"] for r in rows)
    print(common.table([[r["seed"], r["one"]["drop"], r["two"]["drop"], round(r["ratio"], 3), r["same_start"],
                         r["same_weights"], r["one"]["wall_s"], r["two"]["wall_s"]] for r in rows],
                       ["seed", "drop, 1 worker", "drop, 2 workers", "ratio", "same start", "same weights",
                        "wall 1 (s)", "wall 2 (s)"]))
    print(f"target: ratio within 1 +- {TOLERANCE} for every seed, equal weights on both workers: "
          f"{common.verdict(met)}")
    print(common.machine_line(machine))
    common.write_json(args.out, {"machine": machine, "steps": args.steps, "batch_size": cfg["train"]["batch_size"],
                                 "model": cfg["model"]["kind"], "tolerance": TOLERANCE, "rows": rows, "met": met})


if __name__ == "__main__":
    main()
