"""The control log's life around its steps (:mod:`pgc_hvd.runtime.log_life`), in one process:
a follower's fault notice and census on a real TCPStore (the other rank never answers, so it
is named), the decider's timeout message, the choice between the census and a notice alone
(elastic mode), and the log itself: a queue on the store that followers push to and rank 0's
reader pops."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from pgc_hvd.runtime.control_log import LogChannel, decode_rows
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.log_life import (FAULT, FaultNotice, LogLife, census_or_notice,
                                      timeout_message)
from pgc_hvd.runtime.rows import CTRL_BAD_STEP, CTRL_DONE, ctrl_len

LENGTH = ctrl_len(1)


@pytest.fixture
def follower():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    chan = LogChannel({"main": store, "writer": store}, rank=1, n=2, name="life", timeout=0.3,
                      length=LENGTH)
    yield chan, store
    chan.stop()


def test_a_followers_notice_and_census_name_the_rank_that_never_answers(follower):
    chan, store = follower
    assert isinstance(chan, LogLife) and issubclass(FaultNotice, AgentError)
    err = chan.census(5, AgentError("the data collective timed out"))
    # its notice went into the log first, for a decider waiting for rows
    (w, row), = decode_rows(store.queue_pop("pgc/life/log"), LENGTH)
    assert w == int(FAULT) and row[0] == 1.0
    assert store.check(["pgc/life/fault/1"]) and not store.check(["pgc/life/fault/0"])
    assert err.hung_ranks == (0,) and "rank(s) [0]" in str(err) and "step 5" in str(err)


def test_a_follower_in_the_broadcast_asks_whether_the_census_is_open_on_long_waits_only(
        follower):
    """Rank 0 left the outcome's broadcast for the census (its collective failed first): the
    follower waiting in it asks the store, once the wait has lasted timeout / 2 and then every
    timeout / 4 (a step's usual wait asks nothing), and leaves for the census when ``fault/0``
    is there, within the census's wait; yes stays yes."""
    import time

    chan, store = follower                 # timeout 0.3 s: asks after 0.15 s, then every 0.075
    chan.wait_from(time.monotonic())
    ops = chan.ops
    assert not chan.ask_census_open() and chan.ops == ops          # too early: no store operation
    time.sleep(0.16)
    assert not chan.ask_census_open() and chan.ops == ops + 1      # asked: no census yet
    assert not chan.ask_census_open() and chan.ops == ops + 1      # not again before 0.075 s
    store.set("pgc/life/fault/0", b"1")                        # rank 0 is in the census
    time.sleep(0.08)
    assert chan.ask_census_open() and chan.ops == ops + 2
    chan.wait_from(time.monotonic())
    assert chan.ask_census_open() and chan.ops == ops + 2          # yes stays yes, asks no more


def test_without_the_census_a_notice_alone():
    calls = []
    chan = SimpleNamespace(census=lambda step, err: calls.append(("census", step)) or err,
                           notify_fault=lambda: calls.append(("notice",)))
    err = AgentError("x")
    assert census_or_notice(chan, 3, False, err) is err and calls == [("notice",)]
    census_or_notice(chan, 3, True, err)
    assert calls[-1] == ("census", 3)


def test_the_deciders_timeout_names_the_ranks_the_step_waits_for():
    rows = [np.zeros(LENGTH).tolist() for _ in range(4)]
    rows[2][CTRL_DONE] = 1.0          # done: not waited for
    rows[3][CTRL_BAD_STEP] = 7        # its message of step 7 was not finite
    decider = SimpleNamespace(step=7, n=4, current_round=SimpleNamespace(arrived=[0]))
    msg = timeout_message(decider, rows, [0.0] * 4, timeout=30)
    assert "step 7 was not decided within 30s" in msg and "rank(s) [1]" in msg


def test_a_followers_rows_are_one_push_each_and_the_reader_pops_them_in_order():
    """The log is a queue on the store (runtime/control_log.py): a follower's row is one
    ``queue_push`` (one control operation, no round trip), rank 0's reader thread pops the rows
    in the order they were pushed and hands them to the decider, and a popped row has left the
    store (nothing to delete, nothing grows); the stop entry ends the reader."""
    import threading
    import time

    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10))
    connect = lambda: dist.TCPStore("127.0.0.1", server.port, 1, False,   # noqa: E731
                                    timeout=timedelta(seconds=10))
    decider = LogChannel({"main": server, "reader": connect()}, rank=0, n=2, name="queue",
                         timeout=5.0, length=LENGTH)
    client = connect()
    follower = LogChannel({"main": client, "writer": client}, rank=1, n=2, name="queue",
                          timeout=5.0, length=LENGTH)
    try:
        rows = [np.full(LENGTH, float(k)) for k in range(3)]
        for r in rows:
            follower.append(torch.from_numpy(r))
        assert follower.ops == 3                       # one push a row
        got, deadline = [], time.monotonic() + 5.0
        while len(got) < 3 and time.monotonic() < deadline:
            got += decider.next_rows(deadline) or []
        assert [w for w, _ in got] == [1, 1, 1]
        assert [row[0] for _, row in got] == [0.0, 1.0, 2.0]   # in push order
        assert decider.ops == 3                        # the reader's pops
        assert server.queue_len("pgc/queue/log") == 0 and server.num_keys() <= 2
    finally:
        decider.stop()
        follower.stop()
    deadline = time.monotonic() + 5.0
    while (any(t.name == "queue-log-reader" for t in threading.enumerate())
           and time.monotonic() < deadline):
        time.sleep(0.01)
    assert not any(t.name == "queue-log-reader" for t in threading.enumerate())
