"""pipeline.manifest: metadata parsing (BOM, CRLF, 2 or 3 columns), each malformed kind as a
DatasetError naming file and line (also through `snakemake -n caches`), stable shards and split.

    python -m pytest -q tests/test_manifest.py
"""
import json
import os
import random
import re
import time

import pytest
from conftest import snakemake

from pipeline import errors, formats, manifest
from pipeline.formats import DatasetError


def _write(path, lines, newline="\n", bom=False, encoding="utf-8"):
    data = "".join(line + newline for line in lines).encode(encoding)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return path


def test_bom_crlf_and_two_or_three_columns(tmp_path):
    lines = ["a1|Plain text|plain text normalized",
             "a2|Two columns only",
             "a3|Text kept when the third column is empty|",
             "a4|Dr. Who|Doctor Who"]
    expected = [("a1", "plain text normalized"), ("a2", "Two columns only"),
                ("a3", "Text kept when the third column is empty"), ("a4", "Doctor Who")]
    for newline in ("\n", "\r\n"):
        for bom in (False, True):
            clips = formats.read_metadata(_write(tmp_path / "m.csv", lines, newline, bom))
            assert [(c.id, c.text) for c in clips] == expected
            assert [c.lineno for c in clips] == [1, 2, 3, 4]
            assert [c.line for c in clips] == lines  # no "\r", no BOM in what is digested


def test_blank_lines_and_a_missing_final_newline(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b"a1|one\n\n  \na2|two")
    clips = formats.read_metadata(path)
    assert [(c.id, c.text, c.lineno) for c in clips] == [("a1", "one", 1), ("a2", "two", 4)]


def test_non_ascii_text_is_kept(tmp_path):
    clips = formats.read_metadata(_write(tmp_path / "m.csv", ["a1|Café — naïve|Café — naïve"]))
    assert clips[0].text == "Café — naïve"


GOOD = ["LJ001-0001|First line.|First line.", "LJ001-0002|Second line.|Second line."]
MALFORMED = {  # kind: (the bad third line as bytes, words the message must hold)
    "one column": (b"LJ001-0003", ["column"]),
    "four columns": (b"LJ001-0003|a|b|c", ["column"]),
    "not utf-8": (b"LJ001-0003|caf\xe9 latin-1|caf\xe9 latin-1", ["utf-8"]),
    "duplicate id": (b"LJ001-0001|Again.|Again.", ["duplicate", "LJ001-0001"]),
    "parent path id": (b"../x|Escapes the audio folder.|Escapes the audio folder.", ["../x"]),
    "path id": (b"a/b|A sub folder.|A sub folder.", ["a/b"]),
    "empty text": (b"LJ001-0003| | ", ["empty"]),
    "empty id": (b"|Some text.|Some text.", ["id"]),
}


def _malformed(tmp_path, kind, newline=b"\n"):
    bad, words = MALFORMED[kind]
    path = tmp_path / "metadata.csv"
    path.write_bytes(newline.join([g.encode() for g in GOOD] + [bad, b"LJ001-0004|Fine.|Fine."]) + newline)
    return path, words


def _names_file_and_line(message, path, lineno):
    return str(path) in message and re.search(rf"(line |:){lineno}\b", message) is not None


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_line_names_file_and_line(tmp_path, kind):
    for newline in (b"\n", b"\r\n"):
        path, words = _malformed(tmp_path, kind, newline)
        with pytest.raises(DatasetError) as e:
            formats.read_metadata(path)
        message = str(e.value)
        assert _names_file_and_line(message, path, 3), message
        assert all(w.lower() in message.lower() for w in words), message


@pytest.mark.parametrize("header", [b"id|text|normalized_text", b"File_Name|Transcription",
                                    b"audio_file|text", b"utt_id|sentence|normalised"])
def test_a_header_row_names_the_file_and_line(tmp_path, header):
    # read as a clip "id" with the text "text", it was left out as missing audio, said only in rejected.tsv
    path = tmp_path / "metadata.csv"
    path.write_bytes(b"\xef\xbb\xbf\r\n" + header + b"\r\nLJ001-0001|Printing.|Printing.\r\n")
    with pytest.raises(DatasetError) as e:
        formats.read_metadata(path)
    assert str(e.value).startswith(f"{path}:2: ") and "is a header row" in str(e.value), str(e.value)
    # a clip whose id or text only looks like a column name is a clip; so is such a row below the first
    path.write_bytes(b"name|Text.\nid|text\nLJ001-0001|Printing.\n")
    assert [c.id for c in formats.read_metadata(path)] == ["name", "id", "LJ001-0001"]


