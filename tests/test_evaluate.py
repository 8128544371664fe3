"""Evaluate: references and verdicts on real recordings, the report's fields, errors, the Snakemake rule."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import ROOT, edited_copy, load_json, planned_jobs, snakemake

from pipeline import audio, config, evaluate, evaluate_report, manifest, shards, wavfile

REPORT_FIELDS = {"clips", "mcd_db", "mcd_db_other", "mcd_db_ceiling", "duration_ratio", "f0_rmse_hz",
                 "mos", "wer", "mos_chance", "wer_chance"}
# the demo's validation clips (by id hash, dataset.val_fraction 0.1); of the 24-clip test corpus's ids
# only LJ001-0015 and LJ001-0016 are among them
DEMO_VAL = ["LJ001-0015", "LJ001-0016", "LJ001-0058", "LJ001-0067", "LJ001-0068", "LJ001-0078", "LJ001-0083",
            "LJ001-0087", "LJ001-0088"]
SHORT_VAL = ["LJ001-0016", "LJ001-0067"]  # two short ones


def test_the_demo_evaluates_at_least_eight_held_out_clips():
    cfg = config.load_config()
    ids = [line.split("|")[0] for line in (ROOT / "data" / "demo" / "metadata.csv").read_text().splitlines()]
    held_out = sorted(cid for cid in ids if manifest.is_validation(cid, cfg["dataset"]["val_fraction"]))
    assert held_out == DEMO_VAL and min(len(held_out), cfg["evaluate"]["max_clips"]) >= 8


def test_listening_processes_never_outnumber_the_clips():
    # `evaluate --threads N`: one listening process per thread up to MAX_LISTENERS, none idle for
    # want of a clip (a 2-clip corpus on 8 cores starts 2), and none on one thread
    assert evaluate.listeners_for(8, 2) == 2
    assert evaluate.listeners_for(8, 40) == evaluate.MAX_LISTENERS
    assert evaluate.listeners_for(2, 9) == 2
    assert evaluate.listeners_for(1, 9) == 0


def test_naturalness_leads_with_bootstrap_intervals():
    rng = np.random.default_rng(1)
    gl = list(2.5 + rng.random(9))
    # a copy exactly 0.3 above Griffin-Lim on every clip: every resample says so, the interval is that point
    exact = evaluate.lead([g + 0.3 for g in gl], gl)
    assert exact["clips"] == 9 and exact["lead"] == pytest.approx(0.3)
    assert exact["low"] == pytest.approx(0.3) and exact["high"] == pytest.approx(0.3)
    # per-clip noise widens it around the difference of medians; a clip missing either score is left out
    noisy = [g + 0.3 + rng.normal(0, 0.2) for g in gl]
    result = evaluate.lead(noisy + [None, 3.0], gl + [2.0, None])
    assert result["clips"] == 9 and result["lead"] == pytest.approx(np.median(noisy) - np.median(gl))
    assert result["low"] < result["lead"] < result["high"] and result["high"] - result["low"] > 0.1
    assert evaluate.lead(noisy + [None, 3.0], gl + [2.0, None]) == result  # seeded: the same rows, the same interval
    assert evaluate.lead([3.0, 3.1], [2.8, 2.9]) is None  # under 3 paired clips, no interval
    # evaluate.json gives both leads the targets are set on, and evaluate.md says them with their intervals
    figures = evaluate.FIGURES + evaluate.VOCODER_FIGURES
    rows = [{"speaker": "", **dict.fromkeys(figures, 1.0), "mos_vocoder_ceiling": v, "mos_griffin_lim_ceiling": g,
             "mos_synthesized": g + 0.1, "mos_recording": g} for v, g in zip(noisy, gl)]
    leads = evaluate.summarise(rows, vocoder=True)["mos_leads"]
    assert leads["vocoder_ceiling_over_griffin_lim_ceiling"] == result
    assert leads["synthesized_over_recording"]["lead"] == pytest.approx(0.1)
    line = evaluate_report.lead_lines({"mos_leads": leads}, "Vocos")[0]
    assert f"the Vocos copy over Griffin-Lim's {result['lead']:+.3f} ({result['low']:+.3f} to {result['high']:+.3f})" in line
    assert evaluate_report.lead_lines({}, "Vocos") == []


def demo_clips():
    root = ROOT / "data" / "demo"
    texts = {line.split("|")[0]: line.split("|")[1] for line in (root / "metadata.csv").read_text().splitlines()}
    return [evaluate.Clip(cid, texts[cid], root / "wavs" / f"{cid}.flac") for cid in SHORT_VAL]


def test_demo_references_and_verdicts_for_a_perfect_and_a_wrong_model(tmp_path):
    cfg = config.load_config(overrides={"evaluate": {"griffin_lim_iters": 16}})
    analyse = evaluate.Analyser(cfg)
    mels = {c.text: audio.mel_spectrogram(audio.load_audio(c.audio, sample_rate=22050, max_seconds=20), **cfg["audio"])
            for c in demo_clips()}
    texts = list(mels)
    # a model that says exactly the recorded mel: as good as the vocoder allows
    perfect, rows = evaluate.compare(demo_clips(), mels.__getitem__, analyse, log=lambda *a: None)
    assert perfect["clips"] == 2
    assert perfect["mcd_db"] == pytest.approx(perfect["mcd_db_ceiling"])  # Griffin-Lim is deterministic
    assert perfect["mcd_db_ceiling"] < perfect["mcd_db_other"] - 3.0      # the ceiling row is below chance
    assert perfect["duration_ratio"] == 1.0
    # split by the recording's voicing: Griffin-Lim's copy follows the voiced frames' envelope, while the
    # unvoiced ones (noise, pauses) sit near the floor of two renderings of one noise spectrum
    assert perfect["mcd_db_voiced_ceiling"] < perfect["mcd_db_ceiling"] - 0.5
    assert perfect["mcd_db_unvoiced_ceiling"] > perfect["mcd_db_ceiling"] + 0.5
    assert perfect["mcd_db_voiced"] == pytest.approx(perfect["mcd_db_voiced_ceiling"])
    assert 0.3 < perfect["voiced_share"] < 0.9
    # without a trained vocoder the synthesized audio is Griffin-Lim's: the same PESQ and STOI as its ceiling
    assert set(perfect["pesq"]) == set(perfect["stoi"]) == {"synthesized", "griffin_lim_ceiling"}
    assert perfect["pesq"]["synthesized"] == pytest.approx(perfect["pesq"]["griffin_lim_ceiling"], abs=1e-6)
    assert 0.6 < perfect["stoi"]["griffin_lim_ceiling"] <= 1.0 and 1.0 <= perfect["pesq"]["griffin_lim_ceiling"] < 4.6
    # what a listener hears: the recording, and the same Griffin-Lim audio twice, scored alike
    assert set(perfect["mos"]) == set(perfect["wer"]) == {"recording", "synthesized", "griffin_lim_ceiling"}
    assert perfect["mos"]["synthesized"] == pytest.approx(perfect["mos"]["griffin_lim_ceiling"])
    assert perfect["wer"]["synthesized"] == perfect["wer"]["griffin_lim_ceiling"]
    assert 1.0 <= perfect["mos_chance"] < perfect["mos"]["recording"] - 0.4 <= 5.0  # random phase: no voice
    assert perfect["wer_chance"] >= 0.8    # another sentence's words: (nearly) all wrong
    assert all(r["heard_recording"] and 0 <= r["wer_recording"] <= 2 for r in rows)  # what it heard, per clip
    report = {**perfect, "checkpoint": "ckpt-1", "step": 1, "model": None, "griffin_lim_iters": 16,
              "per_clip": [{k: v for k, v in r.items() if k not in evaluate.ARRAYS} for r in rows]}
    assert evaluate_report.verdict(report).startswith("Near the ceiling")
    evaluate_report.write_report(report, rows, tmp_path)
    written = json.loads((tmp_path / "evaluate.json").read_text())
    assert REPORT_FIELDS <= set(written) and len(written["per_clip"]) == 2
    assert (tmp_path / "evaluate.md").read_text().startswith("# Evaluate: 2 validation clips")
    assert (tmp_path / "evaluate.png").read_bytes()[:4] == b"\x89PNG"
    # a model that says the next clip's sentence: at chance
    wrong, _ = evaluate.compare(demo_clips(), lambda t: mels[texts[1 - texts.index(t)]], analyse,
                                log=lambda *a: None)
    assert wrong["mcd_db"] > wrong["mcd_db_ceiling"] + 3.0
    # the recognizer hears the other sentence in it: (nearly) every word wrong, well past the right one's
    assert wrong["wer"]["synthesized"] >= 0.8 and wrong["wer"]["synthesized"] > perfect["wer"]["synthesized"] + 0.2
    assert evaluate_report.verdict({**wrong, "mcd_db_other": perfect["mcd_db_other"]}).startswith("At chance")
    # a model whose every synthesis was cut at synthesize.max_seconds (a decoder that never stops, clips
    # longer than the cap): measured as it was, but said, in the log, the clip's row and evaluate.md
    logged = []
    cut, rows = evaluate.compare(demo_clips(), lambda t: (mels[t][:len(mels[t]) // 2], None, True), analyse,
                                 log=logged.append)
    assert cut["cut"] == 2 and all(r["cut"] for r in rows) and perfect["cut"] == 0
    assert cut["duration_ratio"] == pytest.approx(0.5, abs=0.01)   # synthesized / recorded frames
    assert all("frames (cut at synthesize.max_seconds)" in line for line in logged)
    md = evaluate_report.markdown({**report, **cut, "per_clip": rows})
    assert "Warning: 2 of the 2 syntheses were cut at synthesize.max_seconds" in md
    assert "Warning:" not in evaluate_report.markdown(report)


def test_vocoder_rows_beside_griffin_lims():
    import tensorflow as tf

    from pipeline.vocoder import kinds
    cfg = config.load_config(overrides={"evaluate": {"griffin_lim_iters": 16}, "vocoder": {"kind": "vocos"}})
    mels = {c.text: audio.mel_spectrogram(audio.load_audio(c.audio, sample_rate=22050, max_seconds=20), **cfg["audio"])
            for c in demo_clips()}
    tf.random.set_seed(0)
    untrained = kinds.Vocoder(cfg, kinds.build(cfg["vocoder"], cfg["audio"]))  # a real Vocos, no training
    logged = []
    # as `evaluate --threads 2` runs: a spawned process (no TensorFlow in it) takes the listening measures
    with evaluate.Listeners(1) as listeners:
        result, rows = evaluate.compare(demo_clips(), mels.__getitem__, evaluate.Analyser(cfg, untrained),
                                        log=logged.append, listeners=listeners)
    assert [line.split(":")[0] for line in logged] == SHORT_VAL  # each clip's figures, in clip order
    assert all(f"MOS {r['mos_synthesized']:.2f}, WER {r['wer_synthesized']:.2f}" in line for r, line in zip(rows, logged))
    # ... and its figures are the ones this process makes of the same signals
    sr, signals = rows[0]["signals"]
    here = evaluate.listen(signals["recording"], {}, signals, rows[0]["text"], "en-us", sr)
    assert {k: rows[0][k] for k in here} == here
    # each synthesized signal measured is the one its saved wav holds (16-bit samples): a float residue
    # below one step in the recording's digital silence put Griffin-Lim's MCD at 5.3 dB for 3.9 as saved
    for name in ("synthesized", "vocoder_ceiling", "griffin_lim_ceiling"):
        np.testing.assert_array_equal(signals[name], wavfile.as_heard(signals[name]))
    assert set(result["pesq"]) == set(result["stoi"]) == {"synthesized", "vocoder_ceiling", "griffin_lim_ceiling"}
    assert set(result["mos"]) == set(result["wer"]) == {"recording", "synthesized", "vocoder_ceiling",
                                                        "griffin_lim_ceiling"}
    # a perfect acoustic model through the vocoder measures as the vocoder's own copy-synthesis
    assert result["mcd_db"] == pytest.approx(result["mcd_db_vocoder_ceiling"], abs=0.05)
    # untrained (the mel's pseudo-inverse magnitude, random phase): worse than Griffin-Lim's copy on every
    # measure, as saved (5.5 against 3.9 dB MCD; the float Griffin-Lim copy measured 5.3 in digital silence)
    assert result["mcd_db_vocoder_ceiling"] > result["mcd_db_ceiling"] + 0.5
    assert result["pesq"]["vocoder_ceiling"] < result["pesq"]["griffin_lim_ceiling"] - 0.5
    assert result["f0_gross_error"] > result["f0_gross_error_ceiling"] + 0.1
    assert result["stoi"]["vocoder_ceiling"] < result["stoi"]["griffin_lim_ceiling"]
    assert all("mcd_db_vocoder_ceiling" in r and "pesq_vocoder_ceiling" in r for r in rows)
    assert result["f0_gross_error_vocoder_ceiling"] == pytest.approx(result["f0_gross_error"])  # the same audio
    # evaluate.md: every measure for the synthesized row, both copy-syntheses and chance
    md = evaluate_report.markdown({**result, "step": 0, "checkpoint": "ckpt-0", "griffin_lim_iters": 16,
                                   "per_clip": rows, "vocoder": {"kind": "vocos"}})
    table = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in md.splitlines() if line.startswith("| ")}
    assert table["measure"][1:4] == ["synthesized (through Vocos)", "ceiling: Vocos copy-synthesis of the recording",
                                     "reference: Griffin-Lim copy-synthesis"]
    assert table["PESQ wideband, 1-4.6 (higher is better)"][3] == f"{result['pesq']['griffin_lim_ceiling']:.2f}"
    assert table["F0 RMSE, Hz, frames voiced in both"][2] == f"{result['f0_rmse_hz_vocoder_ceiling']:.1f}"
    # the MCD split by the recording's voicing, for each column, and the voiced frames' share
    voiced = table[f"MCD on the frames the recording voices ({100 * result['voiced_share']:.1f} % of them), dB"]
    assert voiced[1:4] == [f"{result[k]:.2f}" for k in ("mcd_db_voiced", "mcd_db_voiced_vocoder_ceiling",
                                                         "mcd_db_voiced_ceiling")]
    others = table["MCD on the others (unvoiced sounds, pauses), dB"]
    assert others[1:4] == [f"{result[k]:.2f}" for k in ("mcd_db_unvoiced", "mcd_db_unvoiced_vocoder_ceiling",
                                                        "mcd_db_unvoiced_ceiling")]
    # the listener table: the recording, the synthesized audio, both copy-syntheses and chance, in that order
    assert table["listener measure"][1:] == ["recording (the reference)", "synthesized (through Vocos)",
                                             "Vocos copy-synthesis", "Griffin-Lim copy-synthesis", "chance |"]
    mos = table["naturalness: DNSMOS P.835 overall, 1-5 (higher is better)"]
    assert mos[1:5] == [f"{result['mos'][k]:.2f}" for k in evaluate.SIGNALS]
    assert mos[5].startswith(f"{result['mos_chance']:.2f} (the recording's spectrogram with random phase)")
    wer = table["word error rate, pocketsphinx en-us (lower is better)"]
    assert wer[1:5] == [f"{result['wer'][k]:.2f}" for k in evaluate.SIGNALS]


def test_a_report_written_elsewhere_keeps_its_scalars_out_of_the_runs_curves(tmp_path, monkeypatch):
    # `evaluate --out DIR` (another clip count, another setting) writes its TensorBoard scalars into DIR:
    # in the run's folder they would sit beside the run's own figures at the same step
    monkeypatch.chdir(tmp_path)
    cfg = config.load_config(check_paths=False)
    assert evaluate.scalars_folder(cfg, config.report_dir(cfg)) == config.run_dir(cfg)
    assert evaluate.scalars_folder(cfg, tmp_path / "reports" / cfg["name"]) == config.run_dir(cfg)  # the same, absolute
    assert evaluate.scalars_folder(cfg, tmp_path / "elsewhere") == tmp_path / "elsewhere"
    evaluate._tensorboard(cfg, {"step": 7, "mcd_db": 5.0, "mos": {"synthesized": 3.0}}, tmp_path / "elsewhere")
    assert list((tmp_path / "elsewhere").glob("events.out.tfevents.*")) and not config.run_dir(cfg).exists()


def test_verdict_between_and_without_chance():
    base = {"mcd_db_ceiling": 5.0, "mcd_db_other": 13.0}
    assert evaluate_report.verdict({**base, "mcd_db": 9.0}).startswith("Between chance and the ceiling")
    assert "50 %" in evaluate_report.verdict({**base, "mcd_db": 9.0})
    assert evaluate_report.verdict({**base, "mcd_db": 9.0, "mcd_db_other": None}).startswith("No chance reference")
    # through a trained vocoder the model is held to that vocoder's own copy-synthesis, not Griffin-Lim's
    voc = {**base, "mcd_db_vocoder_ceiling": 4.0, "mcd_db": 4.5, "vocoder": {"kind": "vocos"}}
    assert evaluate_report.verdict(voc).startswith("Near the ceiling") and "Vocos resynthesis" in evaluate_report.verdict(voc)
    assert evaluate_report.verdict({**voc, "mcd_db": 8.5}).startswith("Between chance and the ceiling (50 %")
    # the demo's FastPitch at 800 steps: 1.5 dB above its vocoder's copy, a fifth of the way to chance, which
    # twice the training more than halved (benchmarks/RESULTS.md): more training is the next gain, not a vocoder
    demo = {"mcd_db": 5.42, "mcd_db_ceiling": 5.29, "mcd_db_vocoder_ceiling": 3.93, "mcd_db_other": 11.48,
            "vocoder": {"kind": "source_filter"}}
    said = evaluate_report.verdict(demo)
    assert said.startswith("Between chance and the ceiling (20 % of the way from the ceiling to chance: "
                           "MCD 5.42 dB, the ceiling 3.93, chance 11.48)") and "more training" in said, said
    assert evaluate_report.verdict({**demo, "mcd_db": 4.5}).startswith("Near the ceiling (8 %")



def test_a_vocoder_whose_own_copy_is_at_chance_is_named_not_the_corpus():
    # a barely trained vocoder: its copy of the recordings is no nearer them than other sentences, while
    # Griffin-Lim's copy is; the verdict said "check the corpus and audio settings"
    report = {"mcd_db": 12.5, "mcd_db_ceiling": 4.0, "mcd_db_vocoder_ceiling": 12.0, "mcd_db_other": 11.0,
              "vocoder": {"kind": "vocos"}}
    said = evaluate_report.verdict(report)
    assert said.startswith("The Vocos vocoder's own copy of the recordings is no nearer them than other sentences "
                           "are (MCD 12.00 dB, chance 11.00; Griffin-Lim's copy 4.00)") and "vocoder.steps" in said
    # where Griffin-Lim's copy does not separate either, the corpus and audio settings are the suspects
    assert evaluate_report.verdict({**report, "mcd_db_ceiling": 11.5}).startswith("The references do not separate")


def test_wer_chance_scores_english_transcripts_against_english_sentences_only():
    # two English clips (heard by the en-us recognizer) and two German ones (not heard): an English
    # transcript scored against a German sentence gets every word wrong, which raised the chance level
    rng = np.random.default_rng(0)
    analyses = [{"mc": rng.normal(size=(20, 24))} for _ in range(4)]
    texts = ["the cat sat on the mat", "the dog ran in the park", "der Hund lief im Park", "die Katze sass"]
    rows = [{"heard_recording": "the cat sat on the mat"}, {"heard_recording": "the dog ran in the park"}, {}, {}]
    evaluate._chance(rows, analyses, analyses, texts)
    from pipeline import metrics
    assert rows[0]["wer_chance"] == pytest.approx(metrics.wer(texts[1], rows[0]["heard_recording"]))
    assert rows[1]["wer_chance"] == pytest.approx(metrics.wer(texts[0], rows[1]["heard_recording"]))
    assert rows[0]["wer_chance"] < 1 and "wer_chance" not in rows[2]
    # the WER row says how many of the clips it covers
    report = {"clips": 4, "wer_clips": 2, "mos": {"recording": 3.0}, "wer": {"recording": 0.5}, "mos_chance": 1.0,
              "wer_chance": 0.8, "mcd_db_ceiling": 4.0}
    lines = evaluate_report.listener_lines(report)
    assert any(line.startswith("| word error rate, pocketsphinx en-us (lower is better), the 2 of 4 clips in "
                               "English | 0.50 |") for line in lines), lines
    assert any(line.startswith("| word error rate, pocketsphinx en-us (lower is better) | ")
               for line in evaluate_report.listener_lines({**report, "wer_clips": 4}))


def test_ctrl_c_stops_evaluate_and_its_listening_processes_with_one_line(tmp_path):
    # a terminal's Ctrl-C reaches the whole process group: each listening process printed its own
    # KeyboardInterrupt traceback before evaluate's one line
    import os
    import signal
    import time
    code = ("import sys, time\n"
            "from pipeline.errors import cli\n"
            "from pipeline.evaluate import Listeners\n"
            "@cli\n"
            "def main(argv=None):\n"
            "    with Listeners(2) as listeners:\n"                # as evaluate's main holds them
            "        listeners.pool.submit(time.sleep, 0).result()\n"
            "        print('ready', file=sys.stderr, flush=True)\n"
            "        time.sleep(120)\n"
            "main()\n")
    with open(tmp_path / "err", "w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stderr=err, cwd=ROOT, start_new_session=True,
                                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
        try:
            deadline = time.monotonic() + 120
            while "ready" not in (tmp_path / "err").read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, (tmp_path / "err").read_text()
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    time.sleep(0.5)                                                    # the listeners' last words, if any
    said = (tmp_path / "err").read_text()
    assert proc.returncode == 130 and said.splitlines() == ["ready", "stopped (Ctrl-C)"], said[-3000:]

def run_module(*args):
    return subprocess.run([sys.executable, "-m", "pipeline.evaluate", *map(str, args)], check=False, capture_output=True,
                          text=True, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3",
                                                    "PYTHONPATH": str(ROOT)})


def test_without_checkpoint_is_one_line_error(built_cache):
    proc = run_module("--config", built_cache)
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "no checkpoint" in error[0] and "snakemake --cores all train" in error[0]
    assert "Traceback" not in proc.stderr


def test_validation_clips_their_cap_cached_f0_and_the_no_clip_error(built_cache, tmp_path):
    cfg = config.load_config(built_cache)
    meta = Path(cfg["dataset"]["root"]) / "metadata.csv"
    train_only = [line for line in meta.read_text().splitlines() if line.split("|")[0] not in DEMO_VAL]
    (tmp_path / "train_only.csv").write_text("\n".join(train_only) + "\n")
    cfg["dataset"]["metadata"] = str(tmp_path / "train_only.csv")  # holds no clip the split held out
    with pytest.raises(evaluate.NoValidationClips, match="no validation clip: dataset.val_fraction"):
        evaluate.validation_clips(cfg)
    cfg = config.load_config(built_cache, {"evaluate": {"max_clips": 1}})
    [clip] = evaluate.validation_clips(cfg)
    assert clip.id == "LJ001-0015"
    # the recorded F0 comes from the pitch cache: the extractor's own values for that recording
    y = audio.load_audio(clip.audio, sample_rate=cfg["audio"]["sample_rate"], max_seconds=20)
    np.testing.assert_array_equal(clip.f0, evaluate.Analyser(cfg).f0(y))
    assert (clip.f0 > 0).mean() > 0.3


def test_aligner_block_shares_of_right_sums_and_monotonic_paths(built_cache, tmp_path):
    cfg = config.load_config(built_cache)
    assert evaluate.aligner_check(cfg) is None  # no duration caches: evaluate.json has no aligner block
    shutil.copytree(config.cache_dir(cfg), tmp_path / "cache" / cfg["name"])
    cfg = config.load_config(built_cache, {"cache": {"dir": str(tmp_path / "cache")}})
    root = config.cache_dir(cfg)
    entry = json.loads((root / "index.json").read_text())["shards"][0]
    tok, mel = (shards.read_meta(root / entry[k], k) for k in ("tokens", "mels"))
    frames = dict(zip(mel["ids"], mel["lengths"]))
    durations = []
    for i, (cid, n) in enumerate(zip(tok["ids"], tok["lengths"])):
        d = np.ones(n, np.int32)
        d[-1] = frames[cid] - (n - 1)  # sums to the clip's mel frames
        if i == 0:
            d[0] += 1                  # one frame too many
        if i == 1:
            d[0], d[1] = 0, d[1] + 1   # right sum, but a token skipped (alignment search gives each one a frame)
        durations.append(d)
    ids = list(tok["ids"])
    n = len(ids)
    assert n >= 4
    ids[-1] = "LJ999-9999"                                       # a clip whose audio the cache rejected: no mel
    durations[-1] = np.zeros_like(durations[-1])                 # (the duration stage writes zeros for it)
    rejected = [{"id": ids[-2], "path": "x", "stage": "durations", "reason": "token 0 lasts 99 frames"}]
    shards.write(shards.prefix(root, "durations", entry["shard"]), "durations", ids, durations,
                 provenance="test", rejected=rejected)
    # the rejected clip and the one without audio are in neither share (they once read as wrong sums)
    kept = n - 2
    assert evaluate.aligner_check(cfg) == {"clips": kept, "sums_ok": (kept - 1) / kept, "monotonic": (kept - 1) / kept,
                                           "rejected": 1}


@pytest.mark.slow
def test_tts_gap_ladder_on_a_tiny_trained_model(trained_run, tmp_path):
    # benchmarks/tts_gap.py as a user runs it, on the session's run: FastPitch at the recordings' cached
    # durations and pitch through its Vocos (no F0, so no voicing or contour rung)
    out = tmp_path / "tts_gap.json"
    proc = subprocess.run([sys.executable, "benchmarks/tts_gap.py", "--config", str(trained_run.path), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = load_json(out)
    assert result["clips"] == 2 and list(result["medians"]) == ["tts", "durations", "pitch", "copy"]
    for rung, m in result["medians"].items():
        assert np.isfinite(m["mcd_db"]) and -1.0 <= m["stoi"] <= 1.0, (rung, m)
    # the vocoder's copy of the recorded mel is nearer the recording than a 10-step model at any rung
    assert all(result["medians"]["copy"]["mcd_db"] < m["mcd_db"] for r, m in result["medians"].items() if r != "copy")
    assert "| durations |" in proc.stdout


@pytest.mark.slow
def test_snakemake_evaluate_on_a_tiny_trained_model(trained_run, tmp_path):
    # the session's run (conftest.trained_run): FastPitch 10 steps on the aligned corpus, a tiny Vocos
    # (10 steps + 4 on GTA mels); `snakemake evaluate` runs evaluate alone on it
    path = trained_run.path
    snakemake("evaluate", config=path)
    # new synthesize.sentences rerun synthesize, not evaluate (it speaks the validation clips' texts)
    other = edited_copy(path, "evaluate_new_sentences.yaml", synthesize={"sentences": ["Another sentence."]})
    assert planned_jobs(other, "evaluate") == {}
    cfg = config.load_config(path)
    report_dir = config.report_dir(cfg)
    result = load_json(report_dir / "evaluate.json")
    assert REPORT_FIELDS <= set(result)
    assert result["clips"] == 2 and result["step"] == 10 and result["checkpoint"].endswith("ckpt-10")
    # the run has duration caches: the aligner block counts every clip's durations, all sound
    assert result["model"] == "fastpitch"
    n_clips = len((Path(cfg["dataset"]["root"]) / "metadata.csv").read_text().splitlines())
    assert result["aligner"] == {"clips": n_clips, "sums_ok": 1.0, "monotonic": 1.0, "rejected": 0}
    # This corpus is espeak-ng at 22050 Hz, whose energy above the mel's fmax (8 kHz) no vocoder gets
    # back, so Griffin-Lim's MCD sits near chance here (the 16 kHz demo: 6-8 dB). The trained vocoder's
    # copy-synthesis and the 10-step model through that same vocoder keep their order:
    assert result["mcd_db_vocoder_ceiling"] < result["mcd_db_other"]
    assert result["mcd_db"] > result["mcd_db_vocoder_ceiling"]  # 10 steps do not speak
    assert 0 < result["duration_ratio"] and np.isfinite(result["mcd_db"])
    # through the trained vocoder (10 steps + 4 on GTA mels), with Griffin-Lim's row kept beside it
    assert result["vocoder"] == {"kind": "vocos", "steps": 10, "finetune_steps": 4, "finetune_share": 0.75}
    assert np.isfinite(result["mcd_db_vocoder_ceiling"])
    for measure, low, high in (("pesq", 1.0, 4.7), ("stoi", -1.0, 1.0)):
        assert set(result[measure]) == {"synthesized", "vocoder_ceiling", "griffin_lim_ceiling"}
        assert all(v is None or low <= v <= high for v in result[measure].values()), result[measure]
    # what a listener hears, for the recording too: every figure there and finite, over the same 2 clips
    for measure, low, high in (("mos", 1.0, 5.0), ("wer", 0.0, 10.0)):
        assert set(result[measure]) == {"recording", "synthesized", "vocoder_ceiling", "griffin_lim_ceiling"}
        assert all(low <= v <= high for v in result[measure].values()), result[measure]
        assert low <= result[f"{measure}_chance"] <= high
        assert all(f"{measure}_synthesized" in clip for clip in result["per_clip"])
    assert result["mos"]["recording"] > result["mos_chance"]
    assert result["stoi"]["griffin_lim_ceiling"] > 0.5  # Griffin-Lim keeps a recording intelligible
    md = (report_dir / "evaluate.md").read_text()
    assert md.startswith("# Evaluate: 2 validation clips, checkpoint step 10") and "| MCD, dB" in md
    assert "| naturalness: DNSMOS" in md and "| word error rate, pocketsphinx" in md
    assert (report_dir / "evaluate.png").stat().st_size > 10_000
    assert (report_dir / "benchmarks" / "evaluate.tsv").exists()
    # to listen to: the TTS output, and both copies of each recording (the trained vocoder's, Griffin-Lim's)
    listen = report_dir / "evaluate_audio"
    clips = ["LJ001-0015.wav", "LJ001-0016.wav"]
    assert sorted(p.name for p in listen.glob("*.wav")) == clips
    for copy in ("vocoder_copy", "griffin_lim_copy"):
        assert sorted(p.name for p in (listen / copy).iterdir()) == clips
        for name in clips:  # a copy-synthesis lasts as long as its recording, to a frame
            recorded = sf.info(Path(cfg["dataset"]["root"]) / cfg["dataset"]["audio_dir"] / name)
            copied = sf.info(listen / copy / name)
            hop_seconds = cfg["audio"]["hop_length"] / cfg["audio"]["sample_rate"]
            assert abs(copied.duration - recorded.duration) <= hop_seconds, (copy, name)
    # TensorBoard scalars at the checkpoint's step, beside the training curves
    import tensorflow as tf
    scalars = [(e.step, float(tf.make_ndarray(v.tensor)))
               for f in config.run_dir(cfg).glob("events.out.tfevents.*")
               for e in tf.compat.v1.train.summary_iterator(str(f)) for v in e.summary.value if v.tag == "evaluate/mcd_db"]
    assert scalars == [(10, pytest.approx(result["mcd_db"], abs=1e-4))]
    # nothing left to do; its own config section reruns evaluate alone, not training (an edited copy:
    # the shared run's config stays as it is)
    assert planned_jobs(path, "evaluate") == {}
    assert planned_jobs(edited_copy(path, "evaluate_max_clips.yaml", evaluate={"max_clips": 1}), "evaluate") == {
        "evaluate": 1}


def test_a_synthesis_of_the_recordings_length_is_re_timed_unless_its_path_keeps_to_the_diagonal():
    # a TTS whose length equals the recording's by coincidence was scored as it was: one frame's
    # difference moved a clip's PESQ by 0.2
    diagonal = np.stack([np.arange(100), np.arange(100)], 1)
    assert evaluate.keeps_timing(100, 100, diagonal)
    wobble = diagonal.copy()
    wobble[40:60, 0] = np.clip(wobble[40:60, 0] - 3, 0, None)      # within ALIGNED_FRAMES of the diagonal
    assert evaluate.keeps_timing(100, 100, wobble)
    own_timing = np.stack([np.concatenate([np.arange(0, 50) // 2, np.arange(25, 100)]), np.arange(125)], 1)
    assert not evaluate.keeps_timing(100, 100, own_timing)           # the same length, its own timing inside
    assert not evaluate.keeps_timing(99, 100, diagonal[:99])


def test_a_word_error_rate_above_the_recordings_says_how_fine_the_recognizer_is():
    # 0.80 against 0.84 read as the TTS beating the recording; one inaudible 16-bit step moves it that far
    heads = {"synthesized": "synthesized (through Vocos)"}
    line = evaluate_report._above_reference({"recording": 2.9, "synthesized": 2.8}, {"recording": 0.84, "synthesized": 0.80},
                                            heads)[0]
    assert line.startswith("Scored better than the recording: word error rate: synthesized (through Vocos) (0.80 against 0.84).")
    assert "a difference under about 0.1 is none" in line
    line = evaluate_report._above_reference({"recording": 2.9, "synthesized": 3.0}, {"recording": 0.84, "synthesized": 0.9},
                                            heads)[0]
    assert "naturalness:" in line and "coarse" not in line


def test_the_spectrogram_panel_draws_each_bin_at_its_own_frequency():
    # the rows ran from 0 to the top bin's centre: every bin drawn half a bin (5 Hz) off
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sr = 22050
    df = sr / evaluate_report.SPECTRUM_FFT
    tone = 40 * df                                         # a bin's own frequency, ~431 Hz
    y = (0.5 * np.sin(2 * np.pi * tone * np.arange(sr) / sr)).astype(np.float32)
    fig, axes = plt.subplots(1, 1, squeeze=False)
    evaluate_report.spectrogram_panel(axes[0], {"signals": (sr, {"recording": y})}, "Vocos")
    image = axes[0][0].images[0]
    left, right, bottom, top = image.get_extent()
    rows = image.get_array().shape[0]
    brightest = int(np.argmax(image.get_array().max(axis=1)))
    centre = bottom + (brightest + 0.5) * (top - bottom) / rows
    assert abs(centre - tone) < 1e-6 and axes[0][0].get_ylim() == (0, pytest.approx((rows - 1) * df))
    plt.close(fig)


@pytest.mark.slow
def test_a_corpus_in_one_other_language_is_not_scored_by_the_english_recognizer(tmp_path, corpus_template):
    # A German-only source under the default text.language (en-us): its clips carried no language, so
    # evaluate fell back on text.language and scored German speech with the en-us recognizer (WER 0.92)
    from conftest import write_config

    path = write_config(tmp_path, corpus_template, dataset={"sources": [
        {"root": str(corpus_template), "format": "ljspeech", "name": "de", "language": "de"}]},
        cache={"dir": str(tmp_path / "cache"), "shards": 2}, dataset__val_fraction=0.2)
    snakemake("caches", config=path)
    clips = evaluate.validation_clips(config.load_config(path))
    assert clips and {c.language for c in clips} == {"de"} and {c.speaker for c in clips} == {""}
    sr = 22050
    y = (0.3 * np.sin(2 * np.pi * 150 * np.arange(sr) / sr)).astype(np.float32)
    assert not any(k.startswith("wer_") for k in evaluate.listen(y, {}, {"recording": y}, "Guten Tag.", clips[0].language,
                                                                     sr))


def _report(**fields):
    """A report as pipeline.evaluate.evaluate builds it, with every figure evaluate.md reads (made-up values)."""
    report = {"clips": 3, "step": 5, "checkpoint": "ckpt-5", "griffin_lim_iters": 16, "model": "fastpitch",
              "cut": 0, "mcd_db": 7.0, "mcd_db_ceiling": 5.0, "mcd_db_other": 11.0, "duration_ratio": 0.9,
              "f0_rmse_hz": 30.0, "f0_rmse_hz_ceiling": 10.0, "f0_gross_error": 0.25,
              "f0_gross_error_ceiling": 0.05, "voiced_share": 0.6, "per_clip": []}
    return {**report, **fields}


def _table(md, head):
    """The cells of evaluate.md's row whose first cell is `head`."""
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == head:
            return cells
    raise AssertionError(f"no row {head!r} in\n{md}")


