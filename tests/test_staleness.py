"""The staleness contract (docs/architecture.md, docs/caches.md): after a real `snakemake caches`, an edit makes
`snakemake -n caches` plan exactly the stale shard jobs, and a real rebuild then leaves nothing to do.

One corpus is built once for the module; each test edits it, checks the plan, rebuilds and checks
that nothing is left to do, so the next test starts from a clean state (a failed test's leftovers
are rebuilt first). Shard files are stamped (mtime, size) around each real rebuild to check that
only the planned shards were rewritten.

    python -m pytest -q tests/test_staleness.py
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import snakemake_cli
import soundfile as sf
import yaml
from conftest import ROOT, TINY_ALIGNER, TRANSCRIPTS, snakemake, write_config

from pipeline import formats, make_corpus, manifest

SHARDS = 4
_COUNT = re.compile(r"^\s*(\w+)\s+(\d+)\s*$")


# --- helpers ---------------------------------------------------------------------------------
def parse_plan(output):
    """({rule: jobs}, {rule: sorted shard wildcards}) from a non-quiet `snakemake -n` output."""
    counts, shards, rule = {}, {}, None
    for line in output.splitlines():
        m = _COUNT.match(line)
        if m and m.group(1) not in ("total", "job", "count"):
            counts[m.group(1)] = int(m.group(2))
        m = re.match(r"^(?:local)?rule (\w+):", line.strip())
        if m:
            rule = m.group(1)
        m = re.match(r"^wildcards: shard=(\d+)", line.strip())
        if m and rule:
            shards.setdefault(rule, []).append(int(m.group(1)))
    return counts, {k: sorted(v) for k, v in shards.items()}


def plan(config, *extra, project=None):
    """Dry run of `caches`: ({rule: count}, {rule: [shards]}). project: a copied project folder."""
    if project is None:
        proc = snakemake("caches", "-n", *extra, config=config)
    else:
        proc = run_copy(project, "caches", "-n", *extra, config=config)
    return parse_plan(proc.stdout + proc.stderr)


def run_copy(project, *args, config):
    """The real snakemake CLI on a copied project, run inside it (its own .snakemake/)."""
    proc = snakemake_cli.run(["--snakefile", str(project / "Snakefile"), "--cores", "2", "--directory", str(project),
                              *args, "--configfile", str(config)], project)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def stamps(cache):
    """{relative path: (mtime_ns, size)} of every shard file."""
    return {str(p.relative_to(cache)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(cache.glob("*/shard-*"))}


def rewritten(before, after):
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def shard_files(kind, shard):
    """The files one job writes: mel_shard ("mels") writes the energy and audio shards too."""
    kinds = {"mels": ("mels", "energy", "audio")}.get(kind, (kind,))
    return sorted(f"{k}/shard-{shard:03d}{s}" for k in kinds
                  for s in (".bin", ".json") + ((".stats.npy",) if k not in ("tokens", "audio", "durations") else ()))


def jobs_files(*jobs):
    """The files written by jobs [(kind, shard)], sorted."""
    return sorted(f for kind, shard in jobs for f in shard_files(kind, shard))


def read_lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def write_lines(path, lines, newline="\n"):
    path.write_bytes("".join(line + newline for line in lines).encode("utf-8"))


def speak_to(path, text, speed):
    y, sr = make_corpus.speak(text, speed=speed)
    sf.write(str(path), y, sr, subtype="PCM_16")


def transcript(n):
    """Line n (0-based) of the LJSpeech transcripts: lines >= 24 are not in the test corpus."""
    return TRANSCRIPTS.read_text(encoding="utf-8").splitlines()[n]


NOTHING = ({}, {})


# --- the built project shared by this module ---------------------------------------------------
@pytest.fixture(scope="module")
def project(tmp_path_factory, corpus_template):
    tmp = tmp_path_factory.mktemp("staleness")
    root = tmp / "data"
    shutil.copytree(corpus_template, root)
    config = write_config(tmp, root)
    snakemake("caches", config=config)
    return SimpleNamespace(tmp=tmp, root=root, config=config, cache=tmp / "cache" / "t",
                           meta=root / "metadata.csv", clean=True)


@pytest.fixture
def built(project):
    """The module's project, built and up to date (rebuilt if the previous test left it dirty)."""
    if not project.clean:
        snakemake("caches", config=project.config)
    project.clean = False
    yield project


