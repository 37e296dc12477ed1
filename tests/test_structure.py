"""The layout holds what the README's architecture says: the core names no framework, its packages import
one way, and no file or function outgrows a reader (xp/ files ~400 lines, functions ~60)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
XP = ROOT / "xp"
FRAMEWORK_PARTS = ("mx", "pt")  # xp/mx and xp/pt: each framework beside xp's core
# what the core may not name in code (strings, names, imports; docstrings and comments may)
FRAMEWORKS = re.compile(r"mxnet|gluoncv|horovod|torch|DMLC_|MXNET_|NCCL_", re.I)
# Optuna's GP sampler needs the torch package: the study checks Optuna's own dependency, not a framework xp
# trains with
ALLOWED = {("xp/studies/study.py", "torch"),
           # the plugin API's one list of the frameworks a network's factories are given for (xp.plugin.Network)
           ("xp/plugin.py", "mxnet"), ("xp/plugin.py", "torch")}
# what code of xp/ outside xp/launching may not name: the launchers (xp's and Hydra's); placement is theirs
LAUNCHERS = re.compile(r"\b(ssh|slurm|submitit\w*|joblib|ray)\b", re.I)
# horovodrun starts its workers with a program called ssh: xp's engine puts the launcher's transport there
LAUNCHER_ALLOWED = {("xp/mx/horovodrun.py", "ssh")}
# packages, lowest first: each imports only those before it (xp/__init__'s `shipped` is everybody's)
LAYERS = ("errors", "states", "confkeys", "processes", "wire", "interrupts", "plugin", "models", "data", "storefiles", "results", "answers", "tracking", "readback", "trackingd", "studies", "run", "launching", "mx", "pt")


def core_files() -> list[Path]:
    return [f for f in sorted(XP.rglob("*.py")) if f.relative_to(XP).parts[0] not in FRAMEWORK_PARTS]


def docstring_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def framework_names(path: Path, names: re.Pattern = FRAMEWORKS, allowed: set = ALLOWED) -> list[str]:
    tree = ast.parse(path.read_text())
    docs, found = docstring_lines(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            words = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or "", *(a.name for a in node.names)]
            words = [w for w in words if not w.startswith("xp.")]  # xp's own framework parts are named by path
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno not in docs:
            words = [node.value]
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        else:
            continue
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        for w in words:
            for m in names.finditer(w):
                if (rel, m.group(0).lower()) not in allowed:
                    found.append(f"{rel}:{node.lineno}: {m.group(0)} in {w[:60]!r}")
    return found


def test_the_core_names_no_framework():
    found = [hit for f in core_files() for hit in framework_names(f)]
    assert found == [], "\n".join(found)


def test_the_check_sees_a_framework_named_in_code(tmp_path):
    """The scan above can fail: a core file that imports MXNet or lists DMLC_ variables is caught."""
    bad = tmp_path / "core_module.py"
    bad.write_text('"""Docstrings may say mxnet."""\nimport mxnet\nFORWARD = ("DMLC_",)\n')
    assert [h.split(": ", 1)[1] for h in framework_names(bad)] == ["mxnet in 'mxnet'", "DMLC_ in 'DMLC_'"]


def test_no_launcher_is_named_outside_the_launchers():
    """Where a study's trials or a job's processes run is the launchers' decision (xp/launching): the rest of xp
    asks them, and matches no launcher's name (ssh, slurm, Hydra's submitit and joblib, ray) in code."""
    files = [f for f in sorted(XP.rglob("*.py")) if f.relative_to(XP).parts[0] != "launching"]
    found = [hit for f in files for hit in framework_names(f, LAUNCHERS, LAUNCHER_ALLOWED)]
    assert found == [], "\n".join(found)
    assert framework_names(Path(__file__), LAUNCHERS, set()) != []  # the check can fail: this file names them


def imports_of(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("xp."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "xp":
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("xp."))
    return out


def test_packages_import_one_way():
    wrong = []
    for f in sorted(XP.rglob("*.py")):
        part = f.relative_to(XP).parts[0].removesuffix(".py")
        if part not in LAYERS:
            continue  # the entry points (cli, preflight, dispatch) and the commands sit on top
        below = set(LAYERS[:LAYERS.index(part) + 1]) | {"shipped"}
        wrong += [f"{f.relative_to(ROOT)} imports xp.{m}" for m in imports_of(f) - below]
    assert wrong == [], "\n".join(wrong)


def test_no_file_or_function_outgrows_a_reader():
    long_files = [f"{f.relative_to(ROOT)}: {n} lines" for f in sorted(XP.rglob("*.py"))
                  if (n := len(f.read_text().splitlines())) > 400]
    long_functions = []
    for f in sorted(XP.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name}: "
                                      f"{node.end_lineno - node.lineno + 1} lines")
    assert long_files == [] and long_functions == [], "\n".join(long_files + long_functions)


STATES = ("RUNNING", "FINISHED", "FAILED", "KILLED", "SCHEDULED", "WAITING", "COMPLETE", "PRUNED", "FAIL", "STOPPED",
          "PENDING", "COMPLETING", "COMPLETED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
          "BOOT_FAIL", "DEADLINE", "UNKNOWN")
STATE_ALLOWED = {("xp/check.py", "FAIL")}  # the check table's verdict column ("ok" or "FAIL"), not a state


def state_literals(path: Path) -> list[str]:
    """String constants of `path` that are a state (a whole constant, or quoted inside one: an MLflow filter's
    'RUNNING'), docstrings left out."""
    tree = ast.parse(path.read_text())
    docs, found = docstring_lines(tree) | enum_lines(tree), []
    quoted = re.compile(r"'(%s)'" % "|".join(STATES))
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno not in docs:
            words = [node.value] if node.value in STATES else quoted.findall(node.value)
            found += [f"{rel}:{node.lineno}: {w!r}" for w in words if (rel, w) not in STATE_ALLOWED]
    return found


def enum_lines(tree: ast.AST) -> set[int]:
    """The lines of the enums' own definitions (class X(StrEnum)): where a state is spelled once."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any(ast.unparse(b).endswith("Enum") for b in node.bases)
            for n in range(node.lineno, node.end_lineno + 1)}


