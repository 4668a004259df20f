"""The README's quick start (launch/quickstart.py) runs as printed and learns."""

import re
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[2] / "launch" / "quickstart.py"
README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_shows_the_quickstart_code():
    body = QUICKSTART.read_text().split("\n", 1)[1]
    body = body[: body.index("\nwith torch.no_grad()")]
    assert body.strip() in README.read_text()


@pytest.mark.multirank
def test_quickstart_trains_on_two_ranks(horovodrun):
    proc = horovodrun(2, QUICKSTART, timeout=240)
    match = re.search(r"quickstart: (\d+) updates, training accuracy ([0-9.]+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    assert int(match.group(1)) == 60
    assert float(match.group(2)) > 0.8   # softmax regression on digits, 60 PGC-CR steps
