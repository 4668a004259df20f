"""The loaders' one batch rule (`BatchRule`, pgc_hvd/data/coded_loader.py): PartitionLoader and CodedLoader serve
the same samples for a (partition, step), a function of (seed, partition, step) only; full batch
when B is None or larger than the smallest partition."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pgc_hvd.data import CodedLoader, PartitionLoader  # noqa: E402
from pgc_hvd.data.coded_loader import BatchRule  # noqa: E402
from pgc_hvd.runtime import PartitionLoader as RuntimePartitionLoader  # noqa: E402


class Items(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i


def test_both_loaders_serve_the_same_batch_of_a_partition_and_step():
    N, n, B = 103, 4, 5                      # unequal partitions: 26, 26, 26, 25
    X, y = torch.arange(N, dtype=torch.float32)[:, None], torch.arange(N)
    parts = PartitionLoader(X, y, n, batch_size=B, seed=7).partitions
    mem = PartitionLoader(X, y, n, batch_size=B, seed=7, partitions=parts)
    coded = CodedLoader(Items(N), n, batch_size=B, seed=7, partitions=parts)
    assert mem.rule.steps_per_epoch == len(coded) == 25 // B
    for k in range(n):
        for t in range(0, 3 * len(coded) + 2):
            a, b = mem.indices(k, t), coded.indices(k, t)
            assert np.array_equal(a, b) and len(a) == B
            assert np.array_equal(mem.batch(k, t)[1].numpy(), a)
            assert set(a) <= set(parts[k].tolist())
    # an epoch of partition k: E batches without repeats, and a fresh permutation next epoch
    E = len(coded)
    first = np.concatenate([mem.indices(0, t) for t in range(E)])
    assert len(set(first.tolist())) == E * B
    assert not np.array_equal(first, np.concatenate([mem.indices(0, t) for t in range(E, 2 * E)]))


def test_the_rule_depends_on_seed_partition_and_step_only():
    parts = [np.arange(0, 40), np.arange(40, 80)]
    a, b = BatchRule(parts, 8, seed=1), BatchRule(parts, 8, seed=1)
    for t in (7, 0, 3, 7, 12):                # any order of asking, any cache state
        assert np.array_equal(a.indices(1, t), BatchRule(parts, 8, seed=1).indices(1, t))
    assert not np.array_equal(a.indices(0, 0), BatchRule(parts, 8, seed=2).indices(0, 0))
    for t in range(40):
        a.indices(t % 2, t * 5)
    assert a.cached_permutations <= 16


@pytest.mark.parametrize("batch_size", [None, 41])
def test_full_batch_is_the_whole_partition(batch_size):
    parts = [np.arange(0, 40), np.arange(40, 90)]
    rule = BatchRule(parts, batch_size, seed=0)
    assert rule.full and rule.steps_per_epoch == 1
    assert np.array_equal(rule.indices(1, 5), parts[1])


def test_the_runtime_name_is_the_same_class():
    assert RuntimePartitionLoader is PartitionLoader
