"""The online rule of stragglers='auto' on its own: bounded memory, boundaries, hysteresis,
refusals before a run."""

import pytest

from pgc_hvd.control.auto_s import AutoConfig, AutoStragglers


def feed(rule, delays_of, steps, start=0, tau=1.0):
    for t in range(start, start + steps):
        for r in range(rule.n):
            rule.observe(r, tau * rule.partitions(rule.s) + delays_of(r, t), rule.partitions(rule.s))
        rule.observe_step(tau + max(delays_of(r, t) for r in range(rule.n)))


def test_switches_down_to_zero_without_stragglers_and_up_for_a_slow_rank():
    rule = AutoStragglers("pgc-cr", 12, {"every": 10, "first": 10, "cooldown": 10,
                                         "window": 16, "s_max": 3, "staleness_cost": 1.0, "tau": 1.0})
    assert rule.s == 1
    feed(rule, lambda r, t: 0.0, 10)
    sw = rule.decide(10)
    assert sw is not None and (sw.old, sw.new) == (1, 0) and "less redundancy" in sw.reason
    assert rule.decide(15) is None                # not a boundary
    feed(rule, lambda r, t: 3.0 if r == 2 else 0.0, 20, start=10)
    sw = rule.decide(30)
    assert sw is not None and (sw.old, sw.new) == (0, 1) and "min_gain" in sw.reason
    assert sw.as_dict()["predictions"][0]["s"] == 1


def test_hysteresis_keeps_s_when_gain_is_small():
    rule = AutoStragglers("gc-cr", 4, {"every": 5, "first": 5, "cooldown": 5, "min_gain": 0.5, "tau": 1.0,
                                       "s_max": 2})
    # one rank +1.2: s = 1 gives 2.0 per step against 2.2 at s = 0: +10% < 50%
    rule.s = 0
    feed(rule, lambda r, t: 1.2 if r == 0 else 0.0, 10)
    assert rule.decide(10) is None and rule.s == 0
    assert rule.last_predictions[0]["s"] == 1


def test_a_replan_is_charged_its_warm_up():
    # PGC at s evaluates s + 1 partitions at the first step of a new plan: charged over a
    # horizon of 1 step that is s tau, at least the 1.0 a slow rank's delay costs s = 0
    rule = AutoStragglers("pgc-cr", 8, {"every": 5, "first": 5, "cooldown": 5, "tau": 1.0,
                                        "s_max": 3, "s_start": 0, "horizon": 1,
                                        "min_gain": 0.0})
    feed(rule, lambda r, t: 1.0 if r == 1 else 0.0, 10)
    assert rule.decide(5) is None
    assert rule.warmup_partitions(3) == 4 and rule.warmup_partitions(0) == 1
    rule.cfg.horizon = 50
    assert rule.decide(10).new >= 1


def test_early_boundaries_switch_only_on_a_large_predicted_gain():
    """Before ``first`` every step is an early boundary where a switch needs the best candidate
    predicted > early_gain better: one rank 4x slow is left out after its first step (the
    runtime's slow-rank start, which otherwise runs at s = 0 until ``first``), a rank 1.5x
    slow (predicted +50%) waits for the regular boundary and its 8% margin."""
    opts = {"first": 10, "every": 20, "cooldown": 20, "s_start": 0, "s_max": 2, "tau": 1.0,
            "raise_to": "smallest", "staleness_cost": 0.0}
    slow = AutoStragglers("pgc-cr", 4, {**opts, "early_gain": 1.0})
    feed(slow, lambda r, t: 3.0 if r == 2 else 0.0, 1)
    sw = slow.decide(1)
    assert sw is not None and (sw.step, sw.old, sw.new) == (1, 0, 1), slow.last_predictions
    assert "early boundary" in sw.reason and sw.gain > 1.0
    assert all(slow.decide(t) is None for t in range(2, 21)) and slow.s == 1   # cooldown
    # the same rows without early boundaries: nothing before step 10 (the old start)
    plain = AutoStragglers("pgc-cr", 4, opts)
    feed(plain, lambda r, t: 3.0 if r == 2 else 0.0, 1)
    assert plain.decide(1) is None and not plain.ready(1)
    mild = AutoStragglers("pgc-cr", 4, {**opts, "early_gain": 1.0})
    for t in range(10):
        feed(mild, lambda r, t: 0.5 if r == 2 else 0.0, 1, start=t)
        assert mild.decide(t + 1) is None or t + 1 == 10
    assert mild.s == 1 and mild.switches[-1].step == 10
    assert "early" not in mild.switches[-1].reason


