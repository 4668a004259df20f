"""The agent's bookkeeping is bounded: 20k decisions through the real CommAgent (a world of one
rank, LoopbackChannel, so no Horovod is needed) leave every container it keeps at a size that
does not depend on the number of steps, and the decided updates are released as applied."""

from __future__ import annotations

import time

import torch

from pgc_hvd.compress import DenseCodec
from pgc_hvd.runtime.agent import CommAgent, Outgoing
from pgc_hvd.runtime.channel import LoopbackChannel
from pgc_hvd.runtime.wire import ctrl_len
from pgc_hvd.schemes import get_scheme

STEPS = 20_000


def sizes(agent: CommAgent) -> dict:
    return agent.bookkeeping()


def test_bookkeeping_is_bounded_over_20k_decisions():
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
        if t in (1_000, 5_000, STEPS - 1):
            seen[t] = sizes(agent)
            times[t] = time.perf_counter() - t0
    agent.finish()
    assert agent.decided() == STEPS
    # every container is as small after 20k steps as after 1k (none grows with the run: a leak
    # of one entry per step would be 19k over)
    for key, value in seen[STEPS - 1].items():
        assert value <= max(seen[1_000][key], 1) + 64, (key, seen)
    assert seen[STEPS - 1]["updates"] == 0
    print(f"\nagent bookkeeping: {seen[STEPS - 1]}; seconds at step 1k / 5k / 20k: "
          f"{times[1_000]:.1f} / {times[5_000]:.1f} / {times[STEPS - 1]:.1f}")
