"""The staleness contract with several dataset sources (docs/datasets.md): after a real `snakemake
durations`, adding a source reruns only the shards that gain clips, one source's `language` only the
token and duration shards holding its clips, one VCTK transcript one token shard; never the aligner
(whose speaker table then lacks the new source's speakers: their clips still get durations).
The index carries the speaker and language tables and per-speaker statistics.

    python -m pytest -q tests/test_sources_staleness.py
"""
import json
import shutil
from types import SimpleNamespace

import pytest
import yaml
from conftest import TINY_ALIGNER, TINY_FASTPITCH, snakemake, write_config
from test_staleness import parse_plan, rewritten, stamps

from pipeline import manifest

SHARDS = 4
NOTHING = ({}, {})
pytestmark = pytest.mark.slow


def plan(config):
    proc = snakemake("durations", "-n", config=config)
    return parse_plan(proc.stdout + proc.stderr)


def make_vctk(root, template, rows):
    """A VCTK 0.80 layout (txt/{spk}/{id}.txt, wav48/{spk}/{id}.wav) from template clips: rows (spk, n, line)."""
    for spk, n, line in rows:
        cid, text = line.split("|")[0], line.split("|")[-1]
        (root / "txt" / spk).mkdir(parents=True, exist_ok=True)
        (root / "wav48" / spk).mkdir(parents=True, exist_ok=True)
        (root / "txt" / spk / f"{spk}_{n:03d}.txt").write_text(text + "\n")
        shutil.copy(template / "wavs" / f"{cid}.wav", root / "wav48" / spk / f"{spk}_{n:03d}.wav")
    return root


def make_ljspeech(root, template, lines):
    """An LJSpeech layout (metadata.csv, wavs/) of some of the template's metadata lines."""
    (root / "wavs").mkdir(parents=True)
    for line in lines:
        shutil.copy(template / "wavs" / f"{line.split('|')[0]}.wav", root / "wavs")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    return root


def _sources(p, *, mine=False, language="en-gb"):
    sources = [{"root": str(p.lj), "format": "ljspeech", "speaker": "lj", "language": "en-us"},
               {"root": str(p.vctk), "format": "vctk", "language": language}]
    if mine:
        sources.append({"root": str(p.mine), "format": "csv", "language": "en-us"})
    return sources


def _configure(p, **kw):
    cfg = yaml.safe_load(p.config.read_text())
    cfg["dataset"] = {"sources": _sources(p, **kw)}
    p.config.write_text(yaml.safe_dump(cfg))


def vctk_shards(p):
    return sorted({manifest.shard_of(f"vctk-{t.stem}", SHARDS) for t in (p.vctk / "txt").rglob("*.txt")})


def mine_shards(p):
    return sorted({manifest.shard_of(f"mine-{w.stem}", SHARDS) for w in (p.mine / "wavs").glob("*.wav")})


@pytest.fixture(scope="module")
def project(tmp_path_factory, corpus_template):
    tmp = tmp_path_factory.mktemp("sources")
    lines = (corpus_template / "metadata.csv").read_text().splitlines()
    lj = make_ljspeech(tmp / "lj", corpus_template, lines[:8])
    # two speakers, 3 clips, and a csv corpus of 2 more: each in fewer shards than there are
    vctk = make_vctk(tmp / "vctk", corpus_template, [("p225", 1, lines[10]), ("p225", 2, lines[11]),
                                                     ("p226", 1, lines[12])])
    mine = tmp / "mine"
    (mine / "wavs").mkdir(parents=True)
    rows = ["audio_file|text|speaker"]
    for line, name in ((lines[13], "a1"), (lines[15], "a3")):
        shutil.copy(corpus_template / "wavs" / f"{line.split('|')[0]}.wav", mine / "wavs" / f"{name}.wav")
        rows.append(f"wavs/{name}.wav|{line.split('|')[-1]}|anna")
    (mine / "metadata.csv").write_text("\n".join(rows) + "\n")
    config = write_config(tmp, lj, aligner=TINY_ALIGNER, model={"kind": "fastpitch", "fastpitch": TINY_FASTPITCH},
                          train={"batch_size": 4, "buckets": 2})
    p = SimpleNamespace(tmp=tmp, lj=lj, vctk=vctk, mine=mine, config=config, cache=tmp / "cache" / "t")
    _configure(p)
    snakemake("durations", config=config)
    assert plan(config) == NOTHING
    return p