def test_the_summary_figures_are_medians_over_the_clips():
    # three clips: a median differs from a mean; the WER row counts only the clips the recognizer heard
    figures = evaluate.FIGURES
    rows = [{"speaker": "", **dict.fromkeys(figures, v), "mos_recording": v, "mos_chance": v}
            for v in (1.0, 2.0, 9.0)]
    rows[0].update(wer_recording=0.5, wer_synthesized=0.7)
    summary = evaluate.summarise(rows, vocoder=False)
    assert summary["mcd_db"] == summary["mcd_db_other"] == summary["duration_ratio"] == 2.0
    assert summary["mos"]["recording"] == summary["mos_chance"] == 2.0
    assert summary["clips"] == 3 and summary["wer_clips"] == 1
    assert "the 1 of 3 clips in English" in evaluate_report.markdown(_report(**summary))


def test_the_lead_interval_is_the_middle_95_percent_of_the_bootstrap():
    # the interval the docstring names: clips resampled with replacement, the difference of medians
    # recomputed BOOTSTRAP times, its 2.5th and 97.5th percentiles
    rng = np.random.default_rng(3)
    b = 2.5 + rng.random(12)
    a = b + 0.3 + rng.normal(0, 0.4, 12)
    got = evaluate.lead(list(a), list(b))
    picks = np.random.default_rng(0).integers(0, 12, (evaluate.BOOTSTRAP, 12))
    leads = np.median(a[picks], axis=1) - np.median(b[picks], axis=1)
    assert (got["low"], got["high"]) == pytest.approx(tuple(np.percentile(leads, [2.5, 97.5])))
    inside = np.mean((leads >= got["low"]) & (leads <= got["high"]))
    assert 0.94 <= inside <= 0.96


