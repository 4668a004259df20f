"""The control rule of design note 002, step 3.

Signal (every K steps, from :mod:`pgc_hvd.metrics.diagnostics`):

    rho_t = L_hat^2 * ||beta_t - beta_v||^2 / ||g_hat_t||^2          (``lhat_ratio``)

L_hat^2 * displacement bounds ||grad F(beta_t) - grad F(beta_v)||^2, the staleness error of the
oldest entry used (PGC paper Lemmas 1 and 3: the gamma term), so rho_t compares that error with
the update itself. One spike is common early in a run (a straggler's entry, a small ||g_hat||),
so the rule reads the median of the last ``window`` observations:

* median > ``high`` (and at least ``window`` observations since the last change), or a
  non-finite signal / loss: **lower** one level -- eta <- eta * factor, or c <- max(c_min,
  floor(c * factor)) (the knob is chosen by the engine's actuator);
* median < ``low`` for ``patience`` consecutive observations at a lowered level: **raise** one
  level back (never above the user's value).

``low < high`` is the hysteresis band; each change clears the window, so a new change needs
fresh evidence. Every change is an :class:`Action` (step, knob, old, new, reason) that the
engines put into the step record's ``extra["control"]``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

# exact schemes never see staleness: adaptive control is off for them whatever the user asks
STALE_SCHEMES = ("bounded-staleness", "pgc-fr", "pgc-cr", "pgc-cr-naive", "pgc-bcgc", "is-gc")


def adaptive_default(scheme: str, adaptive: bool) -> bool:
    """Whether the rule runs: only with ``adaptive=True`` and a scheme that uses stale gradients
    (bounded staleness and the pipelined PGC schemes); off for exact schemes."""
    return bool(adaptive) and str(scheme).lower() in STALE_SCHEMES


@dataclasses.dataclass
class ControlConfig:
    high: float = 1.0        # lower when median(rho) over the window exceeds this
    low: float = 0.25        # raise back after `patience` observations below this
    window: int = 5          # observations in the median
    patience: int = 20       # observations below `low` before raising one level
    factor: float = 0.5      # multiplier per level (eta, or c rounded down)
    max_level: int = 6       # at most factor**max_level of the user's eta
    knob: str = "auto"       # "lr", "c", or "auto" (c where the scheme lets it change, else lr)
    every: int = 1           # diagnostics (and the rule) every K steps
    c_min: int = 1

    @classmethod
    def from_options(cls, opts: Optional[dict]) -> "ControlConfig":
        opts = dict(opts or {})
        known = {f.name: f.type for f in dataclasses.fields(cls)}
        bad = set(opts) - set(known)
        if bad:
            raise ValueError(f"unknown control options {sorted(bad)}; known: {sorted(known)}")
        out = {}
        for k, v in opts.items():
            d = getattr(cls, k)
            out[k] = type(d)(v) if not isinstance(d, str) else str(v)
        cfg = cls(**out)
        if not 0 <= cfg.low < cfg.high:
            raise ValueError(f"control needs 0 <= low < high (hysteresis), got {cfg.low}, {cfg.high}")
        if not 0 < cfg.factor < 1:
            raise ValueError(f"control factor must be in (0, 1), got {cfg.factor}")
        return cfg


@dataclasses.dataclass
class Action:
    step: int
    direction: str           # "lower" | "raise"
    level: int               # level after the change
    reason: str
    signal: float            # the median (or the offending value)
    knob: Optional[str] = None
    old: Optional[float] = None
    new: Optional[float] = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class ControlRule:
    """Engine-independent state machine: :meth:`observe` takes rho_t (and the loss) and returns
    "lower", "raise" or None; the engine's actuator turns a level into eta or c."""

    def __init__(self, config: Optional[ControlConfig] = None):
        self.cfg = config or ControlConfig()
        self.level = 0
        self.recent: list[float] = []
        self.quiet = 0           # consecutive observations below `low`
        self.n_obs = 0
        self.actions: list[Action] = []

    def median(self) -> Optional[float]:
        if not self.recent:
            return None
        v = sorted(self.recent)
        m = len(v) // 2
        return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])

    def observe(self, step: int, ratio: Optional[float], loss: Optional[float] = None) -> Optional[Action]:
        cfg = self.cfg
        bad_loss = loss is not None and not math.isfinite(loss)
        if ratio is None and not bad_loss:
            return None
        self.n_obs += 1
        if bad_loss or (ratio is not None and not math.isfinite(ratio)):
            if self.level < cfg.max_level:
                why = f"non-finite {'loss' if bad_loss else 'signal'}"
                return self._change(step, +1, why, float("inf"))
            return None
        self.recent.append(float(ratio))
        self.recent = self.recent[-cfg.window:]
        med = self.median()
        if ratio < cfg.low:
            self.quiet += 1
        else:
            self.quiet = 0
        if len(self.recent) >= cfg.window and med > cfg.high and self.level < cfg.max_level:
            return self._change(step, +1, f"median L_hat^2*disp/||g_hat||^2 = {med:.3g} > high {cfg.high:g} "
                                           f"over {len(self.recent)} observations", med)
        if self.level > 0 and self.quiet >= cfg.patience:
            return self._change(step, -1, f"L_hat^2*disp/||g_hat||^2 < low {cfg.low:g} for "
                                           f"{self.quiet} observations", med)
        return None

    def _change(self, step, delta, reason, signal) -> Action:
        self.level += delta
        self.recent = []
        self.quiet = 0
        a = Action(step, "lower" if delta > 0 else "raise", self.level, reason, float(signal))
        self.actions.append(a)
        return a


class LrActuator:
    """eta_level = eta_0 * factor**level on every param group (each group keeps its own eta_0)."""

    knob = "lr"

    def __init__(self, optimizer, factor: float):
        self.opt, self.factor = optimizer, factor
        self.base = [float(g["lr"]) for g in optimizer.param_groups]

    def value(self) -> float:
        return float(self.opt.param_groups[0]["lr"])

    def set_level(self, level: int) -> tuple[float, float]:
        old = self.value()
        for g, b in zip(self.opt.param_groups, self.base):
            g["lr"] = b * self.factor ** level
        return old, self.value()


class SchemeCActuator:
    """c_level = max(c_min, floor(c_0 * factor**level)) for a scheme whose staleness bound can
    change between steps (bounded staleness: ``c_bound``)."""

    knob = "c"

    def __init__(self, scheme, factor: float, c_min: int = 1):
        self.scheme, self.factor, self.c_min = scheme, factor, c_min
        self.base = int(scheme.c_bound)

    @staticmethod
    def supports(scheme) -> bool:
        return hasattr(scheme, "c_bound")

    def value(self) -> int:
        return int(self.scheme.c_bound)

    def set_level(self, level: int) -> tuple[float, float]:
        old = self.value()
        self.scheme.c_bound = max(self.c_min, int(math.floor(self.base * self.factor ** level + 1e-9)))
        return old, self.value()

    def floor_reached(self, level: int) -> bool:
        return max(self.c_min, int(math.floor(self.base * self.factor ** level + 1e-9))) <= self.c_min
