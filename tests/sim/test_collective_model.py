"""The alpha-beta model of the runtime's collectives, its fit, and the engine's simulation of the
runtime's protocol step (control rounds, then the data plane) -- virtual time only."""

import json
import math

import numpy as np
import pytest
import torch

from pgc_hvd.data import load_dataset, partition, train_test_split
from pgc_hvd.models import build_task
from pgc_hvd.schemes import get_scheme
from pgc_hvd.sim.comm import (FIT_FORMAT, AlphaBeta, CollectiveModel, CommModel, Network,
                              design_row, fit_alpha_beta, fit_network, load_fit,
                              parse_comm_model)
from pgc_hvd.sim.engine import SimConfig, Simulator
from pgc_hvd.sim.timing import TimingSimulator, time_per_step, time_steps


# ------------------------------------------------------------------------------ formulas
def test_ring_allreduce_and_allgather_formulas():
    ab = AlphaBeta(alpha=1e-5, beta=2e-9)
    n, B = 8, 4_000_000
    assert ab.allreduce(n, B) == pytest.approx(2 * 7 * 1e-5 + 2 * 7 / 8 * B * 2e-9)
    # variable-size allgather: (n-1) alpha + (sum - min) beta
    sizes = [0, 100, 0, 400, 50, 0, 0, 0]
    assert ab.allgather(n, sizes) == pytest.approx(7 * 1e-5 + 550 * 2e-9)
    assert ab.allgather(n, [B] * n) == pytest.approx(7 * 1e-5 + 7 * B * 2e-9)
    # one rank: no communication
    assert ab.allreduce(1, B) == 0.0 and ab.allgather(1, [B]) == 0.0
    with pytest.raises(ValueError, match="3 contributions for n = 8"):
        ab.allgather(8, [1, 2, 3])
    # dense allgather of n messages costs ~ n/2 allreduces of one at large sizes
    big = 10 ** 9
    assert ab.allgather(64, [big] * 64) / ab.allreduce(64, big) == pytest.approx(32, rel=1e-3)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1"])
def test_alpha_beta_are_checked(bad):
    with pytest.raises(ValueError, match="AlphaBeta"):
        AlphaBeta(bad, 1e-9)
    with pytest.raises(ValueError, match="AlphaBeta"):
        AlphaBeta(1e-5, bad)


