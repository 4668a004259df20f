"""Units of control="log" (pgc_hvd.runtime.control_log) that need no ranks: the decider's view
of the rows taken so far, and the encoding of a published outcome."""

import math

import torch

from pgc_hvd.runtime.agent import Outgoing
from pgc_hvd.runtime.control_log import (LogView, decode_batches, decode_error, decode_rows,
                                         encode_batches, encode_error, encode_rows,
                                         one_row_per_rank)
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import CTRL_BUSY, CTRL_DONE, CTRL_READY_STEP, ctrl_len, pack_row

RING, K = 2, 1
L = ctrl_len(RING, K)


def row(step=None, busy=0.0, done=0.0):
    out = None if step is None else Outgoing(step, step, torch.zeros(1), 1.0 + step,
                                             loss=0.5, metrics=(2.0,))
    return pack_row(torch.empty(L, dtype=torch.float64), out, ring_size=RING, metrics=K,
                    busy=busy, done=done).tolist()


def test_view_shows_oldest_unoffered_message_with_latest_state():
    v = LogView(3, L, RING, K)
    assert [r[CTRL_READY_STEP] for r in v.rows(set())] == [-1, -1, -1]
    v.add(1, row(0, busy=1.0))
    v.add(1, row(1, busy=2.0))
    v.add(1, row(None, busy=3.0, done=5.0))      # a state row: done, no new message
    ctl = v.rows(set())
    assert ctl[1][CTRL_READY_STEP] == 0 and ctl[1][CTRL_BUSY] == 3.0 and ctl[1][CTRL_DONE] == 5.0
    assert v.moved({(1, 0)})                     # offering (1, 0) uncovers (1, 1)
    assert v.refresh({(1, 0)}) == {1}            # only rank 1's row changed
    ctl = v.ctl
    assert ctl[1][CTRL_READY_STEP] == 1 and not v.moved({(1, 0)})
    assert v.refresh({(1, 0)}) == set()          # nothing new: no row to read again
    # all offered: the latest row (its message already offered, so no new arrival)
    assert v.rows({(1, 0), (1, 1)})[1][CTRL_DONE] == 5.0
    # a state row re-showing an older message adds nothing
    v.add(2, row(3))
    v.add(2, row(2))
    assert v.rows(set())[2][CTRL_READY_STEP] == 3


def test_outcome_encoding_round_trips():
    rows = [(2, row(4)), (0, row(None, busy=1.5))]
    got = decode_rows(encode_rows(rows), L)
    assert [w for w, _ in got] == [2, 0]
    for (_, a), (_, b) in zip(rows, got):
        assert all((x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))
    assert decode_rows(encode_rows([]), L) == []


def test_outcome_batches_round_trip():
    """An outcome carries the decider's batches (every row queued when the body ran) with their
    boundaries, so followers run the body on the same views."""
    batches = [[(2, row(4)), (1, row(3))], [(3, row(5))], [(0, row(None, busy=1.5))]]
    got = decode_batches(encode_batches(batches), L)
    assert [[w for w, _ in b] for b in got] == [[2, 1], [3], [0]]
    assert got[0][0][1][CTRL_READY_STEP] == 4
    assert decode_batches(encode_batches([]), L) == []
    assert [[w for w, _ in b] for b in decode_batches(encode_batches([[(1, row(2))]]), L)] == [[1]]


def test_a_batch_holds_one_row_per_rank():
    """A rank's later row would replace the state its earlier row showed (a non-finite step):
    the rows read are cut so that every run of the body sees each rank's rows in turn."""
    rows = [(1, "a"), (2, "b"), (1, "c"), (0, "d"), (1, "e"), (2, "f")]
    got = one_row_per_rank(rows)
    assert got == [[(1, "a"), (2, "b")], [(1, "c"), (0, "d")], [(1, "e"), (2, "f")]]
    assert [x for b in got for x in b] == rows
    assert one_row_per_rank([(3, "x")]) == [[(3, "x")]]


def test_error_outcome_keeps_the_typed_fields():
    err = AgentError("rank 0 (control log decider): step 4: rank(s) [2] died",
                     failed_ranks=(1,), dead_ranks=(2, 3), hung_ranks=(), broken_world=True)
    rec = decode_error(encode_error(err))
    assert rec.error == str(err)
    assert rec.fields == err.fields()
    again = AgentError(rec.error, **rec.fields)
    assert again.dead_ranks == (2, 3) and again.failed_ranks == (1,) and again.broken_world
    plain = decode_error(encode_error(ValueError("x: y")))
    assert plain.error == "x: y" and plain.fields["dead_ranks"] == () \
        and not plain.fields["broken_world"]


# -- the decision body reads only the rows that changed --------------------------------------
class _MemoryLog:
    """log_loop's channel in memory: the decider takes the log lines in order, ``batch`` at a
    time at most and none of a step past the open one (no rank computes step t + 1 before t is
    decided); each follower reads what the decider published."""

    def __init__(self, lines, batch, published, length):
        self.lines, self.batch, self.published, self.length = lines, batch, published, length
        self.pos, self.agent = 0, None
        self.grace = self.slack = 0.0

    def next_rows(self, deadline):
        out = []
        while (self.pos < len(self.lines) and len(out) < self.batch
               and (not out or self.lines[self.pos][0] <= self.agent.step)):
            out.append(self.lines[self.pos][1])
            self.pos += 1
        return out or None

    def publish(self, step, batches, error=None, wait=None):
        if error is not None:
            raise error
        self.published[step] = encode_batches(batches)

    def decision(self, step):
        from pgc_hvd.runtime.control_log import LogRecord
        return LogRecord(batches=decode_batches(self.published[step], self.length))


