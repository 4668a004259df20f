"""The control rule's state machine: quiet, trigger, hysteresis, actuators."""

import math

import pytest
import torch

from pgc_hvd.control.rule import (CThenLrActuator, ControlConfig, ControlRule, LrActuator,
                                  SchemeCActuator, actuate, adaptive_default, make_actuator)
from pgc_hvd.schemes import get_scheme


def feed(rule, values, start=0):
    acts = []
    for i, v in enumerate(values):
        a = rule.observe(start + i, v)
        if a is not None:
            acts.append(a)
    return acts


def test_quiet_on_small_ratios():
    rule = ControlRule(ControlConfig(high=1.0, low=0.25, window=5))
    assert feed(rule, [0.01, 0.5, 0.9, 0.2] * 25) == []
    assert rule.level == 0


def test_single_spike_does_not_trigger_but_sustained_does():
    rule = ControlRule(ControlConfig(high=1.0, low=0.25, window=5))
    assert feed(rule, [0.01, 0.01, 50.0, 0.01, 0.01, 0.01]) == []
    acts = feed(rule, [3.0] * 5, start=10)
    assert len(acts) == 1 and acts[0].direction == "lower" and rule.level == 1
    assert "> high" in acts[0].reason and acts[0].signal > 1.0


def test_hysteresis_band_holds_level_then_raises_after_patience():
    cfg = ControlConfig(high=1.0, low=0.25, window=3, patience=6)
    rule = ControlRule(cfg)
    feed(rule, [5.0] * 3)
    assert rule.level == 1
    # inside the band (low <= rho <= high): neither lower nor raise, however long
    assert feed(rule, [0.6] * 40, start=10) == []
    assert rule.level == 1
    # below low: raise only after `patience` consecutive observations
    acts = feed(rule, [0.1] * (cfg.patience - 1), start=100)
    assert acts == [] and rule.level == 1
    acts = feed(rule, [0.1], start=200)
    assert [a.direction for a in acts] == ["raise"] and rule.level == 0
    # at level 0 it never raises further
    assert feed(rule, [0.0] * 50, start=300) == []


def test_nonfinite_loss_lowers_at_once_and_max_level():
    rule = ControlRule(ControlConfig(max_level=2))
    a = rule.observe(0, None, loss=float("nan"))
    assert a.direction == "lower" and "non-finite" in a.reason
    rule.observe(1, math.inf)
    assert rule.level == 2
    assert rule.observe(2, math.inf) is None and rule.level == 2


def test_config_validation():
    with pytest.raises(ValueError):
        ControlConfig.from_options({"low": 2, "high": 1})
    with pytest.raises(ValueError):
        ControlConfig.from_options({"bogus": 1})
    cfg = ControlConfig.from_options({"high": "2", "window": "4", "knob": "lr"})
    assert cfg.high == 2.0 and cfg.window == 4 and cfg.knob == "lr"


def test_actuators():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.8)
    lr = LrActuator(opt, 0.5)
    assert lr.set_level(2) == (0.8, pytest.approx(0.2))
    assert lr.set_level(0)[1] == pytest.approx(0.8)
    sch = get_scheme("bounded-staleness", 8, 1, r=2, c=8)
    c = SchemeCActuator(sch, 0.5)
    assert c.set_level(1) == (8, 4) and sch.staleness_bound == 4
    assert c.set_level(5)[1] == 1
    assert c.set_level(0)[1] == 8


def test_adaptive_default_only_for_stale_schemes():
    assert adaptive_default("bounded-staleness", True)
    assert adaptive_default("pgc-cr", True)
    assert not adaptive_default("pgc-cr", False)
    for exact in ("dgd", "gc-cr", "bcgc", "gc-fr"):
        assert not adaptive_default(exact, True)


def test_loss_trend_gate_separates_stale_oscillation_from_divergence():
    cfg = ControlConfig(high=1.0, low=0.25, window=5, growth=0.5, trend_window=8)
    # healthy but stale: rho stays high, the loss oscillates with period ~c (up to 2x inside a
    # period) while its window mean decreases -> no change
    rule = ControlRule(cfg)
    osc = [2.0 * 0.98 ** t * (1.5 + 0.5 * math.sin(2 * math.pi * t / 8)) for t in range(120)]
    assert [rule.observe(t, 3.0, loss=l) for t, l in enumerate(osc)] == [None] * 120
    assert rule.level == 0
    # the same rho with a growing envelope -> lower, and the reason names both conditions
    rule = ControlRule(cfg)
    grow = [2.0 * 1.2 ** t for t in range(20)]
    acts = [a for a in (rule.observe(t, 3.0, loss=l) for t, l in enumerate(grow)) if a]
    assert acts and acts[0].direction == "lower" and "loss trend" in acts[0].reason
    # gate off (growth < 0): rho alone lowers the healthy run too (the note's literal rule)
    rule = ControlRule(dataclasses_replace(cfg, growth=-1.0))
    assert any(rule.observe(t, 3.0, loss=l) for t, l in enumerate(osc))


