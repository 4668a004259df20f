"""stragglers='auto' in the simulator: the budget s re-planned online from the workers' delays,
every switch recorded with its reason, refusals before anything runs."""

import json

import numpy as np
import pytest

from pgc_hvd.data import load_dataset, train_test_split
from pgc_hvd.delays import pattern_spec
from pgc_hvd.sim.run import simulate

N = 6


@pytest.fixture(scope="module")
def digits():
    tr, te = train_test_split(load_dataset("digits"), 0.3, seed=0)
    return tr.subset(np.arange(300)), te.subset(np.arange(100))


def run(digits, s, delay, steps=40, auto=None, scheme="pgc-cr", **kw):
    return simulate(scheme, N, s, data=digits, model="softmax", optimizer="sgd:lr=0.3",
                    delay=delay, steps=steps, partition_time=1.0, batch_size=16, seed=0,
                    diagnostics=False, auto=auto, **kw)


def test_no_stragglers_goes_to_s0_and_records_why(digits):
    recs, summ = run(digits, "auto", "none", auto={"every": 10, "first": 10, "cooldown": 10})
    assert [r.s for r in recs[:10]] == [1] * 10           # the default s until the first boundary
    assert recs[-1].s == 0 and summ["s"] == 0
    sw = recs[10].extra["auto_s"][0]
    assert (sw["step"], sw["old_s"], sw["new_s"]) == (10, 1, 0)
    assert "less redundancy" in sw["reason"]
    assert summ["auto_switches"][0]["new_s"] == 0 and summ["steps_at_s"] == {"0": 30, "1": 10}
    assert sum(1 for r in recs if "auto_s" in r.extra) == len(summ["auto_switches"]) == 1
    # at s = 0 every step waits for all n workers, none is late
    assert all(len(r.workers_used) == N for r in recs[11:])


def test_a_persistent_slow_rank_keeps_redundancy_and_beats_s0(digits):
    slow = pattern_spec("slow-rank", N, compute=1.0, seed=2)
    recs, summ = run(digits, "auto", slow, auto={"every": 10, "first": 10, "s_start": 0})
    assert recs[9].s == 0 and recs[-1].s >= 1
    _, fixed0 = run(digits, 0, slow)
    assert summ["time"] < 0.6 * fixed0["time"]
    assert all(2 not in r.workers_used for r in recs[12:])   # the slow rank left out


def test_gc_cr_switch_changes_c(digits):
    # gc-cr computes c = s + 1 partitions per step: with nobody slow the rule drops to s = 0
    recs, _ = run(digits, "auto", "none", auto={"every": 10, "first": 10, "s_start": 2},
                  scheme="gc-cr")
    assert recs[0].s == 2 and recs[-1].s == 0
    assert recs[-1].time - recs[-2].time == pytest.approx(1.0, rel=0.05)


def test_runs_are_deterministic_and_learn_across_a_switch(digits):
    a, sa = run(digits, "auto", pattern_spec("transient", N, 1.0, steps=40, seed=1),
                auto={"every": 5})
    b, sb = run(digits, "auto", pattern_spec("transient", N, 1.0, steps=40, seed=1),
                auto={"every": 5})
    assert [(r.time, r.s, r.loss) for r in a] == [(r.time, r.s, r.loss) for r in b]
    assert sa["auto_switches"] == sb["auto_switches"]
    assert a[-1].loss < 0.5 * a[0].loss


def test_refused_before_anything_runs(digits, tmp_path):
    path = tmp_path / "records.jsonl"
    with pytest.raises(ValueError, match="s_max <= 5"):
        run(digits, "auto", "none", auto={"s_max": 9}, records_path=path)
    assert not path.exists()
    with pytest.raises(ValueError, match="need s='auto'"):
        run(digits, 1, "none", auto={"every": 5})
    with pytest.raises(ValueError, match="an int .* or 'auto'"):
        run(digits, "sometimes", "none")
    with pytest.raises(ValueError, match="adaptive=True"):
        run(digits, "auto", "none", adaptive=True)
    with pytest.raises(ValueError, match="master model"):
        run(digits, "auto", "none", comm="ring:alpha=1e-5,gbps=10")


def test_cli_auto(tmp_path, usage_error):
    from pgc_hvd.apps.simulate import main
    err = usage_error(main, ["--stragglers", "auto", "--n", "4", "--auto-options", "s_max=6",
                             "--out", str(tmp_path / "x")])
    assert "s_max <= 3" in err
    err = usage_error(main, ["--stragglers", "2", "--auto-options", "every=5",
                             "--out", str(tmp_path / "y")])
    assert "needs --stragglers auto" in err
    err = usage_error(main, ["--stragglers", "most", "--out", str(tmp_path / "z")])
    assert "or 'auto'" in err
    out = tmp_path / "run"
    assert main(["--scheme", "pgc-cr", "--n", "4", "--stragglers", "auto",
                 "--auto-options", "every=5",
                 "--model", "softmax", "--steps", "12", "--partition-time", "1", "--delay",
                 "none", "--batch-size", "16", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["auto_switches"][0]["new_s"] == 0 and summary["s"] == 0


@pytest.mark.parametrize("scheme, options", [("bcgc", None), ("is-sgd", None), ("pgc-fr", None),
                                             ("bounded-staleness", {"r": 2, "c": 2})])
def test_other_schemes_replan(digits, scheme, options):
    recs, summ = run(digits, "auto", pattern_spec("two-class", N, 1.0, seed=0), steps=20,
                     auto={}, scheme=scheme, scheme_options=options)
    assert len(recs) == 20 and all(0 <= r.s <= 3 for r in recs)
    assert sum(summ["steps_at_s"].values()) == 20
