"""The vocoder against a hostile user: a config that disagrees with what the vocoder was trained with,
older or damaged summaries, a changed `vocoder:` setting under trained checkpoints, bad --out paths,
a full disk, and mels too long or malformed. Each is the vocoder's own settings, or one line.

A tiny Vocos "trained" for 0 steps by pipeline.vocoder.train (its initial weights, its summary and
runs/{name}/vocoder.json written as the trainer writes them) stands in for a trained one.

    python -m pytest -q tests/test_vocoder_hostile.py
"""
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
import soundfile as sf
import tensorflow as tf
from conftest import ROOT, TINY_VOCODER, run_config, snakemake

from pipeline import config, data, runinfo
from pipeline.audio import LOG_CLAMP
from pipeline.errors import PipelineError
from pipeline.vocoder import inputs, kinds, train, vocode

VOCOS = {**TINY_VOCODER, "steps": 0, "finetune_steps": 0, "vocos": {**TINY_VOCODER["vocos"], "layers": 2}}


@pytest.fixture(scope="module")
def tiny(built_cache, tmp_path_factory):
    """(config path, config, a log-mel .npy of 60 frames) of a run whose vocoder is a tiny untrained Vocos."""
    tmp = tmp_path_factory.mktemp("vocoder_hostile")
    path = run_config(built_cache, tmp, vocoder=VOCOS)
    cfg = config.load_config(path)
    train.train_vocoder(cfg, "train", config.run_dir(cfg) / "vocoder" / "train.json", final=True, log=lambda *a: None)
    mel = np.clip(np.random.default_rng(0).normal(-5.0, 2.0, (60, cfg["audio"]["n_mels"])), np.log(1e-5), 2.0)
    np.save(tmp / "mel.npy", mel.astype(np.float32))
    return path, cfg, tmp / "mel.npy"


def _vocode(capsys, *argv):
    """(exit status, stderr lines) of `python -m pipeline.vocode ARGV`, in this process."""
    capsys.readouterr()
    try:
        vocode.main([str(a) for a in argv])
        code = 0
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err.splitlines()


def _one_line(code, err, *fragments):
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert all(f in err[0] for f in fragments), (fragments, err)


def test_vocode_speaks_at_the_vocoders_own_settings_whatever_the_config_says(tiny, tmp_path, capsys):
    path, cfg, mel = tiny
    summary = json.loads((config.run_dir(cfg) / "vocoder.json").read_text())
    assert summary["audio"] == cfg["audio"] and summary["vocoder"]["vocos"] == VOCOS["vocos"]
    code, err = _vocode(capsys, "--config", path, "--mel", mel, "--out", tmp_path / "plain.wav")
    assert code == 0 and err == [], err
    # another rate, n_mels and model width in the config: the vocoder still speaks as it was trained
    code, err = _vocode(capsys, "--config", path, "--mel", mel, "--out", tmp_path / "moved.wav", "--set",
                        "audio.sample_rate=16000", "audio.n_mels=64", "vocoder.vocos.dim=32")
    assert code == 0 and len(err) == 1, err
    assert err[0].startswith("note: the config gives audio.n_mels 64 (the vocoder's: 80), audio.sample_rate 16000 "
                             "(the vocoder's: 22050), vocoder.vocos.dim 32 (the vocoder's: 16); using the vocoder's "
                             f"own settings ({config.run_dir(cfg) / 'vocoder.json'})"), err
    plain, sr = sf.read(tmp_path / "plain.wav", dtype="float32")
    moved, moved_sr = sf.read(tmp_path / "moved.wav", dtype="float32")
    assert sr == moved_sr == 22050 and len(moved) == 60 * 256 and np.abs(plain).max() > 1e-4
    np.testing.assert_array_equal(moved, plain)


def test_a_vocoder_trained_on_other_mels_than_the_acoustic_runs_is_refused_where_they_meet(tiny):
    # synthesize, export and evaluate give it the acoustic model's mels: a vocoder trained at another
    # rate or hop made audio of the wrong length at the wrong rate, after only a note
    _, cfg, _ = tiny
    moved = dict(cfg, audio=dict(cfg["audio"], sample_rate=16000, hop_length=200))
    with pytest.raises(runinfo.MissingCheckpoint) as e:
        kinds.load(moved, mels_of="the acoustic run", log=lambda *a: None)
    assert str(e.value) == (f"{config.run_dir(cfg) / 'vocoder.json'}: the vocoder was trained on mels of audio.hop_length "
                            "256, audio.sample_rate 22050, the acoustic run makes them with 200, 16000; run "
                            "`snakemake --cores all vocoder` to train it on these mels")
    assert kinds.load(cfg, mels_of="the acoustic run").audio == cfg["audio"]            # the same mels: loads


def test_fine_tuning_from_a_first_phase_of_other_sizes_is_one_line(tiny, tmp_path):
    # `--phase finetune` after an edit of vocoder.vocos.layers started from the first phase's weights
    # with the new block at its initial values, and shipped them (or failed after every step)
    _, cfg, _ = tiny
    deeper = dict(cfg, vocoder={**cfg["vocoder"], "vocos": {**cfg["vocoder"]["vocos"], "layers": 3}})
    trainer = train.VocoderTrainer(deeper, "train", lambda *a: None)
    first = tf.train.latest_checkpoint(str(config.run_dir(cfg) / "vocoder" / "train" / "checkpoints"))
    with pytest.raises(PipelineError) as e:
        train._checkpoints(deeper, "finetune", trainer, tmp_path / "finetune", lambda *a: None)
    assert str(e.value).startswith(f"{first}: the first phase's vocoder does not fit the one these vocoder: settings "
                                   "build (") and str(e.value).endswith("`snakemake --cores all vocoder`")
    same = train.VocoderTrainer(cfg, "train", lambda *a: None)                   # its own sizes: fine-tunes
    train._checkpoints(cfg, "finetune", same, tmp_path / "finetune", lambda *a: None)


def test_a_vocoder_trained_before_a_setting_of_its_network_existed_is_one_line(tiny, tmp_path, capsys):
    # a setting added to a kind's section (its network built otherwise) is missing from the summary of
    # a vocoder trained before it: vocode, export and evaluate say to train it again, not a KeyError
    path, cfg, mel = tiny
    run = config.run_dir(cfg)
    summary = json.loads((run / "vocoder.json").read_text())
    del summary["vocoder"]["vocos"]["kernel"]
    os.replace(run / "vocoder.json", run / "vocoder.json.aside")
    try:
        (run / "vocoder.json").write_text(json.dumps(summary))
        _one_line(*_vocode(capsys, "--config", path, "--mel", mel, "--out", tmp_path / "old.wav"),
                  f"{run / 'vocoder.json'}: a vocos vocoder trained before vocoder.vocos.kernel existed "
                  "(another network); run `snakemake --cores all vocoder` to train it again")
    finally:
        os.replace(run / "vocoder.json.aside", run / "vocoder.json")
    assert not (tmp_path / "old.wav").exists()
    code, err = _vocode(capsys, "--config", path, "--mel", mel, "--out", tmp_path / "new.wav")
    assert code == 0 and err == [], err


@contextlib.contextmanager
def _moved_aside(*paths):
    """Rename `paths` away for the block (the module's run is shared), then back."""
    saved = [(p, p.with_name(p.name + ".aside")) for p in paths if p.exists()]
    for p, aside in saved:
        os.replace(p, aside)
    try:
        yield
    finally:
        for p, aside in saved:
            os.replace(aside, p)


