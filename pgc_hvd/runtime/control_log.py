"""Control decisions through an ordered log in a TCPStore, with one decider (``control="log"``).

The polled channels (:class:`~pgc_hvd.runtime.channel.AllgatherChannel`,
:class:`~pgc_hvd.runtime.control_store.StoreChannel`) repeat a control round every
``poll_interval`` until the scheme fires: 20-70 rounds a step at np = 4, growing with the time
the ranks compute. Here a rank exchanges control messages only when something happens to it, and
every rank receives each step's outcome by one broadcast. On the TCPStore served by rank 0
(the server set-up and address broadcast of :mod:`~pgc_hvd.runtime.control_store`), for a run
named ``name``:

* **append** (a rank > 0, when something happens to it: a message submitted, a non-finite
  message, the loop done, the training thread failed): the rank's control row
  (:func:`~pgc_hvd.runtime.rows.pack_row`, showing the message it just submitted) is pushed by
  the thread where the event happens onto the log, a queue on the store:
  ``queue_push("pgc/<name>/log", [rank | row])``, one store operation that does not wait for
  the server's answer (about a microsecond). Rank 0's own rows go to the decider in-process
  (0 operations). (Until 2026-12-06 the agent thread wrote each row by ``add`` of a counter and
  ``set`` of ``log/<idx>``, two round trips, about 1 ms a step at np 4 on the 2-core machine,
  and deleted it once taken, so it had to wake on appends while it waited for the outcome:
  it polled that broadcast some 16 times a step.)
* **decide** (rank 0's agent; a reader thread does blocking ``queue_pop``s of the log and
  hands the rows over, beside rank 0's own): the decider keeps
  :class:`LogView`, the n rows the body reads (each rank's latest row with the oldest message
  the scheme has not been offered yet), refreshed only for the ranks with a new row or a
  message waiting, and runs the agent's decision body (the very code of the polled path:
  failed and finished ranks, rank 0's staleness-bound request, the scheme's ``Round`` offered
  the new arrivals in (ready time, rank) order, or a replayed order) on the ranks that changed
  (``decide(rows, changed)``: O(1) a row, not O(n) a run) once per *batch*: every row that has
  come in since its last run (at least one, one row per rank at most), as a polled round sees
  every row that changed since the last round; and once more after each outcome. While one
  run lasts, the next rows queue up for the next. No polling sleeps: between batches it waits
  on a condition variable.
* **deliver**: when the body has an outcome for step t (the Round fired; every rank is done;
  an error: a rank failed, the step cannot fire, or no row came within ``timeout``) the decider
  broadcasts it from its agent thread to every agent thread (one collective,
  ``<name>.dec``: a 16-byte header and a buffer of 2n + 8 log lines; a longer outcome follows
  in ``<name>.dec.rest`` and every rank grows the buffer to it): the batches of rows it took
  since the previous outcome, in its order (or the error's typed fields and text, then the
  rows taken before it). Every rank issues the same agent collectives in the same order
  (broadcast, data collective, broadcast, ...), whatever the arrivals.
* **follow** (every rank > 0's agent): the broadcast of step t, then the same body on the same
  batches in the same order: the same :class:`~pgc_hvd.schemes.Decision` as the decider's,
  bit for bit (same arrivals, same staleness-bound changes at the same point, same losses, user
  metrics, busy seconds and non-finite log, which travel in the rows), with no second encoding
  of decisions to keep in step with the schemes.

So a rank > 0 makes 2 control operations per step (the push and the broadcast), rank 0 about
n (a pop per other rank's row, the broadcast), whatever the compute time; late messages stay
usable (the decider sees every row, in log order); payloads move in the data phase
(``carries_payloads`` False). An agent waits for the outcome's broadcast by blocking in it
(slices of ``BLOCK_SLICE``; rank 0 looks for a follower's fault notice between them), not by
polling.

Faults, the set-up and the end (off the step's path): :mod:`pgc_hvd.runtime.log_life`.

Nothing grows with the run: a row leaves the store when the reader pops it; outcomes never
enter the store. The queue holds the rows pushed and not yet popped (about n).

Owns :class:`LogChannel` (the rows pushed, rank 0's reader thread and its queue),
:class:`LogView`, the outcome's encoding and :func:`log_loop`; the channel is built on the
training thread (the agent's construction: a collective, and rank 0's reader started).
Threads: the agent thread (``log_loop``, the outcome's broadcast), rank 0's reader thread, and
the thread where an event happens (``append``: the training thread packs and pushes the row).
May import: numpy, torch, the standard library, ``runtime.errors``, ``runtime.log_life``,
``runtime.rows``, ``runtime.control_store`` (the store's set-up), ``schemes``.
"""

