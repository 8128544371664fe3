"""Export: the SavedModel speaks as pipeline.synthesize does in a process without this package,
TFLite models run in tf.lite.Interpreter, `pipeline.text --ids`, bad input, and `snakemake export`."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import soundfile as sf
import yaml
from conftest import (
    ROOT,
    SPEAK,
    edited_copy,
    load_json,
    planned_jobs,
    run_config,
    snakemake,
    write_config,
    write_untrained_checkpoint,
)

from pipeline import config, models, runinfo, text

SENTENCE = "The quick brown fox jumps over the lazy dog."
def clean_python(code, cwd):
    """Run code in a fresh interpreter that cannot import `pipeline`: isolated mode (-I: no PYTHONPATH,
    no current directory on sys.path), started in a folder outside the repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=cwd, env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_module(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))


def saved_functions(saved_model):
    """The object paths of the tf.functions a SavedModel holds, read from its saved_model.pb."""
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved_model / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].object_graph_def
    paths, order = {0: ""}, [0]
    for i in order:  # breadth first from the root: each object's shortest path
        for child in graph.nodes[i].children:
            if child.node_id not in paths:
                paths[child.node_id] = f"{paths[i]}.{child.local_name}".lstrip(".")
                order.append(child.node_id)
    return {paths[i] for i, node in enumerate(graph.nodes) if node.WhichOneof("kind") == "function"}


# What the export's signatures call, and nothing else: no Keras `serving_default` of the vocoder
# alone, no FastPitch `_infer` (export.Held)
SAVED_FUNCTIONS = {"synthesize", "log_mel"}


@pytest.fixture(scope="module")
def exported(exported_run):
    """(config path, export folder) of an untrained run (step 3 of 100) exported with --tflite by the
    CLI (conftest.exported_run, which speak and serve load too)."""
    return exported_run


@pytest.fixture(scope="module")
def reference(exported):
    """pipeline.synthesize's mel and Griffin-Lim audio for SENTENCE at SPEAK's pace and pitch shift."""
    from pipeline.synthesize import load_synthesizer
    from pipeline.vocoder.griffin_lim import griffin_lim
    cfg = config.load_config(exported[0])
    synth = load_synthesizer(cfg, log=lambda *a: None)
    mel = synth.infer(SENTENCE, pace=SPEAK["pace"], pitch_shift=SPEAK["pitch_shift"])["mel"]
    audio = griffin_lim(mel, **cfg["audio"], iters=SPEAK["griffin_lim_iters"]).numpy()
    return {"ids": synth.encode(SENTENCE), "mel": mel, "audio": audio, "cfg": cfg}


LOAD_AND_SPEAK = """
    import json, sys
    sys.modules["pipeline"] = None  # unimportable even where `pip install .` put it in site-packages
    import numpy as np, tensorflow as tf
    voice = tf.saved_model.load({model!r})
    args = (tf.constant([{ids}], tf.int32), tf.constant({pace}), tf.constant({pitch_shift}))
    audio = voice.synthesize(*args)["audio"].numpy()
    served = voice.signatures["synthesize"](tokens=args[0], pace=args[1], pitch_shift=args[2])["audio"].numpy()
    log_mel = voice.log_mel(*args)["log_mel"].numpy()
    np.savez({out!r}, audio=audio, served=served, log_mel=log_mel)
    empty = voice.synthesize(tf.zeros([1, 0], tf.int32), args[1], args[2])["audio"].shape.as_list()
    errors = {{}}
    nan, inf = float("nan"), float("inf")
    for name, call in (("id", ([[{n_symbols}]], 1.0, 0.0)), ("negative", ([[-1]], 1.0, 0.0)),
                       ("pace", ([{ids}], 0.0, 0.0)), ("pace_tiny", ([{ids}], 1e-9, 0.0)),
                       ("pace_inf", ([{ids}], inf, 0.0)), ("pace_nan", ([{ids}], nan, 0.0)),
                       ("shift_nan", ([{ids}], 1.0, nan)), ("shift_inf", ([{ids}], 1.0, -inf))):
        try:
            voice.synthesize(tf.constant(call[0], tf.int32), tf.constant(call[1]), tf.constant(call[2]))
            errors[name] = None
        except tf.errors.InvalidArgumentError as e:
            errors[name] = str(e)
    print(json.dumps({{"empty": empty, "errors": errors}}))
"""


def test_saved_model_speaks_as_pipeline_synthesize_without_the_package(exported, reference, tmp_path):
    cfg_path, out = exported
    n_symbols = len(load_json(out / "vocab.json")["symbols"])
    res = clean_python(LOAD_AND_SPEAK.format(model=str(out / "saved_model"), ids=reference["ids"], n_symbols=n_symbols,
                                             out=str(tmp_path / "said.npz"), pace=SPEAK["pace"],
                                             pitch_shift=SPEAK["pitch_shift"]), cwd=tmp_path)
    said = np.load(tmp_path / "said.npz")
    mel, audio = reference["mel"], reference["audio"]
    hop = reference["cfg"]["audio"]["hop_length"]
    assert len(mel) > 10 and said["log_mel"].shape == (1, *mel.shape)
    np.testing.assert_allclose(said["log_mel"][0], mel, atol=1e-5)            # the same mel
    assert said["audio"].shape == (1, len(mel) * hop) and np.abs(audio).max() > 0
    np.testing.assert_allclose(said["audio"][0], audio, atol=1e-6)            # the same audio (deterministic)
    np.testing.assert_array_equal(said["served"], said["audio"])              # the serving signature itself
    assert saved_functions(out / "saved_model") == SAVED_FUNCTIONS
    assert res["empty"] == [1, 0]                                               # empty tokens: empty audio
    assert "an id outside the vocabulary" in res["errors"]["id"]               # from the graph, not garbage
    assert "a negative token id" in res["errors"]["negative"]
    assert "pace must be a finite number in 0.1..10" in res["errors"]["pace"]
    for name in ("pace_tiny", "pace_inf", "pace_nan"):                          # not empty or endless audio
        assert "pace must be a finite number in 0.1..10" in res["errors"][name], res["errors"]
    for name in ("shift_nan", "shift_inf"):                                     # not NaN audio
        assert "pitch_shift must be a finite number of semitones in -24..24" in res["errors"][name], res["errors"]


