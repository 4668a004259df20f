"""Soak benchmark: does anything grow with the run's length?

    python benchmarks/runtime/soak.py [--np 4] [--steps 20000] [--scheme pgc-cr] [--every 1000]
                              [--control allgather|log] [--compute SECONDS]

Trains a tiny model (d = 2,242) for ``--steps`` steps on ``--np`` gloo ranks (no emulated
compute by default: every step is protocol only; ``--compute`` sleeps that long per partition,
as a GPU's forward/backward leaves the CPU free, so the polled plane makes its rounds) and
prints, every ``--every`` steps, rank 0's resident set size (VmRSS), the agent's held decided
updates, and the time per step over the last window.
Flat RSS and flat time per step from the first window to the last mean the per-step bookkeeping
is bounded. ``--tracemalloc``: rank 0 also compares Python-heap snapshots taken after the first
window and at the end, and prints the allocation sites that grew most (slower).

It also prints the control exchanges rank 0 made per step (``control_ops`` of the records:
Horovod collectives on the ``allgather`` plane, store operations on ``log``) and RSS growth per
step from the first window's end to the last's, in bytes: Horovod's allgather leaves 28-39 bytes
of RSS per op (``benchmarks/runtime/hvd_allgather_rss.py``), so the growth follows the number of
collectives a step makes (compare ``--control allgather`` with ``--control log``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result, run_ranks


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(args) -> None:
    import horovod.torch as hvd
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import pgc_hvd
    from pgc_hvd.runtime import PartitionLoader

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n * 64, 32, generator=g)
    y = (X[:, 0] > 0).long()
    loader = PartitionLoader(X, y, n, batch_size=16, seed=0)
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    ops = [0, 0]      # control exchanges, steps recorded (rank 0's records)

    def on_record(r):
        ops[0] += r.extra.get("control_ops") or 0
        ops[1] += 1
    opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05),
                                       m.named_parameters(), scheme=args.scheme, timeout=120,
                                       control=args.control, on_record=on_record)
    rows, t_last, v_last = [], time.time(), 0
    snap = None
    if args.tracemalloc and rank == 0:
        import tracemalloc
        tracemalloc.start(8)
    while opt.version < args.steps:
        for xb, yb in opt.batches(loader):
            time.sleep(args.compute)
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
        if rank == 0 and opt.version - v_last >= args.every:
            now = time.time()
            rows.append({"step": opt.version, "rss_mb": round(rss_mb(), 1),
                         "ms_per_step": round((now - t_last) / (opt.version - v_last) * 1e3, 2),
                         "held_updates": opt.agent.held_updates,
                         "control_ops_per_step": round(ops[0] / max(1, ops[1]), 2)})
            ops[:] = [0, 0]
            print(f"[soak] {rows[-1]}", file=sys.stderr, flush=True)
            t_last, v_last = now, opt.version
            if args.tracemalloc and snap is None:
                snap = tracemalloc.take_snapshot()
    grew = []
    if snap is not None:
        for st in tracemalloc.take_snapshot().compare_to(snap, "lineno")[:5]:
            grew.append(f"{st.size_diff / 1024:+.1f} KiB ({st.count_diff:+d} blocks) "
                        f"{st.traceback.format()[-1].strip()}")
    opt.close()
    if rank == 0:
        print_result({"n": n, "scheme": args.scheme, "control": args.control,
                      "rows": rows, "heap_growth": grew})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--every", type=int, default=1000)
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--control", default="allgather", help="the optimizer's control plane")
    p.add_argument("--compute", type=float, default=0.0, help="emulated seconds per partition")
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--json", default=None)
    p.add_argument("--tracemalloc", action="store_true", help="Python-heap growth sites")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    def echo(line):
        if "[soak]" in line:
            print("  " + line.split("<stderr>:")[-1], flush=True)
    res = run_ranks(args.np, __file__, ["--steps", args.steps, "--every", args.every,
                                        "--scheme", args.scheme, "--control", args.control,
                                        "--compute", args.compute]
                    + (["--tracemalloc"] if args.tracemalloc else []), args.timeout, on_line=echo)
    rows = res["rows"]
    first, last = rows[0], rows[-1]
    per_step = ((last["rss_mb"] - first["rss_mb"]) * 2 ** 20 / (last["step"] - first["step"])
                if last["step"] > first["step"] else float("nan"))
    ops = sum(r["control_ops_per_step"] for r in rows[1:]) / max(1, len(rows) - 1)
    res["rss_bytes_per_step"], res["control_ops_per_step"] = round(per_step, 1), round(ops, 2)
    res["compute"] = args.compute
    print(f"\nSoak, np={res['n']}, {res['scheme']}, control {res['control']}, compute "
          f"{args.compute * 1e3:.0f} ms, {last['step']} "
          f"steps: RSS {first['rss_mb']:.1f} -> {last['rss_mb']:.1f} MB ({per_step:.0f} bytes a "
          f"step after the first window), {ops:.1f} control exchanges a step, time per step "
          f"{first['ms_per_step']:.2f} -> {last['ms_per_step']:.2f} ms (first and last window "
          f"of {args.every} steps), held updates at the end {last['held_updates']}")
    for line in res.get("heap_growth", []):
        print(f"  Python heap, last window against the first: {line}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
