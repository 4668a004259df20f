"""Every exact scheme returns the full average gradient when nothing is stale;
work plans follow the papers' rotation; decisions are deterministic and serialisable."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.schemes import SCHEMES, Arrival, get_scheme
from scheme_test_helpers import GradientTable, Rings, run_step

EXACT = ["dgd", "gc-fr", "gc-cr", "pgc-fr", "pgc-cr-naive", "bcgc", "gfrc", "gmds", "rs",
         "pgc-bcgc", "cyclic-mds"]
NEEDS_DIVISIBLE = {"gc-fr", "pgc-fr"}


@st.composite
def exact_case(draw):
    name = draw(st.sampled_from(EXACT))
    n = draw(st.integers(2, 20))
    if name in NEEDS_DIVISIBLE:
        s = draw(st.sampled_from([d - 1 for d in range(1, n + 1) if n % d == 0]))
    elif name == "dgd":
        s = 0
    else:
        s = draw(st.integers(0, n - 1))
    return name, n, s


@settings(max_examples=80, deadline=None)
@given(exact_case(), st.integers(0, 2**32 - 1))
def test_exact_schemes_recover_the_full_gradient_without_staleness(case, seed):
    name, n, s = case
    rng = np.random.default_rng(seed)
    scheme = get_scheme(name, n, s)
    assert scheme.exact
    grads = GradientTable(n, 4, rng, static=True)
    rings = Rings(scheme, grads)
    for step in range(4):
        order = list(rng.permutation(n)[: n - s])       # s stragglers never arrive
        d, update, _ = run_step(scheme, rings, step, order)
        assert d is not None, "an exact scheme must fire with n-s responders"
        assert set(d.workers) <= set(order)
        assert np.allclose(update, grads.average(step), rtol=1e-6, atol=1e-8)
        assert d.info["partition_weight_min"] == pytest.approx(1.0, abs=1e-6)
        assert d.info["partition_weight_max"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("name", ["pgc-fr", "pgc-cr", "pgc-cr-naive", "pgc-bcgc"])
def test_pipelined_work_plans_rotate_one_partition_per_step(name):
    n, s = 12, 2
    c = s + 1
    scheme = get_scheme(name, n, s)
    for j in range(n):
        p0 = scheme.work_plan(j, 0)
        assert sorted(p0.partitions) == sorted(p0.slot_partitions)      # warm-up: all slots
        L = p0.ring_size
        for t in range(1, 2 * L + 1):
            plan = scheme.work_plan(j, t)
            assert len(plan.evaluate) == 1
            (p, slot), = plan.evaluate
            assert slot == (t - 1) % L and p == plan.slot_partitions[slot]
            if name in ("pgc-cr", "pgc-cr-naive"):
                assert p == (j + (t - 1) % c) % n                         # PGC paper, Sec. V-B
            if name == "pgc-fr":
                assert p == (j // c) * c + (t - 1) % c                    # PGC paper, Sec. IV-A
        coefs = [coef for _, coef in scheme.work_plan(j, 5).combine]
        if name == "pgc-cr-naive":
            assert coefs == [scheme.code.B[j, p] for p in p0.slot_partitions]
        else:
            assert coefs == [1.0] * L


def test_pgc_cr_message_matches_the_paper_formula_with_staleness():
    # g^_j^(t) = sum_{l=0}^{c-1} g^{(t-l)}_{(j + (t-1-l) mod c) mod n} for t >= c
    n, s = 9, 3
    c = s + 1
    rng = np.random.default_rng(3)
    scheme = get_scheme("pgc-cr", n, s)
    grads = GradientTable(n, 3, rng, static=False)
    rings = Rings(scheme, grads)
    for t in range(0, 3 * c):
        arrivals = {j: rings.compute(j, t) for j in range(n)}
        if t >= c:
            for j in range(n):
                expected = sum(grads((j + (t - 1 - l) % c) % n, t - l) for l in range(c))
                assert np.allclose(arrivals[j].message, expected)
                assert max(t - v for v in arrivals[j].slot_versions) == c - 1


def test_gc_schemes_evaluate_the_whole_support_every_step():
    for name in ("gc-fr", "gc-cr", "bcgc", "gfrc", "gmds", "rs"):
        scheme = get_scheme(name, 8 if name != "gc-fr" else 9, 2)
        for t in (0, 1, 7):
            plan = scheme.work_plan(3, t)
            assert sorted(plan.partitions) == sorted(scheme.code.supports[3])


def test_decisions_are_deterministic_serialisable_and_ignore_message_contents():
    n, s = 10, 3
    rng = np.random.default_rng(0)
    order = list(rng.permutation(n))
    for name in SCHEMES:
        if name in NEEDS_DIVISIBLE:
            continue
        s_ = 0 if name == "dgd" else s      # dgd takes s = 0 only
        a = get_scheme(name, n, s_).decide(2, [Arrival(int(w), 2, 2, rng.standard_normal(3)) for w in order])
        b = get_scheme(name, n, s_).decide(2, [Arrival(int(w), 2, 2, None) for w in order])
        if name == "bounded-staleness":
            # its table fills from step-2 arrivals: shards are all present after n arrivals
            assert a is not None
        assert a.to_dict() == b.to_dict()
        json.dumps(a.to_dict())


def test_arrival_order_matters_first_complete_class():
    scheme = get_scheme("bcgc", 6, 2)   # classes {0,3}, {1,4}, {2,5}
    d1 = scheme.decide(0, [Arrival(w, 0) for w in (0, 1, 4, 3)])
    d2 = scheme.decide(0, [Arrival(w, 0) for w in (0, 1, 3, 4)])
    assert sorted(d1.workers) == [1, 4] and d1.arrived == (0, 1, 4)
    assert sorted(d2.workers) == [0, 3] and d2.info["group"] == 0


def test_gc_fr_waits_for_n_minus_s_but_first_complete_fires_earlier():
    paper = get_scheme("gc-fr", 6, 2)                       # groups {0,1,2}, {3,4,5}
    eager = get_scheme("gc-fr", 6, 2, decoder="first-complete")
    arrivals = [Arrival(w, 0) for w in (0, 3, 1, 4, 2, 5)]
    assert paper.decide(0, arrivals).info["n_arrived"] == 4
    assert eager.decide(0, arrivals).info["n_arrived"] == 2
    assert sorted(eager.decide(0, arrivals).workers) == [0, 3]


def test_round_rules():
    scheme = get_scheme("is-sgd", 5, 1)
    rnd = scheme.open_round(3)
    with pytest.raises(ValueError, match="open round 4"):
        rnd.offer(Arrival(0, 4))
    assert rnd.offer(Arrival(0, 2)) is None          # late arrival of step 2: ignored
    for w in (0, 0, 1, 2):                            # duplicates ignored
        assert rnd.offer(Arrival(w, 3)) is None
    d = rnd.offer(Arrival(4, 3))
    assert d is not None and d.workers == (0, 1, 2, 4)
    assert d.info["weight_min"] == pytest.approx(1 / 4)
    assert rnd.offer(Arrival(3, 3)) is None          # after firing: nothing more


def test_combine_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    scheme = get_scheme("rs", 6, 2)
    rng = np.random.default_rng(1)
    g = rng.standard_normal((6, 3))
    msgs = {}
    for j in range(6):
        plan = scheme.work_plan(j, 0)
        msgs[j] = sum(coef * torch.tensor(g[p], dtype=torch.complex128) for p, coef in plan.message_partitions)
    d = scheme.decide(0, [Arrival(j, 0) for j in (5, 1, 2, 0)])
    out = d.combine(msgs)
    assert isinstance(out, torch.Tensor)
    assert np.allclose(out.numpy(), g.mean(0))


def test_invalid_scheme_parameters():
    with pytest.raises(ValueError, match="valid names"):
        get_scheme("gc-mds", 6, 2)
    with pytest.raises(ValueError, match="valid options"):
        get_scheme("pgc-cr", 6, 2, c=3)
    with pytest.raises(ValueError, match="gfrc"):
        get_scheme("pgc-fr", 10, 3)
    with pytest.raises(ValueError, match=r"s in \[0, 5\]"):
        get_scheme("bcgc", 6, 6)
    with pytest.raises(ValueError, match="decoder"):
        get_scheme("bcgc", 6, 2, decoder="fastest")
    with pytest.raises(ValueError, match="replicas"):
        get_scheme("bounded-staleness", 6, 2, r=0)
    with pytest.raises(ValueError, match="shard_sizes"):
        get_scheme("bounded-staleness", 6, 2, shard_sizes=[1, 2])
    with pytest.raises(ValueError, match="c in"):
        get_scheme("is-gc", 6, 2, c=0)
    assert get_scheme("gmds", 6, 2, seed=3).code.seed == 3


def test_dgd_refuses_a_straggler_budget_it_would_ignore():
    """dgd waits for all n workers: s > 0 is an error naming the alternatives, not silently
    dropped, in the scheme and in the simulator alike; is-sgd, its subclass, uses s. The
    experiment level runs dgd beside schemes of budget s with s = 0, asked for explicitly
    (setting_stragglers), and says so in its summary."""
    with pytest.raises(ValueError, match=r"dgd waits for all n=6 workers.*s=1 would be ignored.*"
                                         r"pass s=0.*is-sgd"):
        get_scheme("dgd", 6, 1)
    assert get_scheme("dgd", 6, 0).wait_for == 6
    assert get_scheme("is-sgd", 6, 2).wait_for == 4
    from pgc_hvd.schemes import setting_stragglers
    from pgc_hvd.sim.run import simulate
    with pytest.raises(ValueError, match=r"dgd waits for all n=4 workers.*s=1 would be ignored"):
        simulate("dgd", 4, 1, model="softmax", steps=2, partition_time=0.1)
    assert setting_stragglers("dgd", 1) == 0 and setting_stragglers("is-sgd", 1) == 1
    for s in (setting_stragglers("dgd", 1), None):      # None: the scheme's default
        recs, summary = simulate("dgd", 4, s, model="softmax", steps=2, partition_time=0.1)
        assert summary["s"] == 0 and all(r.s == 0 and len(r.workers_used) == 4 for r in recs)


def test_the_straggler_budget_lives_on_the_scheme():
    """Its default (1; 0 for dgd and on one worker), its check (an int in [0, n - 1], 0 for
    dgd; n may be unknown yet) and the resolution every engine and command line uses."""
    from pgc_hvd.schemes import default_stragglers, scheme_class, stragglers_for
    assert [default_stragglers(x) for x in ("pgc-cr", "bcgc", "is-sgd", "dgd")] == [1, 1, 1, 0]
    assert [default_stragglers(x, 1) for x in ("pgc-cr", "bcgc", "is-sgd", "dgd")] == [0] * 4
    assert stragglers_for("pgc-cr", 4) == 1 and stragglers_for("pgc-cr", 4, 3) == 3
    assert stragglers_for("gc-cr", 1) == 0 and stragglers_for("DGD", 8) == 0
    assert scheme_class("pgc-cr").check_stragglers(5) == 5      # n not known: range unchecked
    with pytest.raises(ValueError, match=r"use s in \[0, 0\]"):
        stragglers_for("pgc-cr", 1, 1)
    with pytest.raises(ValueError, match=r"must be >= 0"):
        scheme_class("pgc-cr").check_stragglers(-1)
    with pytest.raises(ValueError, match=r"dgd waits for all workers"):
        scheme_class("dgd").check_stragglers(2)
    with pytest.raises(TypeError, match="stragglers must be an int"):
        stragglers_for("pgc-cr", 4, 1.0)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_a_schemes_construction_checks_s_once_with_the_one_checker(name):
    """Every scheme's construction asks the one checker of s (``check_stragglers``, in
    ``Scheme.__init__``) exactly once, whatever its subclass chain, and its errors are that
    checker's: the range with the fix, a non-int budget as a TypeError."""
    cls = SCHEMES[name]
    calls = []

    class Counted(cls):
        @classmethod
        def check_stragglers(klass, s, n=None):
            calls.append((s, n))
            return super().check_stragglers(s, n)

    s = 0 if cls.waits_for_all else 1
    scheme = Counted(6, s)
    assert calls == [(s, 6)] and (scheme.n, scheme.s) == (6, s)
    assert type(scheme.n) is int and type(scheme.s) is int
    with pytest.raises(ValueError, match=rf"{cls.name}: needs 0 <= s <= n-1.*use s in \[0, 5\]"):
        cls(6, 6)
    with pytest.raises(TypeError, match="stragglers must be an int"):
        cls(6, 1.0)