class _Body:
    """The decision body (a real :class:`~pgc_hvd.runtime.rows.Decider` and ArrivalBook) run by
    log_loop, with ``fire`` recording the decisions instead of a data phase; ``full``: every
    run reads all n rows (as a polled round does), else only the rows that changed."""

    def __init__(self, scheme, rank, channel, full):
        from pgc_hvd.runtime.rows import ArrivalBook, Decider
        self.decider = Decider(scheme, rank, ArrivalBook(scheme.n, scheme.lookback, 0),
                               every_row=full)
        self.channel, self.decisions = channel, []
        channel.agent = self.decider     # the channel holds back rows of later steps

    def fire(self, decision, ctl):
        self.decisions.append((decision.step, tuple((u.worker, u.step, float(u.weight))
                                                    for u in decision.uses)))
        self.decider.next_round()

    def run(self):
        from pgc_hvd.runtime.control_log import log_loop
        log_loop(self.decider, self.channel, self.fire, timeout=3600.0, census=lambda: False)
        return self


def _lines(n, lookback, steps, seed, early=None):
    """(step, (rank, row)) of a run: per step every rank's message in random order, some
    shown twice (a state row re-showing it), one rank's message of some steps non-finite
    (a bad-step row instead), then every rank's done row. ``early=(rank, k)``: that rank's
    loop ends at version k (its done row first among step k's rows, no message from it
    after)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    Lb = ctrl_len(lookback, 0)
    out = []
    for t in range(steps):
        if early is not None and t == early[1]:
            r = pack_row(torch.empty(Lb, dtype=torch.float64), None, ring_size=lookback,
                         done=1.0 + t).tolist()
            out.append((t, (early[0], r)))
        for w in rng.permutation(n):
            if early is not None and w == early[0] and t >= early[1]:
                continue
            slots = tuple(range(max(0, t - lookback + 1), t + 1))
            msg = Outgoing(t, t, torch.zeros(1), t + float(rng.random()), loss=0.5,
                           slot_versions=slots)
            bad = t if (t % 7 == 3 and w == n - 1) else -1
            r = pack_row(torch.empty(Lb, dtype=torch.float64), None if bad >= 0 else msg,
                         ring_size=lookback, bad_step=bad, busy=float(t)).tolist()
            out.append((t, (int(w), r)))
            if rng.random() < 0.2:
                out.append((t, (int(w), list(r))))
    for w in range(n):
        r = pack_row(torch.empty(Lb, dtype=torch.float64), None, ring_size=lookback,
                     done=1.0 + steps).tolist()
        out.append((steps, (w, r)))
    return out


def test_body_reading_only_changed_rows_decides_as_reading_all():
    """The log loop's decider and a follower replaying its outcomes, with the body reading
    only the rows that changed, take decision for decision what the body reading all n rows
    every run takes (pgc-cr, bcgc, bounded staleness; batches of 1 to 5 rows; past step 64,
    where the book forgets old steps)."""
    from pgc_hvd.schemes import get_scheme
    for name, n, s in (("pgc-cr", 6, 1), ("bcgc", 6, 2), ("bounded-staleness", 5, 1)):
        for batch in (1, 3, 5):
            got = {}
            for full in (True, False):
                sch = get_scheme(name, n, s)
                lines = _lines(n, sch.lookback, 70, seed=batch)
                published = {}
                length = ctrl_len(sch.lookback, 0)
                dec = _Body(sch, 0, _MemoryLog(lines, batch, published, length), full).run()
                fol = _Body(get_scheme(name, n, s), 1,
                            _MemoryLog(lines, batch, published, length), full).run()
                assert dec.decisions == fol.decisions
                got[full] = dec.decisions
            assert len(got[True]) >= 60, (name, batch, len(got[True]))
            assert got[True] == got[False], (name, batch)


def test_body_reading_only_changed_rows_decides_as_reading_all_when_a_rank_ends_early():
    """As above, with one rank's loop ending at version 5 while the others go on: the body
    finds step 5 not needed (IDLE) until a rank still training shows a message for it, and
    offers later the messages a row showed during such a run (bcgc read only the changed rows
    never offered them before), on the changed rows as on all n rows."""
    from pgc_hvd.schemes import get_scheme
    for name, n, s, steps in (("pgc-cr", 6, 1, 20), ("bcgc", 6, 2, 20),
                              ("bounded-staleness", 5, 1, 6)):
        for batch in (1, 4):
            got = {}
            for full in (True, False):
                sch = get_scheme(name, n, s)
                lines = _lines(n, sch.lookback, 20, seed=batch, early=(n - 1, 5))
                length = ctrl_len(sch.lookback, 0)
                dec = _Body(sch, 0, _MemoryLog(lines, batch, {}, length), full).run()
                got[full] = (dec.decisions, dec.decider.book.bad_log, dec.decider.ended_at)
            assert len(got[True][0]) == steps, (name, batch, len(got[True][0]))
            assert got[True] == got[False], (name, batch)
            assert got[True][2] == 5, (name, batch)
