"""The simulator drives every scheme with real gradients; its invariants are checked against
the engine's own arrival log (time, worker, step at the decoder)."""

import json

import numpy as np
import pytest
import torch

from pgc_hvd.data import load_dataset, partition, train_test_split
from pgc_hvd.models import build_task
from pgc_hvd.schemes import SCHEMES, get_scheme
from pgc_hvd.delays import DelayTrace, Exponential, LongStraggler, Recording, Replay
from pgc_hvd.sim.engine import SimConfig, Simulator

N, S, STEPS = 6, 1, 6

OPTIONS = {"bounded-staleness": {"r": 2, "c": 2}, "is-gc": {"c": 2}}
FIRST_K = {"is-sgd", "gc-cr", "pgc-cr", "pgc-cr-naive", "is-gc", "gmds", "rs", "cyclic-mds"}


@pytest.fixture(scope="module")
def digits():
    tr, te = train_test_split(load_dataset("digits"), 0.3, seed=0)
    return tr.subset(np.arange(240)), te.subset(np.arange(100))


def run(digits, name, n=N, s=S, steps=STEPS, delay=None, model="softmax", **cfg):
    tr, te = digits
    task = build_task(model, tr, seed=0)
    s = 0 if name == "dgd" else s     # dgd takes s = 0 only (it waits for every worker)
    scheme = get_scheme(name, n, s, **OPTIONS.get(name, {}))
    config = SimConfig(steps=steps, delay=delay if delay is not None else Exponential(1.0, seed=1),
                       partition_time=0.5, **cfg)
    sim = Simulator(scheme, task, tr, partition(tr.y, n, seed=0),
                    lambda p: torch.optim.SGD(p, lr=0.3), config, test=te)
    return sim, sim.run()


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_scheme_fires_only_when_its_rule_holds(digits, name):
    sim, recs = run(digits, name)
    assert [r.step for r in recs] == list(range(STEPS))
    times = [r.time for r in recs]
    assert all(b >= a for a, b in zip(times, times[1:]))
    log = sim.arrival_log
    for r in recs:
        T, t = r.time, r.step
        arrived = [(a, w) for a, w, st in log if st == t and a <= T]
        order = [w for _, w in sorted(arrived)]
        assert all(np.isfinite(x) and 0 <= x <= r.step_time + 1e-9 for x in r.busy)
        # every message used had reached the decoder by the firing time
        for w, v in zip(r.workers_used, r.versions):
            assert any(a <= T and ww == w for a, ww, st in log if st <= t)
        if name == "dgd":
            assert sorted(order) == list(range(N))
            assert len(arrived) == N and max(a for a, _ in arrived) == pytest.approx(T)
        elif name in FIRST_K or (name in ("gc-fr", "pgc-fr")):
            # fired at exactly the (n-s)-th arrival of the current step
            assert r.extra["n_arrived"] == N - S
            assert len(arrived) >= N - S
            assert sorted(a for a, _ in arrived)[N - S - 1] == pytest.approx(T)
        elif name in ("bcgc", "pgc-bcgc", "gfrc"):
            # the used workers are complete: every partition covered exactly once
            assert r.extra["partition_weight_min"] == pytest.approx(1.0)
            assert r.extra["partition_weight_max"] == pytest.approx(1.0)
            if name != "gfrc":  # class recovery: no class was complete before T
                classes = sim.scheme.code.classes
                first = {w: a for a, w in sorted(arrived, reverse=True)}
                done = [max(first.get(w, np.inf) for w in K) for K in classes]
                assert min(done) == pytest.approx(T)
        elif name == "bounded-staleness":
            assert r.max_age < 2
            assert sorted(w % N for w in r.workers_used) is not None
            if "n_fresh" in r.extra:    # replay="once" (the remedy under momentum): the new
                # entries, at least n - s, each counted once; every shard's entry younger than c
                assert N - S <= len(r.workers_used) == r.extra["n_fresh"] <= N
                assert r.extra["n_fresh"] + r.extra["replayed"] == N
                assert r.extra["table_max_age"] < 2
            else:                       # the note's rule (plain SGD): the whole table
                assert len(r.workers_used) == N  # one table entry per shard
        if sim.scheme.exact and not sim.scheme.pipelined and name != "bounded-staleness":
            assert r.max_age == 0 and r.extra["err_total"] < 1e-8
        assert r.loss is not None and np.isfinite(r.loss)


def test_replayed_trace_gives_identical_records(digits, tmp_path):
    model = Exponential(1.0, seed=3) + LongStraggler(0.2, 3.0, 6.0, seed=3)
    rec = Recording(model)
    _, first = run(digits, "pgc-cr", delay=rec, steps=8)
    path = rec.trace.save(tmp_path / "trace.json")
    for name in ("pgc-cr",):
        _, again = run(digits, name, delay=Replay(DelayTrace.load(path)), steps=8)
        assert [r.to_json() for r in again] == [r.to_json() for r in first]
    # another scheme replays the same schedule (every (worker, step) it needs is in the trace
    # or falls back to the model)
    _, other = run(digits, "gc-cr", delay=Replay(path, fallback=model), steps=8)
    assert len(other) == 8
    # a trace from a shorter run is refused before the run, not at its first gap
    with pytest.raises(ValueError, match="no step past 7, but the run has n=6 workers and 9 steps"):
        run(digits, "pgc-cr", delay=Replay(path), steps=9)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_every_schemes_recorded_trace_passes_the_up_front_check(digits, name):
    """check_trace_covers never refuses the trace of a run of the same n and steps, even where
    workers skip steps (stragglers that fall behind a pipelined or first-k scheme)."""
    from pgc_hvd.delays import check_trace_covers
    rec = Recording(Exponential(1.0, seed=5) + LongStraggler(0.3, 4.0, 8.0, seed=5))
    run(digits, name, delay=rec, steps=STEPS)
    check_trace_covers(Replay(rec.trace), N, STEPS)


