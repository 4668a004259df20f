"""The data side of a rank: the n partitions D_0..D_{n-1} and the batch of each per step.

``PartitionLoader(X, y, n, batch_size)`` splits a dataset with :func:`pgc_hvd.data.partition`
(i.i.d. or sorted by label) and serves ``batch(partition, step)``: a deterministic function of
``(seed, partition, step)`` only, so two workers that hold the same partition evaluate the same
batch at the same step (what gradient coding's exact recovery assumes), and a restored run sees
the same batches. Within a partition the batches walk through a seeded permutation, one epoch
of the partition after another. ``batch_size=None`` gives the whole partition (full-batch GD).

Use with the optimizer, which knows which partitions the scheme wants (c per step for GC, one
rotating partition for PGC, one shard for bounded staleness)::

    for xb, yb in optimizer.batches(loader):
        loss_fn(model(xb), yb).backward()
    optimizer.step()
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from pgc_hvd.options import is_count


class PartitionLoader:
    def __init__(self, X, y, n: int, batch_size: Optional[int] = 32, iid: bool = True,
                 seed: int = 0, partitions: Optional[Sequence[np.ndarray]] = None,
                 device=None, transform=None):
        from pgc_hvd.data import partition

        self.X = torch.as_tensor(np.asarray(X) if not torch.is_tensor(X) else X)
        self.y = torch.as_tensor(np.asarray(y) if not torch.is_tensor(y) else y)
        if len(self.X) != len(self.y):
            raise ValueError(f"X has {len(self.X)} rows but y has {len(self.y)} labels")
        self.n = int(n)
        if partitions is None:
            partitions = partition(self.y.numpy(), self.n, iid=iid, seed=seed)
        if len(partitions) != self.n:
            raise ValueError(f"got {len(partitions)} partitions for n={self.n} workers")
        self.partitions = [np.asarray(p, dtype=np.int64) for p in partitions]
        if any(len(p) == 0 for p in self.partitions):
            raise ValueError(f"a partition is empty: {len(self.X)} samples are too few for n={n}")
        if batch_size is not None and not is_count(batch_size):
            raise ValueError(f"batch_size must be an int >= 1 (per partition and step), or None "
                             f"for whole partitions; got {batch_size!r}")
        self.batch_size = batch_size
        self.seed = int(seed)
        self.device = device
        self.transform = transform

    def indices(self, partition: int, step: int) -> np.ndarray:
        if not 0 <= partition < self.n:
            raise IndexError(f"partition {partition} is not in [0, {self.n - 1}]")
        part = self.partitions[partition]
        if self.batch_size is None or self.batch_size >= len(part):
            return part
        b = int(self.batch_size)
        per_epoch = len(part) // b
        epoch, k = divmod(int(step), per_epoch)
        perm = np.random.default_rng((self.seed, int(partition), epoch)).permutation(len(part))
        return part[perm[k * b:(k + 1) * b]]

    def batch(self, partition: int, step: int):
        idx = torch.from_numpy(self.indices(partition, step))
        xb, yb = self.X[idx], self.y[idx]
        if self.transform is not None:
            xb = self.transform(xb)
        if self.device is not None:
            xb, yb = xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)
        return xb, yb
