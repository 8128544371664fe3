"""Shard jobs start light and write the same bytes: a job started by Snakemake skips the schema
(planning validated the config) and pitch jobs load pyworld without pkg_resources; each shard file
is byte-identical to the one the full-validation, plain-`import pyworld` path writes."""
import json
import os
import platform
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

from pipeline import config, manifest

DEMO = {"root": str(ROOT / "data" / "demo"), "metadata": "metadata.csv", "audio_dir": "wavs",
        "bad_audio": "skip", "max_seconds": 20.0}
JOBS = {
    "tokens": {"dataset": {k: DEMO[k] for k in ("root", "metadata", "audio_dir")}, "cache": {"shards": 8},
               "text": {"cleaners": "english", "frontend": "phonemes", "language": "en-us"}},
    "mels": {"dataset": DEMO, "cache": {"shards": 8},
             "audio": {"sample_rate": 22050, "n_fft": 1024, "hop_length": 256, "win_length": 1024,
                       "n_mels": 80, "fmin": 0, "fmax": 8000}},
    "pitch": {"dataset": DEMO, "cache": {"shards": 8}, "audio": {"sample_rate": 22050, "hop_length": 256},
              "pitch": {"method": "dio", "fmin": 65.0, "fmax": 600.0}},
}
# the job as it ran before: every module imported the ordinary way, the config validated
PLAIN = "import sys, jsonschema, pyworld, pkg_resources; from pipeline import cache; cache.main(sys.argv[1:])"
# the job as Snakemake starts it now, reporting what it imported
LIGHT = ("import sys; from pipeline import cache\ntry:\n    cache.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
         "print('IMPORTED', ' '.join(m for m in ('jsonschema', 'pkg_resources', 'pyworld') if m in sys.modules))")


def _job_args(what, job, shard, out):
    """`python -m pipeline.cache`'s arguments as the kind's rule gives them, writing under `out`."""
    name = f"shard-{shard:03d}"
    args = [what, "--config", json.dumps(job), "--shard", str(shard), "--out", str(out / what / name)]
    if what == "mels":
        args += ["--energy", str(out / "energy" / name), "--audio", str(out / "audio" / name)]
    return args


def _run(code, what, out, env):
    args = _job_args(what, JOBS[what], 0, out)
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("what", ["tokens", "mels", "pitch"])
def test_a_shard_job_started_by_snakemake_imports_less_and_writes_the_same_bytes(tmp_path, what):
    planned = dict(os.environ, **{config.VALIDATED_ENV: config.schema_digest()})
    plain = dict(os.environ)
    plain.pop(config.VALIDATED_ENV, None)
    _run(PLAIN, what, tmp_path / "plain", plain)
    imported = _run(LIGHT, what, tmp_path / "light", planned).split("IMPORTED")[-1].split()
    assert "jsonschema" not in imported and "pkg_resources" not in imported
    if what == "pitch":
        assert "pyworld" in imported  # the extractor really ran
    kinds = {"tokens": ["tokens"], "mels": ["mels", "energy", "audio"], "pitch": ["pitch"]}[what]
    compared = 0
    for kind in kinds:
        for suffix in (".bin", ".json", ".stats.npy"):
            before = tmp_path / "plain" / kind / f"shard-000{suffix}"
            if before.exists():
                after = tmp_path / "light" / kind / f"shard-000{suffix}"
                assert after.read_bytes() == before.read_bytes(), f"{kind}/shard-000{suffix} differs"
                compared += 1
    assert compared >= 2 * len(kinds)  # each kind's .bin and .json at least


def test_a_job_validates_unless_planning_vouched_for_this_schema(monkeypatch, tmp_path):
    bad = json.dumps({"cache": {"shards": 0}})
    monkeypatch.delenv(config.VALIDATED_ENV, raising=False)
    with pytest.raises(config.ConfigError, match="cache.shards"):
        config.load_config(bad, check_paths=False)
    monkeypatch.setenv(config.VALIDATED_ENV, "another schema")  # a stale value: validate as before
    with pytest.raises(config.ConfigError, match="cache.shards"):
        config.load_config(bad, check_paths=False)
    monkeypatch.setenv(config.VALIDATED_ENV, config.schema_digest())
    assert config.load_config(bad, check_paths=False)["cache"]["shards"] == 0  # trusted: planning checked it
    with pytest.raises(config.ConfigError, match="cache.shards"):  # a file config is always validated
        path = tmp_path / "c.yaml"
        path.write_text("cache: {shards: 0}\n")
        config.load_config(path, check_paths=False)


