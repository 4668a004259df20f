"""The agent's life around its steps (:mod:`pgc_hvd.runtime.agent_life`) and its handoff with
the training thread (:class:`~pgc_hvd.runtime.agent.Handoff`), in one process: the real
:class:`~pgc_hvd.runtime.agent.CommAgent` on a world of one rank (``LoopbackChannel``, no
Horovod): a restart before the start only, the staleness knob's refusals, a step not decided
in time, leave / finish / fail, the bookkeeping, and the handoff's own rules."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from pgc_hvd.compress import DenseCodec
from pgc_hvd.runtime.agent import CommAgent, Handoff, Outgoing
from pgc_hvd.runtime.agent_life import AgentLife
from pgc_hvd.runtime.channel import LoopbackChannel
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.rows import ctrl_len
from pgc_hvd.schemes import get_scheme

D = 4


def agent(start_step=0, **kw) -> CommAgent:
    return CommAgent(None, get_scheme("dgd", 1, 0), 0, D, 1, codec=DenseCodec(D), device="cpu",
                     poll_interval=0.001, timeout=5, optimistic=True, start_step=start_step,
                     channel=LoopbackChannel(ctrl_len(1), D), **kw)


def send(a: CommAgent, t: int, value: float = 1.0) -> None:
    packed, payload = a.payload_buffer()
    payload.fill_(value)
    a.submit(Outgoing(t, t, payload, time.time(), packed=packed), 0.0)


def test_the_agent_is_a_life_with_a_handoff():
    a = agent()
    assert isinstance(a, AgentLife) and isinstance(a.handoff, Handoff)
    assert a.cond is a.handoff.cond and a.error is None and not a.running


def test_restart_before_the_start_only_and_the_steps_go_on_from_there():
    a = agent()
    a.restart_at(7)
    assert a.decided() == 7 and a.step == 7
    a.start()
    with pytest.raises(RuntimeError, match="before the agent starts"):
        a.restart_at(3)
    send(a, 7, 2.0)
    a.wait_for(7)
    assert a.take(7).step == 7 and float(a.take(7).flat[0]) == 2.0
    assert a.held_updates == 1
    a.release_before(8)
    assert a.held_updates == 0
    assert a.bookkeeping()["updates"] == 0 and a.data_rounds == 0   # the payload rode along
    a.finish()
    assert not a.running and a.join(0.1)


def test_a_scheme_whose_bound_is_the_codes_has_no_staleness_knob():
    a = agent()
    assert a.staleness_c0 is None and a.staleness_bound is None and a.staleness_changes == []
    with pytest.raises(ValueError):
        a.request_staleness_bound(1)
    a.restore_staleness_bound(None)   # nothing saved: nothing to do


def test_a_step_not_decided_in_time_names_what_it_waits_for():
    a = agent()
    a.start()
    try:
        with pytest.raises(AgentError, match="step 0"):
            a.wait_for(0, timeout=0.2)
        assert a.wait_decided_beyond(0, 0.05) is False
    finally:
        a.fail()
        a.fail()    # once told, the second call adds nothing
        a.join(5)


def test_the_handoff_wakes_the_agent_and_keeps_updates_until_released():
    h = Handoff(None, start_step=0, ring_size=1, metrics=1, reports=True, sends_c=True)
    assert h.mark("done") is False and h.mark("done") is True and h.wake
    h.idle(10.0)          # a local event came: no wait
    assert not h.wake
    with pytest.raises(ValueError, match="metrics"):
        h.submit(Outgoing(0, 0, torch.zeros(D), 0.0, metrics=(1.0, 2.0)), 0.0)
    assert h.wait_decided(0, time.monotonic() + 0.05) is False
    done = threading.Event()
    waiter = threading.Thread(target=lambda: done.set() if h.wait_decided(
        0, time.monotonic() + 5) else None)
    waiter.start()
    upd = type("U", (), {"step": 0, "flat": None})()
    h.hand_over(upd, "report")
    waiter.join(5)
    assert done.is_set() and h.take(0) is upd and h.take_reports() == ["report"]
    with pytest.raises(KeyError, match="not held"):
        h.take(1)
