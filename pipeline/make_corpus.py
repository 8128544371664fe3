"""Make an LJSpeech-layout corpus by speaking LJSpeech transcripts with espeak-ng.

Reads:  a transcripts file in LJSpeech metadata.csv layout (id|text|normalized_text, UTF-8).
Writes: OUT/metadata.csv (the chosen input lines unchanged, UTF-8, LF) and
        OUT/wavs/{id}.flac or .wav (16-bit PCM, mono, at --sample-rate).
It is how the shipped demo corpus data/demo was made, and it makes bigger synthetic corpora for
benchmarks without downloading LJSpeech (13,100 lines in data/ljspeech_transcripts.csv).

Each clip speaks the normalized_text column (the one the text front end reads; text when it is
empty). espeak-ng speaks at 22050 Hz; other rates are resampled with soxr. Every clip carries a
digest of its request (text, voice, speed, rate) in its comment tag, so a rerun skips the clips
already made with the same request: an interrupted run continues, a changed one redoes them, and a
run in another --format removes the clips an earlier run made in the old one (the readers would
prefer a stale .wav). --start and --count count the lines that hold clips (blank lines skipped).
One run at a time writes an --out: a run holds OUT/.make_corpus.lock (removed when it ends; a killed
run's is taken over), and a second one into the same --out stops at its start, one line naming the
holder. A run replaces only what it made: before speaking anything it refuses an audio file in its way
that lacks its tag (a recording of the user's own) and a metadata.csv holding a row of a clip it did
not make that it would not write again (a user's own row): give an empty or new --out. Rows of clips
it made may go (a smaller --count keeps their audio, and a rerun takes them back), unless --transcripts
is that metadata.csv (their text would be lost with them); rerunning the
command, a larger --count, another --format and a corrected transcript line keep working.

Run:  python -m pipeline.make_corpus --transcripts data/ljspeech_transcripts.csv \
          --out data/demo --count 100 --sample-rate 16000 --jobs 2

Several voices (`--voices`, espeak-ng voices and variants): each speaks `--count` lines of its own
(voice i takes the lines after voice i-1's: no sentence is spoken twice), written in the `csv`
source format (pipeline/formats.py): OUT/metadata.csv `audio_file|text|speaker|language` and
OUT/wavs/{voice}-{id}.flac; the speaker is the voice's name ("/" made "_" in espeak-ng's voice files,
e.g. gmw/en-US), the language its code before "+" (for a voice file, the language `espeak-ng
--voices` lists for it) or the matching entry of `--languages`; a language the token job would not
take, or a variant espeak-ng does not have (it would speak the plain voice), stops the run before any
clip is made.

      python -m pipeline.make_corpus --transcripts data/ljspeech_transcripts.csv --out data/voices \
          --voices en-us+m3,en-us+f2,en-gb+m1 --count 60 --sample-rate 22050
"""
import argparse
import concurrent.futures
import errno
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from pipeline.errors import DiskFull, PipelineError, cli, disk_full
from pipeline.files import atomic_write, atomic_write_text, check_folder, exclusive
from pipeline.formats import (
    AUDIO_EXTENSIONS,
    check_text,
    espeak_voices,
    not_a_header,
    plain_id,
    table_lines,
    utf8_lines,
)

ESPEAK = "espeak-ng"
ESPEAK_RATE = 22050  # espeak-ng's own output rate
FORMATS = {"flac": "FLAC", "wav": "WAV"}
_TAG_PREFIX = "make_corpus "
SILENT_PEAK = 328  # int16 peak below -40 dBFS: espeak-ng spoke nothing (its speech peaks near 10000..25000)


def _check_espeak():
    if shutil.which(ESPEAK) is None:
        raise RuntimeError(f"{ESPEAK} is not installed or not on PATH; install it with "
                           f"`apt-get install espeak-ng` (or `conda install -c conda-forge espeak-ng`)")


