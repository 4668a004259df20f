"""Images per second through CodedLoader against a plain DataLoader + DistributedSampler.

    python benchmarks/loader/loader_throughput.py [--images 4096] [--size 32] [--batch 32] [--n 4]
                                           [--workers 2] [--reps 9] [--scheme pgc-cr]
                                           [--paired 80]

Writes an ImageFolder of ``--images`` random ``--size`` x ``--size`` JPEGs (10 classes) to a
temporary folder, then, in one process, times one epoch of rank 0's batches, ``--reps`` times
each, alternating (and alternating which goes first):

* ``plain``: ``DataLoader(ds, batch_size, sampler=DistributedSampler(ds, n, rank=0),
  num_workers, persistent_workers=True)`` -- ``set_epoch(e)`` and one pass over its iterator;
* ``coded``: ``CodedLoader(ds, n, batch_size, num_workers)`` bound to ``--scheme`` at rank 0,
  ``batch(partition, step)`` for every key of the ``len(loader)`` steps of epoch e, as
  ``optimizer.batches`` asks for them (one partition a step under pgc-cr).

Both read the same dataset (torchvision ``ImageFolder``, RandomCrop(padding=4) +
RandomHorizontalFlip + ToTensor + Normalize) with the same batch size and workers; epoch 0 of
each is a warm-up (worker start). Prints the median images/s of each and coded / plain, over
whole epochs (what a training loop waits for: the plain iterator restarts each epoch, the coded
one runs on), after each epoch's first batch (the pipelines' steady rate) and per CPU second of
the main process and the loader's worker processes (the cost, which a shared machine's load
does not change), and one JSON line (``RESULT {...}``). Then (``--paired``) the steady rate
without epoch restarts: alternating 12-batch windows of the coded loader and of a plain
DataLoader over an endless stream of random batches, the median of the paired ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pgc_hvd.apps.local_ranks import print_result


def write_folder(root: Path, images: int, size: int, classes: int = 10, seed: int = 0) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(images):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        arr = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        Image.fromarray(arr).save(folder / f"{i}.jpg", quality=90)


class EndlessBatches:
    """A batch_sampler: endless seeded random batches of ``batch`` indices of ``size``."""

    def __init__(self, size: int, batch: int):
        self.size, self.batch = size, batch

    def __iter__(self):
        import numpy as np

        rng = np.random.default_rng(0)
        while True:
            yield rng.integers(0, self.size, self.batch).tolist()


def paired_windows(ds, coded, scheme, a) -> dict:
    """Steady rates without epoch restarts: ``a.paired`` pairs of 12-batch windows, a plain
    DataLoader over an endless stream of batches then the coded loader going on from its last
    step; the median and quartiles of the per-pair rate ratios coded / plain (pairing cancels
    the drift of a shared machine's load)."""
    from torch.utils.data import DataLoader

    plain = iter(DataLoader(ds, batch_sampler=EndlessBatches(len(ds), a.batch),
                            num_workers=a.workers))
    next(plain)
    step = (a.reps + 1) * len(coded)
    ratios = []
    for _ in range(a.paired):
        t = time.perf_counter()
        for _ in range(12):
            next(plain)
        plain_s = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(12):
            for part, _ in scheme.work_plan(0, step).evaluate:
                coded.batch(part, step)
            step += 1
        ratios.append(plain_s / (time.perf_counter() - t))
    ratios.sort()
    q = len(ratios) // 4
    return {"median": statistics.median(ratios), "q1": ratios[q], "q3": ratios[-1 - q]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n", type=int, default=4, help="ranks the data is split for")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--scheme", default="pgc-cr")
    p.add_argument("--paired", type=int, default=80, metavar="PAIRS",
                   help="then PAIRS alternating 12-batch windows against a plain DataLoader "
                        "over an endless batch stream (0: skip)")
    a = p.parse_args(argv)

    import psutil
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

        me = psutil.Process()

        def cpu_seconds(pids):
            """User + system CPU seconds of this process and the worker processes ``pids``."""
            total = 0.0
            for proc in [me] + [psutil.Process(pid) for pid in pids]:
                t = proc.cpu_times()
                total += t.user + t.system
            return total

        def timed(batches, pids):
            """(images/s over the epoch, images/s after its first batch, images per CPU second
            of the main process and the loader's workers)."""
            c0, t0 = cpu_seconds(pids), time.perf_counter()
            sizes, t_first = [], None
            for y in batches:
                sizes.append(len(y))
                if t_first is None:
                    t_first = time.perf_counter()
            t1, c1 = time.perf_counter(), cpu_seconds(pids)
            return sum(sizes) / (t1 - t0), sum(sizes[1:]) / (t1 - t_first), (sum(sizes), c1 - c0)

        def plain_epoch(e):
            sampler.set_epoch(e)
            return timed((y for _, y in plain), workers["plain"])

        def coded_epoch(e):
            coded.set_epoch(e)
            return timed((coded.batch(part, step)[1]
                          for step in range(e * len(coded), (e + 1) * len(coded))
                          for part, _ in scheme.work_plan(0, step).evaluate), workers["coded"])

        workers = {"plain": [], "coded": []}
        plain_epoch(0)                    # warm-up; starts each loader's workers
        workers["plain"] = [p.pid for p in me.children()]
        coded_epoch(0)
        workers["coded"] = [p.pid for p in me.children() if p.pid not in workers["plain"]]
        rates = {f"{name}{kind}": [] for name in ("plain", "coded") for kind in ("", "_steady")}
        cpu = {"plain": [0, 0.0], "coded": [0, 0.0]}   # images, CPU seconds: all timed epochs
        for e in range(1, a.reps + 1):
            # alternate who goes first, so a drift in the machine's load hits both alike
            order = [("plain", plain_epoch), ("coded", coded_epoch)][::1 if e % 2 else -1]
            for name, run in order:
                whole, steady, (images, seconds) = run(e)
                rates[name].append(whole)
                rates[f"{name}_steady"].append(steady)
                cpu[name][0] += images
                cpu[name][1] += seconds
            print(f"epoch {e}: plain {rates['plain'][-1]:7.0f} img/s (after its first batch "
                  f"{rates['plain_steady'][-1]:7.0f})   coded {rates['coded'][-1]:7.0f} img/s "
                  f"({rates['coded_steady'][-1]:7.0f})", flush=True)
        paired = paired_windows(ds, coded, scheme, a) if a.paired else None
        coded.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    for name, (images, seconds) in cpu.items():   # CPU times tick in 10 ms: summed, not per epoch
        med[f"{name}_per_cpu_s"] = images / max(seconds, 1e-9)
    ratios = {kind or "whole": med[f"coded{kind}"] / med[f"plain{kind}"]
              for kind in ("", "_steady", "_per_cpu_s")}
    load = os.getloadavg()
    print(f"median over {a.reps} epochs of {len(coded) * a.batch} images, coded / plain: "
          f"{ratios['whole']:.3f} in images/s over whole epochs (plain {med['plain']:.0f}, coded "
          f"{med['coded']:.0f}), {ratios['_steady']:.3f} after each epoch's first batch (plain "
          f"{med['plain_steady']:.0f}, coded {med['coded_steady']:.0f}), "
          f"{ratios['_per_cpu_s']:.3f} in images per CPU second over all epochs (plain "
          f"{med['plain_per_cpu_s']:.0f}, coded {med['coded_per_cpu_s']:.0f}); load average "
          f"{load[0]:.2f} at the end, {os.cpu_count()} cores; coded loader {coded.stats}",
          flush=True)
    if paired:
        print(f"paired windows of 12 batches, coded / a plain DataLoader over an endless stream "
              f"of batches (no epoch restarts): median {paired['median']:.3f}, quartiles "
              f"{paired['q1']:.3f}-{paired['q3']:.3f} over {a.paired} pairs", flush=True)
        ratios["paired_steady"] = paired["median"]
    print_result({"args": vars(a), "median": med, "ratios": ratios,
                  "rates": rates, "stats": coded.stats,
                  "loadavg_1m": load[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
