"""Mel-cepstra, DTW and MCD on the shipped demo recordings, checked against SPTK (pysptk)."""
import librosa
import numpy as np
import pysptk
import pytest
import soundfile as sf
from conftest import ROOT

from pipeline import audio, config, make_corpus, metrics, pitch

SR, HOP = 22050, 256
DEMO = ROOT / "data" / "demo" / "wavs"
PITCH = config.load_config()["pitch"]  # the default extractor (dio), as the pitch cache runs it
PITCH_FMIN = PITCH["fmin"]


def pitch_f0(y, sample_rate, hop_length):
    return pitch.f0(y, sample_rate=sample_rate, hop_length=hop_length, n_frames=audio.n_frames(len(y), hop_length),
                    **PITCH)


def recording(clip_id):
    return audio.load_audio(DEMO / f"{clip_id}.flac", sample_rate=SR, max_seconds=20.0)


def band(x, low, high):
    """`x` through an ideal band-pass [low, high) Hz (by FFT)."""
    spec = np.fft.rfft(x)
    hz = np.fft.rfftfreq(len(x), 1.0 / SR)
    return np.fft.irfft(np.where((hz >= low) & (hz < high), spec, 0.0), len(x))


def cepstra(y):
    f0 = pitch_f0(y, SR, HOP)
    return metrics.mel_cepstra(y, f0, sample_rate=SR, hop_length=HOP, f0_floor=PITCH_FMIN), f0


@pytest.mark.parametrize("sample_rate", [16000, 22050, 24000, 44100, 48000])
def test_alpha_matches_sptk(sample_rate):
    assert metrics.mcep_alpha(sample_rate) == pytest.approx(pysptk.util.mcepalpha(sample_rate), abs=1e-9)


