"""PyTorch's DDP tutorial shape (torchrun, DistributedSampler, DDP(model), SGD momentum 0.9, a
plain loop, per-epoch validation with a dist.all_reduce of the validation loss), runnable with
torch's DDP or with pgc_hvd's DDP door. The two differ in the three lines marked ``# pgc``:

    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 4 launch/ddp_tutorial.py --door pgc
    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 4 launch/ddp_tutorial.py --door ddp

``--slow-rank R --slow SECONDS``: rank R's model takes that much longer in every training forward
(a slow GPU: a forward pre-hook sleeps). The door leaves it out of the steps it is late for, and
it catches up without computing; a rank slow *outside* its model (its data loader) is not
tolerated over a run (docs/from_horovod.md, "Which slow ranks it tolerates").
It ends by comparing a digest of the parameters across ranks (``PARAMS <digest>`` on rank 0).
"""

import argparse
import hashlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import pgc_hvd

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--door", choices=("ddp", "pgc"), default="pgc")
ap.add_argument("--scheme", default="pgc-cr")
ap.add_argument("--stragglers", type=int, default=None)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--batch-size", type=int, default=32)
ap.add_argument("--lr", type=float, default=0.05)
ap.add_argument("--slow-rank", type=int, default=-1)
ap.add_argument("--slow", type=float, default=0.0)
args = ap.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
X, y = load_digits(return_X_y=True)           # shipped with scikit-learn: 1797 8x8 images
X = torch.tensor(X / 16, dtype=torch.float32).view(-1, 1, 8, 8)
y = torch.tensor(y)
train_ds, val_ds = TensorDataset(X[:1440], y[:1440]), TensorDataset(X[1440:], y[1440:])

model = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(16 * 64, 10))
if rank == args.slow_rank:                    # a slow GPU (the straggler of --slow-rank)
    model.register_forward_pre_hook(lambda m, _: time.sleep(args.slow) if m.training else None)
if args.door == "ddp":
    sampler = DistributedSampler(train_ds)
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
else:
    sampler = pgc_hvd.CodedSampler(train_ds, batch_size=args.batch_size)         # pgc
    model = pgc_hvd.DistributedDataParallel(model, scheme=args.scheme,           # pgc
                                            stragglers=args.stragglers, timeout=60)
    optimizer = model.distributed_optimizer(                                     # pgc
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
loader = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
val_loader = DataLoader(val_ds, batch_size=64, sampler=DistributedSampler(val_ds, shuffle=False))

t0 = time.monotonic()
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    model.train()
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    model.eval()
    totals = torch.zeros(3)
    with torch.no_grad():
        for xb, yb in val_loader:
            out = model(xb)
            totals += torch.tensor([F.cross_entropy(out, yb, reduction="sum").item(),
                                    (out.argmax(1) == yb).sum().item(), len(yb)])
    dist.all_reduce(totals)                    # unnamed, on the default group
    if rank == 0:
        print(f"epoch {epoch}: val loss {totals[0] / totals[2]:.4f} "
              f"acc {totals[1] / totals[2]:.4f} ({time.monotonic() - t0:.1f} s)", flush=True)

digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()[:16]
digests = [None] * world
dist.all_gather_object(digests, digest)
if len(set(digests)) != 1:
    raise SystemExit(f"rank {rank}: parameters differ across ranks: {digests}")
if rank == 0:
    print(f"PARAMS {digest} ranks={world} steps={getattr(optimizer, 'version', 'n/a')} "
          f"per_epoch={len(loader)} acc={totals[1] / totals[2]:.4f}", flush=True)
