"""Duration shards: integer mel frames per token, from the trained aligner, one job per shard.

    python -m pipeline.durations --config CFG --shard 3 --aligner runs/demo/aligner/KEY/aligner.json \\
        --tokens cache/demo/tokens/shard-003.json --mels cache/demo/mels/shard-003.json \\
        --out cache/demo/durations/shard-003
    snakemake --cores all durations

Reads the aligner (its weights and the mel statistics it trained with, runs/{name}/aligner/) and
this shard's token and mel shards. For each clip the aligner's log-probabilities (frames x tokens),
from its forward pass in NumPy (pipeline/models/aligner_numpy.py: a job that imported TensorFlow
spent ~5.6 CPU-seconds on that alone, more than aligning its clips), go through monotonic
alignment search (`mas`, numba, here in the shard job, never in a training step): the most likely
path in which every token gets at least one frame, tokens in order, and every frame exactly one
token, so each clip's durations sum to its mel frames exactly. With several speakers or languages
the aligner hears each clip's speaker and language (names in the token shard, ids from
aligner.json's tables); a name the aligner never saw (a source added after it was trained: a
dataset edit does not retrain it) aligns with the mean of its speaker (language) vectors and is
named in the log. A clip whose audio cannot carry its text (fewer frames than tokens; a token longer than
aligner.max_token_seconds) is still written, to keep the shard 1:1 with its token shard, and listed
under `rejected` with its reason: the loader leaves it out of training with durations, and the
trainer counts it in its log and lists it in runs/{name}/rejected.tsv.
Writes cache/{name}/durations/shard-NNN.{bin,json} with pipeline/shards.py (int32 per token, 1:1
with the token shard) whose provenance names the aligner and the token and mel shards it was made from.
Config keys: aligner.max_token_seconds, audio.hop_length, audio.sample_rate, audio.n_mels.
"""
import argparse
from pathlib import Path

import numba
import numpy as np

from pipeline import config, shards
from pipeline.errors import PipelineError, cli
from pipeline.models import aligner_numpy


@numba.njit(cache=True)
def mas(log_probs):
    """Monotonic alignment search. log_probs (F frames, T tokens), F >= T -> durations (T,) int32 >= 1
    summing to F: the path maximising the summed log-probability (Viterbi, as in Glow-TTS)."""
    F, T = log_probs.shape
    Q = np.full((F, T), -np.inf)
    Q[0, 0] = log_probs[0, 0]
    for f in range(1, F):
        for t in range(max(0, T - (F - f)), min(T, f + 1)):  # cells from which the end is reachable
            move = Q[f - 1, t - 1] if t > 0 else -np.inf
            Q[f, t] = max(Q[f - 1, t], move) + log_probs[f, t]
    durations = np.zeros(T, np.int32)
    t = T - 1
    for f in range(F - 1, -1, -1):
        durations[t] += 1
        if f > 0 and t > 0 and (t == f or Q[f - 1, t - 1] >= Q[f - 1, t]):
            t -= 1
    return durations


def even_durations(n_tokens, n_frames):
    """Frames spread evenly over tokens (the fallback when n_frames < n_tokens: some tokens get 0)."""
    edges = np.round(np.linspace(0, n_frames, n_tokens + 1)).astype(np.int64)
    return np.diff(edges).astype(np.int32)


def check(durations, n_frames, max_frames):
    """The reason a clip's durations look wrong, or None."""
    if int(durations.sum()) != n_frames:
        return f"durations sum to {int(durations.sum())}, not the clip's {n_frames} frames"
    if n_frames < len(durations):
        return f"{n_frames} mel frames for {len(durations)} tokens: the audio is too short for its text"
    longest = int(durations.argmax())
    if durations[longest] > max_frames:
        return (f"token {longest} lasts {int(durations[longest])} frames, longer than aligner.max_token_seconds "
                f"({max_frames} frames): the audio does not carry its text")
    return None


def align_shard(cfg, shard, aligner_json, tokens, mels, out, log=print):
    """Write duration shard `out` (path without suffix) from token and mel shards `tokens`, `mels`."""
    tok_path, mel_path = Path(tokens).with_suffix(""), Path(mels).with_suffix("")
    tok_meta, tok_arrays = shards.read(tok_path, "tokens")
    mel_meta, mel_arrays = shards.read(mel_path, "mels")
    mel_of = dict(zip(mel_meta["ids"], mel_arrays))
    info, weights = aligner_numpy.load(aligner_json)
    to_id = {ord(s): i for i, s in enumerate(info["vocab"])}  # token shards hold code points
    a = cfg["audio"]
    max_frames = int(cfg["aligner"]["max_token_seconds"] * a["sample_rate"] / a["hop_length"])
    durations, rejected, frames, unseen = [], [], [], set()
    names = {f: tok_meta.get(f"{f}s") or [""] * len(tok_meta["ids"]) for f in ("speaker", "language")}
    for i, (cid, points) in enumerate(zip(tok_meta["ids"], tok_arrays)):
        n, mel = len(points), mel_of.get(cid)
        if mel is None:  # rejected audio: the loader skips it; keep the 1:1 layout with the token shard
            durations.append(np.zeros(n, np.int32)); frames.append(0)
            continue
        F = len(mel)
        if F >= n:
            ids = np.array([to_id[int(c)] for c in points], np.int32)
            voices = aligner_numpy.voice_ids(info, names["speaker"][i], names["language"][i])
            unseen.update(f"{f} {names[f][i]!r}" for f, v in voices.items() if v < 0)
            d = mas(aligner_numpy.log_probs(weights, info, ids, mel, voices))
        else:
            d = even_durations(n, F)
        reason = check(d, F, max_frames)
        if reason:
            rejected.append(dict(id=cid, path=str(tok_path.with_suffix(".json")), stage="durations", reason=reason))
            log(f"rejected {cid}: {reason}")
        durations.append(d); frames.append(F)
    if unseen:
        log(f"the aligner never saw {', '.join(sorted(unseen))}: aligned with the mean of its vectors "
            "(`snakemake --forcerun train_aligner` retrains it on every speaker)")
    provenance = {"aligner": info["weights_digest"], "tokens": shards.file_digest(tok_path.with_suffix(".json")),
                  "mels": shards.file_digest(mel_path.with_suffix(".json"))}
    meta = shards.write(out, "durations", tok_meta["ids"], durations, provenance=provenance, frames=frames,
                        rejected=rejected)
    log(f"duration shard {shard}: {len(frames)} clips, {len(rejected)} rejected (left out of training)")
    return meta


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Write one duration shard from the trained aligner.")
    config.add_arguments(parser)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--aligner", required=True, help="runs/{name}/aligner/aligner.json")
    parser.add_argument("--tokens", required=True, help="the shard's token shard (.json)")
    parser.add_argument("--mels", required=True, help="the shard's mel shard (.json)")
    parser.add_argument("--out", required=True, help="shard path without suffix")
    args = parser.parse_args(argv)
    cfg = config.from_args(args, check_paths=False)
    if not 0 <= args.shard < cfg["cache"]["shards"]:
        raise config.ConfigError(f"--shard must be in 0..{cfg['cache']['shards'] - 1}")
    if not Path(args.aligner).exists():
        raise PipelineError(f"{args.aligner}: no trained aligner; run `snakemake --cores all aligner`")
    align_shard(cfg, args.shard, args.aligner, args.tokens, args.mels, args.out)


if __name__ == "__main__":
    main()
