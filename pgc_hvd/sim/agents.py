"""The Horovod runtime's communication agents, modelled in virtual time (the collective model).

Owns :class:`AgentModel`: the state of every rank's agent thread under a
:class:`~pgc_hvd.sim.comm.CollectiveModel` -- the outboxes announced, the open control round
(idle / collective / data / dormant), the payloads every rank has cached, the bytes each rank
received since the last update -- and the events that drive it (``ctl_deadline``, ``ctl_end``):
control rounds, the decision taken from their rows in (ready time, rank) order, and the data
phase's cost under the runtime's own transport rule (:func:`pgc_hvd.compress.choose_collective`).
What a step costs is described in :mod:`pgc_hvd.sim.engine` ("Collective model").

The simulator's workers hand it their ready messages (:meth:`AgentModel.ready`) and its event
loop hands it the agents' events (:meth:`AgentModel.on_event`); it pushes its own events through
the ``push`` callable it is given and never calls into the simulator.

May import: ``compress``, ``schemes`` (layers 0-2) and :mod:`pgc_hvd.sim.comm`; never the engine.
"""

from __future__ import annotations

import math
import time as _time
from typing import Callable

import numpy as np

from pgc_hvd.compress.codecs import allreduce_bytes, choose_collective

from .comm import CollectiveModel

# control row of the runtime's agent: CTRL_FIXED = 11 float64 fields + one per ring slot
CTRL_FIXED = 11


