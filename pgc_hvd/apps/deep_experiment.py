"""``pgc-hvd experiment deep [--quick] --out DIR``: the papers' claims on a deep workload
(issue 22, docs/experiments.md "Deep networks").

Workload: MNIST-1D (:func:`pgc_hvd.data.load_mnist1d`, 4000 train / 1000 validation, generated
offline) with the 1-D CNN ``cnn1d`` (three conv layers of 32 channels + linear, 8k parameters),
minibatch ``BATCH`` per partition gradient, ``partition_time = 1``, the master comm model.
Optimizers: plain SGD (``SGD_PLAIN``, the papers' setting) and SGD momentum 0.9 (``SGD_MOM``,
the user's), the latter with the staleness-aware momentum correction
(:mod:`pgc_hvd.control.momentum`, the default) and without it (``momentum_correction=False``).

1. **PGC comparison**, n = 12, exponential delays of mean 1 partition time, ``seeds`` seeds
   (seed = model init, partition, minibatches, delays). At s = 3: DGD, IS-SGD, GC-CR, IS-GC
   (c = 2), PGC-FR, PGC-CR, PGC-BCGC with plain SGD and with momentum 0.9 (remedy on); the
   stale schemes (PGC-*) also with the remedy off; PGC-CR also with straggler policy
   ``cancel``. At s = 1, 2 (the momentum comparison only): DGD and PGC-CR, momentum 0.9, remedy
   on and off. Every run stops once its validation accuracy reaches ``TARGET`` (evaluated every
   ``EVAL_EVERY`` steps), or unreached after ``MAX_TIME`` virtual seconds (or ``MAX_STEPS``
   steps): the same time budget for every scheme, not the same step count, which would cut
   the schemes of shorter steps early. Per group: steps and virtual time to the
   target, median and the seeds' 2.5 / 97.5 percentiles (with 5 seeds: min and max), and per
   seed the ratio to DGD with the same seed, s and optimizer (median, interval); a run that
   never reaches the target counts as infinitely slow (the median is then ``inf`` when half
   the seeds miss). The error decomposition (``err_total``, ``err_coding``, ``err_stale``,
   means over the evaluated steps of seed 0) and the mean implicit / effective momentum of the
   records come with each group.
2. **The design note's experiment** (:func:`pgc_hvd.apps.experiments.staleness_runs`) on the
   same workload with SGD momentum 0.9 (remedy on): 8 heterogeneous workers, log-normal delays
   plus occasional 10-30 s stragglers, DGD, GC-CR and bounded staleness r = 2, c in {2, 4, 8},
   one virtual time budget: time to the validation loss DGD ends at, accuracy at equal time,
   gradient evaluations, utilisation, maximum gradient age.

3. ``--grid staleness``: part 2 at full size, over seeds and workloads
   (:mod:`pgc_hvd.apps.deep_staleness`, :func:`~pgc_hvd.apps.deep_staleness.run_staleness`).

``--quick`` (the tests): s = 1, one seed, every scheme with momentum 0.9 (plus PGC-CR with plain
SGD, with the remedy off and with ``cancel``), at most ``QUICK_STEPS`` steps, a 30 s staleness
budget: it
shows the machinery works and every scheme learns, not the verdicts. ``--jobs J`` runs J
simulations at once (processes, one torch thread each).

Writes DIR/records/<run>.jsonl, DIR/summary.json (``runs``: one row per run; ``groups``: the
figures above; ``claims``: the claims' figures; ``staleness``), DIR/table.md, DIR/plot.png.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from pgc_hvd.metrics.targets import first_at_least

from .deep_staleness import STALE_BUDGET, STALE_CS, STALE_WORKLOADS, run_staleness
from .tables import fmt, interval, log as _log, markdown_table, seed_stats, write_experiment

DATASET, MODEL = "mnist1d", "cnn1d"
N = 12
BATCH = 32
SGD_PLAIN = "sgd:lr=0.5"
SGD_MOM = "sgd:lr=0.1,momentum=0.9"
TARGET = 0.4            # validation accuracy (chance 0.1; the author's small CNN: ~0.94)
EVAL_EVERY = 5
MAX_TIME = 600.0        # virtual seconds (partition times) after which a run stops unreached:
MAX_STEPS = 400         # a time budget, so that schemes with shorter steps get more of them
QUICK_STEPS = 20
STALE = ("pgc-fr", "pgc-cr", "pgc-bcgc")
SCHEMES = [("dgd", {}), ("is-sgd", {}), ("gc-cr", {}), ("is-gc", {"c": 2}), ("pgc-fr", {}),
           ("pgc-cr", {}), ("pgc-bcgc", {})]
ADAM = "adam:lr=0.003"
OPTIMIZERS = {"sgd": (SGD_PLAIN, True), "mom": (SGD_MOM, True), "mom-off": (SGD_MOM, False),
              "adam": (ADAM, True)}
STALENESS_BUDGET = 200.0
DECAYS = (1.0, 0.5, 0.25, 0.0)   # ``--grid decay``: PGC-CR's ring weighted by rho^age


def optimizers(momentum_lr=None) -> dict:
    """``OPTIMIZERS`` with the momentum variants' lr replaced by ``momentum_lr`` when given."""
    if momentum_lr is None:
        return dict(OPTIMIZERS)
    mom = f"sgd:lr={momentum_lr:g},momentum=0.9"
    return {"sgd": OPTIMIZERS["sgd"], "mom": (mom, True), "mom-off": (mom, False),
            "adam": OPTIMIZERS["adam"]}