from __future__ import annotations

import array
import logging
import threading
import time
from typing import Optional

import numpy as np
import torch

from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.log_life import (FAULT, FaultNotice, LogLife, census_or_notice, fault_key,
                                      timeout_message)
from pgc_hvd.runtime.rows import (CTRL_BAD_STEP, CTRL_BUSY, CTRL_DONE, CTRL_FAILED,
                                  CTRL_READY_STEP, CTRL_STALENESS_BOUND, CTRL_VERSION, END,
                                  ctrl_len, pack_row)
from pgc_hvd.schemes import Decision

log = logging.getLogger("pgc_hvd.runtime")

#: the row fields that describe the rank, not its message (taken from its latest row)
STATE_FIELDS = (CTRL_BUSY, CTRL_BAD_STEP, CTRL_DONE, CTRL_FAILED, CTRL_STALENESS_BOUND)
_ERR = "pgc-log-error:"


class LogView:
    """The decider's (and every follower's) view of the rows taken so far, as the n rows the
    agent's decision body reads (``ctl``): rank w's latest row, with the message fields of the
    oldest message w has shown that is not yet offered (as a polled rank's row shows its
    oldest pending message); ranks with no row yet show nothing. Kept up to date row by row
    (:meth:`refresh` touches the ranks with a new row or a message waiting to be offered, not
    all n), so the body can read only what changed."""

    def __init__(self, n: int, length: int, ring_size: int, metrics: int):
        blank = pack_row(torch.empty(length, dtype=torch.float64), None, ring_size=ring_size,
                         metrics=metrics).tolist()
        self.latest = [list(blank) for _ in range(int(n))]
        self.pending: list[dict] = [{} for _ in range(int(n))]
        self.top = [-1] * int(n)      # the newest step each rank's rows have shown
        self.version = [-1] * int(n)  # the newest model version each rank's messages were
                                      # computed at (it has read every outcome before it)
        #: the rows the body reads, rank by rank (updated in place by :meth:`refresh`)
        self.ctl = [list(blank) for _ in range(int(n))]
        self._dirty: set = set()      # ranks with a new row since the last refresh
        self._waiting: set = set()    # ranks with a shown message not yet offered

    def add(self, w: int, row: list) -> None:
        """Rank w's next row in log order (a rank shows its messages in step order; a state
        row re-showing an older message adds nothing)."""
        self.latest[w] = row
        self.version[w] = max(self.version[w], int(row[CTRL_VERSION]))
        k = int(row[CTRL_READY_STEP])
        if k > self.top[w]:
            self.pending[w][k] = row
            self.top[w] = k
            self._waiting.add(w)
        self._dirty.add(w)

    def _shown(self, w: int, offered) -> list:
        """Rank w's row as the body should see it now that ``offered`` were offered."""
        pend = self.pending[w]
        for k in [k for k in pend if (w, k) in offered]:
            del pend[k]
        if not pend:
            if w in self._waiting:   # its row shows the latest again (refresh replaces it)
                self._waiting.discard(w)
                self._dirty.add(w)
            return self.latest[w]
        row = list(pend[min(pend)])
        base = self.latest[w]
        for f in STATE_FIELDS:
            row[f] = base[f]
        return row

    def refresh(self, offered) -> set:
        """Bring :attr:`ctl` up to date; the ranks whose row in it changed."""
        changed = set()
        for w in self._dirty | self._waiting:
            row = self._shown(w, offered)
            if w in self._dirty or row[CTRL_READY_STEP] != self.ctl[w][CTRL_READY_STEP]:
                self.ctl[w] = row
                changed.add(w)
        self._dirty = set()
        return changed

    def moved(self, offered) -> bool:
        """Whether a rank's shown message differs from :attr:`ctl`'s now that more are
        offered (its next pending message came into view)."""
        return any(self._shown(w, offered)[CTRL_READY_STEP] != self.ctl[w][CTRL_READY_STEP]
                   for w in sorted(self._waiting))

    def rows(self, offered) -> list:
        """Every rank's row as the body sees it (refreshed; the list is :attr:`ctl`)."""
        self.refresh(offered)
        return self.ctl


