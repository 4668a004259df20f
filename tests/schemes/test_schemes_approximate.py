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
    scheme = get_scheme("bounded-staleness", n, s, r=2, c=c, shard_sizes=[1, 1, 1, 5],
                        replay="mean")   # the design note's rule: the whole table every step
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


def _drive(scheme, events):
    """Feed ``events`` = [(worker, lag)] to ``scheme`` as an engine would: the arrival of worker
    for step max(0, t - lag) (each (worker, step) once), then poll the next rounds; returns the
    decisions in order."""
    t, rnd, sent, out = 0, scheme.open_round(0), set(), []
    for worker, lag in events:
        step = max(0, t - lag)
        if (worker, step) in sent:
            continue
        sent.add((worker, step))
        d = rnd.offer(Arrival(worker, step, step, None))
        while d is not None:
            out.append(d)
            t += 1
            rnd = scheme.open_round(t)
            d = rnd.poll()
    return out


_events = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 4)), min_size=1, max_size=120)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.integers(1, 5), st.data())
def test_bounded_staleness_once_counts_every_gradient_once(n, c, data):
    """replay="once" (the remedy under momentum): a gradient's total weight over its uses is its shard's
    weight w_i, every update has at least m = ``min_fresh`` new gradients (default n - s),
    every entry is younger than c."""
    r = data.draw(st.integers(1, n))
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    m = data.draw(st.one_of(st.none(), st.integers(1, n)))
    scheme = get_scheme("bounded-staleness", n, 1, r=r, c=c, shard_sizes=sizes, min_fresh=m,
                        replay="once")
    assert scheme.replay == "once" and scheme.min_fresh == (n - 1 if m is None else m)
    events = [(w % n, lag) for w, lag in data.draw(_events)]
    total: dict = {}
    for d in _drive(scheme, events):
        assert d.info["n_fresh"] == len(d.uses) >= scheme.min_fresh
        assert d.info["max_age"] < c and d.info["table_max_age"] < c
        for u in d.uses:
            total[(u.worker, u.step)] = total.get((u.worker, u.step), 0.0) + u.weight
    for (w, step), tot in total.items():
        assert tot == pytest.approx(scheme.shard_weights[scheme.shard_of(w, step)])


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(1, 5), st.data())
def test_bounded_staleness_weightings_fire_as_the_note_and_bound_the_weights(n, c, data):
    """"mean" (the note's rule), "age" and "split" fire at the same steps (every entry younger
    than c, from the table alone); "split" keeps a gradient's total at most w_i, "age" weights
    w_i / (1 + age); "once" fires at a subset of those moments (never a pure replay)."""
    r = data.draw(st.integers(1, n))
    events = [(w % n, lag) for w, lag in data.draw(_events)]
    runs = {m: _drive(get_scheme("bounded-staleness", n, 1, r=r, c=c, replay=m), events)
            for m in ("mean", "age", "split")}
    key = [(d.step, tuple((u.worker, u.step) for u in d.uses)) for d in runs["mean"]]
    for m in ("age", "split"):
        assert [(d.step, tuple((u.worker, u.step) for u in d.uses)) for d in runs[m]] == key
    total: dict = {}
    for d in runs["split"]:
        for u in d.uses:
            total[(u.worker, u.step)] = total.get((u.worker, u.step), 0.0) + u.weight
    assert all(v <= 1.0 / n + 1e-12 for v in total.values())
    for d in runs["age"]:
        for u in d.uses:
            assert u.weight == pytest.approx(1.0 / n / (1 + d.step - u.version))


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.integers(1, 5), st.floats(0.0, 1.0), st.data())
def test_bounded_staleness_once_with_decay_weights_by_age_at_the_one_use(n, c, rho, data):
    """``decay`` = rho: a gradient enters one update, with weight w_i rho^a (a its age then),
    so its total is at most w_i; the updates fire at the same moments as without decay."""
    r = data.draw(st.integers(1, n))
    events = [(w % n, lag) for w, lag in data.draw(_events)]
    m = data.draw(st.integers(1, n))
    plain = _drive(get_scheme("bounded-staleness", n, 1, r=r, c=c, min_fresh=m, replay="once"),
                   events)
    decayed = _drive(get_scheme("bounded-staleness", n, 1, r=r, c=c, decay=rho, min_fresh=m,
                                replay="once"), events)
    assert [(d.step, [(u.worker, u.step) for u in d.uses]) for d in decayed] == \
        [(d.step, [(u.worker, u.step) for u in d.uses]) for d in plain]
    for d in decayed:
        for u in d.uses:
            assert u.weight == pytest.approx(rho ** (d.step - u.version) / n)
    with pytest.raises(ValueError, match="decay"):
        get_scheme("bounded-staleness", n, 1, decay=1.5)