def test_empty_metadata_is_an_error(tmp_path):
    path = tmp_path / "metadata.csv"
    path.write_bytes(b"\xef\xbb\xbf\r\n")
    with pytest.raises(DatasetError, match=re.escape(str(path))):
        formats.read_metadata(path)


@pytest.mark.slow
def test_malformed_metadata_reaches_the_user_through_snakemake(tmp_path, corpus):
    root, cfg = corpus
    good = (root / "metadata.csv").read_bytes()
    for kind in ("four columns", "not utf-8", "duplicate id", "parent path id"):
        bad, words = MALFORMED[kind]
        if kind == "duplicate id":
            bad = good.split(b"|", 1)[0] + b"|Again.|Again."
            words = ["duplicate"]
        lines = good.rstrip(b"\n").split(b"\n")
        (root / "metadata.csv").write_bytes(b"\n".join(lines[:5] + [bad] + lines[5:]) + b"\n")
        proc = snakemake("caches", "-n", config=cfg, check=False)
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, kind
        assert _names_file_and_line(output, root / "metadata.csv", 6), (kind, output[-2000:])
        assert all(w.lower() in output.lower() for w in words), (kind, output[-2000:])
        assert "Traceback" not in output  # one clear message, not a Python stack


# --- shards and split ---------------------------------------------------------------------------
IDS = [f"LJ{i:03d}-{j:04d}" for i in range(1, 21) for j in range(1, 101)]  # 2000 ids


def test_shards_are_balanced_and_independent_of_row_order():
    shards = 8
    counts = [0] * shards
    for cid in IDS:
        counts[manifest.shard_of(cid, shards)] += 1
    assert sum(counts) == 2000
    assert all(200 <= c <= 300 for c in counts), counts  # 250 +- 3 standard deviations

    clips = [formats.Clip(cid, "text", f"{cid}|text", n) for n, cid in enumerate(IDS, 1)]
    shuffled = clips[:]
    random.Random(1).shuffle(shuffled)
    a, b = manifest.shard_clips(clips, shards), manifest.shard_clips(shuffled, shards)
    assert {k: [c.id for c in v] for k, v in a.items()} == {k: [c.id for c in v] for k, v in b.items()}
    assert sorted(a) == list(range(shards))


def test_empty_shards_are_listed():
    out = manifest.shard_clips([formats.Clip("a1", "t", "a1|t", 1)], 16)
    assert sorted(out) == list(range(16)) and sum(len(v) for v in out.values()) == 1


@pytest.mark.parametrize("fraction, low, high", [(0.05, 70, 130), (0.2, 346, 454), (0.5, 933, 1067)])
def test_val_fraction_is_roughly_respected(fraction, low, high):
    val = [cid for cid in IDS if manifest.is_validation(cid, fraction)]
    assert low <= len(val) <= high  # 3 standard deviations of a binomial over 2000 ids
    assert not any(manifest.is_validation(cid, 0.0) for cid in IDS)


def test_split_grows_without_moving_validation_clips_back_to_train():
    small = {cid for cid in IDS if manifest.is_validation(cid, 0.05)}
    large = {cid for cid in IDS if manifest.is_validation(cid, 0.2)}
    assert small < large


def test_split_does_not_follow_the_shard():
    # validation clips spread over every shard, so no shard is all validation
    shards = {manifest.shard_of(cid, 8) for cid in IDS if manifest.is_validation(cid, 0.05)}
    assert shards == set(range(8))


def test_manifest_finds_audio_in_each_container(tmp_path):
    (tmp_path / "wavs").mkdir()
    _write(tmp_path / "metadata.csv", ["c1|one", "c2|two", "c3|three", "c4|four"])
    for cid, ext in (("c1", "wav"), ("c2", "flac"), ("c3", "ogg")):
        (tmp_path / "wavs" / f"{cid}.{ext}").write_bytes(b"x")
    found = {cid: manifest.audio_path(tmp_path, "wavs", cid) for cid in ("c1", "c2", "c3", "c4")}
    assert {k: (v.name if v else None) for k, v in found.items()} == {
        "c1": "c1.wav", "c2": "c2.flac", "c3": "c3.ogg", "c4": None}
    by_shard = manifest.load_manifest({"root": str(tmp_path), "metadata": "metadata.csv"}, 3)
    assert sorted(c.id for v in by_shard.values() for c in v) == ["c1", "c2", "c3", "c4"]


