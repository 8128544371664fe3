"""pipeline.config: errors that name the key (from load_config and through `snakemake -n caches`),
user configs merged over the defaults, `--config name=...`.

    python -m pytest -q tests/test_config.py
"""
import json
import math
import re
import shlex

import pytest
import yaml
from conftest import ROOT, snakemake, write_config

from pipeline import config
from pipeline.config import ConfigError

DEFAULTS = yaml.safe_load((config.DEFAULTS).read_text())

BAD = {  # name: (overrides merged into the test config, the key the message must name)
    "unknown top-level key": ({"bogus": 1}, "bogus"),
    "unknown nested key": ({"audio": {"n_mel": 80}}, "audio.n_mel"),
    "wrong type": ({"cache": {"shards": "four"}}, "cache.shards"),
    "zero shards": ({"cache": {"shards": 0}}, "cache.shards"),
    "bad enum": ({"dataset": {"bad_audio": "ignore"}}, "dataset.bad_audio"),
    "fmax above nyquist": ({"audio": {"fmax": 12000}}, "audio.fmax"),
    # 4096 decoder steps of r=1 frame: 47.5 s at 22050 Hz and hop 256 (a ValueError traceback after loading)
    "transformer_tts past its positions": ({"model": {"kind": "transformer_tts", "transformer_tts": {"reduction": 1}},
                                            "synthesize": {"max_seconds": 60.0}}, "synthesize.max_seconds"),
    # 8 frames of hop 128: 1024 samples, no frame of the spectral loss's 2048-sample window (a NaN loss)
    "a vocoder crop shorter than its loss's window": ({"audio": {"hop_length": 128}, "vocoder": {"kind": "vocos", "segment_frames": 8}},
                                                     "vocoder.segment_frames"),
    "missing dataset folder": ({"dataset": {"root": "/nonexistent/corpus"}}, "dataset.root"),
    # TensorFlow takes them as int32: 2**32 + 32 Griffin-Lim iterations ran 32, silently
    "iterations past int32": ({"synthesize": {"griffin_lim_iters": 2**32 + 32}}, "synthesize.griffin_lim_iters"),
    "steps past int32": ({"train": {"steps": 2**31}}, "train.steps"),
    # 1e308 s overflowed in the jobs (a traceback; the duration shard job after deleting its shard), and a
    # voice exported with more than 3600 s could not be loaded
    "a token of 1e308 s": ({"aligner": {"max_token_seconds": 1e308}}, "aligner.max_token_seconds"),
    "synthesis past an hour": ({"synthesize": {"max_seconds": 4000.0}}, "synthesize.max_seconds"),
    "a subnormal fmax": ({"audio": {"fmax": 5e-324}}, "audio.fmax"),  # its mel filters' check underflowed
    # the folders the rules' output paths start with: Snakemake would read {x} as a wildcard
    "braces in cache.dir": ({"cache": {"dir": "/tmp/c{x}"}}, "cache.dir"),
    "braces in runs_dir": ({"runs_dir": "/tmp/r{x}"}, "runs_dir"),
    "a brace in reports_dir": ({"reports_dir": "/tmp/p}"}, "reports_dir"),
    # TensorFlow globs for checkpoints in runs_dir: under runs/x[1]/ a trained run started again from step 0
    "glob characters in runs_dir": ({"runs_dir": "/tmp/r[1]"}, "runs_dir"),
    "pitch fmax above nyquist": ({"pitch": {"fmax": 12000.0}}, "pitch.fmax"),
    "diagnosing a vocoder griffin_lim has none of": ({"vocoder": {"kind": "griffin_lim"}, "diagnose": {"target": "vocoder"}},
                                                     "diagnose.target"),
    "missing metadata file": ({"dataset": {"metadata": "no-such-metadata.csv"}}, "dataset.metadata"),
    # every source's folder is checked, not only the first one's
    "a later source folder missing": ({"dataset": {"sources": [{"root": str(ROOT), "format": "ljspeech"},
                                                               {"root": "/nonexistent/corpus", "format": "vctk"}]}},
                                      "dataset.sources[1].root"),
}


def _config_with(tmp_path, root, overrides):
    base = yaml.safe_load(write_config(tmp_path, root).read_text())
    cfg = config.merge(base, overrides)
    path = tmp_path / "user.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _names_key(message, key):
    return re.search(rf"(^|[\s:'\"(]){re.escape(key)}($|[\s:'\")])", message, re.M) is not None


@pytest.mark.parametrize("name", sorted(BAD))
def test_load_config_error_names_the_key(tmp_path, corpus_template, name):
    overrides, key = BAD[name]
    path = _config_with(tmp_path, corpus_template, overrides)
    with pytest.raises(ConfigError) as e:
        config.load_config(path)
    assert _names_key(str(e.value), key), str(e.value)


@pytest.mark.parametrize("section", ["train", "aligner", "vocoder"])
def test_a_learning_rate_past_1_is_refused_when_the_config_loads(tmp_path, section):
    # 1e40 passed the schema (any number above 0) and failed minutes into training as "diverged"
    path = tmp_path / "my.yaml"
    path.write_text(f"{section}: {{learning_rate: 1e40}}\n")
    with pytest.raises(ConfigError) as e:
        config.load_config(path, check_paths=False)
    assert str(e.value) == f"{path}: {section}.learning_rate: 1e+40 is greater than the maximum of 1.0"
    path.write_text(f"{section}: {{learning_rate: 1.0}}\n")
    assert config.load_config(path, check_paths=False)[section]["learning_rate"] == 1.0


