"""Does the trained model say held-out sentences? Nearest-sentence identification against espeak-ng.

    python benchmarks/heldout.py                       # lines 1000-1019 of data/ljspeech_transcripts.csv
    python benchmarks/heldout.py --start 2000 --count 20 --out .bench/heldout
    python benchmarks/heldout.py --config configs/voices.yaml --speaker en-gb+m1 --language en-gb

With several speakers, --speaker picks the model's voice and espeak-ng speaks the candidates in
the voice of that name (make_corpus --voices names speakers after their espeak-ng voices; --voice
overrides it), so each speaker of a multi-speaker model is checked against its own voice.

The demo corpus is espeak-ng speaking the first 90 transcript lines, so espeak-ng's own rendition
of a sentence is what the model should reproduce. For each of --count sentences the model never
saw, the latest checkpoint (pipeline.synthesize.load_synthesizer) makes a log-mel, and espeak-ng
speaks every candidate sentence; the DTW cost (cosine, per-utterance mean-removed log-mels, divided
by the path's two lengths) of the synthesis against each rendition ranks the candidates. A model
that says its sentences ranks its own first ("identified"); chance is 1 in --count. With
pocketsphinx installed (not a dependency), its word error rate on the Griffin-Lim wavs is printed
beside its rate on espeak-ng's own wavs: the recogniser's floor on this voice. Writes NN.wav (ours)
and NN.espeak.wav into --out and prints one JSON line.
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import librosa  # noqa: E402
import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402

from pipeline import audio, config, make_corpus  # noqa: E402
from pipeline.synthesize import load_synthesizer  # noqa: E402
from pipeline.vocoder.griffin_lim import griffin_lim  # noqa: E402
from pipeline.wavfile import save_wav  # noqa: E402


def features(log_mel):
    m = np.asarray(log_mel, np.float64)
    return (m - m.mean(0)).T                                                   # (n_mels, frames)


def dtw_cost(a, b):
    return float(librosa.sequence.dtw(a, b, metric="cosine")[0][-1, -1] / (a.shape[1] + b.shape[1]))


def word_error_rate(ref, hyp):
    r, h = re.sub(r"[^a-z' ]", " ", ref.lower()).split(), hyp.lower().split()
    d = np.arange(len(h) + 1)
    for i, rw in enumerate(r, 1):
        nd = np.empty_like(d)
        nd[0] = i
        for j, hw in enumerate(h, 1):
            nd[j] = min(d[j] + 1, nd[j - 1] + 1, d[j - 1] + (rw != hw))
        d = nd
    return d[-1] / max(len(r), 1)


def recogniser():
    try:
        from pocketsphinx import Decoder
    except ImportError:
        return None
    decoder = Decoder(samprate=16000)

    def transcribe(path):
        y, sr = sf.read(path, dtype="float32")
        y = librosa.resample(y, orig_sr=sr, target_sr=16000)
        decoder.start_utt()
        decoder.process_raw((np.clip(y, -1, 1) * 32767).astype(np.int16).tobytes(), full_utt=True)
        decoder.end_utt()
        return decoder.hyp().hypstr if decoder.hyp() else ""
    return transcribe


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    config.add_arguments(parser)
    parser.add_argument("--start", type=int, default=1000)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / ".bench" / "heldout"))
    parser.add_argument("--speaker", default="", help="the model's speaker (several speakers)")
    parser.add_argument("--language", default="", help="the model's language (several languages)")
    parser.add_argument("--voice", default="", help="espeak-ng voice of the candidates (default: --speaker, else text.language)")
    args = parser.parse_args(argv)
    cfg = config.from_args(args)
    a = cfg["audio"]
    texts = [r[1] for r in make_corpus.read_transcripts(ROOT / "data/ljspeech_transcripts.csv",
                                                        start=args.start, count=args.count)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    synth = load_synthesizer(cfg, log=lambda *m: None)
    ours, theirs = [], []
    for i, text in enumerate(texts):
        mel = synth.mel(text, speaker=args.speaker, language=args.language)  # (frames, n_mels)
        save_wav(out / f"{i:02d}.wav", np.asarray(griffin_lim(mel, iters=32, **a)), a["sample_rate"])
        y, sr = make_corpus.speak(text, voice=args.voice or args.speaker or cfg["text"]["language"])
        sf.write(out / f"{i:02d}.espeak.wav", y, sr)
        ours.append(features(mel))
        theirs.append(features(audio.mel_spectrogram(y, **a)))
    cost = np.array([[dtw_cost(o, t) for t in theirs] for o in ours])          # (ours, candidates)
    ranks = [int((cost[i] < cost[i, i]).sum()) + 1 for i in range(len(texts))]
    result = {"checkpoint": synth.checkpoint, "speaker": args.speaker, "sentences": len(texts), "identified": sum(r == 1 for r in ranks),
              "mean_rank": float(np.mean(ranks)), "chance": 1 / len(texts),
              "length_ratio": float(np.median([o.shape[1] / t.shape[1] for o, t in zip(ours, theirs)]))}
    transcribe = recogniser()
    if transcribe:
        result["wer_ours"] = float(np.mean([word_error_rate(t, transcribe(out / f"{i:02d}.wav"))
                                            for i, t in enumerate(texts)]))
        result["wer_espeak"] = float(np.mean([word_error_rate(t, transcribe(out / f"{i:02d}.espeak.wav"))
                                              for i, t in enumerate(texts)]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
