"""torchvision's image datasets from a local folder (nothing is downloaded), with clear errors.

    cifar10(root, train=True, transform=None, verify=True)  -> torchvision.datasets.CIFAR10
    image_folder(root, transform=None)                       -> torchvision.datasets.ImageFolder
    augment(size) / to_tensor(size=None)                     -> torchvision transforms

``cifar10``: ``root`` is the folder that holds ``cifar-10-batches-py`` (torchvision's layout)
or that folder itself (the package's earlier layout). torchvision checks every batch file
against the published MD5 sums; ``verify=False`` only checks that the files are there (a
re-packed or cut-down copy, e.g. a test's tiny files), by a subclass whose MD5 entries are None
(the attributes torchvision's CIFAR100 overrides the same way). ``image_folder``:
``root/<class>/<image>``, torchvision's ``ImageFolder`` as it is. Both keep the images as
files / one uint8 array and decode per sample: nothing is converted up front. (This module
loads torchvision; :mod:`pgc_hvd.data` imports it only when asked.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional

from torchvision import transforms
from torchvision.datasets import CIFAR10, ImageFolder

CIFAR_FOLDER = "cifar-10-batches-py"
CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]


def _cifar_root(root: os.PathLike) -> Path:
    root = Path(root).expanduser()
    if root.name == CIFAR_FOLDER and not (root / CIFAR_FOLDER).is_dir():
        root = root.parent
    folder = root / CIFAR_FOLDER
    missing = [f for f in CIFAR_FILES if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"no CIFAR-10 python batches in {folder} (missing {', '.join(missing)}): point "
            f"--data-dir at the folder that holds {CIFAR_FOLDER}/ extracted from "
            f"cifar-10-python.tar.gz (or at {CIFAR_FOLDER}/ itself); nothing is downloaded")
    return root


def cifar10(root: os.PathLike, train: bool = True, transform: Optional[Callable] = None,
            verify: bool = True):
    """torchvision's CIFAR-10 (see the module docstring)."""
    root = _cifar_root(root)
    cls = CIFAR10 if verify else UnverifiedCIFAR10
    try:
        return cls(str(root), train=train, transform=transform, download=False)
    except RuntimeError as err:
        if "corrupted" not in str(err):
            raise
        raise ValueError(
            f"the CIFAR-10 batches in {root / CIFAR_FOLDER} differ from the published files "
            f"(MD5): extract cifar-10-python.tar.gz afresh, or read them as they are with "
            f"verify=False (--no-verify-data)") from None
    except Exception as err:   # a damaged or foreign pickle (only reachable unverified)
        raise ValueError(f"{root / CIFAR_FOLDER} does not hold readable CIFAR-10 python batches "
                         f"({type(err).__name__}: {err}); extract cifar-10-python.tar.gz "
                         f"there") from None


class UnverifiedCIFAR10(CIFAR10):
    """torchvision's CIFAR10 that checks the files exist, not their MD5 sums."""
    train_list = [[name, None] for name, _ in CIFAR10.train_list]
    test_list = [[name, None] for name, _ in CIFAR10.test_list]
    meta = {**CIFAR10.meta, "md5": None}


def image_folder(root: os.PathLike, transform: Optional[Callable] = None):
    """torchvision's ImageFolder over ``root/<class>/<image>``."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder; --data-dir takes an ImageFolder "
                                f"(one sub-folder of images per class)")
    return ImageFolder(str(root), transform=transform)


def to_tensor(size: Optional[int] = None):
    """``[Resize((size, size))] + ToTensor``: float32 (3, H, W) in [0, 1]."""
    steps = [] if size is None else [transforms.Resize((size, size))]
    return transforms.Compose(steps + [transforms.ToTensor()])


def augment(size: int, resize: bool = False):
    """The usual CIFAR augmentation at ``size``: [Resize] + RandomCrop(size, padding=size // 8)
    + RandomHorizontalFlip + ToTensor."""
    steps = [transforms.Resize((size, size))] if resize else []
    return transforms.Compose(steps + [transforms.RandomCrop(size, padding=max(1, size // 8)),
                                       transforms.RandomHorizontalFlip(),
                                       transforms.ToTensor()])
