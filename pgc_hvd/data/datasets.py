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
                     RGB, X shape (N, 3, size, size) in [0, 1];
* ``mnist1d``        ``load_mnist1d(root=None, split="all", seed=42)``: MNIST-1D (Greydanus
                     2020), 5000 x (1, 40) sequences, K = 10, generated offline by the
                     ``mnist1d`` package (``make_dataset(get_dataset_args())``, ~10 s) and cached
                     as ``mnist1d_seed<seed>.npz`` in ``root`` (default ``$PGC_HVD_CACHE`` or
                     ``~/.cache/pgc_hvd``). A task that needs depth: its author reports ~32% for
                     logistic regression, ~68% for an MLP, ~94% for a small 1-D CNN.

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


MNIST1D_CLASSES = 10
MNIST1D_LENGTH = 40


def cache_dir(root: Optional[os.PathLike] = None) -> str:
    """Where generated datasets are cached: ``root``, else ``$PGC_HVD_CACHE``, else
    ``~/.cache/pgc_hvd``."""
    if root is not None:
        return os.fspath(root)
    return os.environ.get("PGC_HVD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "pgc_hvd")


def load_mnist1d(root: Optional[os.PathLike] = None, split: str = "all", seed: int = 42) -> Dataset:
    """MNIST-1D: ``split`` "train" (the package's first 4000), "test" (its last 1000) or "all"
    (5000; :func:`pgc_hvd.sim.run.prepare_data` then splits 80/20 stratified). X shape
    (N, 1, 40) float32 (the package's values, already of unit scale), y in 0..9.

    Generated by ``mnist1d.data.make_dataset(get_dataset_args())`` with ``seed`` (42 is the
    package's default, the published set), offline, then read from the cache
    (:func:`cache_dir`, file ``mnist1d_seed<seed>.npz``)."""
    if split not in ("all", "train", "test"):
        raise ValueError(f"split={split!r}: use 'train', 'test' or 'all'")
    path = os.path.join(cache_dir(root), f"mnist1d_seed{int(seed)}.npz")
    if not os.path.isfile(path):
        try:
            from mnist1d.data import get_dataset_args, make_dataset
        except ImportError:
            raise ImportError("dataset 'mnist1d' is generated by the mnist1d package, which is "
                              "not installed: pip install mnist1d (or pip install "
                              "'pgc_hvd[test]')") from None
        args = get_dataset_args()
        args.seed = int(seed)
        d = make_dataset(args)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + f".{os.getpid()}.tmp.npz"
        np.savez(tmp, x=np.asarray(d["x"], np.float32), y=np.asarray(d["y"], np.int64),
                 x_test=np.asarray(d["x_test"], np.float32),
                 y_test=np.asarray(d["y_test"], np.int64))
        os.replace(tmp, path)   # atomic: concurrent runs never read a half-written cache
    with np.load(path) as z:
        parts = {"train": (z["x"], z["y"]), "test": (z["x_test"], z["y_test"])}
    if split == "all":
        X = np.concatenate([parts["train"][0], parts["test"][0]])
        y = np.concatenate([parts["train"][1], parts["test"][1]])
    else:
        X, y = parts[split]
    return Dataset(X.reshape(len(X), 1, MNIST1D_LENGTH), y, MNIST1D_CLASSES, "mnist1d",
                   [str(k) for k in range(MNIST1D_CLASSES)])


LOADERS = {
    "digits": load_digits,
    "breast_cancer": load_breast_cancer,
    "wine": load_wine,
    "iris": load_iris,
    "generated": make_generated,
    "cifar10": load_cifar10,
    "imagefolder": load_image_folder,
    "mnist1d": load_mnist1d,
}


def load_dataset(name: str, root: Optional[os.PathLike] = None, **options) -> Dataset:
    """Load a dataset by name (see module docstring); ``root`` for cifar10 / imagefolder (and
    the cache folder of mnist1d)."""
    key = name.replace("-", "_").lower()
    if key not in LOADERS:
        raise KeyError(f"unknown dataset {name!r}; known: {sorted(LOADERS)}")
    if key == "mnist1d":
        return LOADERS[key](root, **options)
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
