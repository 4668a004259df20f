"""The simulated workers: what each holds, and the coded message it forms.

Owns :class:`Worker` (its ring of gradient evaluations, the model versions it has received and
computed, its running :class:`Job`, its compute intervals and, under the collective model, its
outbox) and the worker's side of a message: the ring slots' rows summed with the plan's
coefficients and compressed by its :class:`~pgc_hvd.compress.encoder.MessageEncoder` (the
runtime's encoder, which owns the error-feedback residual), so the simulator has no message code
of its own. When a worker starts and finishes a step (virtual time) is the engine's
(:mod:`pgc_hvd.sim.engine`).

May import: ``compress``, ``schemes`` (layers 0-2); never the engine or the runtime.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from pgc_hvd.compress.encoder import MessageEncoder
from pgc_hvd.schemes import Ring


@dataclasses.dataclass
class Job:
    """One step a worker is computing: model version ``step``, [start, end] in virtual time."""

    id: int
    step: int
    start: float
    end: float
    evaluate: Any           # (G, ((partition, slot), ...)): rows of G go into the slots
    plan: Any
    delay: float


class Worker:
    """Worker ``wid``: its ring (slots hold (G, partition): row G[partition] of version v) and
    its message encoder."""

    def __init__(self, wid: int, ring: Ring, encoder: Optional[MessageEncoder] = None):
        self.id = wid
        self.ring = ring
        self.encoder = encoder
        self.job: Optional[Job] = None
        self.latest: int = -1        # newest model version received
        self.done_version: int = -1  # newest version it has computed a step for
        self.applied: int = 0        # model version it holds (collective model: updates applied)
        self.intervals: list = []    # (start, end) of compute since the last fire
        self.outbox: list = []       # collective model: messages not announced yet, oldest first

    def slot_rows(self, slots) -> list:
        """The ring slots' gradient rows; rows from one version are gathered in one pass."""
        entries = [self.ring.slots[slot] for slot in slots]
        G0 = entries[0][0]
        if len(entries) > 2 and all(e[0] is G0 for e in entries):
            idx = torch.tensor([e[1] for e in entries], dtype=torch.long)
            return list(G0.index_select(0, idx).unbind(0))
        return [G[p] for G, p in entries]

    def message(self, plan) -> tuple:
        """``(payload, dense message, ||C(u) - u|| or None)`` of ``plan``: the coded sum of its
        ring slots (:meth:`MessageEncoder.form`) and its compression
        (:meth:`MessageEncoder.compress`)."""
        form = self.ring.form(plan)
        slots = self.slot_rows(form.slots)
        coefs = form.float_coefs if not form.complex and slots[0].dtype == torch.float32 \
            else form.coefs
        dense = self.encoder.form(slots, coefs)
        payload, err = self.encoder.compress(dense)
        return payload, dense, err
