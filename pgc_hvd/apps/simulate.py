"""``pgc-hvd simulate``: one simulated run from the command line (:func:`pgc_hvd.sim.run.simulate`),
``OUT/records.jsonl`` and ``OUT/summary.json``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from pgc_hvd.delays import Recording, parse_delay
from pgc_hvd.metrics.records import check_run_folder, to_jsonable
from pgc_hvd.options import parse_options
from pgc_hvd.sim.comm import CollectiveModel, CommModel, parse_comm_model
from pgc_hvd.sim.run import prepare_data, simulate


def _with_log_control(p, comm: CollectiveModel, control: str, log_fit, measured_here: bool):
    """``comm`` on the ``control`` path with the log's measured costs (as measured for a link
    fitted on this machine, else moved to ``comm``'s link, as ``pgc-hvd experiment scale``
    does), or a usage error naming what is wrong (no costs file, a plane that carries
    payloads)."""
    from pgc_hvd.sim.log_costs import load_log_fit

    from .scale import DEFAULT_LOG_FIT
    path = Path(log_fit) if log_fit is not None else DEFAULT_LOG_FIT
    try:
        costs = load_log_fit(path)
    except (OSError, ValueError) as err:
        p.error(f"--log-fit: {err}")
    try:
        if not measured_here:
            link = comm.network.allgather
            costs = costs.on_link(link.alpha, link.beta)
        return comm.replace(control=control, log=costs)
    except ValueError as err:
        p.error(f"--control {control}: {err}")


def _budget(text: str):
    """--stragglers: an int, or 'auto'."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give an int (the straggler budget s) or 'auto', "
                                         f"got {text!r}") from None


