"""``pgc-hvd demo``: the main job (``bash launch/demo.sh``). Horovod's own
``hvd.DistributedOptimizer`` against pgc_hvd's ``pgc-cr`` and ``bcgc`` with their defaults:
time to a target validation accuracy under injected stragglers, with the user's optimizer.
``--engine torch``: the same under torchrun, torch's own ``DistributedDataParallel`` against
pgc_hvd's DDP door (``pgc_hvd.DistributedDataParallel``).

    pgc-hvd demo [--out runs/demo] [--force] [--engine horovod|torch]
                 [--schemes hvd,pgc-cr,bcgc] [--np 4] [--steps 200]
                 [--optimizer sgd|adam] [--lr LR] [--momentum M] [--delay exp] [--compute-time 0.1]
                 [--target 0.95] [--eval-every 5] [--batch-size 16] [--seed 0] [--quick]

One ``horovodrun --gloo -np N`` launch on this machine trains every scheme in turn, each on a
fresh model with the same initialisation, the same data (the small CNN on scikit-learn's digits,
80/20 split) and the same seeded straggler delays: ``pgc_hvd.apps.tta``, the loop of
``benchmarks/tta/time_to_accuracy.py``, run for a fixed number of steps. Defaults: SGD lr 0.05
momentum 0.9 (``--optimizer adam``: Adam lr 3e-3), a batch of 16 per rank (pgc_hvd: per
partition), 0.1 s of emulated GPU compute per batch, exponential delays Exp(mean = compute) per
rank and step, validation accuracy every 5 steps (not timed), target 95%.

``--engine torch`` (default schemes ``ddp,pgc-cr,bcgc``): one ``torchrun --standalone
--nproc-per-node N`` launch instead (gloo on the loopback interface; the ranks import no
Horovod), the same trial; the baseline is ``ddp``, torch's own
``torch.nn.parallel.DistributedDataParallel`` with its usual DataLoader + ``DistributedSampler``
loop, and each pgc_hvd scheme runs through the DDP door -- ``pgc_hvd.DistributedDataParallel``,
``pgc_hvd.CodedSampler`` and ``model.distributed_optimizer(...)`` in the same loop (one batch of
every partition the rank's step holds, its compute emulated once for those rows:
``pgc_hvd.apps.tta``). The ratios are then to DDP's (``/ ddp`` in the table, ``*_vs_ddp`` in
summary.json). DDP finishes its allreduce inside ``backward()``, so ``ddp``'s busy seconds
include its wait for the slowest rank (Horovod's hooks return at once and wait in ``step()``).

Prints, per scheme: time per step, steps and training seconds to the target, final validation
accuracy and the ratios to the baseline's (Horovod's; DDP's with ``--engine torch``). Writes
into OUT (a non-empty OUT is refused without ``--force``):

* ``OUT/summary.json``   per scheme: time per step, busy seconds (every rank's), steps and
  seconds to the target, final accuracy, ratios to the baseline (``*_vs_hvd``; ``*_vs_ddp``
  with ``--engine torch``), the validation curve;
* ``OUT/<scheme>/run.json``  the scheme's run as measured on rank 0 (every step's seconds);
* ``OUT/<scheme>/records.jsonl``  pgc_hvd's step records (pgc_hvd schemes; ``pgc-hvd report``,
  ``pgc-hvd advise`` read them);
* ``OUT/report.md`` (the table), ``OUT/report.png`` (validation accuracy against training
  seconds with the target line, and the distribution of step times), ``OUT/ranks.log`` (what
  the ranks printed besides rank 0's progress).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from pgc_hvd.apps.tta import BASELINES, ENGINES, OPTIMIZERS, Trial, delay_spec
from pgc_hvd.delays import PATTERN_ALIASES, PATTERNS

HVD = BASELINES["horovod"]
LABELS = {HVD: "hvd.DistributedOptimizer", BASELINES["torch"]: "torch DDP"}
#: how each engine's ranks are launched (the printed header)
LAUNCHERS = {"horovod": "horovodrun --gloo", "torch": "torchrun --standalone, gloo"}
BASELINE_NAMES = {HVD: "Horovod's", BASELINES["torch"]: "torch DDP's"}
QUICK = {"steps": 10, "eval_every": 5, "compute_time": 0.01, "progress_every": 5}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pgc-hvd demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier demo's outputs in a non-empty --out")
    p.add_argument("--engine", choices=ENGINES, default="horovod",
                   help="horovod (default): horovodrun, baseline hvd.DistributedOptimizer, "
                        "pgc_hvd's DistributedOptimizer + CodedLoader; torch: torchrun (no "
                        "Horovod), baseline torch's DistributedDataParallel (ddp), pgc_hvd "
                        "schemes through pgc_hvd.DistributedDataParallel + CodedSampler")
    p.add_argument("--schemes", default=None,
                   help="comma- or space-separated: the engine's baseline (hvd: "
                        "hvd.DistributedOptimizer; ddp with --engine torch: torch's "
                        "DistributedDataParallel) and pgc_hvd schemes with their defaults, "
                        "e.g. dgd, is-sgd, pgc-bcgc, pgc-cr:decay=1 (default hvd,pgc-cr,bcgc; "
                        "ddp,pgc-cr,bcgc with --engine torch)")
    p.add_argument("--np", type=int, default=4, help="ranks on this machine (default 4)")
    p.add_argument("--steps", type=int, default=200, help="steps per scheme (default 200)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd",
                   help="the user's optimizer: sgd (lr 0.05, momentum 0.9) or adam (lr 3e-3)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default by optimizer)")
    p.add_argument("--momentum", type=float, default=None, help="SGD's momentum (default 0.9)")
    p.add_argument("--delay", default="exp",
                   help=f"straggler delays: a pattern scaled to --compute-time and seeded by "
                        f"--seed ({', '.join(PATTERNS)}; default exp: Exp(mean = compute) per "
                        f"rank and step) or a delay spec, e.g. exp:mean=0.2,seed=3")
    p.add_argument("--compute-time", type=float, default=0.1,
                   help="seconds of emulated GPU compute per batch (default 0.1)")
    p.add_argument("--target", type=float, default=0.95,
                   help="target validation accuracy (default 0.95)")
    p.add_argument("--eval-every", type=int, default=5,
                   help="steps between validation evaluations, not timed (default 5)")
    p.add_argument("--batch-size", type=int, default=16,
                   help="samples per rank and step (pgc_hvd: per partition; default 16)")
    p.add_argument("--seed", type=int, default=0, help="initialisation, data order and delays")
    p.add_argument("--progress-every", type=int, default=50, help="steps between progress lines")
    p.add_argument("--timeout", type=float, default=1200.0,
                   help="seconds before the launch is stopped (default 1200)")
    p.add_argument("--quick", action="store_true",
                   help="the smallest mode (the test suite's): 10 steps, 0.01 s compute, "
                        "evaluation every 5 steps")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The options, checked before any rank starts (a bad one is a usage error at once)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            setattr(args, k, v)
    args.baseline = base = BASELINES[args.engine]
    if args.schemes is None:
        args.schemes = f"{base},pgc-cr,bcgc"
    args.schemes = [s for s in args.schemes.replace(",", " ").split() if s]
    if not args.schemes:
        p.error("--schemes names no scheme")
    from pgc_hvd.schemes import SCHEMES
    for v in args.schemes:
        if v in BASELINES.values() and v != base:
            engine = next(e for e, b in BASELINES.items() if b == v)
            p.error(f"--schemes: {v} is the baseline of --engine {engine}; with --engine "
                    f"{args.engine} it is {base}")
        if v != base and v.split(":")[0] not in SCHEMES:
            p.error(f"--schemes: unknown scheme {v!r}; use {base} or one of "
                    f"{', '.join(SCHEMES)}")
    if len(set(args.schemes)) != len(args.schemes):
        p.error(f"--schemes names a scheme twice: {' '.join(args.schemes)}")
    for name in ("np", "steps", "eval_every", "batch_size", "progress_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not (math.isfinite(args.compute_time) and args.compute_time >= 0):
        p.error(f"--compute-time must be finite seconds >= 0, got {args.compute_time}")
    if not 0 < args.target <= 1:
        p.error(f"--target is a validation accuracy in (0, 1], got {args.target}")
    if args.momentum is not None and args.optimizer != "sgd":
        p.error("--momentum is SGD's; Adam keeps its betas (0.9, 0.999)")
    if args.delay in PATTERNS or args.delay in PATTERN_ALIASES:
        try:
            args.delay = delay_spec(args.delay, args.np, args.compute_time, args.seed,
                                    args.steps)
        except ValueError as err:
            p.error(f"--delay {args.delay}: {err}")
    if args.delay is not None:
        from pgc_hvd.delays import parse_delay
        try:
            parse_delay(args.delay)
        except (ValueError, OSError) as err:
            p.error(f"--delay {args.delay!r}: {err}")
    return args


def trial_of(args) -> Trial:
    """The comparison every scheme runs (:class:`pgc_hvd.apps.tta.Trial`), all its steps."""
    return Trial(optimizer=args.optimizer, lr=args.lr, momentum=args.momentum, seed=args.seed,
                 compute=args.compute_time, delay=args.delay, batch_size=args.batch_size,
                 steps=args.steps, eval_every=args.eval_every, target=args.target,
                 stop_at_target=False)


# ----------------------------------------------------------------------------- worker (per rank)
def worker(args) -> None:
    """Every scheme in turn on this rank; rank 0 prints progress and writes each scheme's
    ``run.json`` (and pgc_hvd's step records) under OUT. ``--engine torch``: torch's default
    process group first (torch's DDP needs it), then :mod:`pgc_hvd.torchdist` (the engine behind :mod:`pgc_hvd.torch`) adopts it; no Horovod
    import."""
    import torch

    from pgc_hvd.apps.tta import digits_split, train_one
    from pgc_hvd.metrics.records import RecordWriter

    torch.set_num_threads(1)
    if args.engine == "torch":
        import torch.distributed as dist

        import pgc_hvd.torchdist as hvd
        dist.init_process_group("gloo")
    else:
        import horovod.torch as hvd
    hvd.init()
    base = args.baseline
    trial, data, out = trial_of(args), digits_split(), Path(args.out)
    say = (lambda msg: print(msg, flush=True)) if hvd.rank() == 0 else (lambda msg: None)
    for index, scheme in enumerate(args.schemes):
        door = "pgc_hvd.DistributedDataParallel " if args.engine == "torch" else "pgc_hvd "
        say(f"== {LABELS.get(scheme, door + scheme)}: {hvd.size()} ranks, {trial.steps} "
            f"steps, {trial.describe()}")
        reached = []

        def on_eval(step, seconds, acc, scheme=scheme, reached=reached):
            if acc >= trial.target and not reached:
                reached.append(step)
                say(f"[{scheme}] reached {trial.target:.0%} validation accuracy at step {step}, "
                    f"{seconds:.1f} s")
            if step % args.progress_every == 0 or step == trial.steps:
                say(f"[{scheme}] step {step:>4}/{trial.steps}  val acc {acc:.3f}  "
                    f"{seconds:6.1f} s  ({seconds / step:.3f} s/step)")

        records = None
        if scheme != base and hvd.rank() == 0:
            records = RecordWriter(out / scheme / "records.jsonl", overwrite=True)
        run = train_one(scheme, index, trial, hvd, data, on_eval=on_eval,
                        pgc_options={"records": records} if scheme != base else None,
                        engine=args.engine)
        if hvd.rank() == 0:
            (out / scheme).mkdir(parents=True, exist_ok=True)
            (out / scheme / "run.json").write_text(json.dumps(run) + "\n")
    if args.engine == "torch":
        dist.barrier()               # no rank leaves while a peer still uses the default group
        hvd.shutdown()               # the engine's groups, then the default group we made
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- parent
def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End a launch: SIGTERM to the launcher's process group (horovodrun or torchrun; it ends
    its ranks), SIGKILL to what is left after ``grace`` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def launch_command(args, argv: list) -> list:
    """The launcher's command line for this command's worker on this machine: ``horovodrun
    --gloo -np N`` (gloo on the loopback interface), or with ``--engine torch`` ``torchrun
    --standalone --nproc-per-node N`` (``python -m torch.distributed.run``; gloo on the
    loopback interface by ``GLOO_SOCKET_IFNAME``, set by :func:`launch`)."""
    worker = ["-m", "pgc_hvd", "demo", "--worker", *argv]
    if args.engine == "torch":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(args.np), *worker]
    exe = Path(sys.executable).with_name("horovodrun")
    if not exe.exists():
        exe = shutil.which("horovodrun")
        if exe is None:
            raise SystemExit("pgc-hvd demo: horovodrun not found; run bash launch/setup.sh")
    return [str(exe), "--gloo", "-np", str(args.np), "-H", f"localhost:{args.np}",
            "--network-interface", "lo", sys.executable, *worker]


def launch(args, argv: list) -> int:
    """The launch (:func:`launch_command`) of this command's worker on this machine; rank 0's
    lines are printed as they come, every other line (the other ranks', every stderr) goes to
    ``OUT/ranks.log`` (under torchrun, whose lines carry no rank, the workers print only on
    rank 0, so its stdout is printed and every stderr logged). Returns the launch's exit status
    (stopped after ``--timeout`` s)."""
    cmd = launch_command(args, argv)
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    torch_engine = args.engine == "torch"
    if torch_engine:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    out = Path(args.out)
    with open(out / "ranks.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=log if torch_engine else subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
        stopped = threading.Event()
        timer = threading.Timer(args.timeout, lambda: (stopped.set(), stop(proc)))
        timer.start()
        try:
            for line in proc.stdout:
                if torch_engine:
                    print(line, end="", flush=True)
                elif line.startswith("[0]<stdout>:"):
                    print(line[len("[0]<stdout>:"):], end="", flush=True)
                else:
                    log.write(line)
            rc = proc.wait()
        finally:
            timer.cancel()
    if rc != 0:
        tail = (out / "ranks.log").read_text().splitlines()[-30:]
        print("\n".join(tail), file=sys.stderr)
        why = f" (stopped after --timeout {args.timeout:g} s)" if stopped.is_set() else ""
        print(f"pgc-hvd demo: the launch failed with exit status {rc}{why}; every rank's "
              f"output is in {out / 'ranks.log'}", file=sys.stderr)
    return rc


def summarize(args, runs: dict) -> dict:
    """``summary.json``: one entry per scheme (module doc); ratios to the baseline (``hvd``;
    ``ddp`` with ``--engine torch``) where it ran, keys ``*_vs_<baseline>``. A ratio to a
    target the scheme missed is ``inf``; to one the baseline missed, None."""
    base = args.baseline
    ref = runs.get(base)
    summary = {}
    for scheme, r in runs.items():
        st = r["step_times"]
        row = {
            "scheme": scheme, "n": args.np, "s": r.get("s"), "optimizer": trial_of(args).describe(),
            "delay": args.delay, "compute_time_s": args.compute_time,
            "batch_size": args.batch_size, "steps": r["steps_run"],
            "time_per_step_s": r["time_per_step"], "median_step_s": statistics.median(st),
            "seconds_run": r["seconds_run"],
            "busy_s_rank0": r["busy"][0], "busy_s": r["busy"],
            "busy_fraction": statistics.fmean(r["busy"]) / r["seconds_run"],
            "target_accuracy": args.target, "steps_to_target": r["steps"],
            "seconds_to_target": r["time"], "final_val_accuracy": r["accuracy"],
            "same_params": r["same_params"], "evals": r["evals"]}
        if ref is not None:
            row[f"time_per_step_vs_{base}"] = r["time_per_step"] / ref["time_per_step"]
            for key, field in ((f"seconds_to_target_vs_{base}", "time"),
                               (f"steps_to_target_vs_{base}", "steps")):
                row[key] = (None if ref[field] is None else
                            float("inf") if r[field] is None else r[field] / ref[field])
        summary[scheme] = row
    return summary


def table(args, summary: dict) -> str:
    """The printed table (markdown): one row per scheme."""
    from pgc_hvd.apps.tables import fmt, markdown_table

    def f(v, spec):
        return "-" if v is None else (">max" if v == float("inf") else format(v, spec))

    pct, base = f"{args.target:.0%}", args.baseline
    head = ["scheme", "s/step", "busy", f"steps to {pct}", f"s to {pct}", "final val acc",
            f"s/step / {base}", f"s to {pct} / {base}", f"steps to {pct} / {base}", "same params"]
    rows = [[LABELS.get(k, k), f(r["time_per_step_s"], ".3f"), f(r["busy_fraction"], ".0%"),
             fmt(r["steps_to_target"]) if r["steps_to_target"] else "not reached",
             f(r["seconds_to_target"], ".1f"), f(r["final_val_accuracy"], ".3f"),
             f(r.get(f"time_per_step_vs_{base}"), ".2f"),
             f(r.get(f"seconds_to_target_vs_{base}"), ".2f"),
             f(r.get(f"steps_to_target_vs_{base}"), ".2f"), "yes" if r["same_params"] else "NO"]
            for k, r in summary.items()]
    return markdown_table(head, rows)


def plot(args, summary: dict, runs: dict, path: Path) -> None:
    """``report.png``: validation accuracy against training seconds (the target dashed), and
    each scheme's distribution of step times."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, r in summary.items():
        line, = a.plot([e[1] for e in r["evals"]], [e[2] for e in r["evals"]], lw=1.4,
                       marker=".", ms=3, label=LABELS.get(k, k))
        if r["seconds_to_target"] is not None:      # where it first reached the target
            a.plot([r["seconds_to_target"]], [args.target], marker="*", ms=12,
                   color=line.get_color(), zorder=3)
    a.axhline(args.target, color="gray", ls="--", lw=0.9, label=f"target {args.target:.0%}")
    reached = min(max(e[2] for e in r["evals"]) for r in summary.values())
    a.set_ylim(max(0.0, min(args.target - 0.25, reached) - 0.05), 1.0)  # the approach to the target
    a.set_xlabel("training seconds (evaluation not timed)")
    a.set_ylabel("validation accuracy")
    a.set_title("validation accuracy vs wall-clock time (star: target reached)")
    a.legend(loc="lower right")
    times = [[1e3 * t for t in runs[k]["step_times"]] for k in summary]
    b.boxplot(times, tick_labels=[LABELS.get(k, k) for k in summary], showmeans=True)
    top = 1.25 * max(statistics.quantiles(t, n=100)[-1] if len(t) > 1 else t[0] for t in times)
    beyond = sum(x > top for t in times for x in t)
    b.set_ylim(0, top)     # the first step (start-up) and rare long steps would flatten the boxes
    b.set_ylabel("step time (ms, rank 0)")
    b.set_title("step-time distribution (triangle: mean)")
    if beyond:
        b.text(0.99, 0.98, f"{beyond} steps above {top:.0f} ms not shown", ha="right", va="top",
               fontsize=8, transform=b.transAxes)
    fig.suptitle(f"{args.np} ranks, {trial_of(args).describe()}, "
                 f"{args.compute_time:g} s compute per batch, delays {args.delay}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


OUTPUTS = ("summary.json", "report.md", "report.png", "ranks.log")


def prepare_out(args) -> Path:
    """OUT, created. A non-empty OUT is refused without ``--force``; with it, what a demo
    writes there is removed (:data:`OUTPUTS` and the run folders, those holding ``run.json`` or
    ``records.jsonl``) and anything else is left alone."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"pgc-hvd demo: --out {out} is a file; --out names a folder")
    if out.is_dir() and any(out.iterdir()):
        if not args.force:
            raise SystemExit(f"pgc-hvd demo: {out} is not empty; pass --force to overwrite it or "
                             "--out NEW_DIR")
        for f in OUTPUTS:
            (out / f).unlink(missing_ok=True)
        for d in out.iterdir():
            if d.is_dir() and ((d / "run.json").exists() or (d / "records.jsonl").exists()):
                shutil.rmtree(d)
    out.mkdir(parents=True, exist_ok=True)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    out = prepare_out(args)
    print(f"{args.np} ranks ({LAUNCHERS[args.engine]}), small CNN on digits, "
          f"{trial_of(args).describe()}, "
          f"batch {args.batch_size} per rank, {args.compute_time:g} s emulated compute per batch, "
          f"delays {args.delay}; validation accuracy every {args.eval_every} steps (not timed), "
          f"target {args.target:.0%}", flush=True)
    t0 = time.time()
    rc = launch(args, [a for a in argv if a != "--force"])
    if rc != 0:
        return 1
    runs = {s: json.loads((out / s / "run.json").read_text()) for s in args.schemes}
    summary = summarize(args, runs)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = table(args, summary)
    (out / "report.md").write_text(text + "\n")
    print("\n" + text)
    print("busy: the share of the training seconds the ranks spent computing (forward, emulated "
          f"compute and delay, backward; mean over ranks); * / {args.baseline}: ratio to "
          f"{BASELINE_NAMES[args.baseline]}")
    if args.engine == "torch" and args.baseline in summary:
        print("(ddp's busy includes its allreduce: DDP waits for its gradient buckets inside "
              "backward(), so a rank that is ahead counts its wait for the slowest as busy)")
    plot(args, summary, runs, out / "report.png")
    print(f"\nparameters identical on every rank at the end: "
          f"{'yes' if all(r['same_params'] for r in summary.values()) else 'NO'}; "
          f"{time.time() - t0:.0f} s; outputs in {out} (summary.json, report.md, report.png)")
    return 0 if all(r["same_params"] for r in summary.values()) else 1