def test_an_older_summary_uses_the_phases_inputs_then_run_json_then_the_config(tiny, tmp_path):
    _, cfg, _ = tiny
    run = config.run_dir(cfg)
    old = {k: v for k, v in json.loads((run / "vocoder.json").read_text()).items() if k not in ("audio", "vocoder")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    other = dict(cfg, audio=dict(cfg["audio"], sample_rate=16000))
    logged = []
    voc = kinds.load(other, summary=tmp_path / "old.json", log=logged.append)
    assert voc.audio == cfg["audio"] and len(logged) == 1 and str(run / "vocoder/train/inputs.json") in logged[0]
    index = data.read_index(cfg)
    runinfo.write(run, runinfo.describe(cfg, index, data.feature_stats(cfg, index)))
    try:
        with _moved_aside(run / "vocoder/train/inputs.json"):
            assert kinds.trained_settings(other, old, tmp_path / "old.json") == (
                cfg["audio"], other["vocoder"], str(runinfo.path(run)))
    finally:
        runinfo.path(run).unlink()
    with _moved_aside(run / "vocoder/train/inputs.json"):
        # nothing recorded: the config's settings, as before summaries recorded them
        assert kinds.trained_settings(other, old, tmp_path / "old.json") == (other["audio"], other["vocoder"], "the config")
        # and a config whose sizes do not fit the checkpoint: one line naming it and the section
        wide = dict(cfg, vocoder={**cfg["vocoder"], "vocos": {**cfg["vocoder"]["vocos"], "dim": 32}})
        with pytest.raises(PipelineError, match=r"ckpt-0: does not fit the vocos vocoder built with the settings "
                                                r"of the config \(.*shape.*\); set vocoder.vocos to the sizes"):
            kinds.load(wide, summary=tmp_path / "old.json")


@pytest.fixture
def mount(tmp_path):
    """mount(options) -> a fresh tmpfs folder with those mount options (root only), unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small file system needs root")
    made = []

    def make(options):
        folder = tmp_path / f"mnt-{uuid.uuid4().hex[:6]}"
        folder.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
        if proc.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
        made.append(folder)
        return folder
    yield make
    for folder in made:
        subprocess.run(["umount", str(folder)], check=True)


def test_vocode_bad_out_damaged_summary_and_full_disk_are_one_line(tiny, tmp_path, capsys, mount):
    path, cfg, mel = tiny
    args = ("--config", path, "--mel", mel, "--out")
    _one_line(*_vocode(capsys, *args, tmp_path), f"--out {tmp_path}: a folder; give the path of the .wav")
    (tmp_path / "file").write_text("")
    _one_line(*_vocode(capsys, *args, tmp_path / "file/x.wav"), f"{tmp_path / 'file'} is a file, not a folder")
    read_only = mount("ro,size=64k")
    _one_line(*_vocode(capsys, *args, read_only / "x.wav"), f"--out {read_only / 'x.wav'}: {read_only} is not writable")
    full = mount("size=16k")  # 60 frames are 30 kB of 16-bit audio
    _one_line(*_vocode(capsys, *args, full / "x.wav"), f"no space left on device writing {full / 'x.wav'}; free space")
    assert os.listdir(full) == []                                              # no temporary file left behind
    summary = config.run_dir(cfg) / "vocoder.json"
    saved = summary.read_bytes()
    try:
        summary.write_bytes(saved[:len(saved) // 2])                          # cut short, as a full disk leaves it
        _one_line(*_vocode(capsys, *args, tmp_path / "x.wav"), f"{summary}: damaged vocoder summary (",
                  "delete it and run `snakemake --cores all vocoder`")
    finally:
        summary.write_bytes(saved)
    assert not (tmp_path / "x.wav").exists()


def test_absurd_mels_are_refused_from_their_header_naming_the_limit(tiny, tmp_path, capsys):
    path, _, mel_path = tiny
    huge = tmp_path / "huge.npy"  # sparse on disk: the refusal reads its header alone
    np.lib.format.open_memmap(huge, mode="w+", dtype=np.float32, shape=(vocode.MAX_FRAMES + 1, 80)).flush()
    _one_line(*_vocode(capsys, "--config", path, "--mel", huge, "--out", tmp_path / "x.wav"),
              f"{huge}: 1,000,001 frames, more than this vocoder takes (1,000,000, ")
    gl = np.lib.format.open_memmap(tmp_path / "gl.npy", mode="w+", dtype=np.float32,
                                   shape=(vocode.WHOLE_MAX_FRAMES + 1, 80))
    gl.flush()
    _one_line(*_vocode(capsys, "--config", path, "--mel", tmp_path / "gl.npy", "--out", tmp_path / "x.wav", "--set",
                       "vocoder.kind=griffin_lim"), "20,001 frames, more than this vocoder takes (20,000, ")
    np.savez(tmp_path / "two.npz", a=np.zeros((4, 80)), b=np.zeros(3))
    _one_line(*_vocode(capsys, "--config", path, "--mel", tmp_path / "two.npz", "--out", tmp_path / "x.wav"),
              f"{tmp_path / 'two.npz'}: not a .npy array (no NumPy header: an archive of several)")
    # a wav given for the mel, or a text file for the F0: what it is, not numpy's advice to unpickle it
    sf.write(tmp_path / "a.wav", np.zeros(2205, np.float32), 22050)
    _one_line(*_vocode(capsys, "--config", path, "--mel", tmp_path / "a.wav", "--out", tmp_path / "x.wav"),
              f"{tmp_path / 'a.wav'}: not a .npy array (no NumPy header: a wav file)")
    (tmp_path / "f0.txt").write_text("100 110 120\n")
    code, err = _vocode(capsys, "--config", path, "--mel", mel_path, "--f0", tmp_path / "f0.txt", "--out",
                        tmp_path / "x.wav")
    _one_line(code, err, f"{tmp_path / 'f0.txt'}: not a .npy array (no NumPy header)")
    assert "pickle" not in err[0]
    # a pipe (which would wait for a writer) or a folder: refused at once, by what it is
    os.mkfifo(tmp_path / "fifo.npy")
    (tmp_path / "mels.npy").mkdir()
    for odd in (tmp_path / "fifo.npy", tmp_path / "mels.npy"):
        _one_line(*_vocode(capsys, "--config", path, "--mel", odd, "--out", tmp_path / "x.wav"),
                  f"{odd}: not a file (a folder, a pipe or a device)")
    assert not (tmp_path / "x.wav").exists()


PROBE = """import sys
from pipeline.vocoder.vocode import main
try:
    main(sys.argv[1:])
finally:
    print("tensorflow loaded:", "tensorflow" in sys.modules)
"""


def test_vocode_answers_bad_input_before_tensorflow_loads(tiny, tmp_path):
    # a real process: the bad --out, the run's vocoder summary and the mel file are checked before the
    # vocoder (and TensorFlow, ~5 s) loads, so a typo costs a fraction of a second
    path, _, mel = tiny
    np.save(tmp_path / "transposed.npy", np.load(mel).T)
    for argv, fragment in ((["--mel", tmp_path / "missing.npy", "--out", tmp_path / "x.wav"], "missing.npy: no such file"),
                           (["--mel", tmp_path / "transposed.npy", "--out", tmp_path / "x.wav"], "(transposed?"),
                           (["--mel", mel, "--out", tmp_path], "a folder; give the path of the .wav")):
        proc = subprocess.run([sys.executable, "-c", PROBE, "--config", str(path), *map(str, argv)], capture_output=True,
                              text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
        assert proc.returncode == 2 and proc.stdout.strip() == "tensorflow loaded: False", (proc.stdout, proc.stderr)
        assert proc.stderr.startswith("error: ") and fragment in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_a_long_mel_vocodes_in_chunks_to_the_unchunked_audio(frames=130, chunk=40):
    cfg = config.load_config(None, {"vocoder": VOCOS}, check_paths=False)
    tf.keras.utils.set_random_seed(0)
    voc = kinds.Vocoder(cfg, kinds.build(cfg["vocoder"], cfg["audio"]))       # untrained: any weights will do
    mel = np.random.default_rng(1).normal(-5.0, 2.0, (frames, cfg["audio"]["n_mels"])).astype(np.float32)
    whole = voc(mel, chunk_frames=None)
    lengths, call = [], voc._call
    voc._call = lambda m: lengths.append(m.shape[1]) or call(m)                # the lengths the model runs at
    chunked = voc(mel, chunk_frames=chunk)                                     # 3-4 chunks and their seams
    assert len(lengths) == -(-frames // chunk) and max(lengths) < frames       # memory bounded by the chunk
    assert whole.shape == chunked.shape == (frames * 256,) and np.abs(whole).max() > 1e-3
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-5 * np.abs(whole).max())
    voc.context = 0                                                            # without context the seams show
    assert np.abs(voc(mel, chunk_frames=chunk) - whole).max() > 1e-2 * np.abs(whole).max()


def test_settings_of_another_vocoder_kind_set_nothing_aside_and_rerun_nothing(tiny, tmp_path):
    # vocoder.source_filter or vocoder.hifigan edited while the kind is vocos: planning noted "sets
    # checkpoints aside and trains that phase from its start" and its jobs threw the training away
    import yaml
    from conftest import planned_jobs
    path, cfg, _ = tiny
    folder = config.run_dir(cfg) / "vocoder/train"
    other = config.merge(cfg, {"vocoder": {"source_filter": {"dim": 8}, "hifigan": {"size": "v1"}},
                               "model": {"transformer_tts": {"dropout": 0.3}}})
    assert inputs.notes(other) == [] and inputs.settings(other) == inputs.settings(cfg)
    text = yaml.safe_load(path.read_text())
    text["vocoder"] = {**text["vocoder"], "source_filter": {"dim": 8}, "hifigan": {"size": "v1"}}
    text["model"] = {**text["model"], "transformer_tts": {"dropout": 0.3}}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(text))
    assert planned_jobs(tmp_path / "other.yaml", "vocoder") == planned_jobs(path, "vocoder")
    # checkpoints whose inputs.json holds every kind's section (recorded before they were left out) resume
    recorded = inputs.path(folder).read_text()
    made = json.loads(recorded)
    inputs.path(folder).write_text(json.dumps({**made, "vocoder": {**made["vocoder"], "hifigan": {"size": "v2"}}}))
    try:
        assert inputs.notes(cfg) == []
        logged = []
        inputs.switch(folder, inputs.settings(cfg), logged.append)
        assert logged == [] and (folder / "checkpoints" / "checkpoint").exists()
    finally:
        inputs.path(folder).write_text(recorded)


def _weights(checkpoint):
    reader = tf.train.load_checkpoint(str(checkpoint))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def test_a_changed_vocoder_setting_is_announced_at_planning_and_its_checkpoints_kept(tiny, tmp_path):
    path, cfg, _ = tiny
    run = config.run_dir(cfg)
    folder, lr = run / "vocoder/train", cfg["vocoder"]["learning_rate"]
    changed = dict(cfg, vocoder={**cfg["vocoder"], "learning_rate": 2 * lr})
    assert inputs.notes(cfg) == [] and inputs.notes(dict(cfg, vocoder={**cfg["vocoder"], "finetune_steps": 5})) == []
    mixed = dict(cfg, vocoder={**cfg["vocoder"], "finetune_recorded": 0.9})
    assert inputs.notes(mixed) == [] and inputs.settings(mixed) == inputs.settings(cfg)  # not the first phase's
    assert inputs.settings(mixed, "finetune")["vocoder"]["finetune_recorded"] == 0.9
    gta_only = dict(cfg, vocoder={**cfg["vocoder"], "finetune_recorded": 0})  # as before the key: old checkpoints resume
    assert "finetune_recorded" not in inputs.settings(gta_only, "finetune")["vocoder"]
    # the note names the value fine-tuning trained at, which settings() leaves out (it said None)
    assert inputs.changes(inputs.settings(gta_only, "finetune"), inputs.settings(mixed, "finetune")) == [
        "vocoder.finetune_recorded 0 -> 0.9"]
    shared = dict(cfg, vocoder={**cfg["vocoder"], "finetune_share": 0.25})  # applied after training: both phases resume
    assert all(inputs.settings(shared, p) == inputs.settings(cfg, p) for p in inputs.PHASES)
    note = (f"note: vocoder.learning_rate {lr!r} -> {2 * lr!r} since the vocoder's train phase was trained: its job "
            f"sets {folder / 'checkpoints'} aside and trains that phase from its start")
    assert inputs.notes(changed) == [note]
    (tmp_path / "lr.yaml").write_text(path.read_text().replace(f"learning_rate: {lr}", f"learning_rate: {2 * lr}"))
    dry = snakemake("vocoder", "-n", config=tmp_path / "lr.yaml")                 # the dry run says so
    assert note in dry.stdout + dry.stderr, dry.stderr[-3000:]
    weights = _weights(folder / "checkpoints/ckpt-0")
    logged = []
    inputs.switch(folder, inputs.settings(changed), logged.append)            # what the train job does first
    assert not (folder / "checkpoints").exists() and len(logged) == 1 and "set aside in" in logged[0]
    shutil.copytree(folder / "set_aside" / os.listdir(folder / "set_aside")[0] / "checkpoints",
                    folder / "checkpoints")                                   # as if trained anew with it
    assert inputs.notes(cfg)[0].endswith("(a set made with these settings is kept aside: it resumes from that)")
    inputs.switch(folder, inputs.settings(cfg), logged.append)                # the old setting back: resumed
    assert "resuming from the checkpoints set aside" in logged[-1] and inputs.notes(cfg) == []
    kept = _weights(folder / "checkpoints/ckpt-0")
    assert kept.keys() == weights.keys() and len(kept) > 10
    assert all(np.array_equal(kept[k], weights[k]) for k in kept)


def test_checkpoints_whose_inputs_json_is_gone_are_set_aside_not_resumed_whatever_the_settings(built_cache, tmp_path):
    """vocoder/{phase}/inputs.json deleted (or damaged) under checkpoints, then a setting changed: nothing
    says what they were trained with, so planning says so and the job sets them aside with a reason.txt in
    set_aside/unrecorded-<time>/ (never pruned, weights untouched) and trains from the start. Before, the
    job resumed them silently under the new settings' name."""
    path = run_config(built_cache, tmp_path, vocoder={**VOCOS, "steps": 2, "checkpoint_every": 2, "log_every": 2})
    cfg = config.load_config(path)
    folder, out = config.run_dir(cfg) / "vocoder/train", config.run_dir(cfg) / "vocoder/train.json"
    train.train_vocoder(cfg, "train", out, log=lambda *a: None)
    weights = _weights(folder / "checkpoints/ckpt-2")
    inputs.path(folder).unlink()
    changed = dict(cfg, vocoder={**cfg["vocoder"], "learning_rate": 2 * cfg["vocoder"]["learning_rate"]})
    [note] = inputs.notes(changed)
    assert note.startswith(f"note: {inputs.path(folder)} is missing, so nothing says what {folder / 'checkpoints'} "
                           "were trained with: the vocoder's train job sets them aside in "), note
    logged = []
    summary = train.train_vocoder(changed, "train", out, log=logged.append)
    assert summary["resumed_from"] == 0 and not any("resumed from" in line for line in logged), logged
    [aside] = (folder / "set_aside").glob(inputs.UNRECORDED + "*")
    assert any(line.endswith("training this phase from its start") and str(aside) in line for line in logged)
    assert (aside / "reason.txt").read_text().startswith(f"{inputs.path(folder)} is missing: nothing says")
    kept = _weights(aside / "checkpoints/ckpt-2")
    assert kept.keys() == weights.keys() and all(np.array_equal(kept[k], weights[k]) for k in kept)
    assert inputs.read(folder) == inputs.settings(changed) and inputs.notes(changed) == []
    inputs.path(folder).write_text("{")                                       # damaged: the same, with it kept
    assert "inputs.json is unreadable, so nothing says" in inputs.notes(changed)[0]
    inputs.switch(folder, inputs.settings(changed), logged.append)
    assert not (folder / "checkpoints").exists() and "inputs.json is unreadable" in logged[-1]
    for rate in (1e-4, 2e-4, 3e-4):                                           # three more sets: only KEEP stay
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints/checkpoint").write_text("stands in for the weights")
        inputs.switch(folder, inputs.settings(dict(cfg, vocoder={**cfg["vocoder"], "learning_rate": rate})), logged.append)
    names = [p.name for p in (folder / "set_aside").iterdir()]
    assert len(names) == 2 + inputs.KEEP and sum(n.startswith(inputs.UNRECORDED) for n in names) == 2, names


def test_shipping_a_blend_whose_first_phase_checkpoint_is_gone_is_one_line_naming_it(tiny, tmp_path):
    """vocoder.finetune_share < 1 reads the first phase's weights that fine-tuning started from: gone
    (deleted by hand), the fine-tuning job stops with one line naming it and the two ways out."""
    from pipeline.errors import MissingCheckpoint
    _, cfg, _ = tiny
    cfg = dict(cfg, vocoder={**cfg["vocoder"], "finetune_share": 0.5})
    trainer = train.VocoderTrainer(cfg, "finetune", log=lambda *a: None)
    folder, gone = tmp_path / "finetune", str(tmp_path / "train/checkpoints/ckpt-7")
    inputs.switch(folder, {**inputs.settings(cfg, "finetune"), "from": gone}, log=lambda *a: None)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(generator=trainer.generator), folder / "checkpoints", 1)
    manager.save(checkpoint_number=0)
    with pytest.raises(MissingCheckpoint) as stop:
        train._shipped(cfg, trainer, folder, manager, log=lambda *a: None)
    message = str(stop.value)
    assert "\n" not in message and message.startswith(gone) and "finetune_share: 1" in message
    assert not (folder / "shipped").exists()


