import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pgc_hvd.data import label_histogram, load_digits, partition, partition_sizes


@settings(max_examples=60, deadline=None)
@given(total=st.integers(0, 500), n=st.integers(1, 40), iid=st.booleans(), seed=st.integers(0, 5))
def test_partition_is_a_partition(total, n, iid, seed):
    labels = np.random.default_rng(seed).integers(0, 7, size=total)
    parts = partition(labels, n, iid=iid, seed=seed)
    assert len(parts) == n
    allidx = np.concatenate(parts) if parts else np.array([])
    assert sorted(allidx.tolist()) == list(range(total))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_partition_deterministic_and_seeded():
    a = partition(100, 7, seed=3)
    b = partition(100, 7, seed=3)
    c = partition(100, 7, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_noniid_sorted_by_label():
    ds = load_digits()
    parts = partition(ds.y, 20, iid=False, seed=0)
    # labels are non-decreasing across the concatenation of partitions
    cat = np.concatenate([ds.y[p] for p in parts])
    assert np.all(np.diff(cat) >= 0)
    hist = label_histogram(ds.y, parts, 10)
    # each partition holds at most 2 classes when 20 partitions cut 10 near-equal classes
    assert (np.count_nonzero(hist, axis=1) <= 2).all()
    iid_hist = label_histogram(ds.y, partition(ds.y, 20, iid=True, seed=0), 10)
    assert np.count_nonzero(iid_hist, axis=1).mean() > 5


def test_unequal_sizes_by_weights():
    sizes = partition_sizes(100, 4, [1, 1, 2, 4])
    assert sizes.tolist() == [13, 12, 25, 50]  # the tie goes to the lower index
    assert sizes.sum() == 100 and sizes[3] == 50 and sizes[2] == 25
    parts = partition(100, 4, sizes=[10, 20, 30, 40], seed=1)
    assert [len(p) for p in parts] == [10, 20, 30, 40]


def test_noniid_needs_labels_and_sizes_checked():
    with pytest.raises(ValueError):
        partition(10, 2, iid=False)
    with pytest.raises(ValueError):
        partition(10, 2, sizes=[1.0])
    with pytest.raises(ValueError):
        partition(10, 2, sizes=[-1.0, 2.0])