def test_the_folder_scan_picks_the_file_audio_path_picks(tmp_path):
    """What planning digests per mel shard (one scan of the folder) names the file a job reads:
    .wav before .flac before .ogg whatever the scan order, other files and folders ignored, and
    a replaced file (same name and size) changes its entry."""
    (tmp_path / "wavs").mkdir()
    files = {"a": ("ogg", "flac", "wav"), "b": ("ogg", "flac"), "c": ("flac",), "d": ("ogg",)}
    for stem, exts in files.items():
        for ext in exts:
            (tmp_path / "wavs" / f"{stem}.{ext}").write_bytes(ext.encode())
    (tmp_path / "wavs" / "e.txt").write_bytes(b"not audio")
    (tmp_path / "wavs" / "f.wav").mkdir()  # a folder named like audio
    found = manifest.audio_files(tmp_path, "wavs")
    assert sorted(found) == ["a", "b", "c", "d"]
    for stem, entry in found.items():
        assert entry.split(":")[0] == manifest.audio_path(tmp_path, "wavs", stem).name
    assert {k: v.split(":")[0] for k, v in found.items()} == {"a": "a.wav", "b": "b.flac", "c": "c.flac", "d": "d.ogg"}
    twins = {}  # what planning refuses for a listed clip (formats.one_audio_file)
    assert manifest.audio_files(tmp_path, "wavs", twins) == found
    assert twins == {"a": ["a.wav", "a.flac", "a.ogg"], "b": ["b.flac", "b.ogg"]}
    path = tmp_path / "wavs" / "b.flac"
    st = path.stat()
    path.write_bytes(b"FLAC")  # same size, new content
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert manifest.audio_files(tmp_path, "wavs")["b"] != found["b"]


# --- an audio file known by its bytes: steady_stamps, keyed_stamp ---------------------------------
def test_a_file_whose_timestamp_alone_moved_keeps_its_keyed_stamp(tmp_path, monkeypatch):
    # `touch`, a copy without -p, a fresh checkout: the same bytes, a new mtime, and every shard they
    # touched reran with all that follows it (3 min 27 s of the demo for one touched clip)
    (tmp_path / "wavs").mkdir()
    for stem in "abc":
        (tmp_path / "wavs" / f"{stem}.wav").write_bytes(stem.encode() * 100)
    memo = tmp_path / "cache" / manifest.STAMPS_FILE

    def steady():  # a plan, and the run it starts
        found = manifest.audio_files(tmp_path, "wavs")
        files = {cid: tmp_path / "wavs" / entry.split(":")[0] for cid, entry in found.items()}
        keyed, record = manifest.steady_stamps(found, files, memo)
        manifest.write_stamps(memo, record, log=pytest.fail)
        return found, keyed

    found, keyed = steady()
    assert keyed == found and memo.is_file()  # the first plan: every file's own stamp, each hashed once
    written = memo.stat().st_mtime_ns
    assert steady()[1] == keyed and memo.stat().st_mtime_ns == written  # nothing new: the memo is not rewritten
    a, b, c = (tmp_path / "wavs" / f"{s}.wav" for s in "abc")
    later = time.time() + 100
    os.utime(a, (later, later))                                          # touch
    b.write_bytes(b.read_bytes())                                        # copied over itself, without -p
    now, keyed2 = steady()
    assert now["a"] != found["a"] and now["b"] != found["b"]
    assert keyed2 == keyed                                               # the shards' keys: nothing reruns
    assert steady()[1] == keyed                                          # and the next plan reads nothing
    st = c.stat()
    c.write_bytes(b"x" * 100)                                            # the same size, other bytes,
    os.utime(c, ns=(st.st_atime_ns, st.st_mtime_ns - 10**12))            # an older mtime (cp -p, mv)
    assert steady()[1]["c"] == manifest.audio_stamp(c) != keyed["c"]
    c.rename(tmp_path / "wavs" / "c.flac")                               # another name, the same bytes
    found = manifest.audio_files(tmp_path, "wavs")
    assert manifest.steady_stamps(found, {k: tmp_path / "wavs" / v.split(":")[0] for k, v in found.items()},
                                  memo)[0]["c"].startswith("c.flac:")
    # the jobs map a stamp the same way, through the memo planning names (decode keys of the audio shards)
    monkeypatch.setenv(manifest.STAMPS_ENV, str(memo))
    manifest._job_memo.cache_clear()
    assert manifest.keyed_stamp("a", a) == keyed["a"] != manifest.audio_stamp(a)
    monkeypatch.delenv(manifest.STAMPS_ENV)
    assert manifest.keyed_stamp("a", a) == manifest.audio_stamp(a)       # without a memo: the file's own


