"""pipeline/voice.py at its edges: a damaged export folder is one line naming it (never a traceback),
and what a request can make the voice do is bounded before the audio is made."""
import json
import shutil
import subprocess

import pytest
from conftest import ROOT
from test_speak import blocked_command, child_env

from pipeline.voice import VoiceError


def copy_of(voice, tmp_path, name="voice"):
    return shutil.copytree(voice, tmp_path / name)


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def load(folder):
    from pipeline.voice import Voice
    return Voice(folder)


@pytest.mark.parametrize("damage, message", [
    (lambda d: shutil.rmtree(d / "saved_model" / "variables"), "saved_model: cannot be loaded (FileNotFoundError"),
    (lambda d: (d / "saved_model" / "saved_model.pb").write_bytes(b""), "saved_model: cannot be loaded (ValueError"),
    (lambda d: [shutil.rmtree(d / "saved_model"), (d / "saved_model").mkdir()], "saved_model: cannot be loaded"),
    (lambda d: edit_json(d / "export.json", sample_rate=0), "export.json: sample_rate 0 is not an integer in 1000.."),
    (lambda d: edit_json(d / "export.json", sample_rate=-22050), "export.json: sample_rate -22050 is not an integer"),
    (lambda d: edit_json(d / "export.json", max_seconds=1e308), "export.json: max_seconds 1e+308 is not a number in"),
    (lambda d: edit_json(d / "export.json", max_frames="862"), "export.json: max_frames '862' is not an integer"),
    (lambda d: edit_json(d / "export.json", audio=None), "export.json / vocab.json are not what an export writes"),
])
def test_a_damaged_voice_folder_is_one_error_naming_it(exported_voice, tmp_path, damage, message):
    # were tracebacks from tf.saved_model.load, or a voice of sample rate 0 / max_seconds 1e308
    folder = copy_of(exported_voice, tmp_path)
    damage(folder)
    with pytest.raises(VoiceError) as e:
        load(folder)
    assert message in str(e.value) and str(folder) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("change", [1, -1])
def test_a_vocabulary_of_another_size_than_the_models_is_refused_at_load(exported_voice, tmp_path, change):
    # a vocab.json one symbol longer loaded, and `[[ Q ]]` then failed inside the graph (a 500)
    folder = copy_of(exported_voice, tmp_path)
    vocab = json.loads((folder / "vocab.json").read_text())
    n = len(vocab["symbols"])
    vocab["symbols"] = vocab["symbols"] + ["Q"] if change > 0 else vocab["symbols"][:-1]
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(VoiceError, match=rf"vocab.json: {n + change} symbols, but the model takes {n}; export"):
        load(folder)


def test_speak_says_a_damaged_folder_in_one_line(exported_voice, tmp_path):
    folder = copy_of(exported_voice, tmp_path)
    (folder / "saved_model" / "saved_model.pb").write_bytes(b"")
    proc = subprocess.run(blocked_command("pipeline.speak", "--voice", str(folder), "--out", str(tmp_path / "a.wav"),
                                          "Hello."), capture_output=True, text=True, env=child_env(), cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {folder / 'saved_model'}: cannot be loaded")
