"""The agents' sum allreduce on the CPU: a reduce-scatter and an allgather by direct
point-to-point exchanges, in place of gloo's ``all_reduce``.

Why: on a CPU gloo group gloo's ``all_reduce`` costs about 5 ms whatever the size below a few
hundred kB at np 4 on this 2-core machine (16 words to LeNet-5's d = 61,706: 5.0-5.8 ms), a
latency that is most of a small model's step (DDP's too: its reducer calls the same
collective), and 2.5-3.7 ms at np 3. Here the vector is cut into n spans, span j owned by rank
j: each rank sends every other rank that rank's span and adds the n - 1 spans it receives into
its own (the reduce-scatter), then sends its summed span to every other rank (the allgather):
two rounds of exchanges with every other rank at once. Through the agents' ops
(``benchmarks/doors/allreduce_cost.py``, 2026-12-07, session 27): at np 4 0.42-0.51x gloo's
time up to LeNet-5's size and 0.57-0.62x at 256 K words (recursive halving and doubling, this
module's first form, with 2 log2(n) rounds of one partner each and powers of two only:
0.45-0.51x and 0.65-0.67x); at np 3 0.50-0.69x up to LeNet-5's size and 0.66-0.78x at 256 K;
about 1x at 1 M words. At 2 ranks gloo's own exchange is faster (0.8-1.0 ms against 1.1-1.4
ms), so it keeps it (:data:`MIN_RANKS`). So this takes the sums of at most :data:`MAX_BYTES`
(1 MiB: DDP's first bucket, and the size above which the runtime overlaps the data collective
with backward, ``runtime.overlap.Buckets``) over :data:`MIN_RANKS` to :data:`MAX_RANKS` ranks.
Bytes: this rank sends (n - 1)/n d words in each round, 2 (n - 1)/n d in all, the ring
allreduce's exactly.

Every span's sum is computed on its owner (the n - 1 received spans added in rank order) and
copied to the others, so every rank holds the same bits (the runtime's requirement: every rank
applies the same update); the order of the additions differs from gloo's ring, so results
differ from ``all_reduce``'s in the last bits.

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

#: gloo tags of the exchanges: TAG for the reduce-scatter's, TAG + 1 for the allgather's (the
#: pairs' messages are ordered, so one allreduce's tags may repeat in the next)
TAG = 1 << 20
#: floating dtypes summed this way (others keep gloo's ``all_reduce``)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: the largest sum taken, in bytes (module doc: above it gloo's ring is as fast or faster)
MAX_BYTES = 1 << 20
#: the fewest ranks taken: at 2 gloo's own exchange is faster (module doc)
MIN_RANKS = 3
#: the most ranks taken: each round sends n - 1 messages, a latency that grows with n (measured
#: at 3 and 4 ranks; gloo's ring above)
MAX_RANKS = 8


def applies(tensor: torch.Tensor, size: int) -> bool:
    """Whether a sum over ``size`` ranks of ``tensor`` goes this way: :data:`MIN_RANKS` to
    :data:`MAX_RANKS` ranks, a contiguous floating CPU tensor of ``size`` elements to
    :data:`MAX_BYTES`."""
    return (MIN_RANKS <= size <= MAX_RANKS and tensor.device.type == "cpu"
            and tensor.dtype in DTYPES and tensor.is_contiguous()
            and size <= tensor.numel() and tensor.numel() * tensor.element_size() <= MAX_BYTES)


class Exchange:
    """One round's sends and receives, waited in turn up to ``deadline``
    (``time.monotonic()``; module doc)."""

    def __init__(self, works: list, deadline: float):
        self.works, self.deadline = works, deadline
        self.done = self.timed_out = False

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        """Blocks until all complete (True) or the deadline passes (TimeoutError; the exchange
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
                        raise      # not the deadline: a partner is gone
            self.timed_out = True
        if self.timed_out:
            raise TimeoutError("no answer from a partner before the allreduce's deadline")
        self.done = True
        return True


def allreduce_sum(tensor: torch.Tensor, group, rank: int, size: int, timeout: float,
                  scratch: Callable[[int], torch.Tensor], then: Callable, stage: Callable):
    """The first round of the in-place sum of ``tensor`` over the ``size`` ranks of ``group``
    (``rank``: this rank's index in it), as a chain of stages: returns ``stage(work, next)``
    (:class:`pgc_hvd.torchdist.ops.Stage`), where ``next()`` returns the allgather's stage,
    whose ``next`` is ``then``. ``timeout``: seconds from now for the whole allreduce;
    ``scratch(k)``: a buffer of at least k elements of the tensor's dtype, for the spans
    received."""
    flat = tensor.view(-1)
    deadline = time.monotonic() + float(timeout)
    cut = [flat.numel() * j // size for j in range(size + 1)]
    span = [flat[cut[j]:cut[j + 1]] for j in range(size)]
    mine = span[rank]
    others = [j for j in range(size) if j != rank]
    got = scratch((size - 1) * mine.numel())[: (size - 1) * mine.numel()].view(size - 1, -1)

    def exchange(sends: list, recvs: list, tag: int) -> Exchange:
        works = []
        for j, out, into in zip(others, sends, recvs):
            works.append(dist.isend(out, group=group, group_dst=j, tag=tag))
            works.append(dist.irecv(into, group=group, group_src=j, tag=tag))
        return Exchange(works, deadline)

    def summed():
        for row in got:          # the others' contributions in rank order: the same bits
            mine.add_(row)
        return stage(exchange([mine] * (size - 1), [span[j] for j in others], TAG + 1), then)

    return stage(exchange([span[j] for j in others], list(got), TAG), summed)
