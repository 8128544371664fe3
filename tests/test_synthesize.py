"""pipeline.synthesize: what sentences.json records of each sample."""
import json
import os
import subprocess
import sys

import pytest
from conftest import run_config, write_untrained_checkpoint

from pipeline import config
from pipeline.errors import PipelineError


def test_a_sentence_cut_at_max_seconds_is_recorded_and_said_on_stderr(built_cache, tmp_path, capsys):
    """A sentence cut at synthesize.max_seconds was only logged (under Snakemake, into synthesize.log):
    sentences.json said nothing, so a cut sample looked whole. Now its sample says `"cut": true` and stderr
    says so; a sentence that fits says `"cut": false`."""
    from pipeline import synthesize
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)                     # about 6 frames a token: a long sentence is long
    cfg = config.load_config(path)
    cfg["synthesize"].update(max_seconds=0.6, sentences=["A.", "This sentence is far too long for it."])
    logged = []
    synthesize.synthesize(cfg, tmp_path / "samples", log=logged.append)
    samples = json.loads((tmp_path / "samples" / "sentences.json").read_text())["samples"]
    assert [s["cut"] for s in samples] == [False, True]
    err = [line for line in capsys.readouterr().err.splitlines() if "cut at synthesize.max_seconds" in line]
    assert len(err) == 1 and err[0].startswith("warning: sentence 1 ") and "01.wav" in err[0], err
    assert err[0] in logged                                      # and in the job's log, as before


def test_a_sentence_whose_decoder_never_stopped_is_cut_below_max_frames(built_cache, tmp_path):
    """transformer_tts decodes at most max_positions steps: at a fast pace a sentence that never stopped
    can end below max_frames, and its model says so ("stopped" False): it is cut all the same."""
    from pipeline import synthesize
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    synth = synthesize.load_synthesizer(config.load_config(path), log=lambda *a: None)
    infer = synth.model.infer

    def out_of_steps(*args, **kwargs):
        out = dict(infer(*args, **kwargs))
        assert int(out["lengths"][0]) < kwargs["max_frames"]
        return {**out, "stopped": out["lengths"] < 0}
    whole = synth.infer("A.")
    synth.model.infer = out_of_steps
    assert not whole["cut"] and synth.infer("A.")["cut"]


def test_snakemake_shows_what_synthesize_says():
    # under Snakemake the job's output went only into synthesize.log: a cut sentence's warning never
    # reached the terminal. The rule tees it, as train's does (bash's pipefail keeps a failure a failure)
    from conftest import ROOT
    rules = (ROOT / "rules" / "train.smk").read_text()
    shell = rules[rules.index("rule synthesize:"):].split("shell:", 1)[1].split("\n\n", 1)[0]
    assert "python -m pipeline.synthesize" in shell and shell.rstrip().rstrip('"').endswith("| tee {log:q}"), shell


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_users_files_in_the_out_folder_stay_as_they_were(built_cache, tmp_path, monkeypatch, capsys):
    """`synthesize --out` removed every file named like `\\d+.(wav|npy)` in the folder, a user's own
    (01.wav, 1.npy) with a previous run's. Now it leaves what no earlier sentences.json lists alone, and
    refuses, before the model loads and changing nothing, to write over such a file (or a sentences.json
    it did not write)."""
    import pytest

    from pipeline import synthesize
    from pipeline.errors import PipelineError
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    cfg = config.load_config(path)
    music = tmp_path / "music"
    music.mkdir()
    for name, data in (("01.wav", b"song"), ("02.wav", b"a"), ("1.npy", b"c"), ("notes.txt", b"mine")):
        (music / name).write_bytes(data)
    users = _files(music)
    cfg["synthesize"]["sentences"] = ["A."]
    synthesize.synthesize(cfg, music, log=lambda line: None)
    after = _files(music)
    assert set(after) == set(users) | {"00.wav", "00.npy", "sentences.json"}
    assert {name: after[name] for name in users} == users            # byte for byte

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the folder was checked")
    monkeypatch.setattr(synthesize, "load_synthesizer", no_model)
    cfg["synthesize"]["sentences"] = ["A.", "B.", "C."]               # would write 01.wav and 02.wav
    with pytest.raises(PipelineError, match=r"--out .*music: holds 01\.wav, 02\.wav, which no earlier synthesize"):
        synthesize.synthesize(cfg, music, log=lambda line: None)
    assert _files(music) == after
    with pytest.raises(SystemExit) as stop:                           # the command: the config's two sentences
        synthesize.main(["--config", str(path), "--out", str(music)])
    err = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and err == [f"error: --out {music}: holds 01.wav, which no earlier synthesize wrote "
                                            "there (no sentences.json lists it) and this one would write over; give a "
                                            "new or empty folder, or move it away"], err
    assert _files(music) == after
    (music / "sentences.json").write_text("my own list of songs")
    with pytest.raises(PipelineError, match=r"holds sentences\.json, which is not one synthesize wrote"):
        synthesize.synthesize(cfg, music, log=lambda line: None)


