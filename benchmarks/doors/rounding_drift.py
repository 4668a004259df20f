"""How far float rounding alone carries two runs of the same training apart: torch's DDP
(``DistributedSampler``) and the DDP door at s = 0 (``scheme="dgd"``, ``CodedSampler``), the
same initial model, batches and update (the door's sums in another order), LeNet-5 on
``ddp_tta.py``'s 28x28 digits, SGD lr 0.03 momentum 0.9 (``ddp_tta.py --workload lenet28``'s
run, without the emulated compute). Prints the largest and the relative difference of the
parameters every ``--every`` steps (docs/benchmarks.md, "Float rounding alone"):

    GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node 4 benchmarks/doors/rounding_drift.py
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pgc_hvd  # noqa: E402
from ddp_tta import workload_data  # noqa: E402
from step_cost import lenet  # noqa: E402


def train(door: str, data, steps: int, every: int, seed: int) -> list:
    """The parameters every ``every`` steps of ``door`` ("ddp" or "dgd")."""
    torch.manual_seed(seed)
    net = lenet()
    if door == "ddp":
        sampler = DistributedSampler(data, seed=seed)
        model = DDP(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    else:
        sampler = pgc_hvd.CodedSampler(data, batch_size=32, seed=seed)
        model = pgc_hvd.DistributedDataParallel(net, scheme="dgd", name="drift")
        opt = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.03,
                                                          momentum=0.9))
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    snaps, step, epoch = [], 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            step += 1
            if step % every == 0:
                snaps.append(parameters_to_vector(net.parameters()).detach())
            if step >= steps:
                break
        epoch += 1
    if hasattr(opt, "close"):
        opt.close()
    return snaps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    data, _ = workload_data("lenet28")            # ddp_tta.py's data, its order and offsets
    a = train("ddp", data, args.steps, args.every, args.seed)
    b = train("dgd", data, args.steps, args.every, args.seed)
    if dist.get_rank() == 0:
        print("| step | max abs difference | relative difference (norm) |")
        print("|---|---|---|")
        for i, (u, v) in enumerate(zip(a, b)):
            print(f"| {(i + 1) * args.every} | {float((u - v).abs().max()):.3g} | "
                  f"{float((u - v).norm() / u.norm()):.3g} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