def _rebuild(p):
    before = stamps(p.cache)
    snakemake("durations", config=p.config)
    assert plan(p.config) == NOTHING
    return rewritten(before, stamps(p.cache))


def test_editing_one_vctk_transcript_reruns_one_token_shard(project):
    txt = project.vctk / "txt" / "p226" / "p226_001.txt"
    txt.write_text("A different sentence, said by the same voice.\n")
    k = manifest.shard_of("vctk-p226_001", SHARDS)
    counts, shards = plan(project.config)
    assert counts == {"token_shard": 1, "duration_shard": 1, "cache_index": 1, "durations": 1}
    assert shards == {"token_shard": [k], "duration_shard": [k]}
    assert sorted(_rebuild(project)) == sorted(f"{kind}/shard-{k:03d}.{s}" for kind in ("tokens", "durations")
                                               for s in ("bin", "json"))


def test_one_sources_language_reruns_only_its_token_and_duration_shards(project):
    gain = vctk_shards(project)
    _configure(project, language="en-us")  # was en-gb
    counts, shards = plan(project.config)
    n = len(gain)
    assert counts == {"token_shard": n, "duration_shard": n, "cache_index": 1, "durations": 1}
    assert shards == {"token_shard": gain, "duration_shard": gain}
    changed = _rebuild(project)
    assert all(f.startswith(("tokens/", "durations/")) for f in changed)
    assert json.loads((project.cache / "index.json").read_text())["languages"] == ["en-us"]
    tok = json.loads((project.cache / f"tokens/shard-{gain[0]:03d}.json").read_text())
    assert set(tok["languages"]) == {"en-us"}


def test_adding_a_source_reruns_only_the_shards_that_gain_clips(project):
    gain = mine_shards(project)
    assert 0 < len(gain) < SHARDS
    _configure(project, mine=True, language="en-us")
    counts, shards = plan(project.config)
    n = len(gain)
    assert counts == {"token_shard": n, "mel_shard": n, "pitch_shard": n, "duration_shard": n, "cache_index": 1,
                      "durations": 1}  # no train_aligner
    assert shards == {"token_shard": gain, "mel_shard": gain, "pitch_shard": gain, "duration_shard": gain}
    changed = _rebuild(project)
    assert sorted({int(f.split("shard-")[1][:3]) for f in changed}) == gain
    # the aligner (lj, p225, p226) never heard anna: her clips align with the mean speaker vector, said in the log
    logs = project.tmp / "reports" / "t" / "logs" / "duration_shard"
    assert all("the aligner never saw speaker 'anna'" in (logs / f"{k:03d}.log").read_text() for k in gain)

    index = json.loads((project.cache / "index.json").read_text())
    assert index["speakers"] == ["anna", "lj", "p225", "p226"] and index["languages"] == ["en-us"]
    stats = index["speaker_stats"]
    assert [stats[s]["clips"] for s in index["speakers"]] == [2, 8, 2, 1]
    assert all(50 < stats[s]["pitch_mean"] < 400 and stats[s]["pitch_std"] > 0 for s in index["speakers"])
    tok = json.loads((project.cache / f"tokens/shard-{gain[0]:03d}.json").read_text())
    speaker_of = {"mine": "anna", "lj": "lj"}
    for cid, speaker in zip(tok["ids"], tok["speakers"]):
        assert speaker == speaker_of.get(cid.split("-")[0]) or speaker == cid.split("-")[1][:4]


def test_one_sources_missing_audio_folder_stops_planning(project):
    # with several sources, an unmounted disk under one of them rebuilt every audio shard without its
    # clips (its speakers gone from the index, exit status 0), then rebuilt them all once it returned
    wavs, away = project.vctk / "wav48", project.tmp / "wav48-away"
    before = stamps(project.cache)
    wavs.rename(away)
    try:
        proc = snakemake("durations", config=project.config, check=False)
    finally:
        away.rename(wavs)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-2000:]
    assert f"dataset.sources[1] (vctk, root {project.vctk}): none of its 3 clips' audio files exists" in out, out[-2000:]
    assert "Select jobs to execute" not in out and "Traceback" not in out
    assert stamps(project.cache) == before
