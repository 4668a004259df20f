"""Seeded straggler delay models: ``sample(worker, step) -> seconds``, a pure function of
(seed, worker, step) and the model's parameters (see :mod:`pgc_hvd.delays` for the table of
models and their text specs).

Each (worker, step) draws from its own ``numpy`` stream seeded by
``SeedSequence([seed, salt, worker, step])``, ``salt`` a fixed per-model-type constant, so the
same call returns the same value in any order and in any process.
"""

from __future__ import annotations

import json
import zlib
from typing import Sequence

import numpy as np


def _salt(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class DelayModel:
    """Base class: ``sample(worker, step) -> seconds`` (see module docstring)."""

    type_name = "model"

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def _rng(self, worker: int, step: int) -> np.random.Generator:
        if worker < 0 or step < 0:
            raise ValueError(f"worker and step must be >= 0, got ({worker}, {step})")
        ss = np.random.SeedSequence([self.seed, _salt(self.type_name), int(worker), int(step)])
        return np.random.Generator(np.random.PCG64(ss))

    def sample(self, worker: int, step: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def matrix(self, n: int, steps: int, start: int = 0) -> np.ndarray:
        return np.array([[self.sample(w, t) for w in range(n)]
                         for t in range(start, start + steps)], dtype=np.float64)

    def params(self) -> dict:
        return {}

    def to_dict(self) -> dict:
        return {"type": self.type_name, **self.params()}

    def __add__(self, other: "DelayModel") -> "Sum":
        left = self.parts if isinstance(self, Sum) else (self,)
        right = other.parts if isinstance(other, Sum) else (other,)
        return Sum(*left, *right)

    def __str__(self) -> str:
        p = self.params()
        return self.type_name + (":" + ",".join(f"{k}={v}" for k, v in p.items()) if p else "")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"

    def __eq__(self, other) -> bool:
        return isinstance(other, DelayModel) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))


class Zero(DelayModel):
    type_name = "none"

    def __init__(self):
        super().__init__(0)

    def sample(self, worker: int, step: int) -> float:
        return 0.0


class Constant(DelayModel):
    type_name = "const"

    def __init__(self, value: float):
        super().__init__(0)
        if value < 0:
            raise ValueError("a delay must be non-negative")
        self.value = float(value)

    def sample(self, worker: int, step: int) -> float:
        return self.value

    def params(self) -> dict:
        return {"value": self.value}


class Exponential(DelayModel):
    type_name = "exp"

    def __init__(self, mean: float, seed: int = 0):
        super().__init__(seed)
        if mean < 0:
            raise ValueError("mean must be non-negative")
        self.mean = float(mean)

    def sample(self, worker: int, step: int) -> float:
        return float(self._rng(worker, step).exponential(self.mean)) if self.mean > 0 else 0.0

    def params(self) -> dict:
        return {"mean": self.mean, "seed": self.seed}


class LogNormal(DelayModel):
    type_name = "lognormal"

    def __init__(self, mu: float, sigma: float, seed: int = 0):
        super().__init__(seed)
        if sigma < 0:
            raise ValueError("sigma must be non-negative")
        self.mu, self.sigma = float(mu), float(sigma)

    def sample(self, worker: int, step: int) -> float:
        return float(self._rng(worker, step).lognormal(self.mu, self.sigma))

    def params(self) -> dict:
        return {"mu": self.mu, "sigma": self.sigma, "seed": self.seed}


class Pareto(DelayModel):
    type_name = "pareto"

    def __init__(self, shape: float, scale: float = 1.0, seed: int = 0):
        super().__init__(seed)
        if shape <= 0 or scale < 0:
            raise ValueError("shape must be positive and scale non-negative")
        self.shape, self.scale = float(shape), float(scale)

    def sample(self, worker: int, step: int) -> float:
        return float(self.scale * self._rng(worker, step).pareto(self.shape))

    def params(self) -> dict:
        return {"shape": self.shape, "scale": self.scale, "seed": self.seed}


