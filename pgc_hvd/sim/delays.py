"""Seeded straggler delay models, and delay traces that can be saved and replayed.

Both engines use these: the simulator adds ``sample(worker, step)`` seconds of virtual time to
a worker's compute time at step t; the Horovod runtime sleeps that long (straggler injection).

API
---
Every model is a :class:`DelayModel` with

* ``sample(worker, step) -> float`` seconds >= 0, a pure function of (seed, worker, step) and
  the model's parameters: the same call always returns the same value, in any order, in any
  process (each (worker, step) draws from its own ``numpy`` stream seeded by
  ``SeedSequence([seed, salt, worker, step])``, ``salt`` a fixed per-model-type constant);
* ``matrix(n, steps) -> ndarray (steps, n)`` the same values for a block of steps;
* ``to_dict()`` / :func:`from_dict` a JSON-able spec (``{"type": ..., params...}``), and
  ``str(model)`` / :func:`parse_delay` a short text spec for command lines;
* ``a + b`` -> :class:`Sum` (delays add; combinations such as log-normal plus occasional
  long stragglers).

Models (``seed`` defaults to 0; give two components of the same type different seeds if they
must be independent):

=========================================  =============================================  ==========
class                                      sample                                          text spec
=========================================  =============================================  ==========
``Zero()``                                  0                                               ``none``
``Constant(value)``                         value                                           ``const:value=0.1``
``Exponential(mean, seed)``                 Exp with mean ``mean``                          ``exp:mean=1``
``LogNormal(mu, sigma, seed)``              exp(N(mu, sigma^2))                             ``lognormal:mu=-1,sigma=0.5``
``Pareto(shape, scale, seed)``              scale * (U^(-1/shape) - 1) (Lomax, >= 0,
                                            heavy tail, mean scale/(shape-1) if shape>1)    ``pareto:shape=1.5,scale=0.1``
``LongStraggler(p, low=10, high=30, seed)`` with prob. p: Uniform(low, high), else 0        ``straggler:p=0.01,low=10,high=30``
``FixedStragglers(n, count, delay, seed)``  ``delay`` for a seeded random set of exactly
                                            ``count`` of the n workers at each step, else 0  ``fixed:n=100,count=20,delay=5``
``Sum(m1, m2, ...)``                        m1 + m2 + ...                                   ``exp:mean=1+straggler:p=0.01``
``Heterogeneous(base, factors)``            factors[worker % len] * base(worker, step)      (dict spec only)
``Scaled(base, factor)``                    factor * base                                   (dict spec only)
=========================================  =============================================  ==========

Traces
------
``rec = Recording(model)`` samples through ``model`` and remembers every value;
``rec.trace`` is a :class:`DelayTrace`, ``trace.save(path)`` writes JSON
``{"format": "pgc_hvd.delay_trace/1", "model": <spec or null>, "delays": [[worker, step,
seconds], ...]}`` and ``DelayTrace.load(path)`` reads it back. ``Replay(trace, fallback=None)``
returns the recorded values (bit-identical floats) and, for a (worker, step) not in the trace,
``fallback.sample`` or a ``ValueError`` naming the trace's extent; the simulator and
``pgc-hvd train`` call ``check_trace_covers(model, n, steps)`` first, so a trace from a run with
fewer workers or steps is refused before the run starts. ``DelayTrace.from_model(model, n,
steps)`` precomputes a whole schedule. Replaying one trace under several schemes makes every
scheme face the same straggler schedule, as the papers did with fixed seeds.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

TRACE_FORMAT = "pgc_hvd.delay_trace/1"


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


_SIMPLE = {"none": Zero, "const": Constant, "exp": Exponential, "lognormal": LogNormal,
           "pareto": Pareto, "straggler": LongStraggler, "fixed": FixedStragglers}
_ALIASES = {"exponential": "exp", "zero": "none", "constant": "const", "log-normal": "lognormal",
            "long_straggler": "straggler", "long-straggler": "straggler"}


def from_dict(spec: Mapping[str, Any]) -> DelayModel:
    """Inverse of ``model.to_dict()``; ``{"type": "replay", "path": ...}`` loads a trace."""
    spec = dict(spec)
    t = str(spec.pop("type"))
    return _from_dict_typed(_ALIASES.get(t, t), spec)


def _from_dict_typed(t: str, spec: dict) -> DelayModel:
    if t in _SIMPLE:
        return _SIMPLE[t](**spec)
    if t == "sum":
        return Sum(*(from_dict(p) for p in spec["parts"]))
    if t == "scaled":
        return Scaled(from_dict(spec["base"]), spec["factor"])
    if t == "hetero":
        return Heterogeneous(from_dict(spec["base"]), spec["factors"])
    if t == "replay":
        return Replay(DelayTrace.load(spec["path"]))
    raise KeyError(f"unknown delay model type {t!r}")


def check_workers(model, n: int) -> None:
    """Refuses a model that draws its stragglers among another number of workers than the
    run's n (``fixed:n=...``), which would delay only some of the workers, or none."""
    for m in _walk(model):
        if isinstance(m, FixedStragglers) and m.n != n:
            raise ValueError(f"delay model {m} picks its {m.count} stragglers among n={m.n} "
                             f"workers, but the run has n={n}; write fixed:n={n},count=...")


