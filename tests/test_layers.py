"""The package graph points one way: every import in pgc_hvd/ goes down the layer table of
docs/architecture.md (parsed from there). Pure Python: reads the sources with ast, imports
nothing of the package, so it also sees imports inside functions (lazy imports)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pgc_hvd"
DOC = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([\w]+)`\s*\|[^|]*\|([^|]*)\|\s*$")
MODULE_NAME = re.compile(r"^pgc_hvd(\.\w+)+$")


def layer_table() -> dict[str, tuple[int, set[str]]]:
    """package -> (layer, the packages its "must never import" cell names)."""
    table = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            never = {x.strip().strip("`") for x in m.group(3).split(",") if x.strip()}
            table[m.group(2)] = (int(m.group(1)), never)
    return table


def package_of(module: str) -> str:
    """``pgc_hvd.sim.engine`` -> ``sim``; the top-level modules are their own packages
    (``pgc_hvd.options`` -> ``options``, ``pgc_hvd.__main__`` -> ``cli``); ``pgc_hvd`` itself
    is the package's face."""
    parts = module.split(".")
    if len(parts) == 1:
        return "pgc_hvd"
    return "cli" if parts[1] == "__main__" else parts[1]


def module_of(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_module(name: str, root: Path) -> bool:
    """Whether ``name`` (pgc_hvd.x.y) names a module or package of the sources under root."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every pgc_hvd module ``path`` imports anywhere in its body, and of
    every string constant that is a pgc_hvd module name (``cli.py``'s lazy command table)."""
    module = module_of(path, root)
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[:len(here) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # `from pgc_hvd import _C` imports the module pgc_hvd._C
            names = [f"{base}.{a.name}" for a in node.names] if base == "pgc_hvd" else [base]
            out += [(node.lineno, nm) for nm in names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and MODULE_NAME.match(node.value) and _is_module(node.value, root):
            out.append((node.lineno, node.value))
    return [(ln, m) for ln, m in out if m == "pgc_hvd" or m.startswith("pgc_hvd.")]


def violations() -> list[str]:
    table = layer_table()
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        src = package_of(module_of(path))
        for line, mod in imports(path):
            dst = package_of(mod)
            if dst == src:
                continue
            rel = path.relative_to(ROOT)
            if src not in table or dst not in table:
                bad.append(f"{rel}:{line}: {mod} ({src} -> {dst}): package not in the layer table")
            elif table[dst][0] >= table[src][0]:
                bad.append(f"{rel}:{line}: imports {mod}: {src} (layer {table[src][0]}) must "
                           f"never import {dst} (layer {table[dst][0]})")
    return bad


def test_the_layer_table_is_in_the_docs_and_consistent():
    table = layer_table()
    assert {"schemes", "sim", "runtime", "delays", "control", "apps"} <= set(table)
    for name, (layer, never) in table.items():
        expected = {q for q, (lq, _) in table.items() if lq >= layer and q != name}
        assert never == expected, (f"docs/architecture.md, row {name}: 'must never import' "
                                   f"should list the packages of layer >= {layer}: "
                                   f"{sorted(expected)}")


def test_every_package_is_in_the_layer_table():
    table = layer_table()
    found = {package_of(module_of(p)) for p in PKG.rglob("*.py")} | {"_C"}
    assert found <= set(table), f"packages missing from docs/architecture.md: {found - set(table)}"


def test_imports_point_down_the_layer_table():
    bad = violations()
    assert not bad, "imports against docs/architecture.md's layer table:\n" + "\n".join(bad)


@pytest.mark.parametrize("src, code, expected", [
    ("pgc_hvd/sim/x.py", "def f():\n    from pgc_hvd.runtime import agent\n", "runtime"),
    ("pgc_hvd/runtime/x.py", "from ..sim import engine\n", "sim"),
    ("pgc_hvd/ops/x.py", "from pgc_hvd import _C\n", "_C"),
    ("pgc_hvd/cli.py", "T = {('x',): ('pgc_hvd.apps.report', 'main')}\n", "apps"),
    ("pgc_hvd/runtime/y.py", "E = 'pgc_hvd.DistributedOptimizer'\n", None),
])
def test_the_checker_sees_lazy_relative_and_table_imports(tmp_path, src, code, expected):
    for name in ("pgc_hvd/__init__.py", "pgc_hvd/apps/__init__.py", "pgc_hvd/apps/report.py",
                 src):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code if name == src else "")
    found = [package_of(m) for _, m in imports(tmp_path / src, tmp_path)]
    assert found == ([] if expected is None else [expected])


def _module_graph(root: Path) -> dict:
    """module -> the package modules it imports (at the top or inside a function); an import of
    a name from an ancestor package (``from pgc_hvd import _C``) is not an edge: a module's
    parents are imported before it anyway."""
    mods = {}
    for p in (root / "pgc_hvd").rglob("*.py"):
        rel = p.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts)] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    if sub in mods:
                        graph[m].add(sub)
                    elif node.module in mods and not m.startswith(node.module + "."):
                        graph[m].add(node.module)
            elif isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names if a.name in mods)
        graph[m].discard(m)
    return graph


def import_circles(root: Path) -> list:
    """The strongly connected sets of more than one module (Tarjan)."""
    graph, index, low, stack, on, out = _module_graph(root), {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_the_package():
    """No module imports (even lazily, inside a function) a module that imports it back,
    directly or through others (agent -> channel -> control_log -> agent was one)."""
    assert import_circles(ROOT) == []


def test_the_circle_check_finds_a_circle(tmp_path):
    pkg = tmp_path / "pgc_hvd"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pgc_hvd.b import x\n")
    (pkg / "b.py").write_text("def x():\n    from pgc_hvd import c\n")
    (pkg / "c.py").write_text("import pgc_hvd.a\n")
    assert import_circles(tmp_path) == [["pgc_hvd.a", "pgc_hvd.b", "pgc_hvd.c"]]
