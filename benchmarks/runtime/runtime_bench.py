"""Runtime benchmark: the pgc_hvd step against hvd.DistributedOptimizer at real model sizes.

    python benchmarks/runtime/runtime_bench.py [--models resnet18,resnet50] [--np 2,3,4] [--compute 0.3]
                                      [--steps 12] [--json runs/runtime_bench.json]
    python benchmarks/runtime/runtime_bench.py --crossover      # the optimistic-threshold crossover
    python benchmarks/runtime/runtime_bench.py --models resnet18 --np 4 --controls log,allgather

Launches ``horovodrun --gloo`` once per (np, part) on this machine and prints ratios, all
measured in this one invocation:

a) no stragglers, emulated compute of ``--compute`` seconds per partition evaluated (a sleep, as
   a GPU's forward/backward would leave the CPU free; the real forward/backward of the model on
   a batch of 2 images of 32x32 runs too, so the gradients are the model's): time per step of
   pgc_hvd's ``dgd``, ``pgc-cr``, ``bcgc`` and ``pgc-bcgc`` (s = 1) over
   ``hvd.DistributedOptimizer``'s, and bytes each rank receives per step (rank 0's count: the
   allreduce's 2 (n-1)/n * 4d, the rows of others in allgathers, control rows) over the ring
   allreduce's 2 (n-1)/n * 4d. Models: torchvision's ResNet-18 (d = 11,689,512) and ResNet-50
   (d = 25,557,032), or ``mlp`` (d = 2,242, where only latency shows). Goals: dense
   schemes within 1.05x of Horovod's time at np = 4, ResNet-18, and within 1.1x of the ring
   allreduce's bytes.
b) exponential delays with mean = compute time (seeded; the same schedule for every scheme),
   ``--np-b`` ranks, s = 1, first model: PGC-CR's time per step (straggler_policy ``continue``
   and ``cancel``) over DGD's (pgc_hvd ``dgd``, and ``hvd.DistributedOptimizer`` sleeping the
   same delays), and over its floor: its own time per step without stragglers (part a, same np
   and model) plus the (n-s)-th order statistic of the delays actually drawn (a step cannot end
   before n-s ranks have slept their delays and then done a straggler-free step's work). Goal:
   PGC-CR within 10% of it. Horovod's own floor is its part-a step plus the largest delay.

``--repeat K`` runs the whole list K times in turn within each launch (hvd, dgd, ..., hvd, dgd,
...) and reports each run's median time per step (``<run>.each`` in the JSON holds all K).

``--controls log,allgather``: every pgc_hvd scheme of parts a and b runs once per control plane
(``control=`` of the optimizer; a label ``pgc-cr/log`` in the output), in the same launch as
Horovod's step they are compared with; parts a and b also print the control exchanges a rank
made per step (``control_ops`` of the records, rank 0; at most 5 at np = 4).

``--serial``: dgd and pgc-cr also run with ``overlap=True`` (``dgd@overlap``,
``pgc-cr@overlap``: the data collective during the backward) and ``overlap=False``
(``dgd@serial``, ``pgc-cr@serial``: the message formed and sent at ``step()``, the data collective
after it; the default on the CPU), in the same launch: the overlap's before and after.

Every run also gives rank 0's exposed communication per step (the JSON's ``<run>.exposed``;
printed under part a): the median time of ``step()`` from the end of the last backward to the
update applied (Horovod's: waiting for the allreduces its hooks started), beside the forward
and backward's (``<run>.backward``): the overlap's before and after on the Horovod engine, as
``benchmarks/doors/step_cost.py --profile`` gives them under torchrun.

``--crossover``: time per step of PGC-CR with ``optimistic=True`` (payloads ride with control
rows: one collective, n payloads) and ``optimistic=False`` (control rows, then one allreduce) at
np = 2 and 4 over message sizes 1 KB .. 4 MB, emulated compute 20 ms: where the second becomes
faster is the default of ``pgc_hvd.compress.codecs.OPTIMISTIC_BYTES``.

Time per step = (time of the last decision - time of the first measured one) / steps, on rank 0,
after ``--warmup`` steps (PGC's step 0 evaluates every ring slot).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result, run_ranks
from pgc_hvd.compress import allreduce_bytes

SCHEMES_A = ("hvd", "dgd", "pgc-cr", "bcgc", "pgc-bcgc")
RUNS_B = ("dgd", "hvd", "pgc-cr", "pgc-cr:cancel")


def build_model(kind: str, width: int = 0):
    import torch
    import torch.nn as nn
    torch.manual_seed(1)
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32 if width else 32, 64), nn.ReLU(),
                             nn.Linear(64, 2))
    if kind == "wide":       # d ~= width: one linear layer of the message size wanted
        return nn.Sequential(nn.Flatten(), nn.Linear(32, max(1, width // 33)))
    import torchvision
    return getattr(torchvision.models, kind)(num_classes=1000)


def build_loader(kind: str, n: int):
    """The benchmark's seeded data: n partitions of 8 images of 32x32 (batches of 2) for the
    torchvision models, of 64 vectors of 32 (batches of 16) for ``mlp`` and ``wide``."""
    import torch

    from pgc_hvd.runtime import PartitionLoader
    g = torch.Generator().manual_seed(0)
    image = kind not in ("mlp", "wide")
    X = (torch.randn(n * 8, 3, 32, 32, generator=g) if image else
         torch.randn(n * 64, 32, generator=g))
    y = torch.randint(0, 2, (X.shape[0],), generator=g)
    return PartitionLoader(X, y, n, batch_size=2 if image else 16, seed=0)


# ----------------------------------------------------------------------------- worker (per rank)
def worker(args) -> None:
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    import pgc_hvd
    from pgc_hvd.delays import Exponential, Zero

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    kind = args.model
    loader = build_loader(kind, n)
    compute = args.compute
    delays = Exponential(compute, seed=args.seed) if args.part == "b" else Zero()
    steps, warm = args.steps, args.warmup
    d = sum(p.numel() for p in build_model(kind, args.width).parameters())

    def barrier(tag):
        hvd.allreduce(torch.zeros(1), name=f"barrier.{tag}")

    def run_hvd():
        m = build_model(kind, args.width)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.01),
                                       named_parameters=m.named_parameters())
        times, split = [], []
        for t in range(steps):
            opt.zero_grad()
            time.sleep(compute + delays.sample(rank, t))
            xb, yb = loader.batch(rank, t)
            t0 = time.perf_counter()
            F.cross_entropy(m(xb), yb).backward()
            t1 = time.perf_counter()
            opt.step()      # Horovod's step waits for the allreduces its hooks started
            times.append(time.time())
            split.append((t1 - t0, time.perf_counter() - t1))
        return times, [], [], split[warm:]   # as time_pgc: no records of bytes or exchanges

    def run_pgc(label, tag=""):
        label, _, control = label.partition("/")
        label, _, opt_mode = label.partition("@")
        scheme, _, policy = label.partition(":")
        kw = ({} if not opt_mode else {"overlap": opt_mode == "overlap"}
              if opt_mode in ("overlap", "serial") else {"optimistic": opt_mode == "opt"})
        if control:
            kw["control"] = control
        return time_pgc(pgc_hvd.DistributedOptimizer, build_model(kind, args.width), loader,
                        compute, steps, warm, rank, scheme=scheme, delay=delays,
                        name=f"b-{scheme}-{policy}-{opt_mode}-{control}{tag}",
                        straggler_policy=policy or "continue", **kw)

    out = {"n": n, "part": args.part, "model": kind, "d": d, "compute": compute,
           "steps": steps, "warmup": warm}
    if args.part == "a":
        runs = with_controls(SCHEMES_A, args.controls) + serial_runs(SCHEMES_A, args.serial)
    elif args.part == "b":
        runs = with_controls(RUNS_B, args.controls) + serial_runs(RUNS_B, args.serial)
    else:
        runs = ("pgc-cr@opt", "pgc-cr@two")
    each: dict = {}
    for r in range(args.repeat):      # the runs in turn, --repeat times: A B C A B C ...
        for name in runs:
            barrier(f"{name}.{r}")
            times, nbytes, ops, split = (run_hvd() if name == "hvd"
                                         else run_pgc(name, f"r{r}"))
            if rank == 0:
                each.setdefault(name, []).append((times[-1] - times[warm - 1]) / (steps - warm))
                out[name] = statistics.median(each[name])
                out[f"{name}.each"] = each[name]
                # rank 0's medians: forward+backward, and step(): the exposed communication
                out[f"{name}.backward"] = statistics.median(b for b, _ in split)
                out[f"{name}.exposed"] = statistics.median(s for _, s in split)
                if nbytes:
                    out[f"{name}.bytes"] = sum(nbytes) / len(nbytes)
                if ops:
                    out[f"{name}.control_ops"] = sum(ops) / len(ops)
                print(f"[bench np={n} part {args.part} {kind}] {name}: "
                      f"{each[name][-1] * 1e3:.1f} ms/step", file=sys.stderr, flush=True)
    if args.part == "b":
        import numpy as np
        D = delays.matrix(n, steps)[warm:]           # (steps, n) delays actually drawn
        out["drawn_kth"] = float(np.sort(D, axis=1)[:, n - 2].mean())   # (n-s)-th, s = 1
        out["drawn_max"] = float(D.max(axis=1).mean())
    if rank == 0:
        print_result(out)


def serial_runs(labels, serial: bool) -> tuple:
    """``--serial``: dgd and pgc-cr once more with ``overlap=True`` (label ``@overlap``) and
    ``overlap=False`` (``@serial``), the overlap's before/after in the same launch."""
    return tuple(f"{lab}@{how}" for lab in labels if serial and lab in ("dgd", "pgc-cr")
                 for how in ("overlap", "serial"))


