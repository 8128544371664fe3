"""The duration stage on the demo corpus: `snakemake durations` (the aligner in NumPy) against the
same shards aligned by the TensorFlow model, as the jobs did before, in the same run.

    python benchmarks/durations.py                 # ~3 min on 2 cores (caches + aligner once, then 3 repeats)
    python benchmarks/durations.py --repeats 5

Builds data/demo's caches and aligner with configs/config.yaml (under --workdir, default .bench/),
then, alternating, `repeats` times:
  - the stage: every duration shard deleted, `snakemake --cores 2 durations` (wall, CPU of Snakemake
    and its jobs; target <= 15 s wall on 2 cores);
  - the baseline: one fresh Python per shard, two at a time (as `--cores 2` runs them), each
    importing pipeline.align (TensorFlow), loading the aligner with `align.load_aligner` and
    aligning its shard's clips with `align.log_probs` + `durations.mas`: what a duration_shard job
    ran before; its durations are compared with the shards' for every clip.
Figures go to {workdir}/durations.json.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ROOT  # noqa: E402

TARGET_WALL_S = 15.0

# one shard through the TensorFlow forward pass; prints {"cpu", "durations": {id: [..]}} as JSON
BASELINE = r"""
import json, resource, sys
import numpy as np
from pipeline import align, durations, shards
from pipeline.models import aligner_numpy
aligner_json, tokens, mels = sys.argv[1:4]
model, info = align.load_aligner(None, aligner_json)
to_id = {ord(s): i for i, s in enumerate(info["vocab"])}
tmeta, tok = shards.read(tokens, "tokens")
mmeta, mel = shards.read(mels, "mels")
mel_of = dict(zip(mmeta["ids"], mel))
names = {f: tmeta.get(f"{f}s") or [""] * len(tmeta["ids"]) for f in ("speaker", "language")}
out = {}
for i, (cid, points) in enumerate(zip(tmeta["ids"], tok)):
    m = mel_of.get(cid)
    if m is None or len(m) < len(points):
        continue
    ids = np.array([to_id[int(c)] for c in points], np.int32)
    voices = aligner_numpy.voice_ids(info, names["speaker"][i], names["language"][i])
    out[cid] = durations.mas(align.log_probs(model, info, ids, m, voices)).tolist()
r = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": r.ru_utime + r.ru_stime, "durations": out}))
"""


def log(*a):
    print(*a, flush=True)


def baseline(aligner_json, cache, shards):
    """The TensorFlow way, two shards at a time: (wall s, [per-job CPU s], {id: durations})."""
    def one(k):
        prefix = cache / "tokens" / f"shard-{k:03d}"
        res = common.run_timed([sys.executable, "-c", BASELINE, str(aligner_json), str(prefix),
                                str(cache / "mels" / f"shard-{k:03d}")])
        return json.loads(res["out"].strip().splitlines()[-1])

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, range(shards)))
    wall = time.perf_counter() - t0
    return wall, [r["cpu"] for r in results], {cid: d for r in results for cid, d in r["durations"].items()}


def written(cache, shards):
    from pipeline import shards as pshards
    out = {}
    for k in range(shards):
        meta, arrays = pshards.read(cache / "durations" / f"shard-{k:03d}", "durations")
        out.update({cid: d.tolist() for cid, d in zip(meta["ids"], arrays)})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    import yaml

    workdir = args.workdir.resolve() / "durations"
    shards = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())["cache"]["shards"]
    cfg = common.bench_config(workdir / "config.yaml", name="durdemo", dataset_root=ROOT / "data" / "demo",
                              workdir=workdir)
    cache = workdir / "cache" / "durdemo"
    out = {"benchmark": "durations", "command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
           "machine": common.machine_info(), "shards": shards, "target_wall_s": TARGET_WALL_S, "runs": []}
    log(common.machine_line(out["machine"]))
    log("building data/demo's caches and aligner ...")
    common.snakemake("aligner", config=cfg)
    aligner_json = next((workdir / "runs" / "durdemo" / "aligner").glob("*/aligner.json"))
    for rep in range(args.repeats):
        shutil.rmtree(cache / "durations", ignore_errors=True)
        stage = common.snakemake("durations", config=cfg)
        got = written(cache, shards)
        b_wall, b_cpu, want = baseline(aligner_json, cache, shards)
        same = sum(got[cid] == d for cid, d in want.items())
        run = {"stage_wall_s": stage["wall"], "stage_cpu_s": stage["cpu"], "snakemake_self_cpu_s": stage["self_cpu"],
               "jobs_cpu_s": stage["jobs_cpu"], "load1_after": stage["load1_after"],
               "baseline_wall_s": b_wall, "baseline_jobs_cpu_s": sum(b_cpu), "baseline_job_cpu_s": b_cpu,
               "clips_compared": len(want), "clips_identical": same}
        out["runs"].append(run)
        log(f"  [{rep + 1}/{args.repeats}] snakemake durations {stage['wall']:.1f} s wall, {stage['jobs_cpu']:.1f} "
            f"CPU s in jobs; TensorFlow baseline {b_wall:.1f} s wall, {sum(b_cpu):.1f} CPU s; "
            f"{same}/{len(want)} clips identical; load {stage['load1_after']}")
    runs = sorted(out["runs"], key=lambda r: r["stage_wall_s"])
    med = runs[len(runs) // 2]
    out["median"] = med
    out["met"] = med["stage_wall_s"] <= TARGET_WALL_S and all(r["clips_identical"] == r["clips_compared"] for r in runs)
    out["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    log(common.table([[f"{med['stage_wall_s']:.1f}", f"{med['jobs_cpu_s']:.1f}", f"{med['snakemake_self_cpu_s']:.1f}",
                       f"{med['baseline_wall_s']:.1f}", f"{med['baseline_jobs_cpu_s']:.1f}",
                       f"{med['baseline_wall_s'] / med['stage_wall_s']:.1f}x",
                       f"{med['clips_identical']}/{med['clips_compared']}"]],
                     ["stage wall s", "jobs CPU s", "Snakemake CPU s", "TF baseline wall s", "TF jobs CPU s",
                      "speed-up (wall)", "identical clips"]))
    log(f"duration stage <= {TARGET_WALL_S:.0f} s wall with identical durations: {common.verdict(out['met'])}")
    common.write_json(args.workdir.resolve() / "durations.json", out)


if __name__ == "__main__":
    main()
