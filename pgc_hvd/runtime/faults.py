"""The step's faults, on the training thread: :class:`FaultMonitor`.

How far the agent's log of non-finite messages has been looked at, the check of this rank's
parameters that it triggers after an update (:meth:`FaultMonitor.check_params`), the report of a
failure to the other ranks (:meth:`FaultMonitor.fail`), and the explanation added to an
:class:`~pgc_hvd.runtime.errors.AgentError` from its typed ``failed_ranks`` (never from its
text). The agent is used through its public members (``bad_log``, ``fail``, ``cond``,
``error``). The facade (:mod:`pgc_hvd.runtime.optimizer`) calls it after each update and when
the training thread raises; :mod:`pgc_hvd.runtime.step` is the step itself.

Owns :class:`FaultMonitor`.
Thread: the training thread.
May import: ``runtime.consistency`` (``NonFiniteParameters``), ``runtime.errors`` and torch.
"""

from __future__ import annotations

import time

import torch

from pgc_hvd.runtime.consistency import NonFiniteParameters
from pgc_hvd.runtime.errors import AgentError


class FaultMonitor:
    """Stops every rank on a fault of this one, and explains the others' faults (module doc)."""

    def __init__(self, agent, rank: int, params, *, names=None, timeout: float = 60.0):
        self.agent = agent
        self.rank = int(rank)
        self.params = list(params)
        self.names = names or {}
        self.timeout = float(timeout)
        self._bad_checked = 0            # bad_log entries already looked at

    def check_params(self, *, report: bool = True, started: bool = True) -> None:
        """Stop every rank when this rank's parameters are non-finite.

        The decoded updates are finite (non-finite messages are never used) and the same on
        every rank, so parameters that hold NaN/Inf on one rank were changed outside the
        optimizer (code that runs on one rank only, a hardware fault). Such a rank's messages
        are non-finite at every later step: left to itself it would be a straggler for good,
        use up the budget s, and end the run with ranks that differ (an inf model on rank 0 is
        the one evaluated and saved). The run is stopped, not repaired: copying the others'
        parameters would need a collective every rank joins at the same point, which the
        agent's protocol does not have mid-step, and it would hide the fault (a bug in the
        training script, or hardware) that made them non-finite; the ranks still hold a good
        copy, so the run restarts from a checkpoint.

        Cost: nothing per step. Only when a control round showed a non-finite message of this
        rank (``bad_log``) does it look at its parameters, one pass over d: a message that is
        non-finite because the loss was (a transient fault, the message is left out as a
        straggler's) finds finite parameters and training goes on. The error names the rank,
        the step of its first non-finite message and the parameters; with ``report`` this
        rank's agent tells the others (:meth:`fail`), whose :class:`AgentError` names the rank
        and that step too (:meth:`explain`)."""
        log = self.agent.bad_log
        if len(log) == self._bad_checked:
            return
        new = log[self._bad_checked:]
        self._bad_checked += len(new)
        mine = [k for w, k in new if w == self.rank]
        if not mine:
            return
        bad = [(i, p) for i, p in enumerate(self.params) if not bool(torch.isfinite(p).all())]
        if not bad:
            return
        which = ", ".join(
            f"{self.names.get(id(p), f'#{i}')} ({int((~torch.isfinite(p)).sum())} of {p.numel()})"
            for i, p in bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        if report:
            self.fail(started=started)
        raise NonFiniteParameters(
            f"pgc_hvd: rank {self.rank}'s parameters hold NaN/Inf at step {min(mine)} (entries "
            f"non-finite: {which}); its messages from step {min(mine)} on were non-finite and "
            f"left out. The decoded updates are finite and the same on every rank, so something "
            f"outside the optimizer changed this rank's parameters (code that runs on one rank "
            f"only, a hardware fault). Every rank stops: restart from a checkpoint saved when "
            f"the ranks agreed.")

    def fail(self, started: bool) -> None:
        """The training thread raised: tell the other ranks, and wait (at most ``timeout``)
        until this rank's agent has stopped on the control round that shows it, so that the
        others stop with an error naming this rank even when this process exits right after
        (an exiting process shuts Horovod down, which the others would only see as a rank that
        died)."""
        agent = self.agent
        agent.fail()
        if not started:
            return
        deadline = time.monotonic() + self.timeout
        with agent.cond:
            while agent.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                agent.cond.wait(min(left, 0.05))

    def explain(self, err: AgentError) -> AgentError:
        """``err`` with what this rank knows about its cause: a rank that failed right after
        its messages turned non-finite (:meth:`check_params`: its parameters are); the same
        error when there is nothing to add. The failed ranks are ``err.failed_ranks``."""
        notes = []
        for w in getattr(err, "failed_ranks", ()):
            steps = sorted({k for v, k in self.agent.bad_log if v == w})
            if not steps or w == self.rank:
                continue
            first = len(steps) - 1       # start of the last run of non-finite messages
            while first > 0 and steps[first] - steps[first - 1] <= 2:
                first -= 1
            notes.append(f"rank {w} stopped right after its messages from step {steps[first]} on "
                         f"held NaN/Inf: a rank whose parameters became non-finite stops every "
                         f"rank (rank {w}'s own error names the parameters)")
        if not notes:
            return err
        return AgentError(f"{err}; " + "; ".join(notes), **err.fields())

    def raise_explained(self, err: AgentError):
        """Raise ``err``, explained when there is something to add (chained to it)."""
        better = self.explain(err)
        if better is err:
            raise err
        raise better from err


__all__ = ["FaultMonitor"]
