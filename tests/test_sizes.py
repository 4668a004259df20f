"""Parts a newcomer can find, read in one sitting and trust (docs/architecture.md, "The
runtime's parts"): no module of ``pgc_hvd/`` over :data:`MAX_MODULE_LINES` lines and no class
over :data:`MAX_CLASS_LINES` (every module and class, no exceptions list); every part opens
with what it owns and what it may import -- every runtime module (``pgc_hvd/runtime/``, its
subpackages included, walked, no list) also on which thread its code runs, and its "May
import:" is checked against its real imports --, and every runtime part
(``pgc_hvd/runtime/*.py``) is imported by a unit test of its own -- a ``tests/**/test_*.py``
that runs in the pytest process, not only through a horovodrun script -- so a part is never
covered only indirectly. (No import circle: tests/test_layers.py; no cross-module private read:
tests/test_private_state.py.) Pure Python: reads the sources with ast."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the simulator's parts and the shared message encoder: each module's docstring says what it
#: owns and what it may import (every runtime module is walked instead, with its thread:
#: :func:`missing_statements`)
PARTS = [
    f"pgc_hvd/sim/{m}.py" for m in (
        "agents", "log_agents", "log_costs", "progress", "step_records", "workers")] + [
    "pgc_hvd/compress/codecs.py", "pgc_hvd/compress/encoder.py"]

#: a module a newcomer reads in one sitting: at most this many lines, every module of pgc_hvd/
MAX_MODULE_LINES = 600
#: and at most this many lines a class (nested classes included)
MAX_CLASS_LINES = 400


def oversized(root: Path = ROOT) -> list[str]:
    """Every module of ``root/pgc_hvd`` over :data:`MAX_MODULE_LINES` lines and every class
    over :data:`MAX_CLASS_LINES` (its ``class`` line to its last line), as readable lines."""
    out = []
    for path in sorted((root / "pgc_hvd").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{rel}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    out.append(f"{rel}:{node.lineno}: class {node.name} is {size} lines (at "
                               f"most {MAX_CLASS_LINES})")
    return out


def test_every_module_and_class_reads_in_one_sitting():
    big = oversized()
    assert not big, (
        "split by responsibility, not by line count, and move what a steady-state step does "
        "not run (tests/runtime/test_step_path.py pins the modules a step enters):\n"
        + "\n".join(big))


def test_the_size_check_sees_a_long_module_and_a_long_class(tmp_path):
    pkg = tmp_path / "pgc_hvd" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "short.py").write_text('"""x"""\n\n\nclass A:\n    x = 1\n')
    (pkg / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    inner = "".join(f"        x{i} = {i}\n" for i in range(MAX_CLASS_LINES))
    (pkg / "wide.py").write_text("class Outer:\n    class Inner:\n" + inner)
    big = oversized(tmp_path)
    assert len(big) == 3 and "long.py: 601 lines" in big[0], big
    assert "class Outer" in big[1] and "class Inner" in big[2], big


def runtime_parts(root: Path = ROOT) -> list[str]:
    return sorted(p.stem for p in (root / "pgc_hvd" / "runtime").glob("*.py")
                  if p.stem != "__init__")


def unit_tested(root: Path = ROOT) -> dict[str, list[str]]:
    """``{runtime module: [test files that import it]}`` over ``tests/**/test_*.py``: ``import
    pgc_hvd.runtime.M``, ``from pgc_hvd.runtime.M import ...`` or ``from pgc_hvd.runtime import
    M``."""
    found: dict[str, list[str]] = {}
    for path in sorted((root / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[2] for a in node.names
                          if a.name.startswith("pgc_hvd.runtime.")}
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("pgc_hvd.runtime."):
                    names.add(node.module.split(".")[2])
                elif node.module == "pgc_hvd.runtime":
                    names |= {a.name for a in node.names}
        for name in names:
            found.setdefault(name, []).append(str(path.relative_to(root)))
    return found


@pytest.mark.parametrize("path", PARTS)
def test_each_part_says_what_it_owns_and_may_import(path):
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8"))) or ""
    assert "May import" in doc, f"{path}: its docstring must say what it may import"


#: what every runtime module's docstring states (docs/architecture.md, "The runtime's parts"):
#: a sentence starting "Owns" (what it owns: classes, state, responsibility; "Owns no state:
#: ..." for one that keeps none), "Thread:" or "Threads:" (the training thread, the agent
#: thread, rank 0's log reader, any thread, import time only, ...) and "May import:"
STATEMENTS = {"Owns": re.compile(r"\bOwns\b"),
              "Thread: / Threads:": re.compile(r"\bThreads?:"),
              "May import:": re.compile(r"May import:")}


def runtime_modules(root: Path = ROOT) -> list[Path]:
    """Every module of ``root/pgc_hvd/runtime``, its subpackages' included (the folder walked:
    a new module is in it the moment it exists)."""
    return sorted((root / "pgc_hvd" / "runtime").rglob("*.py"))


def missing_statements(root: Path = ROOT) -> list[str]:
    """Every runtime module whose docstring lacks one of :data:`STATEMENTS`, as readable
    lines (``pgc_hvd/runtime/x.py: no 'Owns' line``)."""
    bad = []
    for path in runtime_modules(root):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path))) or ""
        for what, pattern in STATEMENTS.items():
            if not pattern.search(doc):
                bad.append(f"{path.relative_to(root)}: no '{what}' line in its docstring")
    return bad


def test_every_runtime_module_says_what_it_owns_its_thread_and_may_import():
    bad = missing_statements()
    assert not bad, (
        "every runtime module's docstring says what it owns ('Owns ...'), on which thread(s) its "
        "code runs ('Thread:' / 'Threads:') and what it may import ('May import:'); read the "
        "code and its callers, and write what is true (runtime/control_log.py, "
        "runtime/agent.py):\n" + "\n".join(bad))


def test_the_docstring_check_sees_a_module_without_a_statement(tmp_path):
    run = tmp_path / "pgc_hvd" / "runtime"
    (run / "sub").mkdir(parents=True)
    full = '"""X.\n\nOwns the x. Thread: the agent thread.\nMay import: torch."""\n'
    (run / "__init__.py").write_text(full)
    (run / "a.py").write_text('"""A.\n\nOwns no state. Threads: any.\nMay import: numpy."""\n')
    (run / "b.py").write_text('"""B.\n\nIt owns the b; runs on the agent thread.\n\n'
                              'May import: torch."""\n')
    (run / "sub" / "__init__.py").write_text(full)
    (run / "sub" / "c.py").write_text("x = 1\n")
    assert [p.relative_to(tmp_path).as_posix() for p in runtime_modules(tmp_path)] == [
        "pgc_hvd/runtime/__init__.py", "pgc_hvd/runtime/a.py", "pgc_hvd/runtime/b.py",
        "pgc_hvd/runtime/sub/__init__.py", "pgc_hvd/runtime/sub/c.py"]
    assert missing_statements(tmp_path) == [
        "pgc_hvd/runtime/b.py: no 'Owns' line in its docstring",
        "pgc_hvd/runtime/b.py: no 'Thread: / Threads:' line in its docstring",
        "pgc_hvd/runtime/sub/c.py: no 'Owns' line in its docstring",
        "pgc_hvd/runtime/sub/c.py: no 'Thread: / Threads:' line in its docstring",
        "pgc_hvd/runtime/sub/c.py: no 'May import:' line in its docstring"]


