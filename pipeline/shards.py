"""The one shard format: layout, dtypes, provenance, and reading and writing a shard.

A shard of kind K is two files, `cache/{name}/K/shard-NNN.bin` and `.json` (and, for kinds that
feed the index statistics, `.stats.npy`):
  .bin   every clip's array, concatenated, raw little-endian `KINDS[K].dtype`, `width` values per
         item; the loader reads it with tf.io.read_file + tf.io.decode_raw alone
  .json  kind, format, provenance, dtype, width, ids, lengths (items per clip), offsets (items),
         bytes (the .bin's size), checksum (the .bin's FarmHash Fingerprint64 as 16 hex digits: what
         tf.fingerprint computes, so the loader verifies it in its graph), rejected ([{id, path,
         reason}]), the kind's extras and, for the kinds with a `.stats.npy`, stats_checksum (that
         file's checksum, computed the same way; `pipeline.cache` verifies it where it reads the sums;
         a shard written before it was recorded has none, and its sums are read unverified, as then)
A new kind is one entry in KINDS (and a rule that writes it with `write`).

Items are tokens for the token-aligned kinds (tokens: Unicode code points of the front end's
symbols, the last one the end-of-sequence symbol; durations: mel frames per token, same ids and
lengths as the token shard) and mel frames for the frame-aligned kinds (mels, energy, pitch, gta: the
same ids and frame counts, `pipeline.audio.n_frames`); audio items are samples, frames * hop_length
a clip (the waveform cut to the mel's frame grid, for the vocoder). Provenance is a digest of FORMAT, the config
values and the code the content depends on: the loader refuses to mix shards with the index.

Writes are atomic: `.bin` and `.stats.npy` first, `.json` last, each through a temporary file, so an
interrupted job leaves no shard that loads (and Snakemake reruns it).

A damaged shard (a .bin whose size or checksum no longer matches its JSON: truncated, overwritten, a
flipped byte with its mtime kept) is refused by `check`/`read` and by the loader's graph, and
`intact` reports it to planning (rules/functions/cache.smk `repair`), so `snakemake caches` (or `durations`)
reruns exactly its job.
"""
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import farmhash
import numpy as np

from pipeline import files
from pipeline.errors import GRAPH_MARK, ON_DAMAGED, PipelineError

FORMAT = 3  # bump whenever a shard's layout or meaning changes: every older cache is then refused
HERE = Path(__file__).resolve().parent
REBUILD = "snakemake --cores all caches"


class CacheError(PipelineError):
    """A cache that must not be trained on; the message names the shard or file and what to run."""


@dataclass(frozen=True)
class Kind:
    dtype: str       # little-endian numpy dtype of the .bin
    unit: str        # what one item is: "token" or "frame"
    made_by: str     # the rule that writes it (and the target that rebuilds it)
    target: str      # what to run when it is missing or stale


KINDS = {
    "tokens": Kind("<i4", "token", "token_shard", REBUILD),
    "mels": Kind("<f2", "frame", "mel_shard", REBUILD),
    "energy": Kind("<f4", "frame", "mel_shard", REBUILD),
    "pitch": Kind("<f4", "frame", "pitch_shard", REBUILD),
    "durations": Kind("<i4", "token", "duration_shard", "snakemake --cores all durations"),
    "audio": Kind("<f4", "sample", "mel_shard", REBUILD),          # frames * hop samples a clip
    "gta": Kind("<f2", "frame", "gta_shard", "snakemake --cores all vocoder"),  # the acoustic model's mels
}
DAMAGED = GRAPH_MARK  # starts the loader's in-graph assertion message (pipeline/errors.py reads it)
CACHE_KINDS = ("tokens", "mels", "energy", "pitch")  # what `caches` builds and the index lists


def prefix(cache_dir, kind, shard):
    """cache_dir/kind/shard-NNN (no suffix)."""
    return Path(cache_dir) / kind / f"shard-{int(shard):03d}"


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int).tolist() if len(lengths) else []


def checksum(data):
    """FarmHash Fingerprint64 of `data` (bytes) as 16 hex digits: tf.fingerprint's value, little-endian."""
    return f"{farmhash.fingerprint64(data):016x}"


def checksum_int64(hexdigits):
    """The checksum as the int64 that tf.bitcast(tf.fingerprint(...), tf.int64) gives."""
    return int(np.array(int(hexdigits, 16), np.uint64).view(np.int64))