def rebuild_then_nothing_to_do(p, *extra):
    """The real build after an edit; returns the shard files it rewrote."""
    before = stamps(p.cache)
    snakemake("caches", *extra, config=p.config)
    changed = rewritten(before, stamps(p.cache))
    assert plan(p.config, *extra) == NOTHING, "a rebuild must leave nothing to do"
    p.clean = True
    return changed


def clip_of_shard(p, shard):
    """The first metadata line (index, id) whose clip lives in `shard`."""
    for i, line in enumerate(read_lines(p.meta)):
        cid = line.split("|")[0]
        if manifest.shard_of(cid, SHARDS) == shard:
            return i, cid
    raise AssertionError(f"no clip in shard {shard}")


# --- nothing changed --------------------------------------------------------------------------
@pytest.mark.slow
def test_nothing_changed_means_nothing_to_do(built):
    assert plan(built.config) == NOTHING
    future = time.time() + 60
    os.utime(built.meta, (future, future))  # `touch metadata.csv`, surely newer than every output
    os.utime(built.config, (future, future))  # and the config file
    assert plan(built.config) == NOTHING
    built.clean = True  # an empty plan is what a real build runs


@pytest.mark.slow
def test_crlf_and_bom_rewrite_of_metadata_is_nothing_to_do(built):
    # The rows' digests use each decoded line without its "\r" and without the BOM, so re-saving
    # the file in a Windows editor changes no row.
    lines = read_lines(built.meta)
    built.meta.write_bytes(b"\xef\xbb\xbf" + "".join(line + "\r\n" for line in lines).encode("utf-8"))
    assert plan(built.config) == NOTHING
    write_lines(built.meta, lines)
    built.clean = True


@pytest.mark.slow
def test_planning_removes_what_a_killed_shard_job_left_and_nothing_else(built):
    # SIGKILL or SIGTERM (a SLURM time limit) skips atomic_write's cleanup: a shard's temporary file,
    # gigabytes for an audio shard, stayed for good. Planning removes this user's, untouched for 10 min
    mels = built.cache / "mels"
    old, fresh = mels / ".shard-000.bin.tmp4242", mels / ".shard-001.bin.tmp4243"
    old.write_bytes(b"half a shard")
    fresh.write_bytes(b"being written")
    past = time.time() - 3600
    os.utime(old, (past, past))
    proc = snakemake("caches", "-n", config=built.config)
    assert parse_plan(proc.stdout + proc.stderr) == NOTHING and f"removed {old}: what a stopped shard job left" in \
        proc.stderr
    assert not old.exists() and fresh.exists()
    fresh.unlink()
    built.clean = True


@pytest.mark.slow
def test_row_order_does_not_matter(built):
    lines = read_lines(built.meta)
    shuffled = lines[:]
    random.Random(7).shuffle(shuffled)
    assert shuffled != lines
    write_lines(built.meta, shuffled)
    assert plan(built.config) == NOTHING
    built.clean = True


# --- dataset edits ----------------------------------------------------------------------------
@pytest.mark.slow
def test_edit_one_line_text_rebuilds_one_token_shard(built):
    lines = read_lines(built.meta)
    i, cid = clip_of_shard(built, 2)
    cols = lines[i].split("|")
    lines[i] = "|".join([cid] + [c + " Indeed, quite so." for c in cols[1:]])
    write_lines(built.meta, lines)
    counts, shards = plan(built.config)
    assert counts == {"token_shard": 1, "cache_index": 1, "caches": 1}  # no mel_shard, no pitch_shard
    assert shards == {"token_shard": [2]}
    tokens_before = (built.cache / "tokens/shard-002.bin").read_bytes()
    assert rebuild_then_nothing_to_do(built) == shard_files("tokens", 2)
    # the job read its clips from the list the run wrote for it (pipeline/manifest.py), the edited one
    assert (built.cache / "tokens/shard-002.bin").read_bytes() != tokens_before
    lists = [p for p in (built.cache / ".clips").iterdir()]
    assert len(lists) == 1 and f"clips from {lists[0] / 'shard-002.json'}" in \
        (built.tmp / "reports/t/logs/token_shard/002.log").read_text()


