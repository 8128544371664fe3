"""Shard caches: the jobs that make token, mel (+ energy) and pitch shards, and the index over them.

Each job reads the manifest (pipeline/manifest.py), computes one shard's features and writes them
in the one shard format (pipeline/shards.py). Mel shards and their energy come from one STFT
(pipeline/audio.py), with the waveform cut to the mel's frame grid (audio shards); pitch from pipeline/pitch.py on the same frame grid; tokens from the text
front end (pipeline/text.py, one espeak-ng backend per job). Per-clip sums (`.stats.npy`) give
`index` the train split's mel, energy and voiced-pitch mean/std without a second pass. A job leaves
out, with its reason, each clip it cannot vouch for (audio: load_clip; text: text.problem and
dropped_words); `index` lists them all in rejected.tsv. With dataset.bad_audio `fail` it also records
the clips whose audio was left out, and every job that reads the index refuses (its job is the one
given that key: flipping it rebuilds no shard).

    python -m pipeline.cache tokens --config CFG --shard 3 --out cache/demo/tokens/shard-003
    python -m pipeline.cache mels   --config CFG --shard 3 --out cache/demo/mels/shard-003 --energy cache/demo/energy/shard-003 --audio cache/demo/audio/shard-003
    python -m pipeline.cache pitch  --config CFG --shard 3 --out cache/demo/pitch/shard-003
    python -m pipeline.cache index  --config CFG --out cache/demo/index.json   # every shard of the config's cache
    python -m pipeline.cache index  --config CFG --tokens T.. --mels M.. --energy-shards E.. --pitch P.. --out I
    python -m pipeline.cache check  --config CFG --out cache/demo/caches.json   # refuses an index with bad audio under `fail`

Config keys: dataset.*, cache.shards, text.* (tokens), audio.* (mels; pitch reads sample_rate and
hop_length), pitch.* (pitch).
"""
import argparse
import collections
import contextlib
import functools
import importlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
import types
import unicodedata
import zlib
from pathlib import Path

import numpy as np
import soundfile as sf

from pipeline import audio, config, files, manifest, pitch, shards, text
from pipeline.errors import PipelineError, cli

_print = functools.partial(print, flush=True)


def clip_speaker(ds, clip):
    """A clip's speaker name: its own (sources), else the single folder's name."""
    return clip.speaker or Path(ds["root"]).resolve().name


def _symbols_by_language(clips, text_cfg):
    """[(symbols, dropped)] per clip, each phonemized in its own language: one espeak-ng backend per
    language in this job (text.to_symbols keeps one per voice and process)."""
    out = [None] * len(clips)
    languages = sorted({c.language or text_cfg["language"] for c in clips})
    for language in languages:
        at = [i for i, c in enumerate(clips) if (c.language or text_cfg["language"]) == language]
        for i, result in zip(at, text.to_symbols([clips[i].text for i in at], {**text_cfg, "language": language})):
            out[i] = result
    return out, languages


SPOKEN_SYMBOLS = "&%+=@#‰‱"  # read out as words ("and", "percent", "per mille"), as are currency signs (Unicode Sc)


def dropped_words(line, symbols, text_cfg):
    """Why a line loses spoken characters to the characters front end (digits the cleaners leave, "&",
    "%", currency signs, ...: its audio says words its tokens lack, so no alignment fits); None when
    it drops only punctuation, or reads everything (phonemes: espeak-ng says them)."""
    if text_cfg["frontend"] != "characters":
        return None
    kept = set(symbols)
    lost = list(dict.fromkeys(c for c in text.clean_text(line, text_cfg["cleaners"]) if c not in kept and (
        unicodedata.category(c)[0] in "LN" or unicodedata.category(c) == "Sc" or c in SPOKEN_SYMBOLS)))
    if not lost:
        return None
    return (f"the characters front end drops {', '.join(map(repr, lost))}, which the audio says: write them out "
            f"in words (or use text.frontend: phonemes)")


def build_token_shard(cfg, shard, out, log=_print):
    ds = cfg["dataset"]
    clips = manifest.shard_manifest(ds, cfg["cache"]["shards"], shard, log=log)
    espeak = text.espeak_version() if cfg["text"]["frontend"] == "phonemes" else None
    ids, arrays, rejected, used, dropped, speakers, languages = [], [], [], set(), {}, [], []
    results, voices = _symbols_by_language(clips, cfg["text"])
    for c, (symbols, n_dropped) in zip(clips, results):
        text_cfg = {**cfg["text"], "language": c.language or cfg["text"]["language"]}
        reason = text.problem(c.text, symbols, text_cfg) or dropped_words(c.text, symbols, text_cfg)
        if reason:
            where = manifest.clip_where(ds, c)
            rejected.append(dict(id=c.id, path=where, stage="tokens", reason=f"text {text.shown(c.text)}: {reason}"))
            log(f"rejected {where}: {rejected[-1]['reason']}")
            continue
        ids.append(c.id)
        arrays.append(np.array([ord(s) for s in symbols + text.EOS], np.int32))  # code points, EOS last
        used.update(symbols)
        speakers.append(clip_speaker(ds, c))
        languages.append(c.language or cfg["text"]["language"])
        if n_dropped:
            dropped[c.id] = n_dropped
    meta = shards.write(out, "tokens", ids, arrays, provenance=shards.provenance("tokens", cfg, espeak=espeak),
                        rejected=rejected, symbols=sorted(used), dropped=dropped, espeak=espeak,
                        speakers=speakers, languages=languages)
    log(f"token shard {shard}: {len(ids)} clips, {sum(meta['lengths'])} symbols ({cfg['text']['frontend']}"
        f"{', espeak-ng ' + espeak if espeak else ''}; {', '.join(voices) or 'no'} voice(s)), {len(rejected)} rejected, "
        f"{sum(dropped.values())} characters dropped")


MAX_PEAK = 2.0  # full scale is 1; resampling a full-scale clip overshoots by a few percent at most
# Speech is there where a 20 ms frame, its own mean removed (DC offset), has an RMS of at least -60 dBFS.
# espeak-ng speech at -21 dBFS RMS (data/demo) has 77-94 % of its frames there, 72-90 % 20 dB quieter
# and 17-32 % 40 dB quieter; its shortest clip (1.6 s) padded with digital silence to 20 s, 6 %. Under
# 2 % a clip holds no speech to align (a click in silence: 0.2 %; a constant offset: 0 %).
ACTIVE_LEVEL, MIN_ACTIVE, FRAME_SECONDS = 1e-3, 0.02, 0.02
# Clipped: samples at full scale (0.999 <= |x| <= 1: an integer file's largest values, 32767/32768 and -1).
# Speech normalised to peak 1.0 has 0.001-0.004 % of its samples there (data/demo); overdriven 2x
# (+6 dB) 0.5-1.9 %, x20 24-37 %: over 1 % its flattened peaks are distortion the model would learn.
FULL_SCALE, MAX_CLIPPED = 0.999, 0.01
# A lossy decoder rings around a clipped file's flattened peaks (0.95-1.15, not 1.0): those count from
# 0.95. Peak-normalised speech has 0.004-0.006 % of its samples there as MP3 or Vorbis; overdriven 2x,
# 1.2-1.3 %; x4, 3.3-3.9 % (the clipped share before encoding: 3.6 %).
LOSSY, LOSSY_FULL_SCALE = ("VORBIS", "OPUS", "MPEG_LAYER_I", "MPEG_LAYER_II", "MPEG_LAYER_III"), 0.95
# libsndfile subtypes of 8-bit samples, and of codecs as coarse (speech SNR 22-28 dB, against 37 dB for
# the u-law already refused): ADPCM, G.721/G.723, GSM 06.10, 12-bit DWVW, 8-bit DPCM
COARSE = ("PCM_U8", "PCM_S8", "ULAW", "ALAW", "IMA_ADPCM", "MS_ADPCM", "VOX_ADPCM", "NMS_ADPCM_16", "NMS_ADPCM_24",
          "NMS_ADPCM_32", "G721_32", "G723_24", "G723_40", "GSM610", "DWVW_12", "DPCM_8")
