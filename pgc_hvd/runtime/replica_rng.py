"""Randomness in the forward pass as a function of (seed, partition, step), on every replica.

Gradient coding decodes the full gradient only when the replicas of a partition compute the
same gradient. Dropout, stochastic depth and any other torch random draw in the forward pass
come from the rank's own generator, so two ranks evaluating the same batch would draw different
masks. :meth:`ReplicaRNG.scope` wraps the loop body of each partition that
``optimizer.batches()`` yields: torch's default CPU generator (and the CUDA generator of the
parameters' device, when they are on one) is seeded from ``(seed, partition, step)`` and its
previous state is restored when the body ends, so the user's generators outside
``batches()`` are left as they were.

The seed is agreed at construction (:func:`agree_seed`: rank 0's ``torch.initial_seed()``, one
int64 allgather), so a script that calls ``torch.manual_seed(s)`` gets the same masks run after
run, and one that does not gets fresh ones, as in a plain torch script; the data loader's
samples have their own seeds (:mod:`pgc_hvd.data.coded_sampler`).

Runs on the training thread. May import ``runtime.agreement`` and torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct

import torch

from pgc_hvd.runtime.agreement import gather_versions


def replica_seed(seed: int, partition: int, step: int) -> int:
    """The 63-bit seed of the forward pass of ``(partition, step)`` (BLAKE2b of the three)."""
    raw = hashlib.blake2b(struct.pack("<3q", int(seed), int(partition), int(step)),
                          digest_size=8, person=b"pgc.fwd").digest()
    return int.from_bytes(raw, "little") & (2 ** 63 - 1)


def agree_seed(hvd, *, name: str, timeout: float, rank: int) -> int:
    """Rank 0's ``torch.initial_seed()`` (63 bits) on every rank: one int64 allgather."""
    mine = torch.initial_seed() & (2 ** 63 - 1)
    return gather_versions(hvd, mine, name=name, timeout=timeout, rank=rank,
                           what="the agreement on the forward pass's random seed")[0]


class ReplicaRNG:
    """Scopes of the forward pass's generators (module doc). ``device``: the parameters'."""

    def __init__(self, seed: int, device=None):
        self.seed = int(seed)
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = None
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.init()   # the parameters are there already: cheap
            self.cuda = torch.cuda.default_generators[index]

    @contextlib.contextmanager
    def scope(self, partition: int, step: int):
        """The body of ``(partition, step)`` draws from generators seeded by it; the previous
        states are restored after it (also when it raises)."""
        s = replica_seed(self.seed, partition, step)
        gens = [torch.random.default_generator] + ([self.cuda] if self.cuda is not None else [])
        saved = [g.get_state() for g in gens]
        for g in gens:
            g.manual_seed(s)
        try:
            yield
        finally:
            for g, st in zip(gens, saved):
                g.set_state(st)