def grid(quick: bool, seeds: int, which: str = "full", momentum_lr=None,
         max_steps: int = MAX_STEPS, max_time: float = MAX_TIME, decays=DECAYS) -> list[dict]:
    """The runs (see the module docstring), one dict each; ``which="momentum"``: only DGD and
    PGC-CR at s = 3 with momentum 0.9, remedy on and off (``--grid momentum``, e.g. with
    ``--momentum-lr``); ``which="decay"``: DGD, IS-SGD and PGC-CR with its ring weighted by
    age, ``decay`` in ``DECAYS`` (1: the paper's; 0: fresh gradients only), s = 3, momentum 0.9
    with the remedy (``--grid decay``)."""
    specs = []
    opt_specs = optimizers(momentum_lr)

    def add(scheme, opts, s, opt, policy="continue", named=False):
        # named: the scheme's options are part of its name in the tables ("pgc-cr decay=0.5")
        variant = scheme + "".join(f" {k}={v:g}" for k, v in opts.items()) if named else scheme
        for seed in range(1 if quick else seeds):
            label = f"{variant.replace(' ', '_')}_s{s}_{opt}_{policy}_seed{seed}"
            specs.append({"scheme": scheme, "variant": variant, "opts": opts, "s": s, "opt": opt,
                          "policy": policy,
                          "seed": seed, "label": label, "optimizer": opt_specs[opt][0],
                          "correction": opt_specs[opt][1],
                          "max_steps": QUICK_STEPS if quick else int(max_steps),
                          "max_time": float(max_time)})

    if quick:
        for name, opts in SCHEMES:
            add(name, opts, 1, "mom")
        add("dgd", {}, 1, "sgd")
        add("pgc-cr", {}, 1, "sgd")
        add("pgc-cr", {}, 1, "mom-off")
        add("pgc-cr", {}, 1, "mom", "cancel")
        return specs
    if which == "momentum":
        add("dgd", {}, 3, "mom")
        add("pgc-cr", {}, 3, "mom")
        add("pgc-cr", {}, 3, "mom-off")
        return specs
    if which == "staleness":        # part 2 only (run by :func:`run`)
        return specs
    if which == "adam":
        add("dgd", {}, 3, "adam")
        add("is-sgd", {}, 3, "adam")
        add("pgc-cr", {}, 3, "adam")                          # the remedy: decay 1 - beta1
        add("pgc-cr", {"decay": 1.0}, 3, "adam", named=True)  # the paper's ring
        return specs
    if which == "decay":
        add("dgd", {}, 3, "mom")
        add("is-sgd", {}, 3, "mom")
        for rho in decays:
            add("pgc-cr", {"decay": rho}, 3, "mom", named=True)
        return specs
    for name, opts in SCHEMES:
        for opt in ("sgd", "mom"):
            add(name, opts, 3, opt)
        if name in STALE:
            add(name, opts, 3, "mom-off")
    add("pgc-cr", {}, 3, "mom", "cancel")
    for s in (1, 2):
        add("dgd", {}, s, "mom")
        add("pgc-cr", {}, s, "mom")
        add("pgc-cr", {}, s, "mom-off")
    return specs