# Mixed to mono, channels that are one recording lose nothing; speech in one channel of two loses 6 dB.
# A channel inverted (a lead wired out of phase) or delayed (two microphones) loses 15-40 dB, and the
# clip would train 40 dB too quiet or comb-filtered: more than MAX_MIX_LOSS is refused.
MAX_MIX_LOSS = 10.0  # dB below the loudest channel
# A constant offset (DC) above this gives its silent frames the energy of speech (0.03: more than the
# clip's median speech frame) and lifts mel band 0 in silence by ~9 nats.
MAX_DC = 0.01


class NarrowBand(audio.BadAudio):
    """A clip whose native rate cannot fill the mel's bands: a reject that depends on audio.fmax."""


def _header_problem(info, *, max_seconds, fmax):
    """BadAudio for what the header alone tells: too long, 8-bit samples, and (`fmax` given: the mel
    job) a sample rate below 2 * audio.fmax, whose top mel bands would be empty."""
    if info.samplerate > 0 and info.frames / info.samplerate > max_seconds:
        raise audio.BadAudio(f"too long ({info.frames / info.samplerate:.1f} s > dataset.max_seconds {max_seconds})")
    if info.subtype in COARSE:
        raise audio.BadAudio(f"{'8-bit' if info.subtype in COARSE[:4] else 'coarsely coded'} samples ({info.subtype}): "
                             "quantisation noise at about -48 dB or worse, which the model would learn as part of "
                             "the voice; use 16-bit or better recordings")
    if fmax is not None and 0 < info.samplerate < 2 * fmax:
        raise NarrowBand(f"recorded at {info.samplerate} Hz, which holds nothing above {info.samplerate / 2:g} Hz, "
                         f"but audio.fmax is {fmax:g} Hz (the mel bands above would be empty): lower audio.fmax "
                         f"to {info.samplerate / 2:g} or use wider-band recordings")


OGG_PAGE_MAX = 65307  # 27 header bytes, a 255-entry segment table, 255 segments of 255 bytes


_BIT_REVERSED = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


def ogg_crc(page):
    """The CRC-32 an Ogg page carries (polynomial 0x04C11DB7, not reflected, no initial or final xor;
    computed with its own CRC field zeroed), through zlib's reflected CRC-32: a CRC is affine in its
    input, so zlib's value less that of as many zero bytes is the plain CRC of the bit-reversed bytes."""
    data = (page[:22] + bytes(4) + page[26:]).translate(_BIT_REVERSED)
    plain = zlib.crc32(data) ^ zlib.crc32(bytes(len(data)))
    return int(f"{plain:032b}"[::-1], 2)


def ogg_cut_short(path):
    """True when an Ogg file (Vorbis, Opus, FLAC in Ogg) does not end with a whole last page flagged
    end-of-stream: libsndfile decodes a half-copied .ogg as a shorter clip without a word, where
    audio.wav_shortfall catches a cut WAV and a cut FLAC loses its frame sync. A page is found by its
    capture pattern and version byte, and is whole when its segment table's lengths fit in the file and
    its CRC is right (a cut page padded with zeros by a copy tool fits, but fails its CRC); the last
    whole page is the stream's end unless a page starts after it (cut off). Bytes after it that start
    no page (an ID3v1 tag, zero padding) are not audio and are ignored."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - OGG_PAGE_MAX))
        tail = f.read()
    at = tail.rfind(b"OggS")
    while at >= 0:
        if tail[at + 4:at + 5] == b"\0" and at + 27 <= len(tail):
            n = tail[at + 26]
            table = tail[at + 27:at + 27 + n]
            end = at + 27 + n + sum(table)
            if len(table) == n and end <= len(tail) and \
                    ogg_crc(tail[at:end]) == int.from_bytes(tail[at + 22:at + 26], "little"):
                return b"OggS" in tail[end:] or not tail[at + 5] & 0x04
        at = tail.rfind(b"OggS", 0, at)
    return True


def _wav_data(path):
    """(offset of its data chunk's header, the size that header declares, the file's size) of a RIFF/WAVE
    file, or None (another format, or no data chunk)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        head = f.read(12)
        if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        pos = 12
        while pos + 8 <= size:
            f.seek(pos)
            chunk, n = f.read(4), int.from_bytes(f.read(4), "little")
            if chunk == b"data":
                return pos, n, size
            pos += 8 + n + (n & 1)
    return None


STRAY_SECONDS = 0.01  # bytes after a WAV's chunks worth less audio than this are strays, not a recording


def wav_size_problem(path, info):
    """BadAudio for a RIFF/WAVE file whose data chunk declares less audio than the file holds, which
    libsndfile reads as a shorter clip, silently (its text then sits on part of its audio): a size of
    0 (a header written before the recording and never filled in: no samples at all), or a size
    followed by bytes that start no chunk (the recording went on after its header was written). A
    placeholder size (a WAV written to a pipe: streamed_wav) is read to the file's end, and whole
    chunks after the data (LIST, id3 ), an ID3v1 or ID3v2 tag, zero padding and stray bytes worth less
    than STRAY_SECONDS of audio are a file's own."""
    found = _wav_data(path)
    if found is None:
        return
    pos, n, size = found
    start = pos + 8
    if start + n > size:  # a placeholder (streamed_wav), or truncated (pipeline.audio.wav_shortfall says so)
        return
    with open(path, "rb") as f:
        f.seek(start + n)
        rest = f.read()
    # whole chunks after the data (at its pad byte, or where a writer left it out), then nothing
    rest = min((_after_chunks(rest[skip:]) for skip in {n & 1, 0}), key=len)
    if not rest.strip(b"\0") or (len(rest) == 128 and rest[:3] == b"TAG") or rest[:3] == b"ID3":
        return  # zero padding, an ID3v1 tag, an ID3v2 tag appended by a tagger
    if n == 0:
        raise audio.BadAudio(f"its WAV header declares no audio (a data size of 0: a header written before the "
                             f"recording and never filled in), yet {len(rest)} bytes follow it: save it "
                             "again with the size of its audio")
    per_second = n / (info.frames / info.samplerate) if info.frames and info.samplerate else 0
    if per_second and len(rest) < STRAY_SECONDS * per_second:
        return  # a few stray bytes, not audio
    more = f" (~{len(rest) / per_second:.1f} s of audio at its rate)" if per_second else ""
    raise audio.BadAudio(f"its WAV header declares {n} bytes of audio, and {len(rest)} bytes{more} follow them "
                         "that start no chunk: a header written before the recording ended (only the declared "
                         "part would be read); save it again with the size of all its audio")