def test_an_f0_rmse_without_a_frame_voiced_in_both_is_none_not_nan():
    path = np.stack([np.arange(5), np.arange(5)], 1)
    assert evaluate._f0_rmse(np.zeros(5), np.full(5, 120.0), path) is None    # the synthesis voiced nowhere
    assert evaluate._f0_rmse(np.full(5, 110.0), np.full(5, 100.0), path) == pytest.approx(10.0)


def test_each_copy_synthesis_is_saved_in_its_own_folder(tmp_path):
    sr, n = 16000, 1600
    tone = lambda f: (0.3 * np.sin(2 * np.pi * f * np.arange(n) / sr)).astype(np.float32)  # noqa: E731
    signals = {"recording": tone(100), "synthesized": tone(200), "vocoder_ceiling": tone(300),
               "griffin_lim_ceiling": tone(400)}
    rows = [{"id": "c1", "synthesized_audio": signals["synthesized"], "signals": (sr, signals)}]
    evaluate.save_listening(tmp_path, rows)
    for folder, key in (("vocoder_copy", "vocoder_ceiling"), ("griffin_lim_copy", "griffin_lim_ceiling"), (".", "synthesized")):
        y, rate = sf.read(tmp_path / folder / "c1.wav", dtype="float32")
        assert rate == sr and np.abs(y - signals[key]).max() < 1e-3, (folder, key)