def run_one(spec: dict, out: str, quick: bool, data_dir=None) -> dict:
    """One simulation of the grid (a process of the pool): its row, and for seed 0 the curve."""
    import torch
    torch.set_num_threads(1)
    from pgc_hvd.delays import Exponential
    from pgc_hvd.schemes import setting_stragglers
    from pgc_hvd.sim.run import simulate
    data = _data(data_dir)
    optimizer, correction = spec["optimizer"], spec["correction"]
    s, seed = spec["s"], spec["seed"]
    t0 = time.perf_counter()
    recs, summ = simulate(spec["scheme"], N, setting_stragglers(spec["scheme"], s), data=data,
                          model=MODEL, optimizer=optimizer,
                          delay=Exponential(1.0, seed=1000 * seed + s + 11),
                          steps=spec["max_steps"], scheme_options=spec["opts"],
                          partition_time=1.0, batch_size=BATCH, seed=seed,
                          straggler_policy=spec["policy"], momentum_correction=correction,
                          eval_every=EVAL_EVERY, eval_train=False, diagnostics=seed == 0,
                          diag_every=EVAL_EVERY,
                          target_accuracy=TARGET, stop_at_target=True,
                          max_time=None if quick else spec["max_time"], overwrite=True,
                          records_path=Path(out) / "records" / f"{spec['label']}.jsonl",
                          label=spec["label"])
    st, tt = first_at_least(recs, TARGET)
    mom = [r.extra["effective_momentum"] for r in recs
           if r.extra.get("effective_momentum") is not None]
    row = {k: spec[k] for k in ("scheme", "s", "opt", "policy", "seed", "label", "optimizer",
                                "correction")}
    row["scheme"] = spec.get("variant", spec["scheme"])
    row.update({k: summ[k] for k in ("steps", "time", "time_per_step", "grad_evals",
                                     "utilisation", "max_age", "err_total_mean",
                                     "err_coding_mean", "err_stale_mean")})
    accs = [r.extra["test_accuracy"] for r in recs if r.extra.get("test_accuracy") is not None]
    # the last evaluated step's (a run stopped by its time budget may end between evaluations)
    row["test_accuracy"] = accs[-1]
    row["test_loss"] = next(r.extra["test_loss"] for r in reversed(recs)
                            if r.extra.get("test_loss") is not None)
    row.update({"steps_to_target": st, "time_to_target": tt, "best_accuracy": max(accs),
                "implicit_momentum_mean": float(np.mean([r.extra.get("implicit_momentum") or 0.0
                                                         for r in recs])),
                "effective_momentum_mean": float(np.mean(mom)) if mom else None,
                "wall_seconds": time.perf_counter() - t0})
    if seed == 0:
        row["curve"] = [(r.time, r.extra["test_accuracy"]) for r in recs
                        if r.extra.get("test_accuracy") is not None]
    return row


def _data(data_dir=None):
    from pgc_hvd.sim.run import prepare_data
    return prepare_data(DATASET, root=data_dir)


def _ratio(a, b):
    """a / b for one seed; a run that never reached the target is infinitely slow: inf when
    only ``a`` missed it, 0 when only DGD (``b``) did, None (left out) when both did."""
    if a is None:
        return None if b is None else math.inf
    return 0.0 if b is None else a / b


