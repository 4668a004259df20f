"""The control rows: what every rank tells the others (float64 words), and what they have shown.

Owns the row's layout, its packing (:func:`pack_row`) and parsing, what is read back from the
rows alone (:func:`used_metrics`, :func:`not_decided_message`), and :class:`ArrivalBook`, the
agent's record of the arrivals the rows have shown (below).

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

May import: torch and ``schemes``.
"""

from __future__ import annotations

import logging
import math
from typing import Iterator, Optional

import torch

from pgc_hvd.schemes import Arrival

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
    row.fill_(-1.0)
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
    return row


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
