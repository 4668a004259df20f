"""The data collective overlapped with backward: the message leaves bucket by bucket.

Owns the buckets of the flat d-vector (:class:`Buckets`: contiguous ranges in the order a
backward pass fills them, the last parameters first, about ``bucket_cap_mb`` each, the first
one 1 MiB, as DDP's reducer cuts them). The handoff of one streamed message between the
training thread and the agent is the data plane's (:class:`~pgc_hvd.runtime.communicator.
Stream`: which buckets of the payload the training thread has formed); the hook's side is the
capture's, the message's the step's. This module is read at construction only (no function of
it runs during a step: the path of one step stays as short).

One step, rank r, model version t (docs/architecture.md, "The overlap"):

1. The first gradient hook of the step's backward (:class:`~pgc_hvd.runtime.capture.
   GradientCapture`) asks the step whether the message streams (:meth:`~pgc_hvd.runtime.step.
   Step.open_stream`: one partition evaluated by one backward, dense fp32 rows, no habit seen
   at the first step that needs the whole message at ``step()``: a GradScaler, clipping
   ``p.grad``). If so the message of step t
   is submitted at once, its payload still empty: its control row says "ready" and the
   decision runs while backward computes.
2. Each hook copies ``p.grad`` into the partition's ring slot; when the last parameter of bucket
   k has its gradient, the training thread forms bucket k of the message (the slots' slices with
   the plan's coefficients) and marks it (``Stream.mark``).
3. The agent, once the step is decided, sums the contributions bucket by bucket (one allreduce
   each, in bucket order, the same on every rank): a chosen rank waits for its bucket k
   (``Stream.wait``) and adds a_r times it; every other rank adds zeros at once. Buckets
   leave while later ones are still being computed.
4. ``step()`` marks the buckets no hook completed (parameters with no gradient: zeros), and
   waits for the update as before.

The decoded update is the scheme's, unchanged (same messages, same coefficients); what moves
earlier is the moment a rank says it is ready (the start of its backward instead of
``step()``), so a rank slow before its backward (data, forward, a straggler's sleep) is left
out as before, while a chosen rank slow inside its backward delays the step (as under DDP).

A loss or metrics handed to ``step()`` of a streamed step ride with the rank's next message
(the control row of a message that left at the start of its backward cannot carry them), so a
decided step's ``loss`` and user metrics are those of the used ranks' previous batches.

Threads: :class:`Buckets` is built on the training thread at construction and read-only after
(both threads read it).
May import: torch (the layout is passed in).
"""

from __future__ import annotations

from typing import Optional


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

    @classmethod
    def worth_it(cls, layout, cap_mb: float = DEFAULT_BUCKET_CAP_MB) -> "Optional[Buckets]":
        """The buckets of ``layout``, or None when they are one bucket: a gradient that fits
        DDP's first bucket (d <= 262,144 fp32 at the default caps, LeNet size) has nothing to
        overlap, and declaring its message ready earlier measured no gain on 2 CPU cores (a
        step 0.084 s against 0.075 s without, docs/benchmarks.md "The overlap")."""
        b = cls(layout, cap_mb)
        return b if len(b.ranges) > 1 else None
