"""Speak text with an exported voice: a wav file, or raw PCM on standard output sentence by sentence.

Reads an export folder (`--voice runs/{name}/export`, pipeline/voice.py) and the text: the
arguments, else standard input (UTF-8). Writes `--out F.wav` (16-bit mono at the voice's rate; each
sentence appended to a temporary file beside F.wav as it is made, so a book takes one sentence's memory,
renamed onto F.wav once all is said; at most 4 GiB, about 27 hours at 22050 Hz, as any wav) or, with
`--raw`, 16-bit little-endian mono PCM at the voice's rate on standard output, each sentence as soon as it
is ready. A sentence that would clip has its peaks limited to 0.95 (pipeline/voice.py), the same in a --out
file and in --raw. Standard input is read a paragraph at a time (so with --raw a paragraph is spoken while
the next is typed), the same for --out. Nothing but audio goes to standard output: every log line goes to
standard error. Markup (docs/speak.md): `[[ ... ]]` inline phonemes, and SSML with `--ssml`, or text (of
standard input: a paragraph, then the rest of it) starting with `<speak>`. Bad input: one line
`error: ...` and exit status 2.

    python -m pipeline.speak --voice runs/demo/export --out hello.wav "Hello there. How are you?"
    python -m pipeline.speak --voice runs/demo/export --raw < book.txt | aplay -r 22050 -f S16_LE -c 1
"""
import argparse
import contextlib
import errno
import itertools
import os
import re
import signal
import sys
import threading
import time

import numpy as np

from pipeline import markup
from pipeline.errors import PipelineError, cli
from pipeline.files import check_not_input
from pipeline.voice import PACE_RANGE, PITCH_RANGE, NothingToSay, Voice, VoiceError, check_number
from pipeline.wavfile import check_path, stream_pcm, to_pcm

# the position an error about a text starts with, and the '[[' it may name: "line L" of that text
_POSITION = re.compile(r"(^|opened at )line (\d+)(?=, column )")


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def _raw_stdout():
    """A private copy of standard output for the PCM; file descriptor 1 then points at standard error,
    so a stray print (ours, a library's, TensorFlow's C++) can never corrupt the audio stream."""
    if sys.stdout is None:   # started with it closed (`>&-`): Python leaves None, and the PCM has nowhere to go
        raise VoiceError("--raw: standard output is closed; send it to a player, a pipe or a file, or write a wav "
                         "with --out F.wav")
    if os.isatty(1):   # raw samples on a terminal: screens of binary that can leave it in another mode
        raise VoiceError("--raw: standard output is a terminal; send it to a player (| aplay -r RATE -f S16_LE -c 1), "
                         "a pipe or a file, or write a wav with --out F.wav")
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    return out


def check_out(path):
    """Before the voice loads: an error naming --out unless `path` can become the wav: not empty, not
    `-`, and what wavfile.check_path checks (not a folder, nor a path ending as one's does; a file can
    be made in its nearest existing folder)."""
    if not path:
        raise VoiceError("--out: an empty path; give the path of the .wav to write")
    if path == "-":   # not standard output here: the wav would be a file named "-"
        raise VoiceError("--out -: a wav goes to a file; give its path (./- for a file named -), or --raw for "
                         "PCM on standard output")
    check_path(path, "--out")


def utf8_lines(stream):
    """The lines of a byte stream (standard input) as text, each as soon as it is read: UTF-8 whatever the
    locale says; VoiceError naming standard input and the byte offset of bytes that are not UTF-8."""
    offset = 0
    for number, line in enumerate(stream, 1):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VoiceError(f"standard input, line {number}: byte {line[e.start]:#04x} at byte offset {offset + e.start}"
                             " is not UTF-8; give the text in UTF-8") from None
        offset += len(line)


def paragraphs(lines):
    """(first line number, text) of an iterator of lines, one paragraph at a time (blank lines between);
    a paragraph that starts as SSML does (markup.is_ssml) starts a document: it and the rest, whole."""
    lines, paragraph, first = iter(lines), [], None
    for number, line in enumerate(lines, 1):
        if number == 1:
            line = line.removeprefix(markup.BOM)   # as markup.parse drops it: "<speak>" after it is still SSML
        if not paragraph and not line.strip():
            continue
        if not paragraph and markup.is_ssml(line):
            yield number, line + "".join(lines)
            return
        if line.strip():
            first = first if paragraph else number
            paragraph.append(line)
        else:
            yield first, "".join(paragraph)
            paragraph = []
    if paragraph:
        yield first, "".join(paragraph)


