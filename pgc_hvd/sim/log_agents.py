"""The runtime's ``control="log"`` path, modelled in virtual time.

Owns :class:`LogAgentModel`: the agents of every rank when
:attr:`~pgc_hvd.sim.comm.CollectiveModel.control` is ``"log"`` or ``"log-bcast"``. Where the
polled :class:`~pgc_hvd.sim.agents.AgentModel` repeats control rounds, here (the runtime's
:func:`pgc_hvd.runtime.control_log.log_loop`; costs and formulas in :mod:`pgc_hvd.sim.log_costs`):

1. a rank's message ready at r reaches the decider's queue at r + a (a = 0 on rank 0,
   rtt / 2 + local_rtt / 2 elsewhere: one push; rank 0's reader takes one row per ``local_rtt`` at most);
2. the decider, when free, takes every queued row as one batch: a run of the body on k rows
   lasts run(n) + k row(n), and offers the batch's arrivals to the open round in (ready time,
   rank) order; the round fires at the end of the run whose batch completes it (time D), and
   the batch's later arrivals wait for the next round. Rows that land during a run queue for
   the next batch;
3. the m rows taken since the previous outcome, in b batches, are published and delivered
   (:meth:`~pgc_hvd.sim.comm.CollectiveModel.log_follow`: the store's n - 1 answers one after
   another, or a tree broadcast); every follower replays the body on the b
   batches; the data phase (the inherited :meth:`~pgc_hvd.sim.agents.AgentModel._data_phase`,
   allreduce plane) starts when the last rank joins: the update is every rank's at
   D + follow + data seconds;
4. the decider is in the data phase until then (rows that land meanwhile queue); after it, the
   body runs once more on no new rows (run(n): the batch's leftover arrivals are offered, the new
   round polled -- a bounded-staleness round may fire from its table), then the queued rows
   make the next batch.

Records' ``extra``: ``control_rounds`` (the decider's body runs in the step), ``control_ops``
(rank 0's store operations: its reader's pops of the others' rows and the broadcast, as in the
runtime's records, which are rank 0's), ``control_ops_others`` and ``control_ops_others_max``
(the mean and the most over the ranks > 0: a push per row the rank appended and the
outcome's broadcast; ``"log-store"``: add + set per row, the get, a delete per row taken),
``log_batches`` (b), ``follow_seconds`` (D to the last rank joining the data phase),
``decider_lag`` (the deciding row's landing to D), ``data_seconds``.

The s = 0 path: :class:`SumRowsAgentModel` (no control round; the rows ride in the data
allreduce), where the runtime takes it.

Not modelled: an append's push on the appending rank's training thread (about a microsecond); state rows (done, failed, non-finite; one per
event, not per step); the extra body run when an offer uncovers a rank's next message; the
decider's and followers' CPU taken from their ranks' compute.

May import: ``schemes`` and :mod:`pgc_hvd.sim.agents`, :mod:`pgc_hvd.sim.comm`,
:mod:`pgc_hvd.sim.log_costs`; never the engine.
"""

from __future__ import annotations

import time as _time

