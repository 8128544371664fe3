"""Preprocessing benchmark: the whole `snakemake caches` target against bare loops of the same extractors.

    python benchmarks/preprocess.py                       # both parts: ~7 min on 2 cores (+~2 min, once, to speak the corpora)
    python benchmarks/preprocess.py --quick               # 300-clip ratio + 2,000-clip rebuild corpus, ~3-5 min
    python benchmarks/preprocess.py --part ratio --clips 1000
    python benchmarks/preprocess.py --part full --shards 64 --sweep 16,256   # also measure other shard counts
    python benchmarks/preprocess.py --profile             # + a py-spy profile of one `caches` run (part a's corpus)

Part a (ratio: the whole `caches` target >= 1.0x the audio-seconds/CPU-second of bare
single-process loops of the same extractors): on a mid-size espeak-ng corpus (--clips, default 1,000, FLAC at 22,050 Hz, so
neither side resamples), audio-seconds per CPU-second of `snakemake --cores 2 caches` run from
scratch in a subprocess (CPU = self + children, from resource.getrusage(RUSAGE_CHILDREN) deltas:
Snakemake, its shells and every job; a wrapper also reports Snakemake's own share) against a bare
loop over the same files: `librosa.load(path, sr=22050)` + `librosa.feature.melspectrogram(...,
n_fft=1024, hop_length=256, win_length=1024, power=1.0, n_mels=80, fmin=0, fmax=8000)` + pyworld
`dio` + `stonemask` (fmin 65, fmax 600, the hop as frame period, the product's `speed`) + phonemizer's espeak backend
(created once) on the clip's line (CPU from
time.process_time after one warm-up clip, in a subprocess with the same environment). Two
conditions, each measured on both sides: "as shipped" (numpy's OpenBLAS picks its own thread
count) and "1 BLAS thread" (OPENBLAS/OMP/MKL_NUM_THREADS=1): a lone loop's idle OpenBLAS threads
spin on the idle second core and inflate its CPU seconds, which flatters the target; the second
condition is the fair one. Fixed start-up is measured separately: Snakemake's own (`snakemake -n
caches` on the unbuilt corpus) and the real mel/token job commands on a one-clip corpus.

Part b (full): the 13,100-line transcript file spoken by espeak-ng (made once, reused), with
configs/ljspeech.yaml's cache.shards if that file exists, else 64: the full build (wall, CPU), the
rebuild after editing ONE clip's text and after replacing ONE clip's audio, each as a fraction of the
full build (target <= 3 %; the planned jobs are checked against the staleness contract first), and
`snakemake -n caches` / `-n train` planning time on the built corpus (target <= 5 s). The edited
clip is restored afterwards and the caches brought up to date again.

Corpora, caches and reports go under --workdir (default .bench/, git-ignored); Snakemake runs from
the repository root like tests/conftest.py. Figures are written to {workdir}/preprocess.json.
"""
import argparse
import collections
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

SR = 22050
MEL_KW = dict(sr=SR, n_fft=1024, hop_length=256, win_length=1024, power=1.0, n_mels=80, fmin=0, fmax=8000)
REBUILD_TARGET = 0.03
PLAN_TARGET_S = 5.0


def log(*a):
    print(*a, flush=True)


# --- part a: whole target vs bare loop -------------------------------------------------------------

def warm_page_cache(files):
    n = 0
    for f in files:
        n += len(Path(f).read_bytes())
    return n


