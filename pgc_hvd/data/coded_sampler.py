"""``CodedSampler``: the sampler a DDP script passes to its own ``DataLoader`` in place of
``DistributedSampler``, yielding the partitions gradient coding asks this rank for.

    sampler = pgc_hvd.CodedSampler(dataset, batch_size=32)          # was DistributedSampler
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=2)   # unchanged
    model = pgc_hvd.DistributedDataParallel(model, scheme="pgc-cr", stragglers=1)
    optimizer = model.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:                                         # one batch = one step
            ...

The batches
-----------
The dataset's N indices are dealt into n partitions D_0..D_{n-1} (n = the world size) anew every
epoch e, as ``DistributedSampler(shuffle=True, seed=seed)`` deals them to n ranks
(:class:`DealRule`: ``torch.randperm(N)`` seeded ``seed + e``, padded to a multiple of n with its
own head, every n-th index from k): D_k of epoch e is the list DistributedSampler gives rank k.
A split asked for (``partitions=``, ``labels=`` / ``iid=False``, ``sizes=``) is fixed for the
run instead, by :func:`pgc_hvd.data.partition`, as
:class:`~pgc_hvd.data.coded_loader.CodedLoader` does. Each
``DataLoader`` batch is one step t of this rank: the partitions the scheme wants at t,
``source.loop_partitions(t) = ((k_1, w_1), ..., (k_m, w_m))`` (one for pipelined schemes and
dgd, c = s + 1 for GC, the rank's load for BCGC), share its B samples: b = floor(B / K) samples
of each, K = ``source.loop_width`` the most partitions any rank's step holds (the same b on every
rank, so the replicas of a partition evaluate the same samples and every rank has the same
number of steps an epoch): the batch of (k, t) is a function of (seed, k, t), the j-th run of
b samples of D_k in its epoch (:class:`DealRule`; a fixed split: the loaders' one batch rule,
:class:`~pgc_hvd.data.coded_loader.BatchRule`), then B - m b filler samples (repeats, weight
0). So at one partition a step (dgd, PGC) rank k's batch of step t is the batch
``DataLoader(dataset, batch_size=B, sampler=DistributedSampler(dataset, seed=seed))`` gives
rank k at that step (its full batches: a last, partial one is dropped), and at s = 0 the DDP
door trains DDP's model batch for batch. :func:`batch_layout` gives the
rows of each partition and the scale its rows' gradients get (w_j B / b: the loss is a mean over
the B rows), so ONE backward over the batch gives sum_j w_j g_{k_j}, the coded message (the DDP
door weights the rows, :mod:`pgc_hvd.runtime.ddp`). The step runs in the loop as in DDP: one
batch, one ``backward()``, one ``optimizer.step()``; the DataLoader's workers, pinning and
prefetching are the user's own.

The steps: :meth:`__iter__` starts at the source's model version when the DataLoader creates
its iterator (the start of an epoch: every step of the previous one has been applied), and
yields E = floor(min_k |D_k| / b) steps: one epoch, every partition's samples once
(the deal: |D_k| = ceil(N / n)).
``len(sampler) = E B`` (``len(loader) = E``, for schedulers). ``set_epoch`` is recorded (the
DDP habit); the batches follow the step, so a resumed run continues where its version is.

The source is the process's :class:`pgc_hvd.DistributedDataParallel` (it registers itself,
:func:`register_source`; :meth:`bind` names another): anything with ``n``, ``version``,
``closed``, ``loop_partitions(step)``, ``loop_width`` and ``expect_batch_size(B)`` (told at
each ``__iter__``, so the forward can refuse a DataLoader whose batch_size differs).

Owns :class:`CodedSampler`, :class:`DealRule` and :func:`batch_layout`.
May import: numpy, torch, ``data.partition``, ``data.coded_loader`` (``BatchRule``),
``options``.
"""

from __future__ import annotations

import collections
import weakref
from typing import Optional, Sequence

import numpy as np
import torch
from torch.utils.data import Sampler

from pgc_hvd.data.coded_loader import BatchRule
from pgc_hvd.data.partition import partition as split
from pgc_hvd.options import is_count

__all__ = ["CodedSampler", "DealRule", "batch_layout", "register_source"]

_SOURCES: list = []        # weak references to the live sources of this process, newest last


