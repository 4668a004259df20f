"""``pgc-hvd experiment scale``: predicted time per step at n = 8 .. 1024 (issue 13, item 5).

    pgc-hvd experiment scale --out runs/exp_scale [--comm-fit docs/figures/comm_fit.json]

Time-only simulation (:class:`pgc_hvd.sim.timing.TimingSimulator`: the delays, the collective
comm model and the schemes' decision rules; no gradients) of the Horovod runtime's step for

* n = 8, 16, 64, 256, 1024 workers, s = max(1, n // 16) for PGC-CR (DGD: s = 0);
* d = 11,689,512 (ResNet-18) and 25,557,032 (ResNet-50) float32 parameters, dense messages;
* compute ``PARTITION_TIME`` = 0.2 s per partition (PGC-CR and DGD evaluate one per step;
  PGC-CR's warm-up step 0 evaluates its c = s + 1, so the first ``WARMUP`` steps are not
  counted) plus an injected delay per (worker, step): exponential with mean 0.2 s, or
  log-normal with the same mean (sigma = 1, mu = ln 0.2 - 1/2);
* two links: **measured**, the alpha-beta fitted on this machine (``--comm-fit``, a JSON of
  ``benchmarks/data_plane/measure_collectives.py``; at an n it was not measured at, the fit over every n
  it was), and **datacentre**, a stated 25 Gb/s link with 10 us latency and a GPU-memory local
  pass (1 TB/s): ``ring:alpha=10e-6,gbps=25,pass_beta=1e-12``;
* two data planes: **old**, ``allgather`` (each ready rank's dense message rides with its
  control row: every rank receives n-s..n messages of 4d bytes per step), and **new**,
  ``allreduce`` (decision on control rows, then ONE ring allreduce of 4d bytes);
* ``hvd``: plain ``hvd.DistributedOptimizer`` for reference, computed, not simulated:
  max_w(compute + delay) + the SGD update's local pass + allreduce(n, 4d) per step, averaged
  over the same delays;
* on the new plane, the control paths (:mod:`pgc_hvd.sim.comm`, "Control paths"): **polled**
  (``control="allgather"``: the ``*_new`` columns), **default** (the runtime's default,
  ``control="log"``, the ``default / hvd`` column: rows appended to rank 0's TCPStore, one
  decider whose body reads only the rows that changed, the outcome delivered by one broadcast),
  **store** (a what-if, the default before issue 38: the same, but every rank reads the
  outcome from rank 0's one store) and **free** (every control cost 0: the bound no control
  plane beats; ``default / free`` is how far the default is from it). The log paths'
  constants are measured (``--log-fit``, a JSON of ``benchmarks/control/measure_log_control.py``; on
  the datacentre link its network parts moved to that link, :meth:`~pgc_hvd.sim.log_costs.
  LogCosts.on_link`).

Control rounds poll every 2 ms (the runtime's default); the straggler policy is ``continue``.
Each configuration runs ``STEPS`` steps (``--quick``: n = 8, 16 and 6 steps); the delays of a
(n, delay model) are drawn once and replayed by every scheme, link, plane and control path.
Writes ``summary.json``, ``table.md`` (the planes, then the control paths) and ``plot.png``
(time per step against n; PGC-CR / DGD).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from pgc_hvd.schemes import get_scheme, setting_stragglers

from pgc_hvd.sim.comm import CollectiveModel, load_fit, parse_comm_model
from pgc_hvd.delays import DelayTrace, Exponential, LogNormal, Replay
from pgc_hvd.sim.engine import SimConfig
from pgc_hvd.sim.log_costs import LogCosts, load_log_fit
from pgc_hvd.sim.timing import TimingSimulator, time_per_step

from .tables import table

NS = (8, 16, 64, 256, 1024)
MODELS = (("resnet18", 11_689_512), ("resnet50", 25_557_032))
PARTITION_TIME = 0.2
STEPS, WARMUP = 23, 3
DATACENTRE = "ring:alpha=10e-6,gbps=25,pass_beta=1e-12"
PLANES = (("old", "allgather"), ("new", "allreduce"))
#: the new plane's control paths beside the polled one: (column, control, which costs)
CONTROLS = (("log", "log", "measured"), ("store", "log-store", "measured"),
            ("free", "log", "free"))
DEFAULT_FIT = Path(__file__).resolve().parents[2] / "docs" / "figures" / "comm_fit.json"
DEFAULT_LOG_FIT = DEFAULT_FIT.with_name("log_control_fit.json")


def delay_models(mean: float = PARTITION_TIME) -> dict:
    """The two delay models, with the same mean."""
    sigma = 1.0
    return {"exp": Exponential(mean, seed=1),
            "lognormal": LogNormal(math.log(mean) - sigma ** 2 / 2, sigma, seed=1)}


def stragglers(n: int) -> int:
    return max(1, n // 16)


def links(comm_fit: Optional[Path], log_fit: Optional[Path] = None) -> dict:
    """Both links' collective models, each with its log path's costs (``log``)."""
    path = Path(comm_fit) if comm_fit is not None else DEFAULT_FIT
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: no fitted comm model; measure one with `python benchmarks/"
            f"measure_collectives.py --np 2,3,4 --out {path}` (about a minute) or pass "
            f"--comm-fit PATH")
    lpath = Path(log_fit) if log_fit is not None else DEFAULT_LOG_FIT
    costs = load_log_fit(lpath)
    dc = parse_comm_model(DATACENTRE)
    link = dc.network.allgather
    return {"measured": load_fit(path).replace(log=costs),
            "datacentre": dc.replace(log=costs.on_link(link.alpha, link.beta,
                                                       source=f"{costs.source} on {DATACENTRE}"))}


def hvd_time_per_step(D: np.ndarray, n: int, d: int, cm: CollectiveModel) -> float:
    """Plain Horovod: every step waits for the slowest rank, then one allreduce (module doc)."""
    per = PARTITION_TIME + D[WARMUP:].max(axis=1)
    return float(per.mean() + cm.local(12 * d) + cm.allreduce(n, 4 * d))


def _run(scheme: str, n: int, d: int, steps: int, trace, cm: CollectiveModel) -> tuple:
    """(time per step, the records after warm-up) of one time-only run."""
    s = setting_stragglers(scheme, stragglers(n))
    cfg = SimConfig(steps=steps, delay=Replay(trace), partition_time=PARTITION_TIME, comm=cm,
                    diagnostics=False, eval_every=0)
    recs = TimingSimulator(get_scheme(scheme, n, s), d, cfg).run()
    return time_per_step(recs, WARMUP), recs[WARMUP:]


def _mean(recs, key: str) -> float:
    return float(np.mean([r.extra[key] for r in recs]))


def _row(delay_name: str, n: int, trace, D, link: str, cm0: CollectiveModel, mname: str,
         d: int, steps: int) -> dict:
    """One (delays, n, link, model) row: both planes (polled control), then the new plane's
    other control paths (module doc)."""
    row = {"delay": delay_name, "n": n, "s": stragglers(n), "link": link, "model": mname,
           "d": d, "steps": steps, "warmup": WARMUP, "comm": cm0.describe(n)}
    t0 = time.perf_counter()
    for plane_name, plane in PLANES:
        cm = cm0.replace(plane=plane)
        for scheme in ("dgd", "pgc-cr"):
            key = f"{scheme}_{plane_name}"
            row[key], recs = _run(scheme, n, d, steps, trace, cm)
            row[key + "_mb"] = float(np.mean([r.bytes for r in recs])) / 1e6
            if plane_name == "new" and scheme == "pgc-cr":
                row["polled_rounds"] = _mean(recs, "control_rounds")
    for col, control, which in CONTROLS:
        costs = {"measured": cm0.log, "free": LogCosts.free()}[which]
        cm = cm0.replace(plane="allreduce", control=control, log=costs)
        for scheme in (("dgd", "pgc-cr") if col == "log" else ("pgc-cr",)):
            key = f"{scheme}_{col}"
            row[key], recs = _run(scheme, n, d, steps, trace, cm)
            if scheme == "pgc-cr":
                row[key + "_follow"] = _mean(recs, "follow_seconds")
                row[key + "_lag"] = _mean(recs, "decider_lag")
                row[key + "_ops0"] = _mean(recs, "control_ops")
                row[key + "_ops"] = _mean(recs, "control_ops_others")
                row[key + "_batches"] = _mean(recs, "log_batches")
    row["hvd"] = hvd_time_per_step(D, n, d, cm0)
    for plane_name, _ in PLANES:
        row[f"ratio_{plane_name}"] = row[f"pgc-cr_{plane_name}"] / row[f"dgd_{plane_name}"]
    row["ratio_log"] = row["pgc-cr_log"] / row["dgd_log"]
    row["pgc_new_vs_hvd"] = row["pgc-cr_new"] / row["hvd"]
    for col, _, _ in CONTROLS:
        row[f"pgc_{col}_vs_hvd"] = row[f"pgc-cr_{col}"] / row["hvd"]
    row["pgc_log_vs_free"] = row["pgc-cr_log"] / row["pgc-cr_free"]
    row["seconds"] = time.perf_counter() - t0
    return row


def exp_scale(out: Path, quick: bool, comm_fit: Optional[Path] = None,
              log_fit: Optional[Path] = None) -> tuple[list, str]:
    ns = NS[:2] if quick else NS
    steps = 6 if quick else STEPS
    models = MODELS[:1] if quick else MODELS
    nets = links(comm_fit, log_fit)
    rows = []
    t_all = time.perf_counter()
    for delay_name, model in delay_models().items():
        for n in ns:
            trace = DelayTrace.from_model(model, n, steps + 1)
            D = np.array([[trace[(w, t)] for w in range(n)] for t in range(steps + 1)])
            for link, cm0 in nets.items():
                for mname, d in models:
                    row = _row(delay_name, n, trace, D, link, cm0, mname, d, steps)
                    rows.append(row)
                    print(f"[scale] {delay_name:9s} n={n:5d} {link:10s} {mname}: PGC-CR / hvd "
                          f"polled {row['pgc_new_vs_hvd']:.3f} default "
                          f"{row['pgc_log_vs_hvd']:.3f} store {row['pgc_store_vs_hvd']:.3f} "
                          f"free {row['pgc_free_vs_hvd']:.3f} ({row['seconds']:.1f} s)",
                          file=sys.stderr, flush=True)
    _plot(out / "plot.png", rows, ns)
    planes = [("delays", "delay"), ("n", "n"), ("s", "s"), ("link", "link"), ("model", "model"),
              ("DGD old (s)", "dgd_old"), ("PGC-CR old (s)", "pgc-cr_old"),
              ("DGD new (s)", "dgd_new"), ("PGC-CR new (s)", "pgc-cr_new"), ("hvd (s)", "hvd"),
              ("PGC-CR/DGD old", "ratio_old"), ("PGC-CR/DGD new", "ratio_new"),
              ("PGC-CR new / hvd", "pgc_new_vs_hvd"),
              ("MB/step old", "pgc-cr_old_mb"), ("MB/step new", "pgc-cr_new_mb")]
    controls = [("delays", "delay"), ("n", "n"), ("link", "link"), ("model", "model"),
                ("hvd (s)", "hvd"), ("default / hvd", "pgc_log_vs_hvd"),
                ("free / hvd", "pgc_free_vs_hvd"), ("default / free", "pgc_log_vs_free"),
                ("polled / hvd", "pgc_new_vs_hvd"), ("store / hvd", "pgc_store_vs_hvd"),
                ("PGC-CR default (s)", "pgc-cr_log"), ("PGC-CR free (s)", "pgc-cr_free"),
                ("PGC-CR polled (s)", "pgc-cr_new"), ("PGC-CR store (s)", "pgc-cr_store"),
                ("DGD default (s)", "dgd_log"),
                ("default follow (s)", "pgc-cr_log_follow"),
                ("store follow (s)", "pgc-cr_store_follow"),
                ("default decider lag (s)", "pgc-cr_log_lag"),
                ("default batches/step", "pgc-cr_log_batches"),
                ("polled rounds/step", "polled_rounds"),
                ("default ops/step rank 0", "pgc-cr_log_ops0"),
                ("default ops/step others", "pgc-cr_log_ops")]
    head = (f"time per step (s) predicted by the time-only simulator: compute {PARTITION_TIME} s "
            f"per partition + delays of mean {PARTITION_TIME} s, {steps - WARMUP} steps after "
            f"{WARMUP} of warm-up, s = max(1, n // 16); links: measured = "
            f"{nets['measured'].source} (fit over every n measured where n was not), "
            f"datacentre = {DATACENTRE}; old plane = allgather of ready ranks' messages with the "
            f"control rows, new = control rows then one allreduce; MB/step: the most any rank "
            f"received per PGC-CR step; {time.perf_counter() - t_all:.0f} s to compute\n\n")
    chead = (f"\n\n## Control paths on the new plane\n\ndefault = the runtime's default "
             f"control plane, control=\"log\" ({nets['measured'].log.source}): rows to rank "
             f"0's store, a body reading only the changed rows, the outcome by one broadcast; "
             f"free = every control cost 0 (the bound); polled = control=\"allgather\" "
             f"(allgather of n rows every poll); store = the default before issue 38, the "
             f"outcome read by every rank from rank 0's one store (what-if, same body); follow "
             f"= from the deciding run to the last rank in the data phase; decider lag = from "
             f"the deciding row's landing to the end of its batch's run; batches = the "
             f"decider's body runs on new rows; ops = control operations per step (rank 0: its "
             f"reader's gets and the broadcast; others: the mean over ranks > 0 of add + set, "
             f"the broadcast and a delete)\n\n")
    return rows, head + table(rows, planes) + chead + table(rows, controls)


def _plot(path: Path, rows: list, ns) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links_ = sorted({r["link"] for r in rows}, reverse=True)
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(len(links_), len(models) + 1, figsize=(4.6 * (len(models) + 1),
                                                                    3.8 * len(links_)),
                             squeeze=False)
    for i, link in enumerate(links_):
        for j, model in enumerate(models):
            ax = axes[i, j]
            sel = [r for r in rows if r["link"] == link and r["model"] == model
                   and r["delay"] == "exp"]
            x = [r["n"] for r in sel]
            for key, style, label in (("dgd_old", "C0--", "DGD, old plane"),
                                      ("pgc-cr_old", "C1--", "PGC-CR, old plane"),
                                      ("dgd_new", "C0-", "DGD, new plane"),
                                      ("pgc-cr_new", "C1-", "PGC-CR, new plane"),
                                      ("pgc-cr_log", "C2-", "PGC-CR, default (control=log)"),
                                      ("pgc-cr_store", "C3-.", "PGC-CR, store (what-if)"),
                                      ("pgc-cr_free", "C4:", "PGC-CR, free control"),
                                      ("hvd", "k:", "hvd.DistributedOptimizer")):
                ax.plot(x, [r[key] for r in sel], style, marker="o", ms=3, label=label)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("n")
            ax.set_ylabel("time per step (s)")
            ax.set_title(f"{link}, {model} (d = {sel[0]['d'] / 1e6:.1f}M), exp delays",
                         fontsize=9)
            ax.legend(fontsize=6)
        ax = axes[i, -1]
        for k, (model, delay) in enumerate((m, dl) for m in models for dl in ("exp", "lognormal")):
            sel = [r for r in rows if r["link"] == link and r["model"] == model
                   and r["delay"] == delay]
            x = [r["n"] for r in sel]
            ax.plot(x, [r["ratio_new"] for r in sel], f"C{k}-", marker="o", ms=3,
                    label=f"new, {model}, {delay}")
            ax.plot(x, [r["ratio_old"] for r in sel], f"C{k}--", marker="x", ms=3,
                    label=f"old, {model}, {delay}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n")
        ax.set_ylabel("PGC-CR / DGD time per step")
        ax.set_title(f"{link}: PGC-CR / DGD", fontsize=9)
        ax.legend(fontsize=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