def test_a_rerun_with_fewer_sentences_leaves_no_sample_of_the_previous_run(built_cache, tmp_path):
    """What the previous run wrote and this one does not is removed: the samples its sentences.json
    lists (by index where a sample names no file), and in runs/{name}/samples, whose sentences.json
    `snakemake synthesize` deletes before the job, every NN.wav and NN.npy. The folder's other files stay."""
    from pipeline import synthesize
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    cfg = config.load_config(path)
    quiet = lambda line: None  # noqa: E731

    def samples_in(folder):
        return sorted(p.name for p in folder.iterdir() if p.suffix in (".wav", ".npy"))

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    cfg["synthesize"]["sentences"] = ["A.", "B.", "C."]
    synthesize.synthesize(cfg, mine, log=quiet)
    assert samples_in(mine) == ["00.npy", "00.wav", "01.npy", "01.wav", "02.npy", "02.wav"]
    cfg["synthesize"]["sentences"] = ["A.", "B."]
    synthesize.synthesize(cfg, mine, log=quiet)
    assert samples_in(mine) == ["00.npy", "00.wav", "01.npy", "01.wav"]
    record = json.loads((mine / "sentences.json").read_text())      # a record that names no files
    record["samples"] = [{"text": s["text"]} for s in record["samples"]]
    (mine / "sentences.json").write_text(json.dumps(record))
    cfg["synthesize"]["sentences"] = ["A."]
    synthesize.synthesize(cfg, mine, log=quiet)
    assert samples_in(mine) == ["00.npy", "00.wav"] and (mine / "notes.txt").read_text() == "mine"
    (mine / "sentences.json").write_text(json.dumps({"samples": {str(mine / "00.wav"): "A."}}))  # an older record
    cfg["synthesize"]["sentences"] = ["B."]
    synthesize.synthesize(cfg, mine, log=quiet)
    assert samples_in(mine) == ["00.npy", "00.wav"]

    own = config.run_dir(cfg) / "samples"                          # as `snakemake synthesize` runs it
    cfg["synthesize"]["sentences"] = ["A.", "B."]
    synthesize.synthesize(cfg, own, log=quiet)
    (own / "sentences.json").unlink()                               # Snakemake removes the rule's output
    cfg["synthesize"]["sentences"] = ["A."]
    synthesize.synthesize(cfg, own, log=quiet)
    assert samples_in(own) == ["00.npy", "00.wav"]
    assert [s["wav"] for s in json.loads((own / "sentences.json").read_text())["samples"]] == [str(own / "00.wav")]
    (own / "sentences.json").write_text("written by another version")   # the run's own folder: all of it ours
    synthesize.synthesize(cfg, own, log=quiet)
    assert samples_in(own) == ["00.npy", "00.wav"] and json.loads((own / "sentences.json").read_text())["samples"]