def test_nested_error_names_the_full_key_not_a_namesake(tmp_path, corpus_template):
    # `dataset.root` exists, so an unknown `audio.root` must be named with its section
    path = _config_with(tmp_path, corpus_template, {"audio": {"root": "x"}})
    with pytest.raises(ConfigError, match=r"audio\.root"):
        config.load_config(path)


@pytest.mark.slow
def test_config_errors_reach_the_user_through_snakemake(tmp_path, corpus_template):
    for name in ("unknown nested key", "wrong type", "zero shards", "fmax above nyquist",
                 "missing dataset folder", "braces in cache.dir", "braces in runs_dir", "a brace in reports_dir"):
        overrides, key = BAD[name]
        path = _config_with(tmp_path, corpus_template, overrides)
        proc = snakemake("caches", "-n", config=path, check=False)
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, name
        assert _names_key(output, key), (name, output[-2000:])
        assert "Traceback" not in output and "RuleException" not in output
        # one line naming the key, not a WorkflowError framed by rules/common.smk's name and line twice
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and _names_key(errors[0], key), (name, proc.stderr[-2000:])
        assert "WorkflowError" not in output and "common.smk" not in output, (name, output[-2000:])


def test_partial_config_merges_over_the_defaults(tmp_path, corpus_template):
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump({"dataset": {"root": str(corpus_template)}, "audio": {"n_mels": 64},
                                    "train": {"steps": 5}}))
    cfg = config.load_config(path)
    assert cfg["audio"] == {**DEFAULTS["audio"], "n_mels": 64}
    assert cfg["train"] == {**DEFAULTS["train"], "steps": 5}
    assert cfg["dataset"] == {**DEFAULTS["dataset"], "root": str(corpus_template)}
    for section in set(DEFAULTS) - {"audio", "train", "dataset"}:
        assert cfg[section] == DEFAULTS[section], section
    # the same values from inline JSON, as the rules pass it, limited to what was passed
    inline = config.load_config(json.dumps({"dataset": {"root": str(corpus_template)}, "audio": {"n_mels": 64},
                                            "train": {"steps": 5}}))
    assert inline["audio"]["n_mels"] == 64 and inline["train"]["steps"] == 5
    assert inline["dataset"]["root"] == str(corpus_template)


def _printed_job_configs(output, rule_module_arg):
    """The inline --config JSON of every printed `python -m pipeline.cache <arg>` command."""
    found = []
    for line in output.splitlines():
        if f"pipeline.cache {rule_module_arg} " in line:
            argv = shlex.split(line.strip())
            found.append(json.loads(argv[argv.index("--config") + 1]))
    return found


@pytest.mark.slow
def test_partial_configfile_merges_over_the_defaults_in_snakemake(tmp_path, corpus_template):
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump({"dataset": {"root": str(corpus_template)}, "audio": {"n_mels": 64},
                                    "cache": {"dir": str(tmp_path / "cache"), "shards": 3},
                                    "reports_dir": str(tmp_path / "reports")}))
    proc = snakemake("caches", "-n", "-p", config=path)
    output = proc.stdout + proc.stderr
    mel_jobs = _printed_job_configs(output, "mels")
    assert len(mel_jobs) == 3
    for job in mel_jobs:
        assert job["audio"] == {**DEFAULTS["audio"], "n_mels": 64}
        assert job["dataset"]["root"] == str(corpus_template)
        assert job["dataset"]["max_seconds"] == DEFAULTS["dataset"]["max_seconds"]
        assert job["cache"]["shards"] == 3
    assert len(_printed_job_configs(output, "tokens")) == 3
    assert f"{tmp_path / 'cache'}/demo/index.json" in output  # the default name


@pytest.mark.slow
def test_command_line_name_changes_the_cache_folder(tmp_path, corpus_template):
    cfg = write_config(tmp_path, corpus_template)
    proc = snakemake("caches", "-n", "--config", "name=other", config=cfg)
    output = proc.stdout + proc.stderr
    outputs = re.findall(r"output: (.+)", output)
    assert outputs
    files = [f.strip() for line in outputs for f in line.split(",")]
    assert all(f.startswith(f"{tmp_path / 'cache' / 'other'}/") for f in files), files
    assert f"{tmp_path / 'cache' / 'other' / 'index.json'}" in files


def test_fmax_at_nyquist_and_other_rates(tmp_path, corpus_template):
    ok = _config_with(tmp_path, corpus_template, {"audio": {"sample_rate": 16000, "fmax": 8000}})
    assert config.load_config(ok)["audio"]["fmax"] == 8000
    bad = _config_with(tmp_path, corpus_template, {"audio": {"sample_rate": 16000, "fmax": 8001}})
    with pytest.raises(ConfigError, match=r"audio\.fmax"):
        config.load_config(bad)


def test_missing_config_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "nope.yaml"))):
        config.load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("audio: {n_mels: 80\n")
    with pytest.raises(ConfigError, match=re.escape(str(bad))):
        config.load_config(bad)


def test_a_job_cannot_read_a_key_its_rule_stripped(corpus):
    """Rules pass their jobs only the sections they need (inline JSON); a job that reads anything
    else fails naming the key instead of silently using the shipped default."""
    import json

    root, _ = corpus
    inline = json.dumps({"name": "t", "dataset": {"root": str(root)}, "synthesize": {"griffin_lim_iters": 7}})
    cfg = config.load_config(inline)
    assert cfg["synthesize"]["griffin_lim_iters"] == 7
    assert cfg["dataset"]["root"] == str(root)
    for read in (lambda: cfg["synthesize"]["sentences"], lambda: cfg["train"],
                 lambda: cfg.get("diagnose"), lambda: cfg["dataset"]["val_fraction"]):
        with pytest.raises(KeyError, match="stripped by the rule"):
            read()
    # a config file (not a rule's inline JSON) still gets every default
    assert config.load_config(corpus[1])["synthesize"]["sentences"]


