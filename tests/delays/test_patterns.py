"""The named production straggler patterns: seeded, deterministic, the right mean and shape,
and readable by the spec parser both engines use."""

import numpy as np
import pytest

from pgc_hvd.delays import (PATTERNS, SpeedClasses, Transient, check_workers, from_dict,
                            parse_delay, pattern_model, pattern_spec)


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
