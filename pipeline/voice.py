"""An exported voice, ready to speak: load an export folder, turn (marked-up) text into ids, and
synthesize it sentence by sentence. Shared by `python -m pipeline.speak` and `python -m pipeline.serve`.

Reads an export folder (runs/{name}/export, pipeline/export.py): saved_model/ (its `synthesize`
signature), vocab.json (the symbols and the front end that makes them) and export.json
(format, sample_rate, max_seconds and max_frames, speakers, languages, and `files`: saved_model/'s
files must be those the export wrote, checked by size and sha256 before TensorFlow loads; an export
from before `format` loads unverified, one note at load). Writes nothing (pipeline/wavfile.py
writes the wav where asked). Imports NumPy, the text front end (pipeline/text.py,
pipeline/symbols.py) and pipeline/wavfile.py (its int16 conversion) only: no training module, no config.
TensorFlow (~6 CPU s to import on a small CPU) is imported when a voice loads, after its folder's
files are checked: a usage error of `speak` or `serve`, or a folder that is not an export, is said
in well under a second instead of after that start-up.

The graph stops at max_frames (export.json; `synthesize.max_seconds` of the run), so a longer call
would be cut. Each sentence is therefore split ahead of the call into pieces that fit (at clause
punctuation, then between words) by the voice's seconds per symbol, measured once at load on
CALIBRATION (so the same text always gives the same audio), and a piece whose audio still reaches
max_frames is split in two (between words, else between symbols) and said again: nothing is ever
cut (a single symbol that reaches it is an error). A sentence makes at most MAX_SENTENCE_SECONDS
of audio, and a request at most its `max_seconds`: TooLong before any audio when the estimate is
over, else as soon as the audio passes the bound. A sentence's text holds at most
MAX_SENTENCE_CHARACTERS (TooLong before the front end), and goes through the front end in pieces
(front_end_pieces), so its cost stays linear in the text.

    from pipeline.voice import Voice
    voice = Voice("runs/demo/export")
    request = voice.prepare("Hello there. How are you?", pace=1.1)   # max_seconds=600: a bound on the whole
    for pcm in voice.sentences_audio(request): ...        # int16 [samples], one array per sentence
    pcm = voice.audio(request)                            # int16 [samples], the whole request

Audio is made as float32, a sentence at a time. Each stretch of speech the graph makes fades in and out
over FADE_SECONDS (fade_edges): the voice often starts a sentence mid-wave, and the jump from the
silence or the sentence before it would click. A sentence whose peak is over 1 (it would clip in 16
bits) has its peaks brought down to 0.95 by pipeline/wavfile.py's limiter (`limit_peaks`: a smooth gain
around each peak, 1 elsewhere), so it keeps the loudness of the sentences beside it, in a stream as in
a whole wav: every sentence comes out the same either way. Then to_pcm makes int16 of it.
"""
import hashlib
import json
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline import markup, text
from pipeline.errors import PipelineError
from pipeline.wavfile import limit_peaks, to_pcm

PACE_RANGE = (0.25, 4.0)          # > 1 speaks faster; also the range of pace x prosody rate
PITCH_RANGE = (-12.0, 12.0)       # semitones; pitch_shift + prosody pitch within twice that
CALIBRATION = "The quick brown fox jumps over the lazy dog."   # said at load: the voice's seconds per symbol
MARGIN = 1.25                     # the estimate's safety factor: pieces planned to fill at most 1/MARGIN
MAX_SENTENCE_SECONDS = 600.0      # the most audio one sentence may make (so one sentence's memory is bounded)
FADE_SECONDS = 0.005              # each stretch of speech fades in and out over this (fade_edges)
MAX_SENTENCE_CHARACTERS = 20_000  # a sentence's text at most: a longer one is refused before the front end
FRONT_END_CHARACTERS = 1000       # the text of one front-end call at most (more only where it cannot be cut)
SOONER = "; end sentences sooner (. ! ?)"
EXPORT_FORMAT = 1  # export.json's layout: bump whenever its fields or their meaning change (a newer one is refused)
VERIFIED = ("saved_model",)   # what a voice loads: its files must be those export.json's `files` lists
# what wrote the folder: `snakemake export` (runs/{name}/export) or `pipeline.export --out DIR` (anywhere)
EXPORT_AGAIN = "snakemake --cores all export; a folder written with --out: python -m pipeline.export --config CONFIG --out DIR"
AGAIN = f"export the voice again ({EXPORT_AGAIN})"
_FRONT_END = threading.Lock()     # espeak-ng (through phonemizer) is one library state per process
# where phonemizer cuts a cleaned text to read each side alone: a run of its punctuation marks (a , or .
# between digits is not one)
_CUT = re.compile(r"(?:\s*(?:[%s]|(?<![0-9])[,.]|[,.](?![0-9]))+\s*)+"
                  % re.escape("".join(c for c in text._PUNCTUATION_MARKS if c not in ",.")))
# clause punctuation between words: where an over-long sentence is split first
_CLAUSE = re.compile(r"(?<=[,;:—…])\s+")