# fmax below Nyquist: the envelope of the signal resampled to 2 * fmax, its cepstra warped for that rate
# and CheapTrick's FFT sized for it (a 50 Hz floor needs 2048 points at 22.05 kHz, 1024 at 16 kHz)
@pytest.mark.parametrize("fmax, f0_floor", [(None, PITCH_FMIN), (8000, PITCH_FMIN), (8000, 50.0)])
def test_mel_cepstra_match_sptk_sp2mc(fmax, f0_floor):
    y = recording("LJ001-0016")
    f0 = pitch_f0(y, SR, HOP)
    import pyworld
    import soxr
    rate = SR if fmax is None else 2 * fmax
    x = y if fmax is None else soxr.resample(y.astype(np.float64), SR, rate, quality="HQ")
    t = (np.arange(len(y) // HOP) + 0.5) * HOP / SR                     # frame i centred at (i + 0.5) * hop
    sp = pyworld.cheaptrick(x.astype(np.float64), f0.astype(np.float64), t, rate, f0_floor=f0_floor)
    ours = metrics.mel_cepstra(y, f0, sample_rate=SR, hop_length=HOP, f0_floor=f0_floor, fmax=fmax)
    sptk = np.stack([pysptk.sp2mc(frame, metrics.ORDER, pysptk.util.mcepalpha(rate)) for frame in sp[::7]])
    assert ours.shape == (len(y) // HOP, metrics.ORDER + 1)
    np.testing.assert_allclose(ours[::7], sptk, rtol=1e-9, atol=1e-9)


def test_mcd_is_zero_for_a_recording_against_itself():
    mc, _ = cepstra(recording("LJ001-0016"))
    dist, path = metrics.mcd(mc, mc)
    assert dist == 0.0
    np.testing.assert_array_equal(path[:, 0], path[:, 1])  # the diagonal
    assert len(path) == len(mc)
    # c0 (loudness) counts neither in the distance nor in the DTW that pairs the frames: the same
    # recording with its loudness changed frame by frame is 0 dB away, along the diagonal
    louder = mc.copy()
    louder[:, 0] += np.random.default_rng(0).normal(0.0, 5.0, len(mc))
    dist, path = metrics.mcd(louder, mc)
    assert dist == 0.0
    np.testing.assert_array_equal(path, np.stack([np.arange(len(mc))] * 2, 1))


def test_mcd_orders_stretched_copy_below_another_sentence():
    y = recording("LJ001-0016")
    mc, f0 = cepstra(y)
    stretched, f0_stretched = cepstra(librosa.effects.time_stretch(y, rate=1.25))  # same words, 25 % faster
    other, _ = cepstra(recording("LJ001-0067"))
    d_stretched, path = metrics.mcd(stretched, mc)
    d_other, _ = metrics.mcd(other, mc)
    assert 0 < d_stretched < d_other
    # DTW undoes the stretch: the path advances ~1.25 recorded frames per stretched frame
    slope = np.polyfit(path[:, 0], path[:, 1], 1)[0]
    assert 1.1 < slope < 1.4
    # start to end: from the first pair of frames to the last, never stepping back
    assert tuple(path[0]) == (0, 0) and tuple(path[-1]) == (len(stretched) - 1, len(mc) - 1)
    assert np.all(np.diff(path, axis=0) >= 0) and np.all(np.diff(path, axis=0).sum(1) >= 1)
    # same speaker, same words, same pitch contour: F0 agrees within a few Hz on the DTW pairs
    rmse, frames = metrics.f0_rmse(f0_stretched, f0, path)
    assert frames > 100 and rmse < 15.0


def test_warp_to_gives_audio_back_on_the_identity_and_retimes_without_clicks():
    y = recording("LJ001-0016")
    n = len(y) // HOP
    identity = np.stack([np.arange(n), np.arange(n)], 1)
    np.testing.assert_allclose(metrics.warp_to(y, identity, n_frames=n, hop_length=HOP), y[:n * HOP], atol=1e-6)
    # a tone re-timed onto a recording 25 % longer: the path repeats every 4th frame
    tone = np.sin(2 * np.pi * 220.5 * np.arange(n * HOP) / SR).astype(np.float32)
    longer = n * 5 // 4
    path = np.stack([np.arange(longer) * n // longer, np.arange(longer)], 1)
    warped = metrics.warp_to(tone, path, n_frames=longer, hop_length=HOP)
    assert warped.shape == (longer * HOP,)
    # frames butted together jump by up to 2 where one repeats; cross-faded, no step exceeds the tone's own by much
    assert np.abs(np.diff(warped)).max() < 1.25 * np.abs(np.diff(tone)).max()


def test_mcd_formula_on_known_cepstra():
    # one coefficient apart by 1 in every frame: 10 / ln 10 * sqrt(2) dB; c0 differences do not count
    a = np.zeros((5, metrics.ORDER + 1))
    b = a.copy()
    b[:, 3] = 1.0
    b[:, 0] = 50.0
    assert metrics.mcd_aligned(a, b) == pytest.approx(10 / np.log(10) * np.sqrt(2))
    assert metrics.mcd(a, b)[0] == pytest.approx(10 / np.log(10) * np.sqrt(2))


def test_mcd_by_voicing_splits_the_pairs_by_the_recordings_f0():
    # the recording's cepstra, a copy that differs only where the recording is unvoiced, paired by a DTW
    # path that repeats frames: 0 dB on the voiced pairs, the whole distortion on the others, and the
    # overall MCD their mix by the pairs' share
    mc, f0 = cepstra(recording("LJ001-0016"))
    voiced = f0[:len(mc)] > 0
    assert 0.3 < voiced.mean() < 0.9
    copy = mc.copy()
    copy[~voiced, 2] += 1.0
    copy[~voiced, 0] += 9.0                                  # c0 (loudness) does not count
    path = np.stack([np.arange(len(mc)), np.arange(len(mc))], 1).repeat(1 + (np.arange(len(mc)) % 3 == 0), axis=0)
    on_voiced, on_others = metrics.mcd_by_voicing(copy, mc, path, voiced)
    assert on_voiced == 0.0 and on_others == pytest.approx(10 / np.log(10) * np.sqrt(2))
    share = voiced[path[:, 1]].mean()
    assert np.mean(metrics._pair_distances(copy, mc, path)) == pytest.approx((1 - share) * on_others)
    assert metrics.mcd(copy, mc)[0] == pytest.approx((1 - voiced.mean()) * on_others, rel=0.05)
    # all voiced or none: the other side has no pairs
    assert metrics.mcd_by_voicing(mc, mc, path, np.ones(len(mc), bool)) == (0.0, None)
    assert metrics.mcd_by_voicing(mc, mc, path, np.zeros(len(mc), bool)) == (None, 0.0)
    # the voicing of a pair is its b (recording) frame's, also where the path leaves the diagonal: b's
    # c1 is 0, 1, 2 dB-units from a's, only b's first frame voiced
    a, b = np.zeros((3, metrics.ORDER + 1)), np.zeros((3, metrics.ORDER + 1))
    b[:, 1] = [0.0, 1.0, 2.0]
    lag = np.array([[0, 0], [0, 1], [0, 2], [1, 2], [2, 2]])
    unit = 10 / np.log(10) * np.sqrt(2)
    assert metrics.mcd_by_voicing(a, b, lag, np.array([True, False, False])) == (0.0, pytest.approx(1.75 * unit))


def test_two_renderings_of_one_noise_spectrum_differ_by_several_db():
    # why evaluate splits the MCD by voicing: white noise through one band-pass shape, twice, with
    # different seeds, is the same sound to a listener, yet its WORLD envelopes differ by several dB a
    # frame; the same rendering twice by 0
    hz = np.fft.rfftfreq(SR * 2, 1.0 / SR)
    shape = np.exp(-0.5 * ((hz - 3000.0) / 1000.0) ** 2)                    # one smooth band around 3 kHz
    noise = [np.fft.irfft(np.fft.rfft(np.random.default_rng(seed).normal(0, 0.1, SR * 2)) * shape, SR * 2)
             for seed in (1, 2)]
    f0 = np.zeros(len(noise[0]) // HOP)
    mc = [metrics.mel_cepstra(x, f0, sample_rate=SR, hop_length=HOP, f0_floor=PITCH_FMIN, fmax=8000) for x in noise]
    assert metrics.mcd(mc[0], mc[1])[0] > 3.0
    assert metrics.mcd(mc[0], mc[0])[0] == 0.0


def test_f0_rmse_uses_only_frames_voiced_in_both():
    path = np.stack([np.arange(4), np.arange(4)], 1)
    rmse, frames = metrics.f0_rmse(np.array([100.0, 0, 120, 200]), np.array([110.0, 150, 0, 200]), path)
    assert frames == 2 and rmse == pytest.approx(np.sqrt((10**2 + 0) / 2))
    assert metrics.f0_rmse(np.zeros(4), np.ones(4), path) == (pytest.approx(float("nan"), nan_ok=True), 0)
    # off the diagonal each side is read at its own frame: b lags a by a frame, the path pairs them back
    lag = np.array([[0, 0], [0, 1], [1, 2], [2, 3]])
    assert metrics.f0_rmse(np.array([100.0, 120, 140]), np.array([0.0, 100, 120, 140]), lag) == (0.0, 3)


def test_gross_pitch_error_counts_octave_jumps_among_frames_voiced_in_both():
    path = np.stack([np.arange(5), np.arange(5)], 1)
    a = np.array([100.0, 200.0, 110.0, 0.0, 150.0])
    b = np.array([100.0, 100.0, 100.0, 120.0, 0.0])   # frame 1 an octave off, frame 2 10 % off
    assert metrics.f0_gross_error(a, b, path) == pytest.approx(1 / 3)
    assert metrics.f0_gross_error(np.zeros(5), b, path) is None
    lag = np.array([[0, 0], [0, 1], [1, 2], [2, 3]])   # b lags a by a frame, the path pairs them back
    assert metrics.f0_gross_error(np.array([100.0, 200, 100]), np.array([0.0, 100, 200, 100]), lag) == 0.0
    # off by more than 20 % of the recording's (b's) F0, as GPE counts: 18 % below it is not, 25 % above it is
    one = np.array([[0, 0]])
    assert metrics.f0_gross_error(np.array([82.0]), np.array([100.0]), one) == 0.0
    assert metrics.f0_gross_error(np.array([125.0]), np.array([100.0]), one) == 1.0


def test_mcd_measures_the_band_the_mel_carries():
    # the demo recordings are 16 kHz: at 22.05 kHz their 8-11 kHz band is empty. A faint hiss there
    # (1e-5, inaudible next to speech at ~0.7) must not read as distortion when the mel stops at 8 kHz,
    # while the full-band analysis (fmax None) is dominated by it; a change inside the band still counts.
    y = recording("LJ001-0016")
    f0 = pitch_f0(y, SR, HOP)
    hiss = band(np.random.default_rng(0).standard_normal(len(y)) * 1e-5, 8500, SR)
    muffled = band(y, 0, 3000)

    def dist(z, fmax):
        kw = dict(sample_rate=SR, hop_length=HOP, f0_floor=PITCH_FMIN, fmax=fmax)
        return metrics.mcd_aligned(metrics.mel_cepstra(z, f0, **kw), metrics.mel_cepstra(y, f0, **kw))

    assert metrics.analysis_rate(SR, 8000) == 16000 and metrics.analysis_rate(SR, None) == SR
    assert dist(y + hiss, None) > 5.0                # the empty band dominates a full-band figure
    assert dist(y + hiss, 8000) < 0.5                # and is out of the mel's band
    assert dist(muffled, 8000) > 2.0                 # losing 3-8 kHz is distortion either way


def test_pesq_and_stoi_hear_their_own_band_and_no_speech_scores_none():
    # wideband PESQ listens at 16 kHz, STOI at 10 kHz, whatever the rate given: a loud hiss above their
    # Nyquist (8 and 5 kHz) is resampled away before scoring, the same hiss within 1-4 kHz is heard
    y = recording("LJ001-0016")
    noise = np.random.default_rng(0).standard_normal(len(y)) * 3 * y.std()
    above_pesq, above_stoi, within = (y + band(noise, low, high).astype(np.float32)
                                      for low, high in ((8500, SR), (5500, SR), (1000, 4000)))
    clean = metrics.pesq_wb(y, y, SR)
    assert clean > 4.5 and metrics.pesq_wb(y, above_pesq, SR) == pytest.approx(clean, abs=0.05)
    assert metrics.pesq_wb(y, within, SR) < 2.0
    assert metrics.stoi(y, y, SR) == pytest.approx(1.0) and metrics.stoi(y, above_stoi, SR) > 0.99
    assert metrics.stoi(y, within, SR) < 0.9
    assert metrics.pesq_wb(np.zeros_like(y), y, SR) is None      # a recording without speech: no score
    assert metrics.pesq_wb(y, np.zeros_like(y), SR) is None      # a silent output (as saved: every sample 0)
    # STOI needs ~0.4 s of sound: below, pystoi said 1e-5 (with a warning) even for two identical signals
    short = y[:int(0.3 * SR)]
    assert metrics.stoi(short, short, SR) is None and metrics.stoi(y, np.zeros_like(y), SR) == 0.0


def test_an_output_with_no_sound_scores_the_bottom_of_each_scale_not_none():
    # a silent TTS output was "no score", which the medians leave out: 4 silent clips of 6 made the TTS's
    # PESQ and naturalness those of the 2 others
    from pipeline import evaluate
    y = recording("LJ001-0016")
    out = evaluate.listen(y, {"synthesized": np.zeros_like(y)}, {"recording": y, "synthesized": np.zeros_like(y)},
                          "", "de", SR)   # German: no recognizer, only the scores
    assert (out["pesq_synthesized"], out["mos_synthesized"]) == (metrics.PESQ_FLOOR, metrics.MOS_FLOOR)
    assert out["stoi_synthesized"] == 0.0 and out["mos_recording"] > 2.0
    silent = np.zeros_like(y)   # no recording to judge by: nothing scored
    out = evaluate.listen(silent, {"synthesized": silent}, {"recording": silent, "synthesized": silent}, "", "de", SR)
    assert out["pesq_synthesized"] is None and out["mos_synthesized"] is None and out["mos_recording"] is None


# --- what a listener hears ---------------------------------------------------------------------
def test_mos_predictor_ranks_clean_speech_above_the_same_speech_in_heavy_noise():
    y = recording("LJ001-0016")
    noisy = y + np.random.default_rng(0).standard_normal(len(y)).astype(np.float32) * y.std()  # 0 dB SNR
    clean, buried = metrics.naturalness(y, SR), metrics.naturalness(noisy, SR)
    assert 1.0 <= buried < clean - 0.5 <= 4.5
    # noise with the recording's own spectrum and loudness, frame by frame (the report's chance level)
    assert metrics.naturalness(metrics.speech_shaped_noise(y, SR), SR) < clean - 0.4
    assert metrics.naturalness(np.zeros(SR, np.float32), SR) is None  # silence is not scored


def test_wer_normalises_both_sides_and_counts_substitutions_deletions_insertions():
    text = "Dr. Smith paid $5.50 on May 1st, 1865 -- in the 'Low Countries'!"
    heard = "doctor smith paid five dollars fifty cents on may first eighteen sixty five in the low countries"
    assert metrics.words(text) == heard and metrics.wer(text, heard) == 0.0
    assert metrics.wer(heard.upper(), text) == 0.0                     # the same cleaners on both sides
    # "brown" heard as "crown" (a substitution), "fox" lost (a deletion): 2 errors in 5 words
    assert metrics.wer("The quick brown fox jumps.", "the quick crown jumps") == pytest.approx(0.4)
    assert metrics.wer("the quick brown fox jumps", "the the quick brown fox jumps over") == pytest.approx(0.4)
    assert metrics.wer("the fox", "") == 1.0 and metrics.wer("...", "a word") is None


def test_the_recognizer_hears_the_sentence_an_espeak_recording_says():
    # three short demo recordings (espeak-ng, like the test corpus) it hears best: 0.50-0.60 of their
    # words wrong (the median over all 90 is 0.83: it was trained on human voices)
    texts = dict(line.split("|")[:2] for line in (ROOT / "data" / "demo" / "metadata.csv").read_text().splitlines())
    ids = ["LJ001-0008", "LJ001-0061", "LJ001-0083"]
    heard = {cid: metrics.transcribe(recording(cid), SR) for cid in ids}
    own = [metrics.wer(texts[cid], heard[cid]) for cid in ids]
    shuffled = [metrics.wer(texts[ids[(i + 1) % len(ids)]], heard[cid]) for i, cid in enumerate(ids)]
    assert np.mean(own) < np.mean(shuffled) - 0.25, (heard, own, shuffled)
    assert min(shuffled) >= 0.8  # another sentence's words are (nearly) all wrong
    # the same words in the other order: what the decoder heard before does not change what it hears
    # (its noise and cepstral-mean estimates carried over: LJ001-0083 was heard otherwise after LJ001-0008)
    assert {cid: metrics.transcribe(recording(cid), SR) for cid in ids[::-1]} == heard


def test_heldout_sentences_are_spoken_once_and_worlds_copy_is_scored_near_the_recording(tmp_path, capsys):
    # benchmarks/vocoder.py --heldout START:COUNT --world: transcript lines the demo never saw, spoken by
    # espeak-ng and kept for the next run; WORLD's analysis-synthesis of each, scored by evaluate's predictor
    from benchmarks import vocoder as bench
    clips = bench.heldout_clips("1000:2", "en-us", tmp_path)
    lines = make_corpus.read_transcripts(ROOT / "data" / "ljspeech_transcripts.csv", start=1000, count=2)
    assert [(c.id, c.text, c.f0) for c in clips] == [(cid, text, None) for cid, text, _ in lines]
    stamps = [c.audio.stat().st_mtime_ns for c in clips]
    again = bench.heldout_clips("1000:2", "en-us", tmp_path)
    assert [c.audio for c in again] == [c.audio for c in clips] and [c.audio.stat().st_mtime_ns for c in clips] == stamps
    assert {c.audio.parent for c in bench.heldout_clips("1000:2", "en-gb", tmp_path)} == {tmp_path / "en-gb"}  # its own
    y = audio.load_audio(clips[0].audio, sample_rate=SR, max_seconds=20.0)
    (world,) = bench.world_naturalness(clips[:1], SR, 20.0)
    assert 2.0 < world and abs(world - metrics.naturalness(y, SR)) < 0.6  # a copy, not noise (chance ~2.2)
    # a malformed range or round count is one line naming the option, before anything loads
    for bad, said in ((["--heldout", "1000"], "--heldout '1000': START:COUNT"), (["--heldout", "5:0"], "--heldout '5:0'"),
                      (["--rounds", "0"], "--rounds 0: 1 or more")):
        with pytest.raises(SystemExit):
            bench.main(bad)
        assert said in capsys.readouterr().err


def test_listening_measures_hear_audio_as_it_is_saved_not_clipped(tmp_path):
    # the source-filter copies peak at 1.2-1.5: the measures heard them hard-clipped, while every
    # delivery path (evaluate_audio/, speak --out, synthesize) scales such audio whole to a 0.95 peak
    from pipeline import wavfile
    t = np.arange(16000) / 16000
    y = (1.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    heard = metrics.to_listen_rate(y, 16000)
    np.testing.assert_allclose(heard, y * (0.95 / 1.5), atol=1.5 / 32768)
    np.testing.assert_allclose(wavfile.as_heard(0.5 * y), 0.5 * y, atol=1 / 32768)  # what would not clip: kept
    # ... and in the saved wav's 16-bit samples: a float residue below one step, where a recording holds
    # digital silence, scored 13-20 dB a frame in the MCD of evaluate's Griffin-Lim copy (5.3 dB for 3.9)
    quiet = np.concatenate([y, np.full(4000, 1e-6, np.float32)])
    wavfile.save_wav(tmp_path / "saved.wav", quiet, 16000)
    np.testing.assert_array_equal(wavfile.as_heard(quiet), sf.read(str(tmp_path / "saved.wav"), dtype="float32")[0])
    assert not wavfile.as_heard(quiet)[-4000:].any()
    np.testing.assert_array_equal(metrics.to_listen_rate(quiet, 16000), wavfile.as_heard(quiet))


def test_chance_noise_has_the_recordings_loudness():
    rng = np.random.default_rng(0)
    y = (0.3 * np.sin(2 * np.pi * 150 * np.arange(22050) / 22050) * (1 + 0.5 * rng.random(22050))).astype(np.float32)
    noise = metrics.speech_shaped_noise(y, 22050)
    assert np.sqrt(np.mean(noise.astype(np.float64) ** 2)) == pytest.approx(np.sqrt(np.mean(y.astype(np.float64) ** 2)),
                                                                             rel=1e-4)
