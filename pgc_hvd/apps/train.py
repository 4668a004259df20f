"""``pgc-hvd train``: one training run; runs on every rank under ``horovodrun`` or ``torchrun``.

    horovodrun --gloo -np 4 -H localhost:4 python -m pgc_hvd train --scheme pgc-cr --stragglers 1 \\
        --dataset digits --model cnn --steps 80 --delay exp:mean=0.1,seed=1 --out runs/x
    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 4 -m pgc_hvd train ... # no Horovod

The engine follows the launcher (:func:`pgc_hvd.runtime.engine.from_environment`): Horovod's
collectives under ``horovodrun``, torch.distributed's (:mod:`pgc_hvd.torch`) under ``torchrun``
(its backend: ``PGC_HVD_TORCH_BACKEND=gloo|nccl``, default NCCL for CUDA tensors; ``gloo`` lets
several ranks share one GPU).

Each rank is one worker; rank 0 writes ``OUT/records.jsonl`` (one StepRecord per step, the
format the simulator writes), ``OUT/summary.json`` (time per step, time to the target loss, final
loss and accuracy) and prints progress. Straggler delays come from the simulator's delay models
(:func:`pgc_hvd.delays.parse_delay`: ``exp:mean=0.1``, ``replay:trace.json``, ...) and are
slept on the compute side of each rank, so a simulated run can face the same schedule.

``--dataset cifar10|imagefolder --data-dir DIR`` trains on torchvision's ``CIFAR10`` /
``ImageFolder`` through :class:`pgc_hvd.data.CodedLoader` (``--workers`` DataLoader processes
per rank, ``--augment``); the small bundled sets stay in memory
(:mod:`pgc_hvd.apps.train_data`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from pgc_hvd.metrics.records import check_run_folder
from pgc_hvd.metrics.targets import RUNTIME_WINDOW, first_reaching
from pgc_hvd.options import parse_options


def _budget(text: str):
    """--stragglers: an int, or 'auto'."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give an int (the straggler budget s) or 'auto', "
                                         f"got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pgc-hvd train", description=__doc__.split("\n\n")[0])
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--stragglers", "--straggler-budget", dest="s", type=_budget, default=None,
                   help="straggler budget s (default: the scheme's, 1; 0 for dgd, which waits "
                        "for every rank and takes 0 only, and on one rank; not `--s`: "
                        "horovodrun would take it for its own), or 'auto': chosen while "
                        "training from the ranks' delays (docs/control.md)")
    p.add_argument("--auto-options", dest="auto", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="--stragglers auto option (repeat, or comma-separated): s_start, s_max, "
                        "every (20), first (10), cooldown (20), window (16), min_gain (0.08), "
                        "early_gain (1.0), staleness_cost (measured on the runtime's "
                        "workload: RUNTIME_STALENESS_COST), tau, ... (not `--auto`: horovodrun "
                        "refuses it as an abbreviation of its --autotune options)")
    p.add_argument("--dataset", default="digits",
                   help="digits, breast_cancer, wine, iris, generated (in memory), or cifar10 / "
                        "imagefolder: torchvision's CIFAR10 / ImageFolder from --data-dir, fed "
                        "through pgc_hvd.data.CodedLoader's DataLoader workers")
    p.add_argument("--data-dir", default=None,
                   help="cifar10: the folder holding cifar-10-batches-py (or it); imagefolder: "
                        "one sub-folder of images per class (80/20 split by the seed)")
    p.add_argument("--workers", type=int, default=2,
                   help="DataLoader worker processes per rank for cifar10 / imagefolder")
    p.add_argument("--image-size", type=int, default=32,
                   help="imagefolder: images resized to SIZE x SIZE")
    p.add_argument("--augment", action="store_true",
                   help="cifar10 / imagefolder: RandomCrop(padding) + RandomHorizontalFlip, "
                        "seeded per sample so every replica augments alike")
    p.add_argument("--no-verify-data", action="store_true",
                   help="cifar10: read batches whose MD5 differs from the published files "
                        "(a re-packed or cut-down copy)")
    p.add_argument("--model", default="cnn")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch-size", type=int, default=32, help="per partition and step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--momentum-correction", choices=("on", "off"), default="on",
                   help="apply each stale update with the momentum its stale gradients have not "
                        "already supplied (default on; pgc_hvd.control.momentum)")
    p.add_argument("--delay", default="zero", help="delay model spec, e.g. exp:mean=0.1,seed=1")
    p.add_argument("--compute-time", type=float, default=0.0,
                   help="emulated extra compute seconds per partition evaluated")
    p.add_argument("--non-iid", action="store_true", help="partitions sorted by label")
    p.add_argument("--compression", default=None, metavar="SPEC",
                   help="none (default) or topk:RATIO[,ef=0|1][,method=exact|threshold] (also "
                        "topk:k=COUNT): sparse top-kappa messages, error feedback unless ef=0; "
                        "the spelling of pgc-hvd simulate")
    p.add_argument("--target-loss", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--progress-every", type=int, default=10)
    p.add_argument("--adaptive", action="store_true",
                   help="staleness control (pgc_hvd.control): lower lr (or the staleness bound c of "
                        "bounded-staleness) when the staleness error is large and the validation "
                        "loss grows; stale schemes only")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="scheme option (repeatable, or comma-separated), e.g. c=4,r=2 for "
                        "bounded-staleness, decoder=n-s for bcgc")
    p.add_argument("--control", choices=("allgather", "store", "log"), default=None,
                   help="how ranks exchange control rows (default: the optimizer's, log): an "
                        "ordered log in a TCPStore served by rank 0 with rank 0 deciding, no "
                        "polling (pgc_hvd.runtime.control_log), the polled Horovod allgather, or "
                        "the store's rows polled (pgc_hvd.runtime.control_store)")
    p.add_argument("--rule", action="append", default=[], metavar="KEY=VALUE",
                   help="control rule options KEY=VAL,... (ControlConfig fields: high, low, window, "
                        "patience, factor, growth, trend_window, every, knob=lr|c|auto, ...)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where each rank trains: cuda pins rank r to GPU local_rank mod the GPUs "
                        "it sees (the usual Horovod layout, one rank per GPU); auto (default) = "
                        "cuda when torch sees a GPU and pgc_hvd._C has its CUDA kernels, else cpu")
    p.add_argument("--out", required=True, help="run folder (records.jsonl, summary.json)")
    p.add_argument("--force", action="store_true", help="overwrite records in --out")
    return p


