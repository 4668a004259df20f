"""Expected progress per second of a (scheme, s): the one model behind ``pgc-hvd advise`` and
the online rule ``stragglers="auto"`` (:mod:`.auto_s`).

Owns :func:`time_per_step` (:func:`draw_delays`, :func:`order_statistic_time`,
:func:`continue_time`),
:func:`progress_per_step`, :func:`predict` / :func:`rank` and :func:`step_partitions`; reads only per-rank delay samples (seconds a rank's step took beyond
its k partitions' compute), the compute time of one partition tau and a fixed cost per step.

The model, with the design note's symbols (n workers, budget s, c partitions per step):

* **Time per step.** A step fires with the n - s fastest ranks, so its time is the
  (n - s)-th order statistic of the n ranks' step durations X_r = k tau + D_r, plus a fixed
  protocol cost o (decode, control, broadcast):

      T(scheme, s) = E[ X_(n-s:n) ] + o,

  k = :func:`step_partitions`: 1 for PGC's pipelined schemes, IS-SGD and DGD, c = s + 1 for the
  gradient codes that evaluate every partition of their support each step (GC-CR, BCGC). The
  expectation is a Monte Carlo over ``draws`` joint draws, each rank's D_r drawn from its own
  observed samples (independent across ranks, a rank's persistent slowness kept). With s = 0
  this is the slowest rank's time: Horovod's step. That is the time when a rank left out of
  a step stops at once and starts the next one with the others (``straggler_policy="cancel"``
  in the simulator). Where it finishes its step first (``"continue"``: the simulator's
  default, and the runtime, whose forward and backward cannot be interrupted), it starts the
  next step late, so the fastest n - s of a step are not the fastest of fresh draws:
  :func:`continue_time` runs the draws as successive steps (rank r starts step t when step
  t - 1 has fired or when it finishes its own step, whichever is later; the step fires at the
  (n - s)-th finish) and takes the mean time between fires. Exponential delays of mean tau at
  n = 4, s = 1: 0.77x the s = 0 step with ``continue`` against 0.68x with ``cancel``, the
  simulator's figures (docs/benchmarks.md, "The doors on the issue's LeNet-5 workload").
* **Fixed cost per step** o (:class:`FixedCost`): o_0 at s = 0, o_1 at s >= 1. The runtime's
  s = 0 step runs no control round (the rows ride in the data allreduce,
  ``runtime/sum_rows.py``; the simulator's collective model prices it so too), every s >= 1
  step pays one, so o_1 - o_0 is the round. Each is calibrated from step times observed at
  such an s (:meth:`FixedCost.calibrated`); one not observed yet is the other plus or minus a
  prior for the round (``round_cost``: :data:`DEFAULT_ROUND_COST` in the runtime, 0 under the
  simulator's master model, whose decoder runs no round at any s).
* **Progress per step** gamma relative to the exact gradient (DGD's step = 1): 1 for schemes
  that use no stale gradient (DGD, IS-SGD, GC-CR, BCGC, and every scheme at s = 0); for
  schemes that use stale gradients (PGC's ring of the last c - 1 = s versions, bounded
  staleness) the measured staleness effect

      gamma(s) = 1 / (1 + lambda * s),

  lambda = ``staleness_cost``: the extra steps to a target per unit of ring depth. It is a
  property of the workload and the optimizer, not of the cluster: measured on MNIST-1D's
  ``cnn1d`` with SGD momentum 0.9 and the default remedy (docs/control.md, "s chosen online")
  at lambda = -0.007 (no measurable cost up to s = 25 at n = 100: the remedy's ring decay
  works there), so the default is a small 0.005, a tie-break towards less staleness; on a
  workload where staleness costs steps set it (``advise`` measures it per candidate from its
  simulations: :func:`measured_staleness_cost`; the runtime's rule defaults to the figure
  measured on its own workload, ``runtime.config.RUNTIME_STALENESS_COST``, fitted by
  :func:`fit_staleness_cost`).
* **Expected progress per second** ``rate = gamma / T``; :func:`rank` orders candidates by it
  and the rule switches only when the best beats the current by a margin (hysteresis).

May import: numpy, ``schemes`` (layer 2); nothing of the engines.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

# extra steps per unit of ring depth for the stale schemes (module doc; docs/control.md)
DEFAULT_STALENESS_COST = 0.005
#: seconds a control round adds to a step at s >= 1 over the s = 0 path, before both have been
#: observed: the log path's round at n = 4 by the simulator's formulas (pgc_hvd/sim/log_costs.py)
#: with the constants measured on this machine (docs/figures/log_control_fit.json): the append
#: (a push: rtt / 2 + rtt / 2), the decider's runs on the 4 rows (2 runs + 4 rows, two
#: batches), the follower's replay (3 runs + 4 rows); the broadcast's link time is left out
#: (loopback). tests/control/test_auto_s_costs.py recomputes it from those sources.
DEFAULT_ROUND_COST = 2.55e-4


@dataclasses.dataclass(frozen=True)
class FixedCost:
    """The fixed cost per step (decode, control, broadcast, apply) beside the order statistic:
    ``zero`` at s = 0 (the s = 0 path: no control round) and ``round`` at s >= 1 (with it)."""

    zero: float
    round: float

    def at(self, s: int) -> float:
        return self.zero if s <= 0 else self.round

    @classmethod
    def calibrated(cls, zero: Optional[float] = None, round: Optional[float] = None,
                   round_cost: float = 0.0) -> "FixedCost":
        """o_0 and o_1 from what was observed (None: not observed): one observed gives the
        other as itself plus (o_1) or minus (o_0, not below 0) ``round_cost``, the prior for
        the control round; neither: 0 and ``round_cost``."""
        rc = max(0.0, float(round_cost))
        if zero is None and round is None:
            zero = 0.0
        if zero is None:
            zero = max(0.0, round - rc)
        if round is None:
            round = zero + rc
        return cls(float(zero), float(round))

    @classmethod
    def of(cls, overhead) -> "FixedCost":
        """``overhead`` as a FixedCost: a number is the same cost at every s."""
        if isinstance(overhead, FixedCost):
            return overhead
        return cls(float(overhead), float(overhead))


@dataclasses.dataclass(frozen=True)
class Prediction:
    """One candidate's figures: ``k`` partitions per step, seconds per step, progress per step
    (DGD = 1) and their ratio, the expected progress per second."""

    scheme: str
    s: int
    k: int
    time_per_step: float
    progress_per_step: float

    @property
    def rate(self) -> float:
        return self.progress_per_step / self.time_per_step if self.time_per_step > 0 else math.inf

    def as_dict(self) -> dict:
        return {"scheme": self.scheme, "s": self.s, "k": self.k,
                "time_per_step": self.time_per_step,
                "progress_per_step": self.progress_per_step, "rate": self.rate}


def _cls(scheme: str):
    from pgc_hvd.schemes import scheme_class
    return scheme_class(scheme)


def step_partitions(scheme: str, n: int, s: int, **options) -> int:
    """Partitions a rank evaluates per step in steady state (after the pipelined schemes'
    warm-up): the largest ``len(work_plan(w, t).evaluate)`` over the ranks at a step past the
    ring's depth, read from the scheme itself."""
    from pgc_hvd.schemes import get_scheme
    sch = get_scheme(scheme, n, s, **options)
    t = int(sch.lookback) + 2
    return max(1, max(len(sch.work_plan(w, t).evaluate) for w in range(n)))


