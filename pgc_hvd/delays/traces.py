"""Delay traces: a recorded schedule (worker, step) -> seconds that can be saved and replayed.

``rec = Recording(model)`` samples through ``model`` and remembers every value; ``rec.trace`` is
a :class:`DelayTrace`, ``trace.save(path)`` writes JSON ``{"format": "pgc_hvd.delay_trace/1",
"model": <spec or null>, "delays": [[worker, step, seconds], ...]}`` and ``DelayTrace.load(path)``
reads it back. ``Replay(trace, fallback=None)`` returns the recorded values (bit-identical
floats) and, for a (worker, step) not in the trace, ``fallback.sample`` or a ``ValueError``
naming the trace's extent (:meth:`DelayTrace.extent`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .models import DelayModel

TRACE_FORMAT = "pgc_hvd.delay_trace/1"


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