STREAMED = 0x7FFF0000  # a data size at least this large, beyond the file's end: a streaming writer's placeholder


def streamed_wav(path):
    """The bytes of a WAV whose data size is the placeholder of a writer that could not seek back to
    fill it in (espeak-ng --stdout writes 0x7FFFF000, arecord 0x7FFFFFFF: no clip is 2 GB) with that size
    set to 0xFFFFFFFF, the placeholder pipeline.audio reads to the file's end; else None. A torn copy
    of a real clip declares what it lost, far less, and stays truncated."""
    found = _wav_data(path)
    if found is None or not (STREAMED <= found[1] < 0xFFFFFFFF and found[0] + 8 + found[1] > found[2]):
        return None
    pos, raw = found[0], Path(path).read_bytes()
    return raw[:4] + b"\xff\xff\xff\xff" + raw[8:pos + 4] + b"\xff\xff\xff\xff" + raw[pos + 8:]


def decode(path, *, sample_rate, max_seconds):
    """pipeline.audio.load_audio, a WAV streamed with a placeholder size (streamed_wav) read to its end:
    how the mel job and evaluate read a clip (pipeline.audio, whose bytes are the mels' code digest, is
    not edited for it)."""
    streamed = streamed_wav(path) if os.path.isfile(path) else None
    if streamed is None:
        return audio.load_audio(path, sample_rate=sample_rate, max_seconds=max_seconds)
    with _as_file(streamed) as copy:
        return audio.load_audio(copy, sample_rate=sample_rate, max_seconds=max_seconds)


@contextlib.contextmanager
def _as_file(data):
    """A path that reads as `data`: on Linux a memory file (memfd, opened by its /proc/self/fd name),
    which a job killed while it decodes (SIGKILL, a SLURM time limit) cannot leave behind; elsewhere a
    temporary file in $TMPDIR, removed when the block ends."""
    fd = None
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        try:
            fd = os.memfd_create("streamed.wav", os.MFD_CLOEXEC)
        except OSError:   # a kernel or a sandbox without memory files
            fd = None
    if fd is not None:
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.NamedTemporaryFile(suffix=".wav") as copy:
        copy.write(data)
        copy.flush()
        yield copy.name


def _after_chunks(raw):
    """What follows the whole RIFF chunks at the start of `raw` (the last one's pad byte may be missing)."""
    at = 0
    while at + 8 <= len(raw) and all(32 <= b < 127 for b in raw[at:at + 4]) \
            and at + 8 + int.from_bytes(raw[at + 4:at + 8], "little") <= len(raw) + 1:
        n = int.from_bytes(raw[at + 4:at + 8], "little")
        at += 8 + n + (n & 1)
    return raw[at:]


def _id3v2_size(head):
    """The bytes an ID3v2 tag at the start of `head` takes (0: none): its size is syncsafe (7 bits a byte),
    plus 10 for a footer."""
    if head[:3] != b"ID3" or len(head) < 10:
        return 0
    return 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10])) + 10 * bool(head[5] & 0x10)


def _frame_sync(data, at):
    """The first offset from `at` where `data` holds an MPEG audio frame sync (11 set bits), or len(data) - 1
    (none)."""
    at = data.find(b"\xff", at)
    while 0 <= at < len(data) - 1 and data[at + 1] & 0xE0 != 0xE0:
        at = data.find(b"\xff", at + 1)
    return len(data) - 1 if at < 0 else at


def mp3_declared_samples(path, info, data=None):
    """(samples, samples a frame) an MP3 file's first frame declares it holds, or None: a Xing or
    Info header with a frame count (its flags' bit 0), whose length libsndfile (mpg123) reports as
    info.frames, or a VBRI header (Fraunhofer's), which mpg123 does not read: it then stops at its own
    estimate from the file's size and first bitrate and can drop half an intact file's audio. Without
    either, the length is that estimate, and nothing is checked here (mp3_cut_frame still is). `data`:
    the file's bytes, where the caller has read them."""
    if data is None:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
    head = data
    at = _id3v2_size(head)  # an ID3v2 tag first
    if at + 4 > len(head):
        with open(path, "rb") as f:
            f.seek(at)
            head = bytes(at) + f.read(4096)
    at = _frame_sync(head, at)
    if at + 4 > len(head):
        return None
    per_frame = 1152 if (head[at + 1] >> 3) & 3 == 3 else 576  # MPEG-1 Layer III, else MPEG-2 / 2.5
    first = head[at:at + 200]
    for tag in (b"Xing", b"Info"):
        found = first.find(tag)
        if found >= 0 and found + 8 <= len(first):
            return (info.frames, per_frame) if int.from_bytes(first[found + 4:found + 8], "big") & 1 else None
    if first[36:40] == b"VBRI" and len(first) >= 54:  # at 32 bytes of side information past the header
        return int.from_bytes(first[50:54], "big") * per_frame, per_frame
    return None


MP3_KBPS = {3: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),  # Layer III, MPEG-1
            2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)}  # MPEG-2 and 2.5
MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}  # by version bits
MP3_STREAM_BITS = 0xFFFE0C00  # sync, version, layer, sample rate: the same in every frame of a stream


def mp3_frame_length(header):
    """The bytes an MPEG Layer III frame takes, from its 4-byte header (an int), or None: not a frame
    header, another layer, or one whose length it does not say (free format, a bad or reserved value)."""
    version, layer, index, rate = (header >> 19) & 3, (header >> 17) & 3, (header >> 12) & 0xF, (header >> 10) & 3
    if header >> 21 != 0x7FF or version == 1 or layer != 1 or index in (0, 15) or rate == 3 or header & 3 == 2:
        return None
    kbps = MP3_KBPS[3 if version == 3 else 2][index]
    return (144 if version == 3 else 72) * kbps * 1000 // MP3_RATES[version][rate] + ((header >> 9) & 1)


