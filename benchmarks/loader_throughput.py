"""Images per second through CodedLoader against a plain DataLoader + DistributedSampler.

    python benchmarks/loader_throughput.py [--images 4096] [--size 32] [--batch 32] [--n 4]
                                           [--workers 2] [--reps 5] [--scheme pgc-cr]

Writes an ImageFolder of ``--images`` random ``--size`` x ``--size`` JPEGs (10 classes) to a
temporary folder, then, in one process, times one epoch of rank 0's batches, ``--reps`` times
each, alternating:

* ``plain``: ``DataLoader(ds, batch_size, sampler=DistributedSampler(ds, n, rank=0),
  num_workers, persistent_workers=True)`` -- ``set_epoch(e)`` and one pass over its iterator;
* ``coded``: ``CodedLoader(ds, n, batch_size, num_workers)`` bound to ``--scheme`` at rank 0,
  ``batch(partition, step)`` for every key of the ``len(loader)`` steps of epoch e, as
  ``optimizer.batches`` asks for them (one partition a step under pgc-cr).

Both read the same dataset (torchvision ``ImageFolder``, RandomCrop(padding=4) +
RandomHorizontalFlip + ToTensor + Normalize) with the same batch size and workers; epoch 0 of
each is a warm-up (worker start). Prints the median images/s of each and coded / plain, and
one JSON line (``RESULT {...}``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def write_folder(root: Path, images: int, size: int, classes: int = 10, seed: int = 0) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(images):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        arr = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        Image.fromarray(arr).save(folder / f"{i}.jpg", quality=90)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n", type=int, default=4, help="ranks the data is split for")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--scheme", default="pgc-cr")
    a = p.parse_args(argv)

    import torch
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets, transforms

    from pgc_hvd.data import CodedLoader
    from pgc_hvd.schemes.registry import get_scheme

    torch.set_num_threads(1)
    tf = transforms.Compose([transforms.RandomCrop(a.size, padding=4),
                             transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))])
    with tempfile.TemporaryDirectory(prefix="loader_throughput_") as tmp:
        t0 = time.perf_counter()
        write_folder(Path(tmp), a.images, a.size)
        print(f"wrote {a.images} JPEGs of {a.size}x{a.size} in {time.perf_counter() - t0:.1f}s",
              flush=True)
        ds = datasets.ImageFolder(tmp, transform=tf)
        sampler = DistributedSampler(ds, num_replicas=a.n, rank=0, shuffle=True, seed=0)
        plain = DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers,
                           persistent_workers=a.workers > 0)
        scheme = get_scheme(a.scheme, n=a.n, s=1)
        coded = CodedLoader(ds, n=a.n, batch_size=a.batch, num_workers=a.workers, seed=0)
        coded.bind(scheme, 0)

        def plain_epoch(e):
            sampler.set_epoch(e)
            t = time.perf_counter()
            count = sum(len(y) for _, y in plain)
            return count / (time.perf_counter() - t)

        def coded_epoch(e):
            coded.set_epoch(e)
            t = time.perf_counter()
            count = 0
            for step in range(e * len(coded), (e + 1) * len(coded)):
                for part, _ in scheme.work_plan(0, step).evaluate:
                    count += len(coded.batch(part, step)[1])
            return count / (time.perf_counter() - t)

        plain_epoch(0)
        coded_epoch(0)
        rates = {"plain": [], "coded": []}
        for e in range(1, a.reps + 1):
            rates["plain"].append(plain_epoch(e))
            rates["coded"].append(coded_epoch(e))
            print(f"epoch {e}: plain {rates['plain'][-1]:8.0f} img/s   coded "
                  f"{rates['coded'][-1]:8.0f} img/s", flush=True)
        coded.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = med["coded"] / med["plain"]
    load = os.getloadavg()
    print(f"median: plain {med['plain']:.0f} img/s, coded {med['coded']:.0f} img/s, "
          f"coded / plain = {ratio:.3f} (load average {load[0]:.2f}, {os.cpu_count()} cores; "
          f"coded loader {coded.stats})", flush=True)
    print("RESULT " + json.dumps({"args": vars(a), "median_images_per_s": med, "ratio": ratio,
                                  "rates": rates, "stats": coded.stats,
                                  "loadavg_1m": load[0]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
