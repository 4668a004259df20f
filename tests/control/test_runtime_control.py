"""AdaptiveController in the Horovod runtime (2 gloo ranks): a too-large lr triggers the rule,
every rank takes the same decision, the records carry diagnostics and actions; a small lr is quiet.
The five runs are entries of the session's np 2 launch (``launch_group``), each writing in its
own folder."""

import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "adaptive_rank.py"
TRAIN = Path(__file__).parent / "scripts" / "train_cli.py"
RULE = [(50.0, True), (0.05, False)]

# each run writes into its own working folder (ModeRun.cwd)
RUNS = [(f"rule-{lr}", "test_runtime_rule", SCRIPT, [".", lr, 24]) for lr, _ in RULE] + [
    ("c", "test_runtime_rule_lowers_the_staleness_bound_on_every_rank_at_once", SCRIPT,
     [".", 50.0, 24, "bounded-staleness", "c"]),
    ("cli-lr", "test_train_cli_adaptive_uses_actual_ages", TRAIN,
     ["--scheme", "pgc-cr", "--stragglers", "1", "--model", "softmax", "--steps", "24",
      "--lr", "50", "--momentum", "0", "--adaptive", "--rule", "window=3,patience=1000",
      "--timeout", "60", "--out", "run"]),
    ("cli-c", "test_train_cli_passes_scheme_options_and_lowers_c", TRAIN,
     ["--scheme", "bounded-staleness", "--stragglers", "1", "--option", "c=3", "--option", "r=2",
      "--option", "replay=mean",
      "--model", "softmax", "--steps", "20", "--lr", "50", "--momentum", "0", "--adaptive",
      "--rule", "knob=c,window=3", "--rule", "patience=1000", "--timeout", "60",
      "--control", "store", "--out", "run"])]
LAUNCH_GROUPS = [("horovodrun", 2, RUNS)]


@pytest.mark.multirank
@pytest.mark.parametrize("lr,expect", RULE)
def test_runtime_rule(hvd2, lr, expect):
    res = json.loads((hvd2.ran(f"rule-{lr}").cwd / "result.json").read_text())
    assert len(set(res["levels"])) == 1 and len(set(res["lrs"])) == 1   # ranks agree
    assert res["n_records"] == 24 and res["n_diag"] > 0
    if expect:
        assert res["actions"] and res["actions"][0]["direction"] == "lower"
        assert res["actions"][0]["new"] < res["actions"][0]["old"] == lr
        assert res["lrs"][0] < lr
    else:
        assert res["actions"] == [] and res["lrs"][0] == lr


@pytest.mark.multirank
def test_runtime_rule_lowers_the_staleness_bound_on_every_rank_at_once(hvd2):
    """Bounded staleness with the note's rule (``replay="mean"``: stale table entries; the
    engines' default steps on gradients of the current model and leaves the rule nothing to
    act on), knob c (2 gloo ranks, too-large lr): the rule lowers c from 2 to 1;
    every rank applies it at the same step (rank 0's request rides in its control rows), the
    records carry the bound each decision used, and every decision after the change uses only
    fresh gradients (t - v < 1) while the lr is untouched."""
    res = json.loads((hvd2.ran("c").cwd / "result.json").read_text())
    acts = res["actions"]
    assert acts and acts[0]["knob"] == "c" and (acts[0]["old"], acts[0]["new"]) == (2, 1)
    assert res["staleness_bounds"] == [1, 1] and res["lrs"] == [50.0, 50.0]
    (change,), (change1,) = res["staleness_changes"]          # one change per rank, the same one
    assert change == change1 and change[1] == 1 and change[0] > acts[0]["step"]
    for r in res["records"]:
        assert r["c"] == (2 if r["step"] < change[0] else 1)
        assert r["max_age"] <= r["c"] - 1
        assert all(r["step"] - v < r["c"] for v in r["versions"])


@pytest.mark.multirank
def test_train_cli_adaptive_uses_actual_ages(hvd2):
    """``pgc-hvd train --adaptive --rule ...`` (2 gloo ranks, PGC-CR, too-large lr): the
    controller gets each step's decision (on_update(step, flat, decision)), so the recorded ages
    are the ones used, bounded by c - 1; the rule lowers lr; the summary reports it."""
    out = hvd2.ran("cli-lr").cwd / "run"
    summ = json.loads((out / "summary.json").read_text())
    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == 24 and summ["adaptive"] is True
    diags = [d for r in recs for d in r["extra"].get("diag", [])]
    assert diags and all(d["age"] <= d["age_bound"] for d in diags)
    assert any(d["age"] > 0 for d in diags) and all("val_loss" in d for d in diags)
    # each diagnostic's age is the decision's max age of its step (not the bound)
    ages = {r["step"]: r["max_age"] for r in recs}
    assert all(d["age"] == min(ages[d["step"]], d["age_bound"]) for d in diags)
    acts = [a for r in recs for a in r["extra"].get("control", [])]
    assert acts and acts[0]["direction"] == "lower" and acts[0]["knob"] == "lr"
    assert summ["control_actions"] == len(acts) and summ["final_lr"] < 50


@pytest.mark.multirank
def test_train_cli_passes_scheme_options_and_lowers_c(hvd2):
    """``pgc-hvd train --scheme bounded-staleness --option c=3 --option replay=mean --adaptive
    --rule knob=c --control store`` (the note's rule, as above): the scheme gets its
    options, the rule lowers c on every rank (the request
    travels in the TCPStore control rows), the summary says so."""
    out = hvd2.ran("cli-c").cwd / "run"
    summ = json.loads((out / "summary.json").read_text())
    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert summ["scheme_options"] == {"c": 3, "r": 2, "replay": "mean"}
    assert summ["control"] == "store"
    assert recs[0]["extra"]["c"] == 3 and summ["final_c"] == 1 == recs[-1]["extra"]["c"]
    acts = [a for r in recs for a in r["extra"].get("control", [])]
    assert acts[0]["knob"] == "c" and (acts[0]["old"], acts[0]["new"]) == (3, 1)
    assert all(r["step"] - v < r["extra"]["c"] for r in recs for v in r["versions"])
