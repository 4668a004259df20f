"""One simulated run from plain settings (``pgc-hvd simulate`` is :mod:`pgc_hvd.apps.simulate`).

    records, summary = simulate(scheme="pgc-cr", n=12, s=2, dataset="digits", model="softmax",
                                optimizer="sgd:lr=0.5", delay="exp:mean=1", steps=100, ...)

``optimizer``: ``NAME[:key=value,...]`` with NAME ``sgd``, ``nesterov`` (SGD, momentum 0.9,
nesterov=True unless given) or any ``torch.optim`` class name (``adam``, ``rmsprop``, ...); or a
callable ``params -> Optimizer``. The summary (see :func:`summarize`) holds the figures the
experiment tables use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from pgc_hvd.control.momentum import remedy_scheme_options
from pgc_hvd.options import split_spec
from pgc_hvd.data import load_dataset, partition, standardize, train_test_split
from pgc_hvd.metrics.diagnostics import delay_histogram
from pgc_hvd.metrics.records import RecordWriter
from pgc_hvd.models import build_task, default_model
from pgc_hvd.schemes import get_scheme, stragglers_for

from .engine import SimConfig, Simulator


def make_optimizer(spec: Any) -> Callable:
    if callable(spec):
        return spec
    name, _, parts = split_spec(spec)
    kw: dict = {}
    for part in parts:
        v = part.value
        try:
            if part.key is None:
                raise ValueError
            kw[part.key] = (v.lower() == "true") if v.lower() in ("true", "false") else float(v)
        except ValueError:
            raise ValueError(f"optimizer spec {spec!r}: {part.text!r} is not KEY=NUMBER (or "
                             "true/false); e.g. sgd:lr=0.5,momentum=0.9") from None
    name = name.lower()
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


def param_groups_of(make_opt: Callable) -> list:
    """The hyper-parameters ``make_opt`` gives (its ``param_groups``, read from an optimizer
    built on one throw-away parameter), for the remedy's scheme options."""
    return make_opt([torch.nn.Parameter(torch.zeros(1))]).param_groups


def prepare_data(dataset: str, root: Optional[str] = None, test_fraction: float = 0.2,
                 seed: int = 0, standardize_features: Optional[bool] = None,
                 verify: bool = True):
    """Arrays of a named dataset, split (and standardised when tabular); ``verify=False``
    reads CIFAR-10 batches whose MD5 differs from the published files."""
    options = {"verify": verify} if dataset.replace("-", "_").lower() == "cifar10" else {}
    ds = load_dataset(dataset, root=root, **options) if root else load_dataset(dataset)
    tr, te = train_test_split(ds, test_fraction, seed=seed)
    if standardize_features is None:
        standardize_features = len(ds.feature_shape) == 1  # tabular data
    if standardize_features:
        tr, mu, sd = standardize(tr)
        te, _, _ = standardize(te, mu, sd)
    return tr, te