def _auto_options(p, items) -> dict:
    """--auto-options KEY=VALUE -> AutoConfig's options (ints where the field is an int, raise_to a
    word)."""
    from pgc_hvd.control.auto_s import AutoConfig
    try:
        raw = parse_options(items, "--auto-options")
    except ValueError as err:
        p.error(str(err))
    ints = {"every", "first", "cooldown", "horizon", "window", "s_max", "s_start",
            "min_samples", "draws"}
    words = {"raise_to"}
    out = {}
    for k, v in raw.items():
        try:
            out[k] = v if k in words else int(v) if k in ints else float(v)
        except (TypeError, ValueError):
            p.error(f"--auto-options {k}={v}: not a number")
    try:
        AutoConfig.from_options(out)
    except ValueError as err:
        p.error(f"--auto-options: {err}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pgc-hvd simulate",
                                description="One simulated run: n virtual workers, real gradients, virtual time.")
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--n", type=int, default=12)
    p.add_argument("--stragglers", "--straggler-budget", dest="s", type=_budget, default=None,
                   help="straggler budget s (default: the scheme's, 1; 0 for dgd, which waits "
                        "for every worker and takes 0 only), or 'auto': chosen online from the "
                        "workers' delays (pgc_hvd.control.auto_s; options with --auto-options)")
    p.add_argument("--s", dest="s", type=_budget, help=argparse.SUPPRESS)   # the old spelling
    p.add_argument("--auto-options", dest="auto", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="--stragglers auto option: every (steps between re-plans, 1), first "
                        "(1), window (samples per rank, 16), min_gain (0.08), early_gain, "
                        "s_max, s_start, staleness_cost, min_samples, tau")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="scheme option, e.g. c=2, r=2, decoder=min-error")
    p.add_argument("--dataset", default="digits")
    p.add_argument("--data-dir", default=None,
                   help="local folder of cifar10 (holding cifar-10-batches-py, read by "
                        "torchvision) or imagefolder data")
    p.add_argument("--no-verify-data", action="store_true",
                   help="cifar10: read batches whose MD5 differs from the published files")
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
                        "fitted:PATH (benchmarks/data_plane/measure_collectives.py); see pgc_hvd.sim.comm")
    p.add_argument("--plane", default=None, choices=["allgather", "allgather-2phase", "allreduce"],
                   help="collective models: the runtime's data plane (default allreduce)")
    p.add_argument("--poll-interval", type=float, default=None,
                   help="collective models: seconds between control rounds (default 0.002)")
    p.add_argument("--control", default=None,
                   choices=["allgather", "log", "log-bcast", "log-store"],
                   help="collective models: how a step's decision is reached (the optimizer's "
                        "control=; default here allgather, polled rounds; log: the runtime's "
                        "default, rows appended to rank 0's store and each outcome broadcast "
                        "from rank 0 (log-bcast: the same); log-store: the outcome served from "
                        "the store instead, the delivery before issue 38); pgc_hvd.sim.comm")
    p.add_argument("--log-fit", default=None, metavar="PATH",
                   help="--control log / log-bcast / log-store: the log's measured costs "
                        "(default docs/figures/log_control_fit.json, from benchmarks/"
                        "measure_log_control.py)")
    p.add_argument("--compression", default=None, metavar="SPEC",
                   help="none (default) or topk:RATIO[,ef=0|1][,method=exact|threshold]: "
                        "top-kappa of every coded message, error feedback on unless ef=0 (the "
                        "spelling of pgc-hvd train; pgc_hvd.compress.parse_compression)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="minibatch per partition gradient (seeded by step); default: full partition")
    p.add_argument("--non-iid", action="store_true", help="partitions sorted by label")
    p.add_argument("--policy", default="continue", choices=["continue", "cancel"])
    p.add_argument("--momentum-correction", default="on", choices=["on", "off"],
                   help="subtract the stale gradients' implicit momentum from the optimizer's "
                        "(default on, as the runtime; pgc_hvd.control.momentum)")
    p.add_argument("--adaptive", action="store_true",
                   help="staleness control rule (bounded staleness, PGC): lower lr or c when "
                        "L_hat^2*disp/||g_hat||^2 is large (pgc_hvd.control)")
    p.add_argument("--rule", action="append", default=[], metavar="KEY=VALUE",
                   help="control rule option: high, low, window, patience, factor, knob (lr|c|auto), every")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", required=True, help="output folder (records.jsonl, summary.json)")
    p.add_argument("--force", action="store_true",
                   help="replace the results of an earlier run in --out")
    a = p.parse_args(argv)
    if a.threads < 1:
        p.error(f"--threads must be >= 1, got {a.threads}")
    if a.rule and not a.adaptive:
        p.error("--rule sets options of the control rule: it needs --adaptive")
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
        elif (a.plane, a.poll_interval, a.control) != (None, None, None):
            p.error("--plane, --poll-interval and --control apply to collective comm "
                    "models (--comm-model ring:... or fitted:PATH), not to the master model")
    except ValueError as err:
        p.error(f"--comm-model: {err}")
    if a.log_fit is not None and a.control in (None, "allgather"):
        p.error("--log-fit gives the log control's costs: it needs --control log, "
                "log-bcast or log-store")
    if a.control not in (None, "allgather"):
        comm = _with_log_control(p, comm, a.control, a.log_fit,
                                 measured_here=a.comm_model.startswith("fitted:"))
    try:
        check_run_folder(a.out, overwrite=a.force)
    except ValueError as err:
        p.error(str(err))
    if a.save_trace and Path(a.save_trace).is_dir():
        p.error(f"--save-trace {a.save_trace} is a folder; name the trace file to write")
    torch.set_num_threads(a.threads)
    try:
        opts = parse_options(a.option, "--option")
        rule = parse_options(a.rule, "--rule")
    except ValueError as err:
        p.error(str(err))
    from pgc_hvd.schemes import scheme_class
    try:
        scheme_cls = scheme_class(a.scheme)
    except ValueError as err:
        p.error(f"--scheme: {err}")
    auto = None
    if a.auto and a.s != "auto":
        p.error("--auto-options sets options of --stragglers auto: it needs --stragglers auto")
    if a.s == "auto":
        from pgc_hvd.control.auto_s import AutoStragglers
        auto = _auto_options(p, a.auto)
        try:
            AutoStragglers(a.scheme, a.n, auto)     # the budget range, before anything runs
        except ValueError as err:
            p.error(f"--stragglers auto: {err}")
        if isinstance(comm, CollectiveModel):
            p.error("--stragglers auto runs on the master comm model (the default) only; "
                    "drop --comm-model")
        if a.adaptive:
            p.error("--stragglers auto and --adaptive are not combined yet; run one of them")
    try:
        if a.s is not None and a.s != "auto":
            scheme_cls.check_stragglers(a.s, a.n)
    except ValueError as err:
        p.error(f"--stragglers {a.s}: {err}")
    try:
        delay = Recording(parse_delay(a.delay))
    except (ValueError, OSError) as err:   # a bad spec, or a missing or damaged replay: trace
        p.error(f"--delay {a.delay!r}: {err}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(a.dataset, root=a.data_dir, seed=a.seed,
                        verify=not a.no_verify_data) if a.data_dir else None
    recs, summary = simulate(a.scheme, a.n, a.s, a.dataset, a.model, a.optimizer, delay, a.steps,
                             iid=not a.non_iid, seed=a.seed, scheme_options=opts, data=data,
                             records_path=out / "records.jsonl", partition_time=a.partition_time,
                             comm=comm, compression=topk,
                             straggler_policy=a.policy,
                             momentum_correction=a.momentum_correction == "on",
                             batch_size=a.batch_size, adaptive=a.adaptive,
                             rule=rule, overwrite=a.force, auto=auto,
                             progress=True)
    if a.save_trace:
        delay.trace.save(a.save_trace)
    (out / "summary.json").write_text(json.dumps(to_jsonable(summary), indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "delay_histogram"}, default=str))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
