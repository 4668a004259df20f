"""The end of training without close(), dropout under exact decoding, per-rank data (each
launches lifecycle_checks.py under horovodrun; no script calls close())."""

import re
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "lifecycle_checks.py"
DIED = "a rank has died or shut down Horovod"
#: the run whose exit fails on every rank: side by side with the other faults (conftest)
FAULT_LAUNCHES = [("horovodrun", 2, "mismatch", "test_parameters_compared_at_exit", SCRIPT,
                   ["mismatch"])]


def all_ok(out: str, np_: int = 2) -> None:
    assert sorted(re.findall(r"ALL OK rank=(\d)", out)) == [str(r) for r in range(np_)], out


@pytest.mark.multirank
def test_dropout_replicas_and_per_rank_data(horovodrun):
    """gc-cr, n = 2, s = 1, a dropout model: the same parameters whichever rank straggles
    (compared across ranks and across the two runs); then per-rank random data is refused at
    the first step on every rank with the fix."""
    proc = horovodrun(2, SCRIPT, "replicas", timeout=120)
    out = proc.stdout
    all_ok(out)
    digests = set(re.findall(r"slow=\d digest=([0-9a-f]{16})", out))
    assert len(digests) == 1 and len(re.findall(r"slow=\d digest=", out)) == 4, out
    refused = [l for l in out.splitlines() if "REFUSED" in l]
    assert len(refused) == 2 and all("give every rank the same dataset" in l for l in refused)
    assert DIED not in proc.stderr, proc.stderr


@pytest.mark.multirank
def test_collected_optimizer_and_hvd_shutdown_close_without_close(horovodrun):
    """An optimizer that went out of scope waits (its rank's loop marked done) while the job
    runs other collectives and trains a second one; hvd.shutdown() closes both, parameters
    compared; the ranks print the same parameters and nobody reports a dead rank."""
    proc = horovodrun(2, SCRIPT, "collected", timeout=120)
    all_ok(proc.stdout)
    lines = re.findall(r"PARAMS digest=([0-9a-f]{16}) rank=(\d)", proc.stdout)
    assert sorted(r for _, r in lines) == ["0", "1"] and len({h for h, _ in lines}) == 1, lines
    assert DIED not in proc.stderr and "stopped" not in proc.stderr, proc.stderr


@pytest.mark.multirank
def test_parameters_compared_at_exit(fault):
    """No close(): a rank whose parameters were changed after the loop makes the exit's close
    fail on every rank (status 1, the comparison's error), as close() would."""
    proc = fault("mismatch")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert len(re.findall(r"LOOP DONE rank=\d", proc.stdout)) == 2, proc.stdout
    assert "closing the optimizer at exit (no close() was called) failed" in proc.stderr
    assert "ranks [1] hold parameters that differ from ranks [0]" in proc.stderr, proc.stderr