def uses_stale_gradients(scheme: str) -> bool:
    return bool(_cls(scheme).uses_stale_gradients)


def progress_per_step(scheme: str, s: int,
                      staleness_cost: float = DEFAULT_STALENESS_COST) -> float:
    """gamma (module doc): 1 for a scheme without stale gradients or at s = 0, else
    1 / (1 + staleness_cost * s)."""
    if s <= 0 or not uses_stale_gradients(scheme):
        return 1.0
    return 1.0 / (1.0 + float(staleness_cost) * s)


def draw_delays(delays: Sequence[Sequence[float]], draws: int = 256, seed: int = 0,
                half_life: Optional[float] = None) -> np.ndarray:
    """(draws, n) joint draws of the ranks' delays, rank r's column from its samples
    ``delays[r]`` (oldest first); with ``half_life`` h a sample of age a (0: the newest) is
    drawn with weight 2^(-a/h), so a rank that became slow (or fast) counts as such after about
    h samples. Deterministic for a given ``seed``; the same draws serve every candidate s
    (common random numbers: the candidates' differences are not Monte Carlo noise)."""
    if any(len(d) == 0 for d in delays):
        raise ValueError("every rank needs at least one delay sample")
    rng = np.random.default_rng(seed)
    cols = []
    for d in delays:
        a = np.asarray(d, dtype=float)
        if len(a) == 1:
            cols.append(np.full(draws, a[0]))
        elif half_life:
            w = 0.5 ** (np.arange(len(a) - 1, -1, -1) / float(half_life))
            cols.append(a[rng.choice(len(a), size=draws, p=w / w.sum())])
        else:
            cols.append(a[rng.integers(0, len(a), size=draws)])
    return np.stack(cols, axis=1)