from .agents import CTRL_FIXED, AgentModel
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
        self.run_seconds = lc.run_seconds("decider", self.n)
        self.row_seconds = lc.row_seconds("decider", self.n)
        self._queue: list = []             # (landed at, rank, entry) not yet taken
        self._leftover: list = []          # a batch's arrivals after the one that fired
        self._busy_until = 0.0             # the decider thread is free from then
        self._reader_free = 0.0            # rank 0's reader: its last row's landing
        self._in_data = False              # the decider is in a data phase
        self._free_id = 0                  # the pending "log_free" event's id
        self._taken = 0                    # rows taken since the previous outcome
        self._batches = 0                  # ... in this many batches
        self._taken_by = [0] * self.n      # ... of each rank
        self._read = 0                     # rows of ranks > 0 rank 0's reader got (record)
        self._appended = [0] * self.n      # rows each rank appended (record)
        self._rec: dict = {}               # the outcome's figures, for the record
        self._landed = 0.0                 # when the deciding row landed
        self._body_runs = 0

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
        if kind == "log_row":
            wid, entry = payload
            if wid != 0:
                self._read += 1
                self._recv[0] += self.line_bytes
                self.total_bytes += self.line_bytes
            self._queue.append((t, wid, entry))
            if not self._in_data and self._busy_until <= t:
                self._batch(t)
        elif kind == "log_free":
            if payload[0] == self._free_id and not self._in_data and self._queue:
                self._batch(t)
        else:
            raise ValueError(f"LogAgentModel: unknown event {kind!r}")

    def fired(self) -> tuple[int, dict]:
        step_bytes = int(self._recv.max())
        self._recv[:] = 0.0
        rec = self._rec
        ops = [self.comm.log_ops(self._read, self._appended[w], rec["taken_by"][w])
               for w in range(1, self.n)]
        extra = {"control_rounds": self._body_runs,
                 "control_ops": ops[0][0] if ops else 0,
                 "control_ops_others": (sum(o[1] for o in ops) / len(ops)) if ops else 0.0,
                 "control_ops_others_max": max((o[1] for o in ops), default=0),
                 "log_batches": rec["batches"], "follow_seconds": rec["follow"],
                 "decider_lag": rec["lag"], "data_seconds": self._data_seconds}
        self._body_runs = self._read = 0
        self._appended = [0] * self.n
        self.decide_seconds = 0.0
        self.step += 1
        return step_bytes, extra

    def next_round(self, t: float) -> None:
        """The data phase is over at t: one run of the body offers the last batch's leftover
        arrivals and polls the new round; then the queued rows make the next batch."""
        self.round = self.scheme.open_round(self.step)
        self._in_data = False
        end = t + self.run_seconds
        self._busy_until = end
        self._body_runs += 1
        left, self._leftover = self._leftover, []
        decision = self._offer(left, end)
        if decision is None:
            decision, self._landed = self.round.poll(), t
        if decision is not None:
            self._fire_at(end, decision)
            return
        self._free_id += 1
        self.push(end, "log_free", self._free_id)

    # -- the decider ---------------------------------------------------------------------
    def _batch(self, t: float) -> None:
        """Take every queued row as one batch at t (module doc, step 2)."""
        batch, self._queue = self._queue, []
        end = t + self.run_seconds + len(batch) * self.row_seconds
        self._busy_until = end
        self._body_runs += 1
        self._taken += len(batch)
        self._batches += 1
        for _, wid, _ in batch:
            self._taken_by[wid] += 1
        order = sorted(batch, key=lambda x: (x[2]["ready"], x[1]))
        decision = self._offer(order, end)
        if decision is not None:
            self._fire_at(end, decision)
            return
        self._free_id += 1
        self.push(end, "log_free", self._free_id)

    def _offer(self, rows: list, t: float):
        """Offer the rows' arrivals in order until one decides (its row's landing is noted);
        the rest are left over."""
        for i, (landed, wid, entry) in enumerate(rows):
            arrival = entry["arrival"]
            self.arrival_log.append((t, wid, arrival.step))
            self.store[(wid, arrival.step)] = entry
            w0 = _time.thread_time()
            decision = self.round.offer(arrival)
            self.decide_seconds = _time.thread_time() - w0
            if decision is not None:
                self._leftover, self._landed = rows[i + 1:], landed
                return decision
        return None

    def _fire_at(self, t: float, decision) -> None:
        """The round fired at t: publish, deliver, follow, then the data phase (step 3)."""
        m, b = self._taken, self._batches
        follow, own = self.comm.log_follow(self.n, m, b, self.scheme.lookback)
        B = (m + max(0, b - 1)) * self.line_bytes
        self._recv[1:] += B
        self.total_bytes += int((self.n - 1) * B)
        self._rec = {"taken_by": self._taken_by, "batches": b, "follow": follow,
                     "lag": t - self._landed}
        self._taken, self._batches, self._taken_by = 0, 0, [0] * self.n
        self._in_data = True
        self._data_seconds = self._data_phase(decision)
        self._busy_until = t + max(follow, own) + self._data_seconds
        self._round_id += 1
        self.push(self._busy_until, "data_end", self._round_id, decision)