def _replace_audio(p, shard, older_mtime=False):
    lines = read_lines(p.meta)
    i, cid = clip_of_shard(p, shard)
    wav = p.root / "wavs" / f"{cid}.wav"
    new = p.tmp / f"{cid}.new.wav"
    speak_to(new, lines[i].split("|")[-1], speed=120)  # the same words, spoken slower
    assert new.read_bytes() != wav.read_bytes()
    if older_mtime:  # as `mv`, `cp -p` or `rsync -a` of a file made before the caches were built
        old = min(s[0] for s in stamps(p.cache).values()) / 1e9 - 3600
        os.utime(new, (old, old))
    os.replace(new, wav)
    return cid


@pytest.mark.slow
def test_replace_one_audio_file_rebuilds_its_mel_and_pitch_shard(built):
    cid = _replace_audio(built, 3)
    counts, shards = plan(built.config)
    assert counts == {"mel_shard": 1, "pitch_shard": 1, "cache_index": 1, "caches": 1}  # no token_shard
    assert shards == {"mel_shard": [3], "pitch_shard": [3]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("mels", 3), ("pitch", 3))
    n = sf.info(str(built.root / "wavs" / f"{cid}.wav")).frames
    for kind in ("mels", "energy", "pitch"):  # the slower speech is what the shards now hold
        meta = json.loads((built.cache / f"{kind}/shard-003.json").read_text())
        assert meta["lengths"][meta["ids"].index(cid)] == n // 256
    audio = json.loads((built.cache / "audio/shard-003.json").read_text())  # the vocoder's waveform too
    assert audio["lengths"][audio["ids"].index(cid)] == n // 256 * 256


@pytest.mark.slow
def test_replace_audio_with_a_file_older_than_the_cache_still_rebuilds(built):
    # Replacing a clip by moving in a file written earlier (mv, cp -p, rsync -a) keeps its old
    # mtime, so Snakemake's mtime trigger alone would miss it: the file's identity must count.
    _replace_audio(built, 0, older_mtime=True)
    counts, shards = plan(built.config)
    assert counts == {"mel_shard": 1, "pitch_shard": 1, "cache_index": 1, "caches": 1}
    assert shards == {"mel_shard": [0], "pitch_shard": [0]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("mels", 0), ("pitch", 0))


@pytest.mark.slow
def test_an_audio_file_with_a_new_timestamp_and_its_bytes_reruns_nothing(built):
    # `touch`, a copy without -p or rsync -t, a fresh checkout: every shard it touched reran, and what follows
    wavs = sorted((built.root / "wavs").iterdir())
    future = time.time() + 60
    os.utime(wavs[0], (future, future))
    for wav in wavs[1:]:
        wav.write_bytes(wav.read_bytes())      # copied over itself: a new mtime, the same bytes
    assert plan(built.config) == NOTHING
    recorded = json.loads((built.cache / manifest.STAMPS_FILE).read_text())  # what the plan read is recorded
    assert recorded[wavs[0].stem][0] == manifest.audio_stamp(wavs[0]) != recorded[wavs[0].stem][1]
    # the same size, other bytes: that shard reruns (planning read the changed file)
    i, cid = clip_of_shard(built, 2)
    wav = built.root / "wavs" / f"{cid}.wav"
    y, sr = sf.read(str(wav), dtype="int16")
    sf.write(str(wav), np.roll(y, 1), sr, subtype="PCM_16")
    counts, shards = plan(built.config)
    assert shards == {"mel_shard": [2], "pitch_shard": [2]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("mels", 2), ("pitch", 2))


@pytest.mark.slow
def test_add_one_clip_rebuilds_only_its_shard(built):
    line = transcript(30)
    cid = line.split("|")[0]
    ids_before = {i: json.loads((built.cache / f"tokens/shard-{i:03d}.json").read_text())["ids"]
                  for i in range(SHARDS)}
    assert all(cid not in ids for ids in ids_before.values())
    speak_to(built.root / "wavs" / f"{cid}.wav", line.split("|")[-1], speed=175)
    write_lines(built.meta, read_lines(built.meta) + [line])
    k = manifest.shard_of(cid, SHARDS)
    counts, shards = plan(built.config)
    assert counts == {"token_shard": 1, "mel_shard": 1, "pitch_shard": 1, "cache_index": 1, "caches": 1}
    assert shards == {"token_shard": [k], "mel_shard": [k], "pitch_shard": [k]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("tokens", k), ("mels", k), ("pitch", k))
    for kind in ("tokens", "mels", "energy", "pitch"):
        ids = json.loads((built.cache / f"{kind}/shard-{k:03d}.json").read_text())["ids"]
        assert sorted(ids) == sorted(ids_before[k] + [cid])