def test_verdict_thresholds_at_chance_and_a_vocoder_copy_exactly_at_chance():
    base = {"mcd_db_ceiling": 5.0, "mcd_db_other": 15.0}
    assert evaluate_report.verdict({**base, "mcd_db": 13.5}).startswith("At chance")          # 85 % of the way
    assert evaluate_report.verdict({**base, "mcd_db": 12.5}).startswith("Between chance")     # 75 %
    # the trained vocoder's copy exactly as far from the recordings as other sentences: no nearer them
    voc = {"mcd_db": 12.0, "mcd_db_ceiling": 4.0, "mcd_db_vocoder_ceiling": 11.0, "mcd_db_other": 11.0,
           "vocoder": {"kind": "vocos"}}
    assert evaluate_report.verdict(voc).startswith("The Vocos vocoder's own copy of the recordings is no nearer")


def test_evaluate_md_puts_each_figure_in_its_own_column():
    report = _report(mcd_db_vocoder_ceiling=4.0, f0_rmse_hz_vocoder_ceiling=12.0, f0_gross_error_vocoder_ceiling=0.1,
                     vocoder={"kind": "vocos"}, cut=1,
                     pesq={"synthesized": 1.5, "vocoder_ceiling": 3.5, "griffin_lim_ceiling": 2.5},
                     stoi={"synthesized": 0.5, "vocoder_ceiling": 0.9, "griffin_lim_ceiling": 0.8},
                     aligner={"clips": 10, "sums_ok": 1.0, "monotonic": 0.7, "rejected": 0},
                     per_clip=[{"id": f"c{i}", "text": f"sentence {i}", "mcd_db": 6.0 + i, "mcd_db_ceiling": 5.0,
                                "mcd_db_vocoder_ceiling": 4.0, "mcd_db_other": 11.0 + i, "duration_ratio": 0.9,
                                "f0_rmse_hz": 30.0, "mos_synthesized": 2.1, "mos_recording": 3.2,
                                "wer_synthesized": 0.9, "wer_recording": 0.4,
                                "heard_recording": f"heard {i} recorded", "heard_synthesized": f"heard {i} said"}
                               for i in range(4)])
    md = evaluate_report.markdown(report)
    # columns: measure, synthesized, the vocoder's copy, Griffin-Lim's copy, chance
    assert _table(md, "PESQ wideband, 1-4.6 (higher is better)")[1:4] == ["1.50", "3.50", "2.50"]
    assert _table(md, "STOI, 0-1 (higher is better)")[1:4] == ["0.500", "0.900", "0.800"]
    assert _table(md, "F0 gross errors (> 20 % off, mostly octave jumps), share of those frames")[1:4] == [
        "25.0 %", "10.0 %", "5.0 %"]
    assert "10 clips; 100 % sum to their mel frames, 70 % a monotonic path" in md
    assert "Warning: 1 of the 3 syntheses were cut" in md
    # per clip: MCD, the vocoder's and Griffin-Lim's ceilings, chance, length, F0, MOS (recording), WER (recording)
    assert _table(md, "c1") == ["c1", "7.00", "4.00", "5.00", "12.00", "0.90", "30.0", "2.10 (3.20)", "0.90 (0.40)"]
    # what the recognizer heard in the first HEARD_CLIPS clips: on the recording, then on the synthesized audio
    heard = [line for line in md.splitlines() if "heard " in line]
    assert len(heard) == evaluate_report.HEARD_CLIPS
    assert heard[0] == "| c0 | sentence 0 | heard 0 recorded | heard 0 said |"


