"""When a run first reaches a target: the one definition both engines' tables use.

Given the step records of a run (StepRecord objects from the simulator or dicts read back from
``records.jsonl``, in step order) and a target value of a metric ``key`` (default ``"loss"``),

    first_reaching(records, target, key, window) = (t + 1, time_t)

for the first record t at which the mean of the last ``window`` available values of ``key`` is
at or below the target, or ``(None, None)`` if no record is. Records without a value of ``key``
are skipped (not every step is evaluated). ``t + 1`` is the number of steps taken.

The window is the one choice that differs between engines, and it is explicit at every call:

* the simulator's ``loss`` is the training loss on the whole training set at the new model, so
  ``window=1`` (:data:`SIM_WINDOW`);
* the runtime's ``loss`` is rank 0's minibatch loss of the step, noisy, so the tables use the
  moving average of :data:`RUNTIME_WINDOW` = 5 steps.

Keys other than the StepRecord fields (``test_loss`` for instance) are read from ``extra``.

A metric that grows (validation accuracy) uses :func:`first_at_least`: the first record whose
value is at or above the target, with the same ``(t + 1, time_t)`` convention.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

from pgc_hvd.options import is_count

SIM_WINDOW = 1
RUNTIME_WINDOW = 5


def _field(record: Any, key: str):
    if isinstance(record, dict):
        value = record.get(key)
        if value is None:
            value = (record.get("extra") or {}).get(key)
        return value
    value = getattr(record, key, None)
    if value is None:
        value = (getattr(record, "extra", None) or {}).get(key)
    return value


def first_reaching(records: Iterable[Any], target: Optional[float], key: str = "loss",
                   window: int = SIM_WINDOW) -> Tuple[Optional[int], Optional[float]]:
    """``(steps, time)`` at the first record whose ``window``-mean of ``key`` is <= ``target``.

    ``target=None`` gives ``(None, None)``. ``window`` must be a positive integer.
    """
    if not is_count(window):
        raise ValueError(f"window must be a positive integer (number of values averaged), "
                         f"got {window!r}")
    if target is None:
        return None, None
    recent: list[float] = []
    for r in records:
        value = _field(r, key)
        if value is None:
            continue
        recent.append(float(value))
        if len(recent) > window:
            recent.pop(0)
        if len(recent) == window and sum(recent) / window <= target:
            return int(_field(r, "step")) + 1, float(_field(r, "time"))
    return None, None


def first_at_least(records: Iterable[Any], target: Optional[float], key: str = "test_accuracy"
                   ) -> Tuple[Optional[int], Optional[float]]:
    """``(steps, time)`` at the first record whose ``key`` (default the validation accuracy) is
    >= ``target``; records without it are skipped; ``target=None`` gives ``(None, None)``."""
    if target is None:
        return None, None
    for r in records:
        value = _field(r, key)
        if value is not None and float(value) >= target:
            return int(_field(r, "step")) + 1, float(_field(r, "time"))
    return None, None