def _npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def write(out, kind, ids, arrays, *, provenance, width=1, stats=None, rejected=(), **extra):
    """Write shard `out` (a path without suffix) of `kind` from one array per clip, in `ids` order:
    (length,) arrays, or (length, width) ones; `stats` (clips, ...) float64 goes to `.stats.npy`.
    Returns the JSON it wrote."""
    k = KINDS[kind]
    out = Path(out)
    assert len(ids) == len(arrays), f"{len(ids)} ids but {len(arrays)} arrays"
    lengths = [int(len(a)) for a in arrays]
    shape = (0,) if width == 1 else (0, width)
    flat = np.concatenate(arrays) if arrays else np.zeros(shape)
    flat = np.ascontiguousarray(flat, dtype=np.dtype(k.dtype))
    assert flat.shape[1:] == shape[1:], f"{kind}: items of shape {flat.shape[1:]}, expected {shape[1:]}"
    data = flat.tobytes()
    sums = None if stats is None else _npy_bytes(np.asarray(stats, np.float64))
    if sums is not None:
        extra["stats_checksum"] = checksum(sums)
    meta = dict(kind=kind, format=FORMAT, provenance=provenance, dtype=k.dtype, width=width, ids=list(ids),
                lengths=lengths, offsets=offsets(lengths), bytes=len(data), checksum=checksum(data),
                rejected=list(rejected), **extra)
    files.atomic_write_bytes(out.with_suffix(".bin"), data)
    if sums is not None:
        files.atomic_write_bytes(out.with_suffix(".stats.npy"), sums)
    files.atomic_write_text(out.with_suffix(".json"), json.dumps(meta, indent=1))
    return meta


def read_meta(out, kind=None):
    """The shard's JSON; CacheError when it is missing, unreadable or of another format."""
    path = Path(out).with_suffix(".json")
    target = KINDS[kind].target if kind else REBUILD
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CacheError(f"{path}: shard missing; run `{target}`") from None
    except (OSError, ValueError) as e:
        raise CacheError(f"{path}: unreadable ({e}); run `{target}`") from None
    if meta.get("format") != FORMAT:
        raise CacheError(f"{path}: written in cache format {meta.get('format')}, this code reads format {FORMAT}; "
                         f"rebuild it with `{target}`")
    if kind and meta.get("kind") != kind:
        raise CacheError(f"{path}: a {meta.get('kind')} shard where a {kind} shard belongs; run `{target}`")
    missing = [key for key in META_KEYS if key not in meta]
    if missing or meta.get("kind") not in KINDS:  # else a KeyError traceback wherever it is read
        raise CacheError(f"{path}: {'no ' + ', '.join(missing) if missing else 'no known kind'} (a damaged or "
                         f"hand-edited JSON); run `{target}`")
    return meta


META_KEYS = ("kind", "provenance", "dtype", "width", "ids", "lengths", "offsets", "bytes", "checksum")


