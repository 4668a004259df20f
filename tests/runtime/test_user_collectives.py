"""The user's own collectives never hang beside pgc_hvd, on both engines.

Each test runs ``user_collectives_checks.py`` (its doc lists the habits: unnamed
``allreduce`` / ``allgather`` / ``broadcast`` / ``alltoall`` in the loop and after it, an async
allreduce held across ``step()``, with and without ``close()``, one rank slowed, the default
control plane) as an entry of the session's shared launch of its world size (``launch_group``,
tests/conftest.py: earlier entries' unnamed collectives ran on every rank too, so Horovod's
automatic names still agree) and requires every case's check on every rank. A hang fails the
rank through the script's watchdog (every thread's stack in the report) before the launch's own
timeout."""

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


CASES = [("horovodrun", 3, ALL), ("horovodrun", 4, "pgc-cr,bcgc"), ("torchrun", 4, ALL)]
LAUNCH_GROUPS = [(launcher, np_, [(f"uc-{schemes}", f"test_unnamed_user_collectives_{launcher}",
                                   SCRIPT, [schemes])])
                 for launcher, np_, schemes in CASES]


@pytest.mark.multirank
@pytest.mark.parametrize("np_,schemes", [(3, ALL), (4, "pgc-cr,bcgc")])
def test_unnamed_user_collectives_horovodrun(launch_group, request, np_, schemes):
    _passed(launch_group(request, "horovodrun", np_).ran(f"uc-{schemes}"), np_, schemes)


@pytest.mark.multirank
@pytest.mark.parametrize("np_,schemes", [(4, ALL)])
def test_unnamed_user_collectives_torchrun(launch_group, request, np_, schemes):
    _passed(launch_group(request, "torchrun", np_).ran(f"uc-{schemes}"), np_, schemes)