def test_bounded_staleness_once_equals_the_mean_without_staleness():
    """c = 1 (every entry must be fresh: all n arrivals of step t): the default's update is
    the note's, the exact average."""
    n = 6
    g = np.random.default_rng(1).standard_normal((n, 3))
    for mode in ("once", "mean"):
        scheme = get_scheme("bounded-staleness", n, 1, r=2, c=1, replay=mode)
        for t in range(3):
            arrivals = [Arrival(j, t, t, g[scheme.shard_of(j, t)]) for j in range(n)]
            rnd = scheme.open_round(t)
            ds = [rnd.offer(a) for a in arrivals]
            assert ds[-1] is not None and all(d is None for d in ds[:-1])
            assert np.allclose(rnd.combine(), g.mean(axis=0))


def test_bounded_staleness_once_does_not_replay():
    """The note's rule fires step 1 from step 0's table alone (a pure replay); "once" waits for
    m new gradients (here m = 1) and uses only those, each with its own weight; the default m
    is n - s."""
    n = 4
    g = np.eye(n)
    assert get_scheme("bounded-staleness", n, 1).replay == "mean"     # the constructor: the note's
    assert get_scheme("bounded-staleness", n, 1).min_fresh == n - 1
    assert get_scheme("bounded-staleness", n, 2).min_fresh == n - 2
    with pytest.raises(ValueError, match="min_fresh"):
        get_scheme("bounded-staleness", n, 1, min_fresh=n + 1)
    scheme = get_scheme("bounded-staleness", n, 1, r=2, c=2, min_fresh=1, replay="once")
    rnd = scheme.open_round(0)
    for j in range(n):
        d0 = rnd.offer(Arrival(j, 0, 0, g[scheme.shard_of(j, 0)]))
    assert d0 is not None and d0.info["n_fresh"] == n and d0.info["replayed"] == 0
    rnd1 = scheme.open_round(1)
    assert rnd1.poll() is None
    d1 = rnd1.offer(Arrival(0, 1, 1, g[scheme.shard_of(0, 1)]))
    assert d1 is not None and [(u.worker, u.step) for u in d1.uses] == [(0, 1)]
    assert d1.info["replayed"] == n - 1 and d1.info["weight_sum"] == pytest.approx(1 / n)
    assert np.allclose(rnd1.combine(), g[scheme.shard_of(0, 1)] / n)
    with pytest.raises(ValueError, match="replay"):
        get_scheme("bounded-staleness", n, 1, replay="twice")


def test_bounded_staleness_waits_for_n_minus_s_new_gradients_not_for_the_straggler():
    """replay="once", default m = n - s: step 1 fires at the (n - s)-th new gradient while worker n - 1 is
    still out; its late gradient (age 1 < c) is counted at step 2, once."""
    n, s = 5, 1
    scheme = get_scheme("bounded-staleness", n, s, r=2, c=3, replay="once")
    rnd = scheme.open_round(0)
    for j in range(n):
        d = rnd.offer(Arrival(j, 0, 0, None))
    assert d is not None
    rnd = scheme.open_round(1)
    ds = [rnd.offer(Arrival(j, 1, 1, None)) for j in range(n - 1)]
    assert ds[-1] is not None and all(x is None for x in ds[:-1])
    assert sorted(u.worker for u in ds[-1].uses) == list(range(n - 1))
    rnd = scheme.open_round(2)
    assert rnd.offer(Arrival(n - 1, 1, 1, None)) is None       # 1 new < m
    # step 2: worker j evaluates shard j; the late gradient is shard 0's (worker 4 at step 1),
    # so workers 1, 2, 3 bring the other m - 1 new ones
    assert scheme.shard_of(n - 1, 1) == 0
    ds = [rnd.offer(Arrival(j, 2, 2, None)) for j in range(1, n - 1)]
    d2 = ds[-1]
    assert d2 is not None and (n - 1, 1) in {(u.worker, u.step) for u in d2.uses}
    assert d2.info["max_age"] == 1 and d2.info["n_fresh"] == n - 1


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.integers(1, 5), st.data())
def test_bounded_staleness_engines_default_fires_on_the_current_model_and_takes_the_mean(n, c,
                                                                                         data):
    """The engines' default (replay="once", fire="current", normalize=True): every update has
    at least m gradients of the model it updates (age 0), uses each gradient once, keeps every
    age below c, and its weights are the shard weights of the new entries scaled to sum 1."""
    r = data.draw(st.integers(1, n))
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    m = data.draw(st.integers(1, n))
    scheme = get_scheme("bounded-staleness", n, 1, r=r, c=c, shard_sizes=sizes, min_fresh=m,
                        replay="once", fire="current", normalize=True)
    events = [(w % n, lag) for w, lag in data.draw(_events)]
    seen = set()
    for d in _drive(scheme, events):
        ages = [d.step - u.version for u in d.uses]
        assert sum(a == 0 for a in ages) == d.info["n_current"] >= m
        assert max(ages) < c and d.info["table_max_age"] < c
        assert sum(u.weight for u in d.uses) == pytest.approx(1.0)
        raw = [scheme.shard_weights[scheme.shard_of(u.worker, u.step)] for u in d.uses]
        assert d.info["fresh_share"] == pytest.approx(sum(raw))
        for u, w in zip(d.uses, raw):
            assert u.weight == pytest.approx(w / sum(raw))
            assert (u.worker, u.step) not in seen
            seen.add((u.worker, u.step))


