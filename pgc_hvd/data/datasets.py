"""Datasets as in-memory arrays: scikit-learn's bundled sets, generated data, CIFAR-10 and
ImageNet-style folders from a local path. Nothing is ever downloaded.

    ds = load_dataset(name, root=None, **options) -> Dataset

``Dataset`` holds ``X`` (float32, shape (N, *feature_shape)), ``y`` (int64 labels 0..K-1),
``num_classes`` K, ``name`` and ``classes`` (label names). Names:

* ``digits``         sklearn 8x8 digits, 1797 x (1, 8, 8) images, K = 10 (pixels / 16);
* ``breast_cancer``  sklearn breast cancer, 569 x 30 features, K = 2 (binary);
* ``wine``           sklearn wine, 178 x 13, K = 3;  ``iris`` 150 x 4, K = 3;
* ``generated``      ``make_generated(num_samples, num_features, num_classes, seed)``: Gaussian
                     class clusters (sklearn ``make_classification``) for scale tests;
* ``cifar10``        ``load_cifar10(root, train=True, limit=None)``: the python-pickle batches
                     (``data_batch_1..5`` / ``test_batch``, in ``root`` or
                     ``root/cifar-10-batches-py``), X shape (N, 3, 32, 32) in [0, 1];
* ``imagefolder``    ``load_image_folder(root, size=32, limit_per_class=None)``: one
                     sub-folder per class (``root/<class>/<image>``), images resized to
                     size x size RGB, X shape (N, 3, size, size) in [0, 1]. For large folders use
                     :class:`ImageFolder` (lazy, a torch-style dataset) instead.

Helpers: ``standardize(ds)`` (zero-mean unit-variance features, statistics from ``ds`` or
given), ``train_test_split(ds, test_fraction, seed, stratify=True)`` -> (train, test),
``ds.flat()`` (X reshaped to (N, d)), ``ds.subset(idx)``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from pgc_hvd.options import is_count

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".gif", ".tif", ".tiff", ".webp")


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


def _cifar_dir(root: os.PathLike) -> Path:
    root = Path(root)
    for cand in (root, root / "cifar-10-batches-py"):
        if (cand / "test_batch").exists() or (cand / "data_batch_1").exists():
            return cand
    raise FileNotFoundError(
        f"no CIFAR-10 python batches (data_batch_1..5, test_batch) in {root} "
        f"or {root / 'cifar-10-batches-py'}")


def load_cifar10(root: os.PathLike, train: bool = True, limit: Optional[int] = None) -> Dataset:
    """CIFAR-10 from the python-pickle batches in ``root`` (see module docstring)."""
    if limit is not None and not is_count(limit):
        raise ValueError(f"limit must be an int >= 1 (samples kept) or None, got {limit!r}")
    d = _cifar_dir(root)
    files = sorted(d.glob("data_batch_*")) if train else [d / "test_batch"]
    files = [f for f in files if f.exists()]
    if not files:
        raise FileNotFoundError(f"no {'training' if train else 'test'} batches in {d}")
    xs, ys = [], []
    for f in files:
        try:
            with open(f, "rb") as fh:
                batch = pickle.load(fh, encoding="bytes")
            data = batch.get(b"data", batch.get("data"))
            labels = batch.get(b"labels", batch.get("labels"))
            if data is None or labels is None:
                raise ValueError("no 'data' or 'labels' entry")
            x = np.asarray(data, dtype=np.uint8)
            if x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
                raise ValueError(f"'data' has shape {x.shape}, not (N, 3072)")
            lab = np.asarray(labels, dtype=np.int64)
            if len(lab) != len(x) or (len(lab) and not (0 <= lab.min() and lab.max() < 10)):
                raise ValueError(f"{len(lab)} labels for {len(x)} images, or labels outside 0..9")
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as err:
            raise ValueError(f"{f} is not a CIFAR-10 python batch ({err}); point --data-dir at "
                             "the folder extracted from cifar-10-python.tar.gz") from None
        xs.append(x.reshape(-1, 3, 32, 32))
        ys.append(lab)
        if limit is not None and sum(len(v) for v in ys) >= limit:
            break
    X = np.concatenate(xs).astype(np.float32) / 255.0
    y = np.concatenate(ys)
    if limit is not None:
        X, y = X[:limit], y[:limit]
    classes = None
    meta = d / "batches.meta"
    if meta.exists():
        with open(meta, "rb") as fh:
            m = pickle.load(fh, encoding="bytes")
        names = m.get(b"label_names", m.get("label_names"))
        if names is not None:
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    return Dataset(X, y, 10, "cifar10", classes)


class ImageFolder:
    """Lazy ImageNet-style folder ``root/<class>/<image>``: ``ds[i] -> (float32 array (3, size,
    size) in [0, 1], label)``; ``targets`` holds all labels (for :func:`partition`)."""

    def __init__(self, root: os.PathLike, size: int = 32, limit_per_class: Optional[int] = None):
        self.root = Path(root)
        self.size = int(size)
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"no class sub-folders in {self.root}")
        self.samples: list[tuple[Path, int]] = []
        for label, cls in enumerate(self.classes):
            files = sorted(f for f in (self.root / cls).iterdir()
                           if f.suffix.lower() in IMAGE_EXTENSIONS)
            if limit_per_class is not None:
                files = files[:limit_per_class]
            self.samples.extend((f, label) for f in files)
        self.targets = np.array([lab for _, lab in self.samples], dtype=np.int64)
        if not self.samples:
            raise FileNotFoundError(f"no images ({', '.join(sorted(IMAGE_EXTENSIONS))}) in the "
                                    f"class sub-folders of {self.root}")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        from PIL import Image
        path, label = self.samples[i]
        with Image.open(path) as im:
            im = im.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
            arr = np.asarray(im, dtype=np.float32) / 255.0
        return arr.transpose(2, 0, 1).copy(), label

    def to_dataset(self) -> Dataset:
        X = np.stack([self[i][0] for i in range(len(self))]) if len(self) else \
            np.zeros((0, 3, self.size, self.size), np.float32)
        return Dataset(X, self.targets, len(self.classes), "imagefolder", list(self.classes))


def load_image_folder(root: os.PathLike, size: int = 32,
                      limit_per_class: Optional[int] = None) -> Dataset:
    return ImageFolder(root, size, limit_per_class).to_dataset()


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
