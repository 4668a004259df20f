"""stragglers="auto" against fixed budgets s on the deep workload, per production straggler
pattern (simulator).

    python benchmarks/sim/auto_s_study.py --n 12,32,100 --seeds 5 --jobs 2 --out runs/auto_s
    python benchmarks/sim/auto_s_study.py --calibrate --out runs/auto_s_cal   # lambda

Workload (docs/experiments.md, "Deep networks"): MNIST-1D, ``cnn1d``, minibatch 32 per partition
gradient, SGD lr 0.1 momentum 0.9 with the default staleness-aware remedy, partition time 1
(virtual seconds), the master comm model, straggler policy ``continue``; scheme PGC-CR (the
optimizer's default scheme). A run stops once its validation accuracy (every 5 steps) reaches
``--target`` (default 0.4, the deep experiment's), or after ``--max-steps`` (400): then its
time is infinite.

Patterns (:func:`pgc_hvd.delays.pattern_spec`, compute = 1, transient stragglers from 25% to
60% of ``--pattern-steps``): none, slow-rank, two-class, heavy-tail, transient. Seed k is the
model's init, the partition, the minibatches and the pattern's draws (the slow set included).

Per (n, pattern): ``auto`` (default options: a re-plan boundary every 10 steps, 32 samples per
rank, 8% hysteresis, s in 0..max(3, n/4), starting at the default s = 1) and the fixed budgets
``--fixed`` (default {0, 1, 2, 3, n/8, n/4}); the table gives the median time to the target
over the seeds, the best fixed s by that median, and auto's ratios to it and to s = 1; "auto /
best, time per step" is the ratio of the medians of the mean time per step, which leaves out
the steps to the target (noisy: a trajectory that switches s once is another trajectory).

``--calibrate``: PGC-CR at the fixed budgets under exponential delays (mean 1) for each
``--n``, on seeds 100.. (not the study's), steps to the target per s: the staleness effect
lambda of :mod:`pgc_hvd.control.progress_model` (steps(s) / steps(0) = 1 + lambda s, least
squares over the seeds' medians of every (n, s)).

``--auto-options KEY=VALUE`` (repeat, or comma-separated): options of the auto rows
(AutoConfig's), e.g. ``--auto-options s_start=2,lower_gain=0.05``; they join the rows' labels,
so one OUT can hold auto
rows of several option sets beside the same fixed rows (the table reads those of this call).

Rows go to OUT/runs.jsonl as they finish; a rerun with the same OUT skips the rows it has
(so a long study can be resumed). The table is printed and written to OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

OPTIMIZER = "sgd:lr=0.1,momentum=0.9"
EVAL_EVERY = 5
_DATA: dict = {}


def fixed_budgets(n: int) -> list[int]:
    return sorted({s for s in (0, 1, 2, 3, n // 8, n // 4) if 0 <= s <= n - 1})


def run_one(spec: dict) -> dict:
    import torch
    torch.set_num_threads(1)
    from pgc_hvd.delays import pattern_spec
    from pgc_hvd.metrics.targets import first_at_least
    from pgc_hvd.sim.run import prepare_data, simulate
    if "mnist1d" not in _DATA:           # once per process (the pool's workers persist)
        _DATA["mnist1d"] = prepare_data("mnist1d")
    data = _DATA["mnist1d"]
    t0 = time.perf_counter()
    n, seed = spec["n"], spec["seed"]
    delay = (spec["delay"] if spec.get("delay") else
             pattern_spec(spec["pattern"], n, 1.0, spec["pattern_steps"], seed=seed))
    s = spec["s"]
    recs, summ = simulate("pgc-cr", n, s, data=data, model="cnn1d", optimizer=OPTIMIZER,
                          delay=delay, steps=spec["max_steps"], partition_time=1.0,
                          batch_size=32, seed=seed, eval_every=EVAL_EVERY, eval_train=False,
                          diagnostics=False, target_accuracy=spec["target"],
                          stop_at_target=True, auto=spec.get("auto"))
    st, tt = first_at_least(recs, spec["target"])
    return {**{k: spec[k] for k in ("label", "n", "pattern", "s", "seed")},
            "delay": str(delay), "steps_to_target": st, "time_to_target": tt,
            "steps": summ["steps"], "time_per_step": summ["time_per_step"],
            "final_s": summ["s"], "switches": summ.get("auto_switches"),
            "steps_at_s": summ.get("steps_at_s"), "wall_seconds": time.perf_counter() - t0}


def specs_of(args) -> list[dict]:
    out = []
    if args.calibrate:
        for n in args.n:
            for s in (args.fixed if args.fixed else fixed_budgets(n)):
                for seed in range(100, 100 + args.seeds):
                    out.append({"label": f"cal_n{n}_s{s}_seed{seed}", "n": n, "pattern": "exp",
                                "delay": f"exp:mean=1,seed={seed}", "s": s, "seed": seed,
                                "target": args.target, "max_steps": args.max_steps,
                                "pattern_steps": args.pattern_steps})
        return out
    for n in args.n:
        budgets = ["auto"] + (args.fixed if args.fixed else fixed_budgets(n))
        for pattern in args.patterns:
            for s in budgets:
                if s != "auto" and s > n - 1:
                    continue
                tag = "".join(f"_{k}={v}" for k, v in sorted(args.auto.items())) \
                    if s == "auto" else ""
                for seed in range(args.seeds):
                    out.append({"label": f"n{n}_{pattern}_s{s}{tag}_seed{seed}", "n": n,
                                "pattern": pattern, "s": s, "seed": seed,
                                "target": args.target, "max_steps": args.max_steps,
                                "pattern_steps": args.pattern_steps,
                                "auto": dict(args.auto) if s == "auto" else None})
    return out


def _median(v):
    v = sorted(math.inf if x is None else x for x in v)
    return statistics.median(v) if v else None


def _fmt(x, nd=0):
    return "-" if x is None else (">max" if math.isinf(x) else f"{x:.{nd}f}")


def table(rows: list[dict]) -> str:
    by: dict = {}
    for r in rows:
        by.setdefault((r["n"], r["pattern"]), {}).setdefault(r["s"], []).append(r)
    lines = ["| n | pattern | auto: time to target (s) | auto's final s (switches) | best fixed s "
             "| its time | auto / best | auto / best, time per step | s = 1 time | auto / s=1 "
             "| s = 0 time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for (n, pattern), group in sorted(by.items()):
        med = {s: _median([r["time_to_target"] for r in rs]) for s, rs in group.items()}
        tps = {s: _median([r["time_per_step"] for r in rs]) for s, rs in group.items()}
        auto = med.get("auto")
        fixed = {s: m for s, m in med.items() if s != "auto"}
        if not fixed or auto is None:
            continue
        best = min(fixed, key=lambda s: (fixed[s], s))
        finals = [r["final_s"] for r in group["auto"]]
        nsw = [len(r["switches"] or []) for r in group["auto"]]
        r_best = auto / fixed[best] if fixed[best] and math.isfinite(fixed[best]) else None
        r_one = auto / fixed[1] if fixed.get(1) and math.isfinite(fixed[1]) else None
        verdicts.append((n, pattern, r_best, r_one))
        lines.append(f"| {n} | {pattern} | {_fmt(auto)} | {statistics.median(finals):g} "
                     f"({statistics.median(nsw):g}) | {best} | {_fmt(fixed[best])} | "
                     f"{_fmt(r_best, 2)} | {_fmt(tps['auto'] / tps[best], 2)} | "
                     f"{_fmt(fixed.get(1))} | {_fmt(r_one, 2)} | {_fmt(fixed.get(0))} |")
    within = sum(1 for v in verdicts if v[2] is not None and v[2] <= 1.05)
    below = sum(1 for v in verdicts if v[3] is not None and v[3] <= 0.85)
    lines.append("")
    lines.append(f"auto within 5% of the best fixed s in {within} of {len(verdicts)} "
                 f"(n, pattern) cells; at least 15% below s = 1 in {below}.")
    return "\n".join(lines)


def calibration(rows: list[dict]) -> str:
    out = ["| n | s | median steps to target | steps / steps(s=0) |", "|---|---|---|---|"]
    pts = []
    for n in sorted({r["n"] for r in rows}):
        budgets = sorted({r["s"] for r in rows if r["n"] == n})
        steps = {s: _median([r["steps_to_target"] for r in rows if r["n"] == n and r["s"] == s])
                 for s in budgets}
        base = steps.get(0)
        for s in budgets:
            ratio = steps[s] / base if base else None
            out.append(f"| {n} | {s} | {_fmt(steps[s])} | {_fmt(ratio, 2)} |")
            if s > 0 and ratio is not None and math.isfinite(ratio):
                pts.append((s, ratio - 1.0))
    lam = sum(s * y for s, y in pts) / sum(s * s for s, _ in pts) if pts else None
    out.append("")
    out.append(f"lambda (least squares of steps(s)/steps(0) - 1 = lambda s): "
               f"{'-' if lam is None else f'{lam:.3f}'}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", default="12,32,100", help="comma-separated numbers of workers")
    p.add_argument("--patterns", default="none,slow-rank,two-class,heavy-tail,transient")
    p.add_argument("--fixed", default=None,
                   help="comma-separated fixed budgets (default {0,1,2,3,n/8,n/4})")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--target", type=float, default=0.4,
                   help="validation accuracy (default 0.4, the deep experiment's)")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--pattern-steps", type=int, default=60,
                   help="the run length the transient pattern is laid out for (25%%-60%%)")
    p.add_argument("--auto-options", dest="auto", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="options of the auto rows (AutoConfig's, e.g. s_start=2,lower_gain=0.05; "
                        "default: none, the simulator's defaults); they join the rows' labels")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--calibrate", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from pgc_hvd.delays import pattern_name
    try:
        a.n = [int(x) for x in a.n.split(",") if x.strip()]
        a.fixed = [int(x) for x in a.fixed.split(",")] if a.fixed else None
    except ValueError:
        p.error("--n and --fixed take comma-separated integers")
    a.patterns = [x.strip() for x in a.patterns.split(",") if x.strip()]
    try:
        a.patterns = [pattern_name(x) for x in a.patterns]
    except ValueError as err:
        p.error(f"--patterns: {err}")
    try:
        from pgc_hvd.control.auto_s import AutoConfig
        from pgc_hvd.options import parse_options
        a.auto = parse_options(a.auto, "--auto-options")
        AutoConfig.from_options(a.auto)
    except (TypeError, ValueError) as err:
        p.error(f"--auto-options: {err}")
    if min(a.n) < 2 or a.seeds < 1 or a.jobs < 1:
        p.error("--n >= 2, --seeds >= 1 and --jobs >= 1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "runs.jsonl"
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["label"]] = r
    specs = specs_of(a)
    todo = [sp for sp in specs if sp["label"] not in done]
    finished = [len(specs) - len(todo)]
    t0 = time.perf_counter()
    print(f"[auto-s] {len(specs)} runs, {len(specs) - len(todo)} already in {path}",
          file=sys.stderr, flush=True)
    with open(path, "a") as f:
        def keep(row):
            done[row["label"]] = row
            finished[0] += 1
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"[auto-s] {row['label']}: {row['steps_to_target']} steps, "
                  f"{_fmt(row['time_to_target'], 1)} s ({row['wall_seconds']:.1f} s wall; "
                  f"{finished[0]}/{len(specs)})", file=sys.stderr, flush=True)
        if a.jobs > 1:
            import multiprocessing as mp
            with mp.get_context("spawn").Pool(a.jobs) as pool:
                for row in pool.imap_unordered(run_one, todo):
                    keep(row)
        else:
            for sp in todo:
                keep(run_one(sp))
    rows = [done[sp["label"]] for sp in specs]
    text = calibration(rows) if a.calibrate else table(rows)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"[auto-s] wall {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
