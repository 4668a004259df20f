"""Units of control="log" (pgc_hvd.runtime.control_log) that need no ranks: the decider's view
of the rows taken so far, and the encoding of a published outcome."""

import math

import torch

from pgc_hvd.runtime.agent import Outgoing
from pgc_hvd.runtime.control_log import (LogView, decode_batches, decode_error, decode_rows,
                                         encode_batches, encode_error, encode_rows,
                                         one_row_per_rank)
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.wire import CTRL_BUSY, CTRL_DONE, CTRL_READY_STEP, ctrl_len, pack_row

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
    assert v.moved(ctl, {(1, 0)})                # offering (1, 0) uncovers (1, 1)
    ctl = v.rows({(1, 0)})
    assert ctl[1][CTRL_READY_STEP] == 1 and not v.moved(ctl, {(1, 0)})
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