# --- clips from the run's list, not from the whole dataset ------------------------------------
def _sources_dataset(tmp_path, corpus_template):
    """An ljspeech source and a vctk one, made from the template's clips."""
    from test_sources_staleness import make_ljspeech, make_vctk
    lines = (corpus_template / "metadata.csv").read_text().splitlines()
    lj = make_ljspeech(tmp_path / "lj", corpus_template, lines[:12])
    vctk = make_vctk(tmp_path / "vctk", corpus_template, [("p225", 1, lines[12]), ("p225", 2, lines[13]),
                                                          ("p226", 1, lines[14]), ("p226", 2, lines[15])])
    return {"sources": [{"root": str(lj), "format": "ljspeech", "name": "lj", "speaker": "lj", "language": "en-us"},
                        {"root": str(vctk), "format": "vctk", "name": "vctk", "language": "en-gb"}]}, [
        lj / "metadata.csv", vctk / "txt"]


@pytest.mark.parametrize("form", ["folder", "sources"])
def test_shard_jobs_given_the_runs_clip_lists_read_no_dataset_text_and_write_the_same_bytes(tmp_path, corpus_template,
                                                                                            form):
    shards = 2
    if form == "folder":
        root = tmp_path / "data"
        shutil.copytree(corpus_template, root)
        planned = {"root": str(root), "metadata": "metadata.csv", "audio_dir": "wavs"}
        texts = [root / "metadata.csv"]
    else:
        planned, texts = _sources_dataset(tmp_path, corpus_template)
    # what each job's rule gives it (rules/functions/cache.smk): mel and pitch jobs get no speaker or language
    audio_ds = ({"sources": [{k: s[k] for k in ("root", "format", "name")} for s in planned["sources"]]}
                if form == "sources" else dict(planned))
    jobs = {"tokens": dict(JOBS["tokens"], dataset=planned),
            "mels": dict(JOBS["mels"], dataset={**audio_ds, "bad_audio": "skip", "max_seconds": 20.0}),
            "pitch": dict(JOBS["pitch"], dataset={**audio_ds, "bad_audio": "skip", "max_seconds": 20.0})}
    env = dict(os.environ, **{config.VALIDATED_ENV: config.schema_digest()})
    env.pop(manifest.CLIP_LISTS_ENV, None)

    def run_all(out, env):
        logs = []
        for what, job in jobs.items():
            for shard in range(shards):
                args = _job_args(what, dict(job, cache={"shards": shards}), shard, out)
                proc = subprocess.run([sys.executable, "-m", "pipeline.cache", *args], cwd=ROOT, env=env,
                                      capture_output=True, text=True)
                assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
                logs.append(proc.stdout)
        return logs

    run_all(tmp_path / "read", env)  # each job reads the dataset
    # as the run does before it starts the jobs (onstart): lists from the manifest planning read
    folder = manifest.write_clip_lists(manifest.load_manifest(planned, shards), shards, tmp_path / "lists", planned)
    # the jobs must not read the dataset's text now: metadata.csv is malformed, VCTK's transcripts gone
    for t in texts:
        if t.is_dir():
            t.rename(t.with_name(t.name + ".hidden"))
        else:
            t.write_text("this line has no id|column\n")
    logs = run_all(tmp_path / "listed", dict(env, **{manifest.CLIP_LISTS_ENV: str(folder)}))
    assert all(f"clips from {folder}" in log for log in logs)
    compared = 0
    for f in sorted((tmp_path / "read").rglob("shard-*")):
        after = tmp_path / "listed" / f.relative_to(tmp_path / "read")
        assert after.read_bytes() == f.read_bytes(), f"{f.relative_to(tmp_path / 'read')} differs"
        compared += 1
    assert compared == shards * (2 + 3 + 2 + 3 + 3)  # tokens, mels, audio, energy, pitch: .bin, .json (.stats.npy)


