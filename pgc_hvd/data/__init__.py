"""Data: shipped and local datasets, and the n data partitions of gradient coding.

    from pgc_hvd.data import load_dataset, partition
    ds = load_dataset("digits")                          # Dataset(X, y, num_classes, ...)
    parts = partition(ds.y, n=100, iid=False, seed=0)    # sorted by label, equal sizes
    parts = partition(len(ds), n=12, sizes=[2, 1] * 6)   # i.i.d., unequal (weights)

A torch map-style dataset (torchvision's ``CIFAR10``, ``ImageFolder``, a user's own) as the
partitions of a run, through a torch DataLoader with workers and prefetching::

    loader = CodedLoader(dataset, n=hvd.size(), batch_size=32, num_workers=2)
    for xb, yb in optimizer.batches(loader): ...

Tensors already in memory: ``PartitionLoader(X, y, n=hvd.size(), batch_size=32)``. Both loaders
serve the batch of a (partition, step) by one rule (:class:`~pgc_hvd.data.coded_loader.BatchRule`).

See :mod:`pgc_hvd.data.datasets`, :mod:`pgc_hvd.data.partition`,
:mod:`pgc_hvd.data.coded_loader`, :mod:`pgc_hvd.data.partition_loader` and
:mod:`pgc_hvd.data.vision` (torchvision's CIFAR10 and ImageFolder from a local folder) for the
details. Importing this package does not load torch
(``CodedLoader`` and ``PartitionLoader`` load it on first use).
"""

from .datasets import (Dataset, LOADERS, load_breast_cancer, load_cifar10,
                       load_dataset, load_digits, load_image_folder, load_iris, load_mnist1d,
                       load_wine,
                       make_generated, standardize, train_test_split)
from .partition import label_histogram, partition, partition_sizes

__all__ = ["Dataset", "LOADERS", "load_dataset", "load_digits",
           "load_breast_cancer", "load_wine", "load_iris", "make_generated", "load_cifar10",
           "load_image_folder", "load_mnist1d", "standardize", "train_test_split", "partition",
           "partition_sizes", "label_histogram", "CodedLoader", "PartitionLoader"]


def __getattr__(name):
    if name == "CodedLoader":   # lazy: pgc_hvd.data stays free of torch
        from .coded_loader import CodedLoader

        return CodedLoader
    if name == "PartitionLoader":
        from .partition_loader import PartitionLoader

        return PartitionLoader
    raise AttributeError(f"module 'pgc_hvd.data' has no attribute {name!r}")