class AgentModel:
    """Every rank's agent of one simulated run (module doc). ``workers``: the simulator's
    workers (their ``outbox`` lists); ``store``, ``arrival_log``: the simulator's, written when
    a row is offered to the round; ``push(t, kind, *payload)``: schedules an event."""

    def __init__(self, comm: CollectiveModel, scheme, workers: list, store: dict,
                 arrival_log: list, push: Callable, *, d: int, element_size: int,
                 sparse: bool):
        self.comm, self.scheme, self.workers = comm, scheme, workers
        self.store, self.arrival_log, self.push = store, arrival_log, push
        self.n = scheme.n
        self.d = int(d)
        self.element_size = int(element_size)
        self.model_bytes = self.d * self.element_size
        self.sparse = bool(sparse)
        cm = comm
        self._row_bytes = 8 * (CTRL_FIXED + self.scheme.lookback)
        self._late_usable = self.scheme.late_usable
        #: seconds a worker takes to apply one update (SGD: 12 d bytes, module doc of the engine)
        self.apply_seconds = cm.local(3 * self.model_bytes)
        self._cached: set = set()          # (worker, step) whose payload every rank holds
        self._phase = "idle"               # idle | collective | data | dormant
        self._submitted: dict = {}         # rank -> (entry or None, payload bytes) this round;
                                           # a rank not in it at the round's start shows nothing
        self._outbox_ranks: set = set()    # ranks with a message not announced yet
        self._woke: set = set()            # ranks whose next wait is skipped
        self._round_id = 0
        self._last_end = 0.0               # end of the last collective
        self._wait = cm.poll_interval
        self._dormant = None               # (end, wait, round cost) while rounds are empty
        self._rounds = 0
        self._rounds_at_last_fire = 0
        self._data_seconds = 0.0
        self._empty_round = cm.allgather(self.n, [self._row_bytes] * self.n)
        self._recv = np.zeros(self.n)      # bytes each rank received since the last update
        #: bytes moved by every collective so far (received by all ranks together)
        self.total_bytes = 0
        #: the step whose round is open, the round, and the CPU seconds its decision took
        self.step = 0
        self.round = None
        self.decide_seconds = 0.0

    # -- what the simulator calls -------------------------------------------------------------
    def begin(self) -> None:
        """Open round 0: every agent's loop begins with a control round."""
        self.step = 0
        self.round = self.scheme.open_round(0)
        self.decide_seconds = 0.0
        self._start_round(0.0)

    def ready(self, wid: int, entry: dict, t: float) -> None:
        """Rank ``wid``'s message (an ``entry`` of the store) sits in its outbox from time t."""
        self.workers[wid].outbox.append(entry)
        self._outbox_ranks.add(wid)
        self.event(wid, t)

    def on_event(self, t: float, kind: str, payload: tuple) -> None:
        """An agent's event: the others' wait ends (``ctl_deadline``) or a control round ends
        (``ctl_end``: its rows are offered; a decision schedules ``data_end``)."""
        if kind == "ctl_deadline":
            if payload[0] == self._round_id and self._phase == "idle":
                self._deadline(t)
            return
        rid, rows = payload
        if rid != self._round_id:
            return
        rnd = self.round
        self._last_end = t
        decision = self._control_end(t, rows, rnd)
        if decision is None:
            self._enter_idle(t, self.comm.poll_interval / 4 if rnd.arrived
                             else self.comm.poll_interval)
        else:
            self._phase = "data"
            self._data_seconds = self._data_phase(decision)
            self._round_id += 1
            self.push(t + self._data_seconds, "data_end", self._round_id, decision)

    def fired(self) -> tuple[int, dict]:
        """The step's update is every rank's: (bytes received by the rank receiving most,
        the record's ``control_rounds`` and ``data_seconds``); the next step is counted."""
        step_bytes = int(self._recv.max())
        self._recv[:] = 0.0
        extra = {"control_rounds": self._rounds - self._rounds_at_last_fire,
                 "data_seconds": self._data_seconds}
        self._rounds_at_last_fire = self._rounds
        self.decide_seconds = 0.0
        self.step += 1
        return step_bytes, extra

    def next_round(self, t: float) -> None:
        """The agent's loop goes straight to the next control round: every rank submits now."""
        self.round = self.scheme.open_round(self.step)
        self._woke.clear()
        self._submitted = {}
        for wid in self._outbox_ranks:
            self._submit(wid)
        self._start_round(t)

    # -- the agents' protocol ---------------------------------------------------------------
    def form_seconds(self, slots: int) -> float:
        """Coded accumulation of ``slots`` ring slots, finiteness check, copy to the send
        buffer (module doc)."""
        return self.comm.local((slots + 1) * self.model_bytes + 1.25 * self.model_bytes
                               + 2 * self.model_bytes)

    def _rides(self, entry) -> bool:
        """Does this message's payload ride with its control row (one-collective steps)? Old
        plane: always. New plane: while the n copies a rank receives, n * bytes, are at most
        ``optimistic_below`` (the runtime's rule, ``compress.codecs.optimistic_default``)."""
        cm = self.comm
        return cm.plane == "allgather" or (cm.plane == "allreduce"
                                           and self.n * entry["bytes"] <= cm.optimistic_below)

    def event(self, wid: int, t: float) -> None:
        """A local event on rank ``wid`` (its message became ready) at time t."""
        if self._phase == "dormant":
            self._wake_from_dormant(t)
        if self._phase == "idle" and wid not in self._submitted:
            self._submit(wid)
            if len(self._submitted) == self.n:
                self._start_round(t)
        else:
            self._woke.add(wid)

    def _wake_from_dormant(self, t: float) -> None:
        """Rounds of empty rows ran every ``wait + cost`` since ``end``: find where t falls."""
        end, wait, cost = self._dormant
        self._dormant = None
        period = wait + cost
        k = max(0, int(math.floor((t - end - wait) / period))) if t > end + wait else -1
        if k < 0:               # still in the first wait
            self._enter_idle(end, wait)
            return
        start = end + wait + k * period   # start of the k-th empty round after `end`
        if t > start + period:            # rounding
            k += 1
            start += period
        self._rounds += k + 1
        each = (self.n - 1) * self._row_bytes * (k + 1)
        self._recv += each
        self.total_bytes += int(each)
        if t <= start + cost:             # inside the (k+1)-th empty round: it ends at start+cost
            self._phase = "collective"
            self._round_id += 1
            self.push(start + cost, "ctl_end", self._round_id, {})
        else:                             # in the wait after it
            self._enter_idle(start + cost, wait)

    def _submit(self, wid: int) -> None:
        w = self.workers[wid]
        entry, pbytes = None, 0
        if w.outbox:
            entry = w.outbox[0]
            if (not entry["sent"] and self._rides(entry)
                    and (entry["arrival"].step >= self.step or self._late_usable)):
                entry["sent"] = True
                pbytes = entry["bytes"]
        self._submitted[wid] = (entry, pbytes)

    def _start_round(self, t: float) -> None:
        sizes = [self._row_bytes] * self.n
        for wid, (_, pbytes) in self._submitted.items():
            sizes[wid] += pbytes
        cost = self.comm.allgather(self.n, sizes)
        self._received(allgather=sizes)
        self._phase = "collective"
        self._round_id += 1
        self._rounds += 1
        self.push(t + cost, "ctl_end", self._round_id, self._submitted)
        self._submitted = {}

    def _received(self, allgather=None, each: float = 0.0) -> None:
        """Count the bytes every rank receives in a collective: an allgather of ``sizes`` (each
        rank receives all but its own), or ``each`` bytes per rank (allreduce)."""
        if allgather is not None:
            total = sum(allgather)
            self._recv += total - np.asarray(allgather, dtype=float)
            self.total_bytes += int(total - min(allgather))
        else:
            self._recv += each
            self.total_bytes += int(each)

    def _enter_idle(self, end: float, wait: float) -> None:
        """After a collective that did not fire: ranks wait ``wait`` (or not, if woken)."""
        self._phase = "idle"
        self._last_end = end
        self._wait = wait
        self._round_id += 1
        self._submitted = {}
        for wid in sorted(self._woke):
            self._submit(wid)
        self._woke.clear()
        if len(self._submitted) == self.n:
            self._start_round(end)
            return
        if not self._submitted and not self._outbox_ranks:
            self._phase = "dormant"
            self._dormant = (end, wait, self._empty_round)
            return
        self.push(end + wait, "ctl_deadline", self._round_id)

    def _deadline(self, t: float) -> None:
        """The others' wait ends: every rank has submitted (ranks with nothing to show need no
        entry in ``_submitted``)."""
        for wid in self._outbox_ranks:
            if wid not in self._submitted:
                self._submit(wid)
        self._start_round(t)

    def _control_end(self, t: float, rows: dict, rnd):
        """Offer the round's rows in (ready time, rank) order; the decision or None."""
        arrivals = []
        for wid, (entry, pbytes) in rows.items():
            if entry is None:
                continue
            if pbytes:
                self._cached.add((wid, entry["arrival"].step))
            arrivals.append((entry["ready"], wid, entry))
        arrivals.sort(key=lambda x: (x[0], x[1]))
        decision = None
        for _, wid, entry in arrivals:
            arrival = entry["arrival"]
            box = self.workers[wid].outbox
            box.remove(entry)
            if not box:
                self._outbox_ranks.discard(wid)
            self.arrival_log.append((t, wid, arrival.step))
            self.store[(wid, arrival.step)] = entry
            w0 = _time.thread_time()
            decision = rnd.offer(arrival)
            self.decide_seconds = _time.thread_time() - w0
            if decision is not None:
                break
        if decision is None:
            decision = rnd.poll()
        return decision

    def _data_phase(self, decision) -> float:
        """Seconds from the deciding control round's end to the update on every rank."""
        cm: CollectiveModel = self.comm
        n, d4 = self.n, self.model_bytes
        uses = [(u.worker, u.step) for u in decision.uses]
        used_bytes = sum(self.store[key]["bytes"] for key in uses)
        sparse = self.sparse
        missing = [0] * n        # bytes of each rank's used messages not every rank holds
        for key in uses:
            if key not in self._cached:
                missing[key[0]] += self.store[key]["bytes"]
        if cm.plane in ("allgather", "allgather-2phase"):
            # the planes before issue 13: allgather what is missing, then every rank decodes
            # sum a_u m_u from the messages
            seconds = cm.local(used_bytes + d4)
            if any(missing):
                seconds += cm.allgather(n, missing)
                self._received(allgather=missing)
        else:
            # issue 13's plane, with the runtime's own rule (pgc_hvd.compress.codecs)
            needed = sum(1 for key in uses if key not in self._cached)
            width = max(1, self.store[uses[0]]["bytes"] // 4) if uses else 1
            kind = choose_collective(sparse=sparse, n=n, d=self.d, width=width, needed=needed)
            cached = sum(self.store[key]["bytes"] for key in uses if key in self._cached)
            if kind == "cached":
                seconds = cm.local(used_bytes + d4)
            elif kind == "allgather":      # the chosen (values, indices) rows
                seconds = cm.allgather(n, missing) + cm.local(used_bytes + d4)
                self._received(allgather=missing)
            else:                          # each rank's sum a_u m_u, ONE allreduce
                seconds = (cm.local(max(missing) + d4) + cm.allreduce(n, d4)
                           + (cm.local(cached + d4) if cached else 0.0))
                self._received(each=allreduce_bytes(n, self.d) * self.element_size / 4)
        self._cached = {k for k in self._cached if k[1] > decision.step
                        or (self._late_usable and k[1] >= decision.step - self.scheme.lookback)}
        return seconds
