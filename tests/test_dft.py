"""pipeline.dft against numpy's and TensorFlow's FFTs on the project's frame grid, and its TFLite conversion."""
import numpy as np
import pytest
import tensorflow as tf

from pipeline import dft
from pipeline.audio import frame_padding, mel_spectrogram, stft_magnitude

AUDIO = dict(sample_rate=22050, n_fft=1024, hop_length=256, win_length=1024, n_mels=80, fmin=0, fmax=8000)
GRIDS = [dict(n_fft=1024, hop_length=256, win_length=1024),   # HiFi-GAN's
         dict(n_fft=512, hop_length=128, win_length=400),     # a window shorter than n_fft
         dict(n_fft=64, hop_length=15, win_length=48)]        # odd n_fft - hop: the right pad takes one more


def _window_fn(n_fft, win_length):
    """tf.signal's window_fn for a periodic Hann of win_length centred in n_fft."""
    left = (n_fft - win_length) // 2
    return lambda length, dtype=tf.float32: tf.pad(tf.signal.hann_window(win_length, periodic=True, dtype=dtype),
                                                   [[left, n_fft - win_length - left]])


def speech_like(n, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 22050
    y = sum(0.2 / k * np.sin(2 * np.pi * 180 * k * t + rng.uniform(0, 6)) for k in range(1, 8))
    return (y * (1 + 0.5 * np.sin(2 * np.pi * 3 * t)) + 0.01 * rng.standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("grid", GRIDS)
def test_stft_matches_tf_signal_stft_on_the_reflect_padded_grid(grid):
    y = speech_like(5000)
    real, imag = dft.stft(y, **grid)
    n_fft, hop = grid["n_fft"], grid["hop_length"]
    padded = tf.pad(y, [frame_padding(n_fft=n_fft, hop_length=hop)], mode="REFLECT")
    expected = tf.signal.stft(padded, n_fft, hop, fft_length=n_fft, window_fn=_window_fn(n_fft, grid["win_length"]))
    assert real.shape == imag.shape == expected.shape == (5000 // hop, n_fft // 2 + 1)
    scale = np.abs(expected.numpy()).max()
    np.testing.assert_allclose(real.numpy(), np.real(expected.numpy()), atol=2e-5 * scale)
    np.testing.assert_allclose(imag.numpy(), np.imag(expected.numpy()), atol=2e-5 * scale)


@pytest.mark.parametrize("grid", GRIDS)
def test_magnitude_matches_pipeline_audio(grid):
    y = speech_like(6000, seed=1)
    mag = dft.magnitude(*dft.stft(y, **grid)).numpy()
    expected = stft_magnitude(y, **grid).T                                   # audio's (K, F) -> (F, K)
    assert mag.shape == expected.shape
    np.testing.assert_allclose(mag, expected, rtol=1e-3, atol=2e-5 * expected.max())


def test_magnitude_of_a_silent_bin_is_not_zero_and_its_gradient_finite():
    # a vocoder's silent output (all-zero spectra) must not give NaN gradients: sqrt(re^2 + im^2 + 1e-9)
    zeros = tf.zeros([2, 3])
    with tf.GradientTape() as tape:
        tape.watch(zeros)
        mag = dft.magnitude(zeros, zeros)
    np.testing.assert_allclose(mag.numpy(), np.sqrt(dft.EPSILON))
    assert np.all(np.isfinite(tape.gradient(mag, zeros).numpy()))


def test_log_mel_matches_pipeline_audio_mel():
    y = speech_like(22050, seed=2)
    ours = dft.log_mel_spectrogram(y, **AUDIO).numpy()
    expected = mel_spectrogram(y, **AUDIO)
    assert ours.shape == expected.shape == (22050 // 256, 80)
    np.testing.assert_allclose(ours, expected, atol=2e-3)


@pytest.mark.parametrize("grid", GRIDS)
def test_istft_inverts_stft_batched(grid):
    y = np.stack([speech_like(4 * 1024 + 77, seed=s) for s in (3, 4)])      # [2, n]: leading dims carry through
    back = dft.istft(*dft.stft(y, **grid), **grid).numpy()
    frames = y.shape[1] // grid["hop_length"]
    assert back.shape == (2, frames * grid["hop_length"])
    np.testing.assert_allclose(back, y[:, :back.shape[1]], atol=1e-4)


def test_istft_matches_tf_signal_inverse_stft_on_an_arbitrary_spectrum():
    """The least-squares inverse of an inconsistent spectrum (Griffin-Lim's case) equals the
    tf.signal.inverse_stft construction pipeline.vocoder used, with the same trimming."""
    n_fft, hop, win = 1024, 256, 1024
    rng = np.random.default_rng(5)
    spec = (rng.standard_normal((12, 513)) + 1j * rng.standard_normal((12, 513))).astype(np.complex64)
    spec[:, 0] = spec[:, 0].real                                             # irfft ignores these imaginary parts
    spec[:, -1] = spec[:, -1].real
    window_fn = _window_fn(n_fft, win)
    inverse_window_fn = tf.signal.inverse_stft_window_fn(hop, forward_window_fn=window_fn)
    left, _ = frame_padding(n_fft=n_fft, hop_length=hop)
    weight = window_fn(n_fft) * inverse_window_fn(n_fft, tf.float32)
    overlap = tf.signal.overlap_and_add(tf.tile(weight[None], [12, 1]), hop)[left:left + 12 * hop]
    expected = tf.signal.inverse_stft(spec, n_fft, hop, fft_length=n_fft, window_fn=inverse_window_fn)
    expected = (expected[left:left + 12 * hop] / overlap).numpy()
    ours = dft.istft(spec.real, spec.imag, n_fft=n_fft, hop_length=hop, win_length=win).numpy()
    assert ours.shape == expected.shape == (12 * hop,)
    np.testing.assert_allclose(ours, expected, atol=1e-5 * np.abs(expected).max())


def test_polar_round_trip():
    real, imag = dft.stft(speech_like(3000, seed=6), n_fft=512, hop_length=128, win_length=512)
    mag = tf.sqrt(real ** 2 + imag ** 2)
    re2, im2 = dft.polar(mag, tf.atan2(imag, real))
    np.testing.assert_allclose(re2.numpy(), real.numpy(), atol=1e-4)
    np.testing.assert_allclose(im2.numpy(), imag.numpy(), atol=1e-4)


def test_rfft_transforms_match_the_matmul_ones():
    grid = dict(n_fft=512, hop_length=128, win_length=400)
    y = np.stack([speech_like(3000, seed=s) for s in (9, 10)])                # [2, n]
    real, imag = dft.stft(y, **grid)
    r2, i2 = dft.rfft_stft(y, **grid)
    scale = np.abs(real.numpy()).max()
    np.testing.assert_allclose(r2.numpy(), real.numpy(), atol=2e-5 * scale)
    np.testing.assert_allclose(i2.numpy(), imag.numpy(), atol=2e-5 * scale)
    rng = np.random.default_rng(11)                                           # an inconsistent spectrum
    spec_re, spec_im = (rng.standard_normal((2, 9, 257)).astype(np.float32) for _ in range(2))
    expected = dft.istft(spec_re, spec_im, **grid).numpy()
    np.testing.assert_allclose(dft.rfft_istft(spec_re, spec_im, **grid).numpy(), expected,
                               atol=1e-5 * np.abs(expected).max())
    assert dft.fft_ok(1024) and not dft.fft_ok(1000)


@pytest.mark.parametrize("n_fft", [512, 500])
def test_models_take_the_fft_where_n_fft_is_a_power_of_two_and_the_matmuls_elsewhere(n_fft):
    """dft.transforms, the vocoders' pair: the real FFT at n_fft 2^k, else the matmuls; the same audio
    and spectra either way (the vocoders' gradients and exports rely on both)."""
    grid = dict(n_fft=n_fft, hop_length=125, win_length=400)
    stft, istft = dft.transforms(**grid)
    assert (stft.func, istft.func) == ((dft.rfft_stft, dft.rfft_istft) if n_fft == 512 else (dft.stft, dft.istft))
    y = tf.constant(speech_like(3000, seed=12)[None])
    with tf.GradientTape() as tape:
        tape.watch(y)
        real, imag = stft(y)
        loss = tf.reduce_sum(tf.square(istft(real * 0.5, imag)))
    np.testing.assert_allclose(real.numpy(), dft.stft(y, **grid)[0].numpy(), atol=2e-5 * np.abs(real.numpy()).max())
    audio = istft(real, imag).numpy()[0]
    np.testing.assert_allclose(audio, y.numpy()[0, :audio.shape[0]], atol=1e-4)
    assert np.isfinite(tape.gradient(loss, y).numpy()).all()


def test_overlap_add_matches_tf_signal():
    frames = np.random.default_rng(8).standard_normal((2, 7, 100)).astype(np.float32)
    for hop in (25, 30, 100):                                                # divides the frame, does not, = frame
        np.testing.assert_allclose(dft.overlap_add(tf.constant(frames), hop).numpy(),
                                   tf.signal.overlap_and_add(frames, hop).numpy(), atol=1e-5)


@pytest.mark.parametrize("batch,transforms", [(False, "matmul"), (True, "matmul"), (False, "rfft")])
def test_converts_to_tflite_with_builtin_ops_only(batch, transforms):
    grid = dict(n_fft=1024, hop_length=256, win_length=1024)
    stft, istft = (dft.stft, dft.istft) if transforms == "matmul" else (dft.rfft_stft, dft.rfft_istft)

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None] if batch else [None], tf.float32)])
        def round_trip(self, audio):
            real, imag = stft(audio, **grid)
            return {"audio": istft(real, imag, **grid), "magnitude": dft.magnitude(real, imag)}

    module = Module()
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.round_trip.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]  # no Flex: fails if an op needs one
    interpreter = tf.lite.Interpreter(model_content=converter.convert())
    y = speech_like(8000, seed=7)
    runner = interpreter.get_signature_runner()
    out = runner(audio=y[None] if batch else y)
    audio = out["audio"][0] if batch else out["audio"]
    assert audio.shape == (8000 // 256 * 256,)
    np.testing.assert_allclose(audio, y[:audio.shape[0]], atol=1e-4)
    magnitude = out["magnitude"][0] if batch else out["magnitude"]
    np.testing.assert_allclose(magnitude, stft_magnitude(y, **grid).T, rtol=1e-3, atol=1e-3)
    shorter = runner(audio=np.stack([y[:3000]] * 2) if batch else y[:3000])  # other shapes: they are dynamic
    assert shorter["audio"].shape == ((2, 2816) if batch else (2816,))
    np.testing.assert_allclose(shorter["audio"][0] if batch else shorter["audio"], y[:2816], atol=1e-4)