def test_a_file_changed_while_the_run_was_under_way_stops_its_job(tmp_path, monkeypatch):
    # the memo held the bytes planning read, the job decoded others under that key, and when the old bytes
    # came back (a checkout switched back, a backup restored) the plan mapped them to that key: nothing reran
    wav = tmp_path / "wavs" / "a.wav"
    wav.parent.mkdir()
    wav.write_bytes(b"A" * 100)
    memo = tmp_path / manifest.STAMPS_FILE
    found = manifest.audio_files(tmp_path, "wavs")
    manifest.write_stamps(memo, manifest.steady_stamps(found, {"a": wav}, memo)[1], log=pytest.fail)
    monkeypatch.setenv(manifest.STAMPS_ENV, str(memo))
    manifest._job_memo.cache_clear()
    manifest.check_planned("a", wav)                    # as planned
    later = time.time() + 100
    os.utime(wav, (later, later))
    manifest.check_planned("a", wav)                    # touched: the same bytes
    wav.write_bytes(b"B" * 100)
    with pytest.raises(errors.PipelineError, match=f"^{re.escape(str(wav))}: changed while this run was under way"):
        manifest.check_planned("a", wav)
    manifest.check_planned("other", wav)                # a clip planning did not read: nothing to compare


def test_a_hand_edited_memo_entry_is_unseen(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"A")
    memo = tmp_path / manifest.STAMPS_FILE
    stamp = manifest.audio_stamp(tmp_path / "a.wav")
    for entry in (["a.wav:1:1", None, "x"], [stamp, None, None], [stamp, 5, None], "junk"):
        memo.write_text(json.dumps({"a": entry}))
        assert manifest.steady_stamps({"a": stamp}, {"a": tmp_path / "a.wav"}, memo)[0] == {"a": stamp}


def test_a_memo_that_cannot_be_written_is_said_and_changes_nothing(tmp_path):
    (tmp_path / "x.wav").write_bytes(b"RIFF")
    (tmp_path / "cache").write_text("a file where the cache folder goes")
    said = []
    stamps = {"x": manifest.audio_stamp(tmp_path / "x.wav"), "gone": None}
    keyed, record = manifest.steady_stamps(stamps, {"x": tmp_path / "x.wav"}, tmp_path / "cache" / manifest.STAMPS_FILE)
    assert keyed == stamps
    manifest.write_stamps(tmp_path / "cache" / manifest.STAMPS_FILE, record, log=said.append)
    assert len(said) == 1 and said[0].startswith(f"audio file digests not recorded in {tmp_path / 'cache'}")


# --- the clip lists a run writes for its shard jobs -------------------------------------------
def _listed_dataset(tmp_path, n=40):
    root = tmp_path / "data"
    root.mkdir()
    meta = _write(root / "metadata.csv", [f"c{i:03d}|Text number {i}.|text number {i}" for i in range(n)])
    return {"root": str(root), "metadata": "metadata.csv", "audio_dir": "wavs"}, meta


def test_clip_lists_hold_each_shards_clips_and_change_only_with_the_dataset(tmp_path):
    ds, meta = _listed_dataset(tmp_path)
    lists = tmp_path / "lists"
    m = manifest.load_manifest(ds, 4)
    gen = manifest.write_clip_lists(m, 4, lists, ds)
    for k in range(4):
        assert manifest.read_clip_list(gen / f"shard-{k:03d}.json", ds, 4, k) == m[k]
    written = {p.name: p.stat().st_mtime_ns for p in gen.iterdir()}
    assert manifest.write_clip_lists(manifest.load_manifest(ds, 4), 4, lists, ds) == gen  # same data: nothing written
    assert {p.name: p.stat().st_mtime_ns for p in gen.iterdir()} == written
    lines = meta.read_text().splitlines()
    lines[5] = "c005|Edited text.|edited text"
    _write(meta, lines)
    killed, writing = lists / ".tmp-0123456789abcdef-1", lists / ".tmp-fedcba9876543210-2"
    killed.mkdir(), writing.mkdir()  # a killed run's half-written folder, an hour old; one being written now
    os.utime(killed, (time.time() - 7200,) * 2)
    m2 = manifest.load_manifest(ds, 4)
    gen2 = manifest.write_clip_lists(m2, 4, lists, ds)
    assert gen2 != gen and not gen.exists() and sorted(p.name for p in lists.iterdir()) == [writing.name, gen2.name]
    k = manifest.shard_of("c005", 4)
    assert [c.text for c in manifest.read_clip_list(gen2 / f"shard-{k:03d}.json", ds, 4, k) if c.id == "c005"] == \
        ["edited text"]
    assert manifest.write_clip_lists(manifest.load_manifest(ds, 8), 8, lists, ds) != gen2  # the shard count too