SOURCE_FILTER = {**TINY_VOCODER, "kind": "source_filter", "steps": 0, "finetune_steps": 0,
                 "source_filter": {"dim": 16, "intermediate_dim": 32, "layers": 1, "kernel": 7, "f0_head_dim": 16,
                                   "f0_weight": 1.0}}


@pytest.mark.parametrize("n_fft, hop", [(1024, 256), (1024, 128), (512, 128), (1024, 300), (4096, 64)])
def test_min_frames_is_the_fewest_a_source_filter_model_takes(n_fft, hop):
    # its source's STFT reflect-pads the audio by (n_fft - hop) / 2 on the right: fewer frames fail in the graph;
    # kinds.build creates the variables on as many (32 at n_fft 4096, hop 64: more than the 8 it used to)
    audio = {**config.load_config(ROOT / "configs/config.yaml", check_paths=False)["audio"],
             "n_fft": n_fft, "win_length": n_fft, "hop_length": hop}
    fewest = kinds.min_frames("source_filter", audio)
    model = kinds.build({**SOURCE_FILTER, "kind": "source_filter"}, audio)
    assert model(tf.fill([1, fewest, audio["n_mels"]], -5.0), training=False).shape == (1, fewest * hop)
    with pytest.raises(tf.errors.InvalidArgumentError):
        model(tf.fill([1, fewest - 1, audio["n_mels"]], -5.0), training=False)
    assert kinds.min_frames("vocos", audio) == kinds.min_frames("griffin_lim", audio) == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_f0_is_refused_not_vocoded_into_nan_audio(bad):
    # one NaN or infinite F0 made thousands of NaN samples around its frame, silently
    audio = config.load_config(ROOT / "configs/config.yaml", check_paths=False)["audio"]
    voc = kinds.Vocoder({"audio": audio, "vocoder": SOURCE_FILTER}, kinds.build(SOURCE_FILTER, audio))
    mel, f0 = np.full((20, audio["n_mels"]), -4.0, np.float32), np.full(20, 150.0, np.float32)
    assert np.all(np.isfinite(voc(mel, f0=f0)))
    f0[5] = bad
    with pytest.raises(ValueError, match=r"^f0 holds NaN or infinite values \(frame 5\): F0 in Hz, 0 where unvoiced$"):
        voc(mel, f0=f0)


