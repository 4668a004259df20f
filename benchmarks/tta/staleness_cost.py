"""The staleness cost lambda of the runtime's own workload: steps to a target validation
accuracy at fixed ring depths s with no stragglers (so only the staleness differs), fitted to
the model of ``stragglers="auto"`` (progress per step 1 / (1 + lambda s),
:func:`pgc_hvd.control.progress_model.progress_per_step`).

    python benchmarks/tta/staleness_cost.py [--s 0,1,2,3] [--seeds 0,1,2] [--eval-every 1]
        [--targets 0.9,0.93,0.95] [--json docs/figures/runtime_staleness_cost.json]
    python benchmarks/tta/staleness_cost.py --from A.json [--from B.json]     # refit only

The runs are ``benchmarks/tta/time_to_accuracy.py``'s (its workload: the digits CNN, a batch of
16 per partition, ``--compute`` 0.1 s a batch, SGD lr 0.05 momentum 0.9, the default remedy;
horovodrun np 4), pattern ``none``, variants ``SCHEME:s=S`` for each S in ``--s``, one launch
per seed, evaluated every ``--eval-every`` steps (1: the exact first step at a target), each
run ending at the highest target. Per seed and target the ratio steps(s) / steps(0) (the same
seed's s = 0 run: the exact gradient) is fitted by least squares through the origin,
ratio - 1 = lambda s (:func:`~pgc_hvd.control.progress_model.fit_staleness_cost`); printed
beside it: each s's median ratio and its own (ratio - 1) / s, and a fit with a quadratic term
(ratio - 1 = a s + b s^2), which say whether the cost grows faster than linearly in s.
The fit at the highest target is the figure ``pgc_hvd.runtime.config.RUNTIME_STALENESS_COST``
carries (tests/control/test_auto_s_runtime.py recomputes it from the JSON). Figures are
measured on a shared 2-core machine: steps, not seconds, are what this reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def steps_to(evals, target: float):
    """The first evaluated step at accuracy >= ``target`` (None: never)."""
    return next((int(st) for st, _, acc in evals if acc >= target), None)


def runs_by_seed(results: list, scheme: str) -> dict:
    """{seed: {s: evals}} from time_to_accuracy's launches (pattern none, evals kept)."""
    from pgc_hvd.apps.tta import parse_variant
    out: dict = {}
    for launch in results:
        if launch["pattern"] != "none":
            continue
        for run in launch["runs"]:
            name, flags, s = parse_variant(run["variant"])
            if name != scheme or flags or not isinstance(s, int):
                continue
            out.setdefault(int(launch["seed"]), {})[s] = run["evals"]
    return out


def fit(results: list, scheme: str, targets: list, n: int = 4) -> dict:
    """Per target: each seed's steps at each s, the ratios to s = 0, lambda (linear fit
    through the origin), each s's median ratio and (ratio - 1) / s, the quadratic fit, and a
    fit in the late messages per deciding one, ratio - 1 = lambda_late s / (n - s) (a step
    fires with n - s of the n ranks' messages; the other s are counted late)."""
    from pgc_hvd.control.progress_model import fit_staleness_cost
    seeds = runs_by_seed(results, scheme)
    out = {}
    for target in targets:
        steps = {seed: {s: steps_to(ev, target) for s, ev in sorted(runs.items())}
                 for seed, runs in sorted(seeds.items())}
        points = [(s, st, by_s.get(0)) for by_s in steps.values() for s, st in by_s.items()]
        ratios: dict = {}
        for s, st, exact in points:
            if s >= 1 and st and exact:
                ratios.setdefault(s, []).append(st / exact)
        per_s = {s: {"ratios": r, "median": statistics.median(r),
                     "mean": statistics.fmean(r),
                     "lambda_of_s": (statistics.median(r) - 1.0) / s}
                 for s, r in sorted(ratios.items())}
        xs = [(s, r) for s, rs in ratios.items() for r in rs]
        quad = None
        if len({s for s, _ in xs}) >= 2:
            A = np.array([[s, s * s] for s, _ in xs], dtype=float)
            y = np.array([r - 1.0 for _, r in xs])
            a, b = np.linalg.lstsq(A, y, rcond=None)[0]
            quad = {"a": float(a), "b": float(b)}
        late = [(s / (n - s), r) for s, r in xs if s < n]
        lam_late = (sum(x * (r - 1.0) for x, r in late) / sum(x * x for x, _ in late)
                    if late else None)
        out[str(target)] = {"steps": {str(k): {str(s): v for s, v in d.items()}
                                      for k, d in steps.items()},
                            "per_s": {str(s): v for s, v in per_s.items()},
                            "lambda": fit_staleness_cost(points), "quadratic": quad,
                            "lambda_late": lam_late,
                            "missed": [(seed, s) for seed, d in steps.items()
                                       for s, v in d.items() if v is None]}
    return out


