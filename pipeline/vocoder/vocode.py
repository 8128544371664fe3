"""Copy-synthesis: a log-mel [F, n_mels] (.npy, as synthesize writes runs/{name}/samples/NN.npy, or
a mel cut out of a cache) through the run's trained vocoder (Griffin-Lim with vocoder.kind
griffin_lim) into a 16-bit wav of F * hop_length samples.

The vocoder runs with the `audio:` and `vocoder:` settings it was trained with (recorded in
runs/{name}/vocoder.json; one note on stderr when the config gives others): its rate, hop and
n_mels, not the config's. Long mels go through in chunks of kinds.CHUNK_FRAMES frames with context
(the same audio in bounded memory); a mel above MAX_FRAMES frames (WHOLE_MAX_FRAMES for the kinds
vocoded whole: Griffin-Lim, and source_filter, whose source's phase runs through the whole mel) is
refused from its header, before it is read. A mel shorter than the vocoder
takes (source_filter: 2 frames at n_fft 1024, hop 256; kinds.min_frames) gets silent frames after
it and keeps its own audio, as in the exported voice. Bad input is one line, given before TensorFlow
loads (the --out path, the run's vocoder summary, the mel and F0 files); a mel on another scale
(dB, normalised, log10, linear) is refused (check_scale; its scale is judged from 40 frames up).

Reads runs/{name}/vocoder.json and its checkpoint; config keys audio.* (Griffin-Lim; a trained vocoder
uses its own), vocoder.kind, synthesize.griffin_lim_iters (Griffin-Lim only).

    python -m pipeline.vocode --config configs/config.yaml --mel runs/demo/samples/00.npy [--f0 F0.npy] --out 00.wav

`--f0`: F0 in Hz per mel frame (0 unvoiced) for vocoder.kind source_filter; without it, that
vocoder's own F0 + voicing head estimates F0 from the mel. Other kinds ignore it.
"""
import argparse
import os
import stat

import numpy as np

from pipeline import config
from pipeline.audio import LOG_CLAMP
from pipeline.errors import PipelineError, cli
from pipeline.files import check_not_input
from pipeline.vocoder import kinds
from pipeline.wavfile import check_path, save_wav

MAX_FRAMES = 1_000_000  # ~3 h at 22,050 Hz with hop 256: ~1 GB of float32 audio, the most vocode holds
# ~4 min at 22,050 Hz / 256, for kinds that cannot be chunked: Griffin-Lim iterates over the whole
# spectrogram (~1.2 GB), source_filter's harmonics run in phase from the first frame (~1.2 GB)
WHOLE_MAX_FRAMES = 20_000


class MelError(PipelineError):
    """A mel file the vocoder cannot take; the message names the file."""


NPY_MAGIC = b"\x93NUMPY"
# what a file that is not a .npy most often is, by its first bytes: said beside the refusal
KNOWN_HEADERS = ((b"RIFF", "a wav file"), (b"fLaC", "a FLAC file"), (b"ID3", "an MP3 file"),
                 (b"PK\x03\x04", "an archive of several"))


