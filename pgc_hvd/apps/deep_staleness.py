"""``pgc-hvd experiment deep --grid staleness``: the design note's experiment at full size
(:func:`run_staleness`; the command and its other grids: :mod:`pgc_hvd.apps.deep_experiment`).

``--seeds`` seeds (seed = model init, partition, minibatches and the delay draws), on
``--workloads`` (:data:`STALE_WORKLOADS`: MNIST-1D ``cnn1d``, the digits ``cnn``): 8
heterogeneous workers, log-normal delays plus occasional 10-30 s stragglers, sync DP, GC and
bounded staleness r = 2 with the default remedy (each gradient counted once, a step on n - s
gradients of the current model, the mean of its new ones) and with it off (``replay="mean"``),
c in ``--cs``; per (workload, variant): seeds reaching the workload's fixed validation-loss
target, time to it, accuracy at the end of the budget, gradient FLOPs (:func:`forward_flops`),
utilisation, gradient ages, the error decomposition (seed 0); with ``--adaptive`` also under the
design note's L_hat rule.

May import: the layers below ``apps``; :mod:`.experiments` (the delays, the grid's runner),
:mod:`.tables`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from .tables import fmt, interval, markdown_table, seed_stats

SGD_MOM = "sgd:lr=0.1,momentum=0.9"   # deep_experiment's momentum-0.9 SGD

STALE_CS = (2, 4, 8)
STALE_BUDGET = 400.0    # virtual seconds (MNIST-1D), the same for every variant
STALE_WORKLOADS = {
    # target: a fixed validation loss every variant is timed to, picked from DGD's seed-0
    # curve so that DGD reaches it about 2/3 into the budget (MNIST-1D: 1.6 at ~265 s of 400;
    # the digits CNN: 0.4 at ~290 s of 500)
    "mnist1d": {"dataset": "mnist1d", "model": "cnn1d", "optimizer": SGD_MOM, "batch": 32,
                "target_loss": 1.6, "budget": STALE_BUDGET},
    "digits": {"dataset": "digits", "model": "cnn", "optimizer": "sgd:lr=0.05,momentum=0.9",
               "batch": 16, "target_loss": 0.4, "budget": 500.0},
}


def stale_variants(cs=STALE_CS, adaptive: bool = False) -> list:
    """(label, scheme, s, options, adaptive): sync DP, GC (GC-CR, s = 1), bounded staleness
    r = 2 with the default remedy (``replay="once"``, ``fire="current"``, ``normalize=True``:
    what ``simulate`` builds) and with it off
    (``replay="mean"``, the note's); ``adaptive``: both again with the design note's L_hat
    control rule (:mod:`pgc_hvd.control`, knob "auto": c, then lr)."""
    out = [("sync-dp", "dgd", 0, {}, False), ("gc", "gc-cr", 1, {}, False)]
    out += [(f"bounded c={c}", "bounded-staleness", 1, {"r": 2, "c": c}, False) for c in cs]
    out += [(f"bounded c={c} remedy off", "bounded-staleness", 1,
             {"r": 2, "c": c, "replay": "mean"}, False) for c in cs]
    if adaptive:
        out += [(f"bounded c={c} + rule", "bounded-staleness", 1, {"r": 2, "c": c}, True)
                for c in cs]
        out += [(f"bounded c={c} remedy off + rule", "bounded-staleness", 1,
                 {"r": 2, "c": c, "replay": "mean"}, True) for c in cs]
    return out


def stale_grid(seeds: int, workloads=("mnist1d",), cs=STALE_CS, budget=None,
               quick: bool = False, adaptive: bool = False) -> list[dict]:
    """The runs of ``--grid staleness``; ``budget`` None: each workload's own."""
    specs = []
    for wl in workloads:
        for label, scheme, s, opts, rule in stale_variants(cs, adaptive):
            for seed in range(seeds):
                specs.append({"workload": wl, "variant": label, "scheme": scheme, "s": s,
                              "opts": opts, "seed": seed, "adaptive": rule,
                              "budget": float(budget or STALE_WORKLOADS[wl]["budget"]),
                              "quick": quick,
                              "label": f"stale_{wl}_{label.replace(' ', '_').replace('=', '')}"
                                       f"_seed{seed}"})
    return specs


def forward_flops(model, x) -> float:
    """FLOPs of one forward pass of ``model`` on ``x`` (2 per multiply-add of the Conv / Linear
    layers; activations and pooling left out)."""
    import torch
    total = [0.0]

    def hook(mod, inp, out):
        if isinstance(mod, (torch.nn.Conv1d, torch.nn.Conv2d)):
            k = mod.weight[0].numel()           # in_channels / groups * kernel
            total[0] += 2.0 * out.numel() * k
        elif isinstance(mod, torch.nn.Linear):
            total[0] += 2.0 * out.numel() * mod.in_features

    hs = [m.register_forward_hook(hook) for m in model.modules()
          if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear))]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hs:
            h.remove()
    return total[0]


