"""Multi-rank tests of the pgc_hvd runtime: runtime_checks.py, twin_checks.py and
plane_checks.py under horovodrun. The runs that end cleanly share one launch per world size (the
``launch_group`` fixture: np 4 and np 3); the runs that kill or hang a rank have a launch
each, run side by side with the other modules' (``FAULT_LAUNCHES``); np 5 has its own."""

from pathlib import Path

import pytest
from checks import all_ok, passed

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "runtime_checks.py"
TWIN = HERE / "scripts" / "twin_checks.py"
PLANE = HERE / "scripts" / "plane_checks.py"

NP4 = [("core", "test_core_np4", SCRIPT, ["core"]),
       ("log", "test_log_control_np4", SCRIPT, ["log"]),
       ("twin", "test_runtime_replaying_simulated_arrivals_matches_simulator", TWIN, ["twin"]),
       ("twin-log", "test_log_control_replaying_simulated_arrivals_matches_simulator", TWIN,
        ["twin-log"]),
       ("compress", "test_topk_compression_across_ranks", TWIN, ["compress"])]
NP3 = [("small", "test_small_np3_config_errors_exact_checkpoint", SCRIPT, ["small"]),
       ("log-exact", "test_log_control_exact_np3", SCRIPT, ["log-exact"]),
       ("dense", "test_dense_allreduce_equals_cached_payloads", PLANE, ["dense"]),
       ("sparse", "test_sparse_rows_by_allgather_or_densified_and_rs_with_topk", PLANE,
        ["sparse"])]


LAUNCH_GROUPS = [("horovodrun", 4, NP4), ("horovodrun", 3, NP3)]

DEAD = ["dead", "dead-store"]
HUNG = ["process", "thread"]
NAMED = [("dead-log", "2"), ("hung-log", "2"), ("dead-log-decider", "0"), ("dead-sum", "2"),
         ("hung-sum", "2"), ("dead-sum-0", "0")]
#: the runs that kill or freeze a rank: a launch each, run side by side (conftest.fault_launches)
FAULT_LAUNCHES = (
    [("horovodrun", 3, m, "test_dead_rank_stops_others_with_clear_error", SCRIPT, [m])
     for m in DEAD]
    + [("horovodrun", 3, f"hung-{k}", "test_hung_rank_stops_others_with_clear_error", SCRIPT,
        [f"hung-{k}"]) for k in HUNG]
    + [("horovodrun", 3, m, "test_log_control_names_dead_or_hung_rank", SCRIPT, [m])
       for m, _ in NAMED])


def _checks(proc, np_):
    """The checks rank 0 passed, and how many ranks got to the end (tests/checks.py)."""
    return ({name for name, ranks in passed(proc.stdout).items() if 0 in ranks},
            all_ok(proc.stdout))


@pytest.mark.multirank
def test_core_np4(hvd4):
    """dgd == hvd.DistributedOptimizer; exact schemes decode the full-gradient average; one
    injected straggler is left out and steps stay far below its delay; a NaN message is a
    straggler; parameters bit-identical across ranks under random delays."""
    proc = hvd4.ran("core")
    checks, all_ok = _checks(proc, 4)
    assert all_ok == 4, proc.stdout + proc.stderr
    assert {"dgd_equals_hvd", "exact_dgd_gc-cr_bcgc_bounded-staleness", "straggler_pgc-cr",
            "straggler_bcgc", "nan_message_is_a_straggler", "bit_identical_pgc-cr"} <= checks


@pytest.mark.multirank
def test_small_np3_config_errors_exact_checkpoint(hvd3):
    assert_small(hvd3.ran("small"))


def assert_small(proc):
    checks, all_ok = _checks(proc, 3)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert {"config_errors", "exact_gc-cr_bcgc_rs_gmds", "checkpoint_dgd",
            "checkpoint_pgc-cr", "momentum_correction", "staleness_bound", "exact-store_gc-cr_bcgc_bounded-staleness",
            "straggler-store_pgc-cr"} <= checks
    # the mismatch error names the offending rank on every rank
    assert sum("ranks [1] were built with a different" in l for l in proc.stdout.splitlines()) == 3


@pytest.mark.multirank
@pytest.mark.parametrize("mode", DEAD)
def test_dead_rank_stops_others_with_clear_error(fault, mode):
    proc = fault(mode)
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    assert all("died" in l for l in clear), clear
    assert "NO-ERROR" not in proc.stdout


@pytest.mark.multirank
@pytest.mark.parametrize("kind", HUNG)
def test_hung_rank_stops_others_with_clear_error(fault, kind):
    """A rank that hangs without dying (whole process frozen under pgc-cr; only its training
    thread under dgd) makes the others stop with a clear error after the configured timeout
    (5 s) instead of hanging; the error names the rank the step waits for and says it is alive
    when its control rows kept coming, or that no control round completed when they did not."""
    proc = fault(f"hung-{kind}")
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    assert {l.split("rank=")[1].split()[0] for l in clear} == {"0", "1"}
    assert all("hung" in l and "timeout" in l for l in clear), clear
    if kind == "thread":   # rank 2's rows keep coming: it is named, and known alive
        assert all("waits for ranks [2]" in l and "alive" in l for l in clear), clear
    else:                  # a frozen process stops every collective: the ranks say so
        assert all("no control round has completed" in l or "got no answer" in l
                   for l in clear), clear
    # stopped within the configured timeout of its last completed step (wide margin: 2 cores)
    after = [float(l.split(" after ")[1].split("s ")[0]) for l in clear]
    assert all(4.0 <= a < 15.0 for a in after), clear
    assert "NO-ERROR" not in proc.stdout


