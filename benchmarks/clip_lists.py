"""What a shard job pays to find its own clips: reading the whole dataset, against reading the list the
run wrote for it (pipeline/manifest.py, write_clip_lists / shard_manifest); and, with --against, what
the job cost before (another checkout's pipeline/, e.g. before the jobs kept freed memory).

    python benchmarks/clip_lists.py                      # ~4 min: part a, then part b
    python benchmarks/clip_lists.py --part a --against /path/to/a/checkout/of/the/previous/commit

a) The real jobs on part b of benchmarks/preprocess.py's corpus (13,100 espeak-ng clips, 128 shards,
   config {workdir}/preprocess/full/config-s128.yaml): token, mel and pitch jobs of the first
   --jobs shards, with the shell command its rule gives it, each run once per variant, back to
   back, the order alternating: this checkout reading the dataset, this checkout given the run's
   list, and (--against) the other checkout. CPU per job (the job's process, from
   RUSAGE_CHILDREN), the saving as the median of same-shard pairs, and every output file compared
   byte for byte with the first variant's.
b) The scale: a metadata.csv of ROWS synthetic rows (text only, no audio: the manifest is all that
   is timed) at SHARDS shards, for each --scales ROWS:SHARDS (13,100:128 and 1,000,000:4,096), in
   this process: what one job spent finding its clips
   (load_manifest(...)[shard]: every row parsed and hashed), what it spends now (shard_manifest
   through the list), and what the run pays once per dataset change (write_clip_lists) and once
   per run (write_clip_lists with nothing to write).

Figures go to {workdir}/clip_lists.json.
"""
import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT))
from pipeline import config as pconfig  # noqa: E402
from pipeline import manifest  # noqa: E402

KINDS = ("tokens", "mels", "pitch")


def log(*a):
    print(*a, flush=True)


def job_command(kind, cfg, shard, out):
    """The shell command of the kind's rule (rules/cache.smk), with the config sections rules/functions/cache.smk passes."""
    ds = cfg["dataset"]
    if kind == "tokens":
        job = dict(dataset={k: ds[k] for k in ("root", "metadata", "audio_dir")}, text=cfg["text"])
    else:
        audio_ds = {k: v for k, v in ds.items() if k != "val_fraction"}
        job = dict(dataset=audio_ds, audio=cfg["audio"]) if kind == "mels" else \
            dict(dataset=audio_ds, audio={k: cfg["audio"][k] for k in ("sample_rate", "hop_length")}, pitch=cfg["pitch"])
    job["cache"] = {"shards": cfg["cache"]["shards"]}
    return common.shard_job_command(kind, json.dumps(job, sort_keys=True), shard, out)


