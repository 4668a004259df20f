"""The pieces a :class:`~pgc_hvd.data.coded_loader.CodedLoader` hands to a torch ``DataLoader``.

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
"""

from __future__ import annotations

import hashlib
import random
import struct
import weakref
from typing import Callable

import numpy as np
import torch
from torch.utils.data import Sampler, get_worker_info


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
