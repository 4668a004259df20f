"""The staleness control rule (docs/control.md).

Signal (every K steps, from :mod:`pgc_hvd.metrics.diagnostics`):

    rho_t = L_hat^2 * ||beta_t - beta_v||^2 / ||g_hat_t||^2          (``lhat_ratio``)

L_hat^2 * displacement bounds ||grad F(beta_t) - grad F(beta_v)||^2, the staleness error of the
oldest entry used (PGC paper Lemmas 1 and 3: the gamma term), so rho_t compares that error with
the update itself.

Why rho alone is not enough, and the loss-trend gate
----------------------------------------------------
Descent lemma for an L-smooth F and the update beta_{t+1} = beta_t - eta * g_hat, with
g_hat = grad F(beta_t) + e_t:

    F(beta_{t+1}) <= F(beta_t) - eta <grad F(beta_t), g_hat> + (L eta^2 / 2) ||g_hat||^2,
    <grad F(beta_t), g_hat> >= ||g_hat||^2 - ||e_t|| ||g_hat||,   ||e_t||^2 <= rho_t ||g_hat||^2.

So rho_t < 1 (with eta L < 2 (1 - sqrt(rho_t))) is a *sufficient* condition for descent, built from
the worst case: the oldest entry's error, at full weight, pointing against the update. In bounded
staleness only some of the n entries have the oldest version and their errors partly cancel, so
rho_t > 1 does not mean ascent. On the control experiment's set-up (``pgc-hvd experiment
control``, docs/control.md) the
healthy run (c = 8, eta = 0.5, fastest to target) has median rho ~0.75 and above 1 for its first
~90 steps, while the diverging one (c = 8, eta = 8) has median ~1.4: a threshold on rho cannot
separate them. The other candidates did not either (measured on the fixed runs' records):
cos(stale, current) < 0 happens in both runs early (-0.4 to -0.5); eta * L_hat is ~0.25 in the
healthy run and ~0.3 in the diverging one, because L_hat is a secant estimate over the
displacement and the softmax saturates when the iterates travel far (L_hat drops from ~0.5 to
~0.03); ||g_hat||^2 grows 5x early in the healthy run too.

What does separate them is the consequence the descent lemma predicts when its bound is binding:
the objective grows. Near a minimum with Hessian H, an entry of age a gives the linear recurrence
beta_{t+1} - beta* = (beta_t - beta*) - eta H (beta_{t-a} - beta*); its modes solve
z^{a+1} - z^a + eta lambda = 0. Stable complex roots (|z| < 1) make the loss *oscillate* with a
period of order the staleness while its average decreases (the healthy c = 8 run oscillates by up
to 2x inside each ~8-step period); an unstable root (|z| > 1) makes the *envelope* grow
geometrically, by |z|^(2W) between consecutive windows of W steps. Hence the gate: the mean loss
over the last ``trend_window`` observations exceeds (1 + ``growth``) times the mean over the
``trend_window`` before (shorter windows, half the history each, at the start of a run). With a
window at least as long as the oscillation period (>= c) the bounded oscillation averages out:
the healthy runs' largest window-to-window ratio is 1.15, the diverging run's 2.6-3.4 (the
eta = 8 runs from their first steps). The rule lowers only when both hold -- rho says staleness
error is large enough to explain an ascent, the trend says the ascent is happening -- so a
healthy-but-stale run is left alone and a loss increase with small rho (noise, a too-large eta
with fresh gradients, which lowering c would not fix) is not blamed on staleness. ``growth < 0``
switches the gate off (rho alone); an observation without a loss (the
engine did not pass one) is also judged on rho alone. The engines pass a low-noise loss: the
simulator its full training loss, the runtime the loss on its fixed validation batch (identical
on every rank).

The rule
--------
One spike of rho is common early in a run (a straggler's entry, a small ||g_hat||), so the rule
reads the median of the last ``window`` observations:

* median > ``high`` (and at least ``window`` observations since the last change) and the loss
  trend gate holds, or a non-finite signal / loss: **lower** one level -- eta <- eta * factor, or
  c <- max(c_min, floor(c * factor)) (the knob is chosen by the engine's actuator; "auto" on
  bounded staleness lowers c to its floor first, then eta: :class:`CThenLrActuator`);
* median < ``low`` for ``patience`` consecutive observations at a lowered level: **raise** one
  level back (never above the user's value).

``low < high`` is the hysteresis band; each change clears the rho window, so a new change needs
fresh evidence (the loss history is kept: a loss still climbing after a change lowers again).
Every change is an :class:`Action` (step, knob, old, new, reason) that the engines put into the
step record's ``extra["control"]``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

def adaptive_default(scheme: str, adaptive: bool) -> bool:
    """Whether the rule runs: only with ``adaptive=True`` and a scheme that uses stale gradients
    (:attr:`~pgc_hvd.schemes.Scheme.uses_stale_gradients`: bounded staleness and the pipelined
    PGC schemes); off for the others, which never see staleness, whatever the user asks."""
    from pgc_hvd.schemes import scheme_class

    try:
        cls = scheme_class(scheme)
    except ValueError:
        return False
    return bool(adaptive) and cls.uses_stale_gradients


@dataclasses.dataclass
class ControlConfig:
    high: float = 1.0        # lower when median(rho) over the window exceeds this
    low: float = 0.25        # raise back after `patience` observations below this
    window: int = 5          # observations in the median
    patience: int = 20       # observations below `low` before raising one level
    factor: float = 0.5      # multiplier per level (eta, or c rounded down)
    max_level: int = 6       # at most factor**max_level of the user's eta
    knob: str = "auto"       # "lr", "c", or "auto" (c then lr where the scheme lets c change, else lr)
    every: int = 1           # diagnostics (and the rule) every K steps
    c_min: int = 1
    growth: float = 0.5      # loss-trend gate: lower only if mean loss of the last trend_window
                             # observations > (1 + growth) x the mean of the trend_window before
                             # (growth < 0: gate off, rho alone)
    trend_window: int = 8    # observations per trend window; >= c averages the stale oscillation

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
        if cfg.trend_window < 1:
            raise ValueError(f"control trend_window must be >= 1, got {cfg.trend_window}")
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
        self.losses: list[float] = []
        self.actions: list[Action] = []

    def median(self) -> Optional[float]:
        if not self.recent:
            return None
        v = sorted(self.recent)
        m = len(v) // 2
        return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])

    def trend(self) -> Optional[float]:
        """Mean loss over the last ``trend_window`` observations / mean over the ones before
        (``min(trend_window, len // 2)`` each); None with fewer than 2 losses."""
        n = len(self.losses)
        w = min(self.cfg.trend_window, n // 2)
        if w < 1:
            return None
        last = sum(self.losses[n - w:]) / w
        prev = sum(self.losses[n - 2 * w:n - w]) / w
        return last / prev if prev > 0 else float("inf")

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
        if loss is not None:
            self.losses.append(float(loss))
            self.losses = self.losses[-2 * cfg.trend_window:]
        self.recent.append(float(ratio))
        self.recent = self.recent[-cfg.window:]
        med = self.median()
        if ratio < cfg.low:
            self.quiet += 1
        else:
            self.quiet = 0
        if len(self.recent) >= cfg.window and med > cfg.high and self.level < cfg.max_level:
            why = (f"median L_hat^2*disp/||g_hat||^2 = {med:.3g} > high {cfg.high:g} "
                   f"over {len(self.recent)} observations")
            gated = cfg.growth >= 0 and loss is not None
            tr = self.trend() if gated else None
            # gate on: lower only if the loss grows (no decision until 2 losses are known)
            if not gated or (tr is not None and tr > 1 + cfg.growth):
                if gated:
                    why += f" and loss trend x{tr:.3g} > 1 + growth {cfg.growth:g}"
                return self._change(step, +1, why, med)
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
    change between steps (``scheme.staleness_bound_adjustable``: bounded staleness).

    ``apply(c)`` makes a new bound take effect; by default it sets ``scheme.staleness_bound`` at once
    (the simulator). The Horovod runtime passes the optimizer's ``set_staleness_bound``, which
    applies it on every rank at the same control round."""

    knob = "c"

    def __init__(self, scheme, factor: float, c_min: int = 1,
                 apply: Optional[Callable[[int], None]] = None):
        self.scheme, self.factor, self.c_min = scheme, factor, c_min
        self.base = int(scheme.staleness_bound)
        self.current = self.base
        self._apply = apply

    @staticmethod
    def supports(scheme) -> bool:
        return scheme is not None and bool(scheme.staleness_bound_adjustable)

    def target(self, level: int) -> int:
        return max(self.c_min, int(math.floor(self.base * self.factor ** level + 1e-9)))

    def value(self) -> int:
        return self.current

    def set_level(self, level: int) -> tuple[float, float]:
        old, self.current = self.current, self.target(level)
        if self._apply is None:
            self.scheme.staleness_bound = self.current
        else:
            self._apply(self.current)
        return old, self.current


class CThenLrActuator:
    """Knob "auto" on a scheme with a changeable staleness bound: the first levels lower c (as
    :class:`SchemeCActuator`) down to its floor c_min, the levels beyond lower the learning rate
    (as :class:`LrActuator`, counted from the floor): level l gives

        c = c_act.target(min(l, L_c)),   eta = eta_0 * factor**max(0, l - L_c),

    L_c the first level at which c reaches c_min. Raising walks back the same way (lr first).
    ``last_knob`` names the knob the last :meth:`set_level` moved."""

    knob = "auto"

    def __init__(self, c_act: "SchemeCActuator", lr_act: "LrActuator"):
        self.c_act, self.lr_act = c_act, lr_act
        self.c_levels = 0
        while c_act.target(self.c_levels) > c_act.c_min:
            self.c_levels += 1
        self.lr_level = 0
        self.last_knob = "c"

    def value(self):
        return self.c_act.value()

    def set_level(self, level: int) -> tuple[float, float]:
        c_level, lr_level = min(level, self.c_levels), max(0, level - self.c_levels)
        if lr_level > 0 or self.lr_level > 0:   # beyond c's floor, or walking lr back to eta_0
            self.lr_level, self.last_knob = lr_level, "lr"
            return self.lr_act.set_level(lr_level)
        self.last_knob = "c"
        return self.c_act.set_level(c_level)


def make_actuator(knob: str, scheme, optimizer, factor: float, c_min: int = 1,
                  apply_c: Optional[Callable[[int], None]] = None):
    """The actuator of ``knob`` for an engine: "lr" (every param group of ``optimizer``), "c"
    (the scheme's staleness bound; ``apply_c`` as in :class:`SchemeCActuator`) or "auto" (c, then
    lr once c is at its floor, where the scheme lets c change: :class:`CThenLrActuator`; else lr).
    Both engines bind their knob here."""
    if knob == "auto":
        if not SchemeCActuator.supports(scheme):
            return LrActuator(optimizer, factor)
        return CThenLrActuator(SchemeCActuator(scheme, factor, c_min, apply=apply_c),
                               LrActuator(optimizer, factor))
    if knob == "c":
        if not SchemeCActuator.supports(scheme):
            raise ValueError(f"{scheme.name}: its pipeline depth c is fixed by the code; "
                             "use knob='lr'")
        return SchemeCActuator(scheme, factor, c_min, apply=apply_c)
    if knob == "lr":
        return LrActuator(optimizer, factor)
    raise ValueError(f"control knob must be 'lr', 'c' or 'auto', got {knob!r}")


def actuate(rule: "ControlRule", actuator, act: Optional[Action]) -> Optional[Action]:
    """Carry out the rule's action ``act`` with ``actuator`` and return it with knob, old and new
    filled in; None when there is nothing to do. Lowering c below its floor is not possible, so
    such an action is withdrawn (the rule's level and log are restored)."""
    if act is None or actuator is None:
        return act
    if isinstance(actuator, SchemeCActuator) and act.direction == "lower" \
            and actuator.value() <= actuator.c_min:
        rule.level -= 1
        rule.actions.pop()
        return None
    act.old, act.new = actuator.set_level(rule.level)
    act.knob = getattr(actuator, "last_knob", actuator.knob)
    return act