def test_per_speaker_rows_are_held_to_the_vocoder_they_were_heard_through():
    per = {"anna": {"clips": 2, "mcd_db": 6.0, "mcd_db_ceiling": 5.0, "mcd_db_vocoder_ceiling": 4.0,
                    "mcd_db_other": 11.0, "duration_ratio": 0.95, "f0_rmse_hz": 25.0, "f0_rmse_hz_ceiling": 9.0,
                    "mos": {"synthesized": 2.5, "recording": 3.5}, "wer": {"synthesized": 0.8, "recording": 0.3}},
           "bob": {"clips": 1, "mcd_db": 7.0, "mcd_db_ceiling": 6.0, "mcd_db_vocoder_ceiling": None,
                   "mcd_db_other": 12.0, "duration_ratio": 1.1, "f0_rmse_hz": 35.0, "f0_rmse_hz_ceiling": 8.0,
                   "mos": {}, "wer": {}}}
    lines = evaluate_report.speaker_lines({"per_speaker": per, "speaker_similarity": None})
    md = "\n".join(lines)
    assert _table(md, "anna") == ["anna", "2", "6.00", "4.00", "11.00", "0.95", "25.0", "2.50 (3.50)", "0.80 (0.30)"]
    assert _table(md, "bob")[:7] == ["bob", "1", "7.00", "6.00", "12.00", "1.10", "35.0"]


