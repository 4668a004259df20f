"""No module reads another module's ``_pgc_*`` state: the optimizer's parts, elastic,
checkpoint, the tests and the benchmarks use public, documented members instead
(docs/architecture.md, "The runtime's parts"). Pure Python: reads the sources with ast.

A ``_pgc_`` name is *defined* by a module that assigns it (``x._pgc_y = ...``) or defines a
function of that name; reading it (``x._pgc_y`` in a load) anywhere else fails."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pgc_hvd", "tests", "benchmarks", "launch")


def _files(root: Path = ROOT):
    for top in SOURCES:
        yield from sorted((root / top).rglob("*.py"))


def definitions_and_reads(path: Path):
    """(names this file defines, [(line, name) it reads]) of ``_pgc_`` attributes."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    defined, reads = set(), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("_pgc_"):
            defined.add(node.name)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_pgc_"):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                defined.add(node.attr)
            else:
                reads.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith("_pgc_") and node.value.isidentifier():
            reads.append((node.lineno, node.value))   # getattr(opt, "_pgc_x")
    return defined, reads


def foreign_reads(root: Path = ROOT) -> list[str]:
    bad = []
    for path in _files(root):
        if path.resolve() == Path(__file__).resolve():
            continue   # this checker names the prefix itself
        defined, reads = definitions_and_reads(path)
        for line, name in reads:
            if name not in defined:
                bad.append(f"{path.relative_to(root)}:{line}: reads {name}, which this module "
                           f"does not define: use the owner's public member")
    return bad


def test_no_module_reads_another_modules_pgc_state():
    bad = foreign_reads()
    assert not bad, "private _pgc_ state read outside its module:\n" + "\n".join(bad)


@pytest.mark.parametrize("code, found", [
    ("def f(opt):\n    return opt._pgc_timeout\n", True),
    ("def f(opt):\n    return getattr(opt, '_pgc_config', None)\n", True),
    ("class A:\n    def __init__(self):\n        self._pgc_x = 1\n"
     "    def g(self):\n        return self._pgc_x\n", False),
    ("def f(loader, me):\n    loader._pgc_bound = me\n    return loader._pgc_bound\n", False),
])
def test_the_checker_sees_foreign_reads(tmp_path, code, found):
    (tmp_path / "pgc_hvd").mkdir()
    (tmp_path / "pgc_hvd" / "m.py").write_text(code)
    assert bool(foreign_reads(tmp_path)) == found
