"""The command line: ``pgc-hvd simulate`` and ``pgc-hvd experiment staleness --quick``."""

import json

import pytest
import torch

from pgc_hvd.cli import main
from pgc_hvd.metrics.records import read_records


def test_simulate_cli_writes_records_trace_and_replays(tmp_path, capsys):
    args = ["simulate", "--scheme", "bcgc", "--n", "6", "--stragglers", "2", "--steps", "4",
            "--partition-time", "0.5", "--delay", "exp:mean=1,seed=2", "--compression", "topk:0.1,ef=0"]
    assert main(args + ["--out", str(tmp_path / "a"), "--save-trace", str(tmp_path / "t.json")]) == 0
    first = list(read_records(tmp_path / "a" / "records.jsonl"))
    assert len(first) == 4 and first[0]["scheme"] == "bcgc"
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["n"] == 6
    args[args.index("--delay") + 1] = f"replay:{tmp_path / 't.json'}"
    assert main(args + ["--out", str(tmp_path / "b")]) == 0
    again = list(read_records(tmp_path / "b" / "records.jsonl"))
    assert again == first
    torch.set_num_threads(1)


@pytest.mark.slow
def test_experiment_quick_outputs(tmp_path):
    assert main(["experiment", "staleness", "--quick", "--out", str(tmp_path)]) == 0
    for f in ("summary.json", "table.md", "plot.png"):
        assert (tmp_path / f).stat().st_size > 0
    runs = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert {r["variant"] for r in runs} == {"sync-dp", "gc", "bounded c=2", "bounded c=4", "bounded c=8",
                                          "bounded c=2 once", "bounded c=4 once",
                                          "bounded c=8 once"}
    assert all(r["max_age"] < 8 for r in runs)
    # pgc-hvd report reads an experiment's records/<run>.jsonl: one row per run
    assert main(["report", str(tmp_path), "--no-plot"]) == 0
    rows = [ln for ln in (tmp_path / "report.md").read_text().splitlines()[2:] if ln.startswith("|")]
    assert len(rows) == len(list((tmp_path / "records").glob("*.jsonl"))) == len(runs)
    torch.set_num_threads(1)


def test_simulate_refuses_to_replace_an_earlier_run(tmp_path, usage_error):
    args = ["simulate", "--scheme", "pgc-cr", "--n", "4", "--s", "1", "--steps", "2",
            "--partition-time", "0.1", "--model", "softmax", "--out", str(tmp_path)]
    assert main(args) == 0
    before = (tmp_path / "records.jsonl").read_bytes()
    assert "pass --force" in usage_error(main, args)
    assert (tmp_path / "records.jsonl").read_bytes() == before  # nothing lost
    assert main(args + ["--force"]) == 0
    # pgc-hvd report reads a simulated run's final loss and test accuracy too
    assert main(["report", str(tmp_path), "--no-plot"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    report = (tmp_path / "report.md").read_text()
    assert f"{summary['final_loss']:.3f}" in report and f"{summary['test_accuracy']:.3f}" in report
    torch.set_num_threads(1)


@pytest.mark.parametrize("bad, message", [
    (["--steps", "0"], "--steps must be >= 1"),
    (["--compression", "topk:0"], "must lie in (0, 1]"),
    (["--compression", "topk:1.5"], "must lie in (0, 1]"),
    (["--compression", "topk:0.1,ef=2"], "ef=0"),
    (["--compression", "topk:0.1,foo=1"], "unknown option"),
    (["--compression", "gzip"], "use 'none' or a top-kappa spec"),
    (["--compression", "topk:k=5"], "takes a ratio"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--scheme", "dgd"], "--stragglers 1: dgd waits for all n=4 workers"),
    (["--stragglers", "4"], "--stragglers 4: pgc-cr: needs 0 <= s <= n-1"),
    (["--scheme", "pgc"], "--scheme: unknown scheme 'pgc'"),
])
def test_simulate_rejects_bad_values_before_writing(tmp_path, usage_error, bad, message):
    argv = ["simulate", "--n", "4", "--s", "1", "--out", str(tmp_path / "x")] + bad
    assert message in usage_error(main, argv)
    assert not (tmp_path / "x" / "records.jsonl").exists()


def test_stragglers_is_the_flag_and_s_its_hidden_alias(capsys):
    from pgc_hvd.apps.codes_report import main as codes_main
    from pgc_hvd.apps.simulate import main as simulate_main
    for cli in (simulate_main, codes_main):
        with pytest.raises(SystemExit):
            cli(["--help"])
        text = capsys.readouterr().out
        assert "--stragglers" in text and "--s " not in text and "--s," not in text


def test_experiment_refuses_to_replace_results(tmp_path, usage_error):
    (tmp_path / "summary.json").write_text("{}")
    assert "pass --force" in usage_error(
        main, ["experiment", "staleness", "--quick", "--out", str(tmp_path)])
    assert (tmp_path / "summary.json").read_text() == "{}"
    assert "names no dataset" in usage_error(
        main, ["experiment", "bcgc", "--quick", "--datasets", ",", "--out", str(tmp_path / "y")])


def test_simulate_control_needs_adaptive(tmp_path, usage_error):
    assert "needs --adaptive" in usage_error(
        main, ["simulate", "--rule", "knob=c", "--out", str(tmp_path)])


def test_simulate_reads_cifar10_from_data_dir(tmp_path):
    import pickle

    import numpy as np
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    # the layout of cifar-10-python.tar.gz, tiny (torchvision reads it without the MD5 check)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8),
                         "labels": [i % 10 for i in range(8)]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    out = tmp_path / "run"
    assert main(["simulate", "--dataset", "cifar10", "--data-dir", str(tmp_path),
                 "--no-verify-data", "--model",
                 "softmax", "--n", "4", "--s", "1", "--steps", "2", "--partition-time", "0.1",
                 "--out", str(out)]) == 0
    assert len(list(read_records(out / "records.jsonl"))) == 2
    torch.set_num_threads(1)


def test_simulate_checks_its_out_folder_and_trace_before_the_run(tmp_path, unusable_runs,
                                                                usage_error):
    """The same checks as pgc-hvd train (one helper, check_run_folder): a file as --out, a
    records.jsonl or summary.json that is a folder, an earlier run, a damaged replay: trace."""
    for argv, message in unusable_runs:
        assert message in usage_error(main, ["simulate", "--n", "4", "--s", "1", "--out"] + argv)
    (tmp_path / "t.json").write_text('{"format": "pgc_hvd.delay_trace/1", "delays": [[0, 0,')
    assert "--delay" in usage_error(main, ["simulate", "--out", str(tmp_path / "x"), "--delay",
                                           f"replay:{tmp_path / 't.json'}"])
    assert "--save-trace" in usage_error(main, ["simulate", "--out", str(tmp_path / "x"),
                                                "--save-trace", str(tmp_path)])
    assert not (tmp_path / "x").exists()
