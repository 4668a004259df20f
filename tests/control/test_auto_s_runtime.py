"""``stragglers="auto"`` in the runtime (pgc_hvd/runtime/auto_s.py, docs/control.md "s chosen
online"): the setting checked once (config), the rule fed from control rows, and a switch at
np 3 under both engines ending with identical parameters (one entry in each engine's shared
np 3 launch, ``launch_group``; a few seconds each)."""

import json
from pathlib import Path

import pytest
from checks import passed

from pgc_hvd.runtime.agent import Update
from pgc_hvd.runtime.auto_s import RuntimeAutoS, agent_name, switch_of
from pgc_hvd.runtime.config import (AUTO_DEFAULTS, RUNTIME_STALENESS_COST, RuntimeConfig,
                                    cross_rank_fields)
from pgc_hvd.runtime.rows import CTRL_BUSY, CTRL_READY_STEP

SCRIPT = Path(__file__).parent / "scripts" / "auto_s_checks.py"
ROOT = Path(__file__).resolve().parents[2]
ENTRY = [("auto-switch", "test_auto_switch_at_np3_ends_with_identical_parameters", SCRIPT,
          ["16"])]
LAUNCH_GROUPS = [("horovodrun", 3, ENTRY), ("torchrun", 3, ENTRY)]


# -- the setting, checked once -----------------------------------------------------------------
def test_auto_setting_resolves_the_rules_settings_with_runtime_defaults():
    c = RuntimeConfig(scheme="pgc-cr", stragglers="auto", auto={"s_max": 2}).checked(4)
    assert c.stragglers == 0 == c.auto.s_start and c.auto.s_max == 2
    assert (c.auto.every, c.auto.first, c.auto.cooldown) == tuple(
        AUTO_DEFAULTS[k] for k in ("every", "first", "cooldown"))
    again = c.checked(4)
    assert again.auto == c.auto and again.stragglers == 0      # checking twice changes nothing
    assert cross_rank_fields(c)["extra"]["auto (stragglers='auto' options)"]["s_max"] == 2
    assert cross_rank_fields(RuntimeConfig().checked(4))["extra"][
        "auto (stragglers='auto' options)"] is None


def test_the_runtime_staleness_cost_is_the_one_measured_on_its_workload():
    """The runtime rule's default staleness_cost is RUNTIME_STALENESS_COST, the fit of
    benchmarks/tta/staleness_cost.py at its highest target, recomputed here from the launches'
    evaluations it recorded (docs/figures/runtime_staleness_cost.json; steps(s) / steps(0) =
    1 + lambda s, the same seed's s = 0 run the exact one), to its two digits; the
    simulator's rule keeps its own default (MNIST-1D's, docs/control.md)."""
    from pgc_hvd.apps.tta import parse_variant
    from pgc_hvd.control.auto_s import AutoConfig
    from pgc_hvd.control.progress_model import DEFAULT_STALENESS_COST, fit_staleness_cost
    data = json.loads((ROOT / "docs" / "figures" / "runtime_staleness_cost.json").read_text())
    target = max(float(x) for x in data["fit"])
    points = []
    for launch in data["results"]:
        steps = {parse_variant(r["variant"])[2]: next(
            (st for st, _, acc in r["evals"] if acc >= target), None) for r in launch["runs"]}
        points += [(s, st, steps[0]) for s, st in steps.items()]
    assert len(points) >= 3 * 4 and {s for s, _, _ in points} >= {0, 1, 2, 3}
    assert RUNTIME_STALENESS_COST == pytest.approx(fit_staleness_cost(points), abs=0.005)
    assert AUTO_DEFAULTS["staleness_cost"] == RUNTIME_STALENESS_COST
    assert RuntimeConfig(stragglers="auto").checked(4).auto.staleness_cost == \
        RUNTIME_STALENESS_COST
    assert AutoConfig().staleness_cost == DEFAULT_STALENESS_COST


@pytest.mark.parametrize("kw,words", [
    (dict(stragglers="auto", auto={"s_max": 3}), "pass auto options s_max <= 2"),
    (dict(stragglers="auto", auto={"s_start": 2, "s_max": 1}), "lower s_start"),
    (dict(stragglers=3), "use s in [0, 2]"),
    (dict(stragglers=1, auto={"s_max": 1}), "pass stragglers='auto' with it"),
    (dict(stragglers="auto", scheme="dgd"), "tolerates no stragglers"),
    (dict(stragglers="sometimes"), "or 'auto'"),
    (dict(stragglers="auto", auto={"bogus": 1}), "unknown stragglers='auto' options"),
])
def test_auto_refusals_name_the_fix(kw, words):
    """Refused by RuntimeConfig.checked, or for a fixed s by the scheme's construction
    (RuntimeConfig.build_scheme), both of which the optimizer runs before its first collective
    (the multi-rank entry checks that no rank hangs)."""
    with pytest.raises((ValueError, TypeError)) as err:
        RuntimeConfig(**kw).checked(3).build_scheme(3, [])
    assert words in str(err.value), err.value


