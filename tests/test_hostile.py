"""A hostile user's probes, each one line naming the key or file, none losing finished work: non-finite
numbers and cross-key rules in the config, a key given twice, unreadable config files, a 5,000-digit
number, paths in the data, a 2-hour clip, a diverging run, pace and pitch shift in synthesis, the run's
own audio settings, configs shipped with the package.

    python -m pytest -q tests/test_hostile.py
"""
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import tracemalloc

import numpy as np
import pytest
import soundfile as sf
import yaml
from conftest import ROOT, edited_copy, inflate_checkpoint, run_config, write_untrained_checkpoint
from test_train import tiny_config

from pipeline import audio, cache, config, errors, formats, shards, text
from pipeline.config import ConfigError

ENV = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")


def one_line_error(main, argv, capsys):
    """The one stderr line of a `@cli` main that fails as expected (exit status 2)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == errors.EXIT_EXPECTED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# --- the config: every number finite, rules between keys, each key once ------------------------
@pytest.mark.parametrize("section, key, value", [
    ("audio", "fmax", ".nan"), ("pitch", "fmax", ".nan"), ("synthesize", "pitch_shift", ".nan"),
    ("synthesize", "max_seconds", ".inf"), ("synthesize", "pace", ".nan"), ("train", "learning_rate", ".inf"),
    ("dataset", "max_seconds", "-.inf"), ("aligner", "temperature", ".nan"), ("audio", "fmin", ".nan"),
])
def test_nan_and_inf_are_refused_naming_the_key(tmp_path, section, key, value):
    path = tmp_path / "my.yaml"
    path.write_text(f"{section}:\n  {key}: {value}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: {section}\.{key}: -?(nan|inf) is not a finite number$"):
        config.load_config(path, check_paths=False)


def test_nan_in_free_form_keys_inline_json_and_set_is_refused_too(capsys):
    with pytest.raises(ConfigError, match=r"model\.options\.scale: nan is not a finite number"):
        config.load_config('{"model": {"options": {"scale": NaN}}}', check_paths=False)
    line = one_line_error(config.main, ["--set", "synthesize.max_seconds=.inf"], capsys)
    assert line.endswith("synthesize.max_seconds: inf is not a finite number")


@pytest.mark.parametrize("value, message", [
    ("4294967296", "train.seed: 4294967296 is greater than the maximum of 4294967295"),  # numpy's, Keras's: 32-bit
    ("9223372036854775808", "train.seed: an integer of 64 bits is beyond the 64-bit integers numpy and TensorFlow hold"),
    ("1.0e+300", "train.seed: 1e+300 is not of type 'integer'"),
])
def test_a_seed_or_integer_numpy_and_tensorflow_cannot_take_is_refused(capsys, value, message):
    line = one_line_error(config.main, ["--set", f"train.seed={value}"], capsys)
    assert line.endswith(message), line
    assert config.load_config(None, {"train": {"seed": 2 ** 32 - 1}}, check_paths=False)["train"]["seed"] == 2 ** 32 - 1


@pytest.mark.parametrize("sections, key", [
    ({"audio": {"hop_length": 2048}}, "audio.hop_length: 2048 is more than half of audio.win_length 1024"),
    ({"audio": {"hop_length": 512, "win_length": 256}}, "audio.hop_length: 512 is more than half of audio.win_length 256"),
    # hop == win: the periodic Hann window's zero falls on every hop-th sample of every frame (Griffin-Lim gave NaN)
    ({"audio": {"hop_length": 256, "win_length": 256}}, "audio.hop_length: 256 is more than half of audio.win_length 256"),
    ({"audio": {"hop_length": 513}}, "audio.hop_length: 513 is more than half of audio.win_length 1024"),
    ({"model": {"fastpitch": {"heads": 3, "d_model": 32}}}, "model.fastpitch.heads: 3 does not divide "
                                                             "model.fastpitch.d_model 32"),
    ({"model": {"transformer_tts": {"heads": 3, "d_model": 32}}}, "model.transformer_tts.heads: 3 does not divide"),
    ({"model": {"kind": "transformer_tts"}, "synthesize": {"pitch_shift": 2.0}},
     "synthesize.pitch_shift: 2.0, but model.kind transformer_tts has no pitch control"),
])
def test_cross_key_rules_are_one_line_before_any_job(tmp_path, sections, key):
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump(sections))
    with pytest.raises(ConfigError, match="^" + key):
        config.load_config(path, check_paths=False)


@pytest.mark.parametrize("sections, key", [
    ({"pitch": {"method": "pyin", "fmin": 47.0, "fmax": 48.0}}, "pitch.fmax: 48.0 is less than an octave above pitch.fmin 47.0"),
    ({"audio": {"fmin": 7900}}, "audio.n_mels: 70 of the 80 mel filters between audio.fmin 7900 and audio.fmax 8000 Hz "
                                "hold no FFT bin"),
    ({"audio": {"n_mels": 512}}, "audio.n_mels: 99 of the 512 mel filters"),
    ({"audio": {"n_fft": 2 ** 30, "win_length": 2 ** 30, "hop_length": 2 ** 30}}, "audio.n_fft: 1073741824 is greater than"),
    ({"name": "rb3\n"}, "name: 'rb3\\n' does not match"),
])
def test_settings_no_job_could_use_are_refused_at_planning(tmp_path, sections, key):
    # each of these planned fine and then failed in every pitch or mel job with a traceback (a
    # 160 GiB allocation for n_fft 2^30), or built mel channels that are constant
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump(sections))
    with pytest.raises(ConfigError, match=r"^([^ ]*: )?" + re.escape(key)):
        config.load_config(path, check_paths=False)


def test_yaml_aliases_cannot_make_a_config_of_a_billion_values(tmp_path):
    # 600 bytes that expand to 10^9 values: every walk over the config (the finite check, a job's
    # json.dumps) would run for hours; a mapping that holds itself would recurse forever
    lines = ["model:", "  options:", "    x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"    x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"^model\.options\.x4: more than 100,000 values once its YAML aliases"):
        config.load_config(bomb, check_paths=False)
    loop = tmp_path / "loop.yaml"
    loop.write_text("model:\n  options: &o\n    self: *o\n")
    with pytest.raises(ConfigError, match=r"^model\.options\.self[.a-z]*: refers back to model\.options[.a-z]*, which holds it"):
        config.load_config(loop, check_paths=False)
    small = tmp_path / "small.yaml"  # an alias or two is fine
    small.write_text("model:\n  options:\n    a: &v [1, 2]\n    b: *v\n")
    assert config.load_config(small, check_paths=False)["model"]["options"] == {"a": [1, 2], "b": [1, 2]}


def test_a_quoted_yes_or_no_stays_a_string_where_the_key_is_one(tmp_path):
    # YAML 1.1 reads a bare on/no as a boolean; a quoted one is the user's string (a run named "on",
    # Norwegian's espeak-ng code "no")
    path = tmp_path / "my.yaml"
    path.write_text('name: "on"\ntext:\n  language: "no"\n')
    cfg = config.load_config(path, check_paths=False)
    assert (cfg["name"], cfg["text"]["language"]) == ("on", "no")
    train = config.load_config(None, {"train": {"jit_compile": "false", "mixed_precision": "off", "steps": "5"}},
                               check_paths=False)["train"]  # how --config 'train={...}' delivers them
    assert (train["jit_compile"], train["mixed_precision"], train["steps"]) == (False, "off", 5)
    # YAML 1.1 reads 1e-4 (no dot before the exponent) as a string: where a number is wanted, it is one
    path.write_text("train:\n  learning_rate: 1e-4\n")
    assert config.load_config(path, check_paths=False)["train"]["learning_rate"] == 1e-4
    assert config.load_config(None, {"train": {"learning_rate": "2E-3"}}, check_paths=False)["train"]["learning_rate"] == 2e-3


def test_a_set_value_is_named_as_one(capsys):
    line = one_line_error(config.main, ["--set", "train.learning_rate=-1"], capsys)
    # (a whole number takes the schema's spelling, a float here: -1.0; config._spelled)
    assert f"{config.DEFAULTS} with --set: train.learning_rate: -1.0 is less than" in line


def test_a_key_given_twice_names_the_key_and_both_lines(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("name: x\ntrain:\n  steps: 3\naudio:\n  n_mels: 80\ntrain:\n  batch_size: 2\n")
    message = f"{path}:6:1: not valid YAML: key 'train' given twice (first on line 2)"
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        config.load_config(path, check_paths=False)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):  # what Snakemake's --configfile read
        config.check_configfiles([config.DEFAULTS, path])
    nested = tmp_path / "nested.json"
    nested.write_text('{"train": {"steps": 3, "steps": 4}}')
    with pytest.raises(ConfigError, match=f"^{nested}: key 'steps' given twice"):
        config.check_configfiles([nested])
    with pytest.raises(ConfigError, match="^inline config: key 'steps' given twice"):
        config.load_config('{"train": {"steps": 3, "steps": 4}}', check_paths=False)
    config.check_configfiles([config.DEFAULTS, ROOT / "configs" / "ljspeech.yaml"])  # the shipped ones are fine


def test_config_files_that_cannot_be_read_are_one_line(tmp_path, capsys):
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    cases = {(str(folder),): f"error: {folder}: a folder, not a config file",
             (str(latin),): f"error: {latin}: not UTF-8 text (byte 10)",
             ('{"train": {"steps": 3}',): "error: inline config: not valid JSON at column 23",
             ('[1, 2]',): "error: config file not found: [1, 2]",
             (str(latin), "--set", "train.steps=[1"): "error: --set 'train.steps=[1': the value is not valid YAML"}
    for (path, *more), want in cases.items():
        assert one_line_error(config.main, ["--config", path, *more], capsys).startswith(want)


# --- text and data: per clip, each path inside its source --------------------------------------
def test_a_5000_digit_number_is_refused_by_the_front_end_and_rejects_its_clip_alone(corpus, capsys):
    number = "7" * 5000
    line = one_line_error(text.main, ["--frontend", "characters", f"I owe you {number} dollars."], capsys)
    assert "a number of 5000 digits (more than 100 are not read out" in line and len(line) < 400
    root, path = corpus
    metadata = root / "metadata.csv"
    rows = metadata.read_text(encoding="utf-8").splitlines()
    victim = rows[3].split("|")[0]
    rows[3] = f"{victim}|It cost {number} pounds.|It cost {number} pounds."
    metadata.write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = config.load_config(path, {"cache": {"shards": 1}})
    out = shards.prefix(config.cache_dir(cfg), "tokens", 0)
    cache.build_token_shard(cfg, 0, out, log=lambda *a: None)
    meta = shards.read_meta(out, "tokens")
    assert len(meta["ids"]) == len(rows) - 1 and victim not in meta["ids"]
    [rejected] = meta["rejected"]
    assert rejected["id"] == victim and rejected["path"].endswith("metadata.csv:4")
    assert "a number of 5000 digits" in rejected["reason"]


def test_an_ljspeech_source_without_metadata_is_one_line(tmp_path):
    (tmp_path / "wavs").mkdir()
    with pytest.raises(formats.DatasetError, match=f"^{tmp_path / 'metadata.csv'}: not found"):
        formats.read_source({"root": str(tmp_path), "format": "ljspeech"}, 0)


@pytest.mark.parametrize("audio_file", ["/etc/secret.wav", "../outside.wav", "wavs/../../outside.wav",
                                        "wavs\\..\\x.wav"])
def test_a_csv_row_cannot_name_audio_outside_its_source(tmp_path, audio_file):
    root = tmp_path / "corpus"
    (root / "wavs").mkdir(parents=True)
    (root / "metadata.csv").write_text(f"audio_file|text|speaker\nwavs/a.wav|Hello there.|ann\n"
                                       f"{audio_file}|Hello again.|ann\n")
    with pytest.raises(formats.DatasetError, match=rf"^{root / 'metadata.csv'}:3: audio_file '.+': must be a path "
                                                   "relative to the source's root"):
        formats.read_source({"root": str(root), "format": "csv"}, 0)


def test_a_csv_row_may_name_a_file_in_a_subfolder_and_a_linked_folder(tmp_path):
    elsewhere = tmp_path / "disk2"
    elsewhere.mkdir()
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "wavs").symlink_to(elsewhere)  # a corpus whose audio lives on another disk
    (root / "metadata.csv").write_text("audio_file|text|speaker\nwavs/a.wav|Hello there.|ann\n")
    [clip] = formats.read_source({"root": str(root), "format": "csv"}, 0)
    assert clip.audio == str(root / "wavs" / "a.wav")


def test_a_long_clip_is_refused_by_its_header_before_it_is_decoded(tmp_path):
    path = tmp_path / "long.wav"
    sr, minutes = 8000, 10
    with sf.SoundFile(str(path), "w", samplerate=sr, channels=1, subtype="PCM_16") as f:
        second = (0.1 * np.sin(np.arange(sr) * 0.05)).astype(np.float32)
        for _ in range(minutes * 60):
            f.write(second)
    tracemalloc.start()
    try:
        with pytest.raises(audio.BadAudio, match=r"too long \(600\.0 s > dataset\.max_seconds 10\)"):
            cache.load_clip(path, sample_rate=sr, max_seconds=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"{peak / 1e6:.1f} MB allocated to refuse it (decoded whole, it takes ~40 MB)"


# --- synthesis: pace and pitch shift checked, the run's own audio settings ----------------------
@pytest.fixture(scope="module")
def untrained_run(built_cache, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile_run")
    path = run_config(built_cache, tmp, steps=100)
    write_untrained_checkpoint(path, step=3)
    return path


def test_synthesis_refuses_a_nan_pace_or_pitch_shift_per_call(untrained_run):
    from pipeline.synthesize import load_synthesizer
    synth = load_synthesizer(config.load_config(untrained_run), log=lambda *a: None)
    for kwargs, message in (({"pace": float("nan")}, "pace: nan must be a finite number in 0.1..10"),
                            ({"pace": 1e-9}, "pace: 1e-09 must be a finite number in 0.1..10"),
                            ({"pitch_shift": float("inf")}, "pitch_shift: inf must be a finite number in -24..24")):
        with pytest.raises(errors.PipelineError, match=f"^{message}$"):
            synth.infer("Hello there.", **kwargs)


def test_synthesis_refuses_a_control_character_in_a_sentence_naming_it(untrained_run, capsys):
    # espeak-ng stopped at the NUL: sample 00 said "a" and was written as the sentence "a\x00b"
    from pipeline import synthesize
    argv = ["--config", str(untrained_run), "--set", 'synthesize.sentences=["Hello.", "a\\u0000b"]']
    assert one_line_error(synthesize.main, argv, capsys) == \
        ("error: synthesize.sentences[1], character 2: control character U+0000 is not plain text; remove it (the "
         "front end would stop or split a word there)")


def test_a_sentence_the_front_end_cannot_say_is_named_by_its_key(untrained_run, capsys):
    # was "error: '!!!': gives no phonemes ...", naming no sentence of the config
    from pipeline import synthesize
    argv = ["--config", str(untrained_run), "--set", 'synthesize.sentences=["Hello.", "!!!"]']
    assert one_line_error(synthesize.main, argv, capsys) == \
        "error: synthesize.sentences[1]: '!!!': gives no phonemes (nothing to say)"


def test_synthesis_speaks_at_the_runs_audio_settings_whatever_the_config_says(untrained_run, tmp_path):
    from pipeline import synthesize
    cfg = config.load_config(untrained_run, {"audio": {"hop_length": 200},
                                             "synthesize": {"sentences": ["Hello there."]}})
    logged = []
    synthesize.synthesize(cfg, tmp_path / "samples", log=logged.append)
    said = json.loads((tmp_path / "samples" / "sentences.json").read_text())["samples"][0]
    wav, sr = sf.read(said["wav"])
    assert sr == 22050 and len(wav) == said["frames"] * 256  # the run's hop, not the config's 200
    assert any("audio.hop_length 200 (the run's: 256)" in line for line in logged), logged


# --- a diverging run saves nothing non-finite, and its advice works -----------------------------
DIVERGE = """
    import json, sys
    from pipeline import config, errors, train
    for path in sys.argv[1:]:  # one process: TensorFlow is imported once
        cfg = config.load_config(path)
        logged, out = [], {{}}
        try:
            train.train(cfg, config.run_dir(cfg) / "train.json", log=logged.append)
        except errors.PipelineError as e:
            out["error"] = str(e)
        folder = config.run_dir(cfg) / "checkpoints"
        out["checkpoints"] = {{p.rsplit("/", 1)[1]: bool(train._finite_checkpoint(p)) for p in train._checkpoints(folder)}}
        print(json.dumps(out))
        if "error" not in out:
            break
