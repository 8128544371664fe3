"""What the project imports and runs is what its own files install.

A package that is importable here only because somebody installed it by hand passes every other
test and then fails on a user's fresh machine (the SLURM executor plugin did). These tests read the
sources (pipeline/, tests/, benchmarks/, rules/, the Snakefile), collect every third-party module they
import and every Snakemake executor a profile names, and require each to be declared by all three
install paths: requirements.txt (install.sh), environment.yml (conda) and pyproject.toml (pip install .).
CI (`.ci/run`) runs the suite in a fresh virtual environment, so an undeclared package fails there too.
"""
import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

SOURCES = ("pipeline", "tests", "benchmarks", "scripts", "docs")
FIRST_PARTY = {"pipeline", "conftest", "common", "benchmarks", "tests"}
# conda-forge names that differ from the PyPI distribution they stand for
CONDA_TO_PYPI = {"pysoundfile": "soundfile", "soxr-python": "soxr", "python": None, "pip": None}


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec):
    return norm(re.split(r"[\s<>=!~;\[#]", spec.strip(), maxsplit=1)[0])


def requirements_txt():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return {requirement_name(line) for line in lines if line.strip() and not line.lstrip().startswith("#")}


def environment_yml():
    deps = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    names = set()
    for dep in deps:
        if isinstance(dep, dict):
            names |= {requirement_name(spec) for spec in dep.get("pip", [])}
        else:
            name = requirement_name(dep)
            name = CONDA_TO_PYPI.get(name, name)
            if name:
                names.add(name)
    return names


def pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for extra in project.get("optional-dependencies", {}).values() for s in extra]
    return {requirement_name(spec) for spec in specs}


def _optional(node, parents):
    """An import inside `try: ... except ImportError` is optional by design (the code says what it skips)."""
    for parent in parents:
        if isinstance(parent, ast.Try) and node in ast.walk(ast.Module(body=parent.body, type_ignores=[])):
            for handler in parent.handlers:
                names = [handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts
                if any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names):
                    return True
    return False


def imported_modules(source, path):
    """{top-level module: first place} for the imports of one Python source that are not optional."""
    tree = ast.parse(source, filename=str(path))
    found = {}

    def visit(node, parents):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not _optional(node, parents):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                names = [node.module] if node.module and node.level == 0 else []
            for name in names:
                found.setdefault(name.split(".")[0], f"{path}:{node.lineno}")
        for child in ast.iter_child_nodes(node):
            visit(child, parents + [node])

    visit(tree, [])
    return found


def smk_python(text):
    """The Python of a Snakemake file: its import lines (rules are not Python as a whole)."""
    return "\n".join(line.strip() for line in text.splitlines() if re.match(r"^\s*(import|from)\s+\w", line)
                     and not line.rstrip().endswith("("))


def project_imports():
    found = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for module, where in imported_modules(path.read_text(), path.relative_to(ROOT)).items():
                found.setdefault(module, where)
    for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        text = path.read_text()
        # multi-line `from x import (\n a,\n b)` blocks: keep the opening line's module
        text = re.sub(r"^(\s*from\s+[\w.]+\s+import)\s*\((.|\n)*?\)", r"\1 _", text, flags=re.MULTILINE)
        for module, where in imported_modules(smk_python(text), path.relative_to(ROOT)).items():
            found.setdefault(module, where)
    local = {p.stem for folder in SOURCES for p in (ROOT / folder).rglob("*.py")}
    return {m: w for m, w in found.items()
            if m not in sys.stdlib_module_names and m not in FIRST_PARTY and m not in local and m != "__future__"}


def test_the_three_install_paths_declare_the_same_packages():
    txt, env, toml = requirements_txt(), environment_yml(), pyproject()
    assert txt == env, f"requirements.txt vs environment.yml: only in requirements.txt {sorted(txt - env)}, only in environment.yml {sorted(env - txt)}"
    assert txt == toml, f"requirements.txt vs pyproject.toml: only in requirements.txt {sorted(txt - toml)}, only in pyproject.toml {sorted(toml - txt)}"


def test_every_imported_package_is_declared_and_installed():
    declared = requirements_txt()
    providers = importlib.metadata.packages_distributions()
    undeclared, missing = [], []
    for module, where in sorted(project_imports().items()):
        dists = {norm(d) for d in providers.get(module, [])}
        if not dists:
            missing.append(f"{module} ({where})")
        elif not dists & declared:
            undeclared.append(f"{module} from {sorted(dists)} ({where})")
    assert not missing, f"imported but not installed in this environment: {missing}"
    assert not undeclared, f"imported but declared in no install file (requirements.txt, environment.yml, pyproject.toml): {undeclared}"


def test_the_scan_sees_the_packages_the_pipeline_is_built_on():
    # guards the scanner itself: if it stopped parsing, the test above would pass on nothing
    modules = project_imports()
    assert {"tensorflow", "numpy", "yaml", "snakemake", "soundfile", "phonemizer", "pyworld", "pytest"} <= set(modules)
    assert "pipeline" not in modules and "os" not in modules


@pytest.mark.parametrize("profile", sorted(p.parent.name for p in (ROOT / "profiles").glob("*/config.yaml")))
def test_every_profile_executor_is_installed_with_the_project(profile):
    settings = yaml.safe_load((ROOT / "profiles" / profile / "config.yaml").read_text())
    executor = settings.get("executor", "local")
    if executor in ("local", "dryrun", "touch"):  # built into Snakemake
        return
    plugin = f"snakemake-executor-plugin-{executor}"
    assert plugin in requirements_txt(), f"profiles/{profile} uses executor {executor!r}: {plugin} is in no install file"
    importlib.metadata.version(plugin)  # installed here, by those files


def test_the_commands_run_from_another_working_folder(tmp_path):
    # `cd my-project; python -m pipeline.speak ...` beside a run of one's own: "No module named 'pipeline'"
    # (install.sh installed the packages, not the checkout)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "pipeline.text", "--frontend", "characters", "Hello, there."],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0] == "hello, there."
    spec = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.__file__)"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    found = Path(spec.stdout.strip())
    assert (found.parent.parent / "Snakefile").is_file(), found  # a checkout's code, not a copy
    if found != ROOT / "pipeline" / "__init__.py":   # one environment, several checkouts: install.sh's last one
        pytest.skip(f"this environment's install is of the checkout at {found.parent.parent}; install.sh here to test this one")