def run_stale_one(spec: dict, out: str, data_dir=None) -> dict:
    """One run of the staleness grid (a process of the pool): its row (and seed 0's curve)."""
    import torch
    torch.set_num_threads(1)
    from pgc_hvd.metrics.targets import first_reaching
    from pgc_hvd.models import build_task
    from pgc_hvd.sim.run import prepare_data, simulate
    from .experiments import STALENESS_FACTORS, staleness_delay
    wl = STALE_WORKLOADS[spec["workload"]]
    data = prepare_data(wl["dataset"], root=data_dir)
    seed = spec["seed"]
    t0 = time.perf_counter()
    recs, summ = simulate(spec["scheme"], len(STALENESS_FACTORS), spec["s"], data=data,
                          model=wl["model"], optimizer=wl["optimizer"],
                          delay=staleness_delay(seed), steps=100000, max_time=spec["budget"],
                          scheme_options=spec["opts"], partition_time=1.0,
                          batch_size=wl["batch"], seed=seed, eval_every=2, eval_train=False,
                          overwrite=True, adaptive=spec.get("adaptive", False),
                          **({"rule": {"knob": "auto"}} if spec.get("adaptive") else
                             {"diagnostics": seed == 0, "diag_every": 4}),
                          records_path=Path(out) / "records" / f"{spec['label']}.jsonl",
                          label=spec["label"])
    target = wl["target_loss"]
    st, tt = first_reaching(recs, target, key="test_loss")
    evals = [r for r in recs if r.extra.get("test_accuracy") is not None]
    task = build_task(wl["model"], data[0], seed=0)
    x1 = torch.as_tensor(data[0].X[:1], dtype=torch.float32)
    flops = 3.0 * forward_flops(task.model, x1) * wl["batch"] * summ["grad_evals"]
    row = {k: spec[k] for k in ("workload", "variant", "scheme", "seed", "label", "budget")}
    row.update({k: summ.get(k) for k in ("steps", "time", "grad_evals", "utilisation",
                                         "max_age", "diverged", "err_total_mean",
                                         "err_coding_mean", "err_stale_mean")})
    row.update({"replay": spec["opts"].get("replay", "once" if spec["scheme"] ==
                                           "bounded-staleness" else None),
                "c": spec["opts"].get("c"), "target_loss": target,
                "steps_to_target": st, "time_to_target": tt,
                "accuracy_at_equal_time": evals[-1].extra["test_accuracy"] if evals else None,
                "loss_at_equal_time": evals[-1].extra.get("test_loss") if evals else None,
                "control_actions": summ.get("control_actions"),
                "best_accuracy": max((r.extra["test_accuracy"] for r in evals), default=None),
                "grad_flops": flops,
                "mean_age": float(np.mean([r.mean_age or 0.0 for r in recs])),
                "weight_sum_mean": float(np.mean([r.extra.get("weight_sum", 1.0) for r in recs])),
                "wall_seconds": time.perf_counter() - t0})
    if row["diverged"] is not None:   # ended early: at equal time its model is non-finite
        row["accuracy_at_equal_time"] = None
    if seed == 0:
        row["curve"] = [(r.time, r.extra["test_loss"]) for r in evals]
    return row


