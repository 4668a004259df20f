"""Partition a dataset into the n data partitions D_0..D_{n-1} of gradient coding.

    partition(labels_or_len, n, iid=True, sizes=None, seed=0) -> list of n int64 index arrays

* ``labels_or_len``: an int N (the dataset length; i.i.d. only) or a 1-D array of N labels.
* ``iid=True``: a seeded permutation of range(N) cut into consecutive chunks (shuffled,
  i.i.d. partitions). ``iid=False``: indices sorted by label (ties in a seeded random order)
  cut into consecutive chunks, so partition k holds one or few classes (the BCGC paper's
  non-i.i.d. "sorted by label" setting).
* ``sizes``: None for equal sizes (they differ by at most one, larger first), or n
  non-negative weights: partition k gets round(N * w_k / sum w) indices by the
  largest-remainder rule, so the sizes always sum to N. Integer weights that already sum to N
  are therefore exact sizes.
* ``seed``: the only source of randomness; the same arguments give the same partitions.

Every index 0..N-1 appears in exactly one partition. Within a partition the indices are kept in
the order of the permutation (iid) or of the label sort (non-iid).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def partition_sizes(total: int, n: int, sizes: Sequence[float] | None = None) -> np.ndarray:
    """Sizes of the n partitions of ``total`` items (see module docstring)."""
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if total < 0:
        raise ValueError(f"dataset length must be non-negative, got {total}")
    if sizes is None:
        base, extra = divmod(total, n)
        return np.array([base + (1 if k < extra else 0) for k in range(n)], dtype=np.int64)
    w = np.asarray(sizes, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"sizes must hold n={n} weights, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("sizes must be finite, non-negative and not all zero")
    exact = total * w / w.sum()
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    if short:
        order = np.argsort(-(exact - out), kind="stable")
        out[order[:short]] += 1
    return out


def partition(labels_or_len, n: int, iid: bool = True, sizes: Sequence[float] | None = None,
              seed: int = 0) -> list[np.ndarray]:
    """Split a dataset into n index arrays (see module docstring)."""
    rng = np.random.default_rng(seed)
    if np.ndim(labels_or_len) == 0:
        total = int(labels_or_len)
        labels = None
    else:
        labels = np.asarray(labels_or_len)
        if labels.ndim != 1:
            raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
        total = len(labels)
    counts = partition_sizes(total, n, sizes)
    if iid:
        order = rng.permutation(total)
    else:
        if labels is None:
            raise ValueError("non-i.i.d. (sorted by label) partitions need the labels, not a length")
        shuffled = rng.permutation(total)
        order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return [order[bounds[k]:bounds[k + 1]].astype(np.int64) for k in range(n)]


def label_histogram(labels, parts: Sequence[np.ndarray], num_classes: int | None = None) -> np.ndarray:
    """(n, num_classes) counts of each label in each partition (a check of non-i.i.d.-ness)."""
    labels = np.asarray(labels)
    k = int(num_classes if num_classes is not None else labels.max() + 1)
    return np.stack([np.bincount(labels[p], minlength=k) for p in parts])
