"""The fixed cost per step of the DDP door: time per step of torch's DDP and of
``pgc_hvd.DistributedDataParallel`` (dgd, pgc-cr) on the same loop, no stragglers, under torchrun.

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 4 benchmarks/doors/step_cost.py \
        [--model lenet|resnet18] [--compute 0.0] [--steps 60] [--warmup 10] [--doors ddp,dgd,pgc-cr]
        [--control log] [--profile] [--rounds 1] [--interleave]

A door ``ddp+direct`` is torch's DDP with a comm hook that sums each bucket as the door's
agents do (:mod:`pgc_hvd.torchdist.direct_sum`: below 1 MiB, a reduce-scatter and an
allgather by direct exchanges in place of gloo's allreduce), to tell the door's own fixed cost
from its collective's. A door
``SCHEME+overlap`` runs the door with ``overlap=True`` (the default on the CPU is off),
``SCHEME+serial`` with ``overlap=False`` (the message formed and sent at
``step()``, the data collective after it), for the overlap's before/after in one launch; the
profile's ``step()`` column is the exposed communication (from the end of ``backward()`` to the
update applied).

One launch: each door in turn (a fresh model, the same seed) runs ``--warmup`` + ``--steps`` steps
of the DDP tutorial's loop on random data (LeNet-5 on 28x28 inputs, batch 32, d = 61,706; or
torchvision's ResNet-18 on 2 images of 32x32, d = 11,689,512), sleeping ``--compute`` seconds
per batch (emulated accelerator time). Prints rank 0's median and mean ms per step and the ratio
to DDP's, and the CPU a step costs the machine (each rank's median process time a step, all its
threads, summed over the ranks: on a machine with fewer cores than ranks this is what the
ranks' time per step follows, and it moves less with other jobs' load); ``--profile`` adds, for the door, where rank 0's step time goes (forward, backward,
``optimizer.step()``) as medians in ms. ``--rounds R`` runs the doors' sequence R times (each
round a fresh model per door), so a load that changes during the launch falls on every door
alike; the table pools the R rounds' steps and a second one gives each round's median / DDP's.
``--interleave`` builds every door of a round first and runs one step of each in turn, so that
a machine shared with other jobs loads every door alike, step by step (an idle door's agent
thread waits without polling on the s = 0 path; on the control plane a follower's waits in the
outcome's broadcast, polled every millisecond at most, a small load on the others' steps).
"""

from __future__ import annotations

import argparse
import statistics
import time


def direct_hook(n: int):
    """DDP's comm hook for the door ``ddp+direct``: each bucket averaged by the sum the DDP
    door's agents use (``pgc_hvd.torchdist.direct_sum``: direct exchanges up to 1 MiB,
    gloo's allreduce above), on a group of its own: DDP given the door's collective, to tell
    the door's fixed cost from the collective's."""
    import torch
    import torch.distributed as dist
    from pgc_hvd.torchdist.ops import GroupOps

    ops = GroupOps(dist.new_group(), "ddp+direct", dist.get_rank(), n, sum_timeout=120)

    def hook(state, bucket):
        buf = bucket.buffer()
        ops.synchronize(ops.allreduce_async_(buf, op=ops.Average))
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut
    return hook


