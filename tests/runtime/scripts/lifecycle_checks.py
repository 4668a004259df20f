"""Runs on every rank under horovodrun: the end of training without close(), dropout replicas,
per-rank data. No script here calls ``close()``.

    python lifecycle_checks.py replicas   # -np 2: a dropout model under gc-cr ends with the same
                                          #   parameters whichever rank straggles; per-rank
                                          #   random data is refused at the first step
    python lifecycle_checks.py collected  # -np 2: an optimizer that went out of scope, then one
                                          #   still referenced at hvd.shutdown(): both closed
    python lifecycle_checks.py mismatch   # -np 2: rank 1 changes its parameters after the loop:
                                          #   the exit's close compares them and exits 1

Each check prints "CHECK <name> ok rank=<r>"; the last line of a clean run is "ALL OK rank=<r>".
"""

from __future__ import annotations

import gc
import sys

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

import pgc_hvd
from pgc_hvd.data import CodedLoader
from pgc_hvd.runtime import lifecycle
from pgc_hvd.runtime.consistency import tensors_digest

from runtime_checks import Fixed, data, same_on_all_ranks
from checks import ok   # tests/checks.py


torch.set_num_threads(1)


def dropout_model():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 2))


def train(m, scheme, steps, *, name, delay=None, loader=None, s=1):
    loader = loader or data(hvd.size())
    opt = pgc_hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5),
                                       m.named_parameters(), scheme=scheme, stragglers=s,
                                       delay=delay, name=name, timeout=30)
    for _ in range(steps):
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        opt.step()
    return opt


def check_dropout_same_whichever_rank_straggles(steps=4):
    """gc-cr at n = 2, s = 1: each rank evaluates both partitions, the fastest rank's message
    is decoded alone. With dropout seeded per (seed, partition, step) on every replica, the
    decoded update is the same whoever is fast, so the two runs end with the same parameters."""
    digests = []
    torch.manual_seed(123)
    before = torch.random.default_generator.get_state()
    for slow in range(hvd.size()):
        m = dropout_model()
        torch.manual_seed(123)   # the run seed (rank 0's is agreed at construction)
        opt = train(m, "gc-cr", steps, name=f"drop{slow}", delay=Fixed(slow, 0.25, from_step=0))
        used = opt.metrics["ranks"]   # the last step was decoded from the fast rank alone
        assert list(used) == [w for w in range(hvd.size()) if w != slow], used
        opt.close()   # the next run reuses the processes: end this one here (same as exit's)
        same_on_all_ranks(m, f"dropout{slow}")
        digests.append(tensors_digest(m.parameters()))
        print(f"INFO rank {hvd.rank()} slow={slow} digest={digests[-1]:016x} used={used}",
              flush=True)
    assert len(set(digests)) == 1, f"dropout: parameters depend on the straggler: {digests}"
    # the user's generator outside opt.batches() is where the user left it
    torch.manual_seed(123)
    assert torch.equal(torch.random.default_generator.get_state(), before)
    ok("dropout_same_whichever_rank_straggles")


def check_per_rank_data_refused():
    g = torch.Generator().manual_seed(1000 + hvd.rank())   # a different dataset on each rank
    X = torch.randn(64, 6, generator=g)
    y = (X[:, 0] > 0).long()
    loader = CodedLoader(torch.utils.data.TensorDataset(X, y), n=hvd.size(), batch_size=8)
    m = dropout_model()
    try:
        train(m, "pgc-cr", 2, name="perrank", loader=loader)
    except ValueError as err:
        msg = str(err)
        assert "the ranks' data differ" in msg and "same dataset" in msg and \
            "torch.manual_seed" in msg, msg
        print(f"REFUSED rank={hvd.rank()}: {msg}", flush=True)
        ok("per_rank_data_refused")
        return
    raise AssertionError("per-rank random data was accepted")


def check_collected_then_shutdown():
    def scope():
        m = dropout_model()
        train(m, "pgc-cr", 5, name="scoped", delay=Fixed(1, 0.05))
        return tensors_digest(m.parameters())

    first = scope()            # model and optimizer unreachable from here on
    gc.collect()
    assert [o.config.name for o in lifecycle.kept()] == ["scoped"], "not collected"
    # the job goes on with collectives of its own while the collected optimizer waits
    total = hvd.allreduce(torch.tensor([float(first % 1000)]), op=hvd.Sum, name="after")
    assert float(total) == 2 * float(first % 1000), "the ranks' first models differ"
    m = dropout_model()
    opt = train(m, "pgc-cr", 5, name="second", delay=Fixed(0, 0.05))
    names = [o.config.name for _, o in lifecycle.unclosed()]
    assert names == ["scoped", "second"], names   # the collected one is kept until closed
    rank = hvd.rank()
    print(f"PARAMS digest={tensors_digest(m.parameters()):016x} rank={rank}", flush=True)
    hvd.shutdown()             # closes 'scoped' and 'second' first (parameters compared)
    assert opt.closed and not lifecycle.unclosed()
    ok("collected_then_shutdown", rank)
    print(f"ALL OK rank={rank}", flush=True)


def check_mismatch_at_exit():
    m = dropout_model()
    train(m, "pgc-cr", 4, name="mismatch")
    if hvd.rank() == 1:
        with torch.no_grad():
            next(m.parameters()).add_(1.0)   # a change outside the optimizer, on one rank
    print(f"LOOP DONE rank={hvd.rank()}", flush=True)


def main():
    hvd.init()
    mode = sys.argv[1]
    if mode == "replicas":
        check_dropout_same_whichever_rank_straggles()
        check_per_rank_data_refused()
        print(f"ALL OK rank={hvd.rank()}", flush=True)
    elif mode == "collected":
        check_collected_then_shutdown()
    elif mode == "mismatch":
        check_mismatch_at_exit()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
