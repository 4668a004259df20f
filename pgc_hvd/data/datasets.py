"""Datasets as in-memory arrays: scikit-learn's bundled sets, generated data, CIFAR-10 and
ImageNet-style folders from a local path (both read by torchvision). Nothing is ever
downloaded.

    ds = load_dataset(name, root=None, **options) -> Dataset

``Dataset`` holds ``X`` (float32, shape (N, *feature_shape)), ``y`` (int64 labels 0..K-1),
``num_classes`` K, ``name`` and ``classes`` (label names). Names:

* ``digits``         sklearn 8x8 digits, 1797 x (1, 8, 8) images, K = 10 (pixels / 16);
* ``breast_cancer``  sklearn breast cancer, 569 x 30 features, K = 2 (binary);
* ``wine``           sklearn wine, 178 x 13, K = 3;  ``iris`` 150 x 4, K = 3;
* ``generated``      ``make_generated(num_samples, num_features, num_classes, seed)``: Gaussian
                     class clusters (sklearn ``make_classification``) for scale tests;
* ``cifar10``        ``load_cifar10(root, train=True, limit=None, verify=True)``: the python
                     batches read by torchvision's ``CIFAR10`` (``root`` holds
                     ``cifar-10-batches-py`` or is it), X shape (N, 3, 32, 32) in [0, 1];
* ``imagefolder``    ``load_image_folder(root, size=32, limit_per_class=None)``: torchvision's
                     ``ImageFolder`` (``root/<class>/<image>``), images resized to size x size
                     RGB, X shape (N, 3, size, size) in [0, 1].

These two hold the images in memory (the simulator's data). To train on an image dataset of
any size, keep torchvision's dataset (:mod:`pgc_hvd.data.vision`) and feed it through
:class:`pgc_hvd.data.CodedLoader`.

Helpers: ``standardize(ds)`` (zero-mean unit-variance features, statistics from ``ds`` or
given), ``train_test_split(ds, test_fraction, seed, stratify=True)`` -> (train, test),
``ds.flat()`` (X reshaped to (N, d)), ``ds.subset(idx)``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import numpy as np

from pgc_hvd.options import is_count

@dataclasses.dataclass
class Dataset:
    X: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str = "dataset"
    classes: Optional[list] = None

    def __post_init__(self):
        self.X = np.ascontiguousarray(self.X, dtype=np.float32)
        self.y = np.ascontiguousarray(self.y, dtype=np.int64)
        if len(self.X) != len(self.y):
            raise ValueError(f"X has {len(self.X)} rows but y has {len(self.y)} labels")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def feature_shape(self) -> tuple:
        return tuple(self.X.shape[1:])

    @property
    def num_features(self) -> int:
        return int(np.prod(self.feature_shape))

    @property
    def binary(self) -> bool:
        return self.num_classes == 2

    def flat(self) -> np.ndarray:
        return self.X.reshape(len(self.X), -1)

    def subset(self, idx) -> "Dataset":
        idx = np.asarray(idx, dtype=np.int64)
        return Dataset(self.X[idx], self.y[idx], self.num_classes, self.name, self.classes)


def _sk(loader, name: str, image_shape=None, scale: float = 1.0) -> Dataset:
    b = loader()
    X = np.asarray(b.data, dtype=np.float32) / scale
    if image_shape is not None:
        X = X.reshape((len(X),) + tuple(image_shape))
    names = [str(c) for c in getattr(b, "target_names", [])] or None
    y = np.asarray(b.target, dtype=np.int64)
    return Dataset(X, y, int(y.max()) + 1, name, names)


def load_digits() -> Dataset:
    from sklearn.datasets import load_digits as f
    return _sk(f, "digits", image_shape=(1, 8, 8), scale=16.0)


def load_breast_cancer() -> Dataset:
    from sklearn.datasets import load_breast_cancer as f
    return _sk(f, "breast_cancer")


def load_wine() -> Dataset:
    from sklearn.datasets import load_wine as f
    return _sk(f, "wine")


def load_iris() -> Dataset:
    from sklearn.datasets import load_iris as f
    return _sk(f, "iris")


def make_generated(num_samples: int = 10000, num_features: int = 100, num_classes: int = 10,
                   seed: int = 0, class_sep: float = 1.0) -> Dataset:
    """Gaussian class clusters (sklearn ``make_classification``), deterministic in ``seed``."""
    from sklearn.datasets import make_classification
    informative = max(2, min(num_features, int(np.ceil(np.log2(num_classes))) + 4))
    X, y = make_classification(n_samples=num_samples, n_features=num_features,
                               n_informative=informative, n_redundant=0,
                               n_classes=num_classes, n_clusters_per_class=1,
                               class_sep=class_sep, random_state=seed)
    return Dataset(X, y, num_classes, "generated")


def load_cifar10(root: os.PathLike, train: bool = True, limit: Optional[int] = None,
                 verify: bool = True) -> Dataset:
    """CIFAR-10 read by torchvision (:func:`pgc_hvd.data.vision.cifar10`: ``root`` holds
    ``cifar-10-batches-py`` or is it; MD5-checked unless ``verify=False``) as arrays, X shape
    (N, 3, 32, 32) in [0, 1], the first ``limit`` samples. For training through workers use the
    torchvision dataset itself with :class:`~pgc_hvd.data.coded_loader.CodedLoader`."""
    if limit is not None and not is_count(limit):
        raise ValueError(f"limit must be an int >= 1 (samples kept) or None, got {limit!r}")
    from pgc_hvd.data.vision import cifar10

    tv = cifar10(root, train=train, verify=verify)
    data, y = tv.data[:limit], np.asarray(tv.targets[:limit], dtype=np.int64)
    X = data.transpose(0, 3, 1, 2).astype(np.float32) / 255.0   # torchvision keeps (N, H, W, C)
    return Dataset(X, y, 10, "cifar10", list(tv.classes))


def load_image_folder(root: os.PathLike, size: int = 32,
                      limit_per_class: Optional[int] = None) -> Dataset:
    """An ImageFolder (``root/<class>/<image>``, torchvision's) decoded into arrays: X shape
    (N, 3, size, size) in [0, 1] (Resize((size, size)) + ToTensor), the first
    ``limit_per_class`` images of each class. For large folders use the torchvision dataset
    with :class:`~pgc_hvd.data.coded_loader.CodedLoader` (decoded per batch) instead."""
    from pgc_hvd.data.vision import image_folder, to_tensor

    tv = image_folder(root, transform=to_tensor(int(size)))
    targets = np.asarray(tv.targets, dtype=np.int64)
    keep = np.arange(len(targets))
    if limit_per_class is not None:
        keep = np.concatenate([np.flatnonzero(targets == k)[:limit_per_class]
                               for k in range(len(tv.classes))])
    X = np.stack([tv[int(i)][0].numpy() for i in keep]) if len(keep) else \
        np.zeros((0, 3, size, size), np.float32)
    return Dataset(X, targets[keep], len(tv.classes), "imagefolder", list(tv.classes))


LOADERS = {
    "digits": load_digits,
    "breast_cancer": load_breast_cancer,
    "wine": load_wine,
    "iris": load_iris,
    "generated": make_generated,
    "cifar10": load_cifar10,
    "imagefolder": load_image_folder,
}


def load_dataset(name: str, root: Optional[os.PathLike] = None, **options) -> Dataset:
    """Load a dataset by name (see module docstring); ``root`` for cifar10 / imagefolder."""
    key = name.replace("-", "_").lower()
    if key not in LOADERS:
        raise KeyError(f"unknown dataset {name!r}; known: {sorted(LOADERS)}")
    if key in ("cifar10", "imagefolder"):
        if root is None:
            raise ValueError(f"dataset {name!r} needs root=<local path> (nothing is downloaded)")
        return LOADERS[key](root, **options)
    return LOADERS[key](**options)


def standardize(ds: Dataset, mean: Optional[np.ndarray] = None,
                std: Optional[np.ndarray] = None) -> tuple[Dataset, np.ndarray, np.ndarray]:
    """Per-feature zero mean, unit variance (statistics from ``ds`` unless given).
    Returns (new dataset, mean, std) so a test split can reuse the training statistics."""
    X = ds.X
    if mean is None:
        mean = X.mean(axis=0)
    if std is None:
        std = X.std(axis=0)
    std = np.where(std > 1e-8, std, 1.0).astype(np.float32)
    return Dataset((X - mean) / std, ds.y, ds.num_classes, ds.name, ds.classes), mean, std


def train_test_split(ds: Dataset, test_fraction: float = 0.2, seed: int = 0,
                     stratify: bool = True) -> tuple[Dataset, Dataset]:
    """Seeded split; stratified by label by default."""
    rng = np.random.default_rng(seed)
    if not 0 < test_fraction < 1:
        raise ValueError("test_fraction must lie in (0, 1)")
    test_idx: list[np.ndarray] = []
    if stratify:
        for c in range(ds.num_classes):
            idx = np.flatnonzero(ds.y == c)
            rng.shuffle(idx)
            test_idx.append(idx[: int(round(len(idx) * test_fraction))])
        test = np.sort(np.concatenate(test_idx))
    else:
        perm = rng.permutation(len(ds))
        test = np.sort(perm[: int(round(len(ds) * test_fraction))])
    mask = np.ones(len(ds), bool)
    mask[test] = False
    return ds.subset(np.flatnonzero(mask)), ds.subset(test)
