"""Runs on every rank (horovodrun or torchrun): the user's own collectives beside pgc_hvd.

    python user_collectives_checks.py [SCHEMES]   # default: pgc-cr,bcgc,bounded-staleness

A Horovod script averages metrics, sums validation results and broadcasts flags, mostly with
*unnamed* collectives. Horovod names an unnamed op ``<op>.noname.<handle>`` from a per-process
handle counter that every op (pgc_hvd's too) advances, so any rank-dependent number of Horovod
ops issued by pgc_hvd before the user's op gives it a different name on each rank, and every
rank hangs. For each scheme, with the default control plane and one rank slowed (rank n - 1,
50 ms a batch), SGD momentum 0.9, this script:

* in the loop, every third step: an unnamed ``allreduce`` (the step's mean), ``allgather``,
  ``broadcast`` and ``alltoall``, and an ``allreduce_async`` started before ``step()`` and
  synchronized after it;
* after the loop, with ``close()`` (even cases) and without (odd): unnamed ``allreduce``
  (``op=Sum``), ``allgather``, ``broadcast``, ``alltoall``;
* checks every value, then the cross-rank parameter hash through an unnamed allgather.

A hang is the failure this pins: a watchdog (``faulthandler``) ends the rank with every
thread's stack after ``WATCHDOG`` seconds. Prints ``CHECK <name> ok rank=<r>``.
"""

from __future__ import annotations

import faulthandler
import hashlib
import os
import sys

import torch
import torch.nn.functional as F

import pgc_hvd

hvd = pgc_hvd.engine()     # horovod.torch under horovodrun, pgc_hvd.torch under torchrun

sys.path.insert(0, os.path.dirname(__file__))
from consistency_fault_checks import data, model  # noqa: E402
from checks import ok  # noqa: E402

torch.set_num_threads(1)
WATCHDOG = 90.0
STEPS = 12


def check_equal(got, want, what):
    got, want = torch.as_tensor(got).double(), torch.as_tensor(want).double()
    assert got.shape == want.shape and torch.allclose(got, want), f"{what}: {got} != {want}"


def check_alltoall(n: int, r: int, what: str) -> None:
    """An unnamed alltoall of equal splits: rank r receives w * n + r from every rank w."""
    back = hvd.alltoall(torch.tensor([float(r * n + j) for j in range(n)]))
    back = back[0] if isinstance(back, (tuple, list)) else back   # (tensor, splits) or tensor
    check_equal(back, [float(w * n + r) for w in range(n)], what)


def user_habits_in_loop(step: int, n: int, r: int) -> None:
    """The logging habits of a Horovod loop, all unnamed."""
    avg = hvd.allreduce(torch.tensor([float(step + r)]))       # default op: Average
    check_equal(avg, [step + (n - 1) / 2], "in-loop allreduce")
    got = hvd.allgather(torch.tensor([[float(r), float(step)]]))
    check_equal(got, [[float(w), float(step)] for w in range(n)], "in-loop allgather")
    flag = hvd.broadcast(torch.tensor([float(r * 100 + step)]), root_rank=0)
    check_equal(flag, [float(step)], "in-loop broadcast")
    check_alltoall(n, r, "in-loop alltoall")


def user_habits_after(n: int, r: int, tag: float) -> None:
    """What a script does after training: validation sums, gathers, a broadcast flag."""
    total = hvd.allreduce(torch.tensor([1.0 + r + tag]), op=hvd.Sum)
    check_equal(total, [n + n * (n - 1) / 2 + n * tag], "after-loop allreduce(Sum)")
    got = hvd.allgather(torch.tensor([float(r) + tag]))
    check_equal(got, [w + tag for w in range(n)], "after-loop allgather")
    flag = hvd.broadcast(torch.tensor([float(r) + tag]), root_rank=0)
    check_equal(flag, [tag], "after-loop broadcast")
    check_alltoall(n, r, "after-loop alltoall")


def unnamed_hash(m) -> None:
    raw = b"".join(p.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
                   for p in m.parameters())
    h = int(hashlib.sha256(raw).hexdigest()[:12], 16)
    allh = hvd.allgather(torch.tensor([h], dtype=torch.int64))   # unnamed, on purpose
    assert len(set(allh.tolist())) == 1, f"parameter hashes differ across ranks {allh}"


def run_case(i: int, scheme: str, close: bool) -> None:
    n, r = hvd.size(), hvd.rank()
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)
    m = model()
    kw = {} if scheme == "pgc-cr" else {"scheme": scheme}   # pgc-cr: every default
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        named_parameters=m.named_parameters(), name=f"uc{i}", timeout=60,
        delay=pgc_hvd.delays.SlowWorker(n - 1, 0.05), **kw)
    loader = data(n)
    for step in range(STEPS):
        for xb, yb in opt.batches(loader):
            F.cross_entropy(m(xb), yb).backward()
        pending = hvd.allreduce_async(torch.tensor([float(r)]), op=hvd.Sum) \
            if step % 3 == 1 else None
        opt.step()
        if pending is not None:
            check_equal(hvd.synchronize(pending), [n * (n - 1) / 2], "async allreduce")
        if step % 3 == 0:
            user_habits_in_loop(step, n, r)
    assert opt.version == STEPS, (opt.version, STEPS)
    if close:
        opt.close()
    user_habits_after(n, r, float(i))
    unnamed_hash(m)
    faulthandler.cancel_dump_traceback_later()
    ok(f"{scheme}.{'close' if close else 'open'}")


def main() -> None:
    hvd.init()
    schemes = (sys.argv[1] if len(sys.argv) > 1 else "pgc-cr,bcgc,bounded-staleness").split(",")
    i = 0
    for scheme in schemes:
        for close in (True, False):
            run_case(i, scheme, close)
            i += 1
    # the user's last words: an unnamed collective with every optimizer still open or closed
    user_habits_after(hvd.size(), hvd.rank(), 100.0)
    ok("last")


if __name__ == "__main__":
    main()
