"""The agent's life around its steps: what :class:`~pgc_hvd.runtime.agent.CommAgent` does
outside a steady-state step, as its base class :class:`AgentLife` (kept apart so that the
agent's module reads as the step's handoff, loop and data phase; none of it runs in a
steady-state step, so it is not on the step's path).

* before the first step: continue from a restored version (``restart_at``); the staleness
  knob (rank 0's checked request of a bound c in [1, c_0], a checkpoint's bound, the bound in
  force and its changes, read from the agent's :class:`~pgc_hvd.runtime.rows.Decider`);
* the end: this rank's loop is done (``leave``: no wait, safe from a finaliser; ``finish``:
  serve collectives until every rank is done), its training thread failed (``fail``), its
  world is gone (``cut_off``, ``join``, ``running``);
* the diagnostics: why a step is not decided in time (naming the ranks it waits for), the
  sizes of every container the agent keeps (``bookkeeping``, ``held_updates``), the data
  plane's counters.

Owns no state of its own: it uses the agent's members (``self``: the handoff, decider,
channel, thread). Threads: the training thread (requests, the end), any (reads).
May import: ``runtime.errors``, ``runtime.rows``, the standard library.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import not_decided_message

log = logging.getLogger("pgc_hvd.runtime")


class AgentLife:
    """The base class of :class:`~pgc_hvd.runtime.agent.CommAgent` (module doc); not built
    alone."""

    # -- before the first step, and the staleness knob (training thread) ----------------------
    def request_staleness_bound(self, c: int) -> None:
        """Ask every rank to decide with staleness bound ``c`` in [1, c_0] (``staleness_c0``,
        the bound the agent was built with: buffers and control rows are sized for it) from
        the next control round on (module doc); only rank 0's request is sent. A scheme whose
        c is the code's, or a c out of range, raises ValueError naming the fix."""
        self.decider.check_staleness_bound(c)
        self.handoff.request(c)
        if self._log and self.rank == 0:
            self._append_row()

    def restart_at(self, step: int) -> None:
        """Before :meth:`start`: decide from ``step`` on (a restored checkpoint's version)."""
        if self.started:
            raise RuntimeError("restart_at must be called before the agent starts")
        self.decider.step = int(step)
        self.handoff.restart_at(step)

    # -- why a step is not decided; the diagnostics ----------------------------------------
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

    @property
    def held_updates(self) -> int:
        """Decided updates not yet released (bounded by how far this rank lags)."""
        return len(self.handoff.updates)

    # -- the end: leave, finish, fail; cut off when the world is gone ---------------------------
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
        again = self.handoff.mark("done")
        if self._log and not again:
            self._append_row()
        self._take_over()

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
        again = self.handoff.mark("failed")
        if self._log and not again:
            self._append_row()
        self._take_over()

    def _inline_now(self) -> bool:
        """Whether the training thread runs this rank's rounds: ``inline`` (s = 0 without the
        overlap) and the agent thread has not taken them over (:meth:`_take_over`)."""
        return self.inline and self._thread.ident is None

    def _take_over(self) -> None:
        """``inline`` (s = 0, the training thread ran the rounds): the agent thread serves the
        rounds left (this rank's done or failed row, then every rank's until all are done),
        so that neither a finaliser nor a failing training thread runs a collective."""
        with self.cond:   # leave() may come from a finaliser and from close() at exit
            if self._inline_now() and self.started and self.error is None:
                self._thread.start()

    def stop_on(self, err: BaseException) -> None:
        """What stopped the agent's rounds: logged, the channel stopped, ``on_stop`` told, the
        error handed to the training thread."""
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
        self.handoff.stop(err)

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
                    "cache": len(self.comm.cache), "outbox": len(self.handoff.outbox),
                    "updates": self.held_updates, "pool": self.pool.free_buffers,
                    "bad_log": sizes["bad_log"], "staleness_changes": len(self.staleness_changes)}
