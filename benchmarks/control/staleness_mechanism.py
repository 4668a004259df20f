"""What breaks bounded staleness under momentum 0.9 on a deep net? (simulator)

    python benchmarks/control/staleness_mechanism.py [--seeds 0,1,2] [--cs 2,4,8] [--jobs 2]
                                             [--budget 200] [--json PATH]

The design note's set-up (``pgc_hvd.apps.experiments.staleness_delay``: 8 heterogeneous
workers, log-normal delays, 10-30 s stragglers with p = 0.02 per worker-step, 1 s per
partition gradient) on MNIST-1D with ``cnn1d``, minibatch 32, bounded staleness r = 2,
c in ``--cs``, a virtual budget of ``--budget`` s. Variants, each separating one mechanism:

* ``mean`` (the note's rule: the whole table at every step), SGD lr 0.1 momentum 0.9: the
  failing configuration;
* ``mean, plain SGD lr 0.1``: the user's momentum removed, same lr (is the momentum on top
  the breaker?);
* ``mean, plain SGD lr 1.0``: momentum removed, same total gain lr / (1 - beta);
* ``split``: every entry at every step with weight w_i / c, so an entry's total weight over
  its (at most c) uses is at most w_i: the replay kept, its amplification removed;
* ``age``: w_i / (1 + a_i) at every step (staleness-aware lr, eta / tau);
* ``once``: each gradient counted once, at its first use, a step per new gradient (m =
  ``min_fresh`` = 1: no replay, the delay kept), with plain SGD lr 0.1 and 1.0, weighted
  1 / (1 + a) (``once-age``) or rho^a (``once decay RHO``), with the momentum correction, with
  DC-ASGD, DC-ASGD-a or Gap-Aware on top;
* ``once m=M``: a step waits for M new gradients (m = 7 = n - s: the remedy's first form);
* ``default``: what the engines build (m = n - s gradients of the current model, the mean of
  the step's new ones: ``fire="current"``, ``normalize=True``);
* ``mean`` with the momentum correction and with DC-ASGD-a;
* plain SGD lr 0.5 (the deep experiment's): DGD, the note's rule and once with m = 7;
* DGD with momentum 0.9 and with plain SGD lr 1.0, for reference.

Per run: final and best validation accuracy, the validation loss at the end, whether it
diverged, steps, and the replay statistics read from the records: ``uses_per_grad`` (mean
number of updates a table entry enters), ``max_uses``, ``replay_steps`` (share of steps whose
every entry had been used before: pure replays), ``weight_per_grad`` (mean total weight of
a gradient over its uses, in units of w_i = 1/n: the lr amplification) and ``mean_age``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

MOM = "sgd:lr=0.1,momentum=0.9"
SGD01 = "sgd:lr=0.1"
SGD1 = "sgd:lr=1.0"
SGD05 = "sgd:lr=0.5"      # the deep experiment's plain SGD (the papers' setting)


def variants(cs):
    """(label, scheme, optimizer, replay, c, extra); extra: None, "momcorr" (the momentum
    correction of pgc_hvd.control.momentum on this scheme), "dc" (DC-ASGD, lambda 0.04),
    "dca" (DC-ASGD-a, adaptive lambda 2 / sqrt(mean square)), "gap" (Gap-Aware)."""
    B = "bounded-staleness"
    out = [("dgd", "dgd", MOM, None, 0, None), ("dgd plain lr 0.1", "dgd", SGD01, None, 0, None),
           ("dgd plain lr 0.5", "dgd", SGD05, None, 0, None)]
    for c in cs:
        out += [(f"mean c={c}", B, MOM, "mean", c, None),
                (f"mean plain lr 0.1 c={c}", B, SGD01, "mean", c, None),
                (f"mean plain lr 1.0 c={c}", B, SGD1, "mean", c, None),
                (f"split c={c}", B, MOM, "split", c, None),
                (f"age c={c}", B, MOM, "age", c, None),
                (f"mean momcorr c={c}", B, MOM, "mean", c, "momcorr"),
                (f"mean dc-asgd-a c={c}", B, MOM, "mean", c, "dca"),
                (f"once c={c}", B, MOM, "once", c, None),
                (f"once plain lr 0.1 c={c}", B, SGD01, "once", c, None),
                (f"once plain lr 1.0 c={c}", B, SGD1, "once", c, None),
                (f"once-age c={c}", B, MOM, "once-age", c, None),
                (f"once decay 0.5 c={c}", B, MOM, "once:0.5", c, None),
                (f"once decay 0.25 c={c}", B, MOM, "once:0.25", c, None),
                (f"once decay 0.1 c={c}", B, MOM, "once:0.1", c, None),
                (f"once m=4 c={c}", B, MOM, "once:1:4", c, None),
                (f"once m=7 c={c}", B, MOM, "once:1:7", c, None),
                (f"default c={c}", B, MOM, "default", c, None),
                (f"once m=7 decay 0.5 c={c}", B, MOM, "once:0.5:7", c, None),
                (f"mean plain lr 0.5 c={c}", B, SGD05, "mean", c, None),
                (f"once m=7 plain lr 0.5 c={c}", B, SGD05, "once:1:7", c, None),
                (f"once momcorr c={c}", B, MOM, "once", c, "momcorr"),
                (f"once dc-asgd c={c}", B, MOM, "once", c, "dc"),
                (f"once dc-asgd-a c={c}", B, MOM, "once", c, "dca"),
                (f"once gap-aware c={c}", B, MOM, "once", c, "gap")]
    return out


class Compensation:
    """A ``step_hook`` that rewrites g_hat = sum_u w_u m_u from the decision's messages:

    * DC-ASGD (Zheng et al. 2017): m_u + lambda m_u * m_u * (beta_t - beta_{v_u}); "dc":
      lambda = 0.04 (MXNet's default), "dca": lambda_t = 2 / sqrt(MS_t), MS_t the running
      mean square of g_hat (0.95 decay), the paper's adaptive variant;
    * Gap-Aware (Barkai et al. 2020): m_u / max(1, G_u), G_u = |beta_t - beta_{v_u}| / C, C the
      running mean of |beta_{t+1} - beta_t| (elementwise)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.ms = None
        self.step_size = None
        self.prev = None

    def __call__(self, sim, step, decision, g_hat, extra):
        import torch
        x_t = sim.snapshots[step]
        if self.prev is not None:
            delta = (x_t - self.prev).abs()
            self.step_size = (delta if self.step_size is None
                              else 0.95 * self.step_size + 0.05 * delta)
        self.prev = x_t.clone()
        out = torch.zeros_like(g_hat)
        for u in decision.uses:
            m = sim.store[(u.worker, u.step)]["dense"].to(g_hat.dtype)
            gap = x_t - sim.snapshots[u.version]
            if self.kind in ("dc", "dca"):
                lam = 0.04
                if self.kind == "dca":
                    lam = 2.0 / (self.ms.sqrt() + 1e-7) if self.ms is not None else 0.0
                m = m + lam * m * m * gap
            elif self.kind == "gap" and self.step_size is not None:
                m = m / torch.clamp(gap.abs() / (self.step_size + 1e-12), min=1.0)
            out += float(u.weight) * m
        g_hat.copy_(out)
        sq = g_hat * g_hat
        self.ms = sq if self.ms is None else 0.95 * self.ms + 0.05 * sq


def replay_stats(recs, n: int) -> dict:
    """Replays read from the records: every use is (worker, version) of a table entry."""
    uses: dict = {}
    replay_steps = 0
    for r in recs:
        fresh = 0
        for w, v in zip(r.workers_used, r.versions):
            key = (w, v)
            fresh += key not in uses
            uses[key] = uses.get(key, 0) + 1
        replay_steps += fresh == 0
    counts = list(uses.values()) or [0]
    return {"uses_per_grad": statistics.fmean(counts), "max_uses": max(counts),
            "replay_steps": replay_steps / max(1, len(recs))}


def _run(job):
    label, scheme, opt, replay, c, extra, seed, budget = job
    import math
    import torch
    torch.set_num_threads(1)
    import pgc_hvd.sim.engine as engine
    hook = None
    original = engine.applies_to
    if extra == "momcorr":      # the pipelined schemes' momentum correction, on this scheme
        engine.applies_to = lambda scheme: True
    elif extra is not None:
        hook = Compensation(extra)
    try:
        return _simulate(label, scheme, opt, replay, c, seed, budget, hook)
    finally:
        engine.applies_to = original


def _simulate(label, scheme, opt, replay, c, seed, budget, hook):
    import math
    from pgc_hvd.apps.experiments import STALENESS_FACTORS, staleness_delay
    from pgc_hvd.sim.run import prepare_data, simulate
    data = prepare_data("mnist1d")
    opts = {} if scheme == "dgd" else {"r": 2, "c": c, "replay": replay.split(":")[0]}
    if replay == "default":         # what the engines build: the remedy's every part
        opts = {"r": 2, "c": c}
    if replay and replay.startswith("once"):
        opts["min_fresh"] = 1       # "once" here: a step per new gradient unless m is given
    if ":" in (replay or ""):       # "once:RHO[:M]": counted once with weight rho^age, at
        parts = replay.split(":")   # least M new gradients per step
        opts["decay"] = float(parts[1])
        if len(parts) > 2:
            opts["min_fresh"] = int(parts[2])
    recs, summ = simulate(scheme, len(STALENESS_FACTORS), 1, data=data, model="cnn1d",
                          optimizer=opt, delay=staleness_delay(seed), steps=100000,
                          max_time=budget, scheme_options=opts, partition_time=1.0,
                          batch_size=32, seed=seed, eval_every=2, eval_train=False,
                          diagnostics=False, step_hook=hook)
    accs = [r.extra["test_accuracy"] for r in recs if r.extra.get("test_accuracy") is not None]
    loss = next((r.extra["test_loss"] for r in reversed(recs)
                 if r.extra.get("test_loss") is not None), None)
    row = {"variant": label, "seed": seed, "steps": len(recs), "time": recs[-1].time,
           "final_acc": accs[-1] if accs else None, "best_acc": max(accs) if accs else None,
           "final_loss": loss if loss is None or math.isfinite(loss) else None,
           "diverged": summ.get("diverged"), "grad_evals": summ["grad_evals"],
           "mean_age": statistics.fmean(r.mean_age for r in recs if r.mean_age is not None),
           "max_age": max(r.max_age for r in recs)}
    if scheme != "dgd":
        row.update(replay_stats(recs, len(STALENESS_FACTORS)))
        ws = [r.extra.get("weight_sum") for r in recs]
        if replay == "mean":        # every use carries w_i = 1/n
            row["weight_per_grad"] = row["uses_per_grad"]
        elif ws and all(w is not None for w in ws):
            # total weight applied / gradients used, in units of 1/n
            row["weight_per_grad"] = (sum(ws) * len(STALENESS_FACTORS)
                                      / max(1, len({(w, v) for r in recs
                                                    for w, v in zip(r.workers_used, r.versions)})))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--cs", default="2,4,8")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--budget", type=float, default=200.0)
    p.add_argument("--only", default=None, help="comma-separated variant prefixes to run")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    seeds = [int(x) for x in a.seeds.split(",")]
    cs = [int(x) for x in a.cs.split(",")]
    vs = variants(cs)
    if a.only:
        keep = [x.strip() for x in a.only.split(",")]
        vs = [v for v in vs if any(v[0].startswith(k) for k in keep)]
    jobs = [(*v, seed, a.budget) for v in vs for seed in seeds]
    with ProcessPoolExecutor(a.jobs) as pool:
        rows = []
        for row in pool.map(_run, jobs):
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\nvariant | final acc (median) | best acc | diverged | steps | uses/grad | "
          "weight/grad | replay steps | mean age")
    for v in vs:
        rs = [r for r in rows if r["variant"] == v[0]]
        def med(k):
            return statistics.median([r[k] for r in rs if r.get(k) is not None]
                                     or [float("nan")])
        print(f"{v[0]} | {med('final_acc'):.3f} | {med('best_acc'):.3f} | "
              f"{sum(r['diverged'] is not None for r in rs)}/{len(rs)} | {med('steps'):.0f} | "
              f"{med('uses_per_grad'):.2f} | {med('weight_per_grad'):.2f} | "
              f"{med('replay_steps'):.2f} | {med('mean_age'):.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": "python benchmarks/control/staleness_mechanism.py "
                       + " ".join(argv if argv is not None else sys.argv[1:]),
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
