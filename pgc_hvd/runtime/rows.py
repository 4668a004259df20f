"""The control rows: what every rank tells the others (float64 words), what they have shown, and
what is decided from them.

Owns the row's layout, its packing (:func:`pack_row`) and parsing, what is read back from the
rows alone (:func:`used_metrics`, :func:`not_decided_message`), :class:`ArrivalBook`, the
agent's record of the arrivals the rows have shown, and :class:`Decider`, the decision body on
them (below). Threads: the agent thread (the book, the decider); :func:`pack_row` also on the
thread where an event happens (the training thread; any for the agent's ``leave``).

========================  ==========================================================================
field                     meaning
========================  ==========================================================================
``CTRL_READY_STEP``       step of the oldest message not yet offered, -1 when none
``CTRL_VERSION``          model version that message was computed at
``CTRL_READY_TIME``       ``time.time()`` when it became ready (orders arrivals across ranks)
``CTRL_LOSS``             training loss reported with it (nan when none)
``CTRL_BUSY``             cumulative busy seconds of the rank's training thread
``CTRL_BAD_STEP``         newest step whose message held NaN/Inf, -1 when none
``CTRL_DONE``             1 when the rank's training loop has finished
``CTRL_FAILED``           1 when the rank's training thread raised
``CTRL_PAYLOAD``          1 when the message's payload follows this row in the same allgather
``CTRL_STALENESS_BOUND``  rank 0 only: the staleness bound c requested for the scheme, -1 = none
``CTRL_ERROR``            ||C(u) - u||, the message's compression error (nan when not sent)
``CTRL_FIXED`` + i        version of ring slot i of the message (``ring_size`` entries, -1 padded)
``metrics_at(r)`` + j     user metric j reported with the message (``metrics`` = k entries, fixed
                          when the agent is built, default 0; nan when none), :func:`metric_values`
========================  ==========================================================================

A row is ``ctrl_len(ring_size, metrics)`` = 11 + ring_size + k float64 words, 8 (11 + L + k)
bytes per rank per control round.

Packed form (optimistic one-collective rounds, :class:`~pgc_hvd.runtime.channel.AllgatherChannel`):
one 1-D float32 tensor per rank, the row's float64 words bit-cast to 2 ``ctrl_len`` float32
words, followed by the payload row when ``CTRL_PAYLOAD`` is set; :func:`parse_packed` splits the
allgathered concatenation back into rows and payloads.

What the control rows have shown: the arrivals a rank's agent offers to the scheme.
:class:`ArrivalBook` (at the end of this module) is the agent's record of the rows of every control round (the same
rows on every rank, so the same record everywhere): which messages ``(worker, step)`` have been
offered to the scheme's ``Round``, the loss and user metrics each carried, the newest step each
rank has shown, the log of non-finite messages (``bad_log``), and the replayed arrival order
(``replay=[(worker, step), ...]``: offered strictly in that order while it lasts). It turns a
round's rows into :class:`~pgc_hvd.schemes.Arrival` objects in offer order ((ready time, rank),
or the replay's) and forgets the bookkeeping of long-gone steps. It never calls a collective
and holds no lock: the agent thread owns it (the training thread reads ``bad_log`` only).

The decision on the rows (at the end of this module): :class:`Decider`, the decision body on
one view of every rank's row (the same on every rank, so the same decisions everywhere),
offers the new arrivals to the scheme's ``Round`` until it fires, reading only the rows that
changed since its last run (:class:`RowState`); it raises on a failed rank or a round that can
no longer fire, finds a step no rank still training needs (``IDLE``), and sets the staleness
bound rank 0's row requests. It is built on its own (scheme, rank, book) and holds no lock and
calls no collective: the agent (:class:`~pgc_hvd.runtime.agent.CommAgent`) has one and runs it
on its thread, polled or under :func:`~pgc_hvd.runtime.control_log.log_loop`.

May import: numpy, torch, ``runtime.errors`` and ``schemes``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Iterator, Optional

import numpy as np
import torch

from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.schemes import Arrival, Scheme

CTRL_READY_STEP = 0
CTRL_VERSION = 1
CTRL_READY_TIME = 2
CTRL_LOSS = 3
CTRL_BUSY = 4
CTRL_BAD_STEP = 5
CTRL_DONE = 6
CTRL_FAILED = 7
CTRL_PAYLOAD = 8
CTRL_STALENESS_BOUND = 9
CTRL_ERROR = 10
CTRL_FIXED = 11


def ctrl_len(ring_size: int, metrics: int = 0) -> int:
    """float64 words of one control row: the fixed fields, ``ring_size`` slot versions, then
    ``metrics`` user metric slots."""
    return CTRL_FIXED + int(ring_size) + int(metrics)


def metrics_at(ring_size: int) -> int:
    """Index of the first user metric slot of a row with ``ring_size`` slot versions."""
    return CTRL_FIXED + int(ring_size)


def slot_versions(row, ring_size: int | None = None) -> tuple:
    """The ring slot versions a control row carries (the -1 padding removed); give
    ``ring_size`` when the row also carries metrics (they follow the slot versions)."""
    end = None if ring_size is None else CTRL_FIXED + int(ring_size)
    return tuple(int(v) for v in row[CTRL_FIXED:end] if v >= 0)


def metric_values(row, ring_size: int, metrics: int) -> tuple:
    """The ``metrics`` user metric values a control row carries (nan: not reported)."""
    start = metrics_at(ring_size)
    return tuple(float(v) for v in row[start: start + int(metrics)])


def pack_row(row: torch.Tensor, out=None, *, ring_size: int, metrics: int = 0, busy: float = 0.0,
             bad_step: int = -1, done: float = 0.0, failed: bool = False,
             payload: bool = False, c_request=None) -> torch.Tensor:
    """Write one control row into ``row`` (float64, ``ctrl_len(ring_size, metrics)`` words):
    the message ``out`` (an :class:`~pgc_hvd.runtime.agent.Outgoing`: step, version, ready
    time, loss, compression error, slot versions, user metrics; None: no message, -1 and nan)
    and the rank's state (busy seconds, newest non-finite step, done = 1 + the version its loop
    ended at or 0, failed, payload follows, rank 0's requested staleness bound or None)."""
    tensor, row = row, row.numpy()   # written through numpy: a word costs ns, not us
    row.fill(-1.0)
    at = metrics_at(ring_size)
    if out is not None:
        row[CTRL_READY_STEP] = out.step
        row[CTRL_VERSION] = out.version
        row[CTRL_READY_TIME] = out.ready_time
        row[CTRL_LOSS] = out.loss
        row[CTRL_ERROR] = out.error_norm
        for i, v in enumerate(out.slot_versions[: ring_size]):
            row[CTRL_FIXED + i] = v
        for j in range(metrics):
            row[at + j] = float(out.metrics[j]) if out.metrics else math.nan
    else:
        row[CTRL_LOSS] = math.nan
        row[at: at + metrics] = math.nan
    row[CTRL_BUSY] = busy
    row[CTRL_BAD_STEP] = bad_step
    row[CTRL_DONE] = done
    row[CTRL_FAILED] = 1.0 if failed else 0.0
    row[CTRL_PAYLOAD] = 1.0 if payload else 0.0
    if c_request is not None:
        row[CTRL_STALENESS_BOUND] = c_request
    return tensor