def test_bounded_staleness_current_waits_for_the_models_gradients_and_folds_the_late_one_in():
    """fire="current", normalize=True, n = 5, s = 1: step 1 fires at the 4th gradient of model
    1; at step 2 worker 4's late gradient of model 1 (shard 0) and three of model 2 are 4 new
    entries but only 3 of the current model, so the step waits for a 4th of model 2
    (fire="new" fires there), then uses all 5, each with weight 1/5."""
    n, s = 5, 1
    scheme = get_scheme("bounded-staleness", n, s, r=2, c=3, replay="once", fire="current",
                        normalize=True)
    old = get_scheme("bounded-staleness", n, s, r=2, c=3, replay="once")
    firsts = []
    for sch in (scheme, old):
        rnd = sch.open_round(0)
        for j in range(n):
            d = rnd.offer(Arrival(j, 0, 0, None))
        rnd = sch.open_round(1)
        ds = [rnd.offer(Arrival(j, 1, 1, None)) for j in range(n - 1)]
        assert ds[-1] is not None and all(x is None for x in ds[:-1])
        firsts.append(ds[-1].info["weight_sum"])
    assert firsts == [pytest.approx(1.0), pytest.approx((n - 1) / n)]   # the mean; w_i each
    rnd, rnd_old = scheme.open_round(2), old.open_round(2)
    assert rnd.offer(Arrival(n - 1, 1, 1, None)) is None
    assert rnd_old.offer(Arrival(n - 1, 1, 1, None)) is None
    for j in range(1, n - 1):
        d, d_old = rnd.offer(Arrival(j, 2, 2, None)), rnd_old.offer(Arrival(j, 2, 2, None))
    assert d is None and d_old is not None            # 3 of model 2: "new" fires, not "current"
    d = rnd.offer(Arrival(n - 1, 2, 2, None))         # shard 4 (worker 0's would replace shard 0)
    assert d is not None and d.info["n_current"] == n - 1 and len(d.uses) == n
    assert all(u.weight == pytest.approx(1 / n) for u in d.uses) and d.info["max_age"] == 1
    for bad, match in (({"fire": "late"}, "fire"), ({"normalize": "maybe"}, "normalize")):
        with pytest.raises(ValueError, match=match):
            get_scheme("bounded-staleness", n, s, replay="once", **bad)
    assert get_scheme("bounded-staleness", n, s, normalize="true").normalize is True
    assert get_scheme("bounded-staleness", n, s).fire == "new"      # the constructor's default


def test_bounded_staleness_keeps_the_newest_version():
    scheme = get_scheme("bounded-staleness", 3, 0, r=1, c=5)
    rnd = scheme.open_round(3)
    rnd.offer(Arrival(0, 3, 3, np.ones(1)))
    rnd.offer(Arrival(0, 2, 2, np.zeros(1)))     # older version of shard 0: ignored
    assert scheme.table[0][2] == 3


# -- PGC-CR with the ring weighted by age (decay rho) ------------------------------------------