class SumRowsAgentModel(AgentModel):
    """The runtime's s = 0 path (:mod:`pgc_hvd.runtime.sum_rows`), chosen where the runtime
    chooses it (:meth:`pgc_hvd.runtime.config.RuntimeConfig.rows_in_sum`: the default control
    plane, ``"log"``, a scheme that waits for every rank with a decision known before any row,
    ``Scheme.full_round_weights``, dense fp32 messages, real coefficients): no control round.
    Each rank's agent waits for its own message of step t, then joins ONE allreduce of its
    contribution with n row slots (3 ``ctrl_len`` float32 words each); the allreduce starts
    when the last rank joins and the update is every rank's at its end, as DDP's step. Records'
    ``extra``: ``control_rounds`` 0, ``control_ops`` 0, ``data_seconds``."""

    def __init__(self, comm, scheme, workers, store, arrival_log, push, **kw):
        super().__init__(comm, scheme, workers, store, arrival_log, push, **kw)
        #: bytes of the n row slots the allreduce carries beside the d words
        self.slot_bytes = 4 * 3 * self.n * (CTRL_FIXED + scheme.lookback)
        self._ready: dict = {}             # step -> {rank: (ready time, entry)}
        self._in_data = False

    def begin(self) -> None:
        self.step = 0
        self.round = self.scheme.open_round(0)
        self.decide_seconds = 0.0

    def ready(self, wid: int, entry: dict, t: float) -> None:
        self._ready.setdefault(entry["arrival"].step, {})[wid] = (t, entry)
        self._join(t)

    def on_event(self, t: float, kind: str, payload: tuple) -> None:
        raise ValueError(f"SumRowsAgentModel: unknown event {kind!r}")

    def fired(self) -> tuple[int, dict]:
        step_bytes = int(self._recv.max())
        self._recv[:] = 0.0
        self.decide_seconds = 0.0
        self.step += 1
        return step_bytes, {"control_rounds": 0, "control_ops": 0,
                            "data_seconds": self._data_seconds}

    def next_round(self, t: float) -> None:
        self.round = self.scheme.open_round(self.step)
        self._in_data = False
        self._join(t)

    def _join(self, t: float) -> None:
        """When every rank holds its message of the open step: the rows offered in (ready time,
        rank) order (the full round decides), then the one allreduce."""
        got = self._ready.get(self.step)
        if self._in_data or got is None or len(got) < self.n:
            return
        del self._ready[self.step]
        for old in [k for k in self._ready if k < self.step]:
            del self._ready[old]
        start = max(t, max(r for r, _ in got.values()))
        decision = None
        for ready, wid, entry in sorted((r, w, e) for w, (r, e) in got.items()):
            arrival = entry["arrival"]
            self.arrival_log.append((start, wid, arrival.step))
            self.store[(wid, arrival.step)] = entry
            w0 = _time.thread_time()
            decision = self.round.offer(arrival) if decision is None else decision
            self.decide_seconds = _time.thread_time() - w0
        if decision is None:
            decision = self.round.poll()
        if decision is None:
            raise RuntimeError(f"{self.scheme.name}: every rank's message of step {self.step} "
                               "did not decide it (the s = 0 path needs a full round)")
        self._in_data = True
        cm = self.comm
        self._data_seconds = (self._data_phase(decision)
                              + cm.allreduce(self.n, self.model_bytes + self.slot_bytes)
                              - cm.allreduce(self.n, self.model_bytes))
        self._round_id += 1
        self.push(start + self._data_seconds, "data_end", self._round_id, decision)


__all__ = ["LogAgentModel", "SumRowsAgentModel"]
