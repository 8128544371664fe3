"""The aligner's forward pass in NumPy: what a duration shard job runs, without TensorFlow.

pipeline/models/aligner.py defines and trains the model in TensorFlow; importing TensorFlow costs a
job ~5.6 CPU-seconds, more than aligning a 100-clip shard. Training writes the weights a second time
as plain named arrays (`aligner.npz`, `arrays`), and `log_probs` here computes what
`Aligner.call(...)["log_probs"]` computes for one clip, op for op in float32: the token encoder
(embedding, + the language vector, conv k=3 + ReLU, conv k=1), the mel encoder (conv k=3 + ReLU,
+ the speaker vector, conv k=1 + ReLU, conv k=1), -temperature * squared distance, log-softmax over
the tokens, + the beta-binomial prior, log-softmax again. A clip is not padded: the model's padding
is masked to exact zeros, so it changes nothing but the order of some float sums.

The two agree to float32 rounding, not bit for bit: the log-gamma of the prior is the C library's
lgammaf that TensorFlow calls (the prior is then the same bits), but oneDNN's convolutions and
OpenBLAS's products add in different orders (~1e-4 on log-probabilities of order 1..100). Monotonic
alignment search compares sums of these, so a clip whose two best paths differ by less than that
could move one boundary by a frame; every clip of the demo, the multi-speaker demo and the tests'
corpus gets the same durations from both (tests/test_durations.py, benchmarks/durations.py).

    info, weights = load("runs/demo/aligner/KEY/aligner.json")     # checks aligner.npz's digest
    lp = log_probs(weights, info, tokens, mel, voice_ids(info, speaker, language))  # (F, T)
"""
import json
import math
from pathlib import Path

import numba
import numpy as np

from pipeline.errors import PipelineError
from pipeline.shards import file_digest

LAYERS = ("key0", "key1", "query0", "query1", "query2")


@numba.vectorize(["float32(float32)"], cache=True)
def gammaln(x):
    """float32 log|Gamma(x)| by the C library's lgammaf, as TensorFlow's tf.math.lgamma computes it
    (bit for bit; scipy's gammaln rounds a float64 result, which differs in the last bit half the time,
    and the prior subtracts lgammas of ~100 from each other)."""
    return math.lgamma(x)


def arrays_of(model):
    """{name: float32 array} of a built Aligner (pipeline/models/aligner.py): what `aligner.npz` holds."""
    out = {"embedding": model.embedding.get_weights()[0]}
    for name in ("speaker_embedding", "language_embedding"):
        table = getattr(model, name)
        if table is not None:
            out[name] = table.get_weights()[0]
    for name, layer in zip(LAYERS, model.key_convs + model.query_convs):
        out[f"{name}.kernel"], out[f"{name}.bias"] = layer.get_weights()
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def load(aligner_json):
    """(aligner.json's dict, its weights as {name: float32 array}) for `log_probs`; PipelineError when
    the arrays are missing (an aligner trained before they were written), damaged or from another
    training than aligner.json's."""
    path = Path(aligner_json)
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PipelineError(f"{path}: no trained aligner; run `snakemake --cores all aligner`") from None
    retrain = "`snakemake --forcerun train_aligner` retrains it"
    if "arrays" not in info:
        raise PipelineError(f"{path}: this aligner has no aligner.npz (trained by an older version); {retrain}")
    arrays = path.with_name(info["arrays"])
    if not arrays.exists():
        raise PipelineError(f"{arrays}: missing; {retrain}")
    if file_digest(arrays) != info["arrays_digest"]:
        raise PipelineError(f"{arrays}: its digest is not the one {path.name} recorded (damaged, or from "
                            f"another training); {retrain}")
    with np.load(arrays) as f:
        weights = {k: f[k] for k in f.files}
    info["_stats"] = (np.asarray(info["mel_mean"], np.float32), np.asarray(info["mel_std"], np.float32))
    return info, weights


