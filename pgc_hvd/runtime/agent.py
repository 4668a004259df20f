"""The communication agent: one thread per rank that takes part in every collective on time.

Owns the handoff with the training thread (the outbox of messages, the decided updates, the
condition variable) and the agent thread's loop (control rounds, each decided step's data
phase); the decision body it runs on the rows is its :class:`~pgc_hvd.runtime.rows.Decider`. The data
plane -- one decision in, one update out -- is :class:`~pgc_hvd.runtime.communicator.
Communicator`; the control row's packing is :func:`pgc_hvd.runtime.rows.pack_row`; the control
channel is built by :func:`pgc_hvd.runtime.channel.control_channel`. The agent never calls into
the optimizer: it queues a :class:`Report` of each decided step, which the training thread
turns into records; what the control rows have shown (offered arrivals, their losses and
metrics, non-finite messages, the replayed order) is :class:`~pgc_hvd.runtime.rows.
ArrivalBook`'s. May import: ``compress``, ``schemes``, ``runtime.channel``,
``runtime.communicator`` (``Collectives`` and the data plane), ``runtime.errors``, ``runtime.rows``, ``runtime.control_log``
(``control="log"``).

Horovod collectives are all-or-nothing (DESIGN.md): a rank whose training thread is busy
computing (or straggling) cannot be left out of a collective. So every rank runs this agent,
which is never blocked by its rank's compute. A step is decided in two phases:

1. **control**: every rank's control row (:mod:`pgc_hvd.runtime.rows`: the step of the message
   the rank has ready, the model version it used, when it became ready, its loss, busy seconds,
   non-finite, done and failed flags, the compression error ||C(u) - u|| for the minimum-error
   class decoder, slot versions) reaches every rank identically through the control channel
   (:mod:`pgc_hvd.runtime.channel`: a Horovod allgather, or a TCPStore). Every rank offers the
   new arrivals, ordered by ``(ready time, rank)``, to its own copy of the scheme's
   :class:`~pgc_hvd.schemes.Round` with ``message=None``, so every rank computes the same
   :class:`~pgc_hvd.schemes.Decision`. Repeated until the scheme's rule fires:
   ``poll_interval`` seconds apart while no message of the open round is known,
   ``poll_interval / 4`` once one is (the same on every rank), and at once after a local event
   (message submitted, rank finished or failed: condition-variable handoff).
2. **data**: the decided update g_hat = Re sum_{u in uses} a_u D(p_u) is linear in the messages
   and each use is owned by its sender, so the collective is chosen from the bytes
   (:func:`pgc_hvd.compress.codecs.choose_collective`, the same choice on every rank):

   * dense rows: each rank adds its own uses, sum_{u owned} a_u m_u (zeros when it owns none),
     into a d-vector, and ONE in-place ``hvd.allreduce`` (sum) hands every rank the same update
     at 2 (n-1)/n * 4d bytes, like ``hvd.DistributedOptimizer``;
   * sparse top-kappa rows: an allgather of the chosen ranks' rows when that is fewer bytes,
     else densified into the allreduce;
   * small rows (optimistic one-collective rounds, :func:`~pgc_hvd.compress.optimistic_default`):
     a rank's payload rides in the same allgather as the control row that first shows it ready;
     every rank caches the payloads it received, identically, and a step whose used payloads
     are all cached decodes with no second collective. A message that is already too late to
     be used (its step has fired, and the scheme ignores past steps) goes without its payload.

   Either way the decision depends only on the control rows (arrival order), never on payloads;
   cached and gathered payloads are decoded in (worker, step) order, so every rank forms the
   same floating-point sum, and the allreduce gives every rank the same bits.

fp16 messages (:class:`~pgc_hvd.compress.codecs.Fp16Codec`, ``codec.wire_dtype`` float16):
payload rows hold fp16 entries (2d + 4 bytes for dense rows; 6 kappa + 4 for top-kappa rows,
:class:`~pgc_hvd.compress.codecs.Fp16SparseCodec`), so payloads riding with the control rows and
the data allgather move half the bytes (three quarters for top-kappa rows), and the sum of the
contributions moves in fp16 (2 (n-1)/n * 2d bytes; ``narrow_reduce``: an alltoall of fp16 chunks
summed in fp32 by their owner + an allgather of the sums on CPU, where Gloo's own fp16 sum is
slow; Horovod's fp16 ring allreduce on GPU) and is widened back to fp32; a sum that overflows
fp16 (> 65504, seen identically on every rank as a non-finite result) is repeated in
fp32 for that step, never applied (``info["fp16_fallback"]``). ``Update.info["bytes"]`` counts
what really moved.

User metrics (``metrics=k``, default 0): every message carries k float64 values in its control
row (``Outgoing(..., metrics=(x_1, ..., x_k))``, e.g. accuracy, a loss term), beside its loss.
Each decided step's :class:`Update` then has ``info["metrics"]``, per slot the mean of the finite
values over the messages the decision used (NaN where none), ``info["metrics_count"]`` (how many
per slot) and ``info["metrics_from"]`` (the used ``(worker, step)``); ``info["loss"]`` is the
same mean of their losses (None where none). They come from the control rows, identical on every
rank, so every rank gets the same numbers with no extra collective: a per-batch
``hvd.allreduce`` of the loss would put the ranks back in lockstep and lose the straggler
tolerance. A row costs 8 k more bytes per rank per control round.

Decoded updates are kept per step until the training thread has applied them
(:meth:`CommAgent.take`, :meth:`CommAgent.release_before`): the agent's bookkeeping is bounded
by how far the slowest local step lags, never by the run's length. Messages the decision did not
use are dropped (exact and pipelined schemes; a pipelined worker's ring keeps its partition
gradients) or stay with their owner while they sit in the scheme's staleness table (bounded
staleness: the owner contributes them when a later decision uses them).

Staleness bound (bounded staleness, docs/control.md): rank 0 may request another bound c in
[1, c_0] (:meth:`CommAgent.request_staleness_bound`, checked there, e.g. from the control rule;
c_0 = ``staleness_c0``, the bound the agent was built with; a checkpoint's bound:
:meth:`CommAgent.restore_staleness_bound`). The request travels in rank 0's
control rows; every rank sets ``scheme.staleness_bound`` when a control round shows a value that differs
from its own, before offering that round's arrivals. The rows are the same on every rank, so the
change takes effect at the same point of the decision sequence everywhere (``staleness_changes`` logs
``(step, c)``), whatever the ranks' timing.

Faults: every collective runs asynchronously and is polled with a deadline (``timeout``): a rank
that died or hung makes the others raise :class:`AgentError` instead of hanging; a rank whose
training thread failed, or a round that cannot fire any more (every rank either arrived,
sent a non-finite message, or finished), raises on every rank; a step not decided within the
timeout names the ranks it waits for and whether their control rows kept coming.

``control="log"`` (:mod:`pgc_hvd.runtime.control_log`): no control rounds. A rank appends its
row to an ordered log when an event happens (message submitted, non-finite, done, failed), rank
0's agent runs the same decision body (:meth:`Decider.decide <pgc_hvd.runtime.rows.Decider>`,
on the rows that changed) on the rows in log order and broadcasts the rows of each outcome, and every
other agent runs the same body on them (:func:`pgc_hvd.runtime.control_log.log_loop`): the same
decisions, 4 control operations per follower per step.

Replay (``replay=[(worker, step), ...]``, e.g. a simulator's arrival log): arrivals are offered
in exactly that order while it lasts, whatever the ranks' real timing; with the optimizer's
matching rule for which model version a rank computes next, a real run then takes the same
decisions as the simulated run it replays (the twin test).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from pgc_hvd.compress.codecs import Codec
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.channel import control_channel
from pgc_hvd.runtime.communicator import Collectives, Communicator
from pgc_hvd.runtime.rows import (CTRL_BUSY, END, IDLE, WAIT, ArrivalBook, Decider, ctrl_len,
                                  metrics_at, not_decided_message, pack_row)
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
    previous update: allgathers, or store operations); ``fp16_fallback`` with fp16 messages; ``metrics``,
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


class CommAgent:
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
                 metrics: int = 0, narrow_reduce: str = "auto", buckets=None):
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
        # reports: every decided step's Report is queued for the training thread
        # (take_reports), which writes the records; the agent never calls into the optimizer
        self.reports = bool(reports)
        self._reports: list = []
        self.name = name
        self._decided = int(start_step)      # number of steps decided (the next round's step)
        self._updates: dict[int, Update] = {}  # decided, not yet released by the training thread
        self._applied = int(start_step)      # the training thread's version (release_before)
        self.cond = threading.Condition()
        self.error: Optional[BaseException] = None
        # called on the agent thread with the error that stopped it, before the training
        # thread is told (the elastic state leaves a broken world from here: gloo_cascade)
        self.on_stop: Optional[Callable[[BaseException], None]] = None
        # control='log': after a failed data collective, name the ranks that did not answer a
        # census over the control store (up to timeout + 1 s, failure path only); elastic mode
        # turns it off: Horovod re-forms the world without asking who
        self.census = True
        self._outbox: dict[int, Outgoing] = {}
        self._bad_step = -1
        self._busy_total = 0.0
        self._done = False
        self._failed = False
        self._busy_prev = [0.0] * self.n
        self._c_request: Optional[int] = None   # rank 0: staleness bound to request
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
        # the overlap (runtime.overlap): sums bucket by bucket; a wait for a bucket of this
        # rank's streamed message ends when its training thread fails
        self.comm.buckets = buckets
        self.comm.stop = lambda: self._failed
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
        # control='log': rows are appended where events happen, decisions read (control_log)
        self._log = getattr(channel, "kind", None) == "log"
        self._ops_prev = 0     # the channel's control operations at the previous decision
        self.optimistic = bool(channel.carries_payloads)
        # can a message for a past step still be used (bounded staleness table)?
        self._late_usable = scheme.late_usable
        self._wake = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-agent", daemon=True)

    # -- training-thread side ------------------------------------------------
    def request_staleness_bound(self, c: int) -> None:
        """Ask every rank to decide with staleness bound ``c`` in [1, c_0] (``staleness_c0``,
        the bound the agent was built with: buffers and control rows are sized for it) from
        the next control round on (module doc); only rank 0's request is sent. A scheme whose
        c is the code's, or a c out of range, raises ValueError naming the fix."""
        self.decider.check_staleness_bound(c)
        with self.cond:
            self._c_request = int(c)
            self._wake = True
            self.cond.notify_all()
        if self._log and self.rank == 0:
            self._append_row()

    def start(self) -> None:
        self._thread.start()

    def restart_at(self, step: int) -> None:
        """Before :meth:`start`: decide from ``step`` on (a restored checkpoint's version)."""
        if self._thread.is_alive():
            raise RuntimeError("restart_at must be called before the agent starts")
        self.decider.step = self._decided = self._applied = int(step)
        self._updates.clear()

    def payload_buffer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh ``(packed, payload)`` pair for one message: the training thread writes the
        payload (``width`` floats, a view of ``packed``) and submits ``Outgoing(...,
        packed=packed)``; the agent fills the control words in front when it sends."""
        head = 2 * self.ctrl_len if self.optimistic else 0
        packed = self.pool.get(head + self.width)
        return packed, (packed[head:] if head else packed)

    def submit(self, out: Outgoing, busy_total: float) -> None:
        if len(out.metrics) not in (0, self.metrics):
            raise ValueError(f"Outgoing(step={out.step}).metrics has {len(out.metrics)} values "
                             f"but this agent was built with metrics={self.metrics}: pass "
                             f"exactly {self.metrics} floats (or none), or build the agent with "
                             f"metrics={len(out.metrics)}")
        with self.cond:
            self._outbox[out.step] = out
            self._busy_total = busy_total
            self._wake = True
            self.cond.notify_all()
        if self._log:
            self._append_row()
        self._raise_if_failed()

    def report_bad(self, step: int, busy_total: float) -> None:
        with self.cond:
            self._bad_step = max(self._bad_step, int(step))
            self._busy_total = busy_total
            self._wake = True
            self.cond.notify_all()
        if self._log:
            self._append_row()

    def wait_for(self, step: int, timeout: Optional[float] = None) -> None:
        """Block until the update of ``step`` is decided (or raise the agent's error)."""
        limit = self.timeout if timeout is None else timeout
        # control='log': the decider's verdict on a missing rank comes first (it names it)
        deadline = time.monotonic() + limit + (self.channel.grace if self._log else 0.0)
        with self.cond:
            while self.error is None and self._decided <= step:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentError(self._not_decided(step, limit))
                self.cond.wait(min(left, 1.0))
        self._raise_if_failed()

    def _not_decided(self, step: int, limit: float) -> str:
        """Why ``step`` is not decided after ``limit`` seconds (:func:`~pgc_hvd.runtime.rows.
        not_decided_message`), naming the ranks it waits for."""
        dec = self.decider
        rnd = dec.current_round
        return not_decided_message(
            self.rank, step, limit, rows=dec.last_rows, n=self.n,
            quiet=time.monotonic() - dec.last_round_at, ended_at=dec.ended_at,
            open_step=dec.step, arrived=set(rnd.arrived) if rnd is not None else set(),
            poll_interval=self.poll_interval)

    def wait_decided_beyond(self, step: int, seconds: float) -> bool:
        """Sleep up to ``seconds``, returning early (True) once ``step`` is decided."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while self.error is None and self._decided <= step:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def decided(self) -> int:
        """Number of steps decided so far (the next round's step)."""
        return self._decided

    def take(self, step: int) -> Update:
        """The decided update of ``step`` (kept until :meth:`release_before` passes it)."""
        with self.cond:
            try:
                return self._updates[step]
            except KeyError:
                raise KeyError(f"step {step} is not held: decided {self._decided}, held "
                               f"{sorted(self._updates)[:3]}...") from None

    def release_before(self, step: int) -> None:
        """Forget the updates of steps before ``step`` (the training thread applied them); their
        buffers are recycled, so an ``on_update`` callback that keeps one must clone it."""
        with self.cond:
            for k in [k for k in self._updates if k < step]:
                self.pool.put(self._updates.pop(k).flat)
            self._applied = max(self._applied, int(step))

    def take_reports(self) -> list:
        """The :class:`Report` of every step decided since the last call, in step order (empty
        unless the agent was built with ``reports=True``)."""
        with self.cond:
            out, self._reports = self._reports, []
        return out

    def _report(self, update: Update, busy_step: list) -> "Report":
        sch = self.scheme
        return Report(update.step, update.decision, update.time, dict(update.info), busy_step,
                      [w for w, k in self.book.bad_log if k == update.step],
                      int(sch.staleness_bound) if sch.staleness_bound_adjustable else None)

    @property
    def held_updates(self) -> int:
        """Decided updates not yet released (bounded by how far this rank lags)."""
        return len(self._updates)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the agent thread to stop; whether it has."""
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def cut_off(self) -> None:
        """Make every later collective of this agent fail (:meth:`Collectives.cut_off`), and
        stop its control channel's threads (an abandoned world's log reader)."""
        self.coll.cut_off()
        self.channel.stop()

    @property
    def running(self) -> bool:
        """Whether the agent thread is alive."""
        return self._thread.is_alive()

    def leave(self) -> None:
        """This rank's loop is done (at the version the training thread has applied): the
        agent serves collectives until every rank is done, then stops; no wait (safe from a
        finaliser, :mod:`pgc_hvd.runtime.lifecycle`)."""
        with self.cond:
            again = self._done
            self._done = True
            self._wake = True
            self.cond.notify_all()
        if self._log and not again:
            self._append_row()

    def finish(self, timeout: Optional[float] = None) -> None:
        """This rank's loop is done: keep serving collectives until every rank is done."""
        self.leave()
        self._thread.join(self.timeout if timeout is None else timeout)
        if self._thread.is_alive():
            raise AgentError(f"rank {self.rank}: the other ranks did not finish within "
                             f"{self.timeout:.0f}s")
        self._raise_if_failed()

    def fail(self) -> None:
        """The training thread raised: tell the other ranks (they stop with a clear error)."""
        with self.cond:
            again = self._failed
            self._failed = True
            self._wake = True
            self.cond.notify_all()
        if self._log and not again:
            self._append_row()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            fields = self.error.fields() if isinstance(self.error, AgentError) else {}
            raise AgentError(str(self.error), **fields) from self.error

    @property
    def bad_log(self) -> list:
        """(rank, step) of every message that held NaN/Inf (:attr:`ArrivalBook.bad_log`)."""
        return self.book.bad_log

    # -- the decider's state, read here ------------------------------------------
    @property
    def step(self) -> int:
        """The round being decided (:attr:`Decider.step <pgc_hvd.runtime.rows.Decider>`)."""
        return self.decider.step

    @property
    def control_rounds(self) -> int:
        """Runs of the decision body so far."""
        return self.decider.control_rounds

    @property
    def staleness_c0(self) -> Optional[int]:
        """The staleness bound c_0 the agent was built with (None: c is the code's)."""
        return self.decider.staleness_c0

    @property
    def staleness_changes(self) -> list:
        """``(step, c)`` of every change of the staleness bound the rows showed."""
        return self.decider.staleness_changes

    @property
    def staleness_bound(self) -> Optional[int]:
        """The bound c the decisions currently use (None for schemes whose c is the code's)."""
        return self.decider.staleness_bound

    def restore_staleness_bound(self, c: Optional[int]) -> None:
        """Before the first step: a checkpoint's bound (None: none saved). Every rank restores
        its own value; rank 0's request makes them agree at once."""
        if c is not None and self.staleness_c0 is not None:
            self.scheme.staleness_bound = int(c)
            self.request_staleness_bound(int(c))

    # -- agent thread --------------------------------------------------------
    def fire(self, decision: Decision, ctl) -> None:
        """A decided step: the data phase, its report and update handed over, the next round
        opened (the control plane calls it with the rows that decided: the polled loop,
        :func:`~pgc_hvd.runtime.control_log.log_loop`)."""
        n, dec = self.n, self.decider
        busy = [ctl[w][CTRL_BUSY] for w in range(n)]
        self.coll.step = self.step
        try:
            update = self._data_phase(decision, dec.step_start)
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
        with self.cond:
            if self.reports:
                self._reports.append(self._report(update, busy_step))
            self._updates[update.step] = update
            self._decided += 1
            self.cond.notify_all()
        dec.step_start = update.time
        dec.next_round()


    def _control_row(self) -> tuple[torch.Tensor, Optional[Outgoing]]:
        """This rank's control row (:func:`~pgc_hvd.runtime.rows.pack_row`) and, when its
        payload rides along, the message."""
        out_with_payload = None
        with self.cond:
            pending = sorted(k for k in self._outbox if (self.rank, k) not in self.book.offered)
            out = self._outbox[pending[0]] if pending else None
            # optimistic: the payload goes with the first control row that shows the message,
            # unless no decision can use it any more (a late message of an exact/pipelined
            # scheme, which ignores arrivals for past steps)
            if (out is not None and self.optimistic and not out.sent and out.packed is not None
                    and (out.step >= self.step or self._late_usable)):
                out.sent = True
                out_with_payload = out
            # done: 1 + the version the rank's loop ended at (no step at or past it is decided)
            pack_row(self._row, out, ring_size=self.ring_size, metrics=self.metrics,
                     busy=self._busy_total, bad_step=self._bad_step,
                     done=1.0 + self._applied if self._done else 0.0, failed=self._failed,
                     payload=out_with_payload is not None,
                     c_request=self._c_request if self.rank == 0 else None)
        return self._row, out_with_payload

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
            log.error("pgc_hvd agent on rank %d stopped: %s", self.rank, err)
            # the channel's own threads end with the agent (rank 0's log reader would
            # otherwise stay blocked in the store until the process exits, and a read that
            # times out while the interpreter finalises aborts the process)
            self.channel.stop()
            if self.on_stop is not None:
                try:
                    self.on_stop(err)
                except Exception as hook_err:   # never hides the agent's own error
                    log.warning("pgc_hvd agent on rank %d: on_stop failed: %s", self.rank,
                                hook_err)
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _idle(self, hurry: bool) -> None:
        """Wait before the next control round. ``hurry`` (the same on every rank: some message
        of the open round is already known) shortens the wait to ``poll_interval / 4``, so the
        arrival that completes the round is seen soon; a local event (message submitted,
        finished, failed) ends the wait at once."""
        wait = self.poll_interval / 4 if hurry else self.poll_interval
        with self.cond:
            if not self._wake:
                self.cond.wait(wait)
            self._wake = False

    def _append_row(self) -> None:
        """control='log': this rank's row joins the log (called where the event happens)."""
        self.channel.append(self.control_row())

    def control_row(self) -> torch.Tensor:
        """This rank's control row now (:func:`~pgc_hvd.runtime.rows.pack_row`), showing its
        newest message: what the control log appends when something happens to the rank."""
        row = torch.empty(self.ctrl_len, dtype=torch.float64)
        with self.cond:
            out = self._outbox[max(self._outbox)] if self._outbox else None
            pack_row(row, out, ring_size=self.ring_size, metrics=self.metrics,
                     busy=self._busy_total, bad_step=self._bad_step,
                     done=1.0 + self._applied if self._done else 0.0, failed=self._failed,
                     c_request=self._c_request if self.rank == 0 else None)
        return row

    def _loop(self) -> None:
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
        with self.cond:
            return self._outbox[step]

    def _data_phase(self, decision: Decision, step_start: float) -> Update:
        """The decision's update through the data plane (:class:`~pgc_hvd.runtime.
        communicator.Communicator`), then this rank's outbox pruned (the buffers of the
        messages no decision needs any more are recycled) and the update's ``info`` from the
        control rows (losses, user metrics) and the communicator (bytes, collective)."""
        # what the scheme may use again (bounded staleness table): kept, by owner and in caches
        keep = self.scheme.retained()
        comm = self.comm
        offered = self.book.offered
        flat, kind, fallback, uses = comm.combine(decision, keep, offered)
        now = time.time()
        with self.cond:
            for k in list(self._outbox):
                if (self.rank, k) in offered and (self.rank, k) not in keep:
                    gone = self._outbox.pop(k)
                    if not gone.consumed:
                        self.pool.put(gone.packed)
        used = self.book.used_info(uses)     # loss, user metrics: from the control rows
        info = {"loss": used.pop("loss"), "step_time": now - step_start, "control_rounds": self.control_rounds,
                "data_rounds": comm.data_rounds, "bytes": comm.take_bytes(),
                "collective": kind, "control_ops": self._control_ops(),
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

    @property
    def data_rounds(self) -> int:
        """Data-phase collectives so far."""
        return self.comm.data_rounds

    @property
    def narrow_reduce(self) -> str:
        """How an fp16 sum of contributions moves (:data:`~pgc_hvd.runtime.communicator.
        NARROW_REDUCE`)."""
        return self.comm.narrow_reduce

    def bookkeeping(self) -> dict:
        """Sizes of every container the agent keeps (bounded whatever the run's length)."""
        with self.cond:
            sizes = self.book.sizes()
            return {"offered": sizes["offered"], "meta": sizes["meta"],
                    "cache": len(self.comm.cache), "outbox": len(self._outbox),
                    "updates": self.held_updates, "pool": self.pool.free_buffers,
                    "bad_log": sizes["bad_log"], "staleness_changes": len(self.staleness_changes)}
