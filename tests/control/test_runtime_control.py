"""AdaptiveController in the Horovod runtime (2 gloo ranks): a too-large lr triggers the rule,
every rank takes the same decision, the records carry diagnostics and actions; a small lr is quiet."""

import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "adaptive_rank.py"


@pytest.mark.multirank
@pytest.mark.parametrize("lr,expect", [(50.0, True), (0.05, False)])
def test_runtime_rule(horovodrun, tmp_path, lr, expect):
    horovodrun(2, SCRIPT, tmp_path, lr, 24, timeout=180)
    res = json.loads((tmp_path / "result.json").read_text())
    assert len(set(res["levels"])) == 1 and len(set(res["lrs"])) == 1   # ranks agree
    assert res["n_records"] == 24 and res["n_diag"] > 0
    if expect:
        assert res["actions"] and res["actions"][0]["direction"] == "lower"
        assert res["actions"][0]["new"] < res["actions"][0]["old"] == lr
        assert res["lrs"][0] < lr
    else:
        assert res["actions"] == [] and res["lrs"][0] == lr
