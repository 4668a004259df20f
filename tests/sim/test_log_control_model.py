"""The model of the runtime's ``control="log"`` path (pgc_hvd.sim.log_costs, pgc_hvd.sim.log_agents,
CollectiveModel.control): its formulas, its operation counts per rank per step, how it grows with
n, and one step timed by hand -- virtual time only."""

import json
import math

import pytest

from pgc_hvd.schemes import get_scheme
from pgc_hvd.sim.comm import CollectiveModel, Network
from pgc_hvd.sim.log_costs import (FORMAT, LogCosts, bcast_bytes, line_bytes, load_log_fit,
                                   tree_depth)
from pgc_hvd.sim.timing import time_steps

def line(a, b, row):
    """Measured points of a body run costing a + b n, and ``row`` per row, at any n."""
    return ((1, a + b, row), (2, a + 2 * b, row))


COSTS = LogCosts(rtt=1e-4, local_rtt=5e-5, get_beta=1e-9, fan_op=2e-4, fan_beta=2e-9,
                 decider=line(6e-5, 1e-6, 2e-5), follower=line(5e-5, 1e-6, 1e-5), source="test")
NET = Network.link(1e-3, 1e-9)


def model(control="log", costs=COSTS, **kw):
    return CollectiveModel(NET, control=control, log=costs, **kw)


# ------------------------------------------------------------------------------ formulas
def test_cost_formulas():
    c = COSTS
    assert c.append_delay(0) == 0.0                       # rank 0's rows: in-process
    assert c.append_delay(3) == pytest.approx(5e-5 + 2.5e-5)   # one-way push, reader's answer
    assert c.run_seconds("decider", 100) == pytest.approx(6e-5 + 1e-4)
    assert c.row_seconds("decider", 100) == pytest.approx(2e-5)
    assert c.body_seconds("follower", 100, 3, 7) == pytest.approx(3 * 1.5e-4 + 7 * 1e-5)
    assert c.fanout(7, 1000) == pytest.approx(7 * (2e-4 + 2e-6))
    assert c.publish(1000) == pytest.approx(1e-6)
    dc = c.on_link(1e-5, 3e-10)
    assert dc.rtt == pytest.approx(1e-4 + 2e-5) and dc.fan_beta == 3e-10
    assert dc.fanout(1, 0) == pytest.approx(1e-5 + 2e-4)  # transit + the server's answer
    # the body's cost between and beyond measured points: straight lines
    pts = LogCosts(0, 0, 0, 0, 0, decider=((256, 1e-3, 3e-5), (4, 1e-4, 1e-5), (64, 2e-4, 2e-5)))
    assert pts.decider[0] == (4, 1e-4, 1e-5)              # sorted by n
    assert pts.run_seconds("decider", 34) == pytest.approx(1.5e-4)
    assert pts.row_seconds("decider", 34) == pytest.approx(1.5e-5)
    assert pts.run_seconds("decider", 1024) == pytest.approx(1e-3 + 768 * 8e-4 / 192)
    assert pts.run_seconds("decider", 1) == pytest.approx(1e-4 - 3e-4 / 60 * 1)
    assert pts.run_seconds("follower", 64) == 0.0         # none measured
    # the runtime's broadcast buffer: 2n + 8 lines and a 16-byte header, or the outcome
    assert bcast_bytes(4, 100, 2) == 16 + 16 * line_bytes(2)
    assert bcast_bytes(4, 1e6, 2) == 16 + 1e6
    assert (dc.decider, dc.follower, dc.local_rtt) == (c.decider, c.follower, c.local_rtt)
    free = LogCosts.free()
    assert free.append_delay(5) == free.fanout(9, 1e6) == 0
    assert free.body_seconds("decider", 1024, 10, 1024) == 0
    assert line_bytes(65) == 8 * (1 + 11 + 65)
    assert [tree_depth(n) for n in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]
    with pytest.raises(ValueError, match="rtt"):
        LogCosts(-1.0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="decider"):
        LogCosts(0, 0, 0, 0, 0, decider=(1.0,))
    with pytest.raises(ValueError, match="distinct"):
        LogCosts(0, 0, 0, 0, 0, decider=((4, 1.0, 0.0), (4, 2.0, 0.0)))


