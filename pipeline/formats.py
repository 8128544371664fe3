"""Corpus formats: one small reader per layout, looked up by name (`dataset.sources[].format`).

Each reader takes a source (`{root, format, name, speaker, language}`, see configs/config.yaml)
and returns its rows as Clip (id, text, speaker, language, audio file, file:line):
  ljspeech  {root}/metadata.csv (id|text|normalized_text) + {root}/wavs/{id}.{wav,flac,ogg};
            one speaker: the source's `speaker`, else its name
  vctk      {root}/txt/{speaker}/{id}.txt + {root}/wav48_silence_trimmed/{speaker}/{id}_mic1.flac
            (VCTK 0.92) or {root}/wav48/{speaker}/{id}.wav (0.80); speaker = folder name
  libritts  {root}/{speaker}/{chapter}/{id}.normalized.txt + {id}.wav; speaker = folder name
  csv       {root}/metadata.csv with a header row naming the columns audio_file|text|speaker|language
            (language optional; speaker optional when the source sets `speaker`); audio_file is
            relative to root, the id is its file name without extension
A row's language is its own (csv), else the source's `language`, else `text.language`.
`read_sources` joins them: clip ids are `{source name}-{id}` (unique across sources; a collision
is a DatasetError naming both files), source names unique, and no audio file (symbolic and hard
links followed) belongs to two clips.

    python -m pipeline.manifest is not a CLI; try: python -c "from pipeline import formats; print(formats.FORMATS)"
"""
import os
import re
import shutil
import subprocess
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.registry import Registry

AUDIO_EXTENSIONS = ("wav", "flac", "ogg")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # ids become file names: no separators, no "..";
# always fullmatch: `$` would let a trailing newline through


class DatasetError(PipelineError):
    """A problem in the dataset's files; the message names the file and line."""


# Unicode's Cc (control) characters are U+0000-U+001F and U+007F-U+009F, and its stability policy adds
# none; as one character class, a 13,100-line corpus is checked in milliseconds (per character, 0.4 s)
_CONTROL = re.compile("[" + "".join(re.escape(chr(c)) for c in range(0xA0)
                                    if unicodedata.category(chr(c)) == "Cc" and not chr(c).isspace()) + "]")


def check_text(text, where):
    """text, or DatasetError naming its first control character that is not whitespace (Unicode category
    Cc: NUL, ESC, DEL, ...). espeak-ng reads a transcript as a C string: a NUL ends it there, silently,
    and an escape sequence's digits are read aloud."""
    found = _CONTROL.search(text)
    if found is not None:
        raise DatasetError(f"{where}: control character U+{ord(found.group()):04X} at character "
                           f"{found.start() + 1} (a transcript is plain text: remove it)")
    return text


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


def plain_id(clip_id, where):
    """clip_id when it can name a file in one folder (a metadata id becomes wavs/{id}.wav), else DatasetError."""
    if not _ID.fullmatch(clip_id):
        raise DatasetError(f"{where}: id {clip_id!r} is not a plain file name "
                           "(letters, digits, '_', '-', '.'; no path separators)")
    return clip_id


def _not_utf16(raw, path):
    """DatasetError when the bytes of `path` start with a UTF-16 byte order mark (FF FE or FE FF)."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise DatasetError(f"{path}: UTF-16 (it starts with a UTF-16 byte order mark); save it as UTF-8")


def utf8_lines(raw, path):
    """The lines of a UTF-8 file (a BOM dropped), or DatasetError naming the first line that is not
    UTF-8, and saying so when the file is UTF-16 (a BOM of FF FE or FE FF)."""
    _not_utf16(raw, path)
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = raw.split(b"\n")
    for lineno, line in enumerate(lines, start=1):
        try:
            lines[lineno - 1] = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DatasetError(f"{path}:{lineno}: not UTF-8 (byte {e.start + 1} of the line)") from None
    return lines


def read_bytes(path, missing=""):
    """A data file's bytes, or DatasetError naming it: `missing` (what the file should be) when it is
    not there; the system's reason when it cannot be read (no permission, a folder of that name)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: not found{missing}") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from None