def test_an_onset_between_regular_boundaries_is_an_early_boundary():
    """After ``first``, a step off the regular boundaries is an early boundary once ``half_life``
    steps in a row took more than (1 + early_gain) x the window's fastest: two ranks 5x slow
    from step 75 (the runtime's transient pattern: tau 0.1 s, +0.4 s; its regular boundaries,
    every 20 from 10, would wait for step 90) are left out after four slow steps, at s = 2, the
    smallest s that leaves both out: at an onset the windows are full, so the smallest s is
    taken within the regular margin of the best, not early_gain's (which took s = 1 there, and
    the run stayed at it for 31 steps). Steady steps and a mild slowdown are no onset."""
    opts = {"first": 10, "every": 20, "cooldown": 20, "s_start": 0, "s_max": 2, "tau": 0.1,
            "raise_to": "smallest", "staleness_cost": 0.05, "early_gain": 1.0}
    rule = AutoStragglers("pgc-cr", 4, opts)
    mild = AutoStragglers("pgc-cr", 4, opts)
    noise = lambda r, t: 0.02 * ((r + t) % 3)   # noqa: E731
    for t in range(75):
        feed(rule, noise, 1, start=t, tau=0.1)
        feed(mild, noise, 1, start=t, tau=0.1)
        assert rule.decide(t + 1) is None and mild.decide(t + 1) is None
    assert not any(rule.early(t) for t in range(10, 76)) and rule.s == 0
    switched = []
    for t in range(75, 90):
        feed(rule, lambda r, t: 0.4 if r in (1, 3) else noise(r, t), 1, start=t, tau=0.1)
        feed(mild, lambda r, t: 0.1 if r in (1, 3) else noise(r, t), 1, start=t, tau=0.1)
        sw = rule.decide(t + 1)
        switched += [sw] if sw is not None else []
        assert not mild.early(t + 1) and (t + 1 == 90 or mild.decide(t + 1) is None)
    assert [(sw.step, sw.old, sw.new) for sw in switched] == [(75 + 4, 0, 2)], rule.last_predictions
    assert "onset" in switched[0].reason


def test_an_early_raise_takes_the_smallest_s_within_early_gain_of_the_best():
    """One sample per rank: fast ranks 0.10 / 0.13 / 0.16 s, one 0.42 s. s = 3 is predicted the
    best, 60% above s = 1: a regular boundary (8%) takes s = 3, an early one (few samples
    cannot tell s = 1 from s = 3 by their spread) the smallest s within early_gain of the best,
    s = 1 (the runtime's slow-rank smoke took s = 3 at step 2 and paid its deeper ring's steps)."""
    busy = [0.10, 0.13, 0.16, 0.42]
    opts = {"s_start": 0, "s_max": 3, "tau": 0.1, "raise_to": "smallest", "staleness_cost": 0.0,
            "round_cost": 0.0}
    early = AutoStragglers("pgc-cr", 4, {**opts, "first": 10, "every": 20, "early_gain": 1.0})
    regular = AutoStragglers("pgc-cr", 4, {**opts, "first": 1, "every": 20})
    for rule in (early, regular):
        for r, b in enumerate(busy):
            rule.observe(r, b, 1)
    assert early.decide(1).new == 1 and regular.decide(1).new == 3


def test_lower_gain_keeps_cheap_redundancy():
    """No stragglers at n = 12: s = 0 is predicted a little better than the start s = 1 (the
    staleness tie-break), so the rule drops to 0 at step 1 (the simulator's transient pattern:
    the burst then finds s = 0); with lower_gain 5% the cheap s = 1 is kept as insurance, and
    a slow rank still raises s."""
    opts = {"tau": 1.0, "s_max": 3}
    drop, keep = (AutoStragglers("pgc-cr", 12, {**opts, **o}) for o in ({}, {"lower_gain": 0.05}))
    for rule in (drop, keep):
        feed(rule, lambda r, t: 0.0, 1)
    sw = drop.decide(1)
    assert sw is not None and (sw.old, sw.new) == (1, 0) and 0 <= sw.gain < 0.05
    assert keep.decide(1) is None and keep.s == 1
    feed(keep, lambda r, t: 4.0 if r in (3, 7) else 0.0, 4, start=1)
    assert keep.decide(12).new >= 2


def test_memory_is_bounded():
    rule = AutoStragglers("pgc-cr", 4, {"every": 5, "window": 8, "tau": 1.0})
    feed(rule, lambda r, t: 0.0, 500)
    assert rule.stats.counts() == [8] * 4 and len(rule.stats.step_times) == 8
    for t in range(5, 5000, 5):
        rule.decide(t)
    assert len(rule.switches) <= 64


def test_tau_estimated_from_the_smallest_step():
    rule = AutoStragglers("pgc-cr", 3, {"every": 2, "min_samples": 2})
    for r, secs in enumerate([0.5, 0.7, 0.9]):
        rule.observe(r, secs, 1)
        rule.observe(r, secs + 0.1, 1)
    assert rule.stats.tau == pytest.approx(0.5)
    assert rule.stats.delays()[2] == pytest.approx([0.4, 0.5])


@pytest.mark.parametrize("n, opts, message", [
    (12, {"s_max": 12}, "s_max <= 11"),
    (4, {"s_max": 7}, "s <= n - 1 = 3"),
    (4, {"s_start": 3, "s_max": 2}, "s_start"),
    (4, {"every": 0}, "every must be an int >= 1"),
    (4, {"bogus": 1}, "unknown stragglers='auto' options"),
    (4, {"min_samples": 40, "window": 8}, "exceeds"),
    (4, {"early_gain": -0.5}, "early_gain must be a fraction >= 0"),
    (4, {"lower_gain": -0.1}, "lower_gain must be a fraction >= 0"),
    (4, {"early_gain": "big"}, "early_gain must be a fraction >= 0"),
])
def test_refused_before_anything_runs(n, opts, message):
    with pytest.raises(ValueError, match=message):
        AutoStragglers("pgc-cr", n, opts)


def test_refused_for_a_scheme_that_waits_for_all():
    with pytest.raises(ValueError, match="tolerates no stragglers"):
        AutoStragglers("dgd", 4)


def test_default_budget_range():
    assert AutoConfig().budget_range("pgc-cr", 100) == (1, 25)
    assert AutoConfig().budget_range("pgc-cr", 2) == (1, 1)
    assert AutoConfig(s_start=0).budget_range("bcgc", 12) == (0, 3)