def test_what_a_killed_synthesize_left_under_this_pid_never_reaches_the_out_folder(built_cache, tmp_path):
    """The samples were written into `.{out}.tmp{pid}` and every file there moved into --out. A synthesize
    killed mid-run (SIGKILL, a SLURM limit) leaves that folder; a later one given the same pid (a fresh
    container's) wrote into it and moved the killed run's 05.wav, of other sentences, into --out, listed
    nowhere. Now each run writes into a new folder of its own."""
    from pipeline import files, synthesize
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    cfg = config.load_config(path)
    out = tmp_path / "samples"
    left = files.temporary(out)                                    # the killed run's, this process's pid
    left.mkdir()
    (left / "05.wav").write_bytes(b"a killed run's sample")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed = synthesize.temporary_folder(out).rename(tmp_path / f".samples.tmp{gone.pid}.1-{files.process_tag().split('-', 1)[1]}-x")
    live = synthesize.temporary_folder(out)    # this process's: another synthesize running now
    cfg["synthesize"]["sentences"] = ["A."]
    lines = []
    synthesize.synthesize(cfg, out, log=lines.append)
    assert sorted(p.name for p in out.iterdir()) == ["00.npy", "00.wav", "sentences.json"]
    assert not killed.exists() and live.is_dir() and left.is_dir()
    assert f"removed what a killed synthesize left beside {out}: {killed.name}" in lines


def test_an_empty_out_is_refused_not_read_as_the_runs_own_samples(built_cache, tmp_path, capsys):
    """`--out "$DIR"` with DIR unset gave --out "", read as no --out: the run's own runs/{name}/samples,
    whose samples it replaced. Now an empty (or blank) --out is one line, and nothing there changes."""
    from pipeline import synthesize
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    cfg = config.load_config(path)
    own = config.run_dir(cfg) / "samples"
    cfg["synthesize"]["sentences"] = ["A."]
    synthesize.synthesize(cfg, own, log=lambda line: None)
    before = _files(own)
    for empty in ("", "  "):
        with pytest.raises(SystemExit) as stop:
            synthesize.main(["--config", str(path), "--out", empty])
        assert stop.value.code == 2
        assert capsys.readouterr().err.splitlines() == ["error: --out: an empty path; give the folder to write the samples in"]
    assert _files(own) == before


def test_a_checkpoint_that_speaks_nan_is_one_line_naming_the_sentence_and_checkpoint(built_cache, tmp_path, capsys):
    """A checkpoint with NaN weights stopped at the wav writer, whose line named the temporary file
    (.samples.tmp.../00.wav, gone by then) and neither the sentence nor the checkpoint."""
    import tensorflow as tf

    from pipeline import synthesize
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    cfg = config.load_config(path)
    model = synthesize.load_synthesizer(cfg, log=lambda line: None).model
    model.mel_out.kernel.assign(tf.fill(model.mel_out.kernel.shape, float("nan")))
    ckpt = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), config.run_dir(cfg) / "checkpoints", 2)
    ckpt.save(checkpoint_number=2)
    with pytest.raises(SystemExit) as stop:
        synthesize.main(["--config", str(path), "--out", str(tmp_path / "samples")])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning: ")]
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: synthesize.sentences[0]: the model's mel ({ckpt.latest_checkpoint}) has NaN "
                             "or infinite values; nothing written"), err
    assert not (tmp_path / "samples").exists()


def test_an_out_link_is_written_through_and_a_link_loop_is_refused(built_cache, tmp_path, capsys):
    """--out a link to a folder not made yet: every sentence was synthesized, then making the folder
    failed with a traceback (FileExistsError) and nothing was kept. Now the link is followed, as export
    follows it; a link that leads back to itself is one line before the model loads."""
    from pipeline import synthesize
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "made" / "samples")
    synthesize.main(["--config", str(path), "--out", str(link), "--set", 'synthesize.sentences=["A."]'])
    assert link.is_symlink() and sorted(p.name for p in link.iterdir()) == ["00.npy", "00.wav", "sentences.json"]
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        synthesize.main(["--config", str(path), "--out", str(loop)])
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines() == [
        f"error: --out {loop}: a symbolic link that leads back to itself; give a folder"]