def test_every_runtime_part_has_a_unit_test_of_its_own():
    tested = unit_tested()
    missing = [m for m in runtime_parts() if m not in tested]
    assert not missing, (
        f"runtime parts no unit test imports: {missing}. Add tests/runtime/test_<part>.py that "
        f"runs the part in the pytest process (a world of one rank, LoopbackChannel: "
        f"tests/runtime/test_step.py), with the edge cases its horovodrun tests cover")


def test_the_checker_sees_a_part_without_a_unit_test(tmp_path):
    (tmp_path / "pgc_hvd" / "runtime").mkdir(parents=True)
    (tmp_path / "tests" / "runtime").mkdir(parents=True)
    for m in ("a", "b", "c", "__init__"):
        (tmp_path / "pgc_hvd" / "runtime" / f"{m}.py").write_text('"""x"""\n')
    (tmp_path / "tests" / "runtime" / "test_a.py").write_text(
        "from pgc_hvd.runtime.a import X\nfrom pgc_hvd.runtime import b\n")
    (tmp_path / "tests" / "runtime" / "c_checks.py").write_text(
        "import pgc_hvd.runtime.c\n")   # a horovodrun script is no unit test
    assert runtime_parts(tmp_path) == ["a", "b", "c"]
    assert sorted(unit_tested(tmp_path)) == ["a", "b"]


