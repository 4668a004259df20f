"""The agents' sum allreduce on the CPU: recursive halving, then recursive doubling, point to
point (Rabenseifner's allreduce), in place of gloo's ``all_reduce``.

Why: on a CPU gloo group gloo's ``all_reduce`` costs about 5-6 ms whatever the size below a
few hundred kB (np 4 on this 2-core machine: 16 words 5.6 ms, LeNet-5's d = 61,706 4.7-5.3
ms), a latency that is most of a small model's step (DDP's too: its reducer calls the same
collective). Recursive halving and doubling takes 2 log2(n) exchanges with one partner each,
each a gloo ``isend`` / ``irecv`` pair: 2.7-2.9 ms at those sizes (0.52-0.60x), 0.65-0.68x at
128-256 K words, 0.92-0.95x at 512 K - 1 M and 1.09x at ResNet-18's 11.7 M, where gloo's ring
pipelines its segments (``benchmarks/doors/allreduce_cost.py``, 2026-12-07). So it takes the
sums of at most :data:`MAX_BYTES` (1 MiB: DDP's first bucket, and the size above which the
runtime overlaps the data collective with backward, ``runtime.overlap.Buckets``). Bytes: this
rank sends d/2 + d/4 + ... + d/n in the halving and as many in the doubling, 2 (n - 1)/n * d
words, the ring allreduce's exactly.

Per rank r of n (a power of two), ``k = n/2, n/4, ..., 1``: swap half of the current span with
partner ``r ^ k`` and add the half kept (the lower rank of the pair keeps the lower half); after
log2(n) steps rank r holds the sum of one n-th of the vector; then the same partners in reverse
order swap the spans summed, so every rank ends with every span. Every span's sum is computed
on one rank and copied to the others, so every rank holds the same bits (the runtime's
requirement: every rank applies the same update); the order of the additions differs from
gloo's ring, so results differ from ``all_reduce``'s in the last bits.

Waiting: gloo's point-to-point ``Work`` can be neither polled (``is_completed()`` stays False
until it is waited) nor waited in slices (a ``wait(timeout)`` that times out closes the pair:
"Application timeout caused pair closure"). So :class:`Exchange` blocks in ``wait`` up to the
whole allreduce's deadline (the agent's ``timeout``, set when the allreduce is issued), whatever
slice its caller asks for, and a deadline that passes leaves it not completed, so the caller's
wait (``communicator.wait_for_handle``) reports "no answer" as it does for a collective; a
partner that died fails the exchange at once. Only the agents' data groups use it
(:func:`pgc_hvd.torchdist.world.agent_ops`), whose allreduces are waited by one thread with no
``abort`` and never polled.

May import: the standard library and torch; nothing of the package.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable, Optional

import torch
import torch.distributed as dist

#: gloo tags of the exchanges: TAG + the exchange's index in its allreduce (the pairs' messages
#: are ordered, so one allreduce's tags may repeat in the next)
TAG = 1 << 20
#: floating dtypes summed this way (others keep gloo's ``all_reduce``)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: the largest sum taken, in bytes (module doc: above it gloo's ring is as fast or faster)
MAX_BYTES = 1 << 20


def applies(tensor: torch.Tensor, size: int) -> bool:
    """Whether a sum over ``size`` ranks of ``tensor`` goes this way: a power of two ranks (>= 2),
    a contiguous floating CPU tensor of ``size`` elements to :data:`MAX_BYTES`."""
    return (size >= 2 and size & (size - 1) == 0 and tensor.device.type == "cpu"
            and tensor.dtype in DTYPES and tensor.is_contiguous()
            and size <= tensor.numel() and tensor.numel() * tensor.element_size() <= MAX_BYTES)


class Exchange:
    """One step's send and receive with the partner, waited together up to ``deadline``
    (``time.monotonic()``; module doc)."""

    def __init__(self, works: list, deadline: float):
        self.works, self.deadline = works, deadline
        self.done = self.timed_out = False

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        """Blocks until both complete (True) or the deadline passes (TimeoutError; the exchange
        stays not completed); ``timeout`` is not honoured below the deadline (module doc)."""
        while self.works and not self.timed_out:
            left = self.deadline - time.monotonic()
            if left > 0:
                try:   # whole milliseconds, at least 1: torch reads 0 ms as "no timeout"
                    self.works[0].wait(timedelta(milliseconds=max(1, int(left * 1000))))
                    self.works.pop(0)
                    continue
                except Exception:
                    if time.monotonic() < self.deadline - 0.001:
                        raise      # not the deadline: the partner is gone
            self.timed_out = True
        if self.timed_out:
            raise TimeoutError("no answer from the partner before the allreduce's deadline")
        self.done = True
        return True


def allreduce_sum(tensor: torch.Tensor, group, rank: int, size: int, timeout: float,
                  scratch: Callable[[int], torch.Tensor], then: Callable, stage: Callable):
    """The first step of the in-place sum of ``tensor`` over the ``size`` ranks of ``group``
    (``rank``: this rank's index in it), as a chain of stages: returns ``stage(work, next)``
    (:class:`pgc_hvd.torchdist.ops.Stage`), where ``next()`` returns the next step's stage, or
    ``then()``'s result after the last step. ``timeout``: seconds from now for the whole
    allreduce; ``scratch(k)``: a buffer of at least k elements of the tensor's dtype, for the
    halves received."""
    flat = tensor.view(-1)
    deadline = time.monotonic() + float(timeout)
    spans: list = []      # per halving step: (the span given, the span kept)

    def exchange(send: torch.Tensor, recv: torch.Tensor, peer: int, step: int) -> Exchange:
        return Exchange([dist.isend(send, group=group, group_dst=peer, tag=TAG + step),
                         dist.irecv(recv, group=group, group_src=peer, tag=TAG + step)],
                        deadline)

    def halving(k: int, lo: int, hi: int):
        peer, mid = rank ^ k, lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank < peer else ((mid, hi), (lo, mid))
        got = scratch(keep[1] - keep[0])[: keep[1] - keep[0]]
        work = exchange(flat[give[0]:give[1]], got, peer, len(spans))

        def added():
            flat[keep[0]:keep[1]].add_(got)
            spans.append((give, keep))
            return halving(k // 2, *keep) if k > 1 else doubling(0)
        return stage(work, added)

    def doubling(i: int):
        give, keep = spans[-1 - i]
        work = exchange(flat[keep[0]:keep[1]], flat[give[0]:give[1]], rank ^ (1 << i),
                        len(spans) + i)
        return stage(work, (lambda: doubling(i + 1)) if i + 1 < len(spans) else then)

    return halving(size // 2, 0, flat.numel())