def _parse_wav(data: bytes) -> tuple[np.ndarray, int]:
    """int16 samples and rate of espeak-ng's streamed WAV (its size fields are placeholders)."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise RuntimeError(f"{ESPEAK} did not write a WAV stream")
    pos, rate = 12, None
    while pos + 8 <= len(data):
        chunk, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if chunk == b"fmt ":
            codec, channels, rate, _, _, bits = struct.unpack("<HHIIHH", data[pos + 8:pos + 24])
            if (codec, channels, bits) != (1, 1, 16):
                raise RuntimeError(f"{ESPEAK} wrote codec {codec}, {channels} channels, {bits} bit; "
                                   "expected 16-bit PCM mono")
        elif chunk == b"data":
            body = data[pos + 8:]  # the stream's size field is unknown when writing to a pipe
            return np.frombuffer(body[:len(body) // 2 * 2], "<i2"), rate
        pos += 8 + size + (size & 1)
    raise RuntimeError(f"{ESPEAK} wrote a WAV stream without audio")


def _speak_pcm(text: str, voice: str, speed: int) -> tuple[np.ndarray, int]:
    # --stdin: the text never meets argv, so quotes and leading dashes are safe.
    cmd = [ESPEAK, "-v", voice, "-s", str(speed), "--stdin", "--stdout"]
    try:
        proc = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True)
    except FileNotFoundError:
        _check_espeak()
        raise
    if proc.returncode == -signal.SIGINT:  # Ctrl-C reached espeak-ng too: a stop, not a failed line
        raise KeyboardInterrupt
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()}")
    pcm, rate = _parse_wav(proc.stdout)
    if pcm.size == 0:
        raise ValueError(f"{ESPEAK} produced no audio for {text!r}")
    peak = int(np.abs(pcm.astype(np.int32)).max())
    if peak < SILENT_PEAK:  # e.g. "..." or a lone dash: a clip of silence labelled with text
        raise ValueError(f"{ESPEAK} spoke only silence for {text!r} (peak {peak} of 32767); give the line "
                         "words to speak or leave it out")
    return pcm, rate


def speak(text: str, *, voice: str = "en-us", speed: int = 175) -> tuple[np.ndarray, int]:
    """Speak text with espeak-ng: float32 samples in [-1, 1) and their sample rate (22050)."""
    pcm, rate = _speak_pcm(text, voice, speed)
    return pcm.astype(np.float32) / 32768.0, rate


def read_transcripts(path, *, start: int = 0, count: int | None = None) -> list[tuple[str, str, str]]:
    """(id, text to speak, original line) for clips start .. start+count of an LJSpeech csv (its lines
    that hold one: a BOM and blank lines are skipped, as the pipeline's reader does): transcript_rows
    without the line numbers."""
    return [row[:3] for row in transcript_rows(path, start=start, count=count)]


def transcript_rows(path, *, start: int = 0, count: int | None = None) -> list[tuple[str, str, str, int]]:
    """(id, text to speak, original line, its line number) for clips start .. start+count of an
    LJSpeech csv. An id names its clip's file, so it must be a plain file name (formats.plain_id), once
    in the lines read; a text the pipeline would refuse (a control character: formats.check_text) or a
    first row of column names (formats.not_a_header) stops the run before anything is spoken."""
    rows, seen = [], {}
    path = Path(path)
    # only "\n" ends a line (str.splitlines would also split on \x85, \u2028, ...); a CR inside one is refused
    lines = table_lines(path.read_bytes(), path)
    for lineno, line in lines[start:] if count is None else lines[start:start + count]:
        where = f"{path}:{lineno}"
        cols = line.split("|")
        if len(cols) not in (2, 3) or not cols[0].strip():
            raise ValueError(f"{where}: expected id|text|normalized_text, got {line!r}")
        if lineno == lines[0][0]:  # metadata.csv would hold it: the pipeline refuses it there
            not_a_header(cols, line, where)
        spoken = (cols[2] if len(cols) == 3 and cols[2].strip() else cols[1]).strip()
        if not spoken:
            raise ValueError(f"{where}: empty text for id {cols[0]!r}")
        clip_id = plain_id(cols[0].strip(), where)
        check_text(line, where)
        if clip_id in seen:
            raise ValueError(f"{where}: duplicate id {clip_id!r} (first on line {seen[clip_id]})")
        seen[clip_id] = lineno
        rows.append((clip_id, spoken, line, lineno))
    return rows


def case_insensitive(folder):
    """Whether `folder`'s file system takes names that differ only in case for one file (macOS's and
    Windows' defaults), tried with a temporary file."""
    probe = Path(tempfile.mkstemp(prefix=".case-probe-", dir=folder)[1])
    try:
        return Path(folder, probe.name.swapcase()).exists()
    finally:
        probe.unlink()


def check_case_twins(folder, stems):
    """ValueError naming both lines when two clips' file names (stems: (name, file:line)) differ only in
    case and `folder` is on a file system that makes them one file: the second clip would overwrite
    the first's audio, and metadata.csv pair two texts with one recording. On Linux they are two files."""
    seen = {}
    for stem, where in stems:
        first = seen.setdefault(stem.casefold(), (stem, where))
        if first[0] != stem and case_insensitive(folder):
            raise ValueError(f"{where}: clip {stem!r} and {first[0]!r} ({first[1]}) differ only in case, and "
                             f"{folder} is on a file system that makes them one file; rename one")


LOCK = ".make_corpus.lock"  # in --out while a run writes there: no clip, no leftover, never in metadata.csv


def corpus_lock(out: Path):
    """The lock a run holds on its --out (made first, a folder): out/LOCK (files.exclusive). A second run
    into the same --out stops at its start, one line naming the holder: two at once removed each other's
    temporary clips as a killed run's leftovers and failed on the lines whose clips went."""
    check_folder(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    busy = lambda holder: (f"--out {out}: another make_corpus is writing this corpus now ({holder} holds "
                           f"{out / LOCK}); wait for it to end, or give another --out")
    return exclusive(out / LOCK, busy)


def _tagged(path) -> bool:
    """Whether path is an audio file make_corpus made (its comment tag); False for anything else,
    a folder, a pipe or a file libsndfile cannot read included."""
    if not os.path.isfile(path):
        return False
    try:
        with sf.SoundFile(path) as f:
            return (f.comment or "").startswith(_TAG_PREFIX)
    except (OSError, RuntimeError):  # sf.LibsndfileError is a RuntimeError
        return False


def check_out_path(out):
    """ValueError for an --out whose name is not UTF-8: libsndfile takes UTF-8 paths only, and every clip
    failed with an encoding error that named its transcript line."""
    try:
        os.fspath(out).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"--out {os.fspath(out)!r}: not a UTF-8 path, which libsndfile cannot write to; "
                         "give a folder whose name is UTF-8") from None


def check_ours(paths):
    """ValueError naming the first file in the place of one of `paths` (the clips a run would write), in
    any audio format, that exists without make_corpus's tag: a user's own recording, or a file it cannot
    read, is never replaced, nor given a twin in another format (MY007.wav beside a new MY007.flac: the
    readers refuse a clip with two). Every path is checked before anything is spoken."""
    places = [Path(path).with_suffix(f".{ext}") for path in paths for ext in AUDIO_EXTENSIONS]
    theirs = [path for path in places if os.path.lexists(path) and not _tagged(path)]
    if theirs:
        more = f" (and {len(theirs) - 1} more in the clips' places)" if len(theirs) > 1 else ""
        raise ValueError(f"{theirs[0]}{more}: not made by make_corpus (it has no make_corpus tag), so no clip "
                         "replaces it or goes beside it; give an empty or new --out")


def check_metadata(path, lines, clip_of):
    """ValueError naming metadata.csv at `path` when replacing it with `lines` would lose a row of a clip
    make_corpus did not make: a row is kept when its clip (clip_of(row) -> (key, [its audio files as
    each format names them])) is one of the new lines' clips, and may go when one of its audio files
    carries make_corpus's tag (a rerun makes it again). A rerun, a larger --count, another --format or
    a corrected transcript line keep every row; a user's own rows (their recordings, or no audio at all)
    are never dropped."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    old = [line.removesuffix("\r").lstrip("\ufeff") for line in utf8_lines(path.read_bytes(), path) if line.strip()]
    keep = {clip_of(line)[0] for line in lines}
    lost = [line for line in old if (clip := clip_of(line))[0] not in keep and not any(map(_tagged, clip[1]))]
    if lost:
        raise ValueError(f"{path}: {len(lost)} of its {len(old)} rows name clips make_corpus did not make and are not "
                         f"among the {len(lines)} this run would write (first {lost[0][:40]!r}); replacing it would "
                         "lose them: give an empty or new --out")


def check_not_transcripts(transcripts, path, lines):
    """ValueError when the metadata.csv at `path` is the transcripts file itself and replacing it with
    `lines` would drop or change any of its lines (a smaller --count, another --start): their text would
    be gone, and a larger --count could not take them back. The same lines again are no change."""
    try:
        same = os.path.samefile(transcripts, path)
    except OSError:   # no metadata.csv yet
        return
    if same and [line for _, line in table_lines(Path(path).read_bytes(), path)] != list(lines):
        raise ValueError(f"--transcripts {transcripts} is the metadata.csv this run writes, and it would keep "
                         f"{len(lines)} of its lines (the others' text would be lost): copy it elsewhere and give "
                         "that as --transcripts")


def check_space(path, size):
    """DiskFull naming path's folder when a failed write of about `size` bytes there did not fit in its
    free space (libsndfile reports a full disk as "System error."), else None."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return None
    if free >= size + (1 << 20):  # room for the clip and then some: another failure
        return None
    return DiskFull(f"no space left on device in {path.parent} ({free // 1024} KiB free, writing {path.name}); "
                    "free space and rerun (the clips made so far stay)")


def remove_other_formats(paths, log):
    """Delete, beside each clip just made (or kept), a file of the same name in another audio format
    that make_corpus made (its comment tag): a corpus remade in flac would otherwise keep the old .wav
    clips, which the readers prefer. Another program's file is left for planning to refuse."""
    removed = 0
    for path in paths:
        for ext in AUDIO_EXTENSIONS:
            other = path.with_suffix(f".{ext}")
            if other != path and _tagged(other):
                other.unlink()
                removed += 1
    if removed:
        print(f"make_corpus: removed {removed} clips left in another format by an earlier run", file=log)


def _request_tag(text: str, voice: str, speed: int, sample_rate: int) -> str:
    request = json.dumps([text, voice, speed, sample_rate], ensure_ascii=False)
    return _TAG_PREFIX + hashlib.sha256(request.encode("utf-8")).hexdigest()[:16]


def _existing_frames(path: Path, tag: str, sample_rate: int) -> int | None:
    """Frames of a clip made by the same request, or None when it must be (re)made."""
    try:
        with sf.SoundFile(path) as f:
            same = f.comment == tag and f.samplerate == sample_rate and f.channels == 1
            return f.frames if same else None
    except (OSError, RuntimeError, sf.LibsndfileError):
        return None  # missing (a file it did not make never gets here: check_ours refused it)


def write_atomic(path: Path, pcm: np.ndarray, sample_rate: int, *, comment: str = "",
                 compression_level: float | None = None):
    """Write int16 mono audio to path via a temporary file in the same folder + os.replace."""
    fmt = FORMATS[path.suffix[1:]]
    extra = {"compression_level": compression_level} if compression_level is not None else {}
    def write(tmp):
        with sf.SoundFile(tmp, "w", sample_rate, 1, "PCM_16", format=fmt, **extra) as f:
            if comment:
                f.comment = comment
            f.write(pcm)
    atomic_write(path, write)


def _make_clip(path: Path, text: str, voice: str, speed: int, sample_rate: int,
               compression_level: float | None) -> tuple[int, bool]:
    """(frames, made) for one clip; made is False when an identical clip was already there."""
    tag = _request_tag(text, voice, speed, sample_rate)
    frames = _existing_frames(path, tag, sample_rate)
    if frames is not None:
        return frames, False
    pcm, rate = _speak_pcm(text, voice, speed)
    if rate != sample_rate:
        pcm = soxr.resample(pcm, rate, sample_rate)  # int16 in, int16 out
    try:
        write_atomic(path, pcm, sample_rate, comment=tag, compression_level=compression_level)
    except (OSError, RuntimeError) as err:
        full = check_space(path, pcm.nbytes)
        if full is None:
            raise
        raise full from err
    return len(pcm), True


def _make_clips(tasks, speed, sample_rate, compression_level, jobs, log) -> tuple[int, int]:
    """(frames, clips made) for tasks (where, path, text, voice); the first failure stops the run and
    names its transcript line."""
    total, made = 0, 0
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:  # each thread waits on one espeak
        futures = {pool.submit(_make_clip, path, text, voice, speed, sample_rate, compression_level): where
                   for where, path, text, voice in tasks}
        try:
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                try:
                    frames, new = future.result()
                except DiskFull:
                    raise  # names its folder; no transcript line is to blame
                except Exception as err:
                    raise RuntimeError(f"{futures[future]}: {err}") from err
                total, made = total + frames, made + new
                if done % 1000 == 0:
                    print(f"make_corpus: {done}/{len(tasks)} clips", file=log)
        except BaseException:  # first failure or Ctrl-C: start no more espeak processes
            pool.shutdown(cancel_futures=True)
            raise
    return total, made


SPEEDS = (80, 5000)         # words a minute: espeak-ng speaks slower ones at its default, none from ~10000
SAMPLE_RATES = (8000, 192000)
MAX_JOBS = 256              # espeak-ng processes at once: a thread and a process each (10**5 tried to start 13,100)


def check_numbers(*, count, start, jobs, sample_rate, speed, compression_level=None, fmt="flac"):
    """ValueError naming the option for a number make_corpus cannot honour: espeak-ng speaks a speed
    outside SPEEDS at its default (0, -50 and 175 gave the same clip) or not at all (99999), a
    2 GHz --sample-rate made a 4 GB wav of a 1 s clip, and libsndfile refuses a compression level
    for a wav (after the first clip was spoken, naming its transcript line)."""
    checks = (("--count", count, count >= 1, "1 or more"), ("--start", start, start >= 0, "0 or more"),
              ("--jobs", jobs, 1 <= jobs <= MAX_JOBS, f"1 to {MAX_JOBS}"),
              ("--sample-rate", sample_rate, SAMPLE_RATES[0] <= sample_rate <= SAMPLE_RATES[1],
               "%d to %d Hz" % SAMPLE_RATES),
              ("--speed", speed, SPEEDS[0] <= speed <= SPEEDS[1], "%d to %d words a minute" % SPEEDS),
              ("--compression-level", compression_level, compression_level is None or 0 <= compression_level <= 1,
               "0 to 1"),
              ("--compression-level", compression_level, compression_level is None or fmt == "flac",
               f"FLAC only (--format {fmt} is not compressed)"))
    for option, value, ok, bounds in checks:
        if not ok:
            raise ValueError(f"{option} {value}: {bounds}")


def make_corpus(transcripts, out, *, count: int, start: int = 0, fmt: str = "flac",
                sample_rate: int = ESPEAK_RATE, jobs: int = 1, voice: str = "en-us",
                speed: int = 175, compression_level: float | None = None, log=sys.stderr) -> dict:
    """Speak `count` transcript lines from `start` into an LJSpeech-layout corpus at `out`.

    Returns {"clips", "made", "skipped", "seconds"}; metadata.csv is written last, so it only
    exists once every listed clip does. compression_level (FLAC, 0..1) trades encoding time for
    size and does not change the samples, so it is not part of a clip's request.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    check_numbers(count=count, start=start, jobs=jobs, sample_rate=sample_rate, speed=speed,
                  compression_level=compression_level, fmt=fmt)
    check_out_path(out)
    _check_espeak()
    check_variants([voice], "--voice")
    rows = transcript_rows(transcripts, start=start, count=count)
    if len(rows) < count:
        raise ValueError(f"{transcripts} has {len(rows)} lines from line {start}, not {count}")
    out = Path(out)
    with corpus_lock(out):   # one run at a time into --out, from here on
        wavs = out / "wavs"
        check_not_transcripts(transcripts, out / "metadata.csv", [line for _, _, line, _ in rows])
        check_metadata(out / "metadata.csv", [line for _, _, line, _ in rows],
                       lambda row: _clip_files(wavs, row.split("|", 1)[0]))
        check_ours([wavs / f"{clip_id}.{fmt}" for clip_id, *_ in rows])
        wavs.mkdir(parents=True, exist_ok=True)
        for stale in wavs.glob(".*.tmp[0-9]*"):  # a killed run's (files.temporary names): no other run writes here
            stale.unlink(missing_ok=True)
        check_case_twins(wavs, [(clip_id, f"{transcripts}:{lineno}") for clip_id, _, _, lineno in rows])

        t0 = time.perf_counter()
        total, made = _make_clips([(f"{transcripts}:{lineno}: clip {clip_id}", wavs / f"{clip_id}.{fmt}", text,
                                    voice) for clip_id, text, _, lineno in rows],
                                  speed, sample_rate, compression_level, jobs, log)
        remove_other_formats([wavs / f"{clip_id}.{fmt}" for clip_id, *_ in rows], log)
        atomic_write_text(out / "metadata.csv", "".join(line + "\n" for _, _, line, _ in rows))

        stats = {"clips": len(rows), "made": made, "skipped": len(rows) - made,
                 "seconds": round(total / sample_rate, 2)}
        print(f"make_corpus: {stats['clips']} clips ({made} made, {stats['skipped']} already there), "
              f"{stats['seconds']} s of audio at {sample_rate} Hz in {out} "
              f"({time.perf_counter() - t0:.1f} s)", file=log)
        return stats


def check_variants(voices, option):
    """ValueError naming `option` for a voice whose variant (after "+") espeak-ng does not have, before
    anything is spoken: espeak-ng speaks such a voice as the plain voice, silently (en-us+M3 and en-us+f9
    are en-us: variant names are case-sensitive), so two --voices were one voice under two speakers.
    The variants are the files `espeak-ng --voices=variant` lists (!v/m3 is m3); nothing is checked
    without the program or such a listing."""
    program = shutil.which(ESPEAK)
    wanted = [(voice, voice.partition("+")[2]) for voice in voices if voice.partition("+")[2]]
    if program is None or not wanted:
        return
    listing = subprocess.run([program, "--voices=variant"], capture_output=True, text=True, check=False).stdout
    known = {word[3:] for line in listing.splitlines()[1:] for word in line.split() if word.startswith("!v/")}
    for voice, variant in wanted if known else ():   # an espeak-ng that lists none: nothing to check against
        if variant in known:
            continue
        same = [v for v in known if v.lower() == variant.lower()]
        alike = sorted((v for v in known if v[:1].lower() == variant[:1].lower()), key=lambda v: (len(v), v))
        raise ValueError(f"{option} {voice}: espeak-ng has no variant {variant!r} (it would speak "
                         f"{voice.partition('+')[0]} without one, silently); "
                         + (f"write {same[0]!r}" if same else
                            f"`espeak-ng --voices=variant` lists them, e.g. {', '.join(alike[:12] or sorted(known)[:12])}"))


def voice_speaker(voice):
    """A voice's speaker name in the corpus: the voice with its path separators (espeak-ng's voice files,
    e.g. "gmw/en-US", "mb/mb-en1") made "_", a plain name (formats.check_speaker)."""
    return voice.replace("/", "_").replace("\\", "_")


def voice_file_stem(voice, clip_id):
    """A clip's file name (no extension) for a voice: "en-us+m3", "LJ001-0001" -> "en-us_m3-LJ001-0001";
    "gmw/en-US" -> "gmw_en-US-LJ001-0001" (one file in wavs/, not a folder per path)."""
    return f"{voice_speaker(voice).replace('+', '_')}-{clip_id}"


def voice_languages(voices):
    """Each voice's language as the token job spells it: its name before "+", or, for an espeak-ng voice
    file ("gmw/en-US+f2"), the language `espeak-ng --voices` lists for that file ("en-us")."""
    program = shutil.which("espeak-ng")
    listing = subprocess.run([program, "--voices"], capture_output=True, text=True, check=False).stdout \
        if program else ""
    by_file = {cols[4]: cols[1] for cols in (line.split() for line in listing.splitlines()[1:]) if len(cols) > 4}
    return [by_file.get(v.split("+")[0], v.split("+")[0]) for v in voices]


def _clip_files(out, stem):
    """(stem, the clip's audio file in every format) under `out`: what check_metadata asks of a row."""
    return stem, [Path(out) / f"{stem}.{ext}" for ext in AUDIO_EXTENSIONS]


def make_voices_corpus(transcripts, out, *, voices, languages=None, count: int, start: int = 0, fmt: str = "flac",
                       sample_rate: int = ESPEAK_RATE, jobs: int = 1, speed: int = 175,
                       compression_level: float | None = None, log=sys.stderr) -> dict:
    """A csv-format corpus of several espeak-ng voices, `count` different lines each (see the module
    doc; compression_level as make_corpus's). Returns {"clips", "made", "skipped", "seconds", "speakers"}."""
    voices = [v.strip() for v in voices if v.strip()]
    languages = list(languages) if languages else voice_languages(voices)
    if not voices or len({voice_speaker(v) for v in voices}) != len(voices) or len(languages) != len(voices):
        raise ValueError(f"--voices: give distinct voices ({voices}) and, with --languages, one language each "
                         f"({languages})")
    known = espeak_voices()
    for voice, language in zip(voices, languages):
        if known is not None and language not in known:
            raise ValueError(f"--voices {voice}: espeak-ng has no language {language!r} for the token job; "
                             "give each voice's language with --languages (`espeak-ng --voices` lists them)")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")
    check_numbers(count=count, start=start, jobs=jobs, sample_rate=sample_rate, speed=speed,
                  compression_level=compression_level, fmt=fmt)
    check_out_path(out)
    _check_espeak()
    check_variants(voices, "--voices")
    rows = transcript_rows(transcripts, start=start, count=count * len(voices))
    if len(rows) < count * len(voices):
        raise ValueError(f"{transcripts} has {len(rows)} lines from line {start}, not {count * len(voices)} "
                         f"({count} for each of {len(voices)} voices)")
    out = Path(out)
    with corpus_lock(out):   # one run at a time into --out, from here on
        jobs_list = [(voice, language, *rows[i * count + k])
                     for i, (voice, language) in enumerate(zip(voices, languages)) for k in range(count)]
        lines = ["audio_file|text|speaker|language"] + [
            f"wavs/{voice_file_stem(voice, cid)}.{fmt}|{text}|{voice_speaker(voice)}|{language}"
            for voice, language, cid, text, *_ in jobs_list]
        check_metadata(out / "metadata.csv", lines,
                       lambda row: _clip_files(out, os.path.splitext(row.split("|", 1)[0])[0]))
        check_ours([out / "wavs" / f"{voice_file_stem(voice, cid)}.{fmt}" for voice, _, cid, *_ in jobs_list])
        (out / "wavs").mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        check_case_twins(out / "wavs", [(voice_file_stem(voice, cid), f"{transcripts}:{lineno}")
                                        for voice, _, cid, _, _, lineno in jobs_list])
        total, made = _make_clips([(f"{transcripts}:{lineno}: clip {cid} ({voice})",
                                    out / "wavs" / f"{voice_file_stem(voice, cid)}.{fmt}", text, voice)
                                   for voice, _, cid, text, _, lineno in jobs_list],
                                  speed, sample_rate, compression_level, jobs, log)
        remove_other_formats([out / "wavs" / f"{voice_file_stem(voice, cid)}.{fmt}" for voice, _, cid, *_ in jobs_list],
                             log)
        atomic_write_text(out / "metadata.csv", "".join(line + "\n" for line in lines))
        stats = {"clips": len(jobs_list), "made": made, "skipped": len(jobs_list) - made,
                 "seconds": round(total / sample_rate, 2), "speakers": [voice_speaker(v) for v in voices]}
        print(f"make_corpus: {len(voices)} voices x {count} clips ({made} made), {stats['seconds']} s of audio in {out} "
              f"({time.perf_counter() - t0:.1f} s)", file=log)
        return stats


@cli
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transcripts", required=True, help="id|text|normalized_text file")
    p.add_argument("--out", required=True, help="corpus folder (metadata.csv + wavs/)")
    p.add_argument("--count", type=int, required=True, help="number of lines to speak (per voice with --voices)")
    p.add_argument("--start", type=int, default=0, help="first line (0-based)")
    p.add_argument("--format", choices=sorted(FORMATS), default="flac")
    p.add_argument("--sample-rate", type=int, default=ESPEAK_RATE, help="Hz; soxr resamples")
    p.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, MAX_JOBS),
                   help=f"espeak-ng processes at once (1 to {MAX_JOBS})")
    p.add_argument("--voice", help="the espeak-ng voice (default en-us); with --voices, list every voice there")
    p.add_argument("--voices", help="several espeak-ng voices, e.g. en-us+m3,en-us+f2,en-gb+m1: a csv-format "
                                    "corpus, different lines per voice")
    p.add_argument("--languages", help="with --voices: the language of each voice's rows (default: its code "
                                       "before '+')")
    p.add_argument("--speed", type=int, default=175, help="words per minute")
    p.add_argument("--compression-level", type=float, default=None,
                   help="FLAC effort from 0 (fastest) to 1 (smallest); default libsndfile's")
    args = p.parse_args(argv)
    try:
        if args.voices:
            if args.voice is not None:
                raise ValueError(f"--voice {args.voice}: not with --voices, which names every voice; list it there")
            make_voices_corpus(args.transcripts, args.out, voices=args.voices.split(","),
                               languages=args.languages.split(",") if args.languages else None, count=args.count,
                               start=args.start, fmt=args.format, sample_rate=args.sample_rate, jobs=args.jobs,
                               speed=args.speed, compression_level=args.compression_level)
            return
        if args.languages:
            raise ValueError("--languages goes with --voices")
        make_corpus(args.transcripts, args.out, count=args.count, start=args.start,
                    fmt=args.format, sample_rate=args.sample_rate, jobs=args.jobs,
                    voice=args.voice or "en-us", speed=args.speed,
                    compression_level=args.compression_level)
    except (RuntimeError, ValueError, OSError) as err:  # @cli: one line, status 2, as every command
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            raise disk_full(err.filename or args.out) from None
        raise PipelineError(str(err)) from None


if __name__ == "__main__":
    main()