def read_index_json(path):
    """index.json as written by cache_index, read without TensorFlow (`snakemake caches`' check reads it
    too); CacheError when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CacheError(f"{path}: no cache index; build it with `{REBUILD}`") from None
    except (OSError, ValueError) as e:  # cut short or not JSON
        raise CacheError(f"{path}: unreadable ({e}); rebuild it with `{REBUILD}`") from None


def refuse_bad_audio(path, index):
    """PipelineError with the index's message when it records bad audio under dataset.bad_audio: fail
    (pipeline.cache.bad_audio_record): every job that reads the index refuses with it."""
    if index.get("bad_audio"):
        raise PipelineError(f"{path}: {index['bad_audio']['message']}")


def expected_bytes(meta):
    return sum(meta["lengths"]) * meta["width"] * np.dtype(meta["dtype"]).itemsize


def check_provenance(path, kind, got, want, than="the current config"):
    """The one provenance check: CacheError unless a shard's or the index's provenance `got` for
    `kind` is `want` (what this code and config would write)."""
    if got != want:
        sections = {"tokens": "text:", "mels": "audio:", "energy": "audio:", "pitch": "pitch:", "durations": "aligner:"}
        raise CacheError(f"{path}: the {kind} cache was built with other settings or code than {than} (its "
                         f"`{sections[kind]}` section, its code or the espeak-ng version; provenance {got} != {want}); "
                         f"run `{KINDS[kind].target}`")


def check(meta, out, want_provenance=None):
    """CacheError unless the JSON, its provenance and the .bin on disk agree."""
    path = Path(out).with_suffix(".bin")
    target = KINDS[meta["kind"]].target
    if want_provenance is not None:
        check_provenance(path, meta["kind"], meta["provenance"], want_provenance, than="the index")
    lengths, width = meta["lengths"], meta["width"]
    if (len(lengths) != len(meta["ids"]) or not all(isinstance(n, int) and n >= 0 for n in lengths)
            or meta["dtype"] != KINDS[meta["kind"]].dtype or not (isinstance(width, int) and width >= 1)):
        # each of these passed the size and checksum of an intact .bin and sliced its clips wrong, silently
        raise CacheError(f"{Path(out).with_suffix('.json')}: its ids and lengths disagree in number, a length is "
                         f"negative, or its dtype or width is not a {meta['kind']} shard's (a damaged or hand-edited "
                         f"JSON); run `{target}`")
    expected = expected_bytes(meta)
    if meta["bytes"] != expected:
        raise CacheError(f"{path}: its JSON records {meta['bytes']} bytes but its lengths add up to {expected}; "
                         f"run `{target}`")
    if meta["offsets"] != offsets(meta["lengths"]) or len(set(meta["ids"])) != len(meta["ids"]):
        raise CacheError(f"{Path(out).with_suffix('.json')}: its offsets are not its lengths' running sums, or an id "
                         f"repeats (a damaged or hand-edited JSON); run `{target}`")
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise CacheError(f"{path}: missing; run `{target}` (it rebuilds damaged shards)") from None
    if size != expected:
        raise CacheError(f"{path}: {size} bytes on disk, {expected} expected (truncated or corrupted); "
                         f"run `{target}` (it rebuilds damaged shards)")


def damaged(path, target):
    """The message for a .bin whose checksum does not match its JSON."""
    return (f"{DAMAGED} {path}: checksum mismatch (the file changed after its job wrote it); "
            f"run `{target}` (it rebuilds exactly the damaged shards)")


def read(out, kind=None):
    """(meta, [one array per clip]) of a checked shard (size and checksum), with NumPy: for tools and tests."""
    meta = read_meta(out, kind)
    return meta, arrays(meta, out)


def arrays(meta, out):
    """[one array per clip] of shard `out` whose JSON `meta` was read already, after checking its
    .bin's size and checksum (CacheError otherwise)."""
    check(meta, out)
    path = Path(out).with_suffix(".bin")
    data = path.read_bytes()
    if checksum(data) != meta["checksum"]:
        unverify(path)
        raise CacheError(damaged(path, KINDS[meta["kind"]].target))
    flat = np.frombuffer(data, dtype=np.dtype(meta["dtype"]))
    if meta["width"] > 1:
        flat = flat.reshape(-1, meta["width"])
    return [flat[o:o + n] for o, n in zip(meta["offsets"], meta["lengths"])]


def remove_leftovers(cache, run):
    """The temporary files that killed shard jobs left in cache/{name}/{kind}/ and runs/{name}/gta/
    (files.remove_stale_temporaries), removed -> their paths. Planning calls it when no other Snakemake
    holds those folders."""
    folders = [Path(cache) / kind for kind in KINDS if kind != "gta"] + [Path(run) / "gta"]
    return [path for folder in folders for path in files.remove_stale_temporaries(folder)]


STATS_KINDS = ("mels", "energy", "pitch")  # the kinds whose shards carry a .stats.npy


def _files(out):
    # plain strings, not pathlib: planning calls this for every shard of every kind
    base = str(out)
    suffixes = (".json", ".bin") + ((".stats.npy",) if os.path.basename(os.path.dirname(base)) in STATS_KINDS else ())
    return [base + s for s in suffixes]


def _stamp(bin_path):
    """cache/{name}/.verified/{kind}-shard-NNN: what planning last verified of that .bin."""
    bin_path = Path(bin_path)
    return bin_path.parent.parent / ".verified" / f"{bin_path.parent.name}-{bin_path.stem}"


def unverify(bin_path):
    """Forget that planning verified this .bin (its checksum failed where it was read), so the next
    planning hashes it again and reruns its job."""
    _stamp(bin_path).unlink(missing_ok=True)


ON_DAMAGED.append(unverify)


