"""The torch engine under torchrun (horovod hidden from the ranks): its collectives, the
quick start, and the runtime's multi-rank checks that matter, launched as the horovodrun tests
launch them (the same check scripts and assertions, the engine taken from the launcher). The runs
that end cleanly share one launch per world size (``launch_group``: np 4, 3 and 2); the runs that
kill or hang a rank and the call-order check (its own environment) have their own."""

import importlib.util
from pathlib import Path

import pytest
from checks import all_ok, passed

HERE = Path(__file__).resolve().parent
RUNTIME = HERE.parent / "runtime"
RANKS = RUNTIME / "scripts"   # the runtime tests' rank scripts


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_torchrun_{name}", RUNTIME / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


runtime_tests = _load("test_runtime")
habits_tests = _load("test_horovod_habits")
SCRIPT = RANKS / "runtime_checks.py"

NP4 = [("quickstart", "test_quickstart_under_torchrun_np4_without_horovod",
        HERE / "scripts" / "quickstart_ranks.py", []),
       ("core", "test_core_np4", SCRIPT, ["core"]),
       ("twin", "test_runtime_replaying_simulated_arrivals_matches_simulator",
        RANKS / "twin_checks.py", ["twin"]),
       ("direct-sum", "test_agent_sums_by_direct_exchanges",
        HERE / "scripts" / "torchdist_checks.py", ["direct-sum"])]
HABITS = RANKS / "horovod_habits_checks.py"
# "ops" ends with hvd.shutdown(): last
NP3 = [("small", "test_small_np3_config_errors_exact_checkpoint", SCRIPT, ["small"]),
       ("metrics", "test_metrics_read_from_the_control_rows", HABITS, ["metrics"]),
       ("broadcast", "test_broadcast_optimizer_state_and_rank0_resume", HABITS, ["broadcast"]),
       ("direct-sum", "test_agent_sums_by_direct_exchanges",
        HERE / "scripts" / "torchdist_checks.py", ["direct-sum"]),
       ("ops", "test_torch_engine_collectives", HERE / "scripts" / "torchdist_checks.py", ["ops"])]




def _train_cli(cwd):
    return ["train", "--scheme", "pgc-cr", "--stragglers", "1", "--model", "softmax",
            "--steps", "8", "--lr", "0.1", "--momentum", "0.9", "--delay", "exp:mean=0.01,seed=1",
            "--timeout", "60", "--out", cwd / "run"]


NP2 = [("surface", "test_horovod_keywords_fp16_and_refusals", HABITS, ["surface"]),
       ("train-cli", "test_train_cli_under_torchrun_without_horovod", "-m pgc_hvd", _train_cli)]
LAUNCH_GROUPS = [("torchrun", 4, NP4), ("torchrun", 3, NP3), ("torchrun", 2, NP2)]
#: a dead rank and a frozen one: a launch each, side by side with the other faults (conftest);
#: at np 3 the agents' sums go by direct exchanges (torchdist.direct_sum), as at any n in 3-8
FAULT_LAUNCHES = [("torchrun", 3, m, t, SCRIPT, [m]) for m, t in (
    ("dead", "test_dead_rank_stops_others_with_clear_error"),
    ("hung-sum", "test_hung_rank_under_dgd_is_named_by_the_census"))] + [
    ("torchrun", 3, m, "test_dead_rank_named_on_the_s0_path_and_the_control_log", SCRIPT, [m])
    for m in ("dead-sum", "dead-log")] + [
    ("torchrun", 3, m, "test_direct_sum_with_a_dead_or_frozen_partner",
     HERE / "scripts" / "torchdist_checks.py", [m]) for m in ("direct-sum-dead", "direct-sum-hung")]


def _checks(proc):
    """The checks rank 0 passed, and how many ranks got to the end (tests/checks.py)."""
    return ({name for name, ranks in passed(proc.stdout).items() if 0 in ranks},
            all_ok(proc.stdout))


@pytest.mark.multirank
def test_torch_engine_collectives(torch3):
    """allgather of equal and different row lengths, alltoall, allreduce (bits equal on every
    rank), broadcasts, broadcast_optimizer_state (the version travels), a thread on its own
    groups beside the training thread."""
    proc = torch3.ran("ops")
    checks, all_ok = _checks(proc)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert {"allgather_equal_and_variable_lengths", "allreduce_alltoall_broadcast",
            "broadcast_parameters_and_optimizer_state", "threads_on_their_own_groups"} <= checks


@pytest.mark.multirank
def test_call_order_check_names_the_rank(torchrun):
    proc = torchrun(3, HERE / "scripts" / "torchdist_checks.py", "order", timeout=120,
                    env={"PGC_HVD_TORCH_CHECK_ORDER": "1"})
    checks, all_ok = _checks(proc)
    assert all_ok == 3 and "order_mismatch_named" in checks, proc.stdout + proc.stderr


@pytest.mark.multirank
def test_quickstart_under_torchrun_np4_without_horovod(torch4):
    """`torchrun --nproc-per-node 4 launch/quickstart.py` trains with pgc-cr and ends with the
    same parameters on every rank, on ranks where horovod cannot be imported."""
    proc = torch4.ran("quickstart")
    ok = [l for l in proc.stdout.splitlines() if "QUICKSTART-OK" in l]
    assert len(ok) == 4, proc.stdout + proc.stderr
    assert len({l.split("hash=")[1].split()[0] for l in ok}) == 1, ok
    assert "training accuracy" in proc.stdout