class WireError(RuntimeError):
    """An allgathered control tensor does not parse: ranks disagree on the layout."""


def parse_packed(got: torch.Tensor, n: int, length: int, width: int) -> tuple[list, dict]:
    """Split an allgather of n packed rows ([2 ``length`` float32 words of the row | payload of
    ``width`` words when its CTRL_PAYLOAD is set], rank after rank) into (rows as lists of
    floats, ``{(rank, step): payload view}``)."""
    rows, payloads, off = [], {}, 0
    words = 2 * length
    for w in range(n):
        if off + words > got.numel():
            raise WireError(f"control allgather of {got.numel()} words ends inside rank {w}'s "
                            f"row: ranks disagree on the message layout")
        r = got[off: off + words].clone().view(torch.float64).tolist()
        off += words
        rows.append(r)
        if r[CTRL_PAYLOAD] > 0:
            payloads[(w, int(r[CTRL_READY_STEP]))] = got[off: off + width]
            off += width
    if off != got.numel():
        raise WireError(f"control allgather of {got.numel()} words does not parse ({off} "
                        f"expected): ranks disagree on the message layout")
    return rows, payloads


def used_metrics(uses, metric_meta: dict, k: int) -> dict:
    """The user metrics of the messages a decision used, from their control rows (the same
    rows on every rank, so every rank gets the same values; ``metric_meta``: (worker, step) ->
    its k values): ``metrics`` = per slot j, the mean of the finite values x_{u,j} over the used
    messages u (NaN where none was finite), ``metrics_count`` = how many were averaged per
    slot, ``metrics_from`` = the used messages ``(worker, step)`` in that order."""
    sums, counts = [0.0] * k, [0] * k
    for u in uses:
        vals = metric_meta.get((u.worker, u.step))
        if vals is None:
            continue
        for j, x in enumerate(vals):
            if math.isfinite(x):
                sums[j] += x
                counts[j] += 1
    return {"metrics": tuple(sm / c if c else math.nan for sm, c in zip(sums, counts)),
            "metrics_count": tuple(counts),
            "metrics_from": tuple((u.worker, u.step) for u in uses)}