def intact(*outs):
    """"ok" when every shard's JSON reads and its .bin has the size and checksum the JSON records,
    else "damaged".

    `outs` are the shards one job writes (mel_shard: mels and energy). Planning asks this of every
    shard (rules/functions/cache.smk `repair`), so a damaged one is rebuilt by its own job alone. A job none of
    whose files exist is "ok" (it runs anyway, its outputs are missing); a job with some of its files
    missing (a deleted .bin, .stats.npy or energy shard) is "damaged": `cache_index` lists only the
    JSON files of tokens, mels and pitch, so only this check notices the others are gone.
    A .bin is hashed when its size, mtime, ctime or inode changed since planning last verified it
    (a stamp in cache/{name}/.verified/): any write to it, even one that puts the mtime back, moves
    its ctime; where no stamp can be written (a cache this user may only read), every planning hashes
    it again. Damage that moves nothing (a disk's own bit rot) is caught where the bytes are read
    (`read`, the loader's graph), which forgets the stamp, so the next planning hashes the file.
    """
    present = [os.path.exists(f) for out in outs for f in _files(out)]
    if not any(present):
        return "ok"
    if not all(present):
        return "damaged"
    for out in outs:
        try:
            with open(f"{out}.json", encoding="utf-8") as f:
                meta = json.load(f)
            path = f"{out}.bin"
            st = os.stat(path)
            if st.st_size != meta["bytes"]:
                return "damaged"
            key = f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {meta['checksum']}\n"
            stamp = _stamp(path)
            if stamp.is_file() and stamp.read_text(encoding="utf-8") == key:
                continue
            if checksum(Path(path).read_bytes()) != meta["checksum"]:
                return "damaged"
            try:
                files.atomic_write_text(stamp, key)
            except OSError:   # a cache this user may read, not write: verified now, hashed again next time
                pass
        except (OSError, ValueError, KeyError, TypeError):
            return "damaged"
    return "ok"


# --- provenance ------------------------------------------------------------------------------
def digest(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()[:16]


def stale_durations(out, tokens, mels):
    """Why duration shard `out` (a path without suffix) no longer pairs with the token and mel shards
    `tokens` and `mels` (their .json) it was aligned to, or None: the digests of their JSON that its
    provenance records, against the files now (what the loader refuses it for). None when any of the
    three is missing or unreadable (their own jobs make them)."""
    try:
        with open(f"{out}.json", encoding="utf-8") as f:
            made_from = json.load(f).get("provenance", {})
        now = {"tokens": file_digest(tokens), "mels": file_digest(mels)}
    except (OSError, ValueError, AttributeError):
        return None
    changed = [str(path) for kind, path in (("tokens", tokens), ("mels", mels))
               if made_from.get(kind) not in (None, now[kind])]
    return f"aligned to another {' and '.join(changed)} than the one on disk (stale)" if changed else None


def set_aside(out, folder, reason):
    """Move shard `out`'s JSON into `folder` (kept, not deleted), so its job's output is missing and
    Snakemake plans it whatever else reruns; `reason` goes beside it. Returns the new path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    moved = folder / f"{Path(out).parent.name}-{Path(out).name}.json"
    os.replace(f"{out}.json", moved)
    moved.with_suffix(".why").write_text(f"{reason}\n", encoding="utf-8")
    return moved


def file_digest(*paths):
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


def code_digest(*modules):
    """file_digest of pipeline/ modules, e.g. code_digest("audio.py", "models/aligner.py"): the code
    part of what a shard, the aligner or a duration shard is made by (an edit reruns its jobs)."""
    return file_digest(*(HERE / m for m in modules))


def settings(kind, cfg):
    """The config values a cache kind's content depends on (and all its job reads besides paths)."""
    if kind == "tokens":
        return {"text": dict(cfg["text"])}
    if kind in ("mels", "energy", "audio"):
        return {"audio": dict(cfg["audio"])}
    if kind == "pitch":
        return {"audio": {k: cfg["audio"][k] for k in ("sample_rate", "hop_length")}, "pitch": dict(cfg["pitch"])}
    raise KeyError(kind)


CODE = {"tokens": ("text.py", "symbols.py"), "mels": ("audio.py",), "energy": ("audio.py",), "audio": ("audio.py",),
        "pitch": ("audio.py", "pitch.py")}


def provenance(kind, cfg, espeak=None):
    """What a shard's content depends on besides its clips: FORMAT, its settings, its code, and for
    phoneme tokens the espeak-ng version (`espeak`, else asked of the library). Imports no librosa,
    so planning stays fast."""
    parts = [FORMAT, json.dumps(settings(kind, cfg), sort_keys=True), code_digest(*CODE[kind])]
    if kind == "tokens" and cfg["text"]["frontend"] == "phonemes":
        if espeak is None:
            from pipeline import text
            espeak = text.espeak_version()
        parts.append(f"espeak-ng {espeak}")
    return digest(*parts)