def groups(rows: list[dict]) -> list[dict]:
    """One entry per (s, optimizer, policy, scheme) over its seeds (module docstring)."""
    keys = []
    for r in rows:
        k = (r["s"], r["opt"], r["policy"], r["scheme"])
        if k not in keys:
            keys.append(k)
    out = []
    for s, opt, policy, scheme in keys:
        runs = sorted((r for r in rows if (r["s"], r["opt"], r["policy"], r["scheme"]) ==
                       (s, opt, policy, scheme)), key=lambda r: r["seed"])
        # DGD of the same seed, s and optimizer (its remedy and policy change nothing: no stale
        # gradient, and every worker has finished when DGD updates)
        ref_opt = "mom" if opt == "mom-off" else opt
        dgd = {r["seed"]: r for r in rows if r["scheme"] == "dgd" and r["s"] == s
               and r["opt"] == ref_opt and r["policy"] == "continue"}
        g = {"s": s, "opt": opt, "optimizer": runs[0]["optimizer"],
             "momentum_correction": runs[0]["correction"], "policy": policy, "scheme": scheme,
             "seeds": len(runs), "reached": sum(r["steps_to_target"] is not None for r in runs)}
        for key in ("steps_to_target", "time_to_target"):
            g[key] = seed_stats([r[key] for r in runs])
            g[key + "_per_seed"] = [r[key] for r in runs]
            ratios = [_ratio(r[key], dgd[r["seed"]][key]) for r in runs if r["seed"] in dgd]
            ratios = [x for x in ratios if x is not None]
            g[key.replace("_to_target", "_vs_dgd")] = seed_stats(ratios) if ratios else None
        g["time_per_step"] = float(np.mean([r["time_per_step"] for r in runs]))
        g["final_accuracy"] = float(np.median([r["test_accuracy"] for r in runs]))
        for key in ("implicit_momentum_mean", "effective_momentum_mean", "err_total_mean",
                    "err_coding_mean", "err_stale_mean", "max_age"):
            vals = [r[key] for r in runs if r.get(key) is not None]
            g[key] = float(np.mean(vals)) if vals else None
        out.append(g)
    return out


def _find(gs, scheme, s=3, opt="mom", policy="continue"):
    return next((g for g in gs if (g["scheme"], g["s"], g["opt"], g["policy"]) ==
                 (scheme, s, opt, policy)), None)


def claims(gs: list[dict], s: int = 3) -> list[dict]:
    """The PGC paper's claims with this run's figures (medians over seeds, [lo, hi]); the
    verdict is left to the reader of the figures (docs/experiments.md)."""
    out = []

    def med(g, key):
        return None if g is None or g.get(key) is None else g[key]["median"]

    for opt in ("sgd", "mom", "mom-off"):
        cr, fr = _find(gs, "pgc-cr", s, opt), _find(gs, "pgc-fr", s, opt)
        dgd = _find(gs, "dgd", s, "mom" if opt == "mom-off" else opt)
        gc = _find(gs, "gc-cr", s, opt)
        if cr is None or dgd is None:
            continue
        out.append({"claim": "PGC-CR needs fewer steps than DGD", "opt": opt,
                    "figure": "steps PGC-CR / DGD", "value": cr["steps_vs_dgd"]})
        out.append({"claim": "PGC-CR reaches the target in less time than DGD", "opt": opt,
                    "figure": "time PGC-CR / DGD", "value": cr["time_vs_dgd"]})
        if fr is not None:
            out.append({"claim": "PGC-CR faster than PGC-FR", "opt": opt,
                        "figure": "time PGC-CR / PGC-FR (medians)",
                        "value": {"median": _safe_div(med(cr, "time_to_target"),
                                                      med(fr, "time_to_target"))}})
        same = [g for g in gs if g["s"] == s and g["opt"] == opt and g["policy"] == "continue"]
        if same:
            best = min(same, key=lambda g: g["time_to_target"]["median"])
            out.append({"claim": "a PGC scheme reaches the target in the least time", "opt": opt,
                        "figure": "fastest scheme (median time)", "value": best["scheme"]})
        if gc is not None:
            out.append({"claim": "GC is slower per step than DGD", "opt": opt,
                        "figure": "time per step GC-CR / DGD",
                        "value": {"median": gc["time_per_step"] / dgd["time_per_step"]}})
    return out