def report(fits: dict) -> str:
    lines = []
    for target, f in fits.items():
        lam = f["lambda"]
        lines.append(f"\ntarget {float(target):.0%}: lambda = "
                     f"{'-' if lam is None else format(lam, '.3f')} (steps(s) / steps(0) = "
                     f"1 + lambda s, least squares through the origin)"
                     + (f"; quadratic fit a = {f['quadratic']['a']:.3f}, "
                        f"b = {f['quadratic']['b']:.3f} (1 + a s + b s^2)"
                        if f["quadratic"] else "")
                     + (f"; in s / (n - s): lambda_late = {f['lambda_late']:.3f} "
                        f"(1 + lambda_late s / (n - s))" if f.get("lambda_late") is not None
                        else ""))
        lines.append("| seed | " + " | ".join(f"s = {s}" for s in
                                                 next(iter(f["steps"].values()), {})) + " |")
        for seed, d in f["steps"].items():
            lines.append(f"| {seed} | " + " | ".join("-" if v is None else str(v)
                                                      for v in d.values()) + " |")
        for s, p in f["per_s"].items():
            lines.append(f"s = {s}: ratios {', '.join(f'{r:.2f}' for r in p['ratios'])}; "
                         f"median {p['median']:.3f}, mean {p['mean']:.3f}, "
                         f"(median - 1) / s = {p['lambda_of_s']:.3f}")
        if f["missed"]:
            lines.append(f"not reached (seed, s): {f['missed']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--s", default="0,1,2,3", help="ring depths (0 must be among them)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--targets", default="0.9,0.93,0.95",
                   help="validation accuracies; runs end at the highest")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--compute", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--json", default=None, help="write the launches' results and the fit here")
    p.add_argument("--from", dest="sources", action="append", default=[],
                   help="refit the results of earlier --json files (no launch)")
    args = p.parse_args(argv)
    targets = sorted(float(x) for x in args.targets.split(","))
    results, meta = [], {"args": vars(args)}
    for src in args.sources:
        results += json.loads(Path(src).read_text())["results"]
    if not args.sources:
        depths = [int(x) for x in args.s.split(",")]
        if 0 not in depths:
            raise SystemExit("--s must include 0 (the exact run each ratio is taken against)")
        sys.path.insert(0, str(HERE))
        import time_to_accuracy
        t0 = time.time()
        meta["start_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0))
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "tta.json"
            rc = time_to_accuracy.main([
                "--variants", ",".join(f"{args.scheme}:s={s}" for s in depths),
                "--patterns", "none", "--seeds", args.seeds, "--np", str(args.np),
                "--target", str(targets[-1]), "--compute", str(args.compute),
                "--eval-every", str(args.eval_every), "--max-steps", str(args.max_steps),
                "--keep-evals", "--json", str(out)])
            results = json.loads(out.read_text())["results"]
        meta["seconds"] = round(time.time() - t0, 1)
        if rc:
            print("time_to_accuracy reported parameters that differ across ranks")
    fits = fit(results, args.scheme, targets, args.np)
    print(report(fits))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({**meta, "results": results, "fit": fits},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
