"""Decode-quality report: ||a_I||_1, residual and decode time per code.

    pgc-hvd report codes --n 100 --stragglers 20,24 [--patterns 200] [--seed 0] [--codes ...]

A code is a name, optionally with integer options: ``rs:stride=1`` is the Reed-Solomon code on
consecutive evaluation points (see :mod:`pgc_hvd.codes.reed_solomon`).

For each code and s, sample straggler patterns as uniformly random arrival
orders of the n workers. Binary codes (fr, gfrc, bcgc) feed the arrivals one
by one to the streaming first-complete decoder (the BCGC paper's decoder; FRC
and GFRC in their strict class mode, as in its Table II); real and complex codes
solve a_I B_I = 1 for the first n - s arrivals I (cache bypassed, so every solve
is timed). Reported: mean and max of ||a_I||_1, mean and max residual
||a_I B_I - 1||_2, and mean and max decode time.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from pgc_hvd.options import parse_options

from pgc_hvd.codes.registry import CODES, get_code

DEFAULT_CODES = ("bcgc", "gfrc", "fr", "gmds", "cr", "rs", "rs:stride=1", "cyclic-mds")


@dataclass
class CodeFigures:
    code: str
    n: int
    s: int
    patterns: int
    norm1_mean: float
    norm1_max: float
    residual_mean: float
    residual_max: float
    time_mean_s: float
    time_max_s: float
    note: str = ""


def parse_code_spec(spec: str) -> tuple[str, dict]:
    """``"rs:stride=1"`` -> ``("rs", {"stride": 1})``; ``"bcgc"`` -> ``("bcgc", {})``.

    Options follow the name, each after a colon: ``name:key=value:key=value``."""
    name, *opts = spec.split(":")
    return name.strip(), parse_options(opts, f"code option in {spec!r}:")


def measure(name: str, n: int, s: int, patterns: int = 200, seed: int = 0) -> Optional[CodeFigures]:
    """Figures for one code spec (``name`` or ``name:key=value``), with a note when the code
    does not exist for (n, s)."""
    try:
        base, options = parse_code_spec(name)
        code = get_code(base, n, s, **options)
    except ValueError as err:
        return CodeFigures(name, n, s, 0, *([float("nan")] * 6), note=str(err).split(";")[0])
    rng = np.random.default_rng(seed)
    norms, residuals, times = [], [], []
    for _ in range(patterns):
        order = [int(i) for i in rng.permutation(n)]
        if code.is_binary:
            t0 = time.perf_counter()
            dec = code.decoder("class")
            for i in order:
                if dec.offer(i) is not None:
                    break
            a = dec.vector()
            t1 = time.perf_counter()
            residuals.append(float(np.linalg.norm(a @ code.B - 1)))
            norms.append(float(a.sum()))
        else:
            I = order[: n - s]
            t0 = time.perf_counter()
            res = code.solver.solve_uncached(tuple(sorted(I)))
            t1 = time.perf_counter()
            norms.append(res.norm1)
            residuals.append(res.residual)
        times.append(t1 - t0)
    return CodeFigures(name, n, s, patterns, float(np.mean(norms)), float(np.max(norms)),
                       float(np.mean(residuals)), float(np.max(residuals)),
                       float(np.mean(times)), float(np.max(times)))


def format_table(rows: Sequence[CodeFigures]) -> str:
    head = (f"{'code':<13}{'n':>5}{'s':>4}  {'||a_I||_1 mean':>15}{'max':>11}  "
            f"{'residual mean':>14}{'max':>10}  {'decode ms mean':>15}{'max':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.patterns == 0:
            lines.append(f"{r.code:<13}{r.n:>5}{r.s:>4}  n/a: {r.note}")
            continue
        lines.append(
            f"{r.code:<13}{r.n:>5}{r.s:>4}  {r.norm1_mean:>15.3g}{r.norm1_max:>11.3g}  "
            f"{r.residual_mean:>14.2e}{r.residual_max:>10.2e}  "
            f"{1e3 * r.time_mean_s:>15.3f}{1e3 * r.time_max_s:>9.3f}"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="pgc-hvd report codes", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100, help="number of workers (default 100)")
    p.add_argument("--stragglers", dest="s", default="20,24",
                   help="comma-separated straggler budgets s (default 20,24)")
    p.add_argument("--s", dest="s", help=argparse.SUPPRESS)   # the old spelling
    p.add_argument("--patterns", type=int, default=200, help="straggler patterns sampled per code and s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--codes", default=",".join(DEFAULT_CODES),
                   help="comma-separated code specs name[:key=value], e.g. bcgc,rs,rs:stride=1")
    args = p.parse_args(argv)
    try:
        ss = [int(x) for x in args.s.split(",") if x.strip()]
    except ValueError:
        p.error(f"--stragglers must be comma-separated integers, got {args.s!r}")
    if not ss:
        p.error(f"--stragglers names no straggler budget: {args.s!r}")
    if args.n < 1:
        p.error(f"--n is the number of workers and must be >= 1, got {args.n}")
    if min(ss) < 0:
        p.error(f"--stragglers budgets must be >= 0, got {args.s!r}")
    if args.patterns < 1:
        p.error(f"--patterns must be >= 1, got {args.patterns}")
    names = [c.strip() for c in args.codes.split(",") if c.strip()]
    if not names:
        p.error(f"--codes names no code: {args.codes!r}")
    for name in names:  # typos are usage errors; "n/a" rows are for codes that lack (n, s)
        try:
            base, options = parse_code_spec(name)
        except ValueError as err:
            p.error(str(err))
        if base not in CODES:
            p.error(f"unknown code {base!r} in --codes; valid names: {', '.join(CODES)}")
        unknown = set(options) - set(inspect.signature(CODES[base]).parameters)
        if unknown:
            p.error(f"code {base!r} does not take option(s) {sorted(unknown)} (in --codes)")
    rows = []
    for s in ss:
        for name in names:
            rows.append(measure(name, args.n, s, args.patterns, args.seed))
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
