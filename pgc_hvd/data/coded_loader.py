"""``CodedLoader``: any map-style torch ``Dataset`` as the n partitions of gradient coding, fed
through a standard ``torch.utils.data.DataLoader`` (worker processes, pinned memory, prefetching).

    loader = pgc_hvd.CodedLoader(dataset, n=hvd.size(), batch_size=32, seed=0, iid=False,
                                 num_workers=2, pin_memory=True, device=device)
    # or, keeping a DataLoader's settings:  CodedLoader.from_dataloader(dl, n=hvd.size())
    while opt.version < epochs * len(loader):
        for xb, yb in opt.batches(loader):          # the partitions the scheme wants now
            F.cross_entropy(model(xb), yb).backward()
        opt.step()

The batches (the contract with :meth:`pgc_hvd.DistributedOptimizer.batches`)
--------------------------------------------------------------------------------
The dataset's N indices are split into partitions D_0..D_{n-1} by
:func:`pgc_hvd.data.partition` (i.i.d., or sorted by label with the labels from
``dataset.targets`` or ``labels=``; or given as ``partitions=``). ``len(loader)`` = E =
floor(min_k |D_k| / B) steps make one epoch; the batch of partition k at step t (epoch
e = t // E, position j = t mod E) is, by the loaders' one rule (:class:`BatchRule`, at the end of this module,
also :class:`~pgc_hvd.data.partition_loader.PartitionLoader`'s),

    batch(k, t) = D_k[pi_{k,e}[j B : (j + 1) B]],   pi_{k,e} = permutation of |D_k| seeded by (seed, k, e),

and the sample at index i of it goes through ``dataset[i]`` with the random generators seeded
by (seed, k, t, i) (:class:`~pgc_hvd.data.coded_loader.KeyedDataset`), so random
augmentations too are a function of (seed, k, t): the replicas of a partition compute the
same gradient, as exact recovery assumes, whichever rank, process or worker computes it. (A
partition larger than E B sees E B of its samples per epoch, a fresh random subset each epoch.)
The step is the rank's model version; ``set_epoch(e)`` only records e (nothing depends on it: a
straggler that jumps from epoch e into e + 1 still gets the batches of its steps).

Prefetching
-----------
At its first ``batches(loader)`` the optimizer calls :meth:`bind` with its scheme and rank;
from then on a :class:`~pgc_hvd.data.coded_loader.KeySampler` predicts the keys this rank
will ask for -- the entries of ``scheme.work_plan(rank, t).evaluate`` for t, t + 1, ... after
the last key served -- and the DataLoader's workers compute them ahead (``num_workers`` times
``prefetch_factor`` batches in flight; the main process keeps only their keys). Every batch
comes back with its key, checked against the one asked for, so a wrong prediction costs time,
never a wrong batch: a key already in flight is taken after discarding the ones before it (a
straggler that jumps from step 5 to step 8); a key not in flight (a jump past the window, a
step back, a slot the optimizer re-evaluates) is computed in the main process by the same code
while the sampler restarts its predictions after it and the stale batches are discarded.
``loader.stats`` counts the three outcomes (``prefetched``, ``discarded``, ``here``).
With ``num_workers=0``, or before :meth:`bind`, every batch is computed on demand here.

The workers are started by the DataLoader (fork on Linux, by default) from a rank that already
runs Horovod's background thread and the optimizer's agent thread. Forking a threaded process
deadlocked once in our tests, inside CPython's after-fork code (the worker never ran; its rank
waited for its batches): ``multiprocessing_context="forkserver"`` starts the workers from a
single-threaded server instead, at the price of a picklable dataset and transforms
(tests/data/coded_loader_checks.py uses it). Each such worker imports what it unpickles (torch,
torchvision, ...) unless the server did so before its first fork: pass a context with a preload,
``ctx = multiprocessing.get_context("forkserver"); ctx.set_forkserver_preload(["torch",
"torchvision.datasets", "pgc_hvd.data.coded_loader"])``, ``multiprocessing_context=ctx`` (three
ranks' loaders with 2 workers each started in 12 s instead of 30 s on the 2-core CI machine).

Memory holds the partitions' indices (8 bytes a sample), at most 16 cached epoch permutations
and the batches in flight: nothing grows with the number of steps, and no sample is kept.

The pieces a :class:`~pgc_hvd.data.coded_loader.CodedLoader` hands to a torch ``DataLoader``.

A batch of gradient coding is named by its key ``(partition, step)``. Three small objects carry
keys through a standard ``torch.utils.data.DataLoader`` (worker processes, pinning, prefetching)
without changing what the user's dataset sees:

* :class:`KeySampler`, the DataLoader's ``batch_sampler``: an endless iterator, living in the
  main process, that asks its owner for the next predicted key each time the DataLoader
  dispatches a batch and yields the items ``[(partition, step, index), ...]`` of that batch;
* :class:`KeyedDataset`: ``ds[(partition, step, index)] -> ((partition, step), user_ds[index])``
  with every random number generator a transform may use (torch's default CPU generator,
  ``random``, numpy's legacy global one) seeded from ``(seed, partition, step, index)`` just
  before ``user_ds[index]`` runs, so random augmentations are a function of the key: two ranks
  (or a worker process and the main process) that compute the same key get bit-identical
  tensors. In the main process the generators' previous states are restored afterwards;
* :class:`KeyedCollate`: the user's ``collate_fn`` over the samples, returned with the batch's
  key, which must be the same for every item (the owner checks it against the key it expects).

:func:`sample_seed` is the seed map: the first 8 bytes of BLAKE2b over the four integers,
as a 63-bit integer (numpy's legacy generator takes it modulo 2**32).

The one batch rule of the loaders: which samples of partition D_k the batch of step t holds,
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

May import: torch, numpy, :mod:`pgc_hvd.options`, :mod:`pgc_hvd.data.partition`.
"""