def table_lines(raw, path):
    """(line number, line) of a transcript table's lines that are not blank: UTF-8 (utf8_lines), a
    CRLF ending dropped. A carriage return left inside a line is DatasetError: a file with old Mac
    line endings (CR alone) split on LF would read two rows as one, the first clip with the second's
    text."""
    out = []
    for lineno, line in enumerate(utf8_lines(raw, path), start=1):
        line = line.rstrip("\r")
        if "\r" in line:
            raise DatasetError(f"{path}:{lineno}: a carriage return (CR) inside the line: the file ends its lines "
                               "with CR alone (old Mac line endings) or holds a stray CR; save it with LF "
                               "(or CRLF) line endings")
        if line.strip():
            out.append((lineno, line))
    return out


# a first row of column names (id|text|normalized_text, file_name|transcription): read as a clip, it was
# left out as "missing file", said only in rejected.tsv
_HEADER = re.compile(r"(?i)(id|file|file_?name|audio|audio_?file|path|wav|utt(erance)?(_?id)?|name|text|"
                     r"normali[sz]ed(_?text)?|transcripts?|transcriptions?|sentence)")


def not_a_header(cols, line, where):
    """DatasetError when the first row of an LJSpeech table (`cols`: its fields) is column names
    (id|text|normalized_text): such a table has no header row."""
    if len(cols) > 1 and _HEADER.fullmatch(cols[0].strip()) and _HEADER.fullmatch(cols[1].strip()):
        raise DatasetError(f"{where}: {line!r} is a header row; an LJSpeech metadata.csv has none "
                           "(every line is id|text|normalized_text): remove it")


def read_metadata(path):
    """The clips of a metadata.csv, in file order; DatasetError on the first malformed line."""
    path = Path(path)
    clips, seen = [], {}
    for lineno, line in table_lines(read_bytes(path), path):
        cols = line.split("|")
        if len(cols) not in (2, 3):
            raise DatasetError(f"{path}:{lineno}: expected 2 or 3 columns separated by '|' "
                               f"(id|text|normalized_text), found {len(cols)}")
        if not clips:
            not_a_header(cols, line, f"{path}:{lineno}")
        clip_id = plain_id(cols[0].strip(), f"{path}:{lineno}")
        text = (cols[2] if len(cols) == 3 and cols[2].strip() else cols[1]).strip()
        if not text:
            raise DatasetError(f"{path}:{lineno}: empty text for id {clip_id!r}")
        check_text(line, f"{path}:{lineno}")
        if clip_id in seen:
            raise DatasetError(f"{path}:{lineno}: duplicate id {clip_id!r} (first on line {seen[clip_id]})")
        seen[clip_id] = lineno
        clips.append(Clip(clip_id, text, line, lineno))
    if not clips:
        raise DatasetError(f"{path}: no clips (the file is empty)")
    return clips


CSV_COLUMNS = ("audio_file", "text", "speaker", "language")
_LANGUAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # an espeak-ng language code, no variant


def source_name(src, i=None):
    """A source's name: its `name`, else its root folder's name."""
    name = src.get("name") or Path(src["root"]).resolve().name
    if not _ID.fullmatch(name):
        key = f"dataset.sources[{i}].name" if i is not None else "dataset.sources[].name"
        raise DatasetError(f"{key}: {name!r} is not a plain name (letters, digits, '_', '-', '.'); set `name` "
                           "on the source")
    return name


def check_speaker(speaker, where):
    if not speaker or "/" in speaker or "\\" in speaker or speaker in (".", "..") or speaker != speaker.strip() \
            or any(unicodedata.category(ch) == "Cc" for ch in speaker):
        raise DatasetError(f"{where}: speaker {speaker!r} must be a plain name (no path separator or control "
                           "character, not empty)")
    return speaker


def check_language(language, where):
    if language and not _LANGUAGE.fullmatch(language):
        raise DatasetError(f"{where}: language {language!r} is not an espeak-ng language code (e.g. en-us, de)")
    return language


def _scan_audio(folder):
    """{stem: [its audio files' paths, wav first, then flac, then ogg]} of one folder. Extensions in any
    case (`.WAV`: what field recorders and TIMIT write)."""
    found = {}
    for e in _entries(folder, "the audio folder", missing_ok=True):
        stem, _, ext = e.name.rpartition(".")
        ext = ext.lower()
        if ext in AUDIO_EXTENSIONS:
            found.setdefault(stem, []).append((AUDIO_EXTENSIONS.index(ext), e.path))
    return {stem: [p for _, p in sorted(files)] for stem, files in found.items()}


