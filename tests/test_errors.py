"""One error path: an expected failure is one line naming the file or key and what to run, exit 2;
a bug keeps its traceback."""
import shutil
import subprocess
import sys

import pytest

from pipeline.errors import PipelineError, cli
from tests.conftest import ROOT


def run_module(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT)


def assert_one_line(proc, *needles):
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("module", ["pipeline.train", "pipeline.diagnose"])
def test_no_cache_is_one_line_naming_the_index_and_the_command(corpus, module):
    _, cfg = corpus
    assert_one_line(run_module(module, "--config", str(cfg)), "index.json", "snakemake --cores all caches")


def test_synthesize_without_checkpoint_is_one_line_before_tensorflow_loads(built_cache):
    # checked before TensorFlow and the model load: a typo costs a fraction of a second, not ~5 s
    probe = ("import runpy, sys\ntry:\n    runpy.run_module('pipeline.synthesize', run_name='__main__')\n"
             "finally:\n    print('tensorflow loaded:', 'tensorflow' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe, "--config", str(built_cache)], capture_output=True, text=True,
                          cwd=ROOT)
    assert_one_line(proc, "no checkpoint", "train")
    assert proc.stdout.strip() == "tensorflow loaded: False"


def test_a_missing_run_names_the_working_folder_its_relative_path_was_read_in(tmp_path):
    # `python -m pipeline.vocode` from a folder that holds no run: runs/ is read there (README), and the
    # error says so, rather than a bare "runs/demo/vocoder.json: no trained vocoder" that reads as if
    # the project's own run were missing
    import os

    import numpy as np

    np.save(tmp_path / "m.npy", np.full((40, 80), -5.0, np.float32))
    proc = subprocess.run([sys.executable, "-m", "pipeline.vocode", "--config", str(ROOT / "configs" / "config.yaml"),
                           "--mel", "m.npy", "--out", "x.wav"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line(proc, f"error: runs/demo/vocoder.json (in the working folder {tmp_path}): no trained vocoder")
    assert not (tmp_path / "x.wav").exists()
    from pipeline.errors import located
    assert located(tmp_path / "runs") == str(tmp_path / "runs")   # an absolute path is enough as it is
    assert located("runs:v2/demo") == f"runs:v2/demo (in the working folder {os.getcwd()})"


def test_config_error_names_the_key(corpus):
    _, cfg = corpus
    assert_one_line(run_module("pipeline.train", "--config", str(cfg), "--set", "train.bogus=1"), "train.bogus")


def test_a_bug_keeps_its_traceback():
    @cli
    def broken(argv=None):
        return {}["missing"]

    with pytest.raises(KeyError):
        broken([])

    @cli
    def expected(argv=None):
        raise PipelineError("cache/x.bin: missing; run `snakemake caches`")

    with pytest.raises(SystemExit) as e:
        expected([])
    assert e.value.code == 2


@pytest.mark.parametrize("reader_gone, status", [(True, 0), (False, 1)])
def test_a_broken_pipe_is_quiet_only_when_standard_output_lost_its_reader(reader_gone, status):
    # `... | head`: the reader has what it wanted (status 0, no traceback); a broken pipe of another (a
    # worker's) while standard output still has its reader is a bug and keeps its traceback
    import os
    code = ("from pipeline.errors import cli\n"
            "def main(argv=None):\n    raise BrokenPipeError(32, 'Broken pipe')\n"
            "cli(main)([])\n")
    read, write = os.pipe()
    if reader_gone:
        os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              timeout=120)
    finally:
        os.close(write)
        if not reader_gone:
            os.close(read)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert ("Traceback" in proc.stderr and "BrokenPipeError" in proc.stderr) == (not reader_gone), proc.stderr[-2000:]


def test_a_full_disk_is_one_line_naming_the_file(capsys):
    # OSError ENOSPC out of any command (a write outside pipeline.files): one line, the file named
    import errno

    @cli
    def main(argv=None):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out.bin")

    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: no space left on device writing /data/out.bin; free space and rerun\n"


def test_out_of_memory_is_one_line_naming_the_sizes_to_lower(capsys):
    # model.fastpitch.ffn_dim: 100000000 planned, then the train job ended in a ResourceExhaustedError traceback
    import numpy as np
    import tensorflow as tf

    for allocate, said in ((lambda: np.zeros(1 << 50), "Unable to allocate 8.00 PiB"),
                           (lambda: tf.zeros([1 << 40]), "OOM when allocating tensor with shape[1099511627776]")):
        with pytest.raises(SystemExit) as e:
            cli(lambda argv=None, allocate=allocate: allocate())([])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and "{{" not in err, err
        assert err.startswith(f"error: out of memory ({said}") and "model.*" in err and "train.batch_size" in err


def test_resuming_with_another_model_is_one_line(tmp_path):
    """A run folder whose checkpoints came from another `model:` is refused before any restore."""
    import json

    import tensorflow as tf

    from pipeline.train import check_same_model

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    tf.train.Checkpoint(v=tf.Variable(1.0)).save(str(run / "checkpoints" / "ckpt"))
    (run / "config.json").write_text(json.dumps({"model": {"kind": "transformer_tts"}}))
    check_same_model({"model": {"kind": "transformer_tts"}}, run)  # the same model resumes
    with pytest.raises(PipelineError, match="another `model:`.*'transformer_tts', now 'fastpitch'"):
        check_same_model({"model": {"kind": "fastpitch"}}, run)


def test_a_model_section_the_run_does_not_use_changes_nothing(tmp_path):
    # editing transformer_tts's keys refused a fastpitch run's resume (and planning let it through, so
    # Snakemake had deleted train.json first); config.json deleted, run.json still says what made it
    import json

    import tensorflow as tf

    from pipeline import config, runinfo
    from pipeline.train import check_same_model

    cfg = config.load_config(check_paths=False)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    tf.train.Checkpoint(v=tf.Variable(1.0)).save(str(run / "checkpoints" / "ckpt"))
    (run / "config.json").write_text(json.dumps(cfg))
    unused = config.merge(cfg, {"model": {"transformer_tts": {"stop_threshold": 0.6}}})
    check_same_model(unused, run)
    wider = config.merge(cfg, {"model": {"fastpitch": {"ffn_dim": 128}}})
    with pytest.raises(PipelineError, match=r"'fastpitch', now 'fastpitch': model\.fastpitch\.ffn_dim changed \(\d+ -> 128\)"):
        check_same_model(wider, run)
    (run / "config.json").unlink()
    runinfo.write(run, {"format": runinfo.FORMAT, "config": {"model": json.loads(json.dumps(cfg["model"]))}, "stats": {}})
    with pytest.raises(PipelineError, match=r"model\.fastpitch\.ffn_dim changed"):
        check_same_model(wider, run)
    assert runinfo.model_changes(cfg["model"], unused["model"]) == []
    with pytest.raises(runinfo.RunChanged, match=r"model\.fastpitch\.ffn_dim changed.* or delete .*run/checkpoints to "
                                                r"train anew$"):  # at planning
        runinfo.check_unchanged(config.merge(wider, {"runs_dir": str(tmp_path), "name": "run"}))
    # the README's way to start over: with the checkpoints deleted, planning lets `train` begin afresh
    shutil.rmtree(run / "checkpoints")
    runinfo.check_unchanged(config.merge(wider, {"runs_dir": str(tmp_path), "name": "run"}))
