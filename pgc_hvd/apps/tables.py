"""Markdown tables of the applications' results (experiments, reports): one writer, the cells
formatted by the caller."""

from __future__ import annotations

import math
import sys
from typing import Iterable, Sequence

import numpy as np


def write_experiment(out, title: str, summary: dict, table_md: str, wall: float,
                     command: str | None = None) -> None:
    """An experiment's ``summary.json`` and ``table.md`` (title, the command when given, the
    tables, the wall time) in folder ``out``."""
    import json
    from pgc_hvd.metrics.records import to_jsonable
    (out / "summary.json").write_text(json.dumps(to_jsonable(summary), indent=1))
    cmd = f"command: `{command}`\n\n" if command else ""
    (out / "table.md").write_text(f"# {title}\n\n{cmd}{table_md}\n\nwall time {wall:.1f} s\n")


def log(msg: str) -> None:
    """A progress line on stderr (the tables go to stdout and files)."""
    print(msg, file=sys.stderr, flush=True)


def fmt(v, nd: int = 3) -> str:
    """A cell: ``-`` for None, floats to ``nd`` significant digits (``%.3e`` from 1e4 on)."""
    if v is None:
        return "-"
    if isinstance(v, float):
        if not np.isfinite(v):
            return str(v)
        return f"{v:.{nd}g}" if abs(v) < 1e4 else f"{v:.3e}"
    return str(v)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """``| h1 | h2 |``, ``|---|---|``, then one ``| c1 | c2 |`` line per row of cells."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(out)


def table(rows, cols) -> str:
    """``cols`` = [(header, key)]: one line per row dict, cells ``fmt(row.get(key))``."""
    return markdown_table([c for c, _ in cols], [[fmt(r.get(k)) for _, k in cols] for r in rows])


def seed_stats(vals) -> dict:
    """median and the 2.5 / 97.5 percentiles (nearest seeds) of ``vals``; None -> inf."""
    v = sorted(math.inf if x is None else float(x) for x in vals)
    if not v:
        return {"median": None, "lo": None, "hi": None}
    k = len(v)
    med = v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])
    lo = v[max(0, int(math.floor(0.025 * (k - 1))))]
    hi = v[min(k - 1, int(math.ceil(0.975 * (k - 1))))]
    return {"median": med, "lo": lo, "hi": hi}


def interval(st) -> str:
    """A cell of :func:`seed_stats`: ``median [lo, hi]`` (the median alone without an interval;
    ``-`` for none)."""
    if not st:
        return "-"
    if st.get("lo") is None:
        return fmt(st.get("median"))
    return f"{fmt(st['median'])} [{fmt(st['lo'])}, {fmt(st['hi'])}]"