def not_decided_message(rank: int, step: int, limit: float, *, rows, n: int, quiet: float,
                        ended_at, open_step: int, arrived: set, poll_interval: float) -> str:
    """Why ``step`` is not decided after ``limit`` seconds, from what the last control rows
    showed (``rows``, ``quiet`` seconds ago): a rank's loop ended (``ended_at``), no round
    completes (a rank died or hung), or the open round waits for named ranks."""
    head = f"rank {rank}: step {step} was not decided within {limit:.0f}s (timeout)"
    if ended_at is not None and step >= ended_at:
        return (f"{head}: a rank's training loop ended at version {ended_at}, and no "
                f"step from there on is decided. Every rank must run the same number of "
                f"updates: give every rank's loop the same number of step() calls (each "
                f"applies one update), e.g. `for i in range(steps)` or `while "
                f"optimizer.version < steps`, not a loop that ends on time or on local "
                f"data")
    if rows is None or quiet > min(limit / 2, 5.0 + 10 * poll_interval):
        return (f"{head}: no control round has completed for {quiet:.0f}s, so a rank has "
                f"died or hung (its process is frozen; the allgather cannot tell which rank, "
                f"control='store' names it)")
    waiting = [w for w in range(n) if w not in arrived and rows[w][CTRL_DONE] <= 0]
    return (f"{head}: the open round (step {open_step}) waits for ranks {waiting}, which are "
            f"alive (their control rows keep coming) but have not delivered a message: they "
            f"are slower than the timeout (raise timeout=) or their training loop hung")


# ---- what the rows have shown: the arrivals offered to the scheme -----------------------------

#: the decision body's outcomes besides a Decision (:meth:`~pgc_hvd.runtime.agent.DecisionBody.decide`)
END, IDLE, WAIT = object(), object(), object()

log = logging.getLogger("pgc_hvd.runtime")


class ArrivalBook:
    """The control rows' record of one rank's agent (module doc)."""

    def __init__(self, n: int, ring_size: int, metrics: int = 0,
                 replay: Optional[list] = None):
        self.n, self.ring_size, self.metrics = int(n), int(ring_size), int(metrics)
        #: (worker, step) already offered to the scheme (the same on every rank)
        self.offered: set = set()
        self._loss: dict = {}                 # (worker, step) -> loss from its control row
        self._metrics: dict = {}              # (worker, step) -> its k metrics
        self._bad_seen: set = set()
        #: (rank, step) of every message that held NaN/Inf, in the order the rows showed them
        self.bad_log: list[tuple[int, int]] = []
        #: newest step each rank has shown a message for
        self.newest = [-1] * self.n
        self._replay = [(int(w), int(k)) for w, k in replay] if replay else []
        self._replay_pos = 0

    def see_ready(self, ctl, ranks=None) -> None:
        """Note the newest step each row shows ready (``ranks``: only these rows changed since
        the last call; None: all)."""
        for w in range(self.n) if ranks is None else ranks:
            self.newest[w] = max(self.newest[w], int(ctl[w][CTRL_READY_STEP]))

    def see_bad(self, ctl, *, warn: bool, ranks=None) -> None:
        """Log the non-finite messages the rows report (``warn``: once each, on rank 0;
        ``ranks``: only these rows changed, in rank order; None: all)."""
        for w in range(self.n) if ranks is None else ranks:
            b = int(ctl[w][CTRL_BAD_STEP])
            if b >= 0 and (w, b) not in self._bad_seen:
                self._bad_seen.add((w, b))
                self.bad_log.append((w, b))
                if warn:
                    log.warning("rank %d's message for step %d holds NaN/Inf: treated as a "
                                "straggler, never applied", w, b)

    def arrivals(self, ctl, ranks=None) -> Iterator[Arrival]:
        """The rows' new arrivals in offer order, each recorded as offered just before it is
        yielded (stop iterating once the round decides: the rest are shown again next round).
        ``ranks``: the only rows that may show one (None: all)."""
        arrivals = []
        for w in range(self.n) if ranks is None else ranks:
            k = int(ctl[w][CTRL_READY_STEP])
            if k >= 0 and (w, k) not in self.offered:
                arrivals.append((ctl[w][CTRL_READY_TIME], w, k))
        arrivals.sort()
        replaying = self._replay_pos < len(self._replay)
        if replaying:
            arrivals = self._replay_order(arrivals)
        for _, w, k in arrivals:
            if replaying:
                self._replay_pos += 1
            row = ctl[w]
            self.offered.add((w, k))
            self._loss[(w, k)] = row[CTRL_LOSS]
            if self.metrics:
                self._metrics[(w, k)] = metric_values(row, self.ring_size, self.metrics)
            err = row[CTRL_ERROR]
            yield Arrival(w, k, version=int(row[CTRL_VERSION]), message=None,
                          error_norm=None if math.isnan(err) else float(err),
                          slot_versions=slot_versions(row, self.ring_size) or None)

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

    def used_info(self, uses) -> dict:
        """``loss`` (the mean of the finite losses the used messages carried, None where none)
        and, with user metrics, their means (:func:`~pgc_hvd.runtime.rows.used_metrics`)."""
        losses = [self._loss.get((u.worker, u.step), math.nan) for u in uses]
        losses = [x for x in losses if math.isfinite(x)]
        info = {"loss": sum(losses) / len(losses) if losses else None}
        if self.metrics:
            info.update(used_metrics(uses, self._metrics, self.metrics))
        return info

    def forget_before(self, old: int) -> None:
        """Drop the bookkeeping of steps before ``old``."""
        self.offered = {k for k in self.offered if k[1] >= old}
        self._loss = {k: v for k, v in self._loss.items() if k[1] >= old}
        self._metrics = {k: v for k, v in self._metrics.items() if k[1] >= old}

    def sizes(self) -> dict:
        """Sizes of its containers (``CommAgent.bookkeeping``)."""
        return {"offered": len(self.offered), "meta": len(self._loss),
                "bad_log": len(self.bad_log)}