def test_tflite_float32_and_float16_run_in_the_interpreter(exported, reference):
    import tensorflow as tf

    from pipeline.audio import mel_spectrogram
    _, out = exported
    meta = load_json(out / "export.json")["tflite"]
    assert meta["float32"]["ops"] == meta["float16"]["ops"] == "builtin"     # no Flex delegate needed
    assert meta["float16"]["bytes"] < 0.6 * meta["float32"]["bytes"]
    a = reference["cfg"]["audio"]
    expected = reference["audio"]
    tokens = np.array([reference["ids"]], np.int32)
    args = dict(pace=np.float32(SPEAK["pace"]), pitch_shift=np.float32(SPEAK["pitch_shift"]))
    heard = {}
    for kind in ("float32", "float16"):
        runner = tf.lite.Interpreter(model_path=str(out / meta[kind]["file"])).get_signature_runner("synthesize")
        heard[kind] = runner(tokens=tokens, **args)["audio"][0]
        # float16 weights can move one token's rounded duration by a frame (seen in about 1 run in 5 with
        # these random weights): its length may differ by one hop, float32's may not
        slack = a["hop_length"] if kind == "float16" else 0
        assert abs(len(heard[kind]) - len(expected)) <= slack and len(heard[kind]) % a["hop_length"] == 0
        assert runner(tokens=np.zeros([1, 0], np.int32), **args)["audio"].shape == (1, 0)
        with pytest.raises(RuntimeError, match="out of bounds"):             # TFLite drops tf.debugging asserts
            runner(tokens=np.array([[10_000]], np.int32), **args)
    # float32: pipeline.dft's matmuls in place of the FFT; the same audio to float tolerance
    np.testing.assert_allclose(heard["float32"], expected, atol=1e-3 * np.abs(expected).max())
    # float16 weights move the mel a little: compare what is heard, not samples
    # (Griffin-Lim's iterations amplify float16 rounding: 0.2-0.36 mean natural-log gap across runs with
    # unseeded weights, against ~3.4 for silence; noise or a wrong mel is of the order of silence's gap)
    n = min(len(heard["float16"]), len(expected))
    mel_gap = np.abs(mel_spectrogram(heard["float16"][:n], **a) - mel_spectrogram(expected[:n], **a)).mean()
    silence_gap = np.abs(mel_spectrogram(np.zeros(n, np.float32), **a) - mel_spectrogram(expected[:n], **a)).mean()
    assert mel_gap < 0.5 and mel_gap < 0.1 * silence_gap, (mel_gap, silence_gap)


def test_export_json_and_vocab_json_say_what_was_exported(exported):
    cfg_path, out = exported
    cfg = config.load_config(cfg_path)
    meta = load_json(out / "export.json")
    assert meta["run"] == "t" and meta["step"] == 3 and meta["checkpoint"].endswith("ckpt-3")
    assert meta["acoustic"] == {"step": 3, "planned_steps": 100, "finished": False, "summary": None}  # untrained
    assert meta["vocoder"]["kind"] == "griffin_lim" and meta["vocoder"]["trained"] is False
    assert "no trained vocoder" in meta["vocoder"]["note"]
    assert meta["notes"][0].startswith("the acoustic model is exported at step 3 of train.steps 100")
    assert meta["sample_rate"] == 22050 and meta["audio"] == cfg["audio"] and meta["model"] == "fastpitch"
    assert meta["signature"]["inputs"] == {"tokens": "int32 [1, T]", "pace": "float32 []", "pitch_shift": "float32 []"}
    vocab = load_json(out / "vocab.json")
    carried = load_json(config.run_dir(cfg) / "run.json")                      # what the run was trained with
    assert vocab == carried["vocab"] and vocab["symbols"][:2] == ["_", "~"] and vocab["frontend"] == "phonemes"
    assert sorted(p.name for p in out.iterdir()) == [".exported", "export.json", "model.tflite",
                                                     "model_float16.tflite", "saved_model", "vocab.json"]  # no temporary left


def test_export_json_has_a_format_and_each_written_files_size_and_sha256(exported):
    # export.json had no format, and nothing tied it to the saved_model/ beside it
    import hashlib
    _, out = exported
    meta = load_json(out / "export.json")
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                     if p.is_file() and (p.name.endswith(".tflite") or "saved_model" in p.parts))
    assert meta["format"] == 1 and sorted(meta["files"]) == written
    assert {"saved_model/saved_model.pb", "saved_model/fingerprint.pb", "model.tflite"} <= set(written)
    for path, entry in meta["files"].items():
        data = (out / path).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, path


