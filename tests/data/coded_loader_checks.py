"""Runs on every rank under horovodrun: torchvision ImageFolder + CodedLoader(num_workers=2)
trains every shard under a scheme whose partitions are not the rank's own.

    python coded_loader_checks.py SCHEME FOLDER STEPS [mismatch]

FOLDER is an ImageFolder of K = n classes (class k bright in channel k); the partitions are
sorted by label, so shard k is class k and a shard that no rank trained would score ~0 on its
class. The last rank is slowed by 40 ms per step from step 1 (the optimizer's ``delay=``).
Each rank prints its per-shard accuracy and loss before and after, checks every shard's
accuracy > 0.8 (chance 1/n) and its loss fell, and ends by comparing a hash of the parameters
across ranks; then prints "CHECK <scheme> ok rank=<r>". With ``mismatch``, rank 1 then builds
a loader with other transforms and every rank checks that its first ``batches()`` is refused
naming "loader transform" ("CHECK mismatch ok").
"""

from __future__ import annotations

import hashlib
import multiprocessing
import sys

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from checks import ok   # tests/checks.py
from torchvision import datasets, transforms

import pgc_hvd

torch.set_num_threads(1)


class SlowRank:
    """Delay model: ``delay`` seconds for ``worker`` at every step >= 1."""

    def __init__(self, worker, delay):
        self.worker, self.delay = worker, delay

    def sample(self, worker, step):
        return self.delay if worker == self.worker and step >= 1 else 0.0


def shard_scores(model, plain, partitions):
    """(accuracy, mean loss) of the model on every shard's samples, unaugmented."""
    out = []
    with torch.no_grad():
        for part in partitions:
            x = torch.stack([plain[int(i)][0] for i in part])
            y = torch.tensor([plain[int(i)][1] for i in part])
            logits = model(x)
            out.append((float((logits.argmax(1) == y).double().mean()),
                        float(F.cross_entropy(logits, y))))
    return out


def main(scheme: str, folder: str, steps: int, mismatch: bool = False) -> None:
    hvd.init()
    rank, n = hvd.rank(), hvd.size()
    augment = transforms.Compose([transforms.RandomCrop(8, padding=1),
                                  transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    train = datasets.ImageFolder(folder, transform=augment)
    plain = datasets.ImageFolder(folder, transform=transforms.ToTensor())
    assert len(train.classes) == n, f"the folder has {len(train.classes)} classes for n={n}"
    # workers from a fork server, not forked from this threaded rank: a fork of a process
    # running Horovod's and the agent's threads once deadlocked in CPython's after-fork code.
    # The server imports what the workers unpickle once, before its first fork; without the
    # preload every worker imports torch and torchvision itself (seconds each on 2 cores)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torchvision.datasets", "pgc_hvd.data.coded_loader"])
    loader = pgc_hvd.CodedLoader(train, n=n, batch_size=4, iid=False, seed=3, num_workers=2,
                                 multiprocessing_context=ctx)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, n))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = shard_scores(model, plain, loader.partitions)
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5), named_parameters=model.named_parameters(),
        scheme=scheme, stragglers=1, delay=SlowRank(n - 1, 0.04), timeout=60,
        name=f"loader-{scheme}")
    while opt.version < steps:
        for xb, yb in opt.batches(loader):
            F.cross_entropy(model(xb), yb).backward()
        opt.step()
    opt.close()
    stats = dict(loader.stats)
    loader.close()
    after = shard_scores(model, plain, loader.partitions)
    print(f"SHARDS {scheme} rank={rank} " + " ".join(
        f"shard{k}: acc {a0:.2f}->{a1:.2f} loss {l0:.3f}->{l1:.3f}"
        for k, ((a0, l0), (a1, l1)) in enumerate(zip(before, after))) + f" loader {stats}",
        flush=True)
    for k, ((_, l0), (a1, l1)) in enumerate(zip(before, after)):
        assert a1 > 0.8 and l1 < l0, (f"{scheme}: shard {k} was not trained (accuracy {a1:.2f}, "
                                      f"loss {l0:.3f} -> {l1:.3f})")
    if rank != n - 1:   # the slowed rank may jump past its prefetch window at every step
        assert stats["prefetched"] > 0, f"{scheme}: no batch came from the workers: {stats}"
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    h = int(hashlib.sha256(flat.double().numpy().tobytes()).hexdigest()[:12], 16)
    hashes = hvd.allgather(torch.tensor([h], dtype=torch.int64), name=f"hash.{scheme}")
    assert len(set(hashes.tolist())) == 1, f"{scheme}: parameter hashes differ {hashes.tolist()}"
    ok(scheme, rank)
    if mismatch:
        refuse_different_transforms(model, folder, n, rank)


def refuse_different_transforms(model, folder, n, rank):
    """Rank 1 augments differently: the first batches() of the loader is refused on every rank,
    naming the field (the replicas of a partition would compute different gradients)."""
    tf = [transforms.ToTensor(), transforms.Compose([transforms.RandomHorizontalFlip(),
                                                     transforms.ToTensor()])][rank == 1]
    loader = pgc_hvd.CodedLoader(datasets.ImageFolder(folder, transform=tf), n=n, batch_size=4)
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
        scheme="pgc-cr", stragglers=1, timeout=60, name="loader-mismatch")
    try:
        next(iter(opt.batches(loader)))
    except ValueError as err:
        assert "loader transform" in str(err) and "ranks [1]" in str(err), err
    else:
        raise AssertionError("a loader whose transforms differ across ranks was accepted")
    ok("mismatch", rank)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), mismatch="mismatch" in sys.argv[4:])