def one_audio_file(files, clip_id, where):
    """The one audio file of a clip (files: its paths, preferred first; None when it has none), or
    DatasetError when it has several formats (LJ001-0001.wav and .flac): the pipeline would read the
    first and ignore the rest, often a stale copy a conversion or a second make_corpus left behind."""
    if files and len(files) > 1:
        names = ", ".join(os.path.basename(f) for f in files)
        raise DatasetError(f"{where}: clip {clip_id!r} has audio in {len(files)} formats ({names}) beside each "
                           f"other; keep one (the pipeline would read {os.path.basename(files[0])} and ignore the rest)")
    return files[0] if files else None


def not_a_file_name(clip_id, has_audio, folder, where):
    """DatasetError when a clip that has no audio file is named with its file's extension
    (`LJ001-0001.wav|...` in metadata.csv, for wavs/LJ001-0001.wav) and `has_audio(stem)` finds the file:
    the id is the file's name without it, so the clip's audio was looked for as LJ001-0001.wav.wav."""
    stem, _, ext = clip_id.rpartition(".")
    if stem and ext.lower() in AUDIO_EXTENSIONS and has_audio(stem):
        raise DatasetError(f"{where}: id {clip_id!r} ends with its audio file's extension; an id is the file's name "
                           f"without it ({folder}/{clip_id}.wav|flac|ogg is looked for): write {stem!r}")


def _read_text(path):
    try:
        raw = path.read_bytes()
        _not_utf16(raw, path)
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 (byte {e.start + 1})") from None
    except OSError as e:  # a broken link, a folder named like a transcript, no permission
        raise DatasetError(f"{path}: cannot read the transcript ({e.strerror or type(e).__name__})") from None
    text = " ".join(check_text(text, str(path)).split())  # line breaks and tabs are whitespace here
    if not text:
        raise DatasetError(f"{path}: empty transcript")
    return text


def _file_id(cid, path):
    """A clip id taken from a file's name (vctk, libritts): the rule ljspeech ids and csv names follow."""
    if not _ID.fullmatch(cid):
        raise DatasetError(f"{path.parent}: the file name {path.name!r} gives the clip id {cid!r}, not a plain "
                           "name (letters, digits, '_', '-', '.'); rename the file")
    return cid


def _entries(folder, what="the folder", missing_ok=False):
    """The entries of a corpus folder, sorted by name, or DatasetError naming it when it cannot be listed
    (no permission, a file where the folder should be): a speaker or chapter folder read as empty would
    drop its clips without a word. missing_ok: no such folder is no entries."""
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError as e:
        if missing_ok and isinstance(e, FileNotFoundError):
            return []
        raise DatasetError(f"{folder}: cannot list {what} ({e.strerror or type(e).__name__})") from None


def _subfolders(folder):
    return [e.name for e in _entries(folder) if e.is_dir()] if folder.is_dir() else []


def _named(folder, suffix):
    """The paths in `folder` whose names end with `suffix` (as Path.glob("*" + suffix), which reads a
    folder it cannot list as empty), sorted."""
    return [Path(e.path) for e in _entries(folder) if e.name.endswith(suffix)]


def read_ljspeech(root, src, name, strict):
    speaker = src.get("speaker") or name
    if not (root / "metadata.csv").is_file():
        raise DatasetError(f"{root / 'metadata.csv'}: not found (an ljspeech source holds metadata.csv and wavs/)")
    audio = _scan_audio(root / "wavs")
    out = []
    for c in read_metadata(root / "metadata.csv"):
        where = f"{root / 'metadata.csv'}:{c.lineno}"
        if c.id not in audio:
            not_a_file_name(c.id, audio.__contains__, root / "wavs", where)
        wav = one_audio_file(audio.get(c.id), c.id, where) or str(root / "wavs" / f"{c.id}.wav")
        out.append(Clip(c.id, c.text, c.line, c.lineno, speaker, src.get("language") or "", wav, where))
    return out