def test_text_ids_prints_the_exported_vocabularys_ids(exported, reference, capsys):
    cfg_path, out = exported
    expected = text.encode(SENTENCE, load_json(out / "vocab.json"))
    assert expected == reference["ids"] and expected[-1] == 1                    # end-of-sequence last
    for where in (["--run", str(out)], ["--run", str(out.parent)], ["--config", str(cfg_path)]):
        text.main(["--ids", SENTENCE, *where])
        printed = capsys.readouterr()
        assert json.loads(printed.out) == expected, where
        assert str(out / "vocab.json") in printed.err
    with pytest.raises(SystemExit) as stop:
        text.main(["--ids", SENTENCE, "--run", str(out / "nowhere")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "snakemake export" in err


def test_export_before_training_is_one_line_naming_what_to_run(built_cache, tmp_path, capsys):
    from pipeline import export
    path = run_config(built_cache, tmp_path)
    with pytest.raises(SystemExit) as stop:
        export.main(["--config", str(path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: ") and "snakemake --cores all train" in err
    assert not config.run_dir(config.load_config(path)).exists()   # nor the folder its lock went in


def test_a_kind_export_cannot_build_leaves_export_out_and_refuses_it_at_planning(tmp_path, corpus_template):
    # `snakemake --cores all` with transformer_tts trained, synthesized and evaluated, then failed in export
    assert models.export_problem({"kind": "my_tts:build"}).startswith("model.kind: 'my_tts:build' cannot be exported")
    for kind, exported in (("transformer_tts", False), ("fastpitch", True)):
        path = write_config(tmp_path, corpus_template, model={"kind": kind})
        jobs = planned_jobs(path, "all")
        assert jobs["train"] == 1 and jobs["evaluate"] == 1 and jobs.get("export") == (1 if exported else None), kind
        if not exported:   # by the rule's name, or by its output's path (trained first, then refused)
            stamp = config.run_dir(config.load_config(path)) / "export" / ".exported"
            for target in ("export", str(stamp)):
                proc = snakemake(target, "-n", config=path, check=False)
                assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
                    f"error: model.kind: {kind!r} cannot be exported yet (fastpitch can: its inference is one "
                    "graph with pace and pitch_shift as tensors); synthesize and evaluate use the run's checkpoint "
                    "instead"), (target, proc.stderr[-1500:])


@pytest.mark.slow
def test_snakemake_export_speaks_as_snakemake_synthesize(trained_run, tmp_path):
    # the session's run (conftest.trained_run: FastPitch, a tiny Vocos, `snakemake synthesize` done);
    # `snakemake export` adds its export folder (Griffin-Lim's export: the `exported` tests above, and
    # its plan in test_vocoder_rules)
    path, run = trained_run.path, trained_run.run
    snakemake("export", config=path)
    cfg = config.load_config(path)
    meta = load_json(run / "export" / "export.json")
    assert meta["step"] == 10 and meta["acoustic"]["finished"] and meta["tflite"] is None
    assert meta["acoustic"]["summary"] == str(run / "train.json") and meta["notes"] == []  # finished, trained vocoder
    assert not (run / "export" / "model.tflite").exists()                      # export.tflite: false
    ids = text.encode(cfg["synthesize"]["sentences"][0], load_json(run / "export" / "vocab.json"))
    pace, pitch_shift = cfg["synthesize"]["pace"], cfg["synthesize"]["pitch_shift"]
    clean_python(LOAD_AND_SPEAK.format(model=str(run / "export" / "saved_model"), ids=ids, n_symbols=10_000,
                                       out=str(tmp_path / "said.npz"), pace=pace, pitch_shift=pitch_shift),
                 cwd=tmp_path)
    said = np.load(tmp_path / "said.npz")
    mel = np.load(run / "samples" / "00.npy")                                  # what snakemake synthesize made
    np.testing.assert_allclose(said["log_mel"][0], mel, atol=1e-5)
    wav, sr = sf.read(run / "samples" / "00.wav", dtype="float32")
    audio = said["audio"][0]
    peak = np.abs(audio).max()
    audio = audio * (0.95 / peak) if peak > 1.0 else audio                     # save_wav's clipping guard
    assert sr == meta["sample_rate"] and wav.shape == audio.shape and peak > 1e-3
    np.testing.assert_allclose(wav, audio, atol=1.5 / 32768)                  # equal up to 16-bit rounding
    # new sentences rerun synthesize, not the export (an edited copy: the shared run's config stays)
    other = edited_copy(path, "export_new_sentences.yaml", synthesize={"sentences": ["Another sentence."]})
    assert planned_jobs(other, "export") == {}
    assert planned_jobs(other, "synthesize") == {"synthesize": 1}


@pytest.fixture(scope="module")
def exported_vocos(trained_run, tmp_path_factory):
    """(config, export folder) of the session's trained run (conftest.trained_run: FastPitch and a tiny
    Vocos, its final runs/{name}/vocoder.json after fine-tuning), exported with --tflite by the CLI
    into a folder of this module's own (`snakemake export` writes the run's)."""
    out = tmp_path_factory.mktemp("export_vocos") / "export"
    proc = run_module("pipeline.export", "--tflite", "--config", str(trained_run.path), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return trained_run.path, out


def test_saved_model_with_the_trained_vocoder_speaks_as_pipeline_vocode_without_the_package(exported_vocos, tmp_path):
    import tensorflow as tf

    from pipeline.synthesize import load_synthesizer
    from pipeline.vocoder import vocode
    cfg_path, out = exported_vocos
    cfg = config.load_config(cfg_path)
    synth = load_synthesizer(cfg, log=lambda *a: None)
    mel = synth.infer(SENTENCE, pace=SPEAK["pace"], pitch_shift=SPEAK["pitch_shift"])["mel"]
    np.save(tmp_path / "mel.npy", mel)
    vocoded = vocode.vocode(cfg, tmp_path / "mel.npy", tmp_path / "vocoded.wav")   # what pipeline.vocode writes
    ids = synth.encode(SENTENCE)
    clean_python(LOAD_AND_SPEAK.format(model=str(out / "saved_model"), ids=ids, n_symbols=len(synth.vocab["symbols"]),
                                       out=str(tmp_path / "said.npz"), pace=SPEAK["pace"],
                                       pitch_shift=SPEAK["pitch_shift"]), cwd=tmp_path)
    said = np.load(tmp_path / "said.npz")
    np.testing.assert_allclose(said["log_mel"][0], mel, atol=1e-5)
    assert said["audio"].shape == (1, len(mel) * cfg["audio"]["hop_length"]) and np.abs(vocoded).max() > 0
    np.testing.assert_allclose(said["audio"][0], vocoded, atol=1e-5 * np.abs(vocoded).max())   # Vocos, not Griffin-Lim
    assert saved_functions(out / "saved_model") == SAVED_FUNCTIONS                # the Keras vocoder's own: not saved
    wav, _ = sf.read(tmp_path / "vocoded.wav", dtype="float32")
    peak = np.abs(vocoded).max()
    np.testing.assert_allclose(wav, vocoded * (0.95 / peak) if peak > 1.0 else vocoded, atol=1.5 / 32768)

    meta = load_json(out / "export.json")
    summary = load_json(config.run_dir(cfg) / "vocoder.json")
    assert meta["vocoder"] == {"kind": "vocos", "trained": True, "steps": 10, "finetune_steps": 4, "finetune_share": 0.75,
                               "phase": "finetune",
                               "checkpoint": summary["checkpoint"], "summary": str(config.run_dir(cfg) / "vocoder.json"),
                               "gta_from": summary["gta_from"], "f0": None}  # a Vocos takes no F0
    assert [runinfo.checkpoint_path(c) for c in summary["gta_from"]] == [meta["checkpoint"]]  # fine-tuned for it
    assert not any(n.startswith("vocoder") or "fine-tuned" in n for n in meta["notes"])
    # the TFLite float32 model runs the trained vocoder on built-in ops in tf.lite.Interpreter
    assert meta["tflite"]["float32"]["ops"] == meta["tflite"]["float16"]["ops"] == "builtin"
    runner = tf.lite.Interpreter(model_path=str(out / "model.tflite")).get_signature_runner("synthesize")
    heard = runner(tokens=np.array([ids], np.int32), pace=np.float32(SPEAK["pace"]),
                   pitch_shift=np.float32(SPEAK["pitch_shift"]))["audio"][0]
    np.testing.assert_allclose(heard, vocoded, atol=1e-3 * np.abs(vocoded).max())
    empty = runner(tokens=np.zeros([1, 0], np.int32), pace=np.float32(1.0), pitch_shift=np.float32(0.0))["audio"]
    assert empty.shape == (1, 0)


def test_export_with_a_vocoder_kind_but_no_trained_vocoder_is_one_line_naming_the_vocoder_target(
        exported_vocos, tmp_path, capsys):
    from pipeline import export
    cfg_path, _ = exported_vocos
    user = yaml.safe_load(cfg_path.read_text())
    user["vocoder"]["kind"] = "hifigan"                                       # vocoder.json holds a vocos
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(user))
    with pytest.raises(SystemExit) as stop:
        export.main(["--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "export")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "snakemake --cores all vocoder" in err, err
    assert not (tmp_path / "export").exists()


def test_a_direct_export_of_a_vocoder_fine_tuned_for_another_acoustic_checkpoint_says_so_in_one_line(
        trained_run, tmp_path, capsys):
    """Acoustic training went on after the vocoder's fine-tuning: `snakemake export` reruns the GTA mels and
    the fine-tuning first (gta_shard takes train.json); `python -m pipeline.export` exports the vocoder as it
    is (as `pipeline.synthesize` speaks with it) and says so: one stderr line naming vocoder.json, both
    acoustic checkpoints and `snakemake --cores all vocoder`, also in export.json's notes. Before, nothing."""
    import tensorflow as tf

    from pipeline import export
    from pipeline.synthesize import load_synthesizer
    from pipeline.vocoder import inputs, kinds
    user = yaml.safe_load(trained_run.path.read_text())                        # a copy: the shared run stays
    user.update(runs_dir=str(tmp_path / "runs"))                               # the same name: the same caches
    (tmp_path / "copy.yaml").write_text(yaml.safe_dump(user))
    shutil.copytree(trained_run.run, tmp_path / "runs" / user["name"])
    cfg = config.load_config(tmp_path / "copy.yaml")
    run = config.run_dir(cfg)
    tuned, summary = run / "checkpoints" / "ckpt-10", kinds.read_summary(kinds.summary_path(cfg))
    assert summary["phase"] == "finetune" and [runinfo.checkpoint_path(c) for c in summary["gta_from"]] == [
        str(trained_run.run / "checkpoints" / "ckpt-10")]                      # recorded where it trained
    older = {k: v for k, v in summary.items() if k != "gta_from"}              # a summary from before the key
    assert inputs.finetuned_elsewhere(cfg, summary, str(tuned)) is None
    assert inputs.finetuned_elsewhere(cfg, older, str(tuned)) is None         # read from the GTA shards
    model = load_synthesizer(cfg, log=lambda *a: None).model                  # more acoustic training: new weights
    model.trainable_variables[0].assign_add(tf.fill(model.trainable_variables[0].shape, 0.01))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run / "checkpoints", 3).save(checkpoint_number=20)
    capsys.readouterr()
    meta = export.export(cfg, tmp_path / "export", tflite=False, log=lambda *a: None)
    err = capsys.readouterr().err.splitlines()
    said = [line for line in err if "fine-tuned" in line]
    assert len(said) == 1 and said[0].startswith(f"note: {run / 'vocoder.json'}: "), err
    assert all(f in said[0] for f in (str(trained_run.run / "checkpoints" / "ckpt-10"),
                                      f"not of {run / 'checkpoints' / 'ckpt-20'}", "`snakemake --cores all vocoder`"))
    assert meta["checkpoint"] == str(run / "checkpoints" / "ckpt-20") and meta["notes"] == [said[0][len("note: "):]]
    assert "ckpt-10" in inputs.finetuned_elsewhere(cfg, older, meta["checkpoint"])  # the older summary too
    # synthesize and evaluate run directly say the same, in their logs
    from pipeline import evaluate, synthesize
    for command, call in (("synthesize", lambda log: synthesize.synthesize(cfg, tmp_path / "samples", log=log)),
                          ("evaluate", lambda log: evaluate.evaluate(cfg, tmp_path / "report", log=log))):
        logged = []
        call(logged.append)
        said = [line for line in logged if "fine-tuned" in line]
        assert len(said) == 1 and f"not of {run / 'checkpoints' / 'ckpt-20'}" in said[0], (command, logged)
        assert said[0].endswith(f", then {command} again"), said[0]


def test_a_tflite_model_that_gives_non_finite_audio_is_refused(tmp_path):
    # a converter can write a model whose kernels misbehave in the interpreter: export checks each one
    import tensorflow as tf

    from pipeline import export

    spec = (tf.TensorSpec([1, None], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))

    class Voice(tf.Module):
        def __init__(self, scale):
            self.scale = tf.Variable(scale)

        @tf.function(input_signature=spec)
        def synthesize(self, tokens, pace, pitch_shift):
            frames = tf.cast(tf.repeat(tokens, 4, axis=1), tf.float32) + pace + pitch_shift
            return {"audio": tf.math.sqrt(self.scale * frames)}   # sqrt of a negative: NaN

    vocab = {"symbols": list("_~abcdefghij"), "eos_id": 1}
    good, bad = Voice(1.0), Voice(-1.0)

    def tflite(voice):
        path = tmp_path / f"voice{float(voice.scale.numpy())}"
        tf.saved_model.save(voice, str(path), signatures={export.SIGNATURE: voice.synthesize})
        flat, ops = export.convert_tflite(path)
        assert ops["ops"] == "builtin"
        return flat

    assert export.check_tflite(tflite(good), good, vocab) is None
    reason = export.check_tflite(tflite(bad), good, vocab)
    assert reason and "non-finite audio (32 of 32 samples)" in reason


def test_an_out_that_is_not_an_export_is_refused_before_any_work(exported, tmp_path, capsys, monkeypatch):
    # export replaces its folder whole: a run, a folder of the user's or `.` is refused, one line, and kept
    from pipeline import export
    cfg_path, _ = exported
    run = tmp_path / "run"                                              # what a trained run holds
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "ckpt-3.index").write_text("weights")
    (run / "run.json").write_text("{}")
    (run / "export.json").write_text("{}")
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    lone = tmp_path / "lone"                                            # an export writes vocab.json, not alone
    lone.mkdir()
    (lone / "vocab.json").write_text("{}")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))

    def refused(out, *fragments):
        with pytest.raises(SystemExit) as stop:
            export.main(["--config", str(cfg_path), "--out", out])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith("error: --out"), err
        assert all(f in err for f in fragments), (fragments, err)

    refused(str(run), f"--out {run}: holds checkpoints/, run.json, not a previous export")
    refused(f"{precious}/", f"--out {precious}: holds notes.txt, not a previous export")
    refused(str(lone), f"--out {lone}: holds vocab.json, not a previous export")
    refused("", "--out: an empty path")
    monkeypatch.chdir(precious)
    refused(".", f"--out {precious}: holds notes.txt")                  # `.` is the folder it names
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_a_previous_export_is_replaced_whole(exported, tmp_path, monkeypatch):
    from pipeline import export
    cfg_path, previous = exported
    out = tmp_path / "voice"
    out.mkdir()
    monkeypatch.chdir(out)
    assert export.check_out(".") == out and export.check_out(f"{out}/") == out    # empty: taken, as its own path
    for name in export.TFLITE_FILES.values():   # what `snakemake export` leaves of an export with TFLite models
        (out / name).write_bytes(b"old")
    assert export.check_out("./") == out
    monkeypatch.chdir(tmp_path)
    shutil.rmtree(out)
    shutil.copytree(previous, out)                                      # a previous export, with its TFLite models
    (out / "export.json").write_text(json.dumps({**load_json(out / "export.json"), "run": "old"}))
    export.main(["--config", str(cfg_path), "--out", "voice/"])
    meta = load_json(out / "export.json")
    assert meta["run"] == load_json(previous / "export.json")["run"] != "old" and meta["tflite"] is None
    assert sorted(os.listdir(out)) == [".exported", "export.json", "saved_model", "vocab.json"]  # no stale TFLite
    assert sorted(os.listdir(tmp_path)) == ["voice"]                    # nothing left beside it
    # through a symbolic link: the folder it leads to is replaced and the link kept (the link was replaced
    # by a folder, the old link left beside it as .link.old-..., and the folder kept its stale export)
    (out / "export.json").write_text(json.dumps({**load_json(out / "export.json"), "run": "old"}))
    os.symlink(out, tmp_path / "link")
    export.main(["--config", str(cfg_path), "--out", str(tmp_path / "link")])
    assert (tmp_path / "link").is_symlink() and load_json(out / "export.json")["run"] != "old"
    assert sorted(os.listdir(tmp_path)) == ["link", "voice"]


SOURCE_FILTER = {"kind": "source_filter", "steps": 0, "finetune_steps": 0, "learning_rate": 0.001, "batch_size": 2,
                 "segment_frames": 16, "checkpoint_every": 5, "log_every": 5, "summary_every": 10,
                 "source_filter": {"dim": 16, "intermediate_dim": 32, "layers": 1, "kernel": 7, "f0_head_dim": 16,
                                   "f0_weight": 1.0}}


def test_a_source_filter_export_speaks_an_empty_token_list_and_a_one_frame_mel(built_cache, tmp_path):
    # the source-filter vocoder takes 2 frames at n_fft 1024, hop 256 (kinds.min_frames): the exported
    # graph runs silent frames after a shorter mel and keeps only the mel's own audio
    import tensorflow as tf
    from conftest import write_untrained_checkpoint

    from pipeline import export
    from pipeline.vocoder import train
    path = run_config(built_cache, tmp_path, vocoder=SOURCE_FILTER, steps=100)
    write_untrained_checkpoint(path, step=3)
    cfg = config.load_config(path)
    train.train_vocoder(cfg, "train", config.run_dir(cfg) / "vocoder" / "train.json", final=True, log=lambda *a: None)
    meta = export.export(cfg, tmp_path / "export", tflite=False, log=lambda *a: None)
    assert meta["vocoder"]["kind"] == "source_filter"
    voice = tf.saved_model.load(str(tmp_path / "export" / "saved_model"))
    empty = voice.synthesize(tf.zeros([1, 0], tf.int32), tf.constant(1.0), tf.constant(0.0))["audio"]
    assert empty.shape == (1, 0)
    vocoder, info = export.export_vocoder(cfg, cfg["audio"], "fft")       # the graph's vocoder, as exported
    mel = np.full((1, cfg["audio"]["n_mels"]), -5.0, np.float32)            # one frame, its F0 head's or given
    for f0 in (None, tf.constant([120.0])):
        assert vocoder(tf.constant(mel), f0).shape == (cfg["audio"]["hop_length"],)


def test_tflite_refuses_negative_ids_and_too_many_tokens_as_the_saved_model_does(exported):
    # Keras 3's `take` wraps a negative id numpy-style and TFLite drops the graph's assertions: -1 spoke
    # as the last symbol. Self-attention's memory grows with the square of the tokens: a bound, recorded
    import tensorflow as tf
    _, out = exported
    meta = load_json(out / "export.json")
    n, most = len(load_json(out / "vocab.json")["symbols"]), meta["max_tokens"]
    assert most == 4096 and meta["tflite"]["float32"]["ops"] == "builtin"     # FastPitch's max_positions
    args = dict(pace=np.float32(1.0), pitch_shift=np.float32(0.0))
    runner = tf.lite.Interpreter(model_path=str(out / "model.tflite")).get_signature_runner("synthesize")
    assert runner(tokens=np.array([[n - 1, 1]], np.int32), **args)["audio"].shape[1] > 0   # the last id speaks
    for ids in ([[-1, 1]], [[5, -n, 1]], [[-2**31, 1]], np.full((1, most + 1), 5)):
        with pytest.raises(RuntimeError, match="out of bounds"):
            runner(tokens=np.array(ids, np.int32), **args)
    voice = tf.saved_model.load(str(out / "saved_model"))
    call = lambda ids: voice.synthesize(tf.constant(ids, tf.int32), tf.constant(1.0), tf.constant(0.0))  # noqa: E731
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"tokens: more than {most} .export.json max_tokens."):
        call(np.full((1, most + 1), 5))
    with pytest.raises(tf.errors.InvalidArgumentError, match="a negative token id"):
        call([[-1, 1]])
    assert call(np.full((1, most), 5))["audio"].shape[1] > 0                     # the bound itself is taken


def test_the_bad_input_table_quotes_the_graphs_own_errors(exported):
    # docs/export.md quoted a pace error the graph never gave
    import tensorflow as tf
    _, out = exported
    table = (ROOT / "docs" / "export.md").read_text()
    voice = tf.saved_model.load(str(out / "saved_model"))
    for pace, shift, start in ((0.0, 0.0, "pace must"), (1.0, 99.0, "pitch_shift must")):
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            voice.synthesize(tf.constant([[5, 1]], tf.int32), tf.constant(pace), tf.constant(shift))
        said = str(e.value)[str(e.value).index(start):].split("; got")[0]
        assert f'"{said}; got ..."' in table, said


def test_a_reordered_vocab_json_is_refused_when_the_voice_loads(exported, tmp_path):
    # same size, other order: ids that would speak other phonemes; export.json records the symbols' digest
    from pipeline.voice import Voice, VoiceError
    _, out = exported
    shutil.copytree(out, tmp_path / "voice")
    vocab = load_json(out / "vocab.json")
    symbols = vocab["symbols"]
    symbols[5], symbols[6] = symbols[6], symbols[5]
    (tmp_path / "voice" / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(VoiceError, match=f"{tmp_path / 'voice' / 'vocab.json'}: its symbols are not the ones"):
        Voice(tmp_path / "voice")


def _wrong_scales(mel, mean, std):
    return {"normalised": (mel - mean) / std, "log10": mel / np.log(10), "linear power": np.exp(mel)}


def _noisy_mels(cfg, snr_db):
    """The corpus's clips with white noise at `snr_db`, as the mel job would analyse them: a real
    recording's mel never comes near the clamp (its noise floor is above it)."""
    from pipeline import audio, manifest
    rng, out = np.random.default_rng(0), []
    for clip in [c for group in manifest.load_manifest(cfg["dataset"], 1).values() for c in group][:8]:
        y = audio.load_audio(manifest.clip_audio(cfg["dataset"], clip), sample_rate=cfg["audio"]["sample_rate"],
                             max_seconds=60.0)
        y = y + rng.standard_normal(len(y)).astype(np.float32) * np.sqrt(np.mean(y ** 2) / 10 ** (snr_db / 10))
        out.append(audio.mel_spectrogram(y, **cfg["audio"]))
    return out


def test_vocode_refuses_a_mel_on_another_scale_and_takes_real_ones(exported, tmp_path):
    # the range check alone let z-scored, log10 and linear-power mels through (docs/vocoder.md promised
    # a one-line error); every real mel of the cache, and synthesize's, must still pass, and so must a
    # noisy recording's, which never comes near the clamp (a check on the minimum refused them)
    from pipeline import data, shards
    from pipeline.vocoder import vocode
    cfg = config.load_config(exported[0])
    stats = load_json(config.run_dir(cfg) / "run.json")["stats"]
    mels = [m.astype(np.float32) for entry in data.read_index(cfg)["shards"]
            for m in shards.read(config.cache_dir(cfg) / entry["mels"], "mels")[1]]
    assert len(mels) == 24
    for mel in mels + _noisy_mels(cfg, 20) + _noisy_mels(cfg, 0):
        np.save(tmp_path / "real.npy", mel)
        vocode.read_mel(tmp_path / "real.npy", cfg["audio"])                     # taken
    for mel in mels:
        for wrong in _wrong_scales(mel, np.array(stats["mel_mean"]), np.array(stats["mel_std"])).values():
            np.save(tmp_path / "wrong.npy", wrong.astype(np.float32))
            with pytest.raises(vocode.MelError, match=r"wrong.npy: (its median .* too high|.* sit at -5.00, a clamp)"):
                vocode.read_mel(tmp_path / "wrong.npy", cfg["audio"])
    np.save(tmp_path / "short.npy", np.full((3, cfg["audio"]["n_mels"]), -4.0, np.float32))   # a loud cut-out
    assert vocode.read_mel(tmp_path / "short.npy", cfg["audio"]).shape == (3, cfg["audio"]["n_mels"])


MTIME_ONLY = ("--rerun-triggers", "mtime")


def _copy_of_trained_run(trained_run, tmp_path, **sections):
    """(config, run folder) of a copy of the shared trained run under tmp_path (the same name: the same
    caches), with `sections` merged in. copytree keeps the mtimes: Snakemake run with MTIME_ONLY finds the
    copy up to date (its other triggers would see the duration shards' aligner moved, and rebuild them)."""
    user = yaml.safe_load(trained_run.path.read_text())
    user.update(runs_dir=str(tmp_path / "runs"), reports_dir=str(tmp_path / "reports"), **sections)
    (tmp_path / "copy.yaml").write_text(yaml.safe_dump(user))
    run = tmp_path / "runs" / user["name"]
    shutil.copytree(trained_run.run, run, ignore=shutil.ignore_patterns("export", ".export.*"))
    return tmp_path / "copy.yaml", run


def _kill_the_export_once_started(run, started, timeout=300):
    """Wait for the export's temporary folder beside runs/{name}/export, then SIGKILL the process it names
    (`.export.tmp{pid}.{start}-{host}-0`: files.tagged_folder)."""
    import signal
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and started.is_alive():
        tmp = sorted(run.glob(".export.tmp*"))
        if tmp:
            pid = int(re.fullmatch(r"\.export\.tmp(\d+)\.\d+-.+", tmp[0].name)[1])
            assert pid > 1 and pid != os.getpid(), tmp[0].name
            os.kill(pid, signal.SIGKILL)
            return tmp[0]
        time.sleep(0.2)
    raise AssertionError("snakemake export never started its export")


@pytest.mark.slow
def test_snakemake_export_keeps_the_previous_export_when_killed_or_refused(trained_run, tmp_path):
    # Snakemake deletes a job's declared outputs before it runs: the export's own files were, so a killed
    # `snakemake export` left no voice. A checkpoint whose graph speaks NaN was exported as a voice (only
    # its TFLite models were checked and left out): it is refused now, before anything is written.
    import threading
    path, run = _copy_of_trained_run(trained_run, tmp_path)
    healthy = (run / "run.json").read_text()
    info = load_json(run / "run.json")               # a NaN mel statistic: the graph speaks NaN
    info["stats"]["mel_mean"][0] = float("nan")
    (run / "run.json").write_text(json.dumps(info))
    previous = run / "export"
    (previous / "saved_model").mkdir(parents=True)
    (previous / "saved_model" / "saved_model.pb").write_bytes(b"the previous voice")
    (previous / "vocab.json").write_text(json.dumps(info["vocab"]))
    (previous / "export.json").write_text(json.dumps({"run": "previous"}))
    before = {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()}
    assert planned_jobs(path, "export", *MTIME_ONLY) == {"export": 1}            # the copy is up to date
    assert snakemake("export", *MTIME_ONLY, config=path, check=False).returncode != 0
    log = (tmp_path / "reports" / run.name / "logs" / "export.log").read_text()
    assert "gave non-finite audio" in log and "so it is not exported" in log, log[-2000:]
    assert {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()} == before
    assert not list(run.glob(".export.*"))                                      # refused before any work
    (run / "run.json").write_text(healthy)
    done = {}
    started = threading.Thread(target=lambda: done.update(
        proc=snakemake("export", *MTIME_ONLY, config=path, check=False)))
    started.start()
    killed = _kill_the_export_once_started(run, started)
    started.join(600)
    assert done["proc"].returncode != 0 and killed.is_dir()                    # killed: its temporary stays
    assert {p.relative_to(previous): p.read_bytes() for p in previous.rglob("*") if p.is_file()} == before
    snakemake("export", *MTIME_ONLY, config=path)                             # again: the export is made
    assert load_json(previous / "export.json")["step"] == 10                  # the run's, not the previous voice
    assert sorted(os.listdir(previous)) == [".exported", "export.json", "saved_model", "vocab.json"]
    assert not list(run.glob(".export.*"))                                      # the killed one's removed
    assert planned_jobs(path, "export", *MTIME_ONLY) == {}


def test_leftovers_of_a_live_export_on_another_host_are_kept(tmp_path):
    # a pid is this host's: another node's export writing to the same shared runs folder looked dead
    # (os.kill sees only this host) and its temporary folder was deleted mid-export
    import time

    from pipeline import files
    out = tmp_path / "export"
    host = files.host_id()
    dead = 2 ** 22 + 12345                        # above Linux's pid_max default: no such process
    names = {f".export.tmp-{host}-{dead}": False, f".export.tmp-{host}-{os.getppid()}": True,
             f".export.old-other-node-07-{dead}": True, f".export.tmp-other-node-07-{dead + 1}": False,
             f".export.tmp{dead}": True,          # an older export's name, fresh: kept until it ages
             f".export.old-{host}-{os.getppid()}": False}  # a live pid, but untouched for days: a reused pid
    for name in names:
        (tmp_path / name / "saved_model").mkdir(parents=True)
    stale = time.time() - files.LEFTOVER_SECONDS - 60
    for old in (tmp_path / f".export.tmp-other-node-07-{dead + 1}", tmp_path / f".export.old-{host}-{os.getppid()}"):
        for p in (old, old / "saved_model"):
            os.utime(p, (stale, stale))
    files.remove_leftover_folders(out, "export", log=lambda *a: None)
    assert {name: (tmp_path / name).exists() for name in names} == names


def test_export_and_synthesize_judge_leftover_folders_by_one_rule(tmp_path):
    """Export removed another host's temporary folder once untouched for six hours; synthesize
    (files.remove_leftover_folders) never did, so a killed synthesize on another node sharing the runs
    folder left its samples for good. One rule now, for both names: gone on this host, now; alive by pid and
    start time, kept; a writer no pid here can judge (another host's), once untouched LEFTOVER_SECONDS."""
    import time

    from pipeline import files
    host, dead = files.host_id(), 2 ** 22 + 12345
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = files._started(live.pid)
        for what in ("export", "samples"):
            names = {f".{what}.tmp{dead}.1-other-node-07-x1": False,     # another host's, untouched for days
                     f".{what}.tmp{dead}.2-other-node-07-x2": True,      # another host's, being written
                     f".{what}.tmp{dead}.1-{host}-x3": False,            # this host's, its writer gone
                     f".{what}.tmp{live.pid}.{started}-{host}-x4": True}  # its writer alive, however quiet
            for name in names:
                (tmp_path / name).mkdir()
            stale = time.time() - files.LEFTOVER_SECONDS - 60
            for name in (f".{what}.tmp{dead}.1-other-node-07-x1", f".{what}.tmp{live.pid}.{started}-{host}-x4"):
                os.utime(tmp_path / name, (stale, stale))
            files.remove_leftover_folders(tmp_path / what, what, log=lambda *a: None)
            assert {name: (tmp_path / name).exists() for name in names} == names
        assert files.tagged_folder(tmp_path / "export").name == f".export.tmp{files.process_tag()}-0"
    finally:
        live.kill()
        live.wait()


def test_export_json_bounds_the_graph_as_synthesize_does(exported):
    # the exported graph stops at max_frames: synthesize.max_seconds on the run's frame grid, rounded up as
    # `snakemake synthesize` rounds it; speak and serve read both (pipeline.voice)
    import math
    cfg_path, out = exported
    cfg = config.load_config(cfg_path)
    meta = load_json(out / "export.json")
    a = cfg["audio"]
    assert meta["max_seconds"] == cfg["synthesize"]["max_seconds"] == SPEAK["max_seconds"]
    assert meta["max_frames"] == math.ceil(SPEAK["max_seconds"] * a["sample_rate"] / a["hop_length"])
    run = load_json(config.run_dir(cfg) / "run.json")                       # the name tables, in id order
    assert (meta["speakers"], meta["languages"]) == (run["speakers"], run["languages"]) and run["speakers"] != run["languages"]


def test_an_acoustic_run_at_its_planned_steps_is_exported_as_finished(exported):
    from pipeline import export
    cfg = config.load_config(exported[0])                                  # train.steps 100
    assert export._train_state(cfg, 100)["finished"] is True
    assert export._train_state(cfg, 99)["finished"] is False


def test_a_kind_that_cannot_be_exported_is_one_line_not_a_traceback(monkeypatch):
    # `python -m pipeline.export` on a transformer_tts run: refused before its graph is built
    from pipeline import export
    monkeypatch.setattr(export.runinfo, "run_vocabulary", lambda cfg: {"model": {"kind": "transformer_tts"}})
    with pytest.raises(export.ExportError, match="model.kind: 'transformer_tts' cannot be exported yet"):
        export.build_voice({}, synth=object())


def _export_folder(path, run):
    (path / "saved_model").mkdir(parents=True)
    (path / "saved_model" / "saved_model.pb").write_text(run)
    (path / "export.json").write_text(json.dumps({"run": run}))
    return path


def test_the_previous_export_is_deleted_only_once_the_new_one_is_in_place(tmp_path, monkeypatch):
    from pipeline import export
    out, new = _export_folder(tmp_path / "export", "old"), _export_folder(tmp_path / ".export.tmp-x-1", "new")
    removed, rmtree = [], shutil.rmtree

    def spy(path, *args, **kwargs):
        removed.append((load_json(os.path.join(path, "export.json"))["run"], load_json(out / "export.json")["run"]))
        rmtree(path, *args, **kwargs)
    monkeypatch.setattr(export.shutil, "rmtree", spy)
    export._replace_folder(new, out)
    assert removed == [("old", "new")]                     # the old export removed while `out` holds the new one
    assert load_json(out / "export.json")["run"] == "new" and sorted(os.listdir(tmp_path)) == ["export"]


def test_an_export_folder_that_changed_during_the_export_is_not_replaced(tmp_path):
    # `out` is checked again before it is replaced: a user's file written there meanwhile is never deleted
    from pipeline import export
    from pipeline.errors import PipelineError
    out, new = _export_folder(tmp_path / "export", "old"), _export_folder(tmp_path / ".export.tmp-x-1", "new")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match="holds notes.txt, not a previous export"):
        export._replace_folder(new, out)
    assert (out / "notes.txt").read_text() == "mine" and load_json(out / "export.json")["run"] == "old"


def test_a_checkpoint_that_speaks_nan_is_not_exported_and_the_previous_export_stays(built_cache, tmp_path):
    """A checkpoint with NaN weights (diverged; older code saved such) was exported without a word: a
    SavedModel whose every sample is NaN. Only the TFLite models were checked. Now the graph speaks a
    test sentence first, and non-finite audio is one line naming the checkpoint; nothing is written."""
    import tensorflow as tf

    from pipeline import export
    from pipeline.synthesize import load_synthesizer
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    cfg = config.load_config(path)
    run = config.run_dir(cfg)
    model = load_synthesizer(cfg, log=lambda line: None).model
    model.mel_out.kernel.assign(tf.fill(model.mel_out.kernel.shape, float("nan")))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), run / "checkpoints", 2).save(checkpoint_number=2)
    out = _export_folder(tmp_path / "export", "old")
    with pytest.raises(export.ExportError, match=r"ckpt-2: the graph gave non-finite audio \(\d+ of \d+ samples\) "
                                                 r"for a test sentence, so it is not exported"):
        export.export(cfg, out, tflite=False, log=lambda line: None)
    assert load_json(out / "export.json")["run"] == "old" and sorted(os.listdir(tmp_path)) == sorted(
        ["config.yaml", "export", "runs"])