def register_source(source) -> None:
    """``source`` (a :class:`pgc_hvd.DistributedDataParallel`) feeds the samplers that are not
    bound to another."""
    _SOURCES[:] = [r for r in _SOURCES if r() is not None and r() is not source]
    _SOURCES.append(weakref.ref(source))


def _default_source():
    live = [r() for r in _SOURCES if r() is not None and not r().closed]
    if not live:
        raise RuntimeError(
            "CodedSampler: no pgc_hvd.DistributedDataParallel has been built in this process, "
            "so the sampler does not know the scheme: wrap the model "
            "(model = pgc_hvd.DistributedDataParallel(model, ...)) before iterating the "
            "DataLoader or calling len() on it, or call sampler.bind(model)")
    if len(live) > 1:
        raise RuntimeError(
            f"CodedSampler: {len(live)} pgc_hvd.DistributedDataParallel models live in this "
            f"process: call sampler.bind(model) with the one this loader feeds")
    return live[0]


def batch_layout(parts: Sequence, batch_size: int, width: int) -> tuple[int, list]:
    """``(b, rows)`` of a batch of ``batch_size`` B samples holding the partitions ``parts =
    ((k, w), ...)``: b = floor(B / width) samples each (``width`` >= len(parts): the most
    partitions any rank's batch holds), then B - m b fillers; ``rows`` is ``[(start, stop,
    scale), ...]`` for each partition (scale = w B / b) and the fillers (scale 0)."""
    m = len(parts)
    B = int(batch_size)
    if int(width) < m:
        raise ValueError(f"width={width} is less than the {m} partitions of the batch")
    b = B // int(width)
    if b < 1:
        raise ValueError(f"batch_size={B} is smaller than the {width} partitions a step holds; "
                         f"use batch_size >= {width}")
    rows = [(j * b, (j + 1) * b, float(w) * B / b) for j, (_, w) in enumerate(parts)]
    if m * b < B:
        rows.append((m * b, B, 0.0))
    return b, rows


def _check_holds(smallest: int, b: int) -> None:
    """ValueError with the fix when the smallest partition holds fewer than the b samples a
    step takes from it."""
    if smallest < b:
        raise ValueError(f"a partition holds {smallest} samples, fewer than the {b} a step "
                         f"takes from it: use a smaller batch_size, fewer ranks or more data")