def read_vctk(root, src, name, strict):
    if src.get("speaker"):
        raise DatasetError(f"dataset.sources ({name}).speaker: a vctk corpus names its speakers by folder; "
                           "remove the key")
    trimmed = (root / "wav48_silence_trimmed").is_dir()
    out = []
    for speaker in _subfolders(root / "txt"):
        check_speaker(speaker, f"{root / 'txt'}: folder")  # the speaker is the folder's name
        audio = _scan_audio(root / ("wav48_silence_trimmed" if trimmed else "wav48") / speaker)
        for txt in _named(root / "txt" / speaker, ".txt"):
            cid = _file_id(txt.stem, txt)
            wav = one_audio_file(audio.get(f"{cid}_mic1" if trimmed else cid), cid, str(txt))
            missing = root / "wav48_silence_trimmed" / speaker / f"{cid}_mic1.flac" if trimmed else \
                root / "wav48" / speaker / f"{cid}.wav"
            out.append(Clip(cid, _read_text(txt), "", 1, speaker, src.get("language") or "", wav or str(missing),
                            str(txt)))
    return out


def read_libritts(root, src, name, strict):
    if src.get("speaker"):
        raise DatasetError(f"dataset.sources ({name}).speaker: a libritts corpus names its speakers by folder; "
                           "remove the key")
    out = []
    for speaker in _subfolders(root):
        check_speaker(speaker, f"{root}: folder")
        for chapter in _subfolders(root / speaker):
            folder = root / speaker / chapter
            audio = _scan_audio(folder)
            for txt in _named(folder, ".normalized.txt"):
                cid = _file_id(txt.name[:-len(".normalized.txt")], txt)
                wav = one_audio_file(audio.get(cid), cid, str(txt)) or str(folder / f"{cid}.wav")
                out.append(Clip(cid, _read_text(txt), "", 1, speaker, src.get("language") or "", wav, str(txt)))
    return out


def inside_root(root, relative, where):
    """root / relative for a path that a data row names: DatasetError unless it is relative and stays
    inside the source's root, with no `..` part (the rule for every path data gives, docs/datasets.md).
    Symbolic links inside the root are followed: a wavs/ that links to another disk is the corpus
    owner's choice, where a row naming /etc/... or ../ is not."""
    path = Path(relative)
    if path.is_absolute() or path.drive or ".." in path.parts or "\\" in relative:
        raise DatasetError(f"{where} {relative!r}: must be a path relative to the source's root {root}, "
                           "without '..' (absolute paths and paths leaving the root are refused)")
    return root / path


def read_csv(root, src, name, strict):
    path = root / "metadata.csv"
    lines = table_lines(read_bytes(path, " (a csv source holds metadata.csv)"), path)
    if not lines:
        raise DatasetError(f"{path}: empty (expected a header row {'|'.join(CSV_COLUMNS)})")
    header = [h.strip() for h in lines[0][1].split("|")]
    unknown = sorted(set(header) - set(CSV_COLUMNS))
    if unknown or len(set(header)) != len(header) or not {"audio_file", "text"} <= set(header):
        raise DatasetError(f"{path}:{lines[0][0]}: header {lines[0][1]!r}: expected the columns "
                           f"{'|'.join(CSV_COLUMNS)} (language optional; speaker optional with the source's `speaker`)")
    if strict and "speaker" not in header and not src.get("speaker"):
        raise DatasetError(f"{path}:{lines[0][0]}: no speaker column and the source sets no `speaker`")
    out = []
    for lineno, line in lines[1:]:
        cols = line.split("|")
        if len(cols) != len(header):
            raise DatasetError(f"{path}:{lineno}: expected {len(header)} fields ({'|'.join(header)}), found {len(cols)}")
        where = f"{path}:{lineno}"
        check_text(line, where)
        row = dict(zip(header, (c.strip() for c in cols)))
        if not row["audio_file"] or not row["text"]:
            raise DatasetError(f"{where}: empty {'audio_file' if not row['audio_file'] else 'text'} field")
        audio = inside_root(root, row["audio_file"], f"{where}: audio_file")
        cid = audio.name.rpartition(".")[0] or audio.name
        if not _ID.fullmatch(cid):
            raise DatasetError(f"{where}: audio_file {row['audio_file']!r} is not a plain file name under {root} "
                               "(letters, digits, '_', '-', '.')")
        speaker = row.get("speaker") or src.get("speaker") or ""
        language = row.get("language") or src.get("language") or ""
        if strict:
            check_speaker(speaker, where)
            check_language(language, where)
        out.append(Clip(cid, row["text"], "", lineno, speaker, language, str(audio), where))
    return out


