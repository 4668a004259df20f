"""The main job (``bash launch/demo.sh``, ``pgc_hvd/apps/demo.py``) cannot rot: its smallest mode
runs as a user would start it, on 4 real ranks (hvd.DistributedOptimizer, pgc-cr, bcgc; with
``--engine torch`` under torchrun, Horovod hidden: torch's DDP, pgc-cr and bcgc through the DDP
door), and writes the summary, table and plot; ``--help`` lists every option; bad options are
refused before any rank starts."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch_watch import run_watched

from pgc_hvd.apps import demo

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "launch" / "demo.sh"


def test_help_lists_every_option():
    """``demo.sh --help`` (no environment needed) names every option ``pgc-hvd demo`` takes."""
    text = subprocess.run(["bash", str(DEMO), "--help"], capture_output=True, text=True,
                          check=True).stdout
    options = set(re.findall(r"--[a-z][a-z-]*", demo.build_parser().format_help())) - {"--help"}
    assert len(options) > 10
    missing = sorted(o for o in options | {"--skip-setup"} if o not in text)
    assert not missing, f"demo.sh --help does not list {missing}"


@pytest.mark.parametrize("argv, message", [
    (["--schemes", "hvd,nope"], "unknown scheme 'nope'"),
    (["--schemes", "hvd hvd"], "names a scheme twice"),
    (["--optimizer", "adam", "--momentum", "0.5"], "--momentum is SGD's"),
    (["--target", "1.5"], "--target is a validation accuracy"),
    (["--delay", "exp:mean=-1"], "--delay"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--engine", "torch", "--schemes", "hvd,pgc-cr"], "hvd is the baseline of --engine horovod"),
    (["--schemes", "ddp,pgc-cr"], "ddp is the baseline of --engine torch"),
    (["--engine", "mpi"], "invalid choice"),
])
def test_bad_options_are_refused_at_once(argv, message, capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(argv)
    assert message in capsys.readouterr().err


def test_delay_patterns_are_the_one_table_s():
    """``--delay NAME`` takes any pattern of ``pgc_hvd.delays.PATTERNS`` or an alias, scaled to
    ``--compute-time`` and seeded by ``--seed`` + 1 (the README's figures: ``exp:mean=0.1,seed=1``
    at seed 0); a spec passes as it is."""
    assert demo.parse_args([]).delay == "exp:mean=0.1,seed=1"
    assert demo.parse_args(["--delay", "slow", "--seed", "1"]).delay.startswith("slow:worker=2,")
    assert demo.parse_args(["--delay", "pareto"]).delay.startswith("pareto:shape=2.5,")
    assert demo.parse_args(["--delay", "transient", "--steps", "40"]).delay.startswith(
        "transient:n=4,count=2,delay=0.4,start=10,stop=24,")
    assert demo.parse_args(["--delay", "none"]).delay is None
    assert demo.parse_args(["--delay", "exp:mean=0.2,seed=3"]).delay == "exp:mean=0.2,seed=3"


def test_ratio_to_a_missed_target():
    """A scheme that misses the target is ``inf`` times Horovod's time; against a Horovod run
    that missed it there is no ratio."""
    def run(steps, time):
        return {"step_times": [0.1, 0.3], "steps_run": 2, "time_per_step": 0.2,
                "seconds_run": 0.4, "busy": [0.2, 0.3], "steps": steps, "time": time,
                "accuracy": 0.9, "same_params": True, "evals": [[0, 0.0, 0.1]]}
    args = demo.parse_args(["--np", "2"])
    got = demo.summarize(args, {"hvd": run(2, 0.4), "pgc-cr": run(None, None)})
    assert got["pgc-cr"]["seconds_to_target_vs_hvd"] == float("inf")
    assert got["hvd"]["seconds_to_target_vs_hvd"] == 1.0
    got = demo.summarize(args, {"hvd": run(None, None), "pgc-cr": run(2, 0.4)})
    assert got["pgc-cr"]["seconds_to_target_vs_hvd"] is None
    assert got["pgc-cr"]["busy_fraction"] == pytest.approx(0.25 / 0.4)
    assert "not reached" in demo.table(args, got)


def test_engine_torch_defaults_and_ratios_to_ddp():
    """``--engine torch``: the default schemes are ddp, pgc-cr, bcgc, and the one ratio code path
    names its keys and columns after the baseline (``*_vs_ddp``, ``/ ddp``)."""
    assert demo.parse_args([]).schemes == ["hvd", "pgc-cr", "bcgc"]
    args = demo.parse_args(["--engine", "torch", "--np", "2"])
    assert args.schemes == ["ddp", "pgc-cr", "bcgc"] and args.baseline == "ddp"

    def run(tps, steps, time):
        return {"step_times": [tps, tps], "steps_run": 2, "time_per_step": tps,
                "seconds_run": 2 * tps, "busy": [0.1, 0.1], "steps": steps, "time": time,
                "accuracy": 0.9, "same_params": True, "evals": [[0, 0.0, 0.1]]}
    got = demo.summarize(args, {"ddp": run(0.2, 2, 0.4), "pgc-cr": run(0.1, 2, 0.2)})
    assert got["pgc-cr"]["time_per_step_vs_ddp"] == pytest.approx(0.5)
    assert got["pgc-cr"]["seconds_to_target_vs_ddp"] == pytest.approx(0.5)
    assert got["ddp"]["steps_to_target_vs_ddp"] == 1.0
    assert not any(k.endswith("_vs_hvd") for r in got.values() for k in r)
    text = demo.table(args, got)
    assert "s/step / ddp" in text and "/ hvd" not in text and "torch DDP" in text
    cmd = demo.launch_command(args, ["--engine", "torch"])
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


@pytest.mark.multirank
def test_quick_demo_runs_every_scheme_on_four_ranks(tmp_path):
    """``bash launch/demo.sh --skip-setup --quick``: Horovod, pgc-cr and bcgc each train 10
    steps on 4 ranks with identical parameters at the end; summary.json holds each one's time per
    step and busy seconds (rank 0's and every rank's), the table and the plot are written."""
    out = tmp_path / "demo"
    env = dict(os.environ, PGC_HVD_VENV=sys.prefix)
    proc = run_watched(["bash", str(DEMO), "--skip-setup", "--quick", "--out", str(out)],
                       env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["hvd", "pgc-cr", "bcgc"]
    for scheme, r in summary.items():
        assert r["n"] == 4 and r["steps"] == 10, (scheme, r)
        assert r["same_params"], scheme
        assert r["time_per_step_s"] > 0 and r["busy_s_rank0"] > 0, (scheme, r)
        assert len(r["busy_s"]) == 4 and all(b > 0 for b in r["busy_s"]), (scheme, r)
        assert [e[0] for e in r["evals"]] == [0, 5, 10], (scheme, r)
        assert 0 <= r["final_val_accuracy"] <= 1
        assert r["time_per_step_vs_hvd"] > 0
        assert len(json.loads((out / scheme / "run.json").read_text())["step_times"]) == 10
    assert summary["hvd"]["s"] is None and summary["pgc-cr"]["s"] == summary["bcgc"]["s"] == 1
    for scheme in ("pgc-cr", "bcgc"):   # pgc_hvd's own step records, one per step
        assert len((out / scheme / "records.jsonl").read_text().splitlines()) == 10
    assert "s/step / hvd" in proc.stdout and "hvd.DistributedOptimizer" in proc.stdout
    assert (out / "report.md").read_text().count("\n") == 2 + len(summary)
    assert (out / "report.png").stat().st_size > 10_000


HIDDEN_HOROVOD = "raise ImportError('horovod is hidden from this run (test_demo.py)')\n"


@pytest.mark.multirank
def test_quick_demo_engine_torch_under_torchrun_without_horovod(tmp_path):
    """``bash launch/demo.sh --skip-setup --engine torch --quick``: torchrun --standalone, 4 ranks,
    Horovod hidden (a ``horovod`` package that raises ImportError first on the path, as the
    torchrun fixture of tests/conftest.py hides it): torch's DistributedDataParallel (ddp, the
    baseline), pgc-cr and bcgc through pgc_hvd.DistributedDataParallel each train 10 steps with
    identical parameters at the end; the table's ratio columns are to DDP's."""
    hide = tmp_path / "hidden-horovod"
    (hide / "horovod").mkdir(parents=True)
    (hide / "horovod" / "__init__.py").write_text(HIDDEN_HOROVOD)
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env.update(PGC_HVD_VENV=sys.prefix, PYTHONPATH=os.pathsep.join(
        [str(hide)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = run_watched(["bash", str(DEMO), "--skip-setup", "--engine", "torch", "--quick",
                        "--out", str(out)], env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torchrun --standalone" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["ddp", "pgc-cr", "bcgc"]
    for scheme, r in summary.items():
        assert r["n"] == 4 and r["steps"] == 10, (scheme, r)
        assert r["same_params"], scheme
        assert r["time_per_step_s"] > 0 and len(r["busy_s"]) == 4, (scheme, r)
        assert [e[0] for e in r["evals"]] == [0, 5, 10], (scheme, r)
        assert r["time_per_step_vs_ddp"] > 0 and "time_per_step_vs_hvd" not in r, (scheme, r)
    assert summary["ddp"]["time_per_step_vs_ddp"] == 1.0
    assert summary["ddp"]["s"] is None and summary["pgc-cr"]["s"] == summary["bcgc"]["s"] == 1
    for scheme in ("pgc-cr", "bcgc"):   # the door's optimizer writes pgc_hvd's step records
        assert len((out / scheme / "records.jsonl").read_text().splitlines()) == 10
    table = (out / "report.md").read_text()
    head, _, *rows = table.splitlines()
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert cols[6:9] == ["s/step / ddp", "s to 95% / ddp", "steps to 95% / ddp"], cols
    assert "/ hvd" not in proc.stdout and "hvd.DistributedOptimizer" not in proc.stdout
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in rows}
    assert list(cells) == ["torch DDP", "pgc-cr", "bcgc"]
    assert cells["torch DDP"][6] == "1.00" and all(c[-1] == "yes" for c in cells.values())
    for name in ("pgc-cr", "bcgc"):
        assert float(cells[name][6]) == pytest.approx(summary[name]["time_per_step_vs_ddp"],
                                                      abs=0.006)
    assert (out / "report.png").stat().st_size > 10_000


@pytest.mark.parametrize("variant,want", [
    ("pgc-cr", ("pgc-cr", [], None)),
    ("pgc-cr:s=auto", ("pgc-cr", [], "auto")),
    ("pgc-cr:off:s=0:decay=0.5", ("pgc-cr", ["off", "decay=0.5"], 0)),
])
def test_variant_names_the_straggler_budget(variant, want):
    """``NAME:s=N`` / ``NAME:s=auto`` (the demo's and the time-to-accuracy benchmark's variants)
    is the budget, not a scheme option; a bad one is refused with what it must be."""
    from pgc_hvd.apps.tta import parse_variant
    assert parse_variant(variant) == want


@pytest.mark.parametrize("variant,message", [("pgc-cr:s=1:s=2", "gives s twice"),
                                             ("pgc-cr:s=many", "number >= 0 or auto")])
def test_bad_variant_budget_is_refused(variant, message):
    from pgc_hvd.apps.tta import parse_variant
    with pytest.raises(ValueError, match=message):
        parse_variant(variant)
