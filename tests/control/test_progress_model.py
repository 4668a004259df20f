"""The expected-progress-per-second model that advise and stragglers='auto' share."""

import math

import numpy as np
import pytest

from pgc_hvd.control.progress_model import (continue_time, fit_staleness_cost,
                                            measured_staleness_cost, order_statistic_time,
                                            predict, progress_per_step, rank, step_partitions,
                                            step_time, time_per_step)


def test_partitions_per_step_from_the_scheme():
    assert step_partitions("pgc-cr", 12, 3) == 1          # one new partition, ring of c = 4
    assert step_partitions("gc-cr", 12, 3) == 4           # c = s + 1 partitions every step
    assert step_partitions("bcgc", 12, 1) == 2
    assert step_partitions("is-sgd", 12, 2) == 1
    assert step_partitions("pgc-cr", 12, 0) == 1


def test_progress_per_step_staleness_effect():
    assert progress_per_step("gc-cr", 3) == 1.0
    assert progress_per_step("pgc-cr", 0) == 1.0
    assert progress_per_step("pgc-cr", 2, staleness_cost=0.5) == pytest.approx(0.5)
    assert measured_staleness_cost("pgc-cr", 2, 300, 100) == pytest.approx(1.0)
    assert measured_staleness_cost("gc-cr", 2, 300, 100) is None


def test_staleness_cost_fitted_through_the_origin():
    """lambda from (s, steps, exact steps) of several seeds: the least-squares slope of
    steps / exact - 1 against s; points with a run that missed the target are left out."""
    pts = [(0, 100, 100), (1, 110, 100), (2, 120, 100), (3, 130, 100), (2, None, 100)]
    assert fit_staleness_cost(pts) == pytest.approx(0.1)
    # s = 1 costs 0.1, s = 3 costs 0.3 and 0.9 over two seeds: (1*0.1 + 3*0.3 + 3*0.9) / 19
    pts = [(1, 110, 100), (3, 130, 100), (3, 190, 100)]
    assert fit_staleness_cost(pts) == pytest.approx(3.7 / 19)
    assert fit_staleness_cost([(1, 90, 100)]) == 0.0           # never below 0
    assert fit_staleness_cost([(0, 100, 100), (1, None, 100)]) is None


def test_order_statistic_matches_exponential_closed_form():
    # n ranks, D ~ Exp(1): E[max] = H_n, E[(n-1)-th] = H_n - 1
    rng = np.random.default_rng(0)
    n = 8
    delays = [rng.exponential(1.0, 4000) for _ in range(n)]
    H = sum(1 / i for i in range(1, n + 1))
    assert time_per_step(delays, 1.0, 1, 0, draws=4000) == pytest.approx(1 + H, rel=0.04)
    assert time_per_step(delays, 1.0, 1, 1, draws=4000) == pytest.approx(H, rel=0.04)
    assert time_per_step(delays, 1.0, 2, 1, overhead=0.5, draws=4000) == \
        pytest.approx(2 + H - 1 + 0.5, rel=0.04)
    with pytest.raises(ValueError, match=r"\[0, n - 1\]"):
        time_per_step(delays, 1.0, 1, 8)


def test_continue_time_a_left_out_rank_finishes_its_step_and_starts_the_next_late():
    """Hand-checked chain (tau = 1, k = 1, n = 3, s = 1): step 0 finishes at 1, 2, 5 and fires
    at 2 (rank 2 busy until 5); step 1: ranks 0, 1 start at 2 and finish at 3, 7; rank 2
    starts at 5 and finishes at 6: fires at 6; step 2 (rank 1 busy until 7): 7, 8, 7 -> 7
    (``cancel`` would fire at 2, 4, 8). The mean time between fires after the warm-up row."""
    D = np.array([[0.0, 1.0, 4.0], [0.0, 4.0, 0.0], [0.0, 1.0, 0.0]])
    assert continue_time(D, 1.0, 1, 1) == pytest.approx((7 - 2) / 2)
    assert continue_time(D, 1.0, 1, 1, overhead=0.5) == pytest.approx((8.0 - 2.5) / 2)
    # s = 0: every rank in every step, the order statistic
    assert continue_time(D, 1.0, 1, 0) == order_statistic_time(D, 1.0, 1, 0)
    with pytest.raises(ValueError, match=r"\[0, n - 1\]"):
        continue_time(D, 1.0, 1, 3)
    with pytest.raises(ValueError, match="policy"):
        step_time(D, 1.0, 1, 1, policy="abandon")


def test_continue_costs_what_the_simulator_measured_under_exponential_delays():
    """n = 4, delays Exp(mean tau): s = 1 steps at 0.77x the s = 0 step when a left-out rank
    finishes its step (the simulator: 0.120 against 0.155 s, docs/benchmarks.md) and 0.68x
    when it stops at once (0.106 s); s = 2 at 0.64x and 0.52x (docs/control.md); slower than
    ``cancel`` at every s >= 1."""
    rng = np.random.default_rng(0)
    D = rng.exponential(0.05, size=(4096, 4))
    full = step_time(D, 0.05, 1, 0, policy="continue")
    assert step_time(D, 0.05, 1, 1, policy="continue") / full == pytest.approx(0.77, abs=0.02)
    assert step_time(D, 0.05, 1, 1, policy="cancel") / full == pytest.approx(0.68, abs=0.02)
    assert step_time(D, 0.05, 1, 2, policy="continue") / full == pytest.approx(0.64, abs=0.02)
    assert step_time(D, 0.05, 1, 2, policy="cancel") / full == pytest.approx(0.52, abs=0.02)
    gaps = [step_time(D, 0.05, 1, s, policy="continue") - step_time(D, 0.05, 1, s)
            for s in (1, 2, 3)]
    assert min(gaps) > 0.01, gaps
    p = predict("pgc-cr", 2, D.T.tolist(), 0.05, drawn=D, policy="continue")
    assert p.time_per_step == step_time(D, 0.05, 1, 2, policy="continue")


def test_deterministic_for_a_seed():
    delays = [[0.1, 0.5, 2.0]] * 5
    assert time_per_step(delays, 1, 1, 1, seed=3) == time_per_step(delays, 1, 1, 1, seed=3)


def test_ranking_persistent_slow_rank_against_none():
    n = 12
    slow = [[0.0] * 16 for _ in range(n)]
    slow[4] = [3.0] * 16                       # one rank 4x slow
    best = rank([("pgc-cr", s) for s in range(4)], slow, tau=1.0, staleness_cost=1.0)[0]
    assert best.s == 1 and best.time_per_step == pytest.approx(1.0)
    exact = rank([("gc-cr", s) for s in range(4)], slow, tau=1.0)
    assert exact[0].s == 1 and exact[0].time_per_step == pytest.approx(2.0)
    none = [[0.0] * 16 for _ in range(n)]
    assert rank([("pgc-cr", s) for s in range(4)], none, tau=1.0)[0].s == 0
    assert rank([("gc-cr", s) for s in range(4)], none, tau=1.0)[0].s == 0
    p = predict("pgc-cr", 0, slow, 1.0)
    assert p.rate == pytest.approx(1 / 4.0) and p.as_dict()["k"] == 1
    assert math.isinf(predict("pgc-cr", 0, none, 0.0).rate)