# --- TensorFlow jobs: Keras without scikit-learn, pandas and matplotlib; oneDNN kernels --------
X86 = ("x86_64", "AMD64")  # where TensorFlow's CPU kernels can be oneDNN's
KERAS_START = """
import sys
{first}
print(sorted(m for m in ('sklearn', 'pandas', 'matplotlib', 'tensorflow', 'keras') if m in sys.modules))
print(sys.modules['keras.src.wrappers.fixes'].sklearn, sys.modules['keras.src.visualization.plot_image_gallery'].plt,
      sys.modules['keras.src.trainers.data_adapters.array_slicing'].pandas)
import librosa.segment, sklearn.cluster, pandas  # what needs them still has them
print(sklearn.cluster.KMeans.__name__, pandas.DataFrame.__name__)
from pipeline import train
train.save_alignment_png([[1.0, 0.0], [0.0, 1.0]], sys.argv[1], step=1)  # the pipeline's own figures draw
from pipeline.placement import cpu_kernels
print(cpu_kernels())
"""


@pytest.mark.parametrize("first", ["import pipeline.train", "import pipeline, keras",
                                   "import pipeline, tensorflow as tf"])
def test_a_tensorflow_job_starts_without_kerass_extras_and_the_rest_still_has_them(first, tmp_path):
    png = tmp_path / "alignment.png"
    # oneDNN's CPU kernels: on wherever the pipeline is imported before TensorFlow, unless the
    # environment says otherwise (the last case); this test process's own setting is not passed on
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if first.endswith("as tf"):
        env["TF_ENABLE_ONEDNN_OPTS"] = "0"
    proc = subprocess.run([sys.executable, "-c", KERAS_START.format(first=first), str(png)], cwd=ROOT,
                          capture_output=True, text=True, env=dict(env, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kernels = "Eigen" if "TF_ENABLE_ONEDNN_OPTS" in env else "oneDNN" if platform.machine() in X86 else None
    assert proc.stdout.splitlines()[:3] == ["['keras', 'tensorflow']", "None None None", "KMeans DataFrame"]
    assert proc.stdout.splitlines()[3] == kernels or kernels is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


ONCE = """
import importlib.machinery, sys
ran = []
exec_module = importlib.machinery.SourceFileLoader.exec_module
def counted(loader, module):
    ran.extend([module.__name__] if module.__name__ in ("tensorflow", "phonemizer.backend.espeak.api") else [])
    return exec_module(loader, module)
importlib.machinery.SourceFileLoader.exec_module = counted
sys.stderr.write("a job's ")
import pipeline, tensorflow
from phonemizer.backend.espeak import api
print(sorted(ran), tensorflow.constant(2).numpy())
print("own line", file=sys.stderr)
"""


@pytest.mark.parametrize("log_level", ["3", "0"])
def test_tensorflow_loads_once_and_quietly_unless_asked_for_its_lines(log_level):
    # the pipeline's quiet import ran tensorflow/__init__.py a second time, into a second module object
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": log_level}
    proc = subprocess.run([sys.executable, "-c", ONCE], cwd=ROOT, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[0] == "['phonemizer.backend.espeak.api', 'tensorflow'] 2"
    # only TensorFlow's loading is quiet: what the job wrote before it and writes after it reaches its log
    assert proc.stderr.endswith("own line\n"), proc.stderr[-2000:]
    if log_level == "3":  # the default: TensorFlow's C++ start-up lines do not bury a job's own
        assert proc.stderr == "a job's own line\n"
    elif platform.machine() in X86:  # asked for (TF_CPP_MIN_LOG_LEVEL=0): they are there
        assert "oneDNN custom operations are on" in proc.stderr, proc.stderr[-2000:]


CLOSED = """
import os, sys
import pipeline
first = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY)   # a job's output file
import tensorflow
print(first, tensorflow.constant(2).numpy(), flush=True)
print("an error line", file=sys.stderr)
"""


def test_a_job_started_with_standard_error_closed_runs_and_its_files_never_take_descriptor_2(tmp_path):
    # `speak ... 2>&-` exited 1 without a word and wrote no wav (sys.stderr None in the quiet import),
    # and a file opened first took descriptor 2, where TensorFlow and every error then wrote
    out = tmp_path / "out.bin"
    proc = subprocess.run([sys.executable, "-c", CLOSED, str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=lambda: os.close(2))
    assert proc.returncode == 0, proc.stdout
    first, two = proc.stdout.split()
    assert int(first) > 2 and two == "2"
    assert out.read_bytes() == b""