def test_a_record_naming_other_files_never_makes_them_removable(tmp_path):
    # a sentences.json (hand-edited, or another tool's) naming notes.txt must not let a rerun delete it
    from pipeline import synthesize
    cfg = config.load_config(overrides={"runs_dir": str(tmp_path / "runs")}, check_paths=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    (mine / "00.wav").write_bytes(b"")
    (mine / "sentences.json").write_text(json.dumps({"samples": [
        {"wav": str(mine / "notes.txt"), "mel": str(mine / "notes.txt")}, {"wav": str(mine / "00.wav")}]}))
    assert synthesize.previous_samples(cfg, mine) == {"00.wav", "sentences.json"}


def test_a_checkpoint_without_some_of_the_models_weights_is_refused(built_cache, tmp_path):
    # a layer the checkpoint holds no weights for kept its random initial values, silently
    from pipeline import runinfo, synthesize
    from pipeline.errors import MissingCheckpoint
    path = run_config(built_cache, tmp_path, steps=10)
    write_untrained_checkpoint(path, step=1)
    cfg = config.load_config(path)
    run = config.run_dir(cfg)
    info = json.loads(runinfo.path(run).read_text())
    info["config"]["model"]["fastpitch"]["decoder_layers"] += 1
    runinfo.write(run, info)
    with pytest.raises(MissingCheckpoint, match="does not read whole into the run's fastpitch model"):
        synthesize.load_synthesizer(cfg, log=lambda line: None)


def test_a_run_without_a_language_table_speaks_in_the_language_asked():
    # one language: no table to choose from; synthesize.language is the front end's voice
    from pipeline import synthesize
    info = {"vocab": {"language": "en-us"}, "speakers": [], "languages": []}
    assert synthesize.resolve_voice({"speaker": "", "language": "en-gb"}, info) == (0, 0, "en-gb")


def test_without_proc_a_live_writer_is_never_taken_for_a_gone_one(monkeypatch, tmp_path):
    # with no /proc (macOS, a container without it) every writer read as gone: a live run's folder removed
    import builtins

    from pipeline import files
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: (_ for _ in ()).throw(FileNotFoundError(path))
                        if str(path).startswith("/proc/") else real_open(path, *a, **k))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert files._started(os.getpid()) == 0 and files._started(dead.pid) is None
    host = files.host_id()
    live, gone = (tmp_path / f".samples.tmp{os.getppid()}.0-{host}-a1"), (tmp_path / f".samples.tmp{dead.pid}.0-{host}-a2")
    for folder in (live, gone):
        folder.mkdir()
    files.remove_leftover_folders(tmp_path / "samples", "synthesize", lambda line: None)
    assert live.is_dir() and not gone.exists()


def test_a_killed_synthesizes_folder_is_removed_and_a_live_ones_kept(tmp_path):
    """A killed synthesize left its `.samples.tmp...` folder beside --out for good. Now a later run removes
    those whose writer is gone from this host (its pid dead, or taken by a later process) and keeps a live
    run's, another host's and anything not named as its own."""
    from pipeline import files, synthesize
    final = tmp_path / "samples"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ours = synthesize.temporary_folder(final)                 # this process's: a live run's
        tag = files.process_tag()
        pid, host = tag.split("-", 1)[0].split(".")[0], tag.split("-", 1)[1]
        started = files._started(live.pid)
        named = {"killed": f".samples.tmp{dead.pid}.1-{host}-abc_123",
                 "reused": f".samples.tmp{live.pid}.{started + 1}-{host}-x1",   # its pid now another process's
                 "live": f".samples.tmp{live.pid}.{started}-{host}-x2",
                 "elsewhere": f".samples.tmp{dead.pid}.1-otherhost.1-x3",     # another node sharing the folder
                 "other output": f".export.tmp{dead.pid}.1-{host}-x4",
                 "older form": f".samples.tmp{dead.pid}-x5"}
        for name in named.values():
            (tmp_path / name).mkdir()
            (tmp_path / name / "00.wav").write_bytes(b"a sample")
        lines = []
        files.remove_leftover_folders(final, "synthesize", lines.append)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [ours.name] + [named[k] for k in ("live", "elsewhere", "other output", "older form")])  # fresh: kept
        assert lines == [f"removed what a killed synthesize left beside {final}: "
                         f"{named['killed']}, {named['reused']}"]
        assert ours.name.startswith(f".samples.tmp{pid}.") and (ours / "..").resolve() == tmp_path.resolve()
    finally:
        live.kill()
        live.wait()


