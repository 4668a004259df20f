"""Multi-rank foundation of the runtime: collectives issued from a background agent thread (an
entry of the session's np 2 and np 3 launches, ``launch_group``: last, it ends with
hvd.shutdown())."""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TEST = "test_variable_size_allgather_from_background_thread"
SCRIPT = HERE / "scripts" / "allgather_from_agent_thread.py"
LAUNCH_GROUPS = [("horovodrun", n, [("allgather", TEST, SCRIPT, [])], "last") for n in (2, 3)]


@pytest.mark.multirank
@pytest.mark.parametrize("np_", [2, 3])
def test_variable_size_allgather_from_background_thread(launch_group, request, np_):
    proc = launch_group(request, "horovodrun", np_).ran("allgather")
    ok_lines = [line for line in proc.stdout.splitlines() if "OK rank=" in line]
    assert len(ok_lines) == np_, proc.stdout + proc.stderr
    # Some rank contributed zero rows in round 0 (odd ranks do).
    assert any("zero_row_ranks=[1" in line for line in ok_lines), proc.stdout
