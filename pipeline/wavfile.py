"""Writing wav files: 16-bit mono PCM, atomically (pipeline/files.py), the path checked before any work.

Every command that writes audio writes it through here: synthesize, vocode, evaluate's listening
folder, speak and the server's responses. The standard library's `wave` and NumPy only, so the
exported voice's commands (pipeline/voice.py: TensorFlow alone) use it too.

    from pipeline import wavfile
    wavfile.check_path(args.out, "--out")           # before the model loads: a folder, a missing parent
    wavfile.save_wav(path, audio, sample_rate)      # float audio; audio that would clip is scaled to a 0.95 peak
    pcm = wavfile.to_pcm(audio)                     # the int16 samples save_wav writes (speak, serve)
    audio = wavfile.limit_peaks(audio, sample_rate) # peaks over 1 brought to 0.95, the rest as it is (the voice)
    wavfile.write_pcm(path, pcm, sample_rate)       # int16 samples as they are
    wavfile.stream_pcm(path, blocks, sample_rate)   # int16 blocks, each written as it comes (speak --out)
    body = wavfile.wav_bytes(pcm, sample_rate)      # a whole wav in memory (an HTTP response)

A full disk is one line naming the path (pipeline.errors.DiskFull) and leaves no temporary file;
audio with a NaN or infinite sample is refused (PipelineError naming the path), never written as noise;
so is audio a wav cannot hold (its sizes are 32-bit: 4 GiB, about 27 hours at 22050 Hz), before it is.
"""
import errno
import io
import os
import wave
from pathlib import Path

import numpy as np

from pipeline import files
from pipeline.errors import PipelineError

PEAK = 0.95          # audio that would clip is scaled to this peak before the 16-bit conversion
FULL_SCALE = 32768   # float x becomes floor(x * 32768), clipped to int16: libsndfile's (soundfile's) conversion
BLOCK = 1 << 18      # samples converted and written at a time: a long wav is never converted whole
LIMIT_SECONDS = 0.01  # limit_peaks: half its windows; the gain ramps over twice this on each side of a peak
MAX_DATA = 0xFFFFFFFF - 36  # bytes of samples a wav holds: its RIFF size (32 bits) counts them and 36 header bytes


# names of audio formats a wav written under them would pretend to be
OTHER_AUDIO = {"mp3": "MP3", "flac": "FLAC", "ogg": "Ogg", "oga": "Ogg", "opus": "Opus", "m4a": "AAC", "aac": "AAC",
               "mp4": "MP4", "m4b": "AAC", "aif": "AIFF", "aiff": "AIFF", "wma": "WMA", "webm": "WebM", "au": "Sun audio",
               "caf": "CAF", "wv": "WavPack", "ape": "Monkey's Audio"}


def check_path(path, flag="--out"):
    """PipelineError naming `flag` unless `path` can become a wav file: not a folder (nor a path ending
    as one's does), a device, a pipe or a socket (files.target: a symbolic link is written through to
    its target; one that leads back to itself, on the way or at the end, is refused), the nearest existing
    parent of where it lands a writable folder (missing folders are made when it is written)."""
    if os.path.basename(os.fspath(path)) in ("", ".", ".."):   # "new/": Path() drops the "/": a file "new"
        raise PipelineError(f"{flag} {path}: a folder (a path ending in {os.sep}, . or ..); give the path of the "
                            ".wav to write")
    path = Path(path)
    _check_no_loop(path, flag)
    if path.is_dir():
        raise PipelineError(f"{flag} {path}: a folder; give the path of the .wav to write")
    written = files.target(path, flag)   # through a link: what is written is its target
    for name in dict.fromkeys((path, written)):
        kind = name.suffix.lower().lstrip(".")
        if kind in OTHER_AUDIO:   # hello.mp3 held a wav: a player or a tool that trusts the name fails on it
            raise PipelineError(f"{flag} {path}: this writes a 16-bit wav, not {OTHER_AUDIO[kind]}"
                                f"{'' if name == path else f' (into {name})'}; name it .wav (and convert it after, "
                                f"e.g. `ffmpeg -i out.wav out.{kind}`)")
    files.check_writable(path, flag, written.parent)


