"""PGC-CR's unbiased estimator and bounded weights vs the naive design; IS-GC;
minimum-error decoding; bounded staleness's table and firing rule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.schemes import Arrival, get_scheme


def _stale_messages(n, s, rng, dim=3):
    """Ring contents with a different (stale) vector in every slot: x[j, l]."""
    x = rng.standard_normal((n, s + 1, dim))
    return x, {j: x[j].sum(axis=0) for j in range(n)}


def test_pgc_cr_unbiased_exact_enumeration():
    # eq. (2): E[g^] = (1/(nc)) sum_{i,j} g_i^{(s(t,i,j))}; straggler set uniform over C(n, s)
    n, s = 7, 2
    c = s + 1
    rng = np.random.default_rng(5)
    x, msgs = _stale_messages(n, s, rng)
    scheme = get_scheme("pgc-cr", n, s)
    total, count = 0.0, 0
    for stragglers in itertools.combinations(range(n), s):
        order = [j for j in range(n) if j not in stragglers]
        d = scheme.decide(4, [Arrival(j, 4, 4, msgs[j]) for j in order])
        total = total + d.combine(msgs)
        count += 1
    assert np.allclose(total / count, x.sum(axis=(0, 1)) / (n * c), atol=1e-12)


def test_pgc_cr_unbiased_monte_carlo():
    n, s = 12, 3
    c = s + 1
    rng = np.random.default_rng(11)
    x, msgs = _stale_messages(n, s, rng)
    scheme = get_scheme("pgc-cr", n, s)
    samples = []
    for _ in range(3000):
        order = rng.permutation(n)
        d = scheme.decide(1, [Arrival(int(j), 1, 1, None) for j in order])
        samples.append(d.combine(msgs))
    samples = np.array(samples)
    target = x.sum(axis=(0, 1)) / (n * c)
    stderr = samples.std(axis=0) / np.sqrt(len(samples))
    assert np.all(np.abs(samples.mean(axis=0) - target) < 5 * stderr + 1e-12)
    # and it is an estimator, not the exact value: single samples do differ
    assert np.abs(samples - target).max() > 10 * stderr.max()


def test_naive_pgc_cr_coefficients_explode_while_pgc_cr_stays_below_two():
    # PGC paper Fig. 6 / Sec. V-A: n = 12, c = 6; the paper saw |alpha| up to 7500
    n, c = 12, 6
    s = c - 1
    naive = get_scheme("pgc-cr-naive", n, s)
    pgc = get_scheme("pgc-cr", n, s)
    worst_naive, pgc_range = 0.0, (np.inf, -np.inf)
    for stragglers in itertools.combinations(range(n), s):
        arrivals = [Arrival(j, 7) for j in range(n) if j not in stragglers]
        dn = naive.decide(7, arrivals)
        assert dn.info["partition_weight_min"] == pytest.approx(1.0, abs=1e-6)   # sum_m alpha_{m,k} = 1
        worst_naive = max(worst_naive, dn.info["alpha_absmax"])
        dp = pgc.decide(7, arrivals)
        pgc_range = (min(pgc_range[0], dp.info["partition_weight_min"]),
                     max(pgc_range[1], dp.info["partition_weight_max"]))
    assert worst_naive > 100
    assert 0 <= pgc_range[0] and pgc_range[1] < 2


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 30), st.data())
def test_pgc_cr_partition_weights_in_0_2(n, data):
    s = data.draw(st.integers(0, n - 1))
    scheme = get_scheme("pgc-cr", n, s)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    d = scheme.decide(2, [Arrival(int(j), 2) for j in rng.permutation(n)])
    mu = (n - s) * (s + 1) / n
    assert d.info["weight_max"] == pytest.approx(1 / (n * mu))
    assert 0 <= d.info["partition_weight_min"] <= d.info["partition_weight_max"] < 2


def test_is_gc_keeps_disjoint_supports_and_rescales():
    n, s = 10, 3
    scheme = get_scheme("is-gc", n, s)           # c = 2: supports {i, i+1}
    order = [0, 1, 2, 5, 6, 8, 9]
    d = scheme.decide(0, [Arrival(j, 0) for j in order])
    assert d.workers == (0, 2, 5, 8)             # 1 overlaps 0, 6 overlaps 5, 9 overlaps 8/0
    assert d.info["covered"] == 8
    assert d.info["weight_max"] == pytest.approx(1 / 8)
    g = np.random.default_rng(0).standard_normal((n, 2))
    msgs = {j: g[j] + g[(j + 1) % n] for j in range(n)}
    covered = [0, 1, 2, 3, 5, 6, 8, 9]
    assert np.allclose(d.combine(msgs), g[covered].mean(axis=0))


def _topk(x, k=1):
    out = np.zeros_like(x)
    idx = np.argsort(-np.abs(x))[:k]
    out[idx] = x[idx]
    return out


@pytest.mark.parametrize("name,exact", [("bcgc", True), ("gfrc", False)])
def test_min_error_decoder_uses_partition_diversity(name, exact):
    # BCGC paper Example V.11(1): n=8, s=2, g0=(3,0), g1=(0,4), others 0, top-1 compression
    n, s = 8, 2
    g = np.zeros((n, 2))
    g[0], g[1] = (3, 0), (0, 4)
    scheme = get_scheme(name, n, s, decoder="min-error")
    arrivals = []
    for j in range(n):
        msg = sum(coef * g[p] for p, coef in scheme.work_plan(j, 0).message_partitions)
        comp = _topk(msg)
        arrivals.append(Arrival(j, 0, 0, comp, error_norm=float(np.linalg.norm(comp - msg))))
    # first n-s = 6 arrivals complete K_1 = {1,4,7} and K_0 = {0,3,6}; the decoder must pick
    order = [1, 4, 7, 0, 3, 6, 2, 5]
    d = scheme.decide(0, [arrivals[j] for j in order])
    assert d.info["n_arrived"] == n - s
    update = d.combine({a.worker: a.message for a in arrivals}) * n
    assert np.allclose(update, g.sum(axis=0)) == exact
    if name == "bcgc":
        assert d.info["group"] == 1 and d.info["class_error"] == 0.0
    else:
        assert d.info["class_error"] > 0
    with pytest.raises(ValueError, match="error_norm"):
        scheme.decide(0, [Arrival(j, 0) for j in range(n)])


def test_bounded_staleness_every_shard_evaluated_once_per_step():
    n, r = 7, 3
    scheme = get_scheme("bounded-staleness", n, 2, r=r)
    for t in range(6):
        shards = sorted(scheme.work_plan(j, t).partitions[0] for j in range(n))
        assert shards == list(range(n))
        for j in range(n):
            assert scheme.work_plan(j, t).partitions[0] in scheme.supports()[j]


def test_bounded_staleness_fires_only_when_every_shard_is_younger_than_c():
    n, s, c = 4, 1, 2
    scheme = get_scheme("bounded-staleness", n, s, r=2, c=c, shard_sizes=[1, 1, 1, 5])
    g = np.arange(4 * 2, dtype=float).reshape(4, 2)
    # step 0: everyone delivers
    rnd = scheme.open_round(0)
    ds = [rnd.offer(Arrival(j, 0, 0, g[scheme.shard_of(j, 0)])) for j in range(n)]
    d0 = [d for d in ds if d is not None]
    assert len(d0) == 1 and ds[-1] is d0[0]                      # fired at the last shard
    w = np.array([1, 1, 1, 5]) / 8
    assert np.allclose(rnd.combine(), (w[:, None] * g).sum(axis=0))
    # step 1: table entries have age 1 < c, so the round fires without any arrival
    rnd1 = scheme.open_round(1)
    assert rnd1.poll() is not None and rnd1.decision.info["max_age"] == 1
    # step 2: ages 2 = c: must wait until each shard is refreshed
    rnd2 = scheme.open_round(2)
    assert rnd2.poll() is None
    for j in range(n - 1):
        assert rnd2.offer(Arrival(j, 2, 2, g[scheme.shard_of(j, 2)])) is None
    # shards 0, 1, 2 are fresh; shard 3 (worker 3's at step 2) is missing. Worker 2's late
    # message for step 1 was shard 3 at version 1 (age 1 < c): it completes the table.
    assert [scheme.shard_of(j, 2) for j in range(n)] == [0, 1, 2, 3] and scheme.shard_of(2, 1) == 3
    d2 = rnd2.offer(Arrival(2, 1, 1, g[3]))
    assert d2 is not None
    assert {(u.worker, u.step, u.version) for u in d2.uses} == {(0, 2, 2), (1, 2, 2), (2, 2, 2), (2, 1, 1)}
    assert d2.info["table_max_age"] == 1 and d2.info["max_age"] == 1
    assert np.allclose(rnd2.combine(), (w[:, None] * g).sum(axis=0))


def test_bounded_staleness_keeps_the_newest_version():
    scheme = get_scheme("bounded-staleness", 3, 0, r=1, c=5)
    rnd = scheme.open_round(3)
    rnd.offer(Arrival(0, 3, 3, np.ones(1)))
    rnd.offer(Arrival(0, 2, 2, np.zeros(1)))     # older version of shard 0: ignored
    assert scheme.table[0][2] == 3
