"""The user's own collectives never hang beside pgc_hvd, on both engines.

Each test launches ``user_collectives_checks.py`` (its doc lists the habits: unnamed
``allreduce`` / ``allgather`` / ``broadcast`` / ``alltoall`` in the loop and after it, an async
allreduce held across ``step()``, with and without ``close()``, one rank slowed, the default
control plane) and requires every case's check on every rank. A hang fails the rank through the
script's watchdog (every thread's stack in the report) before the launch's own timeout."""

from pathlib import Path

import pytest
from checks import passed_everywhere

SCRIPT = Path(__file__).resolve().parent / "scripts" / "user_collectives_checks.py"
ALL = "pgc-cr,bcgc,bounded-staleness"


def _passed(proc, np_, schemes):
    want = {f"{s}.{how}" for s in schemes.split(",") for how in ("close", "open")} | {"last"}
    missing = want - passed_everywhere(proc.stdout, np_)
    assert not missing, f"checks not passed on every rank: {sorted(missing)}\n" \
        + proc.stdout[-6000:] + proc.stderr[-6000:]


@pytest.mark.multirank
@pytest.mark.parametrize("np_,schemes", [(3, ALL), (4, "pgc-cr,bcgc")])
def test_unnamed_user_collectives_horovodrun(horovodrun, np_, schemes):
    proc = horovodrun(np_, SCRIPT, schemes, timeout=240)
    _passed(proc, np_, schemes)


@pytest.mark.multirank
@pytest.mark.parametrize("np_,schemes", [(4, ALL)])
def test_unnamed_user_collectives_torchrun(torchrun, np_, schemes):
    proc = torchrun(np_, SCRIPT, schemes, timeout=240)
    _passed(proc, np_, schemes)