from __future__ import annotations

import collections
import hashlib
import random
import struct
import weakref
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler, default_collate, get_worker_info

from pgc_hvd.data.partition import partition as split
from pgc_hvd.options import is_count

_PLAN_CACHE = 64     # work plans kept


class CodedLoader:
    """See the module docstring. Arguments:

    dataset     a map-style torch Dataset (``len`` and ``dataset[i]``), e.g. torchvision's
                ``CIFAR10`` or ``ImageFolder`` with their transforms; never materialised.
    n           number of partitions = ranks (``hvd.size()``).
    batch_size  samples per partition and step (B).
    iid, sizes, seed, partitions, labels
                the partitioning (:func:`pgc_hvd.data.partition`): i.i.d. or sorted by label
                (labels from ``labels=`` or ``dataset.targets``), relative sizes, or explicit
                ``partitions`` (n index arrays); ``seed`` also seeds the batches and samples.
    device      where :meth:`batch` puts the batch's tensors (``non_blocking`` when pinned).
    collate_fn, num_workers, pin_memory, prefetch_factor, persistent_workers, timeout,
    worker_init_fn, multiprocessing_context
                passed to ``torch.utils.data.DataLoader`` (workers stay up by default).
    """

    def __init__(self, dataset, n: int, batch_size: int, *, iid: bool = True, seed: int = 0,
                 sizes: Optional[Sequence[float]] = None,
                 partitions: Optional[Sequence[Sequence[int]]] = None, labels=None,
                 device=None, collate_fn: Optional[Callable] = None, num_workers: int = 0,
                 pin_memory: bool = False, prefetch_factor: Optional[int] = None,
                 persistent_workers: Optional[bool] = None, timeout: float = 0,
                 worker_init_fn: Optional[Callable] = None, multiprocessing_context=None):
        if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__len__")
                                                        and hasattr(dataset, "__getitem__")):
            raise TypeError(f"CodedLoader needs a map-style dataset (len(ds) and ds[i]); got "
                            f"{type(dataset).__name__}. Gradient coding names every batch by "
                            f"the indices of its partition, which an IterableDataset has not")
        if not is_count(n):
            raise ValueError(f"n must be an int >= 1 (the number of ranks, hvd.size()), got {n!r}")
        if not is_count(batch_size):
            raise ValueError(f"batch_size must be an int >= 1 (samples per partition and step), "
                             f"got {batch_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.dataset = dataset
        self.n, self.batch_size, self.seed = int(n), int(batch_size), int(seed)
        self.device = None if device is None else torch.device(device)
        self.partitions = self._partitions(partitions, labels, iid, sizes)
        smallest = min(range(self.n), key=lambda k: len(self.partitions[k]))
        if len(self.partitions[smallest]) < self.batch_size:
            raise ValueError(
                f"partition {smallest} holds {len(self.partitions[smallest])} samples, fewer "
                f"than batch_size={self.batch_size}: use batch_size <= "
                f"{len(self.partitions[smallest])}, fewer ranks, or more data")
        self.rule = BatchRule(self.partitions, self.batch_size, self.seed)
        self.steps_per_epoch = self.rule.steps_per_epoch
        self.epoch = 0
        self.stats = {"prefetched": 0, "discarded": 0, "here": 0}
        self._keyed = KeyedDataset(dataset, self.seed)
        self._collate = KeyedCollate(default_collate if collate_fn is None else collate_fn)
        self.num_workers = int(num_workers)
        self.pin_memory = bool(pin_memory)
        kwargs = {} if prefetch_factor is None else {"prefetch_factor": prefetch_factor}
        if persistent_workers is None:
            persistent_workers = self.num_workers > 0
        self._loader_kwargs = dict(
            num_workers=self.num_workers, pin_memory=self.pin_memory, timeout=timeout,
            worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            persistent_workers=persistent_workers, **kwargs)
        self.dataloader = self._make_dataloader()   # torch checks its own arguments here
        self._plans: collections.OrderedDict = collections.OrderedDict()
        self._scheme = self._rank = None
        self._iter = None
        self._pending: collections.deque = collections.deque()  # (key, generation), in flight
        self._gen = 0                # keys drawn in an older generation are stale
        self._cursor = None          # (step, position in its plan) of the next key to draw
        self._last_step = None

    @classmethod
    def from_dataloader(cls, dataloader: DataLoader, n: int, **kwargs) -> "CodedLoader":
        """A CodedLoader with the dataset and settings of a user's ``DataLoader`` (batch size,
        collate_fn, workers, pinning, prefetch factor, persistent workers, timeout,
        worker_init_fn, multiprocessing context); its sampler and shuffling are replaced by the
        scheme's partitions. ``kwargs`` (``seed``, ``iid``, ``device``, ...) go to the
        constructor and win over the DataLoader's settings."""
        if not isinstance(dataloader, DataLoader):
            raise TypeError(f"from_dataloader takes a torch.utils.data.DataLoader, got "
                            f"{type(dataloader).__name__}")
        if dataloader.batch_size is None and "batch_size" not in kwargs:
            raise ValueError("the DataLoader has no batch_size (it was built with a "
                             "batch_sampler): pass batch_size=B, the samples per partition and "
                             "step")
        settings = {"batch_size": dataloader.batch_size, "collate_fn": dataloader.collate_fn,
                    "num_workers": dataloader.num_workers, "pin_memory": dataloader.pin_memory,
                    "timeout": dataloader.timeout, "worker_init_fn": dataloader.worker_init_fn,
                    "multiprocessing_context": dataloader.multiprocessing_context}
        if dataloader.num_workers > 0:
            settings.update(prefetch_factor=dataloader.prefetch_factor,
                            persistent_workers=dataloader.persistent_workers)
        settings.update(kwargs)
        return cls(dataloader.dataset, n, **settings)

    def _make_dataloader(self) -> DataLoader:
        # its iterator starts at the first batch after bind(). Its own generator: creating the
        # iterator draws a base seed, which must not advance the user's global torch generator
        return DataLoader(self._keyed, batch_sampler=KeySampler(self), collate_fn=self._collate,
                          generator=torch.Generator().manual_seed(self.seed),
                          **self._loader_kwargs)

    # -- the partitioning ------------------------------------------------------------
    def _partitions(self, partitions, labels, iid, sizes) -> list:
        N = len(self.dataset)
        if partitions is not None:
            if len(partitions) != self.n:
                raise ValueError(f"got {len(partitions)} partitions for n={self.n} ranks")
            out = [np.asarray(p, dtype=np.int64).reshape(-1) for p in partitions]
            for k, p in enumerate(out):
                if len(p) and (p.min() < 0 or p.max() >= N):
                    raise ValueError(f"partition {k} holds indices outside [0, {N - 1}] (the "
                                     f"dataset has {N} samples)")
            return out
        if labels is None and not iid:
            labels = getattr(self.dataset, "targets", None)
            if labels is None:
                raise ValueError(
                    f"iid=False (partitions sorted by label) needs the labels: "
                    f"{type(self.dataset).__name__} has no .targets; pass labels=<N labels>")
        if labels is not None:
            labels = np.asarray(labels)
            if labels.shape != (N,):
                raise ValueError(f"labels has shape {labels.shape}; the dataset has {N} samples")
        return split(labels if labels is not None else N, self.n, iid=iid, sizes=sizes,
                     seed=self.seed)

    def __len__(self) -> int:
        """Steps per epoch E = floor(min_k |D_k| / B)."""
        return self.steps_per_epoch

    def epoch_of(self, step: int) -> int:
        return int(step) // self.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch (DistributedSampler's call); batches follow the step, not this."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        self.epoch = int(epoch)

    def indices(self, partition: int, step: int) -> np.ndarray:
        """The dataset indices of the batch of ``(partition, step)`` (see the module doc)."""
        return self.rule.indices(*self._check_key(partition, step))

    def _check_key(self, partition, step) -> tuple[int, int]:
        for name, v in (("partition", partition), ("step", step)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {v!r}")
        if not 0 <= partition < self.n:
            raise IndexError(f"partition {partition} is not in [0, {self.n - 1}]")
        if step < 0:
            raise IndexError(f"step must be >= 0, got {step}")
        return int(partition), int(step)

    # -- the optimizer's side ----------------------------------------------------------
    def bind(self, scheme, rank: int) -> None:
        """Predict from ``scheme.work_plan(rank, t)`` from now on (the optimizer calls this at
        its first ``batches(loader)``; a new optimizer re-binds)."""
        if scheme.n != self.n:
            raise ValueError(f"pgc_hvd: the loader splits the data into n = {self.n} partitions "
                             f"but {scheme.name} runs on {scheme.n} ranks, one partition per "
                             f"rank: build it with n=hvd.size()")
        if not 0 <= int(rank) < self.n:
            raise IndexError(f"rank {rank} is not in [0, {self.n - 1}]")
        self._scheme, self._rank = scheme, int(rank)
        self._plans.clear()
        self._cursor = None          # the next batch() positions the predictions

    def batch(self, partition: int, step: int):
        """The collated batch of ``(partition, step)``, on ``device``."""
        key = self._check_key(partition, step)
        if self._scheme is None or self.num_workers == 0:
            data = self._here(key)
        elif self._iter is None or self._cursor is None:   # the first batch after bind()
            self._restart_after(key)
            if self._iter is None:
                self._iter = iter(self.dataloader)   # prefetching starts after this key
            data = self._here(key)
        else:
            self._drop_stale()
            if any(k == key for k, _ in self._pending):
                while True:
                    got, data = self._pull()
                    if got == key:
                        self.stats["prefetched"] += 1
                        break
                    self.stats["discarded"] += 1
            else:
                if key[1] < self._last_step or self._after(key) > self._cursor:
                    self._restart_after(key)   # a step back, or a jump past the window
                data = self._here(key)
        self._last_step = key[1]
        return self._to_device(data)

    def close(self) -> None:
        """Stop the worker processes (a later batch starts them again)."""
        self._iter = None   # the old DataLoader's iterator, dropped with it, stops its workers
        self.dataloader = self._make_dataloader()
        self._pending.clear()
        self._cursor = None

    def __iter__(self):
        raise TypeError("a CodedLoader serves the batches the scheme asks for: iterate "
                        "`for xb, yb in optimizer.batches(loader)` (or call "
                        "loader.batch(partition, step))")

    # -- prediction ------------------------------------------------------------------------
    def _plan(self, step: int) -> tuple:
        plan = self._plans.get(step)
        if plan is None:
            plan = tuple(p for p, _ in self._scheme.work_plan(self._rank, step).evaluate)
            self._plans[step] = plan
            if len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
        return plan

    def _after(self, key) -> tuple[int, int]:
        """The position after ``key`` in this rank's order of keys (a key its plan does not
        hold, e.g. a slot re-evaluated after a cancelled warm-up, is last in its step)."""
        partition, step = key
        plan = self._plan(step)
        return self._norm((step, plan.index(partition) + 1 if partition in plan else len(plan)))

    def _norm(self, pos) -> tuple[int, int]:
        step, i = pos
        for _ in range(_PLAN_CACHE):
            if i < len(self._plan(step)):
                return step, i
            step, i = step + 1, 0
        raise RuntimeError(f"pgc_hvd: {self._scheme.name} gives rank {self._rank} nothing to "
                           f"evaluate for {_PLAN_CACHE} steps from step {pos[0]}")

    def draw_key(self) -> tuple[int, int]:
        """The next predicted key (called by the KeySampler as the DataLoader dispatches)."""
        step, i = self._cursor
        self._cursor = self._norm((step, i + 1))
        key = (self._plan(step)[i], step)
        self._pending.append((key, self._gen))
        return key

    def _restart_after(self, key) -> None:
        self._cursor = self._after(key)
        self._gen += 1
        self._drop_stale()   # their places in the pipeline go to keys drawn from the cursor

    def _drop_stale(self) -> None:
        while self._pending and self._pending[0][1] != self._gen:
            self._pull()
            self.stats["discarded"] += 1

    def _pull(self):
        expected, _ = self._pending.popleft()
        got, data = next(self._iter)
        if tuple(got) != expected:   # the DataLoader returns batches in sampling order
            raise RuntimeError(f"pgc_hvd: the DataLoader returned the batch of {tuple(got)} "
                               f"where {expected} was dispatched; keep in_order=True")
        return tuple(got), data

    def _here(self, key):
        self.stats["here"] += 1
        items = [self._keyed[(key[0], key[1], int(i))] for i in self.indices(*key)]
        return self._collate(items)[1]

    def _to_device(self, data):
        if self.device is None:
            return data
        non_blocking = self.pin_memory and self.device.type != "cpu"

        def move(x):
            if torch.is_tensor(x):
                return x.to(self.device, non_blocking=non_blocking)
            if isinstance(x, tuple) and hasattr(x, "_fields"):   # a namedtuple
                return type(x)(*(move(v) for v in x))
            if isinstance(x, (list, tuple)):
                return type(x)(move(v) for v in x)
            if isinstance(x, dict):
                return {k: move(v) for k, v in x.items()}
            return x
        return move(data)

    def __repr__(self) -> str:
        return (f"CodedLoader({type(self.dataset).__name__} of {len(self.dataset)}, n={self.n}, "
                f"batch_size={self.batch_size}, seed={self.seed}, steps/epoch={len(self)}, "
                f"num_workers={self.num_workers})")


# --- the keys' carriers through a torch DataLoader: KeySampler, KeyedDataset, KeyedCollate

def sample_seed(seed: int, partition: int, step: int, index: int) -> int:
    """The 63-bit seed of the sample ``index`` in the batch of ``(partition, step)``."""
    raw = hashlib.blake2b(struct.pack("<4q", seed, partition, step, index), digest_size=8).digest()
    return int.from_bytes(raw, "little") & (2 ** 63 - 1)


class KeyedDataset(torch.utils.data.Dataset):
    """``dataset[index]`` under generators seeded by the key (see the module docstring)."""

    def __init__(self, dataset, seed: int):
        self.dataset = dataset
        self.seed = int(seed)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item):
        partition, step, index = item
        s = sample_seed(self.seed, partition, step, index)
        if get_worker_info() is not None:   # a worker process: its generators are its own
            _seed_all(s)
            return (partition, step), self.dataset[index]
        saved = (torch.random.default_generator.get_state(), random.getstate(),
                 np.random.get_state())
        try:
            _seed_all(s)
            return (partition, step), self.dataset[index]
        finally:
            torch.random.default_generator.set_state(saved[0])
            random.setstate(saved[1])
            np.random.set_state(saved[2])


def _seed_all(s: int) -> None:
    # the default CPU generator only: torch.manual_seed would also re-seed every CUDA device
    torch.random.default_generator.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2 ** 32)