FORMATS = Registry("dataset.sources[].format", DatasetError, what="format", read=None)  # read(root, src, name, strict) -> [Clip]
FORMATS.add("ljspeech", read=read_ljspeech)
FORMATS.add("vctk", read=read_vctk)
FORMATS.add("libritts", read=read_libritts)
FORMATS.add("csv", read=read_csv)


def read_source(src, i=None, strict=True):
    """The clips of one source, ids prefixed with its name, in the reader's order."""
    key = f"dataset.sources[{i}]" if i is not None else "dataset.sources[]"
    read = FORMATS.get(src.get("format"), key=f"{key}.format").read
    root = Path(src["root"])
    if not root.is_dir():
        raise DatasetError(f"{key}.root: folder not found: {root}")
    name = source_name(src, i)
    if strict:
        if src.get("speaker"):
            check_speaker(src["speaker"], f"{key}.speaker")
        check_language(src.get("language"), f"{key}.language")
    clips = read(root, src, name, strict)
    if not clips:
        raise DatasetError(f"{key}.root: {root} holds no clips in the {src['format']} layout "
                           f"({read.__name__} in pipeline/formats.py)")
    out = []
    for c in clips:
        cid = f"{name}-{c.id}"
        line = "|".join((cid, c.text, c.speaker, c.language))  # what the token shard depends on
        out.append(Clip(cid, c.text, line, c.lineno, c.speaker, c.language, c.audio, c.where, name))
    return out


def normalised(sources):
    """{source name: the source with its `name` filled in}, in config order."""
    return {source_name(src, i): {**src, "name": source_name(src, i)} for i, src in enumerate(sources)}


def espeak_voices():
    """The voice names espeak-ng (and so phonemizer's espeak backend) accepts, from `espeak-ng --voices`
    (about 20 ms; phonemizer's own check costs half a second of imports); None without the program."""
    program = shutil.which("espeak-ng")
    if program is None:
        return None
    listing = subprocess.run([program, "--voices"], capture_output=True, text=True, check=False).stdout
    return {line.split()[1] for line in listing.splitlines()[1:] if len(line.split()) > 1}


def check_languages(clips, known, default):
    """DatasetError naming the first clip (file:line) whose language the token job's espeak-ng backend
    does not take as written. That backend looks a code up exactly among the voices `espeak-ng --voices`
    lists (espeak_voices): "EN-US" or a voice's other language ("en", "fr") would pass a
    check by `known` (espeak_languages: every code, lowercased) and fail in the job."""
    voices = espeak_voices()
    spelled = {v.lower(): v for v in voices} if voices is not None else {k: k for k in known}
    exact = set(spelled.values())
    for c in clips:
        language = c.language or default
        if language in exact:
            continue
        where = f"{c.where}: language {language!r} (from its source's `language`, its csv column or text.language)"
        if language.lower() in spelled:
            raise DatasetError(f"{where}: espeak-ng spells it {spelled[language.lower()]!r} and the token job looks "
                               "it up as written; write that")
        close = sorted(v for v in exact if v.split("-")[0] == language.split("-")[0].lower())
        raise DatasetError(f"{where} is not an espeak-ng voice; `espeak-ng --voices` lists them, e.g. "
                           f"{', '.join(close or sorted(v for v in exact if v.startswith('en')))}")


def _listing(folder):
    """(device, {name: inode}, {names that are symbolic links}) from one stat of a folder and one scan
    of it (the inodes readdir gives, so that two listings compare alike on any file system); None for
    a missing folder."""
    try:
        device = os.stat(folder or ".").st_dev
        with os.scandir(folder or ".") as entries:
            inodes, links = {}, set()
            for e in entries:
                inodes[e.name] = e.inode()
                if e.is_symlink():
                    links.add(e.name)
        return device, inodes, links
    except OSError:  # missing: its clips have no audio, which the audio jobs report
        return None


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:  # gone since the scan: the audio jobs report it
        return False


def _of_source(clip):
    return f" of source {clip.source!r}" if clip.source else ""


