"""``PartitionLoader``: tensors in memory as the n partitions D_0..D_{n-1}, and the batch of
each per step.

``PartitionLoader(X, y, n, batch_size)`` splits a dataset with :func:`pgc_hvd.data.partition`
(i.i.d. or sorted by label) and serves ``batch(partition, step)`` by the loaders' one batch rule
(:class:`~pgc_hvd.data.coded_loader.BatchRule`, the same as :class:`~pgc_hvd.data.CodedLoader`'s): a
deterministic function of ``(seed, partition, step)`` only, so two workers that hold the same
partition evaluate the same batch at the same step (what gradient coding's exact recovery
assumes), and a restored run sees the same batches. ``batch_size=None`` (or one larger than the
smallest partition) gives the whole partition (full-batch GD).

Use with the optimizer, which knows which partitions the scheme wants (c per step for GC, one
rotating partition for PGC, one shard for bounded staleness)::

    for xb, yb in optimizer.batches(loader):
        loss_fn(model(xb), yb).backward()
    optimizer.step()

Also importable as ``pgc_hvd.runtime.PartitionLoader``.

May import: torch, numpy, :mod:`pgc_hvd.options`, :mod:`pgc_hvd.data.partition`,
:mod:`pgc_hvd.data.coded_loader`.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from pgc_hvd.data.coded_loader import BatchRule
from pgc_hvd.data.partition import partition as split
from pgc_hvd.options import is_count


class PartitionLoader:
    def __init__(self, X, y, n: int, batch_size: Optional[int] = 32, iid: bool = True,
                 seed: int = 0, partitions: Optional[Sequence[np.ndarray]] = None,
                 device=None, transform=None):
        self.X = torch.as_tensor(np.asarray(X) if not torch.is_tensor(X) else X)
        self.y = torch.as_tensor(np.asarray(y) if not torch.is_tensor(y) else y)
        if len(self.X) != len(self.y):
            raise ValueError(f"X has {len(self.X)} rows but y has {len(self.y)} labels")
        self.n = int(n)
        if partitions is None:
            partitions = split(self.y.numpy(), self.n, iid=iid, seed=seed)
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
        self.rule = BatchRule(self.partitions, batch_size, self.seed)

    def indices(self, partition: int, step: int) -> np.ndarray:
        if not 0 <= partition < self.n:
            raise IndexError(f"partition {partition} is not in [0, {self.n - 1}]")
        return self.rule.indices(partition, step)

    def batch(self, partition: int, step: int):
        idx = torch.from_numpy(self.indices(partition, step))
        xb, yb = self.X[idx], self.y[idx]
        if self.transform is not None:
            xb = self.transform(xb)
        if self.device is not None:
            xb, yb = xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)
        return xb, yb
