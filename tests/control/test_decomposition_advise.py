"""Lemma 1/3 error split (simulator probe) and ``pgc-hvd advise`` on a delay trace."""

import math

import numpy as np
import pytest
import torch

from pgc_hvd.apps.advise import advise, fit_delays, format_report
from pgc_hvd.sim.decomposition import DecompositionProbe
from pgc_hvd.delays import DelayTrace, Exponential, LogNormal
from pgc_hvd.sim.run import prepare_data, simulate


@pytest.fixture(scope="module")
def data():
    torch.set_num_threads(1)
    return prepare_data("digits")


def probe_run(data, scheme, opts, batch_size):
    probe = DecompositionProbe(every=4)
    simulate(scheme, 8, 0 if scheme == "dgd" else 1, data=data, model="softmax",
             optimizer="sgd:lr=0.5", delay="exp:mean=1,seed=3", steps=24, scheme_options=opts,
             partition_time=1.0, step_hook=probe, batch_size=batch_size, diagnostics=False)
    return probe.summary()


def test_split_is_exact_and_attributes_sources(data):
    full_dgd = probe_run(data, "dgd", {}, None)
    assert full_dgd["lemma_total_mean"] < 1e-10          # exact, full-batch: no error at all
    mb_dgd = probe_run(data, "dgd", {}, 8)
    assert mb_dgd["lemma_bias_mean"] < 1e-10 and mb_dgd["lemma_stochastic_mean"] > 0
    stale = probe_run(data, "bounded-staleness", {"r": 2, "c": 4}, None)
    assert stale["lemma_stochastic_mean"] < 1e-10 and stale["lemma_stale_mean"] > 0
    pgc = probe_run(data, "pgc-cr", {}, 8)
    for s in (full_dgd, mb_dgd, stale, pgc):   # total = bias + stochastic + cross, exactly
        assert math.isclose(s["lemma_total_mean"], s["lemma_bias_mean"] + s["lemma_stochastic_mean"]
                            + s["lemma_cross_mean"], rel_tol=1e-6, abs_tol=1e-9)


def test_fit_picks_the_generating_family():
    rng = np.random.default_rng(0)
    assert fit_delays(rng.exponential(0.1, 400))["kind"] == "exp"
    f = fit_delays(rng.lognormal(-2.0, 0.3, 400))
    assert f["kind"] == "lognormal" and abs(f["ln_mu"] + 2.0) < 0.1


def test_fit_ignores_the_zero_that_the_shift_estimate_makes():
    """tau = min busy/k leaves one delay at exactly 0; it must not inflate a log-normal's sigma
    (clipped to 1e-6 it once gave sigma ~5 and predictions 30x too slow)."""
    rng = np.random.default_rng(1)
    x = rng.lognormal(-2.0, 0.3, 60)
    x = x - x.min()  # as observations() makes them
    f = fit_delays(x)
    assert f["zeros"] == 1 and f["n_samples"] == 60
    assert f["ln_sigma"] is not None and f["ln_sigma"] < 2.0
    # many zeros (steps without delay): the exponential over all samples
    y = np.concatenate([np.zeros(30), rng.exponential(0.1, 30)])
    g = fit_delays(y)
    assert g["kind"] == "exp" and g["aic_exp"] is None and abs(g["exp_mean"] - y.mean()) < 1e-12


def test_advise_on_a_trace(tmp_path):
    # rank 3 is a slow straggler: waiting for everybody (DGD) must not be recommended
    models = [Exponential(0.05, seed=1)] * 3 + [LogNormal(math.log(1.0), 0.2, seed=2)]
    trace = DelayTrace({(w, t): models[w].sample(w, t) for w in range(4) for t in range(40)})
    path = trace.save(tmp_path / "delay_trace.json")
    res = advise(path, model="softmax", target=None, s_values=(1,), steps=15, partition_time=0.05,
                 bootstrap=2, lr=0.5)
    assert res["fits"][3]["kind"] == "lognormal"
    ranked = res["ranked"]
    tps = {(r["scheme"], r["s"]): r["time_per_step"] for r in ranked}
    assert tps[("dgd", 0)] > 0.8                       # waits for the ~1 s rank every step
    assert res["recommendation"]["scheme"] != "dgd"
    assert res["recommendation"]["predicted_time_per_step"] < 0.5 * tps[("dgd", 0)]
    assert 0.0 <= res["recommendation"]["bootstrap_best_share"] <= 1.0
    assert "recommendation:" in format_report(res)


def test_advise_ranks_by_time_to_accuracy_with_the_users_optimizer(tmp_path):
    models = [Exponential(0.05, seed=1)] * 3 + [LogNormal(math.log(1.0), 0.2, seed=2)]
    trace = DelayTrace({(w, t): models[w].sample(w, t) for w in range(4) for t in range(40)})
    path = trace.save(tmp_path / "delay_trace.json")
    res = advise(path, model="softmax", s_values=(1,), steps=20, partition_time=0.05,
                 bootstrap=0, optimizer="sgd:lr=0.05,momentum=0.9", target_accuracy=0.6)
    assert res["assumed"] == {"optimizer": "sgd:lr=0.05,momentum=0.9",
                              "momentum_correction": True}
    reached = [r for r in res["ranked"] if r["time_to_target"] is not None]
    assert reached, "softmax on digits reaches 60% validation accuracy within 20 steps"
    # ranked by time to the accuracy target first
    times = [r["time_to_target"] for r in reached]
    assert times == sorted(times) and res["ranked"][:len(reached)] == reached
    report = format_report(res)
    assert "assumed optimizer: sgd:lr=0.05,momentum=0.9 with the momentum correction on" in report
    assert "steps to accuracy 0.6" in report


@pytest.mark.parametrize("argv, message", [
    (["--s-values", "a"], "comma-separated integers"),
    (["--s-values", "0,1"], "budgets >= 1"),
    (["--steps", "-5"], "--steps must be >= 1"),
    (["--partition-time", "-1"], "seconds > 0"),
])
def test_advise_usage_errors(tmp_path, usage_error, argv, message):
    from pgc_hvd.apps.advise import main
    assert message in usage_error(main, [str(tmp_path)] + argv)