def check_same_audio(clips, paths=None, where_of=None):
    """DatasetError naming both clips when two are one audio file (the same device and inode: one path
    twice, a symbolic link, a hard link): the same recording under two ids (two sources over one folder,
    a link) would train under one and validate under the other. Each folder is scanned once; only the
    files that are symbolic links are resolved, each to its target's folder listing (one already
    listed) or stat (a folder of its own, as git-annex keeps each file); two files the listings pair
    are confirmed by stat (os.path.samefile) before they stop planning. `paths` ({clip id: file}) and
    `where_of` (clip -> file:line) stand in for each clip's `audio` and `where`."""
    listings, seen, real_folders = {}, {}, {}
    audio_of = (lambda c: paths[c.id]) if paths is not None else (lambda c: c.audio)
    where_of = where_of or (lambda c: c.where)

    def identity(path, follow=True):
        folder, name = os.path.split(path)
        if folder not in listings:
            listings[folder] = _listing(folder)
        if listings[folder] is None:
            return None  # no such folder: the audio jobs report it
        if name not in listings[folder][1]:
            # not as listed, yet there on a disk that ignores case (a1.wav is A1.wav on macOS): stat it
            try:
                st = os.stat(path)
            except OSError:
                return None  # no such file: the audio jobs report it
            return st.st_dev, st.st_ino
        device, inodes, links = listings[folder]
        if name in links:
            if not follow:
                return None
            try:
                if folder not in real_folders:  # `..` in a target is the real folder's parent
                    real_folders[folder] = os.path.realpath(folder)
                target = os.path.normpath(os.path.join(real_folders[folder], os.readlink(path)))
                if os.path.dirname(target) in listings:  # a folder listed anyway: its readdir inodes
                    found = identity(target, follow=False)
                    if found is not None:
                        return found
                st = os.stat(path)  # a folder of its own (git-annex: one per file): one stat, no listing
            except OSError:  # a broken link or a loop: the audio jobs report it
                return None
            return st.st_dev, st.st_ino
        return device, inodes[name]

    for c in clips:
        audio = audio_of(c)
        key = identity(audio)
        first = seen.setdefault(key, c) if key is not None else c
        if first is not c and _same_file(audio_of(first), audio):  # stat's word, where the listings agree
            real, other = os.path.realpath(audio_of(first)), os.path.realpath(audio)
            raise DatasetError(f"clip {first.id!r}{_of_source(first)} ({where_of(first)}) and clip {c.id!r}"
                               f"{_of_source(c)} ({where_of(c)}) are one audio file "
                               f"{real}{'' if other == real else f' (hard-linked as {other})'}: the same recording "
                               "twice would train under one id and validate under the other; list it once")


def read_sources(sources, strict=True):
    """Every source's clips; DatasetError on two sources of one name, two clips of one id or of one
    audio file, or two spellings of one speaker (check_speaker_spellings)."""
    names, seen, out = {}, {}, []
    for i, src in enumerate(sources):
        name = source_name(src, i)
        if name in names:
            raise DatasetError(f"dataset.sources[{i}].name: {name!r} is also the name of dataset.sources[{names[name]}]; "
                               "give one of them another `name`")
        names[name] = i
        for c in read_source(src, i, strict):
            if c.id in seen:
                raise DatasetError(f"clip id {c.id!r} twice: {seen[c.id]} and {c.where}; rename one file or a source")
            seen[c.id] = c.where
            out.append(c)
    check_same_audio(out)
    check_speaker_spellings(out)
    return out


def check_speaker_spellings(clips):
    """DatasetError naming both clips when two speakers' names are one name in two Unicode spellings
    (NFC "José", NFD "Jose" + a combining accent: one source's metadata from macOS, another's from
    Linux): they look alike in every listing, and the speaker table would hold two speakers, each
    trained on part of one voice."""
    first = {}
    for c in clips:
        if not c.speaker:
            continue
        key = unicodedata.normalize("NFC", c.speaker)
        other = first.setdefault(key, c)
        if other.speaker != c.speaker:
            raise DatasetError(f"{c.where}: speaker {c.speaker!r} is {other.speaker!r} ({other.where}) spelled with "
                               "other Unicode code points (NFC against NFD): they would train as two speakers; "
                               "write both the same way")