def check_trace_covers(model, n: int, steps: int) -> None:
    """Refuses a replayed trace (without fallback) that cannot serve a run of ``n`` workers and
    ``steps`` steps: one in which a worker 0..n-1 has no entry, or no step reaches steps - 1.
    A trace recorded from a run of the same n and steps always passes (its last step is computed
    by at least n - s workers); workers that skipped a step leave gaps that this does not refuse,
    since a replay of the same run never asks for them."""
    for m in _walk(model):
        if not isinstance(m, Replay) or m.fallback is not None:
            continue
        workers, last = m.trace.span()
        missing = [w for w in range(n) if w not in workers]
        if missing or last < steps - 1:
            what = (f"no entry for worker(s) {missing[:8]}{'...' if len(missing) > 8 else ''}"
                    if missing else f"no step past {last}")
            raise ValueError(
                f"delay trace has {what}, but the run has n={n} workers and {steps} steps "
                f"({m.trace.extent()}); record a trace with this run's n and steps "
                f"(pgc-hvd simulate ... --save-trace PATH), or run fewer steps")


def _walk(model):
    """``model`` and every delay model inside it (sums, scaled, heterogeneous, recordings)."""
    stack = [model]
    while stack:
        m = stack.pop()
        yield m
        stack.extend(getattr(m, "parts", ()))
        for attr in ("base", "model"):
            inner = getattr(m, attr, None)
            if isinstance(inner, DelayModel):
                stack.append(inner)


def parse_delay(text: str) -> DelayModel:
    """Text spec -> model: components ``name:key=value,...`` joined by ``+``; a lone value is the
    first parameter (``exp:2`` = ``exp:mean=2``); ``replay:PATH`` replays a saved trace."""
    text = text.strip()
    if text.startswith("replay:"):
        return Replay(DelayTrace.load(text[len("replay:"):]))
    parts = []
    for comp in text.split("+"):
        comp = comp.strip()
        name, _, args = comp.partition(":")
        name = _ALIASES.get(name.strip().lower(), name.strip().lower())
        if name not in _SIMPLE:
            raise ValueError(f"unknown delay model {name!r} in {text!r}; known: {sorted(_SIMPLE)}")
        kwargs: dict[str, float] = {}
        for i, a in enumerate(x for x in args.split(",") if x.strip()):
            if "=" in a:
                k, v = a.split("=", 1)
                k = k.strip()
            else:
                k = {"const": "value", "exp": "mean", "lognormal": "mu", "pareto": "shape",
                     "straggler": "p", "fixed": "n"}[name]
                v = a
                if i != 0:
                    raise ValueError(f"positional value only allowed first, in {comp!r}")
            try:
                kwargs[k] = float(v)
            except ValueError:
                raise ValueError(f"{k}={v.strip()!r} in delay spec {comp!r} is not a number") from None
            if not math.isfinite(kwargs[k]) or (k != "mu" and kwargs[k] < 0):
                raise ValueError(f"{k}={v.strip()} in delay spec {comp!r}: parameters must be "
                                 "finite, and >= 0 except a log-normal's mu")
        for key in ("seed", "n", "count"):
            if key in kwargs:
                kwargs[key] = int(kwargs[key])
        try:
            parts.append(_SIMPLE[name](**kwargs))
        except TypeError as err:  # an unknown or missing parameter name
            raise ValueError(f"delay spec {comp!r}: {err}; see pgc_hvd.sim.delays for "
                             f"the parameters of {name!r}") from None
    return parts[0] if len(parts) == 1 else Sum(*parts)


