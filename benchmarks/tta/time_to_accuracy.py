"""Time to a target validation accuracy: the user's own loop under horovodrun, pgc_hvd against
``hvd.DistributedOptimizer`` (what users buy is time to a good-enough model).

    python benchmarks/tta/time_to_accuracy.py [--np 4] [--variants hvd,pgc-cr,pgc-cr:off]
        [--patterns none,slow,exp,lognormal] [--optimizers sgd,adam] [--seeds 0,1,2]
        [--target 0.95] [--compute 0.1] [--max-steps 300] [--json runs/tta.json]
    python benchmarks/tta/time_to_accuracy.py --quick      # one short launch (the smoke test's)
    python benchmarks/tta/time_to_accuracy.py --from A.json --from B.json   # re-summarize, merged

The workload, the straggler patterns and the variants are those of ``pgc_hvd/apps/tta.py``
(the loop this benchmark shares with the main job, ``launch/demo.sh``): the 3-layer CNN on
scikit-learn's digits, a batch of 16 per rank (pgc_hvd: per partition) and step, ``--compute``
seconds of emulated GPU work per batch with each rank's delay slept between the forward and the
backward, the user's optimizer with the user's hyper-parameters (``sgd``: SGD lr 0.05 momentum
0.9; ``adam``: Adam lr 3e-3), validation accuracy every ``--eval-every`` steps (not timed), and
one seeded delay schedule per pattern for every variant, any name of
:data:`pgc_hvd.delays.PATTERNS` (``pgc_hvd.delays.pattern_spec``, seeded by the trial's seed +
1): ``none``, ``slow`` (``slow-rank``: rank (seed + 1) % np 4x slow; before the one pattern
table it was rank 1 at every seed), ``exp`` (Exp(mean = compute) per rank and step),
``lognormal`` (with rare 10-30 x stragglers), ``heavy-tail``, ``two-class``, ``transient``.

Variants: ``hvd`` (``hvd.DistributedOptimizer``), and any pgc_hvd scheme name (s = 0 for
``dgd``, 1 otherwise), ``NAME:off`` with ``momentum_correction=False``, ``NAME:cancel`` with
``straggler_policy="cancel"``, ``NAME:KEY=VALUE`` with a scheme option
(e.g. ``pgc-cr:decay=0.5``; flags chain: ``pgc-cr:off:decay=0.5``). One horovodrun launch
per (pattern, optimizer, seed) runs every variant in turn on fresh models with the same
initialisation. Printed: per variant, median over seeds of steps and training seconds to the
target and their ratio to Horovod's (the median of the per-seed ratios), and time per step. A
run that misses the target in ``--max-steps`` counts as not reached (its ratio is reported as
">"). Figures are measured on a shared 2-core machine: read ratios measured in one launch,
never single numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result, run_ranks

from pgc_hvd.apps.tta import OPTIMIZERS, Trial, delay_spec
from pgc_hvd.delays import PATTERN_ALIASES, PATTERNS


# ----------------------------------------------------------------------------- worker (per rank)
def worker(args) -> None:
    import horovod.torch as hvd
    import torch

    from pgc_hvd.apps.tta import digits_split, train_one
    torch.set_num_threads(1)
    hvd.init()
    trial = Trial(optimizer=args.optimizer, seed=args.seed, compute=args.compute,
                  delay=delay_spec(args.pattern, hvd.size(), args.compute, args.seed,
                                   args.max_steps),
                  batch_size=args.batch_size, steps=args.max_steps, eval_every=args.eval_every,
                  target=args.target, stop_at_target=True)
    data = digits_split()
    out = [train_one(v, i, trial, hvd, data) for i, v in enumerate(args.variants.split(","))]
    for r in out:              # rank 0's series stay out of the launch's result line
        del r["step_times"]
        if not args.keep_evals:
            del r["evals"]
    if hvd.rank() == 0:
        print_result({"pattern": args.pattern, "optimizer": args.optimizer,
                      "seed": args.seed, "runs": out})


# ----------------------------------------------------------------------------- parent
def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _pattern_order(name: str) -> int:
    """Where ``name`` (or the pattern it is an alias of) stands in the one pattern table."""
    name = PATTERN_ALIASES.get(name, name)
    return PATTERNS.index(name) if name in PATTERNS else len(PATTERNS)


def merged(results: list) -> list:
    """Launches of the same (pattern, optimizer, seed) as one: their runs by variant, a later
    launch's run replacing an earlier one's of the same variant (``--from`` files given in
    order: e.g. a rule's new runs over the old ones, beside the fixed budgets they shared)."""
    out: dict = {}
    for r in results:
        key = (r["pattern"], r["optimizer"], r.get("seed"))
        have = out.setdefault(key, {**r, "runs": []})
        newer = {y["variant"] for y in r["runs"]}
        have["runs"] = [x for x in have["runs"] if x["variant"] not in newer] + list(r["runs"])
    return list(out.values())


def summarize(results: list) -> list:
    """One row per (pattern, optimizer, variant): medians over seeds and ratios to ``hvd``."""
    rows = []
    keys = sorted({(r["pattern"], r["optimizer"]) for r in results},
                  key=lambda k: (_pattern_order(k[0]), k[1]))
    for pattern, optimizer in keys:
        launches = [r for r in results if (r["pattern"], r["optimizer"]) == (pattern, optimizer)]
        variants = list(dict.fromkeys(v["variant"] for r in launches for v in r["runs"]))
        for v in variants:
            runs = [(r, x) for r in launches for x in r["runs"] if x["variant"] == v]
            ratios_t, ratios_s = [], []
            for r, x in runs:
                h = next((y for y in r["runs"] if y["variant"] == "hvd"), None)
                if h is None or h["time"] is None:
                    continue
                ratios_t.append(x["time"] / h["time"] if x["time"] else float("inf"))
                ratios_s.append(x["steps"] / h["steps"] if x["steps"] else float("inf"))
            rows.append({
                "pattern": pattern, "optimizer": optimizer, "variant": v, "seeds": len(runs),
                "reached": sum(1 for _, x in runs if x["steps"] is not None),
                "seed_list": [r.get("seed") for r, _ in runs],
                "steps": [x["steps"] for _, x in runs], "time": [x["time"] for _, x in runs],
                "steps_median": _med([x["steps"] for _, x in runs]),
                "time_median": _med([x["time"] for _, x in runs]),
                "time_per_step": _med([x["time_per_step"] for _, x in runs]),
                "time_ratio": statistics.median(ratios_t) if ratios_t else None,
                "steps_ratio": statistics.median(ratios_s) if ratios_s else None,
                "same_params": all(x["same_params"] for _, x in runs),
                # s=auto: the s each seed's run ended with (its switches are in the JSON)
                "final_s": [x["auto"]["final_s"] for _, x in runs if x.get("auto")]})
    return rows


def against_fixed(rows: list) -> list:
    """Per (pattern, optimizer) with an ``s=auto`` variant: auto's median time to the target
    over the best fixed budget's (the pgc_hvd variant of that scheme with the smallest median
    time, ``s=N`` or the default), and auto's time over it seed by seed."""
    from pgc_hvd.apps.tta import parse_variant
    out = []
    for auto in (r for r in rows if parse_variant(r["variant"])[2] == "auto"):
        scheme = parse_variant(auto["variant"])[0]
        fixed = [r for r in rows if (r["pattern"], r["optimizer"]) ==
                 (auto["pattern"], auto["optimizer"]) and r["variant"] != auto["variant"]
                 and parse_variant(r["variant"])[0] == scheme and r["time_median"] is not None]
        if not fixed or auto["time_median"] is None:
            continue
        best = min(fixed, key=lambda r: r["time_median"])
        # seed by seed (merged --from files may give a variant fewer seeds than another)
        best_of = dict(zip(best["seed_list"], best["time"]))
        per_seed = [a / best_of[k] if a and best_of.get(k) else None
                    for k, a in zip(auto["seed_list"], auto["time"])]
        out.append({"pattern": auto["pattern"], "optimizer": auto["optimizer"],
                    "auto": auto["variant"], "best_fixed": best["variant"],
                    "ratio": auto["time_median"] / best["time_median"], "per_seed": per_seed})
    return out


def table(rows: list, target: float) -> str:
    def f(x, fmt):
        if x is None:
            return "-"
        return ">max" if x == float("inf") else format(x, fmt)
    lines = [f"| pattern | optimizer | variant | reached | steps to {target:.0%} (per seed) | "
             f"median s | s/step | time / Horovod | steps / Horovod |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = ", ".join("-" if s is None else str(s) for s in r["steps"])
        name = r["variant"] + (f" (final s {', '.join(map(str, r['final_s']))})"
                               if r.get("final_s") else "")
        lines.append(f"| {r['pattern']} | {r['optimizer']} | {name} | "
                     f"{r['reached']}/{r['seeds']} | {steps} | {f(r['time_median'], '.1f')} | "
                     f"{f(r['time_per_step'], '.3f')} | {f(r['time_ratio'], '.2f')} | "
                     f"{f(r['steps_ratio'], '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--variants", default="hvd,pgc-cr,pgc-cr:off")
    p.add_argument("--patterns", default="none,slow,exp")
    p.add_argument("--optimizers", default="sgd")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--compute", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--json", default=None, help="write the launches' results and the rows here")
    p.add_argument("--keep-evals", action="store_true",
                   help="keep each run's evaluations [(step, seconds, accuracy)] in the JSON "
                        "(benchmarks/tta/staleness_cost.py reads steps to several targets)")
    p.add_argument("--from", dest="sources", action="append", default=[],
                   help="summarize the launches of earlier --json files (repeat to merge: more "
                        "seeds, or newer runs of a variant, which replace a seed's earlier run "
                        "of it) instead of launching")
    p.add_argument("--quick", action="store_true",
                   help="np 2, hvd and pgc-cr, exp delays, one seed, target 0.5 (a smoke run)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--pattern", default="none", help=argparse.SUPPRESS)
    p.add_argument("--optimizer", default="sgd", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.quick:
        args.np, args.variants, args.patterns, args.seeds = 2, "hvd,pgc-cr", "exp", "0"
        args.target, args.max_steps, args.compute = 0.5, 60, 0.02
    results = merged([launch for src in args.sources
                      for launch in json.loads(Path(src).read_text())["results"]])
    t_start = time.time()
    for pattern in ([] if args.sources else args.patterns.split(",")):
        try:                                          # refuse an unknown pattern at once
            delay_spec(pattern, args.np, args.compute, 0, args.max_steps)
        except ValueError as err:
            raise SystemExit(f"--patterns: {err}") from None
        for optimizer in args.optimizers.split(","):
            if optimizer not in OPTIMIZERS:
                raise SystemExit(f"unknown optimizer {optimizer!r}; use {', '.join(OPTIMIZERS)}")
            for seed in (int(x) for x in args.seeds.split(",")):
                wargs = ["--pattern", pattern, "--optimizer", optimizer, "--seed", seed,
                         "--variants", args.variants, "--target", args.target,
                         "--compute", args.compute, "--batch-size", args.batch_size,
                         "--eval-every", args.eval_every, "--max-steps", args.max_steps]
                if args.keep_evals:
                    wargs.append("--keep-evals")
                t0 = time.time()
                res = run_ranks(args.np, __file__, wargs, timeout=3600)
                results.append(res)
                print(f"# {pattern} {optimizer} seed {seed}: " + ", ".join(
                    f"{r['variant']} {r['steps']} steps {r['time'] or float('nan'):.1f} s"
                    for r in res["runs"]) + f"  ({time.time() - t0:.0f} s)", flush=True)
    rows = summarize(results)
    print(f"\nnp {args.np}, compute {args.compute} s per batch, target {args.target:.0%} "
          f"validation accuracy, {time.time() - t_start:.0f} s in all"
          + (f" (the launches of {', '.join(args.sources)})" if args.sources else ""))
    print(table(rows, args.target))
    verdict = against_fixed(rows)
    for v in verdict:
        print(f"{v['pattern']} {v['optimizer']}: {v['auto']} / the best fixed s "
              f"({v['best_fixed']}) = {v['ratio']:.2f} on the median time to the target "
              f"(per seed {', '.join('-' if x is None else f'{x:.2f}' for x in v['per_seed'])})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results,
                                               "rows": rows, "auto_vs_fixed": verdict},
                                              indent=1))
    bad = [r for r in rows if not r["same_params"]]
    if bad:
        print("PARAMETERS DIFFER ACROSS RANKS in: " + ", ".join(
            f"{r['pattern']}/{r['optimizer']}/{r['variant']}" for r in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
