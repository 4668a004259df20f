"""Sizes a newcomer can read: no class in ``pgc_hvd/`` over about 450 lines, the runtime's
facade (``runtime/optimizer.py``) at most about 600, and every part split out of the engines
opening with what it owns and what it may import (issue 23; docs/architecture.md, "The
runtime's parts"). Pure Python: reads the sources with ast, as ``test_private_state.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_CLASS_LINES = 450
MAX_OPTIMIZER_LINES = 600

#: the parts of the two engines (and the shared message encoder): each module's docstring says
#: what it owns and what it may import
PARTS = [f"pgc_hvd/runtime/{m}.py" for m in (
    "agent", "arrivals", "capture", "communicator", "config", "distributed", "faults",
    "closing", "elastic_checkpoint", "gloo_cascade", "interop", "lifecycle", "optim_state",
    "planner", "replica_check", "replica_rng",
    "sender", "step_records",
    "updates")] + [f"pgc_hvd/sim/{m}.py" for m in (
        "agents", "log_agents", "log_costs", "progress", "step_records", "workers")] + ["pgc_hvd/compress/message.py"]


def class_lengths(root: Path = ROOT) -> list[tuple[int, str]]:
    """(lines, "path:Class") of every class in ``root/pgc_hvd``, longest first."""
    out = []
    for path in sorted((root / "pgc_hvd").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out.append((node.end_lineno - node.lineno + 1,
                            f"{path.relative_to(root)}:{node.name}"))
    return sorted(out, reverse=True)


def test_no_class_is_over_450_lines():
    big = [f"{name}: {lines} lines" for lines, name in class_lengths() if lines > MAX_CLASS_LINES]
    assert not big, (f"classes over {MAX_CLASS_LINES} lines (split them by job, "
                     f"docs/architecture.md):\n" + "\n".join(big))


def test_the_optimizer_facade_is_at_most_600_lines():
    lines = len((ROOT / "pgc_hvd/runtime/optimizer.py").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_OPTIMIZER_LINES, (
        f"pgc_hvd/runtime/optimizer.py has {lines} lines: the facade delegates to its parts; "
        f"move a job into a part of its own")


@pytest.mark.parametrize("path", PARTS)
def test_each_part_says_what_it_owns_and_may_import(path):
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8"))) or ""
    assert "May import" in doc, f"{path}: its docstring must say what it may import"


def test_the_checker_sees_a_long_class(tmp_path):
    (tmp_path / "pgc_hvd").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES + 1))
    (tmp_path / "pgc_hvd" / "m.py").write_text(f"class Big:\n{body}\n")
    (lines, name), = class_lengths(tmp_path)
    assert lines == MAX_CLASS_LINES + 2 and name.endswith("m.py:Big")
