"""Fixtures of the multi-host tests: loopback ssh hosts (launch/local_hosts.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "launch"))
from local_hosts import LocalHosts, Unavailable  # noqa: E402


@pytest.fixture
def two_hosts():
    """``(horovodrun, LocalHosts)``: the venv's horovodrun and two started loopback ssh hosts,
    stopped after the test; a skip naming the reason where either cannot be had."""
    exe = Path(sys.executable).with_name("horovodrun")
    if not exe.exists():
        pytest.skip("horovod is not installed (run bash launch/setup.sh)")
    lh = LocalHosts(count=2)
    try:
        lh.start()
    except Unavailable as err:
        pytest.skip(f"no local ssh hosts: {err}")
    try:
        yield exe, lh
    finally:
        lh.stop()
