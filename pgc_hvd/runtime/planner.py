"""The step's plan: which partitions this rank evaluates at its current version, and whether.

Owns the cached :class:`~pgc_hvd.schemes.WorkPlan` of the current step, whether this rank
computes at it, and whether the step was overtaken (``straggler_policy="cancel"``). Every
``step()`` applies exactly one decided update, so a rank whose step has already been decided
without it (a straggler that is behind) computes nothing while it catches up; replaying a
schedule (``replay_arrivals``) it computes exactly the steps it computed there. The version and
whether the run has started are arguments.

Runs on the training thread. May import nothing of ``runtime``; the worker ring, the gradient
capture, the sender's clock and the agent are used through their public members.
"""

from __future__ import annotations


class StepPlanner:
    """The plan of the current step (module doc)."""

    def __init__(self, worker_ring, capture, sender, agent, *, replay_steps=(),
                 cancel: bool = False):
        self.worker_ring, self.capture, self.sender, self.agent = worker_ring, capture, sender, agent
        self.replay_steps = set(replay_steps)
        self.replay_end = max(self.replay_steps) if self.replay_steps else -1
        self.cancel = bool(cancel)
        self.plan = None              # the current step's WorkPlan (None: not formed yet)
        self.computes = True          # this rank sends a message at the current step
        self.cancelled = False        # the current step fired without this rank (cancel)

    def current(self, version: int, started: bool):
        """The plan at ``version``, formed on first use (a ring slot never filled, warm-up
        cancelled, is evaluated now: :meth:`~pgc_hvd.schemes.Ring.plan`)."""
        if self.plan is None:
            self.plan = self.worker_ring.plan(version)
            self.capture.new_step()
            if version <= self.replay_end:
                self.computes = version in self.replay_steps
            else:
                self.computes = not started or version >= self.agent.decided()
            self.sender.clock()
        return self.plan

    def overtaken(self, version: int, started: bool) -> bool:
        """``straggler_policy="cancel"``: has step ``version`` been decided without this rank's
        message? (Then the rest of the step is abandoned: no message is sent, evaluated ring
        slots are kept, and the rank moves on to the newest model.)"""
        if self.cancel and started and self.agent.decided() > version:
            self.cancelled = True
        return self.cancelled

    def next(self) -> None:
        """An update was applied: the next step's plan is formed on its first use."""
        self.plan = None
        self.cancelled = False
