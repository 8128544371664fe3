"""F0 (pitch) in Hz per mel frame, 0 where unvoiced, on exactly the mel's frame grid.

`f0(y, sample_rate=, hop_length=, n_frames=, fmin=, fmax=, method=)` returns one value per frame
of `pipeline.audio.n_frames`: frame t is centred on sample t*hop + hop/2 (HiFi-GAN's framing).
Every voiced value lies within pitch.fmin..pitch.fmax; every value is finite. Methods (the config's
`pitch.method`, registered in METHODS; benchmarks/pitch.py measures them against speech
re-synthesised by WORLD with a known F0, benchmarks/RESULTS.md has the figures):
  - praat:   Praat's autocorrelation method (`praat-parselmouth`, To Pitch (ac)) on the clip resampled
             to 8 kHz: the default, fewer gross and voicing errors than DIO, clean and at 20 dB SNR,
             at about DIO's CPU
  - dio:     pyworld's DIO refined by StoneMask (WORLD vocoder)
  - swiftf0: SwiftF0's small CNN (ONNX, shipped in the `swift-f0` wheel): the fewest gross errors,
             but 2-3x DIO's CPU; searches 46.875..2093.75 Hz only
  - harvest: pyworld's Harvest: tens of times DIO's CPU
  - pyin:    librosa's probabilistic YIN: as slow, and the most voicing errors

The pitch_shard rule runs `python -m pipeline.cache pitch ...` (pipeline/cache.py), which reads
the `pitch:` section and audio.sample_rate / audio.hop_length. The evaluate stage uses this same
function for its F0 RMSE. Any edit here rebuilds every pitch shard and nothing else.

    python -c "from pipeline import pitch; print(list(pitch.METHODS))"
"""
import functools

import numpy as np

from pipeline.errors import PipelineError
from pipeline.registry import Registry

# DIO decimates the signal before its search (WORLD's `speed`, 1..12) to about 22,050 / 4 = 5.5 kHz,
# far above any F0 it searches (the factor scales with the rate): on espeak-ng speech 99.8 % of
# frames agree within 5 % with no decimation and tones keep their 0.06 % error, at 4x less CPU
# (benchmarks/RESULTS.md)
DIO_SPEED = 4
# Praat analyses the voice's 0-4 kHz band: the clip is resampled to 8 kHz (soxr) first (RAPT, too, searches
# a downsampled signal). Praat's autocorrelation costs per sample of its 3-period window: 0.73-0.90x DIO's CPU in
# four runs of benchmarks/pitch.py against 1.03-1.21x at 22,050 Hz, with the same gross and voicing errors
# (fine error +0.4 cents; benchmarks/RESULTS.md)
PRAAT_RATE = 8000
SWIFT_VOICED = 0.5  # SwiftF0's confidence is calibrated so that a frame is voiced at >= 0.5