def _schema_keys(schema, node, path=()):
    """Every property path of the schema (through $refs, items and oneOf/anyOf branches)."""
    if not isinstance(node, dict):
        return
    if "$ref" in node:
        yield from _schema_keys(schema, schema["$defs"][node["$ref"].split("/")[-1]], path)
    for key, sub in (node.get("properties") or {}).items():
        yield path + (key,)
        yield from _schema_keys(schema, sub, path + (key,))
    for sub in [node.get("items"), node.get("additionalProperties"), *node.get("oneOf", []), *node.get("anyOf", [])]:
        yield from _schema_keys(schema, sub, path)


def test_every_schema_key_is_read_by_some_module():
    # a key the schema requires but no job reads is a setting the user changes for nothing
    schema = yaml.safe_load((ROOT / "configs" / "schema.yaml").read_text())
    sources = [*(ROOT / "pipeline").rglob("*.py"), *(ROOT / "rules").glob("*.smk"), ROOT / "Snakefile"]
    text = "\n".join(p.read_text(encoding="utf-8") for p in sources if p.name != "config.py")  # config.py reads all
    keys = sorted(set(_schema_keys(schema, schema)))
    assert len(keys) > 50
    unread = [".".join(k) for k in keys if not re.search(rf"""["']{re.escape(k[-1])}["']""", text)]
    assert unread == [], f"schema keys no module reads (by name): {unread}"


def test_a_whole_number_float_where_an_integer_is_wanted_becomes_that_integer(tmp_path):
    # JSON Schema counts 8.0 as an integer; range(8.0) and np.zeros(8.0) in a job do not
    path = tmp_path / "my.yaml"
    path.write_text("cache: {shards: 8.0}\naudio: {n_fft: 1024.0, n_mels: 80.0, hop_length: 256.0}\n"
                    "train: {batch_size: 8.0, seed: 4.0}\nvocoder: {vocos: {kernel: 7.0}}\n")
    cfg = config.load_config(path, check_paths=False)
    got = [cfg["cache"]["shards"], cfg["audio"]["n_fft"], cfg["audio"]["n_mels"], cfg["audio"]["hop_length"],
           cfg["train"]["batch_size"], cfg["train"]["seed"], cfg["vocoder"]["vocos"]["kernel"]]
    assert got == [8, 1024, 80, 256, 8, 4, 7] and {type(v) for v in got} == {int}
    # a job's --set overrides too, and a number the schema takes as a float stays one
    cfg = config.load_config(json.dumps({"train": {"steps": 5}}), {"train": {"steps": 10.0, "grad_clip": 1.0}},
                             check_paths=False)
    assert type(cfg["train"]["steps"]) is int and type(cfg["train"]["grad_clip"]) is float
    # exponent notation YAML 1.1 reads as a string (no dot, or no sign), where the default is a whole number
    path.write_text("audio: {fmax: 7.6e3}\ntrain: {steps: 1e3, seed: 3E+2}\n")
    cfg = config.load_config(path, check_paths=False)
    assert (cfg["audio"]["fmax"], cfg["train"]["steps"], cfg["train"]["seed"]) == (7600, 1000, 300)
    assert type(cfg["train"]["steps"]) is int and type(cfg["train"]["seed"]) is int
    path.write_text("cache: {shards: 8.5}\n")
    with pytest.raises(ConfigError, match=r"cache\.shards: 8\.5 is not of type 'integer'$"):
        config.load_config(path, check_paths=False)



@pytest.mark.parametrize("text, read_as, base", [("dataset: {max_seconds: 1:30}", 90, "base 60"),
                                                 ("train: {seed: 010}", 8, "octal"),
                                                 ("train: {steps: 0x10}", 16, "hexadecimal"),
                                                 ("train: {steps: 0b101}", 5, "binary"),
                                                 ("synthesize: {max_seconds: 1:00:00.5}", 3600.5, "base 60")])
def test_a_number_yaml_1_1_reads_in_another_base_is_refused_at_its_line(tmp_path, corpus_template, text, read_as,
                                                                         base):
    # YAML 1.1 (PyYAML, and Snakemake's own loader) reads `1:30` as 90 and `010` as 8: a duration or a seed a
    # user wrote would reach the jobs as another number without a word
    path = tmp_path / "my.yaml"
    path.write_text(f"# a comment\n{text}\n")
    value = text.split(": ", 2)[2].rstrip("}")
    message = f"{path}:2:{text.index(value) + 1}: {value} is read as {read_as:g} ({base}, YAML 1.1)"
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        config.load_config(path, check_paths=False)
    key = text.split(":")[0] + "." + text.split("{")[1].split(":")[0]
    with pytest.raises(ConfigError, match=re.escape(f"--set '{key}={value}': {value} is read as")):
        config.load_config(None, config.parse_set([f"{key}={value}"]), check_paths=False)
    # quoted, where a number is wanted: text, not a number, naming the key
    path.write_text(text.replace(value, f'"{value}"') + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"{key}: '{value}' is not a decimal number (YAML 1.1 reads it "
                                                    "in another base); write the number you mean in decimal")):
        config.load_config(path, check_paths=False)
    if base == "octal":   # through Snakemake, which read the file itself: one line
        mine = write_config(tmp_path, corpus_template)
        mine.write_text(mine.read_text() + text + "\n")
        proc = snakemake("caches", "-n", config=mine, check=False)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode != 0 and errors == [f"error: {mine}:{len(mine.read_text().splitlines())}:"
                                                   f"{text.index(value) + 1}: {message.split(': ', 1)[1]}: "
                                                   f"write the decimal number you mean, or quote it (\"{value}\") "
                                                   "for text"], proc.stderr[-2000:]


