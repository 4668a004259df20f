"""The communication agent: one thread per rank that takes part in every collective on time.

Horovod collectives are all-or-nothing (DESIGN.md): a rank whose training thread is busy
computing (or straggling) cannot be left out of an allgather. So every rank runs this agent,
which is never blocked by its rank's compute, and the steps are decided by allgathers of
control rows:

1. **control**: an ``hvd.allgather`` of one control row per rank (``CTRL_*`` fields, float64: the
   step of the message the rank has ready, the model version it used, when it became ready, its
   loss, busy seconds, non-finite flag, done and failed flags, the message's compression error
   ||C(u) - u|| for the minimum-error class decoder, slot versions). The rows reach
   every rank identically; every rank offers the new arrivals, ordered by ``(ready time, rank)``,
   to its own copy of the scheme's :class:`~pgc_hvd.schemes.Round` with ``message=None``, so
   every rank computes the same :class:`~pgc_hvd.schemes.Decision`. Repeated until the scheme's
   rule fires: ``poll_interval`` seconds apart while no message of the open round is known,
   ``poll_interval / 4`` once one is (the same on every rank), and at once after a local event
   (message submitted, rank finished or failed: condition-variable handoff).
2. **payloads, optimistic (default for CPU tensors; one collective per step)**: a rank sends its
   message's payload in the *same* allgather as the control row that first shows it ready (one
   1-D float32 tensor per rank: the control row's float64 words bit-cast, then the payload when
   ``CTRL_PAYLOAD`` is set; ranks contribute different lengths). Every rank caches the payloads
   it received, identically; a step that fires on that control round needs no other collective.
   A message that is already too late to be used (its step has fired, and the scheme ignores
   past steps) is announced without its payload. Cost: the payloads of ready ranks the decision
   leaves out move too (at most s per step, when they are ready in the same round).
3. **data (two-phase mode, and payloads not cached)**: one variable-size ``hvd.allgather`` in
   which each rank contributes the messages of its own that the decision uses and that the
   others do not hold yet (zero rows otherwise): dense rows of d floats, or sparse top-kappa rows
   ``[values | int32 indices bit-cast]``.

Either way the decision depends only on the control rows (arrival order), never on payloads, and
every rank decodes the same update ``sum_I a_I m_I`` (uses sorted by (worker, step), so the
floating-point sum is the same on every rank and in every run) with
:func:`pgc_hvd.ops.decode_accumulate`.

Decoded updates are appended, in step order, to :attr:`CommAgent.updates`; the training thread
applies the ones it has missed before its next computation. Messages the decision did not use
are dropped (exact and pipelined schemes; a pipelined worker's ring keeps its partition
gradients) or stay available while they sit in the scheme's staleness table (bounded staleness).

Staleness bound (bounded staleness, design note 002): rank 0 may request another bound c
(:meth:`CommAgent.request_c_bound`, e.g. from the control rule). The request travels in rank 0's
control rows; every rank sets ``scheme.c_bound`` when a control round shows a value that differs
from its own, before offering that round's arrivals. The rows are the same on every rank, so the
change takes effect at the same point of the decision sequence everywhere (``c_changes`` logs
``(step, c)``), whatever the ranks' timing.

Control through a key-value store (``channel``, :mod:`pgc_hvd.runtime.control_store`): the
control rows of step 1 travel through a TCPStore served by rank 0 instead of the allgather (every
rank reads the same n rows per round, so the decisions are the same); payloads then always move
in step 3.

Faults: every collective runs asynchronously and is polled with a deadline (``timeout``): a rank
that died or hung makes the others raise :class:`AgentError` instead of hanging; a rank whose
training thread failed, or a round that cannot fire any more (every rank either arrived,
sent a non-finite message, or finished), raises on every rank.

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
from typing import Any, Callable, Optional

import torch

from pgc_hvd.schemes import Arrival, Decision

log = logging.getLogger("pgc_hvd.runtime")

# control row fields (float64)
CTRL_READY_STEP = 0   # step of the oldest message not yet offered, -1 when none
CTRL_VERSION = 1      # model version that message was computed at
CTRL_READY_TIME = 2   # time.time() when it became ready (orders arrivals across ranks)
CTRL_LOSS = 3         # training loss reported with it (nan when none)
CTRL_BUSY = 4         # cumulative busy seconds of the rank's training thread
CTRL_BAD_STEP = 5     # newest step whose message held NaN/Inf, -1 when none
CTRL_DONE = 6         # 1 when the rank's training loop has finished
CTRL_FAILED = 7       # 1 when the rank's training thread raised
CTRL_PAYLOAD = 8      # 1 when the message's payload follows this row in the same allgather
CTRL_C_BOUND = 9      # rank 0 only: the staleness bound c requested for the scheme, -1 = none
CTRL_ERROR = 10       # ||C(u) - u||, the message's compression error (nan when not sent)
CTRL_FIXED = 11       # slot versions follow (ring_size entries, -1 padded)


def wait_for_handle(hvd, handle, timeout: float) -> bool:
    """Poll an asynchronous Horovod handle until it completes (True) or ``timeout`` seconds pass
    (False). Short sleeps first (a small allgather takes 1-3 ms here), then at most 1 ms between
    polls; a blocking ``synchronize`` could not time out on a hung rank."""
    deadline = time.monotonic() + timeout
    sleep = 0.0001
    while not hvd.poll(handle):
        if time.monotonic() > deadline:
            return False
        time.sleep(sleep)
        sleep = min(sleep * 1.5, 0.001)
    return True


class AgentError(RuntimeError):
    """A fault the runtime cannot step past (dead/hung rank, failed rank, undecodable step)."""


@dataclass
class Outgoing:
    step: int
    version: int
    payload: torch.Tensor          # one row: dense d floats, sparse 2k floats, complex 2d floats
    ready_time: float
    loss: float = math.nan
    slot_versions: tuple = ()
    packed: Optional[torch.Tensor] = None  # [control words | payload] (payload is a view of it)
    error_norm: float = math.nan   # ||C(u) - u|| when the scheme's decoder needs it
    sent: bool = False             # its payload already went out with a control row


@dataclass
class Update:
    step: int
    flat: torch.Tensor
    decision: Decision
    time: float
    info: dict = field(default_factory=dict)


class CommAgent:
    """Runs the control/data protocol for one rank in a background thread (see module doc)."""

    def __init__(self, hvd, scheme, rank: int, d: int, ring_size: int, *, payload_width: int,
                 decode: Callable[[torch.Tensor, list, list], torch.Tensor], device,
                 start_step: int = 0, poll_interval: float = 0.002, timeout: float = 60.0,
                 on_step: Optional[Callable[[Update, list], None]] = None, name: str = "pgc",
                 replay: Optional[list] = None, optimistic: Optional[bool] = None,
                 channel=None):
        self.hvd = hvd
        self.scheme = scheme
        self.rank = int(rank)
        self.n = scheme.n
        self.d = int(d)
        self.ring_size = int(ring_size)
        self.width = int(payload_width)
        self._decode = decode
        self.device = device
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.on_step = on_step
        self.name = name
        self.step = int(start_step)          # the round being decided
        self.updates: list[Update] = []       # decided updates, self.updates[k].step == first + k
        self.first_step = int(start_step)
        self.cond = threading.Condition()
        self.error: Optional[BaseException] = None
        self._outbox: dict[int, Outgoing] = {}
        self._offered: set = set()            # (worker, step) already offered (same on all ranks)
        self._meta: dict = {}                 # (worker, step) -> (loss, ...) from control rows
        self._cache: dict = {}                # (worker, step) -> received payload (table schemes)
        self._bad_seen: set = set()
        self.bad_log: list[tuple[int, int]] = []
        self._bad_step = -1
        self._busy_total = 0.0
        self._done = False
        self._failed = False
        self._ops = 0
        self.control_rounds = 0
        self.bytes_moved = 0
        self._busy_prev = [0.0] * self.n
        self._c_request: Optional[int] = None   # rank 0: staleness bound to request
        self.c_changes: list[tuple[int, int]] = []
        # replayed arrival order: (worker, step) pairs offered strictly in this order while it
        # lasts (a message that is ready early waits), then ready-time order
        self._replay = [(int(w), int(k)) for w, k in replay] if replay else []
        self._replay_pos = 0
        # optimistic one-collective steps (module doc): payloads ride with control rows; CPU
        # tensors only (control rows live on the CPU; device payloads use the data phase)
        dev = torch.device(device) if device is not None else torch.device("cpu")
        self.optimistic = (dev.type == "cpu") if optimistic is None else bool(optimistic)
        if self.optimistic and dev.type != "cpu":
            raise ValueError("optimistic one-collective steps need CPU payloads")
        # control rounds through a key-value store (control_store.StoreChannel) instead of the
        # allgather: payloads cannot ride with the rows there
        self.channel = channel
        if channel is not None:
            if optimistic:
                raise ValueError("control='store' exchanges control rows through a key-value "
                                 "store, which cannot carry payloads: leave optimistic unset")
            self.optimistic = False
        self.ctrl_len = CTRL_FIXED + self.ring_size          # float64 fields per control row
        self._row = torch.empty(self.ctrl_len, dtype=torch.float64)
        # can a message for a past step still be used (bounded staleness table)?
        self._late_usable = getattr(scheme, "table", None) is not None
        self._wake = False
        self.data_rounds = 0
        self._bytes_since = 0
        self._thread = threading.Thread(target=self._run, name=f"{name}-agent", daemon=True)

    # -- training-thread side ------------------------------------------------
    def request_c_bound(self, c: int) -> None:
        """Ask every rank to decide with staleness bound ``c`` from the next control round on
        (see the module doc); only rank 0's request is sent."""
        with self.cond:
            self._c_request = int(c)
            self._wake = True
            self.cond.notify_all()

    def start(self) -> None:
        self._thread.start()

    def payload_buffer(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh ``(packed, payload)`` pair for one message: the training thread writes the
        payload (``width`` floats, a view of ``packed``) and submits ``Outgoing(...,
        packed=packed)``; the agent fills the control words in front when it sends."""
        head = 2 * self.ctrl_len if self.optimistic else 0
        packed = torch.empty(head + self.width, dtype=torch.float32, device=self.device)
        return packed, packed[head:]

    def submit(self, out: Outgoing, busy_total: float) -> None:
        with self.cond:
            self._outbox[out.step] = out
            self._busy_total = busy_total
            self._wake = True
            self.cond.notify_all()
        self._raise_if_failed()

    def report_bad(self, step: int, busy_total: float) -> None:
        with self.cond:
            self._bad_step = max(self._bad_step, int(step))
            self._busy_total = busy_total
            self._wake = True
            self.cond.notify_all()

    def wait_for(self, step: int, timeout: Optional[float] = None) -> None:
        """Block until the update of ``step`` is decided (or raise the agent's error)."""
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        with self.cond:
            while self.error is None and self.decided() <= step:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AgentError(
                        f"rank {self.rank}: step {step} was not decided within {limit:.0f}s "
                        f"(timeout); a rank may have died or hung")
                self.cond.wait(min(left, 1.0))
        self._raise_if_failed()

    def wait_decided_beyond(self, step: int, seconds: float) -> bool:
        """Sleep up to ``seconds``, returning early (True) once ``step`` is decided."""
        deadline = time.monotonic() + seconds
        with self.cond:
            while self.error is None and self.decided() <= step:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def decided(self) -> int:
        """Number of steps decided so far (the next round's step)."""
        return self.first_step + len(self.updates)

    def take(self, step: int) -> Update:
        with self.cond:
            return self.updates[step - self.first_step]

    def release_before(self, step: int) -> None:
        """Drop update tensors older than ``step`` (the training thread applied them)."""
        with self.cond:
            for k in range(0, max(0, step - self.first_step)):
                u = self.updates[k]
                if u is not None and u.flat is not None:
                    self.updates[k] = Update(u.step, None, u.decision, u.time, u.info)

    def finish(self, timeout: Optional[float] = None) -> None:
        """This rank's loop is done: keep serving collectives until every rank is done."""
        with self.cond:
            self._done = True
            self._wake = True
            self.cond.notify_all()
        self._thread.join(self.timeout if timeout is None else timeout)
        if self._thread.is_alive():
            raise AgentError(f"rank {self.rank}: the other ranks did not finish within "
                             f"{self.timeout:.0f}s")
        self._raise_if_failed()

    def fail(self) -> None:
        """The training thread raised: tell the other ranks (they stop with a clear error)."""
        with self.cond:
            self._failed = True
            self._wake = True
            self.cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise AgentError(str(self.error)) from self.error

    # -- agent thread --------------------------------------------------------
    def _collective(self, tensor: torch.Tensor, kind: str) -> torch.Tensor:
        self._ops += 1
        name = f"{self.name}.{kind}.{self._ops}"
        try:
            handle = self.hvd.allgather_async(tensor, name=name)
            if not wait_for_handle(self.hvd, handle, self.timeout):
                raise AgentError(
                    f"rank {self.rank}: collective {name} (step {self.step}) got no answer "
                    f"within {self.timeout:.0f}s: a rank has died or hung; stopping instead "
                    f"of hanging")
            return self.hvd.synchronize(handle)
        except AgentError:
            raise
        except Exception as err:
            raise AgentError(
                f"rank {self.rank}: collective {name} (step {self.step}) failed: a rank has died "
                f"or shut down Horovod; stopping ({type(err).__name__}: {err})") from err

    def _control_row(self) -> tuple[torch.Tensor, Optional[Outgoing]]:
        """This rank's control row and, when its payload rides along, the message."""
        row = self._row
        row.fill_(-1.0)
        out_with_payload = None
        with self.cond:
            pending = sorted(k for k in self._outbox if (self.rank, k) not in self._offered)
            if pending:
                out = self._outbox[pending[0]]
                row[CTRL_READY_STEP] = out.step
                row[CTRL_VERSION] = out.version
                row[CTRL_READY_TIME] = out.ready_time
                row[CTRL_LOSS] = out.loss
                row[CTRL_ERROR] = out.error_norm
                for i, v in enumerate(out.slot_versions[: self.ring_size]):
                    row[CTRL_FIXED + i] = v
                # optimistic: the payload goes with the first control row that shows the message,
                # unless no decision can use it any more (a late message of an exact/pipelined
                # scheme, which ignores arrivals for past steps)
                if (self.optimistic and not out.sent and out.packed is not None
                        and (out.step >= self.step or self._late_usable)):
                    out.sent = True
                    out_with_payload = out
            else:
                row[CTRL_LOSS] = math.nan
            row[CTRL_BUSY] = self._busy_total
            row[CTRL_BAD_STEP] = self._bad_step
            row[CTRL_DONE] = 1.0 if self._done else 0.0
            row[CTRL_FAILED] = 1.0 if self._failed else 0.0
            row[CTRL_PAYLOAD] = 0.0 if out_with_payload is None else 1.0
            if self.rank == 0 and self._c_request is not None:
                row[CTRL_C_BOUND] = self._c_request
        return row, out_with_payload

    def _control_round(self) -> tuple[list, dict]:
        """One control allgather: every rank's control row (as lists of floats) and the payloads
        that rode along, ``{(worker, step): payload row}`` (identical on every rank)."""
        row, out = self._control_row()
        C = self.ctrl_len
        if self.channel is not None:
            self._ops += 1
            return self.channel.exchange(row), {}
        if not self.optimistic:
            ctl = self._collective(row.view(1, C), "ctl")
            return ctl.tolist(), {}
        words = row.view(torch.float32)                      # 2C float32 words, bit-exact
        if out is not None:
            send = out.packed
            send[: 2 * C].copy_(words)
        else:
            send = words
        got = self._collective(send, "ctl")
        rows, payloads, off = [], {}, 0
        for _ in range(self.n):
            r = got[off: off + 2 * C].clone().view(torch.float64).tolist()
            off += 2 * C
            rows.append(r)
            if r[CTRL_PAYLOAD] > 0:
                w = len(rows) - 1
                payloads[(w, int(r[CTRL_READY_STEP]))] = got[off: off + self.width]
                off += self.width
        if off != got.numel():
            raise AgentError(f"rank {self.rank}: control allgather of {got.numel()} words does "
                             f"not parse ({off} expected): ranks disagree on the message layout")
        return rows, payloads

    def _run(self) -> None:
        try:
            self._loop()
            if self.channel is not None:
                self.channel.close()
        except BaseException as err:  # surfaced to the training thread
            log.error("pgc_hvd agent on rank %d stopped: %s", self.rank, err)
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

    def _loop(self) -> None:
        rnd = self.scheme.open_round(self.step)
        step_start = time.time()
        n = self.n
        while True:
            ctl, payloads = self._control_round()
            self.control_rounds += 1
            for key, p in payloads.items():
                self._cache[key] = p
                self._bytes_since += p.numel() * p.element_size()
            failed = [w for w in range(n) if ctl[w][CTRL_FAILED] > 0]
            if failed:
                raise AgentError(f"rank(s) {failed} failed (their training thread raised); "
                                 f"stopping rank {self.rank}")
            if all(ctl[w][CTRL_DONE] > 0 for w in range(n)):
                return
            self._apply_c_bound(int(ctl[0][CTRL_C_BOUND]))
            for w in range(n):
                b = int(ctl[w][CTRL_BAD_STEP])
                if b >= 0 and (w, b) not in self._bad_seen:
                    self._bad_seen.add((w, b))
                    self.bad_log.append((w, b))
                    if self.rank == 0:
                        log.warning("rank %d's message for step %d holds NaN/Inf: treated as a "
                                    "straggler, never applied", w, b)
            arrivals = []
            for w in range(n):
                k = int(ctl[w][CTRL_READY_STEP])
                if k >= 0 and (w, k) not in self._offered:
                    arrivals.append((ctl[w][CTRL_READY_TIME], w, k))
            arrivals.sort()
            replaying = self._replay_pos < len(self._replay)
            if replaying:
                arrivals = self._replay_order(arrivals)
            decision = None
            for _, w, k in arrivals:
                if replaying:
                    self._replay_pos += 1
                row = ctl[w]
                slots = tuple(int(v) for v in row[CTRL_FIXED:] if v >= 0)
                self._offered.add((w, k))
                self._meta[(w, k)] = row[CTRL_LOSS]
                err = row[CTRL_ERROR]
                arr = Arrival(w, k, version=int(row[CTRL_VERSION]), message=None,
                              error_norm=None if math.isnan(err) else float(err),
                              slot_versions=slots or None)
                decision = rnd.offer(arr)
                if decision is not None:
                    break  # later arrivals of this batch are offered to the next round
            if decision is None:
                decision = rnd.poll()
            if decision is None:
                self._check_stuck(ctl, rnd)
                self._idle(hurry=bool(rnd.arrived))
                continue
            busy = [ctl[w][CTRL_BUSY] for w in range(n)]
            update = self._data_phase(decision, step_start)
            busy_step = [b - p for b, p in zip(busy, self._busy_prev)]
            self._busy_prev = busy
            if self.on_step is not None:
                self.on_step(update, busy_step)
            with self.cond:
                self.updates.append(update)
                self.cond.notify_all()
            self.step += 1
            step_start = update.time
            if self.step % 64 == 0:  # forget bookkeeping of long-gone steps
                old = self.step - 32
                self._offered = {k for k in self._offered if k[1] >= old}
                self._meta = {k: v for k, v in self._meta.items() if k[1] >= old}
            rnd = self.scheme.open_round(self.step)

    def _apply_c_bound(self, c: int) -> None:
        """Set the scheme's staleness bound to rank 0's request c (>= 1) when it differs."""
        if c >= 1 and getattr(self.scheme, "c_bound", c) != c:
            self.scheme.c_bound = c
            self.c_changes.append((self.step, c))

    def _replay_order(self, arrivals: list) -> list:
        """The ready arrivals that come next in the replayed order, in that order (each rank's
        control row shows one message, so the run continues over the next control rounds)."""
        ready = {(w, k): (tm, w, k) for tm, w, k in arrivals}
        out = []
        pos = self._replay_pos
        while pos < len(self._replay) and self._replay[pos] in ready:
            out.append(ready.pop(self._replay[pos]))
            pos += 1
        return out

    def _check_stuck(self, ctl, rnd) -> None:
        t = self.step
        gone = set(rnd.arrived)
        gone |= {w for w in range(self.n) if int(ctl[w][CTRL_BAD_STEP]) == t}
        done = {w for w in range(self.n) if ctl[w][CTRL_DONE] > 0}
        if len(gone | done) == self.n:
            bad = sorted(w for w in range(self.n) if int(ctl[w][CTRL_BAD_STEP]) == t)
            raise AgentError(
                f"step {t} cannot be decoded by {self.scheme.name} (n={self.n}, s={self.scheme.s}): "
                f"arrived {sorted(rnd.arrived)}, non-finite messages from {bad}, finished ranks "
                f"{sorted(done)}. Too many stragglers for s, or ranks finished at different steps "
                f"(loop on `optimizer.version < steps`)")

    def _data_phase(self, decision: Decision, step_start: float) -> Update:
        """Decode the decision's update. Payloads that rode along with control rows are cached
        (identically on every rank); only the uses missing from the cache (two-phase mode, or a
        late message of bounded staleness sent without its payload) need the data allgather."""
        uses = sorted(decision.uses, key=lambda u: (u.worker, u.step))
        needed = [(u.worker, u.step) for u in uses if (u.worker, u.step) not in self._cache]
        received: dict = {}
        if needed:
            mine = [k for k in needed if k[0] == self.rank]
            with self.cond:
                rows = [self._outbox[k[1]].payload for k in mine]
            send = (torch.stack(rows) if rows else
                    torch.zeros((0, self.width), dtype=torch.float32, device=self.device))
            got = self._collective(send, "data")
            self.data_rounds += 1
            self._bytes_since += got.numel() * got.element_size()
            order = [k for w in range(self.n) for k in needed if k[0] == w]
            for i, key in enumerate(order):
                received[key] = got[i]
        msgs, weights = [], []
        for u in uses:
            key = (u.worker, u.step)
            msgs.append(self._cache.get(key, received.get(key)))
            weights.append(u.weight)
        flat = self._decode(msgs, weights, decision)
        now = time.time()
        # keep only what the scheme may use again (bounded staleness table) and payloads of
        # messages not offered yet (shown in a control row after the decision fired); prune
        # own outbox
        table = getattr(self.scheme, "table", None)
        keep = {(e[0], e[1]) for e in table if e is not None} if table is not None else set()
        for key, m in received.items():
            if key in keep:
                self._cache[key] = m
        self._cache = {k: v for k, v in self._cache.items()
                       if k in keep or (k not in self._offered and k[1] >= decision.step)}
        with self.cond:
            for k in list(self._outbox):
                if (self.rank, k) in self._offered and (self.rank, k) not in keep:
                    del self._outbox[k]
        losses = [self._meta.get((u.worker, u.step), math.nan) for u in uses]
        losses = [x for x in losses if math.isfinite(x)]
        info = {"loss": sum(losses) / len(losses) if losses else None,
                "step_time": now - step_start, "control_rounds": self.control_rounds,
                "data_rounds": self.data_rounds, "bytes": int(self._bytes_since)}
        self._bytes_since = 0
        return Update(decision.step, flat, decision, now, info)
