"""The wiring: the optimizer's scheme-dependent parts, built in one place.

:func:`build_parts` builds, from a checked :class:`~pgc_hvd.runtime.config.RuntimeConfig`, the
parts that depend on the scheme -- the scheme itself (with the momentum remedy's options:
:meth:`~pgc_hvd.runtime.config.RuntimeConfig.build_scheme`, or the one the facade built before
any collective), the worker's ring, the message encoder, the gradient capture with the overlap's buckets, the
agent, the step and the fault monitor -- as one :class:`Parts`. The facade
(:class:`~pgc_hvd.runtime.optimizer.PGCOptimizer`) calls it at construction and at each re-plan
of ``stragglers="auto"`` (:mod:`pgc_hvd.runtime.auto_s`), which then hands the new parts what
the old ones knew (:func:`carry_over`): the loop's habits, the compute clock, the
hyper-parameter digest, the last update and the version reached. The capture's hooks are
attached by the caller, last (a construction that fails leaves no hook on the model).

Owns :class:`Parts`, :func:`build_parts`, :func:`carry_over`. Thread: training, at
construction and at a re-plan; never in a step.
May import: ``compress.encoder``, ``control.momentum``, ``schemes``, ``runtime.agent``,
``runtime.capture``, ``runtime.faults``, ``runtime.overlap``, ``runtime.step``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from pgc_hvd.compress.encoder import MessageEncoder
from pgc_hvd.control.momentum import applies_to
from pgc_hvd.runtime.agent import CommAgent
from pgc_hvd.runtime.capture import GradientCapture
from pgc_hvd.runtime.overlap import Buckets
from pgc_hvd.runtime.faults import FaultMonitor
from pgc_hvd.runtime.step import Step


@dataclasses.dataclass
class Parts:
    """One plan's parts (module doc); ``corrects_momentum``: the staleness-aware momentum
    correction applies (pipelined schemes with ``momentum_correction``)."""
    scheme: Any
    encoder: MessageEncoder
    capture: GradientCapture
    agent: CommAgent
    step: Step
    faults: FaultMonitor
    corrects_momentum: bool


def build_parts(hvd, config, *, rank: int, n: int, layout, names: dict, param_groups,
                reports: bool, name: str, replay: Optional[list] = None, replay_steps=(),
                on_decided: Optional[Callable] = None, recorder=None, scheme=None) -> Parts:
    """The parts of the scheme ``config`` names for worker ``rank`` of ``n`` (module doc):
    ``layout`` the parameters' :class:`~pgc_hvd.flat_layout.FlatLayout`, ``names`` their
    names, ``param_groups`` the optimizer's; the agent's ``name`` (its collectives and control
    channel), whether it queues ``reports``, the replayed arrivals (``replay``,
    ``replay_steps``) and its ``on_decided`` callback. A ``recorder``
    (:class:`~pgc_hvd.runtime.step_records.StepRecorder`) is told the scheme's name, s and
    whether updates are momentum-corrected. ``scheme``: the one the facade built before any
    collective (:meth:`~pgc_hvd.runtime.config.RuntimeConfig.build_scheme`, the one check
    of s); None: built here (a re-plan)."""
    from pgc_hvd.schemes import Ring
    if scheme is None:
        scheme = config.build_scheme(n, param_groups)
    ring = Ring(scheme, rank)   # slot versions, plans, the unfilled-slot rule
    encoder = MessageEncoder(layout.numel, config.compression, complex_messages=ring.complex,
                             device=layout.device, wire_dtype=config.wire_dtype)
    capture = GradientCapture(layout, ring, ring_mode=bool(scheme.pipelined or ring.complex),
                              passes_per_step=config.backward_passes_per_step,
                              scheme=scheme, rank=rank, names=names)
    corrects = bool(config.momentum_correction and applies_to(scheme))
    if recorder is not None:
        recorder.scheme_name, recorder.s = scheme.name, scheme.s
        recorder.momentum_correction = corrects
    optimistic = config.effective_optimistic(encoder.codec, layout.device, n)
    # the data collective overlapped with backward: the buckets (runtime.overlap)
    capture.buckets = (Buckets.worth_it(layout, config.bucket_cap_mb)
                       if config.overlaps(scheme, encoder.codec, optimistic=optimistic,
                                          complex_code=ring.complex, device=layout.device)
                       else None)
    agent = CommAgent(hvd, scheme, rank, layout.numel, scheme.lookback, codec=encoder.codec,
                      device=layout.device, timeout=config.timeout,
                      poll_interval=config.poll_interval, reports=reports, name=name,
                      replay=replay, optimistic=optimistic, control=config.control,
                      metrics=len(config.metrics), buckets=capture.buckets,
                      rows_in_sum=config.rows_in_sum(scheme, encoder.codec, optimistic=optimistic,
                                                     complex_code=ring.complex))
    if on_decided is not None:
        agent.on_decided = on_decided
    # the step: version, plan, clock, message, update (the capture asks it for the plan)
    step = Step(capture, encoder, agent, scheme, rank, param_groups=param_groups,
                delay=config.delay, cancel=config.cancel, replay_steps=replay_steps,
                op_scale=config.op_scale, on_update=config.on_update)
    faults = FaultMonitor(agent, rank, layout.params, names=names, timeout=config.timeout)
    return Parts(scheme, encoder, capture, agent, step, faults, corrects)


def carry_over(old: Parts, new: Parts) -> None:
    """A re-plan's hand-over: the new parts continue at the version the old ones reached, with
    the loop's habits (fed by the loop, under a GradScaler, may stream: seen at the first
    step), the compute clock, the hyper-parameter digest, the last update (its metrics) and
    what the agent was told to do on a fault (elastic mode's: no census, leave the world at
    once: ``census``, ``on_stop``)."""
    new.capture.loop_fed, new.capture.amp = old.capture.loop_fed, old.capture.amp
    new.agent.census, new.agent.on_stop = old.agent.census, old.agent.on_stop
    step, was = new.step, old.step
    step.busy, step.hyper_digest, step.last = was.busy, was.hyper_digest, was.last
    step.may_stream = was.may_stream
    step.restart_at(was.version)


__all__ = ["Parts", "build_parts", "carry_over"]
