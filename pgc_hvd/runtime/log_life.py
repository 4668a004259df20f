"""The control log's life around its steps (``control="log"``, :mod:`pgc_hvd.runtime.control_log`):
its set-up, its failure path and its end, as the base class :class:`LogLife` of
:class:`~pgc_hvd.runtime.control_log.LogChannel` and the functions ``log_loop`` calls when a
step fails. None of it runs in a steady-state step (so it is not on the step's path).

* set-up (:meth:`LogLife.create`): rank 0 serves the TCPStore, every rank connects (the server
  and address broadcast of :mod:`~pgc_hvd.runtime.control_store`), each with a second client
  (rank 0: its log reader; the others: the appender).
* faults: no row for ``timeout`` seconds while the open step waits makes the decider broadcast
an error naming the ranks it waits for (and how long since each one's last row) and raise; the
others raise the decider's text. A dead rank (rank 0 included) fails the broadcast or the data
collective at once; a frozen one lets it time out: the decider's broadcast of step t ends
``timeout`` after its wait for the rows, the followers' 2 ``timeout`` after their previous
data phase, about the same moment. Either way every rank that gets there posts a notice in
the log (so a decider waiting for rows, in no collective, comes at once:
:class:`FaultNotice`), says so in the store (``fault/<rank>``) and waits up to ``timeout``
+ 1 s for the others; the ranks that never say so are named (:meth:`LogLife.census`); a
store that cannot be reached names rank 0. The other way round, a follower waiting in the
outcome's broadcast that rank 0 has left for the census (its collective failed first) asks
the store whether the census is open (``LogChannel.ask_census_open``, on long waits only),
so it comes within the census's wait and is not named with the dead rank. Close: as
``control="store"`` (every rank adds 1 to ``pgc/<name>/bye``; rank 0 waits for n).
* the end: :meth:`LogLife.close` (the bye protocol, then rank 0's reader stopped) and
  :meth:`LogLife.stop` (no bye: the agent stopped on an error, or an abandoned world).

Owns :class:`FaultNotice` and the log's set-up, failure path and end; no state of its own: it
uses the channel's members (``self``: store, writer, prefix, timeout, ...). Threads: the
training thread (:meth:`LogLife.create`, in the agent's construction; ``stop`` when the agent is
cut off), the agent thread (the census, :meth:`LogLife.notify_fault`, ``close``, ``stop``).
May import: numpy, the standard library, ``runtime.errors``, ``runtime.rows``,
``runtime.control_store`` (the store's set-up and bye).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import numpy as np

from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import CTRL_BAD_STEP, CTRL_DONE

log = logging.getLogger("pgc_hvd.runtime")

STOP = -1.0           # the rank word of the entry that stops rank 0's reader thread
FAULT = -3.0          # the rank word of a follower's notice: a collective failed, census


def fault_key(prefix: str, rank: int) -> str:
    """The store key under which ``rank`` says it is in the census."""
    return f"{prefix}/fault/{rank}"


class FaultNotice(AgentError):
    """A follower's collective failed and it has gone to the census (its notice in the log):
    the decider, which may be waiting for rows and in no collective, joins the census at
    once."""


class LogLife:
    """The base class of :class:`~pgc_hvd.runtime.control_log.LogChannel` (module doc); not
    built alone."""

    @classmethod
    def create(cls, coll, n: int, length: int) -> "LogLife":
        """Rank 0 serves, every rank connects (a collective: every rank must call it); each
        rank opens a second client (rank 0: its log reader; others: the appender), so a
        blocking read never holds up an append. ``coll``: the agent's collectives (the
        outcome's broadcast)."""
        from pgc_hvd.runtime.control_store import open_store

        hvd, rank, name, timeout = coll.hvd, coll.rank, coll.name, coll.timeout
        follow = 2.0 * float(timeout) + 3.0   # a frozen rank 0: the census gives up after it
        store, connect = open_store(hvd, rank, f"{name}.log", timeout if rank == 0 else follow)
        clients = {"main": store}
        if rank == 0:
            clients["reader"] = connect(timeout)
        else:
            clients["writer"] = connect(timeout)
        return cls(clients, rank, n, name, timeout, length, coll=coll)

    def notify_fault(self) -> None:
        """A follower whose collective failed: a notice in the log, so the decider, which may
        be waiting for rows and in no collective, or in a broadcast that hangs on, stops at
        once (:class:`FaultNotice`; failure path only, 1 store operation)."""
        if self.rank == 0 or self.writer is None:
            return
        notice = np.full(self.length + 1, 0.0, dtype=np.float64)
        notice[0], notice[1] = FAULT, float(self.rank)
        self._push(notice.tobytes())

    def census(self, step: int, err: AgentError) -> AgentError:
        """Who is missing, after the data collective of ``step`` failed or timed out (a dead or
        frozen rank is in it too, so it fails before the decider misses a row): every rank
        that gets here says so under ``pgc/<name>/fault/<rank>`` and waits a little for the
        others (up to ``timeout`` + 1 s: an alive rank's collective has failed by then); the
        ranks that never say so are named. Only on this failure path. The key names no step:
        the survivors reach the census from different places (the data phase, the log's fault
        notice, the s = 0 round) whose step counters may differ by one, and a world holds one
        census at most (the agent stops after it; elastic mode takes none)."""
        key = lambda w: fault_key(self.prefix, w)   # noqa: E731
        read = f"{self.prefix}/fault/read"
        # an alive rank's data collective fails at most `timeout` after the first one's
        wait = self.timeout + 1.0
        self.notify_fault()
        try:
            self.store.set(key(self.rank), b"1")
            try:
                self.store.wait([key(w) for w in range(self.n)], timedelta(seconds=wait))
            except Exception:
                pass   # some never report: they are the ones
            missing = [w for w in range(self.n) if not self.store.check([key(w)])]
            self.store.add(read, 1)
            if self.rank == 0:   # the server: stay until the others have read the census
                deadline = time.monotonic() + wait
                while (int(self.store.add(read, 0)) < self.n - len(missing)
                       and time.monotonic() < deadline):
                    time.sleep(0.01)
        except Exception:
            return AgentError(f"rank {self.rank}: step {step}: a collective failed and "
                              f"the control store on rank 0 is unreachable: rank 0 died or "
                              f"hung; stopping ({err})", dead_ranks=(0,))
        if not missing:
            return AgentError(f"rank {self.rank}: step {step}: {err}", **err.fields())
        # a collective that failed (a peer's connection reset) lost a process; one that timed
        # out waits for a rank that may only be frozen
        who = {"dead_ranks": missing} if err.broken_world else {"hung_ranks": missing}
        return AgentError(f"rank {self.rank}: step {step}: a collective failed and "
                          f"rank(s) {missing} did not answer a census over the control store "
                          f"within {wait:.0f}s: rank(s) {missing} died or hung (timeout "
                          f"{self.timeout:.0f}s); stopping ({err})", **who)

    def stop(self) -> None:
        """Leave without the bye protocol (the agent stopped on an error, or an abandoned
        world in elastic mode): rank 0's reader thread ends at once; nothing waits for the
        other ranks (the store keeps serving their census)."""
        self._stop_reader()

    def _stop_reader(self) -> None:
        """Rank 0: the reader waits on the next log index: give it the stop entry (through
        its own server)."""
        self._closing = True
        if self.rank != 0:
            return
        try:
            self.store.queue_push(self.key, np.full(self.length + 1, STOP,
                                                    dtype=np.float64).tobytes())
        except Exception as err:
            log.debug("rank 0: could not stop the log reader: %s", err)

    def close(self) -> None:
        """After the last outcome: stop rank 0's reader, then the bye protocol of
        ``control="store"``."""
        from pgc_hvd.runtime.control_store import say_bye
        say_bye(self.store, self.prefix, self.rank, self.n, self.timeout)
        self._stop_reader()
        if self._reader is not None:
            self._reader.join(1.0)