def _check_no_loop(path, flag):
    """PipelineError naming `flag`, `path` and the link when a symbolic link on the way to `path` (it, or
    a folder above it) leads back to itself: no file can be made there (`ln -s loop loop; --out loop/x.wav`
    failed at the write with a traceback; a link to itself was replaced by a file, where a shell's `>` refuses)."""
    if not _loops(path):
        return   # there, missing (made when written), or what the checks after this one say
    link = next((p for p in reversed((path, *path.parents)) if _loops(p)), path)
    raise PipelineError(f"{flag} {path}: {'it is' if link == path else f'{link} is'} a symbolic link that leads "
                        "back to itself; give the path of the .wav to write")


def _loops(path):
    """Whether following `path` runs into a symbolic link loop (ELOOP)."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _open(target, sample_rate):
    w = wave.open(target, "wb")
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(int(sample_rate))
    return w


def wav_bytes(pcm, sample_rate):
    """int16 samples as the bytes of a 16-bit mono wav."""
    out = io.BytesIO()
    with _open(out, sample_rate) as w:
        w.writeframes(np.ascontiguousarray(pcm, "<i2").tobytes())
    return out.getvalue()


def write_pcm(path, pcm, sample_rate):
    """int16 samples as a wav at `path`, atomically and durably (fsync before the rename)."""
    files.atomic_write_bytes(path, wav_bytes(pcm, sample_rate))


def stream_pcm(path, blocks, sample_rate, where=None):
    """int16 blocks (an iterable: a generator making them) as one wav at `path`, each block appended to
    the temporary file beside `path` as it comes, so only one is ever in memory; the wav's sizes are
    written at the end, then the file is renamed onto `path` (files.atomic_write: durable, and nothing
    at `path` changes, nor is a temporary file left, when the blocks raise, the disk fills or the run
    is stopped). The same bytes as write_pcm of the blocks joined. Audio a wav cannot hold (MAX_DATA)
    is a PipelineError naming `where` (default `path`) before its block is written. -> samples written."""
    written = 0

    def write(tmp):
        nonlocal written
        with open(tmp, "wb") as f, _open(f, sample_rate) as w:
            for block in blocks:
                data = np.ascontiguousarray(block, "<i2").tobytes()
                if 2 * written + len(data) > MAX_DATA:
                    hours = MAX_DATA / 2 / sample_rate / 3600
                    raise PipelineError(f"{where or path}: the audio passes 4 GiB, the most a wav holds (about "
                                        f"{hours:.1f} hours at {int(sample_rate)} Hz); nothing written; say the text "
                                        "in parts")
                w.writeframes(data)
                written += len(data) // 2
    files.atomic_write(path, write)
    return written


def limit_peaks(audio, sample_rate, seconds=LIMIT_SECONDS):
    """Flat float32 audio with its peaks over 1 brought down to PEAK by a smooth gain, the rest kept as it
    is: a look-ahead peak limiter. Its gain dips around each such peak, ramping over 2 x `seconds` on
    each side (slower than a voice's pitch period, so it does not distort it), and is 1 elsewhere, so a
    sentence that would clip keeps the loudness of the sentences beside it (scaling it whole would make
    it quieter). Audio peaking at 1 or less, or holding a NaN or an infinite sample (to_pcm refuses
    it), comes back unchanged. NumPy only, O(samples)."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    peak = _peak(audio)
    if not np.isfinite(peak) or peak <= 1.0:
        return audio
    h = max(1, int(round(seconds * sample_rate)))
    wanted = np.minimum(1.0, PEAK / np.maximum(np.abs(audio), 1e-30))            # the gain each sample needs
    lowest = _running_min(np.pad(wanted, 2 * h, constant_values=1.0), 2 * h + 1)   # [i]: over padded [i .. i + 2h]
    sums = np.zeros(len(lowest) + 1)
    np.cumsum(lowest, dtype=np.float64, out=sums[1:])
    del lowest
    gain = np.subtract(sums[2 * h + 1:2 * h + 1 + len(audio)], sums[:len(audio)])
    del sums
    gain /= 2 * h + 1                                 # the mean of 2h + 1 of them
    # each mean is over minima whose windows all hold the sample itself: never above the gain it needs,
    # exactly; the bound is kept after float rounding too (a running sum of ~1e7 loses a 1e-9 gain)
    np.minimum(gain, wanted, out=gain)
    out = (audio * gain).astype(np.float32)
    return np.clip(out, -PEAK, PEAK, out=out)         # float32 rounding gave 0.95000005


def _running_min(values, width):
    """[i] = min(values[i : i + width]) for each i where the window fits (van Herk / Gil-Werman: prefix
    and suffix minima of width-long blocks), in O(len(values))."""
    n = max(0, len(values) - width + 1)
    blocks = np.pad(values, (0, -len(values) % width), constant_values=np.inf).reshape(-1, width)
    prefix = np.minimum.accumulate(blocks, axis=1).ravel()
    suffix = np.minimum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
    return np.minimum(suffix[:n], prefix[width - 1:width - 1 + n])


def _peak(audio):
    """The largest |sample| of flat float audio, without a copy of it (NaN if any sample is NaN)."""
    return float(np.maximum(np.max(audio), -np.min(audio))) if audio.size else 0.0


def _scale(peaks, where):
    """What float audio of these peaks (its chunks') is multiplied by before its floor: FULL_SCALE, times
    PEAK / peak when the peak is over 1 (it would clip); PipelineError naming `where` for a NaN or
    infinite sample."""
    peaks = list(peaks)
    if not all(np.isfinite(p) for p in peaks):
        raise PipelineError(f"{where}: the audio has NaN or infinite samples; nothing written")
    peak = max(peaks, default=0.0)
    return np.float32(FULL_SCALE * (PEAK / peak if peak > 1.0 else 1.0))


def as_heard(audio):
    """Float audio (flat, finite) as a saved wav holds it: to_pcm's 16-bit samples over FULL_SCALE, what
    libsndfile reads back from evaluate_audio/ or speak --out. What every measure should take: the
    float signal's residue below one 16-bit step, where a recording holds digital silence, scored
    13-20 dB per frame in the mel-cepstral distance and moved the recognizer's transcripts."""
    return to_pcm(audio).astype(np.float32) / np.float32(FULL_SCALE)


def _pcm(audio, scale):
    """A block of float audio times `scale` as int16 samples (floored, clipped to int16's range)."""
    return np.clip(np.floor(audio * scale), -FULL_SCALE, FULL_SCALE - 1).astype("<i2")


def to_pcm(audio, where="audio"):
    """Float audio (any shape, flattened; or a list of such chunks, one utterance) as the int16 samples
    save_wav writes: audio that would clip (peak > 1) is scaled to a PEAK peak as one whole, quieter
    audio is kept as it is; PipelineError naming `where` for a NaN or infinite sample. Chunks are
    converted where they lie, a block at a time: no float copy of the whole utterance is made."""
    chunks = [np.asarray(c, dtype=np.float32).reshape(-1) for c in (audio if isinstance(audio, list) else [audio])]
    scale = _scale((_peak(c) for c in chunks), where)
    out, at = np.empty(sum(len(c) for c in chunks), "<i2"), 0
    for chunk in chunks:
        for start in range(0, len(chunk), BLOCK):          # converted a block at a time, as save_wav does
            block = chunk[start:start + BLOCK]
            out[at:at + len(block)] = _pcm(block, scale)
            at += len(block)
    return out


def save_wav(path, audio, sample_rate):
    """Float audio (any shape, flattened) as a 16-bit wav at `path`, atomically (temporary file, fsync,
    rename); audio that would clip (peak > 1) is scaled to a 0.95 peak, quieter audio is kept as it is."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    scale = _scale([_peak(audio)], path)

    def write(tmp):
        with open(tmp, "wb") as f:
            with _open(f, sample_rate) as w:
                for start in range(0, len(audio), BLOCK):
                    w.writeframes(_pcm(audio[start:start + BLOCK], scale).tobytes())
            f.flush()
            os.fsync(f.fileno())
    files.atomic_write(path, write)
