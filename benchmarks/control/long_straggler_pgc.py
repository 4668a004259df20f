"""Why does a rare long straggler cost PGC-CR steps? (simulator)

    python benchmarks/control/long_straggler_pgc.py [--seeds 0,1,2] [--jobs 2] [--json PATH]
        [--patterns NAME,NAME SPEC ...] [--only LABEL,...] [--steps 400]

The runtime benchmark's workload in the simulator (``benchmarks/control/decay_sweep.py``'s ``cnn``):
the digits CNN, n = 4, s = 1, minibatch 16, SGD lr 0.05 momentum 0.9, validation accuracy 95%
evaluated every 5 steps, at most 400 steps / 800 time units, 1 time unit per partition
gradient. The straggler patterns (``--patterns``, default ``exp,lognormal``) are
``benchmarks/tta/time_to_accuracy.py``'s: any name of the one pattern table
:data:`pgc_hvd.delays.PATTERNS` (:func:`pgc_hvd.delays.pattern_spec` at n = 4, compute = 1, 400
steps, seeded by the run's seed + 1), e.g.

* ``exp``: exponential delays of mean one compute;
* ``lognormal``: log-normal delays (median 0.3 compute, sigma 0.5) plus, with probability
  0.01 per worker-step, a 10-30 compute straggler;

or any delay spec (:func:`pgc_hvd.delays.parse_delay`'s text, as ``pgc-hvd simulate --delay``;
a component without ``seed=`` is seeded by the run's seed + 1), one spec per argument since a
spec has commas: ``--patterns exp,lognormal
'lognormal:mu=-1.2039728043259361,sigma=0.5+straggler:p=0.05,low=10,high=30'`` (the
``lognormal`` pattern with straggler probability 0.05).

Variants (PGC-CR unless said), each removing one suspect:

* ``dgd``; ``pgc-cr``: the defaults (momentum swap + ring decay rho = 1 - beta = 0.1);
* ``pgc-cr cancel``: straggler policy ``cancel`` (a worker drops its step for a newer model,
  so its ring never holds evaluations older than its last completed step);
* ``pgc-cr swap-capped``: the momentum swap reads min(mean age, (c - 1) / 2), the mean age of
  a ring refreshed on time (a straggler's ancient slots cannot push mu_imp towards 1);
* ``pgc-cr no-swap``: the ring decay kept (``decay`` = 0.1 given), the swap off;
* ``pgc-cr off``: both parts off (``momentum_correction=False``);
* ``bounded-staleness`` (r = c = s + 1 = 2, the runtime benchmark's): with its remedy (each
  gradient counted once, a step on n - s gradients of the current model, the mean of its new
  ones) and without (``off``: the note's rule); the remedy's parts one at a time: ``fire=new``
  (the first remedy: m new entries of any age, weights w_i), ``fire=new normalize``, ``no
  normalize`` (fire on the current model, weights w_i), ``decay 0.1`` (late entries at
  0.1^age), ``cancel`` (straggler policy cancel: no late gradient at all);
* ``is-sgd``: the mean of the first n - s gradients of every step (the late ones dropped).

Prints steps to the target per seed and the medians, and per run the largest mean age the
swap saw, the smallest momentum it applied and the mean age of the used gradients over the
steps (averaged over the seeds in the table).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

OPT = "sgd:lr=0.05,momentum=0.9"
VARIANTS = [("dgd", "dgd", {}, "continue", True, None),
            ("pgc-cr", "pgc-cr", {}, "continue", True, None),
            ("pgc-cr cancel", "pgc-cr", {}, "cancel", True, None),
            ("pgc-cr swap-capped", "pgc-cr", {}, "continue", True, "cap"),
            ("pgc-cr no-swap", "pgc-cr", {"decay": 0.1}, "continue", False, None),
            ("pgc-cr off", "pgc-cr", {}, "continue", False, None),
            ("bounded-staleness", "bounded-staleness", {}, "continue", True, None),
            ("bounded-staleness off", "bounded-staleness", {}, "continue", False, None),
            ("bounded-staleness fire=new", "bounded-staleness", {"replay": "once"}, "continue",
             True, None),
            ("bounded-staleness fire=new normalize", "bounded-staleness",
             {"replay": "once", "normalize": True}, "continue", True, None),
            ("bounded-staleness no normalize", "bounded-staleness", {"normalize": False},
             "continue", True, None),
            ("bounded-staleness decay 0.1", "bounded-staleness", {"decay": 0.1}, "continue",
             True, None),
            ("bounded-staleness cancel", "bounded-staleness", {}, "cancel", True, None),
            ("is-sgd", "is-sgd", {}, "continue", True, None)]


def delay_spec(pattern: str, seed: int, steps: int = 400) -> str:
    """The delay spec of ``--patterns`` entry ``pattern`` for the run of seed ``seed``: a name
    of the pattern table (:func:`pgc_hvd.delays.pattern_spec`, n = 4, compute = 1, seeded by
    ``seed + 1`` as ``time_to_accuracy.py``'s), or a delay spec whose components without a
    seed (of a model that draws) get ``seed + 1``."""
    from pgc_hvd.delays import PATTERN_ALIASES, PATTERNS, parse_delay, pattern_spec
    if pattern in PATTERNS or pattern in PATTERN_ALIASES:
        return pattern_spec(pattern, 4, 1.0, steps, seed=seed + 1)
    if ":" not in pattern or "=" not in pattern:
        raise SystemExit(
            f"--patterns {pattern!r}: not a pattern of pgc_hvd.delays.PATTERNS "
            f"({', '.join(PATTERNS)}) nor a delay spec with named values (e.g. "
            "'lognormal:mu=-1.2039728043259361,sigma=0.5+straggler:p=0.05,low=10,high=30' for "
            "the lognormal pattern with straggler probability 0.05)")
    if pattern.startswith("replay:"):
        return pattern
    try:
        return "+".join(f"{c},seed={seed + 1}" if "seed=" not in c
                        and "seed" in parse_delay(c).params() else c
                        for c in pattern.split("+"))
    except ValueError as err:
        raise SystemExit(f"--patterns {pattern!r}: {err}") from None


def pattern_list(args: list[str]) -> list[str]:
    """``--patterns``' arguments: a comma-separated list of pattern names, or one delay spec
    (it has a ``:``) per argument."""
    return [p for a in args for p in ([a] if ":" in a else a.split(",")) if p]


def cap_mean_age(sim, step, decision, g_hat, extra) -> None:
    """The ``swap-capped`` variant, through the simulator's ``step_hook`` (called before each
    update is applied): the momentum swap reads min(mean age, (c - 1) / 2); the uncapped age
    stays in the record's ``extra`` (``uncapped_mean_age``) for the table."""
    age = decision.info.get("mean_age")
    if age is not None:
        extra["uncapped_mean_age"] = age
        decision.info["mean_age"] = min(age, (sim.scheme.ring_depth - 1) / 2.0)