def stale_groups(rows: list[dict]) -> list[dict]:
    """Per (workload, variant) over seeds: reached k/seeds, time to the target (median [lo, hi];
    unreached = inf), accuracy at equal time, grad evals and FLOPs, utilisation, max age, the
    error decomposition (seed 0), diverged count."""
    keys = []
    for r in rows:
        if (r["workload"], r["variant"]) not in keys:
            keys.append((r["workload"], r["variant"]))
    out = []
    for wl, var in keys:
        runs = sorted((r for r in rows if (r["workload"], r["variant"]) == (wl, var)),
                      key=lambda r: r["seed"])
        g = {"workload": wl, "variant": var, "seeds": len(runs), "c": runs[0]["c"],
             "replay": runs[0]["replay"], "target_loss": runs[0]["target_loss"],
             "reached": sum(r["time_to_target"] is not None for r in runs),
             "diverged": sum(r["diverged"] is not None for r in runs),
             "time_to_target": seed_stats([r["time_to_target"] for r in runs]),
             "time_to_target_per_seed": [r["time_to_target"] for r in runs],
             "accuracy_at_equal_time": seed_stats([r["accuracy_at_equal_time"] or 0.0 for r in runs]),
             "accuracy_per_seed": [r["accuracy_at_equal_time"] for r in runs]}
        for key in ("grad_evals", "grad_flops", "utilisation", "max_age", "steps", "mean_age",
                    "weight_sum_mean", "control_actions"):
            g[key] = seed_stats([r[key] for r in runs if r.get(key) is not None])
        for key in ("err_total_mean", "err_coding_mean", "err_stale_mean"):
            vals = [r[key] for r in runs if r.get(key) is not None]
            g[key] = float(np.mean(vals)) if vals else None
        out.append(g)
    return out


def stale_claims(gs: list[dict]) -> list[dict]:
    """The design note's claim per workload and c, with the figures the verdict rests on."""
    out = []
    for wl in dict.fromkeys(g["workload"] for g in gs):
        by = {g["variant"]: g for g in gs if g["workload"] == wl}
        dgd, gc = by.get("sync-dp"), by.get("gc")
        for var, g in by.items():
            if not var.startswith("bounded"):
                continue
            med = g["time_to_target"]["median"]
            out.append({
                "workload": wl, "variant": var, "reached": f"{g['reached']}/{g['seeds']}",
                "time_to_target": g["time_to_target"],
                "faster_than_dgd": dgd is not None and med < dgd["time_to_target"]["median"],
                "faster_than_gc": gc is not None and med < gc["time_to_target"]["median"],
                "utilisation_higher": all(
                    b is not None and g["utilisation"]["median"] > b["utilisation"]["median"]
                    for b in (dgd, gc)),
                "accuracy_at_equal_time": g["accuracy_at_equal_time"],
                "accuracy_vs_best_baseline": g["accuracy_at_equal_time"]["median"] - max(
                    b["accuracy_at_equal_time"]["median"] for b in (dgd, gc) if b is not None),
                "diverged": g["diverged"]})
    return out


