"""Where a step's time goes under a delay pattern: every rank's wall-clock times of each
iteration of ddp_tta.py's loop (its LeNet-5 on 28x28 digits, compute and delay slept inside
the model), split at the step's (n - s)-th ready rank.

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 4 \\
        benchmarks/doors/step_timeline.py [--door ddp|pgc-cr@1|pgc-cr@2|dgd] \\
        [--delay exp:mean=0.05,seed=0] [--steps 160] [--skip 10]

Per step t after ``--skip``: ``ready`` is when a rank calls ``optimizer.step()`` (its backward
done; DDP's backward holds its allreduce), the (n - s)-th ready the moment the step can be
decided, and the update's time the first ``step()`` return among the ranks ready by then.
Prints rank 0's means and medians of the period (update to update), of its two parts: the
previous update to the (n - s)-th ready (compute, the delays' order statistic and, where a
left-out rank finishes its step, its late start) and the (n - s)-th ready to the update (the
decision, the data sum, the hand-over: the runtime's latency), and of each rank's forward
(with the sleep), backward and ``step()``. ``s`` is the door's (``@s``; dgd and ddp: 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--door", default="pgc-cr@1")
    p.add_argument("--delay", default="exp:mean=0.05,seed=0")
    p.add_argument("--compute", type=float, default=0.05)
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--skip", type=int, default=10)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from ddp_tta import emulated, make_door, workload_data
    from pgc_hvd.delays import parse_delay
    from step_cost import lenet

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train, _ = workload_data("lenet28")
    model = emu = emulated(lenet(), args.compute, parse_delay(args.delay), rank)
    model, opt, sampler = make_door(args.door, model, train, dict(lr=0.03, momentum=0.9), 0)
    s = args.door.partition("@")[2].partition("+")[0]
    s = int(s) if s and s != "auto" else 0
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    rows, step, epoch = [], 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            emu.step = step
            t0 = time.time()
            opt.zero_grad()
            out = model(xb)
            t1 = time.time()
            F.cross_entropy(out, yb).backward()
            t2 = time.time()
            opt.step()
            rows.append((t0, t1, t2, time.time()))
            step += 1
            if step >= args.steps:
                break
        epoch += 1
    if hasattr(opt, "close"):
        opt.close()
    every = [None] * n
    dist.all_gather_object(every, rows)
    if rank == 0:
        report(every, n, s, args)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def report(every, n: int, s: int, args) -> None:
    period, before, latency, fwd, bwd, stp = [], [], [], [], [], []
    prev = None
    for t in range(args.skip, min(len(r) for r in every)):
        it = [every[w][t] for w in range(n)]
        kth = sorted(x[2] for x in it)[n - s - 1]
        update = min(x[3] for x in it if x[2] <= kth)
        latency.append(update - kth)
        if prev is not None:
            period.append(update - prev)
            before.append(kth - prev)
        prev = update
        for t0, t1, t2, t3 in it:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            stp.append(t3 - t2)
    ms = lambda v: f"{1e3 * statistics.fmean(v):.1f} / {1e3 * statistics.median(v):.1f}"  # noqa: E731
    print(f"{args.door}, {n} ranks, {args.delay}, compute {args.compute} s, steps "
          f"{args.skip}..{args.steps} (mean / median ms)")
    print("| period | update -> (n-s)-th ready | (n-s)-th ready -> update | forward (with the "
          "sleep) | backward | step() |")
    print("|---|---|---|---|---|---|")
    print(f"| {ms(period)} | {ms(before)} | {ms(latency)} | {ms(fwd)} | {ms(bwd)} | {ms(stp)} |",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
