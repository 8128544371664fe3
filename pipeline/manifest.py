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
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError

AUDIO_EXTENSIONS = ("wav", "flac", "ogg")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # ids become file names: no separators, no ".."


class DatasetError(PipelineError):
    """A problem in the dataset's files; the message names the file and line."""


@dataclass(frozen=True)
class Clip:
    id: str
    text: str        # the column the text front end reads (normalized_text when present)
    line: str        # the raw metadata line (single folder) or the row's fields, for digests
    lineno: int
    speaker: str = ""     # "" in the single-folder form: its one speaker
    language: str = ""    # espeak-ng voice; "": text.language
    audio: str = ""       # the audio file (sources); "": found by audio_path (single folder)
    where: str = ""       # file and line for messages (sources)
    source: str = ""      # the source's name (sources)


def _stable_int(*parts):
    return int.from_bytes(hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()[:8], "big")


def shard_of(clip_id, shards):
    return _stable_int("shard", clip_id) % shards


def is_validation(clip_id, val_fraction):
    return _stable_int("split", clip_id) / 2**64 < val_fraction


def read_metadata(path):
    """The clips of a metadata.csv, in file order; DatasetError on the first malformed line."""
    path = Path(path)
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    clips, seen = [], {}
    for lineno, line_bytes in enumerate(raw.split(b"\n"), start=1):
        line_bytes = line_bytes.rstrip(b"\r")
        if not line_bytes.strip():
            continue
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(f"{path}:{lineno}: not UTF-8 (byte {e.start + 1} of the line)") from None
        cols = line.split("|")
        if len(cols) not in (2, 3):
            raise DatasetError(f"{path}:{lineno}: expected 2 or 3 columns separated by '|' "
                               f"(id|text|normalized_text), found {len(cols)}")
        clip_id = cols[0].strip()
        if not _ID.match(clip_id):
            raise DatasetError(f"{path}:{lineno}: id {clip_id!r} is not a plain file name "
                               "(letters, digits, '_', '-', '.'; no path separators)")
        text = (cols[2] if len(cols) == 3 and cols[2].strip() else cols[1]).strip()
        if not text:
            raise DatasetError(f"{path}:{lineno}: empty text for id {clip_id!r}")
        if clip_id in seen:
            raise DatasetError(f"{path}:{lineno}: duplicate id {clip_id!r} (first on line {seen[clip_id]})")
        seen[clip_id] = lineno
        clips.append(Clip(clip_id, text, line, lineno))
    if not clips:
        raise DatasetError(f"{path}: no clips (the file is empty)")
    return clips


def audio_path(root, audio_dir, clip_id):
    """The clip's audio file, or None when no {id}.wav/.flac/.ogg exists."""
    folder = Path(root) / audio_dir
    for ext in AUDIO_EXTENSIONS:
        p = folder / f"{clip_id}.{ext}"
        if p.is_file():
            return p
    return None


def audio_files(root, audio_dir):
    """{clip id: "name:size:mtime_ns"} for every audio file of the folder, from one directory scan.

    What the Snakefile digests per mel shard: an added, removed, renamed or replaced file (even one
    moved in with an older mtime) changes its entry. The preference order is audio_path's.
    """
    rank = {ext: k for k, ext in enumerate(AUDIO_EXTENSIONS)}
    best = {}  # stem: (rank, entry); planning runs this on every clip, so no per-file lists or lambdas
    with os.scandir(Path(root) / audio_dir) as entries:
        for e in entries:
            stem, _, ext = e.name.rpartition(".")
            r = rank.get(ext)
            if r is not None and e.is_file() and (stem not in best or r < best[stem][0]):
                best[stem] = (r, e)
    out = {}
    for stem, (_, e) in best.items():
        st = e.stat()
        out[stem] = f"{e.name}:{st.st_size}:{st.st_mtime_ns}"
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
        from pipeline import formats
        return shard_clips(formats.read_sources(dataset_cfg["sources"], strict=strict), shards)
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


def audio_stamp(path):
    """"name:size:mtime_ns" of a file (None when missing): what the Snakefile digests per mel shard."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{Path(path).name}:{st.st_size}:{st.st_mtime_ns}"