@pytest.mark.slow
def test_remove_one_clip_rebuilds_only_its_shard(built):
    lines = read_lines(built.meta)
    i, cid = clip_of_shard(built, 1)
    write_lines(built.meta, lines[:i] + lines[i + 1:])
    (built.root / "wavs" / f"{cid}.wav").unlink()
    counts, shards = plan(built.config)
    assert counts == {"token_shard": 1, "mel_shard": 1, "pitch_shard": 1, "cache_index": 1, "caches": 1}
    assert shards == {"token_shard": [1], "mel_shard": [1], "pitch_shard": [1]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("tokens", 1), ("mels", 1), ("pitch", 1))
    for kind in ("tokens", "mels", "energy", "pitch"):
        assert cid not in json.loads((built.cache / f"{kind}/shard-001.json").read_text())["ids"]
    index = json.loads((built.cache / "index.json").read_text())
    assert cid not in (built.cache / "rejected.tsv").read_text()  # removed, not rejected
    assert index["counts"]["clips"] == len(read_lines(built.meta))


# --- damaged caches ---------------------------------------------------------------------------
@pytest.mark.slow
def test_deleted_and_truncated_shards_rebuild_exactly_their_jobs_and_then_load(built):
    (built.cache / "tokens/shard-001.bin").unlink()
    mel = built.cache / "mels/shard-002.bin"
    mel.write_bytes(mel.read_bytes()[:-1000])
    from pipeline import config as pconfig
    from pipeline import data
    cfg = pconfig.load_config(built.config)
    with pytest.raises(data.CacheError, match="snakemake --cores all caches"):
        data.load_clips(cfg)
    counts, shards = plan(built.config)
    assert counts == {"token_shard": 1, "mel_shard": 1, "cache_index": 1, "caches": 1}
    assert shards == {"token_shard": [1], "mel_shard": [2]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("tokens", 1), ("mels", 2))
    clips, _ = data.load_clips(cfg)
    assert len(clips.ids) == len(read_lines(built.meta))  # every clip back, every shard checked
    batch = next(iter(data.build_dataset(cfg, "train")))  # and training data loads again
    assert {"tokens", "mel", "pitch", "energy"} <= set(batch)


@pytest.mark.slow
def test_a_dry_run_beside_a_running_build_marks_no_shard_damaged(built, tmp_path):
    # `snakemake -n` from a second terminal while a build writes a shard: planning took the half-written
    # shard for a damaged one and wrote its repair marker, so the next run did its job (and the index,
    # and all after it) again. Another Snakemake's lock in the working folder now holds the marker back.
    work = tmp_path / "work"
    (work / ".snakemake" / "locks").mkdir(parents=True)
    (work / "configs").symlink_to(ROOT / "configs")  # the Snakefile's configfile, relative to its folder
    mel = built.cache / "mels/shard-002.bin"
    marker = built.cache / ".repair" / "mels-002"
    before = marker.read_text() if marker.exists() else None
    mel.write_bytes(mel.read_bytes()[:-1000])  # as a job half way through it leaves it
    lock = work / ".snakemake" / "locks" / "0.output.lock"
    lock.write_text(f"{mel}\n")
    snakemake("caches", "-n", config=built.config, cwd=work)
    assert (marker.read_text() if marker.exists() else None) == before
    # a lock of another run (another `name`, another project in the folder) is not this run's business
    lock.write_text(f"{tmp_path / 'elsewhere' / 'cache' / 'mels' / 'shard-002.bin'}\n")
    out = snakemake("caches", "-n", config=built.config, cwd=work)
    assert marker.read_text() != before and "shard=002" in out.stdout + out.stderr
    lock.unlink()  # no other run: the same shard is damaged, and marked so
    before = marker.read_text()
    out = snakemake("caches", "-n", config=built.config, cwd=work)
    assert marker.read_text() != before and "shard=002" in out.stdout + out.stderr


