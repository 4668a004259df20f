"""The control rule in the simulator: a ``SimConfig.step_hook``.

    from pgc_hvd.control.sim import SimController
    ctl = SimController(ControlConfig(high=1.0, knob="c"))
    simulate("bounded-staleness", 8, 1, ..., step_hook=ctl, diag_every=ctl.cfg.every)

or simply ``simulate(..., adaptive=True, rule={"knob": "c"})`` / ``pgc-hvd simulate --adaptive``.
Every K-th step (the engine computes the staleness diagnostics only then; their CPU cost is
``extra["diag_seconds"]``) the hook feeds ``lhat_ratio`` and the last loss to the rule; a change
is applied before the step's update (so the offending step already uses the lowered eta, or the
next round the lowered c) and written to ``extra["control"]``; ``extra["control_level"]``,
``extra["lr"]`` and ``extra["c"]`` are recorded every step.
"""

from __future__ import annotations

import math
from typing import Optional

from .rule import ControlConfig, ControlRule, actuate, make_actuator


class SimController:
    def __init__(self, config: Optional[ControlConfig] = None):
        self.cfg = config or ControlConfig()
        self.rule = ControlRule(self.cfg)
        self.actuator = None
        self.last_loss: Optional[float] = None

    def _bind(self, sim) -> None:
        self.actuator = make_actuator(self.cfg.knob, sim.scheme, sim.opt, self.cfg.factor,
                                      self.cfg.c_min)

    def __call__(self, sim, step, decision, g_hat, extra) -> None:
        if self.actuator is None:
            self._bind(sim)
        if sim.records and sim.records[-1].loss is not None:
            self.last_loss = float(sim.records[-1].loss)
        ratio = extra.get("lhat_ratio")
        if ratio is None and "disp_max" in extra:
            ratio = 0.0  # diagnostics ran and found no stale entry
        gsq = extra.get("g_hat_sq")
        if gsq is not None and not math.isfinite(gsq):
            ratio = float("inf")
        act = actuate(self.rule, self.actuator, self.rule.observe(step, ratio, self.last_loss))
        if act is not None:
            extra.setdefault("control", []).append(act.as_dict())
        extra["control_level"] = self.rule.level
        extra["c"] = int(sim.scheme.lookback)   # the staleness bound, or the ring depth

    @property
    def actions(self):
        return self.rule.actions
