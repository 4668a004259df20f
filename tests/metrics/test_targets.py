"""first_reaching: the time-to-target definition shared by the simulator and the runtime."""

import json

import pytest

from pgc_hvd.metrics import RecordWriter, StepRecord, read_records
from pgc_hvd.metrics.targets import RUNTIME_WINDOW, SIM_WINDOW, first_at_least, first_reaching

LOSSES = [2.0, 1.0, 0.4, 0.9, 0.5, 0.45, 0.42, 0.41, 0.3, 0.2]


def _records(losses, skip=()):
    return [StepRecord(step=t, time=0.5 * (t + 1), loss=None if t in skip else v)
            for t, v in enumerate(losses)]


def test_window_one_is_the_first_record_at_or_below_target():
    assert first_reaching(_records(LOSSES), 0.4, window=SIM_WINDOW) == (3, 1.5)
    assert first_reaching(_records(LOSSES), 0.2) == (10, 5.0)


def test_window_averages_the_last_values_and_ignores_one_lucky_minibatch():
    # mean of 5: steps 5..9 -> (0.45+0.42+0.41+0.3+0.2)/5 = 0.356; steps 4..8 -> 0.416
    assert first_reaching(_records(LOSSES), 0.4, window=RUNTIME_WINDOW) == (10, 5.0)
    assert first_reaching(_records(LOSSES), 0.42, window=RUNTIME_WINDOW) == (9, 4.5)
    assert first_reaching(_records(LOSSES), 0.1, window=RUNTIME_WINDOW) == (None, None)


def test_records_without_the_key_are_skipped_and_extra_keys_are_read():
    recs = _records(LOSSES, skip={2})
    assert first_reaching(recs, 0.4) == (9, 4.5)
    for t, r in enumerate(recs):
        r.extra["test_loss"] = 1.0 - 0.1 * t
    assert first_reaching(recs, 0.5, key="test_loss") == (6, 3.0)


def test_dicts_read_back_from_records_jsonl_give_the_same_answer(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        for r in _records(LOSSES):
            w.write(r)
    back = list(read_records(path))
    assert all(isinstance(r, dict) for r in back)
    for window in (1, 3, 5):
        assert first_reaching(back, 0.42, window=window) == first_reaching(_records(LOSSES), 0.42, window=window)
    assert json.loads(path.read_text().splitlines()[0])["loss"] == 2.0


def test_no_target_and_bad_window():
    assert first_reaching(_records(LOSSES), None) == (None, None)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="window"):
            first_reaching(_records(LOSSES), 0.4, window=bad)


def test_first_at_least_is_the_first_record_at_or_above_target():
    accs = [0.1, 0.5, None, 0.94, 0.95, 0.93, 0.97]
    recs = [StepRecord(step=t, time=0.5 * (t + 1), extra={} if a is None else {"test_accuracy": a})
            for t, a in enumerate(accs)]
    assert first_at_least(recs, 0.95) == (5, 2.5)
    assert first_at_least(recs, 0.5) == (2, 1.0)
    assert first_at_least(recs, 0.99) == (None, None)
    assert first_at_least(recs, None) == (None, None)
    dicts = [{"step": t, "time": 1.0 * t, "extra": {"test_accuracy": a}}
             for t, a in enumerate(accs) if a is not None]
    assert first_at_least(dicts, 0.95) == (5, 4.0)
