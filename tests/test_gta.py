"""GTA mels: clips batched through the acoustic model give each clip its own teacher-forced mel, in its
own voice, exactly as one clip at a time would (pipeline.vocoder.gta.teacher_forced_mels)."""
import numpy as np
import tensorflow as tf

from pipeline.models.fastpitch import FastPitch
from pipeline.models.transformer_tts import TransformerTTS
from pipeline.vocoder.gta import teacher_forced_mels

N_MELS = 8
FASTPITCH = dict(n_symbols=12, n_mels=N_MELS, d_model=32, heads=2, encoder_layers=1, decoder_layers=1, ffn_dim=32,
                 ffn_kernel=3, dropout=0.0, predictor_channels=16, predictor_kernel=3, predictor_dropout=0.0,
                 n_speakers=3)
TRANSFORMER = dict(n_symbols=12, n_mels=N_MELS, d_model=32, heads=2, encoder_layers=1, decoder_layers=2, ffn_dim=64,
                   encoder_conv_layers=2, encoder_conv_kernel=3, prenet_dim=32, prenet_dropout=0.0, dropout=0.0,
                   reduction=2, postnet_channels=16, postnet_layers=3, postnet_kernel=3)
NORM = {k: tf.constant(v, tf.float32) for k, v in dict(
    mel_mean=np.full(N_MELS, -5.0), mel_std=np.full(N_MELS, 2.0), pitch_mean=150.0, pitch_std=30.0,
    energy_mean=1.0, energy_std=0.5, speaker_pitch_mean=[120.0, 200.0, 160.0], speaker_pitch_std=[20.0, 35.0, 25.0]).items()}


def clips(n, durations=True, seed=0):
    """n clips of different lengths (3-11 tokens, 1-4 frames a token), speakers 0-2 in turn."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        d = rng.integers(1, 5, rng.integers(3, 12)).astype(np.int32)
        frames = int(d.sum())
        clip = {"tokens": rng.integers(1, 12, len(d)).astype(np.int32),
                "mels": rng.normal(-5.0, 2.0, (frames, N_MELS)).astype(np.float16),
                "pitch": np.where(rng.random(frames) < 0.7, rng.uniform(90, 250, frames), 0.0).astype(np.float32),
                "energy": rng.uniform(0.2, 2.0, frames).astype(np.float32), "speaker": i % 3}
        if durations:
            clip["durations"] = d
        out.append(clip)
    return out


def test_fastpitch_batched_clips_get_their_own_mels_in_their_own_voices():
    model = FastPitch(**FASTPITCH)
    model.speaker_embedding.embeddings.assign(tf.random.normal(model.speaker_embedding.embeddings.shape, seed=1))
    data = clips(11)
    batched = teacher_forced_mels(model, data, NORM, batch_size=4)   # unsorted input, uneven last batch
    alone = teacher_forced_mels(model, data, NORM, batch_size=1)
    assert [len(m) for m in batched] == [len(c["mels"]) for c in data]
    for a, b in zip(batched, alone):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # the voice is each clip's own: speaker 0 for everyone (what GTA mels were before) changes them
    as_first = teacher_forced_mels(model, [dict(c, speaker=0) for c in data], NORM, batch_size=4)
    moved = [np.abs(a - b).max() for a, b, c in zip(batched, as_first, data) if c["speaker"]]
    assert min(moved) > 1e-3


def test_transformer_tts_batched_clips_round_frames_up_to_its_reduction():
    model = TransformerTTS(**TRANSFORMER)
    data = [{k: v for k, v in c.items() if k in ("tokens", "mels", "pitch", "energy")} for c in clips(7, durations=False)]
    assert any(len(c["mels"]) % 2 for c in data)  # odd lengths: padded to the frame multiple
    batched = teacher_forced_mels(model, data, NORM, batch_size=3)
    for a, b, c in zip(batched, teacher_forced_mels(model, data, NORM, batch_size=1), data):
        assert a.shape == (len(c["mels"]), N_MELS)
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_transformer_tts_gta_mels_are_the_same_in_every_process_and_batch(tmp_path):
    """Pre-net dropout stays on when teacher-forced (Tacotron 2: GTA mels are what the model speaks with), but
    its masks came from an unrestored SeedGenerator: every process made other GTA mels (other checksums, so
    fine-tuning never resumed) and a clip's mel moved with the clips beside it. Now each clip's masks are
    seeded by its own tokens: fresh models from one checkpoint agree, in batches of 1 or 4."""
    cfg = dict(TRANSFORMER, prenet_dropout=0.5)
    path = tf.train.Checkpoint(model=TransformerTTS(**cfg)).write(str(tmp_path / "ckpt"))
    data = [{k: v for k, v in c.items() if k in ("tokens", "mels", "pitch", "energy")} for c in clips(7, durations=False)]
    runs = []
    for batch_size in (4, 1):
        model = TransformerTTS(**cfg)                                            # a fresh process's model
        tf.train.Checkpoint(model=model).read(path).assert_existing_objects_matched()
        model.seed_generator.next()                                              # whatever its generator is at
        runs.append(teacher_forced_mels(model, data, NORM, batch_size=batch_size))
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, atol=1e-5)
    no_dropout = TransformerTTS(**dict(cfg, prenet_dropout=0.0))
    tf.train.Checkpoint(model=no_dropout).read(path).expect_partial()
    off = teacher_forced_mels(no_dropout, data, NORM, batch_size=4)
    assert max(np.abs(a - b).max() for a, b in zip(runs[0], off)) > 1e-3  # dropout is on, as at inference
