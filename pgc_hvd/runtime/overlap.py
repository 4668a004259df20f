"""The data collective overlapped with backward: the message leaves bucket by bucket.

Owns the buckets of the flat d-vector (:class:`Buckets`: contiguous ranges in the order a
backward pass fills them, the last parameters first, about ``bucket_cap_mb`` each, the first
one 1 MiB, as DDP's reducer cuts them) and the handoff of one streamed message between the
training thread and the agent (:class:`Stream`: which buckets of the payload the training
thread has formed).

One step, rank r, model version t (docs/architecture.md, "The overlap"):

1. The first gradient hook of the step's backward (:class:`~pgc_hvd.runtime.step.
   GradientCapture`) asks the step whether the message streams (:meth:`~pgc_hvd.runtime.step.
   Step.open_stream`: one partition evaluated by one backward, dense fp32 rows, no habit seen
   at the first step that needs the whole message at ``step()``). If so the message of step t
   is submitted at once, its payload still empty: its control row says "ready" and the
   decision runs while backward computes.
2. Each hook copies ``p.grad`` into the partition's ring slot; when the last parameter of bucket
   k has its gradient, the training thread forms bucket k of the message (the slots' slices with
   the plan's coefficients) and marks it (:meth:`Stream.mark`).
3. The agent, once the step is decided, sums the contributions bucket by bucket (one allreduce
   each, in bucket order, the same on every rank): a chosen rank waits for its bucket k
   (:meth:`Stream.wait`) and adds a_r times it; every other rank adds zeros at once. Buckets
   leave while later ones are still being computed.
4. ``step()`` marks the buckets no hook completed (parameters with no gradient: zeros), and
   waits for the update as before.

The decoded update is the scheme's, unchanged (same messages, same coefficients); what moves
earlier is the moment a rank says it is ready (the start of its backward instead of
``step()``), so a rank slow before its backward (data, forward, a straggler's sleep) is left
out as before, while a chosen rank slow inside its backward delays the step (as under DDP).

Runs on both threads: :class:`Buckets` is read-only after construction; :class:`Stream` is the
one object both threads touch (its condition variable). May import: ``flat_layout``,
``runtime.errors`` and torch.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

import torch

from pgc_hvd.runtime.errors import AgentError

#: DDP's reducer: buckets of at most 25 MiB, the first one (filled first) 1 MiB
DEFAULT_BUCKET_CAP_MB = 25.0
FIRST_BUCKET_CAP_MB = 1.0


class Buckets:
    """Contiguous ranges ``ranges[k] = (lo, hi)`` of a :class:`~pgc_hvd.flat_layout.FlatLayout`
    covering all d entries, in allreduce order: the parameters in reverse layout order (the
    order backward produces their gradients), cut when a bucket reaches ``cap_mb`` MiB of fp32
    (the first at ``min(cap_mb, 1)``). ``of_param[id(p)]`` is p's bucket, ``counts[k]`` how many
    parameters bucket k holds. A function of the layout and ``cap_mb`` only, so every rank cuts
    the same buckets."""

    def __init__(self, layout, cap_mb: float = DEFAULT_BUCKET_CAP_MB):
        cap_mb = float(cap_mb)
        if not cap_mb > 0:
            raise ValueError(f"bucket_cap_mb={cap_mb!r}: give a positive size in MiB "
                             f"(DDP's default {DEFAULT_BUCKET_CAP_MB:g})")
        self.cap_mb = cap_mb
        self.d = int(layout.numel)
        self.ranges: list[tuple[int, int]] = []
        self.counts: list[int] = []
        self.of_param: dict[int, int] = {}
        limit = int(min(cap_mb, FIRST_BUCKET_CAP_MB) * 2 ** 20) // 4
        hi = self.d
        lo, count = hi, 0
        for p in reversed(layout.params):
            off, k = layout.offsets[id(p)]
            if count and (hi - off) > limit:     # p would overflow the open bucket: close it
                self.ranges.append((lo, hi))
                self.counts.append(count)
                hi, count = lo, 0
                limit = int(cap_mb * 2 ** 20) // 4
            lo = off
            count += 1
            self.of_param[id(p)] = len(self.ranges)
        self.ranges.append((lo, hi))
        self.counts.append(count)

    def __len__(self) -> int:
        return len(self.ranges)


class Stream:
    """Which buckets of one message the training thread has formed (module doc). The training
    thread calls :meth:`mark` (and :meth:`close` if it gives up); the agent calls :meth:`wait`
    before it reads bucket k of the payload."""

    def __init__(self, nbuckets: int):
        self.ready = [False] * int(nbuckets)
        self.closed = False
        self._cond = threading.Condition()

    def mark(self, k: int) -> None:
        with self._cond:
            self.ready[k] = True
            self._cond.notify_all()

    def close(self) -> None:
        """The training thread will form no more buckets (it failed): waiters stop."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    @property
    def complete(self) -> bool:
        return all(self.ready)

    def wait(self, k: int, timeout: float, *, rank: int, step: int,
             stop: Optional[Callable[[], bool]] = None) -> None:
        """Block until bucket ``k`` is formed; :class:`AgentError` if the training thread closed
        the stream, ``stop()`` turns true, or ``timeout`` seconds pass."""
        deadline = time.monotonic() + float(timeout)
        with self._cond:
            while not self.ready[k]:
                if self.closed or (stop is not None and stop()):
                    raise AgentError(f"rank {rank}: its training thread stopped during the "
                                     f"backward of step {step} (bucket {k} of its message "
                                     f"never formed)")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentError(
                        f"rank {rank}: step {step} was decided with this rank's message, but "
                        f"its training thread formed no bucket {k} of it within {timeout:.0f}s "
                        f"(a backward that never ended, or optimizer.step() never called after "
                        f"it)")
                self._cond.wait(min(left, 0.5))

