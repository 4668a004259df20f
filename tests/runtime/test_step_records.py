"""The records on their own, in one process: :class:`~pgc_hvd.runtime.step_records.
StepRecorder` drains the real agent's reports (a world of one rank, ``LoopbackChannel``) into
one :class:`~pgc_hvd.metrics.records.StepRecord` per decided step, in order, on the calling
thread, through a writer and ``on_record``; with neither it is inactive and reads nothing."""

from __future__ import annotations

import threading
import time

import torch

from pgc_hvd.compress import DenseCodec
from pgc_hvd.runtime.agent import CommAgent, Outgoing
from pgc_hvd.runtime.channel import LoopbackChannel
from pgc_hvd.runtime.step_records import StepRecorder
from pgc_hvd.runtime.rows import ctrl_len
from pgc_hvd.schemes import get_scheme


class Writer:
    def __init__(self):
        self.rows, self.closed = [], False

    def write(self, rec):
        self.rows.append(rec)

    def close(self):
        self.closed = True


def decided_steps(agent, steps, d):
    for t in range(steps):
        packed, payload = agent.payload_buffer()
        payload.fill_(1.0)
        agent.submit(Outgoing(t, t, payload, time.time(), loss=0.5 + t, packed=packed), 0.01)
        agent.wait_for(t)
        agent.take(t)
        agent.release_before(t + 1)


def test_one_record_per_decided_step_in_order_on_the_draining_thread():
    d = 6
    scheme = get_scheme("dgd", 1, 0)
    agent = CommAgent(None, scheme, 0, d, 1, codec=DenseCodec(d), device="cpu",
                      poll_interval=0.001, timeout=30, optimistic=True, reports=True,
                      channel=LoopbackChannel(ctrl_len(1), d))
    agent.start()
    writer, seen = Writer(), []
    group = {"params": [], "lr": 0.1, "momentum": 0.9}
    rec = StepRecorder(writer, lambda r: seen.append((r, threading.get_ident())),
                       scheme_name="dgd", n=1, s=0, param_groups=[group])
    assert rec.active
    try:
        decided_steps(agent, 3, d)
        rec.drain(agent)
    finally:
        agent.finish()
    assert [r.step for r in writer.rows] == [0, 1, 2]
    assert [r.step for r, _ in seen] == [0, 1, 2]
    assert {tid for _, tid in seen} == {threading.get_ident()}
    first = writer.rows[0]
    assert first.scheme == "dgd" and first.n == 1 and first.s == 0
    assert first.workers_used == [0] and first.loss == 0.5 and first.time >= 0.0
    assert first.extra["arrived"] == [0] and first.extra["nonfinite_ranks"] == []
    rec.drain(agent)   # nothing new
    assert len(writer.rows) == 3
    rec.close()
    assert writer.closed


def test_without_writer_or_callback_nothing_is_read():
    rec = StepRecorder(None, None, scheme_name="pgc-cr", n=2, s=1)
    assert not rec.active
    rec.drain(agent=None)   # inactive: the agent is not touched
    rec.close()
