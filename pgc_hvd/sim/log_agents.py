"""The runtime's ``control="log"`` path, modelled in virtual time.

Owns :class:`LogAgentModel`: the agents of every rank when
:attr:`~pgc_hvd.sim.comm.CollectiveModel.control` is ``"log"`` or ``"log-bcast"``. Where the
polled :class:`~pgc_hvd.sim.agents.AgentModel` repeats control rounds, here (the runtime's
:func:`pgc_hvd.runtime.control_log.log_loop`; costs and formulas in :mod:`pgc_hvd.sim.log_costs`):

1. a rank's message ready at r reaches the decider's queue at r + a (a = 0 on rank 0,
   1.5 rtt + local_rtt / 2 elsewhere; rank 0's reader takes one row per ``local_rtt`` at most);
2. the decider takes the queued rows one at a time, q_dec(n) seconds each (a row is taken at
   max(its landing, the previous row's end)), and offers each row's arrival to the open round
   in that (log) order, so the round fires at the end of the row that completes it, time D;
3. the m rows taken since the previous outcome are published and delivered
   (:meth:`~pgc_hvd.sim.comm.CollectiveModel.log_follow`: the store's n - 1 answers one after
   another, or a tree broadcast), every follower runs the body on them (m q_fol(n)), and the
   data phase (the inherited :meth:`~pgc_hvd.sim.agents.AgentModel._data_phase`, allreduce
   plane) starts when the last rank joins: the update is every rank's at
   D + follow + data seconds;
4. the decider is in the data phase until then (rows that land meanwhile queue); after it, it
   runs the body once more (q_dec: the new round is polled, a bounded-staleness round may fire
   from its table) and takes the queued rows.

Records' ``extra``: ``control_rounds`` (the decider's body runs in the step: rows taken + 1),
``control_ops`` (rank 0's store operations: its reader's gets of the others' rows + the
publish, as the runtime's records, which are rank 0's), ``control_ops_others`` (the most any
rank > 0 made: add + set per row it appended, + one get), ``follow_seconds`` (D to the last
rank joining the data phase), ``decider_lag`` (the deciding row's landing to D),
``data_seconds``.

Not modelled: an append's round trip on the appending rank's training thread (one ``rtt``, tens
of microseconds, before its next compute); state rows (done, failed, non-finite; one per event,
not per step); the decider's and followers' CPU taken from their ranks' compute.

May import: ``schemes`` and :mod:`pgc_hvd.sim.agents`, :mod:`pgc_hvd.sim.comm`,
:mod:`pgc_hvd.sim.log_costs`; never the engine.
"""

from __future__ import annotations

import time as _time
from collections import deque

from .agents import AgentModel
from .log_costs import line_bytes


class LogAgentModel(AgentModel):
    """Every rank's agent under a log control path (module doc); the engine drives it as it
    drives :class:`~pgc_hvd.sim.agents.AgentModel` (``begin``, ``ready``, ``on_event``,
    ``fired``, ``next_round``)."""

    def __init__(self, comm, scheme, workers, store, arrival_log, push, **kw):
        super().__init__(comm, scheme, workers, store, arrival_log, push, **kw)
        lc = comm.log
        self.costs = lc
        self.line_bytes = line_bytes(scheme.lookback)
        self.q_decider = lc.row_seconds("decider", self.n)
        self._queue: deque = deque()       # (landed at, rank, entry) not yet taken
        self._busy_until = 0.0             # the decider thread is free from then
        self._reader_free = 0.0            # rank 0's reader: its last row's landing
        self._in_data = False              # the decider is in a data phase
        self._taken = 0                    # rows taken since the previous outcome
        self._read_by_reader = 0           # ... of them, rows of ranks > 0
        self._body_runs = 0
        self._appended = [0] * self.n      # rows each rank appended since the previous outcome
        self._follow = 0.0
        self._lag = 0.0

    # -- what the simulator calls ------------------------------------------------------
    def begin(self) -> None:
        self.step = 0
        self.round = self.scheme.open_round(0)
        self.decide_seconds = 0.0

    def ready(self, wid: int, entry: dict, t: float) -> None:
        """Rank ``wid``'s message is ready at t: its row joins the log (step 1, module doc)."""
        self._appended[wid] += 1
        land = t + self.costs.append_delay(wid)
        if wid != 0:
            land = max(land, self._reader_free + self.costs.local_rtt)
            self._reader_free = land
        self.push(land, "log_row", wid, entry)

    def on_event(self, t: float, kind: str, payload: tuple) -> None:
        if kind != "log_row":
            raise ValueError(f"LogAgentModel: unknown event {kind!r}")
        wid, entry = payload
        self._queue.append((t, wid, entry))
        self._drain()

    def fired(self) -> tuple[int, dict]:
        step_bytes = int(self._recv.max())
        self._recv[:] = 0.0
        ops = self.comm.log_ops(self._read_by_reader)
        extra = {"control_rounds": self._body_runs, "control_ops": ops["rank0"],
                 "control_ops_others": max((2 * self._appended[w] + 1
                                            for w in range(1, self.n)), default=0),
                 "follow_seconds": self._follow, "decider_lag": self._lag,
                 "data_seconds": self._data_seconds}
        self._body_runs = 0
        self._read_by_reader = 0
        self._appended = [0] * self.n
        self.decide_seconds = 0.0
        self.step += 1
        return step_bytes, extra

    def next_round(self, t: float) -> None:
        """The data phase is over at t: the body runs once more on the new round (it may fire
        from the scheme's table alone), then the decider takes the queued rows."""
        self.round = self.scheme.open_round(self.step)
        self._in_data = False
        self._busy_until = max(self._busy_until, t) + self.q_decider
        self._body_runs += 1
        decision = self.round.poll()
        if decision is not None:
            self._fire_at(self._busy_until, decision, landed=t)
            return
        self._drain()

    # -- the decider ---------------------------------------------------------------------
    def _drain(self) -> None:
        """Take the queued rows in log order while no data phase holds the decider."""
        while self._queue and not self._in_data:
            landed, wid, entry = self._queue.popleft()
            end = max(self._busy_until, landed) + self.q_decider
            self._busy_until = end
            self._taken += 1
            self._body_runs += 1
            if wid != 0:
                self._read_by_reader += 1
                self._recv[0] += self.line_bytes
                self.total_bytes += self.line_bytes
            arrival = entry["arrival"]
            self.arrival_log.append((end, wid, arrival.step))
            self.store[(wid, arrival.step)] = entry
            w0 = _time.thread_time()
            decision = self.round.offer(arrival)
            self.decide_seconds = _time.thread_time() - w0
            if decision is not None:
                self._fire_at(end, decision, landed)

    def _fire_at(self, t: float, decision, landed: float) -> None:
        """The round fired at t (the end of the deciding row, which landed at ``landed``):
        publish, deliver, follow, then the data phase (module doc, step 3)."""
        m = self._taken
        follow, _ = self.comm.log_follow(self.n, m, self.scheme.lookback)
        B = m * self.line_bytes
        self._recv[1:] += B
        self.total_bytes += int((self.n - 1) * B)
        self._follow, self._lag = follow, t - landed
        self._taken = 0
        self._in_data = True
        self._data_seconds = self._data_phase(decision)
        self._busy_until = t + follow + self._data_seconds
        self._round_id += 1
        self.push(self._busy_until, "data_end", self._round_id, decision)


__all__ = ["LogAgentModel"]
