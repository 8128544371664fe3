"""Copy-synthesis: a log-mel [F, n_mels] (.npy, as synthesize writes runs/{name}/samples/NN.npy, or
a mel cut out of a cache) through the run's trained vocoder (Griffin-Lim with vocoder.kind
griffin_lim) into a 16-bit wav of F * hop_length samples.

Reads runs/{name}/vocoder.json and its checkpoint; config keys audio.*, vocoder.kind,
synthesize.griffin_lim_iters (Griffin-Lim only).

    python -m pipeline.vocode --config configs/config.yaml --mel runs/demo/samples/00.npy --out 00.wav
"""
import argparse

import numpy as np

from pipeline import config
from pipeline.audio import LOG_CLAMP
from pipeline.errors import PipelineError, cli
from pipeline.vocoder import kinds
from pipeline.vocoder.griffin_lim import save_wav


class MelError(PipelineError):
    """A mel file the vocoder cannot take; the message names the file."""


def read_mel(path, audio_cfg):
    """(F, n_mels) float32 log-mel from `path`, or MelError naming the file and what is wrong."""
    try:
        mel = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise MelError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise MelError(f"{path}: not a .npy array ({str(e).splitlines()[0]})") from None
    n_mels = audio_cfg["n_mels"]
    if mel.ndim != 2 or not np.issubdtype(mel.dtype, np.floating):
        raise MelError(f"{path}: a {mel.dtype} array of shape {mel.shape}, expected a float log-mel [frames, {n_mels}]")
    if mel.shape[1] != n_mels:
        hint = " (transposed? the frames come first)" if mel.shape[0] == n_mels else ""
        raise MelError(f"{path}: {mel.shape[1]} mel bands, the config's audio.n_mels is {n_mels}{hint}: "
                       f"a mel made with other audio: settings")
    if mel.shape[0] == 0:
        raise MelError(f"{path}: no frames")
    if not np.all(np.isfinite(mel)):
        raise MelError(f"{path}: holds NaN or infinite values")
    floor = np.log(LOG_CLAMP)
    # a model's mel may overshoot the clamp a little (synthesize writes it unclamped); a dB mel goes to -80 or -100
    if mel.min() < floor - 3.0 or mel.max() > 8.0:
        raise MelError(f"{path}: values {mel.min():.2f}..{mel.max():.2f} are not a natural-log mel clamped at "
                       f"log({LOG_CLAMP}) = {floor:.2f} (a dB or normalised mel? made with other audio: settings?)")
    return mel.astype(np.float32)


def vocode(cfg, mel_path, out):
    mel = read_mel(mel_path, cfg["audio"])
    voc = kinds.load(cfg)
    audio = voc(mel)
    save_wav(out, audio, cfg["audio"]["sample_rate"])
    print(f"{out}: {len(audio) / cfg['audio']['sample_rate']:.2f} s from {mel_path} ({len(mel)} frames) "
          f"through the {voc.kind} vocoder" + (f" ({voc.steps} + {voc.finetune_steps} steps)" if voc.model else ""),
          flush=True)
    return audio


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="A log-mel .npy through the run's vocoder into a wav.")
    config.add_arguments(parser)
    parser.add_argument("--mel", required=True, help="log-mel [frames, n_mels] .npy")
    parser.add_argument("--out", required=True, help="the wav to write")
    args = parser.parse_args(argv)
    vocode(config.from_args(args, check_paths=False), args.mel, args.out)


if __name__ == "__main__":
    main()