def lenet():
    import torch.nn as nn
    return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("lenet", "resnet18"), default="lenet")
    p.add_argument("--compute", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--doors", default="ddp,dgd,pgc-cr")
    p.add_argument("--control", default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--interleave", action="store_true")
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    import pgc_hvd

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    total = args.warmup + args.steps
    if args.model == "lenet":
        shape, batch, build = (1, 28, 28), 32, lenet
    else:
        import torchvision
        shape, batch = (3, 32, 32), 2
        build = lambda: torchvision.models.resnet18(num_classes=10)   # noqa: E731
    g = torch.Generator().manual_seed(0)
    N = n * batch * (total + 2)
    ds = TensorDataset(torch.randn(N, *shape, generator=g), torch.randint(0, 10, (N,), generator=g))
    def make(door: str, k: int) -> dict:
        """One door's model, optimizer and batches (a fresh model, the same seed)."""
        torch.manual_seed(0)
        model = build()
        if door in ("ddp", "ddp+direct"):
            sampler = DistributedSampler(ds)
            model = DDP(model)
            if door == "ddp+direct":
                model.register_comm_hook(None, direct_hook(n))
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        else:
            sampler = pgc_hvd.CodedSampler(ds, batch_size=batch)
            opts = {"control": args.control} if args.control else {}
            scheme, _, how = door.partition("+")   # pgc-cr+overlap / pgc-cr+serial
            if how:
                opts["overlap"] = how == "overlap"
            model = pgc_hvd.DistributedDataParallel(model, scheme=scheme, name=f"cost{k}",
                                                    timeout=120, **opts)
            sampler.bind(model)
            opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01,
                                                              momentum=0.9))
        loader = DataLoader(ds, batch_size=batch, sampler=sampler)
        return {"door": door, "model": model, "opt": opt, "it": iter(loader), "times": [],
                "parts": [], "cpu": []}

    def one(st: dict, step: int) -> None:
        model, opt = st["model"], st["opt"]
        xb, yb = next(st["it"])
        c0 = time.process_time()
        t0 = time.perf_counter()
        time.sleep(args.compute)
        opt.zero_grad()
        out = model(xb)
        loss = F.cross_entropy(out, yb)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        c3 = time.process_time()
        if step >= args.warmup:
            st["times"].append(t3 - t0)
            st["cpu"].append(c3 - c0)
            st["parts"].append((t1 - t0 - args.compute, t2 - t1, t3 - t2))

    results = {}
    per_round = []
    doors = args.doors.split(",")
    for r in range(args.rounds):
        # --interleave: every door built, then one step of each in turn (a load that changes
        # falls on every door alike, step by step); else each door's steps in a row
        groups = ([list(enumerate(doors))] if args.interleave
                  else [[(k, door)] for k, door in enumerate(doors)])
        for group in groups:
            states = [make(door, k + len(doors) * r) for k, door in group]
            dist.barrier()
            for step in range(total):
                for st in states:
                    one(st, step)
            for st in states:
                if hasattr(st["opt"], "close"):
                    st["opt"].close()
            dist.barrier()
            for st in states:
                got = results.setdefault(st["door"], ([], [], []))
                got[0].extend(st["times"])
                got[1].extend(st["parts"])
                got[2].extend(st["cpu"])
                per_round.append((r, st["door"], statistics.median(st["times"])))
    # the CPU a step costs the machine: every rank's median process time a step (all its
    # threads: training, agent, gloo's), summed over the ranks
    cpu = torch.tensor([statistics.median(got[2]) for got in results.values()],
                       dtype=torch.float64)
    dist.all_reduce(cpu)
    cpu = dict(zip(results, cpu.tolist()))
    if rank == 0:
        d = sum(p.numel() for p in build().parameters())
        print(f"{n} ranks, {args.model} (d = {d:,}), batch {batch}, compute {args.compute} s, "
              f"{args.steps} steps after {args.warmup}")
        base = statistics.median(results["ddp"][0]) if "ddp" in results else None
        print("| door | median ms/step | mean ms/step | median / DDP | CPU ms/step, all ranks "
              "| CPU / DDP's |" + (" forward | backward | step() |" if args.profile else ""))
        print("|---|---|---|---|---|---|" + ("---|---|---|" if args.profile else ""))
        for door, (times, parts, _) in results.items():
            med = statistics.median(times)
            row = (f"| {door} | {1e3 * med:.1f} | {1e3 * statistics.fmean(times):.1f} | "
                   f"{med / base:.2f} |" if base else f"| {door} | {1e3 * med:.1f} | - | - |")
            row += (f" {1e3 * cpu[door]:.1f} | "
                    + (f"{cpu[door] / cpu['ddp']:.2f} |" if "ddp" in cpu else "- |"))
            if args.profile:
                row += "".join(f" {1e3 * statistics.median(p[i] for p in parts):.1f} |"
                               for i in range(3))
            print(row, flush=True)
        if args.rounds > 1 and "ddp" in results:
            print("\nper round, median / DDP's: " + "; ".join(
                f"{door} " + " ".join(f"{med / ddp:.2f}" for rr, dd, med in per_round
                                      if dd == door
                                      for r2, d2, ddp in per_round if r2 == rr and d2 == "ddp")
                for door in results if door != "ddp"), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
