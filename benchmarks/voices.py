"""Planning with several speakers: `snakemake -n train` on 13,100 clips split over 100 speakers (a
`csv` source, docs/datasets.md) against the same 13,100 clips as one LJSpeech-layout folder.

Nothing is built: every clip's audio is a hard link to one short wav (planning stats each file and
reads the transcripts, it never opens the audio), so the corpus costs seconds to make. Target:
<= 5 s wall for the multi-speaker plan (the single-folder plan is the reference).

    python benchmarks/voices.py [--clips 13100 --speakers 100 --shards 128 --repeats 3]
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

TRANSCRIPTS = common.ROOT / "data" / "ljspeech_transcripts.csv"


def make_corpora(work, clips, speakers):
    """(single-folder root, csv root) over the same clips, every audio file one hard-linked wav."""
    lines = TRANSCRIPTS.read_text(encoding="utf-8").splitlines()[:clips]
    one = work / "one.wav"
    sf.write(one, np.zeros(22050, np.int16), 22050, subtype="PCM_16")
    lj, mine = work / "lj", work / "mine"
    (lj / "wavs").mkdir(parents=True)
    (mine / "wavs").mkdir(parents=True)
    rows = ["audio_file|text|speaker|language"]
    for k, line in enumerate(lines):
        cid, text = line.split("|")[0], line.split("|")[-1]
        os.link(one, lj / "wavs" / f"{cid}.wav")
        os.link(one, mine / "wavs" / f"{cid}.wav")
        rows.append(f"wavs/{cid}.wav|{text}|s{k % speakers:03d}|{'en-gb' if k % speakers % 2 else 'en-us'}")
    (lj / "metadata.csv").write_text("\n".join(lines) + "\n")
    (mine / "metadata.csv").write_text("\n".join(rows) + "\n")
    return lj, mine


def plan(work, name, dataset, shards, repeats):
    cfg = {"name": name, "dataset": dataset, "cache": {"dir": str(work / "cache"), "shards": shards},
           "runs_dir": str(work / "runs"), "reports_dir": str(work / "reports")}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs = [common.snakemake("train", "-n", "--quiet", "rules", config=path) for _ in range(repeats)]
    planned = common.parse_planned(runs[-1]["out"])
    return {"wall_s": round(common.median([r["wall"] for r in runs]), 2),
            "cpu_s": round(common.median([r["cpu"] for r in runs]), 2),
            "walls": [round(r["wall"], 2) for r in runs], "load1_after": runs[-1]["load1_after"],
            "token_shard": planned.get("token_shard"), "train": planned.get("train")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clips", type=int, default=13100)
    p.add_argument("--speakers", type=int, default=100)
    p.add_argument("--shards", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-voices-") as tmp:
        work = Path(tmp)
        lj, mine = make_corpora(work, args.clips, args.speakers)
        out = {"clips": args.clips, "speakers": args.speakers, "shards": args.shards,
               "single_folder": plan(work, "one", {"root": str(lj)}, args.shards, args.repeats),
               "sources_csv": plan(work, "many", {"sources": [{"root": str(mine), "format": "csv"}]},
                                   args.shards, args.repeats)}
    out["target_met"] = out["sources_csv"]["wall_s"] <= 5.0
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