def test_control_paths_are_checked():
    assert CollectiveModel(NET).control == "allgather"
    with pytest.raises(ValueError, match="choose one of"):
        model(control="gossip")
    with pytest.raises(ValueError, match="needs its costs"):
        CollectiveModel(NET, control="log")
    with pytest.raises(ValueError, match="plane='allreduce'"):
        model(plane="allgather")
    assert "control=log-store" in model(control="log-store").describe(8)


def test_follow_is_log_depth_by_the_broadcast_and_quadratic_through_one_store():
    """m = n rows a step in b = 5 batches, B = (m + b - 1) L bytes: the runtime's broadcast
    of its buffer (bcast_bytes) costs ceil(log2 n) (alpha + B_bcast beta) for the decider and
    the last follower; the store (the what-if) answers (n-1)(fan_op + B fan_beta), then each
    follower deletes its row (rtt: the runtime of that time). Then each follower replays the
    body, (1 + b) runs on the m rows (the log is a queue: nothing to delete)."""
    L, b = line_bytes(4), 5
    for n in (8, 64, 1024):
        B = (n + b - 1) * L
        body = COSTS.body_seconds("follower", n, 1 + b, n)
        tree = tree_depth(n) * (1e-3 + bcast_bytes(n, B, 4) * 1e-9)
        follow, own = model().log_follow(n, n, b, 4)
        assert own == pytest.approx(tree)
        assert follow == pytest.approx(tree + body)
        store, own = model(control="log-store").log_follow(n, n, b, 4)
        assert own == pytest.approx(B * 1e-9 + 5e-5)
        assert store == pytest.approx(B * 1e-9 + (n - 1) * (2e-4 + B * 2e-9) + 1e-4 + body)
    # the bytes alone (no per-answer or body cost): the store's delivery grows like n^2
    # ((n-1) n L bytes leave one server), the broadcast's like n log n (its buffer ~ 2n lines,
    # log2 n rounds)
    flat = LogCosts(0.0, 0.0, 1e-9, 0.0, 2e-9)
    store = [model(control="log-store", costs=flat).log_follow(n, n, 1, 4)[0] for n in (64, 1024)]
    tree = [model(costs=flat).log_follow(n, n, 1, 4)[0] for n in (64, 1024)]
    assert store[1] / store[0] == pytest.approx(1023 * 1024 / (63 * 64), rel=0.01)
    assert tree[1] / tree[0] < 0.5 * store[1] / store[0]
    assert model().log_follow(1, 1, 1, 4) == (0.0, 0.0)


def test_load_log_fit(tmp_path):
    doc = {"format": FORMAT, "store": {"rtt": 1e-5, "beta": 3e-10, "fan_latency": 3e-4,
                                       "fan_op": 1e-4, "fan_beta": 1e-9},
           "body": {"samples": [{"n": 4, "decider": {"run": 7e-5, "row": 2e-5},
                                 "follower": {"run": 5e-5, "row": 1e-5}},
                                {"n": 64, "decider": {"run": 2e-4, "row": 3e-5},
                                 "follower": {"run": 1.5e-4, "row": 1e-5}}]}}
    p = tmp_path / "log.json"
    p.write_text(json.dumps(doc))
    c = load_log_fit(p)
    assert (c.rtt, c.local_rtt, c.fan_op, c.fan_latency) == (1e-5, 1e-5, 1e-4, 3e-4)
    assert c.decider == ((4, 7e-5, 2e-5), (64, 2e-4, 3e-5))
    assert c.run_seconds("follower", 34) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="measure_log_control"):
        load_log_fit(tmp_path / "none.json")
    p.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a"):
        load_log_fit(p)