def test_a_mel_shorter_than_the_source_filter_vocoder_takes_gets_silence_after_it(built_cache, tmp_path, capsys):
    # 2 frames at n_fft 1024, hop 256: one frame is vocoded with a silent frame after it, as the exported
    # voice does, and keeps its own 256 samples
    path = run_config(built_cache, tmp_path, vocoder=SOURCE_FILTER)
    cfg = config.load_config(path)
    train.train_vocoder(cfg, "train", config.run_dir(cfg) / "vocoder" / "train.json", final=True, log=lambda *a: None)
    mel = np.full((2, cfg["audio"]["n_mels"]), np.log(LOG_CLAMP), np.float32)
    mel[0] = np.linspace(-6.0, -2.0, cfg["audio"]["n_mels"])
    np.save(tmp_path / "one.npy", mel[:1])
    np.save(tmp_path / "two.npy", mel)
    for name in ("one", "two"):
        code, err = _vocode(capsys, "--config", path, "--mel", tmp_path / f"{name}.npy", "--out", tmp_path / f"{name}.wav")
        assert code == 0 and err == [], err
    one, two = (sf.read(str(tmp_path / f"{name}.wav"), dtype="int16")[0] for name in ("one", "two"))
    assert len(one) == 256 and len(two) == 512 and np.abs(one).max() > 0
    np.testing.assert_array_equal(one, two[:256])
    assert len(kinds.load(cfg)(mel[:0])) == 0                               # no frames: no audio, no error


def test_the_source_filter_vocoder_bounds_what_it_takes_whole(built_cache, tmp_path, capsys):
    # its harmonics run in phase from the first frame, so it is not chunked: a mel past WHOLE_MAX_FRAMES
    # would need tens of GB, refused from its header; an F0 above Nyquist is no F0 it can sound
    path = run_config(built_cache, tmp_path, vocoder=SOURCE_FILTER)
    cfg = config.load_config(path)
    train.train_vocoder(cfg, "train", config.run_dir(cfg) / "vocoder" / "train.json", final=True, log=lambda *a: None)
    huge = tmp_path / "huge.npy"
    np.lib.format.open_memmap(huge, mode="w+", dtype=np.float32,
                              shape=(vocode.WHOLE_MAX_FRAMES + 1, cfg["audio"]["n_mels"])).flush()
    _one_line(*_vocode(capsys, "--config", path, "--mel", huge, "--out", tmp_path / "x.wav"),
              f"{huge}: 20,001 frames, more than this vocoder takes (20,000, ")
    np.save(tmp_path / "mel.npy", np.full((4, cfg["audio"]["n_mels"]), -5.0, np.float32))
    # above Nyquist; above audio.fmax (no harmonic left to sound); a log-F0 (ln 120 = 4.8 "Hz": a 5 Hz buzz)
    # (a tiny positive value, 0.01, read as "0.0..", which looks unvoiced)
    for f0, shown in (([0.0, 120.0, 11025.5, 0.0], "120..11025.5"), ([0.0, 120.0, 9000.0, 0.0], "120..9000"),
                      ([0.0, 4.79, 4.8, 0.0], "4.79..4.8"), ([-1.0, 120.0, 120.0, 0.0], "-1..120"),
                      ([0.0, 0.01, 120.0, 0.0], "0.01..120")):
        np.save(tmp_path / "f0.npy", np.array(f0, np.float32))
        _one_line(*_vocode(capsys, "--config", path, "--mel", tmp_path / "mel.npy", "--f0", tmp_path / "f0.npy",
                           "--out", tmp_path / "x.wav"), f"{tmp_path / 'f0.npy'}: values {shown} are not F0 in Hz (",
                  "20 Hz up to below 8000 Hz, the vocoder's audio.fmax and half its rate)")
    np.save(tmp_path / "f0.npy", np.array([0.0, 120.0, 130.0, 0.0], np.complex64))   # complex: not a warning
    _one_line(*_vocode(capsys, "--config", path, "--mel", tmp_path / "mel.npy", "--f0", tmp_path / "f0.npy",
                       "--out", tmp_path / "x.wav"), "a complex64 array of shape (4,), expected F0 in Hz [4]")
    assert not (tmp_path / "x.wav").exists()


