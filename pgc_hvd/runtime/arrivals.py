"""What the control rows have shown: the arrivals a rank's agent offers to the scheme.

Owns :class:`ArrivalBook`, the agent's record of the rows of every control round (the same
rows on every rank, so the same record everywhere): which messages ``(worker, step)`` have been
offered to the scheme's ``Round``, the loss and user metrics each carried, the newest step each
rank has shown, the log of non-finite messages (``bad_log``), and the replayed arrival order
(``replay=[(worker, step), ...]``: offered strictly in that order while it lasts). It turns a
round's rows into :class:`~pgc_hvd.schemes.Arrival` objects in offer order ((ready time, rank),
or the replay's) and forgets the bookkeeping of long-gone steps. It never calls a collective
and holds no lock: the agent thread owns it (the training thread reads ``bad_log`` only).

May import: ``runtime.wire`` (the row's fields), ``schemes``.
"""

from __future__ import annotations

import logging
import math
from typing import Iterator, Optional

from pgc_hvd.runtime.wire import (CTRL_BAD_STEP, CTRL_ERROR, CTRL_LOSS, CTRL_READY_STEP,
                                  CTRL_READY_TIME, CTRL_VERSION, metric_values, slot_versions,
                                  used_metrics)
from pgc_hvd.schemes import Arrival

#: what one run of the decision body (:meth:`~pgc_hvd.runtime.agent.CommAgent.decide`) can
#: say besides a Decision: every rank is done; a rank's loop ended before the open step
#: (nothing to decide); the open round needs more arrivals
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
        and, with user metrics, their means (:func:`~pgc_hvd.runtime.wire.used_metrics`)."""
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