def dataclasses_replace(cfg, **kw):
    import dataclasses
    return dataclasses.replace(cfg, **kw)


def test_on_update_arity_detection():
    """The runtime passes the decision only to callbacks that take three positional arguments;
    two-argument on_update callbacks keep working."""
    from pgc_hvd.runtime.config import takes_three as _takes_three

    class C:
        def two(self, step, flat): ...
        def three(self, step, flat, decision=None): ...
    assert not _takes_three(lambda step, flat: None)
    assert not _takes_three(C().two)
    assert _takes_three(C().three)
    assert _takes_three(lambda *a: None)
    assert _takes_three(lambda step, flat, decision: None)


def test_c_actuator_applies_through_the_engine_hook_and_binding_follows_the_knob():
    sch = get_scheme("bounded-staleness", 8, 1, r=2, c=8)
    seen = []
    c = SchemeCActuator(sch, 0.5, apply=seen.append)
    assert c.set_level(2) == (8, 2) and seen == [2]
    assert sch.staleness_bound == 8 and c.value() == 2   # the engine applies it (runtime: next control round)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.8)
    assert isinstance(make_actuator("auto", sch, opt, 0.5), CThenLrActuator)
    assert isinstance(make_actuator("c", sch, opt, 0.5), SchemeCActuator)
    assert isinstance(make_actuator("lr", sch, opt, 0.5), LrActuator)
    pgc = get_scheme("pgc-cr", 8, 1)
    assert isinstance(make_actuator("auto", pgc, opt, 0.5), LrActuator)
    with pytest.raises(ValueError, match="fixed by the code"):
        make_actuator("c", pgc, opt, 0.5)
    with pytest.raises(ValueError, match="knob"):
        make_actuator("speed", sch, opt, 0.5)


def test_actuate_withdraws_a_lowering_of_c_at_its_floor():
    sch = get_scheme("bounded-staleness", 8, 1, r=2, c=2)
    rule = ControlRule(ControlConfig(high=1.0, low=0.25, window=1, growth=0.0, trend_window=1))
    act_c = SchemeCActuator(sch, 0.5)
    fired = []
    for step in range(12):   # a sustained divergence: rho and the loss grow
        a = actuate(rule, act_c, rule.observe(step, 10.0 * (step + 1), float(step + 1)))
        if a is not None:
            fired.append(a)
    assert [(a.knob, a.old, a.new) for a in fired] == [("c", 2, 1)]
    assert sch.staleness_bound == 1 and rule.level == 1 and len(rule.actions) == 1


def test_auto_knob_lowers_c_to_its_floor_then_lr_and_raises_back_in_reverse():
    sch = get_scheme("bounded-staleness", 8, 1, r=2, c=4)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.8)
    act = make_actuator("auto", sch, opt, 0.5)
    assert act.c_levels == 2                                   # 4 -> 2 -> 1
    moves = [(act.set_level(lvl), act.last_knob) for lvl in (1, 2, 3, 4, 3, 2, 1, 0)]
    assert [k for _, k in moves] == ["c", "c", "lr", "lr", "lr", "lr", "c", "c"]
    assert [m[0] for m in moves][:4] == [(4, 2), (2, 1), (0.8, 0.4), (0.4, 0.2)]
    assert sch.staleness_bound == 4 and opt.param_groups[0]["lr"] == 0.8
    # through the rule: a sustained divergence walks down c, then lr, never withdrawn
    sch2 = get_scheme("bounded-staleness", 8, 1, r=2, c=2)
    opt2 = torch.optim.SGD([p], lr=0.8)
    rule = ControlRule(ControlConfig(high=1.0, low=0.25, window=1, growth=0.0, trend_window=1,
                                     max_level=3))
    a2 = make_actuator("auto", sch2, opt2, 0.5)
    fired = [a for a in (actuate(rule, a2, rule.observe(t, 10.0 * (t + 1), float(t + 1)))
                         for t in range(12)) if a is not None]
    assert [(a.knob, a.old, a.new) for a in fired] == [("c", 2, 1), ("lr", 0.8, 0.4),
                                                        ("lr", 0.4, 0.2)]