def census_or_notice(chan, step: int, census: bool, err: AgentError) -> AgentError:
    """The outcome's broadcast failed or timed out (a rank died or froze, rank 0 included):
    the census over the control store names who (unless the agent turned it off: elastic
    mode re-forms the world without asking)."""
    if census:
        return chan.census(step, err)
    chan.notify_fault()
    return err


def timeout_message(decider, ctl, last_seen: list, timeout: float) -> str:
    """The decider's error when no row came within ``timeout``: the ranks the open step
    waits for, and how long since each one's last row (``decider``: the
    :class:`~pgc_hvd.runtime.rows.Decider`)."""
    t, rnd, now = decider.step, decider.current_round, time.monotonic()
    done = {w for w in range(decider.n) if ctl[w][CTRL_DONE] > 0}
    bad = {w for w in range(decider.n) if int(ctl[w][CTRL_BAD_STEP]) == t}
    waiting = [w for w in range(decider.n) if w not in set(rnd.arrived) | done | bad]
    if not waiting:
        waiting = [w for w in range(decider.n) if w not in done]
    quiet = ", ".join(f"rank {w}: {now - last_seen[w]:.1f}s" for w in waiting)
    return (f"rank 0 (control log decider): step {t} was not decided within "
            f"{timeout:.0f}s: it waits for rank(s) {waiting} (their last control row: "
            f"{quiet}): a rank has died or hung, or computes longer than the timeout; "
            f"stopping instead of hanging")


__all__ = ["FAULT", "FaultNotice", "LogLife", "STOP", "census_or_notice", "fault_key",
           "timeout_message"]