def test_a_clip_list_that_cannot_stand_for_the_job_is_not_used(tmp_path, monkeypatch):
    ds, _ = _listed_dataset(tmp_path)
    m = manifest.load_manifest(ds, 4)
    gen = manifest.write_clip_lists(m, 4, tmp_path / "lists", ds)
    path = gen / "shard-001.json"
    other = dict(ds, root=str(tmp_path / "elsewhere"))
    with pytest.raises(ValueError, match="another dataset"):
        manifest.read_clip_list(path, other, 4, 1)
    with pytest.raises(ValueError, match="shard 1 of 4, not 1 of 8"):
        manifest.read_clip_list(path, ds, 8, 1)
    with pytest.raises(ValueError, match="shard 1 of 4, not 2 of 4"):
        manifest.read_clip_list(path, ds, 4, 2)
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b'"format": 1', b'"format": 0', 1))
    with pytest.raises(ValueError, match="in format 0, not 1"):
        manifest.read_clip_list(path, ds, 4, 1)
    path.write_bytes(raw.replace(b"Text number", b"Text numbex", 1))  # one byte of one clip's text
    with pytest.raises(ValueError, match="damaged"):
        manifest.read_clip_list(path, ds, 4, 1)
    # a job given that list reads the dataset instead, and says why in its log
    monkeypatch.setenv(manifest.CLIP_LISTS_ENV, str(gen))
    said = []
    assert manifest.shard_manifest(ds, 4, 1, log=said.append) == m[1]
    assert len(said) == 1 and "damaged" in said[0] and "reading the dataset instead" in said[0]
    said.clear()
    assert manifest.shard_manifest(ds, 4, 2, log=said.append) == m[2] and "clips from" in said[0]
    monkeypatch.setenv(manifest.CLIP_LISTS_ENV, str(tmp_path / "lists" / "gone"))  # replaced by a later run
    assert manifest.shard_manifest(ds, 4, 2, log=said.append) == m[2]


def test_a_clip_list_whose_header_is_json_but_no_object_is_unreadable(tmp_path, monkeypatch):
    # [1] or 5 parses as JSON: read as a header, it stopped the shard job with an AttributeError traceback
    ds, _ = _listed_dataset(tmp_path)
    m = manifest.load_manifest(ds, 4)
    gen = manifest.write_clip_lists(m, 4, tmp_path / "lists", ds)
    path = gen / "shard-001.json"
    clips = path.read_bytes().partition(b"\n")[2]
    monkeypatch.setenv(manifest.CLIP_LISTS_ENV, str(gen))
    for header in (b"[1]", b"5", b'"format"', b"null"):
        path.write_bytes(header + b"\n" + clips)
        with pytest.raises(ValueError, match=r"^unreadable header \(JSON, but not an object\)$"):
            manifest.read_clip_list(path, ds, 4, 1)
        said = []  # the job reads the dataset instead, and says why
        assert manifest.shard_manifest(ds, 4, 1, log=said.append) == m[1]
        assert said == [f"{path}: unreadable header (JSON, but not an object); reading the dataset instead"]


def test_a_source_clip_whose_file_is_gone_has_no_audio(tmp_path):
    # the shard job then rejects the clip as a missing file, naming it, instead of failing to decode it
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    here = formats.Clip("s-a", "One.", "a.wav|One.", 2, audio=str(tmp_path / "a.wav"))
    gone = formats.Clip("s-b", "Two.", "b.wav|Two.", 3, audio=str(tmp_path / "b.wav"))
    assert manifest.clip_audio({"sources": []}, here) == tmp_path / "a.wav"
    assert manifest.clip_audio({"sources": []}, gone) is None
