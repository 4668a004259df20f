"""records.jsonl round trips: non-finite values, damaged files, no silent overwrite."""

import math

import pytest

from pgc_hvd.metrics import RecordWriter, StepRecord, read_records


def test_non_finite_values_come_back_as_floats(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        w.write(StepRecord(step=0, time=1.0, loss=float("inf"), extra={"g": float("nan"),
                                                                        "scheme": "pgc-cr"}))
    (rec,) = read_records(path)
    assert rec["loss"] == math.inf and math.isnan(rec["extra"]["g"])
    assert rec["extra"]["scheme"] == "pgc-cr"
    assert '"inf"' in path.read_text()  # still valid JSON on disk


def test_a_damaged_line_names_the_file_and_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"step": 0}\n{"step": \n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"records.jsonl, line 2: not a JSON record"):
        list(read_records(path))
    path.write_text('{"step": 0}\n{"step": ')  # a truncated last line: the step in flight
    assert [r["step"] for r in read_records(path)] == [0]


def test_an_existing_file_is_not_replaced_unless_asked(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        w.write(StepRecord(step=0, time=1.0))
    with pytest.raises(FileExistsError, match="already holds records"):
        RecordWriter(path)
    assert len(list(read_records(path))) == 1
