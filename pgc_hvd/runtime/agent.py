"""The communication agent: one thread per rank that takes part in every collective on time.

Owns the agent thread's loop (control rounds, or the control log's ``log_loop``, running its
:class:`~pgc_hvd.runtime.rows.Decider`; each decided step's data phase, :meth:`CommAgent.fire`)
and, in :class:`Handoff`, the handoff with the training thread under one condition variable:
the outbox of messages, the decided updates (kept until the training thread releases them, so
the bookkeeping is bounded by how far the slowest local step lags, never by the run's length),
the rank's flags and the wake-up of the agent's wait. The protocol -- why every rank runs an
agent (Horovod's collectives are all-or-nothing), the control rows every rank offers in
(ready time, rank) order to its own copy of the scheme's ``Round``, the data plane's one
allreduce, the optimistic payloads, the poll intervals -- is docs/architecture.md's "Runtime
step protocol"; the data plane is :class:`~pgc_hvd.runtime.communicator.Communicator`, the
control row :func:`~pgc_hvd.runtime.rows.pack_row`, what the rows have shown
:class:`~pgc_hvd.runtime.rows.ArrivalBook`, the control channel
:func:`~pgc_hvd.runtime.channel.control_channel`'s. The agent never calls into the optimizer:
it queues a :class:`Report` of each decided step, which the training thread turns into records.

* User metrics (``metrics=k``): every message carries k floats in its control row; each
  decided :class:`Update` has ``info["metrics"]`` (per slot the mean of the finite values over
  the used messages), ``metrics_count``, ``metrics_from`` and ``loss``, the same on every rank
  with no extra collective (:meth:`~pgc_hvd.runtime.rows.ArrivalBook.used_info`).
* Staleness bound (bounded staleness, docs/control.md): rank 0 may request a bound c in
  [1, c_0] (:meth:`CommAgent.request_staleness_bound`; a checkpoint's:
  :meth:`CommAgent.restore_staleness_bound`); it travels in rank 0's rows and every rank sets
  it when a round shows it, so it lands at the same point of the decisions everywhere
  (``staleness_changes``).
* Faults: every collective is polled with a deadline (``timeout``): a dead or hung rank makes
  the others raise :class:`AgentError` instead of hanging; a failed training thread, or a round
  that cannot fire any more, raises on every rank; a step not decided in time names the ranks
  it waits for.
* ``control="log"`` (:mod:`pgc_hvd.runtime.control_log`): no control rounds; a rank appends its
  row where an event happens, rank 0 decides on the log and broadcasts each outcome's rows,
  the others run the same decision body on them (4 control operations per follower per step);
  with s = 0 (``rows_in_sum``) none: the rows ride in the data allreduce (sum_rows; ``inline``).
* Replay (``replay=[(worker, step), ...]``, a simulator's arrival log): arrivals are offered in
  that order while it lasts, so a real run takes the simulated run's decisions (the twin test).

Threads: the agent thread (its loop, ``fire``; ``inline``: the training thread's ``submit``
runs them); the training thread: ``submit``, ``wait_for``, ``take``, ``leave``, ... (the handoff).
May import: ``compress``, ``schemes``, ``runtime.agent_life`` (its base class),
``runtime.channel``, ``runtime.communicator`` (``Collectives`` and the data plane),
``runtime.errors``, ``runtime.rows``, ``runtime.control_log`` (``control="log"``),
``runtime.sum_rows`` (the s = 0 path: rows in the data allreduce).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from pgc_hvd.compress.codecs import Codec
from pgc_hvd.runtime.agent_life import AgentLife
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.channel import control_channel
from pgc_hvd.runtime.communicator import Collectives, Communicator
from pgc_hvd.runtime.rows import (CTRL_BUSY, END, IDLE, WAIT, ArrivalBook, Decider, ctrl_len,
                                  metrics_at, pack_row)
from pgc_hvd.runtime.sum_rows import SumRows
from pgc_hvd.schemes import Decision

__all__ = ["AgentError", "CommAgent", "Outgoing", "Report", "Update"]

log = logging.getLogger("pgc_hvd.runtime")


@dataclass
class Outgoing:
    step: int
    version: int
    payload: torch.Tensor          # one payload row of codec.width float32 words
    ready_time: float
    loss: float = math.nan
    slot_versions: tuple = ()
    packed: Optional[torch.Tensor] = None  # [control words | payload] (payload is a view of it)
    error_norm: float = math.nan   # ||C(u) - u|| when the scheme's decoder needs it
    metrics: tuple = ()            # the agent's k user metrics (floats; () = none reported)
    sent: bool = False             # its payload already went out with a control row
    consumed: bool = False         # its buffer became a decoded update (in-place contribution)
    #: the overlap (runtime.overlap.Stream): the payload's buckets are still being formed by
    #: the training thread; the buffer is the step's, never the pool's
    stream: Optional[object] = None


@dataclass
class Update:
    """A decided step: ``flat`` = g_hat (fp32 d-vector), the decision, when it was decided, and
    ``info``: ``loss`` (mean over the used messages, None when none), ``step_time``,
    ``control_rounds``, ``data_rounds``, ``bytes`` (received by this rank since the previous
    update), ``collective``, ``control_ops`` (control messages this rank issued since the
    previous update: allgathers, or store operations), ``data_seconds`` (this rank's data
    phase: its contribution, the collective, the decode); ``fp16_fallback`` with fp16 messages; ``metrics``,
    ``metrics_count``, ``metrics_from`` when the agent carries user metrics (module doc)."""

    step: int
    flat: torch.Tensor
    decision: Decision
    time: float
    info: dict = field(default_factory=dict)


@dataclass
class Report:
    """What a decided step's record needs, taken on the agent thread when the step is decided
    (no d-vector): the decision, when, ``info`` as in :class:`Update`, each rank's busy seconds
    during the step, the ranks whose message for the step was non-finite, and the staleness
    bound c the decision was taken with (None for schemes whose c is fixed)."""

    step: int
    decision: Decision
    time: float
    info: dict
    busy: list
    nonfinite_ranks: list
    c: Optional[int] = None


class Handoff:
    """The two threads' meeting point (module doc), under one condition variable (:attr:`cond`):
    the outbox of this rank's messages by step, the decided updates until released, how many
    steps are decided and applied, the rank's flags (busy seconds, the newest non-finite step,
    done, failed, a requested staleness bound), the queued reports, the agent's error and the
    wake-up of its wait. Every method takes the lock itself; the rows packed from it are
    :func:`~pgc_hvd.runtime.rows.pack_row`'s."""

    def __init__(self, pool, *, start_step: int, ring_size: int, metrics: int, reports: bool,
                 sends_c: bool):
        self.cond = threading.Condition()
        self.pool = pool                       # the data plane's buffers (recycled here)
        self.ring_size, self.metrics = int(ring_size), int(metrics)
        self.sends_c = bool(sends_c)           # rank 0: its rows carry the requested bound
        self.error: Optional[BaseException] = None   # what stopped the agent thread
        self.outbox: dict[int, Outgoing] = {}
        self.updates: dict[int, Update] = {}   # decided, not yet released by the training thread
        self.decided = int(start_step)         # number of steps decided (the next round's step)
        self.applied = int(start_step)         # the training thread's version (release_before)
        self.busy_total = 0.0
        self.bad_step = -1
        self.done = self.failed = False
        self.c_request: Optional[int] = None   # the staleness bound to request (rank 0's counts)
        self.wake = False
        # every decided step's Report is queued for the training thread (take_reports), which
        # writes the records; the agent never calls into the optimizer
        self.reports = bool(reports)
        self.queued: list = []

    def _event(self) -> None:
        """Under the lock: a local event ends the agent's wait at once."""
        self.wake = True
        self.cond.notify_all()

    # -- training thread ---------------------------------------------------------------------
    def submit(self, out: Outgoing, busy_total: float) -> None:
        if len(out.metrics) not in (0, self.metrics):
            raise ValueError(f"Outgoing(step={out.step}).metrics has {len(out.metrics)} values "
                             f"but this agent was built with metrics={self.metrics}: pass "
                             f"exactly {self.metrics} floats (or none), or build the agent with "
                             f"metrics={len(out.metrics)}")
        with self.cond:
            self.outbox[out.step] = out
            self.busy_total = busy_total
            self._event()

    def report_bad(self, step: int, busy_total: float) -> None:
        with self.cond:
            self.bad_step = max(self.bad_step, int(step))
            self.busy_total = busy_total
            self._event()

    def request(self, c: int) -> None:
        with self.cond:
            self.c_request = int(c)
            self._event()

    def mark(self, flag: str) -> bool:
        """Set ``done`` or ``failed``; whether it was set already."""
        with self.cond:
            again = getattr(self, flag)
            setattr(self, flag, True)
            self._event()
        return again

    def wait_decided(self, step: int, deadline: float) -> bool:
        """Block until ``step`` is decided or the agent stopped (True), or until the monotonic
        ``deadline`` (False)."""
        with self.cond:
            while self.error is None and self.decided <= step:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 1.0))
        return True

    def take(self, step: int) -> Update:
        with self.cond:
            try:
                return self.updates[step]
            except KeyError:
                raise KeyError(f"step {step} is not held: decided {self.decided}, held "
                               f"{sorted(self.updates)[:3]}...") from None

    def release_before(self, step: int) -> None:
        with self.cond:
            for k in [k for k in self.updates if k < step]:
                self.pool.put(self.updates.pop(k).flat)
            self.applied = max(self.applied, int(step))

    def take_reports(self) -> list:
        with self.cond:
            out, self.queued = self.queued, []
        return out

    def restart_at(self, step: int) -> None:
        self.decided = self.applied = int(step)
        self.updates.clear()

    # -- agent thread ------------------------------------------------------------------------
    def pack(self, row: torch.Tensor, pick: Callable) -> Optional[Outgoing]:
        """This rank's control row into ``row``, showing the message ``pick(outbox)`` returns as
        ``(out, rides)``; ``out`` when its payload rides along (``rides``), else None."""
        with self.cond:
            out, rides = pick(self.outbox)
            # done: 1 + the version the rank's loop ended at (no step at or past it is decided)
            pack_row(row, out, ring_size=self.ring_size, metrics=self.metrics,
                     busy=self.busy_total, bad_step=self.bad_step,
                     done=1.0 + self.applied if self.done else 0.0, failed=self.failed,
                     payload=rides, c_request=self.c_request if self.sends_c else None)
        return out if rides else None

    def hand_over(self, update: Update, report: Optional[Report]) -> None:
        """A decided step's update (and its report) to the training thread."""
        with self.cond:
            if report is not None:
                self.queued.append(report)
            self.updates[update.step] = update
            self.decided += 1
            self.cond.notify_all()

    def idle(self, wait: float) -> None:
        """Wait up to ``wait`` seconds unless a local event came since the last wait."""
        with self.cond:
            if not self.wake:
                self.cond.wait(wait)
            self.wake = False

    def own(self, step: int) -> Outgoing:
        with self.cond:
            return self.outbox[step]

    def prune(self, rank: int, offered, keep) -> None:
        """Drop the messages a decision offered that the scheme does not keep; the buffers
        not consumed by an update are recycled."""
        with self.cond:
            for k in list(self.outbox):
                if (rank, k) in offered and (rank, k) not in keep:
                    gone = self.outbox.pop(k)
                    if not gone.consumed:
                        self.pool.put(gone.packed)

    def stop(self, err: BaseException) -> None:
        with self.cond:
            self.error = err
            self.cond.notify_all()