def part_a(workdir, n_jobs, against, out):
    bdir = workdir / "preprocess" / "full"
    corpus = workdir / "corpus" / "lj-13100-flac22050"
    common.ensure_corpus(corpus, 13100, log=log)
    cfg_path = common.bench_config(bdir / "config-s128.yaml", name="lj13100-s128", dataset_root=corpus,
                                   workdir=bdir, shards=128)
    cfg = pconfig.load_config(cfg_path)
    ds, shards = cfg["dataset"], cfg["cache"]["shards"]
    scratch = Path(tempfile.mkdtemp(prefix="clip-lists-", dir=workdir))
    lists = manifest.write_clip_lists(manifest.load_manifest(ds, shards), shards, scratch / "lists", ds)
    env = {pconfig.VALIDATED_ENV: pconfig.schema_digest(), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    # (name, checkout whose pipeline/ runs the job, environment)
    variants = [("reads the dataset", ROOT, {**env, manifest.CLIP_LISTS_ENV: ""}),
                ("given the run's list", ROOT, {**env, manifest.CLIP_LISTS_ENV: str(lists)})]
    if against:
        commit = common.run_timed(["git", "rev-parse", "--short", "HEAD"], cwd=against, check=False)["out"].strip()
        variants.insert(0, (f"before ({commit})", against, {**env, manifest.CLIP_LISTS_ENV: ""}))
    cpu = {(v[0], k): [] for v in variants for k in KINDS}
    for shard in range(n_jobs):
        for kind in KINDS:
            order = variants if (shard + KINDS.index(kind)) % 2 == 0 else variants[::-1]
            for name, checkout, venv in order:
                r = common.run_timed(job_command(kind, cfg, shard, scratch / f"v{variants.index((name, checkout, venv))}"),
                                     env=venv, cwd=checkout)
                cpu[(name, kind)].append(r["cpu"])
    same = differ = 0
    for f in sorted((scratch / "v0").rglob("shard-*")):
        for v in range(1, len(variants)):
            if (scratch / f"v{v}" / f.relative_to(scratch / "v0")).read_bytes() == f.read_bytes():
                same += 1
            else:
                differ += 1
                log(f"DIFFERS: {variants[v][0]}: {f.relative_to(scratch / 'v0')}")
    shutil.rmtree(scratch)
    first = variants[0][0]
    res = {"clips": sum(len(c) for c in manifest.load_manifest(ds, shards).values()), "shards": shards,
           "jobs_per_kind": n_jobs, "variants": [v[0] for v in variants], "files_identical": same,
           "files_differing": differ, "per_job_cpu_s": {}, "saved_a_job_cpu_s": {}}
    rows = []
    for kind in KINDS:
        res["per_job_cpu_s"][kind] = {v[0]: round(common.median(cpu[(v[0], kind)]), 3) for v in variants}
        rows.append([kind, *res["per_job_cpu_s"][kind].values()])
    for name, _, _ in variants[1:]:  # paired: the same shard's job, run back to back
        res["saved_a_job_cpu_s"][name] = {kind: round(common.median([b - a for b, a in zip(cpu[(first, kind)],
                                                                                          cpu[(name, kind)])]), 3)
                                          for kind in KINDS}
        total = sum(res["saved_a_job_cpu_s"][name].values()) * shards
        res["saved_a_job_cpu_s"][name]["full build, one job per shard and kind"] = round(total, 1)
    log(common.table(rows, ["job CPU s (median)", *[v[0] for v in variants]]))
    for name, saved in res["saved_a_job_cpu_s"].items():
        log(f"{name}, against {first}: saved a job (median of pairs) " +
            ", ".join(f"{k} {v} CPU s" for k, v in saved.items()))
    log(f"files compared with '{first}': {same} identical, {differ} differing")
    out["part_a"] = res


def part_b(workdir, rows, shards, out):
    scratch = Path(tempfile.mkdtemp(prefix="clip-lists-", dir=workdir))
    root = scratch / "data"
    root.mkdir()
    with open(root / "metadata.csv", "w", encoding="utf-8") as f:
        for i in range(rows):  # LJSpeech-like lines: ~150 bytes
            f.write(f"XX{i // 1000:03d}-{i % 1000:04d}|Printing, in the only sense with which we are at present "
                    f"concerned, differs from most if not all the arts {i}.|printing, in the only sense with "
                    f"which we are at present concerned, differs from most if not all the arts {i}.\n")
    ds = {"root": str(root), "metadata": "metadata.csv", "audio_dir": "wavs"}

    def cpu(fn):
        t = time.process_time()
        value = fn()
        return time.process_time() - t, value

    picked = list(range(0, shards, max(1, shards // 3)))[:3]
    job_reads = []
    for k in picked:  # first, with nothing else held: a job's process holds no other manifest
        job_reads.append(cpu(lambda k=k: manifest.load_manifest(ds, shards)[k])[0])
        gc.collect()
    read_s, m = cpu(lambda: manifest.load_manifest(ds, shards))
    write_s, folder = cpu(lambda: manifest.write_clip_lists(m, shards, scratch / "lists", ds))
    again_s, same = cpu(lambda: manifest.write_clip_lists(m, shards, scratch / "lists", ds))
    assert same == folder
    os.environ[manifest.CLIP_LISTS_ENV] = str(folder)
    job_lists = []
    for k in picked:
        s, clips = cpu(lambda k=k: manifest.shard_manifest(ds, shards, k, log=lambda *_: None))
        assert clips == m[k]
        job_lists.append(s)
    del os.environ[manifest.CLIP_LISTS_ENV]
    size = sum(p.stat().st_size for p in folder.iterdir())
    shutil.rmtree(scratch)
    jobs = 3 * shards  # token, mel and pitch jobs
    res = {"rows": rows, "shards": shards, "metadata_mb": round(rows * 150 / 1e6),
           "planning_reads_the_dataset_cpu_s": round(read_s, 2),
           "a_job_reading_the_dataset_cpu_s": round(common.median(job_reads), 3),
           "a_job_reading_its_list_cpu_s": round(common.median(job_lists), 5),
           "writing_the_lists_once_per_change_cpu_s": round(write_s, 2),
           "checking_them_each_run_cpu_s": round(again_s, 2),
           "lists_mb": round(size / 1e6, 1),
           "build_before_cpu_h": round(jobs * common.median(job_reads) / 3600, 2),
           "build_now_cpu_s": round(jobs * common.median(job_lists) + write_s, 1)}
    log(f"{rows:,} rows, {shards} shards: a job found its clips in {res['a_job_reading_the_dataset_cpu_s']} CPU s "
        f"(the whole dataset), now {res['a_job_reading_its_list_cpu_s']} CPU s (its list); the run writes the lists in "
        f"{res['writing_the_lists_once_per_change_cpu_s']} CPU s once per dataset change ({res['lists_mb']} MB), "
        f"checks them in {res['checking_them_each_run_cpu_s']} CPU s per run. {jobs:,} shard jobs: "
        f"{res['build_before_cpu_h']} CPU h before, {res['build_now_cpu_s']} CPU s now")
    out.setdefault("part_b", []).append(res)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    p.add_argument("--part", choices=["a", "b", "all"], default="all")
    p.add_argument("--against", type=Path, default=None, help="a: also run each job with another checkout's pipeline/")
    p.add_argument("--jobs", type=int, default=8, help="a: shards whose three jobs run, both ways")
    p.add_argument("--scales", nargs="+", default=["13100:128", "1000000:4096"], help="b: ROWS:SHARDS each")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    workdir = args.workdir.resolve()
    out = {"benchmark": "clip_lists", "command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
           "machine": common.machine_info(), "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    log(common.machine_line(out["machine"]))
    if args.part in ("a", "all"):
        part_a(workdir, args.jobs, args.against.resolve() if args.against else None, out)
    if args.part in ("b", "all"):
        for scale in args.scales:
            rows, shards = map(int, scale.split(":"))
            part_b(workdir, rows, shards, out)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    log(f"figures in {common.write_json(args.json or workdir / 'clip_lists.json', out)}")


if __name__ == "__main__":
    main()