def mp3_cut_frame(path, data=None):
    """What is cut short at the end of an MP3 file (a description), or None: its Layer III frames are
    walked from the first frame sync (after an ID3v2 tag), one step a frame, each header giving its
    length, while the header at the walk's position is a frame's with the first one's version, layer and
    sample rate. The file is cut (a half-copied file, which libsndfile decodes as a shorter clip without
    a word, whatever its Xing or VBRI header says) when, after a whole frame, a frame declares more bytes
    than the file has left, or only the start of a header (2-3 bytes) is left. The walk stops, and
    nothing is refused, at bytes that start no frame: an ID3v1, APEv2 or Lyrics3 tag, zero padding,
    garbage; or at a frame of Layer I or II, a free-format one or a bad or reserved value in a header. A
    file cut exactly between two frames cannot be told from a whole one (unless its Xing, Info or
    VBRI header declares more: mp3_declared_samples); nor one cut inside its first frame. `data`: the
    file's bytes, where the caller has read them."""
    data = Path(path).read_bytes() if data is None else data
    at = _frame_sync(data, _id3v2_size(data))
    stream, last = None, None
    while at + 4 <= len(data):
        header = int.from_bytes(data[at:at + 4], "big")
        size = mp3_frame_length(header)
        if size is None or stream not in (None, header & MP3_STREAM_BITS):
            return None
        if at + size > len(data):
            return None if last is None else f"its last MP3 frame is cut short ({len(data) - at} of its {size} bytes)"
        stream, last, at = header & MP3_STREAM_BITS, at, at + size
    if last is not None and 2 <= len(data) - at and data[at:at + 2] == data[last:last + 2]:
        return f"its last MP3 frame is cut short ({len(data) - at} of its header's 4 bytes)"
    return None


def _clipped_fraction(path, info, y, sample_rate, native=None):
    """The fraction of the file's own samples (every channel, before resampling) at full scale (`native`:
    them, where the caller has read them)."""
    if native is None:
        if info is None or (info.channels == 1 and info.samplerate == sample_rate):
            native = y  # the file's samples themselves
        elif float(np.max(np.abs(y))) * info.channels < 0.9:
            # resampled (and mixed), runs of full-scale samples still reach ~1 (2x overdriven speech at
            # 16 kHz: 1.09 at 22,050 Hz); the demo's clips peak at 0.61-0.89, so are not read twice
            return 0.0
        else:
            native = sf.read(str(path), dtype="float32", always_2d=True)[0]
    level = np.abs(native)
    if info is not None and info.subtype in LOSSY:
        return float(np.count_nonzero(level >= LOSSY_FULL_SCALE)) / native.size
    return float(np.count_nonzero((level >= FULL_SCALE) & (level <= 1))) / native.size  # a float file's 1.2: not clipped


def mix_loss_db(native):
    """How far below its loudest channel (dB, >= 0) a multi-channel clip's mono mix is."""
    loudest = float(np.max(np.sqrt(np.mean(np.square(native, dtype=np.float64), axis=0))))
    mixed = float(np.sqrt(np.mean(np.square(native.mean(axis=1), dtype=np.float64))))
    return 0.0 if loudest == 0 else float(20 * np.log10(loudest / max(mixed, loudest * 1e-10)))


def active_fraction(y, sample_rate):
    """The fraction of a clip's 20 ms frames whose RMS about their own mean reaches ACTIVE_LEVEL."""
    n = max(1, min(len(y), int(sample_rate * FRAME_SECONDS)))
    frames = y[:len(y) // n * n].reshape(-1, n)
    return float(np.mean(frames.std(axis=1) >= ACTIVE_LEVEL))


def _level_problem(path, info, y, sample_rate):
    """BadAudio for samples beyond full scale, heavy clipping, channels that mostly cancel when mixed to
    mono, a DC offset, or too little signal to hold speech."""
    peak = float(np.max(np.abs(y)))
    if peak > MAX_PEAK:
        raise audio.BadAudio(f"samples reach {peak:.3g}, beyond full scale (1.0): a float file scaled like integers? "
                             "divide it by its peak")
    native = None
    if info is not None and info.channels > 1:
        native = sf.read(str(path), dtype="float32", always_2d=True)[0]
        loss = mix_loss_db(native)
        if loss > MAX_MIX_LOSS:
            raise audio.BadAudio(f"mixed to mono, its {info.channels} channels are {loss:.0f} dB below the loudest one "
                                 f"(more than {MAX_MIX_LOSS:.0f} dB: a channel inverted or delayed, or the speech in "
                                 "one channel of several): keep one channel")
    clipped = _clipped_fraction(path, info, y, sample_rate, native)
    if clipped > MAX_CLIPPED:
        raise audio.BadAudio(f"clipped: {clipped:.1%} of its samples are at full scale (more than {MAX_CLIPPED:.0%}); "
                             "re-record or take a copy before the gain was raised")
    active = active_fraction(y, sample_rate)
    offset = float(np.mean(y))
    if abs(offset) > MAX_DC and active >= MIN_ACTIVE:
        raise audio.BadAudio(f"a constant offset (DC) of {offset:.3g} (more than {MAX_DC:g}): its silence carries the "
                             "energy of speech; remove it (a high-pass filter) and keep the file")
    if active < MIN_ACTIVE:
        dc = f", a constant offset of {offset:.3g} (DC) removed" if abs(offset) >= ACTIVE_LEVEL else ""
        raise audio.BadAudio(f"no speech: {active:.1%} of its {FRAME_SECONDS * 1000:.0f} ms frames reach "
                             f"{20 * np.log10(ACTIVE_LEVEL):.0f} dBFS{dc} (at least {MIN_ACTIVE:.0%} must): "
                             "near-silence, a click or an offset")


def _mp3_problem(path, info, got):
    """BadAudio for an MP3 file that decodes to `got` seconds, less than its Xing, Info or VBRI header
    declares (mp3_declared_samples), or whose last frame is cut short (mp3_cut_frame): the file read
    once for both."""
    data = Path(path).read_bytes()
    declared = mp3_declared_samples(path, info, data)
    if declared is not None and info.samplerate > 0:
        samples, per_frame = declared
        seconds = samples / info.samplerate
        if got < seconds - 2 * per_frame / info.samplerate:
            raise audio.BadAudio(f"truncated (its header declares {seconds:.2f} s, it decodes to {got:.2f} s: a "
                                 "half-copied file, or a VBR file libsndfile reads short: convert it to FLAC)")
    cut = mp3_cut_frame(path, data)
    if cut is not None:
        raise audio.BadAudio(f"truncated ({cut}: a half-copied file)")


def load_clip(path, *, sample_rate, max_seconds, fmax=None):
    """pipeline.audio.load_audio, after refusing a file whose header says it is longer than
    `max_seconds` (a 2-hour clip is not decoded whole, ~520 MB, to be refused), holds 8-bit or as
    coarse samples, or (`fmax`, the mel job's audio.fmax) has a sample rate below 2 * fmax; and
    refusing a clip whose samples go beyond full scale (a float file scaled like 16-bit integers gives mels ~10 nats too
    loud, one at 1e30 infinite mels and statistics), are clipped, lose more than MAX_MIX_LOSS mixed to
    mono, carry a DC offset, or hold no speech (near-silence, an offset alone: _level_problem); and a
    WAV whose header declares less audio than it holds (wav_size_problem) or an MP3 that decodes to less
    than its Xing, Info or VBRI header declares (mp3_declared_samples: a half-copied file, or a VBR file
    libsndfile reads short) or whose last frame is cut short (mp3_cut_frame: a half-copied file, with or
    without such a header), which libsndfile keeps short, silently. A WAV streamed
    with a 2 GB placeholder size (espeak-ng --stdout, arecord) is read to its end (streamed_wav). Here,
    not in audio.py, whose bytes are the mel caches' code digest: these checks change no mel of a clip
    they keep."""
    try:
        info = sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError):
        info = None  # load_audio says what is wrong with it
    if info is not None:
        _header_problem(info, max_seconds=max_seconds, fmax=fmax)
        if info.format == "OGG" and ogg_cut_short(path):
            raise audio.BadAudio("truncated (its last Ogg page is cut short or does not end the stream: a "
                                 "half-copied file)")
        if info.format in ("WAV", "WAVEX"):  # WAVEX: WAVE_FORMAT_EXTENSIBLE (24-bit, multichannel: ffmpeg, sox)
            wav_size_problem(path, info)
    try:
        y = decode(path, sample_rate=sample_rate, max_seconds=max_seconds)
    except audio.BadAudio as e:
        if str(e).startswith("silent") and info is not None and info.channels > 1:
            loud = np.max(np.abs(sf.read(str(path), dtype="float32", always_2d=True)[0]), axis=0)
            if np.max(loud) >= audio.SILENCE_PEAK:
                raise audio.BadAudio(f"its {info.channels} channels cancel when mixed to mono (one is the other "
                                     "inverted?): keep one channel") from None
        raise
    if info is not None and info.format == "MP3":
        _mp3_problem(path, info, len(y) / sample_rate)
    _level_problem(path, info, y, sample_rate)
    return y


