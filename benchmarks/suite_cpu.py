"""The test suite's CPU, test by test: a pytest plugin (the figures of RESULTS.md's suite sections).

    PYTHONPATH=benchmarks python -m pytest -p suite_cpu      # writes .bench/suite_cpu/cpu-{worker}.txt

Each line: kind (T: a test with its fixtures' setup and teardown, F: a fixture's setup over 0.5 CPU s),
this process's CPU s, its children's CPU s (Snakemake runs of tests/snakemake_cli.py included: they
are the helper's children, never this process's), wall s, start time, test id (and fixture name).
"""
import os
import resource
import sys
import time
from pathlib import Path

import pytest

OUT = Path(__file__).resolve().parent.parent / ".bench" / "suite_cpu"


def _cpu():
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    forked = getattr(sys.modules.get("snakemake_cli"), "cpu_s", 0.0)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + forked


def _write(*fields):
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / f"cpu-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as f:
        f.write("\t".join(map(str, fields)) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own, children), start = _cpu(), time.time()
    yield
    own2, children2 = _cpu()
    _write("T", f"{own2 - own:.2f}", f"{children2 - children:.2f}", f"{time.time() - start:.2f}", f"{start:.0f}",
           item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    (own, children), start = _cpu(), time.time()
    yield
    own2, children2 = _cpu()
    if own2 - own + children2 - children > 0.5:
        _write("F", f"{own2 - own:.2f}", f"{children2 - children:.2f}", f"{time.time() - start:.2f}", f"{start:.0f}",
               request.node.nodeid, fixturedef.argname)