def test_an_out_link_that_leads_back_to_itself_is_refused_before_any_work(tmp_path):
    # followed to itself, it passed the checks; the finished export then failed to be renamed there
    # (NotADirectoryError, a traceback) and the whole export was thrown away
    from pipeline import export
    from pipeline.errors import PipelineError
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(PipelineError, match=r"^--out .*loop: a symbolic link that leads back to itself; give a folder$"):
        export.check_out(loop)


def _error_line(proc):
    """The one line a refusal printed: stderr's last, after nothing but TensorFlow's own start-up lines."""
    lines = proc.stderr.strip().splitlines()
    assert not any(line.startswith(("Traceback", "error:")) for line in lines[:-1]), proc.stderr
    return lines[-1]


def test_a_second_export_to_one_out_stops_at_its_start_naming_the_first(tmp_path):
    """Two exports to one --out at once: the second did all its work and failed only at the final rename.
    It stops at its start now, one line naming --out and the holder of the lock beside it (held here by
    this process, as a running export holds it: files.exclusive), and writes nothing."""
    import socket

    from pipeline import files
    path, out = write_config(tmp_path, tmp_path / "data"), tmp_path / "voice"
    lock = tmp_path / ".voice.lock"                                   # beside --out: the renames leave it
    with files.exclusive(lock, lambda holder: holder):
        proc = run_module("pipeline.export", "--config", str(path), "--out", str(out))
        assert sorted(os.listdir(tmp_path)) == [".voice.lock", "config.yaml"]        # nothing written
    assert proc.returncode == 2 and _error_line(proc) == (
        f"error: --out {out}: another export is writing it now (process {os.getpid()} on {socket.gethostname()} "
        f"holds {lock}); wait for it to end, or give another --out"), proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]                           # the lock goes with its holder