def _steady_rings(scheme, t, static=False, seed=3, dim=4):
    """Every worker's ring after steps 0..t-1 with no straggler, and step t's arrivals."""
    from scheme_test_helpers import GradientTable, Rings
    grads = GradientTable(scheme.n, dim, np.random.default_rng(seed), static=static)
    rings = Rings(scheme, grads)
    for step in range(t):
        for w in range(scheme.n):
            rings.compute(w, step)
    return grads, {w: rings.compute(w, t) for w in range(scheme.n)}


@settings(max_examples=25, deadline=None)
@given(st.integers(3, 8), st.data())
def test_pgc_cr_decay_unbiased_for_the_age_weighted_average(n, data):
    # E over straggler sets of g^ = (1/(n W)) sum_k sum_{a<c} rho^a g_k^(t-a), W = sum_a rho^a:
    # partition k is evaluated at t, t-1, ..., t-c+1 by its c holders (one each), and each
    # holder's message weights its slot of age a by rho^a.
    s = data.draw(st.integers(1, n - 1))
    rho = data.draw(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]))
    c, t = s + 1, 2 * (s + 1) + 1
    scheme = get_scheme("pgc-cr", n, s, decay=rho)
    grads, arrivals = _steady_rings(scheme, t)
    W = sum(rho ** a for a in range(c))
    want = sum(rho ** a * grads(k, t - a) for k in range(n) for a in range(c)) / (n * W)
    total, count = 0.0, 0
    for stragglers in itertools.combinations(range(n), s):
        rnd = scheme.open_round(t)
        d = None
        for j in range(n):
            if j not in stragglers:
                d = rnd.offer(arrivals[j]) or d
        total = total + rnd.combine(d)
        count += 1
        if rho < 1:
            ages = [a for a in range(c)]
            assert d.info["mean_age"] == pytest.approx(
                sum(rho ** a * a for a in ages) / W, abs=1e-12)
            assert d.info["max_age"] == c - 1
    assert np.allclose(total / count, want, atol=1e-10)


def test_pgc_cr_decay_one_is_the_paper_scheme_and_zero_keeps_only_fresh_gradients():
    n, s, t = 12, 3, 9
    paper, one = get_scheme("pgc-cr", n, s), get_scheme("pgc-cr", n, s, decay=1.0)
    for w in range(n):
        for step in range(6):
            assert one.work_plan(w, step) == paper.work_plan(w, step)
    zero = get_scheme("pgc-cr", n, s, decay=0.0)
    grads, arrivals = _steady_rings(zero, t)
    order = [4, 0, 7, 11, 2, 9, 5, 1, 3, 6, 8, 10]
    d = zero.decide(t, [arrivals[j] for j in order])
    used = order[: n - s]
    fresh = [zero.work_plan(j, t).evaluate[0][0] for j in used]
    assert np.allclose(d.combine({j: arrivals[j].message for j in used}),
                       sum(grads(k, t) for k in fresh) / (n - s))
    assert d.info["mean_age"] == 0.0
    # warm-up (step 0): every slot fresh, the message still sums to W times a gradient
    half = get_scheme("pgc-cr", n, s, decay=0.5)
    assert sum(coef for _, coef in half.work_plan(3, 0).combine) == pytest.approx(1.875)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_pgc_cr_decay_out_of_range_is_refused(bad):
    with pytest.raises(ValueError, match="decay must be in"):
        get_scheme("pgc-cr", 6, 1, decay=bad)


def test_a_decisions_diagnostics_are_cached_by_its_uses_and_never_shared():
    """The effective coefficients of a decision (weights, alphas, per-partition sums) are a
    function of the used messages' entries and weights, cached by them: the same values as
    computed afresh, and every decision gets its own dict."""
    scheme = get_scheme("pgc-cr", 5, 2)
    infos = []
    for t in range(12):          # the ring's rotation repeats the uses' entries
        order = [(t + j) % 5 for j in range(5)]
        d = scheme.decide(t, [Arrival(j, t, t, None) for j in order])
        fresh = scheme._coefficients(d.uses, [scheme.message_entries(u.worker, u.step)
                                               for u in d.uses])
        assert {k: d.info[k] for k in fresh} == fresh
        infos.append(d.info)
    assert len({id(i) for i in infos}) == len(infos)
    infos[0]["weight_min"] = -1.0
    again = scheme.decide(0, [Arrival(j, 0, 0, None) for j in range(5)])
    assert again.info["weight_min"] != -1.0
