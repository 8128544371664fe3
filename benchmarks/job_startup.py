"""Fixed start-up of one job: a fresh interpreter importing pipeline.cache, reading a rule's inline
config and loading pyworld, as a pitch_shard job does before its first clip (`--job pitch`); or
importing pipeline.train (TensorFlow and Keras with it) and getting the mel filterbank, as a TensorFlow job
does (`--job tensorflow`).

    python benchmarks/job_startup.py                         # this checkout, 10 runs
    python benchmarks/job_startup.py --against /path/to/older/checkout --runs 10
    python benchmarks/job_startup.py --job tensorflow --against /path/to/older/checkout
    pip install --no-deps --target /tmp/mld07 ml_dtypes==0.7.0
    python benchmarks/job_startup.py --job tensorflow --against-pythonpath /tmp/mld07   # another package version

Runs alternate between the checkouts (same load for both); CPU is user + system of each child
(getrusage), the median is reported with the load average. `--against-pythonpath DIR` compares this
checkout with itself run with DIR first on PYTHONPATH (other versions of packages installed there).
This checkout's runs get the environment variable planning sets for the jobs it starts
(pipeline.config.VALIDATED_ENV); an older checkout ignores it.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from pipeline import config  # noqa: E402

INLINE = {"audio": {"hop_length": 256, "sample_rate": 22050}, "cache": {"shards": 8},
          "dataset": {"audio_dir": "wavs", "bad_audio": "skip", "max_seconds": 20.0, "metadata": "metadata.csv",
                      "root": "data/demo"}, "pitch": {"fmax": 600.0, "fmin": 65.0, "method": "dio"}}
CODE = ("import pipeline.cache as c; c.config.load_config({cfg!r}, check_paths=False); "
        "getattr(c, '_light_pyworld', lambda: None)(); import pyworld")
# a TensorFlow job before its first step: the trainer's imports and the mel filterbank (training summaries,
# vocoders and synthesis all build it)
TF_JOB = ("import pipeline.train; from pipeline import audio; "
          "audio.mel_basis(sample_rate=22050, n_fft=1024, n_mels=80, fmin=0, fmax=8000)")
JOBS = {"pitch": CODE.format(cfg=json.dumps(INLINE)), "tensorflow": TF_JOB}


def cpu(cwd, env, code):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=cwd, env=env)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", type=Path, default=None, help="another checkout to compare with")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--against-pythonpath", default=None, metavar="DIR",
                   help="compare with this checkout run with DIR first on PYTHONPATH (other package versions)")
    p.add_argument("--job", choices=sorted(JOBS), default="pitch", help="whose start-up (default: pitch)")
    args = p.parse_args(argv)
    env = dict(os.environ, **{config.VALIDATED_ENV: config.schema_digest()})
    plain = {k: v for k, v in os.environ.items() if k != config.VALIDATED_ENV}
    if args.against_pythonpath:
        path = os.pathsep.join(filter(None, [args.against_pythonpath, env.get("PYTHONPATH")]))
        other, where, label = dict(env, PYTHONPATH=path), ROOT, f"with {args.against_pythonpath} first on PYTHONPATH"
    elif args.against:
        other, where, label = plain, args.against, str(args.against)
    else:
        other = None
    here, there = [], []
    for _ in range(args.runs):
        here.append(cpu(ROOT, env, JOBS[args.job]))
        if other is not None:
            there.append(cpu(where, other, JOBS[args.job]))
    line = f"{args.job} job, this checkout: {statistics.median(here):.3f} CPU s"
    if there:
        line += (f"; {label}: {statistics.median(there):.3f} CPU s"
                 f" (ratio {statistics.median(here) / statistics.median(there):.3f})")
    print(f"{line} (median of {args.runs}; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