def _shard_clips(cfg, shard, log):
    return manifest.shard_manifest(cfg["dataset"], cfg["cache"]["shards"], shard, strict=False, log=log)


def decode_key(cfg, clips):
    """What a shard's decoded waveforms depend on: each clip's file (name, size, mtime_ns, as planning keyed
    it: manifest.keyed_stamp), the decode
    settings and the decoding code. The mel job records it in the audio shard it writes; the pitch
    job reads that shard only when its own key is the same, so it never reads audio that its clips
    no longer have (a replaced wav, a changed hop), whichever job Snakemake ran first."""
    ds, a = cfg["dataset"], cfg["audio"]
    stamps = []
    for c in clips:
        path = manifest.clip_audio(ds, c)
        stamps.append(f"{c.id}={manifest.keyed_stamp(c.id, path) if path else None}")
    return shards.digest(shards.code_digest("audio.py", "cache.py"), a["sample_rate"], a["hop_length"],
                         ds["max_seconds"], *stamps)


def _audio_of_shard(cfg, shard, what, log, clips):
    """(clips' signals as (id, float32 audio) pairs, rejected) of one shard, decoded from its files: a
    bad clip is left out and listed in `rejected` (with dataset.bad_audio: fail, the index records it
    and the jobs that read the index refuse)."""
    ds, a = cfg["dataset"], cfg["audio"]
    rejected, start = [], time.time()
    fmax = a["fmax"] if what == "mel" else None  # a pitch job is given no audio.fmax (nor depends on it)

    def signals():
        for i, c in enumerate(clips, start=1):
            path = manifest.clip_audio(ds, c)
            try:
                if path is None:
                    raise audio.BadAudio(f"missing file ({Path(c.audio).name})" if c.audio
                                         else f"missing file (no {c.id}.wav, .flac or .ogg)")
                manifest.check_planned(c.id, path)  # not the bytes this job's key names: stop, leave no shard
                y = load_clip(path, sample_rate=a["sample_rate"], max_seconds=ds["max_seconds"], fmax=fmax)
                audio.check_length(y, a["hop_length"])
            except audio.BadAudio as e:
                where = path or c.audio or Path(ds["root"]) / ds["audio_dir"] / f"{c.id}.*"
                rejected.append(dict(id=c.id, path=str(where), stage={"mel": "mels"}.get(what, what), reason=str(e),
                                     **({"setting": "audio.fmax"} if isinstance(e, NarrowBand) else {})))
                log(f"rejected {where}: {e}")
                continue
            yield c.id, y
            if i % 50 == 0 or i == len(clips):
                rate = i / max(time.time() - start, 1e-9)
                log(f"{what} shard {shard}: {i}/{len(clips)} clips, {rate:.1f} clips/s, eta {(len(clips) - i) / rate:.0f} s")

    return signals(), rejected


def _cached_audio(cfg, shard, path, key, log):
    """The signals and rejected of `_audio_of_shard`, read from the audio shard at `path`
    when the mel job that wrote it decoded exactly these clips (`key`, decode_key); None when it is
    missing, from other clips or settings, or being rewritten (a checksum that does not match yet):
    the caller decodes the clips itself, as it does when the mel job left clips out for audio.fmax (a
    setting pitch does not depend on: its job is not rerun when it changes). Either way the F0 tracks
    are the same bytes (pitch.f0 reads only the frames' samples, and the audio shard holds exactly those)."""
    try:
        meta = shards.read_meta(path, "audio")
    except shards.CacheError as e:
        log(f"pitch shard {shard}: no audio shard to read ({e}): decoding the clips")
        return None
    if meta.get("decoded") != key:
        log(f"pitch shard {shard}: {Path(path).name} is not of these clips' files or settings: decoding them")
        return None
    try:
        waves = shards.arrays(meta, path)
    except shards.CacheError as e:
        log(f"pitch shard {shard}: {Path(path).name} does not match its JSON (being rewritten?): decoding the clips ({e})")
        return None
    if any(r.get("setting") for r in meta["rejected"]):
        log(f"pitch shard {shard}: {Path(path).name} left out clips for audio.fmax, which pitch does not depend on: "
            "decoding the clips")
        return None
    signals = zip(meta["ids"], waves)
    rejected = [dict(r, stage="pitch") for r in meta["rejected"]]
    log(f"pitch shard {shard}: {len(meta['ids'])} clips from {Path(path).with_suffix('.bin')}")
    return signals, rejected


def build_mel_shard(cfg, shard, out, energy_out, audio_out=None, log=_print):
    """Mels (float16) and energy (float32) per frame, from one STFT per clip; with `audio_out`, the
    waveform itself (float32, cut to frames * hop samples: the vocoder's targets on the mel's grid)."""
    a = cfg["audio"]
    basis = audio.mel_basis(sample_rate=a["sample_rate"], n_fft=a["n_fft"], n_mels=a["n_mels"], fmin=a["fmin"],
                            fmax=a["fmax"])
    clips = _shard_clips(cfg, shard, log)
    key = decode_key(cfg, clips)  # before decoding: a file replaced meanwhile is not vouched for
    signals, rejected = _audio_of_shard(cfg, shard, "mel", log, clips)
    ids, mels, energies, mel_sums, energy_sums, waves = [], [], [], [], [], []
    for cid, y in signals:
        spec = audio.stft_magnitude(y, n_fft=a["n_fft"], hop_length=a["hop_length"], win_length=a["win_length"])
        mel = audio.log_mel(spec, basis)                                          # (F, n_mels)
        energy = audio.energy_from_magnitude(spec)                                # (F,)
        ids.append(cid)
        mels.append(mel.astype(np.float16))
        energies.append(energy)
        if audio_out is not None:
            waves.append(y[:len(mel) * a["hop_length"]])                           # (F * hop,)
        mel_sums.append([mel.sum(0, dtype=np.float64), np.square(mel).sum(0, dtype=np.float64)])
        energy_sums.append([energy.sum(dtype=np.float64), np.square(energy, dtype=np.float64).sum()])
    n_mels = a["n_mels"]
    frames = sum(len(m) for m in mels)
    seconds = round(frames * a["hop_length"] / a["sample_rate"], 3)
    if audio_out is not None:
        shards.write(audio_out, "audio", ids, waves, provenance=shards.provenance("audio", cfg), rejected=rejected,
                     hop_length=a["hop_length"], sample_rate=a["sample_rate"], decoded=key)
    shards.write(energy_out, "energy", ids, energies, provenance=shards.provenance("energy", cfg),
                 stats=np.asarray(energy_sums, np.float64).reshape(len(ids), 2), rejected=rejected)
    shards.write(out, "mels", ids, mels, provenance=shards.provenance("mels", cfg), width=n_mels,
                 stats=np.asarray(mel_sums, np.float64).reshape(len(ids), 2, n_mels), rejected=rejected,
                 seconds=seconds)
    log(f"mel shard {shard}: {len(ids)} clips, {seconds:.1f} s of audio, {len(rejected)} rejected")