# The two in-process loops run in a subprocess so that they see exactly the environment (BLAS
# threads) that the Snakemake run sees; CPU from time.process_time, after one warm-up clip.
LOOP = r"""
import json, sys, time
rows = [line.split("\t", 1) for line in open(sys.argv[2], encoding="utf-8").read().split("\n")]
kw = json.loads(sys.argv[3])
t0 = time.process_time()
if sys.argv[1] == "bare":
    import librosa, numpy as np, pyworld
    from phonemizer.backend import EspeakBackend
    from phonemizer.separator import Separator
    espeak = EspeakBackend("en-us", preserve_punctuation=True, with_stress=True)  # one backend, as the docs advise
    MEL = {k: v for k, v in kw.items() if k != "dio_speed"}
    sep = Separator(phone="", word=" ", syllable="")
    def one(f, line):
        y, _ = librosa.load(f, sr=kw["sr"])
        librosa.feature.melspectrogram(y=y, **MEL)
        x = y.astype(np.float64)
        f0, t = pyworld.dio(x, kw["sr"], f0_floor=65.0, f0_ceil=600.0, frame_period=1000 * kw["hop_length"] / kw["sr"],
                            speed=kw["dio_speed"])
        pyworld.stonemask(x, f0, t, kw["sr"])
        espeak.phonemize([line], separator=sep, strip=True)
        return len(y)
else:
    from pipeline import audio, pitch, text
    a, p, t = kw["audio"], kw["pitch"], kw["text"]
    def one(f, line):
        y = audio.load_audio(f, sample_rate=a["sample_rate"], max_seconds=1e9)
        spec = audio.stft_magnitude(y, n_fft=a["n_fft"], hop_length=a["hop_length"], win_length=a["win_length"])
        basis = audio.mel_basis(sample_rate=a["sample_rate"], n_fft=a["n_fft"], n_mels=a["n_mels"], fmin=a["fmin"], fmax=a["fmax"])
        audio.log_mel(spec, basis); audio.energy_from_magnitude(spec)
        pitch.f0(y, sample_rate=a["sample_rate"], hop_length=a["hop_length"], n_frames=audio.n_frames(len(y), a["hop_length"]), **p)
        text.to_symbols([line], t)
        return len(y)
one(*rows[0])
first = time.process_time() - t0
t0 = time.process_time()
samples = sum(one(f, line) for f, line in rows)
print(json.dumps({"cpu": time.process_time() - t0, "samples": samples, "first_clip_cpu": first}))
"""


def loop(kind, list_file, env):
    if kind in ("bare", "bare-dio-default"):
        from pipeline import pitch
        # "bare": the product's DIO setting, the same extractor; "bare-dio-default": pyworld's default
        # (no decimation), as a preprocessing script usually calls it
        kw = dict(MEL_KW, dio_speed=pitch.DIO_SPEED if kind == "bare" else 1)
        kind = "bare"
    else:
        from pipeline import config
        cfg = config.load_config(None, check_paths=False)
        kw = {k: cfg[k] for k in ("audio", "pitch", "text")}
    res = common.run_timed([sys.executable, "-c", LOOP, kind, list_file, json.dumps(kw)], env=env)
    return {**json.loads(res["out"].strip().splitlines()[-1]), "process_cpu": res["cpu"]}


def job_startup(corpus, workdir, env):
    """CPU of one mel_shard and one token_shard job's fixed part: the real `python -m pipeline.cache`
    commands on a one-clip corpus (run twice; the second run is kept, so any memo the product keeps
    beside its shards is warm, as it is for all but the first job of a build), less one steady clip.
    Also the interpreter alone and `import pipeline.cache` alone, to show where it goes."""
    from pipeline import formats, manifest

    one = workdir / "corpus" / "one-clip"
    clip = formats.read_metadata(corpus / "metadata.csv")[0]
    src = manifest.audio_path(corpus, "wavs", clip.id)
    (one / "wavs").mkdir(parents=True, exist_ok=True)
    dst = one / "wavs" / src.name
    if not dst.exists():
        shutil.copyfile(src, dst)
    (one / "metadata.csv").write_text(clip.line + "\n", encoding="utf-8")
    from pipeline import config
    defaults = config.load_config(None, check_paths=False)
    cfg = json.dumps({"name": "one", "dataset": {**defaults["dataset"], "root": str(one)}, "cache": {"shards": 1},
                      **{k: dict(defaults[k]) for k in ("audio", "text", "pitch")}})  # what the rules pass
    out = Path(tempfile.mkdtemp(dir=workdir))
    res = {}
    for kind in ("mels", "tokens", "pitch"):
        cmd = common.shard_job_command(kind, cfg, 0, out, audio=False)
        common.run_timed(cmd, env=env)
        res[kind] = common.run_timed(cmd, env=env)["cpu"]
    interp = common.run_timed([sys.executable, "-c", "pass"], env=env)["cpu"]
    imports = common.run_timed([sys.executable, "-c", "import pipeline.cache"], env=env)["cpu"]
    shutil.rmtree(out, ignore_errors=True)
    return {"mel_job_1clip_cpu": res["mels"], "token_job_cpu": res["tokens"], "pitch_job_1clip_cpu": res["pitch"],
            "interpreter_cpu": interp,
            "import_pipeline_cache_cpu": imports}