def resolve_device(choice: str, local_rank: int):
    """The torch device this rank trains on (see ``--device``); for cuda, also makes it the
    current device. A cuda request that cannot be met is an error naming the fix."""
    import torch

    if choice == "cpu":
        return torch.device("cpu")
    from pgc_hvd.ops._ext import cuda_compiled

    have_gpu, have_kernels = torch.cuda.is_available(), cuda_compiled()
    if choice == "auto" and not (have_gpu and have_kernels):
        return torch.device("cpu")
    if not have_gpu:
        raise SystemExit("--device cuda: torch sees no GPU on this host (check CUDA_VISIBLE_DEVICES "
                         "and the driver), or train with --device cpu")
    if not have_kernels:
        raise SystemExit("--device cuda: pgc_hvd._C was built without its CUDA kernels; rebuild on "
                         "a machine with the CUDA toolkit (bash launch/setup.sh) or train with "
                         "--device cpu")
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        scheme_options = parse_options(args.option, "--option")
        control_options = parse_options(args.rule, "--rule")
    except ValueError as err:
        parser.error(str(err))
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    from pgc_hvd.schemes import scheme_class
    try:
        scheme_cls = scheme_class(args.scheme)
    except ValueError as err:
        parser.error(f"--scheme: {err}")
    try:   # the scheme's check of s; its range in n = hvd.size() is the optimizer's, the same
        if args.s is not None and args.s != "auto":
            scheme_cls.check_stragglers(args.s)
    except ValueError as err:
        parser.error(f"--stragglers {args.s}: {err}")
    try:   # stragglers="auto": its options, checked with n by the optimizer before any collective
        auto_options = parse_options(args.auto, "--auto-options") if args.auto else None
    except ValueError as err:
        parser.error(str(err))
    if auto_options is not None and args.s != "auto":
        parser.error("--auto-options sets options of --stragglers auto: it needs --stragglers auto")
    if args.s == "auto" and (args.adaptive or args.rule):
        parser.error("--stragglers auto and --adaptive are not combined yet (the control rule "
                     "binds its knob to the scheme a re-plan replaces); run one of them")
    if args.workers < 0:
        parser.error(f"--workers is a number of DataLoader processes and must be >= 0, got "
                     f"{args.workers}")
    if args.image_size < 1:
        parser.error(f"--image-size must be >= 1 pixels, got {args.image_size}")
    from pgc_hvd.apps.train_data import VISION
    if args.dataset.lower() in VISION and args.data_dir is None:
        parser.error(f"--dataset {args.dataset} reads a local folder: pass --data-dir DIR "
                     f"(nothing is downloaded)")
    if args.progress_every < 1:
        parser.error(f"--progress-every is a number of steps and must be >= 1, got "
                     f"{args.progress_every}")
    if not (math.isfinite(args.compute_time) and args.compute_time >= 0):
        parser.error(f"--compute-time must be finite seconds >= 0, got {args.compute_time}")
    if not math.isfinite(args.target_loss):
        parser.error(f"--target-loss must be a finite loss, got {args.target_loss}")
    try:
        # rank 0 writes there; every rank checks (the same folder on one host or a shared one)
        check_run_folder(args.out, overwrite=args.force)
    except ValueError as err:
        parser.error(str(err))
    from pgc_hvd.delays import check_trace_covers, parse_delay
    try:
        delays = parse_delay(args.delay)
    except (ValueError, OSError) as err:   # a bad spec, or a missing or damaged replay: trace
        parser.error(f"--delay {args.delay!r}: {err}")
    from pgc_hvd.compress import parse_compression
    try:
        compression = parse_compression(args.compression)
    except ValueError as err:
        parser.error(f"--compression: {err}")
    import torch

    from pgc_hvd.runtime.engine import resolve
    hvd = resolve()        # horovod.torch under horovodrun, pgc_hvd.torchdist under torchrun

    from pgc_hvd.metrics.records import RecordWriter
    from pgc_hvd.models import build_task
    from pgc_hvd.runtime import DistributedOptimizer
    from pgc_hvd.apps.train_data import build_data

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    device = resolve_device(args.device, hvd.local_rank())
    out = Path(args.out)
    try:
        data = build_data(args, n, device)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"pgc-hvd train: {err}") from None
    task = build_task(args.model, data.spec, seed=args.seed)
    model = task.model.to(device)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loader = data.loader
    check_trace_covers(delays, n, args.steps)
    writer = None
    if rank == 0:
        try:
            writer = RecordWriter(out / "records.jsonl", overwrite=args.force)
        except FileExistsError:
            raise SystemExit(f"{out / 'records.jsonl'} already holds an earlier run; choose "
                             "another --out or pass --force to replace it") from None
    t_start = time.time()

    def progress(rec):
        if rec.step % args.progress_every == 0 or rec.step == args.steps - 1:
            loss = "n/a" if rec.loss is None else f"{rec.loss:.3f}"
            print(f"[{args.scheme}] step {rec.step + 1:>4}/{args.steps}  loss {loss}  "
                  f"step {rec.step_time * 1e3:6.1f} ms  used {rec.workers_used}  "
                  f"t={rec.time:6.2f}s", flush=True)

    ctl = None
    opt_kwargs = {"records": writer, "on_record": progress}
    if args.adaptive or args.rule:
        from pgc_hvd.control.rule import ControlConfig, adaptive_default
        from pgc_hvd.control.runtime import AdaptiveController

        cfg = ControlConfig.from_options(control_options)
        if args.rule and not args.adaptive:
            raise SystemExit("--rule needs --adaptive")
        if not adaptive_default(args.scheme, True):
            if rank == 0:
                print(f"[{args.scheme}] --adaptive ignored: exact scheme, no stale gradients", flush=True)
        else:
            val = data.val
            # max_age=None: c - 1 from the optimizer's scheme (attach); the actual ages come with
            # each decision (on_update(step, flat, decision))
            ctl = AdaptiveController(model, task.loss, val, cfg, max_age=None, writer=writer,
                                     on_record=progress)
            opt_kwargs = {"records": None, "on_update": ctl.on_update, "on_record": ctl.on_record}
    if args.control is not None:        # else the optimizer's default control plane
        opt_kwargs["control"] = args.control
    opt = DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum),
        model.named_parameters(), scheme=args.scheme, stragglers=args.s,
        scheme_options=scheme_options, auto=auto_options,
        compression=compression, delay=delays, timeout=args.timeout, name=f"pgc-{args.scheme}",
        momentum_correction=args.momentum_correction == "on", **opt_kwargs)
    if ctl is not None:
        ctl.attach(opt)
    while opt.version < args.steps:
        for xb, yb in opt.batches(loader):
            if args.compute_time > 0:
                time.sleep(args.compute_time)
            loss = task.loss(model(xb), yb)
            loss.backward()
        opt.step(loss=loss.item())
    opt.close()
    data.close()
    wall = time.time() - t_start
    if ctl is not None and writer is not None:
        writer.close()          # the optimizer closes only a writer it was given
    if rank == 0:
        from pgc_hvd.metrics.records import read_records, to_jsonable

        recs = list(read_records(out / "records.jsonl"))
        step_times = [r["step_time"] for r in recs if r.get("step_time") is not None]
        final_train = data.evaluate(task, "train")
        final_test = data.evaluate(task, "test")
        used = [len(r["workers_used"]) for r in recs]
        summary = {
            "scheme": args.scheme, "n": n, "s": opt.scheme.s, "scheme_options": scheme_options,
            "device": device.type,
            "control": opt.config.control,
            "steps": args.steps,
            "dataset": args.dataset, "model": args.model, "delay": str(delays),
            "batch_size": args.batch_size, "lr": args.lr, "wall_time_s": wall,
            "time_per_step_s": sum(step_times) / len(step_times) if step_times else None,
            "median_step_s": sorted(step_times)[len(step_times) // 2] if step_times else None,
            "target_loss": args.target_loss,
            "time_to_target_s": first_reaching(recs, args.target_loss, window=RUNTIME_WINDOW)[1],
            "final_train_loss": final_train["loss"], "final_test_loss": final_test["loss"],
            "final_test_accuracy": final_test["accuracy"],
            "mean_messages_used": sum(used) / len(used) if used else None,
            "nonfinite_messages": len(opt.nonfinite_log),
            "busy_s_rank0": opt.busy_seconds,
            "loader_stats_rank0": dict(getattr(loader, "stats", {})) or None,
        }
        if opt.auto_stragglers is not None:     # stragglers="auto": every switch and why
            summary.update({"stragglers": "auto", **opt.auto_stragglers.summary()})
        if ctl is not None:
            acts = [a for r in recs for a in r.get("extra", {}).get("control", [])]
            summary.update({"adaptive": True, "control_actions": len(acts),
                            "control_lowered": sum(a["direction"] == "lower" for a in acts),
                            "final_lr": opt.param_groups[0]["lr"], "final_c": opt.staleness_bound,
                            "diag_seconds_rank0": ctl.diag_seconds})
        text = json.dumps(to_jsonable(summary), indent=2) + "\n"
        try:
            (out / "summary.json").write_text(text)
        except OSError as err:   # checked before the run; still, never lose the summary
            print(f"[{args.scheme}] could not write {out / 'summary.json'} ({err}); the summary "
                  f"follows:\n{text}", file=sys.stderr, flush=True)
        ttt = summary["time_to_target_s"]
        print(f"[{args.scheme}] done: {summary['time_per_step_s'] * 1e3:.1f} ms/step, time to "
              f"loss {args.target_loss}: {'not reached' if ttt is None else f'{ttt:.2f}s'}, "
              f"test accuracy {final_test['accuracy']:.3f}, wall {wall:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