def _load(path):
    """The array in `path` mapped, not read (a header claiming a huge shape costs nothing), or MelError."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe would wait for a writer, a device never end
            raise MelError(f"{path}: not a file (a folder, a pipe or a device); give a .npy file")
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
    except FileNotFoundError:
        raise MelError(f"{path}: no such file") from None
    except OSError as e:
        raise MelError(f"{path}: cannot be read ({e.strerror or type(e).__name__})") from None
    if head != NPY_MAGIC:  # numpy would try it as a pickle, and say so
        what = next((said for magic, said in KNOWN_HEADERS if head.startswith(magic)), "")
        raise MelError(f"{path}: not a .npy array (no NumPy header{': ' + what if what else ''})")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError, OverflowError) as e:  # a damaged header (a negative shape: OverflowError)
        raise MelError(f"{path}: not a .npy array ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _float32(path, values):
    """`values` as float32, or MelError naming the file when a finite one is beyond float32's range: the
    cast made it infinite, and the file was called one holding infinite values (with NumPy's overflow
    warning beside)."""
    if np.issubdtype(values.dtype, np.floating) and values.size:
        finite = np.abs(values[np.isfinite(values)])
        if finite.size and finite.max() > np.finfo(np.float32).max:
            raise MelError(f"{path}: values up to {finite.max():.3g}, beyond float32's range (about 3.4e38)")
    return np.array(values, np.float32)


def read_mel(path, audio_cfg, max_frames=MAX_FRAMES):
    """(F, n_mels) float32 log-mel from `path`, or MelError naming the file and what is wrong. n_mels:
    audio_cfg's (the vocoder's own); more than `max_frames` frames is refused before reading them."""
    mel = _load(path)
    n_mels = audio_cfg["n_mels"]
    if mel.ndim != 2 or not np.issubdtype(mel.dtype, np.floating):
        raise MelError(f"{path}: a {mel.dtype} array of shape {mel.shape}, expected a float log-mel [frames, {n_mels}]")
    if mel.shape[0] > max_frames:
        raise MelError(f"{path}: {mel.shape[0]:,} frames, more than this vocoder takes ({max_frames:,}, "
                       f"{max_frames * audio_cfg['hop_length'] / audio_cfg['sample_rate'] / 60:.0f} min); cut it into parts")
    if mel.shape[1] != n_mels:
        hint = " (transposed? the frames come first)" if mel.shape[0] == n_mels else ""
        raise MelError(f"{path}: {mel.shape[1]} mel bands, the vocoder's audio.n_mels is {n_mels}{hint}: "
                       f"a mel made with other audio: settings")
    if mel.shape[0] == 0:
        raise MelError(f"{path}: no frames")
    mel = _float32(path, mel)
    if not np.all(np.isfinite(mel)):
        raise MelError(f"{path}: holds NaN or infinite values")
    check_scale(path, mel)
    return mel


FLOOR = float(np.log(LOG_CLAMP))
# What tells this pipeline's natural-log mel from the usual other scales, measured on the demo's clips
# (whole mels, and their 40-frame stretches) clean, quiet (x 0.03) and with white noise down to 0 dB
# SNR: its median stays at or below -2.5 where a normalised (z-scored) mel's is near 0 and a linear
# one's near 0.01; and where it is clamped, it is clamped at FLOOR, where a log10 mel is clamped at
# -5.0 and a dB one at -80 or -100. Its minimum alone does not tell: a noisy recording's mel never
# comes near FLOOR (-7.1 .. -4.3 at 20 .. 0 dB SNR), as a log10 mel's does not. An unclamped log10 mel
# (a recording with a noise floor) passes: its values are a noisier recording's natural-log mel's.
MEDIAN_HIGHEST, SCALE_FRAMES = -1.5, 40
CLAMPED_SHARE = 0.005  # this share of the values at one lowest value: a clamp


def check_scale(path, mel):
    """MelError unless `mel` looks like a natural-log mel of this pipeline: within FLOOR - 3 (a model's
    mel overshoots the clamp a little: synthesize writes it unclamped; a dB mel goes to -80 or -100)
    .. 8, and, from SCALE_FRAMES frames on, a median of at most MEDIAN_HIGHEST and no clamp at another
    value than FLOOR."""
    low, high = float(mel.min()), float(mel.max())
    natural = f"a natural-log mel (clamped at log({LOG_CLAMP}) = {FLOOR:.2f})"
    if low < FLOOR - 3.0 or high > 8.0:
        raise MelError(f"{path}: values {low:.2f}..{high:.2f} are not {natural} (a dB mel? made with other "
                       "audio: settings?)")
    if len(mel) < SCALE_FRAMES:
        return
    median = float(np.median(mel))
    if median > MEDIAN_HIGHEST:
        raise MelError(f"{path}: its median {median:.2f} is too high for {natural}, whose median is below "
                       f"{MEDIAN_HIGHEST} (a normalised or linear mel?)")
    at_low = np.count_nonzero(mel <= low + 1e-4) / mel.size
    if at_low >= CLAMPED_SHARE and abs(low - FLOOR) > 0.05:
        raise MelError(f"{path}: {at_low:.1%} of its values sit at {low:.2f}, a clamp, but {natural} is "
                       f"clamped at {FLOOR:.2f} (a log10 mel?)")


F0_LOWEST = 20.0  # Hz: a voiced value below is no voice's pitch (a log-F0, a period in ms, MIDI notes?)


def read_f0(path, frames, audio_cfg):
    """(frames,) float32 F0 in Hz (0: unvoiced; voiced from F0_LOWEST to below the vocoder's audio.fmax and
    half its rate, where its harmonic source has a first harmonic) from `path`, one value per mel frame,
    or MelError naming the file."""
    f0 = _load(path)
    if f0.ndim != 1 or not (np.issubdtype(f0.dtype, np.floating) or np.issubdtype(f0.dtype, np.integer)) \
            or len(f0) != frames:
        raise MelError(f"{path}: a {f0.dtype} array of shape {f0.shape}, expected F0 in Hz [{frames}] "
                       f"(one value per mel frame, 0 where unvoiced)")
    f0 = _float32(path, f0)
    top = min(audio_cfg["sample_rate"] / 2, audio_cfg["fmax"])
    voiced = f0[f0 > 0]
    if not np.all(np.isfinite(f0)) or f0.min() < 0 or (voiced.size and (voiced.min() < F0_LOWEST or voiced.max() >= top)):
        shown = voiced if np.all(np.isfinite(f0)) and f0.min() >= 0 else f0  # the voiced values when they are wrong
        shown = f"{shown.min():g}..{shown.max():g}"   # :g, not .1f: a tiny 0.01 read as "0.0", unvoiced
        raise MelError(f"{path}: values {shown} are not F0 in Hz (finite; 0 where unvoiced, else "
                       f"{F0_LOWEST:g} Hz up to below {top:g} Hz, the vocoder's audio.fmax and half its rate)")
    return f0


def vocode(cfg, mel_path, out, chunk_frames=kinds.CHUNK_FRAMES, f0_path=None, config_path=None):
    """`f0_path`: F0 per frame (.npy, Hz, 0 unvoiced) for kinds that use F0; None: their own F0 head's.
    `config_path`: the --config file, which --out must not be either."""
    check_path(out, "--out")
    # and not the run's vocoder: a wav over its vocoder.json or a checkpoint file broke every later vocode
    check_not_input(out, "--out", {"--mel": mel_path, "--f0": f0_path, "--config": config_path,
                                   "the vocoder's summary": kinds.summary_path(cfg),
                                   "the vocoder's checkpoints": config.run_dir(cfg) / "vocoder"})
    chunked = kinds.KINDS.get(cfg["vocoder"]["kind"]).context is not None
    # the vocoder's own settings (the n_mels it takes, the rate it speaks at), read before it is built
    audio_cfg = kinds.trained_audio(cfg)
    mel = read_mel(mel_path, audio_cfg, MAX_FRAMES if chunked else WHOLE_MAX_FRAMES)
    f0 = read_f0(f0_path, len(mel), audio_cfg) if f0_path else None
    voc = kinds.load(cfg)
    audio_cfg = voc.audio
    audio = voc(mel, f0=f0, chunk_frames=chunk_frames)
    try:
        save_wav(out, audio, audio_cfg["sample_rate"])
    except OSError as e:  # a full disk is pipeline.errors.DiskFull already
        raise PipelineError(f"--out {out}: cannot write it ({e.strerror or e})") from None
    print(f"{out}: {len(audio) / audio_cfg['sample_rate']:.2f} s from {mel_path} ({len(mel)} frames) "
          f"through the {voc.kind} vocoder" + (f" ({voc.steps} + {voc.finetune_steps} steps)" if voc.model else ""),
          flush=True)
    return audio


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="A log-mel .npy through the run's vocoder into a wav.")
    config.add_arguments(parser)
    parser.add_argument("--mel", required=True, help="log-mel [frames, n_mels] .npy")
    parser.add_argument("--f0", help="F0 in Hz per mel frame [frames] .npy, 0 unvoiced (vocoder.kind source_filter; "
                        "default: its own F0 head's estimate from the mel; other kinds ignore it)")
    parser.add_argument("--out", required=True, help="the wav to write")
    args = parser.parse_args(argv)
    vocode(config.from_args(args, check_paths=False), args.mel, args.out, f0_path=args.f0, config_path=args.config)


if __name__ == "__main__":
    main()