@pytest.mark.multirank
def test_log_control_np4(hvd4):
    """control="log": pgc-cr, bcgc and bounded staleness with one slowed rank end with
    identical parameters on every rank, with at most 5 control operations per rank per step
    (the decider's records per step, every rank's mean), also with 0.05 s and 0.3 s of
    emulated compute a step."""
    proc = hvd4.ran("log")
    checks, all_ok = _checks(proc, 4)
    assert all_ok == 4, proc.stdout + proc.stderr
    assert {"log_pgc-cr_0.0", "log_bcgc_0.0", "log_bounded-staleness_0.0", "log_pgc-cr_0.05",
            "log_pgc-cr_0.3"} <= checks


@pytest.mark.multirank
def test_log_control_exact_np3(hvd3):
    proc = hvd3.ran("log-exact")
    checks, all_ok = _checks(proc, 3)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert "exact-log_gc-cr_bcgc_bounded-staleness" in checks


@pytest.mark.multirank
@pytest.mark.parametrize("mode,who", NAMED)
def test_log_control_names_dead_or_hung_rank(fault, mode, who):
    """control="log": a dead rank, a frozen rank (SIGSTOP) and a dead decider (rank 0) stop the
    others with the rank named; ``*-sum``: the same under dgd, whose steps run no control round
    (the rows ride in the data allreduce, runtime/sum_rows.py): the allreduce fails or times
    out and the census over the control store names the rank (rank 0: the store is gone)."""
    proc = fault(mode)
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    if who == "0":
        assert all("rank 0 died" in l for l in clear), clear
    else:
        assert all(f"rank(s) [{who}]" in l and "died or hung" in l for l in clear), clear
    assert "NO-ERROR" not in proc.stdout


@pytest.mark.multirank
def test_runtime_replaying_simulated_arrivals_matches_simulator(hvd4):
    """Given the same arrival pattern (the simulator's arrival log under seeded exponential +
    long-straggler delays, replayed by the agent), the runtime takes the same decisions and its
    decoded updates and parameters match the simulator's within fp32 tolerance (pgc-cr, pgc-cr
    with its ring weighted by age, bcgc)."""
    assert_twin(hvd4.ran("twin"))


def assert_twin(proc):
    checks, all_ok = _checks(proc, 4)
    assert all_ok == 4, proc.stdout + proc.stderr
    assert {"twin_pgc-cr", "twin_pgc-cr_decay", "twin_bcgc"} <= checks


@pytest.mark.multirank
def test_log_control_replaying_simulated_arrivals_matches_simulator(hvd4):
    """control="log" takes the same decisions on the replayed schedules as the allgather path
    (both match the simulator's, step by step): pgc-cr and bcgc."""
    proc = hvd4.ran("twin-log")
    checks, all_ok = _checks(proc, 4)
    assert all_ok == 4, proc.stdout + proc.stderr
    assert {"twin_pgc-cr_log", "twin_bcgc_log"} <= checks


@pytest.mark.multirank
def test_min_error_class_decoder_across_ranks(horovodrun):
    """BCGC's minimum-error decoder under top-kappa, n = 5, s = 2: every rank sends
    ||C(u) - u|| in its control row; the runtime replaying the simulator's arrivals takes the
    simulator's decisions, and each takes the complete class of least total error, in a schedule
    where that is not the class completed first."""
    proc = horovodrun(5, TWIN, "min-error", timeout=180)
    checks, all_ok = _checks(proc, 5)
    assert all_ok == 5, proc.stdout + proc.stderr
    assert {"twin_bcgc_min_error", "min_error_class_decoder"} <= checks


@pytest.mark.multirank
def test_topk_compression_across_ranks(hvd4):
    """TopK(k=d) equals the dense run; small k with error feedback conserves mass on every rank
    and step, the decoded update is the weighted sum of the sparse messages, ranks identical."""
    proc = hvd4.ran("compress")
    checks, all_ok = _checks(proc, 4)
    assert all_ok == 4, proc.stdout + proc.stderr
    assert {"topk_k_equals_d_is_dense", "topk_error_feedback_conserves_mass_bit_identical"} <= checks


@pytest.mark.multirank
def test_dense_allreduce_equals_cached_payloads(hvd3):
    """Dense messages through ONE allreduce of the ranks' weighted contributions decode the same
    updates as the payloads cached with the control rows, for gc-cr, pgc-cr, bcgc,
    bounded-staleness, is-sgd and rs (same replayed arrivals, same decisions); every update and
    the parameters are bit-identical across ranks."""
    proc = hvd3.ran("dense")
    checks, all_ok = _checks(proc, 3)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert "allreduce_equals_cached_dense" in checks


@pytest.mark.multirank
def test_sparse_rows_by_allgather_or_densified_and_rs_with_topk(hvd3):
    """Top-kappa rows travel by allgather when that is fewer bytes and are densified into the
    allreduce otherwise; both equal the cached path. Reed-Solomon's complex messages under
    TopK run in the runtime, and TopK(k=d) equals the dense run."""
    proc = hvd3.ran("sparse")
    checks, all_ok = _checks(proc, 3)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert {"sparse_allgather_and_densified_equal_cached", "rs_with_topk"} <= checks