# ---------------------------------------------------------------------------------------------
# traces

def _trace_entry(entry: Any, where: str) -> tuple[int, int, float]:
    """One ``[worker, step, seconds]`` trace entry, checked (see :meth:`DelayTrace.load`)."""
    if not isinstance(entry, list) or len(entry) != 3:
        raise ValueError(f"{where}: an entry must be [worker, step, seconds]")
    w, t, v = entry
    for name, x in (("worker", w), ("step", t)):
        if not isinstance(x, int) or isinstance(x, bool) or x < 0:
            raise ValueError(f"{where}: the {name} must be an int >= 0")
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: the delay must be finite seconds >= 0")
    return w, t, float(v)


class DelayTrace:
    """A recorded schedule: (worker, step) -> seconds, with the spec of the model it came from."""

    def __init__(self, delays: Optional[Mapping[tuple[int, int], float]] = None,
                 model: Optional[dict] = None):
        self.delays: dict[tuple[int, int], float] = {
            (int(w), int(t)): float(v) for (w, t), v in (delays or {}).items()}
        bad = next(((k, v) for k, v in self.delays.items() if not (math.isfinite(v) and v >= 0)),
                   None)
        if bad is not None:
            raise ValueError(f"delay trace: worker {bad[0][0]}, step {bad[0][1]} has delay "
                             f"{bad[1]}; delays must be finite seconds >= 0")
        self.model = model

    def __len__(self) -> int:
        return len(self.delays)

    def __contains__(self, key) -> bool:
        return key in self.delays

    def __getitem__(self, key) -> float:
        return self.delays[key]

    def __eq__(self, other) -> bool:
        return isinstance(other, DelayTrace) and self.delays == other.delays

    @classmethod
    def from_model(cls, model: DelayModel, n: int, steps: int) -> "DelayTrace":
        return cls({(w, t): model.sample(w, t) for t in range(steps) for w in range(n)},
                   model.to_dict())

    def to_json(self) -> dict:
        rows = [[w, t, v] for (w, t), v in sorted(self.delays.items(), key=lambda kv: (kv[0][1], kv[0][0]))]
        return {"format": TRACE_FORMAT, "model": self.model, "delays": rows}

    def save(self, path: os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # repr-exact floats: json writes the shortest repr, which round-trips bit-identically
        path.write_text(json.dumps(self.to_json()), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: os.PathLike) -> "DelayTrace":
        """Read a trace :meth:`save` wrote, checking all of it: JSON text, the format tag, and
        every entry a ``[worker, step, seconds]`` with worker and step ints >= 0 and seconds
        finite and >= 0. Anything else is a ValueError naming the file and the line or entry
        (a trace is never read as something else, e.g. a NaN or negative delay as 0)."""
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {err.lineno} column {err.colno}: not JSON "
                             f"({err.msg}); the delay trace is damaged") from None
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}: not a JSON delay trace (byte {err.start} is not UTF-8)"
                             ) from None
        fmt = d.get("format") if isinstance(d, dict) else None
        if fmt != TRACE_FORMAT:
            raise ValueError(f"{path}: not a delay trace (format {fmt!r}, expected "
                             f"{TRACE_FORMAT!r}); write traces with --save-trace / "
                             f"DelayTrace.save")
        if not isinstance(d.get("delays"), list):
            raise ValueError(f"{path}: a delay trace needs a 'delays' list of [worker, step, "
                             f"seconds] entries, found {type(d.get('delays')).__name__}")
        delays = {}
        for i, entry in enumerate(d["delays"]):
            w, t, v = _trace_entry(entry, f"{path}, entry {i} ({entry!r})")
            if (w, t) in delays:
                raise ValueError(f"{path}, entry {i}: worker {w}, step {t} appears twice")
            delays[(w, t)] = v
        return cls(delays, d.get("model"))

    def span(self) -> tuple[list[int], int]:
        """The workers the trace holds (ascending) and its last step (-1 when empty)."""
        return (sorted({w for w, _ in self.delays}),
                max((t for _, t in self.delays), default=-1))

    def extent(self) -> str:
        """Which workers and steps the trace holds, in words (for error messages)."""
        workers, last = self.span()
        if not workers:
            return "the trace is empty"
        return (f"the trace holds {len(workers)} workers ({workers[0]}..{workers[-1]}) and "
                f"steps 0..{last}")

    def histogram(self, bins: int | Sequence[float] = 20) -> dict:
        vals = np.array(list(self.delays.values()), dtype=float)
        counts, edges = np.histogram(vals, bins=bins)
        return {"counts": counts.tolist(), "edges": edges.tolist()}