def order_statistic_time(D: np.ndarray, tau: float, k: int, s: int,
                         overhead: float = 0.0) -> float:
    """E[(n - s)-th smallest of k tau + D_r] + overhead over the rows of ``D``
    (:func:`draw_delays`)."""
    n = D.shape[1]
    if not 0 <= s < n:
        raise ValueError(f"s = {s} must lie in [0, n - 1] for n = {n} ranks")
    kth = np.partition(k * float(tau) + D, n - s - 1, axis=1)[:, n - s - 1]
    return float(kth.mean()) + float(overhead)


#: ``straggler_policy`` values, what a rank left out of a step does (module doc): the
#: runtime's and the simulator's option of that name, and the rule's model
POLICIES = ("continue", "cancel")


def continue_time(D: np.ndarray, tau: float, k: int, s: int, overhead: float = 0.0) -> float:
    """The mean time between fires when a rank left out of a step finishes it first (module
    doc), the rows of ``D`` (:func:`draw_delays`) taken as successive steps: rank r starts
    step t at max(F_{t-1}, its finish), takes k tau + D[t, r], step t fires at the (n - s)-th
    finish plus ``overhead`` (F_t); a rank that finishes after F_t starts the step open then
    (its missed steps are caught up without compute). The first eighth of the rows warm the
    chain up. Equal to :func:`order_statistic_time` at s = 0."""
    rows, n = D.shape
    if not 0 <= s < n:
        raise ValueError(f"s = {s} must lie in [0, n - 1] for n = {n} ranks")
    if s == 0 or rows < 2:
        return order_statistic_time(D, tau, k, s, overhead)
    work, o, kth = k * float(tau), float(overhead), n - s - 1
    free = [0.0] * n                 # when each rank finishes its step in flight
    fired, warm = 0.0, max(1, rows // 8)
    t0 = 0.0
    for t, d in enumerate(D.tolist()):
        fin = [(f if f > fired else fired) + work + x for f, x in zip(free, d)]
        at = sorted(fin)[kth]
        free = [x if f < at else f for f, x in zip(free, fin)]
        fired = at + o
        if t + 1 == warm:
            t0 = fired
    return (fired - t0) / (rows - warm)


def time_per_step(delays: Sequence[Sequence[float]], tau: float, k: int, s: int,
                  overhead: float = 0.0, draws: int = 256, seed: int = 0,
                  half_life: Optional[float] = None) -> float:
    """T(s) of the module doc: :func:`order_statistic_time` of :func:`draw_delays`."""
    n = len(delays)
    if not 0 <= s < n:
        raise ValueError(f"s = {s} must lie in [0, n - 1] for n = {n} ranks")
    return order_statistic_time(draw_delays(delays, draws, seed, half_life), tau, k, s,
                                overhead)


def predict(scheme: str, s: int, delays: Sequence[Sequence[float]], tau: float,
            overhead=0.0, staleness_cost: float = DEFAULT_STALENESS_COST,
            k: Optional[int] = None, draws: int = 256, seed: int = 0,
            progress: Optional[float] = None, half_life: Optional[float] = None,
            drawn: Optional[np.ndarray] = None, policy: str = "cancel") -> Prediction:
    """One candidate's :class:`Prediction`; ``k`` (partitions per step) from the scheme when
    None; ``progress`` (gamma) measured elsewhere (advise's simulations) instead of the
    staleness model when given; ``drawn``: :func:`draw_delays` made once for every candidate
    (else drawn here with ``draws``, ``seed``, ``half_life``); ``overhead``: seconds, or a
    :class:`FixedCost` (o_0 at s = 0, o_1 above); ``policy``: what a rank left out of a step
    does (:func:`step_time`)."""
    n = len(delays)
    if k is None:
        k = step_partitions(scheme, n, s)
    g = progress_per_step(scheme, s, staleness_cost) if progress is None else float(progress)
    D = drawn if drawn is not None else draw_delays(delays, draws, seed, half_life)
    o = FixedCost.of(overhead).at(int(s))
    return Prediction(scheme, int(s), int(k), step_time(D, tau, k, s, o, policy), g)


def step_time(D: np.ndarray, tau: float, k: int, s: int, overhead: float = 0.0,
              policy: str = "cancel") -> float:
    """T(s) over the draws ``D``: :func:`order_statistic_time` where a rank left out of a step
    stops at once (``"cancel"``), :func:`continue_time` where it finishes its step first
    (``"continue"``)."""
    if policy == "cancel":
        return order_statistic_time(D, tau, k, s, overhead)
    if policy == "continue":
        return continue_time(D, tau, k, s, overhead)
    raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")


def rank(candidates, delays: Sequence[Sequence[float]], tau: float, overhead=0.0,
         staleness_cost: float = DEFAULT_STALENESS_COST, draws: int = 256,
         seed: int = 0) -> list[Prediction]:
    """Predictions of ``candidates`` ((scheme, s) pairs; one whose code does not exist for
    (n, s) is left out), best expected progress per second first (ties: smaller s)."""
    out = []
    for scheme, s in candidates:
        try:
            out.append(predict(scheme, s, delays, tau, overhead, staleness_cost, draws=draws,
                               seed=seed))
        except ValueError:
            continue
    out.sort(key=lambda p: (-p.rate, p.s))
    return out


def measured_staleness_cost(scheme: str, s: int, steps: Optional[int],
                            exact_steps: Optional[int]) -> Optional[float]:
    """lambda from a pair of measured steps to one target: the stale candidate's and an exact
    scheme's (gamma = exact / steps = 1 / (1 + lambda s)); None when either is unknown or the
    scheme uses no stale gradients."""
    if not steps or not exact_steps or s <= 0 or not uses_stale_gradients(scheme):
        return None
    return fit_staleness_cost([(s, steps, exact_steps)])   # the fit of one point


def fit_staleness_cost(points) -> Optional[float]:
    """lambda fitted to measured steps to one target: ``points`` are (s, steps, exact_steps)
    triples (a stale scheme at ring depth s and the exact run of the same seed), and lambda
    is the least-squares slope through the origin of steps / exact_steps - 1 = lambda s
    (:func:`progress_per_step`'s model), not below 0; None without a point at s >= 1 whose
    runs both reached the target. ``benchmarks/tta/staleness_cost.py`` measures the runtime's."""
    num = den = 0.0
    for s, steps, exact in points:
        if s >= 1 and steps and exact:
            num += s * (steps / exact - 1.0)
            den += s * s
    return max(0.0, num / den) if den else None


def estimate_tau(busy: np.ndarray, k: np.ndarray) -> float:
    """Compute seconds of one partition from per-step busy seconds and partitions evaluated:
    the smallest busy / k (the shift of a shifted exponential's MLE; ``advise`` and the online
    rule both estimate tau so)."""
    b = np.asarray(busy, dtype=float) / np.maximum(1, np.asarray(k, dtype=float))
    b = b[np.isfinite(b)]
    if b.size == 0:
        raise ValueError("no busy seconds to estimate the compute time from")
    return float(b.min())


__all__ = [
    "DEFAULT_STALENESS_COST", "DEFAULT_ROUND_COST", "FixedCost", "Prediction", "step_partitions",
    "progress_per_step", "time_per_step", "draw_delays", "order_statistic_time", "predict",
    "rank", "measured_staleness_cost", "fit_staleness_cost", "estimate_tau",
    "uses_stale_gradients"
]