def test_synthesize_and_export_refuse_an_empty_out_through_one_check(tmp_path, monkeypatch, capsys):
    """Each command had its own two lines for an empty --out; one check (files.check_given) now says it for
    both, each with its own wording of what to give."""
    from pipeline import export, files, synthesize
    asked = []
    check = files.check_given
    monkeypatch.setattr(files, "check_given", lambda *a: asked.append(a) or check(*a))
    with pytest.raises(SystemExit):
        synthesize.main(["--config", str(tmp_path / "none.yaml"), "--out", " "])
    assert capsys.readouterr().err.splitlines() == ["error: --out: an empty path; give the folder to write the samples in"]
    with pytest.raises(PipelineError, match=r"^--out: an empty path; give the export folder to write$"):
        export.check_out("")
    assert asked == [(" ", "--out", "the folder to write the samples in"), ("", "--out", "the export folder to write")]
    check(None, "--out", "anything")   # no --out: the command's default folder


def test_a_killed_writer_not_yet_reaped_is_gone_not_alive(tmp_path):
    """A writer killed but not reaped (a zombie: its parent has not waited for it, or a container's first
    process reaps nothing) still answers os.kill and has a /proc/PID/stat, so it counted as alive and its
    temporary folder stayed. Its state `Z` now reads as gone."""
    import time

    from pipeline import files
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        stat = f"/proc/{zombie.pid}/stat"
        for _ in range(200):   # exited, never waited for
            fields = open(stat, "rb").read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z":
                break
            time.sleep(0.05)
        assert not files.alive(zombie.pid) and files._started(zombie.pid) is None
        folder = tmp_path / f".samples.tmp{zombie.pid}.{int(fields[19])}-{files.host_id()}-z1"  # its own start
        folder.mkdir()
        files.remove_leftover_folders(tmp_path / "samples", "synthesize", lambda line: None)
        assert not folder.exists()
    finally:
        zombie.wait()


def test_an_older_form_synthesize_folder_goes_once_untouched(tmp_path):
    """A killed synthesize of older code left `.samples.tmp{pid}-XXXX` (no start time, no host) beside
    --out, never removed: gigabytes of samples kept for good. Now it goes once nothing in it was written
    for files.LEFTOVER_SECONDS (its pid judges no writer); a fresh one is kept."""
    import time

    from pipeline import files
    old, fresh = tmp_path / ".samples.tmp4242-ab_c1", tmp_path / ".samples.tmp4243-ab_c2"
    for folder in (old, fresh):
        (folder / "00.wav").parent.mkdir()
        (folder / "00.wav").write_bytes(b"a sample")
    stale = time.time() - files.LEFTOVER_SECONDS - 60
    for p in (old, old / "00.wav"):
        os.utime(p, (stale, stale))
    lines = []
    files.remove_leftover_folders(tmp_path / "samples", "synthesize", lines.append)
    assert not old.exists() and fresh.is_dir()
    assert lines == [f"removed what a killed synthesize left beside {tmp_path / 'samples'}: {old.name}"]
