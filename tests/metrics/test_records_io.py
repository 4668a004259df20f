"""records.jsonl round trips: non-finite values, damaged files, no silent overwrite."""

import json
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
    path.write_text('{"step": 0, "time": 0.1}\n{"step": \n{"step": 2, "time": 0.3}\n')
    with pytest.raises(ValueError, match=r"records.jsonl, line 2: not a JSON record"):
        list(read_records(path))
    path.write_text('{"step": 0, "time": 0.1}\n{"step": ')  # a truncated last line: the step in flight
    assert [r["step"] for r in read_records(path)] == [0]


def test_an_existing_file_is_not_replaced_unless_asked(tmp_path):
    path = tmp_path / "records.jsonl"
    with RecordWriter(path) as w:
        w.write(StepRecord(step=0, time=1.0))
    with pytest.raises(FileExistsError, match="already holds records"):
        RecordWriter(path)
    assert len(list(read_records(path))) == 1


GOOD = '{"step": 0, "time": 0.1, "step_time": 0.1, "workers_used": [0, 1], "loss": 2.0}\n'


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", "line 2: a JSON list, not a step record"),
    ('"text"', "line 2: a JSON str, not a step record"),
    ('{"foo": 1}', r"line 2: not a step record, it lacks \['step', 'time'\]"),
    ('{"step": "0", "time": 1.0}', "line 2: field 'step' is '0', not an int"),
    ('{"step": 1, "time": 1.0, "step_time": "fast"}', "line 2: field 'step_time' is 'fast'"),
    ('{"step": 1, "time": 1.0, "workers_used": 3}', "line 2: field 'workers_used' is 3"),
    ('{"step": 1, "time": 1.0, "busy": [0.1, "x"]}', r"line 2: field 'busy' is \[0.1, 'x'\]"),
    ('{"step": 1, "time": 1.0, "extra": []}', r"line 2: field 'extra' is \[\], not an object"),
])
def test_json_lines_that_are_not_records_are_named(tmp_path, line, message):
    path = tmp_path / "records.jsonl"
    path.write_text(GOOD + line + "\n" + GOOD)
    with pytest.raises(ValueError, match=r"records.jsonl, " + message):
        list(read_records(path))


def test_a_binary_file_or_a_folder_is_not_read_as_records(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=r"records.jsonl: not a text file of JSON records"):
        list(read_records(path))
    with pytest.raises(ValueError, match=r"is a folder, not a records file"):
        list(read_records(tmp_path))


def _run_folder(tmp_path, records=GOOD * 3, summary=None):
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_bytes(records if isinstance(records, bytes) else records.encode())
    if summary is not None:
        (run / "summary.json").write_bytes(summary)
    return run


@pytest.mark.parametrize("records, summary, message", [
    ('[1, 2]\n', None, "records.jsonl, line 1: a JSON list, not a step record"),
    ('{"foo": 1}\n', None, "records.jsonl, line 1: not a step record"),
    ('{"step": 0, "time": 0.1, "step_time": "x"}\n', None, "field 'step_time' is 'x'"),
    (b"\xff\xfe\x00\x01", None, "records.jsonl: not a text file of JSON records"),
    (GOOD, b'{"target_loss": ', "summary.json: damaged, not a JSON summary"),
    (GOOD, b"\xff\xfe", "summary.json: damaged, not a JSON summary"),
    (GOOD, b"[1, 2]", "summary.json: a JSON list, not the summary object"),
    (GOOD, b'{"target_loss": "low"}', "summary.json: target_loss is 'low', not a number"),
    ('{"step": 3, "time": 0.1, "extra": {"auto_s": {"new_s": 2}}}\n', None,
     "step 3: extra.auto_s is {'new_s': 2}, not a list of switches"),
])
def test_report_names_a_damaged_records_file_or_summary(tmp_path, usage_error, records, summary,
                                                         message):
    """pgc-hvd report: a clear usage error naming the file, never a raw AttributeError,
    KeyError, TypeError or UnicodeDecodeError."""
    from pgc_hvd.apps.report import main
    run = _run_folder(tmp_path, records, summary)
    assert message in usage_error(main, [str(run), "--no-plot"])


def test_report_reads_a_good_run_and_checks_its_target(tmp_path, usage_error, capsys):
    from pgc_hvd.apps.report import main
    run = _run_folder(tmp_path, summary=b'{"target_loss": 2.5, "final_test_accuracy": 0.9}')
    assert main([str(run), "--no-plot"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith("| run |") and "| 0.900 |" in row  # the summary's test accuracy
    assert "--target-loss must be a finite loss" in usage_error(
        main, [str(run), "--no-plot", "--target-loss", "nan"])
    (run / "records.jsonl").unlink()
    (run / "records.jsonl").mkdir()
    assert "records.jsonl is a folder" in usage_error(main, [str(run), "--no-plot"])


def test_report_shows_each_switch_of_an_auto_run(tmp_path, capsys):
    """stragglers="auto" (a simulated run, no stragglers: s = 1 -> 0 at its first boundary):
    the report's s column reads where s started and went, report.md lists the switch with its
    step and the rule's reason, and the plot is written with the switch marked."""
    from pgc_hvd.apps.report import main
    from pgc_hvd.apps.simulate import main as simulate
    run = tmp_path / "auto"
    assert simulate(["--scheme", "pgc-cr", "--n", "4", "--stragglers", "auto", "--auto-options",
                     "every=5", "--model", "softmax", "--steps", "12", "--partition-time", "1",
                     "--delay", "none", "--batch-size", "16", "--out", str(run)]) == 0
    switch = json.loads((run / "summary.json").read_text())["auto_switches"][0]
    assert (switch["old_s"], switch["new_s"]) == (1, 0)
    capsys.readouterr()
    assert main([str(run)]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert "| auto 1->0 |" in row, row
    text = (run / "report.md").read_text()
    assert f"before step {switch['step']} (" in text and "s 1 -> 0: predicted" in text, text
    assert (run / "report.png").stat().st_size > 0