def test_the_chance_mcd_is_against_the_other_clips_recordings_only():
    # a model that says each clip's own recording: its MCD against that recording is 0, which is no chance level
    from pipeline import metrics
    rng = np.random.default_rng(0)
    analyses = [{"mc": rng.normal(size=(20, 24))} for _ in range(3)]
    rows = [{}, {}, {}]
    evaluate._chance(rows, analyses, analyses, ["a", "b", "c"])
    for i, row in enumerate(rows):
        others = [metrics.mcd(analyses[i]["mc"], analyses[j]["mc"])[0] for j in range(3) if j != i]
        assert row["mcd_db_other"] == pytest.approx(np.median(others)) and row["mcd_db_other"] > 1.0


def test_per_speaker_figures_count_each_speakers_own_clips():
    rows = [{"speaker": s, **dict.fromkeys(evaluate.FIGURES, v), "voice": (np.full(3, v), np.full(3, v))}
            for s, v in (("anna", 1.0), ("anna", 3.0), ("bob", 8.0))]
    per = evaluate.summarise(rows, vocoder=False)["per_speaker"]
    assert {s: r["clips"] for s, r in per.items()} == {"anna": 2, "bob": 1}
    assert per["anna"]["mcd_db"] == 2.0 and per["bob"]["mcd_db"] == 8.0