def in_input(error, first, named=False):
    """`error` (about a text that starts at line `first` of the input) with its positions in the input;
    `named` (a paragraph of standard input): one without a position (a sentence the front end cannot
    say) names the paragraph's first line."""
    if _POSITION.search(str(error)):
        if first > 1:
            error.args = (_POSITION.sub(lambda m: f"{m[1]}line {int(m[2]) + first - 1}", str(error)),)
    elif named:
        error.args = (f"the paragraph at line {first}: {error}",)
    return error


def prepared(voice, texts, options, lazy, quiet, named=False):
    """(first line, whether it is a paragraph named in errors (in_input), voice.prepare(text)) of each
    (first line, text); one that says nothing is passed over, its NothingToSay appended to `quiet`.
    named: the texts are standard input's."""
    for line, source in texts:
        paragraph = named and not markup.is_ssml(source)   # an SSML document is no paragraph: its errors
        try:                                                # carry their own lines
            yield line, paragraph, voice.prepare(source, **options, lazy=lazy)
        except NothingToSay as e:
            quiet.append(e)
        except PipelineError as e:
            raise in_input(e, line, paragraph) from None


def write_raw(out, data):
    """`data` to the raw PCM stream `out` (unbuffered: a write may take part of it, so until all is
    taken); a full disk behind standard output (`--raw > F` on a full disk, /dev/full) named as
    standard output, not as a file."""
    view = memoryview(data)
    try:
        while view:
            view = view[out.write(view) or 0:]
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise VoiceError("--raw: no space left on device writing standard output; free space and rerun") from None
        raise


def said(voice, texts, args, lazy, named=False):
    """float32 audio of each sentence of each (first line, text) (a paragraph, or the whole input), as
    soon as it is made; lazy: each text prepared as its turn comes (--raw), else every text is checked
    before any audio is made, as one text would be (--out). A paragraph that says nothing ("...") is
    passed over; if none says anything, the first one's error. Errors name lines of the whole input."""
    sentences, quiet = 0, []
    options = dict(ssml=True if args.ssml else None, pace=args.pace, pitch_shift=args.pitch_shift,
                   speaker=args.speaker, language=args.language)
    requests = prepared(voice, texts, options, lazy, quiet, named)
    for line, paragraph, request in requests if lazy else list(requests):
        try:
            for i, audio in enumerate(voice.sentences_float(request)):
                if sentences and not i:   # paragraphs read one by one: the pause markup puts between paragraphs
                    audio = np.concatenate([np.zeros(int(markup.PARAGRAPH_PAUSE * voice.sample_rate), np.float32),
                                            audio])
                yield audio
                sentences += 1
        except PipelineError as e:   # a later sentence (--raw's front end reads each as it comes) too
            raise in_input(e, line, paragraph) from None
    if not sentences and quiet:
        raise quiet[0]


def speak(voice, texts, args, out, named=False):
    """--raw: say each (first line, text) (said), each sentence written to the raw PCM file `out` as
    int16 (to_pcm) as soon as it is made. -> (sentences, seconds to the first audio)."""
    sentences, first, t0 = 0, None, time.perf_counter()
    for audio in said(voice, texts, args, True, named):
        write_raw(out, to_pcm(audio, "--raw").tobytes())
        first = first if first is not None else time.perf_counter() - t0
        sentences += 1
    return sentences, first


def speak_wav(voice, texts, args, path, named=False):
    """--out: say each (first line, text) (said: all of the text checked first) into the wav at `path`,
    each sentence's int16 samples appended to its temporary file as soon as they are made, so a book
    takes one sentence's memory, not hours of audio (wavfile.stream_pcm: renamed onto `path` once all
    is said; a failure, Ctrl-C, SIGTERM or SIGHUP leaves `path` as it was and no temporary file).
    Nothing is made, not a folder, until the text is checked and its first sentence said.
    -> (sentences, samples written)."""
    where, sentences = f"--out {path}", 0
    audio = said(voice, texts, args, False, named)
    first = next(audio, None)
    if first is None:
        return 0, 0
    audio = itertools.chain([first], audio)
    del first   # one sentence in memory at a time: this one goes once it is written

    def blocks():
        nonlocal sentences
        for chunk in audio:
            sentences += 1
            yield to_pcm(chunk, where)
    try:
        with _stopped_by_signals(where):
            samples = stream_pcm(path, blocks(), voice.sample_rate, where)
    except OSError as e:   # a full disk is pipeline.errors.DiskFull already
        raise VoiceError(f"{where}: cannot write it ({e.strerror or e})") from None
    return sentences, samples


