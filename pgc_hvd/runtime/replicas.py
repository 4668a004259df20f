"""The replicas' first step, checked once: the forward pass's seed agreed across the ranks, and
the first step's data compared across the ranks that evaluate each partition.

The seed (:func:`agree_seed`, at construction: rank 0's ``torch.initial_seed()``, one int64
allgather), so a script that calls ``torch.manual_seed(s)`` gets the same masks run after run,
and one that does not gets fresh ones, as in a plain torch script; the scopes it seeds are
:class:`~pgc_hvd.runtime.capture.ReplicaRNG`'s; the data loader's samples have their own seeds
(:mod:`pgc_hvd.data.coded_loader`).

The first step's data (:class:`ReplicaDataCheck`): gradient coding decodes the full gradient
only when every rank that evaluates partition k at step t gets the same batch. A dataset
generated on each rank without a seed (``torch.randn`` data), or a per-rank shard where the
scheme expects the whole dataset, trains something else without a word. At the optimizer's
first step, every batch ``optimizer.batches()`` yielded is noted as a 63-bit digest of its
tensors (:func:`batch_digest`); at the first ``step()`` the ranks allgather one row of n int64
(the digest of each partition, -1 where the rank did not evaluate it) and a partition whose
replicas differ raises the same ValueError on every rank, naming the partition, the ranks and
the fix. One pass over the first step's batches and one collective of 8 n bytes per rank, once;
nothing after the first step (off the path of a steady-state step).

Owns the seed's agreement (:func:`agree_seed`) and :class:`ReplicaDataCheck` (the first step's
digests). Thread: the training thread.
May import: ``runtime.agreement``, numpy and torch.
"""

from __future__ import annotations

import numpy as np
import torch

from pgc_hvd.runtime.agreement import allgather_polled, gather_versions, tensors_digest


def agree_seed(hvd, *, name: str, timeout: float, rank: int) -> int:
    """Rank 0's ``torch.initial_seed()`` (63 bits) on every rank: one int64 allgather."""
    mine = torch.initial_seed() & (2 ** 63 - 1)
    return gather_versions(hvd, mine, name=name, timeout=timeout, rank=rank,
                           what="the agreement on the forward pass's random seed")[0]


# -- the first step's data -----------------------------------------------------------------
NOT_EVALUATED = -1

FIX = ("give every rank the same dataset (CodedLoader splits it into the scheme's partitions "
       "itself: do not shard it per rank) and make generated or randomly augmented data the "
       "same on every rank (seed it: torch.manual_seed(seed) before torch.randn, or a "
       "torch.Generator seeded the same on every rank; CodedLoader seeds the transforms of "
       "each sample itself)")


def _tensors(x):
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, np.ndarray):
        yield torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            yield from _tensors(x[k])
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def batch_digest(batch) -> int:
    """A 63-bit digest of the tensors (and numpy arrays) in ``batch``, in order."""
    return tensors_digest(_tensors(batch))


class ReplicaDataCheck:
    """Notes the first step's batches and compares them across ranks, once (module doc)."""

    def __init__(self, n: int, rank: int):
        self.n, self.rank = int(n), int(rank)
        self.digests: dict = {}
        self.done = False

    def note(self, partition: int, batch) -> None:
        if not self.done:
            self.digests[int(partition)] = batch_digest(batch)

    def check(self, hvd, *, step: int, name: str, timeout: float) -> None:
        """One allgather of every rank's digests; ValueError when replicas differ."""
        if self.done:
            return
        self.done = True
        row = torch.full((1, self.n), NOT_EVALUATED, dtype=torch.int64)
        for k, d in self.digests.items():
            row[0, k] = d
        rows = allgather_polled(hvd, row, name=name, timeout=timeout, rank=self.rank,
                                what="the comparison of the replicas' first batches").tolist()
        bad = []
        for k in range(self.n):
            have = {r: rows[r][k] for r in range(len(rows)) if rows[r][k] != NOT_EVALUATED}
            if len(set(have.values())) > 1:
                groups: dict = {}
                for r, d in have.items():
                    groups.setdefault(d, []).append(r)
                bad.append((k, sorted(groups.values())))
        if bad:
            what = "; ".join(f"partition {k}: " + " vs ".join(f"ranks {g}" for g in gs)
                             for k, gs in bad[:4])
            more = f" and {len(bad) - 4} more partitions" if len(bad) > 4 else ""
            raise ValueError(
                f"pgc_hvd: the ranks' data differ: at step {step} the replicas of a partition "
                f"got different batches ({what}{more}). Gradient coding recovers the full "
                f"gradient only if every rank that evaluates a partition gets the same samples: "
                f"{FIX}.")