def test_files_the_index_does_not_list_still_rebuild_exactly_their_jobs(built):
    # cache_index lists only the token, mel and pitch JSON files; the repair check covers the rest
    (built.cache / "energy/shard-000.bin").unlink()
    (built.cache / "pitch/shard-003.stats.npy").unlink()
    (built.cache / "energy/shard-001.json").unlink()
    counts, shards = plan(built.config)
    assert counts == {"mel_shard": 2, "pitch_shard": 1, "cache_index": 1, "caches": 1}
    assert shards == {"mel_shard": [0, 1], "pitch_shard": [3]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("mels", 0), ("mels", 1), ("pitch", 3))


def flip_byte(path):
    """XOR one byte in the middle of `path` and put its mtime back, as bit rot does."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)[0]
        f.seek(st.st_size // 2)
        f.write(bytes([byte ^ 0x5A]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


@pytest.mark.slow
def test_flipped_bytes_with_mtime_kept_fail_the_loader_and_rebuild_exactly_their_jobs(built):
    import tensorflow as tf

    from pipeline import config as pconfig
    from pipeline import data, errors
    damaged = {"tokens": 0, "mels": 2, "pitch": 3}
    for kind, shard in damaged.items():
        flip_byte(built.cache / f"{kind}/shard-{shard:03d}.bin")
    cfg = pconfig.load_config(built.config)
    data.load_clips(cfg)  # sizes and JSON agree: only the checksum, read with the bytes, tells
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        next(iter(data.build_dataset(cfg, "train")))
    line = errors._one_line(caught.value)  # what `python -m pipeline.train` prints as its one line
    assert line.startswith("damaged cache shard ") and "\n" not in line
    assert "run `snakemake --cores all caches`" in line
    named = set(re.findall(r"(\w+)/shard-(\d{3})\.bin", line))
    assert named and named <= {(k, f"{s:03d}") for k, s in damaged.items()}
    counts, shards = plan(built.config)
    assert counts == {"token_shard": 1, "mel_shard": 1, "pitch_shard": 1, "cache_index": 1, "caches": 1}
    assert shards == {"token_shard": [0], "mel_shard": [2], "pitch_shard": [3]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("tokens", 0), ("mels", 2), ("pitch", 3))
    batches = data.build_dataset(cfg, "train")
    for _, batch in zip(range(8), batches):  # every shard group read and verified again
        assert {"tokens", "mel", "pitch", "energy"} <= set(batch)


@pytest.mark.slow
def test_damage_that_planning_missed_is_found_by_the_loader_and_then_rebuilt(built):
    # planning hashes a .bin only when its size, mtime, ctime or inode moved since it last verified it;
    # a disk's own bit rot moves none of them: here the stamp is rewritten to the damaged file's stat
    import tensorflow as tf

    from pipeline import config as pconfig
    from pipeline import data, errors
    path = rot_unseen(built, "mels", 1)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        next(iter(data.build_dataset(pconfig.load_config(built.config), "train")))
    assert "mels/shard-001.bin" in errors._one_line(caught.value)  # and forgets the stamp
    counts, shards = plan(built.config)
    assert shards == {"mel_shard": [1]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("mels", 1))
    assert path.exists()


def rot_unseen(built, kind, shard):
    """Flip a byte of a verified shard's .bin and rewrite its stamp to the damaged file's stat, as a
    disk's own bit rot leaves it: planning, which hashes only a .bin whose stat moved, cannot see it."""
    assert plan(built.config) == NOTHING  # every shard verified and stamped
    path = built.cache / f"{kind}/shard-{shard:03d}.bin"
    stamp = built.cache / f".verified/{kind}-shard-{shard:03d}"
    checksum = stamp.read_text().split()[-1]
    flip_byte(path)
    st = path.stat()
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {checksum}\n")
    assert plan(built.config) == NOTHING  # planning cannot see it
    return path


