"""``stragglers="auto"``: the straggler budget s chosen online from the cluster's own delays.

Owns :class:`AutoConfig` (the rule's settings, checked before a run starts), :class:`ArrivalStats`
(per-rank windows of what the engine already sees: each rank's step duration and the partitions
it evaluated; bounded memory, nothing grows with the run's length) and :class:`AutoStragglers`
(the rule). An engine feeds it and applies its :class:`Switch`; the simulator's adaptor is in
:mod:`pgc_hvd.sim.engine` (``SimConfig.auto``), the runtime's is to come.

The rule (docs/control.md, "s chosen online"):

* **Observe.** Every finished step of rank r gives (seconds, k): D = seconds - k tau is its delay;
  the last ``window`` per rank are kept, and a draw takes a sample of age a (0: the newest)
  with weight 2^(-a/``half_life``), so a straggler that comes or goes counts as such after a
  few of its steps; a step still being computed that has run longer than the rank's newest
  sample counts as a (censored) sample at the boundary. tau is the configured compute time of
  a partition or, unknown, the smallest seconds / k seen (the shift estimate ``advise``
  uses). The last ``window`` step times of the current s calibrate the model's fixed cost
  of that kind of s, o = max(0, mean step time - T(current s) without o): o_0 at s = 0 (no
  control round: the runtime's s = 0 path), o_1 at s >= 1 (with it); the kind not observed
  yet is the other plus or minus a prior for the round (``round_cost``, else the engine's
  ``round_prior``; :class:`~.progress_model.FixedCost`).
* **Decide, at a safe boundary** (step ``first``, then every ``every`` steps: by default
  every step boundary, where the simulator's plan can change; once every rank has
  ``min_samples`` samples and ``cooldown`` steps have passed since the last switch; with
  ``early_gain`` every step before ``first`` is an early boundary too, and so is a later step
  off the regular boundaries once ``half_life`` steps in a row took more than (1 +
  ``early_gain``) x the window's fastest (an onset: stragglers that came between two
  boundaries and stayed); there a switch
  needs the best candidate predicted more than ``early_gain`` better than the current s, and
  ``raise_to="smallest"`` takes the smallest s within ``early_gain`` of the best (at an onset,
  with full windows, within ``min_gain``): a persistently slow rank is plain after one step,
  the noise of a few samples is not):
  predict every candidate s in 0..s_max with :mod:`.progress_model` (time per step from the
  observed delays plus k partitions' compute, with the engine's ``straggler_policy``: a
  left-out rank that finishes its step starts the next one late, ``continue_time``; one that
  stops at once, the order statistic; progress per step from the staleness effect). A
  candidate other than the current s is charged its re-plan: the first step of a new plan
  evaluates every slot of the new ring (c partitions for PGC), so
  (c_warm - k) tau is spread over ``horizon`` steps. Then:

  - **more redundancy** (best s > current) only if its expected progress per second beats
    the current s's by more than ``min_gain`` (hysteresis; default 8%); to the best s
    (``raise_to="best"``, the simulator's default) or to the smallest s above the current one
    predicted within ``min_gain`` of the best (``"smallest"``, the runtime's: a larger s must
    beat it by the margin too, as it must beat the current one);
  - **less redundancy** (best s < current) as soon as it is predicted at least as good: a
    smaller s costs fewer evaluations and less staleness than the model charges (it is the
    safe side), so s = 0 is reached when nothing is slow. Going back up needs the margin
    again, so the rule does not oscillate between two budgets. With ``lower_gain`` > 0 only
    when predicted more than ``lower_gain`` better: redundancy that costs (almost) nothing is
    kept as insurance against stragglers still to come.
* **Apply.** The engine re-plans at the boundary: code, c, ring and assignment of the new s
  (the simulator drops the old plan's messages still in flight, and the new ring's first step
  evaluates its c partitions, as a pipelined scheme's warm-up). Every switch is a
  :class:`Switch` (step, old s, new s, reason, the predictions) that the engine writes into
  the step record's ``extra["auto_s"]``.

May import: numpy, ``schemes`` (layer 2) and the rest of ``control``; never an engine.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Optional

import numpy as np

from .progress_model import (DEFAULT_ROUND_COST, DEFAULT_STALENESS_COST, FixedCost, Prediction,
                             draw_delays, predict, step_partitions, step_time)

_SWITCHES_KEPT = 64


def default_s_max(n: int) -> int:
    """The largest s ``stragglers="auto"`` considers unless told: max(3, n / 4), and never
    n - 1 where n >= 3, where ONE rank's message decides every step (pgc-cr's ring then holds
    n - 1 stale gradients): measured on the runtime's workload at np 4, s = 3 took 1.13x s = 0's
    steps to the target without stragglers (s = 1, 2: no more) and 1.17x s = 2's time under
    exponential delays, which the model's one staleness cost does not see (docs/control.md,
    "The staleness cost in the runtime")."""
    n = int(n)
    return min(max(1, n - 2), max(3, n // 4))


@dataclasses.dataclass
class AutoConfig:
    every: int = 1           # steps between re-plan boundaries (after the first, at `first`)
    cooldown: int = 10       # steps after a switch before the next one
    first: int = 1           # the first boundary (a persistent straggler is plain at once)
    window: int = 16         # samples kept per rank (and step times of the current s)
    min_gain: float = 0.08   # raise s only when the best predicted rate > (1 + min_gain) x current
    horizon: int = 50        # steps over which a re-plan's warm-up step is charged
    half_life: float = 4.0   # samples: recent steps weigh more (a straggler that comes or goes)
    s_max: Optional[int] = None   # largest s considered (None: default_s_max(n))
    s_start: Optional[int] = None  # s of the first steps (None: the scheme's default, 1)
    staleness_cost: float = DEFAULT_STALENESS_COST   # lambda of progress_model
    min_samples: int = 1     # samples per rank before a decision
    tau: Optional[float] = None   # seconds per partition (None: estimated, min seconds / k)
    draws: int = 256         # Monte Carlo draws of the order statistic
    round_cost: Optional[float] = None   # prior seconds of a control round (s >= 1 over s = 0)
                             # until both are observed (None: the engine's, AutoStragglers.round_prior)
    raise_to: str = "best"   # "best": the best candidate; "smallest": the smallest s whose
                             # predicted rate is within min_gain of the best (the runtime's)
    lower_gain: float = 0.0  # lower s only when the smaller s is predicted > lower_gain better
                             # (0: at least as good; > 0 keeps cheap redundancy as insurance)
    early_gain: Optional[float] = None   # boundaries at every step before `first` too, and at an
                             # onset after it (half_life steps > 1 + early_gain x the fastest),
                             # where a switch needs a predicted gain > early_gain (None: neither)

    @classmethod
    def from_options(cls, opts) -> "AutoConfig":
        if isinstance(opts, AutoConfig):
            return opts
        opts = dict(opts or {})
        names = {f.name for f in dataclasses.fields(cls)}
        bad = set(opts) - names
        if bad:
            raise ValueError(f"unknown stragglers='auto' options {sorted(bad)}; known: "
                             f"{sorted(names)}")
        cfg = cls(**opts)
        for name in ("every", "first", "cooldown", "window", "min_samples", "draws", "horizon"):
            v = getattr(cfg, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"stragglers='auto': {name} must be an int >= 1, got {v!r}")
        if not (cfg.min_gain >= 0 and math.isfinite(cfg.min_gain)):
            raise ValueError(f"stragglers='auto': min_gain must be >= 0, got {cfg.min_gain}")
        if not cfg.staleness_cost >= 0:
            raise ValueError(f"stragglers='auto': staleness_cost must be >= 0, "
                             f"got {cfg.staleness_cost}")
        if not cfg.half_life > 0:
            raise ValueError(f"stragglers='auto': half_life must be > 0 samples, "
                             f"got {cfg.half_life}")
        if cfg.round_cost is not None and not (cfg.round_cost >= 0
                                               and math.isfinite(cfg.round_cost)):
            raise ValueError(f"stragglers='auto': round_cost must be seconds >= 0, "
                             f"got {cfg.round_cost}")
        if cfg.raise_to not in ("best", "smallest"):
            raise ValueError(f"stragglers='auto': raise_to must be 'best' or 'smallest', "
                             f"got {cfg.raise_to!r}")
        if not (isinstance(cfg.lower_gain, (int, float)) and cfg.lower_gain >= 0
                and math.isfinite(cfg.lower_gain)):
            raise ValueError(f"stragglers='auto': lower_gain must be a fraction >= 0 (0: lower "
                             f"s when predicted at least as good), got {cfg.lower_gain!r}")
        if cfg.early_gain is not None and not (isinstance(cfg.early_gain, (int, float))
                                               and cfg.early_gain >= 0
                                               and math.isfinite(cfg.early_gain)):
            raise ValueError(f"stragglers='auto': early_gain must be a fraction >= 0 (e.g. "
                             f"1.0: predicted twice as fast), or None for no boundary before "
                             f"first; got {cfg.early_gain!r}")
        if cfg.tau is not None and not cfg.tau > 0:
            raise ValueError(f"stragglers='auto': tau must be seconds > 0, got {cfg.tau}")
        if cfg.min_samples > cfg.window:
            raise ValueError(f"stragglers='auto': min_samples = {cfg.min_samples} exceeds "
                             f"window = {cfg.window}")
        return cfg

    def budget_range(self, scheme: str, n: int) -> tuple[int, int]:
        """(s_start, s_max) for ``scheme`` over n ranks, checked before anything runs: a budget
        above n - 1 is refused with the fix."""
        from pgc_hvd.schemes import scheme_class
        cls = scheme_class(scheme)
        if cls.waits_for_all:
            raise ValueError(f"stragglers='auto' with {scheme!r}: it waits for every worker and "
                             f"tolerates no stragglers; use a scheme that does ('pgc-cr', "
                             f"'gc-cr', 'bcgc', 'is-sgd') or stragglers=0")
        if n < 2:
            raise ValueError(f"stragglers='auto' needs n >= 2 workers, got n={n}")
        s_max = default_s_max(n) if self.s_max is None else int(self.s_max)
        if not 0 <= s_max <= n - 1:
            raise ValueError(f"stragglers='auto': s_max = {s_max} is not possible with n = {n} "
                             f"workers (s <= n - 1 = {n - 1}); pass auto options s_max <= {n - 1} "
                             f"(e.g. {{'s_max': {min(n - 1, max(1, n // 4))}}}) or run more "
                             f"workers")
        s0 = cls.default_stragglers(n) if self.s_start is None else int(self.s_start)
        if not 0 <= s0 <= s_max:
            raise ValueError(f"stragglers='auto': s_start = {s0} must lie in [0, s_max = "
                             f"{s_max}] for n = {n}; lower s_start or raise s_max (<= {n - 1})")
        return s0, s_max


@dataclasses.dataclass
class Switch:
    """One re-plan: at the boundary before step ``step`` s goes from ``old`` to ``new``."""

    step: int
    old: int
    new: int
    reason: str
    gain: float
    predictions: list

    def as_dict(self) -> dict:
        return {"step": self.step, "old_s": self.old, "new_s": self.new, "reason": self.reason,
                "gain": self.gain, "predictions": self.predictions}


class ArrivalStats:
    """Per-rank windows of (seconds, partitions) of finished steps and the step times of the
    current plan; memory O(n * window) whatever the run's length."""

    def __init__(self, n: int, window: int, tau: Optional[float] = None):
        self.n, self.window = int(n), int(window)
        self.fixed_tau = tau
        self.samples = [collections.deque(maxlen=self.window) for _ in range(self.n)]
        self.step_times: collections.deque = collections.deque(maxlen=self.window)
        self._tau_min = math.inf

    def observe(self, rank: int, seconds: float, partitions: int) -> None:
        k = max(1, int(partitions))
        self.samples[rank].append((float(seconds), k))
        self._tau_min = min(self._tau_min, float(seconds) / k)

    def observe_step(self, step_time: float) -> None:
        self.step_times.append(float(step_time))

    def reset_steps(self) -> None:
        self.step_times.clear()

    @property
    def tau(self) -> float:
        return float(self.fixed_tau) if self.fixed_tau is not None else self._tau_min

    def counts(self) -> list[int]:
        return [len(d) for d in self.samples]

    def delays(self, running=None) -> list[list[float]]:
        """Each rank's delays D = seconds - k tau (>= 0) over its window, oldest first.
        ``running``: {rank: (seconds so far, k)} of steps still being computed; one that has
        already run longer than the rank's newest sample is appended as a (censored, lower)
        sample, so a rank that just became slow counts before its slow step ends."""
        tau = self.tau
        out = [[max(0.0, sec - k * tau) for sec, k in d] for d in self.samples]
        for r, (sec, k) in (running or {}).items():
            d = max(0.0, sec - max(1, int(k)) * tau)
            if out[r] and d > out[r][-1]:
                out[r].append(d)
        return out