"""


@pytest.mark.slow
def test_a_diverging_run_saves_no_nan_and_its_advice_works_when_followed(built_cache, tmp_path):
    # A run blowing up: its one step at the highest rate the schema takes saved weights finite but huge
    # (inflated here), and the next step at that rate overflows. checkpoint_every below log_every: a save
    # comes before the loss is logged (and checked).
    wild = tiny_config(built_cache, tmp_path, steps=3, checkpoint_every=1, log_every=3, learning_rate=1.0,
                       warmup_steps=0, buckets=1)
    start = edited_copy(wild, "start.yaml", train={"steps": 1})
    calm = edited_copy(wild, "calm.yaml", train={"learning_rate": 0.001})
    folder = config.run_dir(config.load_config(wild)) / "checkpoints"

    def follow(*paths):
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(DIVERGE.format()), *map(str, paths)],
                              capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads(line) for line in proc.stdout.strip().splitlines()]

    assert follow(start) == [{"checkpoints": {"ckpt-1": True}}]
    inflate_checkpoint(folder / "ckpt-1", "model/")
    first, second, third = follow(wild, calm, calm)
    assert first["error"] == ("training diverged: the loss became nan by step 2; nothing non-finite was saved, a rerun "
                              f"resumes from {folder / 'ckpt-1'}, the last checkpoint (all finite): lower "
                              "train.learning_rate (now 1) and rerun"), first
    assert first["checkpoints"] == {"ckpt-1": True}  # not the NaN weights of step 2
    # the advice followed, it diverged again from ckpt-1: the checkpoint was the cause, set aside
    assert second["error"] == ("training diverged: the loss became nan by step 2; nothing non-finite was saved, it "
                               "diverged again from ckpt-1 at a lower rate than before (1), so that checkpoint is set "
                               f"aside in {folder / 'diverged'}; no checkpoint is left, so a rerun starts from step 0: "
                               "rerun (lowering train.learning_rate, now 0.001, further if it diverges again)"), second
    assert second["checkpoints"] == {}
    assert "error" not in third and third["checkpoints"] == {"ckpt-1": True, "ckpt-2": True, "ckpt-3": True}


def test_a_non_finite_loss_stops_the_run_at_the_log_line_that_shows_it():
    # the loss is checked where it is logged, not only at the next checkpoint: a run logging every 100
    # steps and saving every 1000 went on for up to 900 steps after `loss nan`, appending NaN rows to
    # history.jsonl, and its one line named a later step than the one the loss went bad by
    import tensorflow as tf

    from pipeline import train
    trainer = type("Trainer", (), {"optimizer": type("Optimizer", (), {"learning_rate": tf.Variable(1e-3)})()})()
    logged = []
    progress = train.Progress(trainer, total=1000, log_every=5, log=logged.append)
    progress.update({"total": tf.constant(0.5)}, 0.0)
    progress.report(5)
    for loss in (0.4, float("nan")):
        progress.update({"total": tf.constant(loss)}, 0.0)
    with pytest.raises(train.NonFinite, match="the loss became nan by step 10"):
        progress.report(10)
    assert "step 10/1000" in logged[-1] and "loss nan" in logged[-1]
    assert [row["step"] for row in progress.history] == [5]  # no NaN row for history.jsonl


def test_weights_gone_non_finite_under_a_finite_loss_stop_the_run_before_the_save():
    # a step whose update overflows leaves the logged loss finite: the save's check reads the weights
    # and the optimizer's state too
    import tensorflow as tf

    from pipeline import train
    weights, moments = tf.Variable([1.0, 2.0]), tf.Variable([0.0, 0.0])
    trainer = type("Trainer", (), {"model": type("Model", (), {"variables": [weights]})(), "model_device": "/CPU:0",
                                   "optimizer": type("Optimizer", (), {"variables": [moments],
                                                                       "learning_rate": tf.Variable(1.0)})()})()
    progress = train.Progress(trainer, total=10, log_every=5, log=lambda *a: None)
    progress.update({"total": tf.constant(0.5)}, 0.0)
    train.check_finite_state(trainer, progress, 1)  # all finite: saved
    for variable, value in ((weights, [float("inf"), 2.0]), (moments, [float("nan"), 0.0])):
        variable.assign(value)
        with pytest.raises(train.NonFinite, match="^the weights became non-finite by step 2$"):
            train.check_finite_state(trainer, progress, 2)
        variable.assign([1.0, 2.0] if variable is weights else [0.0, 0.0])


def test_a_checkpoint_a_run_diverges_from_again_at_a_lower_rate_is_set_aside_so_reruns_start_further_back(tmp_path):
    import tensorflow as tf

    from pipeline import train
    folder = tmp_path / "checkpoints"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=tf.Variable([1e30, 2.0])), folder, max_to_keep=3)
    for step in (1, 2):
        manager.save(checkpoint_number=step)  # finite, but (say) a model already blowing up
    ckpt = {k: str(folder / f"ckpt-{k}") for k in (1, 2)}
    cause, logged = "the loss became nan by step 3", []
    # the run that saved them diverged at 1e9: a rerun resumes from ckpt-2
    first = train.diverged(cause, manager, {"learning_rate": 1e9}, None, True, logged.append)
    assert str(first).endswith(f"a rerun resumes from {ckpt[2]}, the last checkpoint (all finite): lower "
                               "train.learning_rate (now 1e+09) and rerun")
    # resumed from ckpt-2 at the same rate, diverged before saving: the rate, not ckpt-2, is to blame
    same = train.diverged(cause, manager, {"learning_rate": 1e9}, ckpt[2], True, logged.append)
    assert str(same) == str(first) and tf.train.latest_checkpoint(folder) == ckpt[2]
    # the advice followed (0.001 < 1e9) and it diverged again from ckpt-2: set aside, the rerun starts at ckpt-1
    again = train.diverged(cause, manager, {"learning_rate": 0.001}, ckpt[2], True, logged.append)
    assert str(again) == (f"training diverged: {cause}; nothing non-finite was saved, it diverged again from ckpt-2 "
                          f"at a lower rate than before (1e+09), so that checkpoint is set aside in "
                          f"{folder / 'diverged'}; a rerun resumes from {ckpt[1]}, the last checkpoint (all finite): "
                          "rerun (lowering train.learning_rate, now 0.001, further if it diverges again)")
    assert tf.train.latest_checkpoint(folder) == ckpt[1] and (folder / "diverged/ckpt-2.index").exists()
    # a marker that is not the object this writes (edited by hand): the one line still, the marker written anew
    for marker in ("[1, 2]", '{"checkpoint": "ckpt-1", "learning_rate": "fast"}', "3"):
        (folder / train.DIVERGED_FROM).write_text(marker)
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=tf.Variable([1e30, 2.0])), folder, max_to_keep=3)
        said = train.diverged(cause, manager, {"learning_rate": 0.001}, ckpt[1], True, logged.append)
        assert str(said).endswith(f"a rerun resumes from {ckpt[1]}, the last checkpoint (all finite): lower "
                                  "train.learning_rate (now 0.001) and rerun"), marker
        assert json.loads((folder / train.DIVERGED_FROM).read_text()) == {"checkpoint": "ckpt-1", "learning_rate": 0.001}


def test_checkpoints_an_older_run_saved_non_finite_are_set_aside_not_resumed(tmp_path):
    import tensorflow as tf

    from pipeline import train
    folder = tmp_path / "checkpoints"
    weights = tf.Variable([1.0, 2.0])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=weights), folder, max_to_keep=3)
    for step, value in ((1, 1.0), (2, 2.0), (3, float("nan")), (4, float("inf"))):
        weights.assign([value, 2.0])
        manager.save(checkpoint_number=step)
    logged = []
    latest = train.set_aside_diverged(folder, chief=True, log=logged.append)
    assert latest == str(folder / "ckpt-2") == tf.train.latest_checkpoint(folder)
    assert train._checkpoints(folder) == [str(folder / "ckpt-2")]
    assert sorted(p.name for p in (folder / "diverged").glob("*.index")) == ["ckpt-3.index", "ckpt-4.index"]
    assert logged == [f"set aside ckpt-3, ckpt-4 (non-finite or unreadable weights) in {folder / 'diverged'}; the "
                      f"latest checkpoint is now {folder / 'ckpt-2'}"]


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_torn_checkpoint_is_set_aside_and_the_one_before_resumed(tmp_path, damage):
    # a truncated .data file was an IndexError traceback, a flipped byte a checksum OpError, on every rerun
    import tensorflow as tf

    from pipeline import train
    folder = tmp_path / "checkpoints"
    weights = tf.Variable(np.arange(50_000, dtype=np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=weights), folder, max_to_keep=3)
    for step in (1, 2):
        manager.save(checkpoint_number=step)
    data = next(folder.glob("ckpt-2.data-*"))
    raw = bytearray(data.read_bytes())
    data.write_bytes(bytes(raw[:len(raw) // 2]) if damage == "truncated" else bytes(raw[:100]) + bytes([raw[100] ^ 0xFF])
                     + bytes(raw[101:]))
    logged = []
    assert train.set_aside_diverged(folder, chief=True, log=logged.append) == str(folder / "ckpt-1")
    assert (folder / "diverged" / "ckpt-2.index").exists() and "non-finite or unreadable" in logged[0]


@pytest.mark.parametrize("state", ["deleted", "garbage"])
def test_checkpoints_a_lost_state_file_no_longer_names_are_listed_again_not_overwritten(tmp_path, state):
    # without the `checkpoint` state file the trainer started from step 0, cut the loss history back and
    # overwrote ckpt-N files of the same numbers
    import tensorflow as tf

    from pipeline import train
    folder = tmp_path / "checkpoints"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(w=tf.Variable([1.0])), folder, max_to_keep=3)
    for step in (5, 10):
        manager.save(checkpoint_number=step)
    if state == "deleted":
        (folder / "checkpoint").unlink()
    else:
        (folder / "checkpoint").write_text("garbage {{{")
    assert tf.train.latest_checkpoint(folder) is None
    logged = []
    assert train.set_aside_diverged(folder, chief=True, log=logged.append) == str(folder / "ckpt-10")
    assert train._checkpoints(folder) == [str(folder / "ckpt-5"), str(folder / "ckpt-10")]
    assert logged == [f"{folder / 'checkpoint'}: missing or unreadable while ckpt-5, ckpt-10 are there: listed them "
                      "again; resuming from ckpt-10"]
    assert train.relist(folder, logged.append) == [] and len(logged) == 1   # listed: nothing more to do


def test_resuming_across_float16_loss_scaling_is_one_line_naming_mixed_precision(tmp_path):
    # `mixed_precision: auto` is float16 on a GPU without bfloat16 and off on most CPUs: resuming on the
    # other machine restored a loss-scaled optimizer's state into a plain one, a TensorFlow traceback
    import keras
    import tensorflow as tf

    from pipeline import train
    saved = {}
    for name, scaled in (("plain", False), ("scaled", True)):
        model = keras.Sequential([keras.layers.Dense(2)])
        model.build((None, 3))
        opt = keras.optimizers.Adam()
        opt = keras.optimizers.LossScaleOptimizer(opt) if scaled else opt
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(tf.ones((1, 3))))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        saved[name] = (tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / name / "ckpt")), opt)
    for path, opt in saved.values():
        train.check_loss_scale(path, {"optimizer": opt}, "off")          # the same kind resumes
    with pytest.raises(errors.PipelineError, match=r"trained with train.mixed_precision float16 .*resumed with off here; "
                                            r"set train.mixed_precision: float16 to resume it"):
        train.check_loss_scale(saved["scaled"][0], {"optimizer": saved["plain"][1]}, "off")
    with pytest.raises(errors.PipelineError, match=r"off or bfloat16 .*resumed with float16 here; set train.mixed_precision: off"):
        train.check_loss_scale(saved["plain"][0], {"optimizer": saved["scaled"][1]}, "float16")


# --- `pip install .`: the wheel carries every folder of the package and the configs -------------
def test_the_wheel_carries_every_package_folder_and_the_configs(tmp_path):
    import shutil
    import zipfile
    src = tmp_path / "src"
    for name in ("pipeline", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    folders = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "pipeline").rglob("__init__.py")}
    assert {f"{f}/__init__.py" for f in folders} <= names  # pipeline, pipeline/models, pipeline/vocoder, ...
    assert {f"pipeline/configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # as installed: no configs/ beside the package
    code = "from pipeline import config; print(config.DEFAULTS); print(config.load_config(check_paths=False)['name'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(ENV, PYTHONPATH=str(site)), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(site / "pipeline" / "configs" / "config.yaml"), "demo"]


# --- an output folder that is a file: one line before the work, not a traceback after it ---------
@pytest.mark.parametrize("module", ["synthesize", "export", "evaluate", "diagnose"])
def test_an_out_folder_that_is_a_file_is_one_line_before_any_work(module, tmp_path, capsys):
    import importlib
    main = importlib.import_module(f"pipeline.{module}").main
    (tmp_path / "report").write_text("keep me")
    cfg = ["--config", str(ROOT / "configs/config.yaml"), "--set", f"runs_dir={tmp_path}/runs"]
    assert one_line_error(main, [*cfg, "--out", str(tmp_path / "report")], capsys) == \
        f"error: --out {tmp_path / 'report'}: a file, not a folder"
    assert one_line_error(main, [*cfg, "--out", str(tmp_path / "report/x")], capsys) == \
        f"error: --out {tmp_path / 'report/x'}: {tmp_path / 'report'} is a file, not a folder"
    assert (tmp_path / "report").read_text() == "keep me" and sorted(os.listdir(tmp_path)) == ["report"]


# --- paths a command reads and writes, arguments that are not text, another working folder ------
def test_an_output_that_is_an_input_is_refused_before_any_work(tmp_path, capsys):
    # `speak --out VOICE/export.json` wrote a wav over the voice's export.json (exit 0: the voice broken),
    # `vocode --mel m.npy --out m.npy` over the mel, `--out c.yaml` over its config
    from pipeline import files, speak
    from pipeline.vocoder import vocode
    voice = tmp_path / "voice"
    voice.mkdir()
    (voice / "export.json").write_text("{}")
    said = one_line_error(speak.main, ["--voice", str(voice), "--out", str(voice / "export.json"), "Hi."], capsys)
    assert said == (f"error: --out {voice / 'export.json'}: it lies in that folder, --voice {voice}, which this "
                    "command reads; write the output elsewhere")
    assert (voice / "export.json").read_text() == "{}"
    mel, cfg = tmp_path / "m.npy", tmp_path / "c.yaml"
    np.save(mel, np.zeros((4, 80), np.float32))
    cfg.write_text("name: t\n")
    os.symlink(mel, tmp_path / "link.npy")
    for out, option in ((mel, "--mel"), (tmp_path / "link.npy", "--mel"), (cfg, "--config")):
        said = one_line_error(vocode.main, ["--config", str(cfg), "--mel", str(mel), "--out", str(out)], capsys)
        assert said.startswith(f"error: --out {out}: it is that file, {option} ") and "write the output elsewhere" in said
    assert np.load(mel).shape == (4, 80) and cfg.read_text() == "name: t\n"
    files.check_not_input(tmp_path / "other.wav", "--out", {"--mel": str(mel), "--f0": None})   # elsewhere: fine
    # nor the run's vocoder it loads: a wav over vocoder.json or a checkpoint's .index broke every later vocode
    run = tmp_path / "runs" / "t"
    (run / "vocoder" / "train").mkdir(parents=True)
    (run / "vocoder.json").write_text("{}")
    (run / "vocoder" / "train" / "ckpt-1.index").write_text("x")
    cfg.write_text(f"name: t\nruns_dir: {tmp_path / 'runs'}\n")
    for out, what in ((run / "vocoder.json", "it is that file, the vocoder's summary"),
                      (run / "vocoder" / "train" / "ckpt-1.index", "it lies in that folder, the vocoder's checkpoints")):
        said = one_line_error(vocode.main, ["--config", str(cfg), "--mel", str(mel), "--out", str(out)], capsys)
        assert said.startswith(f"error: --out {out}: {what} "), said
    assert (run / "vocoder.json").read_text() == "{}"


def test_only_an_old_temporary_file_of_this_users_is_a_leftover(tmp_path):
    from pipeline import files
    names = {".shard-000.bin.tmp12345": 3600, ".shard-001.bin.tmp12346": 0, ".w.tmp7.weights.h5": 3600,
             ".x.tmp": 3600, "shard-000.bin": 3600, ".notes.tmp12": 3600}
    for name, age in names.items():
        (tmp_path / name).write_text("x")
        os.utime(tmp_path / name, (time.time() - age, time.time() - age))
    os.symlink(tmp_path / "shard-000.bin", tmp_path / ".shard-002.bin.tmp5")   # a link: never followed, kept
    (tmp_path / ".dir.tmp9").mkdir()                                           # a folder: kept
    removed = files.remove_stale_temporaries(tmp_path)
    assert sorted(os.path.basename(p) for p in removed) == [".notes.tmp12", ".shard-000.bin.tmp12345",
                                                             ".w.tmp7.weights.h5"]
    assert sorted(os.listdir(tmp_path)) == [".dir.tmp9", ".shard-001.bin.tmp12346", ".shard-002.bin.tmp5", ".x.tmp",
                                            "shard-000.bin"]
    assert files.remove_stale_temporaries(tmp_path / "missing") == []


def test_a_link_planted_at_the_temporary_name_is_not_written_through(tmp_path):
    # in a folder others may write (speak --out /tmp/x.wav), .x.wav.tmp{pid} is a predictable name: a link
    # planted there sent the write, as this user, to wherever it pointed
    from pipeline import files
    victim, out = tmp_path / "victim.txt", tmp_path / "shared" / "x.wav"
    victim.write_text("not yours")
    out.parent.mkdir()
    tmp = files.temporary(out)
    tmp.symlink_to(victim)
    with pytest.raises(errors.PipelineError, match=r"^.*\.x\.wav\.tmp\d+: something not this user's file \(a link, another "
                                            r"user's file\) is where the temporary file of .*x\.wav goes; remove it$"):
        files.atomic_write_text(out, "audio")
    assert victim.read_text() == "not yours" and tmp.is_symlink() and not out.exists()
    tmp.unlink()
    tmp.write_text("left by a killed process of ours with this pid")
    files.atomic_write_text(out, "audio")
    assert out.read_text() == "audio" and not tmp.exists()


def test_a_memo_whose_temporary_name_is_taken_is_computed_not_a_failure(tmp_path, monkeypatch):
    # the mel filterbank's memo is a saving: a link at its temporary name must not fail the job
    from pipeline import files
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    params = dict(sample_rate=16000, n_fft=512, n_mels=40, fmin=0.0, fmax=7000.0)
    audio.mel_basis.cache_clear()
    made = audio.mel_basis(**params)                   # the memo written, then taken away
    (memo,) = audio.memo_folder().glob(".mel_basis-*.npy")
    memo.unlink()
    files.temporary(memo, ".npy").symlink_to(tmp_path / "elsewhere")
    audio.mel_basis.cache_clear()
    assert np.array_equal(audio.mel_basis(**params), made) and not (tmp_path / "elsewhere").exists()
    audio.mel_basis.cache_clear()


def test_speak_with_standard_input_closed_is_one_line(tmp_path):
    # `python -m pipeline.speak --voice V --out x.wav <&-`: sys.stdin is None, an AttributeError after the
    # model had loaded
    proc = subprocess.run([sys.executable, "-m", "pipeline.speak", "--voice", str(tmp_path / "voice"), "--out",
                           str(tmp_path / "x.wav")], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          cwd=ROOT, env=ENV, preexec_fn=lambda: os.close(0))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "error: no text to speak: no TEXT given and standard input is closed"), proc.stderr[-2000:]


def test_arguments_that_are_not_utf8_are_one_line(capsys):
    # `--set name=t\xe9`, `pipeline.text caf\xe9`: a UnicodeEncodeError traceback wherever the text was written
    from pipeline import config as config_mod
    bad = os.fsdecode(b"caf\xe9")
    said = one_line_error(text.main, [bad], capsys)
    assert said == "error: argument 'caf\\xe9' is not UTF-8 text (byte 0xe9); paths, text and options are read as UTF-8"
    said = one_line_error(config_mod.main, ["--set", os.fsdecode(b"name=t\xe9")], capsys)
    assert said.startswith("error: argument 'name=t\\xe9' is not UTF-8 text")


def test_a_full_disk_under_tensorflow_is_a_full_disk_not_out_of_memory(capsys):
    # a checkpoint's save on a full disk raises TensorFlow's ResourceExhaustedError, which said "out of memory:
    # lower the model's sizes"
    import tensorflow as tf
    err = tf.errors.ResourceExhaustedError(None, None, "/runs/t/export/.tmp/variables/variables_temp/part-00000-of-00001"
                                           ".data-00000-of-00001.tempstate123; No space left on device [Op:SaveV2]")

    def main(argv=None):
        raise err
    said = one_line_error(errors.cli(main), [], capsys)
    assert said == ("error: no space left on device writing /runs/t/export/.tmp/variables/variables_temp/"
                    "part-00000-of-00001.data-00000-of-00001.tempstate123; free space and rerun")


@pytest.mark.parametrize("key", ["cache", "runs_dir", "reports_dir"])
def test_a_folder_key_that_starts_with_a_dash_is_refused_naming_it(tmp_path, key):
    # `runs_dir: -runs` planned, then every job failed with "argument --out: expected one argument"
    overrides = {"cache": {"dir": "-cache"}} if key == "cache" else {key: "-x"}
    with pytest.raises(ConfigError, match=r"^(cache\.dir|runs_dir|reports_dir): '-(cache|x)' starts with '-', which the "
                                          r"jobs' commands would read as an option"):
        config.load_config(None, overrides, check_paths=False)


@pytest.mark.parametrize("key", ["cache", "runs_dir", "reports_dir"])
def test_a_folder_key_that_starts_with_a_tilde_is_refused_naming_it(tmp_path, key, monkeypatch):
    # quoted in every command, `runs_dir: ~/runs` made a folder named "~" in the working folder
    monkeypatch.chdir(tmp_path)
    overrides = {"cache": {"dir": "~/c"}} if key == "cache" else {key: "~/x"}
    with pytest.raises(ConfigError) as e:
        config.load_config(None, overrides, check_paths=False)
    name = "cache.dir" if key == "cache" else key
    assert str(e.value).startswith(f"{name}: '~/") and "not expanded to a home folder" in str(e.value)
    assert os.path.expanduser("~") in str(e.value) and not (tmp_path / "~").exists()


def test_runs_dir_that_is_the_cache_folder_is_refused(tmp_path, monkeypatch):
    # both write {name}/rejected.tsv: training's left-out clips were read back as the caches' at planning
    monkeypatch.chdir(tmp_path)
    for overrides in ({"runs_dir": "cache"}, {"runs_dir": "./shared/", "cache": {"dir": "shared"}}):
        with pytest.raises(ConfigError, match=r"^runs_dir: '(cache|shared)' is also cache\.dir; the two must be different"):
            config.load_config(None, overrides, check_paths=False)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    with pytest.raises(ConfigError, match=r"^runs_dir: 'link' is also cache\.dir"):
        config.load_config(None, {"runs_dir": "link", "cache": {"dir": "real"}}, check_paths=False)
    assert config.load_config(None, {"reports_dir": "runs"}, check_paths=False)["reports_dir"] == "runs"  # no clash


@pytest.mark.parametrize("key", ["cache", "runs_dir", "reports_dir"])
def test_a_folder_key_where_a_file_stands_is_refused_naming_it(tmp_path, key, monkeypatch):
    # a file at runs/{name} (or at the folder, or above it): planning stopped in a NotADirectoryError
    # traceback (reports_dir), planned jobs that could not write (cache.dir), or said to delete the
    # run's checkpoints (runs_dir)
    monkeypatch.chdir(tmp_path)
    name = "cache.dir" if key == "cache" else key
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "t").write_text("x")
    for folder, blocked in (("folder", "folder/t"), ("file", "file"), ("file/below", "file")):
        overrides = {"name": "t", **({"cache": {"dir": folder}} if key == "cache" else {key: folder})}
        with pytest.raises(ConfigError) as e:
            config.load_config(None, overrides, check_paths=False)
        assert str(e.value).startswith(f"{name}: {blocked} exists and is not a folder"), str(e.value)
    (tmp_path / "folder" / "t").unlink()
    (tmp_path / "folder" / "t").mkdir()
    (tmp_path / "link").symlink_to("folder")
    for folder in ("folder", "link", "new/below"):  # a folder, a link to one, one to make: as before
        overrides = {"name": "t", **({"cache": {"dir": folder}} if key == "cache" else {key: folder})}
        config.load_config(None, overrides, check_paths=False)


def test_a_name_or_folder_longer_than_a_file_name_may_be_is_refused_naming_it(tmp_path, monkeypatch):
    # `--config name=<300 letters>`: planning stopped in an OSError traceback (File name too long)
    monkeypatch.chdir(tmp_path)
    for overrides, key in (({"name": "a" * 300}, "name"), ({"cache": {"dir": "c/" + "é" * 128}}, "cache.dir"),
                           ({"reports_dir": "r" * 256 + "/x"}, "reports_dir")):
        with pytest.raises(ConfigError, match=rf"^{key}: .{{20}}\.\.\. is \d+ bytes, more than a file or folder name"):
            config.load_config(None, overrides, check_paths=False)
    config.load_config(None, {"name": "a" * 255, "runs_dir": "r" * 255}, check_paths=False)  # as long as may be


def test_a_value_json_cannot_hold_is_refused_naming_its_key(tmp_path):
    # a YAML date in the free-form model.options stopped planning with a TypeError traceback
    path = tmp_path / "my.yaml"
    path.write_text("model:\n  options: {released: 2024-01-01, tags: !!set {a, b}}\n")
    with pytest.raises(ConfigError, match=r"model\.options\.released: a date \(2024-01-01\), not a string, number"):
        config.load_config(path, check_paths=False)
    path.write_text("model:\n  options: {released: '2024-01-01'}\n")   # quoted: the text it is
    assert config.load_config(path, check_paths=False)["model"]["options"] == {"released": "2024-01-01"}


def test_true_or_false_stays_text_where_the_key_takes_no_boolean(tmp_path):
    # `name: "true"` was made a boolean and refused ("True is not of type 'string'"), and a speaker
    # named "false" could not be chosen: only keys whose schema takes a boolean read them as one
    path = tmp_path / "my.yaml"
    path.write_text('name: "true"\nsynthesize:\n  speaker: "False"\n')
    cfg = config.load_config(path, check_paths=False)
    assert (cfg["name"], cfg["synthesize"]["speaker"]) == ("true", "False")
    train = config.load_config(None, {"train": {"jit_compile": "true", "mixed_precision": "false"}},
                               check_paths=False)["train"]
    assert (train["jit_compile"], train["mixed_precision"]) == (True, "off")


@pytest.mark.slow
def test_snakemake_from_another_working_folder_finds_its_defaults_and_its_code(tmp_path, corpus_template,
                                                                               monkeypatch):
    # `cd elsewhere; snakemake -s PROJECT/Snakefile --configfile my.yaml`: configs/config.yaml was looked up in
    # the working folder and skipped (a partial config: "'audio' is a required property"), and with a whole
    # config every job failed with "No module named 'pipeline'"
    from conftest import snakemake, write_config
    mine = write_config(tmp_path, corpus_template)                           # partial, absolute paths
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.delenv("PYTHONPATH", raising=False)                           # as a user's shell has it
    snakemake("caches", config=mine, cwd=elsewhere)
    assert (tmp_path / "cache" / "t" / "caches.json").is_file()



def test_a_voice_whose_vocabulary_names_no_front_end_is_one_line(tmp_path, capsys):
    # vocab.json with "frontend": "klingon": `pipeline.text --ids --run` (and speak) ended in KeyError: 'klingon'
    voice = tmp_path / "voice"
    voice.mkdir()
    (voice / "vocab.json").write_text(json.dumps({"symbols": ["_", "~", "a"], "pad_id": 0, "eos_id": 1,
                                                  "frontend": "klingon", "language": "en-us", "cleaners": "basic"}))
    said = one_line_error(text.main, ["--ids", "--run", str(voice), "Hi."], capsys)
    assert said == (f"error: {voice / 'vocab.json'}: not a vocabulary an export writes (no front end this pipeline "
                    "has: characters or phonemes); export the voice again")