def with_controls(labels, controls: str) -> tuple:
    """``labels`` with each pgc_hvd run repeated per control plane of ``controls`` (comma
    separated; the runtime's default plane, ``control="log"``, keeps the plain
    label and passes no ``control=``, another gets ``/<control>``)."""
    from pgc_hvd.runtime.config import DEFAULT_CONTROL
    planes = [c.strip() for c in controls.split(",") if c.strip()]
    return tuple(lab for lab in labels if lab == "hvd") + tuple(
        lab if plane == DEFAULT_CONTROL else f"{lab}/{plane}"
        for lab in labels if lab != "hvd" for plane in planes)


# ----------------------------------------------------------------------------- driver
def time_pgc(make_optimizer, m, loader, compute: float, steps: int, warm: int, rank: int,
             device=None, **options) -> tuple[list, list]:
    """pgc_hvd's loop on model ``m`` (SGD lr 0.01, ``compute`` seconds slept per partition
    before its backward) until version ``steps``, with ``make_optimizer`` (the Horovod or the
    torch engine's ``DistributedOptimizer``) and its ``options``, the batches moved to ``device``
    when given (the model's); on rank 0 returns the wall
    time each step was decided, the bytes received and the control exchanges made in each step
    after ``warm`` (from the records), elsewhere ([], [], [])."""
    import torch
    import torch.nn.functional as F
    decided, nbytes, ops, split = {}, {}, {}, []

    def on_record(r):
        decided[r.step] = time.time()
        nbytes[r.step] = r.bytes
        ops[r.step] = r.extra.get("control_ops")
    opt = make_optimizer(torch.optim.SGD(m.parameters(), lr=0.01), m.named_parameters(),
                         on_record=on_record, timeout=300, **options)
    while opt.version < steps:
        backward = 0.0
        for xb, yb in opt.batches(loader):
            time.sleep(compute)
            if device is not None:
                xb, yb = xb.to(device), yb.to(device)
            t0 = time.perf_counter()
            F.cross_entropy(m(xb), yb).backward()
            backward += time.perf_counter() - t0
        t1 = time.perf_counter()
        opt.step()      # from the end of the last backward to the update applied
        if opt.version > warm:
            split.append((backward, time.perf_counter() - t1))
    opt.close()
    if rank != 0:
        return [], [], [], []
    return ([decided[t] for t in range(steps)], [nbytes[t] for t in range(warm, steps)],
            [ops[t] for t in range(warm, steps) if ops[t] is not None], split)


