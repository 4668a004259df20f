"""The simulated workers: what each holds, and the coded message it forms.

Owns :class:`Worker` (its ring of gradient evaluations, the model versions it has received and
computed, its running :class:`Job`, its compute intervals and, under the collective model, its
outbox) and the worker's side of a message: the ring slots' rows summed with the plan's
coefficients and compressed by its :class:`~pgc_hvd.compress.encoder.MessageEncoder` (the
runtime's encoder, which owns the error-feedback residual), so the simulator has no message code
of its own. :class:`WorkerSteps`, a base class of the engine's
:class:`~pgc_hvd.sim.engine.Simulator` (here since issue 46): when a worker starts a step (the
plan of the newest version it holds, its compute time: partitions, delay and, under the
collective model, the updates it applies and the message's forming), finishes it (its ring
filled, its message sent or handed to its agent) and receives a new model (``"cancel"``
abandons the running step); it runs on the simulator's own members (``self``: the clock's
events, the delay model, the agents).

May import: ``compress``, ``schemes`` (layers 0-2), ``sim.comm``; never the engine or the
runtime.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from pgc_hvd.compress.encoder import MessageEncoder
from pgc_hvd.schemes import Arrival, Ring

from .comm import message_bytes


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


class WorkerSteps:
    """The events of a worker's step, as a base class of :class:`~pgc_hvd.sim.engine.Simulator`
    (module doc); not built alone."""

    def _start(self, w: Worker, t: float) -> None:
        v = w.latest
        plan = w.ring.plan(v)       # with any slot never filled (e.g. warm-up cancelled)
        evaluate = plan.evaluate
        G = self.grads_at(v)
        delay = float(self.delay.sample(w.id, v))
        self.delays_seen.append(delay)
        dur = len(evaluate) * self.partition_time + delay
        if self.collective:  # the worker's local passes over d (module doc)
            dur += (v - w.applied) * self.agents.apply_seconds + self._form_seconds(
                len(plan.combine))
            w.applied = v
        self._job_id += 1
        # ring entries are (G, partition) pairs: the row G[partition] is read when a message is
        # formed (no per-slot tensor views on the hot path)
        w.job = Job(self._job_id, v, t, t + dur, (G, evaluate), plan, delay)
        w.done_version = v
        self.total_evals += len(evaluate)
        self._push(t + dur, "done", w.id, self._job_id)

    def _form_seconds(self, slots: int) -> float:
        """Coded accumulation of ``slots`` ring slots, finiteness check, copy to the send
        buffer (module doc)."""
        return self.comm.local((slots + 1) * self.model_bytes + 1.25 * self.model_bytes
                               + 2 * self.model_bytes)

    def _finish(self, w: Worker, t: float) -> None:
        job = w.job
        w.job = None
        w.intervals.append((job.start, job.end))
        G, evaluate = job.evaluate
        if self.cfg.auto is not None:
            self.cfg.auto.observe(w.id, job.end - job.start, len(evaluate))
            if job.step < self.plan_start:     # computed for a plan re-planned since: dropped
                if w.latest > w.done_version:
                    self._start(w, t)
                return
        for p, slot in evaluate:
            w.ring.fill(slot, job.step, (G, p))
        plan = job.plan
        payload, dense, err = self._message(w, plan)
        nbytes = self._message_bytes(payload) + (8 if err is not None else 0)
        versions = w.ring.message_versions(plan)
        arrival = Arrival(w.id, job.step, job.step, None, err, versions)
        if self.collective:
            self.agents.ready(w.id, {"arrival": arrival, "payload": payload, "dense": dense,
                                     "bytes": nbytes, "ready": t, "sent": False}, t)
        else:
            self.total_bytes += nbytes
            send = t
            if self.comm.serial_ingress:
                send = max(t, self.ingress_free)
                self.ingress_free = send + self.comm.cost(nbytes)
            self._push(send + self.comm.cost(nbytes), "arrive", arrival, payload, dense, nbytes)
        if w.latest > w.done_version:
            self._start(w, t)

    def _message_bytes(self, payload) -> int:
        return message_bytes(payload)

    def _message(self, w: Worker, plan):
        """The worker's coded message: (payload, dense message, compression error or None)
        (:meth:`.workers.Worker.message`, the runtime's :class:`MessageEncoder`)."""
        return w.message(plan)

    def _on_model(self, t: float, wid: int, v: int) -> None:
        w = self.workers[wid]
        if v <= w.latest:
            return
        w.latest = v
        if w.job is None:
            self._start(w, t)
        elif self.cfg.straggler_policy == "cancel":
            job = w.job
            w.intervals.append((job.start, t))
            w.job = None
            self._start(w, t)