class DealRule:
    """The batches of the default split (module doc): ``indices(k, t)``, the b indices of
    partition k's batch at step t, where partition k of epoch e is the list
    ``DistributedSampler(N, num_replicas=n, rank=k, shuffle=True, seed=seed)`` yields in epoch
    e, and step t is run j of b of it (e, j = divmod(t, E), E = ``steps_per_epoch`` =
    ceil(N / n) // b). The last two epochs' deals are kept (a rank's steps go forward)."""

    KEPT = 2

    def __init__(self, N: int, n: int, batch_size: int, seed: int):
        self.N, self.n, self.b, self.seed = int(N), int(n), int(batch_size), int(seed)
        self.per_rank = -(-self.N // self.n)          # DistributedSampler's num_samples
        _check_holds(self.per_rank, self.b)
        self.steps_per_epoch = self.per_rank // self.b
        self._deals: collections.OrderedDict = collections.OrderedDict()

    @property
    def cached_deals(self) -> int:
        """Epochs' deals held now (at most ``KEPT``)."""
        return len(self._deals)

    def deal(self, epoch: int) -> np.ndarray:
        """(n, ceil(N / n)): row k is what DistributedSampler gives rank k in ``epoch``."""
        rows = self._deals.get(epoch)
        if rows is None:
            g = torch.Generator()
            g.manual_seed(self.seed + int(epoch))
            perm = torch.randperm(self.N, generator=g).numpy()
            pad = self.per_rank * self.n - self.N
            if pad:                     # its head again (cyclically), as DistributedSampler
                perm = np.concatenate([perm, np.resize(perm, pad)])
            rows = self._deals[epoch] = np.ascontiguousarray(perm.reshape(-1, self.n).T)
            while len(self._deals) > self.KEPT:
                self._deals.popitem(last=False)
        return rows

    def indices(self, partition: int, step: int) -> np.ndarray:
        epoch, j = divmod(int(step), self.steps_per_epoch)
        return self.deal(epoch)[int(partition), j * self.b:(j + 1) * self.b]


class CodedSampler(Sampler):
    """See the module docstring. ``dataset``: a map-style dataset (or its length N);
    ``batch_size``: B, the DataLoader's; ``seed``: DistributedSampler's (the deal of each
    epoch; a fixed split's too); ``iid``, ``sizes``, ``partitions``, ``labels``: a fixed split
    instead of the deal, as :class:`~pgc_hvd.data.coded_loader.CodedLoader`'s."""

    def __init__(self, dataset, batch_size: int, *, iid: bool = True, seed: int = 0,
                 sizes: Optional[Sequence[float]] = None,
                 partitions: Optional[Sequence[Sequence[int]]] = None, labels=None):
        if not is_count(batch_size):
            raise ValueError(f"batch_size must be an int >= 1 (the DataLoader's batch_size), "
                             f"got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.N = int(dataset) if isinstance(dataset, (int, np.integer)) else len(dataset)
        self.dataset = None if isinstance(dataset, (int, np.integer)) else dataset
        self.batch_size, self.seed = int(batch_size), int(seed)
        self._split = dict(iid=iid, sizes=sizes, partitions=partitions, labels=labels)
        #: the default split, dealt anew every epoch (DealRule), or a fixed one asked for
        self.dealt = bool(iid) and sizes is None and partitions is None and labels is None
        self.epoch = 0
        self._source = None
        self.partitions = None
        self._rules: dict = {}       # b -> BatchRule

    # -- binding ------------------------------------------------------------------------
    def bind(self, source) -> "CodedSampler":
        """Feed ``source``'s plans (a :class:`pgc_hvd.DistributedDataParallel`)."""
        self._source = source
        self.partitions = None
        self._rules = {}
        return self

    @property
    def source(self):
        if self._source is None:
            self._source = _default_source()
        return self._source

    def _parts(self) -> list:
        if self.partitions is None:
            n = int(self.source.n)
            sp = self._split
            if sp["partitions"] is not None:
                if len(sp["partitions"]) != n:
                    raise ValueError(f"got {len(sp['partitions'])} partitions for n={n} ranks")
                self.partitions = [np.asarray(p, dtype=np.int64).reshape(-1)
                                   for p in sp["partitions"]]
            else:
                labels = sp["labels"]
                if labels is None and not sp["iid"]:
                    labels = getattr(self.dataset, "targets", None)
                    if labels is None:
                        raise ValueError("iid=False (partitions sorted by label) needs the "
                                         "labels: pass labels=<N labels>")
                self.partitions = split(np.asarray(labels) if labels is not None else self.N,
                                        n, iid=sp["iid"], sizes=sp["sizes"], seed=self.seed)
        return self.partitions

    def _rule(self, b: int):
        rule = self._rules.get(b)
        if rule is None and self.dealt:
            rule = self._rules[b] = DealRule(self.N, int(self.source.n), b, self.seed)
        elif rule is None:
            parts = self._parts()
            _check_holds(min(len(p) for p in parts), b)
            rule = self._rules[b] = BatchRule(parts, b, self.seed)
        return rule

    # -- the steps -----------------------------------------------------------------------
    def layout(self, step: int) -> tuple[tuple, int, list]:
        """``(parts, b, rows)`` of step ``step``'s batch (:func:`batch_layout`)."""
        parts = tuple(self.source.loop_partitions(int(step)))
        b, rows = batch_layout(parts, self.batch_size, self.source.loop_width)
        return parts, b, rows

    def indices(self, step: int) -> np.ndarray:
        """The B dataset indices of step ``step``'s batch."""
        parts, b, rows = self.layout(step)
        rule = self._rule(b)
        chunks = [rule.indices(k, step) for k, _ in parts]
        out = np.concatenate(chunks)
        if len(out) < self.batch_size:   # fillers: weight 0
            out = np.concatenate([out, np.resize(chunks[-1], self.batch_size - len(out))])
        return out

    def steps_per_epoch(self) -> int:
        _, b, _ = self.layout(int(self.source.version))
        return self._rule(b).steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch() * self.batch_size

    def __iter__(self):
        self.source.expect_batch_size(self.batch_size)
        start = int(self.source.version)
        for t in range(start, start + self.steps_per_epoch()):
            yield from self.indices(t).tolist()

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch (DistributedSampler's call); the batches follow the step."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = int(epoch)

    def __repr__(self) -> str:
        return (f"CodedSampler(N={self.N}, batch_size={self.batch_size}, seed={self.seed}, "
                f"bound={self._source is not None})")