def encode_rows(rows: list) -> bytes:
    """[(rank, row), ...] as float64 bytes, one [rank | row] line each."""
    lines = array.array("d")     # extended in C, no per-word Python object
    for w, r in rows:
        lines.append(float(w))
        lines.extend(r)
    return lines.tobytes()


def decode_rows(raw: bytes, length: int) -> list:
    if not raw:
        return []
    lines = np.frombuffer(raw, dtype=np.float64).reshape(-1, length + 1)
    return list(zip(lines[:, 0].astype(np.int64).tolist(), lines[:, 1:].tolist()))


_BATCH = -2.0         # the rank word of the line that separates two batches in an outcome


def encode_batches(batches: list) -> bytes:
    """The batches of rows an outcome took, ``[[(rank, row), ...], ...]``, as one byte string:
    their lines in order, a separator line (rank word -2) between two batches."""
    if not batches:
        return b""
    width = len(batches[0][0][1]) if batches[0] else 0
    lines: list = []
    for i, batch in enumerate(batches):
        if i:
            lines.append((int(_BATCH), [0.0] * width))
        lines.extend(batch)
    return encode_rows(lines)


def decode_batches(raw: bytes, length: int) -> list:
    out: list = [[]]
    sep = int(_BATCH)
    for w, r in decode_rows(raw, length):
        if w == sep:
            out.append([])
        else:
            out[-1].append((w, r))
    return out if raw else []


class LogRecord:
    """What a follower reads for step t: the decider's rows, or its error (its text and the
    typed fields of :class:`~pgc_hvd.runtime.errors.AgentError`)."""

    def __init__(self, batches=(), error: Optional[str] = None, fields: Optional[dict] = None):
        self.batches, self.error, self.fields = list(batches), error, dict(fields or {})


def _ranks(text: str) -> tuple:
    return tuple(int(w) for w in text.split(",") if w)


def encode_error(error: BaseException) -> bytes:
    """An outcome that is an error: its typed fields (failed, dead, hung ranks; broken world),
    then its text."""
    f = error.fields() if isinstance(error, AgentError) else AgentError().fields()
    head = "|".join([",".join(map(str, f["failed_ranks"])), ",".join(map(str, f["dead_ranks"])),
                     ",".join(map(str, f["hung_ranks"])), str(int(f["broken_world"]))])
    return (_ERR + head + ":" + str(error)).encode()


def decode_error(raw: bytes) -> LogRecord:
    head, _, msg = raw.decode()[len(_ERR):].partition(":")
    failed, dead, hung, broken = (head.split("|") + ["", "", "", "0"])[:4]
    return LogRecord(error=msg, fields={"failed_ranks": _ranks(failed), "dead_ranks": _ranks(dead),
                                        "hung_ranks": _ranks(hung),
                                        "broken_world": broken == "1"})


#: bytes of an outcome's header in the broadcast: its length in bytes, its kind (int64 each)
HEAD = 16
_ROWS, _ERROR = 0, 1


def outcome_capacity(n: int, length: int) -> int:
    """Bytes the first broadcast of an outcome holds beside its header: 2n + 8 log lines
    (a step's outcome takes about one row per rank); a longer one follows in a second
    broadcast and every rank then grows the capacity to it (the same on every rank)."""
    return (2 * int(n) + 8) * 8 * (int(length) + 1)