def test_a_copied_run_loads_its_own_vocoder_not_the_one_it_was_copied_from(tiny, tmp_path):
    # vocoder.json names its checkpoint by the path the run had when it trained: a copy of the run
    # loaded the original's weights (and, once the original was retrained, other weights than its own)
    _, cfg, _ = tiny
    original = config.run_dir(cfg)
    shutil.copytree(original, tmp_path / "runs" / "copy")
    copied = dict(cfg, runs_dir=str(tmp_path / "runs"), name="copy")
    recorded = json.loads(kinds.summary_path(copied).read_text())["checkpoint"]
    assert recorded.startswith(str(original))                  # as written, in the original run
    voc = kinds.load(copied)
    assert voc.summary["checkpoint"] == str(tmp_path / "runs/copy/vocoder/train/checkpoints/ckpt-0")
    for f in (tmp_path / "runs/copy/vocoder/train/checkpoints").glob("ckpt-0.*"):
        f.unlink()
    with pytest.raises(runinfo.MissingCheckpoint, match="copy/vocoder/train/checkpoints/ckpt-0 is gone"):
        kinds.load(copied)                                     # not the original's, which is still there
    assert os.path.exists(f"{recorded}.index")


def test_a_copied_run_resumes_its_fine_tuning_whose_first_phase_has_the_same_weights(tmp_path):
    # fine-tuning's inputs name the first phase's checkpoint as path@digest: a copy of the run (another
    # path, the same weights) set its fine-tuning aside and trained it again
    cfg = config.load_config(None, {"runs_dir": str(tmp_path / "runs"), "name": "copy"}, check_paths=False)
    folder, logged = tmp_path / "finetune", []
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-100"\n')
    made = {**inputs.settings(cfg, "finetune"), "from": f"runs/demo/vocoder/train/checkpoints/ckpt-1500@{'a' * 16}"}
    (folder / inputs.FILE).write_text(json.dumps(made))
    copied = {**made, "from": f"{tmp_path}/runs/copy/vocoder/train/checkpoints/ckpt-1500@{'a' * 16}"}
    inputs.switch(folder, copied, log=logged.append)
    assert logged == [] and (folder / "checkpoints" / "checkpoint").exists()        # resumed where it was
    assert inputs.read(folder)["from"] == copied["from"]                            # recorded under its own path
    retrained = {**copied, "from": f"{tmp_path}/runs/copy/vocoder/train/checkpoints/ckpt-1500@{'b' * 16}"}
    inputs.switch(folder, retrained, log=logged.append)
    assert len(logged) == 1 and "the first phase's weights" in logged[0]            # other weights: set aside
    assert not (folder / "checkpoints").exists()
    # a damaged record ("from": a number) is another input, set aside, not a TypeError; the set made from
    # `copied` (set aside just above) comes back
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    (folder / inputs.FILE).write_text(json.dumps({**made, "from": 5}))
    inputs.switch(folder, copied, log=logged.append)
    assert len(logged) == 3 and "the first phase's weights" in logged[1] and "resuming" in logged[2]
    assert "ckpt-100" in (folder / "checkpoints" / "checkpoint").read_text()


