"""Straggler patterns, as named delay specs both engines and every benchmark read.

Owns the two delay models that production patterns need beyond :mod:`.models`
(:class:`SpeedClasses`, :class:`Transient`) and the one table of named patterns
(:func:`pattern_spec`, :data:`PATTERNS`, :data:`PATTERN_ALIASES`): each name gives a text spec
that :func:`pgc_hvd.delays.parse_delay` reads, so the same pattern drives the simulator
(``pgc-hvd simulate --delay SPEC``), the runtime's straggler injection (``pgc-hvd train --delay
SPEC``), the main job (``pgc-hvd demo --delay NAME``) and the benchmarks' ``--patterns``.

Production studies of large training jobs find stragglers mostly persistent or structural (a
slow host, a slow pipeline stage, sequence-length imbalance), appearing and disappearing during
a run, rather than the i.i.d. per-step delays the papers assume; the papers' i.i.d. delays are
here too. With ``compute`` the seconds of one batch's forward/backward (the simulator's
``partition_time``) the named patterns are:

============  ==============================================================  ===========================================
name          what                                                             text spec (n = 12, compute = 1, 400 steps)
============  ==============================================================  ===========================================
``none``      no stragglers                                                    ``none``
``exp``       Exp(mean = compute) on every rank and step (the papers')         ``exp:mean=1,seed=S``
``slow-rank`` one rank, ``seed % n``, persistently 4x slower: +3 compute        ``slow:worker=S%12,delay=3``
              every step
``two-class`` a quarter of the ranks (at least one) 2x slower: +1 compute        ``classes:n=12,count=3,delay=1,seed=S``
              every step, a seeded set fixed for the run
``heavy-tail`` per-batch extra cost Pareto (Lomax) alpha 2.5 of mean = compute   ``pareto:shape=2.5,scale=1.5,seed=S``
              (scale = compute (alpha - 1)): variable sequence lengths
``transient`` two ranks 5x slower (+4 compute) from 25% to 60% of the run,       ``transient:n=12,count=2,delay=4,start=100,stop=240,seed=S``
              fast before and after
``lognormal`` log-normal (median 0.3 compute, sigma 0.5) plus, with              ``lognormal:mu=-1.2039728043259361,sigma=0.5,seed=S``
              probability 0.01 a rank and step, a 10-30 compute straggler      ``+straggler:p=0.01,low=10,high=30,seed=S``
============  ==============================================================  ===========================================

``slow`` and ``pareto`` are accepted for ``slow-rank`` and ``heavy-tail``
(:data:`PATTERN_ALIASES`: the benchmarks' recorded commands spell them so). Every delay scales
with ``compute``: ``compute = 0`` gives ``none``.

May import: numpy, ``options``, and the rest of ``delays`` (layer 1); nothing else of the package.
"""

from __future__ import annotations

import math

import numpy as np

from .models import DelayModel

PARETO_ALPHA = 2.5
PATTERNS = ("none", "exp", "slow-rank", "two-class", "heavy-tail", "transient", "lognormal")
#: other spellings of a pattern's name (module doc), each to its name in :data:`PATTERNS`
PATTERN_ALIASES = {"slow": "slow-rank", "pareto": "heavy-tail"}


class SpeedClasses(DelayModel):
    """Two speed classes: a seeded set of ``count`` of the ``n`` workers (the same at every
    step: a structural slowdown, an older GPU, a longer pipeline stage) gets ``delay`` seconds
    at every step, the others 0. ``slow_workers()`` names the set."""

    type_name = "classes"

    def __init__(self, n: int, count: int, delay: float, seed: int = 0):
        super().__init__(seed)
        if not 0 <= count <= n or delay < 0:
            raise ValueError("need 0 <= count <= n and delay >= 0")
        self.n, self.count, self.delay = int(n), int(count), float(delay)
        self._slow = frozenset(self._rng(0, 0).permutation(self.n)[: self.count].tolist())

    def slow_workers(self) -> frozenset:
        return self._slow

    def sample(self, worker: int, step: int) -> float:
        if worker < 0 or step < 0:
            raise ValueError(f"worker and step must be >= 0, got ({worker}, {step})")
        return self.delay if worker in self._slow else 0.0

    def params(self) -> dict:
        return {"n": self.n, "count": self.count, "delay": self.delay, "seed": self.seed}