def quick_start():
    """Turn TensorFlow's graph optimizer (Grappler) off in this process when no GPU is visible.

    For a process that loads a voice, speaks and exits (`speak`). It is process-wide, so call it
    before the voice loads. On the CPU, Grappler's passes over the voice's graph were most of its
    first call: 0.6-1.1 s without them, 2.0-2.3 s with them. The audio was the same to ~1e-4 of its
    peak, and `speak --raw`'s real-time factor the same. Under the server's load each request took
    ~5 % more CPU without them, so `serve`, which loads once and runs for long, keeps Grappler
    (benchmarks/RESULTS.md, "A voice without Grappler"). With a GPU, TensorFlow's default stays:
    its layout and fusion passes are for GPU kernels, and none was measured here. -> whether it
    turned Grappler off."""
    import tensorflow as tf
    if tf.config.list_physical_devices("GPU"):
        return False
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    return True


class VoiceError(PipelineError):
    """A voice folder, text or option the voice cannot take; one line naming it."""


class TooLong(VoiceError):
    """Text that would make more audio than a sentence (MAX_SENTENCE_SECONDS) or the request (its
    max_seconds) may: refused before that audio is made. `whole`: the request's bound, not a sentence's
    (serve answers both with 413; a stream has no bound of the whole)."""

    def __init__(self, message, whole=False):
        super().__init__(message)
        self.whole = whole


class NothingToSay(VoiceError):
    """Text whose every sentence says nothing (punctuation, pauses alone): refused, streamed or not."""


class VoiceFault(VoiceError):
    """The voice's graph gave audio that cannot be played (NaN or infinite samples): the export is
    broken, not the request. serve answers it with 500, not 400."""


@dataclass
class Request:
    """What to say: sentences, each a list of ("pause", seconds) and ("speech", symbols, pace, pitch)
    parts (the first `ready` of them; the rest, lazy, markup sentences made into parts as each is
    said), the speaker / language inputs of the signature, and the front end's language, pace and
    pitch shift."""
    sentences: list
    inputs: dict = field(default_factory=dict)
    language: str = ""
    pace: float = 1.0
    pitch_shift: float = 0.0
    ready: int = 0
    max_samples: int | None = None   # the most audio the whole request may make (None: no bound)