def test_states_are_spelled_only_in_their_enums():
    """A run's, a trial's or an ending's state is a member of xp.states (StrEnums whose values are MLflow's and
    Optuna's strings), a Slurm job's one of xp.launching.slurm.SlurmState: never a string literal elsewhere."""
    found = [line for f in sorted(XP.rglob("*.py")) for line in state_literals(f)]
    assert found == [], "\n".join(found)


def test_the_state_check_sees_a_literal(tmp_path):
    code = tmp_path / "code.py"
    code.write_text('"""RUNNING in a docstring is prose."""\nx = "KILLED"\nq = "attributes.status = \'RUNNING\'"\n'
                    'said = "the run FAILED"\nclass S(StrEnum):\n    FAIL = "FAIL"\n')
    assert state_literals(code) == ["code.py:2: 'KILLED'", "code.py:3: 'RUNNING'"]


@pytest.fixture(scope="module")
def mypy_said(tmp_path_factory) -> str:
    """mypy, once, over xp/ as pyproject.toml's [tool.mypy] says and over the benchmarks/ scripts that call it (a
    fresh cache, as CI has; about 10 s of CPU)."""
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").glob("*.py"))
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path_factory.mktemp("mypy")),
                        "--explicit-package-bases", "--show-error-codes", "xp", *scripts], cwd=ROOT,
                       env={**os.environ, "MYPYPATH": str(ROOT / "benchmarks")}, capture_output=True, text=True,
                       timeout=900)
    assert re.search(r"^(Found \d+ errors? in|Success:)", r.stdout, re.M), r.stdout[-3000:] + r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow
def test_the_type_checker_is_green(mypy_said):
    """mypy on xp/ as pyproject.toml's [tool.mypy] says (strict on the modules of the placement, states and the
    run's path), every module of xp/ checked (none set aside with ignore_errors): no error."""
    import tomllib

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["xp"]
    set_aside = [o["module"] for o in mypy.get("overrides", []) if o.get("ignore_errors")]
    assert not set_aside, f"modules not type-checked: {set_aside}"
    errors = [line for line in mypy_said.splitlines() if line.startswith("xp/") and " error: " in line]
    assert not errors, "\n".join(errors)


@pytest.mark.slow
def test_the_benchmarks_call_xp_as_it_is_now(mypy_said):
    """A benchmark that calls xp as xp no longer is fails here, not on the day its figure is needed (the bare
    10-trial study called build_net without the input shape for eight stops; gpu_decode_parts.py imported a class
    that had moved): its wrong calls and the names of xp it asks for that xp does not have. (The scripts' own
    looser typing is theirs: only these two kinds of error count.)"""
    stale = [line for line in mypy_said.splitlines() if line.startswith("benchmarks/")
             and ("[call-arg]" in line or re.search(r'Module "xp[\w.]*" has no attribute', line))]
    assert not stale, "\n".join(stale)


def test_every_package_of_xp_is_in_the_wheel():
    """A package missing from pyproject's list installs as nothing: an installed xp fails at its first import."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(f.parent.relative_to(ROOT).parts) for f in XP.rglob("__init__.py")
             if "conf" not in f.parts and "sweeps" not in f.parts}
    assert found - listed == set(), found - listed