class Transient(SpeedClasses):
    """Stragglers that come and go: a seeded set of ``count`` of the ``n`` workers gets
    ``delay`` seconds at every step t with ``start <= t < stop``, and 0 before and after (a
    noisy neighbour, a thermal throttle, a checkpoint writer on the same host)."""

    type_name = "transient"

    def __init__(self, n: int, count: int, delay: float, start: int, stop: int, seed: int = 0):
        super().__init__(n, count, delay, seed)
        if not 0 <= start <= stop:
            raise ValueError(f"need 0 <= start <= stop, got start={start}, stop={stop}")
        self.start, self.stop = int(start), int(stop)

    def sample(self, worker: int, step: int) -> float:
        base = super().sample(worker, step)
        return base if self.start <= step < self.stop else 0.0

    def params(self) -> dict:
        return {"n": self.n, "count": self.count, "delay": self.delay, "start": self.start,
                "stop": self.stop, "seed": self.seed}


def pattern_name(name: str) -> str:
    """``name``'s entry of :data:`PATTERNS` (an alias resolved), or a ValueError naming the
    known ones."""
    if name in PATTERNS:
        return name
    if name in PATTERN_ALIASES:
        return PATTERN_ALIASES[name]
    known = ", ".join(PATTERNS) + " (or " + ", ".join(
        f"{a} for {b}" for a, b in PATTERN_ALIASES.items()) + ")"
    raise ValueError(f"unknown straggler pattern {name!r}; known: {known}")


def _num(x: float) -> str:
    """``x`` as short as it reads back exactly (``3``, ``0.30000000000000004``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def pattern_spec(name: str, n: int, compute: float = 1.0, steps: int = 400,
                 seed: int = 0) -> str:
    """The text spec of named pattern ``name`` (module table; an alias of
    :data:`PATTERN_ALIASES` too) for ``n`` workers, ``compute`` seconds per batch and a run of
    about ``steps`` steps (where transient stragglers come and go); ``seed`` picks the slow
    rank or set and the draws."""
    name = pattern_name(name)
    if n < 2:
        raise ValueError(f"a straggler pattern needs n >= 2 workers, got n={n}")
    if not compute >= 0:
        raise ValueError(f"compute must be seconds >= 0 per batch, got {compute}")
    c = float(compute)
    if name == "none" or c == 0:
        return "none"
    if name == "exp":
        return f"exp:mean={_num(c)},seed={seed}"
    if name == "slow-rank":
        return f"slow:worker={seed % n},delay={_num(3 * c)}"
    if name == "two-class":
        return f"classes:n={n},count={max(1, n // 4)},delay={_num(c)},seed={seed}"
    if name == "heavy-tail":
        return (f"pareto:shape={PARETO_ALPHA:g},scale={_num(c * (PARETO_ALPHA - 1))},"
                f"seed={seed}")
    if name == "transient":
        start, stop = int(0.25 * steps), int(0.6 * steps)
        return (f"transient:n={n},count={min(2, n - 1)},delay={_num(4 * c)},start={start},"
                f"stop={stop},seed={seed}")
    return (f"lognormal:mu={_num(math.log(0.3 * c))},sigma=0.5,seed={seed}"
            f"+straggler:p=0.01,low={_num(10 * c)},high={_num(30 * c)},seed={seed}")


def pattern_model(name: str, n: int, compute: float = 1.0, steps: int = 400,
                  seed: int = 0) -> DelayModel:
    """:func:`pattern_spec` parsed (:func:`pgc_hvd.delays.parse_delay`)."""
    from .spec import parse_delay
    return parse_delay(pattern_spec(name, n, compute, steps, seed))


def mean_delay(model: DelayModel, n: int, steps: int) -> np.ndarray:
    """Each worker's mean delay over steps 0..steps-1 (the tests' and the docs' check)."""
    return model.matrix(n, steps).mean(axis=0)


__all__ = ["PATTERNS", "PATTERN_ALIASES", "PARETO_ALPHA", "SpeedClasses", "Transient",
           "pattern_name", "pattern_spec", "pattern_model", "mean_delay"]
