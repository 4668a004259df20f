"""Does weighting PGC-CR's ring by age (``decay``) help, and where? (simulator)

    python benchmarks/control/decay_sweep.py [--workloads softmax,cnn] [--seeds 0,1,2] [--jobs 2]
                                     [--decays 1,0.5,0.25,0] [--json PATH]

PGC-CR's message with ``decay`` = rho sums its ring slot of age a with weight rho^a (normalised
by W = sum_{a<c} rho^a, so the decoder stays unbiased for the age-weighted average): rho = 1 is
the paper's scheme, rho = 0 keeps only the fresh gradients of the n - s fastest workers (IS-SGD
with rotating partitions). Two workloads, exponential delays of mean 1 partition time:

* ``softmax``: docs/experiments.md section 1 (the paper's noise-dominated convex setting):
  softmax regression on digits, n = 12, s = 3, batch 4 per partition gradient, plain SGD lr 2.0,
  300 steps; target = the training loss DGD reaches at step 180 (same seed).
* ``cnn``: the demo's workload: the digits CNN, n = 4, s = 1, batch 16, SGD lr 0.05 momentum
  0.9 (the momentum correction on), validation accuracy 95% evaluated every 5 steps, at most
  400 steps / 800 time units.

The deep workload (MNIST-1D, n = 12, s = 3) is ``pgc-hvd experiment deep --grid decay``.
``--corr``: instead, the stale/current cosine of the diagnostics (``corr_mean``: cos of the
gradients on a fixed validation batch at beta_v and beta_t, averaged over the stale versions and
the evaluated steps) for PGC-CR (decay 1), seed 0, on softmax, cnn and MNIST-1D (the deep
experiment's settings, 120 steps): the signal an adaptive decay might use.
Prints, per workload, variant and seed: steps and virtual time to the target and the time
ratio to DGD of the same seed, then the median ratio per variant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor


def _run(job):
    workload, scheme, opts, seed = job
    import torch
    torch.set_num_threads(1)
    from pgc_hvd.delays import Exponential
    from pgc_hvd.metrics.targets import first_at_least
    from pgc_hvd.schemes import setting_stragglers
    from pgc_hvd.sim.run import simulate
    if workload == "softmax":
        recs, _ = simulate(scheme, 12, setting_stragglers(scheme, 3), dataset="digits",
                           model="softmax",
                           optimizer="sgd:lr=2.0", delay=Exponential(1.0, seed=1000 * seed + 14),
                           steps=300, scheme_options=opts, partition_time=1.0, batch_size=4,
                           seed=seed)
        return {"losses": [r.loss for r in recs], "times": [r.time for r in recs]}
    recs, _ = simulate(scheme, 4, setting_stragglers(scheme, 1), dataset="digits", model="cnn",
                       optimizer="sgd:lr=0.05,momentum=0.9",
                       delay=Exponential(1.0, seed=1000 * seed + 12), steps=400,
                       scheme_options=opts, partition_time=1.0, batch_size=16, seed=seed,
                       eval_every=5, eval_train=False, target_accuracy=0.95,
                       stop_at_target=True, max_time=800.0)
    steps, time = first_at_least(recs, 0.95)
    return {"steps": steps, "time": time}


def _corr(workload):
    import numpy as np
    import torch
    torch.set_num_threads(1)
    from pgc_hvd.delays import Exponential
    from pgc_hvd.sim.run import simulate
    settings = {
        "softmax": dict(n=12, s=3, dataset="digits", model="softmax", optimizer="sgd:lr=2.0",
                        batch_size=4, delay=Exponential(1.0, seed=14), steps=150),
        "cnn": dict(n=4, s=1, dataset="digits", model="cnn",
                    optimizer="sgd:lr=0.05,momentum=0.9", batch_size=16,
                    delay=Exponential(1.0, seed=12), steps=100),
        "mnist1d": dict(n=12, s=3, dataset="mnist1d", model="cnn1d",
                        optimizer="sgd:lr=0.1,momentum=0.9", batch_size=32,
                        delay=Exponential(1.0, seed=14), steps=120)}[workload]
    recs, summ = simulate("pgc-cr", partition_time=1.0, seed=0, diagnostics=True,
                          diag_every=5, **settings)
    corr = [r.extra["corr_mean"] for r in recs if r.extra.get("corr_mean") is not None]
    return workload, float(np.mean(corr)), summ["err_stale_mean"], summ["g_hat_sq_mean"]


def _to_loss(run, threshold):
    i = next((i for i, x in enumerate(run["losses"]) if x <= threshold), None)
    return (None, None) if i is None else (i + 1, run["times"][i])


def variants(decays):
    return [("dgd", {}), ("is-sgd", {})] + [("pgc-cr", {"decay": d}) for d in decays]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="softmax,cnn")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--decays", default="1,0.5,0.25,0")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--corr", action="store_true", help="the stale/current cosine per workload")
    a = p.parse_args(argv)
    if a.corr:
        with ProcessPoolExecutor(a.jobs) as ex:
            for w, corr, err, g2 in ex.map(_corr, ["softmax", "cnn", "mnist1d"]):
                print(f"{w:8s} pgc-cr decay 1, seed 0: corr_mean {corr:.3f}  err_stale "
                      f"{err:.3g}  ||g_hat||^2 {g2:.3g}", flush=True)
        return 0
    seeds = [int(x) for x in a.seeds.split(",")]
    decays = [float(x) for x in a.decays.split(",")]
    workloads = a.workloads.split(",")
    bad = set(workloads) - {"softmax", "cnn"}
    if bad:
        p.error(f"unknown workload(s) {sorted(bad)}; choose from softmax, cnn")
    jobs = [(w, sch, opts, sd) for w in workloads for sch, opts in variants(decays)
            for sd in seeds]
    with ProcessPoolExecutor(a.jobs) as ex:
        results = list(ex.map(_run, jobs))

    def result(w, sch, opts, sd):
        return results[jobs.index((w, sch, opts, sd))]

    rows = []
    for w in workloads:
        for sd in seeds:
            ref = result(w, "dgd", {}, sd)
            if w == "softmax":
                thr = ref["losses"][179]
                ref_time = _to_loss(ref, thr)[1]
            else:
                ref_time = ref["time"]
            for sch, opts in variants(decays):
                r = result(w, sch, opts, sd)
                steps, time = _to_loss(r, thr) if w == "softmax" else (r["steps"], r["time"])
                name = sch + "".join(f" decay={v:g}" for v in opts.values())
                ratio = None if time is None or ref_time is None else time / ref_time
                rows.append({"workload": w, "variant": name, "seed": sd, "steps": steps,
                             "time": time, "time_vs_dgd": ratio})
                print(f"{w:8s} {name:18s} seed {sd}: steps {steps} time "
                      f"{'-' if time is None else f'{time:.0f}'} vs DGD "
                      f"{'-' if ratio is None else f'{ratio:.3f}'}", flush=True)
    print("\nmedian time to target / DGD (per-seed ratios; a missed target counts as inf):")
    for w in workloads:
        for sch, opts in variants(decays):
            name = sch + "".join(f" decay={v:g}" for v in opts.values())
            rs = [float("inf") if r["time_vs_dgd"] is None else r["time_vs_dgd"]
                  for r in rows if r["workload"] == w and r["variant"] == name]
            print(f"  {w:8s} {name:18s} {statistics.median(rs):.3f}  per seed "
                  + " ".join(f"{x:.3f}" for x in rs))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": "python benchmarks/control/decay_sweep.py " + " ".join(
                argv if argv is not None else sys.argv[1:]), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