def test_damage_found_by_a_numpy_reader_is_rebuilt_by_the_next_plan(built):
    # the duration, GTA and evaluate jobs read shards with NumPy (shards.read), not the loader's graph:
    # a checksum mismatch found there forgets the stamp too, so the next `snakemake` rebuilds the shard
    from pipeline import shards
    path = rot_unseen(built, "pitch", 2)
    with pytest.raises(shards.CacheError, match="pitch/shard-002.bin: checksum mismatch"):
        shards.read(path.with_suffix(""), "pitch")
    counts, stale = plan(built.config)
    assert stale == {"pitch_shard": [2]}
    assert rebuild_then_nothing_to_do(built) == jobs_files(("pitch", 2))


# --- settings ---------------------------------------------------------------------------------
def _edited_config(p, path, **sections):
    cfg = yaml.safe_load(p.config.read_text())
    for section, values in sections.items():
        cfg.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("section, values, stale", [
    ("audio", {"fmax": 7600}, {"mel_shard": SHARDS}),             # the mel band: pitch needs only rate and hop
    ("audio", {"hop_length": 200}, {"mel_shard": SHARDS, "pitch_shard": SHARDS}),  # the frame grid
    ("dataset", {"max_seconds": 15.0}, {"mel_shard": SHARDS, "pitch_shard": SHARDS}),  # which clips are rejected
    ("pitch", {"method": "harvest"}, {"pitch_shard": SHARDS}),
    ("text", {"frontend": "characters"}, {"token_shard": SHARDS}),
    ("text", {"language": "en-gb"}, {"token_shard": SHARDS}),
    ("dataset", {"val_fraction": 0.25}, {}),                       # only the statistics change
    ("train", {"steps": 7}, None),                                 # caches do not depend on training
    ("vocoder", {"segment_frames": 16, "steps": 7}, None),         # nor on the vocoder (the audio cache neither)
])
def test_setting_changes_rebuild_only_what_they_change(built, section, values, stale):
    other = _edited_config(built, built.tmp / "other.yaml", **{section: values})
    counts, _ = plan(other)
    expected = {} if stale is None else {**stale, "cache_index": 1, "caches": 1}
    assert counts == expected
    built.clean = True  # a dry run under other settings changes nothing


@pytest.mark.slow
def test_audio_setting_in_configfile_rebuilds_every_mel_shard(built):
    _edited_config(built, built.config, audio={"n_mels": 64})
    counts, shards = plan(built.config)
    assert counts == {"mel_shard": SHARDS, "cache_index": 1, "caches": 1}
    assert shards == {"mel_shard": list(range(SHARDS))}
    changed = rebuild_then_nothing_to_do(built)
    assert changed == jobs_files(*(("mels", k) for k in range(SHARDS)))
    assert json.loads((built.cache / "mels/shard-000.json").read_text())["width"] == 64
    assert json.loads((built.cache / "index.json").read_text())["n_mels"] == 64


@pytest.mark.slow
def test_audio_setting_on_the_command_line_rebuilds_every_mel_shard(built):
    # `--config` is the other documented way to override a key; Snakemake parses nested values
    # with YAML's BaseLoader, so 48 arrives as the string '48'.
    n_mels = 48 if json.loads((built.cache / "mels/shard-000.json").read_text())["width"] != 48 else 40
    counts, shards = plan(built.config, "--config", f"audio={{n_mels: {n_mels}}}")
    assert counts == {"mel_shard": SHARDS, "cache_index": 1, "caches": 1}
    assert shards == {"mel_shard": list(range(SHARDS))}
    built.clean = True


@pytest.mark.slow
def test_text_setting_rebuilds_every_token_shard(built):
    _edited_config(built, built.config, text={"cleaners": "basic"})
    counts, shards = plan(built.config)
    assert counts == {"token_shard": SHARDS, "cache_index": 1, "caches": 1}
    assert shards == {"token_shard": list(range(SHARDS))}
    changed = rebuild_then_nothing_to_do(built)
    assert changed == jobs_files(*(("tokens", k) for k in range(SHARDS)))
    assert json.loads((built.cache / "vocab.json").read_text())["cleaners"] == "basic"