class CommAgent(AgentLife):
    """Runs the control/data protocol for one rank in a background thread (see module doc).

    ``codec`` (:mod:`pgc_hvd.compress.codecs`) says how payload rows look and how weighted rows
    become the dense update; the agent hands decided :class:`Update` objects back to the
    training thread (:meth:`take`), it never calls into the optimizer. It has a
    :class:`~pgc_hvd.runtime.rows.Decider` (:attr:`decider`), the decision body on the rows;
    the data phase of a decided step and the handoff are its own (:meth:`fire`)."""

    def __init__(self, hvd, scheme, rank: int, d: int, ring_size: int, *, codec: Codec, device,
                 start_step: int = 0, poll_interval: float = 0.002, timeout: float = 60.0,
                 reports: bool = False, name: str = "pgc",
                 replay: Optional[list] = None, optimistic: bool = False,
                 control: str = "allgather", channel=None,
                 metrics: int = 0, narrow_reduce: str = "auto", buckets=None,
                 rows_in_sum: bool = False):
        self.hvd = hvd
        self.scheme = scheme
        self.rank = int(rank)
        self.n = scheme.n
        self.d = int(d)
        self.ring_size = int(ring_size)
        self.codec = codec
        self.width = int(codec.width)
        self.device = device
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.name = name
        # called on the agent thread with the error that stopped it, before the training
        # thread is told (the elastic state leaves a broken world from here: gloo_cascade)
        self.on_stop: Optional[Callable[[BaseException], None]] = None
        # control='log': after a failed data collective, name the ranks that did not answer a
        # census over the control store (up to timeout + 1 s, failure path only); elastic mode
        # turns it off: Horovod re-forms the world without asking who
        self.census = True
        self._busy_prev = [0.0] * self.n
        if isinstance(metrics, bool) or not isinstance(metrics, int) or metrics < 0:
            raise ValueError(f"metrics={metrics!r}: give the number k >= 0 of user metric "
                             f"values each message carries in its control row (default 0)")
        self.metrics = int(metrics)
        self._metric_at = metrics_at(self.ring_size)
        # what the control rows showed: offered arrivals, their losses and metrics, non-finite
        # messages, the replayed order (a message ready early waits for its turn)
        self.book = ArrivalBook(self.n, self.ring_size, self.metrics, replay)
        #: the decision body on the rows (the round being decided is ``decider.step``)
        self.decider = Decider(scheme, self.rank, self.book, step=start_step)
        self.ctrl_len = ctrl_len(self.ring_size, self.metrics)  # float64 words per control row
        self._row = torch.empty(self.ctrl_len, dtype=torch.float64)
        self.coll = Collectives(hvd, self.rank, name, self.timeout, device=device)
        # the data plane (one decision in, one update out) and its recycled buffers
        self.comm = Communicator(self.coll, codec, n=self.n, d=self.d, rank=self.rank,
                                 device=device, own=self._own, narrow_reduce=narrow_reduce)
        self.pool = self.comm.pool
        #: the handoff with the training thread (its condition variable: :attr:`cond`)
        self.handoff = hand = Handoff(self.pool, start_step=start_step,
                                      ring_size=self.ring_size, metrics=self.metrics,
                                      reports=reports, sends_c=self.rank == 0)
        self.cond = hand.cond
        # the overlap (runtime.overlap): sums bucket by bucket; a wait for a bucket of this
        # rank's streamed message ends when its training thread fails
        self.comm.buckets = buckets
        self.comm.stop = lambda: hand.failed
        #: ``on_decided(update, ctl)``: called on the agent thread with each decided update and
        #: the rows that decided it, before the training thread gets it (stragglers="auto",
        #: :mod:`pgc_hvd.runtime.auto_s`, may add ``update.info["auto_s"]``); None: nothing
        self.on_decided: Optional[Callable] = None
        if channel is None:   # the one builder of control channels (channel.control_channel)
            channel = control_channel(control, self.coll, n=self.n, length=self.ctrl_len,
                                      width=self.width, optimistic=optimistic, device=device)
        elif optimistic and not channel.carries_payloads:
            raise ValueError("control='store' exchanges control rows through a key-value "
                             "store, which cannot carry payloads: leave optimistic unset")
        self.channel = channel
        #: the s = 0 path (runtime.sum_rows): rows ride in the data allreduce, no control round
        self.sum_rows = SumRows(scheme, self.rank, self.ctrl_len) if rows_in_sum else None
        #: s = 0 without the overlap: the training thread runs each round itself, in submit
        #: (no hand-off to a thread and back); the thread serves the end (leave, fail)
        self.inline = self.sum_rows is not None and buckets is None
        self.started = False
        # control='log': rows are appended where events happen, decisions read (control_log)
        self._log = getattr(channel, "kind", None) == "log" and self.sum_rows is None
        self._ops_prev = 0     # the channel's control operations at the previous decision
        self.optimistic = bool(channel.carries_payloads)
        # can a message for a past step still be used (bounded staleness table)?
        self._late_usable = scheme.late_usable
        self._thread = threading.Thread(target=self._run, name=f"{name}-agent", daemon=True)

    # -- training-thread side ------------------------------------------------
    def start(self) -> None:
        self.started = True
        if self.inline:
            self.decider.open_round()
        else:
            self._thread.start()

    def payload_buffer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh ``(packed, payload)`` pair for one message: the training thread writes the
        payload (``width`` floats, a view of ``packed``) and submits ``Outgoing(...,
        packed=packed)``; the agent fills the control words in front when it sends."""
        head = 2 * self.ctrl_len if self.optimistic else 0
        tail = self.sum_rows.tail if self.sum_rows is not None else 0   # its row slots
        packed = self.pool.get(head + self.width + tail)
        return packed, (packed[head: head + self.width] if head or tail else packed)

    def submit(self, out: Outgoing, busy_total: float) -> None:
        """This rank's message (into the outbox; control='log': its row appended)."""
        self.handoff.submit(out, busy_total)
        if self._log:
            self._append_row()
        elif self._inline_now():   # the training thread runs the round (agent_life)
            self.sum_rows.inline(self, out)
        self._raise_if_failed()

    def report_bad(self, step: int, busy_total: float) -> None:
        """This rank's message of ``step`` was not finite (a straggler for the decision)."""
        self.handoff.report_bad(step, busy_total)
        if self._log:
            self._append_row()
        elif self._inline_now():
            self.sum_rows.inline(self, None)

    def wait_for(self, step: int, timeout: Optional[float] = None) -> None:
        """Block until the update of ``step`` is decided (or raise the agent's error)."""
        limit = self.timeout if timeout is None else timeout
        # control='log': the decider's verdict on a missing rank comes first (it names it)
        deadline = time.monotonic() + limit + getattr(self.channel, "grace", 0.0)
        if not self.handoff.wait_decided(step, deadline):
            raise AgentError(self._not_decided(step, limit))
        self._raise_if_failed()

    def wait_decided_beyond(self, step: int, seconds: float) -> bool:
        """Sleep up to ``seconds``, returning early (True) once ``step`` is decided."""
        return self.handoff.wait_decided(step, time.monotonic() + seconds)

    def decided(self) -> int:
        """Number of steps decided so far (the next round's step)."""
        return self.handoff.decided

    def take(self, step: int) -> Update:
        """The decided update of ``step`` (kept until :meth:`release_before` passes it)."""
        return self.handoff.take(step)

    def release_before(self, step: int) -> None:
        """Forget the updates of steps before ``step`` (the training thread applied them); their
        buffers are recycled, so an ``on_update`` callback that keeps one must clone it."""
        self.handoff.release_before(step)

    def take_reports(self) -> list:
        """The :class:`Report` of every step decided since the last call, in step order (empty
        unless the agent was built with ``reports=True``)."""
        return self.handoff.take_reports()

    @property
    def error(self) -> Optional[BaseException]:
        """What stopped the agent thread (None while it runs or after a clean end)."""
        return self.handoff.error

    def _report(self, update: Update, busy_step: list) -> "Report":
        sch = self.scheme
        return Report(update.step, update.decision, update.time, dict(update.info), busy_step,
                      [w for w, k in self.book.bad_log if k == update.step],
                      int(sch.staleness_bound) if sch.staleness_bound_adjustable else None)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            fields = self.error.fields() if isinstance(self.error, AgentError) else {}
            raise AgentError(str(self.error), **fields) from self.error

    @property
    def bad_log(self) -> list:
        """(rank, step) of every message that held NaN/Inf (:attr:`ArrivalBook.bad_log`)."""
        return self.book.bad_log

    # -- the decider's state, read here (the others: AgentLife) ---------------------------------
    @property
    def step(self) -> int:
        """The round being decided (:attr:`Decider.step <pgc_hvd.runtime.rows.Decider>`)."""
        return self.decider.step

    @property
    def control_rounds(self) -> int:
        """Runs of the decision body so far."""
        return self.decider.control_rounds

    # -- agent thread --------------------------------------------------------
    def fire(self, decision: Decision, ctl, summed: Optional[torch.Tensor] = None) -> None:
        """A decided step: the data phase, its report and update handed over, the next round
        opened (the control plane calls it with the rows that decided: the polled loop,
        :func:`~pgc_hvd.runtime.control_log.log_loop`; the s = 0 path with the update
        ``summed`` already)."""
        n, dec = self.n, self.decider
        busy = [ctl[w][CTRL_BUSY] for w in range(n)]
        self.coll.step = self.step
        try:
            update = self._data_phase(decision, dec.step_start, summed)
        except AgentError as err:
            if not self._log or not self.census:
                raise
            # control='log': a dead or frozen rank stops the data collective first; the
            # control store's census names it
            raise self.channel.census(self.step, err) from err
        if self.on_decided is not None:
            self.on_decided(update, ctl)
        busy_step = [b - p for b, p in zip(busy, self._busy_prev)]
        self._busy_prev = busy
        self.handoff.hand_over(update, self._report(update, busy_step)
                               if self.handoff.reports else None)
        dec.step_start = update.time
        dec.next_round()

    def _control_row(self) -> tuple[torch.Tensor, Optional[Outgoing]]:
        """This rank's control row (:func:`~pgc_hvd.runtime.rows.pack_row`) and, when its
        payload rides along, the message."""
        def pick(outbox: dict) -> tuple:   # under the handoff's lock
            pending = sorted(k for k in outbox if (self.rank, k) not in self.book.offered)
            out = outbox[pending[0]] if pending else None
            # optimistic: the payload goes with the first control row that shows the message,
            # unless no decision can use it any more (a late message of an exact/pipelined
            # scheme, which ignores arrivals for past steps)
            rides = (out is not None and self.optimistic and not out.sent
                     and out.packed is not None and (out.step >= self.step or self._late_usable))
            if rides:
                out.sent = True
            return out, rides
        return self._row, self.handoff.pack(self._row, pick)

    def _control_round(self) -> tuple[list, dict]:
        """One control exchange: every rank's control row (as lists of floats) and the payloads
        that rode along, ``{(worker, step): payload row}`` (identical on every rank)."""
        row, out = self._control_row()
        self.coll.step = self.step
        rows, payloads = self.channel.exchange(row, None if out is None else out.packed)
        self.comm.bytes_since += 8 * self.ctrl_len * (self.n - 1)
        return rows, payloads

    def _run(self) -> None:
        try:
            self._loop()
            self.channel.close()
        except BaseException as err:  # surfaced to the training thread
            self.stop_on(err)

    def _idle(self, hurry: bool) -> None:
        """Wait before the next control round. ``hurry`` (the same on every rank: some message
        of the open round is already known) shortens the wait to ``poll_interval / 4``, so the
        arrival that completes the round is seen soon; a local event (message submitted,
        finished, failed) ends the wait at once."""
        self.handoff.idle(self.poll_interval / 4 if hurry else self.poll_interval)

    def _append_row(self) -> None:
        """control='log': this rank's row joins the log (called where the event happens)."""
        self.channel.append(self.control_row())

    def control_row(self) -> torch.Tensor:
        """This rank's control row now (:func:`~pgc_hvd.runtime.rows.pack_row`), showing its
        newest message: what the control log appends when something happens to the rank."""
        row = torch.empty(self.ctrl_len, dtype=torch.float64)
        self.handoff.pack(row, lambda outbox: (outbox[max(outbox)] if outbox else None, False))
        return row

    def _loop(self) -> None:
        if self.sum_rows is not None:   # s = 0: the data allreduce carries the rows
            return self.sum_rows.loop(self, opened=self.inline)
        if self._log:   # one decider, every other rank follows its published rows
            from pgc_hvd.runtime.control_log import log_loop
            return log_loop(self.decider, self.channel, self.fire, timeout=self.timeout,
                            census=lambda: self.census)
        dec = self.decider
        dec.open_round()
        while True:
            ctl, payloads = self._control_round()
            self.comm.received(payloads)
            got = dec.decide(ctl)
            if got is END:
                return
            if got is IDLE:
                self._idle(hurry=False)
            elif got is WAIT:
                self._idle(hurry=bool(dec.current_round.arrived))
            else:
                self.fire(got, ctl)

    def _own(self, step: int) -> Outgoing:
        """This rank's message of ``step`` (the communicator reads own payloads here)."""
        return self.handoff.own(step)

    def _data_phase(self, decision: Decision, step_start: float,
                    summed: Optional[torch.Tensor] = None) -> Update:
        """The decision's update through the data plane (:class:`~pgc_hvd.runtime.
        communicator.Communicator`), then this rank's outbox pruned (the buffers of the
        messages no decision needs any more are recycled) and the update's ``info`` from the
        control rows (losses, user metrics) and the communicator (bytes, collective)."""
        t_data = time.perf_counter()
        # what the scheme may use again (bounded staleness table): kept, by owner and in caches
        keep = self.scheme.retained()
        comm = self.comm
        offered = self.book.offered
        flat, kind, fallback, uses = (comm.combine(decision, keep, offered) if summed is None else
                                      (summed, "allreduce", False,
                                       sorted(decision.uses, key=lambda u: (u.worker, u.step))))
        now = time.time()
        self.handoff.prune(self.rank, offered, keep)
        data_seconds = time.perf_counter() - t_data
        used = self.book.used_info(uses)     # loss, user metrics: from the control rows
        info = {"loss": used.pop("loss"), "step_time": now - step_start, "control_rounds": self.control_rounds,
                "data_rounds": comm.data_rounds, "bytes": comm.take_bytes(),
                "collective": kind, "control_ops": self._control_ops(),
                "data_seconds": data_seconds,
                "buckets": len(comm.buckets.ranges) if comm.buckets is not None and kind == "allreduce"
                else None}
        if comm.nonfinite_sum:
            info["nonfinite_sum"] = True
            if self.rank == 0:
                log.warning("step %d: a message used by the decision held NaN/Inf (it left "
                            "during the backward, before its check): the step applies no "
                            "update; its rank reports it and stops overlapping", decision.step)
        if self.codec.wire_dtype != torch.float32:
            info["fp16_fallback"] = fallback
            info["fp16_reduce"] = comm.narrow_reduce if kind == "allreduce" else None
        info.update(used)
        return Update(decision.step, flat, decision, now, info)

    def _control_ops(self) -> Optional[int]:
        """Control messages this rank issued since the previous decided step (collectives or
        store operations of its control channel; None for a channel that does not count)."""
        ops = getattr(self.channel, "ops", None)
        if ops is None:
            return None
        n, self._ops_prev = ops - self._ops_prev, ops
        return int(n)