def test_an_out_name_too_long_for_the_temporary_folder_is_refused_before_any_work(tmp_path):
    """A 230-byte --out name fits a folder, but not `.NAME.tmp{pid}.{start}-{host}-0` beside it, which
    export made only after building and checking the model: it failed after the work, File name too
    long. It stops first now, naming --out, the limit and the longest name that fits."""
    from pipeline import export, files
    from pipeline.errors import PipelineError
    path, out = write_config(tmp_path, tmp_path / "data"), tmp_path / ("v" * 230)
    proc = run_module("pipeline.export", "--config", str(path), "--out", str(out))
    assert proc.returncode == 2 and re.fullmatch(
        rf"error: --out {out}: a name of 230 bytes; export's temporary folder beside it would be named \d+, more "
        r"than a file or folder name may have \(255 bytes\); give a name of at most \d+ bytes", _error_line(proc)), proc.stderr
    assert os.listdir(tmp_path) == ["config.yaml"]
    with pytest.raises(PipelineError, match=r"give a name of at most (\d+) bytes") as refused:   # this process's bound
        export.check_out(out)
    most = int(re.search(r"at most (\d+) bytes", str(refused.value))[1])
    fits = export.check_out(tmp_path / ("v" * most))                   # the bound, exactly: its folders can be made
    for kind in ("tmp", "old"):
        beside = files.tagged_folder(fits, kind)
        beside.mkdir()
        beside.rmdir()
    with pytest.raises(PipelineError, match=f"a name of {most + 1} bytes"):
        export.check_out(tmp_path / ("v" * (most + 1)))
    link = tmp_path / ("l" * 240)                  # a link's own name: the new export goes beside where it leads
    link.symlink_to(tmp_path / "voice")
    assert export.check_out(link) == tmp_path / "voice"