def _advanced(y, hop_length):
    """The signal advanced by half a hop: an extractor that centres frame t on sample t*hop then
    centres it on our frame t's centre, t*hop + hop/2."""
    return np.asarray(y, np.float64)[hop_length // 2:]


def _dio(y, sample_rate, hop_length, n_frames, fmin, fmax):
    import pyworld
    x = _advanced(y, hop_length)
    raw, times = pyworld.dio(x, sample_rate, f0_floor=fmin, f0_ceil=fmax, frame_period=1000.0 * hop_length / sample_rate,
                             speed=max(1, min(12, DIO_SPEED * sample_rate // 22050)))
    return pyworld.stonemask(x, raw, times, sample_rate)


def _harvest(y, sample_rate, hop_length, n_frames, fmin, fmax):
    import pyworld
    out, _ = pyworld.harvest(_advanced(y, hop_length), sample_rate, f0_floor=fmin, f0_ceil=fmax,
                             frame_period=1000.0 * hop_length / sample_rate)
    return out


def _pyin(y, sample_rate, hop_length, n_frames, fmin, fmax):
    import librosa
    frame = max(2048, int(2 ** np.ceil(np.log2(4 * sample_rate / fmin))))  # >= 4 periods of fmin
    out, voiced, _ = librosa.pyin(_advanced(y, hop_length).astype(np.float32), fmin=fmin, fmax=fmax, sr=sample_rate,
                                  frame_length=frame, hop_length=hop_length, center=True)
    return np.where(voiced, out, 0.0)


def on_grid(times, hz, voicing, centres):
    """An extractor's own frames (`times` s, `hz`, `voicing` in 0..1, voiced at >= 0.5) onto the mel
    frame centres `centres` (s): voicing interpolated linearly, F0 linearly in log-frequency between
    the voiced frames around each centre (unvoiced frames carry no F0 of their own)."""
    hz, voicing = np.asarray(hz, np.float64), np.asarray(voicing, np.float64)
    ok = (voicing >= 0.5) & np.isfinite(hz) & (hz > 0)
    if not ok.any():
        return np.zeros(len(centres))
    log_hz = np.interp(times, times[ok], np.log(hz[ok]))  # each unvoiced frame: its voiced neighbours'
    voiced = np.interp(centres, times, voicing, left=0.0, right=0.0) >= 0.5
    return np.where(voiced, np.exp(np.interp(centres, times, log_hz)), 0.0)


def _centres(n_frames, sample_rate, hop_length):
    return (np.arange(n_frames) * hop_length + hop_length / 2) / sample_rate  # (n_frames,) seconds


def praat_rate(sample_rate, fmax):
    """The rate Praat analyses at: PRAAT_RATE, or 4 x pitch.fmax where that is higher; never above the audio's."""
    return min(sample_rate, max(PRAAT_RATE, 4 * fmax))


def _praat(y, sample_rate, hop_length, n_frames, fmin, fmax):
    try:  # declared in all three install files; its wheel names no top-level module, so say it here
        import parselmouth
    except ImportError as e:
        raise PipelineError("pitch.method: praat needs the praat-parselmouth package: "
                            "pip install -r requirements.txt") from e
    x, rate = np.asarray(y, np.float64), praat_rate(sample_rate, fmax)
    if rate != sample_rate:
        import soxr

        x = soxr.resample(x, sample_rate, rate, quality="HQ")
    pad = int(np.ceil(1.5 * rate / fmin))  # half of its 3-periods-of-fmin window: frames reach both ends
    sound = parselmouth.Sound(np.pad(x, pad), sampling_frequency=rate, start_time=-pad / rate)
    track = sound.to_pitch_ac(time_step=hop_length / sample_rate, pitch_floor=fmin, pitch_ceiling=fmax)
    hz = track.selected_array["frequency"]  # 0 where Praat's path is unvoiced
    return on_grid(track.xs(), hz, (hz > 0).astype(np.float64), _centres(n_frames, sample_rate, hop_length))


@functools.lru_cache(maxsize=1)
def _swift_detector():
    import swift_f0
    return swift_f0.SwiftF0(threads=1, spin=False)  # one thread: a job's CPU is one of Snakemake's cores


def _swiftf0(y, sample_rate, hop_length, n_frames, fmin, fmax):
    import swift_f0
    found = _swift_detector().detect(np.asarray(y, np.float32), sample_rate, fmin, fmax)
    times = np.arange(len(found.pitch_hz)) * swift_f0.FRAME_PERIOD  # frame i is centred on i * 16 ms
    return on_grid(times, found.pitch_hz, found.confidence >= SWIFT_VOICED, _centres(n_frames, sample_rate, hop_length))


# Each method: `track(y, sample_rate, hop_length, n_frames, fmin, fmax)` gives F0 (Hz, 0 unvoiced, NaN
# allowed) for mel frames 0.. (any length: f0() cuts or pads); `package` is the PyPI distribution it
# needs; `lowest` / `highest` bound the pitch.fmin / pitch.fmax it can search (the schema says so too).
METHODS = Registry("pitch.method", what="method", track=None, package="", about="", lowest=0.0, highest=np.inf)
METHODS.add("dio", track=_dio, package="pyworld", about="WORLD's DIO refined by StoneMask")
METHODS.add("harvest", track=_harvest, package="pyworld", about="WORLD's Harvest")
METHODS.add("pyin", track=_pyin, package="librosa", about="probabilistic YIN")
METHODS.add("praat", track=_praat, package="praat-parselmouth", about="Praat's autocorrelation method (To Pitch (ac))")
METHODS.add("swiftf0", track=_swiftf0, package="swift-f0", about="SwiftF0, a small CNN run by onnxruntime",
            lowest=46.875, highest=2093.75)


def method_of(name, fmin, fmax):
    """The registered method `name`; one line naming the key when unknown or outside its range."""
    m = METHODS.get(name)
    if fmin < m.lowest or fmax > m.highest:
        key = "pitch.fmin" if fmin < m.lowest else "pitch.fmax"
        raise PipelineError(f"{key}: pitch.method {name} searches {m.lowest:g}..{m.highest:g} Hz; "
                            f"pitch.fmin {fmin:g} and pitch.fmax {fmax:g} must lie within it")
    return m


def f0(y, *, sample_rate, hop_length, n_frames, fmin, fmax, method):
    """(n_frames,) float32 F0 in Hz of mono audio `y`, 0 on unvoiced frames, voiced within fmin..fmax.
    Only the frames' samples count, y[:n_frames * hop_length] (what the audio shard holds and the
    vocoder trains on), so the track is the same from a decoded clip or from the audio cache."""
    track = method_of(method, fmin, fmax).track
    y = y[:n_frames * hop_length]
    out = np.nan_to_num(np.asarray(track(y, sample_rate, hop_length, n_frames, fmin, fmax), np.float64)[:n_frames],
                        nan=0.0, posinf=0.0, neginf=0.0)
    out[(out < fmin * 0.5) | (out > fmax * 2)] = 0.0  # StoneMask can push a frame far off: call it unvoiced
    out = np.where(out > 0, np.clip(out, fmin, fmax), 0.0)  # a refinement just past a bound stays at it
    return np.pad(out, (0, n_frames - len(out))).astype(np.float32)  # (n_frames,)


def voiced_stats(f):
    """[voiced frames, sum, sum of squares] of an F0 track, float64: the index's pitch mean/std."""
    v = f[f > 0].astype(np.float64)
    return np.array([v.size, v.sum(), np.square(v).sum()])