def simulate(scheme: str, n: int, s: Optional[int] = None, dataset: str = "digits",
             model: Optional[str] = None, optimizer: Any = "sgd:lr=0.5", delay: Any = None,
             steps: int = 100, iid: bool = True, sizes=None, seed: int = 0,
             scheme_options: Optional[dict] = None, data=None,
             records_path: Optional[Path] = None, zero_init: bool = False,
             dtype: torch.dtype = torch.float32, adaptive: bool = False,
             rule: Optional[dict] = None, overwrite: bool = False,
             auto: Optional[dict] = None, **config) -> tuple[list, dict]:
    """``adaptive=True``: the staleness control rule (:mod:`pgc_hvd.control`, options in
    ``rule``, e.g. ``{"knob": "c", "high": 1.0, "every": 2}``) for schemes that use stale
    gradients (bounded staleness, PGC); exact schemes run without it. ``records_path``: where the
    records go (one JSON line per step); an existing non-empty file there is refused unless
    ``overwrite=True``. Every argument is checked before that file is opened.

    ``s``: the straggler budget, checked as the optimizer checks it, or None for the scheme's
    default (:func:`pgc_hvd.schemes.stragglers_for`: 0 for dgd, which refuses s > 0 here too;
    an experiment that runs DGD beside the schemes of budget s passes
    :func:`pgc_hvd.schemes.setting_stragglers`).

    ``s="auto"``: the budget is chosen online (:mod:`pgc_hvd.control.auto_s`, options in
    ``auto``, e.g. ``{"every": 20, "s_max": 3, "min_gain": 0.08}``): the run starts at
    ``s_start`` (default the scheme's, 1) and re-plans at boundaries; a budget n does not allow
    (``s_max > n - 1``) is refused here, before anything runs. The master comm model only."""
    auto_rule = None
    if isinstance(s, str):
        if s != "auto":
            raise ValueError(f"s = {s!r}: give an int (the straggler budget) or 'auto'")
        from pgc_hvd.control.auto_s import AutoStragglers
        auto_rule = AutoStragglers(scheme, n, auto, scheme_options)
        s = auto_rule.s
    elif auto is not None:
        raise ValueError("auto options need s='auto' (stragglers='auto')")
    s = stragglers_for(scheme, n, s)
    from pgc_hvd.control.rule import ControlConfig, adaptive_default
    if auto_rule is not None and adaptive_default(scheme, adaptive):
        raise ValueError("stragglers='auto' with adaptive=True: the staleness control rule "
                         "binds its knob to one scheme, which a re-plan replaces; run one of "
                         "the two (adaptive=False, or a fixed s)")
    if adaptive_default(scheme, adaptive):
        from pgc_hvd.control.sim import SimController
        ctl = SimController(ControlConfig.from_options(rule))
        config["step_hook"] = ctl
        config.setdefault("diag_every", ctl.cfg.every)
        config.setdefault("diag_cost", True)
    tr, te = data if data is not None else prepare_data(dataset, seed=seed)
    task = build_task(model or default_model(tr), tr, seed=seed, zero_init=zero_init, dtype=dtype)
    make_opt = make_optimizer(optimizer)
    sch_options = remedy_scheme_options(scheme, scheme_options, param_groups_of(make_opt),
                                        config.get("momentum_correction", True))
    sch = get_scheme(scheme, n, s, **sch_options)
    if auto_rule is not None:
        config["auto"] = auto_rule
        config["make_scheme"] = lambda s_new: get_scheme(scheme, n, s_new, **sch_options)
    parts = partition(tr.y, n, iid=iid, sizes=sizes, seed=seed)
    cfg = SimConfig(steps=steps, delay=delay, seed=seed, **config)
    sim = Simulator(sch, task, tr, parts, make_opt, cfg, test=te)
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
        "diverged": sim.diverged,   # the step at which the run diverged (None: it did not)
        "ring_decay": getattr(sim.scheme, "decay", None),   # PGC-CR's rho (the remedy: 1 - beta)
    }
    out["time_excl_decode"] = T - out["decode_time_total"]
    for k in ("err_total", "err_coding", "err_stale", "err_compress", "g_hat_sq", "disp_max",
              "L_hat_max", "corr_min"):
        vals = [r.extra[k] for r in recs if r.extra.get(k) is not None]
        out[k + "_mean"] = float(np.mean(vals)) if vals else None
    acts = [a for r in recs for a in r.extra.get("control", [])]
    out["control_actions"] = len(acts)
    switches = [a for r in recs for a in r.extra.get("auto_s", [])]
    if sim.cfg.auto is not None:
        # stragglers="auto": every switch (step, old s, new s, reason) and the steps run at each s
        out["auto_switches"] = [{k: v for k, v in a.items() if k != "predictions"}
                                for a in switches]
        at_s: dict = {}
        for r in recs:
            at_s[r.s] = at_s.get(r.s, 0) + 1
        out["steps_at_s"] = {str(k): v for k, v in sorted(at_s.items())}
    out["diag_seconds_total"] = float(sum(r.extra.get("diag_seconds", 0.0) for r in recs))
    out["err_compress_total"] = float(sum(r.extra.get("err_compress", 0.0) for r in recs))
    ce = [r.extra["class_error"] for r in recs if r.extra.get("class_error") is not None]
    out["class_error_total"] = float(sum(ce)) if ce else None  # sum_t sum_{i in K} ||eps_i||
    return out