def launch(np_, part, model, args, steps=None, width=0, compute=None) -> dict:
    print(f"== np={np_} part {part} model {model}{f' d~{width}' if width else ''}", flush=True)

    def echo(line):
        if "[bench " in line:
            print("  " + line.split("<stderr>:")[-1], flush=True)

    return run_ranks(np_, __file__, ["--part", part, "--compute",
                                     args.compute if compute is None else compute,
                                     "--steps", steps or args.steps, "--warmup", args.warmup,
                                     "--seed", args.seed, "--model", model, "--width", width,
                                     "--controls", args.controls, "--repeat", args.repeat]
                     + (["--serial"] if args.serial else []),
                     args.timeout, on_line=echo)


def crossover(args) -> dict:
    sizes = [256, 4096, 16384, 65536, 262144, 1048576]     # parameters (x4 bytes)
    res = {}
    for np_ in (2, 4):
        for w in sizes:
            r = launch(np_, "x", "wide", args, steps=args.steps + 8, width=w, compute=0.02)
            res[(np_, w)] = r
    print(f"\nOptimistic threshold crossover (emulated compute 20 ms, gloo, "
          f"{os.cpu_count()} cores): PGC-CR time per step")
    print(f"{'np':>3} {'d':>9} {'bytes':>9} {'optimistic ms':>14} {'two-phase ms':>13} "
          f"{'ratio':>6}")
    for (np_, w), r in res.items():
        print(f"{np_:>3} {r['d']:>9} {4 * r['d']:>9} {r['pgc-cr@opt'] * 1e3:14.1f} "
              f"{r['pgc-cr@two'] * 1e3:13.1f} {r['pgc-cr@two'] / r['pgc-cr@opt']:6.2f}")
    return {f"np{k[0]}_w{k[1]}": v for k, v in res.items()}


