"""The papers' experiments on the simulator: ``pgc-hvd experiment {pgc,bcgc,staleness} [--quick]
--out DIR``, and ``scale`` (:mod:`pgc_hvd.apps.scale`: predicted time per step of the Horovod
runtime at n = 8..1024 under the alpha-beta model of its collectives, ``--comm-fit PATH``, and
of its control paths, ``--log-fit PATH``). Each writes into DIR one ``records/<run>.jsonl`` per run, ``summary.json`` (one
entry per scheme and setting with the table's figures), ``table.md`` and ``plot.png``.

* ``pgc``  (PGC paper, Figs. 6-10): n = 12, s in {1, 2, 3}, exponential delays of mean 1 and 2
  partition times; DGD, IS-SGD, GC-FR, GC-CR, IS-GC (c = 2), PGC-FR, PGC-CR, pipelined BCGC;
  softmax regression on digits with SGD; time per step normalised by DGD, steps and time to the
  loss threshold (the training loss DGD reaches at 60% of its steps in the same setting), and
  naive PGC-CR at n = 12, c = 6 (s = 5) against PGC-CR: decode coefficients and loss.
* ``bcgc`` (BCGC paper, Tables I-III): n = 100, s in {20, 24}, top-5% compression of every coded
  message, 100 Nesterov iterations from beta_0 = 0, exactly s stragglers per iteration (fixed
  seeded schedule shared by every scheme); softmax on digits, logistic regression on breast
  cancer; uncompressed, naive (uncoded, waits for all), BCGC, GFRC, G-MDS, RS: final accuracy
  (AUC for binary), mean ||a_I||_1, virtual wall time (decode time included, measured as the
  decoder thread's CPU time) and its ratio to GFRC's; a delayed worker's step is abandoned when
  the next model arrives (``cancel``, the paper's schedule); ``--datasets digits`` runs one
  dataset; then
  s = 24 with the minimum-error decoder, i.i.d. vs sorted-by-label partitions, BCGC vs GFRC.
* ``staleness`` (docs/control.md, docs/experiments.md): 8 heterogeneous workers, log-normal delays plus occasional
  10-30 s stragglers; synchronous DP (DGD), GC (GC-CR, s = 1) and bounded staleness r = 2,
  c in {2, 4, 8}, all for the same virtual time budget: time to the target validation loss,
  accuracy at equal time, gradient evaluations, utilisation, max gradient age and the error
  decomposition.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from pgc_hvd.compress import TopK
from pgc_hvd.delays import FixedStragglers, Heterogeneous, LogNormal, LongStraggler, Exponential
from pgc_hvd.metrics.records import to_jsonable
from pgc_hvd.metrics.targets import first_reaching

from pgc_hvd.schemes import setting_stragglers
from pgc_hvd.sim.run import prepare_data, simulate

from .tables import log as _log, table as _table, write_experiment


# ------------------------------------------------------------------------------------- PGC
PGC_SCHEMES = [("dgd", {}), ("is-sgd", {}), ("gc-fr", {}), ("gc-cr", {}), ("is-gc", {"c": 2}),
               ("pgc-fr", {}), ("pgc-cr", {}), ("pgc-bcgc", {})]


PGC_OPTIMIZER = "sgd:lr=2.0"   # plain SGD, as the paper (torch.optim.SGD)
PGC_BATCH = 4                  # minibatch per partition gradient (stochastic, as the paper)


def exp_pgc(out: Path, quick: bool) -> tuple[list, str]:
    """Stochastic minibatch SGD as the paper's runs: every partition gradient is the gradient on
    a minibatch of ``PGC_BATCH`` samples of that partition, drawn by (seed, model version) so
    that every scheme sees the same minibatches. Steps and time to the threshold are averaged
    over ``seeds`` runs (seed = model init, partition, minibatches and delays), as the paper
    averages 5-10 runs; the threshold of each seed is the training loss DGD reaches at 60% of
    its steps with that seed."""
    n = 12
    s_values = [1, 2] if quick else [1, 2, 3]
    means = [1.0] if quick else [1.0, 2.0]
    steps = 25 if quick else 300
    seeds = [0] if quick else [0, 1, 2]
    schemes = PGC_SCHEMES if not quick else [x for x in PGC_SCHEMES if x[0] in ("dgd", "gc-cr", "pgc-cr", "pgc-fr", "is-sgd")]
    data = prepare_data("digits")
    rows, curves = [], {}
    for mean in means:
        for s in s_values:
            per_seed = []  # [(summ, recs) per scheme] per seed
            for seed in seeds:
                setting = []
                for name, opts in schemes:
                    label = f"{name}_s{s}_mean{mean:g}" + (f"_seed{seed}" if seed else "")
                    _log(f"[pgc] {label}")
                    recs, summ = simulate(name, n, setting_stragglers(name, s), data=data,
                                          optimizer=PGC_OPTIMIZER,
                                          delay=Exponential(mean, seed=int(mean * 10) + s + 1000 * seed),
                                          steps=steps, scheme_options=opts, partition_time=1.0,
                                          batch_size=PGC_BATCH, seed=seed,
                                          overwrite=True, records_path=out / "records" / f"{label}.jsonl",
                                          diagnostics=False, label=label, progress=True)
                    summ.update({"setting": f"s={s}, mean={mean:g}", "delay_mean": mean, "label": label})
                    setting.append((summ, recs))
                    if seed == seeds[0]:
                        curves[f"{name}_s{s}_mean{mean:g}"] = ([r.time for r in recs], [r.loss for r in recs])
                dgd_recs = setting[0][1]
                k = int(0.6 * len(dgd_recs))
                threshold = dgd_recs[k - 1].loss
                dgd_t = first_reaching(dgd_recs, threshold)[1]
                dgd_tps = setting[0][0]["time_per_step"]
                for summ, recs in setting:
                    st, tt = first_reaching(recs, threshold)
                    summ["loss_threshold"] = threshold
                    summ["steps_to_threshold"], summ["time_to_threshold"] = st, tt
                    summ["time_per_step_vs_dgd"] = summ["time_per_step"] / dgd_tps
                    summ["steps_vs_dgd"] = None if st is None else st / k
                    summ["time_vs_dgd"] = None if tt is None else tt / dgd_t
                per_seed.append(setting)
            for j in range(len(schemes)):
                runs = [setting[j][0] for setting in per_seed]
                summ = dict(runs[0])
                summ["seeds"] = len(seeds)
                for key in ("steps_to_threshold", "time_to_threshold", "time_per_step_vs_dgd",
                            "steps_vs_dgd", "time_vs_dgd", "final_loss", "test_accuracy", "time_per_step"):
                    vals = [r[key] for r in runs]
                    summ[key] = None if any(v is None for v in vals) else float(np.mean(vals))
                    if key in ("steps_vs_dgd", "time_vs_dgd", "steps_to_threshold") and summ[key] is not None:
                        summ[key + "_per_seed"] = vals
                summ["reached_threshold"] = sum(r["steps_to_threshold"] is not None for r in runs)
                rows.append(summ)
    # naive PGC-CR at n = 12, c = 6 (s = 5) against the unbiased PGC-CR decoder
    naive = {}
    for name in ("pgc-cr-naive", "pgc-cr"):
        label = f"{name}_n12_c6"
        _log(f"[pgc] {label}")
        recs, summ = simulate(name, 12, 5, data=data, optimizer=PGC_OPTIMIZER,
                              delay=Exponential(1.0, seed=99), steps=steps, partition_time=1.0,
                              batch_size=PGC_BATCH,
                              overwrite=True, records_path=out / "records" / f"{label}.jsonl", diagnostics=False,
                              label=label, progress=True)
        summ.update({"setting": "n=12, c=6 (s=5), mean=1", "label": label})
        rows.append(summ)
        naive[name] = recs
    _plot_pgc(out / "plot.png", rows, curves, naive, s_values, means)
    cols = [("setting", "setting"), ("scheme", "scheme"), ("time/step vs DGD", "time_per_step_vs_dgd"),
            ("steps to thr.", "steps_to_threshold"), ("steps vs DGD", "steps_vs_dgd"),
            ("time to thr. (s)", "time_to_threshold"), ("time vs DGD", "time_vs_dgd"), ("final loss", "final_loss"),
            ("test acc.", "test_accuracy"), ("alpha min", "alpha_min"), ("alpha max", "alpha_max")]
    return rows, _table(rows, cols)


def _plot_pgc(path, rows, curves, naive, s_values, means):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    k = len(s_values) * len(means)
    fig, axes = plt.subplots(2, k + 1 if k + 1 <= 4 else 4, figsize=(4.2 * min(k + 1, 4), 7.5), squeeze=False)
    flat = axes.ravel()
    i = 0
    for mean in means:
        for s in s_values:
            ax = flat[i]
            i += 1
            for label, (t, l) in curves.items():
                if label.endswith(f"_s{s}_mean{mean:g}"):
                    ax.plot(t, l, label=label.split("_")[0], lw=1.2)
            ax.set_title(f"loss vs time, s={s}, mean={mean:g}")
            ax.set_xlabel("virtual time (partition times)")
            ax.set_ylabel("training loss")
            ax.set_yscale("log")
            ax.legend(fontsize=6)
    ax = flat[i]
    i += 1
    labels = sorted({r["scheme"] for r in rows if "time_per_step_vs_dgd" in r})
    settings = sorted({r["setting"] for r in rows if "time_per_step_vs_dgd" in r})
    width = 0.8 / max(1, len(settings))
    for j, st in enumerate(settings):
        vals = [next((r["time_per_step_vs_dgd"] for r in rows if r.get("setting") == st and r["scheme"] == lab), 0)
                for lab in labels]
        ax.bar(np.arange(len(labels)) + j * width, vals, width, label=st)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(labels)) + 0.4 - width / 2)
    ax.set_xticklabels(labels, rotation=45, fontsize=7)
    ax.set_title("time per step / DGD")
    ax.legend(fontsize=6)
    ax = flat[i]
    for name, recs in naive.items():
        st = [r.step for r in recs]
        ax.plot(st, [r.loss for r in recs], label=f"{name} loss")
    ax.set_yscale("log")
    ax2 = ax.twinx()
    recs = naive["pgc-cr-naive"]
    ax2.plot([r.step for r in recs], [max(abs(r.alpha_max), abs(r.alpha_min)) for r in recs], "r:",
             label="naive max |alpha|")
    ax2.set_yscale("log")
    ax.set_title("naive PGC-CR, n=12, c=6 (Fig. 6)")
    ax.set_xlabel("step")
    ax.legend(fontsize=6, loc="upper left")
    ax2.legend(fontsize=6, loc="upper right")
    for j in range(i + 1, len(flat)):
        flat[j].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------ BCGC
# (label, scheme, top-kappa fraction, scheme options); "rs-stride1" is RS on consecutive
# evaluation points, whose B has entries up to 1e13 at n = 100 (pgc_hvd.codes.reed_solomon).
BCGC_SCHEMES = [("uncompressed", "bcgc", None, None), ("naive", "dgd", 0.05, None),
                ("bcgc", "bcgc", 0.05, None), ("gfrc", "gfrc", 0.05, None),
                ("gmds", "gmds", 0.05, None), ("rs", "rs", 0.05, None),
                ("rs-stride1", "rs", 0.05, {"stride": 1}),
                ("rs-uncompr", "rs", None, None), ("rs-stride1-uncompr", "rs", None, {"stride": 1})]


BCGC_DATASETS = {"digits": ("softmax", "nesterov:lr=0.1,momentum=0.9"),
                 "breast_cancer": ("logistic", "nesterov:lr=0.1,momentum=0.9")}


def exp_bcgc(out: Path, quick: bool, datasets=None) -> tuple[list, str]:
    """``datasets``: names from :data:`BCGC_DATASETS` (default: all; ``--quick``: digits).

    Straggler set-up as the BCGC paper (Sec. VI): exactly s workers are delayed at each iteration
    by a fixed seeded schedule (``FixedStragglers``, the same for every scheme) and a delayed
    worker's unfinished step is abandoned when the next model arrives (``cancel``), so every
    iteration faces exactly s fresh stragglers and nothing is carried over."""
    n = 100
    steps = 20 if quick else 100
    s_values = [20] if quick else [20, 24]
    if datasets is None:
        datasets = ["digits"] if quick else list(BCGC_DATASETS)
    unknown = [d for d in datasets if d not in BCGC_DATASETS]
    if unknown:
        raise ValueError(f"unknown dataset(s) {unknown}; choose from {sorted(BCGC_DATASETS)}")
    datasets = [(d, *BCGC_DATASETS[d]) for d in datasets]
    rows = []
    for dname, model, opt in datasets:
        data = prepare_data(dname)
        ptime = None  # measured once per dataset (first run), then shared by every scheme
        for s in s_values:
            for label0, scheme, comp, opts in BCGC_SCHEMES:
                label = f"{dname}_s{s}_{label0}"
                _log(f"[bcgc] {label}")
                recs, summ = simulate(scheme, n, setting_stragglers(scheme, s), data=data,
                                      model=model, optimizer=opt,
                                      delay=FixedStragglers(n, s, 0.1, seed=s), steps=steps,
                                      zero_init=True,
                                      compression=None if comp is None else
                                      TopK(comp, error_feedback=False),
                                      partition_time=ptime,
                                      scheme_options=opts,
                                      decode_time="measured", straggler_policy="cancel",
                                      overwrite=True, records_path=out / "records" / f"{label}.jsonl",
                                      label=label, progress=True)
                ptime = summ["partition_time"]
                summ.update({"dataset": dname, "setting": f"{dname}, s={s}", "variant": label0,
                             "label": label,
                             "metric": summ["test_auc"] if summ.get("test_auc") is not None else summ["test_accuracy"]})
                rows.append(summ)
        # partition diversity: min-error decoder, s = 24 (20 in quick), i.i.d. vs sorted by label
        s = s_values[-1]
        for iid in (True, False):
            for scheme in ("bcgc", "gfrc"):
                label = f"{dname}_s{s}_{'iid' if iid else 'sorted'}_{scheme}_minerr"
                _log(f"[bcgc] {label}")
                recs, summ = simulate(scheme, n, s, data=data, model=model, optimizer=opt,
                                      delay=FixedStragglers(n, s, 0.1, seed=s), steps=steps,
                                      zero_init=True,
                                      compression=TopK(0.05, error_feedback=False),
                                      iid=iid,
                                      scheme_options={"decoder": "min-error"}, partition_time=ptime,
                                      decode_time="measured", straggler_policy="cancel",
                                      overwrite=True, records_path=out / "records" / f"{label}.jsonl",
                                      label=label, progress=True)
                summ.update({"dataset": dname, "setting": f"{dname}, s={s}, {'iid' if iid else 'sorted'}, min-error",
                             "variant": scheme, "label": label,
                             "metric": summ["test_auc"] if summ.get("test_auc") is not None else summ["test_accuracy"]})
                rows.append(summ)
    for r in rows:  # time against GFRC in the same setting (with and without decode time)
        g = next((x for x in rows if x["setting"] == r["setting"] and x["variant"] == "gfrc"), None)
        if g is not None and g["time"] > 0:
            r["time_vs_gfrc"] = r["time"] / g["time"]
            r["time_excl_decode_vs_gfrc"] = r["time_excl_decode"] / g["time_excl_decode"]
    _plot_bcgc(out / "plot.png", rows)
    cols = [("setting", "setting"), ("variant", "variant"), ("acc. / AUC", "metric"),
            ("mean ||a_I||_1", "decode_norm1_mean"), ("virtual time (s)", "time"),
            ("decode (s)", "decode_time_total"), ("time / GFRC", "time_vs_gfrc"),
            ("time excl. decode / GFRC", "time_excl_decode_vs_gfrc"),
            ("final loss", "final_loss"), ("sum ||g_hat - g_dense||^2", "err_compress_total"),
            ("sum_t sum_K ||eps_i||", "class_error_total")]
    return rows, _table(rows, cols)


def _plot_bcgc(path, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    settings = [st for st in dict.fromkeys(r["setting"] for r in rows) if "min-error" not in st]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(settings))
    variants = [v for v, *_ in BCGC_SCHEMES]
    for j, st in enumerate(settings):
        vals = [next((r["metric"] for r in rows if r["setting"] == st and r["variant"] == v), np.nan)
                for v in variants]
        axes[0].bar(np.arange(len(variants)) + j * width, vals, width, label=st)
        nrm = [next((r["decode_norm1_mean"] for r in rows if r["setting"] == st and r["variant"] == v), np.nan)
               for v in variants]
        axes[1].bar(np.arange(len(variants)) + j * width, nrm, width, label=st)
    for ax, title in zip(axes, ("final test accuracy / AUC (top-5% unless uncompr.)", "mean ||a_I||_1")):
        ax.set_xticks(np.arange(len(variants)) + 0.4 - width / 2)
        ax.set_xticklabels(variants, rotation=30, ha="right")
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------- staleness
STALENESS_FACTORS = [1.0, 1.0, 1.0, 1.0, 1.25, 1.5, 2.0, 3.0]  # heterogeneous workers
# "bounded c=C": the design note's rule (``replay="mean"``: the whole table at every step), as
# section 3's first figures were measured; "bounded c=C once": each gradient counted once, a
# step on n - s new gradients (the remedy under momentum; docs/control.md), given explicitly so
# that the rows compare the two rules whatever the optimizer
STALENESS_VARIANTS = ([("sync-dp", "dgd", 0, {}), ("gc", "gc-cr", 1, {})]
                      + [(f"bounded c={c}", "bounded-staleness", 1, {"r": 2, "c": c,
                                                                     "replay": "mean"})
                         for c in (2, 4, 8)]
                      + [(f"bounded c={c} once", "bounded-staleness", 1, {"r": 2, "c": c,
                                                                          "replay": "once"})
                         for c in (2, 4, 8)])
STALENESS_COLS = [("variant", "variant"), ("time to target (s)", "time_to_target"),
                  ("acc. at equal time", "accuracy_at_equal_time"), ("final acc.", "test_accuracy"),
                  ("steps", "steps"), ("grad evals", "grad_evals"), ("utilisation", "utilisation"),
                  ("max age", "max_age"), ("err_total", "err_total_mean"),
                  ("err_stale", "err_stale_mean"), ("err_coding", "err_coding_mean"),
                  ("||g_hat||^2", "g_hat_sq_mean"), ("L_hat", "L_hat_max_mean"),
                  ("corr", "corr_min_mean"), ("diverged at step", "diverged")]


def staleness_delay(seed: int = 0):
    """Log-normal(mu = -1, sigma = 0.5) delays scaled per worker by :data:`STALENESS_FACTORS`,
    plus a 10-30 s straggler with probability 0.02 per worker-step (the design note's set-up).
    ``seed`` picks the delay draws (0: the draws every earlier figure used)."""
    return (Heterogeneous(LogNormal(-1.0, 0.5, seed=5 + 1000 * seed), STALENESS_FACTORS)
            + LongStraggler(0.02, 10.0, 30.0, seed=6 + 1000 * seed))


def staleness_runs(out: Path, data, budget: float, model: str = "softmax",
                   optimizer: str = "sgd:lr=0.5", prefix: str = "", tag: str = "staleness",
                   **sim) -> tuple[list, dict]:
    """The design note's experiment on ``data`` (train, test) with ``model``: every variant of
    :data:`STALENESS_VARIANTS` for the same virtual ``budget`` (s), n = 8. Returns (rows,
    validation-loss curves); a row is the run's summary plus ``time_to_target`` (the validation
    loss synchronous DP reaches at the end of the budget), ``accuracy_at_equal_time`` (at the
    end of the shortest run). ``sim``: further :func:`~pgc_hvd.sim.run.simulate` options (e.g.
    ``batch_size``); records go to ``out/records/<prefix><variant>.jsonl``."""
    rows, curves = [], {}
    sim = {"progress": True, **sim}
    for label0, scheme, s, opts in STALENESS_VARIANTS:
        label = prefix + label0.replace(" ", "_").replace("=", "")
        _log(f"[{tag}] {label}")
        recs, summ = simulate(scheme, len(STALENESS_FACTORS), s, data=data, model=model,
                              optimizer=optimizer, delay=staleness_delay(), steps=100000,
                              max_time=budget, scheme_options=opts, partition_time=1.0,
                              overwrite=True, records_path=out / "records" / f"{label}.jsonl",
                              label=label, **sim)
        summ.update({"variant": label0, "label": label})
        if summ["test_accuracy"] is None:  # ended between evaluations: the last evaluated
            summ["test_accuracy"] = next((r.extra["test_accuracy"] for r in reversed(recs)
                                          if r.extra.get("test_accuracy") is not None), None)
        curves[label0] = ([r.time for r in recs], [r.extra.get("test_loss") for r in recs])
        rows.append((summ, recs))
    # target: the validation loss synchronous DP reaches at the end of the budget
    target = next((r.extra["test_loss"] for r in reversed(rows[0][1])
                   if r.extra.get("test_loss") is not None), None)
    out_rows = []
    # equal time: the end of the shortest run that did not diverge (a diverged run ends early)
    t_equal = min((summ["time"] for summ, _ in rows if summ.get("diverged") is None),
                  default=min(summ["time"] for summ, _ in rows))
    for summ, recs in rows:
        st, tt = first_reaching(recs, target, key="test_loss")
        summ["target_test_loss"] = target
        summ["steps_to_target"], summ["time_to_target"] = st, tt
        at = [r for r in recs if r.time <= t_equal and r.extra.get("test_accuracy") is not None]
        summ["accuracy_at_equal_time"] = at[-1].extra.get("test_accuracy") if at else None
        summ["equal_time"] = t_equal
        out_rows.append(summ)
    return out_rows, curves


def exp_staleness(out: Path, quick: bool) -> tuple[list, str]:
    """:func:`staleness_runs` on digits, softmax regression, SGD lr 0.5 (600 s; quick 120 s)."""
    rows, curves = staleness_runs(out, prepare_data("digits"), 120.0 if quick else 600.0)
    _plot_staleness(out / "plot.png", curves, rows)
    return rows, _table(rows, STALENESS_COLS)


def _plot_staleness(path, curves, rows, axes=None):
    """Validation loss against virtual time per variant, and the delay histogram; into
    ``axes`` (two) when given, else a figure saved at ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    own = axes is None
    if own:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, (t, l) in curves.items():
        pts = [(a, b) for a, b in zip(t, l) if b is not None]
        axes[0].plot([a for a, _ in pts], [b for _, b in pts], label=label)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("virtual time (s)")
    axes[0].set_ylabel("validation loss")
    axes[0].legend()
    hist = rows[-1]["delay_histogram"] if rows else {"counts": []}
    if hist["counts"]:
        e = np.array(hist["edges"])
        axes[1].bar(e[:-1], hist["counts"], width=np.diff(e), align="edge")
        axes[1].set_yscale("log")
    axes[1].set_title("delay histogram (s)")
    if own:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def exp_scale(out: Path, quick: bool, **opts) -> tuple[list, str]:
    from .scale import exp_scale as run
    return run(out, quick, **opts)