# ---- the decision on the rows --------------------------------------------------------------


class RowState:
    """What the decision body keeps of the rows it has read, so that a run reads only the rows
    that changed since the previous one (O(1) per row, not O(n) per run): the failed and
    finished ranks, the version each finished rank's loop ended at and how many ranks show
    each, each rank's non-finite step and how many ranks show each, how many ranks still
    training show each newest step, and the ranks whose row shows a message not yet offered
    (``carried``: a decision fired before it was offered)."""

    def __init__(self, n: int):
        self.n = int(n)
        self.failed: set = set()
        self.done: set = set()
        self.ended = [None] * self.n     # the version a finished rank's loop ended at
        self.ended_count: dict = {}      # ended version -> how many finished ranks show it
        self.bad = [None] * self.n       # the newest step a rank's message was non-finite at
        self.bad_count: dict = {}        # non-finite step -> how many ranks show it
        self.live = [None] * self.n      # the newest step a rank still training has shown
        self.live_count: dict = {}       # newest step -> how many ranks still training show it
        self.carried: set = set()
        #: the next run reads every row (the first one; after the book forgot old steps, whose
        #: messages a row may show again)
        self.full = True

    def see(self, ctl, ranks) -> None:
        for w in ranks:
            row = ctl[w]
            (self.failed.add if row[CTRL_FAILED] > 0 else self.failed.discard)(w)
            done = row[CTRL_DONE] > 0
            (self.done.add if done else self.done.discard)(w)
            self.ended[w] = _recount(self.ended_count, self.ended[w],
                                     int(row[CTRL_DONE]) - 1 if done else None)
            b = int(row[CTRL_BAD_STEP])
            self.bad[w] = _recount(self.bad_count, self.bad[w], b if b >= 0 else None)

    def carry(self, ctl, candidates, offered) -> None:
        """Keep, of ``candidates`` (the rows a run could offer), the ranks whose row shows a
        message not yet ``offered``: the next run offers them, changed or not."""
        self.carried = {w for w in candidates if int(ctl[w][CTRL_READY_STEP]) >= 0
                        and (w, int(ctl[w][CTRL_READY_STEP])) not in offered}

    def see_newest(self, newest, ranks) -> None:
        """Count the ranks still training by the newest step they have shown (``newest``: the
        book's, already updated for ``ranks``)."""
        for w in ranks:
            self.live[w] = _recount(self.live_count, self.live[w],
                                    None if w in self.done else newest[w])

    def computed_by_live(self, step: int) -> bool:
        """Whether a rank still training has shown a message for ``step`` or later (O(the
        distinct newest steps shown), a few: the ranks train within a few steps of each
        other)."""
        return any(k >= step for k in self.live_count)