def voice_ids(info, speaker, language):
    """{"speaker": id, "language": id} for a clip's speaker and language names, as the aligner's
    batches carried them (ids into aligner.json's tables; only the fields the aligner has); -1 for a
    name it never saw (log_probs then uses the mean of its vectors)."""
    tables = {"speaker": (info.get("speakers", []), speaker), "language": (info.get("languages", []), language)}
    return {f: table.index(name) if name in table else -1 for f, (table, name) in tables.items() if len(table) > 1}


def _conv(x, kernel, bias):
    """Keras Conv1D, padding "same", stride 1: x (L, C_in), kernel (K, C_in, C_out) -> (L, C_out)."""
    K = kernel.shape[0]
    if K == 1:
        return x @ kernel[0] + bias
    left = (K - 1) // 2
    padded = np.pad(x, ((left, K - 1 - left), (0, 0)))
    out = padded[:len(x)] @ kernel[0]
    for j in range(1, K):
        out += padded[j:j + len(x)] @ kernel[j]
    return out + bias


def _relu(x):
    return np.maximum(x, np.float32(0))


def _vector(table, i):
    """A table's row; an id < 0 (a name the aligner never saw) gets the mean of its rows."""
    return table.mean(axis=0, dtype=np.float32) if i < 0 else table[i]


def _log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def beta_binomial_log_prior(T, F, scaling):
    """(F, T) float32: pipeline/models/aligner.py's prior for one clip (no padding)."""
    f32 = np.float32
    n = f32(T - 1)
    k = np.arange(T, dtype=f32)[None, :]
    f = np.arange(F, dtype=f32)[:, None]
    a, b = f32(scaling) * (f + f32(1)), np.maximum(f32(scaling) * (f32(F) - f), f32(1e-3))

    def lbeta(x, y):
        return gammaln(x) + gammaln(y) - gammaln(x + y)

    log_choose = gammaln(n + f32(1)) - gammaln(k + f32(1)) - gammaln(n - k + f32(1))
    return (log_choose + lbeta(k + a, n - k + b) - lbeta(a, b)).astype(f32)


def log_probs(weights, info, tokens, mel, voices=None):
    """log P(token | frame) for one clip, as pipeline.align.log_probs computes it in TensorFlow: tokens
    (T,) int ids, mel (F, n_mels) log-mel -> (F, T) float64. info: `load`'s aligner.json (the mel
    statistics it normalises with; its `aligner` section gives the temperature and prior scaling);
    voices: {"speaker": id, "language": id} (`voice_ids`)."""
    voices = voices or {}
    w = weights
    mean, std = info["_stats"]
    mel = (np.asarray(mel, np.float32) - mean) / std
    T, F = len(tokens), len(mel)
    k = w["embedding"][np.asarray(tokens)]
    if "language_embedding" in w:
        k = k + _vector(w["language_embedding"], voices.get("language", -1))
    k = _relu(_conv(k, w["key0.kernel"], w["key0.bias"]))
    k = _conv(k, w["key1.kernel"], w["key1.bias"])                             # (T, D)
    q = _relu(_conv(mel, w["query0.kernel"], w["query0.bias"]))
    if "speaker_embedding" in w:
        q = q + _vector(w["speaker_embedding"], voices.get("speaker", -1))
    q = _relu(_conv(q, w["query1.kernel"], w["query1.bias"]))
    q = _conv(q, w["query2.kernel"], w["query2.bias"])                         # (F, D)
    dist = (np.einsum("fd,fd->f", q, q)[:, None] - np.float32(2) * (q @ k.T)
            + np.einsum("td,td->t", k, k)[None, :])                            # (F, T)
    settings = info["aligner"]
    scores = np.float32(-float(settings["temperature"])) * dist
    lp = _log_softmax(scores) + beta_binomial_log_prior(T, F, float(settings["prior_scaling"]))
    return _log_softmax(lp.astype(np.float32)).astype(np.float64)
