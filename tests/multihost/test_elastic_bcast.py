"""elastic.bcast_object sends tensors and plain types only and never builds a peer's pickled
objects: elastic_bcast_checks.py on 2 ranks under horovodrun."""

from pathlib import Path

import pytest
from checks import passed

SCRIPT = Path(__file__).resolve().parent / "scripts" / "elastic_bcast_checks.py"
# an entry of the session's horovodrun -np 2 launch (launch_group, tests/conftest.py)
TEST = "test_bcast_object_sends_plain_state_and_refuses_code"
LAUNCH_GROUPS = [("horovodrun", 2, [("bcast", TEST, SCRIPT, [])])]


@pytest.mark.multirank
def test_bcast_object_sends_plain_state_and_refuses_code(launch_group, request):
    out = launch_group(request, "horovodrun", 2).ran("bcast").stdout
    assert out.count("ALL OK rank=") == 2, out
    for check in ("state_dict_arrives", "root_refuses_objects", "peer_bytes_never_run",
                  "commit_host_check"):
        assert {0, 1} <= set(passed(out).get(check, [])), out