def stale_tables(gs: list[dict], cl: list[dict]) -> str:
    head = ["workload", "variant", "reached", "time to target (s)", "acc. at equal time",
            "steps", "grad evals", "grad GFLOPs", "utilisation", "max age", "mean age",
            "weight/step", "err_total", "err_stale", "err_coding", "rule actions", "diverged"]
    body = []
    for g in gs:
        fl = g["grad_flops"]
        body.append([g["workload"], g["variant"], f"{g['reached']}/{g['seeds']}",
                     interval(g["time_to_target"]), interval(g["accuracy_at_equal_time"]),
                     interval(g["steps"]), interval(g["grad_evals"]),
                     interval({k: (None if v is None else v / 1e9) for k, v in fl.items()}),
                     interval(g["utilisation"]), interval(g["max_age"]), interval(g["mean_age"]),
                     interval(g["weight_sum_mean"]), fmt(g["err_total_mean"]),
                     fmt(g["err_stale_mean"]), fmt(g["err_coding_mean"]),
                     interval(g["control_actions"]) if g["control_actions"]["median"] is not None
                     else "-", f"{g['diverged']}/{g['seeds']}"])
    cl_body = [[c["workload"], c["variant"], c["reached"], interval(c["time_to_target"]),
                "yes" if c["faster_than_dgd"] else "no", "yes" if c["faster_than_gc"] else "no",
                "yes" if c["utilisation_higher"] else "no",
                fmt(c["accuracy_vs_best_baseline"]), str(c["diverged"])] for c in cl]
    target = ", ".join(f"{wl} {STALE_WORKLOADS[wl]['target_loss']}"
                       for wl in dict.fromkeys(g["workload"] for g in gs))
    return ("## The design note's experiment: 8 heterogeneous workers, log-normal delays + "
            f"10-30 s stragglers, r = 2; validation-loss target {target} "
            "(median [2.5%, 97.5%] over seeds; unreached = inf)\n\n" + markdown_table(head, body)
            + "\n\n## The design note's claim per variant\n\n"
            + markdown_table(["workload", "variant", "reached", "time to target",
                              "faster than DGD", "faster than GC", "utilisation higher",
                              "acc. vs best baseline", "diverged"], cl_body))


def stale_plot(path, rows) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    wls = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(wls), figsize=(7 * len(wls), 4.8), squeeze=False)
    for ax, wl in zip(axes[0], wls):
        for r in rows:
            if r["workload"] == wl and r.get("curve"):
                pts = [(a, b) for a, b in r["curve"] if b is not None and math.isfinite(b)]
                ls = ":" if "remedy off" in r["variant"] else "-"
                ax.plot([a for a, _ in pts], [b for _, b in pts], ls, label=r["variant"])
        ax.axhline(STALE_WORKLOADS[wl]["target_loss"], color="grey", lw=0.6)
        ax.set_yscale("log")
        ax.set_ylim(top=3.0)
        ax.set_xlabel("virtual time (s)")
        ax.set_ylabel("validation loss")
        ax.set_title(f"{wl}, seed 0 (dotted: remedy off)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_staleness(out: Path, seeds: int, jobs: int, data_dir=None, workloads=("mnist1d",),
                  cs=STALE_CS, budget=None, quick: bool = False, adaptive: bool = False):
    """``--grid staleness``: the design note's experiment at full size; (summary, tables)."""
    from pgc_hvd.sim.run import prepare_data
    for wl in workloads:                 # generate / cache once before the pool starts
        prepare_data(STALE_WORKLOADS[wl]["dataset"], root=data_dir)
    specs = stale_grid(seeds, workloads, cs, budget, quick, adaptive)
    from .experiments import run_specs
    rows = run_specs(specs, run_stale_one, (str(out), data_dir), jobs, out)
    gs = stale_groups(rows)
    cl = stale_claims(gs)
    stale_plot(out / "plot.png", rows)
    summary = {"experiment": "deep", "grid": "staleness", "quick": quick,
               "workloads": {wl: STALE_WORKLOADS[wl] for wl in workloads}, "cs": list(cs),
               "budget": budget or {wl: STALE_WORKLOADS[wl]["budget"] for wl in workloads},
               "seeds": seeds, "n": 8,
               "groups": gs, "claims": cl,
               "runs": [{k: v for k, v in r.items() if k != "curve"} for r in rows]}
    return summary, stale_tables(gs, cl)