def test_export_tflite_true_in_the_config_converts_without_the_flag(exported, tmp_path, monkeypatch):
    from pipeline import export

    class Converting(Exception):
        pass

    def convert(*args, **kwargs):
        raise Converting
    monkeypatch.setattr(export, "convert_tflite", convert)
    cfg = config.load_config(exported[0], {"export": {"tflite": True}})
    with pytest.raises(Converting):                                         # no --tflite: export.tflite decides
        export.export(cfg, tmp_path / "voice", log=lambda *a: None)
    assert os.listdir(tmp_path) == []                                       # nothing half-written left


def test_a_tflite_model_that_gives_audio_of_another_length_is_refused(tmp_path):
    # fewer samples than the SavedModel for the test sentence: a cut-short voice is never shipped
    import tensorflow as tf

    from pipeline import export
    spec = (tf.TensorSpec([1, None], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))

    class Voice(tf.Module):
        def __init__(self, hop):
            self.hop = hop

        @tf.function(input_signature=spec)
        def synthesize(self, tokens, pace, pitch_shift):
            return {"audio": tf.cast(tf.repeat(tokens, self.hop, axis=1), tf.float32) * pace + pitch_shift}

    vocab = {"symbols": list("_~abcdefghij"), "eos_id": 1}
    short, full = Voice(3), Voice(4)
    tf.saved_model.save(short, str(tmp_path / "short"), signatures={export.SIGNATURE: short.synthesize})
    flat, _ = export.convert_tflite(tmp_path / "short")
    assert export.check_tflite(flat, short, vocab) is None
    assert export.check_tflite(flat, full, vocab) == ("tf.lite.Interpreter gave 24 samples for a test sentence, "
                                                      "the SavedModel 32")


