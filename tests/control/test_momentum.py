"""The staleness-aware momentum correction (pgc_hvd.control.momentum) on real torch optimizers."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pgc_hvd.control.momentum import (compensated, implicit_momentum, momentum_correction,
                                      parse_momentum_correction)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def _grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def _flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_implicit_momentum_of_a_mean_age():
    assert implicit_momentum(None) == 0.0
    assert implicit_momentum(0) == 0.0
    assert implicit_momentum(0.5) == pytest.approx(1 / 3)   # PGC ring of c = 2, all slots used
    assert implicit_momentum(1.0) == pytest.approx(0.5)


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    lambda p: torch.optim.Adam(p, lr=1e-3),
    lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.8, 0.99)),
    lambda p: torch.optim.SGD(p, lr=0.1),
])
def test_a_fresh_update_is_the_optimizers_own_step_bit_for_bit(make):
    a, b = _model(), _model()
    oa, ob = make(a.parameters()), make(b.parameters())
    for t in range(4):
        _grads(a, t), _grads(b, t)
        oa.step()
        with compensated(ob.param_groups, 0.0) as corr:
            ob.step()
        assert corr.mu == 0.0
    assert torch.equal(_flat(a), _flat(b))


def test_sgd_momentum_is_applied_as_beta_prime_with_the_gain_kept():
    age = 1.0                                        # mu_imp = 1/2, beta' = 0.4, lr' = 0.3
    a, b = _model(), _model()
    oa = torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-2)
    ob = torch.optim.SGD(b.parameters(), lr=0.05 * 0.6 / 0.1, momentum=0.4, weight_decay=1e-2)
    for t in range(5):
        _grads(a, t), _grads(b, t)
        with compensated(oa.param_groups, age) as corr:
            assert oa.param_groups[0]["momentum"] == pytest.approx(0.4)
            oa.step()
        ob.step()
    assert corr.record() == {"implicit_momentum": pytest.approx(0.5), "momentum": 0.9,
                             "effective_momentum": pytest.approx(0.4)}
    # the user's values are back: the scheduler, state_dict and the cross-rank digest see them
    assert oa.param_groups[0]["momentum"] == 0.9 and oa.param_groups[0]["lr"] == 0.05
    torch.testing.assert_close(_flat(a), _flat(b), rtol=0, atol=1e-6)


def test_adam_moves_beta1_only():
    a, b = _model(), _model()
    oa = torch.optim.Adam(a.parameters(), lr=1e-2, betas=(0.9, 0.99))
    ob = torch.optim.Adam(b.parameters(), lr=1e-2, betas=(0.9 - 1 / 3, 0.99))
    for t in range(5):
        _grads(a, t), _grads(b, t)
        with compensated(oa.param_groups, 0.5):
            oa.step()
        ob.step()
    assert oa.param_groups[0]["betas"] == (0.9, 0.99) and oa.param_groups[0]["lr"] == 1e-2
    torch.testing.assert_close(_flat(a), _flat(b), rtol=0, atol=1e-6)


def test_disabled_or_momentum_free_changes_nothing_and_errors_restore():
    opt = torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)
    with compensated(opt.param_groups, 3.0, enabled=False) as corr:
        assert opt.param_groups[0]["momentum"] == 0.9
    assert corr.mu == 0.0 and corr.effective_momentum == 0.9
    plain = torch.optim.SGD(_model().parameters(), lr=0.1)
    with compensated(plain.param_groups, 3.0):
        assert plain.param_groups[0]["lr"] == 0.1 and plain.param_groups[0]["momentum"] == 0
    with pytest.raises(RuntimeError):
        with compensated(opt.param_groups, 1.0):
            raise RuntimeError("inner step failed")
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["lr"] == 0.1


@settings(max_examples=200, deadline=None)
@given(beta=st.floats(0.0, 0.999), lr=st.floats(1e-4, 1.0), age=st.floats(0.0, 50.0))
def test_property_beta_prime_in_range_and_total_gain_kept(beta, lr, age):
    g = {"params": [], "lr": lr, "momentum": beta}
    with compensated([g], age) as corr:
        bp, lrp = g["momentum"], g["lr"]
    assert g == {"params": [], "lr": lr, "momentum": beta}
    if beta == 0.0:
        assert (bp, lrp) == (0.0, lr)
        return
    assert 0.0 <= bp <= beta and bp == pytest.approx(max(0.0, beta - age / (1 + age)))
    # a persistent gradient's total step lr / (1 - beta) is the user's
    assert lrp / (1 - bp) == pytest.approx(lr / (1 - beta), rel=1e-9)
    assert corr == momentum_correction([{"lr": lr, "momentum": beta}], age)


def test_constant_gradient_reaches_the_users_terminal_velocity():
    """A persistent gradient moves the parameters lr/(1-beta) per step in the end, corrected or
    not (only the transient differs)."""
    w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01, momentum=0.9)
    last = 0.0
    for _ in range(400):
        w.grad = torch.ones(1, dtype=torch.float64)
        with compensated(opt.param_groups, 0.7):
            opt.step()
        step, last = last - float(w.detach()), float(w.detach())
    assert step == pytest.approx(0.01 / 0.1, rel=1e-6)


def test_parse_momentum_correction():
    assert parse_momentum_correction(True) and not parse_momentum_correction(False)
    assert parse_momentum_correction("auto") and not parse_momentum_correction("off")
    with pytest.raises(ValueError, match="momentum_correction=0.5"):
        parse_momentum_correction(0.5)
    assert math.isfinite(implicit_momentum(1e9))


def test_applies_to_the_pipelined_schemes_only():
    from pgc_hvd.control.momentum import applies_to
    from pgc_hvd.schemes import get_scheme
    assert all(applies_to(get_scheme(name, 4, 1)) for name in ("pgc-cr", "pgc-fr", "pgc-bcgc"))
    assert not any(applies_to(get_scheme(name, 4, s)) for name, s in (
        ("dgd", 0), ("gc-cr", 1), ("is-sgd", 1), ("bcgc", 1), ("bounded-staleness", 1)))


def test_simulator_applies_it_to_pgc_and_not_to_bounded_staleness():
    from pgc_hvd.sim.run import simulate
    for scheme, corrected in (("pgc-cr", True), ("bounded-staleness", False)):
        recs, _ = simulate(scheme, 4, 1, dataset="iris", model="softmax", steps=12,
                           optimizer="sgd:lr=0.1,momentum=0.9", delay="exp:mean=1,seed=3",
                           partition_time=1.0, eval_every=0)
        stale = [r for r in recs if r.mean_age]
        assert stale, f"{scheme} used no stale gradient"
        eff = {round(r.extra["effective_momentum"], 12) for r in stale}
        if corrected:
            assert max(eff) < 0.9 and all(
                r.extra["implicit_momentum"] == pytest.approx(r.mean_age / (1 + r.mean_age))
                for r in stale)
        else:
            assert eff == {0.9} and all(r.extra["implicit_momentum"] == 0.0 for r in stale)


# -- the remedy's ring decay for PGC-CR: rho = 1 - beta (control.momentum.fresh_leaning_decay) --

def _groups(make):
    return make([torch.nn.Parameter(torch.zeros(1))]).param_groups


@pytest.mark.parametrize("make,rho", [
    (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), 0.1),
    (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, nesterov=True), 0.5),
    (lambda p: torch.optim.Adam(p, lr=1e-3), 0.1),                      # betas[0] = 0.9
    (lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.8, 0.99)), 0.2),
    (lambda p: torch.optim.SGD(p, lr=0.5), None),                       # plain SGD: the paper's
    (lambda p: torch.optim.Adagrad(p, lr=0.1), None),                   # no momentum at all
])
def test_fresh_leaning_decay_is_one_minus_the_users_momentum(make, rho):
    from pgc_hvd.control.momentum import fresh_leaning_decay
    got = fresh_leaning_decay(_groups(make))
    assert got == (None if rho is None else pytest.approx(rho))


def test_remedy_scheme_options_set_pgc_cr_decay_only_when_the_user_did_not():
    from pgc_hvd.control.momentum import remedy_scheme_options
    mom = _groups(lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    plain = _groups(lambda p: torch.optim.SGD(p, lr=0.5))
    assert remedy_scheme_options("pgc-cr", None, mom) == {"decay": pytest.approx(0.1)}
    assert remedy_scheme_options("PGC_CR", {"decay": 0.5}, mom) == {"decay": 0.5}   # the user's
    assert remedy_scheme_options("pgc-cr", {}, mom, enabled=False) == {}      # the off switch
    assert remedy_scheme_options("pgc-cr", {}, plain) == {}                   # plain SGD: rho 1
    for other in ("pgc-fr", "pgc-bcgc", "dgd", "is-sgd"):
        assert remedy_scheme_options(other, {}, mom) == {}
    with pytest.raises(ValueError, match="unknown scheme"):
        remedy_scheme_options("pgc-xx", {}, mom)


@pytest.mark.parametrize("optimizer,correction,rho", [
    ("sgd:lr=0.05,momentum=0.9", True, 0.1),
    ("sgd:lr=0.05,momentum=0.9", False, 1.0),
    ("sgd:lr=0.5", True, 1.0),
])
def test_simulator_builds_pgc_cr_with_the_remedys_decay(optimizer, correction, rho):
    from pgc_hvd.sim.run import simulate
    recs, summ = simulate("pgc-cr", 4, 1, dataset="digits", model="softmax", optimizer=optimizer,
                          steps=6, batch_size=8, momentum_correction=correction)
    assert summ["ring_decay"] == pytest.approx(rho)
    assert all(r.extra["ring_decay"] == pytest.approx(rho) for r in recs)


# -- the remedy for bounded staleness: each gradient counted once --

@pytest.mark.parametrize("make", [
    lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    lambda p: torch.optim.Adam(p, lr=1e-3),
    lambda p: torch.optim.SGD(p, lr=0.5),
])
def test_remedy_scheme_options_count_bounded_staleness_gradients_once(make):
    from pgc_hvd.control.momentum import remedy_scheme_options
    g = _groups(make)
    assert remedy_scheme_options("bounded-staleness", {"r": 2}, g) == {
        "r": 2, "replay": "once", "fire": "current", "normalize": True}
    assert remedy_scheme_options("bounded-staleness", {"normalize": False}, g) == {
        "replay": "once", "fire": "current", "normalize": False}
    assert remedy_scheme_options("bounded-staleness", {"replay": "mean"}, g) == {"replay": "mean"}
    assert remedy_scheme_options("bounded-staleness", {"replay": "once"}, g) == {"replay": "once"}
    assert remedy_scheme_options("bounded_staleness", {}, g, enabled=False) == {}   # off switch


@pytest.mark.parametrize("optimizer,correction,once", [
    ("sgd:lr=0.05,momentum=0.9", True, True),
    ("sgd:lr=0.05,momentum=0.9", False, False),
    ("sgd:lr=0.5", True, True),
    ("sgd:lr=0.5", False, False),
])
def test_simulator_counts_bounded_staleness_gradients_once_with_the_remedy(optimizer, correction,
                                                                           once):
    """The simulator builds bounded staleness through the remedy: each step's record carries
    n_current >= n - s gradients of its model, n_fresh new ones (each used once), weights that
    sum to 1 and a share of the data (fresh_share) below 1 once a straggler is left out; with
    the remedy off the note's records (every table entry, no
    n_fresh)."""
    from pgc_hvd.delays import Exponential
    from pgc_hvd.sim.run import simulate
    recs, _ = simulate("bounded-staleness", 4, 1, dataset="digits", model="softmax",
                       optimizer=optimizer, delay=Exponential(1.0, seed=3), steps=12,
                       batch_size=8, scheme_options={"r": 2, "c": 3}, partition_time=1.0,
                       momentum_correction=correction)
    if once:    # a step on 3 gradients of its model, their mean (weights sum to 1)
        assert all(r.extra["n_fresh"] == len(r.workers_used) >= r.extra["n_current"] >= 3
                   for r in recs)
        assert all(r.extra["weight_sum"] == pytest.approx(1.0) for r in recs)
        assert any(r.extra["fresh_share"] < 1.0 for r in recs)
    else:
        assert all("n_fresh" not in r.extra and len(r.workers_used) == 4 for r in recs)