def _recount(count: dict, old, new):
    """Move one rank from key ``old`` to key ``new`` of ``count`` (None: not counted; a key
    whose count drops to 0 goes); returns ``new``."""
    if old != new:
        if old is not None:
            count[old] -= 1
            if not count[old]:
                del count[old]
        if new is not None:
            count[new] = count.get(new, 0) + 1
    return new


class Decider:
    """The decision body, on one view of every rank's control row (the same on every rank): a
    pure function of the rows seen so far (module doc). The agent has one
    (:attr:`~pgc_hvd.runtime.agent.CommAgent.decider`) and runs it in the polled control rounds
    (:meth:`~pgc_hvd.runtime.agent.CommAgent._loop`) or under ``control="log"``
    (:func:`pgc_hvd.runtime.control_log.log_loop`); a decided step's data phase is the
    agent's (its ``fire``), which then calls :meth:`next_round`.

    ``scheme``: this rank's copy of the scheme (its ``Round`` decides); ``book``: the
    :class:`ArrivalBook` the rows are recorded in; ``step``: the first step to decide;
    ``every_row``: see :attr:`every_row`."""

    def __init__(self, scheme, rank: int, book: "ArrivalBook", *, step: int = 0,
                 every_row: bool = False):
        self.scheme, self.n, self.rank, self.book = scheme, scheme.n, int(rank), book
        #: read all n rows at every run, changed or not (as a polled round does): the
        #: reference that reading only the changed rows is tested against
        self.every_row = bool(every_row)
        self.step = int(step)              # the round being decided
        self.control_rounds = 0            # runs of the body (control rounds when polled)
        #: the staleness bound c_0 the agent was built with (None: c is the code's)
        self.staleness_c0: Optional[int] = (int(scheme.staleness_bound)
                                            if scheme.staleness_bound_adjustable else None)
        self.staleness_changes: list[tuple[int, int]] = []
        #: the step at which a finished rank's loop ended (IDLE), the rows of the last run and
        #: when it ran (for the not-decided message): none before the first run
        self.ended_at: Optional[int] = None
        self.last_rows = None
        self.last_round_at = time.monotonic()
        self.step_start = time.time()      # when the open step's round opened (step_time)
        self._round = None
        self._rows_state = RowState(self.n)

    def open_round(self) -> None:
        """Open the round of the current step (at the start of the decision loop)."""
        self._round = self.scheme.open_round(self.step)
        self.step_start = time.time()
        self._rows_state = RowState(self.n)

    @property
    def current_round(self):
        """The scheme's open ``Round`` (read only; for error messages)."""
        return self._round

    def decide(self, ctl, changed=None) -> object:
        """The decision body on one view of every rank's control row (the same on every rank):
        raises on a failed rank or a round that cannot fire; returns ``END`` (every rank is
        done), ``IDLE`` (a rank's loop ended before the open step: nothing to decide),
        ``WAIT`` (the open round needs more arrivals) or the scheme's Decision. A pure function
        of the rows seen so far (the control plane calls it: the polled loop below, the
        control log's decider and followers). ``changed``: the ranks whose row differs from
        the previous call's (the control log's view knows them), so a run costs O(1) per
        changed row; None: every row may have changed (a polled round)."""
        self.control_rounds += 1
        self.last_rows, self.last_round_at = ctl, time.monotonic()
        n, book, rnd, st = self.n, self.book, self._round, self._rows_state
        full = changed is None or st.full or self.every_row
        ranks = range(n) if full else sorted(changed)
        st.full = False
        st.see(ctl, ranks)
        if st.failed:
            failed = sorted(st.failed)
            raise AgentError(f"rank(s) {failed} failed (their training thread raised); "
                             f"stopping rank {self.rank}", failed_ranks=failed)
        if len(st.done) == n:
            return END
        self._apply_staleness_bound(int(ctl[0][CTRL_STALENESS_BOUND]))
        book.see_ready(ctl, ranks)
        st.see_newest(book.newest, ranks)
        book.see_bad(ctl, warn=self.rank == 0, ranks=ranks)
        # the rows that may show a message not yet offered: the changed ones, and those
        # whose message a decision fired before (or a replay held back, or an IDLE run did
        # not offer)
        candidates = ranks if full else sorted(set(ranks) | st.carried)
        if st.done:
            ended = min(st.ended_count)
            if self.step >= ended and not st.computed_by_live(self.step):
                # a rank's loop ended at or before this step, and no rank still training has
                # computed it: it is not needed (every rank loops on `optimizer.version <
                # steps`), and deciding it (a bounded-staleness round can fire from its
                # table, or on a late message) would move every rank past the version its
                # loop stopped at. A rank still training that computes it makes it needed
                # again (a rank that left its loop early catches up at close()).
                self.ended_at = ended
                st.carry(ctl, candidates, book.offered)
                return IDLE
        decision = None
        for arr in book.arrivals(ctl, candidates):
            decision = rnd.offer(arr)
            if decision is not None:
                break  # later arrivals of this batch are offered to the next round
        st.carry(ctl, candidates, book.offered)
        if decision is None:
            decision = rnd.poll()
        if decision is None:
            if self._may_be_stuck(rnd):
                self._check_stuck(ctl, rnd)
            return WAIT
        return decision

    def _may_be_stuck(self, rnd) -> bool:
        """Whether the open round might no longer be able to fire: with the schemes' rule
        (:meth:`~pgc_hvd.schemes.Scheme.can_fire`: while anyone is pending) only when the
        ranks that arrived, sent a non-finite message for it or finished may be all n (a
        count, O(1)); any other rule: always (the O(n) check)."""
        if type(self.scheme).can_fire is not Scheme.can_fire:
            return True
        st = self._rows_state
        return (len(rnd.arrived) + st.bad_count.get(self.step, 0) + len(st.done)) >= self.n

    def next_round(self) -> None:
        """After a decided step: step + 1, the bookkeeping of long-gone steps forgotten every
        64 steps, the next step's round opened (the agent's ``fire`` calls it after the data
        phase)."""
        self.step += 1
        if self.step % 64 == 0:  # forget bookkeeping of long-gone steps
            self.book.forget_before(self.step - 32)
            self._rows_state.full = True   # a row may show a forgotten message again
        self._round = self.scheme.open_round(self.step)

    @property
    def staleness_bound(self) -> Optional[int]:
        """The bound c the decisions currently use (None for schemes whose c is the code's)."""
        c = self.scheme.staleness_bound
        return None if c is None or not self.scheme.staleness_bound_adjustable else int(c)

    def check_staleness_bound(self, c) -> None:
        """ValueError unless ``c`` is a bound the agent can request: an integer in [1, c_0]
        for a scheme whose c can change."""
        if self.staleness_c0 is None:
            raise ValueError(f"{self.scheme.name}: its pipeline depth c is fixed by the code; "
                             f"only bounded-staleness has a staleness bound that can change "
                             f"(lower the learning rate instead)")
        if (isinstance(c, bool) or not isinstance(c, (int, np.integer))
                or not 1 <= c <= self.staleness_c0):
            raise ValueError(f"staleness bound c must be an integer in [1, "
                             f"{self.staleness_c0}] (the c this optimizer was built with), "
                             f"got {c!r}")

    def _apply_staleness_bound(self, c: int) -> None:
        """Set the scheme's staleness bound to rank 0's request c (>= 1) when it differs."""
        sch = self.scheme
        if c >= 1 and sch.staleness_bound_adjustable and sch.staleness_bound != c:
            sch.staleness_bound = c
            self.staleness_changes.append((self.step, c))

    def _check_stuck(self, ctl, rnd) -> None:
        """Raise when the scheme says the open round can no longer fire
        (:meth:`~pgc_hvd.schemes.Scheme.can_fire`): the ranks still pending are those that
        have not arrived, sent no non-finite message for this step and have not finished."""
        t = self.step
        gone = set(rnd.arrived)
        gone |= {w for w in range(self.n) if int(ctl[w][CTRL_BAD_STEP]) == t}
        done = {w for w in range(self.n) if ctl[w][CTRL_DONE] > 0}
        if not self.scheme.can_fire(rnd, set(range(self.n)) - gone - done):
            bad = sorted(w for w in range(self.n) if int(ctl[w][CTRL_BAD_STEP]) == t)
            raise AgentError(
                f"step {t} cannot be decoded by {self.scheme.name} (n={self.n}, s={self.scheme.s}): "
                f"arrived {sorted(rnd.arrived)}, non-finite messages from {bad}, finished ranks "
                f"{sorted(done)}. Too many stragglers for s, or ranks finished at different steps "
                f"(give every rank the same number of step() calls)")
