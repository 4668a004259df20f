"""stragglers='auto': the model's fixed cost per step knows the s = 0 path (o_0: no control
round, the rows ride in the data allreduce; o_1: with the round), and the runtime's raise to
the smallest s within min_gain of the best (docs/control.md, "s chosen online")."""

from pathlib import Path

import numpy as np
import pytest

from pgc_hvd.control.auto_s import AutoStragglers
from pgc_hvd.control.progress_model import DEFAULT_ROUND_COST, FixedCost, predict
from pgc_hvd.runtime.agent import Update
from pgc_hvd.runtime.auto_s import RuntimeAutoS
from pgc_hvd.runtime.config import RuntimeConfig
from pgc_hvd.runtime.rows import CTRL_BUSY, CTRL_READY_STEP, CTRL_READY_TIME

N = 4
ROOT = Path(__file__).resolve().parents[2]


def feed(rule, busy, steps, o0, o1, start=0):
    """``steps`` steps: rank r's step takes busy(r, t) seconds (k = 1, tau = 1); the step time
    the engine sees is the order statistic the s in force waits for plus the fixed cost of its
    kind (o0 at s = 0, o1 at s >= 1)."""
    for t in range(start, start + steps):
        b = sorted(busy(r, t) for r in range(rule.n))
        for r in range(rule.n):
            rule.observe(r, busy(r, t), 1)
        rule.observe_step(b[rule.n - rule.s - 1] + (o0 if rule.s == 0 else o1))


def spread(r, t):
    """Equal ranks whose times spread (an oversubscribed machine): U[1, 1.6], per rank and
    step, reproducible."""
    return 1.0 + 0.6 * np.random.default_rng(1000 * t + r).random()


def rule(**opts):
    return AutoStragglers("pgc-cr", N, {"every": 10, "first": 10, "cooldown": 10, "window": 16,
                                        "tau": 1.0, "s_max": 3, **opts})


def test_fixed_cost_calibrated_from_either_kind_of_step():
    assert FixedCost.calibrated(0.2, None, 0.5) == FixedCost(0.2, 0.7)
    assert FixedCost.calibrated(None, 0.7, 0.5) == FixedCost(pytest.approx(0.2), 0.7)
    assert FixedCost.calibrated(None, 0.1, 0.5) == FixedCost(0.0, 0.1)     # never below 0
    assert FixedCost.calibrated(0.3, 0.4, 9.0) == FixedCost(0.3, 0.4)      # both observed
    assert FixedCost.calibrated(round_cost=0.5) == FixedCost(0.0, 0.5)
    fc = FixedCost(0.1, 0.6)
    assert (fc.at(0), fc.at(1), fc.at(3)) == (0.1, 0.6, 0.6)
    d = [[0.0] * 4 for _ in range(N)]
    assert predict("pgc-cr", 0, d, 1.0, fc).time_per_step == pytest.approx(1.1)
    assert predict("pgc-cr", 2, d, 1.0, fc).time_per_step == pytest.approx(1.6)
    assert predict("pgc-cr", 2, d, 1.0, 0.25).time_per_step == pytest.approx(1.25)


def test_the_round_prior_is_the_log_paths_round_at_n4():
    """DEFAULT_ROUND_COST is the simulator's log path (sim/log_costs.py) with the constants
    measured on this machine (docs/figures/log_control_fit.json): the append (a push), the
    decider's two runs on 4 rows, the follower's replay (the broadcast's link time left out)."""
    from pgc_hvd.sim.log_costs import load_log_fit
    c = load_log_fit(ROOT / "docs" / "figures" / "log_control_fit.json")
    got = (c.append_delay(1) + c.body_seconds("decider", 4, 2, 4)
           + c.body_seconds("follower", 4, 3, 4))
    assert DEFAULT_ROUND_COST == pytest.approx(got, rel=0.05)


def test_no_stragglers_and_a_measured_round_go_to_s0():
    """Equal ranks whose times spread, s = 1 measured with a round of 0.5 (tau = 1): the
    round makes s >= 1 dearer than s = 0 whatever the spread, so the rule goes to 0. One fixed
    cost for every s (the model before) calibrated at s = 1 charged s = 0 the round too, and
    the spread made s = 3 look 20% faster."""
    one = rule(round_cost=0.0)          # o_0 = o_1: one cost for every s, the model before
    feed(one, spread, 10, o0=0.2, o1=0.7)
    assert (one.decide(10).new, one.fixed_cost.zero) == (3, one.fixed_cost.round)
    r = rule(round_cost=0.5)
    feed(r, spread, 10, o0=0.2, o1=0.7)
    sw = r.decide(10)
    assert sw is not None and (sw.old, sw.new) == (1, 0), r.last_predictions
    assert r.fixed_cost.round == pytest.approx(r.fixed_cost.zero + 0.5)
    # at s = 0 its own cost is measured; s = 1 keeps the cost measured with the round
    feed(r, spread, 30, o0=0.2, o1=0.7, start=10)
    assert r.decide(20) is None and r.decide(30) is None and r.s == 0
    assert r.observed_cost[0] == pytest.approx(0.2, abs=0.1)
    assert r.fixed_cost.round > r.fixed_cost.zero + 0.3