def test_decimal_numbers_and_quoted_text_still_read_as_before(tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("train: {seed: 0, steps: 1_000, grad_clip: 0.5, batch_size: 07}\naudio: {fmax: 8000.0}\n"
                    "text: {language: \"10:00\"}\n")                       # 07: octal and decimal agree
    cfg = config._read_yaml(path)
    assert cfg == {"train": {"seed": 0, "steps": 1000, "grad_clip": 0.5, "batch_size": 7}, "audio": {"fmax": 8000.0},
                   "text": {"language": "10:00"}}
    path.write_text(f"train: {{seed: 0x{'F' * 5000}}}\n")                  # one line, not 6,000 digits (or a traceback)
    with pytest.raises(ConfigError, match=r"my\.yaml:1:15: 0xFFFFFFFFFFFFFFFFFF\.\.\. \(5002 characters\) is read in "
                                          r"hexadecimal \(YAML 1\.1\): write the decimal number you mean$"):
        config.load_config(path, check_paths=False)

@pytest.mark.slow
def test_jobs_get_the_integers_a_whole_number_float_gives_and_rerun_for_nothing(tmp_path, corpus_template):
    # the float config plans the very commands (params) of the one written with integers
    printed = []
    for shards, n_mels in ((3, 64), (3.0, 64.0)):
        path = _config_with(tmp_path, corpus_template, {"cache": {"shards": shards}, "audio": {"n_mels": n_mels},
                                                        "train": {"batch_size": float(n_mels) / 8}})
        proc = snakemake("train", "-n", "-p", config=path)
        printed.append(sorted(line.strip() for line in (proc.stdout + proc.stderr).splitlines()
                              if "python -m pipeline." in line))
    assert len(_printed_job_configs("\n".join(printed[1]), "mels")) == 3
    assert printed[1] == printed[0]


def test_a_whole_number_takes_its_defaults_spelling_and_a_path_one_spelling(tmp_path):
    # `pitch: {fmax: 600}` against the default 600.0, `audio: {fmax: 8000.0}` against 8000, and
    # "data/demo/" reached the jobs' params as other values: 25 to 50 jobs reran for the same settings
    cfg = config.load_config(None, {"pitch": {"fmax": 600, "fmin": 65}, "audio": {"fmax": 8000.0, "fmin": 0.0},
                                    "dataset": {"root": "./data//demo/", "audio_dir": "wavs/"},
                                    "cache": {"dir": "cache/"}, "runs_dir": "/tmp/x/../runs/"}, check_paths=False)
    assert (cfg["pitch"]["fmax"], cfg["pitch"]["fmin"]) == (600.0, 65.0) and type(cfg["pitch"]["fmax"]) is float
    assert (cfg["audio"]["fmax"], cfg["audio"]["fmin"]) == (8000, 0) and type(cfg["audio"]["fmax"]) is int
    assert (cfg["dataset"]["root"], cfg["dataset"]["audio_dir"], cfg["cache"]["dir"]) == ("data/demo", "wavs", "cache")
    assert cfg["runs_dir"] == "/tmp/x/../runs"  # ".." kept: through a link it is another folder
    assert config.load_config(None, {"pitch": {"fmax": 600.5}}, check_paths=False)["pitch"]["fmax"] == 600.5
    assert config.load_config(None, {"audio": {"fmax": 7999.5}}, check_paths=False)["audio"]["fmax"] == 7999.5
    assert config.plain_path("/") == "/" and config.plain_path("./") == "."
    sources = [{"root": "./data//lj/", "format": "ljspeech"}, {"root": "/corpora/vctk/", "format": "vctk"}]
    cfg = config.load_config(None, {"dataset": {"sources": sources}}, check_paths=False)
    assert [s["root"] for s in cfg["dataset"]["sources"]] == ["data/lj", "/corpora/vctk"]


def _leaves(node, path=()):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, path + (key,))
        else:
            yield path + (key,), value


def test_a_whole_number_respelled_in_the_defaults_file_itself_keeps_the_jobs_params(tmp_path, monkeypatch):
    # editing configs/config.yaml in place (600.0 -> 600, 0 -> 0.0) moved the spelling the other values
    # were measured against: 6 to 42 jobs of a built run reran for the same settings
    shipped = json.dumps(config.job_params(config.load_config(None, check_paths=False)), sort_keys=True)
    text = config.DEFAULTS.read_text()
    respelled = {"fmax: 600.0": "fmax: 600", "fmin: 65.0": "fmin: 65", "max_seconds: 20.0": "max_seconds: 20",
                 "fmin: 0\n": "fmin: 0.0\n", "fmax: 8000": "fmax: 8000.0", "mel_weight: 45.0": "mel_weight: 45",
                 "grad_clip: 1.0": "grad_clip: 1", "shards: 8": "shards: 8.0"}
    for old, new in respelled.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    edited = tmp_path / "config.yaml"
    edited.write_text(text)
    monkeypatch.setattr(config, "DEFAULTS", edited)
    assert json.dumps(config.job_params(config.load_config(None, check_paths=False)), sort_keys=True) == shipped