def rule_benchmarks(report_dir):
    """{rule: (jobs, summed cpu_time)} from the rules' `benchmark:` files (psutil samples; indicative)."""
    out = {}
    for rule in ("mel_shard", "token_shard", "pitch_shard"):
        cpu, n = 0.0, 0
        for tsv in sorted((Path(report_dir) / "benchmarks" / rule).glob("*.tsv")):
            lines = tsv.read_text().splitlines()
            head, vals = lines[0].split("\t"), lines[-1].split("\t")
            cpu += float(vals[head.index("cpu_time")]); n += 1
        out[rule] = {"jobs": n, "cpu_time_sum": round(cpu, 2)}
    return out


def fresh(cache_dir, report_dir):
    shutil.rmtree(cache_dir, ignore_errors=True)
    shutil.rmtree(report_dir, ignore_errors=True)


CONDITIONS = {"as shipped": {}, "1 BLAS thread": common.ONE_BLAS_THREAD}


def part_ratio(args, workdir):
    import soundfile as sf
    import yaml

    from pipeline import formats, manifest

    corpus = workdir / "corpus" / f"lj-{args.clips}-flac{SR}"
    made = common.ensure_corpus(corpus, args.clips, log=log)
    defaults = yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())
    shards = args.ratio_shards or defaults["cache"]["shards"]
    bdir = workdir / "preprocess" / "ratio"
    name = f"ratio{args.clips}"
    cfg_path = common.bench_config(bdir / "config.yaml", name=name, dataset_root=corpus, workdir=bdir, shards=shards)
    cache_dir, report_dir = bdir / "cache" / name, bdir / "reports" / name
    clips = formats.read_metadata(corpus / "metadata.csv")
    files = [str(manifest.audio_path(corpus, "wavs", c.id)) for c in clips]
    list_file = bdir / "files.txt"
    list_file.parent.mkdir(parents=True, exist_ok=True)
    list_file.write_text("\n".join(f"{f}\t{c.text}" for f, c in zip(files, clips)), encoding="utf-8")
    rate = sf.info(files[0]).samplerate
    resample = "none: files are at 22050 Hz" if rate == SR else f"librosa.load resamples {rate} -> {SR} Hz (soxr_hq)"
    conditions = {k: v for k, v in CONDITIONS.items() if k == "as shipped" or not args.no_blas_check}
    log(f"\n== part a: whole `caches` target vs bare librosa loop: {len(files)} clips, {shards} shards "
        f"(configs/config.yaml's cache.shards), resampling: {resample}; conditions: {', '.join(conditions)}")
    warm_page_cache(files)

    runs = collections.defaultdict(list)
    for rep in range(args.repeats):
        for cond, env in conditions.items():
            bare = loop("bare", list_file, env)
            bare_default = loop("bare-dio-default", list_file, env)
            fresh(cache_dir, report_dir)
            plan = common.snakemake("caches", "-n", config=cfg_path, env=env)  # Snakemake's start-up + DAG, nothing built
            log(f"  [{rep + 1}/{args.repeats}, {cond}] bare loop {bare['cpu']:.1f} CPU s; snakemake caches ...")
            sm = common.snakemake("caches", config=cfg_path, env=env)
            prod = loop("product", list_file, env)
            audio_s = bare["samples"] / SR
            index = json.loads((cache_dir / "index.json").read_text())
            runs[cond].append(dict(
                audio_s=audio_s, bare_cpu=bare["cpu"], bare_first_clip_cpu=bare["first_clip_cpu"],
                bare_process_cpu=bare["process_cpu"], bare_dio_default_cpu=bare_default["cpu"],
                product_cpu=prod["cpu"], sm_cpu=sm["cpu"], sm_wall=sm["wall"], plan_cpu=plan["cpu"],
                sm_self_cpu=sm["self_cpu"], sm_jobs_cpu=sm["jobs_cpu"],
                plan_wall=plan["wall"], load1=sm["load1_after"], index_seconds=index["counts"]["seconds"],
                index_clips=index["counts"]["clips"], rule_benchmarks=rule_benchmarks(report_dir),
                ratio=(audio_s / sm["cpu"]) / (audio_s / bare["cpu"])))
    startup = {cond: job_startup(corpus, bdir, env) for cond, env in conditions.items()}

    res = {"clips": len(files), "shards": shards, "resampling": resample, "corpus": str(corpus),
           "corpus_made_s": round(made["made_s"], 1), "config": str(cfg_path), "target_ratio": 1.0,
           "conditions": {}}
    rows, srows = [], []
    for cond in conditions:
        run = sorted(runs[cond], key=lambda r: r["ratio"])[len(runs[cond]) // 2]  # the median run
        st = startup[cond]
        audio_s = run["audio_s"]
        st["mel_job_fixed_cpu"] = max(st["mel_job_1clip_cpu"] - run["product_cpu"] / len(files), 0.0)
        fixed = run["plan_cpu"] + shards * (st["mel_job_fixed_cpu"] + st["pitch_job_1clip_cpu"]) \
            + (shards + 1) * st["token_job_cpu"]  # the pitch job's one clip is counted as fixed: an overestimate
        bare_rate, whole_rate, prod_rate = audio_s / run["bare_cpu"], audio_s / run["sm_cpu"], audio_s / run["product_cpu"]
        variable = max(run["sm_cpu"] - fixed, 1e-9)
        c = res["conditions"][cond] = {
            "env": conditions[cond], "audio_seconds": round(audio_s, 1), "runs": runs[cond],
            "bare_loop": {"cpu_s": run["bare_cpu"], "audio_s_per_cpu_s": bare_rate,
                          "first_clip_cpu_s_not_counted": run["bare_first_clip_cpu"],
                          "whole_process_cpu_s": run["bare_process_cpu"]},
            "ratio_whole_vs_bare_script_with_its_startup": run["bare_process_cpu"] / run["sm_cpu"],
            "product_mel_function_in_process": {"cpu_s": run["product_cpu"], "audio_s_per_cpu_s": prod_rate,
                                                "vs_bare": prod_rate / bare_rate},
            "caches_target": {"cpu_s": run["sm_cpu"], "wall_s": run["sm_wall"], "audio_s_per_cpu_s": whole_rate,
                              "snakemake_self_cpu_s": run["sm_self_cpu"], "jobs_cpu_s": run["sm_jobs_cpu"],
                              "jobs": {"mel_shard": shards, "pitch_shard": shards, "token_shard": shards,
                                       "cache_index": 1},
                              "load1_after": run["load1"]},
            "ratio_whole_vs_bare": whole_rate / bare_rate, "met": whole_rate / bare_rate >= 1.0,
            "ratio_whole_vs_bare_dio_default": run["bare_dio_default_cpu"] / run["sm_cpu"],
            "startup": {"snakemake_plan_cpu_s": run["plan_cpu"], "snakemake_plan_wall_s": run["plan_wall"], **st,
                        "fixed_cpu_s_total": fixed, "fixed_share_of_target_cpu": fixed / run["sm_cpu"]},
            "ratio_excluding_startup": (audio_s / variable) / bare_rate,
        }
        rows += [[cond, "bare loop: librosa mel + pyworld DIO/StoneMask + phonemizer (the baseline)", run["bare_cpu"], "",
                  bare_rate, 1.0],
                 [cond, "  the same as a script (+ interpreter, imports, 1st clip)", run["bare_process_cpu"], "",
                  audio_s / run["bare_process_cpu"], run["bare_cpu"] / run["bare_process_cpu"]],
                 [cond, "  the same with pyworld's default DIO (no decimation)", run["bare_dio_default_cpu"], "",
                  audio_s / run["bare_dio_default_cpu"], run["bare_cpu"] / run["bare_dio_default_cpu"]],
                 [cond, "the product's extractors in one loop (mel+energy, pitch, phonemes)", run["product_cpu"], "",
                  prod_rate, prod_rate / bare_rate],
                 [cond, "snakemake --cores 2 caches (whole)", run["sm_cpu"], run["sm_wall"], whole_rate, c["ratio_whole_vs_bare"]],
                 [cond, "  Snakemake process itself (scheduling, bookkeeping)", run["sm_self_cpu"], "", "", ""],
                 [cond, "  its jobs (shells, token/mel/index)", run["sm_jobs_cpu"], "", "", ""],
                 [cond, "  less fixed start-up (estimated)", variable, "", audio_s / variable, c["ratio_excluding_startup"]]]
        srows += [[cond, "snakemake -n caches (unbuilt): Snakemake start-up + DAG", run["plan_cpu"], 1],
                  [cond, "one mel_shard job less its clips (real job on 1 clip - 1 steady clip)", st["mel_job_fixed_cpu"], shards],
                  [cond, "  of which `python -c 'import pipeline.cache'`", st["import_pipeline_cache_cpu"], ""],
                  [cond, "  of which `python -c pass` (the interpreter)", st["interpreter_cpu"], ""],
                  [cond, "one pitch_shard job on 1 clip", st["pitch_job_1clip_cpu"], shards],
                  [cond, "one token_shard job (~ cache_index too)", st["token_job_cpu"], shards + 1],
                  [cond, "fixed start-up total", fixed, f"{100 * fixed / run['sm_cpu']:.0f} % of the target's CPU"]]
    log(common.table(rows, ["condition", "what", "CPU s", "wall s", "audio-s / CPU-s", "x bare"]))
    log(common.table(srows, ["condition", "start-up component", "CPU s each", "times"]))
    main = res["conditions"]["as shipped"]
    res["ratio_whole_vs_bare"], res["met"] = main["ratio_whole_vs_bare"], main["met"]
    for cond, c in res["conditions"].items():
        log(f"{cond}: whole target / bare loop = {c['ratio_whole_vs_bare']:.2f}x (target >= 1.0x): {common.verdict(c['met'])}; "
            f"against a bare loop with pyworld's default DIO: {c['ratio_whole_vs_bare_dio_default']:.2f}x")
    return res


# --- profile ---------------------------------------------------------------------------------------

def _kind(proc):
    for key, kind in (("pipeline.cache mels", "mel_shard"), ("pipeline.cache tokens", "token_shard"),
                      ("pipeline.cache pitch", "pitch_shard"),
                      ("pipeline.cache index", "cache_index"), ("snakemake", "snakemake")):
        if key in proc:
            return kind
    return "other"


def _category(frames):
    s = ";".join(frames)
    last = frames[-1] if frames else ""
    if any(w in last for w in ("Condition.wait", "_try_wait", "sleep", "select", "poll")):
        return "waiting"
    if "numba" in s or "llvmlite" in s:
        return "numba compile/import"
    if "_find_and_load" in s:
        return "imports"
    if "stft_magnitude" in s or "log_mel" in s or "energy_from_magnitude" in s:
        return "mel compute"
    if "pitch.py" in s or "f0 " in s:
        return "pitch compute"
    if "phonemize" in s:
        return "phonemize"
    if "psutil" in s:
        return "benchmark: psutil"
    if "atomic_write" in s or "_write_shard" in s:
        return "writing"
    return "other"


def part_profile(args, workdir):
    """py-spy over one `caches` run on part a's corpus: where the CPU goes, per job kind."""
    if shutil.which("py-spy") is None:
        log("py-spy not installed (pip install py-spy): no profile")
        return None
    corpus = workdir / "corpus" / f"lj-{args.clips}-flac{SR}"
    common.ensure_corpus(corpus, args.clips, log=log)
    import yaml
    shards = args.ratio_shards or yaml.safe_load((ROOT / "configs" / "config.yaml").read_text())["cache"]["shards"]
    bdir = workdir / "preprocess" / "profile"
    name = f"profile{args.clips}"
    cfg_path = common.bench_config(bdir / "config.yaml", name=name, dataset_root=corpus, workdir=bdir, shards=shards)
    fresh(bdir / "cache" / name, bdir / "reports" / name)
    raw = bdir / "caches.pyspy.txt"
    log(f"\n== profile: py-spy record --subprocesses over `snakemake caches` ({args.clips} clips, {shards} shards)")
    common.run_timed(["py-spy", "record", "--subprocesses", "--rate", "50", "--format", "raw", "--output", raw,
                      "--", *common.snakemake_cmd("caches", config=cfg_path)])
    by = collections.defaultdict(collections.Counter)
    procs = collections.defaultdict(set)
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        owners = [f for f in frames if f.startswith("process ")]
        kind = _kind(owners[-1]) if owners else "other"
        procs[kind].add(owners[-1].split(":")[0] if owners else "?")
        by[kind][_category([f for f in frames if not f.startswith("process ")])] += int(n)
    cats = ["mel compute", "pitch compute", "phonemize", "imports", "numba compile/import", "writing", "benchmark: psutil", "other", "waiting"]
    rows = [[k, len(procs[k]), *[round(by[k][c] / 50, 1) for c in cats]] for k in sorted(by)]
    log(common.table(rows, ["process", "processes", *[f"{c} (s)" for c in cats]]))
    log("(seconds of samples at 50 Hz while a thread was active; `waiting` is Snakemake waiting on jobs)")
    return {"samples_s": {k: {c: round(by[k][c] / 50, 2) for c in cats} for k in by},
            "processes": {k: len(v) for k, v in procs.items()}, "raw": str(raw)}


# --- part b: full corpus, one-clip rebuilds, planning ----------------------------------------------

def _replace_bytes(path, data):
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def edit_text(meta_path, clip_id):
    lines = Path(meta_path).read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        cols = line.split("|")
        if cols[0] == clip_id:
            lines[i] = "|".join([cols[0]] + [c + " Indeed." for c in cols[1:]])
            break
    _replace_bytes(meta_path, "\n".join(lines).encode("utf-8"))


def replace_audio(path):
    import numpy as np
    import soundfile as sf

    y, sr = sf.read(str(path), dtype="int16")
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=Path(path).suffix)
    os.close(fd)
    sf.write(tmp, (y // 2).astype(np.int16), sr, subtype="PCM_16")  # the same clip, 6 dB quieter
    os.replace(tmp, path)


def plan_times(cfg_path, target, repeats):
    runs = [common.snakemake(target, "-n", config=cfg_path) for _ in range(repeats)]
    return {"wall_s": common.median([r["wall"] for r in runs]), "cpu_s": common.median([r["cpu"] for r in runs]),
            "snakemake_self_cpu_s": common.median([r["self_cpu"] for r in runs]),
            "walls": [round(r["wall"], 2) for r in runs]}


def rebuild(cfg_path, full, expect, what):
    planned, _ = common.planned_jobs(cfg_path, "caches")
    ok = all(planned.get(k, 0) == v for k, v in expect.items())
    log(f"  {what}: planned {planned} ({'as the staleness contract says' if ok else 'NOT ' + str(expect)})")
    r = common.snakemake("caches", config=cfg_path)
    return {"planned": planned, "planned_as_contract": ok, "wall_s": r["wall"], "cpu_s": r["cpu"],
            "snakemake_self_cpu_s": r["self_cpu"], "jobs_cpu_s": r["jobs_cpu"], "load1_after": r["load1_after"],
            "fraction_wall": r["wall"] / full["wall"], "fraction_cpu": r["cpu"] / full["cpu"],
            "met": r["wall"] / full["wall"] <= REBUILD_TARGET}


def measure_shards(args, workdir, corpus, shards):
    from pipeline import formats, manifest

    bdir = workdir / "preprocess" / "full"
    name = f"lj{args.full_clips}-s{shards}"
    cfg_path = common.bench_config(bdir / f"config-s{shards}.yaml", name=name, dataset_root=corpus, workdir=bdir,
                                   shards=shards)
    fresh(bdir / "cache" / name, bdir / "reports" / name)
    log(f"  shards={shards}: planning the unbuilt corpus ...")
    plan_unbuilt = common.snakemake("caches", "-n", config=cfg_path)
    log(f"  shards={shards}: full build (snakemake --cores 2 caches) ...")
    t = common.snakemake("caches", config=cfg_path)
    full = {"wall": t["wall"], "cpu": t["cpu"]}
    log(f"  full build {t['wall']:.1f} s wall, {t['cpu']:.1f} CPU s (Snakemake itself {t['self_cpu']:.1f}, "
        f"jobs {t['jobs_cpu']:.1f}), load average {t['load1_after']}; planning ...")
    plan_c = plan_times(cfg_path, "caches", args.plan_repeats)
    plan_t = plan_times(cfg_path, "train", args.plan_repeats)
    nothing, _ = common.planned_jobs(cfg_path, "caches")

    meta = corpus / "metadata.csv"
    clips = formats.read_metadata(meta)
    victim = clips[len(clips) // 2].id
    audio = manifest.audio_path(corpus, "wavs", victim)
    saved_meta, saved_audio = meta.read_bytes(), audio.read_bytes()
    try:
        edit_text(meta, victim)
        text = rebuild(cfg_path, full, {"token_shard": 1, "mel_shard": 0, "pitch_shard": 0, "cache_index": 1}, f"edit the text of {victim}")
        replace_audio(audio)
        aud = rebuild(cfg_path, full, {"token_shard": 0, "mel_shard": 1, "pitch_shard": 1, "cache_index": 1}, f"replace the audio of {victim}")
    finally:
        _replace_bytes(meta, saved_meta)
        _replace_bytes(audio, saved_audio)
    restore = common.snakemake("caches", config=cfg_path)  # leave the caches matching the corpus again
    return {"shards": shards, "config": str(cfg_path), "clip_edited": victim,
            "plan_unbuilt": {"wall_s": plan_unbuilt["wall"], "cpu_s": plan_unbuilt["cpu"]},
            "mel_shard_inputs": sum(1 for _ in (corpus / "wavs").iterdir()),
            "full_build": {"wall_s": full["wall"], "cpu_s": full["cpu"], "snakemake_self_cpu_s": t["self_cpu"],
                           "jobs_cpu_s": t["jobs_cpu"], "load1_after": t["load1_after"],
                           "rule_benchmark_files_cpu(psutil, indicative)": rule_benchmarks(bdir / "reports" / name)},
            "plan_built_caches": plan_c, "plan_built_train": plan_t, "nothing_to_do_after_build": nothing == {},
            "rebuild_text": text, "rebuild_audio": aud, "restore_rebuild_wall_s": restore["wall"]}


def part_full(args, workdir):
    import yaml

    lj = ROOT / "configs" / "ljspeech.yaml"
    if args.shards:
        shards, source = args.shards, "--shards"
    elif lj.exists() and (yaml.safe_load(lj.read_text()) or {}).get("cache", {}).get("shards"):
        shards, source = yaml.safe_load(lj.read_text())["cache"]["shards"], "configs/ljspeech.yaml cache.shards"
    else:
        shards, source = 64, "default 64 (no configs/ljspeech.yaml with cache.shards)"
    corpus = workdir / "corpus" / f"lj-{args.full_clips}-flac{SR}"
    made = common.ensure_corpus(corpus, args.full_clips, log=log)
    log(f"\n== part b: {made['clips']} clips ({made['seconds'] / 3600:.1f} h of audio), {shards} shards ({source})")
    results = [measure_shards(args, workdir, corpus, shards)]
    for extra in args.sweep:
        if extra != shards:
            results.append(measure_shards(args, workdir, corpus, extra))
    rows = []
    for r in results:
        rows.append([r["shards"], r["full_build"]["wall_s"], r["full_build"]["cpu_s"],
                     f"{r['full_build']['snakemake_self_cpu_s']:.1f} / {r['full_build']['jobs_cpu_s']:.1f}",
                     f"{r['rebuild_text']['wall_s']:.1f} s = {100 * r['rebuild_text']['fraction_wall']:.1f} %"
                     f" ({100 * r['rebuild_text']['fraction_cpu']:.1f} % CPU)",
                     f"{r['rebuild_audio']['wall_s']:.1f} s = {100 * r['rebuild_audio']['fraction_wall']:.1f} %"
                     f" ({100 * r['rebuild_audio']['fraction_cpu']:.1f} % CPU)",
                     r["plan_built_caches"]["wall_s"], r["plan_built_train"]["wall_s"]])
    log(common.table(rows, ["shards", "full build wall s", "full build CPU s", "of which Snakemake / jobs", "1 text edit (of full, wall)",
                            "1 audio replaced (of full, wall)", "-n caches s", "-n train s"]))
    main = results[0]
    verdicts = {
        "rebuild_text_met": main["rebuild_text"]["met"], "rebuild_audio_met": main["rebuild_audio"]["met"],
        "plan_caches_met": main["plan_built_caches"]["wall_s"] <= PLAN_TARGET_S,
        "plan_train_met": main["plan_built_train"]["wall_s"] <= PLAN_TARGET_S,
        "staleness_contract_held": main["rebuild_text"]["planned_as_contract"] and main["rebuild_audio"]["planned_as_contract"]
        and main["nothing_to_do_after_build"],
    }
    for k, v in verdicts.items():
        log(f"{k}: {v}")
    return {"clips": made["clips"], "audio_hours": round(made["seconds"] / 3600, 2), "corpus": str(corpus),
            "corpus_made_s": round(made["made_s"], 1), "shards_source": source, "results": results,
            "targets": {"rebuild_fraction_max": REBUILD_TARGET, "plan_s_max": PLAN_TARGET_S}, **verdicts}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    p.add_argument("--part", choices=["ratio", "full", "all"], default="all")
    p.add_argument("--clips", type=int, default=None, help="part a corpus size (default 1000; --quick 300)")
    p.add_argument("--full-clips", type=int, default=None, help="part b corpus size (default 13100; --quick 2000)")
    p.add_argument("--ratio-shards", type=int, default=None, help="part a shards (default configs/config.yaml's)")
    p.add_argument("--shards", type=int, default=None, help="part b shards (default configs/ljspeech.yaml's, else 64)")
    p.add_argument("--sweep", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help="part b: also measure these shard counts, e.g. 16,256 (a full build each)")
    p.add_argument("--repeats", type=int, default=1, help="part a repeats (the median run is reported)")
    p.add_argument("--plan-repeats", type=int, default=3)
    p.add_argument("--no-blas-check", action="store_true",
                   help="part a: skip the second condition (numpy's OpenBLAS limited to 1 thread on both sides)")
    p.add_argument("--profile", action="store_true", help="also py-spy one `caches` run of part a's corpus")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path, default=None,
                   help="where to write the figures (default {workdir}/preprocess.json, or preprocess-quick.json)")
    args = p.parse_args(argv)
    args.clips = args.clips or (300 if args.quick else 1000)
    args.full_clips = args.full_clips or (2000 if args.quick else 13100)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    out = {"benchmark": "preprocess", "command": "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]]),
           "machine": common.machine_info(), "quick": args.quick}
    log(common.machine_line(out["machine"]))
    json_path = args.json or workdir / ("preprocess-quick.json" if args.quick else "preprocess.json")
    if args.part in ("ratio", "all"):
        out["ratio"] = part_ratio(args, workdir)
        common.write_json(json_path, out)
    if args.profile:
        out["profile"] = part_profile(args, workdir)
        common.write_json(json_path, out)
    if args.part in ("full", "all"):
        out["full"] = part_full(args, workdir)
    out["runtime_s"] = round(time.perf_counter() - t0, 1)
    out["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    common.write_json(json_path, out)
    log(f"\nbenchmark runtime {out['runtime_s']:.0f} s; figures in {json_path}")


if __name__ == "__main__":
    main()