def _light_pyworld():
    """Import pyworld without its __init__, which imports pkg_resources (0.15-0.35 CPU s, every pitch
    job) only to set __version__: the package's names come from its compiled module, as __init__'s
    `from .pyworld import *` gives them, so the F0 tracks are the same bytes."""
    if "pyworld" in sys.modules:
        return
    spec = importlib.util.find_spec("pyworld")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed: pitch.f0 raises its own ImportError
    package = types.ModuleType("pyworld", "PyWorld (compiled module only; see pipeline/cache.py)")
    package.__path__, package.__spec__ = list(spec.submodule_search_locations), spec
    sys.modules["pyworld"] = package
    try:
        compiled = importlib.import_module("pyworld.pyworld")
    except ImportError:
        del sys.modules["pyworld"]
        return
    names = getattr(compiled, "__all__", [n for n in vars(compiled) if not n.startswith("_")])
    package.__dict__.update({n: getattr(compiled, n) for n in names})


def build_pitch_shard(cfg, shard, out, audio_shard=None, log=_print):
    """F0 per frame of one shard's clips, from the audio shard the mel job wrote when it holds exactly
    these clips' waveforms (one decode per clip), else decoded here (the same bytes either way)."""
    a, p = cfg["audio"], cfg["pitch"]
    if p["method"] in ("dio", "harvest"):
        _light_pyworld()
    clips = _shard_clips(cfg, shard, log)
    cached = audio_shard and _cached_audio(cfg, shard, audio_shard, decode_key(cfg, clips), log)
    signals, rejected = cached or _audio_of_shard(cfg, shard, "pitch", log, clips)
    ids, tracks, sums = [], [], []
    for cid, y in signals:
        f = pitch.f0(y, sample_rate=a["sample_rate"], hop_length=a["hop_length"],
                     n_frames=audio.n_frames(len(y), a["hop_length"]), **p)
        ids.append(cid)
        tracks.append(f)
        sums.append(pitch.voiced_stats(f))
    shards.write(out, "pitch", ids, tracks, provenance=shards.provenance("pitch", cfg),
                 stats=np.asarray(sums, np.float64).reshape(len(ids), 3), rejected=rejected)
    voiced = sum(s[0] for s in sums) / max(sum(len(t) for t in tracks), 1)
    log(f"pitch shard {shard}: {len(ids)} clips, {voiced:.0%} of frames voiced ({p['method']}), {len(rejected)} rejected")


def _dataset_name(ds):
    return ", ".join(src["root"] for src in ds["sources"]) if "sources" in ds else ds["root"]


def _mean_std(total, count, floor=1e-6):
    mean = total[0] / max(count, 1)
    return mean, np.sqrt(np.maximum(total[1] / max(count, 1) - mean ** 2, floor))


def speaker_statistics(per_speaker, pitch_all, energy_all):
    """{speaker: {clips, train_clips, pitch_mean, pitch_std, energy_mean, energy_std}}: each speaker's
    train-split voiced pitch and energy; a speaker with no voiced training frame gets the corpus's."""
    out = {}
    for name in sorted(per_speaker):
        sp = per_speaker[name]
        pm, ps = _mean_std(sp["pitch"][1:], sp["pitch"][0]) if sp["pitch"][0] > 0 else pitch_all
        em, es = _mean_std(sp["energy"], sp["frames"]) if sp["frames"] > 0 else energy_all
        out[name] = dict(clips=sp["clips"], train_clips=sp["train"], pitch_mean=round(float(pm), 4),
                         pitch_std=round(float(ps), 4), energy_mean=round(float(em), 6), energy_std=round(float(es), 6))
    return out


def _short_clips(metas, usable):
    """{id: reason} of the clips whose audio cannot carry their text: fewer mel frames than tokens
    (end-of-sequence included), so no alignment gives every token a frame."""
    tokens = dict(zip(metas["tokens"]["ids"], metas["tokens"]["lengths"]))
    return {cid: f"{frames} mel frames for {tokens[cid]} tokens: the audio is too short for its text"
            for cid, frames in zip(metas["mels"]["ids"], metas["mels"]["lengths"])
            if cid in usable and frames < tokens[cid]}


def write_rejected(path, rejected):
    """rejected.tsv: one row per clip left out (id, shard, stage, path, reason), atomically."""
    lines = ["id\tshard\tstage\tpath\treason"] + [
        f"{r['id']}\t{r['shard']}\t{r['stage']}\t{r['path']}\t{r['reason']}" for r in rejected]
    files.atomic_write_text(path, "\n".join(lines) + "\n")


LISTED = 20  # bad clips named in the one-line message of dataset.bad_audio: fail (the index job's log: all)


def bad_audio_record(cfg, bad, log=_print):
    """What index.json records under `bad_audio` when dataset.bad_audio is `fail` and a mel or pitch
    job left clips out (`bad`: their rows), else None. The index is written all the same (a failed
    index would be deleted, and with it every trained aligner's `ancient` input): every job that reads
    it (data.read_index) refuses with the record's one-line message, and so does `snakemake caches`
    (`check`). The index job, the one given the key as the config says, logs every bad clip."""
    if not bad or cfg["dataset"]["bad_audio"] != "fail":
        return None
    for r in bad:
        log(f"bad audio: {r['path']}: {r['reason']}")
    shown = "; ".join(f"{r['path']}: {r['reason']}" for r in bad[:LISTED])
    more = f"; and {len(bad) - LISTED} more (the log of cache_index lists them all)" if len(bad) > LISTED else ""
    return dict(clips=len(bad), message=f"dataset.bad_audio: fail: {len(bad)} clip(s) with bad audio, left out of the "
                                        f"shards: {shown}{more}. Mend or remove them, or set dataset.bad_audio: skip "
                                        f"to go on without them")


