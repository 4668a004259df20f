"""The step's faults on their own: :class:`~pgc_hvd.runtime.faults.FaultMonitor` on a world of
one rank (the real agent on a ``LoopbackChannel``, tests/runtime/test_step.py's ``World``): the
non-finite-parameter check a non-finite message triggers, and an ``AgentError`` explained by the
failed ranks' non-finite messages."""

from __future__ import annotations

import math

import pytest
import torch

from pgc_hvd.runtime.consistency import NonFiniteParameters
from pgc_hvd.runtime.errors import AgentError
from pgc_hvd.runtime.faults import FaultMonitor

from test_step import world  # noqa: F401  (the fixture: tests/runtime/test_step.py)


def test_non_finite_parameters_after_a_non_finite_message_stop_the_run(world):
    w = world()
    faults = FaultMonitor(w.agent, 0, w.layout.params, names={id(w.layout.params[0]): "0.weight"})
    faults.check_params(report=False)          # nothing logged: nothing looked at
    with torch.no_grad():
        w.layout.params[0][0, 0] = math.nan
    w.agent.bad_log.append((0, 4))            # this rank's message of step 4 was non-finite
    with pytest.raises(NonFiniteParameters, match=r"rank 0's parameters hold NaN/Inf at step 4 "
                                                  r"\(entries non-finite: 0.weight \(1 of 35\)"):
        faults.check_params(report=False)


def test_an_agent_error_is_explained_by_the_failed_ranks_non_finite_messages(world):
    w = world()
    faults = FaultMonitor(w.agent, 0, w.layout.params)
    w.agent.bad_log.extend([(1, 7), (1, 8)])
    err = AgentError("rank 1 failed", failed_ranks=[1])
    better = faults.explain(err)
    assert "rank 1 stopped right after its messages from step 7 on held NaN/Inf" in str(better)
    plain = AgentError("x", failed_ranks=[])
    assert faults.explain(plain) is plain