def test_an_export_with_griffin_lim_says_it_has_no_trained_vocoder(exported):
    meta = load_json(exported[1] / "export.json")
    assert meta["notes"][1:] == [f"vocoder: {meta['vocoder']['note']}"]
    assert meta["notes"][1].startswith("vocoder: Griffin-Lim phase recovery inside the graph")


def test_the_hint_to_export_again_names_the_command_for_a_folder_written_with_out(tmp_path):
    """A voice exported with `python -m pipeline.export --out DIR` and found damaged was told to run
    `snakemake --cores all export`, which writes runs/{name}/export, never DIR: the user re-ran it and the
    damaged voice stayed. The hint now names both commands, --out DIR for a folder written there."""
    from pipeline.voice import Voice, VoiceError
    folder = tmp_path / "my voice"
    folder.mkdir()
    (folder / "export.json").write_text(json.dumps({"format": 1, "files": {}}), encoding="utf-8")
    (folder / "vocab.json").write_text("{}", encoding="utf-8")
    with pytest.raises(VoiceError) as e:
        Voice(folder)
    assert str(e.value).startswith(f"{folder / 'saved_model'}: not found; export the voice again")
    assert "snakemake --cores all export" in str(e.value)
    assert "python -m pipeline.export --config CONFIG --out DIR" in str(e.value)