def test_the_clips_evaluated_are_taken_from_each_speaker_in_turn():
    # evaluate.max_clips below the split: the first clips by id were all one speaker's, and the others
    # were left out of the per-speaker figures
    by_speaker = {0: [("a1", 0), ("a2", 1), ("a3", 2), ("a4", 3)], 1: [("y1", 4)], 2: [("z1", 5), ("z2", 6)]}
    assert evaluate.in_turns(by_speaker, 3) == [("a1", 0), ("y1", 4), ("z1", 5)]
    assert evaluate.in_turns(by_speaker, 5) == [("a1", 0), ("a2", 1), ("y1", 4), ("z1", 5), ("z2", 6)]
    assert evaluate.in_turns(by_speaker, 99) == sorted(c for group in by_speaker.values() for c in group)
    assert evaluate.in_turns({}, 3) == []


def test_a_median_that_leaves_clips_out_says_how_many_it_covers():
    # a TTS voiced in 1 of 3 clips: its F0 figures are the median of that one clip, not of the 3 the table heads
    rows = [{"id": f"c{i}", "speaker": "", **dict.fromkeys(evaluate.FIGURES, 5.0), "f0_rmse_hz": f0,
             "f0_gross_error": gross, "pesq_synthesized": 1.4, "pesq_griffin_lim_ceiling": pesq}
            for i, (f0, gross, pesq) in enumerate(((7.0, 0.02, 2.9), (None, None, None), (None, None, 3.1)))]
    md = evaluate_report.markdown(_report(**evaluate.summarise(rows, vocoder=False), per_clip=rows))
    assert _table(md, "F0 RMSE, Hz, frames voiced in both")[1:3] == ["7.0 (1 of 3 clips)", "5.0"]
    assert _table(md, "F0 gross errors (> 20 % off, mostly octave jumps), share of those frames")[1] == \
        "2.0 % (1 of 3 clips)"
    assert _table(md, "PESQ wideband, 1-4.6 (higher is better)")[1:3] == ["1.40", "3.00 (2 of 3 clips)"]
    assert _table(md, "MCD, dB (lower is better)")[1:3] == ["5.00", "5.00"]  # every clip: no count


