"""``stragglers="auto"`` in the runtime: the straggler budget s re-planned while the ranks train.

The rule and its model are the simulator's, reused as they are: :class:`pgc_hvd.control.auto_s.
AutoStragglers` (observe, decide with hysteresis) over :mod:`pgc_hvd.control.progress_model`
(time per step from the observed delays, a left-out rank finishing its step first: the
rule's default ``straggler_policy``, "continue", since a forward and backward cannot be
interrupted; progress per step from the staleness effect). This module is the runtime's
adaptor, :class:`RuntimeAutoS`:

* **Where the statistics live.** On every rank, fed on the agent thread by
  :meth:`RuntimeAutoS.on_decided` (the agent's ``on_decided`` hook, called in
  :meth:`~pgc_hvd.runtime.agent.CommAgent.fire` with the control rows that decided the step,
  the same rows on every rank under every control channel). Each row shows the newest message
  of its rank and the rank's cumulative busy seconds when it sent it; a rank whose row shows a
  new message gives one sample (seconds = busy now - busy at its previous message, k = the
  steady-state partitions of the s in force), i.e. what the simulator observes, (seconds, k)
  of a finished step. The first message of a plan gives none (a re-plan's evaluates the whole
  ring; the run's first step pays the first forward and backward, an outlier that made the early
  boundary take s = 2 where s = 1 was right in docs/control.md's smoke launches), so the first
  early boundary (``early_gain``, before ``first``) that can switch is at step 2. The rows'
  ready times give the step time (a rank's seconds per version between two of its messages, on
  its own clock; the median over the ranks with a new message), which calibrates the model's
  fixed cost per step of the s in force (o_0 on the s = 0 path, o_1 with the control round); the
  round's prior until both were seen is
  :data:`~pgc_hvd.control.progress_model.DEFAULT_ROUND_COST`. Memory: the rule's windows, O(n *
  window), whatever the run's length.
* **Who decides.** Every rank, the same decision, without a collective: the rule is a pure,
  deterministic function of the rows in decision order (its Monte Carlo draws are seeded by the
  number of switches). When the agent decides step V - 1 and V is a boundary of the rule
  (``first``, then every ``every`` steps, ``cooldown`` after a switch), it asks the rule for
  the s of step V; a switch travels with the decided update, ``update.info["auto_s"]`` (the
  :class:`~pgc_hvd.control.auto_s.Switch` as a dict), so every rank reads it when it applies
  update V - 1, i.e. at the same model version.
* **The re-plan, at version V** (the facade's ``step()`` after applying update V - 1,
  :meth:`pgc_hvd.runtime.optimizer.PGCOptimizer.step`): no rank has sent a message for step V
  yet (each one stops there), so the old plan has decided exactly the steps < V and every rank
  has applied them: nothing decided is lost. Every rank leaves the old agent at V (it serves
  collectives until every rank has left: the one synchronisation of a switch), then builds the
  scheme of the new s (code, c), a fresh ring (its first step evaluates every slot, as a
  warm-up; a loop-fed ring starts with zeros), a new agent on a control channel of its own
  name, and re-binds the coded loader; the DDP door's sampler asks the optimizer for each
  step's partitions, so it follows. The model, the user's optimizer and its state carry over.

Defaults differ from the simulator's (:data:`pgc_hvd.runtime.config.AUTO_DEFAULTS`; checked
once there, :func:`~pgc_hvd.runtime.config.auto_setting`): a switch costs the runtime a
barrier and a new control channel, so boundaries are every 20 steps, the first at step 10;
before it, every step is an early boundary where only a predicted gain > ``early_gain`` (100%)
switches, and so is a step after an onset (``half_life`` steps in a row over twice the window's
fastest: stragglers that came between two boundaries); the staleness cost is the one measured
on the runtime's own workload (:data:`~pgc_hvd.runtime.config.RUNTIME_STALENESS_COST`),
where deep rings cost steps.

Owns :class:`RuntimeAutoS` (the rule and its statistics on this rank, under its lock) and the
re-plan's small helpers (:func:`switch_of`, :func:`replanned_config`, :func:`agent_name`); the
re-plan itself is the facade's. Threads: the agent thread (:meth:`RuntimeAutoS.on_decided`),
the training thread (:meth:`RuntimeAutoS.restarted`, ``summary``, the helpers).
May import: ``control`` (the rule), ``runtime.rows`` (the row layout), ``runtime.config``.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import threading
from typing import Optional

from pgc_hvd.control.auto_s import AutoConfig, AutoStragglers
from pgc_hvd.runtime.config import AUTO_DEFAULTS  # noqa: F401  (the runtime defaults, re-exported)
from pgc_hvd.runtime.rows import CTRL_BUSY, CTRL_READY_STEP, CTRL_READY_TIME

class RuntimeAutoS:
    """The rule on one rank (module doc). ``s``: the budget in force."""

    def __init__(self, config: AutoConfig, scheme: str, n: int,
                 scheme_options: Optional[dict] = None):
        self.rule = AutoStragglers(scheme, n, config, scheme_options)
        self.n = int(n)
        self._lock = threading.Lock()
        self._seen_step = [None] * self.n    # the newest message step each row showed
        self._seen_busy = [None] * self.n    # the rank's busy seconds at that message
        self._seen_time = [None] * self.n    # the message's ready time (the rank's clock)
        #: every switch made (dicts, without the candidates' predictions), the newest last
        self.switches: collections.deque = collections.deque(maxlen=64)
        #: steps decided at each s: {s: steps}
        self.steps_at_s: dict = {}

    @property
    def s(self) -> int:
        return self.rule.s

    @property
    def s_max(self) -> int:
        return self.rule.s_max

    # -- agent thread ----------------------------------------------------------------------
    def on_decided(self, update, ctl) -> None:
        """The agent decided ``update.step`` on rows ``ctl``: observe the new messages, and
        at a boundary of the rule put its switch into ``update.info["auto_s"]``."""
        rule = self.rule
        with self._lock:
            k = rule.partitions(rule.s)
            periods = []
            for w in range(self.n):
                step, busy = int(ctl[w][CTRL_READY_STEP]), float(ctl[w][CTRL_BUSY])
                if step < 0 or step == self._seen_step[w]:
                    continue
                ready = float(ctl[w][CTRL_READY_TIME])
                prev, prev_step, prev_time = (self._seen_busy[w], self._seen_step[w],
                                              self._seen_time[w])
                if prev is not None and busy > prev:
                    rule.observe(w, busy - prev, k)
                if prev_time is not None and step > prev_step and ready > prev_time:
                    periods.append((ready - prev_time) / (step - prev_step))
                self._seen_step[w], self._seen_busy[w] = step, busy
                self._seen_time[w] = ready
            if periods:
                # the step time: seconds per version between a rank's messages (its own
                # clock), the median over the ranks with a new one; the same on every rank
                rule.observe_step(statistics.median(periods))
            self.steps_at_s[rule.s] = self.steps_at_s.get(rule.s, 0) + 1
            sw = rule.decide(int(update.step) + 1)
            if sw is not None:
                update.info["auto_s"] = sw.as_dict()
                brief = {k: v for k, v in sw.as_dict().items() if k != "predictions"}
                self.switches.append(brief)

    # -- training thread -------------------------------------------------------------------
    def restarted(self) -> None:
        """A new plan starts (a re-plan): the next message of each rank is its warm-up (the
        whole ring), so it gives no sample; the busy seconds restart with the new step."""
        with self._lock:
            self._seen_step = [None] * self.n
            self._seen_busy = [None] * self.n
            self._seen_time = [None] * self.n

    def summary(self) -> dict:
        """For ``summary.json``: the switches (without predictions), steps decided at each s,
        the s in force."""
        with self._lock:
            return {"auto_switches": list(self.switches),
                    "steps_at_s": {str(k): v for k, v in sorted(self.steps_at_s.items())},
                    "final_s": self.rule.s}


def switch_of(update) -> Optional[dict]:
    """The switch an applied update carries (:meth:`RuntimeAutoS.on_decided`), or None."""
    info = getattr(update, "info", None) or {}
    return info.get("auto_s")


def replanned_config(config, s: int):
    """The runtime config of the plan after a switch: budget ``s``, the rest unchanged."""
    return dataclasses.replace(config, stragglers=int(s))


def agent_name(config, switches: int) -> str:
    """The name of the agent (its collectives and control channel) after ``switches``
    re-plans: ``name.auto<k>``, so the old channel's keys and store stay apart."""
    return f"{config.name}.auto{int(switches)}" if switches else str(config.name)


__all__ = ["AUTO_DEFAULTS", "RuntimeAutoS", "agent_name",
           "replanned_config", "switch_of"]
