"""Every `snakemake ...` command the README and docs/*.md show parses as its reader means it.

Several Snakemake options take any number of values (`--resources`, `--config`, `--forcerun`/`-R`,
`--until`, `--set-threads`, `--set-resources`, ...), so a target written after them becomes one of
their values: `snakemake --resources gpu=2 train` stops with a traceback, `snakemake --config
'x={...}' train` builds the default target with a config entry `train`, and `snakemake --forcerun
caches` forces the `caches` rule instead of asking for it. Each command is parsed with Snakemake's
own argument parser; a parse error, a value without `=` in an option of `key=value` entries, or a
target the docs ask for elsewhere left inside a rule-list option of a command with no target fails.
"""
import re
import shlex

import pytest
from conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)  # CommonMark: closed by as many backticks
COMMAND = re.compile(r"(?:^|[\s(])(snakemake(?:\s.*)?)$", re.S)
ENDS = {"&&", "||", ";", "|", "(", ")", ">", ">>", "<", "&"}
KEY_VALUE = ("resources", "config", "set_threads", "set_resources", "set_scatter", "set_resource_scopes",
             "default_resources")


def _command(text):
    """The argv after `snakemake` in one line or code span, or None: the command ends at a shell
    operator, a comment is dropped, and one with a placeholder (`...`) is not a command."""
    match = COMMAND.search(text.replace("\n", " "))
    if not match:
        return None
    # a command quoted inside a longer span (an error message) ends at its own backtick
    lexer = shlex.shlex(match.group(1).split("`")[0], posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    lexer.whitespace_split = True
    argv = []
    for token in lexer:
        if token in ENDS:
            break
        argv.append(token)
    return None if any("..." in a or "…" in a for a in argv) else argv[1:]


def doc_commands(text):
    """[(line number, argv)] of every snakemake command in a Markdown text: fenced lines and inline spans."""
    found = []
    for block in FENCE.finditer(text):
        start = text.count("\n", 0, block.start(1)) + 1
        found += [(start + i, _command(line)) for i, line in enumerate(block.group(1).splitlines())]
    outside = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found += [(outside.count("\n", 0, m.start()) + 1, _command(m.group(2))) for m in SPAN.finditer(outside)]
    return sorted((line, argv) for line, argv in found if argv is not None)


def _parser():
    from snakemake import cli

    return cli.get_argument_parser()


def problems(argv, parser, targets):
    """Why `snakemake *argv` does not do what it reads as ([] when it does)."""
    try:
        args = parser.parse_args(argv)
    except (ValueError, SystemExit) as e:  # what `snakemake` itself stops with
        return [f"does not parse: {e}"]
    raw = {k: getattr(args, k, None) for k in KEY_VALUE}
    found = [f"--{k.replace('_', '-')} swallows {v!r}" for k in ("config",) for v in raw["config"] or []
             if "=" not in v]  # --config keeps its raw strings; the others parse theirs (above)
    if not args.targets:  # any option of several values (nargs + or *: read from the parser itself)
        for dest in many_valued(parser):
            values = getattr(args, dest, None)
            values = values if isinstance(values, (list, tuple, set, frozenset)) else ()
            found += [f"--{dest.replace('_', '-')} swallows the target {str(v)!r} (no target is left)"
                      for v in sorted(map(str, values)) if v in targets]
    return found


def many_valued(parser):
    """The dests of the parser's options that take several values (nargs + or *), targets aside."""
    return sorted({a.dest for a in parser._actions if a.option_strings and a.nargs in ("+", "*")})


def _all_commands():
    return [(path.relative_to(ROOT), line, argv) for path in DOCS
            for line, argv in doc_commands(path.read_text(encoding="utf-8"))]


def test_every_documented_snakemake_command_parses_as_written():
    parser, commands = _parser(), _all_commands()
    assert len(commands) > 40  # the extraction finds the docs' commands
    targets = {t for *_, argv in commands if not problems(argv, parser, set()) for t in parser.parse_args(argv).targets}
    assert {"caches", "train", "evaluate"} <= targets
    bad = [f"{path}:{line}: snakemake {shlex.join(argv)}: {why}"
           for path, line, argv in commands for why in problems(argv, parser, targets)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("written, wrong", [
    ("```\nsnakemake --resources gpu=2 train    # two GPUs\n```", "does not parse"),
    ("Then `snakemake --cores 4 --resources gpu=2 train --configfile my.yaml`.", "does not parse"),
    ("`snakemake --config 'diagnose={target: vocoder}' diagnose`", "swallows 'diagnose'"),
    ("`snakemake --set-threads train=2 train`", "does not parse"),
    ("run `snakemake\n--forcerun caches` once", "swallows the target 'caches'"),
    ("`snakemake --until caches train`", "swallows the target"),
    ("`snakemake --configfile configs/ljspeech.yaml train`", "--configfile swallows the target 'train'"),
    ("`snakemake --envvars HOME train`", "--envvars swallows the target 'train'"),
])
def test_a_target_after_a_many_valued_option_is_found(written, wrong):
    (_, argv), = doc_commands(written)
    assert any(wrong in why for why in problems(argv, _parser(), {"caches", "train", "diagnose"}))


@pytest.mark.parametrize("written", [
    "```\nsnakemake train --resources gpu=2    # two GPUs\n```",
    "`snakemake --resources gpu=2 -- train`",
    "`snakemake --cores all caches --forcerun token_shard mel_shard pitch_shard`",
    "`snakemake --forcerun train_aligner` trains",
    "`bash install.sh && snakemake --cores all`",
    "`snakemake diagnose --config 'diagnose={target: vocoder}'`",
])
def test_a_command_with_its_target_first_or_after_dashes_passes(written):
    (_, argv), = doc_commands(written)
    assert problems(argv, _parser(), {"caches", "train", "diagnose"}) == []
