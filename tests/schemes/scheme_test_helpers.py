"""A tiny synchronous driver for scheme tests: rings follow the work plans and
"gradients" are random vectors per (partition, model version)."""

from __future__ import annotations

import numpy as np

from pgc_hvd.schemes import Arrival, Ring


class GradientTable:
    """g_k^(v): fixed random vector per partition k (static=True: no staleness),
    or base_k + v * drift_k (stale evaluations differ from current ones)."""

    def __init__(self, n: int, dim: int, rng, static: bool = True):
        self.base = rng.standard_normal((n, dim))
        self.drift = np.zeros((n, dim)) if static else rng.standard_normal((n, dim))

    def __call__(self, k: int, v: int) -> np.ndarray:
        return self.base[k] + v * self.drift[k]

    def average(self, v: int) -> np.ndarray:
        return np.mean([self(k, v) for k in range(len(self.base))], axis=0)


class Rings:
    """Every worker's :class:`~pgc_hvd.schemes.Ring`, slots holding (partition, vector)."""

    def __init__(self, scheme, grads):
        self.scheme, self.grads = scheme, grads
        self.rings = {w: Ring(scheme, w) for w in range(scheme.n)}

    def compute(self, worker: int, step: int):
        ring = self.rings[worker]
        plan = ring.plan(step)
        for p, slot in plan.evaluate:
            ring.fill(slot, step, (p, self.grads(p, step)))
        for slot, p in enumerate(plan.slot_partitions):
            assert ring.slots[slot][0] == p, "ring slot holds the wrong partition"
        msg = sum(coef * ring.slots[slot][1] for slot, coef in plan.combine)
        return Arrival(worker, step, step, msg, slot_versions=ring.message_versions(plan))


def run_step(scheme, rings, step, order):
    """All workers compute; arrivals offered in ``order`` (others straggle forever)."""
    arrivals = {w: rings.compute(w, step) for w in range(scheme.n)}
    rnd = scheme.open_round(step)
    for w in order:
        d = rnd.offer(arrivals[w])
        if d is not None:
            return d, rnd.combine(d), arrivals
    return None, None, arrivals