def report(a: dict, b, c: float, seconds: float) -> None:
    """Print the tables of part a (``{(model, np): result}``) and part b."""
    print(f"\nRuntime benchmark (compute {c * 1e3:.0f} ms per partition, gloo, "
          f"{os.cpu_count()} cores), one run, {seconds:.0f}s")
    print("\na) no stragglers: time per step / hvd.DistributedOptimizer's; bytes received per "
          "rank per step / the ring allreduce's 2(n-1)/n 4d")
    cols = [k for k in next(iter(a.values()))
            if "." not in k and k.split("/")[0].split("@")[0] in SCHEMES_A[1:]]
    print(f"{'model':>9} {'d':>10} {'np':>3} {'hvd ms':>7} " + " ".join(f"{s:>28}" for s in cols))
    for (m, k), r in a.items():
        rb = allreduce_bytes(k, r["d"])
        cells = [f"{r[s] * 1e3:5.0f} {r[s] / r['hvd']:5.2f}x {r.get(s + '.bytes', 0) / rb:5.2f}B"
                 f" {r.get(s + '.control_ops', float('nan')):4.1f}op" for s in cols]
        print(f"{m:>9} {r['d']:>10} {k:>3} {r['hvd'] * 1e3:7.0f} "
              + " ".join(f"{x:>28}" for x in cells))
    print("\n   exposed communication, rank 0's median ms a step: step() (from the end of the "
          "backward to the update applied) / forward+backward")
    for (m, k), r in a.items():
        print(f"{m:>9} np {k}: " + ", ".join(
            f"{s} {r[s + '.exposed'] * 1e3:.1f} / {r[s + '.backward'] * 1e3:.1f}"
            for s in ["hvd", *cols] if s + ".exposed" in r))
    if b is None:
        return
    ar = a.get((b["model"], b["n"]))
    print(f"\nb) exponential delays, mean {c * 1e3:.0f} ms, np={b['n']}, s=1, "
          f"{b['model']} (d = {b['d']}): time per step; floor = the scheme's part-a step + the "
          f"(n-s)-th delay drawn (Horovod: + the largest)")
    hvd_floor = ar["hvd"] + b["drawn_max"] if ar else float("nan")
    print(f"  hvd.DistributedOptimizer {b['hvd'] * 1e3:6.0f} ms   / floor "
          f"{b['hvd'] / hvd_floor:.2f}x ({hvd_floor * 1e3:.0f} ms)")
    dgd = b.get("dgd") or next(v for k, v in b.items() if k.startswith("dgd/") and "." not in k)
    print(f"  dgd (pgc_hvd)            {dgd * 1e3:6.0f} ms")
    for key in [k for k in b if "." not in k
                and k.split("/")[0] in ("pgc-cr", "pgc-cr:cancel", "pgc-cr@serial",
                                        "pgc-cr@overlap")]:
        plane = key.partition("/")[2]
        base = (f"pgc-cr/{plane}" if plane else
                key if key in ("pgc-cr@serial", "pgc-cr@overlap") else "pgc-cr")
        floor = (ar.get(base, float("nan")) if ar else float("nan")) + b["drawn_kth"]
        print(f"  {key:<24} {b[key] * 1e3:6.0f} ms   / hvd {b[key] / b['hvd']:.2f}x, / dgd "
              f"{b[key] / dgd:.2f}x, / floor {b[key] / floor:.2f}x ({floor * 1e3:.0f} ms; "
              f"goal <= 1.10x), {b.get(key + '.control_ops', float('nan')):.1f} control "
              "exchanges/step")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet18,resnet50",
                   help="comma-separated: resnet18, resnet50, mlp")
    p.add_argument("--np", default="2,3,4", help="rank counts of part a")
    p.add_argument("--np-b", type=int, default=4, help="rank count of part b (0: skip)")
    p.add_argument("--compute", type=float, default=0.3, help="emulated seconds per partition")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--steps-b", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--repeat", type=int, default=1,
                   help="run the list this many times in turn (A B A B ...) in each launch and "
                        "report each run's median: steadier on a shared machine")
    p.add_argument("--controls", default="log",
                   help="control planes each pgc_hvd run uses, e.g. log,allgather (the plain "
                        "label is the default plane, log)")
    p.add_argument("--crossover", action="store_true", help="measure the optimistic threshold")
    p.add_argument("--serial", action="store_true",
                   help="also dgd and pgc-cr with overlap=False (the overlap's before/after)")
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--report", default=None, metavar="JSON",
                   help="print the tables of an earlier run's --json file instead of running")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", default="a", help=argparse.SUPPRESS)
    p.add_argument("--model", default="resnet18", help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    t0 = time.time()
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        a = {(r["model"], r["n"]): r for r in saved["a"].values()}
        report(a, saved["b"], next(iter(a.values()))["compute"], time.time() - t0)
        return 0
    if args.crossover:
        out = crossover(args)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    nps = [int(x) for x in args.np.split(",") if x.strip()]
    a = {(m, k): launch(k, "a", m, args) for m in models for k in nps}
    b = (launch(args.np_b, "b", models[0], args, steps=args.steps_b)
         if args.np_b else None)
    report(a, b, args.compute, time.time() - t0)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(
            {"a": {f"{m}_np{k}": r for (m, k), r in a.items()}, "b": b}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