def check_caches(cfg, out, log=_print):
    """`snakemake caches`' last job: PipelineError with the index's bad_audio message when it has one,
    else `out`, a record of the check (a file, so a failed check runs again at the next `caches`)."""
    path = config.cache_dir(cfg) / "index.json"
    index = shards.read_index_json(path)
    shards.refuse_bad_audio(path, index)
    counts = index.get("counts", {})
    files.atomic_write_text(out, json.dumps(dict(index=str(path), counts=counts), indent=1) + "\n")
    log(f"caches: {counts.get('clips')} clips, {counts.get('rejected')} rejected (listed in {path.parent / 'rejected.tsv'})")


def _shard_number(path):
    """shard-NNN(N) -> NNN(N): shard order, which a plain sort breaks from shard-1000 on."""
    return int(Path(path).name.split(".")[0].rsplit("-", 1)[1])


def shard_paths(cfg):
    """{kind: [every shard's .json]} of the config's cache, in shard order: what `index` reads when
    the command line names no shards (a rule cannot: 4 paths a shard overflow the 128 KiB that Linux
    allows one argument, `bash -c` included, from ~1,000 shards on)."""
    return {kind: [shards.prefix(config.cache_dir(cfg), kind, k).with_suffix(".json")
                   for k in range(cfg["cache"]["shards"])] for kind in shards.CACHE_KINDS}


class _Totals:
    """Running sums over every shard's clips for the index: counts, and the feature statistics of the
    training clips (overall and per speaker)."""

    def __init__(self, n_mels, val_fraction):
        self.val_fraction = val_fraction
        self.mel, self.energy, self.pitch = np.zeros((2, n_mels)), np.zeros(2), np.zeros(3)
        self.frames = 0
        self.per_speaker = {}  # name -> {clips, train, frames, energy (sum, sum sq), pitch (voiced, sum, sum sq)}
        self.languages = set()
        self.counts = dict(clips=0, train=0, val=0, rejected=0, seconds=0.0)

    def add_shard(self, metas, stats, usable):
        """Adds one shard's usable clips; (clips, validation clips) of the shard."""
        at = {kind: {cid: i for i, cid in enumerate(metas[kind]["ids"])} for kind in ("energy", "pitch", "tokens")}
        tok = metas["tokens"]
        n = val = 0
        for i, cid in enumerate(metas["mels"]["ids"]):
            if cid not in usable:
                continue
            n += 1
            speaker = tok["speakers"][at["tokens"][cid]]
            self.languages.add(tok["languages"][at["tokens"][cid]])
            sp = self.per_speaker.setdefault(speaker, dict(clips=0, train=0, frames=0, energy=np.zeros(2),
                                                           pitch=np.zeros(3)))
            sp["clips"] += 1
            if manifest.is_validation(cid, self.val_fraction):
                val += 1
                continue
            energy, pitch = stats["energy"][at["energy"][cid]], stats["pitch"][at["pitch"][cid]]
            frames = metas["mels"]["lengths"][i]
            self.mel += stats["mels"][i]
            self.energy += energy
            self.pitch += pitch
            self.frames += frames
            sp["train"] += 1
            sp["frames"] += frames
            sp["energy"] += energy
            sp["pitch"] += pitch
        self.counts["clips"] += n; self.counts["val"] += val; self.counts["train"] += n - val
        self.counts["seconds"] += metas["mels"]["seconds"]
        return n, val


def _audio_files(cfg, shard):
    """{clip id: its audio file} of one shard, for the index's own rejects (a clip too short for its text)."""
    ds = cfg["dataset"]
    clips = _shard_clips(cfg, shard, log=lambda *_: None)
    return {c.id: str(manifest.clip_audio(ds, c) or manifest.clip_where(ds, c)) for c in clips}


