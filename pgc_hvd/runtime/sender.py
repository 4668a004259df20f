"""Message sending: this rank's coded message of one step, from the ring to the agent.

Owns the compute clock (busy seconds: how long this rank computed, sent in its control rows)
and the path of one message: end the partition still in ``p.grad`` (after checking it was not
changed there), refuse a plan with slots that got no gradient, unscale the slots under AMP,
form the message (:class:`~pgc_hvd.compress.message.MessageEncoder`, straight into the payload
row when rows are dense), inject the configured delay (``delays``; cut short under
``straggler_policy="cancel"`` when the step fires without this rank), check it is finite (a
non-finite message is reported as such and never sent), encode it and hand it to the agent.
The plan, the version and whether the step was overtaken are arguments.

Runs on the training thread. May import: ``runtime.agent`` (``Outgoing``) and torch.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Optional

import torch

from pgc_hvd.runtime.agent import Outgoing


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite, in one read of x and no allocation: any NaN or
    Inf entry makes the sum NaN or Inf; a finite sum proves them all finite. Only a sum that
    overflowed (or a real NaN/Inf) is checked entry by entry."""
    total = float(x.sum()) if not x.is_complex() else complex(x.sum())
    if (math.isfinite(total) if isinstance(total, float)
            else math.isfinite(total.real) and math.isfinite(total.imag)):
        return True
    return bool(torch.isfinite(x).all())


class MessageSender:
    """Sends one message per computed step (module doc)."""

    def __init__(self, capture, encoder, agent, scheme, rank: int, *, delays=None,
                 cancel: bool = False):
        self.capture, self.encoder, self.agent, self.scheme = capture, encoder, agent, scheme
        self.rank = int(rank)
        self.delays, self.cancel = delays, bool(cancel)
        #: seconds this rank has computed (forward, backward, forming messages), all steps
        self.busy = 0.0
        self._since: Optional[float] = None   # start of the current step's compute

    def clock(self, restart: bool = False) -> None:
        """Start the current step's compute clock (``restart``: even if it runs)."""
        if restart or self._since is None:
            self._since = time.monotonic()

    def stop_clock(self) -> None:
        """The step's compute is over: add it to :attr:`busy`."""
        self.busy += time.monotonic() - self._since

    def send(self, plan, version: int, *, loss=None, metrics: tuple = (), grad_scale=None,
             overtaken: Callable[[], bool]) -> None:
        """Form, check, encode and submit the message of step ``version`` (module doc); nothing
        is sent once ``overtaken()`` says the step fired without this rank."""
        cap, enc, agent, t = self.capture, self.encoder, self.agent, version
        if cap.target_slot is not None:   # the last partition's gradient is in p.grad
            cap.check_untouched(plan, t, grad_scale)
            cap.end_pending(plan, t)
        packed = payload = msg = None
        if not overtaken():
            missing = cap.missing(plan)
            if missing:
                raise RuntimeError(
                    f"pgc_hvd: scheme {self.scheme.name} asks rank {self.rank} to evaluate "
                    f"partitions {[p for p, sl in plan.evaluate]} at step {t}, but slots "
                    f"{missing} got no gradient; iterate `for batch in optimizer.batches(loader)` "
                    f"(or use optimizer.partition(slot)) and run backward on each batch")
            cap.unscale(grad_scale)
            if not cap.ring_mode:
                msg = cap.msg
            else:
                if enc.dense_rows:   # the dense payload row is the message: formed in place
                    packed, payload = agent.payload_buffer()
                msg = enc.form(*cap.slots(plan), out=payload if payload is not None else cap.msg)
            self._delay(t)
        self.stop_clock()
        if overtaken():
            return
        if not all_finite(msg):
            agent.report_bad(t, self.busy)
            return
        if payload is None:
            packed, payload = agent.payload_buffer()
        error_norm = enc.encode(msg, payload, error_norm=self.scheme.needs_error_norms)
        agent.submit(Outgoing(t, t, payload, time.time(), math.nan if loss is None else float(loss),
                              cap.worker_ring.message_versions(plan), packed=packed,
                              error_norm=error_norm, metrics=metrics), self.busy)

    def _delay(self, t: int) -> None:
        delay = 0.0 if self.delays is None else float(self.delays.sample(self.rank, t))
        if delay > 0:
            if self.cancel:   # cut short when the step fires without this rank
                self.agent.wait_decided_beyond(t, delay)
            else:
                time.sleep(delay)
