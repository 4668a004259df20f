"""The agent's bookkeeping is bounded: 6k decisions through the real CommAgent (a world of one
rank, LoopbackChannel, so no Horovod is needed) leave every container it keeps at a size that
does not depend on the number of steps, and the decided updates are released as applied."""

from __future__ import annotations

import time

import pytest
import torch

from pgc_hvd.compress import DenseCodec
from pgc_hvd.runtime.agent import CommAgent, Outgoing
from pgc_hvd.runtime.channel import LoopbackChannel
from pgc_hvd.runtime.rows import ctrl_len
from pgc_hvd.schemes import get_scheme

STEPS = 6_000


def sizes(agent: CommAgent) -> dict:
    return agent.bookkeeping()


@pytest.mark.slow
def test_bookkeeping_is_bounded_over_6k_decisions():
    d = 8
    scheme = get_scheme("dgd", 1, 0)
    agent = CommAgent(None, scheme, 0, d, 1, codec=DenseCodec(d), device="cpu",
                      poll_interval=0.001, timeout=30, optimistic=True,
                      channel=LoopbackChannel(ctrl_len(1), d))
    agent.start()
    seen, times = {}, {}
    t0 = time.perf_counter()
    for t in range(STEPS):
        packed, payload = agent.payload_buffer()
        payload.fill_(float(t % 7))
        agent.submit(Outgoing(t, t, payload, time.time(), packed=packed), 0.0)
        agent.wait_for(t)
        upd = agent.take(t)
        assert upd.step == t and float(upd.flat[0]) == float(t % 7)   # weight 1/n = 1
        agent.release_before(t + 1)
        if t in (1_000, 3_000, STEPS - 1):
            seen[t] = sizes(agent)
            times[t] = time.perf_counter() - t0
    agent.finish()
    assert agent.decided() == STEPS
    # every container is as small after 6k steps as after 1k (none grows with the run: a leak
    # of one entry per step would be 5k over)
    for key, value in seen[STEPS - 1].items():
        assert value <= max(seen[1_000][key], 1) + 64, (key, seen)
    assert seen[STEPS - 1]["updates"] == 0
    print(f"\nagent bookkeeping: {seen[STEPS - 1]}; seconds at step 1k / 3k / 6k: "
          f"{times[1_000]:.1f} / {times[3_000]:.1f} / {times[STEPS - 1]:.1f}")


def test_staleness_bound_request_is_checked_and_applied_at_a_control_round():
    """The agent's public staleness-bound request (one process, LoopbackChannel): bounded
    staleness built with c_0 = 3 takes c = 1 from the next control round on (the change logged
    at the step it took effect), refuses c outside [1, c_0] naming the range, and a restored
    checkpoint's bound is the scheme's at once; a scheme whose c is its code's refuses any."""
    import pytest
    d = 4
    scheme = get_scheme("bounded-staleness", 1, 0, c=3)
    agent = CommAgent(None, scheme, 0, d, scheme.lookback, codec=DenseCodec(d), device="cpu",
                      poll_interval=0.001, timeout=30, optimistic=True,
                      channel=LoopbackChannel(ctrl_len(scheme.lookback), d))
    assert agent.staleness_c0 == 3 and agent.staleness_bound == 3
    for bad in (0, 4, 2.0, True):
        with pytest.raises(ValueError, match=r"integer in \[1, 3\]"):
            agent.request_staleness_bound(bad)
    agent.restore_staleness_bound(2)           # before the first step: at once
    assert agent.staleness_bound == 2
    agent.start()

    def step(t):
        packed, payload = agent.payload_buffer()
        payload.fill_(1.0)
        agent.submit(Outgoing(t, t, payload, time.time(), packed=packed), 0.0)
        agent.wait_for(t)
        agent.release_before(t + 1)

    for t in range(3):
        step(t)
    agent.request_staleness_bound(1)
    for t in range(3, 6):
        step(t)
    agent.finish()
    assert agent.staleness_bound == 1 and scheme.staleness_bound == 1
    # the change took effect at one step after the request, on the agent thread
    assert [c for _, c in agent.staleness_changes] == [1]
    assert 3 <= agent.staleness_changes[0][0] <= 4
    fixed = get_scheme("dgd", 1, 0)
    other = CommAgent(None, fixed, 0, d, 1, codec=DenseCodec(d), device="cpu", timeout=30,
                      optimistic=True, channel=LoopbackChannel(ctrl_len(1), d))
    assert other.staleness_c0 is None and other.staleness_bound is None
    with pytest.raises(ValueError, match="fixed by the code"):
        other.request_staleness_bound(1)
    other.restore_staleness_bound(2)           # nothing to restore: ignored
