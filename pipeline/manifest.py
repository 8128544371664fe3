"""The manifest: which clips a dataset holds, their text, speaker, language and audio file, their
shard and split.

Two forms of the `dataset:` section:
  - single folder (`root`, `metadata`, `audio_dir`): reads `{root}/{metadata}` (`id|text|normalized_text`,
    the third column optional; UTF-8 with or without BOM; LF or CRLF) and finds each clip's audio at
    `{root}/{audio_dir}/{id}.{wav,flac,ogg}`; one speaker (the folder's name), language `text.language`.
  - `sources:` a list of corpora, each `{root, format, name, speaker, language}`, read by the format's
    reader in pipeline/formats.py (ljspeech, vctk, libritts, csv). A clip's id is `{source name}-{its
    corpus id}`, so ids never depend on which other sources are listed.
A malformed line is a DatasetError naming file and line (or the config key).

Shard = sha256(id) mod cache.shards, and split = a second sha256 of the id: never Python's hash()
(salted per process), never row position, so adding rows moves nothing else.
"""
import functools
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.files import atomic_write_text
from pipeline.formats import AUDIO_EXTENSIONS, Clip, read_metadata, read_sources


def _stable_int(*parts):
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()[:8], "big")


def shard_of(clip_id, shards):
    return _stable_int("shard", clip_id) % shards


def is_validation(clip_id, val_fraction):
    return _stable_int("split", clip_id) / 2**64 < val_fraction


def audio_path(root, audio_dir, clip_id):
    """The clip's audio file, or None when no {id}.wav/.flac/.ogg exists, its extension in any case
    (.WAV, .Flac): the lower-case names first, one stat each, then the folder's audio_files (one scan
    a process), so both find the same file."""
    folder = Path(root) / audio_dir
    for ext in AUDIO_EXTENSIONS:
        p = folder / f"{clip_id}.{ext}"
        if p.is_file():
            return p
    try:
        listed = _listing(str(folder), os.stat(folder).st_mtime_ns).get(clip_id)
    except OSError:
        return None
    return folder / stamp_name(listed) if listed else None


@functools.lru_cache(maxsize=4)
def _listing(folder, mtime_ns):
    """audio_files of `folder`, once a process for each of its mtimes (a renamed file moves it)."""
    return audio_files(folder, "")


def audio_files(root, audio_dir, twins=None):
    """{clip id: "name:size:mtime_ns"} for every audio file of the folder, from one directory scan.

    What the Snakefile digests per mel shard: an added, removed, renamed or replaced file (even one
    moved in with an older mtime) changes its entry. The preference order is audio_path's. `twins`,
    a dict, gets {clip id: [its files' names, preferred first]} for each id with several formats
    (formats.one_audio_file refuses such a clip).
    """
    rank = {ext: k for k, ext in enumerate(AUDIO_EXTENSIONS)}
    best = {}  # stem: (rank, entry); planning runs this on every clip, so no per-file lists or lambdas
    with os.scandir(Path(root) / audio_dir) as entries:
        for e in entries:
            stem, _, ext = e.name.rpartition(".")
            r = rank.get(ext.lower())  # .WAV too, as audio_path finds it
            if r is not None and e.is_file():
                if stem in best and twins is not None:
                    twins.setdefault(stem, [best[stem][1].name]).append(e.name)
                if stem not in best or r < best[stem][0]:
                    best[stem] = (r, e)
    out = {}
    for stem, (_, e) in best.items():
        st = e.stat()
        out[stem] = f"{e.name}:{st.st_size}:{st.st_mtime_ns}"
    for names in (twins or {}).values():
        names.sort(key=lambda name: rank[name.rpartition(".")[2].lower()])
    return out


def shard_clips(clips, shards):
    """{shard: [clips sorted by id]} for every shard, empty ones included."""
    out = {k: [] for k in range(shards)}
    for c in clips:
        out[shard_of(c.id, shards)].append(c)
    for k in out:
        out[k].sort(key=lambda c: c.id)
    return out