class LongStraggler(DelayModel):
    type_name = "straggler"

    def __init__(self, p: float, low: float = 10.0, high: float = 30.0, seed: int = 0):
        super().__init__(seed)
        if not 0 <= p <= 1 or low < 0 or high < low:
            raise ValueError("need 0 <= p <= 1 and 0 <= low <= high")
        self.p, self.low, self.high = float(p), float(low), float(high)

    def sample(self, worker: int, step: int) -> float:
        rng = self._rng(worker, step)
        hit, u = rng.random(), rng.random()
        return self.low + (self.high - self.low) * u if hit < self.p else 0.0

    def params(self) -> dict:
        return {"p": self.p, "low": self.low, "high": self.high, "seed": self.seed}


class FixedStragglers(DelayModel):
    """Exactly ``count`` workers out of ``n`` (a seeded random subset per step, the same for
    every caller) get ``delay`` seconds at each step; the others get 0 (the BCGC paper's
    "exactly s workers are delayed at each iteration according to a fixed schedule")."""

    type_name = "fixed"

    def __init__(self, n: int, count: int, delay: float = 1.0, seed: int = 0):
        super().__init__(seed)
        if not 0 <= count <= n or delay < 0:
            raise ValueError("need 0 <= count <= n and delay >= 0")
        self.n, self.count, self.delay = int(n), int(count), float(delay)
        self._cache: dict[int, frozenset] = {}

    def stragglers(self, step: int) -> frozenset:
        hit = self._cache.get(step)
        if hit is None:
            rng = self._rng(0, step)
            hit = frozenset(rng.permutation(self.n)[: self.count].tolist())
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[step] = hit
        return hit

    def sample(self, worker: int, step: int) -> float:
        return self.delay if worker in self.stragglers(step) else 0.0

    def params(self) -> dict:
        return {"n": self.n, "count": self.count, "delay": self.delay, "seed": self.seed}


class SlowWorker(DelayModel):
    """Worker ``worker`` gets ``delay`` seconds at every step, every other worker 0: one
    persistent straggler (the examples' ``--slow-rank``)."""

    type_name = "slow"

    def __init__(self, worker: int, delay: float):
        super().__init__(0)
        if worker < 0 or delay < 0:
            raise ValueError("need worker >= 0 and delay >= 0")
        self.worker, self.delay = int(worker), float(delay)

    def sample(self, worker: int, step: int) -> float:
        return self.delay if worker == self.worker else 0.0

    def params(self) -> dict:
        return {"worker": self.worker, "delay": self.delay}


class Sum(DelayModel):
    type_name = "sum"

    def __init__(self, *parts: DelayModel):
        super().__init__(0)
        self.parts = tuple(parts)

    def sample(self, worker: int, step: int) -> float:
        return float(sum(m.sample(worker, step) for m in self.parts))

    def to_dict(self) -> dict:
        return {"type": "sum", "parts": [m.to_dict() for m in self.parts]}

    def __str__(self) -> str:
        return "+".join(str(m) for m in self.parts) or "none"


class Scaled(DelayModel):
    type_name = "scaled"

    def __init__(self, base: DelayModel, factor: float):
        super().__init__(0)
        self.base, self.factor = base, float(factor)

    def sample(self, worker: int, step: int) -> float:
        return self.factor * self.base.sample(worker, step)

    def to_dict(self) -> dict:
        return {"type": "scaled", "factor": self.factor, "base": self.base.to_dict()}


class Heterogeneous(DelayModel):
    """Per-worker scale: ``factors[worker % len(factors)] * base.sample(worker, step)``."""

    type_name = "hetero"

    def __init__(self, base: DelayModel, factors: Sequence[float]):
        super().__init__(0)
        self.base, self.factors = base, [float(f) for f in factors]
        if not self.factors or min(self.factors) < 0:
            raise ValueError("factors must be a non-empty list of non-negative numbers")

    def sample(self, worker: int, step: int) -> float:
        return self.factors[worker % len(self.factors)] * self.base.sample(worker, step)

    def to_dict(self) -> dict:
        return {"type": "hetero", "factors": list(self.factors), "base": self.base.to_dict()}


class PerWorker(DelayModel):
    """Worker w's delays from its own model: ``models[w].sample(w, step)`` (e.g. one fitted
    model per rank, :func:`pgc_hvd.apps.advise.fit_delays`)."""

    type_name = "per-rank"

    def __init__(self, models: Sequence[DelayModel]):
        super().__init__(0)
        self.models = list(models)

    def sample(self, worker: int, step: int) -> float:
        return self.models[worker].sample(worker, step)

    def params(self) -> dict:
        return {"models": [m.to_dict() for m in self.models]}

