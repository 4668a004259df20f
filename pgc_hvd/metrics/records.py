"""The per-step record both engines write (DESIGN.md, "Engines share one record format").

Every step, the simulator (virtual time) and the Horovod runtime (wall time) write one
:class:`StepRecord` as one JSON line. Tables and plots are made from these records only, so a
simulated run and a real run compare line by line.

Fields (``None`` when an engine does not know a value):

* ``step`` t, ``time`` (seconds since the run started: virtual or wall), ``step_time`` (this
  step's duration);
* ``scheme``, ``n``, ``s``;
* ``workers_used`` (worker ids whose messages entered the update), ``versions`` (their model
  versions), ``max_age``/``mean_age`` (t - version, over the gradients used);
* ``weight_min``/``weight_max`` (decode weights a_I, including 1/n), ``alpha_min``/``alpha_max``
  (effective per-partition decode coefficients, PGC paper Sec. V), ``decode_norm1`` ||a_I||_1;
* ``loss``, ``accuracy`` (when evaluated), ``bytes`` (moved this step);
* ``busy`` (per-worker busy seconds this step, list of n floats);
* ``extra``: everything else (diagnostics, control-rule actions, scheme info).

:class:`RecordWriter` appends and flushes every record, so a crash loses at most the step in
flight, and it never truncates an existing file unless told to.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Iterator


@dataclasses.dataclass
class StepRecord:
    step: int
    time: float
    step_time: float | None = None
    scheme: str | None = None
    n: int | None = None
    s: int | None = None
    workers_used: list[int] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    max_age: float | None = None
    mean_age: float | None = None
    weight_min: float | None = None
    weight_max: float | None = None
    alpha_min: float | None = None
    alpha_max: float | None = None
    decode_norm1: float | None = None
    loss: float | None = None
    accuracy: float | None = None
    bytes: int | None = None
    busy: list[float] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_decision_info(cls, step: int, time: float, info: dict, **fields: Any) -> "StepRecord":
        """Build a record from a scheme ``Decision.info`` dict plus engine-side fields."""
        known = {f.name for f in dataclasses.fields(cls)}
        mapped = {k: info[k] for k in ("max_age", "mean_age", "weight_min", "weight_max",
                                        "alpha_min", "alpha_max", "decode_norm1") if k in info}
        extra = {k: v for k, v in info.items() if k not in mapped}
        extra.update(fields.pop("extra", {}) or {})
        unknown = set(fields) - known
        if unknown:
            raise TypeError(f"unknown StepRecord fields {sorted(unknown)}; put them in extra=")
        return cls(step=step, time=time, extra=extra, **mapped, **fields)

    def to_json(self) -> str:
        return json.dumps(to_jsonable(dataclasses.asdict(self)), allow_nan=False)


def to_jsonable(x: Any) -> Any:
    """Plain JSON types; non-finite floats become strings ("nan", "inf") rather than invalid JSON."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, complex):
        return {"re": to_jsonable(x.real), "im": to_jsonable(x.imag)}
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "tolist"):
        return to_jsonable(x.tolist())
    return str(x)


