"""Multi-rank tests of the consistency faults (each launches consistency_fault_checks.py under
horovodrun): non-finite parameters on one rank, ranks that differ at close(), a rank that stops
early, settings that must agree across ranks, fp16/bf16/fp64 models, a skipped backward. The two
runs that end cleanly share one launch (``launch_group``); the runs that stop every rank have a
launch each, run side by side with the other modules' (``FAULT_LAUNCHES``)."""

import re
from pathlib import Path

import pytest
from checks import all_ok, passed

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "consistency_fault_checks.py"
CLEAN = [("clean", "test_early_stop_catches_up_at_close_and_mixed_precision", SCRIPT, ["clean"]),
         ("config", "test_settings_that_must_agree_are_compared_and_named", SCRIPT, ["config"])]


LAUNCH_GROUPS = [("horovodrun", 3, CLEAN)]
#: the runs that stop every rank: a launch each, side by side (conftest.fault_launches)
FAULT_LAUNCHES = (
    [("horovodrun", 3, f"nonfinite-{b}", "test_nonfinite_parameters_stop_every_rank_naming_rank_and_step",
      SCRIPT, ["nonfinite", b]) for b in (0, 1)]
    + [("horovodrun", 3, "diverged", "test_close_compares_parameters_across_ranks", SCRIPT,
        ["diverged"]),
       ("horovodrun", 3, "skipped", "test_skipped_backward_in_batches_is_refused", SCRIPT,
        ["skipped"])])


def _checks(proc):
    """The checks rank 0 passed, and how many ranks got to the end (tests/checks.py)."""
    return ({name for name, ranks in passed(proc.stdout).items() if 0 in ranks},
            all_ok(proc.stdout))


def _clear_errors(proc, np_):
    clear = {int(m.group(1)): m.group(2) for m in
             re.finditer(r"CLEAR-ERROR rank=(\d+): (.*)", proc.stdout)}
    assert "NO-ERROR" not in proc.stdout, proc.stdout + proc.stderr
    assert sorted(clear) == list(range(np_)), proc.stdout + proc.stderr
    return clear


@pytest.mark.multirank
@pytest.mark.parametrize("bad", [0, 1])
def test_nonfinite_parameters_stop_every_rank_naming_rank_and_step(fault, bad):
    """A rank whose parameters became inf at step 10 stops the run on every rank; its own
    error names the parameter, every rank's error names the rank and the step."""
    proc = fault(f"nonfinite-{bad}")
    clear = _clear_errors(proc, 3)
    for r, msg in clear.items():
        assert f"rank {bad}" in msg and "step 10" in msg, (r, msg)
    assert "0.weight" in clear[bad] and "NaN/Inf" in clear[bad], clear[bad]


@pytest.mark.multirank
def test_close_compares_parameters_across_ranks(fault):
    """Parameters that differ (finite) at close() raise on every rank, naming rank 2."""
    proc = fault("diverged")
    clear = _clear_errors(proc, 3)
    for r, msg in clear.items():
        assert "ranks [2]" in msg and "differ" in msg, (r, msg)


@pytest.mark.multirank
def test_early_stop_catches_up_at_close_and_mixed_precision(hvd3):
    """A rank that leaves its loop early ends at the others' version and parameters after
    close(). And fp16, bf16 and fp64 models train (fp32 messages, update cast to the
    parameter's dtype) and dgd matches the fp32 run within the dtype's rounding."""
    proc = hvd3.ran("clean")
    checks, all_ok = _checks(proc)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert {"early_stop_catches_up_at_close", "dtypes_fp16_bf16_fp64"} <= checks


@pytest.mark.multirank
def test_settings_that_must_agree_are_compared_and_named(hvd3):
    """The lr, momentum, weight decay, betas, optimizer class, param groups, name,
    optimistic, control, parameter dtype and the loader's seed and batch size: a rank that differs
    gets a ValueError on every rank naming the field and ranks [1]."""
    proc = hvd3.ran("config")
    checks, all_ok = _checks(proc)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert {"config_fields_named", "loader_partitioning_compared"} <= checks


@pytest.mark.multirank
def test_skipped_backward_in_batches_is_refused(fault):
    """A batches() body that skips backward is 'got no gradient' on that rank (not a
    zero gradient) and stops every rank."""
    proc = fault("skipped")
    clear = _clear_errors(proc, 3)
    assert "got no gradient" in clear[1], clear[1]
    for r in (0, 2):
        assert "rank(s) [1]" in clear[r] or "rank 1" in clear[r], clear[r]