EXPERIMENTS = {"pgc": exp_pgc, "bcgc": exp_bcgc, "staleness": exp_staleness, "scale": exp_scale}


def _fit_option(p, name: str, flag: str, value, default: Path, what: str,
                measure: str) -> Optional[Path]:
    """A ``--log-fit`` / ``--comm-fit`` argument, checked: the path given (scale only; it must
    exist), else None once the scale experiment's ``default`` is known to exist; ``p.error``
    names the flag, the file and the command (``python MEASURE PATH``) that makes one."""
    if value is not None:
        if name != "scale":
            p.error(f"{flag} applies to the scale experiment only")
        if not Path(value).is_file():
            p.error(f"{flag} {value}: no such file; measure one with `python {measure} {value}`")
        return Path(value)
    if name == "scale" and not default.is_file():
        p.error(f"scale needs {what}: {default} is missing; pass {flag} PATH (measure one with "
                f"`python {measure} PATH`)")
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pgc-hvd experiment", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=sorted(EXPERIMENTS))
    p.add_argument("--quick", action="store_true", help="small sizes (seconds), for tests")
    p.add_argument("--out", required=True)
    p.add_argument("--force", action="store_true",
                   help="replace the results of an earlier experiment in --out")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--datasets", default=None,
                   help="bcgc only: comma-separated datasets (digits, breast_cancer); default all "
                        "(--quick: digits)")
    p.add_argument("--comm-fit", default=None, metavar="PATH",
                   help="scale only: alpha-beta fitted by benchmarks/data_plane/measure_collectives.py "
                        "(default: docs/figures/comm_fit.json of this checkout)")
    p.add_argument("--log-fit", default=None, metavar="PATH",
                   help="scale only: control='log' costs measured by benchmarks/"
                        "measure_log_control.py (default: docs/figures/log_control_fit.json)")
    a = p.parse_args(argv)
    opts = {}
    from .scale import DEFAULT_FIT, DEFAULT_LOG_FIT
    for flag, value, default, what, measure in (
            ("--log-fit", a.log_fit, DEFAULT_LOG_FIT, "the log control's costs",
             "benchmarks/control/measure_log_control.py --out"),
            ("--comm-fit", a.comm_fit, DEFAULT_FIT, "a fitted comm model",
             "benchmarks/data_plane/measure_collectives.py --np 2,3,4 --out")):
        path = _fit_option(p, a.name, flag, value, default, what, measure)
        if path is not None:
            opts[flag[2:].replace("-", "_")] = path
    if a.datasets:
        if a.name != "bcgc":
            p.error("--datasets applies to the bcgc experiment only")
        opts["datasets"] = [d.strip() for d in a.datasets.split(",") if d.strip()]
        if not opts["datasets"]:
            p.error(f"--datasets names no dataset: {a.datasets!r}")
    out = Path(a.out)
    if (out / "summary.json").exists() and not a.force:
        p.error(f"{out} already holds an experiment's results; choose another --out or pass "
                "--force to replace them")
    torch.set_num_threads(a.threads)
    (out / "records").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows, table = EXPERIMENTS[a.name](out, a.quick, **opts)
    wall = time.perf_counter() - t0
    summary = {"experiment": a.name, "quick": a.quick, "options": opts, "wall_seconds": wall,
               "runs": rows}
    write_experiment(out, f"experiment {a.name}{' (quick)' if a.quick else ''}", summary, table,
                     wall)
    print(table)
    _log(f"[{a.name}] done in {wall:.1f} s -> {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def run_specs(specs: list, run, args: tuple, jobs: int, out: Path) -> list:
    """``run(spec, *args)`` for every spec, in the grid's order, from ``jobs`` processes (spawned)
    or this one; each row is appended to ``out/runs.jsonl`` as it comes (kept if tabulating
    fails) and logged. Returns the rows."""
    def results():
        if jobs > 1:
            import multiprocessing as mp
            with mp.get_context("spawn").Pool(jobs) as pool:
                pending = [pool.apply_async(run, (sp, *args)) for sp in specs]
                for p in pending:
                    yield p.get()
        else:
            for sp in specs:
                yield run(sp, *args)

    rows = []
    with open(out / "runs.jsonl", "w") as done:
        for sp, row in zip(specs, results()):
            rows.append(row)
            done.write(json.dumps(to_jsonable({k: v for k, v in row.items() if k != "curve"}))
                       + "\n")
            done.flush()
            _log(f"[grid] {sp['label']} ({len(rows)}/{len(specs)}) {row['wall_seconds']:.0f} s")
    return rows