def test_auto_needs_two_ranks():
    with pytest.raises(ValueError, match="n >= 2"):
        RuntimeConfig(stragglers="auto").checked(1)


# -- the rule fed from control rows -------------------------------------------------------------
def _row(step, busy):
    row = [0.0] * 12
    row[CTRL_READY_STEP], row[CTRL_BUSY] = float(step), float(busy)
    return row


def _feed(auto, busy_per_step, steps):
    """Decide ``steps`` steps; rank r's message of step t shows busy (t + 1) * busy_per_step[r]."""
    out = []
    for t in range(steps):
        rows = [_row(t, (t + 1) * b) for b in busy_per_step]
        upd = Update(t, None, None, 0.0, {})
        auto.on_decided(upd, rows)
        out.append(switch_of(upd))
    return out


def _auto(**opts):
    cfg = RuntimeConfig(scheme="pgc-cr", stragglers="auto",
                        auto={"first": 4, "every": 4, "cooldown": 4, "window": 6, **opts}
                        ).checked(4).auto
    return RuntimeAutoS(cfg, "pgc-cr", 4)


def test_rows_with_a_slow_rank_raise_s_at_the_first_boundary_and_record_why():
    auto = _auto(s_start=0, s_max=2, early_gain=None)
    got = _feed(auto, [0.01, 0.011, 0.012, 0.05], 12)
    sw = [(t, d["old_s"], d["new_s"]) for t, d in enumerate(got) if d]
    assert sw[0][:2] == (3, 0) and sw[0][2] >= 1, sw   # decided with step 3: from version 4
    assert "predicted progress/s" in got[3]["reason"] and got[3]["predictions"]
    assert auto.s >= 1 and auto.summary()["auto_switches"][0]["step"] == 4


def test_a_slow_rank_is_left_out_at_the_first_early_boundary_with_a_sample():
    """With the runtime's default early_gain one rank 5x slow is left out at step 2, the first
    boundary with a sample per rank (the first message of a plan gives none): it used to cost
    every step before ``first`` (10 by default) at s = 0. Equal ranks: no early switch."""
    auto = _auto(s_start=0, s_max=2)
    assert auto.rule.cfg.early_gain == AUTO_DEFAULTS["early_gain"] == 1.0
    got = _feed(auto, [0.01, 0.011, 0.012, 0.05], 2)
    assert got[0] is None and auto.rule.stats.counts() == [1] * 4
    assert got[1] and (got[1]["step"], got[1]["old_s"], got[1]["new_s"]) == (2, 0, 1), got
    assert "early boundary" in got[1]["reason"]
    calm = _auto(s_start=0, s_max=2)
    assert not any(_feed(calm, [0.01, 0.0102, 0.0104, 0.0106], 12)) and calm.s == 0


def test_equal_ranks_bring_s_down_to_zero():
    auto = _auto(s_start=1, s_max=2)
    got = _feed(auto, [0.01] * 4, 8)
    assert [(d["old_s"], d["new_s"]) for d in got if d] == [(1, 0)]
    assert auto.summary()["steps_at_s"] == {"0": 4, "1": 4}


def test_statistics_are_bounded_and_the_same_from_the_same_rows():
    a, b = _auto(s_start=0), _auto(s_start=0)
    rows = [0.01, 0.02, 0.01, 0.08]
    assert _feed(a, rows, 300) == _feed(b, rows, 300)
    assert max(a.rule.stats.counts()) <= 6            # the window, whatever the run's length
    a.restarted()
    assert a._seen_step == [None] * 4


def test_agent_name_keeps_a_new_plans_channel_apart():
    c = RuntimeConfig(name="pgc").checked(2)
    assert agent_name(c, 0) == "pgc" and agent_name(c, 2) == "pgc.auto2"


# -- a switch under both engines ----------------------------------------------------------------
@pytest.mark.multirank
@pytest.mark.parametrize("engine", ["horovodrun", "torchrun"])
def test_auto_switch_at_np3_ends_with_identical_parameters(engine, request):
    """pgc-cr from s = 0 with one rank persistently slow: s rises to 1 at an early boundary
    (before first = 4, the runtime's early_gain) on every rank
    (the same switches everywhere, the records say why), the re-planned run reaches the same
    version with identical parameters (cross-rank hash); auto with s_max > n - 1 and a fixed
    s > n - 1 are refused on every rank before any collective (the ranks go on without a
    hang). And back: from s = 1, no straggler at first, s falls to 0 at step 4 (those steps run
    no control round: the rows ride in the data allreduce, records' control_ops 0) and rises
    to 1 again at step 12 when a rank turns slow, identical parameters at the end."""
    proc = request.getfixturevalue("hvd3" if engine == "horovodrun" else "torch3").ran(
        "auto-switch")
    got = passed(proc.stdout)
    for name in ("auto_refused_before_any_collective", "auto_switch_identical_parameters",
                 "auto_switch_to_s0_and_back"):
        assert got.get(name) == [0, 1, 2], (name, proc.stdout[-3000:], proc.stderr[-3000:])
