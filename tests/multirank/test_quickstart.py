"""The README's quick start (launch/quickstart.py) runs as printed and learns (an entry of the
session's np 2 launch, ``launch_group``)."""

import re
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[2] / "launch" / "quickstart.py"
README = Path(__file__).resolve().parents[2] / "README.md"
LAUNCH_GROUPS = [("horovodrun", 2, [("quickstart", "test_quickstart_trains_on_two_ranks",
                                     QUICKSTART, [])])]


def test_readme_shows_the_quickstart_code():
    body = QUICKSTART.read_text().split("\n", 1)[1]
    body = body[: body.index("\nwith torch.no_grad()")]
    assert body.strip() in README.read_text()


@pytest.mark.multirank
def test_quickstart_trains_on_two_ranks(launch_group, request):
    proc = launch_group(request, "horovodrun", 2).ran("quickstart")
    match = re.search(r"quickstart: (\d+) updates, training accuracy ([0-9.]+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    assert int(match.group(1)) == 60
    assert float(match.group(2)) > 0.8   # softmax regression on digits, 60 PGC-CR steps