def load_manifest(dataset_cfg, shards, *, strict=True):
    """Read the dataset once: {shard: sorted clips}. strict=False: sources' rows need no speaker
    or language (what mel and pitch jobs read, whose sources carry neither)."""
    if "sources" in dataset_cfg:
        return shard_clips(read_sources(dataset_cfg["sources"], strict=strict), shards)
    meta = Path(dataset_cfg["root"]) / dataset_cfg["metadata"]
    return shard_clips(read_metadata(meta), shards)


def clip_audio(dataset_cfg, clip):
    """The clip's audio file, or None when it has none."""
    if clip.audio:
        return Path(clip.audio) if Path(clip.audio).is_file() else None
    return audio_path(dataset_cfg["root"], dataset_cfg["audio_dir"], clip.id)


def clip_where(dataset_cfg, clip):
    """Where a clip's text comes from, for messages: file:line."""
    return clip.where or f"{Path(dataset_cfg['root']) / dataset_cfg['metadata']}:{clip.lineno}"


def stamp_name(stamp):
    """The file name in a "name:size:mtime_ns" stamp (names may hold colons)."""
    return stamp.rsplit(":", 2)[0]


def audio_stamp(path):
    """"name:size:mtime_ns" of a file (None when missing): what the Snakefile digests per mel shard."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{Path(path).name}:{st.st_size}:{st.st_mtime_ns}"


# --- an audio file known by its bytes, not its timestamp ---------------------------------------
# Planning keys each mel and pitch shard by its clips' "name:size:mtime_ns" (reading every clip's bytes
# at every plan would cost seconds on a large corpus). But `touch`, a copy without `cp -p` or `rsync -t`
# and a fresh checkout change a timestamp and not a byte, and every shard they touched reran, and all
# that follows it. So planning keeps a memo in the cache folder, {clip id: [the stamp it last saw, the
# stamp its shard was keyed with, the file's sha256 then]}: a clip whose stamp moved is hashed, and
# keeps its keyed stamp when its bytes are the same. A new or replaced file is hashed once, when it is
# first seen (every file at a corpus's first plan: ~1 s a GB); the jobs map stamps the same way
# (keyed_stamp), through the memo planning names in STAMPS_ENV.

STAMPS_FILE = ".audio-stamps.json"
STAMPS_ENV = "PIPELINE_AUDIO_STAMPS"


def _file_sha256(path):
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None   # unreadable: its stamp stands, and its job says what is wrong with it


def _read_memo(path):
    try:
        memo = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(memo, dict):
        return {}
    return {k: v for k, v in memo.items() if isinstance(v, list) and len(v) == 3 and isinstance(v[0], str)
            and isinstance(v[1], str) and isinstance(v[2], (str, type(None)))}


def steady_stamps(stamps, paths, memo_path):
    """({clip id: stamp}, the memo to record) for `stamps` ({clip id: "name:size:mtime_ns", None when it has
    no file}), where a clip whose file changed only its timestamp keeps the stamp its shard was keyed with.
    `paths`: {clip id: its file}. Reads the memo at `memo_path`; the run that starts jobs records the new
    one (write_stamps), so a dry run or a lint writes nothing."""
    memo = _read_memo(memo_path)
    out, kept = {}, {}
    for cid, stamp in stamps.items():
        seen = memo.get(cid)
        if stamp is None:
            out[cid] = None
        elif seen is not None and seen[0] == stamp:
            out[cid], kept[cid] = seen[1], seen
        else:
            digest = _file_sha256(paths[cid])
            same = (seen is not None and digest is not None and seen[2] == digest
                    and stamp_name(seen[1]) == stamp_name(stamp))   # the same name, the same bytes
            out[cid] = seen[1] if same else stamp
            kept[cid] = [stamp, out[cid], digest]
    return out, (None if kept == memo else kept)


def write_stamps(memo_path, memo, log=print):
    """Record the memo steady_stamps made (None: unchanged, nothing to write). One that cannot be
    written is said once: its changed files are read again at the next plan."""
    if memo is None:
        return
    try:
        atomic_write_text(memo_path, json.dumps(memo, separators=(",", ":")))
    except (OSError, PipelineError) as e:
        log(f"audio file digests not recorded in {memo_path} ({e.strerror if isinstance(e, OSError) else e}): "
            "the next plan reads the changed files again")


def check_planned(clip_id, path):
    """PipelineError when the clip's file holds other bytes than planning read (the memo it named in
    STAMPS_ENV): changed while the run was under way. Its shard would hold those bytes under the key of
    the ones planning read, and a later return of the old bytes would map back to that key with nothing
    rerun; stopped here, the job leaves no shard and the next plan builds it from what the file holds.
    A file that only changed its timestamp passes (its bytes are read to tell)."""
    stamp, seen = _planned(clip_id, path)
    if seen is None or stamp == seen[0] or (seen[2] and _file_sha256(path) == seen[2]):
        return
    raise PipelineError(f"{path}: changed while this run was under way (its bytes are not those planning read); "
                        "run snakemake again to build its shard from what it holds now")


def stamped_files(dataset_cfg, manifest, stamps):
    """{clip id: its audio file} for the clips of `manifest` ({shard: clips}) that `stamps` (audio_files'
    or audio_stamp's, by clip id) found a file for: what steady_stamps hashes."""
    folder = None if "sources" in dataset_cfg else Path(dataset_cfg["root"]) / dataset_cfg["audio_dir"]
    return {c.id: c.audio if folder is None else folder / stamp_name(stamps[c.id])
            for cs in manifest.values() for c in cs if stamps.get(c.id)}


@functools.lru_cache(maxsize=1)
def _job_memo(path):
    return _read_memo(path)


def _planned(clip_id, path):
    """(audio_stamp(path), the clip's entry in the memo planning named in STAMPS_ENV, or None: no memo,
    no entry, or no file)."""
    stamp = audio_stamp(path)
    memo = os.environ.get(STAMPS_ENV)
    return stamp, (_job_memo(memo).get(clip_id) if memo and stamp is not None else None)


def keyed_stamp(clip_id, path):
    """audio_stamp(path), or the stamp planning keyed the clip's shard with when the file has changed only
    its timestamp since (the memo planning named in STAMPS_ENV; the file's own stamp without one)."""
    stamp, seen = _planned(clip_id, path)
    return seen[1] if seen is not None and seen[0] == stamp else stamp


# --- each shard job's own clips, written once by the run that starts the jobs -----------------
# A shard job needs ~100 rows, but reading them from the dataset means reading all of it: every
# row of metadata.csv parsed and hashed for its shard (every text file, for vctk and libritts).
# That is O(clips) per job and O(clips x shards) per build: ~0.1 CPU s a job on 13,100 clips, hours
# on 1,000,000. So the Snakemake run that starts the jobs (rules/functions/cache.smk, onstart) writes each
# shard's clips from the manifest it read anyway, and the jobs read just theirs.

CLIP_LISTS_ENV = "PIPELINE_CLIP_LISTS"  # the folder of the lists, set for the jobs Snakemake starts
_CLIP_LIST_FORMAT = 1


def dataset_names(dataset_cfg):
    """The files a `dataset:` section reads, as a set of tuples: a clip list written for one
    dataset is never read for another (a job's section may list fewer sources than planning's)."""
    if "sources" in dataset_cfg:
        return {("source", str(s["root"]), str(s.get("format")), str(s.get("name"))) for s in dataset_cfg["sources"]}
    return {("folder", str(dataset_cfg["root"]), str(dataset_cfg["metadata"]))}


def write_clip_lists(manifest, shards, folder, dataset_cfg):
    """Write {folder}/{generation}/shard-NNN.json for every shard of `manifest` ({shard: clips});
    the generation is a digest of all of them, so an unchanged dataset writes nothing and an edited
    one gets a new folder, moved into place whole (a job never sees half of one). Older generations
    are removed. Returns the generation's folder."""
    names = sorted(list(n) for n in dataset_names(dataset_cfg))
    # each clip as its fields in Clip's order (vars(): __init__ sets them in that order), for Clip(*row)
    rows = [[tuple(vars(c).values()) for c in manifest[k]] for k in range(shards)]
    h = hashlib.sha256(json.dumps([_CLIP_LIST_FORMAT, shards, names]).encode("utf-8"))
    for r in rows:  # repr: ~3x cheaper than the JSON, which is made only for a new generation
        h.update(repr(r).encode("utf-8"))
    folder = Path(folder)
    generation = folder / h.hexdigest()[:16]
    if not generation.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{generation.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for k, r in enumerate(rows):
            payload = json.dumps(r, ensure_ascii=False).encode("utf-8")
            head = dict(format=_CLIP_LIST_FORMAT, shards=shards, shard=k, dataset=names,
                        sha256=hashlib.sha256(payload).hexdigest())
            (tmp / f"shard-{k:03d}.json").write_bytes(json.dumps(head).encode("utf-8") + b"\n" + payload)
        try:
            os.rename(tmp, generation)
        except OSError:  # another run wrote the same generation meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
            if not generation.is_dir():
                raise
    for old in folder.iterdir():  # and a killed run's half-written folder, once it is an hour old
        if old.name != generation.name and (not old.name.startswith(".tmp-")
                                            or time.time() - old.stat().st_mtime > 3600):
            shutil.rmtree(old, ignore_errors=True)
    return generation


def read_clip_list(path, dataset_cfg, shards, shard):
    """The clips of one shard from a list write_clip_lists made, or ValueError saying why it cannot
    stand for this job's dataset (another format, dataset or shard count, damaged bytes)."""
    raw = Path(path).read_bytes()
    head_bytes, _, payload = raw.partition(b"\n")
    try:
        head = json.loads(head_bytes)
    except ValueError:
        raise ValueError("unreadable header") from None
    if not isinstance(head, dict):  # JSON, but [1] or 5 is no header this function wrote
        raise ValueError("unreadable header (JSON, but not an object)")
    if head.get("format") != _CLIP_LIST_FORMAT:
        raise ValueError(f"in format {head.get('format')}, not {_CLIP_LIST_FORMAT}")
    if head.get("shards") != shards or head.get("shard") != shard:
        raise ValueError(f"written for shard {head.get('shard')} of {head.get('shards')}, not {shard} of {shards}")
    if not dataset_names(dataset_cfg) <= {tuple(n) for n in head.get("dataset", [])}:
        raise ValueError("written for another dataset")
    if hashlib.sha256(payload).hexdigest() != head.get("sha256"):
        raise ValueError("its clips do not match their checksum (damaged)")
    return [Clip(*row) for row in json.loads(payload)]


def shard_manifest(dataset_cfg, shards, shard, *, strict=True, log=print):
    """One shard's clips, sorted by id: from the list the run wrote (CLIP_LISTS_ENV) when there is
    one for this dataset, else read from the dataset as load_manifest does. The run that wrote the
    list read the whole dataset strictly, so the list holds what a strict read gives."""
    folder = os.environ.get(CLIP_LISTS_ENV)
    if folder:
        path = Path(folder) / f"shard-{shard:03d}.json"
        try:
            clips = read_clip_list(path, dataset_cfg, shards, shard)
            log(f"shard {shard}: {len(clips)} clips from {path}")
            return clips
        except FileNotFoundError:
            pass  # a later run replaced that generation: the dataset moved on, read it
        except (OSError, ValueError, TypeError) as e:
            log(f"{path}: {e}; reading the dataset instead")
    return load_manifest(dataset_cfg, shards, strict=strict)[shard]
