"""One simulated run from plain settings, and ``pgc-hvd simulate``.

    records, summary = simulate(scheme="pgc-cr", n=12, s=2, dataset="digits", model="softmax",
                                optimizer="sgd:lr=0.5", delay="exp:mean=1", steps=100, ...)

``optimizer``: ``NAME[:key=value,...]`` with NAME ``sgd``, ``nesterov`` (SGD, momentum 0.9,
nesterov=True unless given) or any ``torch.optim`` class name (``adam``, ``rmsprop``, ...); or a
callable ``params -> Optimizer``. The summary (see :func:`summarize`) holds the figures the
experiment tables use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from pgc_hvd.data import load_dataset, partition, standardize, train_test_split
from pgc_hvd.metrics.diagnostics import delay_histogram
from pgc_hvd.metrics.records import RecordWriter, check_run_folder, to_jsonable
from pgc_hvd.models import build_task, default_model
from pgc_hvd.options import parse_options
from pgc_hvd.schemes import get_scheme

from .comm import CommModel
from .engine import SimConfig, Simulator


def make_optimizer(spec: Any) -> Callable:
    if callable(spec):
        return spec
    name, _, args = str(spec).partition(":")
    kw: dict = {}
    for a in (x for x in args.split(",") if x.strip()):
        k, eq, v = a.partition("=")
        v = v.strip()
        try:
            if not eq:
                raise ValueError
            kw[k.strip()] = (v.lower() == "true") if v.lower() in ("true", "false") else float(v)
        except ValueError:
            raise ValueError(f"optimizer spec {spec!r}: {a.strip()!r} is not KEY=NUMBER (or "
                             "true/false); e.g. sgd:lr=0.5,momentum=0.9") from None
    name = name.strip().lower()
    if name == "nesterov":
        kw.setdefault("momentum", 0.9)
        kw.setdefault("nesterov", True)
        name = "sgd"
    classes = {c.lower(): getattr(torch.optim, c) for c in dir(torch.optim)
               if isinstance(getattr(torch.optim, c), type)}
    if name not in classes:
        raise ValueError(f"unknown optimizer {name!r} in {spec!r}; use a torch.optim class name "
                         "in lower case (sgd, adam, adamw, ...) or nesterov")
    cls = classes[name]
    return lambda params: cls(params, **kw)


def prepare_data(dataset: str, root: Optional[str] = None, test_fraction: float = 0.2,
                 seed: int = 0, standardize_features: Optional[bool] = None):
    ds = load_dataset(dataset, root=root) if root else load_dataset(dataset)
    tr, te = train_test_split(ds, test_fraction, seed=seed)
    if standardize_features is None:
        standardize_features = len(ds.feature_shape) == 1  # tabular data
    if standardize_features:
        tr, mu, sd = standardize(tr)
        te, _, _ = standardize(te, mu, sd)
    return tr, te


def simulate(scheme: str, n: int, s: int, dataset: str = "digits", model: Optional[str] = None,
             optimizer: Any = "sgd:lr=0.5", delay: Any = None, steps: int = 100,
             iid: bool = True, sizes=None, seed: int = 0, scheme_options: Optional[dict] = None,
             data=None, records_path: Optional[Path] = None, zero_init: bool = False,
             dtype: torch.dtype = torch.float32, adaptive: bool = False,
             control: Optional[dict] = None, overwrite: bool = False,
             **config) -> tuple[list, dict]:
    """``adaptive=True``: the staleness control rule (:mod:`pgc_hvd.control`, options in
    ``control``, e.g. ``{"knob": "c", "high": 1.0, "every": 2}``) for schemes that use stale
    gradients (bounded staleness, PGC); exact schemes run without it. ``records_path``: where the
    records go (one JSON line per step); an existing non-empty file there is refused unless
    ``overwrite=True``. Every argument is checked before that file is opened.

    ``scheme="dgd"`` runs with s = 0 whatever ``s`` is: the papers' experiments run DGD, which
    waits for every worker, beside the schemes of budget s, and this is the one place that
    accepts it; its records and summary say s = 0 (``get_scheme("dgd", n, s)`` refuses s > 0)."""
    from pgc_hvd.control.rule import ControlConfig, adaptive_default
    if adaptive_default(scheme, adaptive):
        from pgc_hvd.control.sim import SimController
        ctl = SimController(ControlConfig.from_options(control))
        config["step_hook"] = ctl
        config.setdefault("diag_every", ctl.cfg.every)
        config.setdefault("diag_cost", True)
    tr, te = data if data is not None else prepare_data(dataset, seed=seed)
    task = build_task(model or default_model(tr), tr, seed=seed, zero_init=zero_init, dtype=dtype)
    baseline = isinstance(scheme, str) and scheme.lower() == "dgd"
    sch = get_scheme(scheme, n, 0 if baseline else s, **(scheme_options or {}))
    parts = partition(tr.y, n, iid=iid, sizes=sizes, seed=seed)
    cfg = SimConfig(steps=steps, delay=delay, seed=seed, **config)
    sim = Simulator(sch, task, tr, parts, make_optimizer(optimizer), cfg, test=te)
    writer = RecordWriter(records_path, overwrite=overwrite) if records_path else None
    sim.writer = writer
    try:
        recs = sim.run()
    finally:
        if writer is not None:
            writer.close()
    return recs, summarize(sim, recs)


def summarize(sim: Simulator, recs) -> dict:
    last = recs[-1]
    T = last.time
    ages = [r.max_age for r in recs if r.max_age is not None]
    out = {
        "scheme": sim.scheme.name, "n": sim.n, "s": sim.scheme.s, "steps": len(recs),
        "time": T, "time_per_step": T / len(recs),
        "final_loss": next((r.loss for r in reversed(recs) if r.loss is not None), None),
        "test_accuracy": last.extra.get("test_accuracy"), "test_auc": last.extra.get("test_auc"),
        "test_loss": last.extra.get("test_loss"),
        "initial_loss": sim.initial.get("train_loss"),
        "decode_norm1_mean": float(np.mean([r.decode_norm1 for r in recs if r.decode_norm1 is not None]
                                           or [np.nan])),
        "alpha_max": float(max((r.alpha_max for r in recs if r.alpha_max is not None), default=np.nan)),
        "alpha_min": float(min((r.alpha_min for r in recs if r.alpha_min is not None), default=np.nan)),
        "grad_evals": sim.total_evals, "partition_time": sim.partition_time,
        "decode_time_total": float(sum(r.extra.get("decode_time", 0.0) for r in recs)),
        "bytes": int(sum(r.bytes or 0 for r in recs)),
        "utilisation": float(sim.busy_total.sum() / (sim.n * T)) if T > 0 else None,
        "max_age": int(max(ages)) if ages else 0,
        "delay_histogram": delay_histogram(sim.delays_seen),
    }
    out["time_excl_decode"] = T - out["decode_time_total"]
    for k in ("err_total", "err_coding", "err_stale", "err_compress", "g_hat_sq", "disp_max",
              "L_hat_max", "corr_min"):
        vals = [r.extra[k] for r in recs if r.extra.get(k) is not None]
        out[k + "_mean"] = float(np.mean(vals)) if vals else None
    acts = [a for r in recs for a in r.extra.get("control", [])]
    out["control_actions"] = len(acts)
    out["diag_seconds_total"] = float(sum(r.extra.get("diag_seconds", 0.0) for r in recs))
    out["err_compress_total"] = float(sum(r.extra.get("err_compress", 0.0) for r in recs))
    ce = [r.extra["class_error"] for r in recs if r.extra.get("class_error") is not None]
    out["class_error_total"] = float(sum(ce)) if ce else None  # sum_t sum_{i in K} ||eps_i||
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pgc-hvd simulate",
                                description="One simulated run: n virtual workers, real gradients, virtual time.")
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--n", type=int, default=12)
    p.add_argument("--s", type=int, default=1)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="scheme option, e.g. c=2, r=2, decoder=min-error")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default=None,
                   help="local folder of cifar10 (python pickle batches) or imagefolder data")
    p.add_argument("--model", default=None, help="softmax, logistic, cnn, resnet18")
    p.add_argument("--optimizer", default="sgd:lr=0.5")
    p.add_argument("--delay", default="exp:mean=1", help="delay spec, e.g. 'lognormal:mu=-1,sigma=0.5+straggler:p=0.01' or replay:PATH")
    p.add_argument("--save-trace", default=None, help="write the delay trace (JSON) here")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--partition-time", type=float, default=None, help="seconds per partition; default: measured")
    p.add_argument("--alpha", type=float, default=None,
                   help="master model: seconds per message (default 5e-4)")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="master model: bytes per second (default 30e6)")
    p.add_argument("--comm-model", default=None, metavar="SPEC",
                   help="master[:alpha=..,bandwidth=..] (default), or the Horovod runtime's "
                        "collectives: ring:alpha=SECONDS,gbps=GBIT (or beta=, bandwidth=) or "
                        "fitted:PATH (benchmarks/measure_collectives.py); see pgc_hvd.sim.comm")
    p.add_argument("--plane", default=None, choices=["allgather", "allgather-2phase", "allreduce"],
                   help="collective models: the runtime's data plane (default allreduce)")
    p.add_argument("--poll-interval", type=float, default=None,
                   help="collective models: seconds between control rounds (default 0.002)")
    p.add_argument("--compression", default=None, metavar="SPEC",
                   help="none (default) or topk:RATIO[,ef=0|1][,method=exact|threshold]: "
                        "top-kappa of every coded message, error feedback on unless ef=0 (the "
                        "spelling of pgc-hvd train; pgc_hvd.compress.parse_compression)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="minibatch per partition gradient (seeded by step); default: full partition")
    p.add_argument("--non-iid", action="store_true", help="partitions sorted by label")
    p.add_argument("--policy", default="continue", choices=["continue", "cancel"])
    p.add_argument("--adaptive", action="store_true",
                   help="staleness control rule (bounded staleness, PGC): lower lr or c when "
                        "L_hat^2*disp/||g_hat||^2 is large (pgc_hvd.control)")
    p.add_argument("--control", action="append", default=[], metavar="KEY=VALUE",
                   help="control rule option: high, low, window, patience, factor, knob (lr|c|auto), every")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", required=True, help="output folder (records.jsonl, summary.json)")
    p.add_argument("--force", action="store_true",
                   help="replace the results of an earlier run in --out")
    a = p.parse_args(argv)
    if a.threads < 1:
        p.error(f"--threads must be >= 1, got {a.threads}")
    if a.control and not a.adaptive:
        p.error("--control sets options of the control rule: it needs --adaptive")
    if a.steps < 1:
        p.error(f"--steps must be >= 1, got {a.steps}")
    from pgc_hvd.compress import parse_compression
    try:
        topk = parse_compression(a.compression)
    except ValueError as err:
        p.error(f"--compression: {err}")
    if topk is not None and topk.k is not None:
        p.error(f"--compression {a.compression!r}: the simulator takes a ratio (topk:RATIO), "
                f"not a count of entries")
    from .comm import CollectiveModel, parse_comm_model
    if a.comm_model is not None and (a.alpha is not None or a.bandwidth is not None):
        p.error("--alpha/--bandwidth set the master model; with --comm-model put them in the spec "
                "(master:alpha=..,bandwidth=.. or ring:alpha=..,gbps=..)")
    try:
        comm = (parse_comm_model(a.comm_model) if a.comm_model is not None else
                CommModel(5e-4 if a.alpha is None else a.alpha,
                          30e6 if a.bandwidth is None else a.bandwidth))
        if isinstance(comm, CollectiveModel):
            comm = comm.replace(**{k: v for k, v in (("plane", a.plane),
                                                     ("poll_interval", a.poll_interval))
                                   if v is not None})
        elif a.plane is not None or a.poll_interval is not None:
            p.error("--plane and --poll-interval apply to collective comm models (--comm-model "
                    "ring:... or fitted:PATH), not to the master model")
    except ValueError as err:
        p.error(f"--comm-model: {err}")
    try:
        check_run_folder(a.out, overwrite=a.force)
    except ValueError as err:
        p.error(str(err))
    if a.save_trace and Path(a.save_trace).is_dir():
        p.error(f"--save-trace {a.save_trace} is a folder; name the trace file to write")
    torch.set_num_threads(a.threads)
    try:
        opts = parse_options(a.option, "--option")
        control = parse_options(a.control, "--control")
    except ValueError as err:
        p.error(str(err))
    from pgc_hvd.delays import Recording, parse_delay
    try:
        delay = Recording(parse_delay(a.delay))
    except (ValueError, OSError) as err:   # a bad spec, or a missing or damaged replay: trace
        p.error(f"--delay {a.delay!r}: {err}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(a.dataset, root=a.data_dir, seed=a.seed) if a.data_dir else None
    recs, summary = simulate(a.scheme, a.n, a.s, a.dataset, a.model, a.optimizer, delay, a.steps,
                             iid=not a.non_iid, seed=a.seed, scheme_options=opts, data=data,
                             records_path=out / "records.jsonl", partition_time=a.partition_time,
                             comm=comm, compress=None if topk is None else topk.ratio,
                             error_feedback=None if topk is None else topk.error_feedback,
                             straggler_policy=a.policy,
                             batch_size=a.batch_size, adaptive=a.adaptive,
                             control=control, overwrite=a.force,
                             progress=True)
    if a.save_trace:
        delay.trace.save(a.save_trace)
    (out / "summary.json").write_text(json.dumps(to_jsonable(summary), indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "delay_histogram"}, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
