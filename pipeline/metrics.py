"""Speech-quality measures for `evaluate`: mel-cepstra, DTW, mel-cepstral distortion (MCD), F0 RMSE.

MCD follows the usual TTS recipe (Kubichek 1993; ESPnet's evaluate_mcd): per frame, the WORLD
CheapTrick spectral envelope, turned into an all-pass-warped mel-cepstrum of order 24 exactly as
SPTK's `sp2mc` does (alpha fitted to the mel scale at the sample rate, as SPTK's `mcepalpha`);
c0 (loudness) is dropped; the envelope covers the band the mel carries (0..audio.fmax: the signal is
resampled to 2 * fmax first when fmax is below Nyquist, see `mel_cepstra`); DTW pairs the frames of the two signals by their cepstra; each pair's

    MCD_dB = 10 / ln 10 * sqrt(2 * sum_{d=1..24} (c_d - c'_d)^2)

is averaged along the path. Identical signals give 0; a few dB separate good TTS from its
recordings; other sentences of one speaker are typically twice as far or more. tests/test_metrics.py
checks the mel-cepstra against pysptk. Frames sit on the mel grid: frame i is centred at
(i + 0.5) * hop_length samples, n_samples // hop_length of them, like every mel and F0 frame here.

    f0 = ...                                  # (F,) Hz, 0 = unvoiced, on the same frame grid
    mc = mel_cepstra(y, f0, sample_rate=22050, hop_length=256, f0_floor=65.0)   # (F, 25)
    dist, path = mcd(mc_synth, mc_recorded)   # dB, (L, 2) frame pairs
    rmse = f0_rmse(f0_synth, f0_recorded, path)
"""
import functools
import re
from pathlib import Path

import numpy as np

ORDER = 24  # mel-cepstral order (ESPnet, nnmnkwii, most MCD tables); c0 is not compared
MCD_SCALE = 10.0 / np.log(10.0) * np.sqrt(2.0)  # cepstral distance -> dB of log-spectral distortion
ENVELOPE_FLOOR = np.finfo(np.float64).tiny  # guards log(0) only (CheapTrick never returns 0): SPTK values


def mcep_alpha(sample_rate):
    """All-pass constant whose frequency warping best fits the mel scale (SPTK's mcepalpha):
    0.41 at 16 kHz, 0.455 at 22.05 kHz, 0.466 at 24 kHz, 0.544 at 44.1 kHz."""
    n = 1000
    mel = np.log1p((sample_rate / 2.0) / n * np.arange(n) / 1000.0)
    mel /= mel[-1]
    omega = np.pi / n * np.arange(n)
    alphas = np.arange(0.0, 1.0, 0.001)[:, None]                     # (A, 1)
    warped = np.arctan2((1 - alphas**2) * np.sin(omega), (1 + alphas**2) * np.cos(omega) - 2 * alphas)
    warped /= warped[:, -1:]                                         # (A, n)
    return float(alphas[np.argmin(np.sqrt(np.mean((warped - mel) ** 2, axis=1))), 0])


@functools.lru_cache(maxsize=8)
def freqt_matrix(n_in, order, alpha):
    """(n_in, order+1) matrix of SPTK's freqt recursion (cepstrum -> warped cepstrum), which is
    linear: run once on the identity, then every frame is one matrix product."""
    b = 1.0 - alpha * alpha
    g = np.zeros((order + 1, n_in))                                  # one column per unit input
    eye = np.eye(n_in)
    for i in range(n_in - 1, -1, -1):                               # SPTK runs from the last coefficient
        d = g.copy()
        g[0] = eye[i] + alpha * d[0]
        if order >= 1:
            g[1] = b * d[0] + alpha * d[1]
        for j in range(2, order + 1):
            g[j] = d[j - 1] + alpha * (d[j] - g[j - 1])
    return g.T


def sp2mc(power, *, order=ORDER, alpha):
    """(F, fft//2+1) power spectra -> (F, order+1) mel-cepstra, as SPTK/pysptk's sp2mc."""
    c = np.fft.irfft(np.log(np.maximum(power, ENVELOPE_FLOOR)), axis=1)  # (F, fft) real cepstrum of log power
    c[:, 0] /= 2.0
    return c @ freqt_matrix(c.shape[1], order, alpha)