# -- "May import:" against the real imports, for every runtime module ----------------------
def _is_module(root: Path, dotted: str) -> bool:
    """Whether ``dotted`` (relative to pgc_hvd, ``runtime.agent``) is a module or package."""
    path = root.joinpath("pgc_hvd", *dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _package(root: Path, path: Path) -> list[str]:
    """The package a module's relative imports start from, as parts below pgc_hvd."""
    parts = list(path.relative_to(root / "pgc_hvd").with_suffix("").parts)
    return parts[:-1]


def real_imports(root: Path, path: Path) -> set[str]:
    """The pgc_hvd modules and packages ``path`` imports anywhere (lazily too), relative to
    pgc_hvd: ``from pgc_hvd.runtime import consistency`` is ``runtime.consistency``, ``from
    pgc_hvd.schemes import Ring`` is ``schemes``."""
    out: set[str] = set()
    pkg = _package(root, path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name[len("pgc_hvd."):] for a in node.names
                    if a.name.startswith("pgc_hvd.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[:len(pkg) - node.level + 1] + (node.module or "").split(".")
            elif node.module and node.module.split(".")[0] == "pgc_hvd":
                base = node.module.split(".")[1:]
            else:
                continue
            base = [b for b in base if b]
            for a in node.names:
                sub = ".".join(base + [a.name])
                out.add(sub if _is_module(root, sub) else ".".join(base))
    return {m for m in out if m}


def may_import(root: Path, path: Path):
    """The pgc_hvd modules and packages the docstring's "May import:" paragraph names
    (````x````, ``:mod:`x```, ``:mod:`pgc_hvd.x```, ``:mod:`.x```; other words -- torch, the
    standard library, a class in passing -- are not modules and are left out); None when the
    docstring has no such paragraph."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    m = re.search(r"May import:?(.*?)(?:\n\s*\n|\Z)", doc, re.S)
    if m is None:
        return None
    names = set()
    for a, b in re.findall(r"``([^`]+)``|:mod:`~?([^`]+)`", m.group(1)):
        name = (a or b).strip()
        if name.startswith("pgc_hvd."):
            name = name[len("pgc_hvd."):]
        elif name.startswith("."):
            name = ".".join(_package(root, path)) + name
        if _is_module(root, name):
            names.add(name)
    return names


def import_mismatches(root: Path = ROOT) -> list[str]:
    """Every runtime module whose "May import:" is missing, leaves out a pgc_hvd module it
    imports, or names one it does not import (a name covers its submodules)."""
    bad = []
    for path in runtime_modules(root):
        rel = path.relative_to(root)
        may = may_import(root, path)
        if may is None:
            bad.append(f"{rel}: no 'May import:' in its docstring")
            continue
        real = real_imports(root, path)
        covers = lambda e, i: i == e or i.startswith(e + ".")   # noqa: E731
        missing = sorted(i for i in real if not any(covers(e, i) for e in may))
        stale = sorted(e for e in may if not any(covers(e, i) for i in real))
        if missing:
            bad.append(f"{rel}: imports {missing}, which its 'May import:' does not name")
        if stale:
            bad.append(f"{rel}: its 'May import:' names {stale}, which it does not import")
    return bad


def test_every_runtime_modules_may_import_is_what_it_imports():
    bad = import_mismatches()
    assert not bad, "\n".join(bad)


def test_the_may_import_check_sees_a_missing_and_a_stale_name(tmp_path):
    run = tmp_path / "pgc_hvd" / "runtime"
    run.mkdir(parents=True)
    for m in ("__init__", "errors", "rows", "agent"):
        (run / f"{m}.py").write_text('"""x.\n\nMay import: the standard library."""\n')
    (tmp_path / "pgc_hvd" / "__init__.py").write_text("")
    (run / "agent.py").write_text(
        '"""The agent.\n\nMay import: ``runtime.rows``, :mod:`pgc_hvd.runtime.errors` '
        '(``AgentError``), torch."""\n'
        "from pgc_hvd.runtime import rows\n\n\ndef f():\n    from . import errors\n")
    assert import_mismatches(tmp_path) == []
    (run / "agent.py").write_text('"""The agent.\n\nMay import: ``runtime.rows``."""\n'
                                  "from pgc_hvd.runtime.errors import AgentError\n")
    (run / "rows.py").write_text('"""Rows."""\n')
    assert import_mismatches(tmp_path) == [
        "pgc_hvd/runtime/agent.py: imports ['runtime.errors'], which its 'May import:' does "
        "not name",
        "pgc_hvd/runtime/agent.py: its 'May import:' names ['runtime.rows'], which it does not "
        "import",
        "pgc_hvd/runtime/rows.py: no 'May import:' in its docstring"]