def _safe_div(a, b):
    if a is None or b is None or b == 0 or math.isinf(b):
        return None
    return a / b


def tables(gs: list[dict], cl: list[dict], stale_rows: list[dict]) -> str:
    from .experiments import STALENESS_COLS
    from .tables import table as _table
    head = ["s", "optimizer", "remedy", "policy", "scheme", "reached", "steps to target",
            "steps vs DGD", "time to target", "time vs DGD", "time/step", "final acc.",
            "mu_imp", "beta_eff", "err_total", "err_coding", "err_stale"]
    body = [[str(g["s"]), g["optimizer"], "on" if g["momentum_correction"] else "off", g["policy"],
             g["scheme"], f"{g['reached']}/{g['seeds']}", interval(g["steps_to_target"]),
             interval(g["steps_vs_dgd"]), interval(g["time_to_target"]), interval(g["time_vs_dgd"]),
             fmt(g["time_per_step"]), fmt(g["final_accuracy"]), fmt(g["implicit_momentum_mean"]),
             fmt(g["effective_momentum_mean"]), fmt(g["err_total_mean"]),
             fmt(g["err_coding_mean"]), fmt(g["err_stale_mean"])] for g in gs]
    cl_body = [[c["claim"], c["opt"], c["figure"],
                c["value"] if isinstance(c["value"], str) else interval(c["value"])] for c in cl]
    return (f"## PGC comparison, n = {N}, validation accuracy target {TARGET} "
            "(median [2.5%, 97.5%] over seeds)\n\n" + markdown_table(head, body)
            + "\n\n## Claims (figures)\n\n" + markdown_table(["claim", "optimizer", "figure", "value"], cl_body)
            + "\n\n## Design note's experiment (8 heterogeneous workers, SGD momentum 0.9)\n\n"
            + _table(stale_rows, STALENESS_COLS))


def plot(path, rows, gs, stale_curves, stale_rows) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .experiments import _plot_staleness
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for ax, opt in ((axes[0, 0], "mom"), (axes[0, 1], "sgd")):
        for r in rows:
            if r["opt"] == opt and r["seed"] == 0 and r["policy"] == "continue" and r.get("curve") \
                    and r["s"] == max(x["s"] for x in rows):
                ax.plot([a for a, _ in r["curve"]], [b for _, b in r["curve"]], label=r["scheme"])
        for r in rows:
            if opt == "mom" and r["opt"] == "mom-off" and r["seed"] == 0 and r.get("curve") \
                    and r["s"] == max(x["s"] for x in rows):
                ax.plot([a for a, _ in r["curve"]], [b for _, b in r["curve"]], ":",
                        label=r["scheme"] + " (remedy off)")
        ax.axhline(TARGET, color="grey", lw=0.6)
        ax.set_title(f"{next((r['optimizer'] for r in rows if r['opt'] == opt), opt)}, seed 0: "
                     "validation accuracy")
        ax.set_xlabel("virtual time (partition times)")
        ax.legend(fontsize=7)
    ax = axes[1, 0]
    sel = [g for g in gs if g["time_vs_dgd"] and g["scheme"] != "dgd"]
    lab = [f"{g['scheme']} s{g['s']} {g['opt']}{' cancel' if g['policy'] == 'cancel' else ''}" for g in sel]
    med = np.array([min(g["time_vs_dgd"]["median"], 5.0) for g in sel])
    lo = np.array([min(g["time_vs_dgd"]["lo"], 5.0) for g in sel])
    hi = np.array([min(g["time_vs_dgd"]["hi"], 5.0) for g in sel])
    ax.barh(np.arange(len(sel)), med, xerr=[med - lo, hi - med], color="C0", alpha=0.7)
    ax.set_yticks(np.arange(len(sel)))
    ax.set_yticklabels(lab, fontsize=6)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_title("time to target / DGD (median, 95% of seeds; capped at 5)")
    _plot_staleness(None, stale_curves, stale_rows, axes=[axes[1, 1], _NullAxis()])
    axes[1, 1].set_title("design note's set-up: validation loss")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class _NullAxis:
    """Swallows the delay-histogram panel of :func:`_plot_staleness`."""

    def __getattr__(self, name):
        return lambda *a, **k: None


