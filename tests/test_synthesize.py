"""pipeline.synthesize: what sentences.json records of each sample."""
import json

from conftest import run_config, write_untrained_checkpoint

from pipeline import config


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


def test_snakemake_shows_what_synthesize_says():
    # under Snakemake the job's output went only into synthesize.log: a cut sentence's warning never
    # reached the terminal. The rule tees it, as train's does (bash's pipefail keeps a failure a failure)
    from conftest import ROOT
    rules = (ROOT / "rules" / "train.smk").read_text()
    shell = rules[rules.index("rule synthesize:"):].split("shell:", 1)[1].split("\n\n", 1)[0]
    assert "python -m pipeline.synthesize" in shell and shell.rstrip().rstrip('"').endswith("| tee {log:q}"), shell
