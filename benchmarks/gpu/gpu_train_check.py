"""A short pgc_hvd training run in the habits of a GPU user, on the torch engine, under torchrun:
fp16 autocast with a ``GradScaler``, fp16 coded messages (``hvd.Compression.fp16``), a
``CodedLoader(pin_memory=True, device="cuda")`` feeding it, and NVML telemetry in the records.

    PGC_HVD_TORCH_BACKEND=gloo GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 2 \\
        benchmarks/gpu/gpu_train_check.py --device cuda --json OUT/amp.json    # two ranks, one GPU
    ... --device cpu                                                      # the rehearsal here

On the CPU (``--device cpu``, the rehearsal) the same loop runs with bfloat16 autocast, no
pinning, and the records say why NVML is absent. The data: a seeded 10-class set of 8x8 images
(a class's mean pattern plus noise), so nothing is read or downloaded. Every rank applies the
same decoded updates; the run fails (exit 1, the reason printed) unless the training loss
falls, the parameters' digests agree across ranks (``close()`` compares them), every batch
arrives on the model's device, and on cuda the records carry NVML's utilisation and memory.
Rank 0 prints one line ``RESULT {json}`` (and writes ``--json``): device, backend, the wire's
bytes per step against the fp32 ring's, the loss scale at the end, seconds per step, the first
and last loss.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result
from pgc_hvd.compress import allreduce_bytes


def make_data(n_samples: int, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(10, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (n_samples,), generator=g)
    x = means[y] + 0.8 * torch.randn(n_samples, 1, 8, 8, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def build_model():
    import torch.nn as nn
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(128, 10))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import pgc_hvd.torch as hvd
    from pgc_hvd.apps.train import resolve_device
    from pgc_hvd.runtime.consistency import tensors_digest
    from pgc_hvd.torchdist import world

    torch.set_num_threads(1)
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    device = resolve_device(args.device, hvd.local_rank())   # cuda: GPU local_rank mod count
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)
    model = build_model().to(device)
    loader = hvd.CodedLoader(make_data(n * args.batch_size * 8, args.seed), n=n,
                             batch_size=args.batch_size, seed=args.seed, pin_memory=cuda,
                             device=device)
    records = []
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(), scheme=args.scheme,
        stragglers=0 if args.scheme == "dgd" or n == 1 else 1,
        compression=hvd.Compression.fp16, on_record=records.append, timeout=120)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    amp_dtype = torch.float16 if cuda else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type)
    problems = []
    on_device = []    # per batch: did CodedLoader deliver it on the model's device?
    start = None
    while opt.version < args.steps:
        losses = []
        for xb, yb in opt.batches(loader):
            on_device.append(xb.device.type == device.type)
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = F.cross_entropy(model(xb), yb)
            scaler.scale(loss).backward()     # no unscale_: pgc_hvd unscales per rank
            losses.append(loss.item())
        scaler.step(opt, **({"loss": sum(losses) / len(losses)} if losses else {}))
        scaler.update()
        if opt.version == 3 and start is None:
            start = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - (start or time.perf_counter())
    opt.close()       # compares the parameters' digests across ranks: raises when they differ
    print(f"PARAMS digest={tensors_digest(model.parameters()):016x} rank={rank} device={device}",
          flush=True)
    if not all(on_device):
        problems.append("a batch arrived on another device than the model's")
    if rank == 0:
        losses = [r.loss for r in records if r.loss is not None]
        gpu = [r.extra.get("gpu", {}) for r in records]
        d = sum(q.numel() for q in model.parameters())
        nbytes = [r.bytes for r in records if r.bytes]
        out = {"device": str(device), "backend": world.W.backend, "n": n, "scheme": args.scheme,
               "d": d, "steps": opt.version, "amp": str(amp_dtype).replace("torch.", ""),
               "loss_scale": float(scaler.get_scale()),
               "seconds_per_step": elapsed / max(1, opt.version - 3),
               "first_loss": losses[0] if losses else None,
               "last_loss": sum(losses[-5:]) / len(losses[-5:]) if losses else None,
               "bytes_per_step": sum(nbytes) / len(nbytes) if nbytes else None,
               "fp32_ring_bytes": allreduce_bytes(n, d), "gpu_record": gpu[-1] if gpu else None}
        if not losses or not out["last_loss"] < out["first_loss"]:
            problems.append(f"the training loss did not fall: {losses[:3]} ... {losses[-3:]}")
        if cuda and not (gpu and gpu[-1].get("available")):
            problems.append(f"no NVML telemetry in the records: {gpu[-1] if gpu else None}")
        # steps where a rank's fp16 gradients overflowed (the scaler lowers its scale)
        out["nonfinite_steps"] = [r.step for r in records if r.extra.get("nonfinite_ranks")]
        print_result(out)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    for problem in problems:
        print(f"FAIL rank {rank}: {problem}", file=sys.stderr, flush=True)
    hvd.shutdown()
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