# ------------------------------------------------------------------------------ the engine
def test_one_dgd_step_timed_by_hand():
    """DGD, n = 4, no delays, free local passes: every rank is ready at T = 0.2 s. Rank 0's
    row is in the decider's hands at T and makes a batch alone: run + row = 3e-4 s. Ranks 1-3
    land meanwhile (T + a, + r, + 2r with a = rtt / 2 + r / 2 = 7.5e-5, r = local_rtt =
    5e-5), so they make the second batch, which fires: D = T + 2 run + 4 row. The outcome
    (4 rows in 2 batches, one separator line) goes out by one broadcast of the runtime's
    buffer (2 rounds of the tree); each follower replays 1 + 2 runs on the 4 rows; then the allreduce of 4d bytes. (The runtime before its s = 0 path:
    ``rows_in_sum=False``; with it, test_dgd_on_the_s0_path_runs_no_control_round.)"""
    n, d, T = 4, 1000, 0.2
    costs = LogCosts(rtt=1e-4, local_rtt=5e-5, get_beta=1e-9, fan_op=2e-4, fan_beta=2e-9,
                     decider=((1, 2.5e-4, 5e-5),), follower=((1, 1e-4, 1e-5),))
    cm = model(costs=costs).replace(rows_in_sum=False)
    recs = time_steps(get_scheme("dgd", n, 0), d, 2, T, comm=cm)
    h = get_scheme("dgd", n, 0).lookback
    B = (4 + 1) * line_bytes(h)
    D = T + 2 * 2.5e-4 + 4 * 5e-5
    follow = 2 * (1e-3 + bcast_bytes(n, B, h) * 1e-9) + 3 * 1e-4 + 4 * 1e-5
    assert recs[0].time == pytest.approx(D + follow + NET.allreduce.allreduce(n, 4 * d))
    e = recs[0].extra
    assert e["log_batches"] == 2 and e["control_rounds"] == 2
    assert e["control_ops"] == 3 + 1     # rank 0: 3 reads, the broadcast
    assert e["control_ops_others"] == e["control_ops_others_max"] == 2  # the push, the bcast
    assert e["follow_seconds"] == pytest.approx(follow)
    assert e["decider_lag"] == pytest.approx(D - (T + 7.5e-5 + 2 * 5e-5))


def test_dgd_on_the_s0_path_runs_no_control_round():
    """The runtime's s = 0 path (runtime/sum_rows.py): every rank ready at T, no control
    round, ONE allreduce of the 4d bytes and the n row slots (3 ctrl_len float32 words each):
    the step is T + that allreduce, however dear the log's costs; pgc-cr at s = 0 too, at
    s = 1 the round again."""
    n, d, T = 4, 1000, 0.2
    costs = LogCosts(rtt=1e-4, local_rtt=5e-5, get_beta=1e-9, fan_op=2e-4, fan_beta=2e-9,
                     decider=((1, 2.5e-4, 5e-5),), follower=((1, 1e-4, 1e-5),))
    h = get_scheme("dgd", n, 0).lookback
    slots = 4 * 3 * n * (11 + h)
    for scheme, s in (("dgd", 0), ("pgc-cr", 0)):
        recs = time_steps(get_scheme(scheme, n, s), d, 3, T, comm=model(costs=costs))
        assert recs[0].time == pytest.approx(T + NET.allreduce.allreduce(n, 4 * d + slots))
        assert all(r.extra["control_rounds"] == 0 == r.extra["control_ops"] for r in recs)
        assert sorted(recs[-1].workers_used) == list(range(n))
    one = time_steps(get_scheme("pgc-cr", n, 1), d, 3, T, comm=model(costs=costs))
    assert one[0].extra["control_rounds"] >= 1


@pytest.mark.parametrize("scheme,s", [("dgd", 0), ("pgc-cr", 1), ("bcgc", 1)])
def test_a_few_control_operations_per_rank_per_step_whatever_the_compute(scheme, s):
    """As the runtime's records: a rank > 0 makes 4 control operations a step (add, set, the
    broadcast, delete; more when a late row of the previous step falls in the window), rank 0
    about n; not growing with the compute time."""
    n = 4
    for compute in (0.05, 0.5):
        recs = time_steps(get_scheme(scheme, n, s), 10_000, 12, compute,
                          delay="exp:mean=0.1,seed=3", comm=model().replace(rows_in_sum=False))
        ops = [r.extra["control_ops"] for r in recs[1:]]
        others = [r.extra["control_ops_others"] for r in recs[1:]]
        assert max(r.extra["control_ops_others_max"] for r in recs[1:]) <= 7
        assert sum(others) / len(others) <= 5
        assert sum(ops) / len(ops) == pytest.approx(n, abs=1.0)


