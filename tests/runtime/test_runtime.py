"""Multi-rank tests of the pgc_hvd runtime (each launches runtime_checks.py under horovodrun)."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "runtime_checks.py"


def _checks(proc, np_):
    lines = proc.stdout.splitlines()
    return {line.split("CHECK ", 1)[1].split(" ok")[0] for line in lines if "CHECK " in line
            and f" ok rank=0" in line}, sum("ALL OK rank=" in line for line in lines)


@pytest.mark.multirank
def test_core_np4(horovodrun):
    """dgd == hvd.DistributedOptimizer; exact schemes decode the full-gradient average; one
    injected straggler is left out and steps stay far below its delay; a NaN message is a
    straggler; parameters bit-identical across ranks under random delays."""
    proc = horovodrun(4, SCRIPT, "core", timeout=240)
    checks, all_ok = _checks(proc, 4)
    assert all_ok == 4, proc.stdout + proc.stderr
    assert {"dgd_equals_hvd", "exact_dgd_gc-cr_bcgc_bounded-staleness", "straggler_pgc-cr",
            "straggler_bcgc", "nan_message_is_a_straggler", "bit_identical_pgc-cr"} <= checks


@pytest.mark.multirank
def test_small_np3_config_errors_exact_checkpoint(horovodrun):
    proc = horovodrun(3, SCRIPT, "small", timeout=240)
    checks, all_ok = _checks(proc, 3)
    assert all_ok == 3, proc.stdout + proc.stderr
    assert {"config_errors", "exact_gc-cr_bcgc_rs_gmds", "checkpoint_dgd",
            "checkpoint_pgc-cr"} <= checks
    # the mismatch error names the offending rank on every rank
    assert sum("ranks [1] were built with a different" in l for l in proc.stdout.splitlines()) == 3


@pytest.mark.multirank
def test_dead_rank_stops_others_with_clear_error(horovodrun):
    proc = horovodrun(3, SCRIPT, "dead", timeout=120, check=False)
    clear = [l for l in proc.stdout.splitlines() if "CLEAR-ERROR" in l]
    assert len(clear) == 2, proc.stdout + proc.stderr
    assert all("died" in l for l in clear), clear
    assert "NO-ERROR" not in proc.stdout
