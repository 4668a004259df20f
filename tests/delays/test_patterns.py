"""The named production straggler patterns: seeded, deterministic, the right mean and shape,
and readable by the spec parser both engines use."""

import math

import numpy as np
import pytest

from pgc_hvd.apps.tta import delay_spec
from pgc_hvd.delays import (PATTERN_ALIASES, PATTERNS, SpeedClasses, Transient, check_workers,
                            from_dict, parse_delay, pattern_model, pattern_name, pattern_spec)


@pytest.mark.parametrize("name", PATTERNS)
def test_pattern_spec_parses_deterministic_and_roundtrips(name):
    model = pattern_model(name, 12, compute=1.0, steps=200, seed=3)
    assert str(parse_delay(pattern_spec(name, 12, 1.0, 200, 3))) == str(model)
    a = model.matrix(12, 50)
    assert np.array_equal(a, pattern_model(name, 12, 1.0, 200, 3).matrix(12, 50))
    assert np.array_equal(a, from_dict(model.to_dict()).matrix(12, 50))
    assert (a >= 0).all()
    check_workers(model, 12)


def test_none_is_zero():
    assert not pattern_model("none", 8).matrix(8, 20).any()


def test_slow_rank_is_one_persistent_rank_4x():
    m = pattern_model("slow-rank", 12, compute=0.5, seed=5)
    d = m.matrix(12, 30)
    slow = 5 % 12
    assert np.all(d[:, slow] == 1.5)            # 3 x compute: the rank takes 4x a batch
    assert not np.delete(d, slow, axis=1).any()


def test_two_class_fixed_set_quarter_of_ranks():
    m = pattern_model("two-class", 32, compute=1.0, seed=1)
    d = m.matrix(32, 40)
    slow_cols = np.flatnonzero(d.any(axis=0))
    assert len(slow_cols) == 8 and set(slow_cols) == set(m.slow_workers())
    assert np.all(d[:, slow_cols] == 1.0)       # 2x compute, every step
    other = pattern_model("two-class", 32, compute=1.0, seed=2)
    assert set(other.slow_workers()) != set(m.slow_workers())
    assert len(pattern_model("two-class", 3).slow_workers()) == 1


def test_heavy_tail_pareto_alpha_2_5_mean_compute():
    m = pattern_model("heavy-tail", 100, compute=2.0, seed=0)
    assert m.shape == 2.5 and m.scale == pytest.approx(3.0)
    d = m.matrix(100, 400)
    assert d.mean() == pytest.approx(2.0, rel=0.05)
    # heavy tail: the 99.9th percentile of a Lomax(2.5) of mean 2 is ~46, an Exp(2)'s ~14
    assert np.quantile(d, 0.999) > 25
    assert np.median(d) < 1.0


def test_transient_comes_and_goes():
    m = pattern_model("transient", 12, compute=1.0, steps=200, seed=4)
    assert isinstance(m, Transient) and (m.start, m.stop) == (50, 120)
    d = m.matrix(12, 200)
    assert not d[:50].any() and not d[120:].any()
    mid = d[50:120]
    cols = np.flatnonzero(mid.any(axis=0))
    assert len(cols) == 2 and set(cols) == set(m.slow_workers()) and np.all(mid[:, cols] == 4.0)


def test_text_specs_and_checks():
    m = parse_delay("classes:12,count=3,delay=0.5,seed=2")
    assert isinstance(m, SpeedClasses) and m.n == 12 and m.count == 3
    t = parse_delay("transient:n=8,count=1,delay=2,start=10,stop=20")
    assert t.sample(0, 9) == 0 and sum(t.sample(w, 10) for w in range(8)) == 2.0
    with pytest.raises(ValueError, match="n=12"):
        check_workers(m, 16)
    with pytest.raises(ValueError, match="start <= stop"):
        Transient(8, 1, 1.0, start=5, stop=2)
    with pytest.raises(ValueError, match="unknown straggler pattern"):
        pattern_spec("bursty", 8)
    with pytest.raises(ValueError, match="n >= 2"):
        pattern_spec("none", 1)


def test_aliases_name_the_same_pattern_and_unknown_names_list_both():
    assert PATTERN_ALIASES == {"slow": "slow-rank", "pareto": "heavy-tail"}
    for alias, name in PATTERN_ALIASES.items():
        assert pattern_name(alias) == name and pattern_name(name) == name
        assert pattern_spec(alias, 4, 0.1, seed=2) == pattern_spec(name, 4, 0.1, seed=2)
    with pytest.raises(ValueError, match=r"known: none, exp, .* \(or slow for slow-rank"):
        pattern_name("bursty")


def test_exp_and_lognormal_scale_with_compute_and_zero_compute_is_none():
    assert pattern_spec("exp", 4, 0.1, seed=7) == "exp:mean=0.1,seed=7"
    m = pattern_model("lognormal", 4, compute=2.0, seed=1)
    d = m.matrix(4, 2000)
    assert np.median(d) == pytest.approx(0.6, rel=0.1)       # median 0.3 compute
    assert (d >= 20).mean() == pytest.approx(0.01, abs=0.005)  # 1% stragglers of 10-30 compute
    for name in PATTERNS:
        assert pattern_spec(name, 4, 0.0) == "none"
    with pytest.raises(ValueError, match="compute must be seconds >= 0"):
        pattern_spec("exp", 4, -1.0)


def test_the_recorded_figures_draw_the_same_delays():
    """The one table gives the delays the recorded figures were measured with: the main job's
    and ``time_to_accuracy``'s (``pgc_hvd.apps.tta.delay_spec``: seed + 1; ``slow`` is rank 1
    at seed 0) and ``ddp_tta``'s exp and pareto (the run's seed), bit for bit."""
    def same(a, b):
        return np.array_equal(parse_delay(a).matrix(4, 60), parse_delay(b).matrix(4, 60))
    assert delay_spec("exp", 4, 0.1, 0) == "exp:mean=0.1,seed=1"
    assert delay_spec("slow", 4, 0.1, 0) == f"slow:worker=1,delay={3 * 0.1}"
    assert same(delay_spec("lognormal", 4, 0.1, 2),
                f"lognormal:mu={math.log(0.3 * 0.1)},sigma=0.5,seed=3"
                f"+straggler:p=0.01,low={10 * 0.1},high={30 * 0.1},seed=3")
    assert delay_spec("none", 4, 0.1, 0) is None
    assert pattern_spec("exp", 4, 0.05, seed=2) == "exp:mean=0.05,seed=2"
    assert same(pattern_spec("pareto", 4, 0.05, seed=2),
                f"pareto:shape=2.5,scale={1.5 * 0.05},seed=2")
