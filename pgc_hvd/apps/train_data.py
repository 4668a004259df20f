"""The data of a ``pgc-hvd train`` run: what each rank iterates and what rank 0 evaluates.

    data = build_data(args, n, device)  -> TrainData
    task = build_task(args.model, data.spec)
    for xb, yb in opt.batches(data.loader): ...
    data.evaluate(task, "train" | "test") -> {"loss", "accuracy"}

* the small bundled sets (``digits``, ``breast_cancer``, ``wine``, ``iris``, ``generated``):
  arrays in memory (:func:`pgc_hvd.data.load_dataset`), a seeded stratified 80/20 split, a
  :class:`~pgc_hvd.data.partition_loader.PartitionLoader` -- as before;
* ``cifar10``: torchvision's ``CIFAR10`` from ``--data-dir`` (training and test sets;
  ``--no-verify-data`` skips the MD5 check), 32 x 32;
* ``imagefolder``: torchvision's ``ImageFolder`` over ``--data-dir`` resized to
  ``--image-size``, a seeded stratified 80/20 split of its files (``torch.utils.data.Subset``).

The image sets train through :class:`~pgc_hvd.data.CodedLoader` with ``--workers`` DataLoader
workers (pinned memory on a GPU), ``ToTensor`` images in [0, 1] and, with ``--augment``,
RandomCrop(padding) + RandomHorizontalFlip (seeded per sample, the same on every replica).
Evaluation runs over a DataLoader of the unaugmented images, batch by batch (nothing is
materialised); the adaptive controller's validation batch is the first 128 test images.

Used by ``pgc-hvd train`` (:mod:`pgc_hvd.apps.train`).

May import: torch, numpy, :mod:`pgc_hvd.data` (datasets, partitions, both loaders, vision).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any, Callable, Optional

import numpy as np
import torch

VISION = ("cifar10", "imagefolder")


@dataclasses.dataclass
class TrainData:
    spec: Any                  # num_classes, feature_shape, name (what build_task reads)
    loader: Any                # what optimizer.batches() takes
    evaluate: Callable         # (task, "train" | "test") -> {"loss", "accuracy"}
    val: Optional[tuple]       # (X, y) on the device: <= 128 test samples
    close: Callable = lambda: None


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
    """Seeded (train, test) index arrays, ``round(test_fraction * count)`` of each label in
    test (the rule of :func:`pgc_hvd.data.train_test_split`)."""
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        rng.shuffle(idx)
        test.append(idx[: int(round(len(idx) * test_fraction))])
    test = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    mask = np.ones(len(labels), bool)
    mask[test] = False
    return np.flatnonzero(mask), test


def build_data(args, n: int, device) -> TrainData:
    if args.dataset.lower() in VISION:
        return _vision(args, n, device)
    return _arrays(args, n, device)


def _arrays(args, n, device) -> TrainData:
    from pgc_hvd.data import load_dataset, train_test_split
    from pgc_hvd.data.partition_loader import PartitionLoader

    ds = load_dataset(args.dataset)
    train, test = train_test_split(ds, 0.2, seed=args.seed)
    loader = PartitionLoader(train.X, train.y, n, batch_size=args.batch_size,
                             iid=not args.non_iid, seed=args.seed, device=device)
    splits = {"train": train, "test": test}

    def evaluate(task, split):
        d = splits[split]
        return task.evaluate(torch.from_numpy(d.X).to(device), torch.from_numpy(d.y).to(device))
    val = (torch.from_numpy(test.X[:128]).to(device), torch.from_numpy(test.y[:128]).to(device))
    return TrainData(train, loader, evaluate, val)


def _vision(args, n, device) -> TrainData:
    from pgc_hvd.data import CodedLoader
    from pgc_hvd.data import vision

    if args.data_dir is None:
        raise ValueError(f"--dataset {args.dataset} reads a local folder: pass --data-dir DIR "
                         f"(nothing is downloaded)")
    name = args.dataset.lower()
    if name == "cifar10":
        size = 32
        train = vision.cifar10(args.data_dir, train=True, transform=vision.to_tensor(),
                               verify=not args.no_verify_data)
        test = vision.cifar10(args.data_dir, train=False, transform=vision.to_tensor(),
                              verify=not args.no_verify_data)
        classes, labels = list(train.classes), np.asarray(train.targets)
        train_eval = train
        if args.augment:
            train = copy.copy(train)   # shares the images; its own transform
            train.transform = vision.augment(size)
    else:
        size = int(args.image_size)
        folder = vision.image_folder(args.data_dir, transform=vision.to_tensor(size))
        classes = list(folder.classes)
        train_idx, test_idx = stratified_split(np.asarray(folder.targets), 0.2, args.seed)
        if len(train_idx) == 0 or len(test_idx) == 0:
            raise ValueError(f"{args.data_dir} holds {len(folder)} images: too few for an 80/20 "
                             f"split; add images")
        labels = np.asarray(folder.targets)[train_idx]
        test = torch.utils.data.Subset(folder, test_idx.tolist())
        train_eval = torch.utils.data.Subset(folder, train_idx.tolist())
        src = folder
        if args.augment:
            src = copy.copy(folder)
            src.transform = vision.augment(size, resize=True)
        train = torch.utils.data.Subset(src, train_idx.tolist())
    pin = device.type == "cuda"
    loader = CodedLoader(train, n=n, batch_size=args.batch_size, iid=not args.non_iid,
                         seed=args.seed, labels=labels, device=device, num_workers=args.workers,
                         pin_memory=pin)
    splits = {"train": train_eval, "test": test}

    def evaluate(task, split):
        return evaluate_dataset(task, splits[split], device, workers=args.workers)
    head = [test[i] for i in range(min(128, len(test)))]
    val = (torch.stack([x for x, _ in head]).to(device),
           torch.tensor([y for _, y in head]).to(device))
    spec = types.SimpleNamespace(num_classes=len(classes), feature_shape=(3, size, size),
                                 name=name)
    return TrainData(spec, loader, evaluate, val, close=loader.close)


@torch.no_grad()
def evaluate_dataset(task, dataset, device, workers: int = 0, batch: int = 256) -> dict:
    """Mean loss and accuracy of ``task.model`` over a torch dataset, batch by batch."""
    was = task.model.training
    task.model.eval()
    total, loss, correct = 0, 0.0, 0
    dl = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers)
    for x, y in dl:
        x, y = x.to(device), y.to(device)
        out = task.model(x)
        loss += float(task.per_sample_loss(out, y).double().sum())
        pred = (out > 0).long().reshape(y.shape) if task.binary else out.argmax(1)
        correct += int((pred == y).sum())
        total += len(y)
    task.model.train(was)
    return {"loss": loss / max(total, 1), "accuracy": correct / max(total, 1)}