@pytest.mark.slow
def test_pitch_setting_on_the_command_line_rebuilds_every_pitch_shard_and_nothing_else(built):
    counts, shards = plan(built.config, "--config", "pitch={fmin: 50.0, fmax: 500.0}")
    assert counts == {"pitch_shard": SHARDS, "cache_index": 1, "caches": 1}
    assert shards == {"pitch_shard": list(range(SHARDS))}
    changed = rebuild_then_nothing_to_do(built, "--config", "pitch={fmin: 50.0, fmax: 500.0}")
    assert changed == jobs_files(*(("pitch", k) for k in range(SHARDS)))
    assert json.loads((built.cache / "index.json").read_text())["pitch"]["fmin"] == 50.0


# --- feature code -----------------------------------------------------------------------------
@pytest.mark.slow
def test_feature_code_change_rebuilds_the_shards_it_makes(tmp_path, corpus_template):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("Snakefile", "rules", "pipeline", "configs", "environment.yml"):  # the rules' conda env too
        src = ROOT / name
        if not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, project / name)
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    meta = root / "metadata.csv"
    write_lines(meta, read_lines(meta)[:10])  # the code trigger does not need many clips
    n = 2
    config = write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": n}, aligner=TINY_ALIGNER)
    cache = tmp_path / "cache" / "t"
    run_copy(project, "caches", config=config)
    # Each edit's dry run below counts its jobs exactly, so it also shows that the run before it left
    # nothing stale: a dry run of its own after each run (one Snakemake start each) would add nothing.

    # a different espeak-ng (patched in where no digest looks) is a change to the token shards alone
    espeak = "\nfrom pipeline import text as _text  # noqa\n_text.espeak_version = lambda: '1.99-test'\n"
    cases = (("audio.py", "", ("mels", "pitch")), ("text.py", "", ("tokens",)), ("symbols.py", "", ("tokens",)),
             ("pitch.py", "", ("pitch",)),
             ("shards.py", espeak, ("tokens",)))
    for module, code, kinds in cases:
        with open(project / "pipeline" / module, "a") as f:
            f.write(code or "\n# a comment is a code change too\n")
        counts, _ = plan(config, project=project)
        rules = {"tokens": "token_shard", "mels": "mel_shard", "pitch": "pitch_shard"}
        assert counts == {**{rules[k]: n for k in kinds}, "cache_index": 1, "caches": 1}, module
        before = stamps(cache)
        run_copy(project, "caches", config=config)
        assert rewritten(before, stamps(cache)) == jobs_files(*((k, i) for k in kinds for i in range(n))), module
    assert json.loads((cache / "tokens/shard-000.json").read_text())["espeak"] == "1.99-test"

    # code that makes no shard (the model) leaves the caches alone (and the last edit's run left nothing)
    with open(project / "pipeline" / "models" / "fastpitch.py", "a") as f:
        f.write("\n# a comment\n")
    assert plan(config, project=project) == NOTHING

    # the code that turns the aligner into durations (its NumPy forward pass, MAS) reruns every
    # duration shard; it is in the aligner's key (so a change is found while a shard reruns), whose new
    # folder copies the trained weights; the aligner's own code retrains it
    run_copy(project, "durations", config=config)

    def plan_durations():
        return parse_plan(run_copy(project, "durations", "-n", config=config).stdout)[0]

    for module in ("durations.py", "models/aligner_numpy.py"):
        with open(project / "pipeline" / module, "a") as f:
            f.write("\n# a comment is a code change too\n")
        assert plan_durations() == {"train_aligner": 1, "duration_shard": n, "durations": 1}, module
        before = stamps(cache)
        run_copy(project, "durations", config=config)
        assert rewritten(before, stamps(cache)) == jobs_files(*(("durations", i) for i in range(n))), module
        assert "copied its weights" in (tmp_path / "reports" / "t" / "logs" / "train_aligner.log").read_text()
    # aligner.max_token_seconds judges the durations made after training: its duration shards rerun,
    # and the aligner's new folder copies the trained weights (it retrained the aligner before)
    stricter = ("--config", "aligner={max_token_seconds: 0.9}")
    assert parse_plan(run_copy(project, "durations", "-n", *stricter, config=config).stdout)[0] == {
        "train_aligner": 1, "duration_shard": n, "durations": 1}
    run_copy(project, "durations", *stricter, config=config)
    assert "copied its weights" in (tmp_path / "reports" / "t" / "logs" / "train_aligner.log").read_text()
    run_copy(project, "durations", config=config)  # back: the duration shards as they were
    assert plan_durations() == {}
    # a forced train_aligner trains, in the new folder such a change makes too (not a copy)
    with open(project / "pipeline" / "durations.py", "a") as f:
        f.write("\n# once more\n")
    run_copy(project, "durations", "--forcerun", "train_aligner", config=config)
    log = (tmp_path / "reports" / "t" / "logs" / "train_aligner.log").read_text()
    assert "copied its weights" not in log and "training anew" in log
    # text.py code that leaves every token as it was: a new aligner key, but the caches' content is the
    # same, so the job copies the trained aligner instead of training it again (the same durations follow)
    aligners = tmp_path / "runs" / "t" / "aligner"
    trained = {p.parent.name: json.loads(p.read_text()) for p in aligners.glob("*/aligner.json")}
    with open(project / "pipeline" / "text.py", "a") as f:
        f.write("\n# a comment is a code change too\n")
    assert plan_durations() == {"token_shard": n, "cache_index": 1, "train_aligner": 1,
                                "duration_shard": n, "durations": 1}
    run_copy(project, "durations", config=config)
    assert plan_durations() == {}
    (new_key,) = {p.parent.name for p in aligners.glob("*/aligner.json")} - set(trained)
    copied = json.loads((aligners / new_key / "aligner.json").read_text())
    assert copied["copied_from"] in trained and copied["weights_digest"] == trained[copied["copied_from"]]["weights_digest"]
    assert "copied its weights" in (tmp_path / "reports" / "t" / "logs" / "train_aligner.log").read_text()
    # a forced rerun of that folder trains, though its sibling still holds the same aligner
    run_copy(project, "durations", "--forcerun", "train_aligner", config=config)
    assert "copied_from" not in json.loads((aligners / new_key / "aligner.json").read_text())
    assert "training anew" in (tmp_path / "reports" / "t" / "logs" / "train_aligner.log").read_text()
    # the aligner's own code trains it again, whatever the caches hold
    with open(project / "pipeline" / "models" / "aligner.py", "a") as f:
        f.write("\n# a comment\n")
    assert plan_durations() == {"train_aligner": 1, "duration_shard": n, "durations": 1}
    run_copy(project, "durations", config=config)
    latest = max(aligners.glob("*/aligner.json"), key=lambda p: p.stat().st_mtime)
    assert "copied_from" not in json.loads(latest.read_text()) and latest.parent.name not in (new_key, *trained)


