"""pgc_hvd on the torch engine against torch's own DistributedDataParallel, under torchrun.

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 4 benchmarks/runtime/torchrun_bench.py \
        [--model resnet18] [--compute 0.3] [--steps 12] [--warmup 3] [--json out.json]
        [--device cuda]      # on a GPU machine: model and batches on cuda (rank r on GPU r mod
                             # the GPUs); PGC_HVD_TORCH_BACKEND=gloo when ranks share a GPU

One launch, every rank: the same model (torchvision ResNet-18, d = 11,689,512, on batches of 2
images of 32x32, as benchmarks/runtime/runtime_bench.py), emulated compute of ``--compute`` seconds
per partition evaluated (a sleep, as a GPU would leave the CPU free) plus the model's real
forward/backward, gloo on the CPU:

a) no stragglers: time per step of ``DistributedDataParallel`` (SGD; its bucketed allreduce),
   pgc_hvd ``dgd`` and ``pgc-cr`` (s = 1) on the torch engine; bytes each rank receives per
   step (pgc_hvd's records: rank 0's count) over the ring allreduce's 2 (n-1)/n * 4d (what
   DDP's gloo allreduce moves);
b) exponential delays with mean ``--compute`` (seeded, the same schedule for both): DDP sleeps
   each rank's delay before its step's backward; pgc-cr gets them as ``delay=``.

``--runs`` lists PART:VARIANT, VARIANT = ``ddp`` or a scheme, with ``@CONTROL`` for a control
channel other than the optimizer's default, log (e.g. ``a:pgc-cr@allgather``).

Time per step = (time of the last step's end - that of the first measured one) / steps, on
rank 0, after ``--warmup`` steps. Prints one table; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from runtime_bench import build_loader, build_model, time_pgc   # beside this script

from pgc_hvd.apps.local_ranks import print_result
from pgc_hvd.compress import allreduce_bytes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--compute", type=float, default=0.3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", default="a:ddp,a:dgd,a:pgc-cr,b:ddp,b:pgc-cr")
    p.add_argument("--json", default=None)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model, its batches and the gradients live (cuda: the "
                        "forward/backward run on the GPU, the sleep stays)")
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import pgc_hvd.torch as hvd
    from pgc_hvd.apps.train import resolve_device
    from pgc_hvd.delays import Exponential, Zero
    from pgc_hvd.torchdist import world

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    device = resolve_device(args.device, hvd.local_rank())   # cuda: GPU local_rank mod count
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    loader = build_loader(args.model, n)
    steps, warm, compute = args.steps, args.warmup, args.compute
    d = sum(q.numel() for q in build_model(args.model).parameters())

    def run_ddp(delays):
        m = build_model(args.model).to(device)
        ddp = torch.nn.parallel.DistributedDataParallel(
            m, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        ends = []
        for t in range(steps):
            opt.zero_grad()
            time.sleep(compute + delays.sample(rank, t))
            xb, yb = loader.batch(rank, t)
            F.cross_entropy(ddp(xb.to(device)), yb.to(device)).backward()
            opt.step()
            sync()
            ends.append(time.time())
        return ends, []

    def run_pgc(scheme, delays, tag):
        scheme, _, control = scheme.partition("@")     # "pgc-cr@log": control="log"
        extra = {"control": control} if control else {}
        return time_pgc(hvd.DistributedOptimizer, build_model(args.model).to(device), loader,
                        compute, steps, warm, rank, device=device, scheme=scheme, delay=delays,
                        name=f"tb-{scheme}-{control or 'ag'}-{tag}", **extra)

    out = {"n": n, "model": args.model, "d": d, "compute": compute, "steps": steps,
           "warmup": warm, "engine": f"torch.distributed ({world.W.backend})",
           "device": str(device), "ring_bytes": allreduce_bytes(n, d)}
    for run in args.runs.split(","):
        part, scheme = run.split(":")
        delays = Exponential(compute, seed=args.seed) if part == "b" else Zero()
        hvd.barrier(name=f"bench.{run}")
        ends, nbytes, *_ = run_ddp(delays) if scheme == "ddp" else run_pgc(scheme, delays, part)
        if rank == 0:
            out[run] = (ends[-1] - ends[warm - 1]) / (steps - warm)
            if nbytes:
                out[f"{run}.bytes"] = sum(nbytes) / len(nbytes)
            print(f"[torchrun bench np={n} {args.model}] {run}: {out[run] * 1e3:.0f} ms/step",
                  file=sys.stderr, flush=True)
    if rank == 0:
        print(f"\nnp={n} {args.model} d={d} compute={compute}s, {steps - warm} measured steps, "
              f"{device}, {out['engine']}")
        print(f"{'run':<12} {'ms/step':>8} {'/ DDP':>7} {'bytes/rank':>12} {'/ ring':>7}")
        for run in args.runs.split(","):
            part = run.split(":")[0]
            ref = out.get(f"{part}:ddp")
            b = out.get(f"{run}.bytes", out["ring_bytes"] if run.endswith("ddp") else None)
            print(f"{run:<12} {out[run] * 1e3:8.0f} "
                  f"{(out[run] / ref if ref else float('nan')):7.2f} "
                  f"{(b or 0) / 1e6:10.1f}MB {((b or 0) / out['ring_bytes']):7.2f}")
        print_result(out)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