def _synthetic(kind, alpha, beta, ns=(2, 3, 4), noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in ns:
        for b in [4 * 4 ** k for k in range(12)]:
            a_coef, b_coef = design_row(kind, n, b)
            t = a_coef * alpha + b_coef * beta
            out.append((n, b, t * (1 + noise * rng.standard_normal())))
    return out


@pytest.mark.parametrize("kind", ["allreduce", "allgather"])
def test_fit_recovers_alpha_and_beta(kind):
    fit = fit_alpha_beta(_synthetic(kind, 7e-4, 1.5e-9), kind)
    assert fit["alpha"] == pytest.approx(7e-4, rel=1e-9)
    assert fit["beta"] == pytest.approx(1.5e-9, rel=1e-9)
    assert fit["rel_rms"] < 1e-9
    noisy = fit_alpha_beta(_synthetic(kind, 7e-4, 1.5e-9, noise=0.05, seed=3), kind)
    assert noisy["alpha"] == pytest.approx(7e-4, rel=0.1)
    assert noisy["beta"] == pytest.approx(1.5e-9, rel=0.1)


def test_fit_keeps_coefficients_non_negative():
    # pure latency (no bandwidth term): beta must come out 0, not negative
    samples = [(4, b, 3e-3 * (1 + 0.01 * (-1) ** i)) for i, b in enumerate([4, 400, 40000, 4e6])]
    fit = fit_alpha_beta(samples, "allgather")
    assert fit["alpha"] > 0 and fit["beta"] >= 0
    with pytest.raises(ValueError, match="at least two"):
        fit_alpha_beta(samples[:1], "allgather")
    with pytest.raises(ValueError, match="allreduce"):
        design_row("broadcast", 4, 1)


def _fit_doc(path, alpha=1e-3, beta=2e-9, pass_beta=1e-11):
    per = {str(n): fit_network({k: [s for s in _synthetic(k, alpha * n, beta) if s[0] == n]
                                for k in ("allreduce", "allgather")}) for n in (2, 4)}
    doc = {"format": FIT_FORMAT, "fits": per,
           "all": fit_network({k: _synthetic(k, alpha, beta) for k in ("allreduce", "allgather")}),
           "local": {"pass_beta": pass_beta}}
    path.write_text(json.dumps(doc))
    return path


def test_load_fit_uses_the_fit_of_each_measured_n(tmp_path):
    cm = load_fit(_fit_doc(tmp_path / "comm.json"), plane="allgather")
    assert isinstance(cm, CollectiveModel) and cm.plane == "allgather"
    assert cm.pass_beta == pytest.approx(1e-11)
    assert cm.net(2).allreduce.alpha == pytest.approx(2e-3)
    assert cm.net(4).allgather.alpha == pytest.approx(4e-3)
    assert cm.net(64).allreduce.alpha == pytest.approx(1e-3)   # not measured: the global fit
    assert parse_comm_model(f"fitted:{tmp_path / 'comm.json'}").net(4) == cm.net(4)
    (tmp_path / "bad.json").write_text('{"format": "x"}')
    with pytest.raises(ValueError, match="not a pgc_hvd.comm_fit/1 file"):
        load_fit(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="measure_collectives"):
        load_fit(tmp_path / "missing.json")


def test_comm_model_specs():
    m = parse_comm_model("master:alpha=1e-3,bandwidth=1e6")
    assert m == CommModel(1e-3, 1e6)
    assert parse_comm_model("master") == CommModel()
    r = parse_comm_model("ring:alpha=10e-6,gbps=25", plane="allgather-2phase", poll_interval=0.01)
    assert r.net(8).allreduce == AlphaBeta(10e-6, 8 / 25e9)
    assert (r.plane, r.poll_interval) == ("allgather-2phase", 0.01)
    assert parse_comm_model("ring:alpha=0,bandwidth=1e9").network == Network.link(0, 1e-9)
    for bad, msg in [("ring:alpha=1", "exactly one of beta"), ("ring:alpha=1,beta=1,gbps=2",
                                                                "exactly one of beta"),
                     ("ring:alpha=1,gbps=0", "gbps must be > 0"), ("ring:alpha", "KEY=NUMBER"),
                     ("ring:alpha=1,beta=1,x=2", "unknown key"), ("mesh", "unknown comm model"),
                     ("fitted:", "needs a path")]:
        with pytest.raises(ValueError, match=msg):
            parse_comm_model(bad)
    with pytest.raises(ValueError, match="plane"):
        parse_comm_model("ring:alpha=1,beta=1", plane="broadcast")
    # SimConfig takes a spec too
    assert isinstance(SimConfig(comm="ring:alpha=1e-5,gbps=25").comm, CollectiveModel)
    with pytest.raises(ValueError, match="comm"):
        SimConfig(comm=3)


# ------------------------------------------------------------------------------ the engine
@pytest.fixture(scope="module")
def digits():
    tr, te = train_test_split(load_dataset("digits"), 0.3, seed=0)
    return tr.subset(np.arange(240)), te.subset(np.arange(100))


def _full(digits, name, n, s, cfg, **opts):
    tr, te = digits
    task = build_task("softmax", tr, seed=0)
    sim = Simulator(get_scheme(name, n, s, **opts), task, tr, partition(tr.y, n, seed=0),
                    lambda p: torch.optim.SGD(p, lr=0.3), cfg, test=te)
    return sim, sim.run()


CASES = [("dgd", 0, {}), ("pgc-cr", 1, {}), ("bcgc", 1, {}), ("gc-cr", 1, {}),
         ("bounded-staleness", 1, {"r": 2, "c": 2})]


@pytest.mark.parametrize("plane", ["allgather", "allgather-2phase", "allreduce"])
@pytest.mark.parametrize("policy", ["continue", "cancel"])
def test_time_only_simulator_is_the_full_simulator_without_gradients(digits, plane, policy):
    """Decisions are pure functions of the arrival order, so the time-only run takes the full
    run's decisions at the same virtual times, with the same bytes."""
    cm = parse_comm_model("ring:alpha=1e-3,beta=1e-8,pass_beta=1e-10", plane=plane,
                          optimistic_below=0)
    for name, s, opts in CASES:
        if policy == "cancel" and name == "bounded-staleness":
            continue
        cfg = SimConfig(steps=8, delay="exp:mean=0.3,seed=2", partition_time=0.3, comm=cm,
                        straggler_policy=policy, diagnostics=False)
        sim, recs = _full(digits, name, 4, s, cfg, **opts)
        timing = TimingSimulator(get_scheme(name, 4, s, **opts), sim.d, cfg).run()
        assert [(r.time, r.workers_used, r.versions, r.bytes) for r in recs] == \
            [(r.time, r.workers_used, r.versions, r.bytes) for r in timing], (name, plane)
        assert all(np.isfinite(r.loss) for r in recs)


def test_master_model_is_unchanged_by_the_time_only_simulator(digits):
    cfg = SimConfig(steps=6, delay="exp:mean=1,seed=1", partition_time=0.5,
                    comm=CommModel(0.01, 1e6), diagnostics=False)
    sim, recs = _full(digits, "pgc-cr", 6, 1, cfg)
    timing = TimingSimulator(get_scheme("pgc-cr", 6, 1), sim.d, cfg).run()
    assert [r.time for r in recs] == [r.time for r in timing]
    # master model: message + broadcast costs alpha + bytes / b each way
    dgd = TimingSimulator(get_scheme("dgd", 3, 0), 1000, SimConfig(
        steps=3, delay="const:value=1", partition_time=0.0, comm=CommModel(0.01, 1e6))).run()
    one = 0.01 + 4000 / 1e6
    assert [r.time for r in dgd] == pytest.approx([1 + one, 2 + 3 * one, 3 + 5 * one])


def _dgd_step(plane, n=4, d=250_000, T=0.5, poll=0.002):
    cm = parse_comm_model("ring:alpha=2e-4,beta=1e-9,pass_beta=1e-11", plane=plane,
                          poll_interval=poll, optimistic_below=0)
    recs = time_steps(get_scheme("dgd", n, 0), d=d, steps=6, partition_time=T, comm=cm)
    return cm, recs


@pytest.mark.parametrize("plane", ["allgather", "allgather-2phase", "allreduce"])
def test_dgd_step_is_compute_plus_the_planes_collectives(plane):
    """No delays, equal compute: every rank is ready at once, so a step is apply + compute +
    form, then one control round (with the payloads on the old plane), then the data phase; the
    control rounds during the compute overlap it (up to one empty round of slack)."""
    n, d, T = 4, 250_000, 0.5
    cm, recs = _dgd_step(plane, n, d, T)
    d4 = 4 * d
    row = 8 * (11 + 1)
    local = cm.local(12 * d) + cm.local(2 * d4 + 1.25 * d4 + 2 * d4)   # apply, form (1 slot)
    if plane == "allgather":
        control = cm.allgather(n, [row + d4] * n)
        data = cm.local(n * d4 + d4)
        recv = (n - 1) * d4
    elif plane == "allgather-2phase":
        control = cm.allgather(n, [row] * n)
        data = cm.allgather(n, [d4] * n) + cm.local(n * d4 + d4)
        recv = (n - 1) * d4
    else:
        control = cm.allgather(n, [row] * n)
        data = cm.local(d4 + d4) + cm.allreduce(n, d4)
        recv = 2 * (n - 1) / n * d4
    expected = local + T + control + data
    empty = cm.allgather(n, [row] * n)
    for r in recs[1:]:
        assert expected - 1e-12 <= r.step_time <= expected + empty + 1e-12
        # bytes: the payloads (or the allreduce), plus control rows
        assert recv <= r.bytes <= recv + (n - 1) * row * (r.extra["control_rounds"] + 1)
    assert recs[2].extra["control_rounds"] >= 1


def test_new_plane_moves_o_d_bytes_and_old_plane_o_nd():
    for n in (4, 16):
        old = _dgd_step("allgather", n=n)[1]
        new = _dgd_step("allreduce", n=n)[1]
        ratio = np.mean([r.bytes for r in old[1:]]) / np.mean([r.bytes for r in new[1:]])
        assert ratio == pytest.approx(n / 2, rel=0.1)   # (n-1) 4d vs 2 (n-1)/n 4d (+ rows)
        assert time_per_step(old) > time_per_step(new)


def test_control_rounds_follow_the_poll_interval():
    """While ranks compute, the agents poll every poll_interval: a longer compute means
    proportionally more (empty) control rounds; a tiny poll interval adds no time."""
    cm_fast = parse_comm_model("ring:alpha=0,beta=0", poll_interval=0.01)
    recs = time_steps(get_scheme("dgd", 3, 0), d=100, steps=4, partition_time=1.0, comm=cm_fast)
    assert all(99 <= r.extra["control_rounds"] <= 102 for r in recs[1:])
    assert [r.step_time for r in recs[1:]] == pytest.approx([1.0] * 3)


def test_pgc_fires_on_the_first_control_round_that_shows_n_minus_s():
    """PGC-CR, one rank much slower every step: the step fires without it, at the end of the
    control round that shows the (n-s)-th message."""
    from pgc_hvd.delays import Heterogeneous, Constant
    cm = parse_comm_model("ring:alpha=1e-4,beta=0", poll_interval=0.004)
    delay = Heterogeneous(Constant(0.1), [0, 0, 0, 50])
    recs = time_steps(get_scheme("pgc-cr", 4, 1), d=1000, steps=5, partition_time=0.2,
                      comm=cm, delay=delay)
    for r in recs[1:]:
        assert 3 not in r.workers_used
        assert r.step_time < 0.2 + 0.004 + 5 * cm.allgather(4, [8 * 13] * 4)


def test_sparse_messages_take_the_cheaper_collective():
    """Top-kappa rows: allgather of the chosen (values, indices) when fewer bytes than the
    allreduce (the runtime's rule), else densified into the allreduce."""
    cm = parse_comm_model("ring:alpha=1e-5,beta=1e-9", plane="allreduce", optimistic_below=0)
    d, n = 1_000_000, 8
    few = time_steps(get_scheme("pgc-cr", n, 1), d=d, steps=4, partition_time=0.1, comm=cm,
                     compress=0.01)
    many = time_steps(get_scheme("pgc-cr", n, 1), d=d, steps=4, partition_time=0.1, comm=cm,
                      compress=0.2)
    ar = 2 * (n - 1) / n * 4 * d
    assert np.mean([r.bytes for r in few[1:]]) < 0.2 * ar        # allgather: 7 x 8 kappa bytes
    assert np.mean([r.bytes for r in many[1:]]) >= ar            # densified: the allreduce


def test_time_only_simulator_refuses_what_needs_gradients():
    with pytest.raises(ValueError, match="partition_time"):
        TimingSimulator(get_scheme("dgd", 2, 0), 10, SimConfig(steps=2))
    with pytest.raises(ValueError, match="measured"):
        TimingSimulator(get_scheme("dgd", 2, 0), 10, SimConfig(steps=2, partition_time=1,
                                                              decode_time="measured"))
    with pytest.raises(ValueError, match="min-error"):
        TimingSimulator(get_scheme("bcgc", 4, 1, decoder="min-error"), 10,
                        SimConfig(steps=2, partition_time=1, compress=0.1))
    assert math.isfinite(time_per_step(time_steps(get_scheme("dgd", 2, 0), 10, 3, 0.1)))


# ------------------------------------------------------------------------------ scale experiment
def test_scale_experiment_quick(tmp_path):
    """``pgc-hvd experiment scale --quick``: n = 8, 16, one model, both links and planes."""
    from pgc_hvd.cli import main
    fit = _fit_doc(tmp_path / "comm.json")
    log_fit = tmp_path / "log.json"
    log_fit.write_text(json.dumps({
        "format": "pgc_hvd.log_control_fit/1",
        "store": {"rtt": 1e-5, "beta": 3e-10, "fan_op": 1e-4, "fan_beta": 1e-9},
        "body": {"samples": [{"n": 4, "decider": {"run": 7e-5, "row": 2e-5},
                              "follower": {"run": 5e-5, "row": 1e-5}},
                             {"n": 16, "decider": {"run": 1e-4, "row": 2e-5},
                              "follower": {"run": 8e-5, "row": 1e-5}}]}}))
    out = tmp_path / "scale"
    assert main(["experiment", "scale", "--quick", "--out", str(out), "--comm-fit", str(fit),
                 "--log-fit", str(log_fit)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = summary["runs"]
    assert {(r["n"], r["link"], r["delay"]) for r in rows} == {
        (n, link, dl) for n in (8, 16) for link in ("measured", "datacentre")
        for dl in ("exp", "lognormal")}
    for r in rows:
        for key in ("dgd_old", "pgc-cr_old", "dgd_new", "pgc-cr_new", "hvd"):
            assert r[key] > 0.2          # at least one partition's compute per step
        assert r["ratio_new"] == pytest.approx(r["pgc-cr_new"] / r["dgd_new"])
        assert r["pgc-cr_old_mb"] > r["pgc-cr_new_mb"]      # O(n d) against O(d) bytes
        # the control paths: free control is the bound
        assert r["pgc-cr_free"] <= min(r["pgc-cr_store"], r["pgc-cr_log"], r["pgc-cr_new"])
        assert r["pgc_log_vs_free"] == pytest.approx(r["pgc-cr_log"] / r["pgc-cr_free"])
        assert r["pgc_log_vs_hvd"] == pytest.approx(r["pgc-cr_log"] / r["hvd"])
        assert r["pgc-cr_log_ops"] <= 6
    assert (out / "plot.png").stat().st_size > 0
    text = (out / "table.md").read_text()
    assert "PGC-CR/DGD new" in text and "store / hvd" in text and "default / hvd" in text


def test_scale_experiment_options_are_checked(tmp_path, capsys):
    from pgc_hvd.apps.experiments import main
    with pytest.raises(SystemExit) as e:
        main(["pgc", "--out", str(tmp_path / "x"), "--comm-fit", "comm.json"])
    assert e.value.code == 2
    assert "scale experiment only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["pgc", "--out", str(tmp_path / "x"), "--log-fit", "log.json"])
    assert e.value.code == 2
    assert "scale experiment only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["scale", "--out", str(tmp_path / "x"), "--log-fit", str(tmp_path / "none.json")])
    assert e.value.code == 2
    assert "measure_log_control" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["scale", "--out", str(tmp_path / "x"), "--comm-fit", str(tmp_path / "none.json")])
    assert e.value.code == 2
    assert "measure_collectives" in capsys.readouterr().err


def test_simulate_command_takes_a_collective_model(tmp_path, capsys):
    from pgc_hvd.apps.simulate import main
    fit = _fit_doc(tmp_path / "comm.json")
    out = tmp_path / "run"
    assert main(["--scheme", "pgc-cr", "--n", "4", "--s", "1", "--steps", "4",
                 "--partition-time", "0.2", "--delay", "exp:mean=0.2,seed=1", "--comm-model",
                 f"fitted:{fit}", "--plane", "allgather", "--out", str(out)]) == 0
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert all(r["extra"]["control_rounds"] >= 1 for r in recs)
    for argv, msg in [(["--comm-model", "ring:alpha=1e-5,gbps=25", "--alpha", "1"], "--alpha"),
                      (["--plane", "allreduce"], "collective comm models"),
                      (["--comm-model", "mesh:x=1"], "unknown comm model")]:
        with pytest.raises(SystemExit) as e:
            main(["--steps", "2", "--out", str(tmp_path / "bad"), *argv])
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_new_plane_lets_small_messages_ride_with_the_control_rows():
    """The runtime's rule: payloads ride while the n copies a rank receives fit in
    optimistic_below bytes; then a step needs no allreduce."""
    def run(limit):
        cm = parse_comm_model("ring:alpha=2e-4,beta=1e-9", plane="allreduce",
                              optimistic_below=limit)
        return time_steps(get_scheme("dgd", 4, 0), d=1000, steps=4, partition_time=0.1, comm=cm)
    ride, apart = run(4 * 4000), run(4 * 4000 - 1)
    assert all(r.extra["data_seconds"] < 1e-6 for r in ride)          # decode only
    assert all(r.extra["data_seconds"] > 6 * 2e-4 for r in apart)     # + the allreduce