def test_no_stragglers_from_s0_the_prior_keeps_s0():
    """Starting at s = 0 (the runtime's start) with no s >= 1 step seen yet: s >= 1 is priced
    with the round's prior, and the spread alone does not pay for it."""
    one = rule(round_cost=0.0, s_start=0)
    feed(one, spread, 10, o0=0.2, o1=0.7)
    assert one.decide(10).new == 3                  # the spread alone, with no round priced
    r = rule(round_cost=0.5, s_start=0)
    feed(r, spread, 30, o0=0.2, o1=0.7)
    assert r.decide(10) is None and r.decide(20) is None and r.s == 0
    assert r.observed_cost == {0: pytest.approx(0.2, abs=0.1), 1: None}


@pytest.mark.parametrize("raise_to, new", [("best", 3), ("smallest", 1)])
def test_one_rank_4x_slow_raises_s(raise_to, new):
    """One rank 4x slow, the others spread a little (0.105-0.14 s, tau 0.1 s, the measured
    fixed costs of docs/control.md's smoke launch on this machine: about 0.03 s a step on the
    s = 0 path, the round's prior 0.05 s): every s >= 1 beats s = 0 by far; the others differ
    by the fast ranks' spread only, within min_gain of each other. 'best' takes s = n - 1,
    'smallest' (the runtime's default) the smallest s within min_gain of the best."""
    slow = lambda r, t: 0.42 if r == 2 else 0.105 + 0.035 * np.random.default_rng(  # noqa: E731
        1000 * t + r).random()
    r = rule(s_start=0, tau=0.1, round_cost=0.05, raise_to=raise_to)
    feed(r, slow, 10, o0=0.03, o1=0.08)
    sw = r.decide(10)
    assert sw is not None and (sw.old, sw.new) == (0, new), r.last_predictions
    rates = {p["s"]: p["rate"] for p in r.last_predictions}
    assert min(rates[1], rates[2], rates[3]) > 2 * rates[0]
    assert max(rates[1], rates[2], rates[3]) < 1.08 * min(rates[1], rates[2], rates[3])
    # raised to s = 1, the larger s must beat it by min_gain: no further switch
    if raise_to == "smallest":
        feed(r, slow, 30, o0=0.03, o1=0.08, start=10)
        assert r.decide(20) is None and r.decide(30) is None and r.s == 1


def test_the_simulator_prices_no_round_under_its_master_model(monkeypatch):
    """The master model's decoder runs no control round at any s: the engine sets the rule's
    prior to 0 (a rule on its own has the runtime's)."""
    from pgc_hvd.control import auto_s
    from pgc_hvd.sim.run import simulate
    assert AutoStragglers("pgc-cr", 4).round_cost == DEFAULT_ROUND_COST
    made = []
    init = auto_s.AutoStragglers.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        made.append(self)
    monkeypatch.setattr(auto_s.AutoStragglers, "__init__", spy)
    simulate("pgc-cr", 4, "auto", steps=6, model="softmax", delay="none", seed=0,
             auto={"every": 3, "first": 3, "cooldown": 3})
    assert made and made[0].round_cost == 0.0
    assert made[0].fixed_cost.zero == made[0].fixed_cost.round


# -- the runtime's adaptor: step times from the rows' ready times ------------------------------
def _row(step, busy, ready):
    row = [0.0] * 12
    row[CTRL_READY_STEP], row[CTRL_BUSY], row[CTRL_READY_TIME] = float(step), busy, ready
    return row


def test_runtime_step_times_from_the_rows_ready_times():
    """Every rank's message of step t is ready at 100 + 0.25 t + 0.01 r (its clock): 0.25 s a
    step, fed to the rule; s = 0's fixed cost is that minus the slowest rank's busy seconds."""
    cfg = RuntimeConfig(scheme="pgc-cr", stragglers="auto",
                        auto={"first": 4, "every": 4, "cooldown": 4, "window": 6, "tau": 0.1}
                        ).checked(4).auto
    auto = RuntimeAutoS(cfg, "pgc-cr", 4)
    busy = [0.100, 0.102, 0.104, 0.106]
    for t in range(8):
        rows = [_row(t, (t + 1) * b, 100 + 0.25 * t + 0.01 * w) for w, b in enumerate(busy)]
        auto.on_decided(Update(t, None, None, 0.0, {}), rows)
    assert list(auto.rule.stats.step_times) == pytest.approx([0.25] * 6)
    assert auto.rule.s == 0 and auto.rule.observed_cost[0] == pytest.approx(0.144, abs=0.002)
    assert auto.rule.fixed_cost.round == pytest.approx(0.144 + DEFAULT_ROUND_COST, abs=0.002)
    auto.restarted()                       # a re-plan: the next message gives no period
    rows = [_row(8, 9 * b, 200.0) for b in busy]
    auto.on_decided(Update(8, None, None, 0.0, {}), rows)
    assert len(auto.rule.stats.step_times) == 6