class AutoStragglers:
    """The online rule (module doc) for ``scheme`` over n ranks. ``s`` is the budget in force;
    :meth:`decide` returns a :class:`Switch` (and updates ``s``) or None."""

    def __init__(self, scheme: str, n: int, config: Optional[AutoConfig] = None,
                 scheme_options: Optional[dict] = None):
        self.cfg = AutoConfig.from_options(config)
        self.scheme, self.n = scheme, int(n)
        self.s, self.s_max = self.cfg.budget_range(scheme, self.n)
        self.stats = ArrivalStats(self.n, self.cfg.window, self.cfg.tau)
        self.options = dict(scheme_options or {})
        self._k: dict[int, int] = {}
        self.last_switch: Optional[int] = None
        self._warm: dict[int, int] = {}
        self.switches: collections.deque = collections.deque(maxlen=_SWITCHES_KEPT)
        self.n_switches = 0
        self.last_predictions: list = []
        #: the engine's prior for the control round when ``round_cost`` is None (the runtime's
        #: log path: DEFAULT_ROUND_COST; the simulator's master model prices none: 0)
        self.round_prior = DEFAULT_ROUND_COST
        #: what a rank left out of a step does, in the engine (progress_model.step_time):
        #: "continue" (it finishes the step: the runtime, whose forward and backward cannot be
        #: interrupted, and the simulator's default), or the simulator's "cancel"
        self.straggler_policy = "continue"
        #: the fixed cost per step calibrated at s = 0 (key 0) and at s >= 1 (key 1), None
        #: until steps at such an s were observed
        self.observed_cost: dict = {0: None, 1: None}
        self.fixed_cost = FixedCost.calibrated(round_cost=self.round_cost)

    @property
    def round_cost(self) -> float:
        """The prior for a control round: ``round_cost`` or the engine's ``round_prior``."""
        return float(self.cfg.round_cost if self.cfg.round_cost is not None
                     else self.round_prior)

    def candidates(self) -> list[tuple[str, int]]:
        return [(self.scheme, s) for s in range(0, self.s_max + 1)]

    def partitions(self, s: int) -> int:
        k = self._k.get(s)
        if k is None:
            k = self._k[s] = step_partitions(self.scheme, self.n, s, **self.options)
        return k

    def warmup_partitions(self, s: int) -> int:
        """Partitions a rank evaluates at the first step of a fresh plan of budget s (every
        slot of the new ring: c for PGC's pipelined schemes, k for the others)."""
        w = self._warm.get(s)
        if w is None:
            from pgc_hvd.schemes import get_scheme
            sch = get_scheme(self.scheme, self.n, s, **self.options)
            w = self._warm[s] = max(len(sch.supports()[r]) if sch.pipelined else
                                    len(sch.work_plan(r, 1).evaluate) for r in range(self.n))
        return w

    # -- what the engine sees ---------------------------------------------------------
    def observe(self, rank: int, seconds: float, partitions: int) -> None:
        self.stats.observe(rank, seconds, partitions)

    def observe_step(self, step_time: float) -> None:
        self.stats.observe_step(step_time)

    # -- the decision --------------------------------------------------------------------
    def early(self, step: int) -> bool:
        """Whether ``step`` is an early boundary (with ``early_gain``): every step before
        ``first``; after it, a step off the regular boundaries whose newest ``half_life`` step
        times were each more than (1 + ``early_gain``) x the window's fastest (an onset that
        held for a half-life of the samples' weights, so the new delays weigh about half in
        the model; a cheap test: the model runs only then)."""
        c = self.cfg
        if c.early_gain is None or step < 1:
            return False
        if step < c.first:
            return True
        if not (step - c.first) % c.every:
            return False             # a regular boundary
        times, last = self.stats.step_times, max(1, math.ceil(c.half_life))
        if len(times) <= last:
            return False
        bar = (1.0 + c.early_gain) * min(times)
        return all(times[-i] > bar for i in range(1, last + 1))

    def ready(self, step: int) -> bool:
        c = self.cfg
        if not self.early(step) and (step < c.first or (step - c.first) % c.every):
            return False
        return ((self.last_switch is None or step - self.last_switch >= c.cooldown)
                and min(self.stats.counts()) >= c.min_samples)

    def predictions(self, running=None) -> tuple[list[Prediction], FixedCost]:
        """The candidates ranked (best first) and the fixed costs per step (o_0 at s = 0, o_1
        at s >= 1): the current s's kind calibrated on its step times (the observed mean step
        time minus the model's T without o), the other kind as last calibrated, else from
        this one and the round's prior (:meth:`FixedCost.calibrated`); ``running`` as
        :meth:`ArrivalStats.delays`."""
        st = self.stats
        delays, tau = st.delays(running), st.tau
        hl = self.cfg.half_life
        D = draw_delays(delays, self.cfg.draws, self.n_switches, hl)
        if st.step_times:
            bare = step_time(D, tau, self.partitions(self.s), self.s,
                             policy=self.straggler_policy)
            self.observed_cost[min(1, self.s)] = max(0.0, float(np.mean(st.step_times)) - bare)
        fc = self.fixed_cost = FixedCost.calibrated(self.observed_cost[0], self.observed_cost[1],
                                                    self.round_cost)
        preds = []
        for scheme, s in self.candidates():
            try:
                k = self.partitions(s)
                replan = 0.0 if s == self.s else \
                    max(0, self.warmup_partitions(s) - k) * tau / self.cfg.horizon
                preds.append(predict(scheme, s, delays, tau, fc.at(s) + replan,
                                     self.cfg.staleness_cost, k=k, drawn=D,
                                     policy=self.straggler_policy))
            except ValueError:     # no code for (n, s)
                continue
        preds.sort(key=lambda p: (-p.rate, p.s))
        return preds, fc

    def decide(self, step: int, running=None) -> Optional[Switch]:
        """At a boundary (:meth:`ready`): the switch to make before step ``step``, or None.
        ``running``: {rank: (seconds so far, partitions)} of the steps being computed now."""
        if not self.ready(step):
            return None
        preds, fc = self.predictions(running)
        self.last_predictions = [p.as_dict() for p in preds]
        cur = next((p for p in preds if p.s == self.s), None)
        if not preds or cur is None:
            return None
        best = preds[0]
        gain = best.rate / cur.rate - 1.0 if cur.rate > 0 else math.inf
        if best.s == self.s:
            return None
        if best.s > self.s and gain <= self.cfg.min_gain:
            return None
        if best.s < self.s and (best.rate < cur.rate if not self.cfg.lower_gain else
                                not gain > self.cfg.lower_gain):
            return None
        early = self.early(step)
        if early and not gain > self.cfg.early_gain:
            return None      # few samples: only a large predicted gain is evidence enough
        if best.s > self.s and self.cfg.raise_to == "smallest":
            # the smallest s above the current one predicted within the margin (min_gain, at
            # an early boundary early_gain) of the best: a larger s must beat it by the
            # margin too (the hysteresis of raising s; few samples tell s apart no better)
            # (before `first`; at an onset the windows are full: the regular margin)
            margin = (max(self.cfg.min_gain, self.cfg.early_gain) if early and step < self.cfg.first
                      else self.cfg.min_gain)
            bar = best.rate / (1.0 + margin)
            best = min((p for p in preds if p.s > self.s and p.rate >= bar),
                       key=lambda p: p.s)
            gain = best.rate / cur.rate - 1.0 if cur.rate > 0 else math.inf
        why = (f"+{gain:.1%}, the best +{preds[0].rate / cur.rate - 1.0:.1%} > min_gain "
               f"{self.cfg.min_gain:.0%}" if best.s > self.s else
               f"less redundancy, predicted at least as good ({gain:+.1%})")
        if early:
            why += (f"; early boundary (before step {self.cfg.first}, or an onset): the best "
                    f"+{preds[0].rate / cur.rate - 1.0:.1%} > early_gain "
                    f"{self.cfg.early_gain:.0%}")
        reason = (f"predicted progress/s {best.rate:.4g} at s={best.s} (T {best.time_per_step:.3g} s"
                  f" incl. re-plan, progress/step {best.progress_per_step:.3g}) vs {cur.rate:.4g} "
                  f"at s={cur.s} (T {cur.time_per_step:.3g} s, progress/step "
                  f"{cur.progress_per_step:.3g}): {why}; tau {self.stats.tau:.3g} s, fixed cost "
                  f"{fc.zero:.3g} s at s=0, {fc.round:.3g} s at s>=1, "
                  f"{min(self.stats.counts())}+ samples per rank")
        sw = Switch(step, self.s, best.s, reason, float(gain), self.last_predictions)
        self.s = best.s
        self.last_switch = step
        self.stats.reset_steps()
        self.switches.append(sw)
        self.n_switches += 1
        return sw


__all__ = ["AutoConfig", "ArrivalStats", "AutoStragglers", "Switch", "default_s_max"]