@contextlib.contextmanager
def _stopped_by_signals(where, signals=(signal.SIGTERM, signal.SIGHUP)):
    """While a wav is written: SIGTERM and SIGHUP (`kill`, `timeout`, a closed terminal) end the process
    as an exception does, exit status 128 + the signal's number, so the wav's temporary file (gigabytes,
    for a book) is removed, not left beside it. A signal not at its default (ignored under nohup) is kept."""
    def stop(number, frame):
        log(f"stopped ({signal.Signals(number).name}); {where} not written")
        raise SystemExit(128 + number)
    before = {s: signal.getsignal(s) for s in signals}
    mine = [s for s, h in before.items() if h == signal.SIG_DFL and threading.current_thread() is threading.main_thread()]
    for s in mine:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, before[s])


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Speak text with an exported voice (runs/{name}/export).")
    parser.add_argument("--voice", required=True, help="the export folder (runs/{name}/export)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="write a 16-bit mono wav here")
    where.add_argument("--raw", action="store_true",
                       help="16-bit little-endian mono PCM at the voice's rate on standard output, sentence by sentence")
    parser.add_argument("--speaker", help="a speaker of the voice (GET /voices or export.json speakers; default the first)")
    parser.add_argument("--language", help="a language of the voice (default the voice's own)")
    parser.add_argument("--pace", type=float, default=1.0, help="> 1 speaks faster (0.25..4, default 1)")
    parser.add_argument("--pitch-shift", type=float, default=0.0, help="semitones (-12..12, default 0)")
    parser.add_argument("--ssml", action="store_true", help="the text is SSML (docs/speak.md)")
    parser.add_argument("text", nargs="*", help="the text (default: standard input)")
    args = parser.parse_args(argv)
    check_number("--pace", args.pace, *PACE_RANGE)             # the cheap checks before the model loads
    check_number("--pitch-shift", args.pitch_shift, *PITCH_RANGE)
    if args.out is not None:
        check_out(args.out)
        check_not_input(args.out, "--out", {"--voice": args.voice})
    if not args.text and sys.stdin is None:   # started with standard input closed (`<&-`)
        raise VoiceError("no text to speak: no TEXT given and standard input is closed")
    items = markup.parse(" ".join(args.text), True if args.ssml else None) if args.text else None
    out = _raw_stdout() if args.raw else None
    voice = Voice(args.voice, log=log, speaker=args.speaker, language=args.language, grappler=False, items=items,
                  pace=args.pace, pitch_shift=args.pitch_shift)   # TEXT's phonemes and prosody too, before the load
    log(f"voice {args.voice}: loaded in {voice.load_seconds:.2f} s ({voice.sample_rate} Hz"
        f"{'' if voice.grappler else '; CPU, graph optimizer off'})")
    if args.text:
        texts = [(1, " ".join(args.text))]
    elif args.ssml:
        texts = [(1, "".join(utf8_lines(sys.stdin.buffer)))]
    else:   # --out as --raw: one rule for what is SSML (--out read aloud the tags --raw took as SSML)
        texts = paragraphs(utf8_lines(sys.stdin.buffer))
    t0 = time.perf_counter()
    named = not args.text and not args.ssml   # the texts are paragraphs of standard input, whose errors name their lines
    if out is None:
        sentences, samples = speak_wav(voice, texts, args, args.out, named)
    else:
        try:
            sentences, first = speak(voice, texts, args, out, named)
        except BrokenPipeError:            # the reader went away (`| head -c ...`): nothing left to say
            return
    if not sentences:
        raise VoiceError("no text to speak (give TEXT or standard input)")
    wall = time.perf_counter() - t0
    if out is None:
        seconds = samples / voice.sample_rate
        log(f"wrote {args.out}: {sentences} sentence(s), {seconds:.2f} s of audio in {wall:.2f} s "
            f"(real-time factor {wall / max(seconds, 1e-9):.3f})")
    else:
        log(f"{sentences} sentence(s) in {wall:.2f} s, first audio after {first:.3f} s")


if __name__ == "__main__":
    main()