class LogChannel(LogLife):
    """One run's ordered control log (module doc). ``rank == 0`` is the decider; outcomes go
    out by one broadcast from it (``coll``: the agent's :class:`~pgc_hvd.runtime.communicator.
    Collectives`)."""

    carries_payloads = False
    kind = "log"

    def __init__(self, clients: dict, rank: int, n: int, name: str, timeout: float,
                 length: int, coll=None):
        from pgc_hvd.runtime.control_store import StoreChannel  # noqa: F401 (the set-up)
        self.rank, self.n, self.length = int(rank), int(n), int(length)
        self.prefix = f"pgc/{name}"
        self.key = f"{self.prefix}/log"   # the log: a queue on the store (push, blocking pop)
        self.timeout = float(timeout)
        #: the outcome's broadcast of step t ends ``timeout`` after the decider's wait for its
        #: rows does (2 ``timeout`` after step t - 1's data phase, on every rank alike), so a
        #: rank that froze stops every rank's broadcast at about the same time, and the census
        #: (up to ``timeout`` + 1 s) follows; the training threads wait ``grace`` longer than
        #: ``timeout`` (3 ``timeout`` + 5 s in all), so the agent's verdict reaches them first
        self.slack = self.timeout
        self.grace = 2.0 * self.timeout + 5.0
        self.coll = coll
        self.capacity = outcome_capacity(self.n, self.length)
        self.store = clients["main"]      # rank 0: the server; closes
        self.writer = clients.get("writer")   # rank > 0: writes its rows (agent thread)
        self.reader = clients.get("reader")   # rank 0: the log reader thread's client
        self.ops = 0                      # control operations this rank issued (store, bcast)
        self._ops_lock = threading.Lock()
        self._append_lock = threading.Lock()
        self.cond = threading.Condition()
        self._queue: list = []            # rank 0: (rank, row) in the decider's order
        self._reader_error: Optional[str] = None
        self._fault: Optional[int] = None  # rank 0: a follower that went to the census
        self._ask_at: Optional[float] = 0.0   # rank > 0: ask_census_open's next ask (None: open)
        self._closing = False
        self._reader = None
        if self.rank == 0:
            self._reader = threading.Thread(target=self._read_log, name=f"{name}-log-reader",
                                            daemon=True)
            self._reader.start()

    def _count(self, k: int = 1) -> None:
        with self._ops_lock:
            self.ops += k

    # -- every rank: append a row ------------------------------------------------------
    def append(self, row: torch.Tensor) -> None:
        """This rank's control row joins the log, from the thread where the event happens
        (rank 0: handed to the decider directly; rank > 0: one ``queue_push``, which does not
        wait for the server's answer)."""
        if self.rank == 0:
            with self.cond:
                self._queue.append((0, row.tolist()))
                self.cond.notify_all()
            return
        line = np.concatenate([[float(self.rank)], row.numpy()]).astype(np.float64).tobytes()
        self._push(line)

    def _push(self, line: bytes) -> None:
        """Rank > 0: one line onto the log's queue (its rows in the order they are pushed)."""
        try:
            with self._append_lock:
                self.writer.queue_push(self.key, line)
        except Exception as err:  # the store is gone: the agent's read reports it
            log.debug("rank %d: control log append failed: %s", self.rank, err)
        finally:
            self._count(1)

    # -- rank 0: the reader thread and the decider's wait -------------------------------
    def _read_log(self) -> None:
        while True:
            try:
                raw = self.reader.queue_pop(self.key)   # blocks (up to the client's timeout)
            except Exception as err:
                if self._closing:
                    return
                if "timeout" in str(err).lower() or "timed out" in str(err).lower():
                    continue   # nothing appended for `timeout` s: the decider judges that
                with self.cond:
                    self._reader_error = f"{type(err).__name__}: {err}"
                    self.cond.notify_all()
                return
            self._count(1)
            got = decode_rows(raw, self.length)
            with self.cond:
                for w, r in got:
                    if w == int(FAULT):
                        self._fault = int(r[0])
                    elif w < 0:
                        return
                    else:
                        self._queue.append((w, r))
                self.cond.notify_all()

    def next_rows(self, deadline: float):
        """Every row queued in the decider's order, ``[(rank, row), ...]`` (at least one: it
        waits); None when none came before ``deadline`` (time.monotonic()). Raises AgentError
        when the store failed."""
        with self.cond:
            while not self._queue:
                if self._fault is not None:
                    raise FaultNotice(f"rank 0: rank {self._fault}'s collective failed (its "
                                      f"notice in the control log)", broken_world=True)
                if self._reader_error is not None:
                    raise AgentError(f"rank 0: the control log failed: {self._reader_error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            batch, self._queue = self._queue, []
            return batch

    # -- the outcome: one broadcast from rank 0 ----------------------------------------
    def _noticed(self) -> bool:
        """Whether to leave the outcome's broadcast for the census: rank 0, a follower's
        notice says its collective failed; rank > 0, rank 0 is in the census
        (:meth:`ask_census_open`)."""
        return self._fault is not None or self.ask_census_open()

    def ask_census_open(self) -> bool:
        """Rank > 0, between the slices of its wait in the outcome's broadcast (``_noticed``):
        whether rank 0 is in the census (``fault/0``: its collective failed, so it left the
        broadcast this rank waits in, which would otherwise hold it up to ``2 timeout`` s, past
        the census's ``timeout`` + 1 s). Asked once the wait has lasted ``timeout / 2`` s,
        then every ``timeout / 4`` s (:meth:`wait_from` sets the clock), so a step's usual
        wait asks nothing; one store operation each; a store that does not answer says no
        (the broadcast fails or times out as before). Once yes, always yes (the caller asks
        again to word its error)."""
        now = time.monotonic()
        if self._ask_at is None:
            return True
        if self.rank == 0 or now < self._ask_at:
            return False
        self._ask_at = now + self.timeout / 4
        self._count(1)
        try:
            opened = bool(self.store.check([fault_key(self.prefix, 0)]))
        except Exception:     # noqa: BLE001 -- rank 0 gone: the broadcast says so
            return False
        if opened:
            self._ask_at = None
        return opened

    def wait_from(self, now: float) -> None:
        """A wait in the outcome's broadcast begins (:meth:`ask_census_open`'s clock)."""
        if self._ask_at is not None:
            self._ask_at = now + self.timeout / 2

    def _broadcast(self, step: int, value: Optional[bytes], kind: int, wait: float) -> tuple:
        """The outcome of ``step`` from rank 0 to every rank (``value``, ``kind`` on rank 0;
        None elsewhere): one broadcast of ``HEAD + capacity`` bytes, a second one of the rest
        when the outcome is longer (then every rank grows ``capacity`` to it). Returns
        ``(kind, bytes)``. Raises the collective's AgentError."""
        buf = torch.zeros(HEAD + self.capacity, dtype=torch.uint8)
        if self.rank == 0:
            head = np.array([len(value), kind], dtype=np.int64).tobytes()
            first = value[: self.capacity]
            buf[:HEAD] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
            if first:
                buf[HEAD: HEAD + len(first)] = torch.frombuffer(bytearray(first),
                                                                dtype=torch.uint8)
        self.coll.step = step
        self._count(1)
        self.wait_from(time.monotonic())
        # blocks in the broadcast (slices of BLOCK_SLICE; rank 0 looks for a fault notice
        # between them): rows are pushed by the threads where they happen, nothing to serve
        self.coll.broadcast_(buf, 0, "dec", timeout=wait, abort=self._noticed)
        size, kind = (int(x) for x in np.frombuffer(buf[:HEAD].numpy().tobytes(),
                                                     dtype=np.int64))
        got = buf[HEAD: HEAD + min(size, self.capacity)].numpy().tobytes()
        if size > self.capacity:
            rest = torch.zeros(size - self.capacity, dtype=torch.uint8)
            if self.rank == 0:
                rest[:] = torch.frombuffer(bytearray(value[self.capacity:]), dtype=torch.uint8)
            self._count(1)
            self.coll.broadcast_(rest, 0, "dec.rest", timeout=wait, abort=self._noticed)
            got += rest.numpy().tobytes()
            self.capacity = size
        return kind, got

    def publish(self, step: int, batches: list, error: Optional[BaseException] = None,
                wait: Optional[float] = None) -> None:
        """The outcome of ``step``: the batches of rows taken since the last one, or an error
        (then the rows taken before it follow its text), broadcast to every rank; waits up to
        ``wait`` seconds (default ``timeout`` + ``slack``). A failed broadcast raises its
        AgentError (every rank is in the same broadcast and stops on it)."""
        wait = self.timeout + self.slack if wait is None else max(1.0, float(wait))
        if error is None:
            self._broadcast(step, encode_batches(batches), _ROWS, wait)
            return
        text = encode_error(error)
        rows = encode_batches(batches)
        value = np.array([len(text)], dtype=np.int64).tobytes() + text + rows
        self._broadcast(step, value, _ERROR, wait)

    # -- ranks > 0: the decision of step t ---------------------------------------------
    def decision(self, step: int) -> LogRecord:
        """Step ``step``'s outcome, from rank 0's broadcast (waits up to ``timeout`` +
        ``slack``: the decider's wait for rows, then its broadcast's). Raises the broadcast's
        AgentError (a rank died or hung: :meth:`census` names it)."""
        kind, raw = self._broadcast(step, None, _ROWS, self.timeout + self.slack)
        if kind == _ERROR:
            k = int(np.frombuffer(raw[:8], dtype=np.int64)[0])
            rec = decode_error(raw[8: 8 + k])
            rec.batches = decode_batches(raw[8 + k:], self.length)
            return rec
        return LogRecord(batches=decode_batches(raw, self.length))


# -- the agent's side (CommAgent under control="log"; the agent is passed in) -----------
def log_loop(decider, chan, fire, *, timeout: float, census=lambda: True) -> None:
    """The agent's loop under ``control="log"`` (module doc): rank 0 takes the rows in log
    order, runs the decision body (``decider``, a :class:`~pgc_hvd.runtime.rows.Decider`)
    once per batch of rows (every row queued since its last run), once more after each outcome
    and once more when an offer uncovered a rank's next message (as a polled rank's next row
    would show it), and publishes each outcome's batches; every other rank runs it on the same
    batches by the same rule, so it reaches the same outcomes. ``chan``: the
    :class:`LogChannel`; ``fire(decision, rows)``: a decided step's data phase (the agent's,
    which opens the next round); ``timeout``: seconds the decider waits for a row;
    ``census()``: whether a failed broadcast asks the store who is gone (the agent's
    ``census``, turned off in elastic mode)."""

    book = decider.book
    view = LogView(decider.n, ctrl_len(book.ring_size, book.metrics), book.ring_size,
                   book.metrics)
    decider.open_round()
    if decider.rank == 0:
        taken: list = []
        queued: list = []     # batches of the rows read, not yet run
        last_seen = [time.monotonic()] * decider.n
        deadline = time.monotonic() + timeout
        while True:
            changed = view.refresh(decider.book.offered)
            ctl = view.ctl
            try:
                got = decider.decide(ctl, changed)
                if isinstance(got, Decision) or got is END:
                    pass
                elif view.moved(decider.book.offered):
                    continue   # an offer uncovered a rank's next message: see it first
                elif not queued:
                    got_rows = chan.next_rows(deadline)
                    if got_rows is None:
                        raise AgentError(timeout_message(decider, ctl, last_seen, timeout))
                    queued = one_row_per_rank(got_rows)
            except FaultNotice as err:   # a follower's collective failed: to the census
                raise census_or_notice(chan, decider.step, census(), err) from err
            except Exception as err:   # every rank stops with the decider's text
                try:
                    chan.publish(decider.step, taken, error=err,
                                 wait=deadline + chan.slack - time.monotonic())
                except AgentError as lost:   # a rank is gone too: the census names it
                    raise census_or_notice(chan, decider.step, census(), lost) from err
                raise
            if got is END or isinstance(got, Decision):
                # the followers wait in the broadcast from the end of the previous step on, up
                # to timeout + slack: the decider's broadcast ends at the same time
                try:
                    chan.publish(decider.step, taken, wait=deadline + chan.slack - time.monotonic())
                except AgentError as err:   # a rank died or hung: the census names it
                    raise census_or_notice(chan, decider.step, census(), err) from err
                if got is END:
                    return
                taken = []
                # published: every follower runs the same data collective, so a failure there
                # (a dead rank) stops each of them on its own; nothing more to publish
                fire(got, ctl)
                deadline = time.monotonic() + timeout
                continue
            batch = queued.pop(0)   # not empty: refilled above when it was
            now = time.monotonic()
            for w, r in batch:
                view.add(w, r)
                last_seen[w] = now
            taken.append(batch)
    while True:
        try:
            rec = chan.decision(decider.step)
        except AgentError as err:   # a rank (rank 0 included) died or hung: the census
            raise census_or_notice(chan, decider.step, census(), err) from err
        if rec.error is not None:
            # the rows the decider took before its error (a non-finite report, say) reach this
            # rank's book too, so its explanation of the error is the decider's
            for batch in rec.batches:
                for w, r in batch:
                    view.add(w, r)
                try:
                    decider.decide(view.ctl, view.refresh(decider.book.offered))
                except AgentError:
                    break
            raise AgentError(f"rank {decider.rank}: stopping: {rec.error}", **rec.fields)
        batches = iter(rec.batches)
        while True:
            changed = view.refresh(decider.book.offered)
            ctl = view.ctl
            got = decider.decide(ctl, changed)
            if got is END:
                return
            if isinstance(got, Decision):
                fire(got, ctl)
                break
            if view.moved(decider.book.offered):
                continue
            batch = next(batches, None)
            if batch is None:
                raise AgentError(f"rank {decider.rank}: control log, step {decider.step}: the "
                                 f"decider's rows do not decide it here (a bug)")
            for w, r in batch:
                view.add(w, r)


def one_row_per_rank(rows: list) -> list:
    """The rows read, in log order, cut into batches that hold at most one row of each rank:
    a batch is what one run of the decision body sees, as a polled round shows one row per
    rank, so a rank's state that a later row of its own replaces (the step of a non-finite
    message, a staleness-bound request) is seen by a run before it is replaced."""
    out: list = [[]]
    ranks: set = set()    # the ranks of the last batch
    for w, r in rows:
        if w in ranks:
            out.append([])
            ranks = set()
        out[-1].append((w, r))
        ranks.add(w)
    return out

