"""F0 (pitch) in Hz per mel frame, 0 where unvoiced, on exactly the mel's frame grid.

`f0(y, sample_rate=, hop_length=, n_frames=, fmin=, fmax=, method=)` returns one value per frame
of `pipeline.audio.n_frames`: frame t is centred on sample t*hop + hop/2 (HiFi-GAN's framing), so
the extractors, which centre frame t on t*hop, run on the signal advanced by hop/2. Methods (the
config's `pitch.method`; benchmarks/pitch.py measures them, benchmarks/RESULTS.md has the figures):
  - dio:     pyworld's DIO refined by StoneMask (WORLD vocoder): the fast one, the default
  - harvest: pyworld's Harvest: more robust voicing, several times slower
  - pyin:    librosa's probabilistic YIN: slowest

The pitch_shard rule runs `python -m pipeline.cache pitch ...` (pipeline/cache.py), which reads
the `pitch:` section and audio.sample_rate / audio.hop_length. The evaluate stage uses this same
function for its F0 RMSE. Any edit here rebuilds every pitch shard and nothing else.
"""
import numpy as np

METHODS = ("dio", "harvest", "pyin")
# DIO decimates the signal before its search (WORLD's `speed`, 1..12) to about 22,050 / 4 = 5.5 kHz,
# far above any F0 it searches (the factor scales with the rate): on espeak-ng speech 99.8 % of
# frames agree within 5 % with no decimation and tones keep their 0.06 % error, at 4x less CPU
# (benchmarks/RESULTS.md)
DIO_SPEED = 4


def f0(y, *, sample_rate, hop_length, n_frames, fmin, fmax, method):
    """(n_frames,) float32 F0 in Hz of mono audio `y`, 0 on unvoiced frames."""
    x = np.asarray(y, np.float64)[hop_length // 2:]  # extractor frame t -> our frame t's centre
    period_ms = 1000.0 * hop_length / sample_rate
    if method == "dio":
        import pyworld
        raw, times = pyworld.dio(x, sample_rate, f0_floor=fmin, f0_ceil=fmax, frame_period=period_ms,
                                 speed=max(1, min(12, DIO_SPEED * sample_rate // 22050)))
        out = pyworld.stonemask(x, raw, times, sample_rate)
    elif method == "harvest":
        import pyworld
        out, _ = pyworld.harvest(x, sample_rate, f0_floor=fmin, f0_ceil=fmax, frame_period=period_ms)
    elif method == "pyin":
        import librosa
        frame = max(2048, int(2 ** np.ceil(np.log2(4 * sample_rate / fmin))))  # >= 4 periods of fmin
        out, voiced, _ = librosa.pyin(x.astype(np.float32), fmin=fmin, fmax=fmax, sr=sample_rate,
                                      frame_length=frame, hop_length=hop_length, center=True)
        out = np.where(voiced, out, 0.0)
    else:
        raise ValueError(f"pitch.method {method!r}: valid methods: {', '.join(METHODS)}")
    out = np.nan_to_num(np.asarray(out, np.float64)[:n_frames], nan=0.0)
    out[(out < fmin * 0.5) | (out > fmax * 2)] = 0.0  # StoneMask can push a frame far off: call it unvoiced
    return np.pad(out, (0, n_frames - len(out))).astype(np.float32)  # (n_frames,)


def voiced_stats(f):
    """[voiced frames, sum, sum of squares] of an F0 track, float64: the index's pitch mean/std."""
    v = f[f > 0].astype(np.float64)
    return np.array([v.size, v.sum(), np.square(v).sum()])
