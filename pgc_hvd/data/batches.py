"""The one batch rule of the loaders: which samples of partition D_k the batch of step t holds,
a function of (seed, k, t) only, so that every replica of a partition evaluates the same batch
at the same step (what exact recovery assumes) and a restored run sees the same batches.

With B samples a batch, E = floor(min_k |D_k| / B) steps make one epoch (the same E for every
partition); the batch of partition k at step t (epoch e = t // E, position j = t mod E) is

    batch(k, t) = D_k[pi_{k,e}[j B : (j + 1) B]],   pi_{k,e} = permutation of |D_k| seeded by (seed, k, e)

(``np.random.default_rng((seed, k, e))``). A partition larger than E B sees E B of its samples
per epoch, a fresh random subset each epoch. B = None, or B larger than the smallest partition,
is full-batch gradient descent: every batch of partition k is all of D_k, in its order (E = 1).

Used by :class:`~pgc_hvd.data.coded_loader.CodedLoader` (a torch Dataset; it asks B <= the
smallest partition) and :class:`~pgc_hvd.data.partition_loader.PartitionLoader` (tensors in
memory).

May import: numpy.
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np

PERM_CACHE = 16     # epoch permutations kept (a rank touches its c partitions at a time)


class BatchRule:
    """``indices(k, t)``: the dataset indices of the batch of ``(partition k, step t)`` (module
    doc). ``partitions`` are the n index arrays D_0..D_{n-1}; ``batch_size`` is B or None."""

    def __init__(self, partitions: Sequence[np.ndarray], batch_size: Optional[int], seed: int):
        self.partitions = partitions
        self.seed = int(seed)
        smallest = min(len(p) for p in partitions)
        self.full = batch_size is None or int(batch_size) > smallest
        self.batch_size = None if self.full else int(batch_size)
        self.steps_per_epoch = 1 if self.full else smallest // self.batch_size
        self._perms: collections.OrderedDict = collections.OrderedDict()

    @property
    def cached_permutations(self) -> int:
        """Epoch permutations held now (at most ``PERM_CACHE``)."""
        return len(self._perms)

    def indices(self, partition: int, step: int) -> np.ndarray:
        part = self.partitions[partition]
        if self.full:
            return part
        epoch, j = divmod(int(step), self.steps_per_epoch)
        key = (int(partition), epoch)
        perm = self._perms.get(key)
        if perm is None:
            perm = np.random.default_rng((self.seed, key[0], epoch)).permutation(len(part))
            self._perms[key] = perm
            if len(self._perms) > PERM_CACHE:
                self._perms.popitem(last=False)
        b = self.batch_size
        return part[perm[j * b:(j + 1) * b]]