def test_log_path_grows_with_n_and_the_broadcast_removes_the_store_term():
    """At n = 128 the one-store delivery (the what-if) costs more than the runtime's
    broadcast, and a free control is fastest; the broadcast still pays the followers' body on
    n rows."""
    n, d = 128, 100_000
    sch = lambda: get_scheme("pgc-cr", n, n // 16)   # noqa: E731
    t = {}
    for name, cm in (("store", model(control="log-store")), ("bcast", model()),
                     ("free", model(costs=LogCosts.free()))):
        recs = time_steps(sch(), d, 6, 0.2, delay="exp:mean=0.2,seed=1", comm=cm)
        t[name] = recs
    follow = {k: sum(r.extra["follow_seconds"] for r in v[2:]) / 4 for k, v in t.items()}
    assert follow["free"] == 0.0
    body = n * COSTS.row_seconds("follower", n) + 2 * COSTS.run_seconds("follower", n)
    assert follow["bcast"] >= body
    # the store answers 127 followers one by one (>= 127 fan_op), the tree takes 7 rounds
    assert follow["store"] - follow["bcast"] > (n - 1) * 2e-4 - 7 * (1e-3 + 3e5 * 1e-9)
    assert t["free"][-1].time < t["bcast"][-1].time < t["store"][-1].time


def test_log_and_polled_paths_take_the_same_decisions_with_free_control():
    """With no control cost the log path decides the step at the (n-s)-th ready message, in
    ready order: the same ranks as the polled path with a tiny poll interval."""
    n, fast = 6, Network.link(1e-9, 0.0)
    free = time_steps(get_scheme("pgc-cr", n, 2), 1000, 8, 0.1, delay="exp:mean=0.1,seed=2",
                      comm=CollectiveModel(fast, control="log", log=LogCosts.free()))
    polled = time_steps(get_scheme("pgc-cr", n, 2), 1000, 8, 0.1, delay="exp:mean=0.1,seed=2",
                        comm=CollectiveModel(fast, poll_interval=1e-7))
    assert [sorted(r.workers_used) for r in free] == [sorted(r.workers_used) for r in polled]
    for a, b in zip(free, polled):
        assert math.isclose(a.time, b.time, rel_tol=1e-3)


def test_simulate_command_runs_the_log_control_path(tmp_path, capsys):
    """``pgc-hvd simulate --control log`` prices the log path (its operation counts in
    the records, as the runtime's); options that cannot go with it are refused by name."""
    from pgc_hvd.apps.simulate import main
    doc = {"format": FORMAT, "store": {"rtt": 1e-4, "beta": 1e-9, "fan_latency": 2e-4,
                                       "fan_op": 2e-4, "fan_beta": 2e-9},
           "body": {"samples": [{"n": 4, "decider": {"run": 7e-5, "row": 2e-5},
                                 "follower": {"run": 5e-5, "row": 1e-5}}]}}
    fit = tmp_path / "log.json"
    fit.write_text(json.dumps(doc))
    base = ["--scheme", "pgc-cr", "--n", "4", "--s", "1", "--steps", "6", "--partition-time",
            "0.2", "--delay", "exp:mean=0.2,seed=1", "--comm-model", "ring:alpha=1e-5,gbps=25"]
    for control in ("allgather", "log"):
        out = tmp_path / control
        assert main([*base, "--control", control, "--out", str(out)]
                    + (["--log-fit", str(fit)] if control == "log" else [])) == 0
        recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
        ops = [r["extra"]["control_ops_others"] for r in recs[1:]] if control == "log" else []
        assert all(o <= 7 for o in ops)
        assert ("log_batches" in recs[-1]["extra"]) == (control == "log")
    for argv, msg in [(["--log-fit", str(fit)], "needs --control log"),
                      (["--control", "log", "--log-fit", str(tmp_path / "none.json")],
                       "measure_log_control"),
                      (["--control", "log", "--log-fit", str(fit), "--plane", "allgather"],
                       "carries no payloads"),
                      (["--comm-model", "master", "--control", "log"],
                       "collective comm models")]:
        with pytest.raises(SystemExit) as e:
            main([*base, "--out", str(tmp_path / "bad"), *argv])
        assert e.value.code == 2
        assert msg in capsys.readouterr().err
