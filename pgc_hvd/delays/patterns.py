"""Straggler patterns seen in production, as named delay specs both engines read.

Owns the two delay models that production patterns need beyond :mod:`.models`
(:class:`SpeedClasses`, :class:`Transient`) and the table of named patterns
(:func:`pattern_spec`, :data:`PATTERNS`): each name gives a text spec that
:func:`pgc_hvd.delays.parse_delay` reads, so the same pattern drives the simulator
(``pgc-hvd simulate --delay SPEC``) and the runtime's straggler injection
(``pgc-hvd train --delay SPEC``).

Production studies of large training jobs find stragglers mostly persistent or structural (a
slow host, a slow pipeline stage, sequence-length imbalance), appearing and disappearing during
a run, rather than the i.i.d. per-step delays the papers assume. With ``compute`` the seconds of
one batch's forward/backward (the simulator's ``partition_time``) the named patterns are:

============  ==============================================================  ===========================================
name          what                                                             text spec (n = 12, compute = 1, 400 steps)
============  ==============================================================  ===========================================
``none``      no stragglers                                                    ``none``
``slow-rank`` one rank persistently 4x slower: +3 compute every step           ``slow:worker=0,delay=3``
``two-class`` a quarter of the ranks (at least one) 2x slower: +1 compute        ``classes:n=12,count=3,delay=1,seed=S``
              every step, a seeded set fixed for the run
``heavy-tail`` per-batch extra cost Pareto (Lomax) alpha 2.5 of mean = compute   ``pareto:shape=2.5,scale=1.5,seed=S``
              (scale = compute (alpha - 1)): variable sequence lengths
``transient`` two ranks 5x slower (+4 compute) from 25% to 60% of the run,       ``transient:n=12,count=2,delay=4,start=100,stop=240,seed=S``
              fast before and after
============  ==============================================================  ===========================================

May import: numpy, ``options``, and the rest of ``delays`` (layer 1); nothing else of the package.
"""

from __future__ import annotations

import numpy as np

from .models import DelayModel

PARETO_ALPHA = 2.5
PATTERNS = ("none", "slow-rank", "two-class", "heavy-tail", "transient")


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


def pattern_spec(name: str, n: int, compute: float = 1.0, steps: int = 400,
                 seed: int = 0) -> str:
    """The text spec of named pattern ``name`` (module table) for ``n`` workers, ``compute``
    seconds per batch and a run of about ``steps`` steps (where transient stragglers come and
    go); ``seed`` picks the slow set and the draws."""
    if n < 2:
        raise ValueError(f"a straggler pattern needs n >= 2 workers, got n={n}")
    if not compute > 0:
        raise ValueError(f"compute must be seconds > 0 per batch, got {compute}")
    c = float(compute)
    if name == "none":
        return "none"
    if name == "slow-rank":
        return f"slow:worker={seed % n},delay={3 * c:g}"
    if name == "two-class":
        return f"classes:n={n},count={max(1, n // 4)},delay={c:g},seed={seed}"
    if name == "heavy-tail":
        return f"pareto:shape={PARETO_ALPHA:g},scale={c * (PARETO_ALPHA - 1):g},seed={seed}"
    if name == "transient":
        start, stop = int(0.25 * steps), int(0.6 * steps)
        return (f"transient:n={n},count={min(2, n - 1)},delay={4 * c:g},start={start},"
                f"stop={stop},seed={seed}")
    raise ValueError(f"unknown straggler pattern {name!r}; known: {', '.join(PATTERNS)}")


def pattern_model(name: str, n: int, compute: float = 1.0, steps: int = 400,
                  seed: int = 0) -> DelayModel:
    """:func:`pattern_spec` parsed (:func:`pgc_hvd.delays.parse_delay`)."""
    from .spec import parse_delay
    return parse_delay(pattern_spec(name, n, compute, steps, seed))


def mean_delay(model: DelayModel, n: int, steps: int) -> np.ndarray:
    """Each worker's mean delay over steps 0..steps-1 (the tests' and the docs' check)."""
    return model.matrix(n, steps).mean(axis=0)


__all__ = ["PATTERNS", "PARETO_ALPHA", "SpeedClasses", "Transient", "pattern_spec",
           "pattern_model", "mean_delay"]
