"""Clips left out of training, each with its reason in rejected.tsv: text in another script (a real
`snakemake caches`), audio too short for its text (cache_index), spoken characters the characters
front end drops (the token job), and a token longer than aligner.max_token_seconds (the duration
shard job), which the loader leaves out and train counts.

    python -m pytest -q tests/test_rejected.py
"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import snakemake, write_config

from pipeline import cache, config, data, durations, manifest, shards
from pipeline import train as train_mod

ODD_ROWS = {  # id: (text, how its audio is made)
    "odd-persian": ("He said سلام to me twice.", "copy"),
    "odd-emoji": ("What a day 😀 it was for all of us.", "copy"),
    "odd-short": ("Printing, in the only sense with which we are at present concerned.", "short"),
}


def _table(path):
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return header, {r.split("\t")[0]: dict(zip(header, r.split("\t"))) for r in lines[1:]}


@pytest.mark.slow
def test_text_in_another_script_and_audio_too_short_are_rejected_with_reasons(tmp_path, corpus_template):
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    lines = (root / "metadata.csv").read_text(encoding="utf-8").splitlines()
    good = root / "wavs" / f"{lines[0].split('|')[0]}.wav"
    y, sr = sf.read(str(good), dtype="float32")
    for cid, (line, how) in ODD_ROWS.items():
        mid = len(y) // 2
        sf.write(str(root / "wavs" / f"{cid}.wav"), y if how == "copy" else y[mid:mid + int(0.12 * sr)], sr)
        lines.append(f"{cid}|{line}|{line}")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg_path = write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": 2})
    snakemake("caches", config=cfg_path)

    cfg = config.load_config(cfg_path)
    cache = config.cache_dir(cfg)
    header, rows = _table(cache / "rejected.tsv")
    assert header == ["id", "shard", "stage", "path", "reason"] and set(rows) == set(ODD_ROWS)
    for cid, row in rows.items():
        assert row["shard"] == str(manifest.shard_of(cid, 2))
    assert rows["odd-persian"]["stage"] == rows["odd-emoji"]["stage"] == "tokens"
    assert "'س' (arabic letter seen)" in rows["odd-persian"]["reason"]
    assert "'😀' (grinning face)" in rows["odd-emoji"]["reason"]
    assert "not in the script of text.language en-us" in rows["odd-emoji"]["reason"]
    assert rows["odd-persian"]["path"].endswith(f"metadata.csv:{len(lines) - 2}")
    short = rows["odd-short"]
    assert short["stage"] == "index" and "mel frames for" in short["reason"] and "too short for its text" in short["reason"]
    # its audio file, as a bad-audio row names it (the mel shard's JSON before)
    assert Path(short["path"]).resolve() == (root / "wavs" / "odd-short.wav").resolve()

    index = json.loads((cache / "index.json").read_text())
    assert index["counts"]["rejected"] == 3 and index["counts"]["clips"] == len(lines) - 3
    clips, _ = data.load_clips(cfg, "all")
    assert not set(clips.ids) & set(ODD_ROWS) and len(clips.ids) == len(lines) - 3
    # the short clip's tokens and mels are cached (its shard jobs succeeded); the index leaves it out
    k = manifest.shard_of("odd-short", 2)
    assert "odd-short" in shards.read_meta(shards.prefix(cache, "mels", k), "mels")["ids"]
    assert "odd-short" in index["shards"][k]["excluded"]
    assert {r["id"] for r in data.left_out(cfg)} == set(ODD_ROWS)


@pytest.mark.slow
def test_a_token_longer_than_max_token_seconds_is_left_out_and_counted(aligned_cache, tmp_path):
    # a private copy of the aligned cache: this test rewrites a duration shard
    src = config.load_config(aligned_cache)
    shutil.copytree(config.cache_dir(src), tmp_path / "cache" / "t")
    cfg = config.load_config(aligned_cache, {"cache": {"dir": str(tmp_path / "cache")},
                                             "runs_dir": str(tmp_path / "runs"),
                                             "aligner": {"max_token_seconds": 0.1}})
    cache = config.cache_dir(cfg)
    aligner = next((Path(src["runs_dir"]) / "t" / "aligner").glob("*/aligner.json"))
    before = data.load_clips(cfg, "all", durations=True)[0].ids
    out = shards.prefix(cache, "durations", 0)
    logged = []
    meta = durations.align_shard(cfg, 0, aligner, f"{shards.prefix(cache, 'tokens', 0)}.json",
                                 f"{shards.prefix(cache, 'mels', 0)}.json", out, log=logged.append)
    max_frames = int(0.1 * cfg["audio"]["sample_rate"] / cfg["audio"]["hop_length"])
    _, arrays = shards.read(out, "durations")
    long = {cid for cid, d in zip(meta["ids"], arrays) if d.max() > max_frames}
    assert long and {r["id"] for r in meta["rejected"]} == long  # every one of them, nothing else
    assert all("longer than aligner.max_token_seconds" in r["reason"] and r["stage"] == "durations"
               for r in meta["rejected"])
    assert any("rejected (left out of training)" in line for line in logged)

    # the loader leaves them out of training with durations; without durations they stay
    after = data.load_clips(cfg, "all", durations=True)[0].ids
    assert set(after) == set(before) - long
    assert set(data.load_clips(cfg, "all")[0].ids) >= long
    batch_ids = set()
    ds = data.build_dataset(cfg, "all", durations=True, with_clip_index=True, repeat=False, shuffle=False,
                            drop_remainder=False)
    named = data.clip_ids(cfg, "all")  # what the clip field indexes, rejected clips in their places
    for batch in ds:
        batch_ids |= {named[int(i)] for i in batch["clip"].numpy()}
        assert np.all(batch["durations"].numpy().sum(1) == batch["mel_lengths"].numpy())
    assert batch_ids == set(after)

    # the train log counts them; the run lists them in runs/{name}/rejected.tsv
    run = config.run_dir(cfg)
    run.mkdir(parents=True)
    log = []
    counts = train_mod.left_out(cfg, run, True, log.append)
    assert counts == {"total": len(long), "durations": len(long)}
    assert log == [f"left out {len(long)} clips ({len(long)} at durations); listed in {run / 'rejected.tsv'}"]
    header, rows = _table(run / "rejected.tsv")
    assert set(rows) == long and all(r["shard"] == "0" for r in rows.values())
    # a clip whose first or last token is too long is most often silence at its ends, not text it lacks
    ends = {cid: int(d.argmax()) in (0, len(d) - 1) for cid, d in zip(meta["ids"], arrays) if cid in long}
    assert any(ends.values()), ends
    for cid, at_end in ends.items():
        assert ("takes any silence at the clip's" in rows[cid]["reason"]) == at_end, rows[cid]


def test_a_token_too_long_at_a_clips_end_is_said_to_be_likely_silence():
    said = "token {} lasts 92 frames, longer than aligner.max_token_seconds (86 frames): the audio does not carry its text"
    assert data.at_an_end(said.format(0), 30) == (
        "token 0 lasts 92 frames, longer than aligner.max_token_seconds (86 frames): the first token, which takes "
        "any silence at the clip's start: trim the clip's quiet ends (docs/datasets.md), or its audio does not "
        "carry its text")
    assert "the last (end of sentence) token, which takes any silence at the clip's end" in data.at_an_end(
        said.format(29), 30)
    assert data.at_an_end(said.format(12), 30) == said.format(12)            # within the sentence: as it was
    other = "20 mel frames for 30 tokens: the audio is too short for its text"
    assert data.at_an_end(other, 30) == other


def test_evaluate_leaves_out_the_validation_clips_the_duration_stage_rejected(aligned_cache, tmp_path):
    # training leaves them out (their audio does not carry their text); evaluate scored them against
    # their recordings and transcripts all the same, and said nothing
    from pipeline import evaluate
    src = config.load_config(aligned_cache)
    shutil.copytree(config.cache_dir(src), tmp_path / "cache" / "t")
    cfg = config.load_config(aligned_cache, {"cache": {"dir": str(tmp_path / "cache")}})
    val = [c.id for c in evaluate.validation_clips(cfg)]
    cache = config.cache_dir(cfg)
    index = data.read_index(cfg)
    rejects = {}
    for entry in index["shards"]:
        out = shards.prefix(cache, "durations", entry["shard"])
        meta, arrays = shards.read(out, "durations")
        mine = [cid for cid in meta["ids"] if cid in val]
        if not mine:
            continue
        rejects[entry["shard"]] = mine
        if len(rejects) == 1:  # the first shard holding one: its first validation clip rejected
            shards.write(out, "durations", meta["ids"], arrays, provenance=meta["provenance"], frames=meta.get("frames"),
                         rejected=[dict(id=mine[0], path="x", stage="durations", reason="token 3 lasts 99 frames")])
            left = [mine[0]]
    assert len(left) < len(val)
    assert [c.id for c in evaluate.validation_clips(cfg)] == [cid for cid in val if cid not in left]
    logged = []
    evaluate.validation_clips(cfg, logged.append)
    assert len(logged) == 1 and logged[0].startswith(f"{len(left)} validation clip(s) left out") and left[0] in logged[0]
    # a duration shard planning set aside as stale is no reason to stop: evaluate uses no durations
    other = shards.prefix(cache, "durations", list(rejects)[-1]).with_suffix(".json")
    other.rename(other.with_suffix(".aside"))
    assert len(evaluate.validation_clips(cfg)) >= len(val) - 1
    other.with_suffix(".aside").rename(other)
    # every one rejected: the error says so, not that dataset.val_fraction holds none
    for shard, mine in rejects.items():
        out = shards.prefix(cache, "durations", shard)
        meta, arrays = shards.read(out, "durations")
        shards.write(out, "durations", meta["ids"], arrays, provenance=meta["provenance"], frames=meta.get("frames"),
                     rejected=[dict(id=cid, path="x", stage="durations", reason="too long") for cid in mine])
    with pytest.raises(evaluate.NoValidationClips, match="the duration stage rejected all"):
        evaluate.validation_clips(cfg)


@pytest.mark.parametrize("cleaners, line, dropped", [
    ("basic", "I have 3 cats & 2 dogs.", "'3', '&', '2'"),
    ("english", "Salt & pepper, 50% off, 2 + 2 = 4.", "'+', '='"),   # the english cleaners say "and", "percent"
    ("basic", "A rate of 5‰ in 3 ‱.", "'5', '‰', '3', '‱'"),          # the english cleaners say "per mille"
])
def test_spoken_characters_the_characters_front_end_drops_reject_the_clip(tmp_path, corpus_template, cleaners, line,
                                                                          dropped):
    # the audio says "three" and "and": tokens without them cannot be aligned to it
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    lines = (root / "metadata.csv").read_text(encoding="utf-8").splitlines()[:3]
    ids = [row.split("|")[0] for row in lines]
    lines[0] = f"{ids[0]}|{line}|{line}"
    lines[1] = f'{ids[1]}|"Quoted" (and bracketed) - dashed [words]; fine!|"Quoted" (and bracketed) - dashed [words]; fine!'
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = config.load_config(write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": 1},
                                          text={"frontend": "characters", "cleaners": cleaners}))
    out = shards.prefix(config.cache_dir(cfg), "tokens", 0)
    cache.build_token_shard(cfg, 0, out, log=lambda *a: None)
    meta = shards.read_meta(out, "tokens")
    assert meta["ids"] == ids[1:]  # punctuation that is not spoken may go
    assert meta["rejected"] == [dict(id=ids[0], path=f"{root / 'metadata.csv'}:1", stage="tokens", reason=(
        f"text {line!r}: the characters front end drops {dropped}, which the audio says: write them out in words "
        "(or use text.frontend: phonemes)"))]


@pytest.mark.slow
def test_fastpitch_trains_without_validation_when_the_aligner_left_out_every_validation_clip(aligned_cache, monkeypatch):
    # whether there is a validation split was judged from the clips without durations: with every
    # validation clip rejected at durations (a small corpus, a low val_fraction), building the
    # validation loader failed with "no clips in the 'val' split", before the first step
    cfg = config.load_config(aligned_cache)
    real = data.load_clips

    def durations_reject_every_val_clip(cfg, split="all", index=None, durations=False):
        clips, paths = real(cfg, split, index, durations=durations)
        return (clips.split("train") if durations else clips), paths

    monkeypatch.setattr(data, "load_clips", durations_reject_every_val_clip)
    trainer = train_mod.Trainer(cfg, log=lambda *a: None)
    assert "durations" in trainer.needs and not trainer.has_val and trainer.val_dataset is None
