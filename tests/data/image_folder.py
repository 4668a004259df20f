"""Tiny image folders written as JPEG files, for the data tests and their rank scripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_image_folder(root: Path, classes: int = 3, per_class: int = 12, size: int = 8,
                       seed: int = 0, separable: bool = True) -> Path:
    """``root/c<k>/<i>.jpg``: ``per_class`` RGB JPEGs of ``size`` x ``size`` per class. With
    ``separable`` class k's images are bright in channel k mod 3 (+ noise), so a small model
    learns them; else uniform noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for k in range(classes):
        folder = Path(root) / f"c{k}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            if separable:
                arr = rng.integers(0, 90, size=(size, size, 3))
                arr[..., k % 3] += 150 if k < 3 else 100 + 40 * (k // 3)
            else:
                arr = rng.integers(0, 256, size=(size, size, 3))
            Image.fromarray(arr.clip(0, 255).astype(np.uint8)).save(folder / f"{i}.jpg",
                                                                    quality=90)
    return Path(root)
