"""``pgc-hvd advise RUN_DIR``: which scheme and which s suit this cluster.

1. **Delays per rank.** From a real run's ``records.jsonl`` (``pgc-hvd train``): rank r's busy
   seconds at step t are k_t * tau + d_{r,t} (k_t partitions evaluated by the scheme's work
   plan, tau the compute time of one partition, d the straggler delay). tau is ``--compute-time``
   plus the framework's own forward/backward, estimated as the smallest busy/k over all ranks
   and steps (the shift of a shifted exponential's MLE) unless ``--partition-time`` is given.
   The busy seconds are exact per-step compute times only where every rank computes every step
   (an all-wait run: DGD, or any run whose steps used all ranks); for other runs they are
   per-step windows, and the fit is rougher (say so in the output). A delay trace
   (``simulate --save-trace``) gives d directly. For each rank, exponential (MLE mean) and
   log-normal (MLE mu, sigma) are fitted and the one with the smaller AIC kept.
2. **Protocol cost.** The real runtime spends time per step outside compute (control rounds,
   allgather, decode): p_t = step_time_t - max over the ranks used of busy_t; its mean is charged
   as a fixed per-step decode time in the simulator.
3. **Candidates.** DGD, and for s in ``--stragglers``: IS-SGD, GC-CR, PGC-CR, BCGC, simulated with
   the fitted per-rank delays, tau, the protocol cost, the run's number of steps and the model
   and data given (``--model``, ``--dataset``, ``--batch-size``, ``--lr``), ``continue`` policy.
4. **Ranking.** By predicted time to accuracy: simulated time to ``--target-accuracy``
   (validation accuracy, the simulator's 20% held-out split) when given, else to the target loss
   (the run's ``target_loss``; the simulator's loss is the full training loss), where reached,
   else by expected progress per second from :mod:`pgc_hvd.control.progress_model`, the model
   the online rule ``stragglers="auto"`` uses: time per step from the order statistics of the
   observed per-rank delays plus the compute of the k partitions a step evaluates and the
   protocol cost, progress per step from the staleness effect (lambda measured by these
   simulations where a stale candidate and DGD both reached the target, else the default).
   Every candidate's row carries that model's figures (``model``). Steps to a target depend on the optimizer: every candidate is
   simulated with the user's optimizer (``--optimizer``, default SGD with the run's lr and
   momentum 0.9, as ``pgc-hvd train``) and the runtime's default staleness-aware momentum
   correction (``--momentum-correction off`` to predict without it), and the report says
   which it assumed -- a scheme that is fast per step but stale can lose on time to accuracy;
   **confidence**: ``--bootstrap`` B replicates, each refitting the delays on a resample of
   every rank's delays and simulating with a fresh delay seed (timing only, a cheap model):
   mean +- sd of each candidate's time per step (and time to target = steps to target x that),
   and the share of replicates in which the recommended configuration is within 5% of the
   fastest time per step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from pgc_hvd.metrics.records import read_records
from pgc_hvd.delays import DelayTrace, Exponential, LogNormal, PerWorker


# ------------------------------------------------------------------------------ fitting
def fit_delays(x, seed: int = 0) -> dict:
    """MLE fits of one rank's delays; returns the AIC-best as ``model`` plus both fits.

    Exact zeros: tau is estimated as the smallest busy/k (the shifted exponential's MLE of the
    shift), so the sample holding that minimum has delay 0 by construction -- an artifact of the
    shift, at which a log-normal's log-likelihood is -inf (clipping it to 1e-6 instead once made
    sigma ~5 and predictions 30x too slow). When zeros are at most max(1, 5%) of the samples they
    are taken as such artifacts and both models are fitted to the positive delays. More zeros
    mean steps without delay (a mixture no log-normal describes): the exponential is fitted to
    all samples and chosen.
    """
    x = np.asarray(x, dtype=float)
    x = np.where(np.isfinite(x), np.maximum(x, 0.0), 0.0)
    zeros = int(np.sum(x <= 1e-12))
    positive = x[x > 1e-12]
    out = {"n_samples": int(len(x)), "zeros": zeros}
    if len(positive) < 2 or zeros > max(1, int(0.05 * len(x))):
        mean = float(max(x.mean(), 1e-9))
        return {**out, "kind": "exp", "model": Exponential(mean, seed=seed), "exp_mean": mean,
                "ln_mu": None, "ln_sigma": None, "aic_exp": None, "aic_lognormal": None}
    x = positive
    mean = float(x.mean())
    ll_exp = float(-len(x) * math.log(mean) - x.sum() / mean)
    lx = np.log(x)
    mu, sigma = float(lx.mean()), float(max(lx.std(), 1e-6))
    ll_ln = float(np.sum(-lx - math.log(sigma * math.sqrt(2 * math.pi)) - (lx - mu) ** 2 / (2 * sigma ** 2)))
    aic_exp, aic_ln = 2 * 1 - 2 * ll_exp, 2 * 2 - 2 * ll_ln
    if aic_exp <= aic_ln:
        model, kind = Exponential(mean, seed=seed), "exp"
    else:
        model, kind = LogNormal(mu, sigma, seed=seed), "lognormal"
    return {**out, "kind": kind, "model": model, "exp_mean": mean, "ln_mu": mu, "ln_sigma": sigma,
            "aic_exp": aic_exp, "aic_lognormal": aic_ln}


def observations(run_dir: Path, partition_time: Optional[float] = None) -> dict:
    """Delays per rank, tau, protocol cost and run facts from RUN_DIR (records or a trace)."""
    run_dir = Path(run_dir)
    trace_files = [run_dir] if run_dir.is_file() else sorted(run_dir.glob("*trace*.json"))
    rec_path = run_dir / "records.jsonl" if run_dir.is_dir() else None
    if rec_path is None or not rec_path.exists():
        if not trace_files:
            raise FileNotFoundError(f"{run_dir}: neither records.jsonl nor a delay trace")
        tr = DelayTrace.load(trace_files[0])
        workers, last = tr.span()
        if not workers:
            raise ValueError(f"{trace_files[0]}: the delay trace is empty")
        n = 1 + workers[-1]
        per = [[v for (w, _), v in sorted(tr.delays.items()) if w == r] for r in range(n)]
        return {"source": "trace", "n": n, "delays": per, "tau": partition_time, "protocol": 0.0,
                "steps": 1 + last, "scheme": None, "s": None,
                "all_wait": True, "observed_time_per_step": None}
    recs = [r for r in read_records(rec_path) if r.get("busy")]
    if not recs:
        raise ValueError(f"{rec_path}: no records with per-rank busy seconds")
    n, scheme_name, s = recs[0]["n"], recs[0]["scheme"], recs[0]["s"]
    from pgc_hvd.schemes import get_scheme, setting_stragglers
    # dgd takes s = 0 only; records written before it refused s > 0 may say the setting's s
    sch = get_scheme(scheme_name, n, setting_stragglers(scheme_name, s))
    k = np.array([[max(1, len(sch.work_plan(w, r["step"]).evaluate)) for w in range(n)] for r in recs], float)
    busy = np.array([r["busy"] for r in recs], dtype=float)
    all_wait = all(len(r["workers_used"]) == n for r in recs)
    # warm-up steps (step 0 of pipelined schemes evaluate c partitions) and the first step
    # (process start) are kept for tau but the first step is dropped from the delay fit
    body = slice(1, None) if len(recs) > 5 else slice(None)
    if partition_time is None:
        tau = float(np.min((busy / k)[body]))
    else:
        tau = float(partition_time)
    d = np.clip(busy - k * tau, 0.0, None)[body]
    per = [d[:, r].tolist() for r in range(n)]
    st = np.array([r["step_time"] for r in recs], dtype=float)
    used_max = np.array([max(r["busy"][w] for w in r["workers_used"]) for r in recs])
    prot = (st - used_max)[body]
    # records of the runtime's control plane (or of the simulator's collective model) carry
    # control_ops: a step at s >= 1 there pays a control round the s = 0 path does not
    from pgc_hvd.control.progress_model import DEFAULT_ROUND_COST
    plane = any("control_ops" in (r.get("extra") or {}) for r in recs)
    return {"source": "records", "n": n, "delays": per, "tau": tau,
            "round_cost": DEFAULT_ROUND_COST if plane else 0.0,
            "protocol": float(max(0.0, np.mean(prot))), "protocol_median": float(np.median(prot)),
            "steps": len(recs), "scheme": scheme_name, "s": s, "all_wait": all_wait,
            "observed_time_per_step": float(np.mean(st[body]))}


# ------------------------------------------------------------------------------ simulation
def candidates(n: int, s_values) -> list[tuple[str, int]]:
    out = [("dgd", 0)]
    for s in s_values:
        if 1 <= s < n:
            out += [("is-sgd", s), ("gc-cr", s), ("pgc-cr", s), ("bcgc", s)]
    return out


def simulate_candidate(scheme, s, n, delay, tau, protocol, steps, model, dataset, batch_size,
                       lr, data, seed=0, timing_only=False, optimizer=None,
                       momentum_correction=True):
    from pgc_hvd.sim.comm import CommModel
    from pgc_hvd.sim.run import simulate
    recs, summ = simulate(scheme, n, s, data=data, dataset=dataset,
                          model="softmax" if timing_only else model,
                          optimizer=optimizer or f"sgd:lr={lr}", delay=delay, steps=steps,
                          seed=seed, partition_time=tau, decode_time=protocol,
                          batch_size=batch_size, comm=CommModel(0.0, 1e15), diagnostics=False,
                          eval_every=0 if timing_only else 1,
                          momentum_correction=momentum_correction)
    return recs, summ


def attach_model(rows: list, obs: dict, seed: int = 0) -> float:
    """Each row's ``model``: :func:`pgc_hvd.control.progress_model.predict` of its (scheme, s)
    with the observed per-rank delays, tau and protocol cost; lambda (the staleness effect) is
    the median of the values the simulations measured (steps to target of a stale candidate
    against DGD's), else the default. Returns the lambda used."""
    from pgc_hvd.control.progress_model import (DEFAULT_STALENESS_COST, FixedCost,
                                                measured_staleness_cost, predict)
    exact = next((r.get("steps_to_target") for r in rows if r["scheme"] == "dgd"), None)
    measured = [m for m in (measured_staleness_cost(r["scheme"], r["s"], r.get("steps_to_target"),
                                                    exact) for r in rows) if m is not None]
    lam = float(np.median(measured)) if measured else DEFAULT_STALENESS_COST
    # the observed protocol cost is o_0 or o_1 by the observed run's s (the rule's FixedCost)
    seen = obs["protocol"]
    zero_path = not obs.get("s")
    fc = FixedCost.calibrated(seen if zero_path else None, None if zero_path else seen,
                              obs.get("round_cost", 0.0))
    for r in rows:
        r["model"] = predict(r["scheme"], r["s"], obs["delays"], obs["tau"], fc,
                             staleness_cost=lam, seed=seed).as_dict()
        r["model"]["staleness_cost"] = lam
    return lam


def advise(run_dir, model="cnn", dataset="digits", batch_size=32, lr=0.5, target=None,
           s_values=(1, 2), steps=None, partition_time=None, bootstrap=5, seed=0,
           progress=False, optimizer=None, momentum_correction=True,
           target_accuracy=None) -> dict:
    """``optimizer``: the user's optimizer spec (``pgc_hvd.sim.run.make_optimizer``), default
    plain SGD at ``lr``; ``momentum_correction``: as the runtime's (default on);
    ``target_accuracy``: rank by time to this validation accuracy instead of the loss."""
    import torch
    from pgc_hvd.metrics.targets import first_at_least, first_reaching
    from pgc_hvd.sim.run import prepare_data
    torch.set_num_threads(1)
    obs = observations(Path(run_dir), partition_time)
    if obs["tau"] is None:
        raise ValueError("a delay trace does not say the compute time: pass --partition-time")
    n = obs["n"]
    steps = int(steps or obs["steps"])
    fits = [fit_delays(x, seed=seed + 101 * r) for r, x in enumerate(obs["delays"])]
    delay = PerWorker([f["model"] for f in fits])
    if target is None and Path(run_dir).is_dir() and (Path(run_dir) / "summary.json").exists():
        target = json.loads((Path(run_dir) / "summary.json").read_text()).get("target_loss")
    data = prepare_data(dataset, seed=seed)
    rows = []
    for scheme, s in candidates(n, s_values):
        if progress:
            print(f"[advise] simulating {scheme} s={s}", file=sys.stderr, flush=True)
        try:
            recs, summ = simulate_candidate(scheme, s, n, delay, obs["tau"], obs["protocol"], steps,
                                            model, dataset, batch_size, lr, data, seed=seed,
                                            optimizer=optimizer,
                                            momentum_correction=momentum_correction)
        except (ValueError, RuntimeError) as e:  # a code that does not exist for (n, s)
            rows.append({"scheme": scheme, "s": s, "error": str(e)[:120]})
            continue
        if target_accuracy is not None:
            st, tt = first_at_least(recs, target_accuracy)
        else:
            st, tt = first_reaching(recs, target)
        rows.append({"scheme": scheme, "s": s, "time_per_step": summ["time_per_step"],
                     "time_to_target": tt, "steps_to_target": st, "final_loss": summ["final_loss"],
                     "tps_boot": []})
    ok = [r for r in rows if "error" not in r]
    attach_model(ok, obs, seed)
    # bootstrap: resample every rank's delays, refit, fresh delay seed; timing only
    rng = np.random.default_rng(seed + 17)
    wins = []
    for b in range(int(bootstrap)):
        bfits = []
        for r, x in enumerate(obs["delays"]):
            xb = rng.choice(np.asarray(x), size=len(x), replace=True)
            bfits.append(fit_delays(xb, seed=seed + 1000 * (b + 1) + r)["model"])
        bdelay = PerWorker(bfits)
        tps = {}
        for row in ok:
            _, summ = simulate_candidate(row["scheme"], row["s"], n, bdelay, obs["tau"], obs["protocol"],
                                         steps, model, dataset, batch_size, lr, data,
                                         seed=seed + b + 1, timing_only=True)
            row["tps_boot"].append(summ["time_per_step"])
            tps[(row["scheme"], row["s"])] = summ["time_per_step"]
        wins.append(tps)
    for row in ok:
        v = row.pop("tps_boot")
        row["tps_mean"] = float(np.mean(v)) if v else None
        row["tps_sd"] = float(np.std(v, ddof=1)) if len(v) > 1 else None

    def key(r):
        tt = r.get("time_to_target")
        return (0, tt) if tt is not None else (1, -r["model"]["rate"], r["time_per_step"])
    ok.sort(key=key)
    best = ok[0]
    # confidence: in how many replicates the recommended configuration is within 5% of the
    # fastest time per step, and a bootstrap interval of its time to target
    kb = (best["scheme"], best["s"])
    share = (sum(1 for w in wins if w[kb] <= 1.05 * min(w.values())) / len(wins)) if wins else None
    for row in ok:
        if row.get("steps_to_target") and row.get("tps_mean") is not None:
            row["ttt_boot"] = [row["steps_to_target"] * row["tps_mean"],
                               row["steps_to_target"] * (row["tps_sd"] or 0.0)]
    return {"run": str(run_dir), "observations": {k: v for k, v in obs.items() if k != "delays"},
            "fits": [{k: v for k, v in f.items() if k != "model"} | {"model": str(f["model"])}
                     for f in fits],
            "target_loss": target, "target_accuracy": target_accuracy, "steps": steps,
            "assumed": {"optimizer": str(optimizer or f"sgd:lr={lr}"),
                        "momentum_correction": bool(momentum_correction)},
            "ranked": ok,
            "failed": [r for r in rows if "error" in r],
            "recommendation": {"scheme": best["scheme"], "s": best["s"],
                               "predicted_time_per_step": best["time_per_step"],
                               "predicted_tps_bootstrap": [best.get("tps_mean"), best.get("tps_sd")],
                               "predicted_time_to_target": best.get("time_to_target"),
                               "model": best.get("model"),
                               "bootstrap_best_share": share, "bootstrap": int(bootstrap)}}


def format_report(res: dict) -> str:
    o = res["observations"]
    lines = [f"advise {res['run']}: n = {o['n']} ranks, {res['steps']} steps, source {o['source']}"
             + (f" ({o['scheme']}, s={o['s']})" if o.get("scheme") else ""),
             f"compute per partition tau = {o['tau'] * 1e3:.1f} ms; protocol cost per step = "
             f"{o['protocol'] * 1e3:.1f} ms" + (f"; observed time per step "
                                                 f"{o['observed_time_per_step'] * 1e3:.1f} ms"
                                                 if o.get("observed_time_per_step") else "")]
    if not o.get("all_wait", True):
        lines.append("note: the run did not use every rank every step, so busy seconds are "
                     "per-step windows; the delay fit is rougher (an all-wait DGD run is best)")
    lines.append("delay fits per rank (AIC-best):")
    for r, f in enumerate(res["fits"]):
        aic = (f"AIC exp {f['aic_exp']:.1f} vs lognormal {f['aic_lognormal']:.1f}"
               if f["aic_exp"] is not None else
               f"{f['zeros']} of {f['n_samples']} delays are 0: exponential only")
        lines.append(f"  rank {r}: {f['kind']:<9} {f['model']}  (exp mean "
                     f"{f['exp_mean'] * 1e3:.1f} ms; {aic})")
    assumed = res.get("assumed", {})
    target_name = (f"accuracy {res['target_accuracy']}" if res.get("target_accuracy") is not None
                   else f"loss {res['target_loss']}")
    lines.append(f"assumed optimizer: {assumed.get('optimizer')} with the momentum correction "
                 f"{'on' if assumed.get('momentum_correction', True) else 'off'} "
                 f"(steps to a target depend on both; --optimizer, --momentum-correction)")
    lines.append("")
    lines.append(f"| rank | scheme | s | time/step (ms) | bootstrap mean +- sd (ms) | steps to "
                 f"{target_name} | time to target (s) | final loss | model: time/step (ms) | "
                 f"progress/step | progress/s |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(res["ranked"], 1):
        bs = "-" if r.get("tps_mean") is None else (
            f"{r['tps_mean'] * 1e3:.1f} +- {(r['tps_sd'] or 0) * 1e3:.1f}")
        tt = "-" if r["time_to_target"] is None else f"{r['time_to_target']:.2f}"
        m = r.get("model") or {}
        mod = (f"{m['time_per_step'] * 1e3:.1f} | {m['progress_per_step']:.2f} | {m['rate']:.3g}"
               if m else "- | - | -")
        lines.append(f"| {i} | {r['scheme']} | {r['s']} | {r['time_per_step'] * 1e3:.1f} | {bs} | "
                     f"{r['steps_to_target'] or '-'} | {tt} | {r['final_loss']:.3f} | {mod} |")
    for r in res["failed"]:
        lines.append(f"(not simulated: {r['scheme']} s={r['s']}: {r['error']})")
    rec = res["recommendation"]
    share = rec["bootstrap_best_share"]
    lines.append("")
    lines.append(f"recommendation: --scheme {rec['scheme']} --stragglers {rec['s']}  "
                 f"(predicted {rec['predicted_time_per_step'] * 1e3:.1f} ms/step"
                 + (f"; within 5% of the fastest time per step in {share:.0%} of "
                    f"{rec['bootstrap']} bootstrap replicates" if share is not None else "") + ")")
    best = res["ranked"][0]
    if best.get("ttt_boot"):
        lines.append(f"time to {target_name}: {best['time_to_target']:.2f} s (bootstrap "
                     f"{best['ttt_boot'][0]:.2f} +- {best['ttt_boot'][1]:.2f} s at "
                     f"{best['steps_to_target']} steps)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pgc-hvd advise", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="a pgc-hvd train run folder (records.jsonl) or a delay trace")
    p.add_argument("--model", default="cnn")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9,
                   help="the user's SGD momentum (pgc-hvd train's default); ignored with "
                        "--optimizer")
    p.add_argument("--optimizer", default=None,
                   help="the user's optimizer, e.g. adam:lr=3e-3 or sgd:lr=0.05,momentum=0.9 "
                        "(default: SGD with --lr and --momentum)")
    p.add_argument("--momentum-correction", choices=("on", "off"), default="on",
                   help="predict with the runtime's staleness-aware momentum correction "
                        "(default on, as the runtime)")
    p.add_argument("--target-loss", type=float, default=None, help="default: the run's summary")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="rank by time to this validation accuracy instead of the loss")
    p.add_argument("--stragglers", dest="s_values", default="1,2",
                   help="comma-separated straggler budgets s to try (default 1,2)")
    p.add_argument("--s-values", dest="s_values", help=argparse.SUPPRESS)   # the old spelling
    p.add_argument("--steps", type=int, default=None, help="default: the run's")
    p.add_argument("--partition-time", type=float, default=None,
                   help="seconds per partition (default: estimated from the records)")
    p.add_argument("--bootstrap", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the full result here")
    a = p.parse_args(argv)
    try:
        s_values = [int(x) for x in a.s_values.split(",") if x.strip()]
    except ValueError:
        p.error(f"--stragglers must be comma-separated integers, got {a.s_values!r}")
    if not s_values or min(s_values) < 1:
        p.error(f"--stragglers needs straggler budgets >= 1, got {a.s_values!r}")
    if a.steps is not None and a.steps < 1:
        p.error(f"--steps must be >= 1 (or left out: the run's), got {a.steps}")
    if a.partition_time is not None and not a.partition_time > 0:
        p.error(f"--partition-time must be seconds > 0, got {a.partition_time}")
    if a.bootstrap < 0:
        p.error(f"--bootstrap must be >= 0, got {a.bootstrap}")
    run_dir = Path(a.run_dir)
    if run_dir.is_file() and run_dir.name == "records.jsonl":
        p.error(f"pass the run folder ({run_dir.parent}), not its records.jsonl")
    if a.target_accuracy is not None and not 0 < a.target_accuracy <= 1:
        p.error(f"--target-accuracy must lie in (0, 1], got {a.target_accuracy}")
    optimizer = a.optimizer or (f"sgd:lr={a.lr},momentum={a.momentum}" if a.momentum
                                else f"sgd:lr={a.lr}")
    try:
        from pgc_hvd.sim.run import make_optimizer
        make_optimizer(optimizer)
    except ValueError as e:
        p.error(str(e))
    res = advise(a.run_dir, a.model, a.dataset, a.batch_size, a.lr, a.target_loss,
                 s_values, a.steps, a.partition_time, a.bootstrap, a.seed, progress=True,
                 optimizer=optimizer, momentum_correction=a.momentum_correction == "on",
                 target_accuracy=a.target_accuracy)
    n = res["observations"]["n"]
    dropped = sorted(s for s in s_values if s >= n)
    if dropped:
        print(f"[advise] --stragglers {dropped} skipped: s must be below n = {n}")
    print(format_report(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
