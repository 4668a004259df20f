"""Runs on every rank under horovodrun across "remote" hosts (tests/multihost): pgc-cr training.

Each rank trains a small MLP for --steps versions with pgc-cr (s = 1) and random straggler
delays, then prints one line ``MH rank=R size=N local_rank=L host=H digest=D version=V`` (the
digest of its parameters after close(), which already compared them across ranks).
"""

import argparse
import os
import sys

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

import pgc_hvd
from pgc_hvd.runtime import PartitionLoader
from pgc_hvd.runtime.consistency import tensors_digest


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    g = torch.Generator().manual_seed(3)
    X = torch.randn(800, 8, generator=g)
    y = (X[:, 0] > 0).long()
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters(),
                                       scheme="pgc-cr", stragglers=1,
                                       delay="exp:mean=0.01,seed=2", timeout=60)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loader = PartitionLoader(X, y, n=hvd.size(), batch_size=16, seed=1)
    while opt.version < args.steps:
        for xb, yb in opt.batches(loader):
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
        opt.step(loss=loss.item())
    opt.close()
    print(f"MH rank={hvd.rank()} size={hvd.size()} local_rank={hvd.local_rank()} "
          f"host={os.environ.get('HOROVOD_HOSTNAME', '?')} "
          f"digest={tensors_digest(model.parameters())} version={opt.version}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
