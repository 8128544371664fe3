"""The package's shape, read with `ast`: no module imports one that imports it back (imports inside
functions included), no function over 60 lines, and every file path the README and docs cite exists."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipeline"
MAX_LINES = 60


def _module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_graph(modules):
    """{module: modules of this package it imports anywhere in its file (module level or in a function)}."""
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                             for a in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def circles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_one_that_imports_it_back():
    found = circles(import_graph(_modules()))
    assert found == [], f"import circles: {found}"


def test_the_circle_finder_sees_a_circle_closed_inside_a_function(tmp_path):
    (tmp_path / "a.py").write_text("import pipeline.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from pipeline import c\n")
    (tmp_path / "c.py").write_text("from pipeline.a import x\n")
    (tmp_path / "d.py").write_text("from pipeline import a\n")
    modules = {f"pipeline.{p.stem}": p for p in tmp_path.glob("*.py")}
    assert circles(import_graph(modules)) == [["pipeline.a", "pipeline.b", "pipeline.c"]]


def test_no_function_in_the_package_is_longer_than_60_lines():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in PACKAGE.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]
    assert long == []


_CITED = re.compile(r"`((?:pipeline|rules|configs|docs|tests|benchmarks|scripts|profiles|data/demo)/[\w./-]+)`")


def test_every_file_the_readme_and_docs_cite_exists():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = sorted({f"{t.relative_to(ROOT)}: {m}" for t in texts
                      for m in _CITED.findall(t.read_text(encoding="utf-8"))
                      if "{" not in m and "*" not in m and not (ROOT / m.rstrip(".")).exists()})
    assert missing == []


def test_every_plug_point_is_one_registry_whose_entries_declare_their_properties():
    import pytest

    from pipeline import config, formats, models, pitch
    from pipeline.registry import Registry
    from pipeline.vocoder import kinds
    for registry, key in ((models.KINDS, "model.kind"), (kinds.KINDS, "vocoder.kind"),
                          (formats.FORMATS, "dataset.sources[].format"), (pitch.METHODS, "pitch.method")):
        assert isinstance(registry, Registry) and registry.key == key and len(registry) >= 2
        assert all(set(vars(registry.get(name))) == {"name", *registry.properties} for name in registry)
    assert not models.needs_durations({"kind": "transformer_tts"}) and models.needs_durations({"kind": "fastpitch"})
    assert kinds.KINDS.get("griffin_lim").build is None and kinds.KINDS.get("vocos").build is not None
    with pytest.raises(config.ConfigError, match=r"vocoder\.kind: unknown kind 'wavenet'; valid: vocos, hifigan"):
        kinds.KINDS.get("wavenet")
    with pytest.raises(TypeError, match="no such properties"):
        Registry("x.kind", build=None).add("a", bulid=print)


def test_a_registry_keeps_its_entries_in_the_order_added_and_refuses_a_name_twice():
    import pytest

    from pipeline.registry import Registry
    voices = Registry("x.kind", build=None, trained=True)
    for name in ("zeta", "alpha", "mu"):  # not alphabetical: the order of the `add` calls is what lists them
        voices.add(name, trained=name != "alpha")
    assert list(voices) == ["zeta", "alpha", "mu"] and len(voices) == 3 and "mu" in voices
    with pytest.raises(TypeError, match=r"x\.kind 'alpha' is registered twice"):
        voices.add("alpha", trained=True)
    assert voices.get("alpha").trained is False  # the first entry stays