def test_the_verdict_gives_its_figures_and_reads_no_negative_share():
    base = {"mcd_db_ceiling": 5.0, "mcd_db_other": 15.0}
    # at chance, as every other verdict: the share of the way and the three MCDs it rests on
    assert "(85 % of the way from the ceiling to chance: MCD 13.50 dB, the ceiling 5.00, chance 15.00)" in \
        evaluate_report.verdict({**base, "mcd_db": 13.5})
    # nearer the recordings than the ceiling's own copy: no "-15 % of the way", no "about as close"
    past = evaluate_report.verdict({**base, "mcd_db": 3.5})
    assert past.startswith("Past the ceiling (MCD 3.50 dB, the ceiling 5.00") and "%" not in past
    assert evaluate_report.verdict({**base, "mcd_db": 4.8}).startswith("Near the ceiling (at it: MCD 4.80 dB")


def test_one_clip_names_the_key_that_capped_it():
    one = {"mcd_db": 6.0, "mcd_db_ceiling": 5.0, "mcd_db_other": None, "clips": 1}
    # evaluate.max_clips: 1 holds the report to one clip: raising val_fraction (a retraining) would not help
    said = evaluate_report.verdict({**one, "max_clips": 1})
    assert "raise evaluate.max_clips, now 1" in said and "val_fraction" not in said
    assert "raise dataset.val_fraction" in evaluate_report.verdict({**one, "max_clips": 20})


def test_a_silent_synthesis_is_at_chance_beyond_it_not_hundreds_of_percent_of_the_way():
    # a decoder that says nothing: its MCD (38 dB for silence against a tone) lies far past chance
    said = evaluate_report.verdict({"mcd_db": 38.0, "mcd_db_ceiling": 5.0, "mcd_db_other": 15.0})
    assert said.startswith("At chance (beyond it: MCD 38.00 dB, the ceiling 5.00, chance 15.00)"), said


def test_the_report_names_the_default_vocoder_in_prose_not_by_its_config_token():
    # evaluate.md said "synthesized (through source_filter)", "source_filter copy-synthesis" and "The
    # source_filter vocoder's own copy", and evaluate.png "TTS through source_filter"
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.vocoder import kinds
    assert all("_" not in evaluate_report.vocoder_name(kind) for kind in kinds.KINDS)
    mos = {"recording": 3.0, "synthesized": 3.1, "vocoder_ceiling": 3.3, "griffin_lim_ceiling": 3.0}
    report = _report(mcd_db_vocoder_ceiling=12.0, mcd_db=12.5, mcd_db_ceiling=4.0, vocoder={"kind": "source_filter"},
                     mos=mos, wer=dict.fromkeys(mos, 0.5), mos_leads={"vocoder_ceiling_over_griffin_lim_ceiling": {
                         "lead": 0.3, "low": 0.1, "high": 0.5, "clips": 3}})
    md = evaluate_report.markdown(report)
    assert "source_filter" not in md
    assert md.splitlines()[2].startswith("The source-filter vocoder's own copy of the recordings is no nearer them")
    assert _table(md, "measure")[1:3] == ["synthesized (through the source-filter vocoder)",
                                          "ceiling: source-filter copy-synthesis of the recording"]
    assert _table(md, "listener measure")[2:4] == ["synthesized (through the source-filter vocoder)",
                                                   "source-filter copy-synthesis"]
    assert "the source-filter copy over Griffin-Lim's +0.300" in md
    assert "The synthesized row is the model's mel through the source-filter vocoder;" in md
    # a proper name stands alone, as before
    assert _table(evaluate_report.markdown({**report, "vocoder": {"kind": "vocos"}}), "measure")[1] == \
        "synthesized (through Vocos)"
    y = np.zeros(2048, np.float32)
    y[::100] = 0.5
    signals = dict.fromkeys(("recording", "griffin_lim_ceiling", "vocoder_ceiling", "synthesized"), y)
    fig, axes = plt.subplots(1, 4, squeeze=False)
    evaluate_report.spectrogram_panel(axes[0], {"signals": (22050, signals)}, evaluate_report._vocoder_name(report))
    assert [ax.get_title() for ax in axes[0]] == ["recording", "Griffin-Lim copy", "source-filter copy",
                                                  "TTS through the source-filter vocoder"]
    plt.close(fig)


def test_the_naturalness_leads_count_the_clips_each_was_taken_over():
    # one recording the predictor could not score: the TTS's lead over the recording is over 8 clips, the
    # copy's over Griffin-Lim's over all 9; the sentence said "over the 9 clips" for both
    rows = [{"speaker": "", **dict.fromkeys(evaluate.FIGURES + evaluate.VOCODER_FIGURES, 5.0),
             "mos_recording": None if i == 4 else 3.0 + 0.01 * i, "mos_synthesized": 3.1 + 0.01 * i,
             "mos_vocoder_ceiling": 3.3 + 0.01 * i, "mos_griffin_lim_ceiling": 3.0 + 0.01 * i} for i in range(9)]
    summary = evaluate.summarise(rows, vocoder=True)
    assert [v["clips"] for v in summary["mos_leads"].values()] == [9, 8]
    line = evaluate_report.lead_lines(summary, "source-filter")[0]
    assert line.startswith("Naturalness leads, difference of medians (95 % bootstrap interval over the clips where "
                           "both its signals have a score): the source-filter copy over Griffin-Lim's +0.300 "), line
    assert "; 9 clips); the synthesized audio over the recording +0.100 (" in line and line.count("; 8 of 9 clips)") == 1
    # the same clip unscored for every signal but the recording's: both leads over the same 8 of the 9
    for r in rows:
        r["mos_recording"] = None if r is rows[4] else r["mos_griffin_lim_ceiling"]
    rows[4]["mos_griffin_lim_ceiling"] = None
    line = evaluate_report.lead_lines(evaluate.summarise(rows, vocoder=True), "source-filter")[0]
    assert "(95 % bootstrap interval over the 8 of 9 clips where both signals have a score): " in line, line
    assert "clips)" not in line
    # every clip scored: the count as it always read
    rows[4]["mos_recording"] = rows[4]["mos_griffin_lim_ceiling"] = 3.04
    line = evaluate_report.lead_lines(evaluate.summarise(rows, vocoder=True), "source-filter")[0]
    assert "(95 % bootstrap interval over the 9 clips): the source-filter copy" in line, line