class KeyedCollate:
    """``[(key, sample), ...] -> (key, collate_fn([sample, ...]))``; one key per batch."""

    def __init__(self, collate_fn: Callable):
        self.collate_fn = collate_fn

    def __call__(self, items):
        keys = {key for key, _ in items}
        if len(keys) != 1:
            raise RuntimeError(f"pgc_hvd: a batch mixes the samples of keys {sorted(keys)} "
                               f"(partition, step); one batch holds one key")
        return keys.pop(), self.collate_fn([sample for _, sample in items])


class KeySampler(Sampler):
    """The DataLoader's ``batch_sampler``: endless; each batch is the items of the key that
    ``owner.draw_key()`` predicts next (the owner records the key in its queue of dispatched
    keys, in the order the DataLoader will return them)."""

    def __init__(self, owner):
        # weakly: the owner holds the DataLoader, which holds this; a dropped owner then frees
        # its DataLoader at once, and the worker processes stop with it
        self._owner = weakref.ref(owner)

    def __iter__(self):
        while True:
            owner = self._owner()
            if owner is None:
                return
            partition, step = owner.draw_key()
            items = [(partition, step, int(i)) for i in owner.indices(partition, step)]
            del owner
            yield items


# --- the loaders' one batch rule (PartitionLoader uses it too)

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