def test_a_free_form_section_keeps_its_spelling():
    # model.options is the user's own model's: its train.steps 5.0 became 5 and pitch.fmin 65 became 65.0
    # (the whole schema's spelling, from its top), changing the user's types and the train job's params
    options = {"ema": {"train": {"steps": 5.0}, "pitch": {"fmin": 65}}, "steps": 3.0}
    got = config.load_config(None, {"model": {"options": options}}, check_paths=False)["model"]["options"]
    assert got == options and type(got["ema"]["train"]["steps"]) is float and type(got["ema"]["pitch"]["fmin"]) is int
    assert type(got["steps"]) is float


def test_the_shipped_values_keep_their_spelling(tmp_path):
    # the spelling runs were keyed with: a change here would rerun every built run's jobs once
    cfg = config.load_config(None, check_paths=False)
    for path, value in _leaves(DEFAULTS):
        got = cfg
        for key in path:
            got = got[key]
        assert (got, type(got)) == (value, type(value)), path


@pytest.mark.slow
def test_the_same_values_spelled_otherwise_plan_the_same_jobs(tmp_path, corpus_template):
    printed = []
    for pitch_fmax, audio_fmax, slash in ((600.0, 8000, ""), (600, 8000.0, "/")):
        path = _config_with(tmp_path, corpus_template, {"pitch": {"fmax": pitch_fmax}, "audio": {"fmax": audio_fmax}})
        text = yaml.safe_load(path.read_text())
        text["dataset"]["root"] += slash
        path.write_text(yaml.safe_dump(text))
        proc = snakemake("caches", "-n", "-p", config=path)
        printed.append(sorted(line.strip() for line in (proc.stdout + proc.stderr).splitlines()
                              if "python -m pipeline." in line))
    assert printed[0] and printed[1] == printed[0]


@pytest.mark.parametrize("value", [None, [], 5])
def test_a_section_that_is_not_a_mapping_is_one_line_naming_it(tmp_path, value):
    for section in (s for s, v in DEFAULTS.items() if isinstance(v, dict)):
        path = tmp_path / "my.yaml"
        path.write_text(yaml.safe_dump({section: value}))
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {section}: {re.escape(str(value))} is not of type 'object'$"):
            config.load_config(path, check_paths=False)


def test_the_config_command_prints_an_inline_config_as_the_job_sees_it(capsys):
    config.main(["--config", '{"train": {"batch_size": 8.0}}', "--set", "cache.shards=2.0"])
    assert yaml.safe_load(capsys.readouterr().out) == {"train": {"batch_size": 8}, "cache": {"shards": 2}}


def test_a_rules_job_gets_its_trainers_logging_keys_from_plannings_environment(monkeypatch):
    # no job's params hold the logging keys (editing them reruns nothing): planning passes them in the
    # environment, and an inline job config holding train: or vocoder: gets them; its own values win
    full = config.load_config(None, check_paths=False)
    inline = json.dumps(config.without_logging({"name": "x", "train": full["train"], "vocoder": full["vocoder"]}))
    with pytest.raises(KeyError, match="train.log_every was stripped"):
        config.load_config(inline, check_paths=False)["train"]["log_every"]
    given = json.loads(config.logging_env(full))
    given["train"]["log_every"], given["vocoder"]["summary_every"] = 3, 11
    monkeypatch.setenv(config.LOGGING_ENV, json.dumps(given))
    cfg = config.load_config(inline, check_paths=False)
    assert (cfg["train"]["log_every"], cfg["vocoder"]["summary_every"], cfg["train"]["steps"]) == (3, 11, full["train"]["steps"])
    own = json.dumps({"name": "x", "train": {**full["train"], "log_every": 7}})
    assert config.load_config(own, check_paths=False)["train"]["log_every"] == 7
    assert "vocoder" not in config.load_config(own, check_paths=False)      # only the sections given
    for damaged in ("{not json", json.dumps({**given, "train": {**given["train"], "log_every": 0}}),
                    json.dumps(given).replace('"log_every": 3', '"log_every": NaN'),  # json reads NaN
                    json.dumps(given).replace('"log_every": 3', '"log_every": true')):  # a bool, not a step count
        monkeypatch.setenv(config.LOGGING_ENV, damaged)
        with pytest.raises(config.ConfigError, match=f"environment variable {config.LOGGING_ENV}: "):
            config.load_config(inline, check_paths=False)


def test_the_limits_config_checks_are_the_models():
    import inspect

    from pipeline.models import transformer_tts
    from pipeline.vocoder import discriminators
    assert config.STFT_LOSS_LONGEST == max(win for _, _, win in discriminators.RESOLUTIONS)
    positions = inspect.signature(transformer_tts.TransformerTTS).parameters["max_positions"].default
    assert config.TRANSFORMER_TTS_STEPS == positions
    cfg = config.load_config(overrides={"model": {"kind": "transformer_tts", "transformer_tts": {"reduction": 1}},
                                        "synthesize": {"max_seconds": 47.5}}, check_paths=False)  # the longest it takes
    assert math.ceil(47.5 * cfg["audio"]["sample_rate"] / cfg["audio"]["hop_length"]) <= positions



def test_a_jobs_params_hold_only_the_model_and_vocoder_kind_in_use():
    cfg = config.load_config(None, check_paths=False)
    params = config.job_params(cfg)
    assert set(params["model"]) == {"kind", "options", "fastpitch"}
    assert set(params["vocoder"]) - set(cfg["vocoder"]) == set() and "source_filter" in params["vocoder"]
    assert not {"vocos", "hifigan"} & set(params["vocoder"])
    assert not {"vocos", "hifigan", "source_filter"} & set(config.job_params(
        config.merge(cfg, {"vocoder": {"kind": "griffin_lim"}}))["vocoder"])
    # a user's own kind may read a built-in kind's section: kept whole
    own = config.merge(cfg, {"model": {"kind": "my_tts:build", "fastpitch": {"d_model": 256}}})
    assert config.job_params(own)["model"]["fastpitch"]["d_model"] == 256


