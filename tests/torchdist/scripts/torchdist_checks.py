"""Runs on every rank under torchrun: the torch engine's collectives (pgc_hvd.torchdist).

    python torchdist_checks.py ops      # allgather (equal / different lengths), alltoall,
                                        # allreduce, broadcasts, optimizer state, threads
    python torchdist_checks.py order    # PGC_HVD_TORCH_CHECK_ORDER=1: a rank that issues a
                                        # different collective is named
    python torchdist_checks.py direct-sum  # an agent's data sums by direct exchanges (np 3, 4)
    python torchdist_checks.py direct-sum-dead | direct-sum-hung   # the last rank gone / frozen

Each check prints "CHECK <name> ok rank=<r>"; a failure raises (non-zero exit).
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import torch

import pgc_hvd.torch as hvd
from pgc_hvd import torchdist
from checks import ok   # tests/checks.py

torch.set_num_threads(1)


def check_allgather():
    r, n = hvd.rank(), hvd.size()
    same = hvd.allgather(torch.full((2, 3), float(r)), name="ag.same")
    assert same.shape == (2 * n, 3) and same[::2, 0].tolist() == list(map(float, range(n)))
    # rows of different lengths, 1-d (the optimistic control rows) and 2-d; a rank with none
    for shape in ((r + 1,), (r, 2)):
        mine = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float64).view(shape) + 100 * r
        got = hvd.allgather(mine, name=f"ag.var.{len(shape)}")
        want = torch.cat([torch.arange(int(torch.tensor(s).prod()), dtype=torch.float64)
                          .view(s) + 100 * w
                          for w, s in enumerate([(w + 1,) if len(shape) == 1 else (w, 2)
                                                 for w in range(n)])])
        assert torch.equal(got, want), (got, want)
    # beyond the one-collective slot (ops.SLOT_BYTES): equal and different lengths, one rank
    # large and the others small (a payload riding with one rank's row), int32 and complex
    from pgc_hvd.torchdist.ops import SLOT_BYTES
    big = SLOT_BYTES // 8 + 3
    for rows, dtype in (([big] * n, torch.float64), ([big + w for w in range(n)], torch.int32),
                        ([big if w == 1 else 2 for w in range(n)], torch.complex64)):
        mine = (torch.arange(rows[r] * 2) + 1000 * r).to(dtype).view(rows[r], 2)
        got = hvd.allgather(mine, name=f"ag.big.{dtype}")
        want = torch.cat([(torch.arange(rows[w] * 2) + 1000 * w).to(dtype).view(rows[w], 2)
                          for w in range(n)])
        assert torch.equal(got, want), (dtype, got.shape, want.shape)
    # polled like the runtime does (handles)
    h = hvd.allgather_async(torch.tensor([r], dtype=torch.int64), name="ag.poll")
    while not hvd.poll(h):
        time.sleep(0.0005)
    assert hvd.synchronize(h).tolist() == list(range(n))
    # a dtype mismatch is an error on every rank, not garbage
    try:
        hvd.allgather(torch.zeros(2, dtype=torch.float32 if r else torch.float64), name="ag.bad")
    except torchdist.CollectiveError as err:
        assert "dtype or trailing shape" in str(err), err
    else:
        raise AssertionError("a dtype mismatch was not refused")
    ok("allgather_equal_and_variable_lengths")


def check_reduce_alltoall_broadcast():
    r, n = hvd.rank(), hvd.size()
    g = torch.Generator().manual_seed(r)
    x = torch.randn(1000, generator=g)
    s = x.clone()
    h = hvd.allreduce_async_(s, name="ar.sum", op=hvd.Sum)
    hvd.synchronize(h)
    rows = hvd.allgather(s.view(1, -1), name="ar.rows")
    assert all(torch.equal(rows[0], rows[w]) for w in range(n)), "allreduce bits differ"
    avg = hvd.allreduce(x, name="ar.avg")
    assert torch.allclose(avg, s / n)
    half = hvd.allreduce(torch.full((4,), 0.5, dtype=torch.float16), op=hvd.Sum, name="ar.16")
    assert half.dtype == torch.float16 and half.tolist() == [0.5 * n] * 4
    a2a = hvd.alltoall(torch.arange(2 * n, dtype=torch.float32) + 1000 * r, name="a2a")
    assert a2a.tolist() == [float(2 * r + j + 1000 * w) for w in range(n) for j in range(2)]
    b = hvd.broadcast(torch.full((3,), float(r)), root_rank=n - 1, name="bc")
    assert b.tolist() == [float(n - 1)] * 3
    assert hvd.broadcast_object({"from": r, "x": [1, 2]}, root_rank=1) == {"from": 1, "x": [1, 2]}
    ok("allreduce_alltoall_broadcast")


def check_state_broadcasts():
    r = hvd.rank()
    torch.manual_seed(r)                     # every rank starts different
    m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4))
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    rows = hvd.allgather(torch.cat([t.reshape(-1).double() for t in m.state_dict().values()])
                         .view(1, -1), name="bp.rows")
    assert all(torch.equal(rows[0], rows[w]) for w in range(hvd.size()))
    opt = torch.optim.Adam(m.parameters(), lr=0.01 * (1 + r), betas=(0.9, 0.99 - 0.001 * r))
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["betas"] == (0.9, 0.99)
    assert all(len(opt.state[p]) > 0 for p in m.parameters())
    # a pgc_hvd optimizer: the version travels, the state-creating step sends nothing
    import torch.nn.functional as F
    from pgc_hvd.runtime import PartitionLoader
    X = torch.randn(64, 5, generator=torch.Generator().manual_seed(3))
    y = (X[:, 0] > 0).long()
    loader = PartitionLoader(X, y, hvd.size(), batch_size=8, seed=1)
    torch.manual_seed(0)
    net = torch.nn.Linear(5, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=net.named_parameters(), scheme="pgc-cr",
                                   name="bos")
    if r == 0:
        opt.start_at(5)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.version == 5, opt.version
    while opt.version < 8:
        for xb, yb in opt.batches(loader):
            F.cross_entropy(net(xb), yb).backward()
        opt.step()
    opt.close()
    ok("broadcast_parameters_and_optimizer_state")


def check_threads_on_their_own_groups():
    """An agent-like thread issues collectives on its own groups while the training thread
    issues others on the train group, at rank-dependent moments: each group's sequence is the
    same on every rank, so every result is right."""
    r, n = hvd.rank(), hvd.size()
    agent = torchdist.agent_ops("threads", timeout=30)
    out, errors = [], []

    def run():
        try:
            rnd = random.Random(r)
            for k in range(40):
                time.sleep(rnd.random() * 0.002)
                name = "threads.ctl" if k % 2 else "threads.data"
                h = agent.allgather_async(torch.tensor([k * 10 + r], dtype=torch.int64),
                                          name=name)
                while not agent.poll(h):
                    time.sleep(0.0002)
                out.append(agent.synchronize(h).tolist())
        except Exception as err:        # noqa: BLE001
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    rnd = random.Random(100 + r)
    for k in range(40):
        time.sleep(rnd.random() * 0.002)
        got = hvd.allreduce(torch.tensor([float(k)]), op=hvd.Sum, name="threads.train")
        assert got.item() == k * n, got
    t.join()
    assert not errors, errors
    assert out == [[k * 10 + w for w in range(n)] for k in range(40)], out[:3]
    ok("threads_on_their_own_groups")


def check_direct_sum():
    """An agent's data group sums CPU tensors by direct exchanges (pgc_hvd.torchdist.direct_sum)
    at 3 to 8 ranks: the sum of every rank's tensor to float rounding, the same bits on every
    rank, for odd sizes and every float dtype; a tensor of fewer elements than ranks or of more
    than 1 MiB, an integer one and a Max keep gloo's allreduce (the same checks)."""
    from pgc_hvd.torchdist import direct_sum
    r, n = hvd.rank(), hvd.size()
    data = torchdist.agent_ops("direct-sum", timeout=30).data
    assert data.sum_timeout == 30.0
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for numel in (n, 5, 1000, 61_706, 300_001):
            x = torch.randn(numel, generator=torch.Generator().manual_seed(7 * r + numel))
            x = x.to(dtype)
            fits = x.numel() * x.element_size() <= direct_sum.MAX_BYTES
            assert direct_sum.applies(x, n) == (fits and n >= 3), (dtype, numel)
            got = data.synchronize(data.allreduce_async_(x.clone(), op=data.Sum))
            every = hvd.allgather(x.double().view(1, -1), name="direct-sum.inputs")
            want = every.sum(0)
            tol = {torch.float16: 2e-2, torch.bfloat16: 1e-1}.get(dtype, 1e-5)
            assert torch.allclose(got.double(), want, rtol=tol, atol=tol), (dtype, numel)
            rows = hvd.allgather(got.view(1, -1).double(), name="direct-sum.bits")
            assert all(torch.equal(rows[0], rows[w]) for w in range(n)), (dtype, numel)
            avg = data.synchronize(data.allreduce_async_(x.clone(), op=data.Average))
            assert torch.allclose(avg.double(), want / n, rtol=tol, atol=tol)
    # gloo's allreduce where direct_sum does not apply
    small = torch.full((n - 1,), float(r + 1))
    assert not direct_sum.applies(small, n)
    got = data.synchronize(data.allreduce_async_(small, op=data.Sum))
    assert got.tolist() == [n * (n + 1) / 2] * (n - 1)
    ints = data.synchronize(data.allreduce_async_(torch.tensor([r, 1]), op=data.Sum))
    assert ints.tolist() == [n * (n - 1) // 2, n]
    top = data.synchronize(data.allreduce_async_(torch.tensor([float(r)] * 8), op=data.Max))
    assert top.tolist() == [float(n - 1)] * 8
    ok("direct_sums")


def check_direct_sum_fault(how: str):
    """The last rank gone (``dead``: its process exits) or frozen (``hung``) before a direct
    sum: the others' sum fails at once naming a collective failure (dead), or stays not
    completed until the allreduce's deadline, without an error and without the pair closed
    before it (hung), as gloo's collective does for ``communicator.wait_for_handle``."""
    from pgc_hvd.runtime.communicator import wait_for_handle
    r, n = hvd.rank(), hvd.size()
    data = torchdist.agent_ops("direct-sum", timeout=3).data
    x = torch.ones(10_000)
    data.synchronize(data.allreduce_async_(x, op=data.Sum))      # every pair connected
    hvd.allreduce(torch.zeros(1), name="direct-sum.ready")
    if r == n - 1:
        if how == "dead":
            os._exit(0)
        time.sleep(12)
        os._exit(0)
    t0 = time.monotonic()
    h = data.allreduce_async_(torch.ones(10_000), op=data.Sum)
    if how == "dead":
        try:
            data.synchronize(h)
        except torchdist.CollectiveError as err:
            took = time.monotonic() - t0
            assert took < 2.5, took
            print(f"CHECK-NOTE dead partner failed after {took:.2f}s: {err}", flush=True)
        else:
            raise AssertionError("a sum with a dead rank completed")
    else:
        # a wait of 1 s blocks until the allreduce's 3 s deadline (gloo's point-to-point
        # waits cannot be cut in slices), then reports "not completed", and so does every
        # later wait, at once, without an error
        assert not wait_for_handle(data, h, 1.0), f"completed without rank {n - 1}"
        took = time.monotonic() - t0
        assert 2.9 < took < 5.0, took
        t1 = time.monotonic()
        assert not any(data.wait_for(h, 0.5) for _ in range(5))
        assert time.monotonic() - t1 < 0.5, time.monotonic() - t1
    ok(f"direct_sum_{how}")
    sys.stdout.flush()
    os._exit(0)      # the group is broken: no shutdown


def check_order():
    """PGC_HVD_TORCH_CHECK_ORDER=1: every collective first compares its name across ranks."""
    assert torchdist.ops.CHECK_ORDER
    r = hvd.rank()
    hvd.allreduce(torch.ones(2), name="same")
    try:
        hvd.allreduce(torch.ones(2), name="odd" if r == 1 else "even")
    except torchdist.CollectiveError as err:
        assert "ranks [1]" in str(err) if r != 1 else "ranks [0" in str(err), err
        print(f"INFO rank={r}: {err}", flush=True)
    else:
        raise AssertionError("a different collective at the same point was not named")
    ok("order_mismatch_named")


def main():
    hvd.init()
    mode = sys.argv[1]
    if mode == "ops":
        check_allgather()
        check_reduce_alltoall_broadcast()
        check_state_broadcasts()
        check_threads_on_their_own_groups()
    elif mode == "order":
        check_order()
    elif mode == "direct-sum":
        check_direct_sum()
    elif mode.startswith("direct-sum-"):
        check_direct_sum_fault(mode.rpartition("-")[2])
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"ALL OK rank={hvd.rank()}", flush=True)
    if mode != "direct-sum":      # an entry of a shared launch (tests/torchdist): others follow
        hvd.shutdown()


if __name__ == "__main__":
    main()