class RecordWriter:
    """Appends StepRecords to a JSONL file, flushing each line.

    ``overwrite=False`` (the default) refuses to clobber an existing non-empty file: pass
    ``overwrite=True`` or ``append=True`` explicitly, or choose a new output folder.
    """

    @staticmethod
    def holds_records(path: str | os.PathLike) -> bool:
        """Whether ``path`` is a non-empty file, which the writer refuses to clobber (a CLI can
        ask before any work, to fail fast)."""
        path = Path(path)
        return path.is_file() and path.stat().st_size > 0

    def __init__(self, path: str | os.PathLike, append: bool = False, overwrite: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.holds_records(self.path) and not (append or overwrite):
            raise FileExistsError(
                f"{self.path} already holds records; pass append=True to continue it, "
                "overwrite=True to replace it, or choose another output folder")
        self._f = open(self.path, "a" if append else "w", encoding="utf-8")

    def write(self, record: StepRecord) -> None:
        self._f.write(record.to_json() + "\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _restore_nonfinite(x: Any) -> Any:
    """The inverse of the writer's encoding of non-finite floats ("nan", "inf", "-inf")."""
    if isinstance(x, dict):
        return {k: _restore_nonfinite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_restore_nonfinite(v) for v in x]
    if isinstance(x, str) and x in _NONFINITE:
        return _NONFINITE[x]
    return x


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# the types of the StepRecord fields a reader relies on: (test, what it must be)
_NUMBER_OR_NONE = (lambda x: x is None or _is_number(x), "a number or null")
_FIELD_TYPES = {
    "step": (lambda x: isinstance(x, int) and not isinstance(x, bool), "an int"),
    "time": (_is_number, "a number"),
    "step_time": _NUMBER_OR_NONE, "loss": _NUMBER_OR_NONE, "accuracy": _NUMBER_OR_NONE,
    "max_age": _NUMBER_OR_NONE, "mean_age": _NUMBER_OR_NONE, "bytes": _NUMBER_OR_NONE,
    "scheme": (lambda x: x is None or isinstance(x, str), "a string or null"),
    "workers_used": (lambda x: isinstance(x, list) and all(_is_number(v) for v in x),
                     "a list of worker ids"),
    "versions": (lambda x: isinstance(x, list) and all(_is_number(v) for v in x),
                 "a list of versions"),
    "busy": (lambda x: x is None or (isinstance(x, list) and
                                     all(v is None or _is_number(v) for v in x)),
             "a list of seconds or null"),
    "extra": (lambda x: isinstance(x, dict), "an object"),
}
REQUIRED_FIELDS = ("step", "time")


def check_record(rec: Any, where: str) -> dict:
    """``rec`` (one decoded JSON line) if it is a StepRecord: an object with ``step`` and
    ``time`` whose known fields have their types; else a ValueError naming ``where``."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a JSON {type(rec).__name__}, not a step record (an object "
                         f"with {list(REQUIRED_FIELDS)}, ...); is this a records file?")
    missing = [k for k in REQUIRED_FIELDS if k not in rec]
    if missing:
        raise ValueError(f"{where}: not a step record, it lacks {missing} (it has "
                         f"{sorted(rec)[:6]}); is this a records file?")
    for key, (ok, what) in _FIELD_TYPES.items():
        if key in rec and not ok(rec[key]):
            raise ValueError(f"{where}: field {key!r} is {rec[key]!r}, not {what}")
    return rec


def read_records(path: str | os.PathLike) -> Iterator[dict]:
    """Yield the records of a JSONL file as dicts (a truncated last line is skipped); the
    non-finite floats the writer stored as "nan" / "inf" / "-inf" come back as floats.

    A file that is not UTF-8 text, a damaged line, or a JSON line that is not a step record
    (:func:`check_record`) raises ValueError naming the file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a text file of JSON records (byte {err.start} is not "
                         "UTF-8)") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder, not a records file") from None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = _restore_nonfinite(json.loads(line))
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:  # the step in flight when a run died
                return
            raise ValueError(f"{path}, line {i + 1}: not a JSON record ({err}); the file is "
                             "damaged (only a truncated last line is expected after a crash)"
                             ) from None
        yield check_record(rec, f"{path}, line {i + 1}")


def _writable(path: Path) -> bool:
    """Whether a file could be written at ``path`` (it, or the nearest folder that exists)."""
    while not path.exists():
        path = path.parent
    return os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0))


def check_run_folder(out: str | os.PathLike, overwrite: bool = False, arg: str = "--out") -> None:
    """ValueError unless folder ``out`` can take a run's ``records.jsonl`` and ``summary.json``:
    ``out`` is not a file, neither of them is a folder, both can be written, and records.jsonl
    holds no earlier run (unless ``overwrite``). Changes nothing; a command calls it before the
    run, so that a run's results are never lost at its end. ``arg`` names the option in the
    messages."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{arg} {out} is a file; {arg} names the run's folder (records.jsonl and "
                         "summary.json are written inside it)")
    for f in (out / "records.jsonl", out / "summary.json"):
        if f.is_dir():
            raise ValueError(f"{f} is a folder, so the run could not write it; remove it or "
                             f"choose another {arg}")
        if not _writable(f):
            raise ValueError(f"{f} cannot be written (permissions); choose another {arg}")
    records = out / "records.jsonl"
    if RecordWriter.holds_records(records) and not overwrite:
        raise ValueError(f"{records} already holds an earlier run; choose another {arg} or pass "
                         "--force to replace it")
