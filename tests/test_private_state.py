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


# -- every single-underscore member, not only _pgc_ ----------------------------------------
def _owned_private(tree) -> set:
    """The private names a module owns: its functions and classes, module-level names, and the
    attributes it sets on ``self`` / ``cls``."""
    owned = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            owned.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            owned.add(node.attr)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Name):
                    owned.add(t.id)
    return {n for n in owned if n.startswith("_") and not n.startswith("__")}


def foreign_private_uses(root: Path = ROOT) -> list[str]:
    """``x._name`` read or written in a module of ``pgc_hvd/`` where ``_name`` is owned by another
    module of the package and not by this one; ``self`` / ``cls`` members (a subclass using its
    base's) and ``_pgc_`` names (the test above) are left out."""
    files = sorted((root / "pgc_hvd").rglob("*.py"))
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in files}
    owned = {p: _owned_private(t) for p, t in trees.items()}
    owners: dict = {}
    for p, names in owned.items():
        for n in names:
            owners.setdefault(n, []).append(p)
    bad = []
    for p, tree in trees.items():
        # names bound to other libraries' modules (``torch._check`` is torch's business)
        foreign = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
                   if isinstance(node, ast.Import) for a in node.names
                   if not a.name.startswith("pgc_hvd")}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and not node.attr.startswith("_pgc_")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in foreign:
                continue
            if node.attr in owned[p] or node.attr not in owners:
                continue
            where = ", ".join(str(o.relative_to(root)) for o in owners[node.attr][:2])
            bad.append(f"{p.relative_to(root)}:{node.lineno}: uses {ast.unparse(node)[:40]}, "
                       f"private to {where}: use (or add) the owner's public member")
    return bad


def test_no_module_uses_another_modules_private_members():
    bad = foreign_private_uses()
    assert not bad, "private members used outside their module:\n" + "\n".join(bad)


def test_the_private_member_check_catches_a_read(tmp_path):
    pkg = tmp_path / "pgc_hvd"
    pkg.mkdir()
    (pkg / "a.py").write_text("class A:\n    def __init__(self):\n        self._hidden = 1\n")
    (pkg / "b.py").write_text("def peek(a):\n    a._round = 2\n    return a._hidden\n")
    (pkg / "c.py").write_text("class C:\n    def run(self):\n        self._round = 0\n")
    bad = foreign_private_uses(tmp_path)
    assert len(bad) == 2 and all("b.py" in b for b in bad), bad


#: a part's flags that other parts read but only the owner writes (through the owner's methods)
OWNED_FLAGS = {"started": "pgc_hvd/runtime/step.py",           # Step.start()
               "update_in_grad": "pgc_hvd/runtime/capture.py"}  # update_loaded / update_applied


def attribute_writes(path: Path):
    """[(line, attribute name)] of every ``x.attr = ...`` (and ``+=``) in ``path`` whose ``x``
    is another object than ``self`` (a class's own attribute of that name is its own)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out = []
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for t in targets:
            for tt in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(tt, ast.Attribute) and not (
                        isinstance(tt.value, ast.Name) and tt.value.id == "self"):
                    out.append((node.lineno, tt.attr))
    return out


def test_flags_are_written_by_their_owners_only():
    """``Step.started`` and ``GradientCapture.update_in_grad`` are written in their own modules
    (the facade, close and the tests call ``Step.start()``, ``capture.update_loaded()`` /
    ``update_applied()``), so one part says when its state changes."""
    bad = [f"{path.relative_to(ROOT)}:{line}: .{attr} written outside {OWNED_FLAGS[attr]}"
           for path in _files() for line, attr in attribute_writes(path)
           if attr in OWNED_FLAGS and path.relative_to(ROOT).as_posix() != OWNED_FLAGS[attr]]
    assert not bad, "\n".join(bad)
