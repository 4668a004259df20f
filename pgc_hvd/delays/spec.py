"""Delay specs: text (``exp:mean=1+straggler:p=0.01``) and dict (``model.to_dict()``) forms of
a delay model, and the checks a run makes before it starts (:func:`check_workers`,
:func:`check_trace_covers`)."""

from __future__ import annotations

import math
from typing import Any, Mapping

from pgc_hvd.options import split_spec

from .models import (Constant, DelayModel, Exponential, FixedStragglers, Heterogeneous,
                     LogNormal, LongStraggler, Pareto, PerWorker, Scaled, SlowWorker, Sum, Zero)
from .patterns import SpeedClasses, Transient
from .traces import DelayTrace, Replay

_SIMPLE = {"none": Zero, "const": Constant, "exp": Exponential, "lognormal": LogNormal,
           "pareto": Pareto, "straggler": LongStraggler, "fixed": FixedStragglers,
           "slow": SlowWorker, "classes": SpeedClasses, "transient": Transient}
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
    if t == "per-rank":
        return PerWorker([from_dict(m) for m in spec["models"]])
    if t == "replay":
        return Replay(DelayTrace.load(spec["path"]))
    raise KeyError(f"unknown delay model type {t!r}")


def check_workers(model, n: int) -> None:
    """Refuses a model that draws its stragglers among another number of workers than the
    run's n (``fixed:n=...``), which would delay only some of the workers, or none."""
    for m in _walk(model):
        if isinstance(m, SlowWorker) and m.worker >= n:
            raise ValueError(f"delay model {m} slows worker {m.worker}, but the run has n={n} "
                             f"workers 0..{n - 1}")
        if isinstance(m, FixedStragglers) and m.n != n:
            raise ValueError(f"delay model {m} picks its {m.count} stragglers among n={m.n} "
                             f"workers, but the run has n={n}; write fixed:n={n},count=...")
        if isinstance(m, SpeedClasses) and m.n != n:
            raise ValueError(f"delay model {m} picks its {m.count} slow workers among n={m.n} "
                             f"workers, but the run has n={n}; write {m.type_name}:n={n},"
                             f"count=... (or pgc_hvd.delays.pattern_spec(name, n={n}))")


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
        name, _, items = split_spec(comp)
        name = _ALIASES.get(name.lower(), name.lower())
        if name not in _SIMPLE:
            raise ValueError(f"unknown delay model {name!r} in {text!r}; known: {sorted(_SIMPLE)}")
        kwargs: dict[str, float] = {}
        for i, part in enumerate(items):
            k, v = part.key, part.value
            if k is None:
                k = {"const": "value", "exp": "mean", "lognormal": "mu", "pareto": "shape",
                     "straggler": "p", "fixed": "n", "slow": "worker",
                     "classes": "n", "transient": "n"}[name]
                if i != 0:
                    raise ValueError(f"positional value only allowed first, in {comp!r}")
            try:
                kwargs[k] = float(v)
            except ValueError:
                raise ValueError(f"{k}={v.strip()!r} in delay spec {comp!r} is not a number") from None
            if not math.isfinite(kwargs[k]) or (k != "mu" and kwargs[k] < 0):
                raise ValueError(f"{k}={v.strip()} in delay spec {comp!r}: parameters must be "
                                 "finite, and >= 0 except a log-normal's mu")
        for key in ("seed", "n", "count", "worker", "start", "stop"):
            if key in kwargs:
                kwargs[key] = int(kwargs[key])
        try:
            parts.append(_SIMPLE[name](**kwargs))
        except TypeError as err:  # an unknown or missing parameter name
            raise ValueError(f"delay spec {comp!r}: {err}; see pgc_hvd.delays for "
                             f"the parameters of {name!r}") from None
    return parts[0] if len(parts) == 1 else Sum(*parts)


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