def test_a_second_config_file_is_refused_not_silently_taken(tmp_path, corpus_template):
    # `python -m pipeline.evaluate --config mine.yaml --config other.yaml` kept only the last: another
    # run's folders, without a word
    import subprocess
    import sys
    mine = write_config(tmp_path, corpus_template)
    proc = subprocess.run([sys.executable, "-m", "pipeline.config", "--config", str(mine), "--config",
                           "configs/ljspeech.yaml"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].endswith(
        f"error: --config given twice ({mine}, then configs/ljspeech.yaml): give one file, with --set KEY=VALUE "
        "for single keys")


def test_a_reader_that_stops_reading_is_no_traceback():
    # `python -m pipeline.config --config c.yaml | head -3`: a BrokenPipeError traceback
    import os
    import subprocess
    import sys
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        proc = subprocess.run([sys.executable, "-m", "pipeline.config", "--config", "configs/config.yaml"], cwd=ROOT,
                              stdout=write, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr



def test_the_config_command_with_standard_output_closed_is_one_line():
    # `python -m pipeline.config >&-` printed to nowhere and exited 0
    import subprocess
    import sys
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "pipeline.config"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: standard output is closed: the merged config has nowhere to go; send it to a file or a pipe"], proc.stderr


def test_a_job_given_no_dataset_folder_checks_none_in_its_working_folder(tmp_path, monkeypatch):
    # with dataset.sources, train_aligner's rule passes no dataset folder; its job then checked the
    # defaults' data/demo in the working folder: "dataset.root: folder not found: data/demo" in any
    # folder but the checkout's
    monkeypatch.chdir(tmp_path)
    inline = {"name": "x", "dataset": {"bad_audio": "skip", "max_seconds": 20.0, "val_fraction": 0.1}}
    cfg = config.load_config(json.dumps(inline))
    assert cfg["dataset"]["max_seconds"] == 20.0
    with pytest.raises(KeyError, match="dataset.root was stripped"):
        cfg["dataset"]["root"]
    assert config.load_config(json.dumps({"name": "x"}))["name"] == "x"  # no dataset at all
    inline["dataset"]["root"] = "data/demo"  # a job given a folder has it checked
    with pytest.raises(ConfigError, match=r"^dataset.root: folder not found: data/demo$"):
        config.load_config(json.dumps(inline))


def test_a_non_finite_number_in_free_form_model_options_is_refused_naming_key_and_index(tmp_path):
    # a user's own model reads model.options as given: a .nan there would reach it as a NaN weight
    path = tmp_path / "my.yaml"
    path.write_text("model: {options: {s: [1.0, .nan], t: [{u: .inf}]}}\n")
    with pytest.raises(ConfigError, match="^" + re.escape(f"{path}: model.options.s[1]: nan is not a finite number")
                       + "$"):
        config.load_config(path, check_paths=False)
    path.write_text("model: {options: {s: [1.0, 2.0], t: [{u: -.inf}]}}\n")
    with pytest.raises(ConfigError, match="^" + re.escape(f"{path}: model.options.t[0].u: -inf is not a finite "
                                                          "number") + "$"):
        config.load_config(path, check_paths=False)


def test_a_window_longer_than_the_fft_is_refused_naming_win_length():
    # the STFT cannot take a window longer than its frame: a user learns which key to shorten
    with pytest.raises(ConfigError, match=r"^audio\.win_length: 2048 is longer than audio\.n_fft 1024$"):
        config.load_config(None, {"audio": {"win_length": 2048}}, check_paths=False)
    assert config.load_config(None, {"audio": {"win_length": 1024}}, check_paths=False)["audio"]["win_length"] == 1024


def test_the_documented_boundaries_load_and_one_step_past_is_refused():
    # "2 * hop_length <= win_length" and "fmax at least an octave above fmin" are inclusive, as documented
    cfg = config.load_config(None, {"audio": {"hop_length": 512, "win_length": 1024},
                                    "pitch": {"fmin": 100.0, "fmax": 200.0}}, check_paths=False)
    assert (cfg["audio"]["hop_length"], cfg["pitch"]["fmax"]) == (512, 200.0)
    with pytest.raises(ConfigError, match=r"^audio\.hop_length: 513 is more than half of audio\.win_length 1024: "):
        config.load_config(None, {"audio": {"hop_length": 513, "win_length": 1024}}, check_paths=False)
    with pytest.raises(ConfigError, match=r"^pitch\.fmax: 199\.5 is less than an octave above pitch\.fmin 100\.0: "):
        config.load_config(None, {"pitch": {"fmin": 100.0, "fmax": 199.5}}, check_paths=False)


def test_an_empty_mel_band_is_refused_naming_audio_fmin():
    # fmin == fmax leaves the mel filters no band: the message names the key to lower, not the mel count
    with pytest.raises(ConfigError, match=r"^audio\.fmin: 4000 must be below audio\.fmax 4000$"):
        config.load_config(None, {"audio": {"fmin": 4000, "fmax": 4000}}, check_paths=False)


def test_the_schema_digest_changes_with_the_defaults_and_the_schema(tmp_path, monkeypatch):
    # jobs skip validation when the digest matches planning's: an edited defaults or schema file must revalidate
    shipped = config.schema_digest()
    defaults, schema = tmp_path / "config.yaml", tmp_path / "schema.yaml"
    defaults.write_text(config.DEFAULTS.read_text())
    schema.write_text(config.SCHEMA.read_text())
    monkeypatch.setattr(config, "DEFAULTS", defaults)
    monkeypatch.setattr(config, "SCHEMA", schema)
    assert config.schema_digest() == shipped  # the same bytes elsewhere: the same digest
    defaults.write_text(defaults.read_text().replace("n_mels: 80", "n_mels: 64", 1))
    edited_defaults = config.schema_digest()
    assert edited_defaults != shipped
    schema.write_text(schema.read_text().replace("maximum: 512", "maximum: 256", 1))
    assert config.schema_digest() not in (shipped, edited_defaults)


def test_a_missing_audio_folder_is_refused_naming_dataset_audio_dir(tmp_path):
    # a corpus copied without its wavs/ fails at loading, naming the key, not with no clips found later
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "metadata.csv").write_text("a|Hello.|Hello.\n")
    with pytest.raises(ConfigError, match="^" + re.escape(f"dataset.audio_dir: folder not found: {root / 'wavs'}")
                       + "$"):
        config.load_config(None, {"dataset": {"root": str(root)}})
    (root / "wavs").mkdir()
    assert config.load_config(None, {"dataset": {"root": str(root)}})["dataset"]["root"] == str(root)


def test_dataset_paths_longer_than_a_file_name_may_be_are_not_found_naming_the_key(tmp_path):
    # a 300-letter folder name: planning stopped in an OSError traceback (File name too long)
    root = tmp_path / "corpus"
    (root / "wavs").mkdir(parents=True)
    (root / "metadata.csv").write_text("a|Hello.|Hello.\n")
    long = "d" * 300
    for dataset, key in (({"root": str(tmp_path / long)}, "dataset.root"),
                         ({"root": str(root), "metadata": long}, "dataset.metadata"),
                         ({"root": str(root), "audio_dir": long}, "dataset.audio_dir"),
                         ({"sources": [{"root": str(tmp_path / long), "format": "ljspeech"}]}, r"dataset.sources\[0\].root")):
        with pytest.raises(ConfigError, match=rf"^{key}: (folder|file) not found: .*{long}$"):
            config.load_config(None, {"dataset": dataset})


def test_pitch_fmax_at_nyquist_loads_and_an_fmin_above_fmax_is_refused_naming_pitch_fmin():
    # as for audio.fmax: the Nyquist frequency itself is allowed, a step past it is not; fmin over fmax
    # names the key to lower, not the octave between them
    assert config.load_config(None, {"pitch": {"fmax": 11025.0}}, check_paths=False)["pitch"]["fmax"] == 11025.0
    with pytest.raises(ConfigError, match=r"^pitch\.fmax: 11025\.5 is above the Nyquist frequency 11025\.0$"):
        config.load_config(None, {"pitch": {"fmax": 11025.5}}, check_paths=False)
    with pytest.raises(ConfigError, match=r"^pitch\.fmin: 300\.0 must be below pitch\.fmax 200\.0$"):
        config.load_config(None, {"pitch": {"fmin": 300.0, "fmax": 200.0}}, check_paths=False)


def test_the_vocoder_crop_and_the_transformer_tts_steps_take_their_boundaries():
    # 8 frames of hop 256 are the spectral loss's longest window exactly (2048 samples): enough
    cfg = config.load_config(None, {"vocoder": {"kind": "vocos", "segment_frames": 8}}, check_paths=False)
    assert cfg["vocoder"]["segment_frames"] * cfg["audio"]["hop_length"] == config.STFT_LOSS_LONGEST
    # the mel loss's STFT reflect-pads a crop by (n_fft - hop) / 2 = 4064 samples at n_fft 8192, hop 64: 64 frames
    # do, 63 (the spectral loss's 2048 samples and more) stopped training in TensorFlow's MirrorPad
    wide = {"audio": {"n_fft": 8192, "hop_length": 64, "win_length": 128}}
    config.load_config(None, {**wide, "vocoder": {"segment_frames": 64}}, check_paths=False)
    with pytest.raises(ConfigError, match=r"^vocoder\.segment_frames: 63 frames of audio\.hop_length 64 are 4032 "
                                          r"samples, no more than the 4064 .* use at least 64$"):
        config.load_config(None, {**wide, "vocoder": {"segment_frames": 63}}, check_paths=False)
    # griffin_lim trains nothing: no loss, no minimum crop
    config.load_config(None, {"audio": {"hop_length": 128}, "vocoder": {"kind": "griffin_lim", "segment_frames": 8}},
                       check_paths=False)
    # transformer_tts: 47.55 s are 4095.6 frames of hop 256 at 22050 Hz, 4096 decoder steps of r=1 (all it has);
    # 47.56 s are 4097 steps
    tts = {"model": {"kind": "transformer_tts", "transformer_tts": {"reduction": 1}}}
    config.load_config(None, {**tts, "synthesize": {"max_seconds": 47.55}}, check_paths=False)
    with pytest.raises(ConfigError, match=r"^synthesize\.max_seconds: 47\.56 s is more than model\.kind transformer_tts"):
        config.load_config(None, {**tts, "synthesize": {"max_seconds": 47.56}}, check_paths=False)
    # a step decodes `reduction` frames: the shipped r=4 reaches 190 s
    cfg = config.load_config(None, {"model": {"kind": "transformer_tts"}, "synthesize": {"max_seconds": 180.0}},
                             check_paths=False)
    assert cfg["model"]["transformer_tts"]["reduction"] == 4


def test_a_config_of_the_most_values_loads_and_one_more_is_refused():
    config.check_structure({"x": [0] * (config.MAX_VALUES - 2)})  # the top level, its list and the list's items
    with pytest.raises(ConfigError, match=r"^\(top level\): more than 100,000 values once its YAML aliases"):
        config.check_structure({"x": [0] * (config.MAX_VALUES - 1)})


@pytest.mark.parametrize("n", [2**63 - 1, -2**63])
def test_the_largest_64_bit_integers_load_and_one_more_is_refused(n):
    got = config.load_config(None, {"model": {"options": {"n": n}}}, check_paths=False)["model"]["options"]
    assert got["n"] == n
    with pytest.raises(ConfigError, match=r": model\.options\.n: an integer of 64 bits is beyond the 64-bit integers"):
        config.load_config(None, {"model": {"options": {"n": n + (1 if n > 0 else -1)}}}, check_paths=False)


def test_a_bare_off_for_mixed_precision_reaches_the_jobs_as_off(tmp_path):
    # YAML 1.1 reads a bare `off` as False: the code sees the one spelling, "off"
    path = tmp_path / "my.yaml"
    path.write_text("train:\n  mixed_precision: off\n")
    assert config.load_config(path, check_paths=False)["train"]["mixed_precision"] == "off"
    assert config.load_config(None, config.parse_set(["train.mixed_precision=off"]),
                              check_paths=False)["train"]["mixed_precision"] == "off"


def test_a_jobs_set_overrides_are_validated_even_where_planning_vouched_for_its_config(monkeypatch):
    # planning validated the inline config it passes, not a --set given to the job by hand
    monkeypatch.setenv(config.VALIDATED_ENV, config.schema_digest())
    inline = json.dumps({"cache": {"shards": 2}})
    assert config.load_config(inline, check_paths=False)["cache"]["shards"] == 2
    with pytest.raises(ConfigError, match=r"^inline config with --set: cache\.shards: 0 is less than the minimum"):
        config.load_config(inline, {"cache": {"shards": 0}}, check_paths=False)


@pytest.mark.parametrize("items, message", [
    (["train.steps"], "--set 'train.steps': expected key=value"),
    (["train=1", "train.steps=2"], "--set 'train.steps=2': train was set to a value above, not a section"),
])
def test_a_set_that_is_no_key_value_pair_is_one_line_naming_it(items, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        config.parse_set(items)


@pytest.mark.parametrize("text", ["", "# nothing set yet\n"])
def test_an_empty_config_file_is_the_defaults(tmp_path, text):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    assert config.load_config(path, check_paths=False) == config.load_config(None, check_paths=False)


@pytest.mark.parametrize("text, got", [("- name: x\n", "list"), ("just a name\n", "str"), ("7\n", "int")])
def test_a_config_file_that_is_no_mapping_is_one_line_naming_it(tmp_path, text, got):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: the top level must be a mapping of keys, got {got}$"):
        config.load_config(path, check_paths=False)


def test_a_jobs_params_hold_bad_audio_skip_whatever_the_config_says():
    # `fail` is the index job's alone: flipping it must rerun no shard job (their params hold "skip")
    cfg = config.load_config(None, {"dataset": {"bad_audio": "fail"}}, check_paths=False)
    assert config.job_params(cfg)["dataset"] == {**cfg["dataset"], "bad_audio": "skip"}
    assert cfg["dataset"]["bad_audio"] == "fail"


def test_a_huge_value_is_abbreviated_in_its_error(tmp_path):
    # a 1 MB string where a number goes: the one-line error repeated all 1,000,000 characters of it
    import subprocess
    import sys
    path = tmp_path / "huge.yaml"
    path.write_text("train:\n  steps: " + "x" * 1_000_000 + "\n")
    proc = subprocess.run([sys.executable, "-m", "pipeline.config", "--config", str(path)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: {path}: train.steps: '{'x' * 79}... (1,000,000 characters) "
                           "is not of type 'integer'\n")
    # a 50,000-item list (within the 100,000 values a config may hold); a key of 100,000 characters
    path.write_text("train:\n  steps: [" + ", ".join(["1"] * 50_000) + "]\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: train.steps: [1, 1, ") + r".{50,80}"
                       + re.escape("... (50,000 items) is not of type 'integer'") + "$"):
        config.load_config(path)
    with pytest.raises(ConfigError, match=re.escape("inline config: train.kkk") + r"k{70,80}"
                       + re.escape("... (100,006 characters): unknown key (valid keys here: ")):
        config.load_config(json.dumps({"train": {"k" * 100_000: 1}}))
    # --set, and text where a number goes (Snakemake's --config hands values over as text)
    with pytest.raises(ConfigError, match=re.escape("--set 'train.steps=0x") + r"1{60,80}"
                       + re.escape("... (100,017 characters): the value is not valid YAML: ")):
        config.parse_set(["train.steps=0x" + "1" * 100_000 + ": ["])
    with pytest.raises(ConfigError, match=re.escape("train.steps: '0x") + r"1{70,80}"
                       + re.escape("... (100,002 characters) is not a decimal number")):
        config.load_config(None, {"train": {"steps": "0x" + "1" * 100_000}})
    # a value within the bound is shown whole, and a path up to the longest the system opens
    assert config.shown("x" * (config.SHOWN_CHARS - 2)) == repr("x" * (config.SHOWN_CHARS - 2))
    assert config.abbreviated("/d" * 1000, limit=config.PATH_MAX) == "/d" * 1000
