"""Runs on every rank (horovodrun or torchrun, ``pgc_hvd.engine()`` picks the engine): the data
collective overlapped with backward (``overlap=True``, the default; pgc_hvd.runtime.overlap).

    python overlap_checks.py [STEPS]

1. pgc-cr, s = 1, buckets of ~40 floats (``bucket_cap_mb``: several buckets for the small
   model), the last rank slowed by the straggler delays (slept before its message is declared
   ready), the loop passing its loss to ``step()``: from the second step on every computing
   rank's message streams (left during the backward), every decided step moved its sum in
   bucket allreduces (the records' ``buckets``), the loss the records report comes one step
   late and is finite, every rank ends at the same version with identical parameters
   (cross-rank hash), and the run learns;
2. the same loop with ``overlap=False``: nothing streams, one allreduce per step
   (``buckets`` None), identical parameters.

Checks print "CHECK <name> ok rank=<r>".
"""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F

import pgc_hvd

hvd = pgc_hvd.engine()
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from consistency_fault_checks import data, model, same_on_all_ranks, same_version_on_all_ranks  # noqa: E402
from checks import ok  # noqa: E402


def run(n: int, steps: int, overlap: bool):
    m = model()
    loader = data(n)
    records = []
    opt = pgc_hvd.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9),
        named_parameters=m.named_parameters(), scheme="pgc-cr", stragglers=1,
        overlap=overlap, bucket_cap_mb=40 * 4 / 2 ** 20,
        delay=f"slow:worker={n - 1},delay=0.03", timeout=60, name=f"ovl{int(overlap)}",
        on_record=records.append if hvd.rank() == 0 else None)
    losses = []
    while opt.version < steps:
        for xb, yb in opt.batches(loader):
            loss = F.cross_entropy(m(xb), yb)
            loss.backward()
        losses.append(float(loss))
        opt.step(loss=float(loss))
    same_version_on_all_ranks(opt, f"ovl{int(overlap)}")
    streamed = opt.current_step.streamed_steps
    computed = steps - opt.catch_up_steps
    opt.close()
    same_on_all_ranks(m, f"ovl{int(overlap)}")
    return streamed, computed, records, losses


def main() -> None:
    if not hvd.is_initialized():
        hvd.init()
    n = hvd.size()
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    streamed, computed, records, losses = run(n, steps, True)
    # every step this rank computed streamed but the first (the slowed rank catches up on
    # some: decided without it, it computes nothing there)
    assert streamed == computed - 1 and computed >= (2 if hvd.rank() == n - 1 else steps - 3), \
        (streamed, computed)
    if hvd.rank() == 0:
        assert all(r.extra.get("buckets") and r.extra["buckets"] >= 2 for r in records), \
            [r.extra.get("buckets") for r in records]
        late = [r.loss for r in records[2:]]
        assert late and all(x is not None and math.isfinite(x) for x in late), late
    assert sum(losses[-5:]) < sum(losses[:5]), losses
    ok("overlap_streams_buckets_identical_parameters")
    streamed, _, records, _ = run(n, 8, False)
    assert streamed == 0, streamed
    if hvd.rank() == 0:
        assert all(r.extra.get("buckets") is None for r in records), records[:2]
    ok("overlap_off_one_collective_identical_parameters")


if __name__ == "__main__":
    main()