def frame_times(n_samples, *, sample_rate, hop_length):
    """Centres (s) of the mel grid's n_samples // hop_length frames."""
    return (np.arange(n_samples // hop_length) + 0.5) * hop_length / sample_rate


def analysis_rate(sample_rate, fmax=None):
    """The rate the envelope is analysed at: 2 * fmax when the mel stops below Nyquist, else sample_rate."""
    return int(round(2 * fmax)) if fmax and 2 * fmax < sample_rate else sample_rate


def mel_cepstra(y, f0, *, sample_rate, hop_length, f0_floor, order=ORDER, fmax=None):
    """(F, order+1) mel-cepstra of the WORLD envelope of mono audio `y`, F = len(f0) frames.

    fmax: the band the mel carries (audio.fmax). Below Nyquist, `y` is resampled to 2 * fmax first (soxr)
    and the envelope analysed there, on the same frame times: above fmax the mel holds nothing a vocoder
    could follow, and a near-empty band (a 16 kHz recording at 22.05 kHz) would otherwise dominate the
    figure (1e-5 of noise above 8 kHz alone measures 13 dB). PESQ (16 kHz) and STOI (10 kHz) are band-limited
    the same way. None: the whole band (SPTK's sp2mc on the signal as it is)."""
    import pyworld  # here: only evaluate needs it

    t = frame_times(len(y), sample_rate=sample_rate, hop_length=hop_length)[:len(f0)]
    rate = analysis_rate(sample_rate, fmax)
    if rate != sample_rate:
        import soxr

        y = soxr.resample(np.asarray(y, np.float64), sample_rate, rate, quality="HQ")
    x = np.ascontiguousarray(y, np.float64)
    fft_size = pyworld.get_cheaptrick_fft_size(rate, f0_floor)
    sp = pyworld.cheaptrick(x, np.ascontiguousarray(f0[:len(t)], np.float64), t, rate,
                            f0_floor=f0_floor, fft_size=fft_size)   # (F, fft/2+1) power
    return sp2mc(sp, order=order, alpha=mcep_alpha(rate))


def dtw_path(a, b):
    """(L, 2) int frame pairs (i into a, j into b), start to end, minimising summed Euclidean distance
    between rows of a (N, D) and b (M, D); steps (1,1), (1,0), (0,1)."""
    import librosa  # librosa's numba DTW

    _, path = librosa.sequence.dtw(X=np.asarray(a, np.float64).T, Y=np.asarray(b, np.float64).T,
                                   metric="euclidean", backtrack=True)
    return path[::-1].astype(np.int64)


def _row_distances(a, b):
    """(L,) dB distance of each row of two frame-aligned mel-cepstra (L, order+1); c0 excluded."""
    diff = np.asarray(a)[:, 1:] - np.asarray(b)[:, 1:]                      # (L, order)
    return MCD_SCALE * np.sqrt(np.sum(diff**2, axis=1))


def _pair_distances(a, b, path):
    """(L,) dB distance of each DTW pair of mel-cepstra rows; c0 excluded."""
    return _row_distances(np.asarray(a)[path[:, 0]], np.asarray(b)[path[:, 1]])


def mcd(a, b):
    """(MCD in dB, DTW path) between two mel-cepstra (N, order+1) and (M, order+1); c0 excluded."""
    path = dtw_path(np.asarray(a)[:, 1:], np.asarray(b)[:, 1:])
    return float(np.mean(_pair_distances(a, b, path))), path


def mcd_by_voicing(a, b, path, voiced_b):
    """(MCD dB over the DTW pairs whose b frame is voiced, over the others), each None where there is none.
    voiced_b (M,) bool: b's voicing (the recording's F0 > 0). The two differ in kind: in a voiced frame the
    envelope is the harmonics' and a vocoder can follow it; an unvoiced frame (a fricative, a pause) is
    noise, whose CheapTrick envelope differs by several dB between two renderings of one spectrum."""
    d = _pair_distances(a, b, path)
    voiced = np.asarray(voiced_b, bool)[path[:, 1]]
    return tuple(float(d[m].mean()) if m.any() else None for m in (voiced, ~voiced))


def mcd_aligned(a, b):
    """MCD in dB of two mel-cepstra already frame-aligned (same length); c0 excluded."""
    return float(np.mean(_row_distances(a, b)))


def f0_rmse(f0_a, f0_b, path):
    """(RMSE in Hz, frames used) over the DTW pairs voiced (> 0) in both; (nan, 0) when none are."""
    fa, fb = np.asarray(f0_a)[path[:, 0]], np.asarray(f0_b)[path[:, 1]]
    both = (fa > 0) & (fb > 0)
    if not both.any():
        return float("nan"), 0
    return float(np.sqrt(np.mean((fa[both] - fb[both]) ** 2))), int(both.sum())


GROSS_PITCH_ERROR = 0.2  # |F0 ratio - 1| above this is a gross (typically octave) error, as in GPE


def f0_gross_error(f0_a, f0_b, path):
    """Share of the DTW pairs voiced in both whose F0 differ by more than 20 % (gross pitch error);
    None when no pair is voiced in both. A few octave errors dominate an RMSE in Hz: this says how many."""
    fa, fb = np.asarray(f0_a)[path[:, 0]], np.asarray(f0_b)[path[:, 1]]
    both = (fa > 0) & (fb > 0)
    if not both.any():
        return None
    return float(np.mean(np.abs(fa[both] / fb[both] - 1.0) > GROSS_PITCH_ERROR))


# --- listening-test proxies: PESQ (wideband, 16 kHz) and STOI of a signal against its recording ---
PESQ_RATE = 16000  # wideband PESQ (ITU-T P.862.2) is defined at 16 kHz
# what an output with no sound at all scores where the recording has speech (pipeline.evaluate.listen):
# the bottom of each scale, not "no score", which a median leaves out (a silent clip made it look better)
PESQ_FLOOR = 1.0   # P.862.2's MOS-LQO runs from about 1.0 to 4.64
MOS_FLOOR = 1.0    # DNSMOS's MOS scale runs from 1 to 5


def warp_to(y, path, *, n_frames, hop_length):
    """`y` (frames of hop_length samples) re-timed onto a recording of n_frames frames along a DTW
    path (i into y's frames, j into the recording's); a synthesized clip then has the recording's
    length, which PESQ and STOI need. Recorded frame j gets the y frame paired with it (its last
    pairing), as a periodic Hann window of two hops centred on that frame's start, overlap-added a
    hop apart: along the identity path the windows sum to 1 and give y back; where the path repeats
    or skips a frame, the seam is a cross-fade. Frames butted together instead click at every seam,
    and PESQ hears the clicks: the demo vocoder's copy of the recorded mels, re-timed along its own
    DTW path, scored 1.92 that way against 2.06 cross-faded (2.80 not re-timed; benchmarks/RESULTS.md)."""
    hop = hop_length
    pick = np.zeros(n_frames + 1, np.int64)
    pick[path[:, 1]] = path[:, 0]                                    # the last pairing of each recorded frame
    pick[n_frames] = pick[n_frames - 1] + 1                          # the last frame's second half-window
    pick = np.minimum(pick, len(y) // hop)
    padded = np.pad(np.asarray(y[:len(y) // hop * hop], np.float32), (hop, 2 * hop))  # padded[k + hop] = y[k]
    window = np.hanning(2 * hop + 1)[:-1].astype(np.float32)        # periodic: overlaps a hop apart sum to 1
    segments = padded[pick[:, None] * hop + np.arange(2 * hop)] * window  # (n_frames + 1, 2 hop)
    out = np.zeros((n_frames + 2, hop), np.float32)
    out[:-1] += segments[:, :hop]
    out[1:] += segments[:, hop:]
    return out[1:n_frames + 1].reshape(-1)


def pesq_wb(reference, degraded, sample_rate):
    """Wideband PESQ (MOS-LQO, about 1.0-4.6) of `degraded` against `reference`, both resampled to
    16 kHz; None when PESQ finds no speech (e.g. a silent output)."""
    import soxr
    from pesq import pesq
    from pesq.cypesq import PesqError

    ref, deg = (soxr.resample(np.asarray(x, np.float32), sample_rate, PESQ_RATE) for x in (reference, degraded))
    n = min(len(ref), len(deg))
    if not np.any(deg[:n]):
        return None  # pesq levels the output by its power: 0 made NaN, a ValueError, not its PesqError
    try:
        return float(pesq(PESQ_RATE, ref[:n], deg[:n], "wb"))
    except PesqError:
        return None


def stoi(reference, degraded, sample_rate):
    """STOI (0-1) of `degraded` against `reference` (cut to the shorter); None when the recording has
    too little sound to measure (pystoi needs 30 frames of 25.6 ms that are not silent, about 0.4 s:
    below, it warns and returns 1e-5, even for two identical signals)."""
    import warnings

    from pystoi import stoi as _stoi

    n = min(len(reference), len(degraded))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        score = float(_stoi(np.asarray(reference[:n], np.float64), np.asarray(degraded[:n], np.float64), sample_rate))
    if any("Not enough STFT frames" in str(w.message) for w in said):
        return None
    return score


# --- speaker similarity -----------------------------------------------------------------------
def speaker_feature(mc, f0):
    """A clip's voice as one vector: the mean of its mel-cepstra c1..c24 over all frames (the vocal
    tract's average spectral envelope) and the mean and standard deviation of log F0 over voiced
    frames (register and intonation range). Content averages out over a sentence; what stays is
    mostly the voice. The cepstra's spread over frames is left out on purpose: synthesized speech is
    smoother than any recording (the "global variance" reduction of statistical TTS, Toda & Tokuda
    2007; 0.76-0.79 of the recordings' spread for each of three espeak-ng voices alike), so it
    measures the model's smoothing, not whose voice it is."""
    c = np.asarray(mc, np.float64)[:, 1:]
    voiced = np.log(np.asarray(f0, np.float64)[np.asarray(f0) > 0])
    pitch = [voiced.mean(), voiced.std()] if len(voiced) > 1 else [0.0, 0.0]
    return np.concatenate([c.mean(0), pitch])


def speaker_similarity(recorded, synthesized, speakers):
    """{accuracy, chance, clips}: the share of synthesized clips whose speaker_feature is nearer to the
    centroid of their own speaker's recordings than to every other speaker's (features z-scored over
    the recordings; a clip's own recording is left out of its speaker's centroid, so sharing the
    words does not count). chance = 1 / speakers compared. None with fewer than 2 speakers."""
    recorded, synthesized = np.asarray(recorded, np.float64), np.asarray(synthesized, np.float64)
    names = sorted(set(speakers))
    if len(names) < 2:
        return None
    mean, std = recorded.mean(0), recorded.std(0)
    # a feature the recordings do not spread over (the pitch pair of a corpus whose clips have under two
    # voiced frames) tells no speaker from another: scaled by ~0 it drowned every other feature
    keep = std > 1e-9
    if not keep.any():
        return None
    rec, syn = ((x[:, keep] - mean[keep]) / std[keep] for x in (recorded, synthesized))
    speakers = np.asarray(speakers)
    hits = total = 0
    for i, own in enumerate(speakers):
        centroids = {}
        for name in names:
            keep = (speakers == name) & (np.arange(len(speakers)) != i)
            if keep.any():
                centroids[name] = rec[keep].mean(0)
        if own not in centroids or len(centroids) < 2:
            continue  # its speaker has no other recording here
        nearest = min(centroids, key=lambda n: np.linalg.norm(syn[i] - centroids[n]))
        hits += nearest == own
        total += 1
    if not total:
        return None
    return {"accuracy": hits / total, "chance": 1 / len(names), "clips": total}


# --- what a listener hears: naturalness (a MOS predictor) and intelligibility (an offline recognizer) ---
LISTEN_RATE = 16000   # DNSMOS and pocketsphinx's en-us model both take 16 kHz audio
DNSMOS_SECONDS = 9.01  # DNSMOS scores 9.01 s windows (speechmos.dnsmos.INPUT_LENGTH)
# pocketsphinx: batch CMN (each clip normalised on its own, so a clip's words never depend on the
# clip decoded before it); a narrower search than the default, no second pass: 0.2 instead of
# 0.6 CPU s per audio second, the same WER on the demo's recordings (0.82 against 0.83)
RECOGNIZER = {"samprate": LISTEN_RATE, "cmn": "batch", "maxhmmpf": 1500, "fwdflat": False, "loglevel": "FATAL"}
_NOT_A_WORD_RE = re.compile(r"[^a-z']+")  # what WER's word lists drop (punctuation, hyphens, digits left over)


def to_listen_rate(y, sample_rate):
    """float32 audio at 16 kHz within [-1, 1], as the predictor and the recognizer take it: first as
    it is saved and spoken (wavfile.as_heard: scaled whole to a 0.95 peak when it would clip, as every
    delivery path does, and in 16-bit samples), so the measures hear what evaluate_audio/ holds, not
    clipping no one hears nor a residue below one 16-bit step."""
    import soxr

    from pipeline.wavfile import as_heard

    y = as_heard(y)
    if sample_rate != LISTEN_RATE:
        y = soxr.resample(y, sample_rate, LISTEN_RATE, quality="HQ")
    return np.clip(y, -1.0, 1.0)  # the resampler's overshoot of a 0.95 peak, if any


@functools.lru_cache(maxsize=1)
def _dnsmos():
    """speechmos's DNSMOS P.835 (its ONNX weights ship inside the wheel), on one onnxruntime thread each."""
    import onnxruntime as ort
    from speechmos import dnsmos

    folder = Path(dnsmos.__file__).parent / "dnsmos_models"
    model = dnsmos.DNSMOS.__new__(dnsmos.DNSMOS)  # its __init__ opens sessions on every core
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    model.primary_model_path = str(folder / "sig_bak_ovr.onnx")
    model.onnx_sess, model.p808_onnx_sess = (
        ort.InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])
        for name in ("sig_bak_ovr.onnx", "model_v8.onnx"))
    return model


def naturalness(y, sample_rate):
    """DNSMOS P.835 overall quality (OVRL, a MOS on 1-5) of mono audio; None for a silent signal.
    A clip shorter than the model's 9.01 s window is repeated to fill one window (DNSMOS's own script
    repeats it to twice its length or more and averages windows shifted by 1 s: 5-8x the cost, the
    same clip within about 0.1); a longer clip is scored as DNSMOS does, windows 1 s apart, averaged."""
    x = to_listen_rate(y, sample_rate)
    if not np.abs(x).max(initial=0.0) > 1e-4:
        return None
    x = np.resize(x, max(len(x), int(DNSMOS_SECONDS * LISTEN_RATE)))  # np.resize repeats the signal
    score = float(_dnsmos()(x, LISTEN_RATE, False)["ovrl_mos"])
    return score if np.isfinite(score) else None


def speech_shaped_noise(y, sample_rate, *, seed=0):
    """`y` with its short-time magnitude kept and its phase replaced by random phase: noise with the
    recording's spectrum and loudness, frame by frame, and no speech in it (the MOS predictor's floor)."""
    import librosa

    y = np.asarray(y, np.float32)
    spec = librosa.stft(y, n_fft=1024, hop_length=256)
    phase = np.exp(2j * np.pi * np.random.default_rng(seed).random(spec.shape))
    noise = librosa.istft(np.abs(spec) * phase, hop_length=256, length=len(y))
    # random phases partly cancel where the frames overlap (about 6 dB here): back to the recording's RMS
    rms = np.sqrt(np.mean(np.square(noise, dtype=np.float64)))
    return (noise * (np.sqrt(np.mean(np.square(y, dtype=np.float64))) / rms if rms > 0 else 1.0)).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _decoder():
    from pocketsphinx import Decoder  # its en-us acoustic model, dictionary and language model ship in the wheel

    return Decoder(**RECOGNIZER)


def load_listeners():
    """Load the MOS predictor and the recognizer now, not at their first use (once a process)."""
    _dnsmos()
    _decoder()


def transcribe(y, sample_rate):
    """What pocketsphinx's en-us model hears in mono audio: lower-case words ("" for none). The same
    words whatever was transcribed before: the decoder's feature state (its noise and cepstral-mean
    estimates carry over from one utterance to the next) is reset first, as a fresh decoder starts."""
    pcm = (to_listen_rate(y, sample_rate) * 32767).astype(np.int16).tobytes()
    decoder = _decoder()
    decoder.reinit_feat()
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return hyp.hypstr if hyp is not None else ""


def words(text):
    """A transcript as WER compares it: the english cleaners (lower case, numbers and abbreviations as
    words), then only letters and apostrophes, one space between words."""
    from pipeline.text import clean_text

    cleaned = _NOT_A_WORD_RE.sub(" ", clean_text(text, "english"))
    return " ".join(w.strip("'") for w in cleaned.split() if w.strip("'"))


def wer(reference, hypothesis):
    """Word error rate of `hypothesis` against `reference`, both normalised by `words`:
    (substitutions + deletions + insertions) / reference words; None when the reference has no word."""
    import jiwer

    ref, hyp = words(reference), words(hypothesis)
    if not ref:
        return None
    return float(jiwer.wer(ref, hyp)) if hyp else 1.0