def _run(job):
    pattern, (label, scheme, opts, policy, correction, hack), seed, steps = job
    import torch
    torch.set_num_threads(1)
    from pgc_hvd.metrics.targets import first_at_least
    from pgc_hvd.sim.run import simulate
    hook = {"step_hook": cap_mean_age} if hack == "cap" else {}
    s = 0 if scheme == "dgd" else 1       # DGD tolerates no straggler
    recs, _ = simulate(scheme, 4, s, dataset="digits", model="cnn", optimizer=OPT,
                       delay=delay_spec(pattern, seed, steps), steps=steps,
                       scheme_options=opts,
                       partition_time=1.0, batch_size=16, seed=seed, eval_every=5,
                       eval_train=False, target_accuracy=0.95, stop_at_target=True,
                       max_time=800.0, straggler_policy=policy,
                       momentum_correction=correction, diagnostics=False, **hook)
    steps, time = first_at_least(recs, 0.95)
    eff = [r.extra.get("effective_momentum") for r in recs
           if r.extra.get("effective_momentum") is not None]
    ages = [r.extra.get("uncapped_mean_age", r.mean_age) or 0.0 for r in recs]
    return {"pattern": pattern, "variant": label, "seed": seed, "steps": steps, "time": time,
            "max_mean_age": max(ages),
            "mean_age": statistics.fmean(ages),
            "min_momentum": min(eff) if eff else None,
            "late_steps": sum(1 for r in recs if (r.max_age or 0) >= 4) / len(recs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--patterns", nargs="+", default=["exp,lognormal"],
                   help="pattern names of pgc_hvd.delays.PATTERNS, comma-separated, and/or delay "
                        "specs, one an argument (module doc)")
    p.add_argument("--steps", type=int, default=400,
                   help="at most this many steps a run (and the patterns' run length)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", default=None, help="comma-separated variant labels (default: all)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    seeds = [int(x) for x in a.seeds.split(",")]
    variants = VARIANTS if a.only is None else [v for v in VARIANTS
                                                 if v[0] in a.only.split(",")]
    if not variants:
        raise SystemExit(f"--only {a.only!r} names no variant; use labels of "
                         + ", ".join(v[0] for v in VARIANTS))
    patterns = pattern_list(a.patterns)
    for pat in patterns:        # refused here, not in a worker
        delay_spec(pat, seeds[0], a.steps)
    jobs = [(pat, v, s, a.steps) for pat in patterns for v in variants for s in seeds]
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(_run, jobs))
    for r in rows:
        print(json.dumps(r))
    print("\npattern | variant | steps to 95% (per seed) | median | max mean age | min beta' | "
          "mean age")
    for pat in patterns:
        for v in variants:
            rs = [r for r in rows if r["pattern"] == pat and r["variant"] == v[0]]
            st = [r["steps"] if r["steps"] is not None else math.inf for r in rs]
            mins = [r["min_momentum"] for r in rs if r["min_momentum"] is not None]
            print(f"{pat} | {v[0]} | {st} | {statistics.median(st)} | "
                  f"{max(r['max_mean_age'] for r in rs):.2f} | "
                  f"{min(mins) if mins else '-'} | "
                  f"{statistics.fmean(r['mean_age'] for r in rs):.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": "python benchmarks/control/long_straggler_pgc.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]), "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