def test_going_back_to_settings_older_than_the_kept_sets_restores_them_not_prunes_them(tmp_path):
    # A -> B -> C -> A: A's set is the oldest of three when C's is set aside; pruning to KEEP deleted it
    # just before it would have come back, and the phase trained anew from step 0
    cfg = config.load_config(None, {"runs_dir": str(tmp_path / "runs"), "name": "t"}, check_paths=False)
    folder, logged = tmp_path / "train", []
    keys = {rate: inputs.settings(dict(cfg, vocoder={**cfg["vocoder"], "learning_rate": rate})) for rate in (1e-3, 2e-3, 3e-3)}
    for step, rate in enumerate([1e-3, 2e-3, 3e-3, 1e-3], start=1):
        inputs.switch(folder, keys[rate], log=logged.append)
        if rate == 1e-3 and step > 1:
            break
        (folder / "checkpoints").mkdir()
        (folder / "checkpoints" / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')
        time.sleep(0.01)                                                        # sets pruned oldest first
    assert "resuming" in logged[-1], logged
    assert 'ckpt-1"' in (folder / "checkpoints" / "checkpoint").read_text()   # A's own checkpoints, back
    assert len(list((folder / "set_aside").iterdir())) == inputs.KEEP           # B's and C's


@pytest.mark.parametrize("named", ["today", "by its full inputs"])
def test_a_copied_run_restores_a_fine_tuning_set_its_original_set_aside(tmp_path, named):
    # sets were named by a digest of their inputs with the first phase's path in it: a run copied after its
    # fine-tuning was set aside (say, for a change of finetune_recorded) trained it again when the change
    # was undone, though the set was right there; sets named that way before still come back
    cfg = config.load_config(None, {"runs_dir": str(tmp_path / "runs"), "name": "copy"}, check_paths=False)
    folder, logged = tmp_path / "finetune", []
    made = {**inputs.settings(cfg, "finetune"), "from": f"runs/demo/vocoder/train/checkpoints/ckpt-1500@{'a' * 16}"}
    name = inputs._digest(made) if named == "today" else \
        hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:12]
    aside = folder / "set_aside" / name
    (aside / "checkpoints").mkdir(parents=True)
    (aside / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-100"\n')
    (aside / inputs.FILE).write_text(json.dumps(made))
    other = {**made, "vocoder": {**made["vocoder"], "learning_rate": 0.5}}
    (folder / inputs.FILE).write_text(json.dumps(other))                           # what the copy last trained
    copied = {**made, "from": f"{tmp_path}/runs/copy/vocoder/train/checkpoints/ckpt-1500@{'a' * 16}"}
    inputs.switch(folder, copied, log=logged.append)
    assert logged and "resuming" in logged[-1]
    assert "ckpt-100" in (folder / "checkpoints" / "checkpoint").read_text() and not aside.exists()
    assert inputs.read(folder)["from"] == copied["from"]


def test_an_old_summary_finds_its_gta_checkpoint_in_shard_order_past_leftovers(tmp_path):
    # a summary from before `gta_from`: the GTA shards that fine-tuning recorded, in shard order, name the
    # acoustic checkpoint; a leftover of a larger cache.shards (or shard-1000 sorting before shard-200 by
    # name) made the note say "fine-tuned on other mels" of a vocoder that was not
    cfg = config.load_config(None, {"runs_dir": str(tmp_path / "runs"), "name": "t"}, check_paths=False)
    run = config.run_dir(cfg)
    (run / "gta").mkdir(parents=True)
    sums = [f"{i:016x}" for i in range(12)]
    for i in (*range(11), 1000):                                                  # 1000: a leftover
        (run / "gta" / f"shard-{i:03d}.json").write_text(json.dumps({"checksum": sums[min(i, 11)],
                                                                     "checkpoint": str(run / "checkpoints/ckpt-10")}))
    (run / "vocoder" / "finetune").mkdir(parents=True)
    (run / "vocoder" / "finetune" / inputs.FILE).write_text(json.dumps({**inputs.settings(cfg, "finetune"),
                                                                        "gta": sums[:11]}))
    (run / "checkpoints").mkdir()
    for step in (10, 20):
        (run / "checkpoints" / f"ckpt-{step}.index").write_bytes(bytes([step]))   # only its digest is read
    summary = {"phase": "finetune"}
    assert inputs.finetuned_elsewhere(cfg, summary, str(run / "checkpoints/ckpt-10")) is None
    assert "ckpt-10, not of " in inputs.finetuned_elsewhere(cfg, summary, str(run / "checkpoints/ckpt-20"))


def test_a_job_killed_while_a_set_aside_set_moves_back_files_no_set_under_another_key(tmp_path, monkeypatch):
    # a kill right after the set of inputs A moved back, before A was recorded, left inputs.json saying B
    # over A's checkpoints: the next job filed them as B's, replacing B's real set, and resumed B from A's
    folder = tmp_path / "train"
    a, b = {"vocoder": {"learning_rate": 0.001}, "audio": {}}, {"vocoder": {"learning_rate": 0.002}, "audio": {}}

    def train_with(key):  # what a phase's job does: switch, then (if nothing came back) train and save
        inputs.switch(folder, key, log=lambda *args: None)
        if not (folder / "checkpoints").exists():
            (folder / "checkpoints").mkdir(parents=True)
            (folder / "checkpoints" / "checkpoint").write_text(json.dumps(key))   # stands in for the weights

    train_with(a)
    train_with(b)

    rmtree = shutil.rmtree

    def killed(where, *args, **kwargs):  # the first step after A's set moved back
        if os.path.basename(where) == inputs._digest(a):
            raise KeyboardInterrupt
        rmtree(where, *args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(inputs.shutil, "rmtree", killed)
        with pytest.raises(KeyboardInterrupt):
            inputs.switch(folder, a, log=lambda *args: None)                      # killed after the move
    for key in (a, b, a):
        train_with(key)
        assert json.loads((folder / "checkpoints" / "checkpoint").read_text()) == key
        assert inputs.read(folder) == key


def test_a_pitch_change_restarts_a_vocoder_that_trains_on_f0_and_not_one_recorded_before(tmp_path):
    # the source-filter vocoder trains on the pitch cache's F0, but its phases' key held vocoder: and
    # audio: alone: a new pitch.method reran the job, which resumed at its last step on the old F0
    cfg = config.load_config(overrides={"runs_dir": str(tmp_path), "vocoder": {"kind": "source_filter"}},
                             check_paths=False)
    assert "pitch" in inputs.settings(cfg, uses_f0=True) and "pitch" in inputs.settings(cfg, "finetune", uses_f0=True)
    assert "pitch" not in inputs.settings(cfg)  # a kind without F0: no key
    assert kinds.uses_f0(cfg["vocoder"]) and not kinds.uses_f0({**cfg["vocoder"], "kind": "vocos"})
    folder = config.run_dir(cfg) / "vocoder" / "train"
    logged = []
    inputs.switch(folder, inputs.settings(cfg, uses_f0=True), logged.append)  # the phase trains at praat
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')
    other = dict(cfg, pitch={**cfg["pitch"], "method": "dio"})
    [note] = inputs.notes(other, uses_f0=True)
    assert note.startswith("note: pitch.method 'praat' -> 'dio' since the vocoder's train phase was trained: its job "
                           "sets"), note
    inputs.switch(folder, inputs.settings(other, uses_f0=True), logged.append)
    assert not (folder / "checkpoints").exists() and "pitch.method 'praat' -> 'dio'" in logged[-1]
    # inputs recorded before they held pitch: resumed as before (nothing says which F0 trained them),
    # and recorded with it from then on
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')
    older = {k: v for k, v in inputs.settings(cfg, uses_f0=True).items() if k != "pitch"}
    inputs.path(folder).write_text(json.dumps(older))
    assert inputs.notes(other, uses_f0=True) == []
    logged.clear()
    inputs.switch(folder, inputs.settings(other, uses_f0=True), logged.append)
    assert logged == [] and (folder / "checkpoints" / "checkpoint").exists()
    assert inputs.read(folder)["pitch"]["method"] == "dio"
    # a set put aside when inputs held no pitch comes back for its settings, named as it was
    without = {k: v for k, v in inputs.settings(other, uses_f0=True).items() if k != "pitch"}
    inputs.path(folder).write_text(json.dumps(without))
    faster = dict(other, vocoder={**other["vocoder"], "learning_rate": 2 * other["vocoder"]["learning_rate"]})
    inputs.switch(folder, inputs.settings(faster, uses_f0=True), logged.append)   # the old set goes aside
    assert not (folder / "checkpoints").exists()
    (folder / "checkpoints").mkdir()                                 # trained anew at the faster rate
    (folder / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    assert inputs.notes(other, uses_f0=True)[0].endswith(
        "(a set made with these settings is kept aside: it resumes from that)")
    inputs.switch(folder, inputs.settings(other, uses_f0=True), logged.append)    # and comes back
    assert "resuming from the checkpoints set aside" in logged[-1] and (folder / "checkpoints" / "checkpoint").exists()
    # a kind without F0 names no pitch among what changed
    vocos = dict(other, vocoder={**other["vocoder"], "kind": "vocos"})
    changed = inputs.changes(inputs.read(folder), inputs.settings(vocos, uses_f0=False))
    assert changed and not any(line.startswith("pitch.") for line in changed)


def test_a_changed_fine_tuning_setting_is_announced_at_planning_for_that_phase(tmp_path):
    # fine-tuning's checkpoints are set aside by its job when a setting it trained with changes: planning
    # (`snakemake -n vocoder`) says so for that phase too, not only for the first; with finetune_steps 0
    # there is no fine-tuning job to announce
    cfg = config.load_config(None, {"runs_dir": str(tmp_path / "runs"), "name": "t",
                                    "vocoder": {"kind": "vocos", "finetune_steps": 4}}, check_paths=False)
    folder = config.run_dir(cfg) / "vocoder" / "finetune"
    inputs.switch(folder, inputs.settings(cfg, "finetune"), log=lambda *a: None)
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    assert inputs.notes(cfg) == []
    mixed = dict(cfg, vocoder={**cfg["vocoder"], "finetune_recorded": 0.5})
    [note] = inputs.notes(mixed)
    assert note == (f"note: vocoder.finetune_recorded 0 -> 0.5 since the vocoder's finetune phase was trained: its job "
                    f"sets {folder / 'checkpoints'} aside and trains that phase from its start")
    assert inputs.notes(dict(mixed, vocoder={**mixed["vocoder"], "finetune_steps": 0})) == []


@pytest.mark.parametrize("frames, chunk, context", [(10, 4, 3), (10, 4, 0), (9, 3, 20), (4, 4, 2), (5, 4, None)])
def test_each_chunk_runs_with_its_context_each_side_and_keeps_its_own_frames_audio(frames, chunk, context):
    # run(a, b) stands in for the vocoder: the audio of frames [a, b), each sample its own index, so a
    # sample from the wrong place, a missing context or a chunk trimmed short shows in the output
    hop, calls = 3, []

    def run(a, b):
        calls.append((a, b))
        return np.arange(a * hop, b * hop, dtype=np.float32)
    out = kinds.chunked(run, frames, hop, context, chunk)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.arange(frames * hop))
    if context is None or frames <= chunk:
        assert calls == [(0, frames)]                                          # one call, whole
    else:
        assert calls == [(max(0, start - context), min(frames, start + chunk + context))
                         for start in range(0, frames, chunk)]


@pytest.mark.parametrize("summary, checkpoint, moved", [
    ("runs/b/vocoder.json", "runs/a/vocoder/train/checkpoints/ckpt-5", "runs/b/vocoder/train/checkpoints/ckpt-5"),
    ("runs/b/vocoder.json", "runs/a/vocoder/finetune/shipped/ckpt-9", "runs/b/vocoder/finetune/shipped/ckpt-9"),
    ("runs/b/vocoder/finetune.json", "runs/a/vocoder/finetune/checkpoints/ckpt-9",
     "runs/b/vocoder/finetune/checkpoints/ckpt-9"),
    ("kept/elsewhere.json", "runs/a/vocoder/train/checkpoints/ckpt-5", None),      # not in a run: as recorded
    ("runs/b/vocoder.json", "models/ckpt-5", None),                                 # not a layout written here
])
def test_a_summary_names_the_checkpoint_in_the_run_folder_it_sits_in(tmp_path, summary, checkpoint, moved):
    # a copied run's summaries (vocoder.json, and each phase's vocoder/{phase}.json) name the first run's
    # checkpoints, the shipped blend's too: each is read in the copy's own folder
    path = tmp_path / summary
    path.parent.mkdir(parents=True)
    recorded = str(tmp_path / checkpoint)
    path.write_text(json.dumps({"kind": "vocos", "checkpoint": recorded, "trained_checkpoint": recorded}))
    info = kinds.read_summary(path)
    expected = recorded if moved is None else str(tmp_path / moved)
    assert info["checkpoint"] == info["trained_checkpoint"] == expected


def test_an_older_summary_builds_the_vocoder_its_phase_recorded_not_the_configs_sizes(tiny, tmp_path):
    # a summary from before summaries recorded the settings: its phase's inputs.json says what the network
    # was; a config of other sizes builds the vocoder trained, with one note, not a mismatch error
    _, cfg, mel = tiny
    run = config.run_dir(cfg)
    old = {k: v for k, v in json.loads((run / "vocoder.json").read_text()).items() if k not in ("audio", "vocoder")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    wide = dict(cfg, vocoder={**cfg["vocoder"], "vocos": {**cfg["vocoder"]["vocos"], "dim": 32}})
    logged = []
    voc = kinds.load(wide, summary=tmp_path / "old.json", log=logged.append)
    assert voc.cfg["vocoder"]["vocos"] == VOCOS["vocos"]
    assert len(logged) == 1 and "vocoder.vocos.dim 32 (the vocoder's: 16)" in logged[0], logged
    same = kinds.load(cfg, log=lambda *a: None)
    np.testing.assert_array_equal(voc(np.load(mel)), same(np.load(mel)))


def test_a_config_of_another_vocoder_kind_is_told_to_train_it_not_given_the_run_one(tiny):
    # vocoder.kind hifigan over a run whose vocoder.json holds a Vocos: not the Vocos, silently
    _, cfg, _ = tiny
    other = dict(cfg, vocoder={**cfg["vocoder"], "kind": "hifigan"})
    with pytest.raises(runinfo.MissingCheckpoint) as e:
        kinds.load(other, log=lambda *a: None)
    assert str(e.value) == (f"{config.run_dir(cfg) / 'vocoder.json'}: a vocos vocoder, the config says vocoder.kind "
                            "hifigan; run `snakemake --cores all vocoder`")


def test_a_short_mel_keeps_its_given_f0_and_a_wrong_length_f0_is_refused():
    # the silent frame after a mel shorter than source_filter takes is unvoiced; the mel's own frame keeps
    # the F0 it was given (not the F0 head's estimate)
    cfg = config.load_config(None, {"vocoder": SOURCE_FILTER}, check_paths=False)
    tf.keras.utils.set_random_seed(0)
    voc = kinds.Vocoder(cfg, kinds.build(cfg["vocoder"], cfg["audio"]))       # untrained: any weights will do
    hop, n_mels = cfg["audio"]["hop_length"], cfg["audio"]["n_mels"]
    assert voc.min_frames == 2
    mel = np.full((2, n_mels), np.log(LOG_CLAMP), np.float32)
    mel[0] = np.linspace(-6.0, -2.0, n_mels)
    one = voc(mel[:1], f0=[150.0])
    assert one.shape == (hop,)
    np.testing.assert_allclose(one, voc(mel, f0=[150.0, 0.0])[:hop], rtol=0, atol=1e-6)
    assert np.abs(one - voc(mel[:1])).max() > 1e-4 * np.abs(one).max()       # the given F0 is heard
    with pytest.raises(ValueError, match=r"f0 has shape \(3,\), the mel 2 frames: one F0 per frame"):
        voc(mel, f0=[150.0, 150.0, 150.0])


def test_read_mel_takes_a_mel_up_to_its_limits_and_refuses_past_them(tmp_path):
    audio = config.load_config(None, check_paths=False)["audio"]
    n_mels, path = audio["n_mels"], tmp_path / "mel.npy"

    def read(mel, **kwargs):
        np.save(path, np.asarray(mel, np.float32))
        return vocode.read_mel(path, audio, **kwargs)
    loud = np.full((5, n_mels), -4.0)                                          # a loud cut-out: no clamp, median -4
    assert read(loud, max_frames=5).shape == (5, n_mels)                        # at the limit: taken
    rng = np.random.default_rng(0)
    normalised = np.clip(rng.normal(0.0, 1.0, (vocode.SCALE_FRAMES, n_mels)), -3.0, 3.0)   # z-scored: median ~0
    assert read(normalised[:-1]).shape == (vocode.SCALE_FRAMES - 1, n_mels)     # too short to judge its scale
    noisy = rng.normal(-5.0, 1.0, (vocode.SCALE_FRAMES, n_mels))              # a noisy recording: nowhere near the clamp
    assert read(noisy).shape == noisy.shape
    high = vocode.MEDIAN_HIGHEST + 0.5 + rng.normal(0.0, 1.0, (vocode.SCALE_FRAMES, n_mels))
    log10 = np.maximum(rng.normal(-4.0, 1.5, (vocode.SCALE_FRAMES, n_mels)), -5.0)   # clamped, but not at log(1e-5)
    for mel, kwargs, said in ((loud, {"max_frames": 4}, "5 frames, more than this vocoder takes (4, "),
                              (loud[:0], {}, "no frames"),
                              (np.where(np.eye(5, n_mels) > 0, np.nan, loud), {}, "holds NaN or infinite values"),
                              (np.linspace(0.0, 80.0, 3 * n_mels).reshape(3, n_mels), {}, "values 0.00..80.00 are not"),
                              (normalised, {}, "is too high for a natural-log mel"),           # judged from 40 frames
                              (high, {}, "is too high for a natural-log mel"),
                              (log10, {}, "of its values sit at -5.00, a clamp")):
        with pytest.raises(vocode.MelError) as e:
            read(mel, **kwargs)
        assert str(e.value).startswith(f"{path}: ") and said in str(e.value), (said, str(e.value))


def test_read_f0_takes_f0_from_its_lowest_to_below_the_top_one_value_a_frame(tmp_path):
    audio = config.load_config(None, check_paths=False)["audio"]
    top, path = min(audio["sample_rate"] / 2, audio["fmax"]), tmp_path / "f0.npy"
    inside = np.array([0.0, vocode.F0_LOWEST, np.nextafter(np.float32(top), np.float32(0)), 0.0], np.float32)
    np.save(path, inside)
    np.testing.assert_array_equal(vocode.read_f0(path, 4, audio), inside)
    for f0, said in (([0.0, vocode.F0_LOWEST, top, 0.0], "are not F0 in Hz"),            # "up to below" the top
                     ([0.0, np.nextafter(np.float32(vocode.F0_LOWEST), np.float32(0)), 120.0, 0.0], "are not F0 in Hz"),
                     ([0.0, 120.0, 130.0], "expected F0 in Hz [4] (one value per mel frame")):
        np.save(path, np.array(f0, np.float32))
        with pytest.raises(vocode.MelError) as e:
            vocode.read_f0(path, 4, audio)
        assert said in str(e.value), (said, str(e.value))


def test_values_beyond_float32_and_a_negative_shape_are_one_line(tmp_path):
    # 1e300 (float64) was cast to inf and called "NaN or infinite" beside NumPy's overflow warning; a
    # header with a negative shape was an OverflowError traceback
    import warnings
    audio = config.load_config(None, check_paths=False)["audio"]
    path = tmp_path / "x.npy"
    mel = np.full((5, audio["n_mels"]), -4.0)
    mel[2, 3] = 1e300
    np.save(path, mel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no RuntimeWarning either
        with pytest.raises(vocode.MelError, match=r"x\.npy: values up to 1e\+300, beyond float32's range"):
            vocode.read_mel(path, audio)
        np.save(path, np.array([0.0, 120.0, -1e300, 0.0, 0.0]))
        with pytest.raises(vocode.MelError, match=r"x\.npy: values up to 1e\+300, beyond float32's range"):
            vocode.read_f0(path, 5, audio)
    np.save(path, np.zeros((2, audio["n_mels"]), np.float32))
    raw = path.read_bytes()
    path.write_bytes(raw.replace(f"(2, {audio['n_mels']})".encode(), f"(-1, {audio['n_mels']})".encode()))
    with pytest.raises(vocode.MelError, match=r"x\.npy: not a \.npy array \("):
        vocode.read_mel(path, audio)


def test_griffin_lim_vocodes_in_a_run_that_trained_no_vocoder(tmp_path):
    # Griffin-Lim needs no training: no runs/{name}/vocoder.json, and the config's audio: settings
    cfg = config.load_config(None, {"runs_dir": str(tmp_path / "runs"), "vocoder": {"kind": "griffin_lim"},
                                    "synthesize": {"griffin_lim_iters": 2}}, check_paths=False)
    assert not kinds.summary_path(cfg).exists()
    np.save(tmp_path / "mel.npy", np.full((4, cfg["audio"]["n_mels"]), -4.0, np.float32))
    audio = vocode.vocode(cfg, tmp_path / "mel.npy", tmp_path / "gl.wav")
    written, sr = sf.read(tmp_path / "gl.wav", dtype="float32")
    assert audio.shape == written.shape == (4 * cfg["audio"]["hop_length"],) and sr == cfg["audio"]["sample_rate"]


def test_the_vocoder_loads_in_float32_whatever_precision_a_trainer_in_the_process_set(tiny):
    _, cfg, mel = tiny
    want = kinds.load(cfg, log=lambda *a: None)(np.load(mel))
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")               # what a bfloat16 trainer leaves
    try:
        got = kinds.load(cfg, log=lambda *a: None)(np.load(mel))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_vocos_audio_is_the_istft_of_the_mels_pseudo_inverse_corrected_and_clipped_at_the_heads_phase():
    """Vocos's head predicts a log-magnitude correction to the mel's pseudo-inverse and a phase: the
    magnitude exp(min(log(max(pinv(exp mel), clamp)) + correction, log 100)) at (cos, sin) of the phase."""
    from pipeline import dft
    from pipeline.audio import mel_basis
    # a window shorter than n_fft, centred in it: the inverse STFT is the mel's own grid
    cfg = config.load_config(None, {"vocoder": VOCOS, "audio": {"win_length": 768}}, check_paths=False)
    a = cfg["audio"]
    model = kinds.build(cfg["vocoder"], a)
    mel = np.random.default_rng(2).uniform(-14.0, 6.0, (1, 12, a["n_mels"])).astype(np.float32)  # silence to loud
    model(mel)
    bins, correction, phase = a["n_fft"] // 2 + 1, 0.4, 0.7
    model.head.kernel.assign(tf.zeros_like(model.head.kernel))               # the head says the same everywhere
    model.head.bias.assign(np.r_[np.full(bins, correction), np.full(bins, phase)].astype(np.float32))
    basis = mel_basis(sample_rate=a["sample_rate"], n_fft=a["n_fft"], n_mels=a["n_mels"], fmin=a["fmin"], fmax=a["fmax"])
    prior = np.exp(mel.astype(np.float64)) @ np.linalg.pinv(basis.astype(np.float64)).T   # (1, F, K)
    log_magnitude = np.log(np.maximum(prior, LOG_CLAMP)) + correction
    assert (prior < LOG_CLAMP).any() and (log_magnitude > np.log(100.0)).any()  # both limits are reached
    magnitude = np.exp(np.minimum(log_magnitude, np.log(100.0))).astype(np.float32)
    _, istft = dft.transforms(n_fft=a["n_fft"], hop_length=a["hop_length"], win_length=a["win_length"])
    want = istft(tf.constant(magnitude * np.cos(phase), tf.float32), tf.constant(magnitude * np.sin(phase), tf.float32))
    want = want.numpy()
    assert want.shape == (1, 12 * a["hop_length"])
    np.testing.assert_allclose(model(mel).numpy(), want, rtol=0, atol=1e-4 * np.abs(want).max())
    h = tf.constant(np.random.default_rng(5).normal(size=(1, 12, VOCOS["vocos"]["dim"])), tf.float32)
    model.block0.gamma.assign(tf.zeros_like(model.block0.gamma))              # layer scale 0: the residual alone
    np.testing.assert_array_equal(model.block0(h).numpy(), h.numpy())




def test_every_weight_of_vocos_gets_a_gradient():
    """No layer is built and then left out of the forward pass: each weight of Vocos (the embedding, two
    ConvNeXt blocks, the norms, the head) moves the audio."""
    cfg = config.load_config(None, {"vocoder": VOCOS}, check_paths=False)
    rng = np.random.default_rng(3)
    model = kinds.build(cfg["vocoder"], cfg["audio"])
    with tf.GradientTape() as tape:
        audio = model(tf.constant(rng.normal(-5.0, 2.0, (1, 10, cfg["audio"]["n_mels"])), tf.float32))
        loss = tf.reduce_sum(audio * tf.constant(rng.normal(size=audio.shape), tf.float32))
    grads = tape.gradient(loss, model.trainable_weights)
    assert [w.path for w, g in zip(model.trainable_weights, grads) if g is None or not np.any(g.numpy())] == []
    # kernel and bias of the embedding, of each LayerNorm and dense layer and the head; the blocks' depthwise
    # conv, two dense layers and layer scale: a layer never called has none
    assert len(model.trainable_weights) == 2 + 2 + VOCOS["vocos"]["layers"] * (2 + 2 + 2 + 2 + 1) + 2 + 2


def test_hifigan_with_silent_residual_branches_is_its_upsampling_chain():
    """HiFi-GAN (Kong et al. 2020): each stage a LeakyReLU(0.1) and a transposed conv (rate u, kernel 2u,
    half the channels: V2 starts at 128), then the mean of its residual blocks; tanh at the end. With
    every residual branch silenced each block is the identity, and the model is that chain. Every hop's
    upsampling plan multiplies to the hop."""
    from pipeline.vocoder import hifigan
    a = config.load_config(None, check_paths=False)["audio"]
    mel = tf.constant(np.random.default_rng(4).normal(-5.0, 2.0, (1, 4, a["n_mels"])), tf.float32)
    model = hifigan.HiFiGAN("v2", 256)
    model(mel)
    for stage in range(4):                                                    # the attributes checkpoints name
        for block, kernel in enumerate((3, 7, 11)):                           # HiFi-GAN V1/V2's resblock 1
            for d, dilation in enumerate((1, 3, 5)):
                res = getattr(model, f"res{stage}_{block}")
                assert (getattr(res, f"c1_{d}").kernel_size, getattr(res, f"c1_{d}").dilation_rate) == (
                    (kernel,), (dilation,))
                for w in getattr(res, f"c2_{d}").weights:
                    w.assign(tf.zeros_like(w))
    x = model.pre(mel)
    for i, u in enumerate((8, 8, 2, 2)):                                      # HiFi-GAN's rates for hop 256
        up = getattr(model, f"up{i}")
        assert (up.filters, up.kernel_size, up.strides) == (128 // 2 ** (i + 1), (2 * u,), (u,)), i
        x = up(tf.nn.leaky_relu(x, 0.1))
    want = tf.tanh(model.post(tf.nn.leaky_relu(x, 0.1)))[..., 0]
    assert want.shape == (1, 4 * 256)
    np.testing.assert_allclose(model(mel).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert all(np.prod(rates) == hop for hop, rates in hifigan.RATES.items())