# --- shard assignment -------------------------------------------------------------------------
_SHARD_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pipeline import manifest
ids = [f"LJ{i:03d}-{j:04d}" for i in range(1, 5) for j in range(1, 51)]
print(json.dumps({"shards": [manifest.shard_of(i, 8) for i in ids],
                  "val": [manifest.is_validation(i, 0.3) for i in ids],
                  "hash": [hash(i) for i in ids]}))
"""


def test_shard_assignment_does_not_depend_on_pythonhashseed():
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", _SHARD_SCRIPT, str(ROOT)], capture_output=True,
                              text=True, env=env, check=True)
        results.append(json.loads(proc.stdout))
    assert results[0]["hash"] != results[1]["hash"]  # the seeds really differ
    assert results[0]["shards"] == results[1]["shards"]
    assert results[0]["val"] == results[1]["val"]
    assert len(results[0]["shards"]) == 200 and len(set(results[0]["shards"])) == 8


def test_shard_assignment_does_not_depend_on_row_order_or_count(tmp_path):
    lines = TRANSCRIPTS.read_text(encoding="utf-8").splitlines()
    small, big = lines[:24], lines[:600]

    def assignment(rows, name):
        path = tmp_path / name
        write_lines(path, rows)
        return {c.id: shard for shard, clips in manifest.shard_clips(formats.read_metadata(path), 8).items()
                for c in clips}

    a = assignment(small, "small.csv")
    b = assignment(big, "big.csv")
    shuffled = big[:]
    random.Random(3).shuffle(shuffled)
    c = assignment(shuffled, "shuffled.csv")
    assert len(a) == 24 and len(b) == len(c) == 600
    assert all(b[i] == s for i, s in a.items())  # 576 more rows move none of the first 24
    assert b == c
    # the shard follows from the id alone
    ids = sorted(b)
    assert [manifest.shard_of(i, 8) for i in ids] == [b[i] for i in ids]