def fade_edges(audio, sample_rate, seconds=FADE_SECONDS):
    """A copy of float32 `audio` whose first and last `seconds` fade in and out (a raised cosine; at most
    half of it each): where speech meets silence or other speech it starts and ends at 0, not mid-wave."""
    audio = np.array(audio, np.float32)
    n = min(len(audio) // 2, int(round(seconds * sample_rate)))
    if n:
        ramp = (0.5 - 0.5 * np.cos(np.pi * (np.arange(n) + 0.5) / n)).astype(np.float32)
        audio[:n] *= ramp
        audio[len(audio) - n:] *= ramp[::-1]
    return audio


def symbols_digest(symbols):
    """export.json's `vocab_digest`: a digest of vocab.json's symbols in id order, so a vocab.json of the
    same size but another order (ids that would speak other phonemes) is refused at load."""
    return hashlib.sha256(json.dumps(list(symbols), ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _files(folder, names):
    """Every file under each of `names` (a file or a folder) in `folder`, sorted."""
    tops = [Path(folder) / name for name in names]
    return sorted(p for top in tops for p in ([top] if top.is_file() else top.rglob("*")) if p.is_file())


def file_digests(folder, names):
    """export.json's `files`: {path under `folder` ("saved_model/saved_model.pb"): {"bytes", "sha256"}} of every
    file under each of `names` there."""
    return {path.relative_to(folder).as_posix(): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
            for path in _files(folder, names)}


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def export_format(meta, where):
    """export.json's `format`, None for an export from before it (its files are not verified); VoiceError
    naming `where` unless it is an integer in 1..EXPORT_FORMAT."""
    found = meta.get("format") if isinstance(meta, dict) else None
    if found is not None and (isinstance(found, bool) or not isinstance(found, int) or found < 1):
        raise VoiceError(f"{where}: format {str(found)[:40]!r} is not an integer in 1..{EXPORT_FORMAT}; {AGAIN}")
    if found is not None and found > EXPORT_FORMAT:
        raise VoiceError(f"{where}: format {found}, newer than this code reads ({EXPORT_FORMAT}); speak it with "
                         f"the code that exported it, or export it again with this code ({EXPORT_AGAIN})")
    return found


def check_files(folder, meta, names=VERIFIED):
    """VoiceError naming the first file under `names` that is not what export.json's `files` says export
    wrote there (missing, another size or sha256, or one it did not write): a saved_model/ copied in from
    another export (another vocabulary, sample rate, speakers) or edited would load and speak wrongly."""
    folder, listed = Path(folder), meta.get("files")
    if not (isinstance(listed, dict) and all(isinstance(v, dict) and {"bytes", "sha256"} <= set(v)
                                             for v in listed.values())):
        raise VoiceError(f"{folder / 'export.json'}: files {json.dumps(listed)[:40]} is not "
                         f"{{path: {{bytes, sha256}}}}; {AGAIN}")
    want = {path: v for path, v in listed.items() if path.split("/")[0] in names}
    # a hidden file export did not list (a file browser's .DS_Store, ._x) is litter TensorFlow never reads
    sizes = {rel: p.stat().st_size for p in _files(folder, names)
             if (rel := p.relative_to(folder).as_posix()) in want or not p.name.startswith(".")}

    def changed(path, what):
        return VoiceError(f"{folder / path}: {what} (export.json files): {path.split('/')[0]} was replaced or "
                          f"changed since it was exported; {AGAIN}")
    for path in sorted(want.keys() | sizes.keys()):   # what is there and its size first: no file read
        if path not in sizes or path not in want:
            raise changed(path, "missing" if path not in sizes else "a file export did not write")
        if sizes[path] != want[path]["bytes"]:
            raise changed(path, f"{sizes[path]} bytes, not the {want[path]['bytes']} export wrote")
    for path in sorted(want):
        if _sha256(folder / path) != want[path]["sha256"]:
            raise changed(path, "its sha256 is not the one export wrote")


def _read_json(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise VoiceError(f"{path}: not found; --voice takes an export folder (runs/{{name}}/export, made by "
                         "`snakemake --cores all export`)") from None
    except (OSError, ValueError) as e:
        raise VoiceError(f"{path}: cannot be read ({e})") from None


def check_number(name, value, low, high):
    """value as a float when it is a finite number in [low, high], else VoiceError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise VoiceError(f"{name}: a number, not {value!r}")
    try:
        number = float(value)
    except OverflowError:            # an integer of hundreds of digits: no float holds it
        raise VoiceError(f"{name}: a {len(str(abs(value)))}-digit number is out of range ({low:g}..{high:g})") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise VoiceError(f"{name}: {value!r} is outside {low:g}..{high:g}")
    return number


def check_text(source):
    """VoiceError naming the first character of `source` that UTF-8 cannot encode (a lone UTF-16
    surrogate, as JSON's "\\udce9" or undecodable bytes in a command line give): the front end
    (espeak-ng) and every answer take UTF-8 text only."""
    try:
        source.encode("utf-8")
    except UnicodeEncodeError as e:
        raise VoiceError(f"{markup.locator(source)(e.start)}: {source[e.start]!r} is not a character (a lone "
                         "surrogate); the text must be valid Unicode (UTF-8)") from None


def split_symbols(symbols, limit):
    """Pieces of at most `limit` symbols that join back into `symbols`: split after clause punctuation
    first, then between words, a single word over the limit anywhere."""
    symbols = symbols.strip()
    if len(symbols) <= limit:
        return [symbols] if symbols else []
    units = []
    for clause in _CLAUSE.split(symbols):
        if len(clause) <= limit:
            units.append(clause)
            continue
        words = [w[i:i + limit] for w in clause.split() for i in range(0, len(w), limit)]
        units += _pack(words, limit)
    return _pack(units, limit)


def front_end_pieces(line, cleaners, size=FRONT_END_CHARACTERS):
    """[(piece, what joins its symbols to the next's)] of a text longer than `size` characters: the text
    cleaned (the front end cleans each piece again, which changes nothing) and cut into pieces of at
    most `size` characters (or one run that cannot be cut), only after a run of punctuation, where
    phonemizer cuts the text and reads each side alone anyway, so the pieces say what the text says.
    phonemizer's cost is quadratic in one call's punctuation (it splits and joins the whole text at
    each mark): so it stays linear. A text holding a number text.problem refuses is left whole."""
    if len(line) <= size or text.longest_number(line) > text.MAX_DIGITS:
        return [(line, "")]
    line = text.clean_text(line, cleaners)
    pieces, start, last = [], 0, 0
    for cut in [m.end() for m in _CUT.finditer(line) if 0 < m.start() and m.end() < len(line)] + [len(line)]:
        if cut - start > size and last > start:
            pieces.append(line[start:last])
            start = last
        last = cut
    pieces.append(line[start:])
    return [(piece, " " if piece[-1].isspace() else "") for piece in pieces]


def _batches(texts, size):
    """`texts` in runs of consecutive ones of at most `size` characters together (a longer one alone)."""
    batch, length = [], 0
    for line in texts:
        if batch and length + len(line) > size:
            yield batch
            batch, length = [], 0
        batch.append(line)
        length += len(line)
    if batch:
        yield batch


def _joined(said):
    """One text's symbols from its pieces' [(symbols, joint)]: a piece that says nothing adds nothing."""
    out, joint = "", ""
    for symbols, after in said:
        if symbols:
            out, joint = out + (joint if out else "") + symbols, after
        else:
            joint = joint or after
    return out


def _pack(units, limit):
    out = []
    for unit in units:
        if out and len(out[-1]) + 1 + len(unit) <= limit:
            out[-1] = f"{out[-1]} {unit}"
        else:
            out.append(unit)
    return out


def halves(symbols):
    """Two pieces split at the word boundary nearest the middle, else (one word) between the symbols
    nearest the middle; None for a single symbol."""
    middle, spaces = len(symbols) / 2, [i for i, c in enumerate(symbols) if c == " "]
    if spaces:
        cut = min(spaces, key=lambda i: abs(i - middle))
        return [symbols[:cut].strip(), symbols[cut + 1:].strip()]
    if len(symbols) < 2:
        return None
    return [symbols[:len(symbols) // 2], symbols[len(symbols) // 2:]]


def _reason(e):
    """The informative line of an exception's message (TensorFlow's start with "Graph execution error")."""
    skip = ("Graph execution error", "Detected at node", "<stack traces", "Traceback")
    lines = [line.strip() for line in str(e).splitlines() if line.strip() and not line.strip().startswith(skip)]
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}".rstrip(": ")


class Voice:
    """An export folder loaded: `prepare` text, then `sentences_audio` (a generator) or `audio`."""

    def __init__(self, folder, log=None, speaker=None, language=None, grappler=True, items=None, pace=1.0,
                 pitch_shift=0.0):
        """speaker, language: names a caller will ask for, checked against export.json before the model
        loads (a typo costs a fraction of a second, not the load); items (markup.parse's), with pace and
        pitch_shift: text a caller will ask for, its phonemes and prosody checked then too (check_items).
        grappler=False: quick_start() just before the model loads (a process that loads a voice, speaks
        and exits); self.grappler says whether Grappler stayed on. self.load_seconds: from TensorFlow imported to the voice ready."""
        folder = self.folder = Path(folder)
        self.meta, self.vocab = _read_json(folder / "export.json"), _read_json(folder / "vocab.json")
        if not (folder / "saved_model").is_dir():
            raise VoiceError(f"{folder / 'saved_model'}: not found; {AGAIN}")
        self.verified = export_format(self.meta, folder / "export.json") is not None   # before its other fields
        if self.verified:
            check_files(folder, self.meta)
        self.sample_rate, self.max_seconds, self.max_samples = self._read_settings()
        if not self.verified:   # once, at load
            (log or (lambda *a: None))(f"note: {folder / 'export.json'}: no format, an export from before its files' "
                                       f"digests: saved_model/ loads unverified; {AGAIN} to have it checked")
        self.max_tokens = self._read_token_settings()
        self.max_sentence_samples = int(MAX_SENTENCE_SECONDS * self.sample_rate)
        self.symbols = [s for s in self.vocab["symbols"] if s not in (text.PAD, text.EOS)]
        self.speakers = list(self.meta.get("speakers") or [])
        self.languages = list(self.meta.get("languages") or [])
        self._check_names(speaker, language)
        if items is not None:
            self.check_items(items, pace, pitch_shift)
        import tensorflow  # noqa: F401  here, after every check the folder's files allow (module docstring)
        t0 = time.perf_counter()
        self.grappler = grappler or not quick_start()
        self.model, self._fn = self._load(folder / "saved_model")
        self._inputs = set(self._fn.structured_input_signature[1])
        self._check_vocabulary()  # its size first (the more telling message), then its order
        digest = self.meta.get("vocab_digest")
        if digest is not None and digest != symbols_digest(self.vocab["symbols"]):
            raise VoiceError(f"{folder / 'vocab.json'}: its symbols are not the ones this model was exported "
                             "with (export.json vocab_digest); export the voice again")
        self._sps = self._seconds_per_symbol()   # also the graph's one-time start, here rather than in a request
        self.load_seconds = time.perf_counter() - t0
        if self.vocab.get("frontend") == "phonemes" and self.vocab.get("espeak") not in (None, text.espeak_version()):
            (log or (lambda *a: None))(f"espeak-ng {text.espeak_version()} phonemizes the text; the voice was "
                                       f"trained on {self.vocab['espeak']}: some words may sound different")

    def _read_settings(self):
        """(sample_rate, max_seconds, max_samples) from export.json, each a finite number in a sane range,
        and vocab.json's symbols, eos id and front end: VoiceError naming the file and the value otherwise."""
        meta, vocab, where = self.meta, self.vocab, self.folder / "export.json"

        def setting(table, key, low, high, integer=False):
            value = table[key]   # NaN / Infinity (JSON allows them) and a huge integer are refused, not converted
            ok = isinstance(value, int) and not isinstance(value, bool) or (
                isinstance(value, float) and math.isfinite(value) and (not integer or value.is_integer()))
            if not ok or not low <= value <= high:
                kind = "an integer" if integer else "a number"
                shown = repr(value) if len(repr(value)) <= 40 else f"a {len(repr(value))}-character value"
                raise VoiceError(f"{where}: {key} {shown} is not {kind} in {low:g}..{high:g}; export the voice again")
            return int(value) if integer else float(value)
        try:
            if not isinstance(meta, dict) or not isinstance(meta.get("audio"), dict):
                raise TypeError("an object with `audio`")
            rate = setting(meta, "sample_rate", 1000, 192_000, integer=True)
            if meta["audio"].get("sample_rate", rate) != rate:   # one edited by hand: which rate is the voice's?
                raise VoiceError(f"{where}: sample_rate {rate} is not audio.sample_rate "
                                 f"{meta['audio']['sample_rate']!r}; export the voice again")
            for names in ("speakers", "languages"):   # a string would be read as a list of its characters
                table = meta.get(names)
                if table is not None and not (isinstance(table, list) and len(set(map(repr, table))) == len(table)
                                              and all(isinstance(n, str) and n.strip() for n in table)):
                    raise VoiceError(f"{where}: {names} {json.dumps(table)[:80]} is not a list of distinct names; "
                                     "export the voice again")
            hop = setting(meta["audio"], "hop_length", 1, rate, integer=True)
            seconds = setting(meta, "max_seconds", 1e-3, 3600)
            # export writes ceil(max_seconds * rate / hop): the bound is that of 3600 s
            frames = (setting(meta, "max_frames", 1, math.ceil(3600 * rate / hop), integer=True) if meta.get("max_frames")
                      is not None else int(seconds * rate / hop))
            symbols = vocab["symbols"]
            if not (isinstance(symbols, list) and symbols and all(isinstance(s, str) and len(s) == 1 for s in symbols)
                    and isinstance(vocab["eos_id"], int) and 0 <= vocab["eos_id"] < len(symbols)
                    and all(isinstance(vocab[k], (str, list)) for k in ("frontend", "language", "cleaners"))):
                raise TypeError(f"{self.folder / 'vocab.json'}: a vocabulary (symbols, eos_id, frontend, language, "
                                "cleaners)")
            if vocab["frontend"] not in text.FRONTENDS:
                raise TypeError(f"{self.folder / 'vocab.json'}: frontend {vocab['frontend']!r}, not one of "
                                f"{', '.join(text.FRONTENDS)}")
        except KeyError as e:
            raise VoiceError(f"{self.folder}: export.json / vocab.json lack {e}; export the voice again") from None
        except (TypeError, AttributeError) as e:
            raise VoiceError(f"{self.folder}: export.json / vocab.json are not what an export writes ({e}); "
                             "export the voice again") from None
        if frames < 1:
            raise VoiceError(f"{where}: max_seconds {seconds:g} is shorter than one frame; export the voice again")
        return rate, seconds, frames * hop

    def _read_token_settings(self):
        """export.json's max_tokens (None in an export from before it): VoiceError naming the file otherwise."""
        where = self.folder / "export.json"
        most = self.meta.get("max_tokens")
        if most is not None and not (isinstance(most, int) and not isinstance(most, bool) and 2 <= most <= 2**31 - 1):
            raise VoiceError(f"{where}: max_tokens {most!r} is not an integer in 2..{2**31 - 1}; export the voice again")
        return most

    def _load(self, path):
        """(model, its `synthesize` signature) of the SavedModel at `path`; VoiceError naming what is wrong."""
        import tensorflow as tf
        try:
            model = tf.saved_model.load(str(path))
        except Exception as e:   # no variables/, an empty or damaged saved_model.pb, an empty folder
            raise VoiceError(f"{path}: cannot be loaded ({_reason(e)}); export the voice again") from None
        fn = getattr(model, "signatures", {}).get("synthesize")
        needs = {"tokens", "pace", "pitch_shift"}
        if fn is None or not needs <= set(fn.structured_input_signature[1]):
            raise VoiceError(f"{path}: no `synthesize` signature taking {', '.join(sorted(needs))}; "
                             "export the voice again")
        return model, fn

    def _check_vocabulary(self):
        """Refuse a vocab.json whose size is not the model's: its last id must be taken, and the graph's
        check on an id far outside (an export's assertion names the model's ids) must agree."""
        import tensorflow as tf
        n, eos = len(self.vocab["symbols"]), self.vocab["eos_id"]
        inputs = self._voice_inputs(None, None)[0]
        for probe in (n - 1, 2**31 - 1):
            try:
                self._fn(tokens=tf.constant([[probe, eos]], tf.int32), pace=tf.constant(1.0, tf.float32),
                         pitch_shift=tf.constant(0.0, tf.float32), **inputs)
                continue
            except tf.errors.InvalidArgumentError as e:
                found = re.search(r"outside the vocabulary \(0\.\.(\d+)|is not in \[0, (\d+)\)", str(e))
                model = (int(found.group(1)) + 1 if found.group(1) else int(found.group(2))) if found else None
                if probe == n - 1 or (model is not None and model != n):
                    raise VoiceError(f"{self.folder / 'vocab.json'}: {n} symbols, but the model takes "
                                     f"{model if model is not None else 'fewer'}; export the voice again") from None
            except tf.errors.OpError as e:
                raise VoiceError(f"{self.folder / 'saved_model'}: fails on a test call ({_reason(e)}); "
                                 "export the voice again") from None

    def _seconds_per_symbol(self):
        """Seconds of audio per symbol at pace 1 on CALIBRATION (or as much of it as max_frames holds), times
        MARGIN (at least 10 ms)."""
        inputs, language = self._voice_inputs(None, None)
        symbols = self._front_end([CALIBRATION], language)[0] or " ".join(self.symbols[:40])
        while True:
            samples = len(self._call(symbols, 1.0, 0.0, inputs))
            if samples < self.max_samples or not halves(symbols):
                return MARGIN * max(samples / self.sample_rate / len(symbols), 0.01)
            symbols = halves(symbols)[0]                   # cut at max_frames: measure on its first half

    def describe(self):
        """{"speakers", "languages", "sample_rate"} (a voice of one speaker: its name, or [])."""
        return {"speakers": self.speakers, "languages": self.languages or [self.vocab.get("language")],
                "sample_rate": self.sample_rate}

    def _check_names(self, speaker, language):
        """VoiceError for a speaker or language name (None: the default) this voice does not have -> its languages."""
        if speaker is not None and speaker not in self.speakers:
            known = ", ".join(self.speakers) or "none: it has one speaker"
            raise VoiceError(f"speaker: unknown speaker {speaker!r}; this voice's speakers: {known}")
        known = self.languages or [self.vocab["language"]]
        if language is not None and language not in known:
            raise VoiceError(f"language: unknown language {language!r}; this voice's languages: {', '.join(known)}")
        return known

    def _voice_inputs(self, speaker, language):
        """(signature inputs, front-end language) for a speaker / language name (None: the default)."""
        import tensorflow as tf
        known = self._check_names(speaker, language)
        if language is None:
            language = self.vocab["language"] if self.vocab["language"] in known else known[0]
        ids = {"speaker": self.speakers.index(speaker) if speaker is not None else 0,
               "language": self.languages.index(language) if self.languages else 0}
        return {k: tf.constant(v, tf.int32) for k, v in ids.items() if k in self._inputs}, language

    def prepare(self, source, *, ssml=None, pace=1.0, pitch_shift=0.0, speaker=None, language=None, lazy=False,
                max_seconds=None, max_pause_seconds=None):
        """A Request for marked-up text (pipeline/markup.py). Every check (options, markup, unknown
        phonemes, prosody out of range, text the front end cannot say) is made here, before any
        audio; lazy=True leaves the front end (espeak-ng, ~2-10 ms a sentence) to each sentence after
        the first that says something as it is said, so a stream starts at once however long the
        text, refuses up front what the whole answer would (nothing to say, a first sentence the front
        end cannot say), and a later sentence the front end cannot say stops it there. Length: TooLong
        for a sentence whose pauses (lazy) or estimated audio (estimate_seconds) exceed
        MAX_SENTENCE_SECONDS, or a request whose estimate exceeds `max_seconds` (None: no bound on
        the whole); sentences_audio holds every sentence to the same bounds as it speaks. TooLong too for
        <break> pauses over `max_pause_seconds` in all (None: no bound), known before any audio: a
        stream's speech, and the pause before each paragraph, grow with its text (at most 0.5 s for a
        paragraph of a few bytes), but a <break> of 10 s takes 26 bytes."""
        check_text(source)
        pace = check_number("pace", pace, *PACE_RANGE)
        pitch_shift = check_number("pitch_shift", pitch_shift, *PITCH_RANGE)
        inputs, language = self._voice_inputs(speaker, language)
        items = markup.parse(source, ssml)
        paused = sum(i.seconds for i in items if isinstance(i, markup.Pause))   # <break>s, not paragraphs' pauses
        sentences = markup.sentences(items)
        for n, sentence in enumerate(sentences, 1):    # before the front end, whose work grows with it
            length = sum(len(i.text.strip()) for i in sentence if isinstance(i, markup.Speech))
            if length > MAX_SENTENCE_CHARACTERS:
                raise TooLong(f"sentence {n}: {length} characters, over the {MAX_SENTENCE_CHARACTERS} one sentence "
                              f"may hold{SOONER}")
        self.check_items((i for s in sentences for i in s), pace, pitch_shift)
        bound = None if max_seconds is None else int(max_seconds * self.sample_rate)
        request = Request(sentences, inputs, language, pace, pitch_shift, max_samples=bound)
        request.sentences, request.ready = self._lead(sentences, request, lazy)
        ready, later = request.sentences[:request.ready], request.sentences[request.ready:]
        if not any(part[0] == "speech" for parts in ready for part in parts):
            raise NothingToSay("no text to speak" if not source.strip() else f"{source.strip()[:40]!r}: nothing to say")
        seconds = ([self.estimate_seconds(parts) for parts in ready]
                   + [sum(i.seconds for i in s if isinstance(i, markup.Pause)) for s in later])
        longest, most = max(range(len(seconds)), key=seconds.__getitem__), self.max_sentence_samples / self.sample_rate
        if seconds[longest] > most:
            raise TooLong(f"sentence {longest + 1}: over the {most:g} s of audio one sentence may "
                          f"make (about {seconds[longest]:.0f} s){SOONER}")
        if max_pause_seconds is not None and paused > max_pause_seconds:
            raise TooLong(f"{paused:.0f} s of pauses (<break>) in all, over the {max_pause_seconds:g} s one request "
                          "may hold")
        if max_seconds is not None and sum(seconds) > max_seconds:
            raise TooLong(f"over the {max_seconds:g} s of audio one request may make (about {sum(seconds):.0f} s)",
                          whole=True)
        return request

    def _lead(self, sentences, request, lazy):
        """(sentences, how many of them, from the first, are parts): all made into parts, or (lazy) those up
        to the first that says something, in batches of 1, 2, 4 ... (one front-end call each), the rest
        left as markup sentences. A sentence of no parts (punctuation alone) is left out."""
        ready, start, size = [], 0, len(sentences) if not lazy else 1
        while start < len(sentences) and (not lazy or not any(p[0] == "speech" for s in ready for p in s)):
            ready += [parts for parts in self._parts(sentences[start:start + size], request) if parts]
            start, size = start + size, 2 * size
        return ready + sentences[start:], len(ready)

    def _parts(self, sentences, request):
        """Each markup sentence as parts: ("pause", seconds) and ("speech", symbols, pace, pitch), one
        speech part per run of one prosody (one front-end call for all of them)."""
        plain = [i for s in sentences for i in s if isinstance(i, markup.Speech) and not i.phonemes]
        symbols = dict(zip(plain, self._front_end([i.text for i in plain], request.language)))
        out = []
        for sentence in sentences:
            parts = []
            for item in sentence:
                if isinstance(item, markup.Pause):
                    parts.append(("pause", item.seconds))
                    continue
                said = item.text if item.phonemes else symbols[item]
                p, q = request.pace * item.rate, request.pitch_shift + item.pitch
                if not said:
                    continue
                if parts and parts[-1][0] == "speech" and parts[-1][2:] == (p, q):
                    parts[-1] = ("speech", f"{parts[-1][1]} {said}", p, q)
                else:
                    parts.append(("speech", said, p, q))
            out.append(parts)
        return out

    def _front_end(self, texts, language):
        """The symbols of each plain text ("" for punctuation alone); VoiceError for text it cannot say (a
        sentence that gives no symbols for a reason, as a number too long to read, is refused, not skipped)."""
        cfg = {"frontend": self.vocab["frontend"], "language": language, "cleaners": self.vocab["cleaners"]}
        pieces = [(n, piece, joint) for n, line in enumerate(texts)   # to_symbols cuts long words (text.cut_long_words)
                  for piece, joint in front_end_pieces(line, cfg["cleaners"])]
        said = []
        for batch in _batches([piece for _, piece, _ in pieces], FRONT_END_CHARACTERS):   # bounded calls
            with _FRONT_END:
                said += [symbols for symbols, _ in text.to_symbols(batch, cfg)]
        lines = [[] for _ in texts]
        for (n, _, joint), symbols in zip(pieces, said):
            lines[n].append((symbols, joint))
        silent = text.problem("", "", cfg)     # problem()'s reason for a line that passes all but having a sound
        out = []
        for line, symbols in zip(texts, map(_joined, lines)):
            reason = text.problem(line, symbols, cfg)
            if reason and reason != silent:
                raise VoiceError(f"{line.strip()[:60]!r}: {reason}")
            out.append("" if reason else symbols)
        return out

    def check_items(self, items, pace, pitch_shift):
        """VoiceError for markup items this voice cannot say: inline phonemes outside its symbols (vocab.json),
        a prosody rate or pitch that takes the pace or pitch shift out of range. Needs no TensorFlow."""
        for item in (i for i in items if isinstance(i, markup.Speech)):
            if item.phonemes:
                self._check_phonemes(item)
            check_number(f"{item.where}: pace {pace:g} x prosody rate {item.rate:g}", pace * item.rate, *PACE_RANGE)
            check_number(f"{item.where}: pitch shift {pitch_shift:g} + prosody pitch {item.pitch:g}",
                         pitch_shift + item.pitch, 2 * PITCH_RANGE[0], 2 * PITCH_RANGE[1])

    def _check_phonemes(self, item):
        known = set(self.symbols)
        unknown = sorted({c for c in item.text if c not in known})
        if unknown:
            raise VoiceError(f"{item.where}: phoneme(s) {' '.join(unknown)} not in this voice's symbols (vocab.json): "
                             f"{' '.join(s for s in self.symbols if s != ' ')}")
        return item.text

    def _call(self, symbols, pace, pitch, inputs):
        """One graph call -> float32 audio [N]."""
        import tensorflow as tf
        tokens = tf.constant([text.ids_of(symbols, self.vocab)], tf.int32)
        try:
            out = self._fn(tokens=tokens, pace=tf.constant(pace, tf.float32),
                           pitch_shift=tf.constant(pitch, tf.float32), **inputs)
        except tf.errors.OpError as e:   # the graph refused what vocab.json and export.json let through
            raise VoiceFault(f"{self.folder / 'saved_model'}: the graph failed on {symbols[:40]!r} ({_reason(e)}); "
                             "export the voice again") from None
        audio = out["audio"][0].numpy()
        bad = int(np.count_nonzero(~np.isfinite(audio)))
        if bad:  # played as silence or clipped noise before: say so instead
            raise VoiceFault(f"{self.folder / 'saved_model'}: non-finite audio ({bad} of {audio.size} samples) for "
                             f"{symbols[:40]!r} at pace {pace:g}, pitch shift {pitch:g}; export the voice again")
        return audio

    def _speech(self, symbols, pace, pitch, inputs):
        """float32 audio of one run of symbols, piece by piece, split so no call reaches max_frames: a piece
        whose audio reached it is said again in two (between words, else between symbols); a single
        symbol that reaches it is an error. Audio that reached max_frames was cut, and is never kept."""
        limit = max(4, int(self.max_seconds * pace / self._sps))
        limit = min(limit, self.max_tokens - 1) if self.max_tokens else limit   # EOS comes after: the graph's bound
        queue = split_symbols(symbols, limit)
        while queue:
            piece = queue.pop(0)
            audio = self._call(piece, pace, pitch, inputs)
            if len(audio) >= self.max_samples:   # cut at max_frames: say it in two
                if not halves(piece):
                    raise VoiceError(f"{piece!r}: one symbol makes {self.max_seconds:g} s of audio or more (the "
                                     f"voice's max_seconds) at pace {pace:g}; ask for a faster pace")
                queue[:0] = halves(piece)
                continue
            yield audio

    def estimate_seconds(self, parts):
        """A low estimate of a prepared sentence's audio, in seconds, made before any of it: its pauses
        exactly, its speech at the voice's measured seconds per symbol (without MARGIN) less MARGIN again,
        so a sentence refused on it would surely have been too long."""
        speech = sum(len(p[1]) / p[2] for p in parts if p[0] == "speech") * self._sps / MARGIN ** 2
        return sum(p[1] for p in parts if p[0] == "pause") + speech

    def _bound(self, request, made):
        """(most samples the next sentence may make, what its TooLong says, whether it is the request's bound)."""
        if request.max_samples is not None and request.max_samples - made < self.max_sentence_samples:
            return (request.max_samples - made,
                    f"over the {request.max_samples / self.sample_rate:g} s of audio one request may make", True)
        most = self.max_sentence_samples
        return most, f"over the {most / self.sample_rate:g} s of audio one sentence may make", False

    def sentence_float(self, parts, inputs, limit=None, over=None, whole=False):
        """float32 audio of one prepared sentence, each stretch of speech faded in and out; TooLong (`over`,
        `whole`) as soon as it would make more than `limit` samples (default MAX_SENTENCE_SECONDS'), so no
        sentence holds more than that in memory."""
        limit = self.max_sentence_samples if limit is None else limit
        out, made = [], 0

        def keep(n):
            nonlocal made
            made += n
            if made > limit:
                raise TooLong((over or f"over the {limit / self.sample_rate:g} s of audio one sentence may make")
                              + ("" if whole else SOONER), whole=whole)
        for part in parts:
            if part[0] == "pause":
                keep(int(round(part[1] * self.sample_rate)))         # counted before it is made
                out.append(np.zeros(int(round(part[1] * self.sample_rate)), np.float32))
            else:
                for audio in self._speech(part[1], part[2], part[3], inputs):
                    keep(len(audio))
                    out.append(fade_edges(audio, self.sample_rate))
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def sentences_float(self, request):
        """float32 audio per sentence, each as soon as it is made, peaks over 1 limited to 0.95 (limit_peaks);
        TooLong for a sentence over MAX_SENTENCE_SECONDS, or (request.max_samples) a request over its
        bound, before its audio is kept."""
        made = 0
        for n, sentence in enumerate(request.sentences):
            parts = sentence if n < request.ready else self._parts([sentence], request)[0]
            if parts:
                limit, over, whole = self._bound(request, made)
                if self.estimate_seconds(parts) * self.sample_rate > limit:    # before any audio: refuse now
                    raise TooLong(f"{over} (about {self.estimate_seconds(parts):.0f} s){'' if whole else SOONER}",
                                  whole=whole)
                audio = self.sentence_float(parts, request.inputs, limit, over, whole)
                made += len(audio)
                yield limit_peaks(audio, self.sample_rate)

    def sentences_audio(self, request):
        """int16 audio per sentence, each as soon as it is made (sentences_float: peaks limited)."""
        for audio in self.sentences_float(request):
            yield to_pcm(audio, self.folder)

    def audio(self, request):
        """All of a request's audio, int16: its sentences_audio joined."""
        return to_pcm(np.concatenate(list(self.sentences_float(request))), self.folder)