@pytest.mark.multirank
def test_train_cli_under_torchrun_without_horovod(torch2):
    """``torchrun -m pgc_hvd train`` (the README's main job's CLI) runs on the torch engine on
    ranks where horovod cannot be imported: records and summary written, every step decided,
    the remedy's ring decay recorded (momentum 0.9 -> rho = 0.1)."""
    import json
    out = torch2.ran("train-cli").cwd / "run"
    summ = json.loads((out / "summary.json").read_text())
    recs = [json.loads(l) for l in (out / "records.jsonl").read_text().splitlines()]
    assert summ["n"] == 2 and summ["steps"] == 8 and [r["step"] for r in recs] == list(range(8))
    assert all(abs(r["extra"]["ring_decay"] - 0.1) < 1e-12 for r in recs)


@pytest.mark.multirank
def test_core_np4(torch4):
    """dgd == torch's DDP; exact schemes decode the full-gradient average; one injected
    straggler is left out; a NaN message is a straggler; parameters bit-identical across ranks
    under random delays."""
    proc = torch4.ran("core")
    checks, all_ok = _checks(proc)
    assert all_ok == 4, proc.stdout + proc.stderr
    assert {"dgd_equals_ddp", "exact_dgd_gc-cr_bcgc_bounded-staleness", "straggler_pgc-cr",
            "straggler_bcgc", "nan_message_is_a_straggler", "bit_identical_pgc-cr"} <= checks


@pytest.mark.multirank
def test_small_np3_config_errors_exact_checkpoint(torch3):
    runtime_tests.assert_small(torch3.ran("small"))


# The faults on the torch engine: a dead rank (named with its pid, from the engine's record of
# the ranks' processes) and a frozen one on the default plane, whose detection goes through the
# engine's own collectives. Which control plane a fault meets (allgather, store, log, the s = 0
# path), and a hung training thread beside a live agent, are the runtime's logic, the same on
# both engines: tests/runtime/test_runtime.py runs each under horovodrun, and the DDP door's
# dead-rank tests (tests/ddp/) run the default control plane on this engine.
@pytest.mark.multirank
def test_dead_rank_stops_others_with_clear_error(fault):
    """As under horovodrun; and the torch engine names the dead rank and its pid."""
    proc = fault("dead")
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    assert all("died" in l for l in clear), clear
    assert "NO-ERROR" not in proc.stdout
    assert any("rank 2 (pid" in l for l in clear), clear


@pytest.mark.multirank
def test_hung_rank_under_dgd_is_named_by_the_census(fault):
    """dgd on the default plane (the s = 0 path: no control round) with rank 2 frozen: the
    others' allreduce times out and the census names it."""
    proc = fault("hung-sum")
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    assert all("rank(s) [2]" in l and "died or hung" in l for l in clear), clear
    assert "NO-ERROR" not in proc.stdout


@pytest.mark.multirank
@pytest.mark.parametrize("np_", [4, 3])
def test_agent_sums_by_direct_exchanges(np_, request):
    """An agent's data group sums CPU tensors by direct exchanges (a reduce-scatter and an
    allgather): the sum to float rounding with the same bits on every rank, odd sizes, every
    float dtype; what it does not take (fewer elements than ranks, integers, Max) keeps gloo's
    allreduce."""
    proc = request.getfixturevalue(f"torch{np_}").ran("direct-sum")
    checks, all_ok = _checks(proc)
    assert all_ok == np_ and "direct_sums" in checks, proc.stdout + proc.stderr


@pytest.mark.multirank
@pytest.mark.parametrize("how", ["dead", "hung"])
def test_direct_sum_with_a_dead_or_frozen_partner(how, fault):
    """np 3, rank 2 gone or frozen before a direct sum: with a dead partner the sum fails at
    once; with a frozen one it stays not completed until the allreduce's deadline, as a gloo
    collective does for the agent's wait (no error from gloo's point-to-point timeout)."""
    proc = fault(f"direct-sum-{how}")
    assert passed(proc.stdout).get(f"direct_sum_{how}") == [0, 1], proc.stdout + proc.stderr


@pytest.mark.multirank
@pytest.mark.parametrize("mode", ["dead-sum", "dead-log"])
def test_dead_rank_named_on_the_s0_path_and_the_control_log(mode, fault):
    """np 3 (the data sums by direct exchanges): dgd on the s = 0 path and pgc-cr on the
    control log with rank 2 dead: every other rank stops naming rank 2 (a frozen rank under
    dgd: ``test_hung_rank_under_dgd_is_named_by_the_census``)."""
    proc = fault(mode)
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    assert all("died" in l and "2" in l for l in clear), clear
    assert "NO-ERROR" not in proc.stdout


@pytest.mark.multirank
def test_runtime_replaying_simulated_arrivals_matches_simulator(torch4):
    runtime_tests.assert_twin(torch4.ran("twin"))


@pytest.mark.multirank
def test_broadcast_optimizer_state_and_rank0_resume(torch3):
    habits_tests.assert_broadcast(torch3["broadcast"])


@pytest.mark.multirank
def test_horovod_keywords_fp16_and_refusals(torch2):
    habits_tests.assert_surface(torch2["surface"])


@pytest.mark.multirank
def test_metrics_read_from_the_control_rows(torch3):
    habits_tests.assert_metrics(torch3.ran("metrics"))