def _stats(path, clips, recorded):
    """A shard's per-clip sums (one row a clip), or CacheError naming the file: planning checks only that
    it is there (its .bin's checksum covers the .bin), so a cut-short one was a ValueError traceback here,
    in every run after, and the shard was never rebuilt. `recorded`: the stats_checksum its shard's JSON
    holds (shards.write): a flipped byte that leaves the sums finite and of the right shape changed the
    statistics every model trains with, without a word. None (a shard written before the checksum was
    recorded): read unverified, as then, not rebuilt (its index, the aligner and the runs trained on
    it stay valid)."""
    try:
        raw = Path(path).read_bytes()
        stats = np.load(io.BytesIO(raw), allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        stats, why = None, str(e).splitlines()[0] if str(e) else type(e).__name__
    else:
        why = None if stats.ndim >= 1 and len(stats) == clips and stats.dtype == np.float64 else \
            f"{stats.dtype} {stats.shape}, not {clips} rows of float64"
        if not why and recorded is not None and shards.checksum(raw) != recorded:
            why = "checksum mismatch: the file changed after its job wrote it"
    if why:
        raise shards.CacheError(f"{path}: damaged ({why}); delete it and run `{shards.REBUILD}` (it rebuilds a shard "
                                "whose files are missing)")
    return stats


def _read_group(k, group, want, rejected, cfg):
    """One shard's metadata and per-clip sums (every kind), checked against the wanted provenance;
    its rejected and too-short clips (named by their audio file) go into `rejected`.
    -> (metas, stats, usable ids, short ids)."""
    metas = {}
    for kind, p in zip(shards.CACHE_KINDS, group):
        metas[kind] = shards.read_meta(p, kind)
        shards.check_provenance(p, kind, metas[kind]["provenance"], want[kind])
        for r in metas[kind]["rejected"]:
            rejected.setdefault(r["id"], dict(r, shard=k, stage=r.get("stage", kind)))
    stats = {kind: _stats(Path(p).with_suffix(".stats.npy"), len(metas[kind]["ids"]), metas[kind].get("stats_checksum"))
             for kind, p in zip(shards.CACHE_KINDS, group) if kind != "tokens"}
    for kind, p in zip(shards.CACHE_KINDS, group):
        if kind in stats and not np.all(np.isfinite(stats[kind])):
            row = int(np.flatnonzero(~np.all(np.isfinite(stats[kind].reshape(len(stats[kind]), -1)), axis=1))[0])
            raise PipelineError(f"{Path(p).with_suffix('.stats.npy')}: clip {metas[kind]['ids'][row]!r} has non-finite "
                                f"{kind} statistics (audio beyond any usable level); the index would average them into "
                                "every clip's normalisation: fix or remove its audio and rerun")
    usable = set(metas["tokens"]["ids"]) & set(metas["energy"]["ids"]) & set(metas["pitch"]["ids"])
    short = _short_clips(metas, usable)
    files_of = _audio_files(cfg, k) if short else {}
    for cid, reason in short.items():
        where = files_of.get(cid) or str(Path(group[1]).with_suffix(".json"))
        rejected.setdefault(cid, dict(id=cid, shard=k, stage="index", path=where, reason=reason))
    return metas, stats, usable - set(short), short


def _no_training_clips(cfg, rejected, counts):
    """The error of an index with no training clip: how many clips were rejected and the commonest
    reason (a failed job leaves no rejected.tsv to read), e.g. every clip recorded below 2 * audio.fmax."""
    found = f"every clip was rejected or in validation ({len(rejected)} rejected, {counts['val']} in validation)"
    if rejected:
        reasons = collections.Counter(r["reason"] for r in rejected)
        reason, n = reasons.most_common(1)[0]
        first = next(r for r in rejected if r["reason"] == reason)
        found += f"; {n} of them ({first['stage']}): {reason} (e.g. {first['path']})"
    return PipelineError(f"no training clips in {_dataset_name(cfg['dataset'])}: {found}")


def build_index(cfg, paths, out, log=_print):
    """index.json + vocab.json + rejected.tsv from every shard's JSON and per-clip sums.
    `paths`: {kind: [shard paths]} for shards.CACHE_KINDS, in shard order."""
    out = Path(out)
    espeak = text.espeak_version() if cfg["text"]["frontend"] == "phonemes" else None
    want = {k: shards.provenance(k, cfg, espeak=espeak) for k in shards.CACHE_KINDS}
    n_mels = cfg["audio"]["n_mels"]
    totals = _Totals(n_mels, cfg["dataset"]["val_fraction"])
    entries, rejected, audio_rejected = [], {}, {}
    for k, group in enumerate(zip(*(sorted(paths[kind], key=_shard_number) for kind in shards.CACHE_KINDS))):
        metas, stats, usable, short = _read_group(k, group, want, rejected, cfg)
        for kind in ("mels", "pitch"):  # a clip whose text was rejected too is still bad audio
            for r in metas[kind]["rejected"]:
                audio_rejected.setdefault(r["id"], dict(r, shard=k))
        n, val = totals.add_shard(metas, stats, usable)
        entries.append(dict(shard=k, clips=n, val=val, excluded=sorted(short),
                            **{kind: str(Path(p).with_suffix("").relative_to(out.parent))
                               for kind, p in zip(shards.CACHE_KINDS, group)},
                            checksums={kind: metas[kind]["checksum"] for kind in shards.CACHE_KINDS}))
    bad_audio = bad_audio_record(cfg, list(audio_rejected.values()), log)
    counts, frames_train = totals.counts, totals.frames
    counts["rejected"] = len(rejected)
    if frames_train == 0:
        raise _no_training_clips(cfg, list(rejected.values()), counts)
    mel_mean, mel_std = _mean_std(totals.mel, frames_train)
    energy_mean, energy_std = _mean_std(totals.energy, frames_train)
    pitch_mean, pitch_std = _mean_std(totals.pitch[1:], totals.pitch[0])
    speakers = speaker_statistics(totals.per_speaker, (pitch_mean, pitch_std), (energy_mean, energy_std))
    vocab = text.vocabulary(cfg["text"], espeak=espeak)
    counts["seconds"] = round(counts["seconds"], 2)
    index = dict(name=cfg["name"], format=shards.FORMAT, provenance=want, n_mels=n_mels, audio=cfg["audio"],
                 text=cfg["text"], pitch=cfg["pitch"], val_fraction=cfg["dataset"]["val_fraction"], counts=counts,
                 mel_mean=mel_mean.round(6).tolist(), mel_std=mel_std.round(6).tolist(),
                 pitch_mean=round(float(pitch_mean), 4), pitch_std=round(float(pitch_std), 4),
                 energy_mean=round(float(energy_mean), 6), energy_std=round(float(energy_std), 6),
                 vocab=vocab, speakers=sorted(speakers), languages=sorted(totals.languages), speaker_stats=speakers,
                 shards=entries, **({"bad_audio": bad_audio} if bad_audio else {}))
    write_rejected(out.parent / "rejected.tsv", rejected.values())
    files.atomic_write_text(out.parent / "vocab.json", json.dumps(vocab, indent=1, ensure_ascii=False))
    files.atomic_write_text(out, json.dumps(index, indent=1, ensure_ascii=False))
    log(f"index: {counts['clips']} clips ({counts['train']} train, {counts['val']} validation), "
        f"{counts['seconds'] / 3600:.2f} h of audio, {len(vocab['symbols'])} symbols, pitch {pitch_mean:.0f} "
        f"+- {pitch_std:.0f} Hz, {len(speakers)} speaker(s), {counts['rejected']} rejected (listed in {out.parent / 'rejected.tsv'})")


def keep_freed_memory():
    """Let glibc's malloc keep memory a clip's arrays freed, for the next clip, instead of handing it
    back to the kernel and faulting it in again: by default a buffer over 128 KiB (a clip's samples,
    DIO's and the STFT's work arrays) is its own mmap, and a freed heap top over 128 KiB is trimmed.
    Measured on 108-clip shards (benchmarks/clip_lists.py): a pitch job's page faults 68,000 -> 11,000
    and its kernel time 0.2 -> 0.05 s; a mel job's kernel time drops by a third. The job holds at
    most 64 MiB it does not use; it computes the same bytes. Elsewhere than glibc, nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs
    except (OSError, AttributeError):  # musl has no mallopt
        return
    mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (32 MiB: glibc's largest on 64-bit)


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Build token, mel (+ energy) and pitch shards and the cache index; "
                                                 "check the index (`snakemake caches`' last job).")
    parser.add_argument("what", choices=["tokens", "mels", "pitch", "index", "check"])
    config.add_arguments(parser)
    parser.add_argument("--shard", type=int)
    parser.add_argument("--out", required=True, help="shard path without suffix, index.json, or check's record")
    parser.add_argument("--energy", help="mels: the energy shard path without suffix")
    parser.add_argument("--audio", help="mels: the audio shard path to write, without suffix (the waveform on the mel "
                                        "grid); pitch: the one to read when it holds this shard's clips")
    for kind in shards.CACHE_KINDS:
        if kind != "energy":
            parser.add_argument(f"--{kind}", nargs="*", default=[], help=f"index: the {kind} shards")
    parser.add_argument("--energy-shards", nargs="*", default=[], help="index: the energy shards")
    args = parser.parse_args(argv)
    # a pitch job gets audio.sample_rate and hop_length alone (its rule passes no other audio key, so
    # an n_mels edit does not rerun it): the cross-key audio checks would see defaults, so skip them
    cfg = config.from_args(args, check_paths=args.what not in ("pitch", "check"))
    if args.what == "check":
        check_caches(cfg, args.out)
        return
    keep_freed_memory()
    if args.what == "index":
        given = dict(tokens=args.tokens, mels=args.mels, energy=args.energy_shards, pitch=args.pitch)
        build_index(cfg, given if any(given.values()) else shard_paths(cfg), args.out)
        return
    if args.shard is None or not 0 <= args.shard < cfg["cache"]["shards"]:
        raise config.ConfigError(f"--shard must be in 0..{cfg['cache']['shards'] - 1}")
    if args.what == "tokens":
        build_token_shard(cfg, args.shard, args.out)
    elif args.what == "mels":
        if not args.energy:
            raise config.ConfigError("mels: --energy (the energy shard path) is required")
        build_mel_shard(cfg, args.shard, args.out, args.energy, args.audio)
    else:
        build_pitch_shard(cfg, args.shard, args.out, args.audio)


if __name__ == "__main__":
    main()
