"""User metrics in the control rows (CommAgent(metrics=k), Outgoing(metrics=...)): the row grows
by k words, each decided step carries the mean over the used messages, and metrics=0 (the
default) changes nothing. The multirank check (every rank the same values, one rank slowed) is
in test_agent_wire.py."""

from __future__ import annotations

import math
import time

import pytest

from pgc_hvd.compress import DenseCodec
from pgc_hvd.runtime.agent import CommAgent, Outgoing
from pgc_hvd.runtime.channel import LoopbackChannel
from pgc_hvd.runtime.rows import CTRL_FIXED, ctrl_len, metric_values, slot_versions
from pgc_hvd.schemes import get_scheme


def loopback_agent(d, metrics, ring=1):
    scheme = get_scheme("dgd", 1, 0)
    return CommAgent(None, scheme, 0, d, ring, codec=DenseCodec(d), device="cpu",
                     poll_interval=0.001, timeout=30, optimistic=True, metrics=metrics,
                     channel=LoopbackChannel(ctrl_len(ring, metrics), d))


def run(agent, d, outs):
    infos = []
    agent.start()
    try:
        for t, (loss, metrics) in enumerate(outs):
            packed, payload = agent.payload_buffer()
            payload.fill_(1.0)
            agent.submit(Outgoing(t, t, payload, time.time(), loss, packed=packed,
                                  metrics=metrics), 0.0)
            agent.wait_for(t)
            infos.append(dict(agent.take(t).info))
            agent.release_before(t + 1)
    finally:
        agent.finish()
    return infos


def test_row_layout_puts_metrics_after_the_slot_versions():
    assert ctrl_len(3) == CTRL_FIXED + 3 and ctrl_len(3, 2) == CTRL_FIXED + 5
    row = [0.0] * CTRL_FIXED + [4.0, 5.0, -1.0] + [0.25, math.nan]
    assert slot_versions(row, 3) == (4, 5)
    got = metric_values(row, 3, 2)
    assert got[0] == 0.25 and math.isnan(got[1])


def test_each_step_carries_the_mean_of_the_used_messages_metrics():
    d = 4
    outs = [(0.5, (1.0, -2.0, 3.5)), (math.nan, (math.nan, 7.0, 0.0)), (1.5, ())]
    infos = run(loopback_agent(d, 3), d, outs)
    assert infos[0]["metrics"] == (1.0, -2.0, 3.5) and infos[0]["metrics_count"] == (1, 1, 1)
    assert infos[0]["metrics_from"] == ((0, 0),) and infos[0]["loss"] == 0.5
    m = infos[1]["metrics"]
    assert math.isnan(m[0]) and m[1:] == (7.0, 0.0) and infos[1]["metrics_count"] == (0, 1, 1)
    assert infos[1]["loss"] is None                     # no finite loss reported
    assert all(math.isnan(x) for x in infos[2]["metrics"])   # () = none reported
    assert infos[2]["metrics_count"] == (0, 0, 0) and infos[2]["loss"] == 1.5
    # the row is 3 words longer
    assert loopback_agent(d, 3).ctrl_len == ctrl_len(1) + 3


def test_default_has_no_metric_slots_and_wrong_counts_are_refused():
    d = 4
    agent = loopback_agent(d, 0)
    assert agent.ctrl_len == ctrl_len(1)
    infos = run(agent, d, [(0.5, ())])
    assert "metrics" not in infos[0] and infos[0]["loss"] == 0.5
    agent = loopback_agent(d, 2)
    agent.start()
    try:
        packed, payload = agent.payload_buffer()
        with pytest.raises(ValueError, match="metrics=2"):
            agent.submit(Outgoing(0, 0, payload, time.time(), packed=packed,
                                  metrics=(1.0, 2.0, 3.0)), 0.0)
    finally:
        agent.fail()
    with pytest.raises(ValueError, match="number k >= 0"):
        loopback_agent(d, -1)