def run(out: Path, quick: bool, seeds: int = 5, jobs: int = 1, data_dir=None,
        staleness: bool = True, which: str = "full", momentum_lr=None, max_steps=MAX_STEPS,
        max_time=MAX_TIME, decays=DECAYS):
    """The whole experiment (module docstring); returns the summary dict and the tables."""
    from .experiments import staleness_runs
    data = _data(data_dir)          # generate / cache once before the pool starts
    specs = grid(quick, seeds, which, momentum_lr, max_steps, max_time, decays)
    from .experiments import run_specs
    rows = run_specs(specs, run_one, (str(out), quick, data_dir), jobs, out)
    gs = groups(rows)
    cl = claims(gs, s=1 if quick else 3)
    stale_rows, curves = [], {}
    if staleness:
        stale_rows, curves = staleness_runs(out, data, 30.0 if quick else STALENESS_BUDGET,
                                            model=MODEL, optimizer=SGD_MOM, prefix="staleness_",
                                            tag="deep", batch_size=BATCH, eval_every=1 if quick else 2,
                                            eval_train=False,
                                            diag_every=1 if quick else 4, progress=False)
    plot(out / "plot.png", rows, gs, curves, stale_rows)
    summary = {"experiment": "deep", "quick": quick, "grid": which, "dataset": DATASET,
               "model": MODEL, "n": N, "batch_size": BATCH, "target_accuracy": TARGET,
               "max_steps": QUICK_STEPS if quick else max_steps, "max_time": max_time,
               "optimizers": optimizers(momentum_lr), "groups": gs, "claims": cl,
               "runs": [{k: v for k, v in r.items() if k != "curve"} for r in rows],
               "staleness": stale_rows}
    return summary, tables(gs, cl, stale_rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pgc-hvd experiment deep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute), for tests")
    p.add_argument("--seeds", type=int, default=5, help="seeds per setting (full size; >= 5 for "
                   "the issue's figures)")
    p.add_argument("--jobs", type=int, default=1, help="simulations at once (processes)")
    p.add_argument("--data-dir", default=None, help="cache folder of the generated MNIST-1D "
                   "(default $PGC_HVD_CACHE or ~/.cache/pgc_hvd)")
    p.add_argument("--no-staleness", action="store_true", help="skip part 2 (the design note's "
                   "experiment)")
    p.add_argument("--grid", choices=["full", "momentum", "decay", "adam", "staleness"],
                   default="full",
                   help="momentum: DGD and PGC-CR at s = 3, momentum 0.9, remedy on and off only; "
                   f"decay: DGD, IS-SGD and PGC-CR with decay in {DECAYS} at s = 3, momentum 0.9; "
                   f"adam: DGD, IS-SGD, PGC-CR (the remedy) and PGC-CR decay=1 with {ADAM}; "
                   "staleness: the design note's experiment at full size (issue 35): sync DP, "
                   "GC and bounded staleness r = 2, c in --cs, with the default remedy and "
                   "without, --seeds seeds, on --workloads")
    p.add_argument("--workloads", default="mnist1d",
                   help=f"--grid staleness: comma-separated, of {sorted(STALE_WORKLOADS)}")
    p.add_argument("--cs", default=",".join(str(c) for c in STALE_CS),
                   help="--grid staleness: staleness bounds c, comma-separated")
    p.add_argument("--adaptive", action="store_true",
                   help="--grid staleness: bounded staleness (remedy on and off) also with the "
                   "design note's L_hat control rule (knob auto)")
    p.add_argument("--budget", type=float, default=None,
                   help="--grid staleness: virtual seconds per run (default: the workload's, "
                   f"MNIST-1D {STALE_BUDGET:g}; --quick 30)")
    p.add_argument("--decays", default=",".join(f"{d:g}" for d in DECAYS),
                   help="--grid decay: PGC-CR's decay values, comma-separated, each in [0, 1]")
    p.add_argument("--momentum-lr", type=float, default=None,
                   help=f"lr of the momentum-0.9 runs (default: {SGD_MOM})")
    p.add_argument("--max-steps", type=int, default=MAX_STEPS,
                   help="steps after which a run that has not reached the target stops")
    p.add_argument("--max-time", type=float, default=MAX_TIME,
                   help="virtual seconds after which a run that has not reached the target stops")
    p.add_argument("--force", action="store_true",
                   help="replace the results of an earlier experiment in --out")
    a = p.parse_args(argv)
    if not (math.isfinite(a.max_time) and a.max_time > 0):
        p.error(f"--max-time {a.max_time}: give virtual seconds > 0")
    if a.seeds < 1 or a.jobs < 1 or a.max_steps < 1:
        p.error(f"--seeds {a.seeds} --jobs {a.jobs} --max-steps {a.max_steps}: each must be >= 1")
    if a.momentum_lr is not None and not (math.isfinite(a.momentum_lr) and a.momentum_lr > 0):
        p.error(f"--momentum-lr {a.momentum_lr}: give a learning rate > 0")
    try:
        decays = tuple(float(x) for x in a.decays.split(","))
    except ValueError:
        p.error(f"--decays {a.decays!r}: give numbers in [0, 1] separated by commas, e.g. 1,0.5,0")
    if not all(0.0 <= d <= 1.0 for d in decays):
        p.error(f"--decays {a.decays!r}: each decay must be in [0, 1]")
    workloads = tuple(w.strip() for w in a.workloads.split(",") if w.strip())
    if not workloads or any(w not in STALE_WORKLOADS for w in workloads):
        p.error(f"--workloads {a.workloads!r}: choose from {sorted(STALE_WORKLOADS)}")
    try:
        cs = tuple(int(x) for x in a.cs.split(","))
    except ValueError:
        p.error(f"--cs {a.cs!r}: give integers >= 1 separated by commas, e.g. 2,4,8")
    if not cs or min(cs) < 1:
        p.error(f"--cs {a.cs!r}: each c must be >= 1")
    budget = a.budget if a.budget is not None else (30.0 if a.quick else None)
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        p.error(f"--budget {a.budget}: give virtual seconds > 0")
    out = Path(a.out)
    if (out / "summary.json").exists() and not a.force:
        p.error(f"{out} already holds an experiment's results; choose another --out or pass "
                "--force to replace them")
    import torch
    torch.set_num_threads(1)
    (out / "records").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if a.grid == "staleness":
        summary, md = run_staleness(out, 1 if a.quick else a.seeds, a.jobs, a.data_dir,
                                    workloads, cs, budget, a.quick, a.adaptive)
    else:
        summary, md = run(out, a.quick, a.seeds, a.jobs, a.data_dir,
                          not a.no_staleness and a.grid == "full", a.grid, a.momentum_lr,
                          a.max_steps, a.max_time, decays)
    wall = time.perf_counter() - t0
    summary["wall_seconds"] = wall
    cmd = "pgc-hvd experiment deep " + " ".join(argv if argv is not None else sys.argv[1:])
    write_experiment(out, f"experiment deep{' (quick)' if a.quick else ''}", summary, md, wall,
                     command=cmd)
    print(md)
    _log(f"[deep] done in {wall:.1f} s -> {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