class Recording(DelayModel):
    """Samples through ``model`` and records every value in ``self.trace``."""

    type_name = "recording"

    def __init__(self, model: DelayModel):
        super().__init__(0)
        self.model = model
        self.trace = DelayTrace(model=model.to_dict())

    def sample(self, worker: int, step: int) -> float:
        v = self.model.sample(worker, step)
        self.trace.delays[(int(worker), int(step))] = float(v)
        return v

    def to_dict(self) -> dict:
        return self.model.to_dict()

    def __str__(self) -> str:
        return str(self.model)


class Replay(DelayModel):
    """Returns the values of a recorded trace; ``fallback`` for pairs not in it (else ValueError).

    A run that replays a trace without a fallback should call :func:`check_trace_covers` first:
    a trace recorded with fewer workers or fewer steps than the run is refused before the run
    starts, not at the first missing (worker, step) pair minutes into it."""

    type_name = "replay"

    def __init__(self, trace: DelayTrace | os.PathLike | str, fallback: Optional[DelayModel] = None):
        super().__init__(0)
        self.trace = trace if isinstance(trace, DelayTrace) else DelayTrace.load(trace)
        self.fallback = fallback

    def sample(self, worker: int, step: int) -> float:
        key = (int(worker), int(step))
        if key in self.trace.delays:
            return self.trace.delays[key]
        if self.fallback is not None:
            return self.fallback.sample(worker, step)
        raise ValueError(f"delay trace has no entry for worker {worker}, step {step} "
                         f"({self.trace.extent()}); record a trace of this run's n and steps "
                         f"(pgc-hvd simulate ... --save-trace PATH), or replay with a fallback "
                         f"model: Replay(trace, fallback=...)")

    def to_dict(self) -> dict:
        return {"type": "replay", "model": self.trace.model, "entries": len(self.trace)}

    def __str__(self) -> str:
        return f"replay({len(self.trace)} entries)"


def as_delay_model(x: Any) -> DelayModel:
    """DelayModel | text spec | dict spec | None -> DelayModel."""
    if x is None:
        return Zero()
    if isinstance(x, DelayModel):
        return x
    if isinstance(x, str):
        return parse_delay(x)
    if isinstance(x, Mapping):
        return from_dict(x)
    raise TypeError(f"cannot make a delay model from {x!r}")