def test_exact_schemes_match_dgd_without_stragglers(digits):
    _, base = run(digits, "dgd", delay="none")
    for name in ("gc-cr", "bcgc", "gfrc", "gc-fr"):
        _, recs = run(digits, name, delay="none")
        assert np.allclose([r.loss for r in recs], [r.loss for r in base], rtol=1e-4, atol=1e-6)


def test_time_model_dgd_waits_for_slowest(digits):
    from pgc_hvd.sim.comm import CommModel
    sim, recs = run(digits, "dgd", delay="const:value=2", steps=3, comm=CommModel(0.01, 1e9))
    # each step: broadcast + one partition (0.5 s) + delay 2 s + message, all alpha = 0.01 + bytes/b
    msg = 0.01 + sim.d * 4 / 1e9
    assert recs[0].step_time == pytest.approx(0.5 + 2 + msg)
    assert recs[1].step_time == pytest.approx(msg + 0.5 + 2 + msg)
    assert all(r.extra["partition_time"] == 0.5 for r in recs)


def test_pgc_evaluates_one_partition_per_step_gc_evaluates_c(digits):
    sim_p, rp = run(digits, "pgc-cr", n=6, s=2, delay="none")
    sim_g, rg = run(digits, "gc-cr", n=6, s=2, delay="none")
    # warm-up step 0 evaluates c = 3 partitions, later steps one each (PGC) vs c each (GC)
    assert sim_p.total_evals <= 6 * 3 + 6 * (STEPS - 1) + 6
    assert sim_g.total_evals >= 6 * 3 * STEPS - 6 * 3
    assert rp[-1].time < rg[-1].time


def test_compression_cuts_bytes_and_min_error_decoder(digits):
    _, dense = run(digits, "bcgc", n=6, s=2, delay="fixed:n=6,count=2,delay=3")
    _, sparse = run(digits, "bcgc", n=6, s=2, delay="fixed:n=6,count=2,delay=3", compress=0.05)
    assert sum(r.extra["bytes_used"] for r in sparse) < 0.2 * sum(r.extra["bytes_used"] for r in dense)
    assert all(r.extra["err_compress"] > 0 for r in sparse)
    tr, te = digits
    scheme = get_scheme("bcgc", 6, 2, decoder="min-error")
    sim = Simulator(scheme, build_task("softmax", tr), tr, partition(tr.y, 6, iid=False),
                    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                    SimConfig(steps=4, partition_time=0.1, compress=0.05, error_feedback=True,
                              delay="exp:1"), test=te)
    recs = sim.run()
    assert all("class_error" in r.extra for r in recs)


def test_cancel_policy_and_cnn_and_records_jsonl(digits, tmp_path):
    from pgc_hvd.metrics.records import RecordWriter, read_records
    tr, te = digits
    with RecordWriter(tmp_path / "r.jsonl") as wr:
        sim = Simulator(get_scheme("pgc-fr", 4, 1), build_task("cnn", tr), tr, partition(tr.y, 4),
                        torch.optim.Adam, SimConfig(steps=3, partition_time=0.2, delay="exp:2",
                                                    straggler_policy="cancel"), writer=wr)
        sim.run()
    rows = list(read_records(tmp_path / "r.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[0]["scheme"] == "pgc-fr"
    json.dumps(rows)


def test_staleness_diagnostics_present(digits):
    _, recs = run(digits, "bounded-staleness", n=4, s=1,
                  delay=LongStraggler(0.3, 2.0, 4.0, seed=2), steps=8)
    stale = [r for r in recs if r.extra["n_stale_entries"] > 0]
    assert stale, "long stragglers should leave stale table entries"
    for r in stale:
        assert r.extra["disp_max"] > 0 and -1 <= r.extra["corr_min"] <= 1 and r.extra["L_hat_max"] >= 0
        parts = r.extra["err_coding"] + r.extra["err_stale"] + r.extra["err_compress"]
        assert r.extra["err_total"] <= 3 * parts + 1e-12  # ||a+b+c||^2 <= 3 (|a|^2+|b|^2+|c|^2)


def test_a_diverged_run_ends_marked_instead_of_raising(digits):
    """lr 1e38 makes the gradients (then the parameters) non-finite within a few steps: the run
    stops there with ``sim.diverged`` set instead of raising from the decoder, its records kept
    up to that step; a healthy run has ``diverged`` None."""
    tr, te = digits
    task = build_task("softmax", tr, seed=0)
    scheme = get_scheme("bounded-staleness", N, S, r=2, c=2)
    sim = Simulator(scheme, task, tr, partition(tr.y, N, seed=0),
                    lambda p: torch.optim.SGD(p, lr=1e38, momentum=0.9),
                    SimConfig(steps=200, delay=Exponential(1.0, seed=1), partition_time=0.5),
                    test=te)
    recs = sim.run()
    assert sim.diverged is not None and len(recs) <= sim.diverged < 200
    healthy, _ = run(digits, "pgc-cr")
    assert healthy.diverged is None
