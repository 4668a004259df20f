"""The worker side of a scheme: one worker's ring of gradient slots, as every engine keeps it.

Worker j keeps L_j = ``plan.ring_size`` slots; slot l holds the newest evaluation of partition
``plan.slot_partitions[l]`` and the model version v_l it was evaluated at (-1: never). At step t
the worker evaluates the pairs of :meth:`Ring.plan` into their slots (:meth:`Ring.fill`) and
sends the coded message

    m_j^(t) = sum_{(l, b_l) in plan.combine} b_l * slot_l,

whose entries have ages t - v_l (:meth:`Ring.message_versions`, ``Arrival.slot_versions``).

Unfilled-slot rule: a slot the message needs but that was never filled (a warm-up step that was
cancelled, a ring emptied by :meth:`Ring.reset`) is evaluated at the current step together with
the plan's own pairs, so a message never sums an empty slot.

Plans are cached by :meth:`~pgc_hvd.schemes.protocol.Scheme.plan_key` (the scheme says which
steps share a plan; no engine re-derives its rotation rule), and so are the message's
coefficients (:class:`MessageForm`: real, as python floats for the kernels, or complex).

The simulator stores what it likes in :attr:`Ring.slots` (a gradient row), the scheme tests
store vectors, the Horovod runtime keeps its own flat buffers and uses the ring for versions
and plans only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .protocol import Scheme, WorkPlan


@dataclass(frozen=True)
class MessageForm:
    """How the coded message is formed from the ring: ``sum(coefs[i] * ring[slots[i]])``.

    ``complex``: some coefficient is complex (RS); ``float_coefs``: the coefficients as python
    floats when none is (what the compiled kernels take), else None."""

    slots: tuple[int, ...]
    coefs: tuple[Any, ...]
    complex: bool
    float_coefs: Optional[tuple[float, ...]]

    @classmethod
    def of(cls, plan: WorkPlan) -> "MessageForm":
        coefs = tuple(c for _, c in plan.combine)
        cplx = any(isinstance(c, complex) for c in coefs)
        return cls(tuple(slot for slot, _ in plan.combine), coefs, cplx,
                   None if cplx else tuple(float(c) for c in coefs))


class Ring:
    """Worker ``worker``'s ring for ``scheme`` (module doc): :attr:`slots`, :attr:`versions`,
    :attr:`size`, whether its message is :attr:`complex`."""

    def __init__(self, scheme: Scheme, worker: int):
        self.scheme = scheme
        self.worker = int(worker)
        plan0 = scheme.work_plan(self.worker, 0)
        self.size = plan0.ring_size
        self.complex = MessageForm.of(plan0).complex
        self.slots: list = [None] * self.size
        self.versions: list[int] = [-1] * self.size
        self.unfilled = self.size           # slots never filled (version -1)
        self._plans: dict = {}
        self._forms: dict = {}

    def plan(self, step: int) -> WorkPlan:
        """The scheme's work plan for this worker at ``step``, with every unfilled slot the
        message needs added to ``evaluate`` (module doc)."""
        key = self.scheme.plan_key(self.worker, step)
        hit = self._plans.get(key)
        if hit is None:
            p = self.scheme.work_plan(self.worker, step)
            hit = (p.evaluate, p.combine, p.slot_partitions)
            self._plans[key] = hit
        evaluate, combine, slot_partitions = hit
        if self.unfilled:
            done = {slot for _, slot in evaluate}
            extra = []
            for slot, _ in combine:
                if self.versions[slot] < 0 and slot not in done:
                    extra.append((slot_partitions[slot], slot))
                    done.add(slot)
            if extra:
                evaluate = evaluate + tuple(extra)
        return WorkPlan(self.worker, int(step), evaluate, combine, slot_partitions)

    def form(self, plan: WorkPlan) -> MessageForm:
        """The coefficients of ``plan``'s message (cached)."""
        form = self._forms.get(plan.combine)
        if form is None:
            form = self._forms[plan.combine] = MessageForm.of(plan)
        return form

    def fill(self, slot: int, version: int, value: Any = None) -> None:
        """Slot ``slot`` now holds an evaluation at model ``version`` (``value``: its content,
        for engines that keep it here)."""
        if self.versions[slot] < 0:
            self.unfilled -= 1
        self.versions[slot] = int(version)
        self.slots[slot] = value

    def message_versions(self, plan: WorkPlan) -> tuple[int, ...]:
        """Model versions of the slots ``plan``'s message sums (``Arrival.slot_versions``)."""
        return tuple(self.versions[slot] for slot, _ in plan.combine)

    def reset(self) -> None:
        """Empty every slot: each is evaluated afresh at its first use."""
        self.restore([-1] * self.size)
        self.slots = [None] * self.size

    def restore(self, versions) -> None:
        """Set the slot versions (a restored checkpoint's)."""
        versions = [int(v) for v in versions]
        if len(versions) != self.size:
            raise ValueError(f"{len(versions)} slot versions for a ring of {self.size} slots")
        self.versions = versions
        self.unfilled = sum(1 for v in versions if v < 0)
