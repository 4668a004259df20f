"""Data: shipped and local datasets, and the n data partitions of gradient coding.

    from pgc_hvd.data import load_dataset, partition
    ds = load_dataset("digits")                          # Dataset(X, y, num_classes, ...)
    parts = partition(ds.y, n=100, iid=False, seed=0)    # sorted by label, equal sizes
    parts = partition(len(ds), n=12, sizes=[2, 1] * 6)   # i.i.d., unequal (weights)

See :mod:`pgc_hvd.data.datasets` and :mod:`pgc_hvd.data.partition` for the details.
"""

from .datasets import (Dataset, ImageFolder, LOADERS, load_breast_cancer, load_cifar10,
                       load_dataset, load_digits, load_image_folder, load_iris, load_wine,
                       make_generated, standardize, train_test_split)
from .partition import label_histogram, partition, partition_sizes

__all__ = ["Dataset", "ImageFolder", "LOADERS", "load_dataset", "load_digits",
           "load_breast_cancer", "load_wine", "load_iris", "make_generated", "load_cifar10",
           "load_image_folder", "standardize", "train_test_split", "partition",
           "partition_sizes", "label_histogram"]
